// ashl/sync/events.hpp — what a consistency policy is told and what it answers.
//
//   ashl::sync::ssp p{{.workers = 4, .staleness = 3}};
//   auto d = p.on_commit({.worker = 2, .sequence = 7, .clock = 7, .time = 1.25, .bytes = 4096});
//   if (d.action == ashl::sync::commit_action::apply) server.add(delta, d.weight);
//   for (const auto& c : d.effects.round) server.add(buffered[c.worker, c.sequence], c.weight);
//   for (auto w : d.effects.released) server.answer_pull(w);
//   if (p.on_pull({.worker = 1, .time = 1.3}).action == ashl::sync::pull_action::serve) ...
//
// Events carry the driver's time (seconds, any epoch, never decreasing); a
// policy never reads a clock (DESIGN.md "The one rule", "Consistency policy").
// Worker ids are dense small integers: 0..workers-1 at construction, larger
// ids may join later.
#pragma once

#include <ashl/config.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

using worker_id = std::uint32_t;

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

// A global metric evaluated by the driver ("loss", "accuracy", ...). A
// non-finite value is recorded as nothing: it never triggers anything.
struct metric_event {
  std::string_view name = "loss";
  double value = 0.0;
  double time = 0.0;
};

// A worker joined, or was evicted (dead, timed out, removed).
struct membership_event {
  worker_id worker = 0;
  double time = 0.0;
};

enum class measurement_kind : std::uint8_t {
  compute,   // one local iteration at the worker's batch size
  push,      // sending one commit
  pull,      // receiving the parameters
  compress,  // compressing one update
  commit,    // push + pull of one commit together (ADSP's O_i)
};

// A timing measurement (ALGORITHMS.md §3 "Measurements").
struct measurement_event {
  worker_id worker = 0;
  measurement_kind kind = measurement_kind::compute;
  double seconds = 0.0;
  std::uint64_t amount = 0;  // bytes or batch size, 0 when not relevant
  double time = 0.0;
};

// ------------------------------------------------------------ decisions out

// One buffered commit to apply now, identified by (worker, sequence).
struct weighted_commit {
  worker_id worker = 0;
  std::uint64_t sequence = 0;
  double weight = 0.0;
  friend bool operator==(const weighted_commit&, const weighted_commit&) = default;
};

// Everything an event caused besides its direct answer, in the order the
// driver must act: first apply `round` (buffered commits, each with its
// weight, then one optimizer step), then answer the pulls in `released`.
struct outcome {
  std::vector<weighted_commit> round;
  std::vector<worker_id> released;
  bool plans_changed = false;  // plan(w) may differ now: tell the workers

  [[nodiscard]] bool empty() const noexcept { return round.empty() && released.empty() && !plans_changed; }
  void merge(outcome&& o) {
    round.insert(round.end(), o.round.begin(), o.round.end());
    released.insert(released.end(), o.released.begin(), o.released.end());
    plans_changed = plans_changed || o.plans_changed;
  }
};

enum class commit_action : std::uint8_t {
  apply,   // apply this commit now, scaled by `weight`
  buffer,  // keep it; a later outcome.round names it with its weight
  drop,    // a duplicate, or from a worker that is not live: ignore it
};

struct commit_decision {
  commit_action action = commit_action::apply;
  double weight = 0.0;  // meaningful for apply only
  outcome effects;      // may include this very commit in effects.round
};

enum class pull_action : std::uint8_t {
  serve,  // answer now
  hold,   // keep it; a later outcome.released names the worker
};

struct pull_decision {
  pull_action action = pull_action::serve;
  outcome effects;  // e.g. a staged schedule switching on this event's time
};

// What a worker should do until told otherwise.
struct worker_plan {
  std::uint32_t local_iterations = 1;  // local steps per commit; 0: commit by interval
  double commit_interval = 0.0;        // seconds between commits (ADSP); 0: by iterations
  std::uint32_t batch_size = 0;        // 0: keep the worker's own
  double data_share = 0.0;             // fraction of the training data; 0: unspecified
  double compression_ratio = 1.0;      // fraction kept, in (0, 1]
  std::string stage;                   // policy or stage name, for telemetry
  friend bool operator==(const worker_plan&, const worker_plan&) = default;
};

// ------------------------------------------------------ staleness weighting

// Scale for an update of staleness τ (ALGORITHMS.md §1, "Staleness-aware
// weighting"): none (1), 1/(1+τ), or a caller function. Every async policy
// takes one.
struct staleness_weighting {
  enum class kind : std::uint8_t { none, inverse, custom };
  kind mode = kind::none;
  std::function<double(std::uint64_t)> custom_fn{};

  static staleness_weighting none() { return {}; }
  static staleness_weighting inverse() { return {kind::inverse, {}}; }
  static staleness_weighting custom(std::function<double(std::uint64_t)> f) {
    return {kind::custom, std::move(f)};
  }

  [[nodiscard]] double operator()(std::uint64_t tau) const {
    switch (mode) {
      case kind::none: return 1.0;
      case kind::inverse: return 1.0 / (1.0 + static_cast<double>(tau));
      case kind::custom: return custom_fn ? custom_fn(tau) : 1.0;
    }
    return 1.0;
  }
};

}  // namespace sync
ASHL_NAMESPACE_END
