// ashl/sync/events.hpp — what a consistency policy is told and what it answers.
//
//   ashl::sync::ssp p{{.workers = 4, .staleness = 3}};
//   ashl::sync::outcome_sink out(4);                       // caller-owned, reused
//   auto d = p.on_commit({.worker = 2, .sequence = 7, .clock = 7, .time = 1.25, .bytes = 4096}, out);
//   if (d.action == ashl::sync::commit_action::apply) server.add(delta, d.weight);  // 1. the commit
//   for (const auto& c : out.round()) server.add(stored[c.worker, c.sequence], c.weight);  // 2. the round
//   for (auto w : out.released()) server.answer_pull(w);   // 3. then the pulls
//   for (auto w : out.plans_changed()) server.send_plan(w, p.plan(w));
//   out.clear();                                           // keeps its capacity
//
// Events carry the driver's time (seconds, any epoch, never decreasing); a
// policy never reads a clock (docs/design.md "The one rule", "Consistency policy").
// Outcomes go into a caller-owned outcome_sink whose storage is reused, so
// after warm-up no event allocates. Worker ids are dense small integers:
// 0..workers-1 at construction, larger ids may join later.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/plan.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <tuple>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

using worker_id = std::uint32_t;
using ashl::measurement_kind;
using ashl::metric_id;
using ashl::stage_id;
using ashl::worker_plan;

// ---------------------------------------------------------------- events in

// A commit (gradient or model delta) from `worker` arrived. `sequence` is the
// worker's own commit counter; a sequence at or below one already accepted is
// a duplicate and is dropped, so a retransmission is never applied twice.
// `clock` is the worker's clock c_i as it reports it (informational: policies
// count accepted commits themselves). `samples` is the mini-batch samples the
// commit covers (batch-weighted BSP); 0 means unknown.
struct commit_event {
  worker_id worker = 0;
  std::uint64_t sequence = 0;
  std::uint64_t clock = 0;
  double time = 0.0;
  std::uint64_t bytes = 0;
  std::uint64_t samples = 0;
};

// `worker` asks for the current parameters.
struct pull_event {
  worker_id worker = 0;
  double time = 0.0;
};

// A global metric evaluated by the driver. A non-finite value is recorded as
// nothing: it never triggers anything.
struct metric_event {
  metric_id metric = metric_id::loss;
  double value = 0.0;
  double time = 0.0;
};

// A worker joined, or was evicted (dead, timed out, removed).
struct membership_event {
  worker_id worker = 0;
  double time = 0.0;
};

// A timing measurement (docs/algorithms.md §3 "Measurements"): the one type that
// profile/ and wire/ use too.
using measurement_event = ashl::measurement;

// ------------------------------------------------------------ decisions out

// One buffered commit to apply now, identified by (worker, sequence).
struct weighted_commit {
  worker_id worker = 0;
  std::uint64_t sequence = 0;
  double weight = 0.0;
  friend bool operator==(const weighted_commit&, const weighted_commit&) = default;
};

// Everything events caused besides their direct answers, in the order the
// driver must act: first the direct commit (commit_decision), then `round`
// (buffered commits, each with its weight, then one optimizer step), then the
// pulls in `released`; plans of the workers in `plans_changed()` (or of
// every worker, when all_plans_changed()) may differ now.
//
// Owned by the driver and reused: clear() keeps every buffer's capacity and
// costs O(entries), so a sink reserved for the worker count never allocates.
class outcome_sink {
 public:
  outcome_sink() = default;
  explicit outcome_sink(std::size_t workers) { reserve(workers); }

  void reserve(std::size_t workers) {
    round_.reserve(2 * workers);
    released_.reserve(workers);
    changed_.reserve(workers);
    if (marked_.size() < workers) marked_.resize(workers, 0);
  }

  // ---- written by policies
  void apply(worker_id w, std::uint64_t sequence, double weight) { round_.push_back({w, sequence, weight}); }
  void release(worker_id w) { released_.push_back(w); }
  void plan_changed(worker_id w) {
    if (w >= marked_.size()) marked_.resize(std::size_t{w} + 1, 0);
    if (marked_[w] != 0) return;
    marked_[w] = 1;
    changed_.push_back(w);
  }
  void all_plans_changed() noexcept { all_ = true; }
  // The round's entries from index `from` on, for a policy that weighs a
  // round after listing it.
  [[nodiscard]] std::span<weighted_commit> round_from(std::size_t from) noexcept {
    return std::span<weighted_commit>(round_).subspan(from);
  }

  // ---- read by drivers
  [[nodiscard]] std::span<const weighted_commit> round() const noexcept { return round_; }
  [[nodiscard]] std::span<const worker_id> released() const noexcept { return released_; }
  [[nodiscard]] std::span<const worker_id> plans_changed() const noexcept { return changed_; }
  [[nodiscard]] bool every_plan_changed() const noexcept { return all_; }
  [[nodiscard]] bool plan_changed_for(worker_id w) const noexcept {
    return all_ || (w < marked_.size() && marked_[w] != 0);
  }
  [[nodiscard]] bool any_plan_changed() const noexcept { return all_ || !changed_.empty(); }
  [[nodiscard]] bool empty() const noexcept {
    return round_.empty() && released_.empty() && changed_.empty() && !all_;
  }

  void clear() noexcept {
    for (worker_id w : changed_) marked_[w] = 0;
    changed_.clear();
    round_.clear();
    released_.clear();
    all_ = false;
  }

 private:
  std::vector<weighted_commit> round_;
  std::vector<worker_id> released_;
  std::vector<worker_id> changed_;
  std::vector<std::uint8_t> marked_;
  bool all_ = false;
};

enum class commit_action : std::uint8_t {
  apply,   // apply this commit now, scaled by `weight`
  buffer,  // keep it; a later round names it with its weight
  drop,    // a duplicate, or from a worker that is not live: ignore it
};

struct commit_decision {
  commit_action action = commit_action::apply;
  double weight = 0.0;  // meaningful for apply only
  friend bool operator==(const commit_decision&, const commit_decision&) = default;
};

enum class pull_action : std::uint8_t {
  serve,  // answer now
  hold,   // keep it; a later outcome's released() names the worker
};

// ------------------------------------------------------ staleness weighting

// Scale for an update of staleness τ (docs/algorithms.md §1, "Staleness-aware
// weighting"): none (1), inverse 1/(1+τ), or power (1+τ)^(−exponent). A
// plain value, so a policy that holds one copies and saves as a value.
struct staleness_weighting {
  enum class kind : std::uint8_t { none = 0, inverse = 1, power = 2 };
  kind mode = kind::none;
  double exponent = 1.0;  // for power

  // In this order in a saved state (core/state_io.hpp).
  static constexpr auto fields() {
    return std::tuple{field{"mode", &staleness_weighting::mode}, field{"exponent", &staleness_weighting::exponent}};
  }
  // The mode, checked after a load (the table reads it unchecked).
  [[nodiscard]] bool valid() const noexcept { return mode == kind::none || mode == kind::inverse || mode == kind::power; }

  static constexpr staleness_weighting none() noexcept { return {}; }
  static constexpr staleness_weighting inverse() noexcept { return {kind::inverse, 1.0}; }
  static constexpr staleness_weighting power(double a) noexcept { return {kind::power, a}; }

  [[nodiscard]] double operator()(std::uint64_t tau) const noexcept {
    switch (mode) {
      case kind::none: return 1.0;
      case kind::inverse: return 1.0 / (1.0 + static_cast<double>(tau));
      case kind::power: return std::pow(1.0 + static_cast<double>(tau), -exponent);
    }
    return 1.0;
  }
  friend constexpr bool operator==(const staleness_weighting&, const staleness_weighting&) = default;
};

}  // namespace sync
ASHL_NAMESPACE_END
