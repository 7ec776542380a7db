#include <ashl/profile/gradient_coding.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/counting_new.hpp"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace ap = ashl::profile;

namespace {

ap::gradient_code code_of(std::size_t m, std::size_t r, std::uint64_t seed = ap::gradient_code_default_seed) {
  auto c = ap::gradient_code::make(m, r, seed);
  BOOST_REQUIRE_MESSAGE(c.has_value(), (c ? std::string() : c.error().message()));
  return std::move(*c);
}

std::string error_of(std::size_t m, std::size_t r) {
  auto c = ap::gradient_code::make(m, r);
  return c ? std::string("ok") : c.error().message();
}

// Random partition gradients g[j] (dim values each), spread over magnitudes.
std::vector<std::vector<double>> gradients(std::size_t m, std::size_t dim, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<std::vector<double>> g(m, std::vector<double>(dim));
  for (std::size_t j = 0; j < m; ++j)
    for (auto& v : g[j]) v = u(rng) * std::pow(10.0, static_cast<double>(j % 3));
  return g;
}

// Worker i's commit c_i = Σ_j B[i][j]·g_j, computed from its encoding only
// (what a worker program has).
std::vector<double> commit_of(const ap::gradient_code& code, std::size_t i, const std::vector<std::vector<double>>& g) {
  std::vector<double> c(g[0].size(), 0.0);
  for (const auto& [j, b] : code.encoding(i))
    for (std::size_t k = 0; k < c.size(); ++k) c[k] += b * g[j][k];
  return c;
}

struct worst_case {
  double error = 0.0;          // max over coordinates of |decoded − Σ g| / Σ_j |g_j|
  double residual = 0.0;
  double amplification = 0.0;
  std::size_t subsets = 0;
};

// Every subset of at least M − r workers decodes Σ_j g_j.
worst_case check_every_subset(std::size_t m, std::size_t r, std::uint64_t seed) {
  ap::gradient_code code = code_of(m, r);
  std::mt19937_64 rng(seed);
  const std::size_t dim = 6;
  const auto g = gradients(m, dim, rng);
  std::vector<std::vector<double>> c(m);
  for (std::size_t i = 0; i < m; ++i) c[i] = commit_of(code, i, g);
  std::vector<double> want(dim, 0.0), scale(dim, 0.0);
  for (std::size_t j = 0; j < m; ++j)
    for (std::size_t k = 0; k < dim; ++k) {
      want[k] += g[j][k];
      scale[k] += std::abs(g[j][k]);
    }
  worst_case w;
  for (std::uint64_t set = 1; set < (std::uint64_t{1} << m); ++set) {
    if (static_cast<std::size_t>(std::popcount(set)) < m - r) continue;
    const auto d = code.decode(set);
    BOOST_REQUIRE_MESSAGE(d.has_value(), (d ? std::string() : d.error().message()));
    BOOST_REQUIRE(static_cast<std::size_t>(std::popcount(d->used)) == m - r);
    BOOST_REQUIRE((d->used & ~set) == 0u);
    for (std::size_t k = 0; k < dim; ++k) {
      double got = 0.0;
      for (std::size_t i = 0; i < m; ++i) {
        if (((set >> i) & 1u) == 0) BOOST_REQUIRE(d->weights[i] == 0.0);  // only arrived commits are used
        got += d->weights[i] * c[i][k];
      }
      w.error = std::max(w.error, std::abs(got - want[k]) / scale[k]);
    }
    w.residual = std::max(w.residual, d->residual);
    w.amplification = std::max(w.amplification, d->amplification);
    ++w.subsets;
  }
  return w;
}

}  // namespace

BOOST_AUTO_TEST_CASE(refusals_name_the_field_and_value) {
  BOOST_TEST(error_of(0, 0) == "gradient_code.workers = 0: must be >= 1");
  BOOST_TEST(error_of(4, 4) == "gradient_code.stragglers = 4: must be < workers (4)");
  BOOST_TEST(error_of(4, 9) == "gradient_code.stragglers = 9: must be < workers (4)");
  BOOST_TEST(error_of(65, 1) == "gradient_code.workers = 65: must be <= 64");
  BOOST_TEST(error_of(1, 0) == "ok");
  BOOST_TEST(error_of(64, 63) == "ok");
  ap::gradient_code code = code_of(5, 2);
  auto few = code.decode(0b00011);
  BOOST_TEST_REQUIRE(!few.has_value());
  BOOST_TEST(few.error().message() ==
             "gradient_code.subset = 2: workers given; an exact decode needs at least M - r = 3");
  auto outside = code.decode(0b100111);
  BOOST_TEST_REQUIRE(!outside.has_value());
  BOOST_TEST(outside.error().message() == "gradient_code.subset = 39: names workers >= M = 5");
}

BOOST_AUTO_TEST_CASE(each_partition_is_on_exactly_r_plus_1_workers_and_b_follows_the_assignment) {
  for (std::size_t m = 1; m <= 12; ++m) {
    for (std::size_t r = 0; r < m; ++r) {
      const ap::gradient_code code = code_of(m, r);
      BOOST_TEST(code.partitions() == m);
      BOOST_TEST(code.needed() == m - r);
      for (std::size_t j = 0; j < m; ++j) {
        std::size_t holders = 0;
        for (std::size_t i = 0; i < m; ++i) {
          holders += code.holds(i, j);
          // Worker i holds i, i+1, ..., i+r (mod M): j − i (mod M) ≤ r.
          BOOST_TEST(code.holds(i, j) == ((j + m - i) % m <= r));
          if (!code.holds(i, j)) BOOST_TEST(code.coefficient(i, j) == 0.0);
        }
        BOOST_TEST(holders == r + 1);
      }
      for (std::size_t i = 0; i < m; ++i) {
        const auto e = code.encoding(i);
        BOOST_TEST_REQUIRE(e.size() == r + 1);
        BOOST_TEST(e[0].partition == i);
        BOOST_TEST(e[0].coefficient == 1.0);  // Algorithm 2 normalises the first entry
        for (std::size_t t = 0; t <= r; ++t) {
          BOOST_TEST(e[t].partition == (i + t) % m);
          BOOST_TEST(e[t].coefficient == code.coefficient(i, e[t].partition));
          BOOST_TEST(std::isfinite(e[t].coefficient));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(r_zero_is_bsp_identity_and_weights_all_one) {
  for (std::size_t m = 1; m <= 10; ++m) {
    ap::gradient_code code = code_of(m, 0);
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < m; ++j) BOOST_TEST(code.coefficient(i, j) == (i == j ? 1.0 : 0.0));
    const std::uint64_t all = m == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << m) - 1;
    const auto d = code.decode(all);
    BOOST_TEST_REQUIRE(d.has_value());
    for (double a : d->weights) BOOST_TEST(a == 1.0);
    BOOST_TEST(d->residual == 0.0);
    BOOST_TEST(d->amplification == 1.0);
  }
}

BOOST_AUTO_TEST_CASE(every_subset_of_m_minus_r_or_more_recovers_the_full_sum) {
  for (std::size_t m = 1; m <= 10; ++m) {
    for (std::size_t r : {0u, 1u, 2u, 3u}) {
      if (r >= m) continue;
      const worst_case w = check_every_subset(m, r, 1000 * m + r);
      BOOST_TEST_MESSAGE("M = " << m << ", r = " << r << ": " << w.subsets << " subsets, worst relative error "
                                << w.error << ", residual " << w.residual << ", amplification " << w.amplification);
      BOOST_TEST(w.error < 1e-10, "M = " << m << ", r = " << r << ": error " << w.error);
      BOOST_TEST(w.residual < 1e-10, "M = " << m << ", r = " << r << ": residual " << w.residual);
    }
  }
}

BOOST_AUTO_TEST_CASE(other_seeds_and_larger_r_decode_too) {
  for (std::uint64_t seed : {1ull, 2ull, 77ull}) {
    for (std::size_t r = 4; r < 8; ++r) {
      ap::gradient_code code = code_of(8, r, seed);
      for (std::uint64_t set = 1; set < 256; ++set) {
        if (static_cast<std::size_t>(std::popcount(set)) < 8 - r) continue;
        const auto d = code.decode(set);
        BOOST_TEST_REQUIRE(d.has_value());
        BOOST_TEST(d->residual < 1e-9);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(same_parameters_same_code_and_seed_changes_it) {
  const ap::gradient_code a = code_of(7, 2, 5), b = code_of(7, 2, 5), c = code_of(7, 2, 6);
  bool differs = false;
  for (std::size_t i = 0; i < 7; ++i)
    for (std::size_t j = 0; j < 7; ++j) {
      BOOST_TEST(a.coefficient(i, j) == b.coefficient(i, j));
      differs = differs || a.coefficient(i, j) != c.coefficient(i, j);
    }
  BOOST_TEST(differs);
}

BOOST_AUTO_TEST_CASE(float_commits_recover_within_amplified_float_rounding) {
  // What a server does: f32 commits, f32 weights, an f32 accumulator.
  ap::gradient_code code = code_of(10, 3);
  std::mt19937_64 rng(9);
  const auto g = gradients(10, 64, rng);
  std::vector<std::vector<float>> c(10);
  for (std::size_t i = 0; i < 10; ++i) {
    const auto ci = commit_of(code, i, g);
    c[i].assign(ci.begin(), ci.end());
  }
  double worst = 0.0, amp = 0.0;
  for (std::uint64_t set = 0; set < 1024; ++set) {
    if (std::popcount(set) != 7) continue;
    const auto d = code.decode(set);
    BOOST_TEST_REQUIRE(d.has_value());
    amp = std::max(amp, d->amplification);
    for (std::size_t k = 0; k < 64; ++k) {
      float acc = 0.0f;
      double want = 0.0, scale = 0.0;
      for (std::size_t i = 0; i < 10; ++i) acc += static_cast<float>(d->weights[i]) * c[i][k];
      for (std::size_t j = 0; j < 10; ++j) want += g[j][k], scale += std::abs(g[j][k]);
      // Bound: a few float roundings of each amplified term.
      const double bound = 8.0 * 6e-8 * (1.0 + d->amplification) * static_cast<double>(10);
      const double err = std::abs(static_cast<double>(acc) - want) / scale;
      BOOST_TEST(err < bound);
      worst = std::max(worst, err);
    }
  }
  BOOST_TEST_MESSAGE("M = 10, r = 3, f32: worst relative error " << worst << ", worst amplification " << amp);
}

BOOST_AUTO_TEST_CASE(decodes_of_seen_sets_allocate_nothing) {
  // Few sets of M − r (C(9, 2) = 36): all decoded by make().
  ap::gradient_code code = code_of(9, 2);
  BOOST_TEST(code.cached_subsets() == 36u);
  const std::uint64_t s1 = 0b111110110, s2 = 0b011111011, bigger = 0b111111110;
  const std::vector<double> w1(code.decode(s1)->weights.begin(), code.decode(s1)->weights.end());
  std::size_t before = counting_new::count();
  double sum = 0.0;
  for (int k = 0; k < 100; ++k) sum += code.decode(k % 3 == 0 ? s1 : k % 3 == 1 ? s2 : bigger)->weights[1];
  BOOST_TEST(counting_new::count() == before);
  BOOST_TEST(std::isfinite(sum));
  BOOST_TEST(code.cached_subsets() == 36u);
  // A larger set uses its first M − r members: the same weights as those.
  BOOST_TEST(code.decode(bigger)->used == 0b011111110u);
  // A copy decodes the same (the cache is a plain value).
  ap::gradient_code copy = code;
  BOOST_TEST((std::vector<double>(copy.decode(s1)->weights.begin(), copy.decode(s1)->weights.end()) == w1));
  // Many sets (C(40, 3) = 9880): decoded lazily, once each.
  ap::gradient_code big = code_of(40, 3);
  BOOST_TEST(big.cached_subsets() == 0u);
  const std::uint64_t s = (std::uint64_t{1} << 40) - 1 - 0b10101;
  const auto first = big.decode(s);
  BOOST_TEST_REQUIRE(first.has_value());
  BOOST_TEST(first->residual < 1e-9);
  BOOST_TEST(big.cached_subsets() == 1u);
  before = counting_new::count();
  BOOST_TEST(big.decode(s)->weights[5] == first->weights[5]);
  BOOST_TEST(counting_new::count() == before);
  BOOST_TEST(big.cached_subsets() == 1u);
}

BOOST_AUTO_TEST_CASE(least_squares_for_fewer_workers_is_exact_from_m_minus_r_and_best_below) {
  ap::gradient_code code = code_of(6, 2);
  std::vector<double> w(6);
  // Four workers (M − r): exact, and the same weights as decode().
  const auto exact = code.approximate(0b011011, w);
  BOOST_TEST_REQUIRE(exact.has_value());
  BOOST_TEST(*exact < 1e-12);
  const auto d = code.decode(0b011011);
  for (std::size_t i = 0; i < 6; ++i) BOOST_TEST(std::abs(w[i] - d->weights[i]) < 1e-12);
  // Three workers: not exact, but the normal equations hold: B_S·(B_Sᵀa − 1) = 0.
  const std::uint64_t s = 0b010011;
  const auto approx = code.approximate(s, w);
  BOOST_TEST_REQUIRE(approx.has_value());
  BOOST_TEST(*approx > 1e-3);
  for (std::size_t p = 0; p < 6; ++p) {
    if (((s >> p) & 1u) == 0) {
      BOOST_TEST(w[p] == 0.0);
      continue;
    }
    double g = 0.0;
    for (std::size_t j = 0; j < 6; ++j) {
      double x = -1.0;
      for (std::size_t i = 0; i < 6; ++i) x += w[i] * code.coefficient(i, j);
      g += code.coefficient(p, j) * x;
    }
    BOOST_TEST(std::abs(g) < 1e-10);
  }
  BOOST_TEST(!code.approximate(0, w).has_value());
  std::vector<double> short_w(3);
  BOOST_TEST(!code.approximate(0b1, short_w).has_value());
}
