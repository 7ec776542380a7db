// ashl/sync/dssp.hpp — dynamic SSP: an SSP whose bound is re-chosen online in
// [s_min, s_max] from recent per-worker iteration times.
//
//   ashl::sync::dssp p{{.workers = 4, .s_min = 1, .s_max = 6}};
//   ashl::sync::outcome_sink out(4);
//   auto a = p.on_pull({.worker = 0, .time = 12.0}, out);   // bound chosen now
//   p.on_commit({.worker = 3, .sequence = 9, .time = 12.5}, out);
//   for (auto w : out.released()) answer(w);
//   out.clear();
//
// Rule (ours, after DSSP): when worker i pulls with c_i − min_j c_j = a, it is
// served if a <= s_min, held if a > s_max; in between it may run
// r = round((t_next − now) / T_i) extra iterations (clamped to
// [0, s_max − s_min]), where T_i is i's mean recent iteration time and t_next
// the predicted next commit of the slowest live workers (the earliest, over
// the live workers at the minimum clock, of last commit plus mean iteration
// time): a fast worker keeps working while the straggler is far from
// committing and waits only when the wait will be short. Without timing data
// (for i, or for any worker at the minimum) the bound is s_min. Iteration
// times are the intervals between a worker's accepted commits since it joined
// (one iteration per commit), over the last `window`. A held pull is released
// at the first event after which the same rule, at that event's time, allows
// it; since the allowance only shrinks as time passes (and a joiner, at the
// minimum without timing data, only lowers it), only commits and evictions
// release. Membership as in sync/ssp.hpp.
// docs/algorithms.md §1 "DSSP".
//
// Cost: the minimum clock and t_next come from the worker table's heap over
// live workers ordered by (c_j, predicted next commit, j). Held pulls sit in
// one heap per level a in [1, s_max − s_min] (clock min + s_min + a), ordered
// by (T_i, i) because at a level the rule releases a prefix of that order,
// and one "far" heap by (c_i, i) for pulls beyond s_max. An event is
// O((s_max − s_min) + log M) plus O(log M) per pull it releases or moves;
// nothing allocates after construction (arrays grow when a new id joins).
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/detail/async.hpp>
#include <ashl/sync/detail/workers.hpp>
#include <ashl/sync/events.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
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
  stage_id stage = stage_id::dssp;
};

class dssp : public detail::async_policy {
  static constexpr double inf = std::numeric_limits<double>::infinity();
  static constexpr std::uint32_t in_far = 0xfffffffeu;  // slot_ value: in the far heap

  // Held pulls beyond s_max, by (c_i, i).
  struct far_order {
    const dssp* p;
    bool operator()(worker_id a, worker_id b) const noexcept {
      const auto ca = p->core_.table()[a].commits, cb = p->core_.table()[b].commits;
      return ca != cb ? ca < cb : a < b;
    }
  };
  // Held pulls at one level, by (T_i, i); T_i = +inf without timing data.
  struct level_order {
    const dssp* p;
    bool operator()(worker_id a, worker_id b) const noexcept {
      const double ta = p->period_[a], tb = p->period_[b];
      return ta != tb ? ta < tb : a < b;
    }
  };

 public:
  using policy_concept = policy_tag;

  dssp() : dssp(dssp_params{}) {}
  explicit dssp(dssp_params p)
      : async_policy(p.workers, {p.scale, std::move(p.weights), {}, p.staleness_weight}, p.stage), s_min_(p.s_min),
        s_max_(std::max(p.s_min, p.s_max)), window_(std::max<std::uint32_t>(1, p.window)), bound_(p.s_min),
        levels_(s_max_ - s_min_) {
    grow(p.workers);
    for (worker_id w = 0; w < p.workers; ++w) core_.table().set_order_key(w, -inf);
  }

  commit_decision on_commit(const commit_event& c, outcome_sink& out) {
    auto& t = core_.table();
    if (!t.accept(c)) return {commit_action::drop, 0.0};
    const worker_id w = c.worker;
    const bool was_held = slot_[w] != detail::no_position;
    if (was_held) unplace(w);
    if (t[w].commits - t[w].start >= 2) record(w, t[w].last_commit_time - t[w].prev_commit_time);
    const double pred = period_[w] < inf ? t[w].last_commit_time + period_[w] : -inf;
    t.set_order_key(w, std::isnan(pred) ? -inf : pred);
    const commit_decision d{commit_action::apply, core_.apply(w)};
    if (was_held) {  // re-placed by release(), which moves far pulls in
      slot_[w] = in_far;
      far_.push(w, pos_, far_order{this});
    }
    release(c.time, out);
    return d;
  }
  pull_action on_pull(const pull_event& q, outcome_sink& out) {
    auto& t = core_.table();
    if (!t.is_live(q.worker)) return pull_action::serve;
    if (t.is_held(q.worker)) return pull_action::hold;
    bound_ = bound_for(q.worker, q.time);
    if (ahead(q.worker) > bound_) {
      t.hold(q.worker);
      place(q.worker, out);  // lands in a level or far: the bound is at least s_min
      return pull_action::hold;
    }
    return serve(q.worker);
  }
  void on_metric(const metric_event&, outcome_sink&) {}
  void on_join(const membership_event& j, outcome_sink& out) {
    auto& t = core_.table();
    const std::uint64_t start = t.live_count() == 0 ? 0 : t.min_live_commits();
    if (!t.join(j.worker, start)) return;
    grow(t.size());
    count_[j.worker] = 0;
    head_[j.worker] = 0;
    period_[j.worker] = inf;
    t.set_order_key(j.worker, -inf);
    release(j.time, out);  // releases nothing (the joiner has no timing); keeps the level base current
  }
  void on_evict(const membership_event& j, outcome_sink& out) {
    auto& t = core_.table();
    if (!t.is_live(j.worker)) return;
    if (slot_[j.worker] != detail::no_position) unplace(j.worker);
    t.evict(j.worker);
    release(j.time, out);
  }
  void on_measurement(const measurement_event&, outcome_sink&) {}
  // Releases every held pull, in id order (O(ids): a drain happens once).
  void drain(outcome_sink& out) {
    core_.table().release_if(out, [](worker_id) { return true; });
    far_.clear(pos_);
    for (auto& h : levels_) h.clear(pos_);
    std::fill(slot_.begin(), slot_.end(), detail::no_position);
  }

  using async_policy::clock;
  using async_policy::min_clock;
  [[nodiscard]] std::uint64_t ahead(worker_id w) const { return clock(w) - min_clock(); }
  [[nodiscard]] std::uint32_t s_min() const noexcept { return s_min_; }
  [[nodiscard]] std::uint32_t s_max() const noexcept { return s_max_; }
  // The bound chosen by the most recent pull decision, in [s_min, s_max].
  [[nodiscard]] std::uint32_t current_bound() const noexcept { return bound_; }
  // T_i: w's mean recent iteration time; +inf without timing data.
  [[nodiscard]] double iteration_time(worker_id w) const noexcept { return period_[w]; }

  // The bound for worker w pulling at `now` (see the header comment). O(1).
  [[nodiscard]] std::uint32_t bound_for(worker_id w, double now) const {
    return s_min_ + extra(period_[w], t_next(), now);
  }

 private:
  // The saved scalars, first in a state (core/fields.hpp).
  static constexpr auto saved() {
    return std::tuple{field{"s_min", &dssp::s_min_}, field{"s_max", &dssp::s_max_}, field{"window", &dssp::window_},
                      field{"current_bound", &dssp::bound_}};
  }

 public:
  void save(state_writer& out) const {
    out.tag("DSSP", 1);
    put_fields(out, *this, saved());
    core_.save(out);
    out.put<std::uint64_t>(count_.size());
    for (worker_id w = 0; w < count_.size(); ++w) {
      out.put(count_[w]);
      for (std::uint32_t k = 0; k < count_[w]; ++k) out.put(ring(w, k));
    }
  }
  status load(state_reader& in) {
    dssp n;
    ASHL_TRY(in.tag("DSSP", 1));
    ASHL_TRY(get_fields(in, n, "dssp", saved()));
    if (n.s_max_ < n.s_min_) return malformed("dssp.s_max", n.s_max_, "below s_min");
    if (n.window_ < 1) return malformed("dssp.window", n.window_, "must be >= 1");
    ASHL_TRY(n.core_.load(in));
    n.levels_.resize(n.s_max_ - n.s_min_);
    const auto& t = n.core_.table();
    n.grow(t.size());
    std::uint64_t ids = 0;
    ASHL_TRY(in.count(ids, 4, "dssp.workers"));
    if (ids != t.size()) return malformed("dssp.workers", ids, "one iteration-time window per worker id");
    for (worker_id w = 0; w < ids; ++w) {
      std::uint32_t k = 0;
      ASHL_TRY(in.get(k, "dssp.times"));
      if (k > n.window_) return malformed("dssp.times", k, "more iteration times than the window");
      for (std::uint32_t i = 0; i < k; ++i) {
        double x = 0.0;
        ASHL_TRY(in.get(x, "dssp.time"));
        n.record(w, x);
      }
    }
    // Held pulls back into their heaps; none may be one the bound allows now.
    n.base_ = t.min_live_commits();
    for (worker_id w = 0; w < t.size(); ++w) {
      if (!t.is_held(w)) continue;
      if (t[w].commits <= n.base_ + n.s_min_) return malformed("dssp.held", w, "a held pull within s_min");
      outcome_sink none;
      n.place(w, none);
    }
    *this = std::move(n);
    return {};
  }

 private:
  void grow(std::size_t ids) {
    if (count_.size() >= ids) return;
    times_.resize(ids * window_, 0.0);
    count_.resize(ids, 0);
    head_.resize(ids, 0);
    period_.resize(ids, inf);
    pos_.resize(ids, detail::no_position);
    slot_.resize(ids, detail::no_position);
    far_.reserve(ids);
    for (auto& h : levels_) h.reserve(ids);
  }
  // k-th oldest iteration time of w.
  [[nodiscard]] double ring(worker_id w, std::uint32_t k) const {
    const std::uint32_t first = (head_[w] + window_ - count_[w]) % window_;
    return times_[std::size_t{w} * window_ + (first + k) % window_];
  }
  void record(worker_id w, double x) {
    times_[std::size_t{w} * window_ + head_[w]] = x;
    head_[w] = (head_[w] + 1) % window_;
    if (count_[w] < window_) ++count_[w];
    double sum = 0.0;  // oldest first, so a loaded copy sums in the same order
    for (std::uint32_t k = 0; k < count_[w]; ++k) sum += ring(w, k);
    const double mean = sum / static_cast<double>(count_[w]);
    period_[w] = mean > 0.0 ? mean : inf;
  }
  // The earliest predicted commit of the live workers at the minimum clock;
  // NaN when any of them has no timing data (or none is live).
  [[nodiscard]] double t_next() const noexcept {
    const auto& t = core_.table();
    if (t.live_count() == 0) return std::numeric_limits<double>::quiet_NaN();
    const double k = t.order_key(t.min_live_worker());
    return std::isfinite(k) ? k : std::numeric_limits<double>::quiet_NaN();
  }
  // Extra iterations beyond s_min for a worker of iteration time `ti`.
  [[nodiscard]] std::uint32_t extra(double ti, double next, double now) const noexcept {
    if (!(ti > 0.0) || !std::isfinite(ti) || !std::isfinite(next)) return 0;
    const double r = std::round((next - now) / ti);
    if (!(r > 0.0)) return 0;
    return static_cast<std::uint32_t>(std::clamp(r, 0.0, static_cast<double>(s_max_ - s_min_)));
  }

  [[nodiscard]] std::size_t level_of(std::uint64_t clock) const noexcept {
    return static_cast<std::size_t>(clock % levels_.size());
  }
  // A held pull into the structure matching its clock (relative to base_);
  // released at once if within s_min.
  void place(worker_id w, outcome_sink& out) {
    const std::uint64_t c = core_.table()[w].commits;
    if (c <= base_ + s_min_) {
      core_.table().release(w, out);
    } else if (c <= base_ + s_max_) {
      const auto l = level_of(c);
      slot_[w] = static_cast<std::uint32_t>(l);
      levels_[l].push(w, pos_, level_order{this});
    } else {
      slot_[w] = in_far;
      far_.push(w, pos_, far_order{this});
    }
  }
  void unplace(worker_id w) {
    if (slot_[w] == in_far) far_.remove(w, pos_, far_order{this});
    else levels_[slot_[w]].remove(w, pos_, level_order{this});
    slot_[w] = detail::no_position;
  }
  void release_level(std::size_t l, outcome_sink& out) {
    auto& h = levels_[l];
    while (!h.empty()) {
      const worker_id w = h.pop(pos_, level_order{this});
      slot_[w] = detail::no_position;
      core_.table().release(w, out);
    }
  }

  // Everything the rule allows after an event at `now`.
  void release(double now, outcome_sink& out) {
    const auto& t = core_.table();
    if (t.live_count() == 0) return;  // nothing is held without a live worker
    const std::uint64_t m = t.min_live_commits();
    if (m > base_) {
      // Levels whose clock is now within s_min go out whole.
      if (!levels_.empty()) {
        const std::uint64_t hi = std::min(m + s_min_, base_ + s_max_);
        for (std::uint64_t c = base_ + s_min_ + 1; c <= hi; ++c) release_level(level_of(c), out);
      }
    }
    base_ = m;  // a smaller m means nothing was held (every live worker left)
    while (!far_.empty() && t[far_.top()].commits <= m + s_max_) {
      const worker_id w = far_.pop(pos_, far_order{this});
      slot_[w] = detail::no_position;
      place(w, out);
    }
    const double next = t_next();
    if (!std::isfinite(next)) return;
    for (std::uint32_t a = 1; a <= s_max_ - s_min_; ++a) {
      auto& h = levels_[level_of(m + s_min_ + a)];
      while (!h.empty() && extra(period_[h.top()], next, now) >= a) {
        const worker_id w = h.pop(pos_, level_order{this});
        slot_[w] = detail::no_position;
        core_.table().release(w, out);
      }
    }
  }

  std::uint32_t s_min_ = 1;
  std::uint32_t s_max_ = 5;
  std::uint32_t window_ = 5;
  std::uint32_t bound_ = 1;
  // Iteration times: a ring of `window_` per worker, in one array.
  std::vector<double> times_;
  std::vector<std::uint32_t> count_;
  std::vector<std::uint32_t> head_;
  std::vector<double> period_;  // T_i, +inf without data
  // Held pulls: levels_[c mod (s_max − s_min)] holds clock c in
  // (base + s_min, base + s_max]; far_ the rest. slot_: which, or no_position.
  std::uint64_t base_ = 0;
  std::vector<detail::id_heap> levels_;
  detail::id_heap far_;
  std::vector<std::uint32_t> pos_;
  std::vector<std::uint32_t> slot_;
};

static_assert(consistency_policy<dssp>);

}  // namespace sync
ASHL_NAMESPACE_END
