#include <ashl/sync/adsp.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/policy_testing.hpp"

#include <cmath>
#include <limits>
#include <vector>

namespace as = ashl::sync;
using ashl::metric_id;
using ashl::measurement_kind;

namespace {
as::outcome_sink sink;  // reused by every event, as a driver does
as::outcome_sink& fresh() {
  sink.clear();
  return sink;
}
}  // namespace

BOOST_AUTO_TEST_CASE(fit_recovers_known_parameters) {
  const as::loss_curve truth{0.04, 0.5, 0.12};
  const double t0 = 100.0, t1 = 130.0, t2 = 160.0;
  auto f = as::fit_loss_curve(t0, truth(0.0), t1, truth(30.0), t2, truth(60.0));
  BOOST_REQUIRE(f.has_value());
  BOOST_TEST(std::abs(f->a2 - 0.04) < 1e-9);
  BOOST_TEST(std::abs(f->b - 0.5) < 1e-9);
  BOOST_TEST(std::abs(f->c - 0.12) < 1e-9);
  // Uneven spacing too.
  auto g = as::fit_loss_curve(0.0, truth(0.0), 7.0, truth(7.0), 61.0, truth(61.0));
  BOOST_REQUIRE(g.has_value());
  BOOST_TEST(std::abs(g->c - 0.12) < 1e-9);
}

BOOST_AUTO_TEST_CASE(fit_rejects_degenerate_systems) {
  BOOST_TEST(!as::fit_loss_curve(0, 3, 1, 2, 2, 1).has_value());      // collinear: no finite c
  BOOST_TEST(!as::fit_loss_curve(0, 1, 1, 2, 2, 2.5).has_value());    // rising loss: a² < 0
  BOOST_TEST(!as::fit_loss_curve(0, 1, 0, 2, 2, 3).has_value());      // repeated time
  BOOST_TEST(!as::fit_loss_curve(0, std::nan(""), 1, 2, 2, 3).has_value());
}

BOOST_AUTO_TEST_CASE(reward_guards_unreachable_targets) {
  const double ninf = -std::numeric_limits<double>::infinity();
  BOOST_TEST(as::commit_rate_reward(as::loss_curve{1.0, 1.0, 0.5}, 0.3) == ninf);  // c >= target
  BOOST_TEST(as::commit_rate_reward(std::nullopt, 0.3) == ninf);
  // 1/(t + 1) + 0.1 = 0.2 at t* = 9.
  BOOST_TEST(std::abs(as::commit_rate_reward(as::loss_curve{1.0, 1.0, 0.1}, 0.2) - 1.0 / 9.0) < 1e-12);
}

BOOST_AUTO_TEST_CASE(plan_interval_and_weights) {
  as::adsp p{{.workers = 4, .period = 60.0, .t_min = 1.0}};
  BOOST_TEST(p.commit_rate() == 1u);
  BOOST_TEST(p.plan(0).commit_interval() == 60.0);
  BOOST_TEST(p.plan(0).local_iterations == 0u);
  BOOST_TEST((p.stage() == ashl::stage_id::adsp));
  BOOST_TEST((p.plan(0).stage == ashl::stage_id::adsp));
  auto& o = fresh();
  p.on_measurement({.worker = 2, .kind = measurement_kind::push, .seconds = 1.5}, o);
  BOOST_TEST((o.plans_changed().size() == 1u && o.plans_changed()[0] == 2u));  // only worker 2's plan
  BOOST_TEST(!o.every_plan_changed());
  p.on_measurement({.worker = 2, .kind = measurement_kind::pull, .seconds = 0.5}, fresh());
  BOOST_TEST(p.plan(2).commit_interval() == 58.0);
  BOOST_TEST(p.plan(2).commit_interval_us == 58'000'000u);
  // The same overhead again changes no plan.
  p.on_measurement({.worker = 2, .kind = measurement_kind::commit, .seconds = 2.0}, fresh());
  BOOST_TEST(!sink.any_plan_changed());
  p.on_measurement({.worker = 3, .kind = measurement_kind::commit, .seconds = 70.0}, fresh());
  BOOST_TEST(p.plan(3).commit_interval() == 1.0);  // t_min
  // One formula: the plan is ashl::adsp_commit_interval in microseconds.
  BOOST_TEST(p.plan(3).commit_interval_us == ashl::worker_plan::interval_us(ashl::adsp_commit_interval(60.0, 1, 70.0, 1.0)));
  BOOST_TEST(p.on_commit({.worker = 0, .sequence = 1}, fresh()).weight == 0.25);
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 1}, fresh()).action == as::commit_action::drop));
  p.on_evict({.worker = 3}, fresh());
  BOOST_TEST(p.on_commit({.worker = 0, .sequence = 2}, fresh()).weight == 1.0 / 3.0);
  BOOST_TEST((p.on_commit({.worker = 3, .sequence = 1}, fresh()).action == as::commit_action::drop));
  BOOST_TEST((p.on_pull({.worker = 1}, fresh()) == as::pull_action::serve));
  p.on_join({.worker = 6}, fresh());
  BOOST_TEST((sink.plans_changed().size() == 1u && sink.plans_changed()[0] == 6u));
  BOOST_TEST(p.on_commit({.worker = 6, .sequence = 1}, fresh()).weight == 0.25);
}

BOOST_AUTO_TEST_CASE(staleness_weighting_scales_the_commit) {
  as::adsp p{{.workers = 2, .staleness_weight = as::staleness_weighting::inverse()}};
  p.on_pull({.worker = 1}, fresh());
  (void)p.on_commit({.worker = 0, .sequence = 1}, fresh());
  (void)p.on_commit({.worker = 0, .sequence = 2}, fresh());
  BOOST_TEST(p.staleness(1) == 2u);
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 1}, fresh()).weight == 0.5 * (1.0 / 3.0));
}

namespace {
// Synthetic training: while ΔC = r is in force, the loss continues from where
// it was along 1/(a(r)² (t − t_r) + b_r) + 0.1 (b_r makes it continuous at the
// switch time t_r), with a(r)² largest at r = 3, sharply enough that ΔC = 3
// reaches the target soonest although later trials start lower.
double a2_of(std::uint32_t r) { return 0.05 / (1.0 + (static_cast<double>(r) - 3.0) * (static_cast<double>(r) - 3.0)); }

struct synthetic_run {
  as::adsp p;
  double now = 0.0;
  double trial_start = 0.0;
  double b = 1.0;
  std::uint32_t rate = 0;
  double loss() const { return 1.0 / (a2_of(rate) * (now - trial_start) + b) + 0.1; }
  void step(double dt) {
    now += dt;
    const double l = loss();
    p.on_metric({.metric = metric_id::loss, .value = l, .time = now}, fresh());
    if (p.commit_rate() != rate) {
      rate = p.commit_rate();
      trial_start = now;
      b = 1.0 / (l - 0.1);
    }
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(search_finds_the_known_best_commit_rate) {
  synthetic_run run{as::adsp{{.workers = 2, .period = 40.0, .search_every = 1e9, .target_loss = 0.2}}};
  run.rate = run.p.commit_rate();
  run.p.on_metric({.metric = metric_id::loss, .value = run.loss(), .time = 0.0}, fresh());
  for (int i = 0; i < 200 && run.p.searching(); ++i) run.step(10.0);
  BOOST_TEST(!run.p.searching());
  BOOST_TEST(run.p.commit_rate() == 3u);
  BOOST_TEST(run.p.plan(0).commit_interval_us == ashl::worker_plan::interval_us(40.0 / 3.0));
}

BOOST_AUTO_TEST_CASE(nan_loss_is_ignored_and_a_loss_rise_restarts_the_search) {
  synthetic_run run{as::adsp{{.workers = 2, .period = 40.0, .search_every = 1e9, .target_loss = 0.2}}};
  run.rate = run.p.commit_rate();
  run.p.on_metric({.metric = metric_id::loss, .value = std::nan(""), .time = 0.0}, fresh());
  run.p.on_metric({.metric = metric_id::loss, .value = run.loss(), .time = 0.0}, fresh());
  for (int i = 0; i < 200 && run.p.searching(); ++i) {
    run.step(10.0);
    run.p.on_metric({.metric = metric_id::loss, .value = std::numeric_limits<double>::infinity(), .time = run.now}, fresh());
  }
  BOOST_TEST(run.p.commit_rate() == 3u);
  BOOST_TEST(run.p.searches_done() == 1u);
  // Loss jumps up by 50 % a period later: a new search starts from ΔC = 1.
  const double t = run.now;
  run.p.on_metric({.metric = metric_id::loss, .value = run.loss(), .time = t + 20.0}, fresh());
  run.p.on_metric({.metric = metric_id::loss, .value = 1.5 * run.loss() + 0.5, .time = t + 41.0}, fresh());
  BOOST_TEST(run.p.searching());
  BOOST_TEST(sink.every_plan_changed());
  BOOST_TEST(run.p.commit_rate() == 1u);
}

BOOST_AUTO_TEST_CASE(search_reruns_after_t_search) {
  synthetic_run run{as::adsp{{.workers = 2, .period = 40.0, .search_every = 500.0, .target_loss = 0.2}}};
  run.rate = run.p.commit_rate();
  run.p.on_metric({.metric = metric_id::loss, .value = run.loss(), .time = 0.0}, fresh());
  for (int i = 0; i < 200 && run.p.searching(); ++i) run.step(10.0);
  BOOST_TEST(!run.p.searching());
  for (int i = 0; i < 49; ++i) run.step(10.0);
  BOOST_TEST(!run.p.searching());
  for (int i = 0; i < 2 && !run.p.searching(); ++i) run.step(10.0);
  BOOST_TEST(run.p.searching());
}

BOOST_AUTO_TEST_CASE(the_metric_read_is_a_parameter) {
  as::adsp p{{.workers = 2, .period = 10.0, .metric = metric_id::accuracy}};
  p.on_metric({.metric = metric_id::loss, .value = 1.0, .time = 0.0}, fresh());
  p.on_metric({.metric = metric_id::loss, .value = 0.9, .time = 6.0}, fresh());
  p.on_metric({.metric = metric_id::loss, .value = 0.8, .time = 11.0}, fresh());
  BOOST_TEST(p.commit_rate() == 1u);  // loss is not what it reads
  p.on_metric({.metric = metric_id::accuracy, .value = 1.0, .time = 0.0}, fresh());
  p.on_metric({.metric = metric_id::accuracy, .value = 0.9, .time = 6.0}, fresh());
  p.on_metric({.metric = metric_id::accuracy, .value = 0.8, .time = 11.0}, fresh());
  BOOST_TEST(p.commit_rate() == 2u);  // the first trial ended: ΔC + 1
}

BOOST_AUTO_TEST_CASE(save_load_round_trip_and_truncation) {
  policy_testing::check_round_trip(as::adsp{{.workers = 4, .period = 2.0, .search_every = 30.0, .target_loss = 0.2,
                                             .staleness_weight = as::staleness_weighting::power(0.5)}},
                                   4, 11);
  as::adsp p{{.workers = 3, .period = 4.0}};
  p.on_measurement({.worker = 1, .kind = measurement_kind::push, .seconds = 0.5}, fresh());
  (void)p.on_commit({.worker = 0, .sequence = 1}, fresh());
  p.on_metric({.metric = metric_id::loss, .value = 1.0, .time = 0.0}, fresh());
  policy_testing::check_load_rejects_truncation(p);
}

// A trial ends at the first metric at or past start + period. Metrics on a
// grid that divides the period land on that boundary; a tick converted
// between two clocks (a real harness stamping its evaluations with their
// ticks on the server's clock) can land a rounding error short of it, and
// must end the trial as the simulator's exact tick does. A metric a
// millisecond short does not.
BOOST_AUTO_TEST_CASE(a_trial_ends_on_its_boundary_within_a_clock_rounding) {
  auto trial_after = [](double last_tick) {
    as::adsp p{{.workers = 2, .period = 5.0, .search_every = 1e9, .target_loss = 0.2}};
    const double start = 0.647;
    const double losses[] = {2.0, 1.6, 1.3, 1.1, 1.0};
    const double times[] = {start, start + 1.25, start + 2.5, start + 3.75, last_tick};
    for (int k = 0; k < 5; ++k) p.on_metric({.metric = metric_id::loss, .value = losses[k], .time = times[k]}, fresh());
    return p.commit_rate();
  };
  const std::uint32_t first = as::adsp{{.workers = 2, .period = 5.0}}.commit_rate();
  BOOST_TEST(trial_after(0.647 + 5.0) == first + 1);          // exactly on the boundary
  BOOST_TEST(trial_after(0.647 + 5.0 - 1e-9) == first + 1);   // a rounding error short
  BOOST_TEST(trial_after(0.647 + 5.0 - 1e-3) == first);       // a millisecond short: not yet
}
