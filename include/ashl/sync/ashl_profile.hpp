// ashl/sync/ashl_profile.hpp — adapts the profile/ planners to the
// ashl_schedule planner callable (profile/ does not depend on sync/).
//
//   ashl::sync::ashl_schedule p{{.workers = 4, .profile_iterations = 50,
//                                .planner = ashl::sync::profile_planner({.r0 = 0.1})}};
//
// Per live worker: robust mean of its compute, push and pull measurements
// (warm-up skipped, trim largest/smallest, both reduced when few samples);
// T_compress from all workers' compress samples (0 if none). Algorithm 1 and
// 2 run once with h_ahl and once with h_shl; D_i is the AHL plan's share.
// ALGORITHMS.md §2 "Phase 0".
//
//   // ASHL+: re-plan when a worker's smoothed times drift by more than 20 %.
//   ashl::sync::ashl_schedule q{{.workers = 4, .planner = ashl::sync::profile_planner(),
//                                .replanner = ashl::sync::profile_replanner({}, {.drift = 0.2})}};
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>
#include <ashl/profile/estimators.hpp>
#include <ashl/profile/replan.hpp>
#include <ashl/sync/ashl.hpp>
#include <ashl/sync/events.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

struct profile_planner_params {
  std::uint32_t h_ahl = 8;
  std::uint32_t h_shl = 2;
  double r0 = 0.1;
  std::size_t trim = 20;
  std::size_t warmup = 0;
};

// What the profiling phase measured, reduced per live worker.
struct profile_timings {
  std::vector<worker_id> live;
  std::vector<profile::worker_timing> timing;  // by position in live
  std::vector<double> push_bytes;              // mean bytes of a profiling push, by position
  double t_compress = 0.0;                     // 0 when nothing was compressed
};

inline result<profile_timings> reduce_profile(const profile_report& r, const profile_planner_params& p) {
  const auto robust = [&](worker_id w, bool any, measurement_kind k, const char* name) -> result<double> {
    std::vector<double> v;
    for (const auto& m : r.measurements) {
      if (m.kind == k && (any || m.worker == w)) v.push_back(m.seconds);
    }
    if (v.empty()) return invalid_argument("ashl_profile.worker[" + std::to_string(w) + "]." + name, 0, "no samples");
    const std::size_t warm = std::min(p.warmup, v.size() - 1);
    profile::trimmed_mean tm{{.trim = std::min(p.trim, (v.size() - warm - 1) / 2), .warmup = warm}};
    for (double s : v) ASHL_TRY(tm.add(s));
    return tm.value();
  };
  profile_timings out;
  out.live = r.live;
  for (worker_id w : r.live) {
    auto c = robust(w, false, measurement_kind::compute, "compute");
    auto u = robust(w, false, measurement_kind::push, "push");
    auto l = robust(w, false, measurement_kind::pull, "pull");
    if (!c) return c.error();
    if (!u) return u.error();
    if (!l) return l.error();
    out.timing.push_back({*c, *u, *l});
    double bytes = 0.0;
    std::size_t n = 0;
    for (const auto& m : r.measurements) {
      if (m.kind == measurement_kind::push && m.worker == w && m.amount > 0) {
        bytes += static_cast<double>(m.amount);
        ++n;
      }
    }
    out.push_bytes.push_back(n == 0 ? 0.0 : bytes / static_cast<double>(n));
  }
  auto tc = robust(0, true, measurement_kind::compress, "compress");
  out.t_compress = tc ? *tc : 0.0;
  return out;
}

namespace detail {
// The AHL plan (H₀ = h_ahl) and the SHL plan (H₀ = h_shl) from one set of
// timings, as the schedule's per-worker entries.
inline result<ashl_plan> plans_from(const std::vector<worker_id>& live, const std::vector<profile::worker_timing>& t,
                                    double t_compress, const profile_planner_params& p) {
  auto ahl = profile::make_plan(t, p.h_ahl, t_compress, p.r0);
  if (!ahl) return ahl.error();
  auto shl = profile::make_plan(t, p.h_shl, t_compress, p.r0);
  if (!shl) return shl.error();
  ashl_plan out;
  for (auto w : live) out.workers.resize(std::max<std::size_t>(out.workers.size(), std::size_t{w} + 1));
  for (std::size_t i = 0; i < live.size(); ++i) {
    out.workers[live[i]] = {ahl->local[i].h, shl->local[i].h, ahl->ratio[i], shl->ratio[i], ahl->local[i].share, 0};
  }
  return out;
}
}  // namespace detail

inline ashl_planner profile_planner(profile_planner_params p = {}) {
  return [p](const profile_report& r) -> result<ashl_plan> {
    auto t = reduce_profile(r, p);
    if (!t) return t.error();
    return detail::plans_from(t->live, t->timing, t->t_compress, p);
  };
}

struct profile_replanner_params {
  double drift = 0.2;      // re-plan when a smoothed time is off its planned value by more than this fraction
  double half_life = 8.0;  // EWMA half-life, in samples of one kind of one worker
};

// ASHL+'s online re-planning (ALGORITHMS.md §2, ours): a profile::replanner
// over the profiled timings of the live workers (Algorithm 1 with h_ahl),
// fed every compute, push and pull measurement after the first plan; when a
// worker's smoothed time drifts, Algorithms 1 and 2 run again for both
// phases. A push of a compressed commit is scaled to the dense size it stands
// for (bytes of a profiling push / bytes sent: the link is taken to be
// bandwidth-bound, as Algorithm 2 takes it); a measurement of a worker the
// profile did not cover is ignored.
inline ashl_replanner_factory profile_replanner(profile_planner_params p = {}, profile_replanner_params q = {}) {
  return [p, q](const profile_report& r, const ashl_plan&) -> result<ashl_replanner> {
    auto t = reduce_profile(r, p);
    if (!t) return t.error();
    auto rp = profile::replanner::create({.h0 = p.h_ahl, .t_compress = t->t_compress, .r0 = p.r0, .drift = q.drift,
                                          .half_life = q.half_life},
                                         t->timing);
    if (!rp) return rp.error();
    struct state {
      profile::replanner r;
      profile_timings t;
      std::vector<std::size_t> index;  // worker id -> position in t.live, or npos
    };
    constexpr std::size_t npos = static_cast<std::size_t>(-1);
    auto st = std::make_shared<state>(state{std::move(*rp), std::move(*t), {}});
    for (std::size_t i = 0; i < st->t.live.size(); ++i) {
      const worker_id w = st->t.live[i];
      if (w >= st->index.size()) st->index.resize(std::size_t{w} + 1, npos);
      st->index[w] = i;
    }
    return ashl_replanner{[st, p](const measurement_event& m) -> result<std::optional<ashl_plan>> {
      if (m.worker >= st->index.size() || st->index[m.worker] == npos) return std::optional<ashl_plan>{};
      const std::size_t i = st->index[m.worker];
      const auto k = static_cast<std::uint32_t>(i);
      result<std::optional<profile::full_plan>> next = std::optional<profile::full_plan>{};
      switch (m.kind) {
        case measurement_kind::compute: next = st->r.observe(k, profile::timing_kind::iter, m.seconds); break;
        case measurement_kind::push: {
          const double dense = st->t.push_bytes[i];
          const double scale = dense > 0.0 && m.amount > 0 ? dense / static_cast<double>(m.amount) : 1.0;
          next = st->r.observe(k, profile::timing_kind::push, m.seconds * scale);
          break;
        }
        case measurement_kind::pull: next = st->r.observe(k, profile::timing_kind::pull, m.seconds); break;
        case measurement_kind::compress:
        case measurement_kind::commit: break;
      }
      if (!next) return next.error();
      if (!*next) return std::optional<ashl_plan>{};
      auto plan = detail::plans_from(st->t.live, (*next)->basis, st->t.t_compress, p);
      if (!plan) return plan.error();
      return std::optional<ashl_plan>{std::move(*plan)};
    }};
  };
}

}  // namespace sync
ASHL_NAMESPACE_END
