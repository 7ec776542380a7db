#include <ashl/compress/cast.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/codec_testing.hpp"

#include <cmath>
#include <cstring>
#include <limits>

using namespace ashl;
using namespace codec_testing;

namespace {
// Bit patterns covering every exponent, rounding boundaries and specials,
// converted through the codec (vectorized path plus the scalar tail).
std::vector<float> pattern_floats() {
  std::vector<float> v;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 4099) v.push_back(detail::bits_float(static_cast<std::uint32_t>(u)));
  for (std::uint32_t b : {0x477fefffu, 0x477ff000u, 0x477ff001u, 0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u,
                          0x7f800000u, 0x7fc00000u, 0x7f800001u, 0xff800000u, 0x80000000u, 0x00000001u, 0x7f7fffffu})
    v.push_back(detail::bits_float(b));
  return v;
}
}  // namespace

BOOST_AUTO_TEST_CASE(conversions_match_core_dtype_bit_for_bit) {
  const auto x = pattern_floats();
  auto ph = encode_to_vector(compress::fp16{}, std::span<const float>(x));
  auto pb = encode_to_vector(compress::bf16{}, std::span<const float>(x));
  BOOST_REQUIRE_EQUAL(ph.size(), 2 * x.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::uint16_t h, b;
    std::memcpy(&h, ph.data() + 2 * i, 2);
    std::memcpy(&b, pb.data() + 2 * i, 2);
    bad += h != detail::f32_to_f16_bits(x[i]);
    bad += b != detail::f32_to_bf16_bits(x[i]);
  }
  BOOST_CHECK_EQUAL(bad, 0u);
  // Decode of every 16-bit pattern equals core's widening.
  std::vector<std::byte> all(2 * 65536);
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto v = static_cast<std::uint16_t>(h);
    std::memcpy(all.data() + 2 * h, &v, 2);
  }
  std::vector<float> acc(65536, 0.0f), accb(65536, 0.0f);
  BOOST_REQUIRE(compress::fp16{}.decode_add(all, {65536, dtype::f32}, host_view<float>(acc.data(), 65536), 1.0f, {}).ok());
  BOOST_REQUIRE(compress::bf16{}.decode_add(all, {65536, dtype::f32}, host_view<float>(accb.data(), 65536), 1.0f, {}).ok());
  bad = 0;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float a = detail::f16_bits_to_f32(static_cast<std::uint16_t>(h));
    const float b = detail::bf16_bits_to_f32(static_cast<std::uint16_t>(h));
    const float ea = 0.0f + a, eb = 0.0f + b;  // what adding into a zero accumulator gives
    if (std::isnan(a)) bad += !std::isnan(acc[h]); else bad += detail::float_bits(acc[h]) != detail::float_bits(ea);
    if (std::isnan(b)) bad += !std::isnan(accb[h]); else bad += detail::float_bits(accb[h]) != detail::float_bits(eb);
  }
  BOOST_CHECK_EQUAL(bad, 0u);
}

BOOST_AUTO_TEST_CASE(own_16_bit_type_is_lossless) {
  std::vector<half> h(65536);
  std::vector<bfloat16> b(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    h[i] = half{static_cast<std::uint16_t>(i)};
    b[i] = bfloat16{static_cast<std::uint16_t>(i)};
  }
  auto ph = encode_to_vector(compress::fp16{}, std::span<const half>(h));
  auto pb = encode_to_vector(compress::bf16{}, std::span<const bfloat16>(b));
  BOOST_CHECK(std::memcmp(ph.data(), h.data(), ph.size()) == 0);
  BOOST_CHECK(std::memcmp(pb.data(), b.data(), pb.size()) == 0);
}

BOOST_AUTO_TEST_CASE(relative_error_bounds_in_normal_range) {
  auto x = normal_values(4097, 5, 100.0f);
  auto ph = encode_to_vector(compress::fp16{}, std::span<const float>(x));
  auto pb = encode_to_vector(compress::bf16{}, std::span<const float>(x));
  std::vector<float> ah(x.size(), 0.0f), ab(x.size(), 0.0f);
  BOOST_REQUIRE(compress::fp16{}.decode_add(ph, {x.size(), dtype::f32}, host_view<float>(ah.data(), ah.size()), 1.0f, {}).ok());
  BOOST_REQUIRE(compress::bf16{}.decode_add(pb, {x.size(), dtype::f32}, host_view<float>(ab.data(), ab.size()), 1.0f, {}).ok());
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(x[i]) < 6.2e-5f) continue;  // below fp16's normal range
    BOOST_CHECK_LE(std::fabs(ah[i] - x[i]), std::ldexp(std::fabs(x[i]), -11));
    BOOST_CHECK_LE(std::fabs(ab[i] - x[i]), std::ldexp(std::fabs(x[i]), -8));
  }
  // bf16 input through fp16: widened exactly, rounded once.
  auto xb = to_type<bfloat16>(x);
  auto pbh = encode_to_vector(compress::fp16{}, std::span<const bfloat16>(xb));
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::uint16_t h;
    std::memcpy(&h, pbh.data() + 2 * i, 2);
    BOOST_CHECK_EQUAL(h, detail::f32_to_f16_bits(xb[i].to_float()));
  }
}

BOOST_AUTO_TEST_CASE(strict_mode_names_the_overflowing_index) {
  std::vector<float> x(100, 1.0f);
  x[17] = 70000.0f;
  x[50] = std::numeric_limits<float>::infinity();  // already inf: carried, not an overflow
  std::vector<std::byte> out(200);
  auto lax = compress::fp16{}.encode(host_view<const float>(x.data(), x.size()), out, {});
  BOOST_REQUIRE(lax.has_value());
  std::uint16_t h;
  std::memcpy(&h, out.data() + 34, 2);
  BOOST_CHECK_EQUAL(h, 0x7c00u);
  auto strict = compress::fp16{compress::cast_options{.strict = true}}.encode(host_view<const float>(x.data(), x.size()), out, {});
  BOOST_REQUIRE(!strict.has_value());
  BOOST_CHECK_EQUAL(strict.error().message(), "fp16.input[17] = 70000: overflows fp16 to inf (|x| >= 65520)");
  x[17] = 65519.0f;
  BOOST_CHECK(compress::fp16{compress::cast_options{.strict = true}}.encode(host_view<const float>(x.data(), x.size()), out, {}).has_value());
  x[3] = -std::numeric_limits<float>::max();
  auto sb = compress::bf16{compress::cast_options{.strict = true}}.encode(host_view<const float>(x.data(), x.size()), out, {});
  BOOST_REQUIRE(!sb.has_value());
  BOOST_CHECK_NE(sb.error().message().find("bf16.input[3]"), std::string::npos);
  // f16 input overflows nothing in bf16; bf16 input can overflow fp16.
  std::vector<bfloat16> xb(9, bfloat16::from_float(1.0f));
  xb[8] = bfloat16::from_float(1e6f);
  auto sbh = compress::fp16{compress::cast_options{.strict = true}}.encode(host_view<const bfloat16>(xb.data(), xb.size()), out, {});
  BOOST_REQUIRE(!sbh.has_value());
  BOOST_CHECK_NE(sbh.error().message().find("fp16.input[8]"), std::string::npos);
}

BOOST_AUTO_TEST_CASE(sizes_and_rejections) {
  auto x = normal_values(11, 6);
  for (auto t : {dtype::f32, dtype::f16, dtype::bf16}) {
    BOOST_CHECK_EQUAL(compress::fp16{}.max_encoded_bytes(11, t), 22u);
    BOOST_CHECK_EQUAL(compress::bf16{}.max_encoded_bytes(11, t), 22u);
  }
  auto p = encode_to_vector(compress::fp16{}, std::span<const float>(x));
  check_rejects_truncation(compress::fp16{}, p, {x.size(), dtype::f32});
  check_rejects_truncation(compress::bf16{}, p, {x.size(), dtype::bf16});
  BOOST_CHECK(!decode_guarded(compress::fp16{}, p, {x.size(), dtype::u8}).ok());
}
