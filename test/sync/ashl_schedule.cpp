#include <ashl/sync/ashl_schedule.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace as = ashl::sync;
using ashl::measurement_kind;
using ashl::metric_id;
using ashl::stage_id;

namespace {
as::outcome_sink sink;  // reused by every event, as a driver does
as::outcome_sink& fresh() {
  sink.clear();
  return sink;
}
float f(double v) { return static_cast<float>(v); }

// A planner in the spirit of Algorithm 1: worker 0 is twice as fast. Records
// how many measurements the report had.
struct two_speed_planner {
  std::size_t seen = 0;
  ashl::result<as::ashl_plan> plan(const as::profile_report& r) {
    seen = r.measurements.size();
    as::ashl_plan p;
    p.workers = {{16, 4, 0.5, 0.25, 2.0 / 3.0, 0}, {8, 2, 0.1, 0.05, 1.0 / 3.0, 0}};
    return p;
  }
  void save(ashl::state_writer& w) const { w.put<std::uint64_t>(seen); }
  ashl::status load(ashl::state_reader& r) { return r.get(seen, "two_speed.seen"); }
};

// A worker's profiling cycle as the drivers report it: its commit, then
// the cycle's compute measurement (sent when the cycle ends: worker_cycle).
// Returns the commit's decision; `sink` holds the measurement's outcomes.
template <class P>
as::commit_decision cycle(P& p, as::worker_id w, std::uint64_t sequence, double time = 0.0) {
  const auto d = p.on_commit({.worker = w, .sequence = sequence, .time = time}, fresh());
  p.on_measurement({.worker = w, .kind = measurement_kind::compute, .seconds = 0.1, .time = time}, fresh());
  return d;
}

// Returns a fixed plan.
struct fixed_planner {
  std::vector<as::ashl_worker_plan> workers;
  ashl::result<as::ashl_plan> plan(const as::profile_report&) const { return as::ashl_plan{workers}; }
  void save(ashl::state_writer&) const {}
  ashl::status load(ashl::state_reader&) { return {}; }
};
}  // namespace

static_assert(as::consistency_policy<as::ashl_schedule<two_speed_planner>>);

BOOST_AUTO_TEST_CASE(profiling_then_ahl_then_shl) {
  as::ashl_schedule<two_speed_planner> p{{.workers = 2, .profile_iterations = 2}};
  BOOST_TEST((p.stage() == stage_id::profile));
  BOOST_TEST(p.plan(0).local_iterations == 1u);
  BOOST_TEST((p.plan(0).stage == stage_id::profile));
  p.on_measurement({.worker = 0, .kind = measurement_kind::compute, .seconds = 0.1}, fresh());
  p.on_measurement({.worker = 1, .kind = measurement_kind::compute, .seconds = 0.2}, fresh());
  BOOST_TEST(p.on_commit({.worker = 0, .sequence = 1}, fresh()).weight == 0.5);
  (void)cycle(p, 0, 2);  // worker 0: 2 commits, 2 compute samples
  (void)p.on_commit({.worker = 1, .sequence = 1}, fresh());
  BOOST_TEST(p.profiling());
  auto d = p.on_commit({.worker = 1, .sequence = 2}, fresh());  // the last profiling commit
  BOOST_TEST((d.action == as::commit_action::apply));
  BOOST_TEST(p.profiling());  // its cycle's compute measurement is still on its way
  p.on_measurement({.worker = 1, .kind = measurement_kind::compute, .seconds = 0.2}, fresh());
  BOOST_TEST(sink.every_plan_changed());
  BOOST_TEST(!p.profiling());
  BOOST_TEST(p.planner().seen == 4u);
  BOOST_TEST(p.planner_status().ok());
  BOOST_TEST((p.stage() == stage_id::ahl));
  BOOST_TEST((p.plan(0).stage == stage_id::ahl));
  BOOST_TEST(p.plan(0).local_iterations == 16u);
  BOOST_TEST(p.plan(0).compression_ratio == 0.5f);
  BOOST_TEST(p.plan(1).data_share == f(1.0 / 3.0));
  // AHL: applied at once with D_i, never held.
  BOOST_TEST(p.on_commit({.worker = 0, .sequence = 3}, fresh()).weight == 2.0 / 3.0);
  for (std::uint64_t s = 4; s < 12; ++s) (void)p.on_commit({.worker = 0, .sequence = s}, fresh());
  BOOST_TEST((p.on_pull({.worker = 0}, fresh()) == as::pull_action::serve));
  // NaN loss does not switch; 0.29 does.
  p.on_metric({.metric = metric_id::loss, .value = std::nan(""), .time = 5}, fresh());
  BOOST_TEST(sink.empty());
  BOOST_TEST((p.stage() == stage_id::ahl));
  p.on_metric({.metric = metric_id::loss, .value = 0.29, .time = 6}, fresh());
  BOOST_TEST(sink.every_plan_changed());
  BOOST_TEST((p.stage() == stage_id::shl));
  BOOST_TEST(p.switched_at() == 6.0);
  BOOST_TEST(p.plan(1).local_iterations == 2u);
  BOOST_TEST(p.plan(1).compression_ratio == 0.05f);
  BOOST_TEST((p.plan(1).stage == stage_id::shl));
  // SHL: s = 3 counting SHL commits only (the AHL commits of worker 0 do not count).
  for (std::uint64_t s = 12; s < 16; ++s) BOOST_TEST(p.on_commit({.worker = 0, .sequence = s}, fresh()).weight == 2.0 / 3.0);
  BOOST_TEST((p.on_pull({.worker = 0}, fresh()) == as::pull_action::hold));  // 4 − 0 > 3
  auto r = p.on_commit({.worker = 1, .sequence = 3}, fresh());
  BOOST_TEST(r.weight == 1.0 / 3.0);
  BOOST_TEST((std::vector<as::worker_id>(sink.released().begin(), sink.released().end()) == std::vector<as::worker_id>{0}));
}

// A worker that floods measurements while profiling: past
// max_profile_measurements its own are dropped and counted, the other
// worker's are still kept, and the planner sees the bounded report.
BOOST_AUTO_TEST_CASE(measurements_kept_while_profiling_are_bounded_per_worker) {
  as::ashl_schedule<two_speed_planner> p{{.workers = 2, .profile_iterations = 1, .max_profile_measurements = 100}};
  for (int i = 0; i < 100000; ++i)
    p.on_measurement({.worker = 0, .kind = measurement_kind::compute, .seconds = 0.1}, fresh());
  p.on_measurement({.worker = 1, .kind = measurement_kind::compute, .seconds = 0.2}, fresh());
  BOOST_TEST(p.measurements_dropped() == 100000u - 100u);
  // Saved and loaded, the bound still holds for what is already kept.
  std::vector<std::byte> bytes;
  ashl::state_writer w(bytes);
  p.save(w);
  as::ashl_schedule<two_speed_planner> q{{.workers = 2, .profile_iterations = 1, .max_profile_measurements = 100}};
  ashl::state_reader r(bytes);
  BOOST_TEST_REQUIRE(q.load(r).ok());
  q.on_measurement({.worker = 0, .kind = measurement_kind::compute, .seconds = 0.1}, fresh());
  BOOST_TEST(q.measurements_dropped() == 1u);  // its own count; what p kept came with the state
  q.on_measurement({.worker = 1, .kind = measurement_kind::compute, .seconds = 0.2}, fresh());
  (void)q.on_commit({.worker = 0, .sequence = 1}, fresh());
  (void)q.on_commit({.worker = 1, .sequence = 1}, fresh());
  BOOST_TEST(!q.profiling());
  BOOST_TEST(q.planner().seen == 102u);
}

BOOST_AUTO_TEST_CASE(bad_plan_falls_back_to_uniform_and_says_why) {
  as::ashl_schedule<fixed_planner> p{{.workers = 2, .profile_iterations = 1},
                                     fixed_planner{{{8, 2, 1.5, 1.0, 0.5, 0}, {8, 2, 1.0, 1.0, 0.5, 0}}}};
  (void)cycle(p, 0, 1);
  (void)cycle(p, 1, 1);
  BOOST_TEST(!p.profiling());
  BOOST_TEST(!p.planner_status().ok());
  BOOST_TEST(p.planner_status().message() == "ashl.plan.ratio_ahl = 1.5: must be in (0, 1]");
  BOOST_TEST(p.plan(0).local_iterations == 8u);
  BOOST_TEST(p.plan(0).data_share == 0.5f);
}

BOOST_AUTO_TEST_CASE(eviction_during_profiling_ends_it_and_carries_over) {
  as::ashl_schedule<> p{{.workers = 3, .profile_iterations = 1}};
  (void)cycle(p, 0, 1);
  (void)cycle(p, 1, 1);
  BOOST_TEST(p.profiling());
  p.on_evict({.worker = 2, .time = 3.0}, fresh());  // nobody waits for worker 2
  BOOST_TEST(sink.every_plan_changed());
  BOOST_TEST(!p.profiling());
  BOOST_TEST(!p.is_live(2));
  BOOST_TEST(p.plan(0).data_share == 0.5f);
  BOOST_TEST((p.on_commit({.worker = 2, .sequence = 2}, fresh()).action == as::commit_action::drop));
}

BOOST_AUTO_TEST_CASE(a_worker_that_rejoins_during_profiling_starts_over) {
  as::ashl_schedule<> p{{.workers = 2, .profile_iterations = 2}};
  (void)cycle(p, 0, 1);
  (void)cycle(p, 0, 2);
  (void)cycle(p, 1, 1);
  p.on_evict({.worker = 0}, fresh());
  p.on_join({.worker = 0}, fresh());
  p.on_join({.worker = 5}, fresh());
  (void)cycle(p, 1, 2);
  BOOST_TEST(p.profiling());  // 0 and 5 have not made 2 commits since they joined
  // Worker 0's compute samples of its first life still count (the report
  // keeps them): its 2 commits suffice; worker 5 needs its measurements too.
  for (std::uint64_t s = 1; s <= 2; ++s) {
    (void)p.on_commit({.worker = 0, .sequence = s}, fresh());
    (void)p.on_commit({.worker = 5, .sequence = s}, fresh());
  }
  BOOST_TEST(p.profiling());
  p.on_measurement({.worker = 5, .kind = measurement_kind::compute, .seconds = 0.1}, fresh());
  BOOST_TEST(p.profiling());
  p.on_measurement({.worker = 5, .kind = measurement_kind::compute, .seconds = 0.1}, fresh());
  BOOST_TEST(!p.profiling());
  BOOST_TEST(p.live_count() == 3u);
  BOOST_TEST(p.plan(5).data_share == f(1.0 / 3.0));
}

// Issue 28's noticed defect: at a worker's N-th commit the server holds the
// compute measurements of N - 1 cycles (the N-th comes when the cycle
// ends), so the plan used to be made from N - 1 samples per worker, from
// none with N = 1. It waits for the N-th now; a worker whose measurements
// never come counts as profiled at its (N + 1)-th commit.
BOOST_AUTO_TEST_CASE(the_plan_waits_for_the_last_profiled_cycles_compute_measurement) {
  as::ashl_schedule<two_speed_planner> p{{.workers = 2, .profile_iterations = 1}};
  (void)p.on_commit({.worker = 0, .sequence = 1, .time = 1.0}, fresh());
  (void)p.on_commit({.worker = 1, .sequence = 1, .time = 2.0}, fresh());
  BOOST_TEST(p.profiling());
  p.on_measurement({.worker = 0, .kind = measurement_kind::push, .seconds = 0.1, .time = 1.5}, fresh());
  p.on_measurement({.worker = 0, .kind = measurement_kind::compute, .seconds = 0.1, .time = 1.5}, fresh());
  BOOST_TEST(sink.empty());
  BOOST_TEST(p.profiling());  // worker 1's is still on its way
  p.on_measurement({.worker = 1, .kind = measurement_kind::compute, .seconds = 0.2, .time = 2.5}, fresh());
  BOOST_TEST(sink.every_plan_changed());
  BOOST_TEST(!p.profiling());
  BOOST_TEST(p.planner().seen == 3u);  // one compute sample of each worker, and the push

  // Measurements that never come: profiled at the (N + 1)-th commit, with
  // what arrived.
  as::ashl_schedule<two_speed_planner> q{{.workers = 2, .profile_iterations = 2}};
  for (std::uint64_t s = 1; s <= 2; ++s) {
    (void)cycle(q, 0, s);
    (void)q.on_commit({.worker = 1, .sequence = s}, fresh());
  }
  BOOST_TEST(q.profiling());
  (void)q.on_commit({.worker = 1, .sequence = 3}, fresh());
  BOOST_TEST(sink.every_plan_changed());
  BOOST_TEST(!q.profiling());
  BOOST_TEST(q.planner().seen == 2u);

  // The samples are state: saved mid-profile and loaded, the count goes on.
  as::ashl_schedule<two_speed_planner> a{{.workers = 2, .profile_iterations = 2}};
  (void)cycle(a, 0, 1);
  (void)cycle(a, 0, 2);
  (void)cycle(a, 1, 1);
  (void)a.on_commit({.worker = 1, .sequence = 2}, fresh());
  std::vector<std::byte> bytes;
  ashl::state_writer w(bytes);
  a.save(w);
  as::ashl_schedule<two_speed_planner> b{{.workers = 2, .profile_iterations = 2}};
  ashl::state_reader r(bytes);
  BOOST_TEST_REQUIRE(b.load(r).ok());
  BOOST_TEST(b.profiling());
  b.on_measurement({.worker = 1, .kind = measurement_kind::compute, .seconds = 0.2}, fresh());
  BOOST_TEST(sink.every_plan_changed());
  BOOST_TEST(!b.profiling());
  BOOST_TEST(b.planner().seen == 4u);
}

BOOST_AUTO_TEST_CASE(profiling_by_time) {
  as::ashl_schedule<> p{{.workers = 2, .profile_iterations = 0, .profile_seconds = 10.0}};
  (void)p.on_pull({.worker = 0, .time = 1.0}, fresh());
  (void)p.on_commit({.worker = 0, .sequence = 1, .time = 5.0}, fresh());
  BOOST_TEST(p.profiling());
  (void)p.on_pull({.worker = 1, .time = 11.0}, fresh());
  BOOST_TEST(sink.every_plan_changed());
  BOOST_TEST((p.stage() == stage_id::ahl));
}

namespace {
// Re-plans when worker 2's compute time reaches 1 s: worker 2 slowed down,
// fewer local steps and a smaller share; 2..5 s gives a bad plan (H = 0),
// above 5 s an error.
struct test_replanner {
  static constexpr bool enabled = true;
  std::size_t started = 0;
  as::ashl_plan first;
  ashl::status start(const as::profile_report& r, const as::ashl_plan& plan) {
    ++started;
    first = plan;
    BOOST_TEST(r.live.size() == 3u);
    return {};
  }
  ashl::result<bool> observe(const as::measurement_event& m, as::ashl_plan& next) {
    if (m.worker != 2 || m.seconds < 1.0) return false;
    if (m.seconds > 5.0) return ashl::invalid_argument("test.seconds", m.seconds, "too slow to plan");
    const std::uint32_t h = m.seconds > 2.0 ? 0u : 2u;  // H = 0 is a bad plan
    next.workers = {{8, 2, 0.2, 0.1, 0.5, 0}, {4, 1, 0.2, 0.1, 0.3, 0}, {h, 1, 0.2, 0.1, 0.2, 0}};
    return true;
  }
  void save(ashl::state_writer& w) const { w.put<std::uint64_t>(started); }
  ashl::status load(ashl::state_reader& r) { return r.get(started, "test_replanner.started"); }
};
static_assert(as::ashl_replanner<test_replanner>);

// Three workers with shares 1/2, 1/4, 1/4 after one profiling commit each.
template <class R = as::no_replanner>
as::ashl_schedule<fixed_planner, R> three_workers() {
  as::ashl_schedule<fixed_planner, R> p{
      {.workers = 3, .profile_iterations = 1},
      fixed_planner{{{8, 2, 0.2, 0.1, 0.5, 0}, {4, 1, 0.2, 0.1, 0.25, 0}, {4, 1, 0.2, 0.1, 0.25, 0}}}};
  for (as::worker_id w = 0; w < 3; ++w) (void)cycle(p, w, 1);
  return p;
}
}  // namespace

BOOST_AUTO_TEST_CASE(eviction_renormalises_the_shares_and_a_joiner_gets_the_mean) {
  auto p = three_workers();
  BOOST_TEST_REQUIRE((p.stage() == stage_id::ahl));
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 2}, fresh()).weight == 0.25);
  p.on_evict({.worker = 0, .time = 1}, fresh());
  BOOST_TEST(sink.every_plan_changed());
  // 0.25 / (0.25 + 0.25): the step does not shrink with the cluster.
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 3}, fresh()).weight == 0.5);
  BOOST_TEST(p.plan(2).data_share == 0.5f);
  // Worker 0 comes back with its planned share; a new worker 3 gets the mean.
  p.on_join({.worker = 0, .time = 2}, fresh());
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 4}, fresh()).weight == 0.25);
  p.on_join({.worker = 3, .time = 3}, fresh());
  BOOST_TEST(sink.every_plan_changed());
  BOOST_TEST_REQUIRE(p.current_plan().workers.size() == 4u);
  BOOST_TEST(p.current_plan().workers[3].share == 1.0 / 3.0);
  BOOST_TEST(p.plan(3).compression_ratio == 0.2f);
  BOOST_TEST(p.plan(3).local_iterations == 8u);
  BOOST_TEST(p.on_commit({.worker = 3, .sequence = 1}, fresh()).weight > 0.0);
}

BOOST_AUTO_TEST_CASE(a_replanner_changes_the_plan_and_keeps_the_counters) {
  auto p = three_workers<test_replanner>();
  BOOST_TEST_REQUIRE(p.replanner().started == 1u);
  BOOST_TEST(p.replanner().first.workers[0].share == 0.5);
  BOOST_TEST(p.plan(2).local_iterations == 4u);
  // A measurement that changes nothing.
  p.on_measurement({.worker = 2, .kind = measurement_kind::compute, .seconds = 0.5}, fresh());
  BOOST_TEST(!sink.any_plan_changed());
  BOOST_TEST(p.replans() == 0u);
  // Switch to SHL and make worker 0 run ahead so that its pull is held.
  p.on_metric({.metric = metric_id::loss, .value = 0.1, .time = 1}, fresh());
  BOOST_TEST_REQUIRE((p.stage() == stage_id::shl));
  for (std::uint64_t s = 2; s < 6; ++s) (void)p.on_commit({.worker = 0, .sequence = s}, fresh());
  BOOST_TEST((p.on_pull({.worker = 0}, fresh()) == as::pull_action::hold));
  p.on_measurement({.worker = 2, .kind = measurement_kind::compute, .seconds = 1.5}, fresh());
  BOOST_TEST(sink.any_plan_changed());
  BOOST_TEST(p.replans() == 1u);
  BOOST_TEST(p.replan_status().ok());
  BOOST_TEST(p.plan(2).local_iterations == 1u);
  BOOST_TEST(p.plan(2).data_share == 0.2f);
  BOOST_TEST(p.is_held(0));  // the SSP state survived the new plan
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 2}, fresh()).weight == 0.3);
  // The same plan again: nothing changes, no worker is marked.
  p.on_measurement({.worker = 2, .kind = measurement_kind::compute, .seconds = 1.2}, fresh());
  BOOST_TEST(!sink.any_plan_changed());
  BOOST_TEST(p.replans() == 2u);
  // A bad plan (H = 0) and a replanner error are recorded; the plan stays.
  p.on_measurement({.worker = 2, .kind = measurement_kind::compute, .seconds = 3.0}, fresh());
  BOOST_TEST(!sink.any_plan_changed());
  BOOST_TEST(p.replan_status().message() == "ashl.plan.h_ahl = 0: must be >= 1");
  p.on_measurement({.worker = 2, .kind = measurement_kind::compute, .seconds = 6.0}, fresh());
  BOOST_TEST(p.replan_status().message() == "test.seconds = 6: too slow to plan");
  BOOST_TEST(p.replans() == 2u);
  BOOST_TEST(p.plan(2).data_share == 0.2f);
}

namespace {
struct swap_replanner {
  static constexpr bool enabled = true;
  ashl::status start(const as::profile_report&, const as::ashl_plan&) { return {}; }
  ashl::result<bool> observe(const as::measurement_event&, as::ashl_plan& next) {
    next.workers = {{8, 2, 0.2, 0.1, 0.5, 0}, {6, 1, 0.2, 0.1, 0.25, 0}, {4, 1, 0.2, 0.1, 0.25, 0}};
    return true;
  }
  void save(ashl::state_writer&) const {}
  ashl::status load(ashl::state_reader&) { return {}; }
};
}  // namespace

BOOST_AUTO_TEST_CASE(a_new_plan_with_the_same_total_marks_only_the_changed_workers) {
  auto p = three_workers<swap_replanner>();
  p.on_measurement({.worker = 1, .kind = measurement_kind::compute, .seconds = 1.0}, fresh());
  BOOST_TEST(!sink.every_plan_changed());
  BOOST_TEST((std::vector<as::worker_id>(sink.plans_changed().begin(), sink.plans_changed().end()) ==
              std::vector<as::worker_id>{1}));
  BOOST_TEST(p.plan(1).local_iterations == 6u);
}

namespace {
// Covers workers 0 and 1 only: worker 2's entry is the default (share 0).
struct partial_replanner {
  static constexpr bool enabled = true;
  ashl::status start(const as::profile_report&, const as::ashl_plan&) { return {}; }
  ashl::result<bool> observe(const as::measurement_event&, as::ashl_plan& next) {
    next.workers.assign(3, as::ashl_worker_plan{});
    next.workers[0] = {8, 2, 0.2, 0.1, 0.5, 0};
    next.workers[1] = {5, 1, 0.2, 0.1, 0.25, 0};
    return true;
  }
  void save(ashl::state_writer&) const {}
  ashl::status load(ashl::state_reader&) { return {}; }
};
}  // namespace

BOOST_AUTO_TEST_CASE(a_worker_the_new_plan_does_not_cover_keeps_its_entry) {
  auto p = three_workers<partial_replanner>();
  const auto before = p.current_plan().workers[2];
  p.on_measurement({.worker = 1, .kind = measurement_kind::compute, .seconds = 1.0}, fresh());
  BOOST_TEST(p.replans() == 1u);
  BOOST_TEST((p.current_plan().workers[2] == before));
  BOOST_TEST(p.plan(1).local_iterations == 5u);
  BOOST_TEST(p.plan(2).local_iterations == 4u);
  BOOST_TEST(p.on_commit({.worker = 2, .sequence = 2}, fresh()).weight == 0.25);
}

BOOST_AUTO_TEST_CASE(save_load_round_trip_and_a_state_with_a_bad_plan_is_refused) {
  auto a = three_workers<test_replanner>();
  a.on_metric({.metric = metric_id::loss, .value = 0.1, .time = 1}, fresh());
  std::vector<std::byte> bytes;
  ashl::state_writer w(bytes);
  a.save(w);
  auto b = as::ashl_schedule<fixed_planner, test_replanner>{{.workers = 1}, fixed_planner{}};
  ashl::state_reader r(bytes);
  BOOST_TEST_REQUIRE(b.load(r).ok());
  BOOST_TEST((b.stage() == stage_id::shl));
  BOOST_TEST(b.replanner().started == 1u);
  BOOST_TEST((b.current_plan() == a.current_plan()));
  for (std::uint64_t s = 2; s < 7; ++s) {
    const auto da = a.on_commit({.worker = 0, .sequence = s}, fresh());
    const auto db = b.on_commit({.worker = 0, .sequence = s}, fresh());
    BOOST_TEST((da == db));
  }
  BOOST_TEST((a.on_pull({.worker = 0}, fresh()) == b.on_pull({.worker = 0}, fresh())));
  BOOST_TEST(b.is_held(0));
  // The plan's H of worker 0 is the first u32 after the plan count: make it 0.
  std::vector<std::byte> plan_bytes;
  ashl::state_writer pw(plan_bytes);
  pw.put<std::uint64_t>(3);
  pw.put<std::uint32_t>(8);  // h_ahl of worker 0 as saved
  auto bad = bytes;
  const auto at = std::search(bad.begin(), bad.end(), plan_bytes.begin(), plan_bytes.end());
  BOOST_TEST_REQUIRE((at != bad.end()));
  *(at + 8) = std::byte{0};
  auto c = as::ashl_schedule<fixed_planner, test_replanner>{{.workers = 1}, fixed_planner{}};
  ashl::state_reader rc(bad);
  const auto st = c.load(rc);
  BOOST_TEST(st.message() == "ashl.plan.h_ahl = 0: must be >= 1");
  BOOST_TEST(c.profiling());
}

namespace {
// Plans from the report: each live worker w gets its own entry (H_AHL 10 + w,
// H_SHL 1 + w, ratios 1/(w + 2) and 1/(w + 4), share w + 1), so a worker's
// plan shows whether the planner covered it. Records its calls, the last
// report's live set and how many compute measurements of worker 3 it held.
struct live_planner {
  std::uint64_t calls = 0;
  std::vector<as::worker_id> live;
  std::uint64_t joiner_samples = 0;
  ashl::result<as::ashl_plan> plan(const as::profile_report& r) {
    ++calls;
    live = r.live;
    joiner_samples = 0;
    for (const auto& m : r.measurements)
      if (m.worker == 3 && m.kind == measurement_kind::compute) ++joiner_samples;
    as::ashl_plan p;
    for (auto w : r.live) {
      if (w >= p.workers.size()) p.workers.resize(std::size_t{w} + 1, as::ashl_worker_plan{.share = 0.0});
      p.workers[w] = {10 + w, 1 + w, 1.0 / (w + 2), 1.0 / (w + 4), static_cast<double>(w + 1), 0};
    }
    return p;
  }
  void save(ashl::state_writer& w) const {
    w.put(calls);
    w.put_vector(live);
    w.put(joiner_samples);
  }
  ashl::status load(ashl::state_reader& r) {
    ASHL_TRY(r.get(calls, "live_planner.calls"));
    ASHL_TRY(r.get_vector(live, "live_planner.live"));
    return r.get(joiner_samples, "live_planner.joiner_samples");
  }
};

// Three workers profiled (two cycles each), in SHL, worker 0 five commits
// ahead, then rank 3 (beyond the profiled set) joins: the window opens.
as::ashl_schedule<live_planner> joined_in_shl() {
  as::ashl_schedule<live_planner> p{{.workers = 3, .profile_iterations = 2}};
  for (std::uint64_t s = 1; s <= 2; ++s)
    for (as::worker_id w = 0; w < 3; ++w) (void)cycle(p, w, s);
  BOOST_TEST_REQUIRE(!p.profiling());
  BOOST_TEST_REQUIRE(p.planner().calls == 1u);
  p.on_metric({.metric = metric_id::loss, .value = 0.1, .time = 1}, fresh());
  BOOST_TEST_REQUIRE((p.stage() == stage_id::shl));
  for (std::uint64_t s = 3; s < 8; ++s) (void)p.on_commit({.worker = 0, .sequence = s}, fresh());  // SSP clock 5
  p.on_join({.worker = 3, .time = 2}, fresh());
  BOOST_TEST(sink.every_plan_changed());
  return p;
}
}  // namespace

// docs/elastic.md §2.4: a joiner after the plan runs on the mean share and
// the default H while it is profiled (profile_iterations commits and their
// compute measurements); then the planner runs again over the live set and
// the joiner gets its own H_i, R_i, D_i; the SSP counters are kept.
BOOST_AUTO_TEST_CASE(a_joiner_is_profiled_then_the_planner_gives_it_its_own_plan_and_keeps_the_ssp_counters) {
  auto p = joined_in_shl();
  // While profiled: the mean share (shares 1, 2, 3 → 2 of 8), the default H.
  BOOST_TEST(p.plan(3).local_iterations == as::ashl_worker_plan{}.h_shl);
  BOOST_TEST(p.plan(3).data_share == 0.25f);
  // One cycle of each worker: nobody profiled twice yet (worker 0's commits
  // before the join do not count for the window).
  for (as::worker_id w : {3u, 1u, 2u, 0u}) (void)cycle(p, w, w == 0 ? 8 : w == 3 ? 1 : 3);
  BOOST_TEST(p.planner().calls == 1u);
  (void)cycle(p, 0, 9);  // SSP clock 7; the others at 1
  BOOST_TEST((p.on_pull({.worker = 0}, fresh()) == as::pull_action::hold));
  (void)cycle(p, 1, 4);
  (void)cycle(p, 2, 4);
  BOOST_TEST(p.planner().calls == 1u);  // the joiner has not profiled yet
  (void)p.on_commit({.worker = 3, .sequence = 2}, fresh());
  BOOST_TEST(p.planner().calls == 1u);  // its second cycle's compute measurement is still to come
  p.on_measurement({.worker = 3, .kind = measurement_kind::compute, .seconds = 0.1}, fresh());
  BOOST_TEST_REQUIRE(p.planner().calls == 2u);
  BOOST_TEST(sink.every_plan_changed());
  BOOST_TEST((p.planner().live == std::vector<as::worker_id>{0, 1, 2, 3}));
  BOOST_TEST(p.planner().joiner_samples == 2u);  // the joiner's own measurements reached the planner
  // The joiner's own entry (SHL: H = 1 + 3, R = 1/7, D = 4 / (1 + 2 + 3 + 4)), and everyone re-planned.
  BOOST_TEST(p.plan(3).local_iterations == 4u);
  BOOST_TEST(p.plan(3).compression_ratio == f(1.0 / 7.0));
  BOOST_TEST(p.plan(3).data_share == f(0.4));
  BOOST_TEST(p.plan(0).local_iterations == 1u);
  BOOST_TEST(p.plan(0).data_share == f(0.1));
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 5}, fresh()).weight == 0.2);  // SSP clock 3 for worker 1
  // The SSP counters were kept: worker 0 (clock 7) is still held, and is
  // released only when the slowest live clock reaches 7 - 3 = 4.
  BOOST_TEST(p.is_held(0));
  (void)p.on_commit({.worker = 2, .sequence = 5}, fresh());
  (void)p.on_commit({.worker = 3, .sequence = 3}, fresh());
  BOOST_TEST(p.is_held(0));  // min clock 3
  for (as::worker_id w : {1u, 2u}) (void)p.on_commit({.worker = w, .sequence = 6}, fresh());
  BOOST_TEST(p.is_held(0));
  (void)p.on_commit({.worker = 3, .sequence = 4}, fresh());
  BOOST_TEST(!p.is_held(0));
  BOOST_TEST(sink.released().size() == 1u);
  BOOST_TEST(!p.reprofiling());
  BOOST_TEST(p.membership_replans() == 1u);
}

// An eviction after the plan re-plans the rest once they have profiled again.
BOOST_AUTO_TEST_CASE(an_eviction_after_the_plan_replans_the_rest) {
  as::ashl_schedule<live_planner> p{{.workers = 3, .profile_iterations = 1}};
  for (as::worker_id w = 0; w < 3; ++w) (void)cycle(p, w, 1);
  BOOST_TEST_REQUIRE(p.planner().calls == 1u);
  p.on_evict({.worker = 2, .time = 1}, fresh());
  BOOST_TEST(p.plan(0).data_share == f(1.0 / 3.0));  // renormalised at once: 1 of 1 + 2
  (void)cycle(p, 0, 2);
  BOOST_TEST(p.planner().calls == 1u);
  (void)cycle(p, 1, 2);
  BOOST_TEST_REQUIRE(p.planner().calls == 2u);
  BOOST_TEST((p.planner().live == std::vector<as::worker_id>{0, 1}));
  BOOST_TEST(sink.every_plan_changed());
  BOOST_TEST(p.membership_replans() == 1u);
}

// A state saved while a joiner is profiled loads into a copy that finishes
// the window exactly as the original does.
BOOST_AUTO_TEST_CASE(a_state_saved_while_a_joiner_is_profiled_loads_and_finishes_the_window) {
  auto a = joined_in_shl();
  for (as::worker_id w : {3u, 1u, 2u, 0u}) (void)cycle(a, w, w == 0 ? 8 : w == 3 ? 1 : 3);
  BOOST_TEST_REQUIRE(a.reprofiling());
  std::vector<std::byte> bytes;
  ashl::state_writer w(bytes);
  a.save(w);
  as::ashl_schedule<live_planner> b{{.workers = 1}};
  ashl::state_reader r(bytes);
  BOOST_TEST_REQUIRE(b.load(r).ok());
  BOOST_TEST(r.at_end());
  BOOST_TEST(b.reprofiling());
  BOOST_TEST(b.profile_commits(3) == 1u);
  BOOST_TEST((b.plan(3) == a.plan(3)));
  for (as::worker_id v : {0u, 1u, 2u}) {
    BOOST_TEST((cycle(a, v, v == 0 ? 9 : 4) == cycle(b, v, v == 0 ? 9 : 4)));
    BOOST_TEST(b.planner().calls == 1u);
  }
  (void)cycle(a, 3, 2);
  (void)cycle(b, 3, 2);
  BOOST_TEST(b.planner().calls == 2u);
  BOOST_TEST(b.plan(3).local_iterations == 4u);
  for (as::worker_id v = 0; v < 4; ++v) BOOST_TEST((a.plan(v) == b.plan(v)));
  std::vector<std::byte> after_a, after_b;
  ashl::state_writer wa(after_a), wb(after_b);
  a.save(wa);
  b.save(wb);
  BOOST_TEST((after_a == after_b));
  // A window flag in a state that has no plan yet is refused by name.
  as::ashl_schedule<live_planner> c{{.workers = 2, .profile_iterations = 2}};
  std::vector<std::byte> profiling;
  ashl::state_writer wc(profiling);
  c.save(wc);
  profiling[profiling.size() - 9] = std::byte{1};  // reprofiling, before the u64 membership_replans
  as::ashl_schedule<live_planner> d{{.workers = 1}};
  ashl::state_reader rd(profiling);
  BOOST_TEST(d.load(rd).message() == "ashl.reprofiling = 1: a window opens only after the plan");
}
