// ashl/profile/replan.hpp — online re-planning ("ASHL+"): keep the timings a
// plan was made from, smooth new measurements with EWMA, and when any
// worker's smoothed time drifts more than a set fraction from those timings,
// re-run Algorithms 1 and 2. docs/algorithms.md §2 "Compression in ASHL" (ours).
//
//   auto r = ashl::profile::replanner::create({.h0 = 8, .r0 = 0.1, .drift = 0.2}, timings);
//   auto next = r->observe(worker, ashl::profile::timing_kind::iter, seconds);
//   if (next && *next) apply((*next)->workers(ashl::stage_id::ahl));  // a worker slowed down
//   r->save(writer);  auto back = ashl::profile::replanner::load(reader);  // the whole state
//
// Each EWMA starts at the planned value, so a single slow sample moves it by
// alpha only: a slowdown must persist for about a half-life to re-plan.
// A sample that re-plans nothing allocates nothing (after a straggler
// window's first use, with straggler re-planning on).
//
// Straggler re-planning (EP4DDL-like, off by default; docs/algorithms.md §3
// "Straggler detection"): with params.stragglers, every iteration time also
// goes to a profile::straggler_detector whose model of worker i is the plan's
// basis T_iter,i (the capability the plan was made from). A report (the
// window's median over T_iter,i · (1 + straggler_threshold) for
// straggler_consecutive windows of straggler_window samples) re-runs
// Algorithms 1 and 2 at once with that median as worker i's T_iter (its EWMA
// restarts there), so the new basis is the new capability and the worker is
// not flagged again for it; at most one re-plan per window per worker. Each
// re-plan, by drift or straggler, leaves a replan_record (last_replan()):
// the worker, the reason, what was measured and what the plan had predicted.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/enum_table.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/profile/estimators.hpp>
#include <ashl/profile/measurement.hpp>
#include <ashl/profile/planner.hpp>
#include <ashl/profile/straggler.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace profile {

enum class timing_kind : std::uint8_t { iter, push, pull };

// Algorithm 1 then Algorithm 2, and the timings they were computed from.
struct full_plan {
  std::vector<local_plan> local;   // H_i, D_i
  std::vector<double> ratio;       // R_i
  std::vector<worker_timing> basis;

  // The same plan per worker as ashl::worker_plan: H_i, D_i and R_i, in
  // stage `stage`; batch and commit interval stay at their defaults (ASHL
  // does not change them).
  [[nodiscard]] std::vector<worker_plan> workers(stage_id stage = stage_id::none) const {
    std::vector<worker_plan> out(local.size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      out[i].local_iterations = local[i].h;
      out[i].data_share = static_cast<float>(local[i].share);
      out[i].compression_ratio = static_cast<float>(ratio[i]);
      out[i].stage = stage;
    }
    return out;
  }
  friend bool operator==(const full_plan&, const full_plan&) = default;
};

inline result<full_plan> make_plan(const std::vector<worker_timing>& t, std::uint32_t h0, double t_compress,
                                   double r0) {
  auto local = plan_local_iterations(t, h0);
  if (!local) return local.error();
  std::vector<std::uint32_t> h;
  for (const auto& p : *local) h.push_back(p.h);
  auto ratio = plan_compression(t, h, t_compress, r0);
  if (!ratio) return ratio.error();
  return full_plan{std::move(*local), std::move(*ratio), t};
}

enum class replan_reason : std::uint8_t {
  none = 0,       // no re-plan yet
  drift = 1,      // a smoothed time drifted more than `drift` from the basis
  straggler = 2,  // the straggler detector flagged the worker
};
inline constexpr auto replan_reason_table = make_enum_table<replan_reason>("none", "drift", "straggler");
static_assert(replan_reason_table.name(replan_reason::straggler) == "straggler",
              "replan_reason_table ends where replan_reason does");
constexpr std::string_view to_string(replan_reason r) noexcept { return replan_reason_table.name(r); }

// Why the latest re-plan happened: which worker, and its measured time
// (drift: the EWMA that drifted; straggler: the window's median iteration
// time) against the time the plan in force had predicted (the basis).
struct replan_record {
  std::uint32_t worker = 0;
  replan_reason reason = replan_reason::none;
  timing_kind kind = timing_kind::iter;
  double measured = 0.0;
  double predicted = 0.0;
  friend bool operator==(const replan_record&, const replan_record&) = default;
};

class replanner {
 public:
  struct params {
    std::uint32_t h0 = 8;
    double t_compress = 0.0;
    double r0 = 0.1;
    double drift = 0.2;      // re-plan when |EWMA − basis| > drift · basis
    double half_life = 8.0;  // EWMA half-life, samples
    bool stragglers = false;                // straggler re-planning (see the header comment)
    std::uint32_t straggler_window = 8;     // iteration samples of one worker per window
    double straggler_threshold = 0.5;       // flagged above basis · (1 + threshold)
    std::uint32_t straggler_consecutive = 2;
    friend bool operator==(const params&, const params&) = default;
  };

  static result<replanner> create(params p, const std::vector<worker_timing>& timings) {
    ASHL_TRY(check(p));
    if (p.stragglers) {
      auto d = straggler_detector::create(detector_params(p, timings.empty() ? 1 : timings.size()));
      if (!d) return d.error();
    }
    auto plan = make_plan(timings, p.h0, p.t_compress, p.r0);
    if (!plan) return plan.error();
    replanner r(p, std::move(*plan));
    return r;
  }

  [[nodiscard]] const full_plan& plan() const noexcept { return plan_; }
  // Every re-plan, by drift or straggler.
  [[nodiscard]] std::size_t replans() const noexcept { return replans_; }
  // Re-plans a straggler report caused.
  [[nodiscard]] std::size_t straggler_replans() const noexcept { return straggler_replans_; }
  // The latest re-plan's worker and reason (reason none before the first).
  [[nodiscard]] const replan_record& last_replan() const noexcept { return last_; }
  // The straggler detector; null when straggler re-planning is off.
  [[nodiscard]] const straggler_detector* stragglers() const noexcept { return detector_ ? &*detector_ : nullptr; }

  // A measurement from the driver: compute, push and pull feed the EWMAs;
  // compress, commit and round are not part of the basis and change nothing.
  result<std::optional<full_plan>> observe(const measurement& m) {
    ASHL_TRY(validate(m));
    switch (m.kind) {
      case measurement_kind::compute: return observe(m.worker, timing_kind::iter, m.seconds);
      case measurement_kind::push: return observe(m.worker, timing_kind::push, m.seconds);
      case measurement_kind::pull: return observe(m.worker, timing_kind::pull, m.seconds);
      case measurement_kind::compress:
      case measurement_kind::commit:
      case measurement_kind::round: break;
    }
    if (m.worker >= smooth_.size()) return out_of_range("replan.worker", m.worker, "no such worker");
    return std::optional<full_plan>{};
  }

  // Feeds one measurement; a new plan when it made some worker drift.
  result<std::optional<full_plan>> observe(std::uint32_t worker, timing_kind kind, double seconds) {
    if (worker >= smooth_.size()) return out_of_range("replan.worker", worker, "no such worker");
    ASHL_TRY(smooth_[worker][static_cast<std::size_t>(kind)].add(seconds));
    // Only this worker's EWMA moved, and after the previous sample nobody
    // was off (or a re-plan reset every basis): checking it alone is enough,
    // and a sample that changes nothing allocates nothing.
    const auto k = static_cast<std::size_t>(kind);
    const auto& b = plan_.basis[worker];
    const double basis = kind == timing_kind::iter ? b.t_iter : kind == timing_kind::push ? b.t_push : b.t_pull;
    if (detector_ && kind == timing_kind::iter) {
      auto flag = detector_->record(worker, seconds, 0.0);
      if (!flag) return flag.error();
      if (*flag) {
        // The window's median is the worker's capability now: its EWMA
        // restarts there, so the new basis does not drift off it at once.
        const straggler_report& r = **flag;
        ewma fresh(p_.half_life);
        ASHL_TRY(fresh.add(r.time));
        smooth_[worker][k] = fresh;
        return replan({worker, replan_reason::straggler, kind, r.time, basis});
      }
    }
    const double now = *smooth_[worker][k].value();
    if (!off(now, basis)) return std::optional<full_plan>{};
    return replan({worker, replan_reason::drift, kind, now, basis});
  }

 [[nodiscard]] const params& parameters() const noexcept { return p_; }

 private:
  // The saved fields (core/fields.hpp), in their order: the parameters; per
  // worker its plan (the ratio between) and its basis; the last re-plan
  // (its enums as their u8 values).
  static constexpr auto saved_params() {
    return std::tuple{field{"h0", &params::h0},
                      field{"t_compress", &params::t_compress},
                      field{"r0", &params::r0},
                      field{"drift", &params::drift},
                      field{"half_life", &params::half_life},
                      field{"stragglers", &params::stragglers},
                      field{"straggler_window", &params::straggler_window},
                      field{"straggler_threshold", &params::straggler_threshold},
                      field{"straggler_consecutive", &params::straggler_consecutive}};
  }
  static constexpr auto saved_local() {
    return std::tuple{field{"h", &local_plan::h}, field{"share", &local_plan::share}};
  }
  static constexpr auto saved_basis() {
    return std::tuple{field{"t_iter", &worker_timing::t_iter}, field{"t_push", &worker_timing::t_push},
                      field{"t_pull", &worker_timing::t_pull}};
  }
  static constexpr auto saved_last() {
    return std::tuple{field{"worker", &replan_record::worker}, field{"reason", &replan_record::reason},
                      field{"kind", &replan_record::kind}, field{"measured", &replan_record::measured},
                      field{"predicted", &replan_record::predicted}};
  }

 public:
  // The whole state: parameters, the current plan and its basis, every EWMA
  // and the re-plan count; load() of it gives a replanner that decides as
  // this one would.
  void save(state_writer& w) const {
    w.tag("RPLN", 2);
    put_fields(w, p_, saved_params());
    w.put<std::uint64_t>(plan_.local.size());
    for (std::size_t i = 0; i < plan_.local.size(); ++i) {
      put_fields(w, plan_.local[i], saved_local());
      w.put(plan_.ratio[i]);
      put_fields(w, plan_.basis[i], saved_basis());
      for (const auto& e : smooth_[i]) e.save(w);
    }
    w.put<std::uint64_t>(replans_);
    w.put<std::uint64_t>(straggler_replans_);
    put_fields(w, last_, saved_last());
    if (detector_) detector_->save(w);
  }
  static result<replanner> load(state_reader& r) {
    ASHL_TRY(r.tag("RPLN", 2));
    params p;
    ASHL_TRY(get_fields(r, p, "replan", saved_params()));
    ASHL_TRY(check(p));
    if (p.h0 == 0) return make_error(errc::malformed, "replan.h0", p.h0, "must be >= 1");
    if (!(p.r0 > 0.0 && p.r0 <= 1.0)) return make_error(errc::malformed, "replan.r0", p.r0, "must be in (0, 1]");
    if (!(std::isfinite(p.t_compress) && p.t_compress >= 0.0))
      return make_error(errc::malformed, "replan.t_compress", p.t_compress, "must be finite and >= 0");
    std::uint64_t n = 0;
    // Per worker: u32 + 5 f64 + 3 ewma of 24 bytes.
    ASHL_TRY(r.count(n, 4 + 5 * 8 + 3 * 24, "replan.workers"));
    if (n == 0) return make_error(errc::malformed, "replan.workers", n, "a plan has at least one worker");
    full_plan plan;
    plan.local.resize(static_cast<std::size_t>(n));
    plan.ratio.resize(plan.local.size());
    plan.basis.resize(plan.local.size());
    std::vector<std::array<ewma, 3>> smooth(plan.local.size());
    for (std::size_t i = 0; i < plan.local.size(); ++i) {
      ASHL_TRY(get_fields(r, plan.local[i], "replan.plan", saved_local()));
      ASHL_TRY(r.get(plan.ratio[i], "replan.plan.ratio"));
      ASHL_TRY(get_fields(r, plan.basis[i], "replan.basis", saved_basis()));
      for (auto& e : smooth[i]) ASHL_TRY(e.load(r));
      for (const auto& e : smooth[i])
        if (e.count() == 0) return make_error(errc::malformed, "replan.ewma.count", 0, "a seeded EWMA has samples");
    }
    ASHL_TRY(detail::check_timings(plan.basis));
    std::uint64_t replans = 0, stragglers = 0;
    ASHL_TRY(r.get(replans, "replan.replans"));
    ASHL_TRY(r.get(stragglers, "replan.straggler_replans"));
    if (stragglers > replans) return make_error(errc::malformed, "replan.straggler_replans", stragglers, "above replans");
    replan_record last;
    ASHL_TRY(get_fields(r, last, "replan.last", saved_last()));
    const auto reason = static_cast<std::uint8_t>(last.reason), kind = static_cast<std::uint8_t>(last.kind);
    if (reason > 2) return make_error(errc::malformed, "replan.last.reason", unsigned{reason}, "unknown reason");
    if (kind > 2) return make_error(errc::malformed, "replan.last.kind", unsigned{kind}, "unknown timing kind");
    replanner out(p, std::move(plan));
    out.smooth_ = std::move(smooth);
    out.replans_ = static_cast<std::size_t>(replans);
    out.straggler_replans_ = static_cast<std::size_t>(stragglers);
    out.last_ = last;
    if (p.stragglers) {
      auto d = straggler_detector::load(r);
      if (!d) return d.error();
      if (d->workers() != out.smooth_.size() || !(d->parameters() == detector_params(p, out.smooth_.size())))
        return make_error(errc::malformed, "replan.stragglers.workers", d->workers(), "must match the plan");
      out.detector_ = std::move(*d);
    }
    return out;
  }
  friend bool operator==(const replanner&, const replanner&) = default;

 private:
  static status check(const params& p) {
    if (!(std::isfinite(p.drift) && p.drift > 0.0)) {
      return invalid_argument("replan.drift", p.drift, "must be finite and > 0");
    }
    if (!(std::isfinite(p.half_life) && p.half_life > 0.0)) {
      return invalid_argument("replan.half_life", p.half_life, "must be finite and > 0");
    }
    return {};
  }
  static straggler_detector::params detector_params(const params& p, std::size_t workers) {
    return {.workers = static_cast<std::uint32_t>(workers), .window = p.straggler_window,
            .threshold = p.straggler_threshold, .consecutive = p.straggler_consecutive};
  }

  replanner(params p, full_plan plan) : p_(p), plan_(std::move(plan)) {
    for (const auto& t : plan_.basis) {
      std::array<ewma, 3> e{ewma(p_.half_life), ewma(p_.half_life), ewma(p_.half_life)};
      // Seeded with the planned (already validated) values.
      (void)e[0].add(t.t_iter);
      (void)e[1].add(t.t_push);
      (void)e[2].add(t.t_pull);
      smooth_.push_back(e);
    }
    if (p_.stragglers) {
      detector_.emplace(detector_params(p_, plan_.basis.size()));
      predict();
    }
  }
  // The detector's model of each worker: the basis iteration time, whatever
  // the batch (the basis has no batch dimension).
  void predict() {
    for (std::uint32_t w = 0; w < plan_.basis.size(); ++w) (void)detector_->set_model(w, {plan_.basis[w].t_iter, 0.0});
  }
  // Algorithms 1 and 2 from every smoothed time; the record says why.
  result<std::optional<full_plan>> replan(const replan_record& why) {
    std::vector<worker_timing> now(smooth_.size());
    for (std::size_t w = 0; w < smooth_.size(); ++w)
      now[w] = {*smooth_[w][0].value(), *smooth_[w][1].value(), *smooth_[w][2].value()};
    auto next = make_plan(now, p_.h0, p_.t_compress, p_.r0);
    if (!next) return next.error();
    plan_ = std::move(*next);
    ++replans_;
    if (why.reason == replan_reason::straggler) ++straggler_replans_;
    last_ = why;
    if (detector_) predict();
    return std::optional<full_plan>{plan_};
  }
  [[nodiscard]] bool off(double now, double basis) const noexcept {
    return std::fabs(now - basis) > p_.drift * basis;
  }

  params p_;
  full_plan plan_;
  std::vector<std::array<ewma, 3>> smooth_;
  std::size_t replans_ = 0;
  std::size_t straggler_replans_ = 0;
  replan_record last_;
  std::optional<straggler_detector> detector_;  // with params.stragglers only
};

}  // namespace profile
ASHL_NAMESPACE_END
