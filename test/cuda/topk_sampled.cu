// GPU sampled top-k against the CPU codec (built by the host compiler,
// reference.hpp): payload bytes over sizes below and above the sampled path
// (2^17), ratios, absolute k, tolerances, dtypes, seeds and patterns (ties
// and all-equal inputs take the ties rule, heavy tails miss the threshold
// and take exact top-k); decode-add; the exact size in d_used and within
// [lo, hi]; graph replay of the encode; malformed payloads.
#include <ashl/compress/cuda/topk_sampled.cuh>

#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include "harness.cuh"

#include <ashl/compress/topk_sampled.hpp>

using namespace ashl_test;

namespace {
const cc::codec_context ctx{.seed = 0x0123456789abcdefull, .step = (std::uint64_t{5} << 32) + 9, .tensor = 4};
const std::vector<std::size_t> sizes{0, 1, 1000, 131071, 131072, 1000003};
}  // namespace

BOOST_AUTO_TEST_CASE(payload_matches_cpu_default) { check_payloads(cc::topk_sampled{}, sizes, ctx); }

BOOST_AUTO_TEST_CASE(payload_matches_cpu_ratios_and_tolerances) {
  for (const cc::topk_sampled_options o :
       {cc::topk_sampled_options{.ratio = 0.001}, cc::topk_sampled_options{.ratio = 0.1, .tolerance = 0.02},
        cc::topk_sampled_options{.ratio = 0.5, .tolerance = 0.5}, cc::topk_sampled_options{.count = 1},
        cc::topk_sampled_options{.count = 4000, .tolerance = 0.3}})
    for (std::size_t n : {std::size_t{200003}, std::size_t{1000003}})
      for (pattern p : all_patterns()) {
        check_payload<float>(cc::topk_sampled{o}, n, p, ctx);
        check_payload<ashl::bfloat16>(cc::topk_sampled{o}, n, p, ctx);
      }
}

BOOST_AUTO_TEST_CASE(payload_matches_cpu_over_seeds_and_steps) {
  for (std::uint64_t step = 0; step < 8; ++step) {
    const cc::codec_context c2{.seed = 1000 + step, .step = step, .tensor = static_cast<std::uint32_t>(step)};
    check_payload<float>(cc::topk_sampled{0.01}, 500009, pattern::normal, c2);
    check_payload<ashl::half>(cc::topk_sampled{0.01}, 500009, pattern::heavy_tailed, c2);
  }
}

BOOST_AUTO_TEST_CASE(count_stays_in_lo_hi) {
  const cc::topk_sampled c{0.01};
  const std::size_t n = 1000003;
  for (pattern p : all_patterns()) {
    const std::vector<float> x = make_input(n, p, 77);
    const gpu_encoded g = gpu_encode(c, x, ctx);
    std::uint32_t count = 0;
    std::memcpy(&count, g.payload.data() + 8, 4);
    BOOST_TEST(count >= c.lo_for(n));
    BOOST_TEST(count <= c.hi_for(n));
  }
}

BOOST_AUTO_TEST_CASE(graph_capture_and_replay) { check_graph_replay(cc::topk_sampled{0.01}, 1000003, ctx); }

BOOST_AUTO_TEST_CASE(malformed_payloads) {
  const std::size_t n = 1000;
  const cc::topk_sampled c{0.1};
  const auto good = cpu_payload(c, make_input(n, pattern::normal, 3), ctx);
  auto bad = good;
  bad[0] = std::byte{0x01};
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_n, ctx);
  bad = good;
  bad.pop_back();
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_bytes, ctx);
  bad = good;
  const std::uint32_t past = static_cast<std::uint32_t>(n);
  std::memcpy(bad.data() + 12 + 4 * 99, &past, 4);  // the last index = n
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::index_out_of_range, ctx);
}

ASHL_TEST_CUDA_MAIN()
