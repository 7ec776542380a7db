// The vector kernels behind qsgd, terngrad, sign and natural (4/8/16 lanes,
// chosen at run time) against plain scalar statements of the same rules.
#include <ashl/compress/detail/quantize.hpp>
#include <boost/test/unit_test.hpp>

#include <ashl/core/philox.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

using namespace ashl;
namespace cd = ashl::compress::detail;

namespace {
std::vector<float> values(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = (i % 9 == 0) ? (i % 2 ? -0.0f : 0.0f) : d(g);
  return x;
}
std::vector<std::uint32_t> words(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<std::uint32_t> w(n);
  for (auto& v : w) v = g();
  return w;
}
}  // namespace

BOOST_AUTO_TEST_CASE(round_levels_matches_the_scalar_rule) {
  for (std::size_t m : {1u, 7u, 8u, 15u, 16u, 17u, 100u, 1024u}) {
    const auto x = values(m, 1 + static_cast<std::uint32_t>(m));
    const auto w = words(m, 2 + static_cast<std::uint32_t>(m));
    for (float L : {1.0f, 7.0f, 127.0f, 32767.0f}) {
      const float k = L / 2.5f;
      std::vector<std::uint16_t> c(m);
      cd::round_levels(x.data(), m, k, L, w.data(), c.data());
      for (std::size_t i = 0; i < m; ++i) {
        float r = std::fabs(x[i]) * k;
        r = r < L ? r : L;
        const int l = static_cast<int>(std::floor(r));
        const int level = l + (uniform01(w[i]) < r - static_cast<float>(l) ? 1 : 0);
        const unsigned sign = (std::signbit(x[i]) && level != 0) ? 1u : 0u;
        BOOST_REQUIRE_EQUAL(c[i], static_cast<std::uint16_t>((static_cast<unsigned>(level) << 1) | sign));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(natural_codes_match_frexp_rule) {
  const std::size_t m = 1000;
  auto x = values(m, 5);
  x[1] = 1e-40f;   // subnormal
  x[2] = -3e-39f;  // subnormal, negative
  x[3] = 1.0f;     // exact power of two
  for (std::int32_t emin : {-20, -3, -126, -274, 1}) {
    const auto w = words(m, 6 + static_cast<std::uint32_t>(emin + 300));
    float f[3];
    for (int j = 0, rest = 24 - emin; j < 3; ++j) {
      const int p = rest < 127 ? rest : 127;
      f[j] = std::ldexp(1.0f, p);
      rest -= p;
    }
    std::vector<std::byte> c(m);
    cd::natural_codes(x.data(), m, emin, f, w.data(), c.data());
    for (std::size_t i = 0; i < m; ++i) {
      const float a = std::fabs(x[i]), u = uniform01(w[i]);
      int e = 0;
      const float mm = std::frexp(a, &e);
      const int low = e - emin;
      int code = low >= 1 ? low + (u < 2.0f * mm - 1.0f ? 1 : 0)
                          : (static_cast<double>(u) < std::ldexp(static_cast<double>(a), -emin) ? 1 : 0);
      code = code > 127 ? 127 : code;
      code = a == 0.0f ? 0 : code;
      const unsigned want = static_cast<unsigned>(code) | ((x[i] < 0.0f && code != 0) ? 0x80u : 0u);
      BOOST_REQUIRE_EQUAL(static_cast<unsigned>(c[i]), want);
    }
  }
}

BOOST_AUTO_TEST_CASE(pack_unpack_round_trip_every_width) {
  std::mt19937 g(7);
  for (unsigned w = 1; w <= 16; ++w) {
    for (std::size_t m : {1u, 5u, 8u, 13u, 64u, 1024u}) {
      std::vector<std::uint16_t> c(m), back(m);
      for (auto& v : c) v = static_cast<std::uint16_t>(g() & ((1u << w) - 1));
      const std::size_t bytes = (m * w + 7) / 8;
      std::vector<std::byte> out(bytes + 8, std::byte{0xee});
      cd::pack_chunk(c.data(), m, w, out.data(), bytes);
      for (std::size_t j = bytes; j < out.size(); ++j) BOOST_REQUIRE(out[j] == std::byte{0xee});  // no overrun
      if ((m * w) % 8 != 0) BOOST_CHECK_EQUAL(static_cast<unsigned>(out[bytes - 1]) >> ((m * w) % 8), 0u);
      cd::unpack_chunk(out.data(), m, w, back.data());
      BOOST_REQUIRE(back == c);
      // LSB-first bit stream: code i is bits [i w, (i + 1) w).
      for (std::size_t i = 0; i < m; ++i) {
        unsigned v = 0;
        for (unsigned b = 0; b < w; ++b) {
          const std::size_t bit = i * w + b;
          v |= ((static_cast<unsigned>(out[bit / 8]) >> (bit % 8)) & 1u) << b;
        }
        BOOST_REQUIRE_EQUAL(v, c[i]);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(statistics_and_sign_bits) {
  auto x = values(1003, 8);
  cd::bucket_stats st = cd::stats(x.data(), x.size());
  double sq = 0, ab = 0;
  float mx = 0;
  for (float v : x) {
    sq += double(v) * v;
    ab += std::fabs(double(v));
    mx = std::max(mx, std::fabs(v));
  }
  BOOST_CHECK_CLOSE(st.sum_sq, sq, 1e-3);
  BOOST_CHECK_CLOSE(st.sum_abs, ab, 1e-3);
  BOOST_CHECK_EQUAL(st.max_abs(), mx);
  BOOST_CHECK(st.finite());
  BOOST_CHECK_EQUAL(cd::max_abs_key(x.data(), x.size()), std::bit_cast<std::uint32_t>(mx));
  BOOST_CHECK_EQUAL(cd::sum_abs_f64(x.data(), x.size()), ab);  // exact for these magnitudes
  std::vector<std::byte> bits((x.size() + 7) / 8);
  cd::negative_bits(x.data(), x.size(), bits.data());
  for (std::size_t i = 0; i < x.size(); ++i)
    BOOST_REQUIRE_EQUAL((static_cast<unsigned>(bits[i / 8]) >> (i % 8)) & 1u, x[i] < 0.0f ? 1u : 0u);
  BOOST_CHECK_EQUAL(static_cast<unsigned>(bits.back()) >> 3, 0u);  // 1003 = 125 * 8 + 3
  x[500] = std::nanf("");
  BOOST_CHECK(!cd::stats(x.data(), x.size()).finite());
  BOOST_CHECK_GE(cd::max_abs_key(x.data(), x.size()), 0x7f800000u);
}
