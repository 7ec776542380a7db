// ashl/sync/ashl_schedule.hpp — the ASHL schedule: profiling, then AHL
// (asynchronous, coarse), then SHL (semi-asynchronous, fine), built with
// staged.hpp and templated on a planner and a re-planner (sync/ashl_plan.hpp).
//
//   ashl::sync::ashl_schedule<> p{{.workers = 9, .profile_iterations = 50},
//                                 ashl::sync::uniform_planner{.h_ahl = 8, .h_shl = 2}};
//   ashl::sync::outcome_sink out(9);
//   // profiling: every commit applied with 1/M, plan = commit every iteration;
//   // then planner.plan(report) gives H_i, R_i, D_i; AHL applies D_i·Δ_i at once;
//   // a loss below 0.3 switches to SHL: SSP(3) over SHL commits, weights D_i.
//   p.stage();                                        // stage_id::profile, ahl, shl
//
// The planner is a value (ashl_planner): it receives every measurement of
// the profiling phase (trimming and warm-up skipping are its business) and
// the live workers. Models that use profile/ live in rules/planners.hpp. A
// planner error, or a plan that misses a live worker or has H = 0, a ratio
// outside (0, 1] or a negative share, is recorded (planner_status()) and the
// default uniform_planner{} plan is used instead, so training never stops on
// a bad plan. docs/algorithms.md §2.
//
// When profiling ends (by iterations): a worker has profiled once it made
// profile_iterations accepted commits and its compute measurement of each
// of those cycles has arrived. A worker measures a cycle's compute before
// its commit but sends the cycle's measurements when the cycle ends (after
// the reply: ps::worker_cycle), so at its N-th commit the server holds
// N - 1 of them (none with N = 1); the schedule waits for the N-th, checked
// at every commit and measurement. A worker whose measurements do not come
// counts as profiled at its (N + 1)-th commit, so profiling ends whatever a
// driver reports. Profiling by time (profile_seconds) ends at the first
// event past it.
//
// Re-planning ("ASHL+", ours): a Replanner with `enabled` is started once,
// right after a good first plan, from the profiling report and that plan; it
// then sees every measurement of the AHL and SHL phases and may write a new
// plan into a buffer the schedule keeps (so a measurement that changes
// nothing allocates nothing). A live worker the new plan does not cover (no
// entry, or a share of 0) keeps its entry. A new plan passes the same
// checks, replaces H_i, R_i and D_i from each worker's next cycle on, keeps
// the SSP counters and held pulls, and marks the workers whose plans changed
// (every plan when the shares' total moved); a rejected one is recorded
// (replan_status()) and the old plan stays.
//
// Membership after the plan (docs/elastic.md §2.4): the weights D_i are
// renormalised over the live workers at once (an eviction does not shrink
// the step; every data share changes); a worker that joins (a rank beyond
// the profiled set, or one evicted before) gets the mean share of the live
// workers, the smallest ratios of the plan in force and the default H while
// it is profiled. A join or an eviction opens a *re-profiling window*:
// training goes on under the plan in force (the stage policies, SSP counters
// and held pulls untouched), while the schedule counts each live worker's
// commits and keeps its measurements in its profile_report again, exactly as
// profiling does (profile_iterations commits and their compute
// measurements, max_profile_measurements per worker); a joiner counts from
// 0, the others from the window's opening. When every live worker has
// profiled in the window (or profile_seconds after it opened, when
// profiling is by time), the planner is run again over the live set
// (report.live) and its plan, if it passes the checks, replaces every
// H_i, R_i, D_i at once (every plan changed; membership_replans()); the
// re-planner, if any, is started again from it. A bad plan is recorded in
// replan_status() and the plan in force stays. A join or eviction while a
// window is open keeps it open (the joiner counts from 0; the others keep
// their counts). The live count, the live shares' total and the profiling
// progress (live workers that profiled, see below) are kept incrementally,
// so no event scans the workers; a new plan and the opening of a window
// cost O(M).
// The stage policies only decide apply / hold (their weights are 1); the
// schedule scales each applied commit by D_i / ΣD and builds the plans.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/ashl_plan.hpp>
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
#include <string>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

struct ashl_params {
  std::size_t workers = 0;
  std::uint32_t profile_iterations = 20;  // commits per live worker; 0: by time only
  double profile_seconds = 0.0;           // from the first event; 0: by iterations only
  switch_trigger to_shl{.loss_below = 0.3};
  std::uint32_t shl_staleness = 3;
  staleness_weighting ahl_staleness_weight{};
  // Measurements kept per worker while profiling (the planner's input); past
  // it a worker's measurements are dropped and counted
  // (ashl_schedule::measurements_dropped), so a worker that floods
  // measurements cannot grow the server's memory. A limit, not state: a
  // loaded schedule keeps its own. 0: no bound.
  std::uint32_t max_profile_measurements = 4096;
  friend bool operator==(const ashl_params&, const ashl_params&) = default;
};

template <ashl_planner Planner = uniform_planner, ashl_replanner Replanner = no_replanner>
class ashl_schedule {
 public:
  using policy_concept = policy_tag;
  using phases = staged<asp, ssp>;
  using planner_type = Planner;
  using replanner_type = Replanner;

  explicit ashl_schedule(ashl_params p, Planner planner = {}, Replanner replanner = {})
      : p_(p),
        planner_(std::move(planner)),
        replanner_(std::move(replanner)),
        profile_(asp_params{.workers = p.workers, .stage = stage_id::profile}),
        phases_({p.to_shl}, asp(asp_params{.workers = p.workers, .staleness_weight = p.ahl_staleness_weight,
                                           .stage = stage_id::ahl}),
                ssp(ssp_params{.workers = p.workers, .staleness = p.shl_staleness, .stage = stage_id::shl})),
        commits_(p.workers, 0),
        live_(p.workers, 1),
        nlive_(p.workers) {}

  commit_decision on_commit(const commit_event& c, outcome_sink& out) {
    if (planned_) {
      commit_decision d = phases_.on_commit(c, out);
      if (d.action == commit_action::apply) d.weight *= weight_of(c.worker);
      if (reprofiling_) {
        note_time(c.time);
        if (d.action != commit_action::drop) count_commit(c.worker);
        maybe_replan_membership(c.time, out);
      }
      return d;
    }
    note_time(c.time);
    commit_decision d = profile_.on_commit(c, out);
    if (d.action != commit_action::drop) {
      count_commit(c.worker);
      if (d.action == commit_action::apply) d.weight *= profile_scale();
    }
    maybe_plan(c.time, out);
    return d;
  }
  pull_action on_pull(const pull_event& q, outcome_sink& out) {
    if (planned_) return phases_.on_pull(q, out);
    note_time(q.time);
    const pull_action a = profile_.on_pull(q, out);
    maybe_plan(q.time, out);
    return a;
  }
  void on_metric(const metric_event& m, outcome_sink& out) {
    if (planned_) {
      phases_.on_metric(m, out);
      return;
    }
    note_time(m.time);
    maybe_plan(m.time, out);
  }
  void on_join(const membership_event& j, outcome_sink& out) {
    const worker_id w = j.worker;
    const bool fresh = !is_live(w);
    if (fresh) grow(std::size_t{w} + 1);
    if (planned_) {
      phases_.on_join(j, out);
      if (!fresh) return;
      if (w >= plan_.workers.size() || plan_.workers[w].share <= 0.0) adopt(w);
      open_window(j.time);
      live_[w] = 1;
      ++nlive_;
      commits_[w] = 0;  // profiled anew, from its first commit
      total_ += plan_.workers[w].share;
      out.all_plans_changed();  // every data share D_i / ΣD moved
      return;
    }
    profile_.on_join(j, out);
    phases_.on_join(j, scratch_);
    scratch_.clear();
    if (!fresh) return;
    live_[w] = 1;
    ++nlive_;
    commits_[w] = 0;  // its compute samples stay: the report keeps its measurements
  }
  void on_evict(const membership_event& j, outcome_sink& out) {
    const worker_id w = j.worker;
    const bool was = is_live(w);
    if (was) {
      live_[w] = 0;
      --nlive_;
    }
    if (planned_) {
      phases_.on_evict(j, out);
      if (!was) return;
      if (w < plan_.workers.size()) total_ -= plan_.workers[w].share;
      out.all_plans_changed();
      if (reprofiling_ && profiled(w)) --reached_;
      open_window(j.time);
      maybe_replan_membership(j.time, out);  // the evicted worker may have been the last one waited for
      return;
    }
    if (was && profiled(w)) --reached_;
    profile_.on_evict(j, out);
    phases_.on_evict(j, scratch_);
    scratch_.clear();
    maybe_plan(j.time, out);
  }
  void on_measurement(const measurement_event& x, outcome_sink& out) {
    if (planned_) {
      phases_.on_measurement(x, out);
      if constexpr (Replanner::enabled) {
        if (replanning_) replan(x, out);
      }
      if (reprofiling_) keep(x, out);
      return;
    }
    keep(x, out);
  }

  // Measurements dropped while profiling: past ashl_params::max_profile_measurements
  // for their worker. Not saved (a count of this process's refusals).
  [[nodiscard]] std::uint64_t measurements_dropped() const noexcept { return dropped_; }
  void drain(outcome_sink& out) {
    if (planned_) phases_.drain(out);
    else profile_.drain(out);
  }

 private:
  // A measurement into the profile report (profiling, or a re-profiling window).
  void keep(const measurement_event& x, outcome_sink& out) {
    if (p_.max_profile_measurements != 0) {
      if (x.worker >= kept_.size()) kept_.resize(std::size_t{x.worker} + 1, 0);
      if (kept_[x.worker] >= p_.max_profile_measurements) {
        ++dropped_;
        return;
      }
      ++kept_[x.worker];
    }
    report_.measurements.push_back(x);
    if (x.kind == measurement_kind::compute) {
      if (x.worker >= samples_.size()) samples_.resize(std::size_t{x.worker} + 1, 0);
      const bool was = profiled(x.worker);
      ++samples_[x.worker];
      if (!was && profiled(x.worker) && is_live(x.worker)) {
        ++reached_;
        if (planned_) maybe_replan_membership(last_time_, out);
        else maybe_plan(last_time_, out);
      }
    }
  }
  void count_commit(worker_id w) {
    const bool was = profiled(w);
    ++commits_[w];
    if (!was && profiled(w) && is_live(w)) ++reached_;
  }

 public:

  [[nodiscard]] worker_plan plan(worker_id w) const {
    worker_plan p;
    p.stage = stage();
    if (!planned_ || w >= plan_.workers.size()) return p;
    const ashl_worker_plan& e = plan_.workers[w];
    const bool shl = phases_.stage_index() == 1;
    p.local_iterations = shl ? e.h_shl : e.h_ahl;
    p.batch_size = e.batch_size;
    p.data_share = static_cast<float>(share_of(w));
    p.compression_ratio = static_cast<float>(shl ? e.ratio_shl : e.ratio_ahl);
    return p;
  }
  [[nodiscard]] stage_id stage() const noexcept {
    if (!planned_) return stage_id::profile;
    return phases_.stage_index() == 0 ? stage_id::ahl : stage_id::shl;
  }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return w < live_.size() && live_[w] != 0; }
  [[nodiscard]] bool is_held(worker_id w) const {
    return planned_ ? phases_.is_held(w) : profile_.is_held(w);
  }

  [[nodiscard]] const ashl_params& params() const noexcept { return p_; }
  [[nodiscard]] const Planner& planner() const noexcept { return planner_; }
  [[nodiscard]] const Replanner& replanner() const noexcept { return replanner_; }
  [[nodiscard]] bool profiling() const noexcept { return !planned_; }
  [[nodiscard]] const status& planner_status() const noexcept { return planner_status_; }
  // The plan in force as the planner (or re-planner) made it; the applied
  // weights are its shares renormalised over the live workers.
  [[nodiscard]] const ashl_plan& current_plan() const noexcept { return plan_; }
  [[nodiscard]] const status& replan_status() const noexcept { return replan_status_; }
  // A re-profiling window is open (a join or an eviction after the plan; see the top).
  [[nodiscard]] bool reprofiling() const noexcept { return reprofiling_; }
  // Plans the planner made over the live set after a window and the schedule accepted.
  [[nodiscard]] std::uint64_t membership_replans() const noexcept { return membership_replans_; }
  // Accepted profiling commits of w: since the start, or since the window opened.
  [[nodiscard]] std::uint64_t profile_commits(worker_id w) const noexcept {
    return w < commits_.size() ? commits_[w] : 0;
  }
  // New plans the re-planner made and the schedule accepted.
  [[nodiscard]] std::size_t replans() const noexcept { return replans_; }
  // Time the SHL phase began (driver time); meaningful once stage() is shl.
  [[nodiscard]] double switched_at() const { return phases_.switched_at(1); }
  [[nodiscard]] std::size_t live_count() const noexcept { return nlive_; }

  void save(state_writer& w) const {
    w.tag("ASHL", 2);
    w.put<std::uint64_t>(p_.workers);
    w.put(p_.profile_iterations);
    w.put(p_.profile_seconds);
    p_.to_shl.save(w);
    w.put(p_.shl_staleness);
    put_fields(w, p_.ahl_staleness_weight);
    planner_.save(w);
    replanner_.save(w);
    profile_.save(w);
    phases_.save(w);
    w.put(planned_);
    w.put_vector(commits_);
    w.put_vector(live_);
    w.put(started_);
    w.put(report_.start_time);
    w.put(report_.end_time);
    w.put<std::uint64_t>(report_.measurements.size());
    for (const auto& m : report_.measurements) {
      w.put(m.worker);
      w.put(static_cast<std::uint8_t>(m.kind));
      w.put(m.seconds);
      w.put(m.amount);
      w.put(m.time);
    }
    w.put_vector(report_.live);
    save_status(w, planner_status_);
    save_plan(w, plan_);
    w.put(total_);
    w.put(min_ratio_ahl_);
    w.put(min_ratio_shl_);
    w.put(replanning_);
    save_status(w, replan_status_);
    w.put<std::uint64_t>(replans_);
    w.put(reprofiling_);  // version 2
    w.put(membership_replans_);
  }
  status load(state_reader& r) {
    ashl_schedule n = *this;
    std::uint64_t workers = 0, count = 0, replans = 0;
    std::uint32_t version = 0;
    ASHL_TRY(r.tag("ASHL", 1, 2, version));
    ASHL_TRY(r.get(workers, "ashl.workers"));
    n.p_.workers = static_cast<std::size_t>(workers);
    ASHL_TRY(r.get(n.p_.profile_iterations, "ashl.profile_iterations"));
    ASHL_TRY(r.get(n.p_.profile_seconds, "ashl.profile_seconds"));
    ASHL_TRY(n.p_.to_shl.load(r));
    ASHL_TRY(r.get(n.p_.shl_staleness, "ashl.shl_staleness"));
    ASHL_TRY(get_fields(r, n.p_.ahl_staleness_weight, "ashl.ahl_staleness_weight"));
    if (!n.p_.ahl_staleness_weight.valid())
      return malformed("ashl.ahl_staleness_weight", static_cast<unsigned>(n.p_.ahl_staleness_weight.mode),
                       "must be 0, 1 or 2");
    ASHL_TRY(n.planner_.load(r));
    ASHL_TRY(n.replanner_.load(r));
    ASHL_TRY(n.profile_.load(r));
    ASHL_TRY(n.phases_.load(r));
    ASHL_TRY(r.get(n.planned_, "ashl.planned"));
    ASHL_TRY(r.get_vector(n.commits_, "ashl.commits"));
    ASHL_TRY(r.get_vector(n.live_, "ashl.live"));
    if (n.live_.size() != n.commits_.size()) return malformed("ashl.live", n.live_.size(), "must match ashl.commits");
    ASHL_TRY(r.get(n.started_, "ashl.started"));
    ASHL_TRY(r.get(n.report_.start_time, "ashl.report.start_time"));
    ASHL_TRY(r.get(n.report_.end_time, "ashl.report.end_time"));
    ASHL_TRY(r.count(count, 4 + 1 + 3 * 8, "ashl.report.measurements"));
    n.report_.measurements.resize(static_cast<std::size_t>(count));
    for (auto& m : n.report_.measurements) {
      std::uint8_t kind = 0;
      ASHL_TRY(r.get(m.worker, "ashl.report.measurement.worker"));
      ASHL_TRY(r.get(kind, "ashl.report.measurement.kind"));
      if (kind >= measurement_kind_count) return malformed("ashl.report.measurement.kind", unsigned{kind}, "not a kind");
      m.kind = static_cast<measurement_kind>(kind);
      ASHL_TRY(r.get(m.seconds, "ashl.report.measurement.seconds"));
      ASHL_TRY(r.get(m.amount, "ashl.report.measurement.amount"));
      ASHL_TRY(r.get(m.time, "ashl.report.measurement.time"));
    }
    ASHL_TRY(r.get_vector(n.report_.live, "ashl.report.live"));
    n.kept_.clear();
    n.samples_.clear();
    for (const auto& m : n.report_.measurements) {
      if (m.worker >= n.kept_.size()) n.kept_.resize(std::size_t{m.worker} + 1, 0);
      ++n.kept_[m.worker];
      if (m.kind != measurement_kind::compute) continue;
      if (m.worker >= n.samples_.size()) n.samples_.resize(std::size_t{m.worker} + 1, 0);
      ++n.samples_[m.worker];
    }
    ASHL_TRY(load_status(r, n.planner_status_, "ashl.planner_status"));
    ASHL_TRY(load_plan(r, n.plan_));
    ASHL_TRY(r.get(n.total_, "ashl.total_share"));
    ASHL_TRY(r.get(n.min_ratio_ahl_, "ashl.min_ratio_ahl"));
    ASHL_TRY(r.get(n.min_ratio_shl_, "ashl.min_ratio_shl"));
    ASHL_TRY(r.get(n.replanning_, "ashl.replanning"));
    ASHL_TRY(load_status(r, n.replan_status_, "ashl.replan_status"));
    ASHL_TRY(r.get(replans, "ashl.replans"));
    n.replans_ = static_cast<std::size_t>(replans);
    n.reprofiling_ = false;  // version 1: no window (it had none)
    n.membership_replans_ = 0;
    if (version >= 2) {
      ASHL_TRY(r.get(n.reprofiling_, "ashl.reprofiling"));
      ASHL_TRY(r.get(n.membership_replans_, "ashl.membership_replans"));
      if (n.reprofiling_ && !n.planned_) return malformed("ashl.reprofiling", 1u, "a window opens only after the plan");
    }
    if (n.planned_) {
      // What install and adopt keep true: every live worker has a valid entry.
      if (status ok = n.check(n.plan_); !ok.ok()) return status(errc::malformed, ok.message());
      if (!(n.total_ >= 0.0) || !std::isfinite(n.total_)) return malformed("ashl.total_share", n.total_, "must be >= 0");
    }
    n.nlive_ = 0;
    n.reached_ = 0;
    for (std::size_t w = 0; w < n.live_.size(); ++w) {
      if (n.live_[w] == 0) continue;
      ++n.nlive_;
      if (n.profiled(static_cast<worker_id>(w))) ++n.reached_;
    }
    n.last_time_ = n.report_.start_time;
    *this = std::move(n);
    return {};
  }

 private:
  [[nodiscard]] double profile_scale() const noexcept {
    return p_.workers == 0 ? 0.0 : 1.0 / static_cast<double>(p_.workers);
  }
  [[nodiscard]] double share_of(worker_id w) const noexcept {
    if (w >= plan_.workers.size() || !(total_ > 0.0)) return 0.0;
    return plan_.workers[w].share / total_;
  }
  [[nodiscard]] double weight_of(worker_id w) const noexcept { return share_of(w); }

  void grow(std::size_t n) {
    if (n <= live_.size()) return;
    live_.resize(n, 0);
    commits_.resize(n, 0);
  }
  void note_time(double t) {
    if (!started_) {
      started_ = true;
      report_.start_time = t;
    }
    last_time_ = std::max(last_time_, t);
  }
  // Profiled (see the top): N accepted commits and the compute measurements
  // of their cycles, or N + 1 commits.
  [[nodiscard]] bool profiled(worker_id w) const noexcept {
    const std::uint64_t n = p_.profile_iterations;
    if (n == 0 || w >= commits_.size()) return false;
    const std::uint64_t c = commits_[w];
    return c > n || (c == n && w < samples_.size() && samples_[w] >= n);
  }
  [[nodiscard]] bool profile_done(double now) const {
    if (p_.profile_seconds > 0.0 && started_ && now - report_.start_time >= p_.profile_seconds) return true;
    if (p_.profile_iterations == 0) return false;
    return nlive_ > 0 && reached_ == nlive_;
  }
  // Scans the live workers: run for a new plan only.
  [[nodiscard]] status check(const ashl_plan& plan) const {
    for (worker_id w = 0; w < live_.size(); ++w) {
      if (live_[w] == 0) continue;
      if (w >= plan.workers.size())
        return out_of_range("ashl.plan.workers.size", plan.workers.size(), "misses a live worker");
      const auto& e = plan.workers[w];
      if (e.h_ahl == 0) return invalid_argument("ashl.plan.h_ahl", e.h_ahl, "must be >= 1");
      if (e.h_shl == 0) return invalid_argument("ashl.plan.h_shl", e.h_shl, "must be >= 1");
      if (!(e.ratio_ahl > 0.0 && e.ratio_ahl <= 1.0))
        return invalid_argument("ashl.plan.ratio_ahl", e.ratio_ahl, "must be in (0, 1]");
      if (!(e.ratio_shl > 0.0 && e.ratio_shl <= 1.0))
        return invalid_argument("ashl.plan.ratio_shl", e.ratio_shl, "must be in (0, 1]");
      if (!(e.share >= 0.0) || !std::isfinite(e.share))
        return invalid_argument("ashl.plan.share", e.share, "must be finite and >= 0");
    }
    return {};
  }
  // The live shares' total and the smallest ratios of `plan`, for the
  // weights and for joiners.
  struct summary {
    double total = 0.0;
    double ratio_ahl = 1.0;
    double ratio_shl = 1.0;
  };
  [[nodiscard]] summary summarise(const ashl_plan& plan) const {
    summary s;
    const std::size_t n = std::min(plan.workers.size(), live_.size());
    for (worker_id w = 0; w < n; ++w) {
      if (live_[w] == 0) continue;
      const auto& e = plan.workers[w];
      s.total += e.share;
      s.ratio_ahl = std::min(s.ratio_ahl, e.ratio_ahl);
      s.ratio_shl = std::min(s.ratio_shl, e.ratio_shl);
    }
    return s;
  }
  void install_summary(const summary& s) {
    total_ = s.total;
    min_ratio_ahl_ = s.ratio_ahl;
    min_ratio_shl_ = s.ratio_shl;
  }

  void maybe_plan(double now, outcome_sink& out) {
    if (planned_ || !profile_done(now)) return;
    report_.end_time = now;
    report_.live.clear();
    for (worker_id w = 0; w < live_.size(); ++w)
      if (live_[w] != 0) report_.live.push_back(w);
    result<ashl_plan> r = planner_.plan(report_);
    planner_status_ = r ? check(*r) : r.error();
    if (planner_status_.ok()) plan_ = std::move(*r);
    else plan_ = std::move(*uniform_planner{}.plan(report_));
    install_summary(summarise(plan_));
    planned_ = true;
    if constexpr (Replanner::enabled) {
      if (planner_status_.ok()) {
        status s = replanner_.start(report_, plan_);
        replanning_ = s.ok();
        if (!s.ok()) replan_status_ = std::move(s);
      }
    }
    report_.measurements.clear();
    report_.measurements.shrink_to_fit();
    kept_.clear();
    kept_.shrink_to_fit();
    samples_.clear();
    samples_.shrink_to_fit();
    profile_.drain(out);
    out.all_plans_changed();
  }

  // A join or an eviction after the plan: count every live worker's profiling
  // commits and keep the measurements from now on (a window already open
  // stays open, its counts kept). O(M), at a membership change only.
  void open_window(double now) {
    if (reprofiling_) return;
    reprofiling_ = true;
    std::fill(commits_.begin(), commits_.end(), std::uint64_t{0});
    report_.measurements.clear();
    kept_.clear();
    samples_.clear();
    reached_ = 0;
    report_.start_time = now;
    last_time_ = std::max(last_time_, now);
  }
  // The window closes when every live worker profiled in it: the planner
  // over the live set, adopted as a whole if it passes the checks.
  void maybe_replan_membership(double now, outcome_sink& out) {
    if (!reprofiling_) return;
    if (!profile_done(now)) return;  // by iterations, or profile_seconds from the window's opening
    report_.end_time = now;
    report_.live.clear();
    for (worker_id w = 0; w < live_.size(); ++w)
      if (live_[w] != 0) report_.live.push_back(w);
    result<ashl_plan> r = planner_.plan(report_);
    status ok = r ? check(*r) : r.error();
    if (ok.ok()) {
      plan_ = std::move(*r);
      install_summary(summarise(plan_));
      ++membership_replans_;
      replan_status_ = status{};
      out.all_plans_changed();
      if constexpr (Replanner::enabled) {
        status s = replanner_.start(report_, plan_);
        replanning_ = s.ok();
        if (!s.ok()) replan_status_ = std::move(s);
      }
    } else {
      replan_status_ = std::move(ok);  // the plan in force stays
    }
    reprofiling_ = false;
    report_.measurements.clear();
    report_.measurements.shrink_to_fit();
    kept_.clear();
    kept_.shrink_to_fit();
    samples_.clear();
    samples_.shrink_to_fit();
  }

  // A worker the plan does not cover: the mean live share, the smallest
  // ratios of the plan, the default H. Called before w counts as live.
  void adopt(worker_id w) {
    if (w >= plan_.workers.size()) plan_.workers.resize(std::size_t{w} + 1, ashl_worker_plan{});
    auto& e = plan_.workers[w];
    e = ashl_worker_plan{};
    e.ratio_ahl = min_ratio_ahl_;
    e.ratio_shl = min_ratio_shl_;
    e.share = nlive_ == 0 ? 1.0 : total_ / static_cast<double>(nlive_);
  }

  void replan(const measurement_event& x, outcome_sink& out) {
    result<bool> r = replanner_.observe(x, next_);
    if (!r) {
      replan_status_ = r.error();
      return;
    }
    if (!*r) return;
    // Workers the new plan does not cover (no entry, or a share of 0: those
    // that joined after profiling) keep their entries. O(M), for a new plan only.
    if (next_.workers.size() < plan_.workers.size()) {
      const std::size_t old = next_.workers.size();
      next_.workers.resize(plan_.workers.size());
      for (std::size_t w = old; w < plan_.workers.size(); ++w) next_.workers[w] = plan_.workers[w];
    }
    for (worker_id w = 0; w < plan_.workers.size(); ++w)
      if (is_live(w) && !(next_.workers[w].share > 0.0) && plan_.workers[w].share > 0.0) next_.workers[w] = plan_.workers[w];
    status ok = check(next_);
    if (!ok.ok()) {
      replan_status_ = std::move(ok);
      return;
    }
    const summary s = summarise(next_);
    if (s.total != total_) {
      out.all_plans_changed();
    } else {
      const std::size_t n = std::max(next_.workers.size(), plan_.workers.size());
      for (worker_id w = 0; w < n; ++w) {
        const bool differs = w >= next_.workers.size() || w >= plan_.workers.size() ||
                             !(next_.workers[w] == plan_.workers[w]);
        if (differs) out.plan_changed(w);
      }
    }
    std::swap(plan_, next_);  // keeps both buffers: the next re-plan reuses the old one
    install_summary(s);
    ++replans_;
    replan_status_ = status{};
  }

  static void save_status(state_writer& w, const status& s) {
    w.put(static_cast<std::uint8_t>(s.code()));
    w.put_string(s.message());
  }
  static status load_status(state_reader& r, status& s, const char* field) {
    std::uint8_t code = 0;
    std::string msg;
    ASHL_TRY(r.get(code, field));
    if (code > static_cast<std::uint8_t>(errc::internal)) return malformed(field, unsigned{code}, "not an error code");
    ASHL_TRY(r.get_string(msg, field));
    s = code == 0 ? status{} : status(static_cast<errc>(code), std::move(msg));
    return {};
  }
  static void save_plan(state_writer& w, const ashl_plan& p) {
    w.put<std::uint64_t>(p.workers.size());
    for (const auto& e : p.workers) {
      w.put(e.h_ahl);
      w.put(e.h_shl);
      w.put(e.ratio_ahl);
      w.put(e.ratio_shl);
      w.put(e.share);
      w.put(e.batch_size);
    }
  }
  static status load_plan(state_reader& r, ashl_plan& p) {
    std::uint64_t n = 0;
    ASHL_TRY(r.count(n, 3 * 4 + 3 * 8, "ashl.plan.workers"));
    p.workers.resize(static_cast<std::size_t>(n));
    for (auto& e : p.workers) {
      ASHL_TRY(r.get(e.h_ahl, "ashl.plan.h_ahl"));
      ASHL_TRY(r.get(e.h_shl, "ashl.plan.h_shl"));
      ASHL_TRY(r.get(e.ratio_ahl, "ashl.plan.ratio_ahl"));
      ASHL_TRY(r.get(e.ratio_shl, "ashl.plan.ratio_shl"));
      ASHL_TRY(r.get(e.share, "ashl.plan.share"));
      ASHL_TRY(r.get(e.batch_size, "ashl.plan.batch_size"));
    }
    return {};
  }

  ashl_params p_;
  Planner planner_;
  Replanner replanner_;
  asp profile_;
  phases phases_;
  bool planned_ = false;
  std::vector<std::uint64_t> commits_;  // accepted profiling commits per worker
  std::vector<std::uint8_t> live_;
  std::size_t nlive_ = 0;
  std::size_t reached_ = 0;  // live workers that profiled()
  std::vector<std::uint64_t> samples_;  // per worker: compute measurements in report_ (rebuilt on load)
  double last_time_ = 0.0;  // the latest driver time of a commit, pull or metric while profiling
  bool started_ = false;
  profile_report report_;
  std::vector<std::uint32_t> kept_;  // per worker: measurements in report_ (rebuilt on load)
  std::uint64_t dropped_ = 0;
  status planner_status_;
  ashl_plan plan_;
  ashl_plan next_;  // the re-planner writes here; swapped with plan_ on success
  double total_ = 0.0;  // Σ D_i over live workers
  double min_ratio_ahl_ = 1.0, min_ratio_shl_ = 1.0;
  bool replanning_ = false;
  status replan_status_;
  std::size_t replans_ = 0;
  bool reprofiling_ = false;  // a re-profiling window is open (after the plan)
  std::uint64_t membership_replans_ = 0;
  outcome_sink scratch_;  // the AHL/SHL stages' answers during profiling; empty between events
};

static_assert(consistency_policy<ashl_schedule<>>);

}  // namespace sync
ASHL_NAMESPACE_END
