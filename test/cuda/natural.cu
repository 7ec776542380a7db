// GPU natural compression against the CPU codec (built by the host compiler,
// reference.hpp): payload bytes over sizes (whole and partial Philox
// blocks), dtypes and patterns (subnormal maxima, zeros, NaN/inf refused);
// decode-add; error feedback; graph replay; malformed payloads.
#include <ashl/compress/cuda/natural.cuh>

#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include "harness.cuh"

#include <ashl/compress/natural.hpp>

using namespace ashl_test;

namespace {
const cc::codec_context ctx{.seed = 9, .step = 4, .tensor = 0xffffffffu};
}  // namespace

BOOST_AUTO_TEST_CASE(payload_matches_cpu) {
  check_payloads(cc::natural{}, {0, 1, 3, 4, 5, 1000, 1000003, (std::size_t{1} << 22) + 5}, ctx);
}

BOOST_AUTO_TEST_CASE(extreme_ranges_match_cpu) {
  // max |x| near 2^128 (emin clamped to 1), and a lone smallest subnormal.
  std::vector<float> big = make_input(10007, pattern::normal, 4);
  big[17] = 3.0e38f;
  std::vector<float> sub(10007, 0.0f);
  sub[9] = 1.4e-45f;
  sub[10] = -1.0e-45f;
  for (const auto* x : {&big, &sub}) {
    const auto cpu = cpu_payload(cc::natural{}, *x, ctx);
    BOOST_TEST(first_difference(cpu, gpu_encode(cc::natural{}, *x, ctx).payload) == -1);
    compare_decode(cc::natural{}, cpu, x->size(), ashl::dtype::f32, ctx);
  }
}

BOOST_AUTO_TEST_CASE(error_feedback_matches_cpu) {
  check_error_feedback<float>(cc::natural{}, 100003, pattern::normal, ctx);
  check_error_feedback<ashl::bfloat16>(cc::natural{}, 100003, pattern::heavy_tailed, ctx);
  check_error_feedback<float>(cc::natural{}, 4099, pattern::special, ctx);
}

BOOST_AUTO_TEST_CASE(graph_capture_and_replay) { check_graph_replay(cc::natural{}, 1000003, ctx); }

BOOST_AUTO_TEST_CASE(malformed_payloads) {
  const std::size_t n = 1000;
  const auto good = cpu_payload(cc::natural{}, make_input(n, pattern::normal, 3), ctx);
  auto bad = good;
  const std::int32_t emin = 2;
  std::memcpy(bad.data() + 8, &emin, 4);
  check_malformed(cc::natural{}, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_field, ctx);
  bad = good;
  bad[12 + 500] = std::byte{0x80};
  check_malformed(cc::natural{}, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_code, ctx);
  bad = good;
  bad.pop_back();
  check_malformed(cc::natural{}, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_bytes, ctx);
}

ASHL_TEST_CUDA_MAIN()
