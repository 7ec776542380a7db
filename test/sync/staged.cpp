#include <ashl/sync/staged.hpp>

#include <ashl/sync/asp.hpp>
#include <ashl/sync/bsp.hpp>
#include <ashl/sync/ssp.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <vector>

namespace as = ashl::sync;

static_assert(as::consistency_policy<as::staged<as::asp, as::ssp>>);
static_assert(as::consistency_policy<as::staged<as::bsp, as::asp, as::ssp>>);

BOOST_AUTO_TEST_CASE(loss_threshold_switches_once_and_nan_never_does) {
  as::staged<as::asp, as::ssp> p{{as::switch_trigger{.loss_below = 0.3}},
                                  as::asp{{.workers = 2}},
                                  as::ssp{{.workers = 2, .staleness = 0}}};
  BOOST_TEST(p.name() == "asp");
  BOOST_TEST(p.on_metric({.name = "loss", .value = std::nan(""), .time = 1}).empty());
  BOOST_TEST(p.on_metric({.name = "loss", .value = -std::numeric_limits<double>::infinity(), .time = 2}).empty());
  BOOST_TEST(p.on_metric({.name = "accuracy", .value = 0.1, .time = 3}).empty());
  BOOST_TEST(p.stage() == 0u);
  auto o = p.on_metric({.name = "loss", .value = 0.29, .time = 4});
  BOOST_TEST(o.plans_changed);
  BOOST_TEST(p.stage() == 1u);
  BOOST_TEST(p.name() == "ssp");
  BOOST_TEST(p.plan(0).stage == "ssp");
  BOOST_TEST(p.switched_at(1) == 4.0);
  // SSP(0) now holds a pull of a worker ahead.
  (void)p.on_commit({.worker = 0, .sequence = 1});
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::hold));
  BOOST_TEST(p.on_metric({.name = "loss", .value = 0.1, .time = 5}).empty());  // no further stage
}

BOOST_AUTO_TEST_CASE(plateau_trigger) {
  as::staged<as::asp, as::asp> p{{as::switch_trigger{.plateau_window = 3, .plateau_epsilon = 0.05}},
                                  as::asp{{.workers = 1, .stage = "a"}},
                                  as::asp{{.workers = 1, .stage = "b"}}};
  const double losses[] = {1.0, 0.8, 0.6, 0.5, 0.49, 0.485};
  (void)p.on_metric({.value = losses[0], .time = 0});
  (void)p.on_metric({.value = losses[1], .time = 1});
  (void)p.on_metric({.value = std::nan(""), .time = 1.5});  // not an evaluation
  (void)p.on_metric({.value = losses[2], .time = 2});
  (void)p.on_metric({.value = losses[3], .time = 3});  // 1.0 -> 0.5 over 3: improving
  BOOST_TEST(p.stage() == 0u);
  (void)p.on_metric({.value = losses[4], .time = 4});  // 0.8 -> 0.49
  BOOST_TEST(p.stage() == 0u);
  (void)p.on_metric({.value = losses[5], .time = 5});  // 0.6 -> 0.485: 19 %
  BOOST_TEST(p.stage() == 0u);
  (void)p.on_metric({.value = 0.48, .time = 6});  // 0.5 -> 0.48: 4 % < 5 %
  BOOST_TEST(p.stage() == 1u);
  BOOST_TEST(p.name() == "b");
}

BOOST_AUTO_TEST_CASE(switch_releases_held_pulls_and_flushes_buffered_commits) {
  as::staged<as::bsp, as::asp> p{{as::switch_trigger{.after_commits = 2}},
                                  as::bsp{{.workers = 3}},
                                  as::asp{{.workers = 3}}};
  (void)p.on_commit({.worker = 0, .sequence = 1});
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::hold));
  auto dup = p.on_commit({.worker = 0, .sequence = 1});  // duplicate: dropped, not counted
  BOOST_TEST((dup.action == as::commit_action::drop));
  BOOST_TEST(p.stage() == 0u);
  // Second accepted commit: buffered in BSP's (incomplete) round; the switch drains it.
  auto e = p.on_commit({.worker = 1, .sequence = 1});
  BOOST_TEST(p.stage() == 1u);
  BOOST_TEST((e.action == as::commit_action::buffer));
  BOOST_TEST((e.effects.round == std::vector<as::weighted_commit>{{0, 1, 0.5}, {1, 1, 0.5}}));
  BOOST_TEST((e.effects.released == std::vector<as::worker_id>{0}));
  BOOST_TEST(e.effects.plans_changed);
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 2}).action == as::commit_action::apply));
}

BOOST_AUTO_TEST_CASE(membership_reaches_every_stage) {
  as::staged<as::bsp, as::asp> p{{as::switch_trigger{.loss_below = 0.5}}, as::bsp{{.workers = 2}},
                                  as::asp{{.workers = 2}}};
  (void)p.on_commit({.worker = 0, .sequence = 1});
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::hold));
  auto o = p.on_evict({.worker = 1});  // unblocks the barrier
  BOOST_TEST((o.released == std::vector<as::worker_id>{0}));
  BOOST_TEST(!p.stage_policy<1>().is_live(1));
  (void)p.on_join({.worker = 4});
  BOOST_TEST(p.stage_policy<1>().is_live(4));
}

BOOST_AUTO_TEST_CASE(time_trigger_switches_on_any_event) {
  as::staged<as::asp, as::ssp, as::asp> p{
      {as::switch_trigger{.at_time = 10.0}, as::switch_trigger{.at_time = 20.0}},
      as::asp{{.workers = 2}}, as::ssp{{.workers = 2, .staleness = 0}}, as::asp{{.workers = 2, .stage = "last"}}};
  (void)p.on_pull({.worker = 0, .time = 9.0});
  BOOST_TEST(p.stage() == 0u);
  auto q = p.on_pull({.worker = 0, .time = 10.0});
  BOOST_TEST(p.stage() == 1u);
  BOOST_TEST(q.effects.plans_changed);
  (void)p.on_commit({.worker = 0, .sequence = 1, .time = 11.0});
  BOOST_TEST((p.on_pull({.worker = 0, .time = 11.0}).action == as::pull_action::hold));
  auto o = p.on_metric({.name = "loss", .value = 1.0, .time = 25.0});  // skips nothing, releases the held pull
  BOOST_TEST(p.stage() == 2u);
  BOOST_TEST(p.name() == "last");
  BOOST_TEST((o.released == std::vector<as::worker_id>{0}));
}
