// ashl/sync/ashl.hpp — the ASHL schedule: profiling, then AHL (asynchronous,
// coarse), then SHL (semi-asynchronous, fine), built with staged.hpp.
//
//   ashl::sync::ashl_schedule p{{.workers = 9, .profile_iterations = 50,
//                                .planner = my_planner}};  // e.g. from ashl/profile
//   // profiling: every commit applied with 1/M, plan = commit every iteration;
//   // then planner(report) gives H_i, R_i, D_i; AHL applies D_i·Δ_i at once;
//   // a loss below 0.3 switches to SHL: SSP(3) over SHL commits, weights D_i.
//
// The planner is injected (std::function) so sync does not depend on
// profile: it receives every measurement of the profiling phase (trimming
// and warm-up skipping are its business) and the live workers. Without one,
// uniform_planner() is used (H₀, D_i = 1/M). A planner error, or a plan that
// misses a live worker or has H = 0, a ratio outside (0, 1] or a negative
// share, is recorded (planner_status()) and the uniform plan is used instead,
// so training never stops on a bad plan. ALGORITHMS.md §2.
//
// Re-planning ("ASHL+", ours): with a replanner factory the schedule builds,
// right after the first plan, an online replanner from the profiling report
// and that plan; it then sees every measurement of the AHL and SHL phases
// and may return a new plan (e.g. when a worker's measured times drifted).
// A new plan passes the same checks, replaces H_i, R_i and D_i from each
// worker's next cycle on, keeps the SSP counters and held pulls, and says
// plans_changed; a rejected one is recorded (replan_status()) and the old
// plan stays. sync/ashl_profile.hpp adapts profile::replanner.
//
// Membership after the plan: the weights D_i are renormalised over the live
// workers (an eviction does not shrink the step); a worker that joins later
// gets the mean share of the live workers, the smallest planned ratios and
// the default H until a re-plan covers it.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/asp.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/events.hpp>
#include <ashl/sync/ssp.hpp>
#include <ashl/sync/staged.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

struct ashl_worker_plan {
  std::uint32_t h_ahl = 8;   // H_i^AHL
  std::uint32_t h_shl = 2;   // H_i^SHL
  double ratio_ahl = 1.0;    // R_i^AHL in (0, 1]
  double ratio_shl = 1.0;    // R_i (SHL) in (0, 1]
  double share = 0.0;        // D_i: data share and aggregation weight
  std::uint32_t batch_size = 0;
};

struct ashl_plan {
  std::vector<ashl_worker_plan> workers;  // indexed by worker id
};

struct profile_report {
  std::vector<measurement_event> measurements;
  std::vector<worker_id> live;
  double start_time = 0.0;
  double end_time = 0.0;
};

using ashl_planner = std::function<result<ashl_plan>(const profile_report&)>;

// Sees one measurement of the AHL/SHL phases; a new plan, or none.
using ashl_replanner = std::function<result<std::optional<ashl_plan>>(const measurement_event&)>;
// Builds the replanner once, from the profiling report and the first plan.
using ashl_replanner_factory = std::function<result<ashl_replanner>(const profile_report&, const ashl_plan&)>;

// H_i = h_ahl / h_shl for all, R_i = ratio, D_i = 1/M over the live workers.
inline ashl_planner uniform_planner(std::uint32_t h_ahl = 8, std::uint32_t h_shl = 2, double ratio = 1.0) {
  return [=](const profile_report& r) -> result<ashl_plan> {
    ashl_plan p;
    std::size_t size = 0;
    for (auto w : r.live) size = std::max<std::size_t>(size, std::size_t{w} + 1);
    p.workers.resize(size);
    const double d = r.live.empty() ? 0.0 : 1.0 / static_cast<double>(r.live.size());
    for (auto w : r.live) p.workers[w] = {h_ahl, h_shl, ratio, ratio, d, 0};
    return p;
  };
}

struct ashl_params {
  std::size_t workers = 0;
  std::uint32_t profile_iterations = 20;  // commits per live worker; 0: by time only
  double profile_seconds = 0.0;           // from the first event; 0: by iterations only
  ashl_planner planner{};                 // empty: uniform_planner()
  switch_trigger to_shl{.loss_below = 0.3};
  std::uint32_t shl_staleness = 3;
  staleness_weighting ahl_staleness_weight{};
  ashl_replanner_factory replanner{};     // empty: plan once (the paper's ASHL)
};

class ashl_schedule {
 public:
  using policy_concept = policy_tag;
  using phases = staged<asp, ssp>;

  ashl_schedule() = default;
  explicit ashl_schedule(ashl_params p)
      : p_(std::move(p)),
        profile_(asp_params{.workers = p_.workers,
                            .scale = p_.workers == 0 ? 0.0 : 1.0 / static_cast<double>(p_.workers),
                            .stage = "profile"}),
        commits_(p_.workers, 0) {}

  commit_decision on_commit(const commit_event& c) {
    if (phases_) return phases_->on_commit(c);
    note_time(c.time);
    commit_decision d = profile_.on_commit(c);
    if (d.action != commit_action::drop) {
      if (c.worker >= commits_.size()) commits_.resize(std::size_t{c.worker} + 1, 0);
      ++commits_[c.worker];
    }
    d.effects.merge(maybe_plan(c.time));
    return d;
  }
  pull_decision on_pull(const pull_event& q) {
    if (phases_) return phases_->on_pull(q);
    note_time(q.time);
    pull_decision d = profile_.on_pull(q);
    d.effects.merge(maybe_plan(q.time));
    return d;
  }
  outcome on_metric(const metric_event& m) {
    if (phases_) return phases_->on_metric(m);
    note_time(m.time);
    return maybe_plan(m.time);
  }
  outcome on_join(const membership_event& j) {
    if (phases_) {
      outcome o = phases_->on_join(j);
      if (j.worker >= plan_.workers.size() || plan_.workers[j.worker].share <= 0.0) adopt(j.worker);
      o.merge(install());
      return o;
    }
    if (j.worker >= commits_.size()) commits_.resize(std::size_t{j.worker} + 1, 0);
    commits_[j.worker] = 0;
    return profile_.on_join(j);
  }
  outcome on_evict(const membership_event& j) {
    if (phases_) {
      outcome o = phases_->on_evict(j);
      o.merge(install());
      return o;
    }
    outcome o = profile_.on_evict(j);
    o.merge(maybe_plan(j.time));
    return o;
  }
  outcome on_measurement(const measurement_event& x) {
    if (phases_) {
      outcome o = phases_->on_measurement(x);
      if (replanner_) o.merge(replan(x));
      return o;
    }
    report_.measurements.push_back(x);
    return {};
  }
  outcome drain() { return phases_ ? phases_->drain() : profile_.drain(); }

  [[nodiscard]] worker_plan plan(worker_id w) const { return phases_ ? phases_->plan(w) : profile_.plan(w); }
  [[nodiscard]] std::string_view name() const { return phases_ ? phases_->name() : profile_.name(); }
  [[nodiscard]] bool is_live(worker_id w) const { return phases_ ? phases_->is_live(w) : profile_.is_live(w); }
  [[nodiscard]] bool is_held(worker_id w) const { return phases_ ? phases_->is_held(w) : profile_.is_held(w); }

  [[nodiscard]] bool profiling() const noexcept { return !phases_; }
  // "profile", "ahl" or "shl".
  [[nodiscard]] std::string_view phase() const { return name(); }
  [[nodiscard]] const status& planner_status() const noexcept { return planner_status_; }
  // The plan in force as the planner (or replanner) made it; the applied
  // weights are its shares renormalised over the live workers.
  [[nodiscard]] const ashl_plan& current_plan() const noexcept { return plan_; }
  [[nodiscard]] const status& replan_status() const noexcept { return replan_status_; }
  // New plans the replanner made and the schedule accepted.
  [[nodiscard]] std::size_t replans() const noexcept { return replans_; }

 private:
  void note_time(double t) {
    if (!started_) {
      started_ = true;
      report_.start_time = t;
    }
  }
  [[nodiscard]] bool profile_done(double now) const {
    if (p_.profile_seconds > 0.0 && started_ && now - report_.start_time >= p_.profile_seconds) return true;
    if (p_.profile_iterations == 0) return false;
    bool any = false;
    for (worker_id w = 0; w < commits_.size(); ++w) {
      if (!profile_.is_live(w)) continue;
      any = true;
      if (commits_[w] < p_.profile_iterations) return false;
    }
    return any;
  }
  [[nodiscard]] status check(const ashl_plan& plan, const std::vector<worker_id>& live) const {
    for (auto w : live) {
      if (w >= plan.workers.size()) return out_of_range("ashl.plan.workers.size", plan.workers.size(), "misses a live worker");
      const auto& e = plan.workers[w];
      if (e.h_ahl == 0) return invalid_argument("ashl.plan.h_ahl", e.h_ahl, "must be >= 1");
      if (e.h_shl == 0) return invalid_argument("ashl.plan.h_shl", e.h_shl, "must be >= 1");
      if (!(e.ratio_ahl > 0.0 && e.ratio_ahl <= 1.0)) return invalid_argument("ashl.plan.ratio_ahl", e.ratio_ahl, "must be in (0, 1]");
      if (!(e.ratio_shl > 0.0 && e.ratio_shl <= 1.0)) return invalid_argument("ashl.plan.ratio_shl", e.ratio_shl, "must be in (0, 1]");
      if (!(e.share >= 0.0) || !std::isfinite(e.share)) return invalid_argument("ashl.plan.share", e.share, "must be finite and >= 0");
    }
    return {};
  }
  outcome maybe_plan(double now) {
    if (phases_ || !profile_done(now)) return {};
    report_.end_time = now;
    report_.live.clear();
    std::size_t size = std::max(p_.workers, commits_.size());
    for (worker_id w = 0; w < size; ++w)
      if (profile_.is_live(w)) report_.live.push_back(w);
    const ashl_planner planner = p_.planner ? p_.planner : uniform_planner();
    result<ashl_plan> r = planner(report_);
    planner_status_ = r ? check(*r, report_.live) : r.error();
    plan_ = planner_status_.ok() ? std::move(*r) : *uniform_planner()(report_);
    size = std::max(size, plan_.workers.size());

    asp_params ahl{.workers = size, .scale = 0.0, .staleness_weight = p_.ahl_staleness_weight, .stage = "ahl"};
    ssp_params shl{.workers = size, .staleness = p_.shl_staleness, .scale = 0.0, .stage = "shl"};
    phases_.emplace(std::array<switch_trigger, 1>{p_.to_shl}, asp(std::move(ahl)), ssp(std::move(shl)));
    for (worker_id w = 0; w < size; ++w)
      if (!profile_.is_live(w)) (void)phases_->on_evict({w, now});
    (void)install();
    if (p_.replanner && planner_status_.ok()) {
      auto r = p_.replanner(report_, plan_);
      if (r) replanner_ = std::move(*r);
      else replan_status_ = r.error();
    }
    report_.measurements.clear();
    report_.measurements.shrink_to_fit();
    outcome o = profile_.drain();
    o.plans_changed = true;
    return o;
  }

  [[nodiscard]] std::vector<worker_id> live_workers() const {
    std::vector<worker_id> live;
    for (worker_id w = 0; w < plan_.workers.size(); ++w)
      if (phases_->is_live(w)) live.push_back(w);
    return live;
  }

  // A worker the plan does not cover: the mean live share, the smallest
  // planned ratios, the default H.
  void adopt(worker_id w) {
    double sum = 0.0, ra = 1.0, rs = 1.0;
    std::size_t n = 0;
    for (worker_id v = 0; v < plan_.workers.size(); ++v) {
      if (v == w || !phases_->is_live(v)) continue;
      const auto& e = plan_.workers[v];
      sum += e.share;
      ra = std::min(ra, e.ratio_ahl);
      rs = std::min(rs, e.ratio_shl);
      ++n;
    }
    if (w >= plan_.workers.size()) plan_.workers.resize(std::size_t{w} + 1, ashl_worker_plan{});
    auto& e = plan_.workers[w];
    e = ashl_worker_plan{};
    e.ratio_ahl = ra;
    e.ratio_shl = rs;
    e.share = n == 0 ? 1.0 : sum / static_cast<double>(n);
  }

  // Pushes plan_ into both stages; weights are the shares over the live
  // workers' total (so they sum to 1 whoever is live).
  outcome install() {
    double total = 0.0;
    for (worker_id w = 0; w < plan_.workers.size(); ++w)
      if (phases_->is_live(w)) total += plan_.workers[w].share;
    for (worker_id w = 0; w < plan_.workers.size(); ++w) {
      const ashl_worker_plan& e = plan_.workers[w];
      const double d = total > 0.0 ? e.share / total : 0.0;
      phases_->stage_policy<0>().set_plan(w, d, {e.h_ahl, 0.0, e.batch_size, d, e.ratio_ahl, "ahl"});
      phases_->stage_policy<1>().set_plan(w, d, {e.h_shl, 0.0, e.batch_size, d, e.ratio_shl, "shl"});
    }
    outcome o;
    o.plans_changed = true;
    return o;
  }

  outcome replan(const measurement_event& x) {
    result<std::optional<ashl_plan>> r = replanner_(x);
    if (!r) {
      replan_status_ = r.error();
      return {};
    }
    if (!*r) return {};
    // Entries the new plan lacks (workers that joined after profiling) keep theirs.
    ashl_plan next = std::move(**r);
    if (next.workers.size() < plan_.workers.size()) {
      const std::size_t old = next.workers.size();
      next.workers.resize(plan_.workers.size());
      for (std::size_t w = old; w < plan_.workers.size(); ++w) next.workers[w] = plan_.workers[w];
    }
    status ok = check(next, live_workers());
    if (!ok.ok()) {
      replan_status_ = std::move(ok);
      return {};
    }
    plan_ = std::move(next);
    ++replans_;
    replan_status_ = {};
    return install();
  }

  ashl_params p_;
  asp profile_;
  std::vector<std::uint64_t> commits_;
  bool started_ = false;
  profile_report report_;
  status planner_status_;
  ashl_plan plan_;
  std::optional<phases> phases_;
  ashl_replanner replanner_;
  status replan_status_;
  std::size_t replans_ = 0;
};

static_assert(consistency_policy<ashl_schedule>);

}  // namespace sync
ASHL_NAMESPACE_END
