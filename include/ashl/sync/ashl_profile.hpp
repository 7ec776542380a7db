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

inline ashl_planner profile_planner(profile_planner_params p = {}) {
  return [p](const profile_report& r) -> result<ashl_plan> {
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
    std::vector<profile::worker_timing> t;
    for (worker_id w : r.live) {
      auto c = robust(w, false, measurement_kind::compute, "compute");
      auto u = robust(w, false, measurement_kind::push, "push");
      auto l = robust(w, false, measurement_kind::pull, "pull");
      if (!c) return c.error();
      if (!u) return u.error();
      if (!l) return l.error();
      t.push_back({*c, *u, *l});
    }
    auto tc = robust(0, true, measurement_kind::compress, "compress");
    const double t_compress = tc ? *tc : 0.0;
    auto ahl = profile::make_plan(t, p.h_ahl, t_compress, p.r0);
    if (!ahl) return ahl.error();
    auto shl = profile::make_plan(t, p.h_shl, t_compress, p.r0);
    if (!shl) return shl.error();
    ashl_plan out;
    for (auto w : r.live) out.workers.resize(std::max<std::size_t>(out.workers.size(), std::size_t{w} + 1));
    for (std::size_t i = 0; i < r.live.size(); ++i) {
      out.workers[r.live[i]] = {ahl->local[i].h, shl->local[i].h, ahl->ratio[i], shl->ratio[i],
                                ahl->local[i].share, 0};
    }
    return out;
  };
}

}  // namespace sync
ASHL_NAMESPACE_END
