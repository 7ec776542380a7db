#include <ashl/sync/ashl.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <optional>
#include <utility>
#include <vector>

namespace as = ashl::sync;

namespace {
// A planner in the spirit of Algorithm 1: worker 0 is twice as fast.
as::ashl_planner two_speed_planner(std::size_t* seen_measurements) {
  return [seen_measurements](const as::profile_report& r) -> ashl::result<as::ashl_plan> {
    *seen_measurements = r.measurements.size();
    as::ashl_plan p;
    p.workers = {{16, 4, 0.5, 0.25, 2.0 / 3.0, 0}, {8, 2, 0.1, 0.05, 1.0 / 3.0, 0}};
    return p;
  };
}
}  // namespace

BOOST_AUTO_TEST_CASE(profiling_then_ahl_then_shl) {
  std::size_t seen = 0;
  as::ashl_schedule p{{.workers = 2, .profile_iterations = 2, .planner = two_speed_planner(&seen)}};
  BOOST_TEST(p.phase() == "profile");
  BOOST_TEST(p.plan(0).local_iterations == 1u);
  (void)p.on_measurement({.worker = 0, .kind = as::measurement_kind::compute, .seconds = 0.1});
  (void)p.on_measurement({.worker = 1, .kind = as::measurement_kind::compute, .seconds = 0.2});
  BOOST_TEST(p.on_commit({.worker = 0, .sequence = 1}).weight == 0.5);
  (void)p.on_commit({.worker = 0, .sequence = 2});
  (void)p.on_commit({.worker = 1, .sequence = 1});
  BOOST_TEST(p.profiling());
  auto d = p.on_commit({.worker = 1, .sequence = 2});  // the last profiling commit
  BOOST_TEST((d.action == as::commit_action::apply));
  BOOST_TEST(d.effects.plans_changed);
  BOOST_TEST(!p.profiling());
  BOOST_TEST(seen == 2u);
  BOOST_TEST(p.planner_status().ok());
  BOOST_TEST(p.phase() == "ahl");
  BOOST_TEST(p.plan(0).local_iterations == 16u);
  BOOST_TEST(p.plan(0).compression_ratio == 0.5);
  BOOST_TEST(p.plan(1).data_share == 1.0 / 3.0);
  // AHL: applied at once with D_i, never held.
  BOOST_TEST(p.on_commit({.worker = 0, .sequence = 3}).weight == 2.0 / 3.0);
  for (std::uint64_t s = 4; s < 12; ++s) (void)p.on_commit({.worker = 0, .sequence = s});
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::serve));
  // NaN loss does not switch; 0.29 does.
  BOOST_TEST(p.on_metric({.name = "loss", .value = std::nan(""), .time = 5}).empty());
  BOOST_TEST(p.phase() == "ahl");
  auto o = p.on_metric({.name = "loss", .value = 0.29, .time = 6});
  BOOST_TEST(o.plans_changed);
  BOOST_TEST(p.phase() == "shl");
  BOOST_TEST(p.plan(1).local_iterations == 2u);
  BOOST_TEST(p.plan(1).compression_ratio == 0.05);
  // SHL: s = 3 counting SHL commits only (the AHL commits of worker 0 do not count).
  for (std::uint64_t s = 12; s < 16; ++s) BOOST_TEST(p.on_commit({.worker = 0, .sequence = s}).weight == 2.0 / 3.0);
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::hold));  // 4 − 0 > 3
  auto r = p.on_commit({.worker = 1, .sequence = 3});
  BOOST_TEST(r.weight == 1.0 / 3.0);
  BOOST_TEST((r.effects.released == std::vector<as::worker_id>{0}));
}

BOOST_AUTO_TEST_CASE(bad_plan_falls_back_to_uniform_and_says_why) {
  as::ashl_schedule p{{.workers = 2, .profile_iterations = 1, .planner = [](const as::profile_report&) -> ashl::result<as::ashl_plan> {
                         as::ashl_plan plan;
                         plan.workers = {{8, 2, 1.5, 1.0, 0.5, 0}, {8, 2, 1.0, 1.0, 0.5, 0}};
                         return plan;
                       }}};
  (void)p.on_commit({.worker = 0, .sequence = 1});
  (void)p.on_commit({.worker = 1, .sequence = 1});
  BOOST_TEST(!p.profiling());
  BOOST_TEST(!p.planner_status().ok());
  BOOST_TEST(p.planner_status().message() == "ashl.plan.ratio_ahl = 1.5: must be in (0, 1]");
  BOOST_TEST(p.plan(0).local_iterations == 8u);
  BOOST_TEST(p.plan(0).data_share == 0.5);
}

BOOST_AUTO_TEST_CASE(eviction_during_profiling_ends_it_and_carries_over) {
  as::ashl_schedule p{{.workers = 3, .profile_iterations = 1}};
  (void)p.on_commit({.worker = 0, .sequence = 1});
  (void)p.on_commit({.worker = 1, .sequence = 1});
  BOOST_TEST(p.profiling());
  auto o = p.on_evict({.worker = 2, .time = 3.0});  // nobody waits for worker 2
  BOOST_TEST(o.plans_changed);
  BOOST_TEST(!p.profiling());
  BOOST_TEST(!p.is_live(2));
  BOOST_TEST(p.plan(0).data_share == 0.5);
  BOOST_TEST((p.on_commit({.worker = 2, .sequence = 2}).action == as::commit_action::drop));
}

BOOST_AUTO_TEST_CASE(profiling_by_time) {
  as::ashl_schedule p{{.workers = 2, .profile_iterations = 0, .profile_seconds = 10.0}};
  (void)p.on_pull({.worker = 0, .time = 1.0});
  (void)p.on_commit({.worker = 0, .sequence = 1, .time = 5.0});
  BOOST_TEST(p.profiling());
  auto q = p.on_pull({.worker = 1, .time = 11.0});
  BOOST_TEST(q.effects.plans_changed);
  BOOST_TEST(p.phase() == "ahl");
}

namespace {
// Three workers with shares 1/2, 1/4, 1/4 after one profiling commit each.
as::ashl_schedule three_workers(as::ashl_replanner_factory f = {}) {
  as::ashl_schedule p{{.workers = 3, .profile_iterations = 1,
                       .planner = [](const as::profile_report&) -> ashl::result<as::ashl_plan> {
                         as::ashl_plan plan;
                         plan.workers = {{8, 2, 0.2, 0.1, 0.5, 0}, {4, 1, 0.2, 0.1, 0.25, 0}, {4, 1, 0.2, 0.1, 0.25, 0}};
                         return plan;
                       },
                       .replanner = std::move(f)}};
  for (as::worker_id w = 0; w < 3; ++w) (void)p.on_commit({.worker = w, .sequence = 1});
  return p;
}
}  // namespace

BOOST_AUTO_TEST_CASE(eviction_renormalises_the_shares_and_a_joiner_gets_the_mean) {
  auto p = three_workers();
  BOOST_TEST_REQUIRE(p.phase() == "ahl");
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 2}).weight == 0.25);
  (void)p.on_evict({.worker = 0, .time = 1});
  // 0.25 / (0.25 + 0.25): the step does not shrink with the cluster.
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 3}).weight == 0.5);
  BOOST_TEST(p.plan(2).data_share == 0.5);
  // Worker 0 comes back with its planned share; a new worker 3 gets the mean.
  (void)p.on_join({.worker = 0, .time = 2});
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 4}).weight == 0.25);
  (void)p.on_join({.worker = 3, .time = 3});
  BOOST_TEST_REQUIRE(p.current_plan().workers.size() == 4u);
  BOOST_TEST(p.current_plan().workers[3].share == 1.0 / 3.0);
  BOOST_TEST(p.plan(3).compression_ratio == 0.2);
  BOOST_TEST(p.plan(3).local_iterations == 8u);
  BOOST_TEST(p.on_commit({.worker = 3, .sequence = 1}).weight > 0.0);
}

BOOST_AUTO_TEST_CASE(a_replanner_changes_the_plan_and_keeps_the_counters) {
  std::size_t built = 0;
  as::ashl_plan seen_first;
  auto factory = [&](const as::profile_report& r, const as::ashl_plan& first) -> ashl::result<as::ashl_replanner> {
    ++built;
    seen_first = first;
    BOOST_TEST(r.live.size() == 3u);
    return as::ashl_replanner{[](const as::measurement_event& m) -> ashl::result<std::optional<as::ashl_plan>> {
      if (m.worker != 2 || m.seconds < 1.0) return std::optional<as::ashl_plan>{};
      if (m.seconds > 5.0) return ashl::invalid_argument("test.seconds", m.seconds, "too slow to plan");
      as::ashl_plan next;
      // Worker 2 slowed down: fewer local steps, a smaller share.
      const double h = m.seconds > 2.0 ? 0.0 : 0.1;  // H = 0 is a bad plan
      next.workers = {{8, 2, 0.2, 0.1, 0.5, 0}, {4, 1, 0.2, 0.1, 0.3, 0}, {h > 0 ? 2u : 0u, 1, 0.2, 0.1, 0.2, 0}};
      return std::optional<as::ashl_plan>{next};
    }};
  };
  auto p = three_workers(factory);
  BOOST_TEST_REQUIRE(built == 1u);
  BOOST_TEST(seen_first.workers[0].share == 0.5);
  BOOST_TEST(p.plan(2).local_iterations == 4u);
  // A measurement that changes nothing.
  BOOST_TEST(!p.on_measurement({.worker = 2, .kind = as::measurement_kind::compute, .seconds = 0.5}).plans_changed);
  BOOST_TEST(p.replans() == 0u);
  // Switch to SHL and make worker 0 run ahead so that its pull is held.
  (void)p.on_metric({.name = "loss", .value = 0.1, .time = 1});
  BOOST_TEST_REQUIRE(p.phase() == "shl");
  for (std::uint64_t s = 2; s < 6; ++s) (void)p.on_commit({.worker = 0, .sequence = s});
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::hold));
  auto o = p.on_measurement({.worker = 2, .kind = as::measurement_kind::compute, .seconds = 1.5});
  BOOST_TEST(o.plans_changed);
  BOOST_TEST(p.replans() == 1u);
  BOOST_TEST(p.replan_status().ok());
  BOOST_TEST(p.plan(2).local_iterations == 1u);
  BOOST_TEST(p.plan(2).data_share == 0.2);
  BOOST_TEST(p.is_held(0));  // the SSP state survived the new plan
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 2}).weight == 0.3);
  // A bad plan (H = 0) and a replanner error are recorded; the plan stays.
  BOOST_TEST(!p.on_measurement({.worker = 2, .kind = as::measurement_kind::compute, .seconds = 3.0}).plans_changed);
  BOOST_TEST(p.replan_status().message() == "ashl.plan.h_ahl = 0: must be >= 1");
  (void)p.on_measurement({.worker = 2, .kind = as::measurement_kind::compute, .seconds = 6.0});
  BOOST_TEST(p.replan_status().message() == "test.seconds = 6: too slow to plan");
  BOOST_TEST(p.replans() == 1u);
  BOOST_TEST(p.plan(2).data_share == 0.2);
}
