// ashl/sync/ssp.hpp — stale synchronous parallel SSP(s).
//
//   ashl::sync::ssp p{{.workers = 4, .staleness = 3}};
//   ashl::sync::outcome_sink out(4);                  // the driver's, reused
//   p.on_commit({.worker = 0, .sequence = 1}, out);   // applied at once
//   if (p.on_pull({.worker = 0}, out) == ashl::sync::pull_action::hold) {}  // c_0 − min_j c_j > 3
//   out.clear();
//   p.on_commit({.worker = 1, .sequence = 1}, out);
//   for (auto w : out.released()) answer(w);          // pulls the slow commit unblocked
//
// Commits are applied on arrival (ASP); worker i's pull is held while
// c_i − min_j c_j > s over live workers, c_i counting the commits the policy
// accepted. s = 0 is lock-step. A joining worker starts at the current
// minimum so it neither blocks others nor runs free; an eviction recomputes
// the minimum and releases what it unblocks; an evicted worker's held pull is
// dropped. A worker has at most one held pull: a pull repeated while held
// stays held and is answered once, on release. ASHL's SHL stage is an ssp
// with per-worker weights D_i and plans. docs/algorithms.md §1 "SSP", §2 "SHL".
//
// Cost: the minimum clock is the top of an indexed heap over live workers,
// and held pulls sit in a second heap ordered by (c_i, i), so a release pops
// while c_i − min <= s: every event is O(log M) plus O(log M) per pull it
// releases, and none allocates (heaps are sized for the workers).
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/detail/async.hpp>
#include <ashl/sync/detail/workers.hpp>
#include <ashl/sync/events.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

struct ssp_params {
  std::size_t workers = 0;
  std::uint32_t staleness = 3;  // the bound s
  double scale = 1.0;
  std::vector<double> weights{};
  std::vector<worker_plan> plans{};
  staleness_weighting staleness_weight{};
  stage_id stage = stage_id::ssp;
};

class ssp : public detail::async_policy {
  // Held pulls by (c_i, i).
  struct order_fn {
    const ssp* p;
    bool operator()(worker_id a, worker_id b) const noexcept {
      const auto ca = p->core_.table()[a].commits, cb = p->core_.table()[b].commits;
      return ca != cb ? ca < cb : a < b;
    }
  };
  [[nodiscard]] order_fn order() const noexcept { return {this}; }

 public:
  using policy_concept = policy_tag;

  ssp() = default;
  explicit ssp(ssp_params p)
      : async_policy(p.workers, {p.scale, std::move(p.weights), std::move(p.plans), p.staleness_weight}, p.stage),
        bound_(p.staleness), pos_(p.workers, detail::no_position) {
    held_.reserve(p.workers);
  }

  commit_decision on_commit(const commit_event& c, outcome_sink& out) {
    auto& t = core_.table();
    if (!t.accept(c)) return {commit_action::drop, 0.0};
    const commit_decision d{commit_action::apply, core_.apply(c.worker)};
    if (pos_[c.worker] != detail::no_position) held_.update(c.worker, pos_, order());  // a held worker committed
    release(out);
    return d;
  }
  pull_action on_pull(const pull_event& q, outcome_sink&) {
    auto& t = core_.table();
    if (!t.is_live(q.worker)) return pull_action::serve;
    if (t.is_held(q.worker)) return pull_action::hold;
    if (ahead(q.worker) > bound_) {
      t.hold(q.worker);
      held_.push(q.worker, pos_, order());
      return pull_action::hold;
    }
    return serve(q.worker);
  }
  void on_metric(const metric_event&, outcome_sink&) {}
  void on_join(const membership_event& j, outcome_sink&) {
    auto& t = core_.table();
    const std::uint64_t start = t.live_count() == 0 ? 0 : t.min_live_commits();
    if (t.join(j.worker, start)) grow(t.size());
  }
  void on_evict(const membership_event& j, outcome_sink& out) {
    auto& t = core_.table();
    if (!t.is_live(j.worker)) return;
    if (pos_[j.worker] != detail::no_position) held_.remove(j.worker, pos_, order());
    t.evict(j.worker);
    release(out);
  }
  void on_measurement(const measurement_event&, outcome_sink&) {}
  // Releases every held pull, in id order (O(ids): a drain happens once).
  void drain(outcome_sink& out) {
    core_.table().release_if(out, [](worker_id) { return true; });
    held_.clear(pos_);
  }

  using async_policy::set_plan;
  using async_policy::clock;
  using async_policy::min_clock;
  [[nodiscard]] std::size_t held_count() const noexcept { return held_.size(); }
  [[nodiscard]] std::uint32_t bound() const noexcept { return bound_; }
  // A new bound s from now on (sync/joint.hpp re-chooses it): held pulls a
  // wider bound allows are released into `out`; a narrower one applies from
  // the next pull on (served pulls are not taken back). Not an event.
  void set_bound(std::uint32_t s, outcome_sink& out) {
    bound_ = s;
    release(out);
  }
  // c_i as the policy counts it.
  // min_j c_j over live workers (0 when none is live).
  // c_i − min_j c_j over live workers.
  [[nodiscard]] std::uint64_t ahead(worker_id w) const { return clock(w) - min_clock(); }

  void save(state_writer& out) const {
    out.tag("SSP_", 1);
    out.put(bound_);
    core_.save(out);
  }
  status load(state_reader& in) {
    ssp n;
    ASHL_TRY(in.tag("SSP_", 1));
    ASHL_TRY(in.get(n.bound_, "ssp.staleness"));
    ASHL_TRY(n.core_.load(in));
    const auto& t = n.core_.table();
    n.grow(t.size());
    const std::uint64_t m = t.min_live_commits();
    for (worker_id w = 0; w < t.size(); ++w) {
      if (!t.is_held(w)) continue;
      if (t[w].commits - m <= n.bound_) return malformed("ssp.held", w, "a held pull within the bound");
      n.held_.push(w, n.pos_, n.order());
    }
    *this = std::move(n);
    return {};
  }

 private:
  void grow(std::size_t n) {
    if (pos_.size() < n) pos_.resize(n, detail::no_position);
    held_.reserve(n);
  }
  // Pops held pulls from the lowest clock up while c_i − min <= s.
  void release(outcome_sink& out) {
    auto& t = core_.table();
    const std::uint64_t m = t.min_live_commits();
    while (!held_.empty() && t[held_.top()].commits - m <= bound_) t.release(held_.pop(pos_, order()), out);
  }

  std::uint32_t bound_ = 3;
  detail::id_heap held_;             // held pulls by (c_i, i)
  std::vector<std::uint32_t> pos_;   // index in held_
};

static_assert(consistency_policy<ssp>);

}  // namespace sync
ASHL_NAMESPACE_END
