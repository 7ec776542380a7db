#include <ashl/compress/qsgd.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/codec_testing.hpp"

#include <ashl/core/philox.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ios>
#include <limits>

using namespace ashl;
using namespace codec_testing;

namespace {
template <class T>
std::vector<float> decode_once(const compress::qsgd& c, const std::vector<float>& xf, const compress::codec_context& ctx) {
  const auto x = to_type<T>(xf);
  auto p = encode_to_vector(c, std::span<const T>(x), ctx);
  std::vector<float> acc(x.size(), 0.0f);
  BOOST_REQUIRE(compress::qsgd{}.decode_add(p, {x.size(), dtype_of<T>}, host_view<float>(acc.data(), acc.size()), 1.0f, ctx).ok());
  return acc;
}
}  // namespace

// The mean of T decodes is within 5 sigma of x, per element, with sigma
// from the analytic variance: level floor(r) + Bernoulli(p), r = |x| s / norm,
// p = r - floor(r), so one decode has variance (norm / s)^2 p (1 - p) and
// the mean of T has that over T. (The norm is read from the payload: it is
// the same every step.) A float slack of 1e-5 norm / s covers the codec's
// float arithmetic and the 24-bit uniform.
BOOST_AUTO_TEST_CASE(unbiased_for_each_dtype) {
  const std::size_t n = 100, bucket = 32;
  const auto xf = normal_values(n, 41);
  compress::qsgd c{{.levels = 3, .bucket = bucket}};
  const double L = 3.0;
  const int trials = 3000;
  auto run = [&]<class T>(T) {
    const auto xt = to_type<T>(xf);
    std::vector<double> sum(n, 0.0);
    const auto first = encode_to_vector(c, std::span<const T>(xt), {.seed = 4, .step = 0, .tensor = 3});
    for (int t = 0; t < trials; ++t) {
      const auto d = decode_once<T>(c, xf, {.seed = 4, .step = static_cast<std::uint64_t>(t), .tensor = 3});
      for (std::size_t i = 0; i < n; ++i) sum[i] += d[i];
    }
    double worst = 0.0;  // largest |bias| / sigma seen
    for (std::size_t i = 0; i < n; ++i) {
      float norm_f;
      std::memcpy(&norm_f, first.data() + 16 + 4 * (i / bucket), 4);
      const double norm = norm_f, xi = to_float(xt[i]);
      const double r = std::fabs(xi) * L / norm, p = r - std::floor(r);
      const double sigma = norm / L * std::sqrt(p * (1.0 - p) / trials);
      const double bias = std::fabs(sum[i] / trials - xi);
      BOOST_CHECK_LE(bias, 5.0 * sigma + 1e-5 * norm / L);
      if (sigma > 0) worst = std::max(worst, bias / sigma);
    }
    BOOST_TEST_MESSAGE("qsgd " << to_string(dtype_of<T>) << ": largest |bias| = " << worst << " sigma");
  };
  run(float{});
  run(half{});
  run(bfloat16{});
}

BOOST_AUTO_TEST_CASE(levels_and_norm_values) {
  // Every decoded value is +-norm * l / s for an integer l in [0, s], with the sign of x.
  const std::size_t n = 77;
  const auto x = normal_values(n, 42);
  compress::qsgd c{{.levels = 5, .bucket = 20}};
  const auto d = decode_once<float>(c, x, {.seed = 1});
  for (std::size_t b = 0; b < 4; ++b) {
    double ss = 0;
    for (std::size_t i = 20 * b; i < std::min<std::size_t>(n, 20 * b + 20); ++i) ss += double(x[i]) * x[i];
    const float norm = static_cast<float>(std::sqrt(ss));
    for (std::size_t i = 20 * b; i < std::min<std::size_t>(n, 20 * b + 20); ++i) {
      const float l = std::fabs(d[i]) / (norm / 5.0f);
      BOOST_CHECK_LE(std::fabs(l - std::round(l)), 1e-4f);
      BOOST_CHECK(d[i] == 0.0f || (d[i] < 0) == (x[i] < 0));
      BOOST_CHECK_LE(std::fabs(d[i] - x[i]), norm / 5.0f * 1.0001f);
    }
  }
}

BOOST_AUTO_TEST_CASE(reproducible_and_sizes) {
  const auto x = normal_values(1000, 43);
  for (std::uint32_t s : {1u, 2u, 7u, 127u, 32767u}) {
    for (std::uint32_t B : {1u, 64u, 1000u, 4096u}) {
      compress::qsgd c{{.levels = s, .bucket = B}};
      auto a = encode_to_vector(c, std::span<const float>(x), {.seed = 5, .step = 8, .tensor = 1});
      auto b = encode_to_vector(c, std::span<const float>(x), {.seed = 5, .step = 8, .tensor = 1});
      BOOST_CHECK(a == b);
      const std::size_t bits = 1 + std::bit_width(s);
      BOOST_CHECK_EQUAL(a.size(), 16 + 4 * ((1000 + B - 1) / B) + (1000 * bits + 7) / 8);
      BOOST_CHECK_EQUAL(a.size(), c.max_encoded_bytes(1000, dtype::f32));
      BOOST_CHECK_EQUAL(c.max_encoded_bytes(1000, dtype::f16), c.max_encoded_bytes(1000, dtype::f32));
    }
  }
  compress::qsgd c{{.levels = 7, .bucket = 64}};
  const auto p = encode_to_vector(c, std::span<const float>(x), {.seed = 5, .step = 8, .tensor = 1});
  BOOST_CHECK(p != encode_to_vector(c, std::span<const float>(x), {.seed = 5, .step = 9, .tensor = 1}));
  BOOST_CHECK(p != encode_to_vector(c, std::span<const float>(x), {.seed = 5, .step = 8, .tensor = 2}));
  BOOST_CHECK(p != encode_to_vector(c, std::span<const float>(x), {.seed = 6, .step = 8, .tensor = 1}));
  // Empty input and all-zero input.
  std::vector<float> z(10, 0.0f), acc(10, 1.0f);
  auto pz = encode_to_vector(c, std::span<const float>(z));
  BOOST_REQUIRE(c.decode_add(pz, {10, dtype::f32}, host_view<float>(acc.data(), 10), 1.0f, {}).ok());
  for (float v : acc) BOOST_CHECK_EQUAL(v, 1.0f);
  auto pe = encode_to_vector(c, std::span<const float>(z.data(), 0));
  BOOST_CHECK_EQUAL(pe.size(), 16u);
  BOOST_CHECK(c.decode_add(pe, {0, dtype::f32}, host_view<float>(acc.data(), 0), 1.0f, {}).ok());
}

BOOST_AUTO_TEST_CASE(encode_errors) {
  std::vector<float> x(10, 1.0f);
  std::vector<std::byte> buf(1000);
  BOOST_CHECK(!compress::qsgd({.levels = 0}).encode(host_view<const float>(x.data(), 10), buf, {}).has_value());
  BOOST_CHECK(!compress::qsgd({.levels = 32768}).encode(host_view<const float>(x.data(), 10), buf, {}).has_value());
  BOOST_CHECK(!compress::qsgd({.bucket = 0}).encode(host_view<const float>(x.data(), 10), buf, {}).has_value());
  auto s = compress::qsgd({.levels = 0}).validate();
  BOOST_CHECK_NE(s.message().find("qsgd.levels = 0"), std::string::npos);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  BOOST_CHECK(!compress::qsgd{}.encode(host_view<const float>(x.data(), 10), buf, {}).has_value());
  x[3] = 1.0f;
  BOOST_CHECK(!compress::qsgd{}.encode(host_view<const float>(x.data(), 10), std::span<std::byte>(buf.data(), 20), {}).has_value());
}

BOOST_AUTO_TEST_CASE(rejects_malformed_payloads) {
  const auto x = normal_values(50, 44);
  compress::qsgd c{{.levels = 5, .bucket = 16}};  // 4 bits: 200 bits = 25 bytes, codes 6..7 unused
  auto p = encode_to_vector(c, std::span<const float>(x), {.seed = 2});
  const compress::payload_info info{50, dtype::f32};
  check_rejects_truncation(compress::qsgd{}, p, info);
  auto expect_field = [&](const std::vector<std::byte>& bad, const char* field) {
    auto s = decode_guarded(compress::qsgd{}, bad, info);
    BOOST_CHECK_MESSAGE(!s.ok() && s.message().find(field) != std::string::npos, s.to_string() + " / " + field);
  };
  auto bad = p;
  put_u32(bad, 8, 0);
  expect_field(bad, "qsgd.bucket");
  bad = p;
  put_u32(bad, 12, 0);
  expect_field(bad, "qsgd.levels");
  bad = p;
  put_u32(bad, 12, 40000);
  expect_field(bad, "qsgd.levels");
  bad = p;
  put_u32(bad, 12, 6);  // same bit width, different meaning is accepted; 9 changes the size
  BOOST_CHECK(decode_guarded(compress::qsgd{}, bad, info).ok());
  put_u32(bad, 12, 9);
  expect_field(bad, "qsgd.payload_bytes");
  bad = p;
  put_u64(bad, 0, 51);
  expect_field(bad, "qsgd.n");
  bad = p;
  put_u32(bad, 16 + 4, 0x7fc00000u);  // NaN norm of bucket 1
  expect_field(bad, "qsgd.norm[1]");
  bad = p;
  put_u32(bad, 16, 0xbf800000u);  // -1
  expect_field(bad, "qsgd.norm[0]");
  bad = p;
  bad[16 + 16] = std::byte{0x0f};  // code 15: level 7 > 5
  expect_field(bad, "qsgd.code[0]");
  bad = p;
  bad[16 + 16] = (bad[16 + 16] & std::byte{0xf0}) | std::byte{0x01};  // sign on level 0
  expect_field(bad, "qsgd.code[0]");
  {
    compress::qsgd c3{{.levels = 1, .bucket = 16}};  // 2 bits x 50 = 100 bits: 4 padding bits
    auto q = encode_to_vector(c3, std::span<const float>(x), {.seed = 2});
    check_rejects_truncation(compress::qsgd{}, q, info);
    q.back() |= std::byte{0x80};
    expect_field(q, "qsgd.padding");
  }
  std::vector<float> acc(51, 0.0f);
  BOOST_CHECK(!c.decode_add(p, info, host_view<float>(acc.data(), 51), 1.0f, {}).ok());
  BOOST_CHECK(!decode_guarded(compress::qsgd{}, p, {50, dtype::f64}).ok());
  const auto xh = to_type<half>(x);
  auto ph = encode_to_vector(c, std::span<const half>(xh), {.seed = 2});
  check_rejects_truncation(compress::qsgd{}, ph, {50, dtype::f16});
}

// The exact payload bytes (FNV-1a of each) as written by the encoder of
// commit 1e05f39, before its kernels were fused with the Philox generator:
// any rewrite must keep every bit, since a GPU encoder or decoder draws the
// same philox_stream words. The cases cover every packer width (2, 4, 8, 11
// and 16 bits), buckets of 1 (subnormal norms: the exact rounding path) to
// 3000, and the f16 / bf16 inputs.
BOOST_AUTO_TEST_CASE(payload_bytes_are_pinned) {
  struct pin {
    std::uint32_t levels, bucket;
    std::uint64_t f32, f16, bf16;
  };
  const pin pins[] = {
      {127, 512, 0xf958413a73a12865, 0x8c88070de60c93e9, 0x2b995684b57e477}, {7, 100, 0x127b0b107f93f89, 0xc36398eed8c67e1c, 0x7ab2a3d1a4f4ae3}, {1, 1, 0x55903f0c19660678, 0x4b355f9040b28dad, 0x7e6654b950db257}, {1000, 3000, 0xb287f06cecc509c7, 0x53bb269084f1b5b5, 0x6498588537252db2}, {32767, 512, 0xdc5f27fb7ba4e4c5, 0x862920638c84c06e, 0x59125e37bd87f765},
      {3, 17, 0x42d9e3097fd658d6, 0xcdc57bf8c44cbf42, 0x7a984a07b127e05f},
  };
  const auto xf = golden_input(100003, 11);
  const auto xh = to_type<half>(xf);
  const auto xb = to_type<bfloat16>(xf);
  const compress::codec_context ctx{.seed = 0x0123456789abcdefull, .step = (std::uint64_t{5} << 32) | 9u, .tensor = 77};
  for (const pin& p : pins) {
    const compress::qsgd c{{.levels = p.levels, .bucket = p.bucket}};
    const std::uint64_t h32 = fnv1a(encode_to_vector(c, std::span<const float>(xf), ctx));
    const std::uint64_t h16 = fnv1a(encode_to_vector(c, std::span<const half>(xh), ctx));
    const std::uint64_t hb = fnv1a(encode_to_vector(c, std::span<const bfloat16>(xb), ctx));
    BOOST_CHECK_MESSAGE(h32 == p.f32 && h16 == p.f16 && hb == p.bf16,
                        "levels " << p.levels << " bucket " << p.bucket << ": {" << std::hex << "0x" << h32 << ", 0x"
                                  << h16 << ", 0x" << hb << "}");
  }
}
