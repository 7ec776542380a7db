#include <ashl/compress/dgc.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/codec_testing.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

using namespace ashl;
using namespace codec_testing;

static_assert(compress::stateful_codec<compress::dgc<compress::threshold>>);
static_assert(compress::stateful_codec<compress::dgc<compress::topk_sampled>>);

BOOST_AUTO_TEST_CASE(momentum_correction_and_masking_match_reference) {
  const std::size_t n = 200;
  const float m = 0.9f;
  compress::dgc<compress::topk> d{compress::topk{0.05}, {.momentum = m}};
  std::vector<float> u(n, 0.0f), v(n, 0.0f);  // reference state
  std::vector<double> sum_g(n, 0.0), sum_sent(n, 0.0);
  std::vector<std::byte> buf(d.max_encoded_bytes(n, dtype::f32));
  for (int t = 0; t < 60; ++t) {
    const auto g = normal_values(n, 200 + t);
    const compress::codec_context ctx{.seed = 1, .step = static_cast<std::uint64_t>(t), .tensor = 7};
    auto used = d.encode(host_view<const float>(g.data(), n), buf, ctx);
    BOOST_REQUIRE(used.has_value());
    std::vector<float> sent(n, 0.0f);
    BOOST_REQUIRE(compress::topk{}.decode_add({buf.data(), *used}, {n, dtype::f32}, host_view<float>(sent.data(), n), 1.0f, ctx).ok());
    const auto pairs = read_pairs(std::vector<std::byte>(buf.begin(), buf.begin() + *used), dtype::f32);
    BOOST_REQUIRE_EQUAL(pairs.index.size(), 10u);
    for (std::size_t i = 0; i < n; ++i) {
      u[i] = m * u[i] + g[i];
      v[i] += u[i];
    }
    // The sent indices are the top-k of |v| (ties to the lower index), in order.
    std::vector<std::uint32_t> order(n);
    for (std::uint32_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return std::fabs(v[a]) > std::fabs(v[b]); });
    std::vector<std::uint32_t> top(order.begin(), order.begin() + 10);
    std::sort(top.begin(), top.end());
    BOOST_CHECK(pairs.index == top);
    for (std::size_t j = 0; j < pairs.index.size(); ++j) {
      const auto i = pairs.index[j];
      BOOST_CHECK_EQUAL(pairs.value[j], v[i]);  // sends the accumulated velocity
      u[i] = v[i] = 0.0f;
      BOOST_CHECK_EQUAL(d.momentum(7)[i], 0.0f);  // masked
      BOOST_CHECK_EQUAL(d.velocity(7)[i], 0.0f);
    }
    for (std::size_t i = 0; i < n; ++i) {
      BOOST_REQUIRE_EQUAL(d.momentum(7)[i], u[i]);
      BOOST_REQUIRE_EQUAL(d.velocity(7)[i], v[i]);
    }
  }
}

// Sampled top-k inside DGC, on f16 gradients at a size where it samples:
// every sent |v| is at least every unsent one, the count is in the codec's
// [lo, hi], sent values are v, and u, v after the step match the reference.
BOOST_AUTO_TEST_CASE(sampled_inner_sends_the_largest_velocities) {
  const std::size_t n = compress::topk_sampled::min_sampled_n + 1000;
  const float m = 0.5f;
  const compress::topk_sampled inner{0.01};
  compress::dgc<compress::topk_sampled> d{inner, {.momentum = m}};
  std::vector<float> u(n, 0.0f), v(n, 0.0f);
  std::vector<std::byte> buf(d.max_encoded_bytes(n, dtype::f16));
  std::vector<std::byte> scratch(d.scratch_bytes(n, dtype::f16));
  for (int t = 0; t < 3; ++t) {
    const auto g = to_type<half>(normal_values(n, 900 + t));
    const compress::codec_context ctx{.seed = 2, .step = static_cast<std::uint64_t>(t), .tensor = 4, .scratch = scratch};
    auto used = d.encode(host_view<const half>(g.data(), n), buf, ctx);
    BOOST_REQUIRE(used.has_value());
    for (std::size_t i = 0; i < n; ++i) {
      u[i] = m * u[i] + to_float(g[i]);
      v[i] += u[i];
    }
    const auto pairs = read_pairs(std::vector<std::byte>(buf.begin(), buf.begin() + *used), dtype::f32);
    BOOST_REQUIRE_GE(pairs.index.size(), inner.lo_for(n));
    BOOST_REQUIRE_LE(pairs.index.size(), inner.hi_for(n));
    std::vector<bool> sent(n, false);
    float min_sent = std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < pairs.index.size(); ++j) {
      const auto i = pairs.index[j];
      BOOST_REQUIRE_EQUAL(pairs.value[j], v[i]);
      sent[i] = true;
      min_sent = std::min(min_sent, std::fabs(v[i]));
    }
    float max_unsent = 0.0f;
    for (std::size_t i = 0; i < n; ++i)
      if (!sent[i]) max_unsent = std::max(max_unsent, std::fabs(v[i]));
    BOOST_CHECK_GE(min_sent, max_unsent);
    for (std::size_t i = 0; i < n; ++i)
      if (sent[i]) u[i] = v[i] = 0.0f;
    std::size_t state_bad = 0;
    for (std::size_t i = 0; i < n; ++i) state_bad += d.momentum(4)[i] != u[i] || d.velocity(4)[i] != v[i];
    BOOST_CHECK_EQUAL(state_bad, 0u);
  }
}

BOOST_AUTO_TEST_CASE(zero_momentum_is_error_feedback) {
  // m = 0: v is the residual of EF-topk, so sum(sent) = sum(g) - v.
  const std::size_t n = 64;
  compress::dgc<compress::topk> d{compress::topk{0.1}, {.momentum = 0.0f}};
  d.reserve(0, n);
  std::vector<double> sum_g(n, 0.0), sum_sent(n, 0.0);
  std::vector<std::byte> buf(d.max_encoded_bytes(n, dtype::bf16));
  for (int t = 0; t < 40; ++t) {
    const auto g = to_type<bfloat16>(normal_values(n, 300 + t));
    auto used = d.encode(host_view<const bfloat16>(g.data(), n), buf, {});
    BOOST_REQUIRE(used.has_value());
    std::vector<float> sent(n, 0.0f);
    BOOST_REQUIRE(d.decode_add({buf.data(), *used}, {n, dtype::f32}, host_view<float>(sent.data(), n), 1.0f, {}).ok());
    for (std::size_t i = 0; i < n; ++i) {
      sum_g[i] += to_float(g[i]);
      sum_sent[i] += sent[i];
    }
  }
  for (std::size_t i = 0; i < n; ++i) BOOST_CHECK_SMALL(sum_sent[i] - (sum_g[i] - d.velocity(0)[i]), 1e-3);
}

BOOST_AUTO_TEST_CASE(errors) {
  std::vector<float> g(10, 1.0f);
  std::vector<std::byte> buf(1000), small(4);
  compress::dgc<compress::threshold> bad{compress::threshold{}, {.momentum = 1.0f}};
  auto r = bad.encode(host_view<const float>(g.data(), 10), buf, {});
  BOOST_REQUIRE(!r.has_value());
  BOOST_CHECK_NE(r.to_status().message().find("dgc.momentum"), std::string::npos);
  compress::dgc<compress::topk> d{compress::topk{0.5}};
  BOOST_CHECK(!d.encode(host_view<const float>(g.data(), 10), small, {}).has_value());
  for (float v : d.velocity(0)) BOOST_CHECK_EQUAL(v, 1.0f);  // nothing sent: still accumulated
  d.reset();
  for (float v : d.momentum(0)) BOOST_CHECK_EQUAL(v, 0.0f);
}
