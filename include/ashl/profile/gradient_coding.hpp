// ashl/profile/gradient_coding.hpp — the gradient-coding planner: cyclic
// repetition of data partitions over workers, the encoding matrix B, and the
// decoding weights that recover the full gradient sum from any M − r workers.
//
//   auto code = ashl::profile::gradient_code::make(5, 2);     // M = 5 workers, r = 2 stragglers
//   if (!code) return code.error();                           // "gradient_code.stragglers = 5: must be < workers (5)"
//   for (auto [j, b] : code->encoding(3)) commit += b * grad_of_partition(j);   // worker 3: partitions 3, 4, 0
//   auto d = code->decode(0b10110);                           // workers 1, 2, 4 arrived (M − r = 3)
//   // Σ_i d->weights[i] · commit_i = Σ_j g_j, to rounding (d->residual, d->amplification)
//
// Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers
// in Distributed Learning" (ICML 2017), the cyclic repetition scheme and its
// Algorithm 2; docs/seed-algorithms.md "Gradient coding". The data is split
// into M partitions; worker i holds partitions i, i+1, ..., i+r (mod M), so
// partition j is on the r + 1 workers j, j−1, ..., j−r (mod M). Worker i
// commits c_i = Σ_j B[i][j]·g_j (g_j: the gradient of partition j), with B[i]
// nonzero only on its own partitions. For every set S of at least M − r
// workers there are weights a with Σ_{i∈S} a_i·B[i] = (1, ..., 1), so
// Σ_{i∈S} a_i·c_i = Σ_j g_j: the server need not wait for the r slowest.
//
// Construction (the paper's Algorithm 2): H is an r × M matrix of seeded
// uniform values in [−1, 1) whose last column is minus the sum of the others,
// so H·1 = 0; row i of B is 1 at partition i and, on partitions i+1..i+r, the
// solution x of H[:, i+1..i+r]·x = −H[:, i], so H·B[i]ᵀ = 0. Every row lies in
// null(H), which has dimension M − r and contains 1; with H random (almost
// surely) any M − r rows of B are independent, hence span null(H) ∋ 1. The
// values come from Philox keyed by (seed, M, r) in 53-bit steps. (ours) One
// random H is sometimes badly conditioned (amplification, below, over 40,000
// for one subset at M = 10, r = 2), so make() draws 4 candidate H's and keeps
// the one with the lowest worst amplification over up to 64 subsets of M − r
// workers (all of them when C(M, r) ≤ 64, else 64 drawn from Philox). The
// same (M, r, seed) gives the same B on every host: a worker program rebuilds
// its coefficients from them instead of receiving them. (The candidates'
// scores differ by far more than rounding, so builds with other floating-
// point contraction pick the same one; candidate() tells which.)
//
// Decoding: for S (a bitmask of worker ids, |S| ≥ M − r) the weights of the
// first M − r members of S (lowest ids) solve the M × (M − r) system
// B_Tᵀ·a = 1 by Gaussian elimination with partial (row) pivoting in double;
// the other members of S get 0. The system is consistent, so this is the
// exact solution, not a least-squares fit. Accuracy: `residual` is
// max_j |Σ_i a_i·B[i][j] − 1| as computed (1e-15..1e-12 for M ≤ 10, r ≤ 3 in
// the tests); `amplification` is max_j Σ_i |a_i·B[i][j]|, the factor by which a
// relative rounding error ε in the commits (f32 on the wire: ε ≈ 6e-8) can
// grow in the decoded sum: |decoded − Σ g| ≲ (residual + ε·amplification)·Σ_j |g_j|
// per coordinate. Amplification is 1 for r = 0 and grows with r: with the
// default seed the worst over every subset is 24 / 82 / 700 for M = 9 and
// r = 1 / 2 / 3, and 66 / 199 / 678 for M = 10 (test/profile/gradient_coding
// prints them), so f32 commits decode to about 1e-5 of Σ_j |g_j| at worst.
// approximate() gives least-squares weights for fewer than M − r workers
// (normal equations; inexact by construction), for a caller that must apply
// something after losing more than r workers.
//
// Cost: make() is O(M·r³) per candidate plus 64 probe solves of
// O(M·(M − r)²) each (about 2·10⁷ flops at M = 64), and when C(M, r) ≤ 1024
// it decodes every set of M − r workers up front (C(M, r) such solves; 120
// at M = 10, r = 3), so decode() never allocates for such codes. Otherwise a
// decode of a new set is O(M·(M − r)²) and one cache entry (it allocates: a
// hash node, M doubles, temporaries); a set seen before is one hash lookup
// and allocates nothing. M ≤ 64 (bitmask).
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/status.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace profile {

inline constexpr std::size_t gradient_code_max_workers = 64;
inline constexpr std::uint64_t gradient_code_default_seed = 0x6772'6164'636f'6465ull;  // "gradcode"

// One term of a worker's commit: B[i][partition]·g_partition.
struct coded_partition {
  std::uint32_t partition = 0;
  double coefficient = 0.0;
  friend bool operator==(const coded_partition&, const coded_partition&) = default;
};

// Decoding weights for one set of workers. `weights` has one entry per
// worker (0 for workers outside `used`); valid until the next decode of a
// subset not seen before (the cache may grow).
struct decoding {
  std::span<const double> weights;
  std::uint64_t used = 0;       // the workers the weights use: the first M − r of the set asked for
  double residual = 0.0;        // max_j |Σ_i a_i·B[i][j] − 1|
  double amplification = 0.0;  // max_j Σ_i |a_i·B[i][j]|
};

namespace detail {

// Solves A·x = b for A (rows × cols, rows ≥ cols, row-major, overwritten) by
// Gaussian elimination with partial pivoting over rows, for a consistent
// system of full column rank; b (rows) is overwritten, x gets cols values.
// Returns false when a pivot is below `tiny` relative to A's largest entry
// (numerically rank-deficient).
inline bool eliminate(std::vector<double>& a, std::vector<double>& b, std::size_t rows, std::size_t cols,
                      std::span<double> x) {
  double scale = 0.0;
  for (double v : a) scale = std::max(scale, std::abs(v));
  if (scale == 0.0) return cols == 0;
  const double tiny = 1e-13 * scale;
  for (std::size_t k = 0; k < cols; ++k) {
    std::size_t p = k;
    for (std::size_t i = k + 1; i < rows; ++i)
      if (std::abs(a[i * cols + k]) > std::abs(a[p * cols + k])) p = i;
    if (!(std::abs(a[p * cols + k]) > tiny)) return false;
    if (p != k) {
      for (std::size_t c = 0; c < cols; ++c) std::swap(a[k * cols + c], a[p * cols + c]);
      std::swap(b[k], b[p]);
    }
    const double piv = a[k * cols + k];
    for (std::size_t i = k + 1; i < rows; ++i) {
      const double f = a[i * cols + k] / piv;
      if (f == 0.0) continue;
      for (std::size_t c = k; c < cols; ++c) a[i * cols + c] -= f * a[k * cols + c];
      b[i] -= f * b[k];
    }
  }
  for (std::size_t k = cols; k-- > 0;) {
    double s = b[k];
    for (std::size_t c = k + 1; c < cols; ++c) s -= a[k * cols + c] * x[c];
    x[k] = s / a[k * cols + k];
  }
  return true;
}

// 53 uniform bits of Philox word pair i, mapped to [−1, 1).
inline double signed_uniform(const philox_stream& s, std::uint64_t i) noexcept {
  const std::uint64_t bits = (static_cast<std::uint64_t>(s.word(2 * i)) << 32) | s.word(2 * i + 1);
  return static_cast<double>(bits >> 11) * 0x1.0p-52 - 1.0;
}

}  // namespace detail

class gradient_code {
 public:
  gradient_code() = default;

  // M = workers (1..64), r = stragglers tolerated (0..M−1).
  static result<gradient_code> make(std::size_t workers, std::size_t stragglers,
                                    std::uint64_t seed = gradient_code_default_seed) {
    if (workers == 0) return invalid_argument("gradient_code.workers", workers, "must be >= 1");
    if (workers > gradient_code_max_workers)
      return invalid_argument("gradient_code.workers", workers,
                              "must be <= " + std::to_string(gradient_code_max_workers));
    if (stragglers >= workers)
      return invalid_argument("gradient_code.stragglers", stragglers,
                              "must be < workers (" + std::to_string(workers) + ")");
    // The paper draws one random H; a random H is sometimes badly conditioned
    // (amplification in the tens of thousands for some subsets at M = 10), so
    // `candidates` H's are drawn (Philox lanes 0..candidates−1) and the one
    // whose worst amplification over the probe subsets is lowest is kept.
    gradient_code best;
    bool found = false;
    for (std::uint32_t lane = 0; lane < candidates; ++lane) {
      gradient_code g;
      g.m_ = workers;
      g.r_ = stragglers;
      g.seed_ = seed;
      g.candidate_ = lane;
      if (!g.build(lane)) continue;
      g.probe_amplification_ = g.probe();
      if (!found || g.probe_amplification_ < best.probe_amplification_) {
        best = std::move(g);
        found = true;
      }
    }
    if (!found || !std::isfinite(best.probe_amplification_))
      return make_error(errc::internal, "gradient_code.seed", seed, "no candidate H gives a decodable B: pick another seed");
    // Every set of exactly M − r workers, decoded now when there are few, so
    // that no round ever decodes (and allocates) for the first time.
    std::uint64_t sets = 1;
    for (std::size_t k = 0; k < stragglers && sets <= eager_subsets; ++k) sets = sets * (workers - k) / (k + 1);
    if (sets <= eager_subsets) {
      best.cache_.reserve(static_cast<std::size_t>(sets));
      best.pool_.reserve(static_cast<std::size_t>(sets) * workers);
      best.stats_.reserve(static_cast<std::size_t>(sets));
      const std::uint64_t all = workers == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << workers) - 1;
      std::uint64_t v = stragglers == 0 ? 0 : (std::uint64_t{1} << stragglers) - 1;  // the missing workers
      for (std::uint64_t n = 0; n < sets; ++n) {
        if (!best.decode(all & ~v))
          return make_error(errc::internal, "gradient_code.seed", seed, "a set of M - r workers does not decode");
        if (n + 1 == sets) break;
        const std::uint64_t t = v | (v - 1);
        v = (t + 1) | (((~t & (t + 1)) - 1) >> (std::countr_zero(v) + 1));
      }
    }
    return best;
  }

  [[nodiscard]] std::size_t workers() const noexcept { return m_; }
  [[nodiscard]] std::size_t partitions() const noexcept { return m_; }
  [[nodiscard]] std::size_t stragglers() const noexcept { return r_; }
  [[nodiscard]] std::size_t needed() const noexcept { return m_ - r_; }  // M − r
  [[nodiscard]] std::uint64_t seed() const noexcept { return seed_; }

  // Assignment: worker i holds partitions i, i+1, ..., i+r (mod M).
  [[nodiscard]] bool holds(std::size_t worker, std::size_t partition) const noexcept {
    return worker < m_ && partition < m_ && (partition + m_ - worker) % m_ <= r_;
  }
  // B[i][j]; 0 unless holds(i, j).
  [[nodiscard]] double coefficient(std::size_t worker, std::size_t partition) const noexcept {
    return b_[worker * m_ + partition];
  }
  // Row i of B (M values).
  [[nodiscard]] std::span<const double> row(std::size_t worker) const noexcept {
    return std::span<const double>(b_).subspan(worker * m_, m_);
  }
  // What worker i computes and commits: Σ over these of coefficient·g_partition.
  // Partitions i, i+1, ..., i+r (mod M), in that order.
  [[nodiscard]] std::vector<coded_partition> encoding(std::size_t worker) const {
    std::vector<coded_partition> e;
    if (worker >= m_) return e;
    e.reserve(r_ + 1);
    for (std::size_t t = 0; t <= r_; ++t) {
      const std::size_t j = (worker + t) % m_;
      e.push_back({static_cast<std::uint32_t>(j), coefficient(worker, j)});
    }
    return e;
  }

  // Exact decoding weights for the workers in `set` (bit i: worker i's
  // commit arrived), at least M − r of them. Cached by the first M − r
  // members of the set: a set whose first M − r were decoded before costs a
  // lookup and allocates nothing.
  result<decoding> decode(std::uint64_t set) {
    ASHL_TRY(check_set(set));
    const auto n = static_cast<std::size_t>(std::popcount(set));
    if (n < needed())
      return invalid_argument("gradient_code.subset", n,
                              "workers given; an exact decode needs at least M - r = " + std::to_string(needed()));
    const std::uint64_t used = first_members(set, needed());
    if (auto it = cache_.find(used); it != cache_.end()) return view(it->second);
    std::vector<double> w(m_, 0.0);
    if (!solve_exact(used, w))
      return make_error(errc::internal, "gradient_code.subset", set,
                        "the rows of B of these workers are numerically dependent (seed " + std::to_string(seed_) +
                            ")");
    const std::size_t at = stats_.size();
    pool_.insert(pool_.end(), w.begin(), w.end());
    stats_.push_back({used, residual(w), amplification(w)});
    cache_.emplace(used, at);
    return view(at);
  }

  // Least-squares weights (minimising ||Σ_{i∈set} a_i·B[i] − 1||₂, normal
  // equations) for any nonempty set, into `weights` (M entries; 0 outside the
  // set). Exact when the set has M − r members or more; for fewer, the best
  // approximation of the full sum those workers allow. Returns the residual
  // max_j |Σ_i a_i·B[i][j] − 1|. Not cached; allocates.
  result<double> approximate(std::uint64_t set, std::span<double> weights) const {
    ASHL_TRY(check_set(set));
    if (set == 0) return invalid_argument("gradient_code.subset", 0, "is empty");
    if (weights.size() != m_) return invalid_argument("gradient_code.weights", weights.size(), "must hold M entries");
    const auto n = static_cast<std::size_t>(std::popcount(set));
    std::fill(weights.begin(), weights.end(), 0.0);
    if (n >= needed()) {
      if (!solve_exact(first_members(set, needed()), weights))
        return make_error(errc::internal, "gradient_code.subset", set, "the rows of B are numerically dependent");
      return residual(weights);
    }
    std::vector<std::size_t> ids;
    for (std::size_t i = 0; i < m_; ++i)
      if ((set >> i) & 1u) ids.push_back(i);
    // (B_S·B_Sᵀ)·a = B_S·1.
    std::vector<double> a(n * n), rhs(n), x(n);
    for (std::size_t p = 0; p < n; ++p) {
      double s = 0.0;
      for (std::size_t j = 0; j < m_; ++j) s += coefficient(ids[p], j);
      rhs[p] = s;
      for (std::size_t q = 0; q < n; ++q) {
        double d = 0.0;
        for (std::size_t j = 0; j < m_; ++j) d += coefficient(ids[p], j) * coefficient(ids[q], j);
        a[p * n + q] = d;
      }
    }
    if (!detail::eliminate(a, rhs, n, n, x))
      return make_error(errc::internal, "gradient_code.subset", set, "the rows of B are numerically dependent");
    for (std::size_t p = 0; p < n; ++p) weights[ids[p]] = x[p];
    return residual(weights);
  }

  [[nodiscard]] std::size_t cached_subsets() const noexcept { return stats_.size(); }
  // Which candidate H was kept, and its worst amplification over the probe subsets.
  [[nodiscard]] std::uint32_t candidate() const noexcept { return candidate_; }
  [[nodiscard]] double probe_amplification() const noexcept { return probe_amplification_; }

  static constexpr std::uint32_t candidates = 4;
  static constexpr std::uint64_t eager_subsets = 1024;
  static constexpr std::uint64_t probe_subsets = 64;

 private:
  struct entry_stats {
    std::uint64_t used;
    double residual;
    double amplification;
  };

  // Row i of B: 1 at partition i, and on i+1..i+r the x with
  // H[:, i+1..i+r]·x = −H[:, i] (the paper's Algorithm 2), for H drawn from
  // Philox (seed; M, r; lane) with H·1 = 0.
  bool build(std::uint32_t lane) {
    const std::size_t m = m_, r = r_;
    b_.assign(m * m, 0.0);
    const philox_stream rng(seed_, (std::uint64_t{lane} << 32) | m, static_cast<std::uint32_t>(r));
    std::vector<double> h(r * m, 0.0);
    for (std::size_t k = 0; k < r; ++k) {
      double sum = 0.0;
      for (std::size_t j = 0; j + 1 < m; ++j) {
        h[k * m + j] = detail::signed_uniform(rng, k * m + j);
        sum += h[k * m + j];
      }
      h[k * m + m - 1] = -sum;
    }
    std::vector<double> a(r * r), rhs(r), x(r);
    for (std::size_t i = 0; i < m; ++i) {
      b_[i * m + i] = 1.0;
      if (r == 0) continue;
      for (std::size_t k = 0; k < r; ++k) {
        for (std::size_t t = 0; t < r; ++t) a[k * r + t] = h[k * m + (i + 1 + t) % m];
        rhs[k] = -h[k * m + i];
      }
      if (!detail::eliminate(a, rhs, r, r, x)) return false;
      for (std::size_t t = 0; t < r; ++t) b_[i * m + (i + 1 + t) % m] = x[t];
    }
    return true;
  }
  // Worst amplification over the probe subsets of M − r workers: every one
  // when there are at most probe_subsets, else probe_subsets drawn from
  // Philox (seed; lane 0xffff); +inf when one does not decode.
  [[nodiscard]] double probe() const {
    const std::size_t m = m_, r = r_;
    if (r == 0) return 1.0;
    const std::uint64_t all = m == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << m) - 1;
    std::vector<double> w(m);
    double worst = 0.0;
    const auto try_missing = [&](std::uint64_t missing) {
      std::fill(w.begin(), w.end(), 0.0);
      if (!solve_exact(all & ~missing, w)) return false;
      worst = std::max(worst, amplification(w));
      return true;
    };
    // C(M, r), stopping once it passes probe_subsets.
    std::uint64_t count = 1;
    for (std::size_t k = 0; k < r && count <= probe_subsets; ++k) count = count * (m - k) / (k + 1);
    if (count <= probe_subsets) {
      // Every r-subset of missing workers, in Gosper's order.
      std::uint64_t v = (std::uint64_t{1} << r) - 1;
      for (std::uint64_t n = 0; n < count; ++n) {
        if (!try_missing(v)) return std::numeric_limits<double>::infinity();
        if (n + 1 == count) break;  // the next step would shift by 64 after the last set
        const std::uint64_t t = v | (v - 1);
        v = (t + 1) | (((~t & (t + 1)) - 1) >> (std::countr_zero(v) + 1));
      }
      return worst;
    }
    const philox_stream rng(seed_, m, 0xffffu);
    std::vector<std::uint32_t> ids(m);
    for (std::uint64_t n = 0; n < probe_subsets; ++n) {
      for (std::size_t i = 0; i < m; ++i) ids[i] = static_cast<std::uint32_t>(i);
      std::uint64_t missing = 0;
      for (std::size_t k = 0; k < r; ++k) {  // partial Fisher–Yates
        const std::size_t pick = k + rng.word(n * m + k) % (m - k);
        std::swap(ids[k], ids[pick]);
        missing |= std::uint64_t{1} << ids[k];
      }
      if (!try_missing(missing)) return std::numeric_limits<double>::infinity();
    }
    return worst;
  }

  status check_set(std::uint64_t set) const {
    if (m_ < 64 && (set >> m_) != 0)
      return invalid_argument("gradient_code.subset", set, "names workers >= M = " + std::to_string(m_));
    return {};
  }
  static std::uint64_t first_members(std::uint64_t set, std::size_t k) noexcept {
    std::uint64_t out = 0;
    for (; k > 0 && set != 0; --k) {
      const std::uint64_t low = set & (~set + 1);
      out |= low;
      set &= set - 1;
    }
    return out;
  }
  // The M × |used| system B_usedᵀ·a = 1.
  bool solve_exact(std::uint64_t used, std::span<double> w) const {
    std::vector<std::size_t> ids;
    for (std::size_t i = 0; i < m_; ++i)
      if ((used >> i) & 1u) ids.push_back(i);
    const std::size_t n = ids.size();
    std::vector<double> a(m_ * n), rhs(m_, 1.0), x(n);
    for (std::size_t j = 0; j < m_; ++j)
      for (std::size_t k = 0; k < n; ++k) a[j * n + k] = coefficient(ids[k], j);
    if (!detail::eliminate(a, rhs, m_, n, x)) return false;
    for (std::size_t k = 0; k < n; ++k) w[ids[k]] = x[k];
    return true;
  }
  [[nodiscard]] double residual(std::span<const double> w) const noexcept {
    double worst = 0.0;
    for (std::size_t j = 0; j < m_; ++j) {
      double s = 0.0;
      for (std::size_t i = 0; i < m_; ++i) s += w[i] * coefficient(i, j);
      worst = std::max(worst, std::abs(s - 1.0));
    }
    return worst;
  }
  [[nodiscard]] double amplification(std::span<const double> w) const noexcept {
    double worst = 0.0;
    for (std::size_t j = 0; j < m_; ++j) {
      double s = 0.0;
      for (std::size_t i = 0; i < m_; ++i) s += std::abs(w[i] * coefficient(i, j));
      worst = std::max(worst, s);
    }
    return worst;
  }
  [[nodiscard]] decoding view(std::size_t at) const noexcept {
    const entry_stats& s = stats_[at];
    return {std::span<const double>(pool_).subspan(at * m_, m_), s.used, s.residual, s.amplification};
  }

  std::size_t m_ = 0;
  std::size_t r_ = 0;
  std::uint64_t seed_ = gradient_code_default_seed;
  std::uint32_t candidate_ = 0;
  double probe_amplification_ = 0.0;
  std::vector<double> b_;  // M × M, row-major
  // Decoding cache: set → entry index; entry k's weights at pool_[k·M, (k+1)·M).
  std::unordered_map<std::uint64_t, std::size_t> cache_;
  std::vector<double> pool_;
  std::vector<entry_stats> stats_;
};

}  // namespace profile
ASHL_NAMESPACE_END
