#include <ashl/rules/planners.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/sync/ashl_schedule.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "../support/counting_new.hpp"
#include "../support/saved_state.hpp"

namespace as = ashl::sync;
namespace aps = ashl::ps;
namespace tt = boost::test_tools;
using ashl::measurement_kind;
using ashl::stage_id;

namespace {
as::profile_report two_workers() {
  as::profile_report r;
  r.live = {0, 1};
  const double iter[2] = {0.10, 0.05};
  for (as::worker_id w = 0; w < 2; ++w) {
    for (int k = 0; k < 5; ++k) {
      r.measurements.push_back({.worker = w, .kind = measurement_kind::compute, .seconds = iter[w]});
      r.measurements.push_back({.worker = w, .kind = measurement_kind::push, .seconds = 0.02, .amount = 1000});
      r.measurements.push_back({.worker = w, .kind = measurement_kind::pull, .seconds = 0.02});
    }
    // One outlier each, trimmed away.
    r.measurements.push_back({.worker = w, .kind = measurement_kind::compute, .seconds = 5.0});
  }
  return r;
}

using test_support::saved;

// A started re-planner over two_workers(): drift 20 %, half-life 2 samples.
aps::profile_replanner started(double drift = 0.2) {
  aps::profile_replanner r({.trim = 1}, {.drift = drift, .half_life = 2});
  const auto rep = two_workers();
  auto first = aps::profile_planner{.trim = 1}.plan(rep);
  BOOST_TEST_REQUIRE(first.has_value());
  const auto s = r.start(rep, *first);
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  return r;
}
}  // namespace

static_assert(as::ashl_planner<aps::profile_planner>);
static_assert(as::ashl_replanner<aps::profile_replanner>);
static_assert(aps::profile_replanner::enabled);

BOOST_AUTO_TEST_CASE(algorithms_1_and_2_for_both_phases) {
  auto plan = aps::profile_planner{.h_ahl = 8, .h_shl = 2, .r0 = 0.1, .trim = 1}.plan(two_workers());
  BOOST_TEST_REQUIRE(plan.has_value());
  BOOST_TEST_REQUIRE(plan->workers.size() == 2u);
  // AHL: rounds 0.84 and 0.44, H = {8, 16}; SHL: rounds 0.24, 0.14, H = {2, 4}.
  BOOST_TEST(plan->workers[0].h_ahl == 8u);
  BOOST_TEST(plan->workers[1].h_ahl == 16u);
  BOOST_TEST(plan->workers[0].h_shl == 2u);
  BOOST_TEST(plan->workers[1].h_shl == 4u);
  BOOST_TEST(plan->workers[1].share == 2.0 / 3, tt::tolerance(1e-12));
  // Equal rounds at r0 (a tie): both send r0.
  BOOST_TEST(plan->workers[0].ratio_ahl == 0.1, tt::tolerance(1e-9));
  BOOST_TEST(plan->workers[1].ratio_ahl == 0.1, tt::tolerance(1e-9));
  BOOST_TEST(plan->workers[0].batch_size == 0u);
}

BOOST_AUTO_TEST_CASE(live_workers_with_gaps_are_planned_by_id) {
  auto r = two_workers();
  for (auto& m : r.measurements) m.worker = m.worker == 0 ? 5 : 2;
  r.live = {5, 2};
  r.measurements.push_back({.worker = 9, .kind = measurement_kind::compute, .seconds = 7.0});  // left: ignored
  auto plan = aps::profile_planner{.trim = 1}.plan(r);
  BOOST_TEST_REQUIRE(plan.has_value());
  BOOST_TEST(plan->workers.size() == 6u);
  BOOST_TEST(plan->workers[5].h_ahl == 8u);
  BOOST_TEST(plan->workers[2].h_ahl == 16u);
  BOOST_TEST(plan->workers[0].share == 0.0);  // not live: the default entry
}

BOOST_AUTO_TEST_CASE(missing_or_absurd_measurements_are_an_error) {
  as::profile_report r;
  r.live = {0};
  auto plan = aps::profile_planner{}.plan(r);
  BOOST_TEST_REQUIRE(!plan.has_value());
  BOOST_TEST(plan.error().message() == "profile.summary.worker[0].compute.count = 0: no samples");
  auto bad = two_workers();
  bad.measurements[4].seconds = -1.0;
  auto e = aps::profile_planner{}.plan(bad);
  BOOST_TEST_REQUIRE(!e.has_value());
  BOOST_TEST(e.error().message() == "profile.summary.measurements[4].seconds = -1: duration must be finite and > 0");
  BOOST_TEST(!aps::profile_planner{.h_ahl = 0}.plan(two_workers()).has_value());
  BOOST_TEST(aps::profile_planner{.r0 = 0}.plan(two_workers()).error().message() ==
             "planner.r0 = 0: must be in (0, 1]");
}

BOOST_AUTO_TEST_CASE(planner_save_and_load) {
  const aps::profile_planner p{.h_ahl = 6, .h_shl = 3, .r0 = 0.25, .trim = 4, .warmup = 2};
  const auto b = saved(p);
  aps::profile_planner q;
  ashl::state_reader in(b);
  BOOST_TEST_REQUIRE(q.load(in).ok());
  BOOST_TEST(in.at_end());
  BOOST_TEST((q == p));
  // Refused input leaves the planner as it was.
  std::vector<std::byte> cut(b.begin(), b.end() - 1);
  ashl::state_reader short_in(cut);
  aps::profile_planner r{.h_ahl = 9};
  BOOST_TEST(!r.load(short_in).ok());
  BOOST_TEST(r.h_ahl == 9u);
}

BOOST_AUTO_TEST_CASE(replanner_a_persistent_slowdown_replans_a_blip_does_not) {
  auto r = started();
  as::ashl_plan next;
  // One slow sample moves the EWMA by half the gap (half-life 2): 0.05 -> 0.0575, inside 20 %.
  auto o = r.observe({.worker = 1, .kind = measurement_kind::compute, .seconds = 0.065}, next);
  BOOST_TEST_REQUIRE(o.has_value());
  BOOST_TEST(!*o);
  BOOST_TEST(r.state()->replans() == 0u);
  // The fast worker becomes as slow as the other: after a few samples the
  // EWMA is more than 20 % off and Algorithm 1 gives both nearly H = 8.
  bool changed = false;
  for (int k = 0; k < 10 && !changed; ++k) {
    auto c = r.observe({.worker = 1, .kind = measurement_kind::compute, .seconds = 0.10}, next);
    BOOST_TEST_REQUIRE(c.has_value());
    changed = *c;
  }
  BOOST_TEST_REQUIRE(changed);
  BOOST_TEST(r.state()->replans() == 1u);
  BOOST_TEST_REQUIRE(next.workers.size() == 2u);
  BOOST_TEST(next.workers[1].h_ahl < 16u);
  BOOST_TEST(next.workers[1].h_ahl >= 8u);
  BOOST_TEST(next.workers[1].share < 2.0 / 3);
  BOOST_TEST(next.workers[0].share + next.workers[1].share == 1.0, tt::tolerance(1e-12));
  BOOST_TEST(next.workers[1].h_shl >= 2u);
}

BOOST_AUTO_TEST_CASE(replanner_scales_a_compressed_push_to_the_dense_size) {
  auto r = started();
  as::ashl_plan next;
  // Pushes of a tenth of the bytes in a tenth of the time: the link did not change.
  for (int k = 0; k < 20; ++k) {
    auto o = r.observe({.worker = 0, .kind = measurement_kind::push, .seconds = 0.002, .amount = 100}, next);
    BOOST_TEST_REQUIRE(o.has_value());
    BOOST_TEST(!*o);
  }
  BOOST_TEST(r.state()->replans() == 0u);
  // A tenth of the bytes in the same time: the link is 10x slower, re-plan.
  bool changed = false;
  for (int k = 0; k < 20 && !changed; ++k)
    changed = *r.observe({.worker = 0, .kind = measurement_kind::push, .seconds = 0.02, .amount = 100}, next);
  BOOST_TEST(changed);
  BOOST_TEST(r.state()->replans() == 1u);
  // Worker 0 now has the longer round: the other one gets more local steps.
  BOOST_TEST(next.workers[1].h_ahl > 16u);
}

BOOST_AUTO_TEST_CASE(replanner_ignores_what_it_does_not_plan_and_reports_bad_input) {
  aps::profile_replanner idle({.trim = 1});
  as::ashl_plan next;
  BOOST_TEST(!*idle.observe({.worker = 0, .kind = measurement_kind::compute, .seconds = 9.0}, next));  // not started
  auto r = started();
  BOOST_TEST(!*r.observe({.worker = 7, .kind = measurement_kind::compute, .seconds = 9.0}, next));  // not profiled
  for (auto k : {measurement_kind::compress, measurement_kind::commit, measurement_kind::round})
    BOOST_TEST(!*r.observe({.worker = 0, .kind = k, .seconds = 9.0}, next));
  auto bad = r.observe({.worker = 0, .kind = measurement_kind::pull, .seconds = -1.0}, next);
  BOOST_TEST_REQUIRE(!bad.has_value());
  BOOST_TEST(bad.error().message() == "profile.sample = -1: duration must be finite and > 0");
  BOOST_TEST(next.workers.empty());
  // A bad setting is reported by start, and the re-planner stays idle.
  aps::profile_replanner neg({.trim = 1}, {.drift = -1.0});
  const auto rep = two_workers();
  const auto s = neg.start(rep, {});
  BOOST_TEST(s.message() == "replan.drift = -1: must be finite and > 0");
  BOOST_TEST(!neg.started());
}

BOOST_AUTO_TEST_CASE(replanner_reuses_the_callers_plan_storage) {
  auto r = started();
  as::ashl_plan next;
  next.workers.reserve(8);
  const auto* storage = next.workers.data();
  bool changed = false;
  for (int k = 0; k < 10 && !changed; ++k)
    changed = *r.observe({.worker = 1, .kind = measurement_kind::compute, .seconds = 0.10}, next);
  BOOST_TEST_REQUIRE(changed);
  BOOST_TEST(next.workers.data() == storage);
  BOOST_TEST(next.workers.size() == 2u);
}

BOOST_AUTO_TEST_CASE(replanner_allocates_nothing_when_nothing_drifted) {
  auto r = started(0.5);
  as::ashl_plan next;
  const std::size_t before = counting_new::count();
  std::size_t changed = 0;
  for (int k = 0; k < 100; ++k) {
    for (as::worker_id w = 0; w < 3; ++w) {  // worker 2 was not profiled
      for (auto kind : {measurement_kind::compute, measurement_kind::push, measurement_kind::pull,
                        measurement_kind::compress, measurement_kind::commit, measurement_kind::round}) {
        const double s = kind == measurement_kind::compute ? (w == 0 ? 0.10 : 0.05) : 0.02;
        auto o = r.observe({.worker = w, .kind = kind, .seconds = s * (k % 2 == 0 ? 1.1 : 0.9), .amount = 1000}, next);
        changed += o.has_value() && *o ? 1 : 0;
      }
    }
  }
  BOOST_TEST(counting_new::count() == before);
  BOOST_TEST(changed == 0u);
}

BOOST_AUTO_TEST_CASE(replanner_save_and_load_continue_exactly) {
  // Before start: parameters only.
  const aps::profile_replanner idle({.h_ahl = 4, .trim = 3}, {.drift = 0.5, .half_life = 3});
  {
    const auto b = saved(idle);
    aps::profile_replanner back;
    ashl::state_reader in(b);
    BOOST_TEST_REQUIRE(back.load(in).ok());
    BOOST_TEST(in.at_end());
    BOOST_TEST((back == idle));
    BOOST_TEST(!back.started());
  }
  // After start and some drift: the EWMAs, the plan and the re-plan count.
  auto r = started();
  as::ashl_plan next;
  for (int k = 0; k < 3; ++k) (void)r.observe({.worker = 1, .kind = measurement_kind::compute, .seconds = 0.08}, next);
  for (int k = 0; k < 8; ++k) (void)r.observe({.worker = 0, .kind = measurement_kind::pull, .seconds = 0.05}, next);
  const auto b = saved(r);
  aps::profile_replanner back;
  ashl::state_reader in(b);
  const auto s = back.load(in);
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  BOOST_TEST(in.at_end());
  BOOST_TEST((back == r));
  BOOST_TEST((saved(back) == b));
  // Both decide alike from here on.
  as::ashl_plan n1, n2;
  const double xs[] = {0.1, 0.12, 0.05, 0.3, 0.3, 0.3, 0.3, 0.02, 0.02};
  for (as::worker_id w = 0; w < 2; ++w) {
    for (double x : xs) {
      for (auto k : {measurement_kind::compute, measurement_kind::push, measurement_kind::pull}) {
        const ashl::measurement m{.worker = w, .kind = k, .seconds = x, .amount = 500};
        auto a = r.observe(m, n1);
        auto c = back.observe(m, n2);
        BOOST_TEST_REQUIRE(a.has_value());
        BOOST_TEST_REQUIRE(c.has_value());
        BOOST_TEST(*a == *c);
        if (*a) BOOST_TEST((n1 == n2));
      }
    }
  }
  BOOST_TEST((back == r));
  BOOST_TEST(r.state()->replans() >= 1u);
  // A damaged state is refused and leaves the target unchanged.
  for (std::size_t cut : {std::size_t{3}, b.size() / 2, b.size() - 1}) {
    std::vector<std::byte> part(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(cut));
    ashl::state_reader pin(part);
    aps::profile_replanner t = idle;
    BOOST_TEST(!t.load(pin).ok());
    BOOST_TEST((t == idle));
  }
}

// ---- with the ASHL schedule (sync/ashl_schedule.hpp) ------------------------

namespace {
as::outcome_sink sink;
as::outcome_sink& fresh() {
  sink.clear();
  return sink;
}

using planned = as::ashl_schedule<aps::profile_planner>;
using replanned = as::ashl_schedule<aps::profile_planner, aps::profile_replanner>;

// Two workers profiled with one commit each; dense pushes of 1000 bytes.
replanned replanning_schedule(double drift) {
  replanned p{{.workers = 2, .profile_iterations = 1}, aps::profile_planner{.trim = 1},
              aps::profile_replanner({.trim = 1}, {.drift = drift, .half_life = 2})};
  for (const auto& m : two_workers().measurements) p.on_measurement(m, fresh());
  (void)p.on_commit({.worker = 0, .sequence = 1}, fresh());
  (void)p.on_commit({.worker = 1, .sequence = 1}, fresh());
  return p;
}

bool plans_changed(replanned& p, const ashl::measurement& m) {
  p.on_measurement(m, fresh());
  return sink.any_plan_changed();
}
}  // namespace

BOOST_AUTO_TEST_CASE(drives_an_ashl_schedule) {
  planned p{{.workers = 2, .profile_iterations = 1}, aps::profile_planner{.trim = 1}};
  for (const auto& m : two_workers().measurements) p.on_measurement(m, fresh());
  (void)p.on_commit({.worker = 0, .sequence = 1}, fresh());
  (void)p.on_commit({.worker = 1, .sequence = 1}, fresh());
  BOOST_TEST(p.planner_status().ok(), p.planner_status().to_string());
  BOOST_TEST((p.stage() == stage_id::ahl));
  BOOST_TEST(p.plan(1).local_iterations == 16u);
  BOOST_TEST(p.plan(0).data_share == static_cast<float>(1.0 / 3), tt::tolerance(1e-6f));
}

BOOST_AUTO_TEST_CASE(schedule_replans_on_a_persistent_slowdown) {
  auto p = replanning_schedule(0.2);
  BOOST_TEST_REQUIRE((p.stage() == stage_id::ahl));
  BOOST_TEST_REQUIRE(p.replan_status().ok(), p.replan_status().to_string());
  BOOST_TEST(p.plan(1).local_iterations == 16u);
  BOOST_TEST(!plans_changed(p, {.worker = 1, .kind = measurement_kind::compute, .seconds = 0.065}));
  BOOST_TEST(p.replans() == 0u);
  bool changed = false;
  for (int k = 0; k < 10 && !changed; ++k)
    changed = plans_changed(p, {.worker = 1, .kind = measurement_kind::compute, .seconds = 0.10});
  BOOST_TEST_REQUIRE(changed);
  BOOST_TEST(p.replans() == 1u);
  BOOST_TEST(p.plan(1).local_iterations < 16u);
  BOOST_TEST(p.plan(1).local_iterations >= 8u);
  BOOST_TEST(p.plan(1).data_share < static_cast<float>(2.0 / 3));
  BOOST_TEST(p.plan(0).data_share + p.plan(1).data_share == 1.0f, tt::tolerance(1e-6f));
}

BOOST_AUTO_TEST_CASE(schedule_keeps_the_plan_when_the_replanner_cannot_start) {
  auto p = replanning_schedule(-1.0);
  BOOST_TEST(p.planner_status().ok());
  BOOST_TEST((p.stage() == stage_id::ahl));
  BOOST_TEST(!p.replanner().started());
  BOOST_TEST(!plans_changed(p, {.worker = 1, .kind = measurement_kind::compute, .seconds = 1.0}));
  BOOST_TEST(p.plan(1).local_iterations == 16u);
}

BOOST_AUTO_TEST_CASE(schedule_with_both_saves_and_loads) {
  auto p = replanning_schedule(0.2);
  (void)plans_changed(p, {.worker = 1, .kind = measurement_kind::compute, .seconds = 0.08});
  const auto b = saved(p);
  replanned q{{.workers = 2}};
  ashl::state_reader in(b);
  const auto s = q.load(in);
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  BOOST_TEST((q.replanner() == p.replanner()));
  BOOST_TEST((q.planner() == p.planner()));
  for (int k = 0; k < 10; ++k) {
    const ashl::measurement m{.worker = 1, .kind = measurement_kind::compute, .seconds = 0.10};
    BOOST_TEST(plans_changed(p, m) == plans_changed(q, m));
    BOOST_TEST((p.plan(1) == q.plan(1)));
  }
  BOOST_TEST(p.replans() == q.replans());
}
