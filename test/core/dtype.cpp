#include <ashl/core/dtype.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

// Every 16-bit pattern is decoded and checked against a reference computed
// with exact double arithmetic (ldexp), and every float -> 16-bit conversion
// is checked against a reference that rounds in double with nearbyint (ties
// to even under the default rounding mode). Both references are written from
// the IEEE 754 definitions, not from the bit tricks in dtype.hpp.

namespace {

using ashl::detail::bits_float;
using ashl::detail::float_bits;

// IEEE binary16 / bfloat16 value of a pattern, computed from the definition.
double ref_decode(std::uint16_t h, int exp_bits, int man_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const bool neg = (h >> 15) & 1u;
  const int e = (h >> man_bits) & ((1 << exp_bits) - 1);
  const int m = h & ((1 << man_bits) - 1);
  double v;
  if (e == (1 << exp_bits) - 1) {
    v = m == 0 ? HUGE_VAL : std::nan("");
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - man_bits);
  } else {
    v = std::ldexp(static_cast<double>((1 << man_bits) + m), e - bias - man_bits);
  }
  return neg ? -v : v;
}

// Round a finite float to the nearest binary format with the given widths,
// ties to even, and return the pattern.
std::uint16_t ref_encode(float f, int exp_bits, int man_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const std::uint16_t sign = std::signbit(f) ? 0x8000u : 0u;
  const double a = std::fabs(static_cast<double>(f));
  if (a == 0) return sign;
  const int emin = 1 - bias;  // exponent of the smallest normal
  int e;
  std::frexp(a, &e);  // a = fr * 2^e, fr in [0.5, 1): exponent of a is e - 1
  const int ue = std::max(e - 1, emin) - man_bits;  // unit in the last place
  const double q = std::nearbyint(std::ldexp(a, -ue));  // exact scaling, RNE
  const double r = std::ldexp(q, ue);
  const double max_finite = std::ldexp(std::ldexp(1.0, man_bits + 1) - 1, bias - man_bits);
  const std::uint16_t inf = static_cast<std::uint16_t>(((1u << exp_bits) - 1) << man_bits);
  if (r > max_finite) return sign | inf;
  if (r < std::ldexp(1.0, emin))  // subnormal (or rounded to zero)
    return sign | static_cast<std::uint16_t>(std::ldexp(r, bias - 1 + man_bits));
  int re;
  const double rf = std::frexp(r, &re);
  const auto mant = static_cast<std::uint16_t>(std::ldexp(rf * 2 - 1, man_bits));
  return sign | static_cast<std::uint16_t>((re - 1 + bias) << man_bits) | mant;
}

std::uint16_t ref_f16(float f) { return ref_encode(f, 5, 10); }
std::uint16_t ref_bf16(float f) { return ref_encode(f, 8, 7); }

bool is_nan16(std::uint16_t h, int exp_bits, int man_bits) {
  const unsigned e = (h >> man_bits) & ((1u << exp_bits) - 1);
  return e == (1u << exp_bits) - 1 && (h & ((1u << man_bits) - 1)) != 0;
}

void check_encode(float f) {
  if (std::isnan(f)) return;
  const std::uint16_t h = ashl::detail::f32_to_f16_bits(f);
  const std::uint16_t b = ashl::detail::f32_to_bf16_bits(f);
  const std::uint16_t rh = ref_f16(f), rb = ref_bf16(f);
  if (h != rh) BOOST_ERROR("f16 of float bits 0x" << std::hex << float_bits(f) << ": got 0x" << h << " want 0x" << rh);
  if (b != rb) BOOST_ERROR("bf16 of float bits 0x" << std::hex << float_bits(f) << ": got 0x" << b << " want 0x" << rb);
#if defined(__FLT16_MAX__) && (defined(__x86_64__) || defined(__aarch64__))
  const _Float16 hw = static_cast<_Float16>(f);
  std::uint16_t hwb;
  std::memcpy(&hwb, &hw, 2);
  if (h != hwb) BOOST_ERROR("f16 of float bits 0x" << std::hex << float_bits(f) << ": got 0x" << h << " _Float16 0x" << hwb);
#endif
}

}  // namespace

BOOST_AUTO_TEST_CASE(sizes_names_and_bytes) {
  BOOST_TEST(ashl::size_of(ashl::dtype::f32) == 4u);
  BOOST_TEST(ashl::size_of(ashl::dtype::f16) == 2u);
  BOOST_TEST(ashl::size_of(ashl::dtype::bf16) == 2u);
  BOOST_TEST(ashl::size_of(ashl::dtype::f64) == 8u);
  BOOST_TEST(ashl::size_of(ashl::dtype::i8) == 1u);
  BOOST_TEST(ashl::size_of(ashl::dtype::u8) == 1u);
  for (int i = 0; i < ashl::dtype_count; ++i) {
    const auto t = static_cast<ashl::dtype>(i);
    BOOST_TEST((ashl::dtype_from_string(ashl::to_string(t)).value() == t));
    BOOST_TEST((ashl::dtype_from_byte(static_cast<std::uint8_t>(i)).value() == t));
  }
  BOOST_TEST(!ashl::dtype_from_byte(6).has_value());
  BOOST_TEST(!ashl::dtype_from_byte(255).has_value());
  BOOST_TEST(!ashl::dtype_from_string("f8").has_value());
  BOOST_TEST(ashl::is_floating(ashl::dtype::bf16));
  BOOST_TEST(!ashl::is_floating(ashl::dtype::u8));
  static_assert(ashl::dtype_of<ashl::half> == ashl::dtype::f16);
  static_assert(ashl::dtype_of<ashl::bfloat16> == ashl::dtype::bf16);
  static_assert(ashl::gradient_element<ashl::half> && !ashl::gradient_element<double>);
}

BOOST_AUTO_TEST_CASE(f16_every_pattern_decodes_exactly_and_round_trips) {
  int nans = 0;
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const auto h = static_cast<std::uint16_t>(p);
    const float got = ashl::detail::f16_bits_to_f32(h);
    const double want = ref_decode(h, 5, 10);
    if (is_nan16(h, 5, 10)) {
      ++nans;
      BOOST_TEST_REQUIRE(std::isnan(got));
      BOOST_TEST_REQUIRE(std::signbit(got) == ((h & 0x8000u) != 0));
      const std::uint16_t back = ashl::detail::f32_to_f16_bits(got);
      BOOST_TEST_REQUIRE(is_nan16(back, 5, 10));
      BOOST_TEST_REQUIRE((back & 0x8000u) == (h & 0x8000u));
      continue;
    }
    BOOST_TEST_REQUIRE(static_cast<double>(got) == want, "pattern " << p);
    BOOST_TEST_REQUIRE(std::signbit(got) == ((h & 0x8000u) != 0), "pattern " << p);
    BOOST_TEST_REQUIRE(ashl::detail::f32_to_f16_bits(got) == h, "pattern " << p);
    BOOST_TEST_REQUIRE(ashl::half::from_float(ashl::half{h}.to_float()).bits == h);
  }
  BOOST_TEST(nans == 2 * 1023);
}

BOOST_AUTO_TEST_CASE(bf16_every_pattern_decodes_exactly_and_round_trips) {
  int nans = 0;
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const auto b = static_cast<std::uint16_t>(p);
    const float got = ashl::detail::bf16_bits_to_f32(b);
    const double want = ref_decode(b, 8, 7);
    if (is_nan16(b, 8, 7)) {
      ++nans;
      BOOST_TEST_REQUIRE(std::isnan(got));
      const std::uint16_t back = ashl::detail::f32_to_bf16_bits(got);
      BOOST_TEST_REQUIRE(is_nan16(back, 8, 7));
      BOOST_TEST_REQUIRE((back & 0x8000u) == (b & 0x8000u));
      continue;
    }
    BOOST_TEST_REQUIRE(static_cast<double>(got) == want, "pattern " << p);
    BOOST_TEST_REQUIRE(std::signbit(got) == ((b & 0x8000u) != 0), "pattern " << p);
    BOOST_TEST_REQUIRE(ashl::detail::f32_to_bf16_bits(got) == b, "pattern " << p);
  }
  BOOST_TEST(nans == 2 * 127);
}

BOOST_AUTO_TEST_CASE(encode_at_every_midpoint_and_its_neighbours) {
  // For each pair of adjacent 16-bit values, the exact midpoint (a tie), and
  // the floats one ulp either side of it, exercise every rounding boundary.
  for (int fmt = 0; fmt < 2; ++fmt) {
    const int eb = fmt == 0 ? 5 : 8, mb = fmt == 0 ? 10 : 7;
    for (std::uint32_t p = 0; p < 0x7fffu; ++p) {
      const auto lo = static_cast<std::uint16_t>(p);
      if (is_nan16(lo, eb, mb) || is_nan16(static_cast<std::uint16_t>(p + 1), eb, mb)) continue;
      const double a = ref_decode(lo, eb, mb);
      double b = ref_decode(static_cast<std::uint16_t>(p + 1), eb, mb);
      if (std::isinf(a)) continue;
      if (std::isinf(b)) b = 2 * a - ref_decode(static_cast<std::uint16_t>(p - 1), eb, mb);  // next binade step
      const double mid = (a + b) / 2;
      const float fm = static_cast<float>(mid);
      if (static_cast<double>(fm) != mid) continue;  // not representable (cannot happen for these formats)
      for (float f : {fm, std::nextafter(fm, 0.0f), std::nextafter(fm, HUGE_VALF), static_cast<float>(a)}) {
        check_encode(f);
        check_encode(-f);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(encode_random_and_strided_floats) {
  std::mt19937 rng(12345);
  for (int i = 0; i < 400000; ++i) check_encode(bits_float(rng()));
  // Strided sweep over every exponent, with low mantissa bits varied.
  for (std::uint64_t x = 0; x < 0x100000000ull; x += 0x1003u) check_encode(bits_float(static_cast<std::uint32_t>(x)));
}

BOOST_AUTO_TEST_CASE(ties_round_to_even) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: even (1.0) wins.
  BOOST_TEST(ashl::half::from_float(1.0f + 0x1p-11f).bits == 0x3c00u);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  BOOST_TEST(ashl::half::from_float(1.0f + 3 * 0x1p-11f).bits == 0x3c02u);
  BOOST_TEST(ashl::half::from_float(std::nextafter(1.0f + 0x1p-11f, 2.0f)).bits == 0x3c01u);
  // bf16: 1 + 2^-8 ties to 1.0; 1 + 3 * 2^-8 ties up to 1 + 2^-6.
  BOOST_TEST(ashl::bfloat16::from_float(1.0f + 0x1p-8f).bits == 0x3f80u);
  BOOST_TEST(ashl::bfloat16::from_float(1.0f + 3 * 0x1p-8f).bits == 0x3f82u);
  // Subnormal ties: 2^-25 (half the smallest subnormal) goes to 0; 3 * 2^-25 to 2 * 2^-24.
  BOOST_TEST(ashl::half::from_float(0x1p-25f).bits == 0x0000u);
  BOOST_TEST(ashl::half::from_float(std::nextafter(0x1p-25f, 1.0f)).bits == 0x0001u);
  BOOST_TEST(ashl::half::from_float(3 * 0x1p-25f).bits == 0x0002u);
}

BOOST_AUTO_TEST_CASE(overflow_goes_to_infinity) {
  BOOST_TEST(ashl::half::from_float(65504.0f).bits == 0x7bffu);
  BOOST_TEST(ashl::half::from_float(std::nextafter(65520.0f, 0.0f)).bits == 0x7bffu);
  BOOST_TEST(ashl::half::from_float(65520.0f).bits == 0x7c00u);  // tie with odd 65504 -> inf
  BOOST_TEST(ashl::half::from_float(-1e10f).bits == 0xfc00u);
  BOOST_TEST(ashl::half::from_float(HUGE_VALF).bits == 0x7c00u);
  BOOST_TEST(ashl::bfloat16::from_float(std::numeric_limits<float>::max()).bits == 0x7f80u);
  BOOST_TEST(ashl::bfloat16::from_float(-std::numeric_limits<float>::max()).bits == 0xff80u);
  BOOST_TEST(ashl::bfloat16::from_float(-HUGE_VALF).bits == 0xff80u);
  BOOST_TEST(std::isinf(ashl::half{0x7c00u}.to_float()));
}

BOOST_AUTO_TEST_CASE(subnormals_and_negative_zero) {
  BOOST_TEST(ashl::half{0x0001u}.to_float() == 0x1p-24f);
  BOOST_TEST(ashl::half{0x03ffu}.to_float() == 1023 * 0x1p-24f);
  BOOST_TEST(ashl::half::from_float(0x1p-24f).bits == 0x0001u);
  BOOST_TEST(ashl::half::from_float(-0x1p-14f).bits == 0x8400u);
  BOOST_TEST(ashl::half::from_float(0x1p-30f).bits == 0x0000u);
  BOOST_TEST(ashl::half::from_float(-0x1p-30f).bits == 0x8000u);
  BOOST_TEST(ashl::half::from_float(-0.0f).bits == 0x8000u);
  BOOST_TEST(std::signbit(ashl::half{0x8000u}.to_float()));
  BOOST_TEST(ashl::bfloat16::from_float(-0.0f).bits == 0x8000u);
  BOOST_TEST(ashl::bfloat16{0x0001u}.to_float() == 0x1p-133f);
  BOOST_TEST(ashl::bfloat16::from_float(0x1p-149f).bits == 0x0000u);  // float subnormal below half a bf16 ulp
  BOOST_TEST(ashl::bfloat16::from_float(0x1p-133f).bits == 0x0001u);
}

BOOST_AUTO_TEST_CASE(nan_stays_nan) {
  for (std::uint32_t payload : {0x1u, 0x400000u, 0x7fffffu, 0x2000u, 0x1fffu, 0x10000u}) {
    for (std::uint32_t sign : {0u, 0x80000000u}) {
      const float f = bits_float(sign | 0x7f800000u | payload);
      BOOST_TEST_REQUIRE(std::isnan(f));
      const auto h = ashl::half::from_float(f);
      const auto b = ashl::bfloat16::from_float(f);
      BOOST_TEST(std::isnan(h.to_float()));
      BOOST_TEST(std::isnan(b.to_float()));
      BOOST_TEST(std::signbit(h.to_float()) == (sign != 0));
      BOOST_TEST(std::signbit(b.to_float()) == (sign != 0));
    }
  }
}

BOOST_AUTO_TEST_CASE(uniform_float_helpers) {
  BOOST_TEST(ashl::to_float(ashl::from_float<ashl::half>(2.5f)) == 2.5f);
  BOOST_TEST(ashl::to_float(ashl::from_float<ashl::bfloat16>(-3.0f)) == -3.0f);
  BOOST_TEST(ashl::from_float<float>(1.25f) == 1.25f);
}
