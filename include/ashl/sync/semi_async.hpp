// ashl/sync/semi_async.hpp — semi-asynchronous training with interval sync
// (Heter-Train): asynchronous push/pull, and a global barrier every K
// iterations or every Δt seconds where the models are averaged.
//
//   ashl::sync::semi_async p{{.workers = 4, .sync_every_iterations = 10}};
//   ashl::sync::outcome_sink out(4);
//   auto d = p.on_commit({.worker = 0, .sequence = 1}, out);   // commits 1..9: apply at once
//   // its 10th: buffer, and its pull is held until every live worker reached
//   // the barrier; then out.round() lists the barrier commits (1/n each) and
//   // out.released() the pulls.
//
// A worker's barrier commit is its K-th since the last barrier, or (with Δt)
// its first commit at or after the barrier time k·Δt of the driver's clock;
// with both set, whichever comes first. Averaging the barrier deltas of
// workers that started from the same parameters averages their models (ours:
// in delta form, so the server keeps one W). The barrier counts live workers
// only; an eviction completes it when the evicted worker was the last one
// missing. A joiner starts its count at 0 and, while a barrier is in
// progress, is pending until it completes (its pull held, the barrier not
// waiting for it: sync/detail/round.hpp); no barrier completes with fewer
// than `min_workers` live in rounds. docs/algorithms.md §1
// "Semi-asynchronous with interval sync".
//
// Cost: as sync/asp.hpp for asynchronous commits, as sync/bsp.hpp for the
// barrier (counted completeness; a completed barrier O(ids) once).
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/detail/async.hpp>
#include <ashl/sync/detail/round.hpp>
#include <ashl/sync/events.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
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
  stage_id stage = stage_id::semi_async;
  std::uint32_t min_workers = 1;  // no barrier completes with fewer live in rounds (>= 1)
};

class semi_async : public detail::async_policy {
 public:
  using policy_concept = policy_tag;

  semi_async() = default;
  explicit semi_async(semi_async_params p)
      : async_policy(p.workers, {p.scale, {}, {}, p.staleness_weight}, p.stage), rounds_(p.workers, round_weighting::mean, p.min_workers),
        k_(p.sync_every_iterations), dt_(p.sync_every_seconds), since_(p.workers, 0),
        next_barrier_time_(p.sync_every_seconds) {
    ASHL_ASSERT(k_ > 0 || dt_ > 0.0, "semi_async: set sync_every_iterations or sync_every_seconds");
    ASHL_ASSERT(p.min_workers >= 1, "semi_async: min_workers must be >= 1");
  }

  commit_decision on_commit(const commit_event& c, outcome_sink& out) {
    auto& t = core_.table();
    if (!t.accept(c)) return {commit_action::drop, 0.0};
    const bool barrier = rounds_.waiting(c.worker) || (k_ > 0 && ++since_[c.worker] >= k_) ||
                         (dt_ > 0.0 && c.time >= next_barrier_time_);
    if (!barrier) return {commit_action::apply, core_.apply(c.worker)};
    since_[c.worker] = 0;
    rounds_.add(t, c);
    settle(c.time, out);
    return {commit_action::buffer, 0.0};
  }
  pull_action on_pull(const pull_event& q, outcome_sink&) {
    auto& t = core_.table();
    if (!t.is_live(q.worker)) return pull_action::serve;
    if (rounds_.waiting(q.worker) || rounds_.pending(q.worker)) {
      t.hold(q.worker);
      return pull_action::hold;
    }
    return serve(q.worker);
  }
  void on_metric(const metric_event&, outcome_sink&) {}
  void on_join(const membership_event& j, outcome_sink& out) {
    auto& t = core_.table();
    if (!t.join(j.worker, 0)) return;
    if (since_.size() < t.size()) since_.resize(t.size(), 0);
    since_[j.worker] = 0;
    (void)rounds_.joined(t, j.worker);
    settle(j.time, out);  // a rejoiner's buffered commit may bring the barrier to min_workers
  }
  void on_evict(const membership_event& j, outcome_sink& out) {
    auto& t = core_.table();
    if (!t.is_live(j.worker)) return;
    rounds_.evicted(j.worker);
    t.evict(j.worker);
    settle(j.time, out);
  }
  void on_measurement(const measurement_event&, outcome_sink&) {}
  void drain(outcome_sink& out) { rounds_.drain(core_.table(), out); }

  [[nodiscard]] std::uint64_t barriers() const noexcept { return rounds_.rounds(); }
  [[nodiscard]] std::size_t buffered() const noexcept { return rounds_.buffered(); }
  [[nodiscard]] double next_barrier_time() const noexcept { return next_barrier_time_; }
  [[nodiscard]] bool is_pending(worker_id w) const noexcept { return rounds_.pending(w); }
  [[nodiscard]] std::uint32_t min_workers() const noexcept { return rounds_.min_workers(); }

 private:
  // The saved barrier rule (core/fields.hpp), first in a state.
  static constexpr auto saved() {
    return std::tuple{field{"sync_every_iterations", &semi_async::k_},
                      field{"sync_every_seconds", &semi_async::dt_}};
  }

 public:
  void save(state_writer& out) const {
    out.tag("SEMI", 1);
    put_fields(out, *this, saved());
    out.put(next_barrier_time_);
    out.put_vector(since_);
    core_.save(out);
    rounds_.save(out);
  }
  status load(state_reader& in) {
    semi_async n;
    ASHL_TRY(in.tag("SEMI", 1));
    ASHL_TRY(get_fields(in, n, "semi_async", saved()));
    if (!(n.k_ > 0 || n.dt_ > 0.0))
      return malformed("semi_async.sync_every_seconds", n.dt_, "no barrier: K = 0 and Δt <= 0");
    ASHL_TRY(in.get(n.next_barrier_time_, "semi_async.next_barrier_time"));
    ASHL_TRY(in.get_vector(n.since_, "semi_async.since"));
    ASHL_TRY(n.core_.load(in));
    if (n.since_.size() != n.core_.table().size())
      return malformed("semi_async.since", n.since_.size(), "one count per worker id");
    ASHL_TRY(n.rounds_.load(in, n.core_.table()));
    *this = std::move(n);
    return {};
  }

 private:
  void settle(double now, outcome_sink& out) {
    if (rounds_.settle(core_.table(), out).rounds > 0 && dt_ > 0.0) next_barrier_time_ = (std::floor(now / dt_) + 1.0) * dt_;
  }

  detail::round_core rounds_;
  std::uint32_t k_ = 0;
  double dt_ = 0.0;
  std::vector<std::uint32_t> since_;
  double next_barrier_time_ = 0.0;
};

static_assert(consistency_policy<semi_async>);

}  // namespace sync
ASHL_NAMESPACE_END
