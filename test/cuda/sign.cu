// GPU sign (EF-signSGD) against the CPU codec (built by the host compiler,
// reference.hpp): payload bytes over sizes (bit words whole and partial),
// buckets, dtypes and patterns (inf/NaN buckets refused at the CPU's
// bucket, -0 sends +d); decode-add; error feedback; graph replay; malformed
// payloads.
#include <ashl/compress/cuda/sign.cuh>

#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include "harness.cuh"

#include <ashl/compress/sign.hpp>

using namespace ashl_test;

namespace {
const cc::codec_context ctx{};
}  // namespace

BOOST_AUTO_TEST_CASE(payload_matches_cpu) {
  check_payloads(cc::sign{}, {0, 1, 7, 33, 1000, 1025, 1000003, (std::size_t{1} << 22) + 5}, ctx);
  for (std::uint32_t b : {1u, 5u, 3000u})
    for (pattern p : all_patterns()) check_payload<float>(cc::sign{{b}}, 300007, p, ctx);
}

BOOST_AUTO_TEST_CASE(error_feedback_matches_cpu) {
  check_error_feedback<float>(cc::sign{}, 100003, pattern::normal, ctx);
  check_error_feedback<ashl::half>(cc::sign{{64}}, 100003, pattern::heavy_tailed, ctx);
  check_error_feedback<float>(cc::sign{}, 4099, pattern::special, ctx);
}

BOOST_AUTO_TEST_CASE(graph_capture_and_replay) { check_graph_replay(cc::sign{}, 1000003, ctx); }

BOOST_AUTO_TEST_CASE(malformed_payloads) {
  const std::size_t n = 1001;
  const cc::sign c{{100}};
  const auto good = cpu_payload(c, make_input(n, pattern::normal, 3), ctx);
  auto bad = good;
  bad[1] = std::byte{0x10};  // n differs
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_n, ctx);
  bad = good;
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(bad.data() + 12 + 4 * 2, &inf, 4);
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_scale, ctx);
  bad = good;
  bad.back() |= std::byte{0x02};  // 1001 % 8 = 1: bits 1..7 of the last byte are padding
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_padding, ctx);
  bad = good;
  bad.push_back(std::byte{0});
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_bytes, ctx);
}

ASHL_TEST_CUDA_MAIN()
