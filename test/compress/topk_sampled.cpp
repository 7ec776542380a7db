#include <ashl/compress/topk_sampled.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/codec_testing.hpp"

#include <algorithm>
#include <cmath>

using namespace ashl;
using namespace codec_testing;

namespace {
template <class T>
void check_bounds(const std::vector<float>& xf, const compress::topk_sampled& c, std::uint64_t step) {
  const auto x = to_type<T>(xf);
  const std::size_t n = x.size();
  std::vector<std::byte> scratch(c.scratch_bytes(n, dtype_of<T>));
  compress::codec_context ctx{.seed = 42, .step = step, .tensor = 3, .scratch = scratch};
  auto p = encode_to_vector(c, std::span<const T>(x), ctx);
  const auto got = read_pairs(p, dtype_of<T>);
  const std::size_t count = got.index.size();
  BOOST_CHECK_LE(count, c.hi_for(n));  // never above the cap
  BOOST_CHECK_GE(count, c.lo_for(n));
  BOOST_CHECK_EQUAL(p.size(), 12 + count * (4 + sizeof(T)));
  BOOST_CHECK_LE(p.size(), c.max_encoded_bytes(n, dtype_of<T>));
  // A threshold selection: nothing left out is larger than anything kept.
  std::vector<bool> in(n, false);
  std::uint32_t min_in = 0xffffffffu;
  for (std::size_t j = 0; j < count; ++j) {
    in[got.index[j]] = true;
    min_in = std::min(min_in, compress::detail::magnitude_key(x[got.index[j]]));
    BOOST_CHECK_EQUAL(got.value[j], to_float(x[got.index[j]]));
    if (j) BOOST_CHECK_LT(got.index[j - 1], got.index[j]);
  }
  std::uint32_t max_out = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (!in[i]) max_out = std::max(max_out, compress::detail::magnitude_key(x[i]));
  BOOST_CHECK_LE(max_out, min_in);
  // Also with caller scratch absent (allocates) the result is in range.
  compress::codec_context bare{.seed = 42, .step = step, .tensor = 3};
  auto q = encode_to_vector(c, std::span<const T>(x), bare);
  BOOST_CHECK(q == p);
}
}  // namespace

BOOST_AUTO_TEST_CASE(cap_and_tolerance) {
  compress::topk_sampled c{0.01};
  BOOST_CHECK_EQUAL(c.k_for(1000000), 10000u);
  BOOST_CHECK_EQUAL(c.hi_for(1000000), 11000u);
  BOOST_CHECK_EQUAL(c.lo_for(1000000), 9000u);
  BOOST_CHECK_EQUAL(c.max_encoded_bytes(1000000, dtype::f32), 12u + 11000u * 8u);
  BOOST_CHECK(!compress::topk_sampled{compress::topk_sampled_options{.tolerance = 0.0}}.validate().ok());
  BOOST_CHECK(!compress::topk_sampled{compress::topk_sampled_options{.passes = 0}}.validate().ok());
}

BOOST_AUTO_TEST_CASE(random_heavy_tailed_and_all_equal) {
  const std::size_t n = 1 << 18;
  const auto normal = normal_values(n, 21);
  std::mt19937 g(22);
  std::cauchy_distribution<float> cd;
  std::vector<float> cauchy(n), pareto(n), equal(n, 0.75f), ties(n);
  for (auto& v : cauchy) v = cd(g);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto& v : pareto) v = (g() & 1 ? 1.0f : -1.0f) * std::pow(1.0f - u(g), -1.0f / 1.5f);
  for (auto& v : ties) v = static_cast<float>(g() % 4);
  for (std::uint64_t step = 0; step < 3; ++step) {
    for (double r : {0.001, 0.01, 0.1}) {
      compress::topk_sampled c{r};
      check_bounds<float>(normal, c, step);
      check_bounds<float>(cauchy, c, step);
      check_bounds<float>(pareto, c, step);
      check_bounds<float>(equal, c, step);
      check_bounds<float>(ties, c, step);
    }
  }
  check_bounds<half>(normal, compress::topk_sampled{0.01}, 0);
  check_bounds<bfloat16>(cauchy, compress::topk_sampled{0.01}, 0);
  check_bounds<half>(equal, compress::topk_sampled{0.01}, 0);
  // All equal: exactly k pairs, the lowest indices.
  compress::topk_sampled c{0.01};
  auto p = encode_to_vector(c, std::span<const float>(equal), {.seed = 1});
  const auto got = read_pairs(p, dtype::f32);
  BOOST_REQUIRE_EQUAL(got.index.size(), c.k_for(n));
  for (std::size_t j = 0; j < got.index.size(); ++j) BOOST_CHECK_EQUAL(got.index[j], j);
}

BOOST_AUTO_TEST_CASE(small_tensors_are_exact) {
  const auto x = normal_values(1000, 23);
  compress::topk_sampled c{0.05};
  auto p = encode_to_vector(c, std::span<const float>(x));
  BOOST_CHECK_EQUAL(read_pairs(p, dtype::f32).index.size(), 50u);
}

BOOST_AUTO_TEST_CASE(rejects_malformed_payloads) {
  const auto x = normal_values(64, 24);
  auto p = encode_to_vector(compress::topk_sampled{0.1}, std::span<const float>(x));
  check_sparse_rejections(compress::topk_sampled{}, p, {64, dtype::f32});
}
