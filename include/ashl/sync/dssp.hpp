// ashl/sync/dssp.hpp — dynamic SSP: an SSP whose bound is re-chosen online in
// [s_min, s_max] from recent per-worker iteration times.
//
//   ashl::sync::dssp p{{.workers = 4, .s_min = 1, .s_max = 6}};
//   auto q = p.on_pull({.worker = 0, .time = 12.0});   // bound chosen now
//
// Rule (ours, after DSSP): when worker i pulls with c_i − min_j c_j = a, it is
// served if a <= s_min, held if a > s_max; in between it may run
// r = round((t_next − now) / T_i) extra iterations (clamped to
// [0, s_max − s_min]), where T_i is i's mean recent iteration time and t_next
// the predicted next commit of the slowest live worker (its last commit plus
// its mean iteration time): a fast worker keeps working while the straggler is
// far from committing and waits only when the wait will be short. Without
// timing data the bound is s_min. Iteration times are the intervals between a
// worker's accepted commits (one iteration per commit), over the last
// `window`. ALGORITHMS.md §1 "DSSP".
#pragma once

#include <ashl/config.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/detail/async.hpp>
#include <ashl/sync/events.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <numeric>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

struct dssp_params {
  std::size_t workers = 0;
  std::uint32_t s_min = 1;
  std::uint32_t s_max = 5;
  std::uint32_t window = 5;  // iteration times kept per worker, >= 1
  double scale = 1.0;
  std::vector<double> weights{};
  staleness_weighting staleness_weight{};
  std::string stage = "dssp";
};

class dssp {
 public:
  using policy_concept = policy_tag;

  dssp() = default;
  explicit dssp(dssp_params p)
      : core_(p.workers, {p.scale, std::move(p.weights), {}, std::move(p.staleness_weight)}, std::move(p.stage)),
        s_min_(p.s_min), s_max_(std::max(p.s_min, p.s_max)), window_(std::max<std::uint32_t>(1, p.window)),
        times_(p.workers), bound_(p.s_min) {}

  commit_decision on_commit(const commit_event& c) {
    auto& t = core_.table();
    if (!t.accept(c)) return {commit_action::drop, 0.0, {}};
    if (c.worker >= times_.size()) times_.resize(std::size_t{c.worker} + 1);
    if (t[c.worker].commits >= 2 + join_offset(c.worker)) {
      auto& q = times_[c.worker];
      q.push_back(t[c.worker].last_commit_time - t[c.worker].prev_commit_time);
      if (q.size() > window_) q.pop_front();
    }
    commit_decision d{commit_action::apply, core_.apply(c.worker), {}};
    d.effects.released = release(c.time);
    return d;
  }
  pull_decision on_pull(const pull_event& q) {
    auto& t = core_.table();
    if (!t.is_live(q.worker)) return {pull_action::serve, {}};
    if (ahead(q.worker) > bound_for(q.worker, q.time)) {
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
    if (t.join(j.worker, start)) {
      if (j.worker >= times_.size()) times_.resize(std::size_t{j.worker} + 1);
      if (j.worker >= offsets_.size()) offsets_.resize(std::size_t{j.worker} + 1, 0);
      times_[j.worker].clear();
      offsets_[j.worker] = start;
    }
    return {};
  }
  outcome on_evict(const membership_event& j) {
    outcome o;
    if (core_.table().evict(j.worker)) o.released = release(j.time);
    return o;
  }
  outcome on_measurement(const measurement_event&) { return {}; }
  outcome drain() { return {{}, core_.table().release_all(), false}; }

  [[nodiscard]] worker_plan plan(worker_id w) const { return core_.plan(w); }
  [[nodiscard]] std::string_view name() const noexcept { return core_.stage(); }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return core_.table().is_live(w); }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return core_.table().is_held(w); }
  [[nodiscard]] std::uint64_t ahead(worker_id w) const {
    return core_.table()[w].commits - core_.table().min_live_commits();
  }
  // The bound chosen by the most recent decision, in [s_min, s_max].
  [[nodiscard]] std::uint32_t current_bound() const noexcept { return bound_; }

  // The bound for worker w pulling at `now` (see the header comment).
  [[nodiscard]] std::uint32_t bound_for(worker_id w, double now) {
    bound_ = choose(w, now);
    return bound_;
  }

 private:
  [[nodiscard]] std::uint64_t join_offset(worker_id w) const { return w < offsets_.size() ? offsets_[w] : 0; }
  [[nodiscard]] double mean_time(worker_id w) const {
    if (w >= times_.size() || times_[w].empty()) return std::numeric_limits<double>::quiet_NaN();
    return std::accumulate(times_[w].begin(), times_[w].end(), 0.0) / static_cast<double>(times_[w].size());
  }
  [[nodiscard]] std::uint32_t choose(worker_id w, double now) const {
    const auto& t = core_.table();
    const double ti = mean_time(w);
    if (!(ti > 0.0)) return s_min_;
    const std::uint64_t m = t.min_live_commits();
    double t_next = std::numeric_limits<double>::infinity();
    for (worker_id j = 0; j < t.size(); ++j) {
      if (!t.is_live(j) || t[j].commits != m) continue;
      const double tj = mean_time(j);
      if (!(tj > 0.0)) return s_min_;  // a slowest worker without timing data
      t_next = std::min(t_next, t[j].last_commit_time + tj);
    }
    if (!std::isfinite(t_next)) return s_min_;
    const double r = std::round((t_next - now) / ti);
    const double extra = std::clamp(r, 0.0, static_cast<double>(s_max_ - s_min_));
    return s_min_ + static_cast<std::uint32_t>(extra);
  }
  std::vector<worker_id> release(double now) {
    const std::uint64_t m = core_.table().min_live_commits();
    return core_.table().release_if([&](worker_id w) { return core_.table()[w].commits - m <= bound_for(w, now); });
  }

  detail::async_core core_;
  std::uint32_t s_min_ = 1;
  std::uint32_t s_max_ = 5;
  std::uint32_t window_ = 5;
  std::vector<std::deque<double>> times_;
  std::vector<std::uint64_t> offsets_;
  std::uint32_t bound_ = 1;
};

static_assert(consistency_policy<dssp>);

}  // namespace sync
ASHL_NAMESPACE_END
