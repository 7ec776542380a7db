#include <ashl/compress/natural.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/codec_testing.hpp"

#include <ashl/core/philox.hpp>

#include <cmath>
#include <cstdint>
#include <ios>
#include <limits>

using namespace ashl;
using namespace codec_testing;

namespace {
bool power_of_two_or_zero(float v) {
  if (v == 0.0f) return true;
  int e = 0;
  return std::frexp(std::fabs(v), &e) == 0.5f;
}
}  // namespace

BOOST_AUTO_TEST_CASE(unbiased_powers_of_two_for_each_dtype) {
  const std::size_t n = 64;
  auto xf = normal_values(n, 71);
  xf[0] = 1e-30f;  // below the range (emin ~ 2^-124): rounds to 0 or 2^emin
  xf[1] = 0.0f;
  xf[2] = 0.75f;
  const int trials = 3000;
  auto run = [&]<class T>(T) {
    const auto x = to_type<T>(xf);
    std::vector<double> sum(n, 0.0);
    for (int t = 0; t < trials; ++t) {
      const compress::codec_context ctx{.seed = 2, .step = static_cast<std::uint64_t>(t), .tensor = 4};
      auto p = encode_to_vector(compress::natural{}, std::span<const T>(x), ctx);
      BOOST_REQUIRE_EQUAL(p.size(), 12 + n);
      std::vector<float> one(n, 0.0f);
      BOOST_REQUIRE(compress::natural{}.decode_add(p, {n, dtype_of<T>}, host_view<float>(one.data(), n), 1.0f, ctx).ok());
      for (std::size_t i = 0; i < n; ++i) {
        const float xi = to_float(x[i]);
        BOOST_REQUIRE(power_of_two_or_zero(one[i]));
        BOOST_REQUIRE(one[i] == 0.0f || (one[i] < 0) == (xi < 0));
        if (i != 0) BOOST_REQUIRE(std::fabs(one[i]) <= 2 * std::fabs(xi) && std::fabs(one[i]) * 2 >= std::fabs(xi));
        sum[i] += one[i];
      }
    }
    // A decode lies in [|x|/2, 2|x|]: sd <= |x| / 2.
    for (std::size_t i = 1; i < n; ++i) {
      const double xi = to_float(x[i]);
      BOOST_CHECK_LE(std::fabs(sum[i] / trials - xi), 5.0 * std::fabs(xi) * 0.5 / std::sqrt(double(trials)) + 1e-12);
    }
    BOOST_CHECK_EQUAL(sum[1], 0.0);
  };
  run(float{});
  run(half{});
  run(bfloat16{});
}

BOOST_AUTO_TEST_CASE(exact_powers_and_reproducibility) {
  std::vector<float> x{1.0f, -0.25f, 8.0f, 0.0f, -1024.0f};
  for (int t = 0; t < 10; ++t) {
    const compress::codec_context ctx{.seed = 1, .step = static_cast<std::uint64_t>(t)};
    auto p = encode_to_vector(compress::natural{}, std::span<const float>(x), ctx);
    std::vector<float> acc(5, 0.0f);
    BOOST_REQUIRE(compress::natural{}.decode_add(p, {5, dtype::f32}, host_view<float>(acc.data(), 5), 1.0f, ctx).ok());
    BOOST_CHECK(acc == x);
  }
  const auto y = normal_values(999, 72);
  compress::natural c;
  auto a = encode_to_vector(c, std::span<const float>(y), {.seed = 5, .step = 8, .tensor = 1});
  BOOST_CHECK(a == encode_to_vector(c, std::span<const float>(y), {.seed = 5, .step = 8, .tensor = 1}));
  BOOST_CHECK(a != encode_to_vector(c, std::span<const float>(y), {.seed = 5, .step = 9, .tensor = 1}));
  BOOST_CHECK(a != encode_to_vector(c, std::span<const float>(y), {.seed = 4, .step = 8, .tensor = 1}));
  // Extremes: the largest float and the smallest subnormal.
  std::vector<float> big{std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()};
  auto pb = encode_to_vector(c, std::span<const float>(big));
  std::vector<float> acc(2, 0.0f);
  BOOST_REQUIRE(c.decode_add(pb, {2, dtype::f32}, host_view<float>(acc.data(), 2), 1.0f, {}).ok());
  BOOST_CHECK_EQUAL(acc[0], std::ldexp(1.0f, 127));
  std::vector<float> tiny{std::numeric_limits<float>::denorm_min()};
  auto pt = encode_to_vector(c, std::span<const float>(tiny));
  std::vector<float> acc1(1, 0.0f);
  BOOST_REQUIRE(c.decode_add(pt, {1, dtype::f32}, host_view<float>(acc1.data(), 1), 1.0f, {}).ok());
  BOOST_CHECK_EQUAL(acc1[0], tiny[0]);
}

BOOST_AUTO_TEST_CASE(rejects_bad_input_and_payloads) {
  std::vector<float> x = normal_values(30, 73);
  std::vector<std::byte> buf(100);
  x[7] = -std::numeric_limits<float>::infinity();
  BOOST_CHECK(!compress::natural{}.encode(host_view<const float>(x.data(), 30), buf, {}).has_value());
  BOOST_CHECK(!compress::natural{}.encode(host_view<const float>(x.data(), 30), std::span<std::byte>(buf.data(), 41), {}).has_value());
  x[7] = 0.0f;
  auto p = encode_to_vector(compress::natural{}, std::span<const float>(x));
  const compress::payload_info info{30, dtype::f32};
  check_rejects_truncation(compress::natural{}, p, info);
  auto expect_field = [&](const std::vector<std::byte>& bad, const char* field) {
    auto s = decode_guarded(compress::natural{}, bad, info);
    BOOST_CHECK_MESSAGE(!s.ok() && s.message().find(field) != std::string::npos, s.to_string() + " / " + field);
  };
  auto bad = p;
  put_u32(bad, 8, 2);
  expect_field(bad, "natural.emin");
  bad = p;
  put_u32(bad, 8, static_cast<std::uint32_t>(-275));
  expect_field(bad, "natural.emin");
  bad = p;
  put_u64(bad, 0, 31);
  expect_field(bad, "natural.n");
  bad = p;
  bad[12 + 29] = std::byte{0x80};
  expect_field(bad, "natural.code[29]");
  const auto xh = to_type<half>(x);
  check_rejects_truncation(compress::natural{}, encode_to_vector(compress::natural{}, std::span<const half>(xh)), {30, dtype::f16});
}

// The exact payload bytes (FNV-1a of each) as written by the encoder of
// commit 1e05f39, before its kernels were fused with the Philox generator:
// any rewrite must keep every bit (a GPU codec draws the same words). The
// input scaled by 2^-100 and 2^-120 puts many elements below the code range
// (the u < a 2^-emin path), 2^113 makes emin clamp at 1 (f16 would
// overflow there, so that case has no f16 pin), and the tensor of
// 2^-145 subnormals alone gives the deepest emin.
BOOST_AUTO_TEST_CASE(payload_bytes_are_pinned) {
  struct pin {
    int scale_exp;
    std::uint64_t f32, f16, bf16;
  };
  const pin pins[] = {{0, 0x3a96a5c920e6af19, 0xbca113706cf82380, 0x381c94600be3de12}, {-100, 0xb32bf22c0e724acd, 0x2a98556cc1a35057, 0x1ff902136a93f816}, {-120, 0x3083fbb4b1f5d5a1, 0x2a98556cc1a35057, 0xc1c61f9637eda59d}, {113, 0x8ddd92854a441fcd, 0x0, 0x139ec7bf0c4f7d7}};
  const auto base = golden_input(100003, 13);
  const compress::codec_context ctx{.seed = 0x1111222233334444ull, .step = (std::uint64_t{1} << 40) | 3u, .tensor = 9};
  for (const pin& p : pins) {
    std::vector<float> xf(base.size());
    for (std::size_t i = 0; i < xf.size(); ++i)  // at most 1.5 2^127: finite in bf16 too
      xf[i] = std::copysign(std::fmin(std::ldexp(std::fabs(base[i]), p.scale_exp), 0x1.8p127f), base[i]);
    const auto xh = to_type<half>(xf);
    const auto xb = to_type<bfloat16>(xf);
    const std::uint64_t h32 = fnv1a(encode_to_vector(compress::natural{}, std::span<const float>(xf), ctx));
    const std::uint64_t h16 =
        p.scale_exp > 15 ? 0 : fnv1a(encode_to_vector(compress::natural{}, std::span<const half>(xh), ctx));
    const std::uint64_t hb = fnv1a(encode_to_vector(compress::natural{}, std::span<const bfloat16>(xb), ctx));
    BOOST_CHECK_MESSAGE(h32 == p.f32 && h16 == p.f16 && hb == p.bf16,
                        "scale 2^" << p.scale_exp << ": {" << std::hex << "0x" << h32 << ", 0x" << h16 << ", 0x" << hb
                                   << "}");
  }
  std::vector<float> tiny(4099);
  for (std::size_t i = 0; i < tiny.size(); ++i) tiny[i] = std::ldexp(base[i] == 0.0f ? 0.0f : 1.0f, -145 - int(i % 4));
  const std::uint64_t ht = fnv1a(encode_to_vector(compress::natural{}, std::span<const float>(tiny), ctx));
  BOOST_CHECK_MESSAGE(ht == 0xfdc4eb43a6f5d423, "subnormal tensor: 0x" << std::hex << ht);
}
