#include <ashl/sync/ashl.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
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
