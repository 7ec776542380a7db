// ashl/sync/ashl_plan.hpp — what ASHL's planners make (per-worker H_i, R_i,
// D_i for the AHL and SHL phases) and the two planner concepts the schedule
// is templated on: the planner run once when profiling ends, and the online
// re-planner of ASHL+.
//
//   ashl::sync::uniform_planner p{.h_ahl = 8, .h_shl = 2, .ratio = 0.1};
//   auto plan = p.plan(report);                       // result<ashl_plan>
//   ashl::sync::ashl_schedule<ashl::sync::uniform_planner> s{{.workers = 4}, p};
//
// Planners are values (no std::function, no shared state): the schedule holds
// them by value, copies them independently and saves them with its own state.
// Models that use profile/ measurements live in rules/planners.hpp (the layer
// that composes sync and profile; sync does not include profile).
// docs/algorithms.md §2 "Phase 0", "Compression in ASHL".
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/events.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
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
  friend bool operator==(const ashl_worker_plan&, const ashl_worker_plan&) = default;
};

struct ashl_plan {
  std::vector<ashl_worker_plan> workers;  // indexed by worker id
  friend bool operator==(const ashl_plan&, const ashl_plan&) = default;
};

// Everything the profiling phase saw: its measurements, the live workers
// when it ended, and when it started and ended (driver time).
struct profile_report {
  std::vector<measurement_event> measurements;
  std::vector<worker_id> live;
  double start_time = 0.0;
  double end_time = 0.0;
};

// Runs once, when profiling ends.
template <class P>
concept ashl_planner = std::copy_constructible<P> &&
                       requires(P& p, const P& cp, const profile_report& r, state_writer& w, state_reader& rd) {
                         { p.plan(r) } -> std::same_as<result<ashl_plan>>;
                         { cp.save(w) } -> std::same_as<void>;
                         { p.load(rd) } -> std::same_as<status>;
                       };

// ASHL+ (ours): started once from the profiling report and the first plan,
// then sees every measurement of the AHL and SHL phases; observe() returns
// true when it wrote a new plan into `next` (whose storage it may reuse, so a
// measurement that changes nothing allocates nothing).
template <class R>
concept ashl_replanner =
    std::copy_constructible<R> &&
    requires(R& r, const R& cr, const profile_report& rep, const ashl_plan& plan, const measurement_event& x,
             ashl_plan& next, state_writer& w, state_reader& rd) {
      { R::enabled } -> std::convertible_to<bool>;
      { r.start(rep, plan) } -> std::same_as<status>;
      { r.observe(x, next) } -> std::same_as<result<bool>>;
      { cr.save(w) } -> std::same_as<void>;
      { r.load(rd) } -> std::same_as<status>;
    };

// H_i = h_ahl / h_shl for all, R_i = ratio, D_i = 1/M over the live workers.
struct uniform_planner {
  std::uint32_t h_ahl = 8;
  std::uint32_t h_shl = 2;
  double ratio = 1.0;

  [[nodiscard]] result<ashl_plan> plan(const profile_report& r) const {
    ashl_plan p;
    std::size_t size = 0;
    for (auto w : r.live) size = std::max<std::size_t>(size, std::size_t{w} + 1);
    p.workers.resize(size);
    const double d = r.live.empty() ? 0.0 : 1.0 / static_cast<double>(r.live.size());
    for (auto w : r.live) p.workers[w] = {h_ahl, h_shl, ratio, ratio, d, 0};
    return p;
  }
  void save(state_writer& w) const {
    w.tag("UPLN", 1);
    w.put(h_ahl);
    w.put(h_shl);
    w.put(ratio);
  }
  status load(state_reader& r) {
    uniform_planner next;
    ASHL_TRY(r.tag("UPLN", 1));
    ASHL_TRY(r.get(next.h_ahl, "uniform_planner.h_ahl"));
    ASHL_TRY(r.get(next.h_shl, "uniform_planner.h_shl"));
    ASHL_TRY(r.get(next.ratio, "uniform_planner.ratio"));
    *this = next;
    return {};
  }
};
static_assert(ashl_planner<uniform_planner>);

// Plan once (the paper's ASHL).
struct no_replanner {
  static constexpr bool enabled = false;
  status start(const profile_report&, const ashl_plan&) { return {}; }
  result<bool> observe(const measurement_event&, ashl_plan&) { return false; }
  void save(state_writer& w) const { w.tag("NRPL", 1); }
  status load(state_reader& r) { return r.tag("NRPL", 1); }
};
static_assert(ashl_replanner<no_replanner>);

}  // namespace sync
ASHL_NAMESPACE_END
