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
  // The scale follows 1/M over the live workers at each join and eviction
  // (async DiLoCo's 1/M, docs/elastic.md §2.4); `scale` is then only the start.
  bool scale_over_live = false;
};

class asp : public detail::async_policy {
 public:
  using policy_concept = policy_tag;

  asp() = default;
  explicit asp(asp_params p)
      : async_policy(p.workers, {p.scale, std::move(p.weights), std::move(p.plans), p.staleness_weight}, p.stage),
        scale_over_live_(p.scale_over_live) {
    rescale();
  }

  commit_decision on_commit(const commit_event& c, outcome_sink&) {
    if (!core_.table().accept(c)) return {commit_action::drop, 0.0};
    return {commit_action::apply, core_.apply(c.worker)};
  }
  pull_action on_pull(const pull_event& q, outcome_sink&) {
    if (core_.table().is_live(q.worker)) core_.table().served(q.worker);
    return pull_action::serve;
  }
  void on_metric(const metric_event&, outcome_sink&) {}
  void on_join(const membership_event& j, outcome_sink&) {
    if (core_.table().join(j.worker, 0)) rescale();
  }
  void on_evict(const membership_event& j, outcome_sink&) {
    if (core_.table().evict(j.worker)) rescale();
  }
  void on_measurement(const measurement_event&, outcome_sink&) {}
  void drain(outcome_sink& out) {
    core_.table().release_if(out, [](worker_id) { return true; });
  }

  using async_policy::set_plan;
  using async_policy::clock;
  [[nodiscard]] double scale() const noexcept { return core_.scale(); }

  // Version 2 carries scale_over_live and is written only when it is set,
  // so every other state keeps version 1's bytes. A version 1 state does not
  // say (it predates the flag): the policy keeps what it was built with, so
  // an async DiLoCo checkpoint from before loads into async DiLoCo's rule.
  void save(state_writer& out) const {
    out.tag("ASP_", scale_over_live_ ? 2 : 1);
    if (scale_over_live_) out.put(scale_over_live_);
    core_.save(out);
  }
  status load(state_reader& in) {
    asp n;
    std::uint32_t version = 0;
    ASHL_TRY(in.tag("ASP_", 1, 2, version));
    if (version >= 2) ASHL_TRY(in.get(n.scale_over_live_, "asp.scale_over_live"));
    else n.scale_over_live_ = scale_over_live_;
    ASHL_TRY(n.core_.load(in));
    *this = std::move(n);
    return {};
  }

 private:
  void rescale() noexcept {
    const std::size_t m = core_.table().live_count();
    if (scale_over_live_ && m > 0) core_.set_scale(1.0 / static_cast<double>(m));
  }

  bool scale_over_live_ = false;
};

static_assert(consistency_policy<asp>);

}  // namespace sync
ASHL_NAMESPACE_END
