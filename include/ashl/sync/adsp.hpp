// ashl/sync/adsp.hpp — ADSP: commit-rate control. Workers never wait; each
// commits its accumulated local delta when the time since its last commit
// reaches max(t_min, Γ/ΔC − O_i); the server applies Δ_i / M. ΔC (commits per
// worker per period Γ) is chosen online by the commit-rate search.
//
//   ashl::sync::adsp p{{.workers = 4, .period = 60, .target_loss = 0.3}};
//   p.on_measurement({.worker = 0, .kind = ashl::sync::measurement_kind::commit, .seconds = 2});
//   p.plan(0).commit_interval;                              // max(t_min, 60/ΔC − 2)
//   p.on_metric({.name = "loss", .value = 1.9, .time = 30}); // drives the search
//
// Search (ALGORITHMS.md §1 "ADSP"): from ΔC = initial, run ΔC for one period
// and record the loss at its start, middle and end (the first metrics at or
// after start, start + Γ/2, start + Γ); fit l(t) = 1/(a²t + b) + c through the
// three points; reward = 1/t* where l(t*) = target (−∞ when c >= target, +∞
// when the target is already reached); try ΔC + 1 next and keep climbing
// while the reward improves; settle on the best. The search re-runs after
// T_search seconds, or when the loss at the end of a period is >= (1 + rise)
// times the previous period's. Non-finite losses are ignored.
#pragma once

#include <ashl/config.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/detail/async.hpp>
#include <ashl/sync/events.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

// l(t) = 1/(a2·t + b) + c, with a2 = a² > 0 and t relative to the first point.
struct loss_curve {
  double a2 = 0.0;
  double b = 0.0;
  double c = 0.0;
  [[nodiscard]] double operator()(double t) const { return 1.0 / (a2 * t + b) + c; }
};

// Fit the curve exactly through (t0,l0), (t1,l1), (t2,l2), t0 < t1 < t2.
// The 3×3 system is nonlinear in (a², b, c), but 1/(l_k − c) is linear in t,
// so collinearity of the three transformed points gives c from one linear
// equation: (l0−l1)(t2−t1)(l2−c) = (l1−l2)(t1−t0)(l0−c); then (a², b) come
// from a least-squares line through (t_k, 1/(l_k − c)). Returns nothing for a
// degenerate system (points on a line, unequal times violated, a loss at or
// below c, a² <= 0, non-finite values).
inline std::optional<loss_curve> fit_loss_curve(double t0, double l0, double t1, double l1, double t2, double l2) {
  if (!(std::isfinite(t0) && std::isfinite(t1) && std::isfinite(t2) && std::isfinite(l0) && std::isfinite(l1) &&
        std::isfinite(l2)))
    return std::nullopt;
  if (!(t0 < t1 && t1 < t2)) return std::nullopt;
  const double u1 = t1 - t0, u2 = t2 - t0;  // times relative to t0, for conditioning
  const double A = (l0 - l1) * (u2 - u1);
  const double B = (l1 - l2) * u1;
  const double den = A - B;
  if (!(std::abs(den) > 1e-12 * (std::abs(A) + std::abs(B))) || den == 0.0) return std::nullopt;
  const double c = (A * l2 - B * l0) / den;
  if (!(l0 > c && l1 > c && l2 > c)) return std::nullopt;
  const double ts[3] = {0.0, u1, u2};
  const double ys[3] = {1.0 / (l0 - c), 1.0 / (l1 - c), 1.0 / (l2 - c)};
  const double tm = (ts[0] + ts[1] + ts[2]) / 3.0, ym = (ys[0] + ys[1] + ys[2]) / 3.0;
  double sxy = 0.0, sxx = 0.0;
  for (int k = 0; k < 3; ++k) {
    sxy += (ts[k] - tm) * (ys[k] - ym);
    sxx += (ts[k] - tm) * (ts[k] - tm);
  }
  const double a2 = sxy / sxx;
  const double b = ym - a2 * tm;
  if (!(a2 > 0.0) || !std::isfinite(a2) || !std::isfinite(b) || !std::isfinite(c)) return std::nullopt;
  return loss_curve{a2, b, c};
}

// 1/t* with l(t*) = target: how soon the target would be reached.
inline double commit_rate_reward(const std::optional<loss_curve>& f, double target) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  if (!f || !(f->c < target)) return -inf;
  const double t_star = (1.0 / (target - f->c) - f->b) / f->a2;
  if (!(t_star > 0.0)) return inf;
  return 1.0 / t_star;
}

struct adsp_params {
  std::size_t workers = 0;
  double period = 60.0;             // Γ, seconds
  double t_min = 0.0;               // shortest commit interval, seconds
  double search_every = 1000.0;     // T_search, seconds
  double target_loss = 0.3;         // ℓ_target of the reward
  double loss_rise = 0.3;           // re-search when a period's loss rises by this fraction
  std::uint32_t initial_commit_rate = 1;  // ΔC the search starts from
  std::uint32_t max_commit_rate = 64;     // the climb stops here
  std::string metric = "loss";
  staleness_weighting staleness_weight{};
  std::string stage = "adsp";
};

class adsp {
 public:
  using policy_concept = policy_tag;

  adsp() = default;
  explicit adsp(adsp_params p)
      : core_(p.workers, {1.0, {}, {}, p.staleness_weight}, p.stage), p_(std::move(p)),
        overhead_(p_.workers, 0.0), push_(p_.workers, 0.0), pull_(p_.workers, 0.0),
        rate_(std::max<std::uint32_t>(1, p_.initial_commit_rate)) {
    trial_ = rate_;
  }

  commit_decision on_commit(const commit_event& c) {
    if (!core_.table().accept(c)) return {commit_action::drop, 0.0, {}};
    const std::size_t m = core_.table().live_count();
    core_.set_scale(m == 0 ? 0.0 : 1.0 / static_cast<double>(m));
    return {commit_action::apply, core_.apply(c.worker), {}};
  }
  pull_decision on_pull(const pull_event& q) {
    if (core_.table().is_live(q.worker)) core_.table().served(q.worker);
    return {pull_action::serve, {}};
  }
  outcome on_metric(const metric_event& m) {
    outcome o;
    if (m.name != p_.metric || !std::isfinite(m.value)) return o;
    const std::uint32_t before = rate_;
    if (searching_) search_step(m.time, m.value);
    else exploit_step(m.time, m.value);
    o.plans_changed = rate_ != before;
    return o;
  }
  outcome on_join(const membership_event& j) {
    outcome o;
    if (core_.table().join(j.worker, 0)) {
      grow(j.worker);
      o.plans_changed = true;
    }
    return o;
  }
  outcome on_evict(const membership_event& j) {
    core_.table().evict(j.worker);
    return {};
  }
  outcome on_measurement(const measurement_event& x) {
    outcome o;
    if (!core_.table().is_live(x.worker) || !std::isfinite(x.seconds) || x.seconds < 0.0) return o;
    grow(x.worker);
    switch (x.kind) {
      case measurement_kind::commit: overhead_[x.worker] = x.seconds; break;
      case measurement_kind::push: push_[x.worker] = x.seconds; overhead_[x.worker] = push_[x.worker] + pull_[x.worker]; break;
      case measurement_kind::pull: pull_[x.worker] = x.seconds; overhead_[x.worker] = push_[x.worker] + pull_[x.worker]; break;
      default: return o;
    }
    o.plans_changed = true;
    return o;
  }
  outcome drain() { return {{}, core_.table().release_all(), false}; }

  [[nodiscard]] worker_plan plan(worker_id w) const {
    worker_plan p = core_.plan(w);
    p.local_iterations = 0;  // commit by time
    const double o = w < overhead_.size() ? overhead_[w] : 0.0;
    p.commit_interval = std::max(p_.t_min, p_.period / static_cast<double>(rate_) - o);
    return p;
  }
  [[nodiscard]] std::string_view name() const noexcept { return core_.stage(); }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return core_.table().is_live(w); }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return core_.table().is_held(w); }

  [[nodiscard]] std::uint32_t commit_rate() const noexcept { return rate_; }  // ΔC in force
  [[nodiscard]] bool searching() const noexcept { return searching_; }
  [[nodiscard]] std::uint64_t searches_done() const noexcept { return searches_done_; }

 private:
  struct point {
    double t;
    double l;
  };

  void grow(worker_id w) {
    if (w >= overhead_.size()) {
      overhead_.resize(std::size_t{w} + 1, 0.0);
      push_.resize(std::size_t{w} + 1, 0.0);
      pull_.resize(std::size_t{w} + 1, 0.0);
    }
  }

  void start_search(point at) {
    searching_ = true;
    trial_ = std::max<std::uint32_t>(1, p_.initial_commit_rate);
    rate_ = trial_;
    best_ = trial_;
    best_reward_ = -std::numeric_limits<double>::infinity();
    first_trial_ = true;
    start_ = at;
    mid_.reset();
  }
  void search_step(double t, double l) {
    if (!start_) {
      start_ = point{t, l};
      return;
    }
    if (!mid_) {
      if (t >= start_->t + 0.5 * p_.period) mid_ = point{t, l};
      return;
    }
    if (t < start_->t + p_.period) return;
    const double r = commit_rate_reward(fit_loss_curve(start_->t, start_->l, mid_->t, mid_->l, t, l), p_.target_loss);
    const point end{t, l};
    if (first_trial_ || r > best_reward_) {
      best_ = trial_;
      best_reward_ = r;
      first_trial_ = false;
      if (trial_ < p_.max_commit_rate) {
        ++trial_;
        rate_ = trial_;
        start_ = end;
        mid_.reset();
        return;
      }
    }
    // The reward stopped improving (or the cap was reached): settle.
    rate_ = best_;
    searching_ = false;
    ++searches_done_;
    search_end_ = t;
    period_start_ = end;
  }
  void exploit_step(double t, double l) {
    if (t - search_end_ >= p_.search_every) {
      start_search(point{t, l});
      return;
    }
    if (t < period_start_.t + p_.period) return;
    const bool rose = l >= (1.0 + p_.loss_rise) * period_start_.l;
    if (rose) {
      start_search(point{t, l});
      return;
    }
    period_start_ = point{t, l};
  }

  detail::async_core core_;
  adsp_params p_;
  std::vector<double> overhead_, push_, pull_;  // O_i and its parts
  std::uint32_t rate_ = 1;
  // search state
  bool searching_ = true;
  bool first_trial_ = true;
  std::uint32_t trial_ = 1;
  std::uint32_t best_ = 1;
  double best_reward_ = -std::numeric_limits<double>::infinity();
  std::optional<point> start_, mid_;
  std::uint64_t searches_done_ = 0;
  // exploitation state
  double search_end_ = 0.0;
  point period_start_{0.0, 0.0};
};

static_assert(consistency_policy<adsp>);

}  // namespace sync
ASHL_NAMESPACE_END
