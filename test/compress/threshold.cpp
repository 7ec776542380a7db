#include <ashl/compress/threshold.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/codec_testing.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

using namespace ashl;
using namespace codec_testing;

BOOST_AUTO_TEST_CASE(selects_exactly_the_elements_at_or_above_theta) {
  const auto x = normal_values(3000, 41);
  compress::threshold c{{.theta = 1.5f}};
  auto p = encode_to_vector(c, std::span<const float>(x));
  const auto got = read_pairs(p, dtype::f32);
  std::vector<std::uint32_t> want;
  for (std::uint32_t i = 0; i < x.size(); ++i)
    if (std::fabs(x[i]) >= 1.5f) want.push_back(i);
  BOOST_CHECK(got.index == want);
  BOOST_CHECK_EQUAL(p.size(), 12 + 8 * want.size());
  BOOST_CHECK_EQUAL(c.max_encoded_bytes(3000, dtype::f32), 12u + 3000u * 8u);
  // Nothing above theta: an empty payload that decodes to nothing.
  auto e = encode_to_vector(compress::threshold{{.theta = 100.0f}}, std::span<const float>(x));
  BOOST_CHECK_EQUAL(e.size(), 12u);
  BOOST_CHECK(decode_guarded(compress::threshold{}, e, {3000, dtype::f32}).ok());
}

BOOST_AUTO_TEST_CASE(cap_keeps_the_largest) {
  const auto x = normal_values(1000, 42);
  compress::threshold c{{.theta = 0.1f, .max_ratio = 0.05}};
  BOOST_CHECK_EQUAL(c.max_encoded_bytes(1000, dtype::f16), 12u + 50u * 6u);
  const auto xh = to_type<half>(x);
  auto p = encode_to_vector(c, std::span<const half>(xh));
  const auto got = read_pairs(p, dtype::f16);
  BOOST_REQUIRE_EQUAL(got.index.size(), 50u);
  float min_in = 1e30f;
  for (float v : got.value) min_in = std::min(min_in, std::fabs(v));
  std::size_t larger_out = 0;
  std::vector<bool> in(1000, false);
  for (auto i : got.index) in[i] = true;
  for (std::size_t i = 0; i < 1000; ++i) larger_out += !in[i] && std::fabs(xh[i].to_float()) > min_in;
  BOOST_CHECK_EQUAL(larger_out, 0u);
}

BOOST_AUTO_TEST_CASE(options_and_rejections) {
  BOOST_CHECK(!compress::threshold{{.theta = -1.0f}}.validate().ok());
  BOOST_CHECK(!compress::threshold{{.theta = NAN}}.validate().ok());
  BOOST_CHECK(!compress::threshold{{.max_ratio = 0.0}}.validate().ok());
  const auto x = normal_values(80, 43);
  auto p = encode_to_vector(compress::threshold{{.theta = 0.5f}}, std::span<const float>(x));
  check_sparse_rejections(compress::threshold{}, p, {80, dtype::f32});
}

// The selection compares magnitude keys (16-bit theta rounded, then stepped
// up): over every 16-bit pattern (NaNs, infinities, subnormals, both zeros)
// and thetas on, between and beyond representable values, the sent indices
// are exactly those with |to_float(x)| >= theta, and f32 agrees on the same values.
BOOST_AUTO_TEST_CASE(every_16_bit_pattern_against_float_compare) {
  const std::size_t n = 65536;
  const float thetas[] = {0.0f, 1e-10f, 5.9604645e-08f, 6.0e-08f, 1e-3f, 0.999f, 1.0f, 1.0009766f, 1.0004883f,
                          3.0f, 65504.0f, 65505.0f, 65520.0f, 1e30f, 3.3895314e38f, 3.3e38f};
  auto run = [&]<class T>(T) {
    std::vector<T> x(n);
    std::vector<float> xf(n);
    for (std::size_t i = 0; i < n; ++i) {
      x[i] = T{static_cast<std::uint16_t>(i)};
      xf[i] = to_float(x[i]);
    }
    for (const float th : thetas) {
      const compress::threshold c{{.theta = th, .max_ratio = 1.0}};
      std::vector<std::uint32_t> want;
      for (std::size_t i = 0; i < n; ++i)
        if (std::fabs(xf[i]) >= th) want.push_back(static_cast<std::uint32_t>(i));
      const auto p16 = read_pairs(encode_to_vector(c, std::span<const T>(x)), dtype_of<T>);
      BOOST_CHECK_MESSAGE(p16.index == want, std::string(to_string(dtype_of<T>)) + " theta " + std::to_string(th));
      const auto p32 = read_pairs(encode_to_vector(c, std::span<const float>(xf)), dtype::f32);
      BOOST_CHECK_MESSAGE(p32.index == want, "f32 of " + std::string(to_string(dtype_of<T>)) + " theta " +
                                                 std::to_string(th));
    }
  };
  run(half{});
  run(bfloat16{});
}
