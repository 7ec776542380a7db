// ashl/sync/asp.hpp — asynchronous parallel: apply every commit on arrival,
// answer every pull at once; no bound on staleness.
//
//   ashl::sync::asp p{{.workers = 8, .staleness_weight = ashl::sync::staleness_weighting::inverse()}};
//   ashl::sync::outcome_sink out(8);
//   auto d = p.on_commit({.worker = 3, .sequence = 1}, out);   // apply, weight 1/(1+τ)
//   p.on_pull({.worker = 3}, out);                              // always serve
//   out.clear();
//
// docs/algorithms.md §1 "ASP" and "Staleness-aware weighting". τ counts the
// updates applied since the worker's last served pull. Every event is O(log M)
// (the worker table keeps the minimum clock for the policies built on it) and
// allocates nothing; a new id joining grows the per-worker arrays.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/detail/async.hpp>
#include <ashl/sync/events.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

struct asp_params {
  std::size_t workers = 0;
  double scale = 1.0;                // weight of each commit (before staleness)
  std::vector<double> weights{};     // optional per-worker weights, override scale
  std::vector<worker_plan> plans{};  // optional per-worker plans
  staleness_weighting staleness_weight{};
  stage_id stage = stage_id::asp;
};

class asp : public detail::async_policy {
 public:
  using policy_concept = policy_tag;

  asp() = default;
  explicit asp(asp_params p)
      : async_policy(p.workers, {p.scale, std::move(p.weights), std::move(p.plans), p.staleness_weight}, p.stage) {}

  commit_decision on_commit(const commit_event& c, outcome_sink&) {
    if (!core_.table().accept(c)) return {commit_action::drop, 0.0};
    return {commit_action::apply, core_.apply(c.worker)};
  }
  pull_action on_pull(const pull_event& q, outcome_sink&) {
    if (core_.table().is_live(q.worker)) core_.table().served(q.worker);
    return pull_action::serve;
  }
  void on_metric(const metric_event&, outcome_sink&) {}
  void on_join(const membership_event& j, outcome_sink&) { core_.table().join(j.worker, 0); }
  void on_evict(const membership_event& j, outcome_sink&) { core_.table().evict(j.worker); }
  void on_measurement(const measurement_event&, outcome_sink&) {}
  void drain(outcome_sink& out) {
    core_.table().release_if(out, [](worker_id) { return true; });
  }

  using async_policy::set_plan;
  using async_policy::clock;

  void save(state_writer& out) const {
    out.tag("ASP_", 1);
    core_.save(out);
  }
  status load(state_reader& in) {
    asp n;
    ASHL_TRY(in.tag("ASP_", 1));
    ASHL_TRY(n.core_.load(in));
    *this = std::move(n);
    return {};
  }
};

static_assert(consistency_policy<asp>);

}  // namespace sync
ASHL_NAMESPACE_END
