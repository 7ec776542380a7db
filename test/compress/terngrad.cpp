#include <ashl/compress/terngrad.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/codec_testing.hpp"

#include <ashl/core/philox.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ios>
#include <limits>

using namespace ashl;
using namespace codec_testing;

// Each decode is 0 or +-s (s = the bucket's max |x|), nonzero with
// probability p = |x| / s, so its variance is s^2 p (1 - p); the mean of T
// decodes is within 5 sigma (of that over T) of x, per element, plus a float
// slack of 1e-5 s for the codec's arithmetic and the 24-bit uniform.
BOOST_AUTO_TEST_CASE(unbiased_ternary_for_each_dtype) {
  const std::size_t n = 90;
  const auto xf = normal_values(n, 51);
  compress::terngrad c{{.bucket = 30}};
  const int trials = 3000;
  auto run = [&]<class T>(T) {
    const auto x = to_type<T>(xf);
    std::vector<double> sum(n, 0.0);
    float smax[3] = {0, 0, 0};
    for (std::size_t i = 0; i < n; ++i) smax[i / 30] = std::max(smax[i / 30], std::fabs(to_float(x[i])));
    for (int t = 0; t < trials; ++t) {
      const compress::codec_context ctx{.seed = 9, .step = static_cast<std::uint64_t>(t), .tensor = 2};
      auto p = encode_to_vector(c, std::span<const T>(x), ctx);
      BOOST_REQUIRE_EQUAL(p.size(), 12u + 12u + 23u);
      std::vector<float> one(n, 0.0f);
      BOOST_REQUIRE(compress::terngrad{}.decode_add(p, {n, dtype_of<T>}, host_view<float>(one.data(), n), 1.0f, ctx).ok());
      for (std::size_t i = 0; i < n; ++i) {
        const float s = smax[i / 30];
        BOOST_REQUIRE(one[i] == 0.0f || one[i] == s * (to_float(x[i]) < 0 ? -1.0f : 1.0f));
        sum[i] += one[i];
      }
    }
    double worst = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const double s = smax[i / 30], xi = to_float(x[i]), p = std::fabs(xi) / s;
      const double sigma = s * std::sqrt(p * (1.0 - p) / trials);
      const double bias = std::fabs(sum[i] / trials - xi);
      BOOST_CHECK_LE(bias, 5.0 * sigma + 1e-5 * s);
      if (sigma > 0) worst = std::max(worst, bias / sigma);
    }
    BOOST_TEST_MESSAGE("terngrad " << to_string(dtype_of<T>) << ": largest |bias| = " << worst << " sigma");
  };
  run(float{});
  run(half{});
  run(bfloat16{});
}

BOOST_AUTO_TEST_CASE(reproducible_and_sizes) {
  const auto x = normal_values(1001, 52);
  for (std::uint32_t B : {1u, 7u, 512u, 5000u}) {
    compress::terngrad c{{.bucket = B}};
    auto a = encode_to_vector(c, std::span<const float>(x), {.seed = 5, .step = 8, .tensor = 1});
    BOOST_CHECK(a == encode_to_vector(c, std::span<const float>(x), {.seed = 5, .step = 8, .tensor = 1}));
    if (B > 1) {  // with one element per bucket every element is its bucket's max: deterministic
      BOOST_CHECK(a != encode_to_vector(c, std::span<const float>(x), {.seed = 5, .step = 9, .tensor = 1}));
      BOOST_CHECK(a != encode_to_vector(c, std::span<const float>(x), {.seed = 5, .step = 8, .tensor = 0}));
    }
    BOOST_CHECK_EQUAL(a.size(), 12 + 4 * ((1001 + B - 1) / B) + (1001 + 3) / 4);
    BOOST_CHECK_EQUAL(a.size(), c.max_encoded_bytes(1001, dtype::bf16));
  }
  // The max element of each bucket is always sent exactly.
  std::vector<float> y{0.5f, -2.0f, 1.0f};
  compress::terngrad c;
  for (int t = 0; t < 20; ++t) {
    const compress::codec_context ctx{.step = static_cast<std::uint64_t>(t)};
    auto p = encode_to_vector(c, std::span<const float>(y), ctx);
    std::vector<float> acc(3, 0.0f);
    BOOST_REQUIRE(c.decode_add(p, {3, dtype::f32}, host_view<float>(acc.data(), 3), 1.0f, ctx).ok());
    BOOST_CHECK_EQUAL(acc[1], -2.0f);
  }
}

BOOST_AUTO_TEST_CASE(rejects_bad_input_and_payloads) {
  std::vector<float> inf(5, 1.0f);
  inf[2] = std::numeric_limits<float>::infinity();
  std::vector<std::byte> buf(100);
  BOOST_CHECK(!compress::terngrad{}.encode(host_view<const float>(inf.data(), 5), buf, {}).has_value());
  BOOST_CHECK(!compress::terngrad({.bucket = 0}).encode(host_view<const float>(inf.data(), 1), buf, {}).has_value());

  const auto x = normal_values(50, 53);
  compress::terngrad c{{.bucket = 16}};  // 4 scales, 13 code bytes (100 bits: 4 padding bits)
  auto p = encode_to_vector(c, std::span<const float>(x), {.seed = 2});
  const compress::payload_info info{50, dtype::f32};
  check_rejects_truncation(compress::terngrad{}, p, info);
  auto expect_field = [&](const std::vector<std::byte>& bad, const char* field) {
    auto s = decode_guarded(compress::terngrad{}, bad, info);
    BOOST_CHECK_MESSAGE(!s.ok() && s.message().find(field) != std::string::npos, s.to_string() + " / " + field);
  };
  auto bad = p;
  put_u32(bad, 8, 0);
  expect_field(bad, "terngrad.bucket");
  bad = p;
  put_u32(bad, 8, 17);
  BOOST_CHECK(!decode_guarded(compress::terngrad{}, bad, info).ok());
  bad = p;
  put_u64(bad, 0, 49);
  expect_field(bad, "terngrad.n");
  bad = p;
  put_u32(bad, 12 + 8, 0x7fc00000u);
  expect_field(bad, "terngrad.scale[2]");
  bad = p;
  put_u32(bad, 12, 0x7f800000u);
  expect_field(bad, "terngrad.scale[0]");
  bad = p;
  bad[28] = (bad[28] & std::byte{0xfc}) | std::byte{0x01};  // code 1 at element 0
  expect_field(bad, "terngrad.code[0]");
  bad = p;
  bad.back() |= std::byte{0x40};
  expect_field(bad, "terngrad.padding");
  const auto xb = to_type<bfloat16>(x);
  check_rejects_truncation(compress::terngrad{}, encode_to_vector(c, std::span<const bfloat16>(xb), {.seed = 2}), {50, dtype::bf16});
}

// The exact payload bytes (FNV-1a of each) as written by the encoder of
// commit 1e05f39, before its kernels were fused with the Philox generator:
// any rewrite must keep every bit (a GPU codec draws the same words).
BOOST_AUTO_TEST_CASE(payload_bytes_are_pinned) {
  struct pin {
    std::uint32_t bucket;
    std::uint64_t f32, f16, bf16;
  };
  const pin pins[] = {{512, 0x33dbf80de7011d44, 0x93ca38d857ccb7ea, 0xed21199b072eda9f}, {77, 0xa952ed77d22bccfc, 0x887eaae6e37a26b7, 0xd4eded2ac6b1c8b}, {1, 0xa8a5df16b99b59ee, 0x1f294c4355808f15, 0x158aba23660d3a9a}, {5000, 0x31e93daf288cbea9, 0xb6a5e618476eed81, 0x5584c015a6be34db}};
  const auto xf = golden_input(100003, 12);
  const auto xh = to_type<half>(xf);
  const auto xb = to_type<bfloat16>(xf);
  const compress::codec_context ctx{.seed = 0xfedcba9876543210ull, .step = 123456789, .tensor = 5};
  for (const pin& p : pins) {
    const compress::terngrad c{{.bucket = p.bucket}};
    const std::uint64_t h32 = fnv1a(encode_to_vector(c, std::span<const float>(xf), ctx));
    const std::uint64_t h16 = fnv1a(encode_to_vector(c, std::span<const half>(xh), ctx));
    const std::uint64_t hb = fnv1a(encode_to_vector(c, std::span<const bfloat16>(xb), ctx));
    BOOST_CHECK_MESSAGE(h32 == p.f32 && h16 == p.f16 && hb == p.bf16,
                        "bucket " << p.bucket << ": {" << std::hex << "0x" << h32 << ", 0x" << h16 << ", 0x" << hb
                                  << "}");
  }
}
