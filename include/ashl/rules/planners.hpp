// ashl/rules/planners.hpp — ASHL's planner and re-planner made of profile/'s
// algorithms, as models of sync/ashl_plan.hpp's concepts (ps composes sync
// and profile; neither includes the other).
//
//   ashl::ps::profile_planner planner{.h_ahl = 8, .h_shl = 2, .r0 = 0.1, .trim = 20};
//   ashl::sync::ashl_schedule<ashl::ps::profile_planner> s{{.workers = 4, .profile_iterations = 50}, planner};
//
//   // ASHL+: re-plan when a worker's smoothed times drift by more than 20 %.
//   ashl::sync::ashl_schedule<ashl::ps::profile_planner, ashl::ps::profile_replanner> t{
//       {.workers = 4}, planner, ashl::ps::profile_replanner(planner, {.drift = 0.2})};
//
// profile_planner: profile::summarize over the live workers (robust means of
// compute, push and pull; warm-up skip and trim reduced when few samples;
// T_compress from every compress sample), then Algorithms 1 and 2 once with
// H₀ = h_ahl and once with H₀ = h_shl; D_i is the AHL plan's share.
// docs/algorithms.md §2 "Phase 0".
//
// profile_replanner (ASHL+, ours): a profile::replanner over the profiled
// timings (Algorithm 1 at h_ahl), fed every compute, push and pull
// measurement after the first plan; when a worker's smoothed time drifts,
// both phases are planned again into the caller's buffer. A push of a
// compressed commit is scaled to the dense size it stands for (mean bytes of
// a profiling push / bytes sent: the link is taken to be bandwidth-bound, as
// Algorithm 2 takes it); a measurement of a worker the profile did not cover
// is ignored. Both are plain values: state by value, no shared state, and
// save/load of everything (EWMAs included). With straggler re-planning on
// (profile_replanner_params::stragglers), a worker flagged by
// profile::straggler_detector against its own planned T_iter re-plans both
// phases at once (profile/replan.hpp); state()->last_replan() says which
// worker and why.
//
// straggler_monitor: profile::straggler_detector as sync::basic_dlb's
// straggler monitor (sync/dlb.hpp): worker i's model is compute seconds =
// (planned seconds per sample) · batch.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/profile/planner.hpp>
#include <ashl/profile/replan.hpp>
#include <ashl/profile/straggler.hpp>
#include <ashl/sync/ashl_plan.hpp>
#include <ashl/sync/dlb.hpp>
#include <ashl/sync/events.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

// Algorithms 1 and 2 for both ASHL phases from the profiling measurements.
struct profile_planner {
  std::uint32_t h_ahl = 8;  // H₀ of the AHL phase
  std::uint32_t h_shl = 2;  // H₀ of the SHL phase
  double r0 = 0.1;          // the slowest round's compression ratio
  std::size_t trim = 20;    // largest and smallest samples dropped per worker and kind
  std::size_t warmup = 0;   // first samples skipped per worker and kind

  [[nodiscard]] profile::summary_params summary() const noexcept { return {.trim = trim, .warmup = warmup}; }

  // Both phases' plans from per-live-worker timings, written into `out`
  // (indexed by worker id; its storage is reused).
  status plans_from(std::span<const sync::worker_id> live, const std::vector<profile::worker_timing>& t,
                    double t_compress, sync::ashl_plan& out) const {
    auto ahl = profile::make_plan(t, h_ahl, t_compress, r0);
    if (!ahl) return ahl.error();
    auto shl = profile::make_plan(t, h_shl, t_compress, r0);
    if (!shl) return shl.error();
    std::size_t size = 0;
    for (auto w : live) size = std::max<std::size_t>(size, std::size_t{w} + 1);
    out.workers.assign(size, sync::ashl_worker_plan{});
    for (std::size_t i = 0; i < live.size(); ++i) {
      out.workers[live[i]] = {ahl->local[i].h, shl->local[i].h, ahl->ratio[i], shl->ratio[i], ahl->local[i].share, 0};
    }
    return {};
  }

  [[nodiscard]] result<sync::ashl_plan> plan(const sync::profile_report& r) const {
    auto s = profile::summarize(r.measurements, r.live, summary());
    if (!s) return s.error();
    sync::ashl_plan out;
    ASHL_TRY(plans_from(s->live, s->timing, s->t_compress, out));
    return out;
  }

  // The saved fields before trim and warmup (core/fields.hpp; those two as u64).
  static constexpr auto saved() {
    return std::tuple{field{"h_ahl", &profile_planner::h_ahl}, field{"h_shl", &profile_planner::h_shl},
                      field{"r0", &profile_planner::r0}};
  }

  void save(state_writer& w) const {
    w.tag("PPLN", 1);
    put_fields(w, *this, saved());
    w.put<std::uint64_t>(trim);
    w.put<std::uint64_t>(warmup);
  }
  status load(state_reader& r) {
    profile_planner next;
    std::uint64_t t = 0, wu = 0;
    ASHL_TRY(r.tag("PPLN", 1));
    ASHL_TRY(get_fields(r, next, "profile_planner", saved()));
    ASHL_TRY(r.get(t, "profile_planner.trim"));
    ASHL_TRY(r.get(wu, "profile_planner.warmup"));
    next.trim = static_cast<std::size_t>(t);
    next.warmup = static_cast<std::size_t>(wu);
    *this = next;
    return {};
  }
  friend bool operator==(const profile_planner&, const profile_planner&) = default;
};
static_assert(sync::ashl_planner<profile_planner>);

struct profile_replanner_params {
  double drift = 0.2;      // re-plan when a smoothed time is off its planned value by more than this fraction
  double half_life = 8.0;  // EWMA half-life, in samples of one kind of one worker
  bool stragglers = false;                  // re-plan when a worker is flagged against its own T_iter
  std::uint32_t straggler_window = 8;       // iteration samples of one worker per window
  double straggler_threshold = 0.5;         // flagged above T_iter · (1 + threshold)
  std::uint32_t straggler_consecutive = 2;  // windows over the line before a flag
  friend bool operator==(const profile_replanner_params&, const profile_replanner_params&) = default;

  // Every field, in the order a state saves them (core/fields.hpp).
  static constexpr auto fields() {
    return std::tuple{field{"drift", &profile_replanner_params::drift},
                      field{"half_life", &profile_replanner_params::half_life},
                      field{"stragglers", &profile_replanner_params::stragglers},
                      field{"straggler_window", &profile_replanner_params::straggler_window},
                      field{"straggler_threshold", &profile_replanner_params::straggler_threshold},
                      field{"straggler_consecutive", &profile_replanner_params::straggler_consecutive}};
  }
};

// ASHL+'s online re-planner (see the header comment).
class profile_replanner {
 public:
  static constexpr bool enabled = true;

  profile_replanner() = default;
  explicit profile_replanner(profile_planner planner, profile_replanner_params q = {}) : p_(planner), q_(q) {}

  [[nodiscard]] const profile_planner& planner() const noexcept { return p_; }
  [[nodiscard]] const profile_replanner_params& parameters() const noexcept { return q_; }
  [[nodiscard]] bool started() const noexcept { return r_.has_value(); }
  // The profile::replanner (its plan, basis and re-plan count); null before start().
  [[nodiscard]] const profile::replanner* state() const noexcept { return r_ ? &*r_ : nullptr; }

  // From the profiling report (the first plan was made from it too). On an
  // error nothing changes.
  status start(const sync::profile_report& rep, const sync::ashl_plan&) {
    auto s = profile::summarize(rep.measurements, rep.live, p_.summary());
    if (!s) return s.error();
    auto rp = profile::replanner::create({.h0 = p_.h_ahl, .t_compress = s->t_compress, .r0 = p_.r0,
                                          .drift = q_.drift, .half_life = q_.half_life,
                                          .stragglers = q_.stragglers, .straggler_window = q_.straggler_window,
                                          .straggler_threshold = q_.straggler_threshold,
                                          .straggler_consecutive = q_.straggler_consecutive},
                                         s->timing);
    if (!rp) return rp.error();
    r_ = std::move(*rp);
    live_ = std::move(s->live);
    push_bytes_ = std::move(s->push_bytes);
    t_compress_ = s->t_compress;
    build_index();
    return {};
  }

  // True when `x` made a worker drift and `next` holds the new plan of both
  // phases. A measurement that moves nothing allocates nothing.
  result<bool> observe(const sync::measurement_event& x, sync::ashl_plan& next) {
    if (!r_) return false;
    const std::size_t i = position(x.worker);
    if (i == npos) return false;
    const auto k = static_cast<std::uint32_t>(i);
    result<std::optional<profile::full_plan>> moved = std::optional<profile::full_plan>{};
    switch (x.kind) {
      case measurement_kind::compute: moved = r_->observe(k, profile::timing_kind::iter, x.seconds); break;
      case measurement_kind::push: {
        const double dense = push_bytes_[i];
        const double scale = dense > 0.0 && x.amount > 0.0 ? dense / x.amount : 1.0;
        moved = r_->observe(k, profile::timing_kind::push, x.seconds * scale);
        break;
      }
      case measurement_kind::pull: moved = r_->observe(k, profile::timing_kind::pull, x.seconds); break;
      case measurement_kind::compress:
      case measurement_kind::commit:
      case measurement_kind::round: break;
    }
    if (!moved) return moved.error();
    if (!moved->has_value()) return false;
    ASHL_TRY(p_.plans_from(live_, r_->plan().basis, t_compress_, next));
    return true;
  }

  void save(state_writer& w) const {
    w.tag("PRPL", 2);
    p_.save(w);
    put_fields(w, q_);
    w.put(r_.has_value());
    if (!r_) return;
    r_->save(w);
    w.put_vector(live_);
    w.put_vector(push_bytes_);
    w.put(t_compress_);
  }
  status load(state_reader& r) {
    profile_replanner next;
    ASHL_TRY(r.tag("PRPL", 2));
    ASHL_TRY(next.p_.load(r));
    ASHL_TRY(get_fields(r, next.q_, "profile_replanner"));
    bool has = false;
    ASHL_TRY(r.get(has, "profile_replanner.started"));
    if (has) {
      auto rp = profile::replanner::load(r);
      if (!rp) return rp.error();
      next.r_ = std::move(*rp);
      ASHL_TRY(r.get_vector(next.live_, "profile_replanner.live"));
      ASHL_TRY(r.get_vector(next.push_bytes_, "profile_replanner.push_bytes"));
      ASHL_TRY(r.get(next.t_compress_, "profile_replanner.t_compress"));
      const std::size_t n = next.r_->plan().basis.size();
      if (next.live_.size() != n)
        return make_error(errc::malformed, "profile_replanner.live.size", next.live_.size(),
                          "must equal the re-planner's " + std::to_string(n) + " workers");
      if (next.push_bytes_.size() != n)
        return make_error(errc::malformed, "profile_replanner.push_bytes.size", next.push_bytes_.size(),
                          "must equal the re-planner's " + std::to_string(n) + " workers");
      for (double b : next.push_bytes_)
        if (!(std::isfinite(b) && b >= 0.0))
          return make_error(errc::malformed, "profile_replanner.push_bytes", b, "must be finite and >= 0");
      if (!(std::isfinite(next.t_compress_) && next.t_compress_ >= 0.0))
        return make_error(errc::malformed, "profile_replanner.t_compress", next.t_compress_, "must be finite and >= 0");
      next.build_index();
      for (std::size_t i = 1; i < next.index_.size(); ++i)
        if (next.index_[i].first == next.index_[i - 1].first)
          return make_error(errc::malformed, "profile_replanner.live", next.index_[i].first, "listed twice");
    }
    *this = std::move(next);
    return {};
  }
  friend bool operator==(const profile_replanner& a, const profile_replanner& b) {
    return a.p_ == b.p_ && a.q_ == b.q_ && a.r_ == b.r_ && a.live_ == b.live_ && a.push_bytes_ == b.push_bytes_ &&
           a.t_compress_ == b.t_compress_;
  }

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  // Sorted (id, position) pairs rather than a table indexed by id, so a
  // loaded state cannot make the table as large as its largest id.
  void build_index() {
    index_.clear();
    index_.reserve(live_.size());
    for (std::size_t i = 0; i < live_.size(); ++i) index_.emplace_back(live_[i], i);
    std::sort(index_.begin(), index_.end());
  }
  [[nodiscard]] std::size_t position(sync::worker_id w) const noexcept {
    auto it = std::lower_bound(index_.begin(), index_.end(), std::pair<sync::worker_id, std::size_t>{w, 0});
    return it != index_.end() && it->first == w ? it->second : npos;
  }

  profile_planner p_{};
  profile_replanner_params q_{};
  std::optional<profile::replanner> r_;
  std::vector<sync::worker_id> live_;   // the profiled workers, by position in the re-planner
  std::vector<double> push_bytes_;      // mean bytes of a profiling push, by position
  double t_compress_ = 0.0;
  std::vector<std::pair<sync::worker_id, std::size_t>> index_;  // (id, position), sorted; derived from live_
};
static_assert(sync::ashl_replanner<profile_replanner>);

// profile::straggler_detector as basic_dlb's straggler monitor (see the
// header comment). Construct it with the detector's parameters; workers that
// join later grow its table at their first prediction.
class straggler_monitor {
 public:
  static constexpr bool enabled = true;

  straggler_monitor() = default;
  explicit straggler_monitor(profile::straggler_detector::params p) : d_(p) {}
  static result<straggler_monitor> create(profile::straggler_detector::params p) {
    auto d = profile::straggler_detector::create(p);
    if (!d) return d.error();
    return straggler_monitor(p);
  }

  [[nodiscard]] const profile::straggler_detector& detector() const noexcept { return d_; }

  void predict(sync::worker_id w, double seconds_per_sample) {
    (void)d_.set_model(w, {0.0, seconds_per_sample});  // refused (ignored) unless finite and > 0
  }
  std::optional<sync::straggler_flag> observe(sync::worker_id w, double seconds, double batch) {
    if (w >= d_.workers() || !(batch > 0.0)) return std::nullopt;
    auto r = d_.record(w, seconds, batch);
    if (!r || !r->has_value()) return std::nullopt;  // a bad sample is the policy's to ignore, as its EWMA does
    const profile::straggler_report& f = **r;
    return sync::straggler_flag{w, f.ratio * d_.model(w).b, d_.model(w).b, f.windows};
  }
  void save(state_writer& w) const { d_.save(w); }
  status load(state_reader& r) {
    auto d = profile::straggler_detector::load(r);
    if (!d) return d.error();
    d_ = std::move(*d);
    return {};
  }
  friend bool operator==(const straggler_monitor&, const straggler_monitor&) = default;

 private:
  profile::straggler_detector d_;
};
static_assert(sync::dlb_straggler_monitor<straggler_monitor>);

}  // namespace ps
ASHL_NAMESPACE_END
