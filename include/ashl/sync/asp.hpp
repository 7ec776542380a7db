// ashl/sync/asp.hpp — asynchronous parallel: apply every commit on arrival,
// answer every pull at once; no bound on staleness.
//
//   ashl::sync::asp p{{.workers = 8, .staleness_weight = ashl::sync::staleness_weighting::inverse()}};
//   auto d = p.on_commit({.worker = 3, .sequence = 1});   // apply, weight 1/(1+τ)
//
// ALGORITHMS.md §1 "ASP" and "Staleness-aware weighting". τ counts the
// updates applied since the worker's last served pull.
#pragma once

#include <ashl/config.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/detail/async.hpp>
#include <ashl/sync/events.hpp>

#include <cstddef>
#include <string>
#include <string_view>
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
  std::string stage = "asp";
};

class asp {
 public:
  using policy_concept = policy_tag;

  asp() = default;
  explicit asp(asp_params p)
      : core_(p.workers, {p.scale, std::move(p.weights), std::move(p.plans), std::move(p.staleness_weight)},
              std::move(p.stage)) {}

  commit_decision on_commit(const commit_event& c) {
    if (!core_.table().accept(c)) return {commit_action::drop, 0.0, {}};
    return {commit_action::apply, core_.apply(c.worker), {}};
  }
  pull_decision on_pull(const pull_event& q) {
    if (core_.table().is_live(q.worker)) core_.table().served(q.worker);
    return {pull_action::serve, {}};
  }
  outcome on_metric(const metric_event&) { return {}; }
  outcome on_join(const membership_event& j) {
    core_.table().join(j.worker, 0);
    return {};
  }
  outcome on_evict(const membership_event& j) {
    core_.table().evict(j.worker);
    return {};
  }
  outcome on_measurement(const measurement_event&) { return {}; }
  outcome drain() { return {{}, core_.table().release_all(), false}; }

  [[nodiscard]] worker_plan plan(worker_id w) const { return core_.plan(w); }
  // A new weight and plan for w from its next commit and cycle on (ASHL+
  // re-planning); counters and held pulls are kept.
  void set_plan(worker_id w, double weight, worker_plan p) {
    core_.set_weight(w, weight);
    core_.set_plan(w, std::move(p));
  }
  [[nodiscard]] std::string_view name() const noexcept { return core_.stage(); }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return core_.table().is_live(w); }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return core_.table().is_held(w); }
  [[nodiscard]] std::uint64_t staleness(worker_id w) const noexcept { return core_.table().staleness(w); }

 private:
  detail::async_core core_;
};

static_assert(consistency_policy<asp>);

}  // namespace sync
ASHL_NAMESPACE_END
