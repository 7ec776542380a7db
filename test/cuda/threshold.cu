// GPU threshold against the CPU codec (built by the host compiler,
// reference.hpp): payload bytes over sizes, thresholds, caps (the cap binds
// or not; count 0), dtypes and patterns (NaN never qualifies, ties, zeros);
// decode-add; the exact size in device_output::d_used; graph replay of the
// encode; malformed payloads.
#include <ashl/compress/cuda/threshold.cuh>

#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include "harness.cuh"

#include <ashl/compress/threshold.hpp>

using namespace ashl_test;

namespace {
const cc::codec_context ctx{.seed = 7, .step = 3, .tensor = 2};
}  // namespace

BOOST_AUTO_TEST_CASE(payload_matches_cpu_default) {
  check_payloads(cc::threshold{}, {0, 1, 7, 1000, 1000003}, ctx);
}

BOOST_AUTO_TEST_CASE(payload_matches_cpu_thresholds_and_caps) {
  // theta 0 takes every non-NaN element; 0.5 about 60 % of normal data; 3
  // about 0.3 %; 1e30 none (count 0). Caps from 1 element to all.
  for (const float theta : {0.0f, 0.5f, 3.0f, 1e30f})
    for (const double cap : {1e-6, 0.001, 0.05, 0.7, 1.0})
      for (std::size_t n : {std::size_t{1}, std::size_t{5000}, std::size_t{300007}})
        for (pattern p : all_patterns()) {
          const cc::threshold c{{.theta = theta, .max_ratio = cap}};
          check_payload<float>(c, n, p, ctx);
          check_payload<ashl::half>(c, n, p, ctx);
          check_payload<ashl::bfloat16>(c, n, p, ctx);
        }
}

BOOST_AUTO_TEST_CASE(graph_capture_and_replay) {
  check_graph_replay(cc::threshold{{.theta = 1.0f, .max_ratio = 0.2}}, 1000003, ctx);
  check_graph_replay(cc::threshold{{.theta = 1.0f, .max_ratio = 0.01}}, 1000003, ctx);  // the cap binds
}

BOOST_AUTO_TEST_CASE(malformed_payloads) {
  const std::size_t n = 1000;
  const cc::threshold c{{.theta = 1.0f, .max_ratio = 0.5}};
  const auto good = cpu_payload(c, make_input(n, pattern::normal, 3), ctx);
  auto bad = good;
  bad[0] = std::byte{0x01};  // n differs from info.count
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_n, ctx);
  bad = good;
  bad.pop_back();
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_bytes, ctx);
  bad = good;
  std::memcpy(bad.data() + 16, bad.data() + 12, 4);  // index[1] = index[0]
  check_malformed(c, bad, n, ashl::dtype::f32, cc::cuda::device_fault::index_not_increasing, ctx);
}

BOOST_AUTO_TEST_CASE(argument_errors_are_statuses) {
  device_buffer<float> dx(16);
  device_buffer<std::byte> out(8);  // fewer than max_encoded_bytes
  cc::cuda::device_output o{.bytes = out.view()};
  cc::cuda::device_scratch q{};
  const cc::threshold c{{.theta = 1.0f, .max_ratio = 1.0}};
  BOOST_REQUIRE(cc::cuda::encode(c, dx.cview(), o, ctx, q, nullptr, cudaStream_t{}).ok());
  BOOST_TEST(!o.size_known);
  BOOST_TEST(o.used == c.max_encoded_bytes(16, ashl::dtype::f32));
  device_buffer<std::byte> scratch(q.bytes);
  cc::cuda::device_scratch sc{scratch.data(), q.bytes};
  BOOST_TEST((cc::cuda::encode(c, dx.cview(), o, ctx, sc, nullptr, cudaStream_t{}).code() ==
              ashl::errc::buffer_too_small));
  const cc::threshold bad{{.theta = -1.0f, .max_ratio = 1.0}};
  cc::cuda::device_scratch q2{};
  BOOST_TEST(!cc::cuda::encode(bad, dx.cview(), o, ctx, q2, nullptr, cudaStream_t{}).ok());
}

ASHL_TEST_CUDA_MAIN()
