// ashl/profile/planner.hpp — the profiling planners as pure functions over
// plain structs: ASHL Algorithm 1 (local iterations H_i, data shares D_i),
// Algorithm 2 (compression ratios R_i), DLB batch sizes, and ADSP's commit
// interval. docs/algorithms.md §2 "Phase 0", §3 "DLB", §1 "ADSP".
//
//   std::vector<ashl::profile::worker_timing> t{{0.10, 0.02, 0.02}, {0.05, 0.02, 0.02}};
//   auto h = ashl::profile::plan_local_iterations(t, 8);       // H = {8, 16}
//   auto r = ashl::profile::plan_compression(t, {8, 16}, 0.01, 0.1);
//   auto s = ashl::profile::summarize(measurements, live, {.trim = 20, .warmup = 50});
//   auto full = ashl::profile::make_plan(s->timing, 8, s->t_compress, 0.1);   // replan.hpp
//   std::vector<ashl::worker_plan> plans = full->workers(ashl::stage_id::ahl);
//
// Plans come out as ashl::worker_plan (core/plan.hpp), the type policies hold
// and the wire sends. Nothing here knows about sync/: rules/planners.hpp makes
// these the ASHL schedule's planner and re-planner.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>
#include <ashl/profile/estimators.hpp>
#include <ashl/profile/measurement.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace profile {

// Measured per-worker times in seconds: one local iteration, one push, one pull.
struct worker_timing {
  double t_iter = 0.0;
  double t_push = 0.0;
  double t_pull = 0.0;
  friend bool operator==(const worker_timing&, const worker_timing&) = default;
};

struct local_plan {
  std::uint32_t h = 1;   // H_i: local iterations per round
  double share = 0.0;    // D_i = H_i / Σ H_j: data share and aggregation weight
  bool operator==(const local_plan&) const = default;
};

struct dlb_plan {
  std::vector<std::uint32_t> batch;  // b_i, Σ b_i = B
  std::vector<double> weight;        // b_i / B
};

// What the profiling phase measured, reduced per live worker (summarize).
struct profile_summary {
  std::vector<std::uint32_t> live;     // worker ids, in the order they were given
  std::vector<worker_timing> timing;   // by position in live
  std::vector<double> push_bytes;      // mean bytes of a push (amount > 0), by position; 0 when none
  double t_compress = 0.0;             // pooled over all workers; 0 without compress samples
};

// Warm-up and trim of the robust means (docs/algorithms.md §2 Phase 0: the
// original trims 20 largest and smallest and skips the first epoch).
struct summary_params {
  std::size_t trim = 20;
  std::size_t warmup = 0;
};

namespace detail {
inline std::string indexed(const char* prefix, std::size_t i, const char* field) {
  return std::string(prefix) + "[" + std::to_string(i) + "]." + field;
}
inline status check_positive(const std::string& field, double v) {
  if (!std::isfinite(v) || v <= 0.0) return invalid_argument(field, v, "must be finite and > 0");
  return {};
}
inline status check_timings(const std::vector<worker_timing>& t) {
  if (t.empty()) return invalid_argument("planner.workers.size", 0, "needs at least one worker");
  for (std::size_t i = 0; i < t.size(); ++i) {
    ASHL_TRY(check_positive(indexed("planner.workers", i, "t_iter"), t[i].t_iter));
    ASHL_TRY(check_positive(indexed("planner.workers", i, "t_push"), t[i].t_push));
    ASHL_TRY(check_positive(indexed("planner.workers", i, "t_pull"), t[i].t_pull));
  }
  return {};
}
}  // namespace detail

namespace detail {
// Mean of `v` after skipping the first `warmup` and trimming `trim` from each
// end, both reduced so that at least one sample is kept: a short profile
// still gives a value. Precondition: !v.empty().
inline double robust_mean(const std::vector<double>& v, summary_params p) {
  ASHL_ASSERT(!v.empty(), "robust_mean of no samples");
  const std::size_t warm = std::min(p.warmup, v.size() - 1);
  const std::size_t trim = std::min(p.trim, (v.size() - warm - 1) / 2);
  trimmed_mean tm{{.trim = trim, .warmup = warm}};
  for (double s : v) (void)tm.add(s);  // validated by summarize
  return *tm.value();
}
}  // namespace detail

// The one reduction of a profiling phase (docs/algorithms.md §2 Phase 0): for each
// worker in `live`, the robust mean (warm-up skipped, trimmed; both reduced
// when there are few samples, see detail::robust_mean) of its compute, push
// and pull seconds and the mean bytes of its pushes; T_compress is the robust
// mean of every worker's compress seconds pooled (0 without any). Every
// measurement is validated first: one absurd timing is an error naming it,
// not a sample quietly trimmed away. Measurements of workers not in `live`
// (they left) count for T_compress only; commit and round are ignored. A
// live worker without a compute, push or pull sample is an error naming it.
inline result<profile_summary> summarize(std::span<const measurement> ms, std::span<const std::uint32_t> live,
                                         summary_params p = {}) {
  if (live.empty()) return invalid_argument("profile.summary.live.size", 0, "needs at least one worker");
  constexpr std::size_t npos = static_cast<std::size_t>(-1);
  std::vector<std::size_t> index;  // worker id -> position in live
  for (std::size_t i = 0; i < live.size(); ++i) {
    if (live[i] >= index.size()) index.resize(std::size_t{live[i]} + 1, npos);
    if (index[live[i]] != npos)
      return invalid_argument("profile.summary.live[" + std::to_string(i) + "]", live[i], "listed twice");
    index[live[i]] = i;
  }
  std::vector<std::array<std::vector<double>, 3>> per(live.size());
  std::vector<double> bytes(live.size(), 0.0);
  std::vector<std::size_t> sends(live.size(), 0);
  std::vector<double> codec;
  for (std::size_t j = 0; j < ms.size(); ++j) {
    const auto& m = ms[j];
    if (!validate(m)) return validate(m, "profile.summary.measurements[" + std::to_string(j) + "]");
    if (m.kind == measurement_kind::compress) {
      codec.push_back(m.seconds);
      continue;
    }
    if (m.worker >= index.size() || index[m.worker] == npos) continue;
    const std::size_t i = index[m.worker];
    switch (m.kind) {
      case measurement_kind::compute: per[i][0].push_back(m.seconds); break;
      case measurement_kind::push:
        per[i][1].push_back(m.seconds);
        if (m.amount > 0.0) {
          bytes[i] += m.amount;
          ++sends[i];
        }
        break;
      case measurement_kind::pull: per[i][2].push_back(m.seconds); break;
      case measurement_kind::compress:
      case measurement_kind::commit:
      case measurement_kind::round: break;
    }
  }
  static constexpr const char* names[3] = {"compute", "push", "pull"};
  profile_summary out;
  out.live.assign(live.begin(), live.end());
  out.timing.resize(live.size());
  out.push_bytes.resize(live.size());
  for (std::size_t i = 0; i < live.size(); ++i) {
    double v[3];
    for (std::size_t k = 0; k < 3; ++k) {
      if (per[i][k].empty())
        return invalid_argument(detail::indexed("profile.summary.worker", live[i], names[k]) + ".count", 0,
                                "no samples");
      v[k] = detail::robust_mean(per[i][k], p);
    }
    out.timing[i] = {v[0], v[1], v[2]};
    out.push_bytes[i] = sends[i] == 0 ? 0.0 : bytes[i] / static_cast<double>(sends[i]);
  }
  if (!codec.empty()) out.t_compress = detail::robust_mean(codec, p);
  return out;
}

// Algorithm 1. H₀ is the slowest worker's local-iteration count; every other
// worker gets as many local iterations as fit in the slowest round:
// H_i = max(1, round((T_max − T_comm,i) / T_iter,i)), D_i = H_i / Σ H_j.
inline result<std::vector<local_plan>> plan_local_iterations(const std::vector<worker_timing>& t,
                                                             std::uint32_t h0) {
  ASHL_TRY(detail::check_timings(t));
  if (h0 == 0) return invalid_argument("planner.h0", h0, "must be >= 1");
  double t_max = 0.0;
  for (const auto& w : t) t_max = std::max(t_max, w.t_iter * h0 + w.t_push + w.t_pull);
  std::vector<local_plan> out(t.size());
  double sum = 0.0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const double h = std::round((t_max - (t[i].t_push + t[i].t_pull)) / t[i].t_iter);
    // Guard the cast: an absurd speed ratio must not overflow uint32.
    out[i].h = static_cast<std::uint32_t>(std::clamp(h, 1.0, 4294967295.0));
    sum += out[i].h;
  }
  for (auto& p : out) p.share = p.h / sum;
  return out;
}

// Algorithm 2. With H_i fixed and a preset ratio r0 for the slowest round:
// R_i = min(1, (T_max − (T_iter,i·H_i + T_compress + T_pull,i)) / T_push,i).
//
// Because T_max is the largest round *at r0*, every worker's spare time is at
// least r0·T_push,i, so R_i >= r0 for all and exactly r0 for the slowest; the
// clamp to [r0, 1] only absorbs floating-point rounding. That includes a
// worker whose communication alone exceeds everyone else's whole round (a
// slow link): it is then the round's slowest member, T_max is its own round
// at r0, and it sends r0 while the others use the time it costs them to send
// more (up to 1). The planner does not push that worker below r0: r0 is the
// accuracy floor the user chose, and sending less would not shorten a round
// that its pull alone may already dominate. Its remedies lie elsewhere (a
// smaller batch via DLB, or eviction after the straggler detector flags it).
inline result<std::vector<double>> plan_compression(const std::vector<worker_timing>& t,
                                                    const std::vector<std::uint32_t>& h,
                                                    double t_compress, double r0) {
  ASHL_TRY(detail::check_timings(t));
  if (h.size() != t.size()) {
    return invalid_argument("planner.h.size", h.size(), "must equal the number of workers");
  }
  for (std::size_t i = 0; i < h.size(); ++i) {
    if (h[i] == 0) return invalid_argument("planner.h[" + std::to_string(i) + "]", h[i], "must be >= 1");
  }
  if (!std::isfinite(t_compress) || t_compress < 0.0) {
    return invalid_argument("planner.t_compress", t_compress, "must be finite and >= 0");
  }
  if (!(r0 > 0.0 && r0 <= 1.0)) return invalid_argument("planner.r0", r0, "must be in (0, 1]");
  double t_max = 0.0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    t_max = std::max(t_max, t[i].t_iter * h[i] + t_compress + r0 * t[i].t_push + t[i].t_pull);
  }
  std::vector<double> out(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    const double spare = t_max - (t[i].t_iter * h[i] + t_compress + t[i].t_pull);
    out[i] = std::clamp(spare / t[i].t_push, r0, 1.0);
  }
  return out;
}

// DLB: b_i = round(B·v_i / Σ v_j), at least b_min, Σ b_i = B exactly. Workers
// whose proportional quota is below b_min are pinned to b_min and the rest of
// B is shared among the others by their speeds; integer parts are then
// completed by largest remainder (ties to the lower index). Weights b_i / B.
inline result<dlb_plan> plan_dlb_batches(const std::vector<double>& speeds, std::uint32_t total,
                                         std::uint32_t b_min) {
  if (speeds.empty()) return invalid_argument("planner.speeds.size", 0, "needs at least one worker");
  for (std::size_t i = 0; i < speeds.size(); ++i) {
    ASHL_TRY(detail::check_positive("planner.speeds[" + std::to_string(i) + "]", speeds[i]));
  }
  if (static_cast<std::uint64_t>(b_min) * speeds.size() > total) {
    return invalid_argument("planner.batch", total, "must be >= b_min * number of workers");
  }
  const std::size_t m = speeds.size();
  std::vector<bool> pinned(m, false);
  std::vector<double> quota(m, 0.0);
  for (bool changed = true; changed;) {
    changed = false;
    double v_free = 0.0;
    std::size_t n_pinned = 0;
    for (std::size_t i = 0; i < m; ++i) {
      if (pinned[i]) ++n_pinned;
      else v_free += speeds[i];
    }
    const double budget = static_cast<double>(total) - static_cast<double>(n_pinned) * b_min;
    for (std::size_t i = 0; i < m; ++i) {
      if (pinned[i]) continue;
      quota[i] = budget * speeds[i] / v_free;
      if (quota[i] < b_min) {
        pinned[i] = true;
        changed = true;
      }
    }
  }
  dlb_plan out;
  out.batch.resize(m);
  std::uint64_t used = 0;
  for (std::size_t i = 0; i < m; ++i) {
    out.batch[i] = pinned[i] ? b_min : static_cast<std::uint32_t>(std::floor(quota[i]));
    used += out.batch[i];
  }
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < m; ++i) {
    if (!pinned[i]) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return quota[a] - std::floor(quota[a]) > quota[b] - std::floor(quota[b]);
  });
  for (std::size_t k = 0; used < total && !order.empty(); k = (k + 1) % order.size()) {
    ++out.batch[order[k]];
    ++used;
  }
  out.weight.resize(m);
  for (std::size_t i = 0; i < m; ++i) out.weight[i] = static_cast<double>(out.batch[i]) / total;
  return out;
}

// ADSP: worker i commits when the time since its last commit reaches
// max(t_min, Γ / ΔC − O_i). The arguments of user configuration are checked
// here; the formula is ashl::adsp_commit_interval (core/plan.hpp), the one
// the ADSP policy uses too.
inline result<double> adsp_commit_interval(double gamma, std::uint32_t delta_c, double o_i, double t_min) {
  ASHL_TRY(detail::check_positive("planner.gamma", gamma));
  if (delta_c == 0) return invalid_argument("planner.delta_c", delta_c, "must be >= 1");
  if (!std::isfinite(o_i) || o_i < 0.0) return invalid_argument("planner.o_i", o_i, "must be finite and >= 0");
  if (!std::isfinite(t_min) || t_min < 0.0) {
    return invalid_argument("planner.t_min", t_min, "must be finite and >= 0");
  }
  return ashl::adsp_commit_interval(gamma, static_cast<double>(delta_c), o_i, t_min);
}

// ADSP for every worker: commit by interval (local_iterations 0: ADSP
// commits whatever it accumulated when the interval elapses) every
// max(t_min, Γ / ΔC − O_i), in whole microseconds (a positive interval is at
// least 1 µs), with data shares 1/M (the server applies Δ_i / M), stage adsp.
inline result<std::vector<worker_plan>> plan_adsp(double gamma, std::uint32_t delta_c,
                                                  const std::vector<double>& commit_seconds, double t_min) {
  if (commit_seconds.empty()) return invalid_argument("planner.commit_seconds.size", 0, "needs at least one worker");
  std::vector<worker_plan> out(commit_seconds.size());
  for (std::size_t i = 0; i < commit_seconds.size(); ++i) {
    auto t = adsp_commit_interval(gamma, delta_c, commit_seconds[i], t_min);
    if (!t) return t.error();
    // A zero interval (t_min = 0 and O_i >= Γ / ΔC) is "commit at once":
    // after every iteration.
    out[i].commit_interval_us = worker_plan::interval_us(*t);
    out[i].local_iterations = out[i].commit_interval_us > 0 ? 0 : 1;
    out[i].data_share = static_cast<float>(1.0 / static_cast<double>(commit_seconds.size()));
    out[i].stage = stage_id::adsp;
  }
  return out;
}

// A DLB plan as worker plans: b_i, and data share = aggregation weight b_i / B.
inline std::vector<worker_plan> to_worker_plans(const dlb_plan& d) {
  std::vector<worker_plan> out(d.batch.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].batch_size = d.batch[i];
    out[i].data_share = static_cast<float>(d.weight[i]);
    out[i].stage = stage_id::dlb;
  }
  return out;
}

}  // namespace profile
ASHL_NAMESPACE_END
