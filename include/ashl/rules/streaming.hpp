// ashl/rules/streaming.hpp — Streaming DiLoCo's fragment rule, pure: which
// fragment of the model a worker synchronises after which inner step, when
// the servers' answer for it is merged into the local model, how it is
// merged, and how the model is cut into fragments. No clock, no I/O; every
// driver (the simulator, ps::worker, the adapters) asks this one rule.
//
//   ashl::ps::streaming_params sp{.fragments = 4, .interval = 100, .delay = 5, .alpha = 0.5};
//   if (auto ok = sp.validate(n, "parameters"); !ok) fail(ok.message());  // names the bad field
//   ashl::ps::streaming_schedule s(sp);
//   for (std::uint64_t t = 1; ; ++t) {                 // t: inner steps finished so far
//     inner_step();
//     if (auto q = s.merge_after(t)) {                  // fragment q's answer is due now (wait for it)
//       ashl::ps::streaming_merge(local(*q), global(*q), reference(*q), sp.alpha);
//     }
//     if (auto p = s.sync_after(t)) commit(*p, local(*p) - reference(*p));  // then keep computing
//   }
//
// The rule (docs/algorithms.md "Streaming fragments"): the model is cut into
// P fragments. Fragment p synchronises every H inner steps, at offset
// o_p = ⌊p·H/P⌋: after the inner steps t = o_p + k·H, k ≥ 1 (fragment 0
// first after H steps, fragment p after H + o_p; so every sync covers H
// steps, one cycle of ps::worker_cycle with the plan's H). A sync sends the
// fragment's model delta, local − reference, where the reference is the
// global value the worker last merged for that fragment (the pseudo-gradient
// with the opposite sign); the worker keeps computing. The servers' new
// global value of the fragment is merged after inner step t + τ, before step
// t + τ + 1: local ← α·local + (1 − α)·global, and reference ← global.
// A sync and a merge after the same step concern different fragments (with
// τ = 0 the merge needs that sync's reply), so drivers send first and merge
// second. With τ = 0 the merge follows its own sync (no overlap); P = 1,
// τ = 0, α = 0 is Local SGD(H) with plain averaging, bit for bit.
//
// Bounds, each refused by name: P ≥ 1; P ≤ the units the model is cut into
// (parameters in the core, layers in the adapters); P ≤ H (each fragment
// its own step, so at most one fragment is on the wire per step); τ < H (a
// fragment's merge lands before its next sync); α in [0, 1].
//
// Fragments: contiguous element ranges in the core (fragment_ranges: the
// even split of shards.hpp); whole layers in the adapters (layer_fragments:
// P runs of consecutive layers of about equal size). The paper interleaves
// layers (fragment p holds layers p, p + P, ...); ours keeps a fragment one
// range, so it is one commit per server.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>
#include <ashl/rules/shards.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

ASHL_NAMESPACE_BEGIN
namespace ps {

struct streaming_params {
  std::uint32_t fragments = 1;  // P
  std::uint32_t interval = 1;   // H: inner steps between two syncs of one fragment
  std::uint32_t delay = 0;      // τ: inner steps from a fragment's sync to its merge
  double alpha = 0.0;           // α: the local value's weight at the merge

  // Checks the bounds for a model cut into `units` (its parameters, or its
  // layers in the adapters; `unit_name` says which, for the message).
  [[nodiscard]] status validate(std::uint64_t units, std::string_view unit_name = "parameters") const {
    if (fragments == 0) return invalid_argument("streaming.fragments", 0, "must be >= 1");
    if (interval == 0) return invalid_argument("streaming.interval", 0, "must be >= 1 (H inner steps)");
    if (fragments > units)
      return invalid_argument("streaming.fragments", fragments,
                              "must be <= the number of " + std::string(unit_name) + " (" + std::to_string(units) +
                                  "): a fragment holds at least one");
    if (fragments > interval)
      return invalid_argument("streaming.fragments", fragments,
                              "must be <= streaming.interval (H = " + std::to_string(interval) +
                                  "): each fragment syncs after its own step");
    if (delay >= interval)
      return invalid_argument("streaming.delay", delay,
                              "must be < streaming.interval (H = " + std::to_string(interval) +
                                  "): a fragment's merge lands before its next sync");
    if (!(alpha >= 0.0 && alpha <= 1.0)) return invalid_argument("streaming.alpha", alpha, "must be in [0, 1]");
    return {};
  }
  friend bool operator==(const streaming_params&, const streaming_params&) = default;
};

// The schedule of streaming_params: functions of the count of inner steps
// finished, the same on every worker; no state, so nothing to save or to
// allocate.
class streaming_schedule {
 public:
  streaming_schedule() = default;
  explicit streaming_schedule(const streaming_params& p) noexcept : p_(p) {
    ASHL_ASSERT(p.fragments >= 1 && p.fragments <= p.interval && p.delay < p.interval,
                "streaming_schedule: streaming_params::validate first");
  }

  [[nodiscard]] const streaming_params& params() const noexcept { return p_; }
  [[nodiscard]] std::uint32_t fragments() const noexcept { return p_.fragments; }

  // o_p = ⌊p·H/P⌋: the step (mod H) after which fragment p syncs.
  [[nodiscard]] std::uint32_t offset(std::uint32_t p) const noexcept {
    ASHL_ASSERT(p < p_.fragments, "streaming_schedule::offset: fragment out of range");
    return static_cast<std::uint32_t>(std::uint64_t{p} * p_.interval / p_.fragments);
  }

  // The fragment that syncs after inner step t (steps finished), if any.
  [[nodiscard]] std::optional<std::uint32_t> sync_after(std::uint64_t t) const noexcept {
    if (t < p_.interval) return std::nullopt;
    const std::uint64_t r = t % p_.interval;
    // The smallest p with ⌊p·H/P⌋ ≥ r; it syncs now when its offset is r.
    const std::uint64_t p = (r * p_.fragments + p_.interval - 1) / p_.interval;
    if (p >= p_.fragments || p * p_.interval / p_.fragments != r) return std::nullopt;
    return static_cast<std::uint32_t>(p);
  }

  // The fragment whose servers' answer is merged after inner step t: the
  // one that synced after step t − τ.
  [[nodiscard]] std::optional<std::uint32_t> merge_after(std::uint64_t t) const noexcept {
    if (t <= p_.delay) return std::nullopt;
    return sync_after(t - p_.delay);
  }

  // The first inner step after which fragment p syncs: H + o_p.
  [[nodiscard]] std::uint64_t first_sync(std::uint32_t p) const noexcept {
    return std::uint64_t{p_.interval} + offset(p);
  }

  // Fragments synced and not merged yet after inner step t (each synced
  // after a step in (t − τ, t]): what a worker still awaits.
  [[nodiscard]] std::uint32_t in_flight(std::uint64_t t) const noexcept {
    std::uint32_t n = 0;
    for (std::uint64_t s = t > p_.delay ? t - p_.delay + 1 : 1; s <= t; ++s) n += sync_after(s).has_value() ? 1 : 0;
    return n;
  }

 private:
  streaming_params p_{};
};

// Fragment p's elements in the core: the even split of n elements into P
// contiguous ranges (shard_layout::even), sizes differing by at most one.
[[nodiscard]] inline key_range fragment_range(std::uint64_t n, std::uint32_t fragments, std::uint32_t p) noexcept {
  ASHL_ASSERT(fragments >= 1 && p < fragments, "fragment_range: fragment out of range");
  const std::uint64_t q = n / fragments, r = n % fragments;
  const std::uint64_t begin = p * q + (p < r ? p : r);
  return {begin, begin + q + (p < r ? 1 : 0)};
}

// The adapters' fragments: layers (sizes in elements, in model order) cut
// into `first.size()` runs of consecutive layers of about equal elements;
// first[p] is the index of fragment p's first layer (first[0] = 0), so
// fragment p holds layers [first[p], first[p + 1]) (the last up to
// layer_sizes.size()). Each fragment gets at least one layer, and each cut
// sits at the layer boundary nearest to p/P of the elements. Writes into the
// caller's span: nothing allocates.
[[nodiscard]] inline status layer_fragments(std::span<const std::uint64_t> layer_sizes,
                                            std::span<std::uint32_t> first) {
  const auto layers = static_cast<std::uint64_t>(layer_sizes.size());
  const auto p_count = static_cast<std::uint32_t>(first.size());
  if (p_count == 0) return invalid_argument("streaming.fragments", 0, "must be >= 1");
  if (p_count > layers)
    return invalid_argument("streaming.fragments", p_count,
                            "must be <= the number of layers (" + std::to_string(layers) + "): a fragment holds at least one");
  long double total = 0;
  for (std::uint64_t s : layer_sizes) total += static_cast<long double>(s);
  first[0] = 0;
  std::uint64_t j = 0;          // layers before the cursor
  long double before = 0;       // their elements
  for (std::uint32_t p = 1; p < p_count; ++p) {
    const long double target = total * p / p_count;
    const std::uint64_t lo = first[p - 1] + 1, hi = layers - (p_count - p);  // cut index bounds
    while (j < lo) before += static_cast<long double>(layer_sizes[j++]);
    // Advance while the next boundary is at least as near to the target.
    while (j < hi) {
      const long double next = before + static_cast<long double>(layer_sizes[j]);
      if (std::fabs(next - target) > std::fabs(before - target)) break;
      before = next;
      ++j;
    }
    first[p] = static_cast<std::uint32_t>(j);
  }
  return {};
}

// The merge of one fragment (after inner step t + τ):
//   local ← α·local + (1 − α)·global;  reference ← global
// in f32, in that order (α = 0 copies global, α = 1 keeps local: both exact).
// `reference` may be empty (a driver that keeps none).
inline void streaming_merge(std::span<float> local, std::span<const float> global, std::span<float> reference,
                            double alpha) noexcept {
  ASHL_ASSERT(local.size() == global.size() && (reference.empty() || reference.size() == global.size()),
              "streaming_merge: local, global and reference must have the fragment's size");
  const auto a = static_cast<float>(alpha), b = static_cast<float>(1.0 - alpha);
  const std::size_t n = local.size();
  if (alpha == 0.0) {
    for (std::size_t i = 0; i < n; ++i) local[i] = global[i];
  } else if (alpha != 1.0) {
    for (std::size_t i = 0; i < n; ++i) local[i] = a * local[i] + b * global[i];
  }
  for (std::size_t i = 0; i < reference.size(); ++i) reference[i] = global[i];
}

}  // namespace ps
ASHL_NAMESPACE_END
