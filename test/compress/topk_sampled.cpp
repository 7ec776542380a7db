#include <ashl/compress/topk_sampled.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/codec_testing.hpp"

#include <ashl/core/philox.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ios>

using namespace ashl;
using namespace codec_testing;

namespace {
template <class T>
void check_bounds(const std::vector<float>& xf, const compress::topk_sampled& c, std::uint64_t step,
                  std::size_t scratch_size = ~std::size_t{0}) {
  const auto x = to_type<T>(xf);
  const std::size_t n = x.size();
  const bool full = scratch_size == ~std::size_t{0};
  std::vector<std::byte> scratch(full ? c.scratch_bytes(n, dtype_of<T>) : scratch_size);
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
  if (full) BOOST_CHECK(q == p);
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

// A caller scratch smaller than scratch_bytes: one that holds only the cap
// (the selection at the first threshold over x), and one that holds nothing
// useful (exact top-k by radix select). The contract holds either way; and
// the heavy-tie input overflows the candidate list at the safe threshold.
BOOST_AUTO_TEST_CASE(smaller_scratch_and_overflowing_candidates) {
  const std::size_t n = 1 << 18;
  const auto normal = normal_values(n, 25);
  // ties: few distinct values. plateau: 10 % equal to 10 (the safe threshold
  // falls among them and their count overflows the list), 1 % distinct above.
  std::vector<float> ties(n), plateau(n);
  for (std::size_t i = 0; i < n; ++i) {
    ties[i] = std::round(std::fabs(normal[i]) * 2.0f);
    plateau[i] = i % 100 == 0 ? 100.0f + std::fabs(normal[i]) : i % 10 == 1 ? 10.0f : normal[i];
  }
  for (double r : {0.001, 0.01}) {
    const compress::topk_sampled c{r};
    const std::size_t one_pass = 8 * std::max(c.hi_for(n), compress::topk_sampled::sample_size / 2) + 7;
    for (std::size_t bytes : {one_pass, std::size_t{64}}) {
      check_bounds<float>(normal, c, 1, bytes);
      check_bounds<float>(ties, c, 1, bytes);
    }
    for (std::uint64_t step = 0; step < 4; ++step) check_bounds<float>(plateau, c, step);
    check_bounds<float>(ties, c, 0);
    check_bounds<half>(plateau, c, 2);
  }
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

// The exact payload bytes (FNV-1a of each), pinned from the encoder of
// commit 1e05f39 (one full pass over x per threshold tried) before it was
// replaced by one candidate pass at a safe threshold. The cases reach a
// first threshold in range, ties at it, and misses (tolerance 0.005 / 0.01,
// one pass or several). Every pin is unchanged but one: ties, setting 4,
// step 0, where the old encoder's third pass landed in range (its refined
// sample ranks read keys the first pass had overwritten) and the new one
// sends the exact top-k, as the old one did with passes = 1 and as it does
// for step 1.
BOOST_AUTO_TEST_CASE(payload_bytes_are_pinned) {
  const std::size_t n = 300007;
  const auto gold = golden_input(n, 14);
  std::vector<float> ties(n), equal(n, -0.5f);
  for (std::size_t i = 0; i < n; ++i) ties[i] = std::round(std::fabs(gold[i]) * 4.0f) / 4.0f;
  struct input {
    const char* name;
    const std::vector<float>* x;
  };
  const input inputs[] = {{"golden", &gold}, {"ties", &ties}, {"equal", &equal}};
  struct setting {
    double ratio, tolerance;
    int passes;
  };
  const setting settings[] = {{0.01, 0.1, 3}, {0.001, 0.1, 3}, {0.1, 0.1, 3}, {0.0001, 0.1, 3},
                              {0.01, 0.01, 3}, {0.001, 0.02, 1}, {0.003, 0.005, 5}};
  // pins[input][setting][step]
  const std::uint64_t pins[3][7][2] = {
      {{0x5d7cd5a861741d7e, 0xebe8d59c36c843cf}, {0x65ce3664daf473da, 0x65ce3664daf473da}, {0xff7846c0510db621, 0xb948635058ac56d8}, {0x362f7e55bf5e4990, 0x2c6cf179724f81ce}, {0xd8576064d0f80b3a, 0xd8576064d0f80b3a}, {0x65ce3664daf473da, 0x65ce3664daf473da}, {0xd62f9da8c367fd48, 0xd62f9da8c367fd48}},  // golden
      {{0xeb31c746fc66b448, 0xe66ea3b4cdfa82ea}, {0xfec9512718ac7f5f, 0xfec9512718ac7f5f}, {0xfff0a9fbae3bc89, 0xc0e871a06e78b58b}, {0x1baa2301db81ff24, 0x20ba648b7db00af1}, {0x318da73e78688e3c, 0x318da73e78688e3c}, {0xfec9512718ac7f5f, 0xfec9512718ac7f5f}, {0x522354d457854f93, 0x522354d457854f93}},  // ties
      {{0x370a8736c03fa45e, 0x370a8736c03fa45e}, {0xda6176c0bae8b30, 0xda6176c0bae8b30}, {0x906fef4a8967689b, 0x906fef4a8967689b}, {0x18abf8c534e19a9c, 0x18abf8c534e19a9c}, {0x370a8736c03fa45e, 0x370a8736c03fa45e}, {0xda6176c0bae8b30, 0xda6176c0bae8b30}, {0xed5aad22bd2c5f86, 0xed5aad22bd2c5f86}},  // equal
  };
  for (std::size_t a = 0; a < 3; ++a) {
    for (std::size_t b = 0; b < 7; ++b) {
      const setting& st = settings[b];
      const compress::topk_sampled c{{.ratio = st.ratio, .tolerance = st.tolerance, .passes = st.passes}};
      std::vector<std::byte> scratch(c.scratch_bytes(n, dtype::f32));
      for (std::uint64_t step = 0; step < 2; ++step) {
        const compress::codec_context ctx{.seed = 99, .step = step, .tensor = 4, .scratch = scratch};
        const std::uint64_t h = fnv1a(encode_to_vector(c, std::span<const float>(*inputs[a].x), ctx));
        BOOST_CHECK_MESSAGE(h == pins[a][b][step], inputs[a].name << " setting " << b << " step " << step << ": 0x"
                                                                << std::hex << h);
      }
    }
  }
  // f16 and bf16 inputs (keys of 15 bits).
  const auto xh = to_type<half>(gold);
  const auto xb = to_type<bfloat16>(gold);
  const compress::topk_sampled c{0.01};
  std::vector<std::byte> scratch(c.scratch_bytes(n, dtype::f16));
  const compress::codec_context ctx{.seed = 5, .step = 1, .tensor = 2, .scratch = scratch};
  const std::uint64_t hh = fnv1a(encode_to_vector(c, std::span<const half>(xh), ctx));
  const std::uint64_t hb = fnv1a(encode_to_vector(c, std::span<const bfloat16>(xb), ctx));
  BOOST_CHECK_MESSAGE(hh == 0x2176db92d0709b49 && hb == 0x37cb131ee611d6cb, "f16 0x" << std::hex << hh << " bf16 0x" << hb);
}
