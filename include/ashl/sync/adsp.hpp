// ashl/sync/adsp.hpp — ADSP: commit-rate control. Workers never wait; each
// commits its accumulated local delta when the time since its last commit
// reaches max(t_min, Γ/ΔC − O_i) (ashl::adsp_commit_interval, the one
// formula); the server applies Δ_i / M over the live workers. ΔC (commits per
// worker per period Γ) is chosen online by the commit-rate search.
//
//   ashl::sync::adsp p{{.workers = 4, .period = 60, .target_loss = 0.3}};
//   ashl::sync::outcome_sink out(4);
//   p.on_measurement({.worker = 0, .kind = ashl::measurement_kind::commit, .seconds = 2}, out);
//   p.plan(0).commit_interval();                        // max(t_min, 60/ΔC − 2) s
//   p.on_metric({.metric = ashl::metric_id::loss, .value = 1.9, .time = 30}, out);  // drives the search
//
// Search (docs/algorithms.md §1 "ADSP"): from ΔC = initial, run ΔC for one period
// and record the loss at its start, middle and end (the first metrics at or
// after start, start + Γ/2, start + Γ); fit l(t) = 1/(a²t + b) + c through the
// three points; reward = 1/t* where l(t*) = target (−∞ when c >= target, +∞
// when the target is already reached); try ΔC + 1 next and keep climbing
// while the reward improves; settle on the best. The search re-runs after
// T_search seconds, or when the loss at the end of a period is >= (1 + rise)
// times the previous period's. Non-finite losses are ignored.
//
// Outcomes: a new ΔC changes every plan (all_plans_changed); a measurement
// of O_i marks only worker i, and only when its interval moved; a joiner's
// own plan is marked. Per-worker state is sized at construction and on the
// join of a new id; the live count is kept, so no event scans the workers.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/events.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
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
  double period = 60.0;                   // Γ, seconds
  double t_min = 0.0;                     // shortest commit interval, seconds
  double search_every = 1000.0;           // T_search, seconds
  double target_loss = 0.3;               // ℓ_target of the reward
  double loss_rise = 0.3;                 // re-search when a period's loss rises by this fraction
  std::uint32_t initial_commit_rate = 1;  // ΔC the search starts from
  std::uint32_t max_commit_rate = 64;     // the climb stops here
  metric_id metric = metric_id::loss;     // the metric the search reads
  staleness_weighting staleness_weight{};
  stage_id stage = stage_id::adsp;
  friend bool operator==(const adsp_params&, const adsp_params&) = default;

  // In this order in a saved state (core/state_io.hpp).
  static constexpr auto fields() {
    return std::tuple{field{"workers", &adsp_params::workers},
                      field{"period", &adsp_params::period},
                      field{"t_min", &adsp_params::t_min},
                      field{"search_every", &adsp_params::search_every},
                      field{"target_loss", &adsp_params::target_loss},
                      field{"loss_rise", &adsp_params::loss_rise},
                      field{"initial_commit_rate", &adsp_params::initial_commit_rate},
                      field{"max_commit_rate", &adsp_params::max_commit_rate},
                      field{"metric", &adsp_params::metric},
                      field{"staleness_weight", &adsp_params::staleness_weight},
                      field{"stage", &adsp_params::stage}};
  }
};

class adsp {
  // Declared first: save() and load() read their tables.
  struct point {
    double t = 0.0;
    double l = 0.0;
    static constexpr auto fields() { return std::tuple{field{"t", &point::t}, field{"l", &point::l}}; }
  };
  struct entry {
    bool live = false;
    bool has_sequence = false;
    std::uint64_t last_sequence = 0;
    std::uint64_t pulled_version = 0;  // version at w's last served pull
    double overhead = 0.0;             // O_i
    double push = 0.0, pull = 0.0;     // its parts, when measured apart
    // In this order in a saved state, after the parameters.
    static constexpr auto fields() {
      return std::tuple{field{"live", &entry::live},         field{"has_sequence", &entry::has_sequence},
                        field{"last_sequence", &entry::last_sequence},
                        field{"pulled_version", &entry::pulled_version},
                        field{"overhead", &entry::overhead}, field{"push", &entry::push},
                        field{"pull", &entry::pull}};
    }
  };
  // The search's state, in its order in a saved state, after the workers.
  static constexpr auto search_fields() {
    return std::tuple{field{"version", &adsp::version_},         field{"rate", &adsp::rate_},
                      field{"searching", &adsp::searching_},     field{"first_trial", &adsp::first_trial_},
                      field{"trial", &adsp::trial_},             field{"best", &adsp::best_},
                      field{"best_reward", &adsp::best_reward_}, field{"has_start", &adsp::has_start_},
                      field{"start", &adsp::start_},             field{"has_mid", &adsp::has_mid_},
                      field{"mid", &adsp::mid_},                 field{"searches_done", &adsp::searches_done_},
                      field{"search_end", &adsp::search_end_},   field{"period_start", &adsp::period_start_}};
  }


 public:
  using policy_concept = policy_tag;

  adsp() = default;
  explicit adsp(adsp_params p) : p_(p), rate_(std::max<std::uint32_t>(1, p.initial_commit_rate)) {
    grow(p_.workers);
    for (std::size_t w = 0; w < p_.workers; ++w) w_[w].live = true;
    live_ = p_.workers;
    trial_ = rate_;
    best_ = rate_;
  }

  commit_decision on_commit(const commit_event& c, outcome_sink&) {
    if (!is_live(c.worker)) return {commit_action::drop, 0.0};
    auto& e = w_[c.worker];
    if (e.has_sequence && c.sequence <= e.last_sequence) return {commit_action::drop, 0.0};
    e.has_sequence = true;
    e.last_sequence = c.sequence;
    const double wt = (1.0 / static_cast<double>(live_)) * p_.staleness_weight(version_ - e.pulled_version);
    ++version_;
    return {commit_action::apply, wt};
  }
  pull_action on_pull(const pull_event& q, outcome_sink&) {
    if (is_live(q.worker)) w_[q.worker].pulled_version = version_;
    return pull_action::serve;
  }
  void on_metric(const metric_event& m, outcome_sink& out) {
    if (m.metric != p_.metric || !std::isfinite(m.value)) return;
    const std::uint32_t before = rate_;
    if (searching_) search_step(m.time, m.value);
    else exploit_step(m.time, m.value);
    if (rate_ != before) out.all_plans_changed();
  }
  void on_join(const membership_event& j, outcome_sink& out) {
    if (is_live(j.worker)) return;
    grow(std::size_t{j.worker} + 1);
    w_[j.worker] = entry{};
    w_[j.worker].live = true;
    w_[j.worker].pulled_version = version_;
    ++live_;
    out.plan_changed(j.worker);
  }
  void on_evict(const membership_event& j, outcome_sink&) {
    if (!is_live(j.worker)) return;
    w_[j.worker].live = false;
    --live_;
  }
  void on_measurement(const measurement_event& x, outcome_sink& out) {
    if (!is_live(x.worker) || !std::isfinite(x.seconds) || x.seconds < 0.0) return;
    auto& e = w_[x.worker];
    const std::uint32_t before = interval_us(e.overhead);
    switch (x.kind) {
      case measurement_kind::commit: e.overhead = x.seconds; break;
      case measurement_kind::push: e.push = x.seconds; e.overhead = e.push + e.pull; break;
      case measurement_kind::pull: e.pull = x.seconds; e.overhead = e.push + e.pull; break;
      default: return;
    }
    if (interval_us(e.overhead) != before) out.plan_changed(x.worker);
  }
  void drain(outcome_sink&) {}  // nothing is ever buffered or held

  [[nodiscard]] worker_plan plan(worker_id w) const {
    worker_plan p;
    p.local_iterations = 0;  // commit by time
    p.commit_interval_us = interval_us(w < w_.size() ? w_[w].overhead : 0.0);
    p.stage = p_.stage;
    return p;
  }
  [[nodiscard]] stage_id stage() const noexcept { return p_.stage; }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return w < w_.size() && w_[w].live; }
  [[nodiscard]] bool is_held(worker_id) const noexcept { return false; }

  [[nodiscard]] const adsp_params& params() const noexcept { return p_; }
  [[nodiscard]] std::uint32_t commit_rate() const noexcept { return rate_; }  // ΔC in force
  [[nodiscard]] bool searching() const noexcept { return searching_; }
  [[nodiscard]] std::uint64_t searches_done() const noexcept { return searches_done_; }
  // τ of w's next commit: commits applied since its last served pull.
  [[nodiscard]] std::uint64_t staleness(worker_id w) const noexcept {
    return w < w_.size() ? version_ - w_[w].pulled_version : 0;
  }

  void save(state_writer& w) const {
    w.tag("ADSP", 1);
    put_fields(w, p_);
    w.put<std::uint64_t>(w_.size());
    for (const auto& e : w_) put_fields(w, e);
    put_fields(w, *this, search_fields());
  }
  status load(state_reader& r) {
    adsp n;
    std::uint64_t size = 0;
    ASHL_TRY(r.tag("ADSP", 1));
    ASHL_TRY(get_fields(r, n.p_, "adsp"));
    if (!n.p_.staleness_weight.valid())
      return malformed("adsp.staleness_weight", static_cast<unsigned>(n.p_.staleness_weight.mode), "must be 0, 1 or 2");
    if (!stage_id_table.contains(n.p_.stage))
      return malformed("adsp.stage", static_cast<std::uint32_t>(n.p_.stage), "not a stage id");
    ASHL_TRY(r.count(size, 2 + 5 * 8, "adsp.worker_count"));
    n.w_.resize(static_cast<std::size_t>(size));
    n.live_ = 0;
    for (auto& e : n.w_) {
      ASHL_TRY(get_fields(r, e, "adsp.worker"));
      n.live_ += e.live ? 1 : 0;
    }
    ASHL_TRY(get_fields(r, n, "adsp", search_fields()));
    if (n.rate_ == 0) return malformed("adsp.rate", n.rate_, "must be >= 1");
    *this = std::move(n);
    return {};
  }

 private:
  [[nodiscard]] std::uint32_t interval_us(double overhead) const noexcept {
    return worker_plan::interval_us(adsp_commit_interval(p_.period, rate_, overhead, p_.t_min));
  }
  void grow(std::size_t n) {
    if (n > w_.size()) w_.resize(n);
  }

  void start_search(point at) {
    searching_ = true;
    trial_ = std::max<std::uint32_t>(1, p_.initial_commit_rate);
    rate_ = trial_;
    best_ = trial_;
    best_reward_ = -std::numeric_limits<double>::infinity();
    first_trial_ = true;
    start_ = at;
    has_start_ = true;
    has_mid_ = false;
  }
  // A metric at t is at or past from + span. Within a microsecond counts:
  // metrics taken on a grid that divides the period (the simulator's ticks,
  // a real harness's evaluations stamped at their ticks) land exactly on
  // the boundary, and a tick converted between two clocks can come out a
  // rounding error short of it; a strict comparison would then wait one
  // more tick in one driver and not in the other.
  static constexpr double boundary_tolerance = 1e-6;  // seconds
  [[nodiscard]] static bool reached(double t, double from, double span) noexcept {
    return t >= from + span - boundary_tolerance;
  }
  void search_step(double t, double l) {
    if (!has_start_) {
      start_ = point{t, l};
      has_start_ = true;
      return;
    }
    if (!has_mid_) {
      if (reached(t, start_.t, 0.5 * p_.period)) {
        mid_ = point{t, l};
        has_mid_ = true;
      }
      return;
    }
    if (!reached(t, start_.t, p_.period)) return;
    const double r = commit_rate_reward(fit_loss_curve(start_.t, start_.l, mid_.t, mid_.l, t, l), p_.target_loss);
    const point end{t, l};
    if (first_trial_ || r > best_reward_) {
      best_ = trial_;
      best_reward_ = r;
      first_trial_ = false;
      if (trial_ < p_.max_commit_rate) {
        ++trial_;
        rate_ = trial_;
        start_ = end;
        has_mid_ = false;
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
    if (reached(t, search_end_, p_.search_every)) {
      start_search(point{t, l});
      return;
    }
    if (!reached(t, period_start_.t, p_.period)) return;
    const bool rose = l >= (1.0 + p_.loss_rise) * period_start_.l;
    if (rose) {
      start_search(point{t, l});
      return;
    }
    period_start_ = point{t, l};
  }

  adsp_params p_;
  std::vector<entry> w_;
  std::size_t live_ = 0;
  std::uint64_t version_ = 0;  // commits applied
  std::uint32_t rate_ = 1;
  // search state
  bool searching_ = true;
  bool first_trial_ = true;
  std::uint32_t trial_ = 1;
  std::uint32_t best_ = 1;
  double best_reward_ = -std::numeric_limits<double>::infinity();
  bool has_start_ = false, has_mid_ = false;
  point start_, mid_;
  std::uint64_t searches_done_ = 0;
  // exploitation state
  double search_end_ = 0.0;
  point period_start_;
};

static_assert(consistency_policy<adsp>);

}  // namespace sync
ASHL_NAMESPACE_END
