// ashl/profile/planner.hpp — the profiling planners as pure functions over
// plain structs: ASHL Algorithm 1 (local iterations H_i, data shares D_i),
// Algorithm 2 (compression ratios R_i), DLB batch sizes, and ADSP's commit
// interval. ALGORITHMS.md §2 "Phase 0", §3 "DLB", §1 "ADSP".
//
//   std::vector<ashl::profile::worker_timing> t{{0.10, 0.02, 0.02}, {0.05, 0.02, 0.02}};
//   auto h = ashl::profile::plan_local_iterations(t, 8);       // H = {8, 16}
//   auto r = ashl::profile::plan_compression(t, {8, 16}, 0.01, 0.1);
//   auto s = ashl::profile::summarize(measurements, 2, {.trim = 20, .warmup = 50});
//   auto full = ashl::profile::make_plan(s->workers, 8, s->t_compress, 0.1);   // replan.hpp
//   std::vector<ashl::profile::worker_plan> plans = full->workers();
//
// Nothing here knows about sync/: sync/ashl_profile.hpp adapts these to the
// ashl_schedule planner callable.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>
#include <ashl/profile/estimators.hpp>
#include <ashl/profile/measurement.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace profile {

// Measured per-worker times in seconds: one local iteration, one push, one pull.
struct worker_timing {
  double t_iter = 0.0;
  double t_push = 0.0;
  double t_pull = 0.0;
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

// What one worker is told to do; the common currency between planners and
// the policies (sync/) or simulator that apply them. A planner fills the
// fields it decides and leaves the others at their defaults.
struct worker_plan {
  std::uint32_t local_iterations = 1;  // H_i: local steps per commit
  double data_share = 0.0;             // D_i: data share and aggregation weight
  std::uint32_t batch_size = 0;        // b_i; 0: the worker keeps its own
  double compression_ratio = 1.0;      // R_i in (0, 1]
  double commit_interval = 0.0;        // seconds between commits (ADSP); 0: after H_i steps
  bool operator==(const worker_plan&) const = default;
};

// Robust per-worker timings from the profiling phase's measurements.
struct profile_summary {
  std::vector<worker_timing> workers;  // indexed by worker id
  double t_compress = 0.0;             // pooled over all workers; 0 without compress samples
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

// Trimmed means (ALGORITHMS.md §2 Phase 0: skip the warm-up, drop the `trim`
// largest and smallest) of each worker's compute, push and pull seconds, for
// workers 0..workers−1, and of every worker's compress seconds pooled (the
// warm-up and trim count per worker and kind, and once for the pool). Every
// measurement is validated: one absurd timing is an error naming it, not a
// sample quietly trimmed away. A worker with too few samples of a kind is an
// error naming the worker and the kind; `round` measurements are ignored.
inline result<profile_summary> summarize(const std::vector<measurement>& ms, std::uint32_t workers,
                                         trimmed_mean::params tp = {}) {
  if (workers == 0) return invalid_argument("planner.workers", workers, "must be >= 1");
  std::vector<std::array<trimmed_mean, 3>> per(workers, {trimmed_mean(tp), trimmed_mean(tp), trimmed_mean(tp)});
  trimmed_mean codec(tp);
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const auto& m = ms[i];
    ASHL_TRY(validate(m));
    if (m.worker >= workers) {
      return out_of_range("planner.measurements[" + std::to_string(i) + "].worker", m.worker, "no such worker");
    }
    switch (m.kind) {
      case measurement_kind::compute: ASHL_TRY(per[m.worker][0].add(m.seconds)); break;
      case measurement_kind::push: ASHL_TRY(per[m.worker][1].add(m.seconds)); break;
      case measurement_kind::pull: ASHL_TRY(per[m.worker][2].add(m.seconds)); break;
      case measurement_kind::compress: ASHL_TRY(codec.add(m.seconds)); break;
      case measurement_kind::round: break;
    }
  }
  static constexpr const char* names[3] = {"compute", "push", "pull"};
  profile_summary out;
  out.workers.resize(workers);
  for (std::uint32_t w = 0; w < workers; ++w) {
    double v[3];
    for (std::size_t k = 0; k < 3; ++k) {
      auto r = per[w][k].value();
      if (!r) {
        return out_of_range(detail::indexed("planner.worker", w, names[k]) + ".count", per[w][k].count(),
                            "needs more than 2 * trim samples after the warm-up");
      }
      v[k] = *r;
    }
    out.workers[w] = {v[0], v[1], v[2]};
  }
  if (codec.count() > 0) {
    auto r = codec.value();
    if (!r) return out_of_range("planner.compress.count", codec.count(), "needs more than 2 * trim samples after the warm-up");
    out.t_compress = *r;
  }
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
// max(t_min, Γ / ΔC − O_i).
inline result<double> adsp_commit_interval(double gamma, std::uint32_t delta_c, double o_i, double t_min) {
  ASHL_TRY(detail::check_positive("planner.gamma", gamma));
  if (delta_c == 0) return invalid_argument("planner.delta_c", delta_c, "must be >= 1");
  if (!std::isfinite(o_i) || o_i < 0.0) return invalid_argument("planner.o_i", o_i, "must be finite and >= 0");
  if (!std::isfinite(t_min) || t_min < 0.0) {
    return invalid_argument("planner.t_min", t_min, "must be finite and >= 0");
  }
  return std::max(t_min, gamma / delta_c - o_i);
}

// ADSP for every worker: commit_interval_i = max(t_min, Γ / ΔC − O_i), with
// H_i = 1 (ADSP commits whatever it accumulated when the interval elapses)
// and data shares 1/M (the server applies Δ_i / M).
inline result<std::vector<worker_plan>> plan_adsp(double gamma, std::uint32_t delta_c,
                                                  const std::vector<double>& commit_seconds, double t_min) {
  if (commit_seconds.empty()) return invalid_argument("planner.commit_seconds.size", 0, "needs at least one worker");
  std::vector<worker_plan> out(commit_seconds.size());
  for (std::size_t i = 0; i < commit_seconds.size(); ++i) {
    auto t = adsp_commit_interval(gamma, delta_c, commit_seconds[i], t_min);
    if (!t) return t.error();
    out[i].commit_interval = *t;
    out[i].data_share = 1.0 / static_cast<double>(commit_seconds.size());
  }
  return out;
}

// A DLB plan as worker plans: b_i, and data share = aggregation weight b_i / B.
inline std::vector<worker_plan> to_worker_plans(const dlb_plan& d) {
  std::vector<worker_plan> out(d.batch.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].batch_size = d.batch[i];
    out[i].data_share = d.weight[i];
  }
  return out;
}

}  // namespace profile
ASHL_NAMESPACE_END
