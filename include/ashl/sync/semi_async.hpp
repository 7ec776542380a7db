// ashl/sync/semi_async.hpp — semi-asynchronous training with interval sync
// (Heter-Train): asynchronous push/pull, and a global barrier every K
// iterations or every Δt seconds where the models are averaged.
//
//   ashl::sync::semi_async p{{.workers = 4, .sync_every_iterations = 10}};
//   // commits 1..9 of a worker: apply at once; its 10th: buffer, and its pull
//   // is held until every live worker reached the barrier; then the barrier
//   // commits are applied as one round (1/n each) and the pulls released.
//
// A worker's barrier commit is its K-th since the last barrier, or (with Δt)
// its first commit at or after the barrier time k·Δt of the driver's clock;
// with both set, whichever comes first. Averaging the barrier deltas of
// workers that started from the same parameters averages their models (ours:
// in delta form, so the server keeps one W). The barrier counts live workers
// only; an eviction completes it when the evicted worker was the last one
// missing. ALGORITHMS.md §1 "Semi-asynchronous with interval sync".
#pragma once

#include <ashl/config.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/detail/async.hpp>
#include <ashl/sync/detail/round.hpp>
#include <ashl/sync/events.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

struct semi_async_params {
  std::size_t workers = 0;
  std::uint32_t sync_every_iterations = 0;  // K; 0: off
  double sync_every_seconds = 0.0;          // Δt; 0: off (at least one of the two is set)
  double scale = 1.0;                       // weight of an asynchronous commit
  staleness_weighting staleness_weight{};
  std::string stage = "semi_async";
};

class semi_async {
 public:
  using policy_concept = policy_tag;

  semi_async() = default;
  explicit semi_async(semi_async_params p)
      : core_(p.workers, {p.scale, {}, {}, std::move(p.staleness_weight)}, std::move(p.stage)),
        rounds_(p.workers, round_weighting::mean), k_(p.sync_every_iterations), dt_(p.sync_every_seconds),
        since_(p.workers, 0), next_barrier_time_(p.sync_every_seconds) {
    ASHL_ASSERT(k_ > 0 || dt_ > 0.0, "semi_async: set sync_every_iterations or sync_every_seconds");
  }

  commit_decision on_commit(const commit_event& c) {
    auto& t = core_.table();
    if (!t.accept(c)) return {commit_action::drop, 0.0, {}};
    if (c.worker >= since_.size()) since_.resize(std::size_t{c.worker} + 1, 0);
    const bool barrier = rounds_.waiting(c.worker) || (k_ > 0 && ++since_[c.worker] >= k_) ||
                         (dt_ > 0.0 && c.time >= next_barrier_time_);
    if (!barrier) return {commit_action::apply, core_.apply(c.worker), {}};
    since_[c.worker] = 0;
    rounds_.add(c);
    return {commit_action::buffer, 0.0, settle(c.time)};
  }
  pull_decision on_pull(const pull_event& q) {
    auto& t = core_.table();
    if (!t.is_live(q.worker)) return {pull_action::serve, {}};
    if (rounds_.waiting(q.worker)) {
      t.hold(q.worker);
      return {pull_action::hold, {}};
    }
    t.served(q.worker);
    return {pull_action::serve, {}};
  }
  outcome on_metric(const metric_event&) { return {}; }
  outcome on_join(const membership_event& j) {
    if (core_.table().join(j.worker, 0)) {
      if (j.worker >= since_.size()) since_.resize(std::size_t{j.worker} + 1, 0);
      since_[j.worker] = 0;
    }
    return {};
  }
  outcome on_evict(const membership_event& j) {
    if (!core_.table().evict(j.worker)) return {};
    return settle(j.time);
  }
  outcome on_measurement(const measurement_event&) { return {}; }
  outcome drain() { return rounds_.drain(core_.table()); }

  [[nodiscard]] worker_plan plan(worker_id w) const { return core_.plan(w); }
  [[nodiscard]] std::string_view name() const noexcept { return core_.stage(); }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return core_.table().is_live(w); }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return core_.table().is_held(w); }
  [[nodiscard]] std::uint64_t barriers() const noexcept { return rounds_.rounds(); }
  [[nodiscard]] double next_barrier_time() const noexcept { return next_barrier_time_; }

 private:
  outcome settle(double now) {
    const std::uint64_t before = rounds_.rounds();
    outcome o = rounds_.settle(core_.table());
    if (rounds_.rounds() != before && dt_ > 0.0) next_barrier_time_ = (std::floor(now / dt_) + 1.0) * dt_;
    return o;
  }

  detail::async_core core_;
  detail::round_core rounds_;
  std::uint32_t k_ = 0;
  double dt_ = 0.0;
  std::vector<std::uint32_t> since_;
  double next_barrier_time_ = 0.0;
};

static_assert(consistency_policy<semi_async>);

}  // namespace sync
ASHL_NAMESPACE_END
