#include <ashl/sync/ashl_profile.hpp>

#include <boost/test/unit_test.hpp>

#include <vector>

namespace as = ashl::sync;
namespace tt = boost::test_tools;

namespace {
as::profile_report two_workers() {
  as::profile_report r;
  r.live = {0, 1};
  const double iter[2] = {0.10, 0.05};
  for (as::worker_id w = 0; w < 2; ++w) {
    for (int k = 0; k < 5; ++k) {
      r.measurements.push_back({.worker = w, .kind = as::measurement_kind::compute, .seconds = iter[w]});
      r.measurements.push_back({.worker = w, .kind = as::measurement_kind::push, .seconds = 0.02});
      r.measurements.push_back({.worker = w, .kind = as::measurement_kind::pull, .seconds = 0.02});
    }
    // One outlier each, trimmed away.
    r.measurements.push_back({.worker = w, .kind = as::measurement_kind::compute, .seconds = 5.0});
  }
  return r;
}
}  // namespace

BOOST_AUTO_TEST_CASE(algorithms_1_and_2_as_the_schedule_planner) {
  auto plan = as::profile_planner({.h_ahl = 8, .h_shl = 2, .r0 = 0.1, .trim = 1})(two_workers());
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
}

BOOST_AUTO_TEST_CASE(missing_measurements_are_an_error) {
  as::profile_report r;
  r.live = {0};
  auto plan = as::profile_planner()(r);
  BOOST_TEST_REQUIRE(!plan.has_value());
  BOOST_TEST(plan.error().message() == "ashl_profile.worker[0].compute = 0: no samples");
}

BOOST_AUTO_TEST_CASE(drives_an_ashl_schedule) {
  as::ashl_schedule p{{.workers = 2, .profile_iterations = 1, .planner = as::profile_planner({.trim = 1})}};
  for (const auto& m : two_workers().measurements) (void)p.on_measurement(m);
  (void)p.on_commit({.worker = 0, .sequence = 1});
  (void)p.on_commit({.worker = 1, .sequence = 1});
  BOOST_TEST(p.planner_status().ok());
  BOOST_TEST(p.phase() == "ahl");
  BOOST_TEST(p.plan(1).local_iterations == 16u);
  BOOST_TEST(p.plan(0).data_share == 1.0 / 3, tt::tolerance(1e-12));
}

namespace {
// Two workers profiled with one commit each; dense pushes of 1000 bytes.
as::ashl_schedule replanning_schedule(double drift) {
  as::ashl_schedule p{{.workers = 2, .profile_iterations = 1, .planner = as::profile_planner({.trim = 1}),
                       .replanner = as::profile_replanner({.trim = 1}, {.drift = drift, .half_life = 2})}};
  for (auto m : two_workers().measurements) {
    if (m.kind == as::measurement_kind::push) m.amount = 1000;
    (void)p.on_measurement(m);
  }
  (void)p.on_commit({.worker = 0, .sequence = 1});
  (void)p.on_commit({.worker = 1, .sequence = 1});
  return p;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_persistent_slowdown_replans_once_a_blip_does_not) {
  auto p = replanning_schedule(0.2);
  BOOST_TEST_REQUIRE(p.phase() == "ahl");
  BOOST_TEST_REQUIRE(p.replan_status().ok());
  BOOST_TEST(p.plan(1).local_iterations == 16u);
  // One slow sample moves the EWMA by half the gap (half-life 2): 0.05 -> 0.0575, inside 20 %.
  BOOST_TEST(!p.on_measurement({.worker = 1, .kind = as::measurement_kind::compute, .seconds = 0.065}).plans_changed);
  BOOST_TEST(p.replans() == 0u);
  // The fast worker becomes as slow as the other: after a few samples the
  // EWMA is more than 20 % off and Algorithm 1 gives both H = 8, D = 1/2.
  bool changed = false;
  for (int k = 0; k < 10 && !changed; ++k)
    changed = p.on_measurement({.worker = 1, .kind = as::measurement_kind::compute, .seconds = 0.10}).plans_changed;
  BOOST_TEST_REQUIRE(changed);
  BOOST_TEST(p.replans() == 1u);
  BOOST_TEST(p.plan(1).local_iterations < 16u);
  BOOST_TEST(p.plan(1).local_iterations >= 8u);
  BOOST_TEST(p.plan(1).data_share < 2.0 / 3);
  BOOST_TEST(p.plan(0).data_share + p.plan(1).data_share == 1.0, tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(a_compressed_push_is_scaled_to_the_dense_size) {
  auto p = replanning_schedule(0.2);
  BOOST_TEST_REQUIRE(p.replan_status().ok());
  // Pushes of a tenth of the bytes in a tenth of the time: the link did not change.
  for (int k = 0; k < 20; ++k)
    BOOST_TEST(!p.on_measurement({.worker = 0, .kind = as::measurement_kind::push, .seconds = 0.002, .amount = 100})
                    .plans_changed);
  BOOST_TEST(p.replans() == 0u);
  // A tenth of the bytes in the same time: the link is 10x slower, re-plan.
  bool changed = false;
  for (int k = 0; k < 20 && !changed; ++k)
    changed = p.on_measurement({.worker = 0, .kind = as::measurement_kind::push, .seconds = 0.02, .amount = 100})
                  .plans_changed;
  BOOST_TEST(changed);
  BOOST_TEST(p.replans() == 1u);
  // Worker 0 now has the longer round: the other one gets more local steps.
  BOOST_TEST(p.plan(1).local_iterations > 16u);
}

BOOST_AUTO_TEST_CASE(a_bad_replanner_setting_is_reported_and_the_plan_kept) {
  auto p = replanning_schedule(-1.0);
  BOOST_TEST(p.planner_status().ok());
  BOOST_TEST(p.phase() == "ahl");
  BOOST_TEST(p.replan_status().message() == "replan.drift = -1: must be finite and > 0");
  BOOST_TEST(!p.on_measurement({.worker = 1, .kind = as::measurement_kind::compute, .seconds = 1.0}).plans_changed);
}
