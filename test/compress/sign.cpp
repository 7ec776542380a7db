#include <ashl/compress/sign.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/codec_testing.hpp"

#include <cmath>
#include <limits>

using namespace ashl;
using namespace codec_testing;

BOOST_AUTO_TEST_CASE(decode_is_exact_for_each_dtype) {
  const std::size_t n = 203;
  const auto xf = normal_values(n, 61);
  compress::sign c{{.bucket = 64}};
  auto run = [&]<class T>(T) {
    const auto x = to_type<T>(xf);
    auto p = encode_to_vector(c, std::span<const T>(x), {.seed = 1});
    BOOST_CHECK_EQUAL(p.size(), 12u + 4u * 4u + 26u);
    BOOST_CHECK_EQUAL(p.size(), c.max_encoded_bytes(n, dtype_of<T>));
    std::vector<float> acc(n, 1.0f);
    BOOST_REQUIRE(compress::sign{}.decode_add(p, {n, dtype_of<T>}, host_view<float>(acc.data(), n), 0.5f, {}).ok());
    for (std::size_t b = 0; b < 4; ++b) {
      const std::size_t lo = 64 * b, hi = std::min(n, lo + 64);
      double s = 0;
      for (std::size_t i = lo; i < hi; ++i) s += std::fabs(double(to_float(x[i])));
      const float d = static_cast<float>(s / double(hi - lo));
      for (std::size_t i = lo; i < hi; ++i) BOOST_CHECK_EQUAL(acc[i], 1.0f + 0.5f * (to_float(x[i]) < 0 ? -d : d));
    }
  };
  run(float{});
  run(half{});
  run(bfloat16{});
  // Deterministic: ctx does not matter.
  auto a = encode_to_vector(c, std::span<const float>(xf), {.seed = 1, .step = 2});
  BOOST_CHECK(a == encode_to_vector(c, std::span<const float>(xf), {.seed = 3, .step = 4, .tensor = 5}));
  // +0 and -0 both send +d.
  std::vector<float> z{0.0f, -0.0f, 2.0f, -2.0f};
  auto pz = encode_to_vector(compress::sign{}, std::span<const float>(z));
  std::vector<float> acc(4, 0.0f);
  BOOST_REQUIRE(compress::sign{}.decode_add(pz, {4, dtype::f32}, host_view<float>(acc.data(), 4), 1.0f, {}).ok());
  BOOST_CHECK(acc == (std::vector<float>{1.0f, 1.0f, 1.0f, -1.0f}));
}

BOOST_AUTO_TEST_CASE(sizes) {
  for (std::size_t n : {0u, 1u, 8u, 9u, 1000u})
    for (std::uint32_t B : {1u, 3u, 512u}) {
      compress::sign c{{.bucket = B}};
      std::vector<float> x(n, -1.5f);
      auto p = encode_to_vector(c, std::span<const float>(x));
      BOOST_CHECK_EQUAL(p.size(), 12 + 4 * ((n + B - 1) / B) + (n + 7) / 8);
      check_rejects_truncation(compress::sign{}, p, {n, dtype::f32});
    }
}

BOOST_AUTO_TEST_CASE(rejects_bad_input_and_payloads) {
  std::vector<float> x = normal_values(21, 62);
  std::vector<std::byte> buf(100);
  x[4] = std::numeric_limits<float>::quiet_NaN();
  BOOST_CHECK(!compress::sign{}.encode(host_view<const float>(x.data(), 21), buf, {}).has_value());
  BOOST_CHECK(!compress::sign({.bucket = 0}).encode(host_view<const float>(x.data(), 21), buf, {}).has_value());
  BOOST_CHECK(!compress::sign{}.encode(host_view<const float>(x.data(), 21), std::span<std::byte>(buf.data(), 18), {}).has_value());
  x[4] = 1.0f;
  compress::sign c{{.bucket = 10}};
  auto p = encode_to_vector(c, std::span<const float>(x));  // 12 + 12 + 3
  const compress::payload_info info{21, dtype::f32};
  check_rejects_truncation(compress::sign{}, p, info);
  auto expect_field = [&](const std::vector<std::byte>& bad, const char* field) {
    auto s = decode_guarded(compress::sign{}, bad, info);
    BOOST_CHECK_MESSAGE(!s.ok() && s.message().find(field) != std::string::npos, s.to_string() + " / " + field);
  };
  auto bad = p;
  put_u32(bad, 8, 0);
  expect_field(bad, "sign.bucket");
  bad = p;
  put_u64(bad, 0, 22);
  expect_field(bad, "sign.n");
  bad = p;
  put_u32(bad, 12 + 4, 0x7fc00000u);
  expect_field(bad, "sign.scale[1]");
  bad = p;
  put_u32(bad, 12, 0xbf800000u);
  expect_field(bad, "sign.scale[0]");
  bad = p;
  bad.back() |= std::byte{0x80};
  expect_field(bad, "sign.padding");
  BOOST_CHECK(!decode_guarded(compress::sign{}, p, {21, dtype::i8}).ok());
}
