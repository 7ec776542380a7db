#include <ashl/compress/randomk.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/codec_testing.hpp"

#include <cmath>
#include <set>

using namespace ashl;
using namespace codec_testing;

namespace {
// The indices a payload touches: decode a payload of ones into zeros.
std::vector<std::size_t> touched(const compress::randomk& c, std::size_t n, const compress::codec_context& ctx) {
  std::vector<float> ones(n, 1.0f);
  auto p = encode_to_vector(c, std::span<const float>(ones), ctx);
  std::vector<float> acc(n, 0.0f);
  BOOST_REQUIRE(compress::randomk{}.decode_add(p, {n, dtype::f32}, host_view<float>(acc.data(), n), 1.0f, ctx).ok());
  std::vector<std::size_t> r;
  for (std::size_t i = 0; i < n; ++i)
    if (acc[i] != 0.0f) r.push_back(i);
  return r;
}
}  // namespace

BOOST_AUTO_TEST_CASE(indices_are_distinct_and_one_per_stratum) {
  for (std::size_t n : {1u, 7u, 1000u, 1001u}) {
    for (double r : {0.01, 0.33, 1.0}) {
      compress::randomk c{{.ratio = r}};
      const std::size_t k = c.k_for(n);
      const philox_stream rng(9, 4, 2);
      std::uint64_t prev = 0;
      for (std::size_t j = 0; j < k; ++j) {
        const auto s = compress::randomk::draw(rng, n, k, j);
        BOOST_CHECK_GE(s.index, s.start);
        BOOST_CHECK_LT(s.index, s.start + s.length);
        if (j) BOOST_CHECK_GT(s.index, prev);
        prev = s.index;
      }
      BOOST_CHECK_EQUAL(touched(c, n, {.seed = 9, .step = 4, .tensor = 2}).size(), k);
    }
  }
}

BOOST_AUTO_TEST_CASE(reproducible_from_seed_step_tensor) {
  const auto x = normal_values(5000, 31);
  compress::randomk c{{.ratio = 0.02}};
  auto a = encode_to_vector(c, std::span<const float>(x), {.seed = 5, .step = 8, .tensor = 1});
  auto b = encode_to_vector(c, std::span<const float>(x), {.seed = 5, .step = 8, .tensor = 1});
  BOOST_CHECK(a == b);
  BOOST_CHECK_EQUAL(a.size(), c.max_encoded_bytes(5000, dtype::f32));
  BOOST_CHECK_EQUAL(a.size(), 21u + 100u * 4u);
  const auto t = touched(c, 5000, {.seed = 5, .step = 8, .tensor = 1});
  BOOST_CHECK(t != touched(c, 5000, {.seed = 5, .step = 9, .tensor = 1}));
  BOOST_CHECK(t != touched(c, 5000, {.seed = 5, .step = 8, .tensor = 2}));
  BOOST_CHECK(t != touched(c, 5000, {.seed = 6, .step = 8, .tensor = 1}));
  // The decoder uses the payload's seed, so a server with another ctx.seed agrees.
  std::vector<float> acc1(5000, 0.0f), acc2(5000, 0.0f);
  BOOST_REQUIRE(c.decode_add(a, {5000, dtype::f32}, host_view<float>(acc1.data(), 5000), 1.0f, {.seed = 5, .step = 8, .tensor = 1}).ok());
  BOOST_REQUIRE(c.decode_add(a, {5000, dtype::f32}, host_view<float>(acc2.data(), 5000), 1.0f, {.seed = 77, .step = 8, .tensor = 1}).ok());
  BOOST_CHECK(acc1 == acc2);
  for (std::size_t i = 0; i < 5000; ++i) BOOST_CHECK(acc1[i] == 0.0f || acc1[i] == x[i]);
}

BOOST_AUTO_TEST_CASE(unbiased_scaling_mean_matches_input) {
  const std::size_t n = 200;
  const auto x = normal_values(n, 32);
  compress::randomk c{{.ratio = 0.1, .unbiased = true}};  // strata of 10
  const int trials = 4000;
  std::vector<float> sum(n, 0.0f);
  for (int t = 0; t < trials; ++t) {
    const compress::codec_context ctx{.seed = 3, .step = static_cast<std::uint64_t>(t), .tensor = 0};
    auto p = encode_to_vector(c, std::span<const float>(x), ctx);
    BOOST_REQUIRE(compress::randomk{}.decode_add(p, {n, dtype::f32}, host_view<float>(sum.data(), n), 1.0f / trials, ctx).ok());
  }
  // Each coordinate: mean of 10 x Bernoulli(1/10) x x_i; sd of the mean = |x_i| * 3 / sqrt(trials).
  for (std::size_t i = 0; i < n; ++i)
    BOOST_CHECK_LE(std::fabs(sum[i] - x[i]), 5.0f * std::fabs(x[i]) * 3.0f / std::sqrt(float(trials)) + 1e-5f);
  // Uneven strata (n not a multiple of k): each value scaled by its own stratum length.
  compress::randomk u{{.count = 3, .unbiased = true}};
  std::vector<float> ones(10, 1.0f), acc(10, 0.0f);
  auto p = encode_to_vector(u, std::span<const float>(ones), {.seed = 1});
  BOOST_REQUIRE(u.decode_add(p, {10, dtype::f32}, host_view<float>(acc.data(), 10), 1.0f, {.seed = 1}).ok());
  float total = 0.0f;
  for (float v : acc) total += v;
  BOOST_CHECK_EQUAL(total, 10.0f);
}

BOOST_AUTO_TEST_CASE(rejects_malformed_payloads) {
  const auto x = normal_values(50, 33);
  compress::randomk c{{.ratio = 0.2, .unbiased = true}};
  auto p = encode_to_vector(c, std::span<const float>(x), {.seed = 2});
  const compress::payload_info info{50, dtype::f32};
  check_rejects_truncation(compress::randomk{}, p, info);
  auto bad = p;
  put_u32(bad, 8, 51);
  BOOST_CHECK_NE(decode_guarded(compress::randomk{}, bad, info).message().find("randomk.k"), std::string::npos);
  bad = p;
  put_u32(bad, 8, 0);
  BOOST_CHECK(!decode_guarded(compress::randomk{}, bad, info).ok());
  bad = p;
  bad[12] = std::byte{2};
  BOOST_CHECK_NE(decode_guarded(compress::randomk{}, bad, info).message().find("randomk.flags"), std::string::npos);
  bad = p;
  put_u64(bad, 0, 49);
  BOOST_CHECK(!decode_guarded(compress::randomk{}, bad, info).ok());
  const auto xb = to_type<bfloat16>(x);
  auto pb = encode_to_vector(c, std::span<const bfloat16>(xb), {.seed = 2});
  BOOST_CHECK_EQUAL(pb.size(), 21u + 10u * 2u);
  check_rejects_truncation(compress::randomk{}, pb, {50, dtype::bf16});
}
