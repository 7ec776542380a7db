// ashl/coll/shards.hpp — uneven shards (HAP): a
// reduce-scatter and all-gather in which rank i owns a contiguous block of
// the vector proportional to its measured speed or bandwidth.
//
//   std::vector<ashl::profile::worker_capability> caps = ...;      // from profile's fits
//   auto counts = ashl::coll::shard_counts(n, caps, ashl::coll::shard_basis::bandwidth);
//   ashl::coll::uneven_allreduce<ashl::coll::mpi> ar(*counts);
//   ASHL_TRY(ar.run(comm, ashl::coll::view(grad)));   // reduce-scatter to rank i's block, all-gather back
//
// shard_counts splits n elements by weights with the largest-remainder rule
// (floor of n·w_i/Σw, then one more to the largest remainders, ties to the
// lower rank), so the counts add up to n exactly, a weight 0 gets 0 elements
// and every rank computes the same split from the same measurements. The
// weight of a rank is its compute speed (samples per second at `batch`,
// from profile::compute_model) or its link bandwidth (β of the slower of its
// push and pull links): a rank that reduces its block faster, or moves it
// faster, gets more of the vector, so no rank's block is the round's tail.
// docs/algorithms.md §3 "Capability models"; docs/coll.md "Uneven shards".
#pragma once

#include <ashl/config.hpp>
#include <ashl/coll/concepts.hpp>
#include <ashl/core/status.hpp>
#include <ashl/profile/capability.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace coll {

// n elements split by weights (finite, >= 0, not all 0).
inline result<std::vector<std::size_t>> shard_counts(std::size_t n, std::span<const double> weights) {
  if (weights.empty()) return invalid_argument("shards.weights.size", 0, "needs at least one rank");
  double total = 0.0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i]) || weights[i] < 0.0)
      return invalid_argument("shards.weights[" + std::to_string(i) + "]", weights[i], "must be finite and >= 0");
    total += weights[i];
  }
  if (!(total > 0.0)) return invalid_argument("shards.weights.sum", total, "must be > 0");
  std::vector<std::size_t> counts(weights.size());
  std::vector<double> rest(weights.size());
  std::size_t given = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const double exact = static_cast<double>(n) * (weights[i] / total);
    counts[i] = std::min<std::size_t>(n - given, static_cast<std::size_t>(std::floor(exact)));
    rest[i] = exact - std::floor(exact);
    given += counts[i];
  }
  std::vector<std::size_t> order(weights.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return rest[a] > rest[b]; });
  for (std::size_t k = 0; given < n; k = (k + 1) % order.size()) {
    if (weights[order[k]] == 0.0) continue;  // a rank of weight 0 never owns a block
    ++counts[order[k]];
    ++given;
  }
  return counts;
}

enum class shard_basis : std::uint8_t {
  compute,    // samples per second at the given batch
  bandwidth,  // the slower of push/pull β
};

// The weights of shard_counts from capabilities (profile/capability.hpp).
inline result<std::vector<double>> shard_weights(std::span<const profile::worker_capability> caps, shard_basis basis,
                                                 double batch = 1.0) {
  std::vector<double> w(caps.size());
  for (std::size_t i = 0; i < caps.size(); ++i) {
    if (basis == shard_basis::compute) {
      const double t = caps[i].compute.predict(batch);
      if (!(t > 0.0) || !std::isfinite(t))
        return invalid_argument("shards.caps[" + std::to_string(i) + "].compute", t, "predicts no positive time");
      w[i] = batch / t;
    } else {
      const double b = std::min(caps[i].push.beta, caps[i].pull.beta);
      if (!(b > 0.0) || !std::isfinite(b))
        return invalid_argument("shards.caps[" + std::to_string(i) + "].beta", b, "must be finite and > 0");
      w[i] = b;
    }
  }
  return w;
}

inline result<std::vector<std::size_t>> shard_counts(std::size_t n, std::span<const profile::worker_capability> caps,
                                                     shard_basis basis, double batch = 1.0) {
  auto w = shard_weights(caps, basis, batch);
  if (!w) return w.error();
  return shard_counts(n, *w);
}

// Allreduce as reduce-scatter into each rank's uneven block, then all-gather
// of the blocks (the two-phase form whose phases HAP balances). Holds the
// counts and a scratch block; run() is blocking. The result equals an
// allreduce of the same op.
template <host_collective C>
class uneven_allreduce {
 public:
  explicit uneven_allreduce(std::vector<std::size_t> counts) : counts_(std::move(counts)) {}

  [[nodiscard]] std::span<const std::size_t> counts() const noexcept { return counts_; }

  status run(C& c, out_view<typename C::space> buf, reduce_op op = reduce_op::sum) {
    const auto me = static_cast<std::size_t>(c.rank());
    if (me >= counts_.size()) return invalid_argument("uneven_allreduce.counts.size", counts_.size(), "must equal the group size");
    const std::size_t es = size_of(buf.element_dtype());
    const auto d = displacements(counts_);
    block_.resize(counts_[me] * es);
    out_view<typename C::space> mine(block_.data(), counts_[me], buf.element_dtype());
    in_view<typename C::space> all(buf.data(), buf.size(), buf.element_dtype());
    ASHL_TRY(blocking(c, c.reduce_scatter(all, mine, counts_, op, c.default_stream())));
    // The block goes back into its own place, then the all-gather is in place.
    if (counts_[me]) std::memcpy(static_cast<std::byte*>(buf.data()) + d[me] * es, block_.data(), counts_[me] * es);
    in_view<typename C::space> own(static_cast<const std::byte*>(buf.data()) + d[me] * es, counts_[me],
                                   buf.element_dtype());
    return blocking(c, c.all_gather(own, buf, counts_, c.default_stream()));
  }

 private:
  std::vector<std::size_t> counts_;
  std::vector<std::byte> block_;
};

}  // namespace coll
ASHL_NAMESPACE_END
