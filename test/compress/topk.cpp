#include <ashl/compress/topk.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/codec_testing.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

using namespace ashl;
using namespace codec_testing;

namespace {
// Reference: stable sort of indices by decreasing |x| (so ties keep the
// lower index first), the first k, then in index order.
template <class T>
std::vector<std::uint32_t> reference(const std::vector<T>& x, std::size_t k) {
  std::vector<std::uint32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(), [&](std::uint32_t a, std::uint32_t b) {
    return compress::detail::magnitude_key(x[a]) > compress::detail::magnitude_key(x[b]);
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

template <class T>
void check_exact(const std::vector<float>& xf, const compress::topk& c) {
  const auto x = to_type<T>(xf);
  const std::size_t n = x.size(), k = c.k_for(n);
  const auto want = reference(x, k);
  std::vector<std::byte> scratch(c.scratch_bytes(n, dtype_of<T>));
  std::vector<std::byte> tiny(16);
  for (int mode = 0; mode < 3; ++mode) {  // scratch given, none (allocates), too small (multi-pass)
    compress::codec_context ctx;
    if (mode == 0) ctx.scratch = scratch;
    if (mode == 2) ctx.scratch = tiny;
    auto p = encode_to_vector(c, std::span<const T>(x), ctx);
    BOOST_REQUIRE_EQUAL(p.size(), c.max_encoded_bytes(n, dtype_of<T>));
    BOOST_REQUIRE_EQUAL(p.size(), 12 + k * (4 + sizeof(T)));
    const auto got = read_pairs(p, dtype_of<T>);
    BOOST_REQUIRE_EQUAL(got.index.size(), k);
    BOOST_CHECK_MESSAGE(got.index == want, "top-k differs from the stable-sort reference, mode " + std::to_string(mode));
    for (std::size_t j = 0; j < k && j < got.index.size(); ++j)
      BOOST_CHECK_EQUAL(got.value[j], to_float(x[got.index[j]]));
  }
}

std::vector<float> tie_heavy(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = static_cast<float>(static_cast<int>(g() % 9) - 4) * 0.25f;  // 9 values, ties everywhere
  return x;
}
}  // namespace

BOOST_AUTO_TEST_CASE(k_from_ratio_or_count) {
  BOOST_CHECK_EQUAL(compress::topk{0.01}.k_for(1000), 10u);
  BOOST_CHECK_EQUAL(compress::topk{0.01}.k_for(10), 1u);       // max(1, round(0.1))
  BOOST_CHECK_EQUAL(compress::topk{0.015}.k_for(100), 2u);     // round(1.5) to even
  BOOST_CHECK_EQUAL(compress::topk{compress::topk::count{7}}.k_for(5), 5u);
  BOOST_CHECK(!compress::topk{0.0}.validate().ok());
  BOOST_CHECK(!compress::topk{1.5}.validate().ok());
  std::vector<float> x(4, 1.0f);
  std::vector<std::byte> out(100);
  auto r = compress::topk{0.0}.encode(host_view<const float>(x.data(), 4), out, {});
  BOOST_REQUIRE(!r.has_value());
  BOOST_CHECK_NE(r.error().message().find("topk.ratio"), std::string::npos);
}

BOOST_AUTO_TEST_CASE(exact_on_random_input_all_dtypes) {
  for (std::size_t n : {1u, 2u, 100u, 5000u}) {
    const auto x = normal_values(n, 11 + static_cast<std::uint32_t>(n));
    for (double r : {0.01, 0.3, 1.0}) {
      check_exact<float>(x, compress::topk{r});
      check_exact<half>(x, compress::topk{r});
      check_exact<bfloat16>(x, compress::topk{r});
    }
  }
}

BOOST_AUTO_TEST_CASE(exact_on_large_input_sampled_path) {
  const std::size_t n = 300000;  // above the sampled-bound threshold (2^17)
  const auto x = normal_values(n, 12);
  check_exact<float>(x, compress::topk{0.01});
  check_exact<half>(x, compress::topk{0.002});
  auto heavy = x;
  std::mt19937 g(3);
  std::cauchy_distribution<float> cd;
  for (auto& v : heavy) v = cd(g);
  check_exact<float>(heavy, compress::topk{0.05});
}

BOOST_AUTO_TEST_CASE(ties_go_to_the_lower_index) {
  for (std::size_t n : {1000u, 200000u}) {
    const auto x = tie_heavy(n, 5);
    check_exact<float>(x, compress::topk{0.1});
    check_exact<bfloat16>(x, compress::topk{0.37});
    const std::vector<float> same(n, -0.5f);
    check_exact<float>(same, compress::topk{0.01});
    check_exact<half>(same, compress::topk{compress::topk::count{3}});
    // All equal: exactly the lowest indices.
    auto p = encode_to_vector(compress::topk{compress::topk::count{3}}, std::span<const float>(same));
    const auto got = read_pairs(p, dtype::f32);
    BOOST_CHECK(got.index == (std::vector<std::uint32_t>{0, 1, 2}));
  }
}

BOOST_AUTO_TEST_CASE(decode_adds_scaled_pairs) {
  const auto x = normal_values(500, 13);
  compress::topk c{0.05};
  auto p = encode_to_vector(c, std::span<const float>(x));
  std::vector<float> acc(500, 1.0f);
  BOOST_REQUIRE(compress::topk{}.decode_add(p, {500, dtype::f32}, host_view<float>(acc.data(), 500), 0.5f, {}).ok());
  const auto sel = reference(x, c.k_for(500));
  std::vector<bool> in(500, false);
  for (auto i : sel) in[i] = true;
  for (std::size_t i = 0; i < 500; ++i) BOOST_CHECK_EQUAL(acc[i], in[i] ? 1.0f + 0.5f * x[i] : 1.0f);
}

BOOST_AUTO_TEST_CASE(rejects_malformed_payloads) {
  const auto x = normal_values(64, 14);
  compress::topk c{0.1};
  auto p = encode_to_vector(c, std::span<const float>(x));
  check_sparse_rejections(compress::topk{}, p, {64, dtype::f32});
  auto zero = p;
  put_u32(zero, 8, 0);
  zero.resize(12);
  auto s = decode_guarded(compress::topk{}, zero, {64, dtype::f32});
  BOOST_CHECK(!s.ok());
  BOOST_CHECK_NE(s.message().find("topk.count = 0"), std::string::npos);
  const auto xh = to_type<half>(x);
  check_sparse_rejections(compress::topk{}, encode_to_vector(c, std::span<const half>(xh)), {64, dtype::f16});
}
