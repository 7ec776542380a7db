// compress/block.hpp: block-scaled 8/4/2-bit integers (docs/codecs.md "block").
#include <ashl/compress/block.hpp>
#include <boost/test/unit_test.hpp>

#include <ashl/compress/error_feedback.hpp>
#include <ashl/compress/registry.hpp>

#include <ashl/core/philox.hpp>

#include "../support/codec_testing.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using namespace ashl;
using namespace codec_testing;

namespace {

std::vector<std::byte> bytes_of(std::initializer_list<unsigned> v) {
  std::vector<std::byte> r;
  for (unsigned b : v) r.push_back(static_cast<std::byte>(b));
  return r;
}
void append(std::vector<std::byte>& p, const std::vector<std::byte>& q) { p.insert(p.end(), q.begin(), q.end()); }
std::vector<std::byte> le32(std::uint32_t v) {
  return bytes_of({v & 0xffu, (v >> 8) & 0xffu, (v >> 16) & 0xffu, v >> 24});
}
std::vector<std::byte> header(std::uint64_t n, std::uint32_t B, unsigned bits, unsigned rounding = 0) {
  std::vector<std::byte> p;
  append(p, le32(static_cast<std::uint32_t>(n)));
  append(p, le32(static_cast<std::uint32_t>(n >> 32)));
  append(p, le32(B));
  append(p, bytes_of({bits, rounding, 0, 0}));
  return p;
}
// Hex text of a payload, so a mismatch prints which byte differs.
std::string hex(const std::vector<std::byte>& p) {
  static constexpr char d[] = "0123456789abcdef";
  std::string s;
  for (std::byte b : p) {
    s += d[static_cast<unsigned>(b) >> 4];
    s += d[static_cast<unsigned>(b) & 15u];
    s += ' ';
  }
  return s;
}
std::vector<float> decode(const std::vector<std::byte>& p, std::size_t n, float scale = 1.0f, dtype t = dtype::f32) {
  std::vector<float> acc(n, 0.0f);
  const status s = compress::block_quant{}.decode_add(p, {n, t}, host_view<float>(acc.data(), n), scale, {});
  BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
  return acc;
}

}  // namespace

// The hand-computed payloads: every byte written out.
BOOST_AUTO_TEST_CASE(exact_bytes_of_small_cases) {
  {  // 4 bits, B = 8, n = 10: one whole block (absmax 7, step 1, r = 1) and a tail of 2
    // (absmax 2: step 2/7, r = 7/2 = 3.5 exactly).
    const std::vector<float> x{1.0f, -2.0f, 0.5f, 3.5f, -7.0f, 0.0f, 0.25f, 7.0f, 1.0f, -2.0f};
    // Nearest, ties to even: 0.5 -> 0, 3.5 -> 4, 0.25 -> 0; tail 1 * 3.5 -> 4, -2 * 3.5 = -7.
    auto want = header(10, 8, 4);
    append(want, le32(0x3f800000u));                     // step 1.0f
    append(want, le32(std::bit_cast<std::uint32_t>(2.0f / 7.0f)));
    BOOST_TEST(std::bit_cast<std::uint32_t>(2.0f / 7.0f) == 0x3e924925u);
    append(want, bytes_of({0xe1, 0x40, 0x09, 0x70, 0x94}));  // nibbles 1,-2 | 0,4 | -7,0 | 0,7 | 4,-7
    const auto got = encode_to_vector(compress::block_quant{{.bits = 4, .block = 8}}, std::span<const float>(x));
    BOOST_TEST(hex(got) == hex(want));
    const auto d = decode(got, 10);
    const float s = 2.0f / 7.0f;
    BOOST_TEST(d == (std::vector<float>{1, -2, 0, 4, -7, 0, 0, 7, 4 * s, -7 * s}), boost::test_tools::per_element());
  }
  {  // 8 bits, B = 8, n = 8: absmax 127, step 1; -63.5 ties to -64 (even).
    const std::vector<float> x{127.0f, -63.5f, 0.5f, 1.5f, -1.0f, 2.5f, 0.0f, -127.0f};
    auto want = header(8, 8, 8);
    append(want, le32(0x3f800000u));
    append(want, bytes_of({0x7f, 0xc0, 0x00, 0x02, 0xff, 0x02, 0x00, 0x81}));
    BOOST_TEST(hex(encode_to_vector(compress::block_quant{{.bits = 8, .block = 8}}, std::span<const float>(x))) ==
               hex(want));
  }
  {  // 2 bits, B = 8, n = 5 (one tail block): absmax 3, m = 1, step 3, r = 1/3.
    // 1.4 / 3 -> 0, -1.6 / 3 -> -1, 3 -> 1, -3 -> -1, 0 -> 0; codes 01 11 00 11 | 00.
    const std::vector<float> x{3.0f, -3.0f, 1.4f, -1.6f, 0.0f};
    auto want = header(5, 8, 2);
    append(want, le32(std::bit_cast<std::uint32_t>(3.0f)));
    append(want, bytes_of({0xcd, 0x00}));
    const auto got = encode_to_vector(compress::block_quant{{.bits = 2, .block = 8}}, std::span<const float>(x));
    BOOST_TEST(hex(got) == hex(want));
    BOOST_TEST(decode(got, 5) == (std::vector<float>{3, -3, 0, -3, 0}), boost::test_tools::per_element());
  }
}

// |x - x^| <= step (1/2 + m 2^-22) per block (nearest), step = absmax / m,
// m = 2^(bits-1) - 1 (the second term: f32 roundings of r, x r, the step
// and step q; ties are frequent with 16-bit inputs), for every width, several block sizes (a tail block each time) and dtype.
BOOST_AUTO_TEST_CASE(nearest_rounding_error_is_at_most_half_a_step) {
  const std::size_t n = 5000 + 37;
  const auto xf = normal_values(n, 71, 3.0f);
  for (unsigned bits : {2u, 4u, 8u})
    for (std::uint32_t B : {8u, 64u, 96u, 4096u}) {
      auto one = [&]<class T>(T) {
        const auto x = to_type<T>(xf);
        const compress::block_quant c{{.bits = bits, .block = B}};
        const auto p = encode_to_vector(c, std::span<const T>(x));
        BOOST_TEST(p.size() == 16 + 4 * ((n + B - 1) / B) + (n * bits + 7) / 8);
        BOOST_TEST(p.size() == c.max_encoded_bytes(n, dtype_of<T>));
        const auto d = decode(p, n, 1.0f, dtype_of<T>);
        const float m = static_cast<float>((1 << (bits - 1)) - 1);
        std::size_t bad = 0;
        for (std::size_t lo = 0; lo < n; lo += B) {
          const std::size_t hi = std::min(n, lo + B);
          float absmax = 0;
          for (std::size_t i = lo; i < hi; ++i) absmax = std::max(absmax, std::fabs(to_float(x[i])));
          const double step = static_cast<double>(absmax) / m;
          for (std::size_t i = lo; i < hi; ++i) {
            const double err = std::fabs(static_cast<double>(to_float(x[i])) - d[i]);
            if (err > step * (0.5 + m * 0x1p-22) + 1e-30) ++bad;
          }
        }
        BOOST_TEST(bad == 0u, bits << " bits, B = " << B << ", " << to_string(dtype_of<T>));
      };
      one(float{});
      one(half{});
      one(bfloat16{});
    }
}

// Stochastic rounding: unbiased (the mean over seeds within 5 sigma of x),
// within one step, deterministic per (seed, step, tensor).
BOOST_AUTO_TEST_CASE(stochastic_rounding_is_unbiased_and_seeded) {
  const std::size_t n = 256;
  const auto x = normal_values(n, 72);
  const compress::block_quant c{{.bits = 2, .block = 64, .stochastic = true}};
  const int draws = 400;
  std::vector<double> mean(n, 0.0);
  std::vector<double> steps(n, 0.0);
  for (std::size_t lo = 0; lo < n; lo += 64) {
    float absmax = 0;
    for (std::size_t i = lo; i < lo + 64; ++i) absmax = std::max(absmax, std::fabs(x[i]));
    for (std::size_t i = lo; i < lo + 64; ++i) steps[i] = absmax;  // m = 1
  }
  for (int s = 0; s < draws; ++s) {
    const auto p = encode_to_vector(c, std::span<const float>(x), {.seed = 11, .step = static_cast<std::uint64_t>(s)});
    BOOST_TEST(static_cast<unsigned>(p[13]) == 1u);  // the rounding field
    const auto d = decode(p, n);
    for (std::size_t i = 0; i < n; ++i) {
      BOOST_TEST_REQUIRE(std::fabs(d[i] - x[i]) < steps[i] * (1 + 0x1p-20));
      mean[i] += d[i] / draws;
    }
  }
  std::size_t far = 0;
  for (std::size_t i = 0; i < n; ++i) {
    // Var of d q with P(up) = f: step^2 f (1 - f) <= step^2 / 4.
    const double sigma = steps[i] / 2 / std::sqrt(static_cast<double>(draws));
    if (std::fabs(mean[i] - x[i]) > 5 * sigma + 1e-6) ++far;
  }
  BOOST_TEST(far == 0u);
  const auto a = encode_to_vector(c, std::span<const float>(x), {.seed = 1, .step = 2, .tensor = 3});
  BOOST_TEST(hex(a) == hex(encode_to_vector(c, std::span<const float>(x), {.seed = 1, .step = 2, .tensor = 3})));
  BOOST_TEST(hex(a) != hex(encode_to_vector(c, std::span<const float>(x), {.seed = 1, .step = 2, .tensor = 4})));
  // Nearest mode does not read the context.
  const compress::block_quant nearest{};
  BOOST_TEST(hex(encode_to_vector(nearest, std::span<const float>(x), {.seed = 1})) ==
             hex(encode_to_vector(nearest, std::span<const float>(x), {.seed = 2, .step = 5})));
}

// The exact payload bytes (FNV-1a of each) as written by the encoder of
// commit c77a659, before its kernels were rewritten for speed: any rewrite
// must keep every bit, since the CUDA encoder (compress/cuda/block.cuh) must
// write the same bytes and, when stochastic, draws the same philox_stream
// words. The cases cover every width, a block of 8, blocks that fill a
// 1024-element piece (64) and that do not (96), a block larger than a piece
// (4096), a tensor of fewer than 4 elements, f16 / bf16 inputs, both
// roundings, and a context whose seed and step use their high 32 bits.
BOOST_AUTO_TEST_CASE(payload_bytes_are_pinned) {
  struct pin {
    bool stochastic;
    unsigned bits;
    std::uint32_t block;
    std::size_t n;
    std::uint64_t f32, f16, bf16;
  };
  const pin pins[] = {
      {true, 4, 64, 100003, 0x20de9a8f70e76c26, 0xab84e9f996dab486, 0x6501d9fa352ec379},
      {true, 2, 96, 100003, 0xef3a72a4583922db, 0x73bf4a9373734a12, 0xabe4b95f71afdede},
      {true, 8, 8, 100003, 0x1fe760df9e15957a, 0x8eedd7282e592a4a, 0xa664f1d49d8bee01},
      {true, 4, 4096, 100003, 0x70f6157529d5b05e, 0x1a8432f1a8910384, 0x63d82bbf2b4aeb6},
      {true, 8, 64, 3, 0xc90802f5feba7b94, 0x6a95a7fbd967d2c3, 0xd39d508a72bb5032},
      {true, 2, 64, 1029, 0x3fb92a9cd4c2b65a, 0x4fa94a2ab957268c, 0x623b8cb5ef092475},
      {false, 4, 64, 100003, 0x3a5770411b6bd763, 0x93445427b7777282, 0x29ab9c652c8f8cec},
      {false, 2, 96, 100003, 0x59b522e0b586aab7, 0x8189b75cdde9e6ee, 0x223e7a3802696a36},
      {false, 8, 8, 100003, 0x3f948865796e5dda, 0xbf73d7752047d515, 0x18deffc6ed67e3c8},
      {false, 4, 4096, 100003, 0x794261c417c69f2e, 0x4a97aea65488f688, 0x1afed0cb7a93f014},
      {false, 8, 64, 3, 0xba9949fc1f3b4f7e, 0x656edca0b3c005a1, 0xc4d92b8eea4f0b50},
      {false, 2, 64, 1029, 0x83709107f4b603eb, 0x8b518c1a1b9da25d, 0xe242867a7bee3a24},
  };
  const auto all = golden_input(100003, 12);
  const compress::codec_context ctx{.seed = 0xfedcba9876543210ull, .step = (std::uint64_t{3} << 32) | 41u, .tensor = 5};
  for (const pin& p : pins) {
    const std::vector<float> xf(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(p.n));
    const compress::block_quant c{{.bits = p.bits, .block = p.block, .stochastic = p.stochastic}};
    const std::uint64_t h32 = fnv1a(encode_to_vector(c, std::span<const float>(xf), ctx));
    const std::uint64_t h16 = fnv1a(encode_to_vector(c, std::span<const half>(to_type<half>(xf)), ctx));
    const std::uint64_t hb = fnv1a(encode_to_vector(c, std::span<const bfloat16>(to_type<bfloat16>(xf)), ctx));
    BOOST_CHECK_MESSAGE(h32 == p.f32 && h16 == p.f16 && hb == p.bf16,
                        (p.stochastic ? "stochastic, " : "nearest, ")
                            << p.bits << " bits, block " << p.block << ", n " << p.n << ": {" << std::hex << "0x"
                            << h32 << ", 0x" << h16 << ", 0x" << hb << "}");
  }
}

// x r is rounded to f32 before u (stochastic) or the rounding constant
// (nearest) is added, as block_quantize_body and the CUDA kernel's
// __fmul_rn / __fadd_rn do: the elements are chosen so that one fused
// rounding of x r + u gives another code for many of them. (gcc makes an FMA
// of a multiply and an add wherever the target has one, target("avx512f"),
// -mfma or -march=haswell, under its default -ffp-contract=fast; clang
// within one expression.) The tests build at -O0, where nothing is
// contracted; built optimised (ASHL_TEST_OPTIMIZE empty, or -O2 -mfma at
// each ASHL_HOST_SIMD level), this test checks that the library's loops
// were not contracted: it failed so on main's portable and AVX2 loops.
BOOST_AUTO_TEST_CASE(x_r_is_rounded_before_the_add) {
  const std::size_t n = 64;  // one block; x[0] = 3 sets absmax, so r = fl(7 / 3)
  const compress::codec_context ctx{.seed = 21, .step = 4, .tensor = 2};
  const philox_stream stream(ctx.seed, ctx.step, ctx.tensor);
  const float r = 7.0f / 3.0f;
  for (bool stochastic : {false, true}) {
    std::vector<float> x(n, 0.0f);
    std::vector<int> want(n, 7);
    x[0] = 3.0f;
    std::size_t sensitive = 0;
    for (std::size_t i = 1; i < n; ++i) {
      const float u = stochastic ? static_cast<float>(stream.word(i) >> 8) * 0x1p-24f : 0.0f;
      auto codec_code = [&](float v) {  // two roundings
        volatile float p = v * r;
        volatile float t = p + u;
        return static_cast<int>(stochastic ? std::floor(t) : std::nearbyint(p));
      };
      auto fused_code = [&](float v) {  // one rounding of x r + u (nearest: of x r + 1.5 2^23)
        return static_cast<int>(stochastic ? std::floor(std::fmaf(v, r, u))
                                           : std::fmaf(v, r, 12582912.0f) - 12582912.0f);
      };
      // Aim x r + u at an integer (nearest: x r at a half), then walk ulps.
      const int k = static_cast<int>(i % 11) - 5;
      const float aim = stochastic ? (static_cast<float>(k) - u) / r : (static_cast<float>(k) + 0.5f) / r;
      x[i] = aim;
      float up = aim, down = aim;
      for (int d = 0; d < 128; ++d, up = std::nextafter(up, 4.0f), down = std::nextafter(down, -4.0f)) {
        const float w = codec_code(up) != fused_code(up) ? up : down;
        if (std::fabs(w) < 3.0f && codec_code(w) != fused_code(w)) {
          x[i] = w;
          ++sensitive;
          break;
        }
      }
      want[i] = std::clamp(codec_code(x[i]), -7, 7);
    }
    BOOST_TEST_REQUIRE(sensitive >= n / 4, sensitive << " elements tell the roundings apart");
    const compress::block_quant c{{.bits = 4, .block = 64, .stochastic = stochastic}};
    const auto p = encode_to_vector(c, std::span<const float>(x), ctx);
    BOOST_TEST_REQUIRE(get_u32(p, 16) == std::bit_cast<std::uint32_t>(3.0f / 7.0f));
    for (std::size_t i = 0; i < n; ++i) {
      const unsigned byte = static_cast<unsigned>(p[20 + i / 2]);
      const int nib = static_cast<int>(i % 2 != 0 ? byte >> 4 : byte & 15u);
      BOOST_TEST((nib >= 8 ? nib - 16 : nib) == want[i], (stochastic ? "stochastic" : "nearest") << ", element " << i);
    }
  }
}

BOOST_AUTO_TEST_CASE(zero_and_tiny_blocks_send_step_zero) {
  std::vector<float> x(24, 0.0f);
  for (std::size_t i = 8; i < 16; ++i) x[i] = (i % 2 != 0 ? -1.0f : 1.0f) * 0x1p-125f;  // below 2^-120
  x[20] = 0.5f;
  for (bool stochastic : {false, true}) {  // stochastic: codes 0 whatever the random words
    const auto p = encode_to_vector(compress::block_quant{{.bits = 4, .block = 8, .stochastic = stochastic}},
                                    std::span<const float>(x), {.seed = 3});
    BOOST_TEST(get_u32(p, 16) == 0u);
    BOOST_TEST(get_u32(p, 20) == 0u);
    BOOST_TEST(get_u32(p, 24) == std::bit_cast<std::uint32_t>(0.5f / 7.0f));
    for (std::size_t j = 0; j < 8; ++j) BOOST_TEST(static_cast<unsigned>(p[28 + j]) == 0u, "code byte " << j);
    const auto d = decode(p, 24);
    for (std::size_t i = 0; i < 24; ++i) BOOST_TEST(d[i] == (i == 20 ? 0.5f : 0.0f));
  }
}

BOOST_AUTO_TEST_CASE(non_finite_input_is_refused_naming_the_block) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    auto x = normal_values(100, 73);
    x[70] = bad;
    std::vector<std::byte> out(compress::block_quant{}.max_encoded_bytes(100, dtype::f32));
    const auto r = compress::block_quant{}.encode(host_view<const float>(x.data(), 100), out, {});
    BOOST_TEST_REQUIRE(!r.has_value());
    BOOST_TEST((r.error().code() == errc::out_of_range));
    BOOST_TEST(r.error().message().find("block.input.block[1]") != std::string::npos, r.error().message());
  }
}

BOOST_AUTO_TEST_CASE(options_are_validated_by_name) {
  const std::vector<float> x(16, 1.0f);
  auto refused = [&](compress::block_quant_options o, const std::string& field) {
    const compress::block_quant c{o};
    BOOST_TEST(!c.validate().ok());
    BOOST_TEST(c.validate().message().rfind(field, 0) == 0u, c.validate().message());
    std::vector<std::byte> out(c.max_encoded_bytes(16, dtype::f32));
    const auto r = c.encode(host_view<const float>(x.data(), 16), out, {});
    BOOST_TEST_REQUIRE(!r.has_value());
    BOOST_TEST((r.error().code() == errc::invalid_argument));
    BOOST_TEST(r.error().message().rfind(field, 0) == 0u, r.error().message());
  };
  for (std::uint32_t bits : {0u, 1u, 3u, 5u, 16u}) refused({.bits = bits}, "block.bits = " + std::to_string(bits));
  for (std::uint32_t B : {0u, 4u, 12u, 65544u, 1u << 20})
    refused({.block = B}, "block.block = " + std::to_string(B));
  for (std::uint32_t B : {8u, 32u, 96u, 4096u, 65536u}) BOOST_TEST(compress::block_quant({.block = B}).validate().ok());
  BOOST_TEST(compress::block_quant::validate({.bits = 3}, "plan_update.codec_").message().rfind(
                 "plan_update.codec_bits = 3", 0) == 0u);
  std::vector<std::byte> small(10);
  const auto r = compress::block_quant{}.encode(host_view<const float>(x.data(), 16), small, {});
  BOOST_TEST((!r.has_value() && r.error().code() == errc::buffer_too_small));
}

BOOST_AUTO_TEST_CASE(malformed_payloads_are_refused_naming_the_field) {
  const std::size_t n = 21;  // 4 bits, B = 8: 3 blocks, 84 bits -> 11 code bytes, 4 padding bits
  const auto x = normal_values(n, 74);
  const compress::block_quant c{{.bits = 4, .block = 8}};
  const auto good = encode_to_vector(c, std::span<const float>(x));
  check_rejects_truncation(compress::block_quant{}, good, {n, dtype::f32});
  auto refused = [&](std::vector<std::byte> p, const std::string& field, compress::payload_info info = {21, dtype::f32}) {
    const status s = decode_guarded(compress::block_quant{}, p, info);
    BOOST_TEST(!s.ok(), field);
    BOOST_TEST(s.message().rfind(field, 0) == 0u, field << " vs " << s.message());
  };
  refused(good, "block.n", {22, dtype::f32});
  auto p = good;
  put_u32(p, 8, 12);
  refused(p, "block.block");
  p = good;
  put_u32(p, 8, 0);
  refused(p, "block.block");
  p = good;
  p[12] = std::byte{3};
  refused(p, "block.bits");
  p = good;
  p[13] = std::byte{2};
  refused(p, "block.rounding");
  p = good;
  p[15] = std::byte{1};
  refused(p, "block.reserved");
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -1.0f, -0.0f}) {
    p = good;
    put_u32(p, 16 + 4, std::bit_cast<std::uint32_t>(bad));
    refused(p, "block.step[1]");
  }
  p = good;
  p[28 + 5] = std::byte{0x80};  // the high nibble of byte 5 is -8
  refused(p, "block.code_byte[5]");
  p = good;
  p[28 + 2] = std::byte{0x18};  // the low nibble
  refused(p, "block.code_byte[2]");
  p = good;
  p[28 + 10] = std::byte{static_cast<unsigned char>(static_cast<unsigned>(p[28 + 10]) | 0x10u)};
  refused(p, "block.padding");
  // 8 and 2 bits: their one refused code.
  const auto p8 = encode_to_vector(compress::block_quant{{.bits = 8, .block = 8}}, std::span<const float>(x));
  auto q = p8;
  q[28 + 20] = std::byte{0x80};
  refused(q, "block.code_byte[20]");
  const auto p2 = encode_to_vector(compress::block_quant{{.bits = 2, .block = 8}}, std::span<const float>(x));
  q = p2;
  q[28 + 1] = std::byte{0x20};  // field 2 of byte 1 is 0b10
  refused(q, "block.code_byte[1]");
  q = p2;
  q[28 + 5] = std::byte{static_cast<unsigned char>(static_cast<unsigned>(q[28 + 5]) | 0x04u)};  // n = 21: 2 bits used
  refused(q, "block.padding");
  // Bad arguments.
  std::vector<float> acc(n, 0.0f);
  BOOST_TEST(!compress::block_quant{}.decode_add(good, {n, dtype::f32}, host_view<float>(acc.data(), n),
                                                 std::numeric_limits<float>::infinity(), {}).ok());
  BOOST_TEST(!compress::block_quant{}.decode_add(good, {n, dtype::f64}, host_view<float>(acc.data(), n), 1.0f, {}).ok());
}

// Through the registry by id, and with error feedback: what one step drops
// the next one sends (x + e decodes to within half a step of what it was).
BOOST_AUTO_TEST_CASE(registry_and_error_feedback) {
  const std::size_t n = 300;
  const auto x = normal_values(n, 75);
  const compress::block_quant c{{.bits = 2, .block = 32}};
  const auto p = encode_to_vector(c, std::span<const float>(x));
  std::vector<float> a(n, 0.0f);
  BOOST_TEST_REQUIRE(compress::decode_add(codec_id::block, p, {n, dtype::f32}, host_view<float>(a.data(), n), 1.0f, {}).ok());
  BOOST_TEST(a == decode(p, n));
  BOOST_TEST(to_string(codec_id::block) == "block");

  compress::error_feedback<compress::block_quant> ef{c};
  std::vector<std::byte> out(ef.max_encoded_bytes(n, dtype::f32));
  std::vector<float> sent(n, 0.0f);
  const std::vector<float> zeros(n, 0.0f);
  double first_err = 0, left = 0;
  for (int step = 0; step < 8; ++step) {
    const auto& in = step == 0 ? x : zeros;
    const auto used = ef.encode(host_view<const float>(in.data(), n), out, {.step = static_cast<std::uint64_t>(step)});
    BOOST_TEST_REQUIRE(used.has_value());
    BOOST_TEST_REQUIRE(c.decode_add({out.data(), *used}, {n, dtype::f32}, host_view<float>(sent.data(), n), 1.0f, {}).ok());
    double err = 0;
    for (std::size_t i = 0; i < n; ++i) err += std::fabs(static_cast<double>(x[i]) - sent[i]);
    if (step == 0) first_err = err;
    left = err;
  }
  // 2-bit sends drop most of x at once; the residual drains it step by step.
  BOOST_TEST(left < first_err / 4, "left " << left << " of " << first_err);
}
