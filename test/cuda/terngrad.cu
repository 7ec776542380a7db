// GPU TernGrad against the CPU codec (built by the host compiler,
// reference.hpp): payload bytes over sizes, buckets, dtypes and patterns
// (NaN/inf refused at the CPU's bucket); decode-add; error feedback; graph
// replay; malformed payloads.
#include <ashl/compress/cuda/terngrad.cuh>

#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include "harness.cuh"

#include <ashl/compress/terngrad.hpp>

using namespace ashl_test;

namespace {
const cc::codec_context ctx{.seed = 77, .step = 1000, .tensor = 2};
}  // namespace

BOOST_AUTO_TEST_CASE(payload_matches_cpu) {
  check_payloads(cc::terngrad{}, {0, 1, 7, 1000, 1025, 1000003, (std::size_t{1} << 22) + 5}, ctx);
  for (std::uint32_t b : {1u, 3000u})
    for (pattern p : all_patterns()) check_payload<float>(cc::terngrad{{b}}, 300007, p, ctx);
}

BOOST_AUTO_TEST_CASE(error_feedback_matches_cpu) {
  check_error_feedback<float>(cc::terngrad{}, 100003, pattern::normal, ctx);
  check_error_feedback<ashl::bfloat16>(cc::terngrad{}, 100003, pattern::ties, ctx);
}

BOOST_AUTO_TEST_CASE(graph_capture_and_replay) { check_graph_replay(cc::terngrad{}, 1000003, ctx); }

BOOST_AUTO_TEST_CASE(malformed_payloads) {
  const std::size_t n = 1001;  // 2-bit codes: 251 code bytes, the last with 6 unused bits
  const cc::terngrad c{{100}};
  const auto good = cpu_payload(c, make_input(n, pattern::normal, 3), ctx);
  auto bad = good;
  std::memset(bad.data() + 8, 0, 4);  // bucket = 0
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_field, ctx);
  bad = good;
  const float neg = -1.0f;
  std::memcpy(bad.data() + 12 + 4 * 10, &neg, 4);  // scale of the last bucket
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_scale, ctx);
  bad = good;
  bad[12 + 44] = std::byte{0x01};  // code 1: a sign on level 0
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_code, ctx);
  bad = good;
  bad.back() |= std::byte{0x80};
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_padding, ctx);
}

ASHL_TEST_CUDA_MAIN()
