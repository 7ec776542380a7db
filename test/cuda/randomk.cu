// GPU random-k against the CPU codec (built by the host compiler,
// reference.hpp): payload bytes over sizes, ratios, absolute k, unbiased
// scaling, dtypes, seeds and 64-bit steps; decode-add (indices regenerated
// from the payload's seed); error feedback; graph replay; malformed payloads.
#include <ashl/compress/cuda/randomk.cuh>

#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include "harness.cuh"

#include <ashl/compress/randomk.hpp>

using namespace ashl_test;

namespace {
const cc::codec_context ctx{.seed = 0xfeedfacecafebeefull, .step = (std::uint64_t{1} << 40) + 3, .tensor = 12};
}  // namespace

BOOST_AUTO_TEST_CASE(payload_matches_cpu) {
  check_payloads(cc::randomk{}, {0, 1, 31, 1000, 1000003, (std::size_t{1} << 22) + 5}, ctx);
  for (const cc::randomk_options o : {cc::randomk_options{0.5, 0, true}, cc::randomk_options{1.0, 0, false},
                                      cc::randomk_options{0.01, 7, true}, cc::randomk_options{0.01, 5000, false}})
    for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{300007}})
      check_payload<float>(cc::randomk{o}, n, pattern::normal, ctx);
}

BOOST_AUTO_TEST_CASE(error_feedback_matches_cpu) {
  check_error_feedback<float>(cc::randomk{{0.01, 0, false}}, 100003, pattern::normal, ctx);
  check_error_feedback<ashl::half>(cc::randomk{{0.1, 0, true}}, 100003, pattern::heavy_tailed, ctx);
}

BOOST_AUTO_TEST_CASE(graph_capture_and_replay) { check_graph_replay(cc::randomk{{0.01, 0, true}}, 1000003, ctx); }

BOOST_AUTO_TEST_CASE(malformed_payloads) {
  const std::size_t n = 1000;
  const cc::randomk c{{0.01, 0, false}};  // k = 10
  const auto good = cpu_payload(c, make_input(n, pattern::normal, 3), ctx);
  auto bad = good;
  bad[8] = std::byte{0};  // k = 0 for n = 1000
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_count, ctx);
  bad = good;
  bad[12] = std::byte{0x02};  // undefined flag bit
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_field, ctx);
  bad = good;
  bad.pop_back();
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_bytes, ctx);
  bad = good;
  bad[8] = std::byte{0xff};  // k = 255 <= n, but the buffer holds 10 values
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_bytes, ctx);
}

ASHL_TEST_CUDA_MAIN()
