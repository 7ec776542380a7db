// GPU QSGD against the CPU codec (built by the host compiler, reference.hpp):
// payload bytes over sizes, buckets (one chunk, several chunks, tiny),
// levels (widths 2 to 16 bits), dtypes and patterns (NaN/inf refused at the
// CPU's bucket, zeros, subnormal norms); decode-add; error feedback; graph
// replay; malformed payloads.
#include <ashl/compress/cuda/qsgd.cuh>

#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include "harness.cuh"

#include <ashl/compress/qsgd.hpp>

using namespace ashl_test;

namespace {
const cc::codec_context ctx{.seed = 0x1234567890abcdefull, .step = (std::uint64_t{3} << 32) + 17, .tensor = 5};
const std::vector<std::size_t> sizes{0, 1, 7, 1000, 1025, 1000003, (std::size_t{1} << 22) + 5};
}  // namespace

BOOST_AUTO_TEST_CASE(payload_matches_cpu_default) { check_payloads(cc::qsgd{}, sizes, ctx); }

BOOST_AUTO_TEST_CASE(payload_matches_cpu_buckets_and_levels) {
  for (const cc::qsgd_options o : {cc::qsgd_options{1, 512}, cc::qsgd_options{15, 3000}, cc::qsgd_options{7, 1},
                                   cc::qsgd_options{32767, 100}, cc::qsgd_options{3, 1024}})
    for (std::size_t n : {std::size_t{1}, std::size_t{5000}, std::size_t{300007}})
      for (pattern p : all_patterns()) {
        check_payload<float>(cc::qsgd{o}, n, p, ctx);
        check_payload<ashl::bfloat16>(cc::qsgd{o}, n, p, ctx);
      }
}

BOOST_AUTO_TEST_CASE(error_feedback_matches_cpu) {
  check_error_feedback<float>(cc::qsgd{{15, 512}}, 100003, pattern::normal, ctx);
  check_error_feedback<ashl::half>(cc::qsgd{}, 100003, pattern::heavy_tailed, ctx);
  check_error_feedback<float>(cc::qsgd{}, 4099, pattern::special, ctx);  // refused steps keep x + e
}

BOOST_AUTO_TEST_CASE(graph_capture_and_replay) { check_graph_replay(cc::qsgd{{15, 512}}, 1000003, ctx); }

BOOST_AUTO_TEST_CASE(malformed_payloads) {
  const std::size_t n = 1000;
  const cc::qsgd c{{15, 100}};  // 5-bit codes, 10 norms
  const auto good = cpu_payload(c, make_input(n, pattern::normal, 3), ctx);
  auto bad = good;
  bad[0] = std::byte{0x01};  // n = 1001... differs from info.count
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_n, ctx);
  bad = good;
  std::memset(bad.data() + 12, 0, 4);  // levels = 0
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_field, ctx);
  bad = good;
  bad.pop_back();
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_bytes, ctx);
  bad = good;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.data() + 16 + 4 * 3, &nan, 4);  // norm of bucket 3
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_scale, ctx);
  bad = good;
  // Codes start after the 10 norms; code 0 = 0b00001 is a sign on level 0.
  bad[16 + 40] = (bad[16 + 40] & std::byte{0xe0}) | std::byte{0x01};
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_code, ctx);
  // Host-checkable: an unknown dtype, a short buffer.
  device_buffer<std::byte> din(good.size());
  device_buffer<float> acc(n);
  device_buffer<std::byte> scratch(4096);
  cc::cuda::device_scratch sc{scratch.data(), 4096};
  BOOST_TEST(!cc::cuda::decode_add(c, {din.data(), 8}, {n, ashl::dtype::f32}, acc.view(), 1.0f, ctx, sc, nullptr,
                                   cudaStream_t{})
                  .ok());
  BOOST_TEST(!cc::cuda::decode_add(c, {din.data(), good.size()}, {n, ashl::dtype::i8}, acc.view(), 1.0f, ctx, sc,
                                   nullptr, cudaStream_t{})
                  .ok());
}

ASHL_TEST_CUDA_MAIN()
