// GPU block-scaled integers against the CPU codec (built by the host
// compiler, reference.hpp): payload bytes for 8, 4 and 2 bits, nearest and
// stochastic rounding, block sizes with tail blocks, every dtype and
// pattern (zeros, ties, NaN/inf refused); decode-add; error feedback; graph
// replay; malformed payloads (docs/codecs.md "block").
#include <ashl/compress/cuda/block.cuh>

#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include "harness.cuh"

#include <ashl/compress/block.hpp>

using namespace ashl_test;

namespace {
const cc::codec_context ctx{.seed = 9, .step = 4, .tensor = 0xffffffffu};
}  // namespace

BOOST_AUTO_TEST_CASE(payload_matches_cpu) {
  for (std::uint32_t bits : {8u, 4u, 2u})
    for (std::uint32_t B : {8u, 64u, 96u, 4096u})
      check_payloads(cc::block_quant{{.bits = bits, .block = B}}, {0, 1, 5, 1000, 100003}, ctx);
  check_payloads(cc::block_quant{{.bits = 4, .block = 64, .stochastic = true}}, {0, 3, 1000, (std::size_t{1} << 20) + 5},
                 ctx);
  check_payloads(cc::block_quant{{.bits = 2, .block = 256, .stochastic = true}}, {7, 100003}, ctx);
}

BOOST_AUTO_TEST_CASE(tiny_and_huge_blocks_match_cpu) {
  std::vector<float> x = make_input(10007, pattern::normal, 4);
  for (std::size_t i = 64; i < 128; ++i) x[i] = 1e-37f * static_cast<float>(i % 3);  // absmax below 2^-120
  x[300] = 3.0e38f;
  const cc::block_quant c{{.bits = 4, .block = 64}};
  const auto cpu = cpu_payload(c, x, ctx);
  BOOST_TEST(first_difference(cpu, gpu_encode(c, x, ctx).payload) == -1);
  compare_decode(c, cpu, x.size(), ashl::dtype::f32, ctx);
}

BOOST_AUTO_TEST_CASE(error_feedback_matches_cpu) {
  check_error_feedback<float>(cc::block_quant{}, 100003, pattern::normal, ctx);
  check_error_feedback<ashl::bfloat16>(cc::block_quant{{.bits = 2, .block = 32}}, 100003, pattern::heavy_tailed, ctx);
  check_error_feedback<float>(cc::block_quant{{.bits = 8, .block = 128, .stochastic = true}}, 4099, pattern::special,
                              ctx);
}

BOOST_AUTO_TEST_CASE(graph_capture_and_replay) { check_graph_replay(cc::block_quant{}, 1000003, ctx); }

BOOST_AUTO_TEST_CASE(malformed_payloads) {
  const std::size_t n = 1000;  // 4 bits, B = 64: 16 steps, 500 code bytes
  const auto good = cpu_payload(cc::block_quant{}, make_input(n, pattern::normal, 3), ctx);
  auto bad = good;
  bad[12] = std::byte{3};  // bits
  check_malformed(cc::block_quant{}, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_field, ctx);
  bad = good;
  bad[8] = std::byte{12};  // block = 12
  check_malformed(cc::block_quant{}, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_field, ctx);
  bad = good;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.data() + 16 + 4 * 5, &nan, 4);
  check_malformed(cc::block_quant{}, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_scale, ctx);
  bad = good;
  bad[16 + 64 + 200] = std::byte{0x80};
  check_malformed(cc::block_quant{}, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_code, ctx);
  bad = good;
  bad.pop_back();
  check_malformed(cc::block_quant{}, bad, n, ashl::dtype::f32, cc::cuda::device_fault::payload_bytes, ctx);
  const std::size_t odd = 1001;  // 4 padding bits in the last byte
  auto pad = cpu_payload(cc::block_quant{}, make_input(odd, pattern::normal, 5), ctx);
  pad.back() = static_cast<std::byte>(static_cast<unsigned>(pad.back()) | 0x10u);
  check_malformed(cc::block_quant{}, pad, odd, ashl::dtype::f32, cc::cuda::device_fault::payload_padding, ctx);
}

ASHL_TEST_CUDA_MAIN()
