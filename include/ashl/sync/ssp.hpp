// ashl/sync/ssp.hpp — stale synchronous parallel SSP(s).
//
//   ashl::sync::ssp p{{.workers = 4, .staleness = 3}};
//   p.on_commit({.worker = 0, .sequence = 1});        // applied at once
//   auto q = p.on_pull({.worker = 0});                // held while c_0 − min_j c_j > 3
//   auto d = p.on_commit({.worker = 1, .sequence = 1});
//   for (auto w : d.effects.released) answer(w);      // pulls the slow commit unblocked
//
// Commits are applied on arrival (ASP); worker i's pull is held while
// c_i − min_j c_j > s over live workers, c_i counting the commits the policy
// accepted. s = 0 is lock-step. A joining worker starts at the current
// minimum so it neither blocks others nor runs free; an eviction recomputes
// the minimum and releases what it unblocks. ASHL's SHL stage is an ssp with
// per-worker weights D_i and plans. ALGORITHMS.md §1 "SSP(s)", §2 "SHL".
#pragma once

#include <ashl/config.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/detail/async.hpp>
#include <ashl/sync/events.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

struct ssp_params {
  std::size_t workers = 0;
  std::uint32_t staleness = 3;       // the bound s
  double scale = 1.0;
  std::vector<double> weights{};
  std::vector<worker_plan> plans{};
  staleness_weighting staleness_weight{};
  std::string stage = "ssp";
};

class ssp {
 public:
  using policy_concept = policy_tag;

  ssp() = default;
  explicit ssp(ssp_params p)
      : core_(p.workers, {p.scale, std::move(p.weights), std::move(p.plans), std::move(p.staleness_weight)},
              std::move(p.stage)),
        bound_(p.staleness) {}

  commit_decision on_commit(const commit_event& c) {
    if (!core_.table().accept(c)) return {commit_action::drop, 0.0, {}};
    commit_decision d{commit_action::apply, core_.apply(c.worker), {}};
    d.effects.released = release();
    return d;
  }
  pull_decision on_pull(const pull_event& q) {
    auto& t = core_.table();
    if (!t.is_live(q.worker)) return {pull_action::serve, {}};
    if (ahead(q.worker) > bound_) {
      t.hold(q.worker);
      return {pull_action::hold, {}};
    }
    t.served(q.worker);
    return {pull_action::serve, {}};
  }
  outcome on_metric(const metric_event&) { return {}; }
  outcome on_join(const membership_event& j) {
    auto& t = core_.table();
    const std::uint64_t start = t.live_count() == 0 ? 0 : t.min_live_commits();
    t.join(j.worker, start);
    return {};
  }
  outcome on_evict(const membership_event& j) {
    outcome o;
    if (core_.table().evict(j.worker)) o.released = release();
    return o;
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
  [[nodiscard]] std::uint32_t bound() const noexcept { return bound_; }
  // c_i as the policy counts it.
  [[nodiscard]] std::uint64_t clock(worker_id w) const { return core_.table()[w].commits; }
  // c_i − min_j c_j over live workers.
  [[nodiscard]] std::uint64_t ahead(worker_id w) const {
    return core_.table()[w].commits - core_.table().min_live_commits();
  }

 private:
  std::vector<worker_id> release() {
    const std::uint64_t m = core_.table().min_live_commits();
    return core_.table().release_if([&](worker_id w) { return core_.table()[w].commits - m <= bound_; });
  }

  detail::async_core core_;
  std::uint32_t bound_ = 3;
};

static_assert(consistency_policy<ssp>);

}  // namespace sync
ASHL_NAMESPACE_END
