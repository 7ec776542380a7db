#include <ashl/compress/cast.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/codec_testing.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

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

// The F16C kernels (x86 with F16C and AVX2, chosen at run time) against the
// portable ones and core/dtype.hpp, bit for bit; on other CPUs both calls
// take the portable path and the test still checks it against core.
BOOST_AUTO_TEST_CASE(f16c_path_is_bit_exact) {
  using compress::detail::convert_path;
  // Every exponent by a stride, each half's rounding midpoint with its two
  // float neighbours (ties to even), both signs, and NaNs of every top
  // payload with quiet and signalling bits.
  std::vector<float> x = pattern_floats();
  for (std::uint32_t h = 0; h < 0x7c00u; ++h) {
    const double mid = (double(detail::f16_bits_to_f32(static_cast<std::uint16_t>(h))) +
                        double(detail::f16_bits_to_f32(static_cast<std::uint16_t>(h + 1)))) / 2;
    const float m = static_cast<float>(mid);  // exact: 12 significant bits
    for (float v : {m, std::nextafter(m, 0.0f), std::nextafter(m, 1e30f)}) {
      x.push_back(v);
      x.push_back(-v);
    }
  }
  for (std::uint32_t p = 0; p < 0x400000u; p += 0x1fffu)
    for (std::uint32_t top : {0x7f800000u, 0xff800000u}) x.push_back(detail::bits_float(top | (p == 0 ? 1u : p)));
  std::vector<std::byte> best(2 * x.size()), portable(2 * x.size());
  const bool ob = compress::detail::convert_f32_to_16<true>(x.data(), best.data(), x.size(), convert_path::best);
  const bool op = compress::detail::convert_f32_to_16<true>(x.data(), portable.data(), x.size(), convert_path::portable);
  BOOST_CHECK(ob && op);  // 65520 and larger are in the set
  std::size_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::uint16_t a, b;
    std::memcpy(&a, best.data() + 2 * i, 2);
    std::memcpy(&b, portable.data() + 2 * i, 2);
    bad += a != b || a != detail::f32_to_f16_bits(x[i]);
  }
  BOOST_CHECK_EQUAL(bad, 0u);
  // The overflow flag of every window (lengths cross the 16-lane blocks).
  bad = 0;
  std::size_t flagged = 0;
  for (std::size_t i = 0, len = 1; i + len <= x.size(); i += len, len = len % 61 + 1) {
    bool expect = false;
    for (std::size_t j = i; j < i + len; ++j)
      expect |= std::isfinite(x[j]) && std::isinf(detail::f16_bits_to_f32(detail::f32_to_f16_bits(x[j])));
    bad += compress::detail::convert_f32_to_16<true>(x.data() + i, best.data(), len, convert_path::best) != expect;
    bad += compress::detail::convert_f32_to_16<true>(x.data() + i, best.data(), len, convert_path::portable) != expect;
    flagged += expect;
  }
  BOOST_CHECK_EQUAL(bad, 0u);
  BOOST_CHECK_GT(flagged, 100u);

  // Decode-add of all 65536 patterns, several scales and accumulators: the
  // accumulator bits agree exactly, NaNs included.
  std::vector<std::byte> all(2 * 65536);
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto v = static_cast<std::uint16_t>(h);
    std::memcpy(all.data() + 2 * h, &v, 2);
  }
  bad = 0;
  for (float scale : {1.0f, -0.5f, 3.0e-3f, 0.0f}) {
    for (float start : {0.0f, -0.0f, 1.25f, -65504.0f}) {
      for (std::size_t off : {std::size_t{0}, std::size_t{3}}) {  // unaligned starts and tails
        const std::size_t n = 65536 - off;
        std::vector<float> a(n, start), b(n, start);
        compress::detail::add_dense(all.data() + 2 * off, dtype::f16, a.data(), n, scale, convert_path::best);
        compress::detail::add_dense(all.data() + 2 * off, dtype::f16, b.data(), n, scale, convert_path::portable);
        for (std::size_t i = 0; i < n; ++i) {
          const float want = start + scale * detail::f16_bits_to_f32(static_cast<std::uint16_t>(i + off));
          bad += detail::float_bits(a[i]) != detail::float_bits(b[i]);
          bad += !std::isnan(want) && detail::float_bits(a[i]) != detail::float_bits(want);
        }
      }
    }
  }
  BOOST_CHECK_EQUAL(bad, 0u);
}

// Strict mode names the first overflowing index wherever it lies (the
// 16-lane kernel or the tail), and inf, NaN and 65519.99 are no overflow.
BOOST_AUTO_TEST_CASE(strict_mode_over_the_kernel_and_the_tail) {
  const compress::fp16 strict{compress::cast_options{.strict = true}};
  for (std::size_t n : {std::size_t{10000}, std::size_t{10007}}) {
    std::vector<float> x(n, 0.5f);
    x[100] = std::numeric_limits<float>::infinity();
    x[200] = -std::numeric_limits<float>::quiet_NaN();
    x[300] = std::nextafter(65520.0f, 0.0f);
    std::vector<std::byte> out(2 * n);
    BOOST_CHECK(strict.encode(host_view<const float>(x.data(), n), out, {}).has_value());
    for (std::size_t at : {std::size_t{5000}, n - 1, n - 3}) {
      auto y = x;
      y[at] = -65520.0f;
      y[at - 1000] = 3e38f;
      auto r = strict.encode(host_view<const float>(y.data(), n), out, {});
      BOOST_REQUIRE(!r.has_value());
      BOOST_CHECK_EQUAL(r.error().message(), "fp16.input[" + std::to_string(at - 1000) +
                                                 "] = 3e+38: overflows fp16 to inf (|x| >= 65520)");
      y[at - 1000] = 0.5f;
      r = strict.encode(host_view<const float>(y.data(), n), out, {});
      BOOST_REQUIRE(!r.has_value());
      BOOST_CHECK_NE(r.error().message().find("fp16.input[" + std::to_string(at) + "]"), std::string::npos);
      // Lax mode writes -inf there and succeeds.
      BOOST_REQUIRE(compress::fp16{}.encode(host_view<const float>(y.data(), n), out, {}).has_value());
      std::uint16_t h;
      std::memcpy(&h, out.data() + 2 * at, 2);
      BOOST_CHECK_EQUAL(h, 0xfc00u);
    }
  }
}

// bf16 of f16 input: every f16 pattern (NaNs, infinities, subnormals, both
// zeros), plus a tail that is not a multiple of the 16-element kernel, equals
// the scalar route f16 -> f32 -> bf16 (round to nearest even, NaN quiet).
BOOST_AUTO_TEST_CASE(bf16_of_every_f16_pattern) {
  std::vector<half> x(65536 + 13);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto b = static_cast<std::uint16_t>(i);
    std::memcpy(&x[i], &b, 2);
  }
  std::vector<std::byte> out(2 * x.size());
  const auto used = compress::bf16{}.encode(host_view<const half>(x.data(), x.size()), out, {});
  BOOST_TEST_REQUIRE(used.has_value());
  BOOST_TEST(*used == out.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::uint16_t h = 0, got = 0;
    std::memcpy(&h, &x[i], 2);
    std::memcpy(&got, out.data() + 2 * i, 2);
    const std::uint16_t want = compress::detail::f32_to_bf16_rne(compress::detail::f16_to_f32(h));
    if (got != want && bad++ < 5) BOOST_TEST(got == want, "f16 pattern " << h);
  }
  BOOST_TEST(bad == 0u);
}
