#include <ashl/sync/staged.hpp>

#include <ashl/sync/asp.hpp>
#include <ashl/sync/bsp.hpp>
#include <ashl/sync/ssp.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <vector>

namespace as = ashl::sync;
using ashl::metric_id;
using ashl::stage_id;

static_assert(as::consistency_policy<as::staged<as::asp, as::ssp>>);
static_assert(as::consistency_policy<as::staged<as::bsp, as::asp, as::ssp>>);

namespace {
as::outcome_sink sink;  // reused by every event, as a driver does
as::outcome_sink& fresh() {
  sink.clear();
  return sink;
}
std::vector<as::worker_id> released() { return {sink.released().begin(), sink.released().end()}; }
std::vector<as::weighted_commit> round() { return {sink.round().begin(), sink.round().end()}; }
}  // namespace

BOOST_AUTO_TEST_CASE(loss_threshold_switches_once_and_nan_never_does) {
  as::staged<as::asp, as::ssp> p{{as::switch_trigger{.loss_below = 0.3}},
                                  as::asp{{.workers = 2}},
                                  as::ssp{{.workers = 2, .staleness = 0}}};
  BOOST_TEST((p.stage() == stage_id::asp));
  p.on_metric({.metric = metric_id::loss, .value = std::nan(""), .time = 1}, fresh());
  BOOST_TEST(sink.empty());
  p.on_metric({.metric = metric_id::loss, .value = -std::numeric_limits<double>::infinity(), .time = 2}, fresh());
  BOOST_TEST(sink.empty());
  p.on_metric({.metric = metric_id::accuracy, .value = 0.1, .time = 3}, fresh());
  BOOST_TEST(sink.empty());
  BOOST_TEST(p.stage_index() == 0u);
  p.on_metric({.metric = metric_id::loss, .value = 0.29, .time = 4}, fresh());
  BOOST_TEST(sink.every_plan_changed());
  BOOST_TEST(p.stage_index() == 1u);
  BOOST_TEST((p.stage() == stage_id::ssp));
  BOOST_TEST((p.plan(0).stage == stage_id::ssp));
  BOOST_TEST(p.switched_at(1) == 4.0);
  // SSP(0) now holds a pull of a worker ahead.
  (void)p.on_commit({.worker = 0, .sequence = 1}, fresh());
  BOOST_TEST((p.on_pull({.worker = 0}, fresh()) == as::pull_action::hold));
  p.on_metric({.metric = metric_id::loss, .value = 0.1, .time = 5}, fresh());  // no further stage
  BOOST_TEST(sink.empty());
}

BOOST_AUTO_TEST_CASE(the_trigger_reads_its_own_metric) {
  as::staged<as::asp, as::ssp> p{{as::switch_trigger{.loss_below = 0.5, .metric = metric_id::accuracy}},
                                  as::asp{{.workers = 2}},
                                  as::ssp{{.workers = 2}}};
  p.on_metric({.metric = metric_id::loss, .value = 0.1, .time = 1}, fresh());
  BOOST_TEST(p.stage_index() == 0u);
  p.on_metric({.metric = metric_id::accuracy, .value = 0.4, .time = 2}, fresh());
  BOOST_TEST(p.stage_index() == 1u);
}

BOOST_AUTO_TEST_CASE(plateau_trigger) {
  as::staged<as::asp, as::asp> p{{as::switch_trigger{.plateau_window = 3, .plateau_epsilon = 0.05}},
                                  as::asp{{.workers = 1, .stage = stage_id::ahl}},
                                  as::asp{{.workers = 1, .stage = stage_id::shl}}};
  const double losses[] = {1.0, 0.8, 0.6, 0.5, 0.49, 0.485};
  p.on_metric({.value = losses[0], .time = 0}, fresh());
  p.on_metric({.value = losses[1], .time = 1}, fresh());
  p.on_metric({.value = std::nan(""), .time = 1.5}, fresh());  // not an evaluation
  p.on_metric({.value = losses[2], .time = 2}, fresh());
  p.on_metric({.value = losses[3], .time = 3}, fresh());  // 1.0 -> 0.5 over 3: improving
  BOOST_TEST(p.stage_index() == 0u);
  p.on_metric({.value = losses[4], .time = 4}, fresh());  // 0.8 -> 0.49
  BOOST_TEST(p.stage_index() == 0u);
  p.on_metric({.value = losses[5], .time = 5}, fresh());  // 0.6 -> 0.485: 19 %
  BOOST_TEST(p.stage_index() == 0u);
  p.on_metric({.value = 0.48, .time = 6}, fresh());  // 0.5 -> 0.48: 4 % < 5 %
  BOOST_TEST(p.stage_index() == 1u);
  BOOST_TEST((p.stage() == stage_id::shl));
}

BOOST_AUTO_TEST_CASE(switch_releases_held_pulls_and_flushes_buffered_commits) {
  as::staged<as::bsp, as::asp> p{{as::switch_trigger{.after_commits = 2}},
                                  as::bsp{{.workers = 3}},
                                  as::asp{{.workers = 3}}};
  (void)p.on_commit({.worker = 0, .sequence = 1}, fresh());
  BOOST_TEST((p.on_pull({.worker = 0}, fresh()) == as::pull_action::hold));
  auto dup = p.on_commit({.worker = 0, .sequence = 1}, fresh());  // duplicate: dropped, not counted
  BOOST_TEST((dup.action == as::commit_action::drop));
  BOOST_TEST(p.stage_index() == 0u);
  // Second accepted commit: buffered in BSP's (incomplete) round; the switch drains it.
  auto e = p.on_commit({.worker = 1, .sequence = 1}, fresh());
  BOOST_TEST(p.stage_index() == 1u);
  BOOST_TEST((e.action == as::commit_action::buffer));
  BOOST_TEST((round() == std::vector<as::weighted_commit>{{0, 1, 0.5}, {1, 1, 0.5}}));
  BOOST_TEST((released() == std::vector<as::worker_id>{0}));
  BOOST_TEST(sink.every_plan_changed());
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 2}, fresh()).action == as::commit_action::apply));
}

BOOST_AUTO_TEST_CASE(membership_reaches_every_stage_and_only_the_current_one_speaks) {
  as::staged<as::bsp, as::asp> p{{as::switch_trigger{.loss_below = 0.5}}, as::bsp{{.workers = 2}},
                                  as::asp{{.workers = 2}}};
  (void)p.on_commit({.worker = 0, .sequence = 1}, fresh());
  BOOST_TEST((p.on_pull({.worker = 0}, fresh()) == as::pull_action::hold));
  p.on_evict({.worker = 1}, fresh());  // unblocks the barrier
  BOOST_TEST((released() == std::vector<as::worker_id>{0}));
  BOOST_TEST(!p.stage_policy<1>().is_live(1));
  p.on_join({.worker = 4}, fresh());
  BOOST_TEST(p.stage_policy<1>().is_live(4));
  BOOST_TEST(p.stage_policy<0>().is_live(4));
}

BOOST_AUTO_TEST_CASE(time_trigger_switches_on_any_event) {
  as::staged<as::asp, as::ssp, as::asp> p{
      {as::switch_trigger{.at_time = 10.0}, as::switch_trigger{.at_time = 20.0}},
      as::asp{{.workers = 2}}, as::ssp{{.workers = 2, .staleness = 0}},
      as::asp{{.workers = 2, .stage = stage_id::shl}}};
  (void)p.on_pull({.worker = 0, .time = 9.0}, fresh());
  BOOST_TEST(p.stage_index() == 0u);
  (void)p.on_pull({.worker = 0, .time = 10.0}, fresh());
  BOOST_TEST(p.stage_index() == 1u);
  BOOST_TEST(sink.every_plan_changed());
  (void)p.on_commit({.worker = 0, .sequence = 1, .time = 11.0}, fresh());
  BOOST_TEST((p.on_pull({.worker = 0, .time = 11.0}, fresh()) == as::pull_action::hold));
  p.on_metric({.metric = metric_id::loss, .value = 1.0, .time = 25.0}, fresh());  // releases the held pull
  BOOST_TEST(p.stage_index() == 2u);
  BOOST_TEST((p.stage() == stage_id::shl));
  BOOST_TEST((released() == std::vector<as::worker_id>{0}));
}

BOOST_AUTO_TEST_CASE(save_and_load_round_trip_and_refuse_bad_bytes) {
  using sched = as::staged<as::asp, as::ssp>;
  const auto make = [] {
    return sched{{as::switch_trigger{.plateau_window = 2, .plateau_epsilon = 0.1}}, as::asp{{.workers = 2}},
                 as::ssp{{.workers = 2, .staleness = 0}}};
  };
  sched a = make();
  a.on_metric({.value = 0.5, .time = 0}, fresh());
  a.on_metric({.value = 0.49, .time = 1}, fresh());  // one more flat evaluation switches
  std::vector<std::byte> bytes;
  ashl::state_writer w(bytes);
  a.save(w);
  sched b{{as::switch_trigger{.loss_below = 0.9}}, as::asp{{.workers = 2}}, as::ssp{{.workers = 2}}};
  ashl::state_reader r(bytes);
  BOOST_TEST_REQUIRE(b.load(r).ok());
  BOOST_TEST(b.triggers()[0].plateau_window == 2u);  // the parameters come from the bytes
  BOOST_TEST(std::isnan(b.triggers()[0].loss_below));
  BOOST_TEST(b.stage_index() == 0u);
  a.on_metric({.value = 0.48, .time = 2}, fresh());
  b.on_metric({.value = 0.48, .time = 2}, fresh());
  BOOST_TEST(a.stage_index() == 1u);
  BOOST_TEST(b.stage_index() == 1u);
  // Truncated bytes are refused and the object is unchanged.
  sched c = make();
  ashl::state_reader t(std::span<const std::byte>(bytes).first(bytes.size() - 3));
  BOOST_TEST(!c.load(t).ok());
  BOOST_TEST(c.stage_index() == 0u);
  c.on_metric({.value = 1.0, .time = 0}, fresh());
  BOOST_TEST(c.stage_index() == 0u);  // its history was not half-loaded
}
