#include <ashl/sim/simulator.hpp>
#include <ashl/sync/ashl_profile.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace sim = ashl::sim;
namespace ss = ashl::sync;
using boost::test_tools::tolerance;

namespace {
sim::cluster_spec spec_of(const std::string& json) {
  auto r = sim::parse_cluster_spec(json);
  BOOST_REQUIRE_MESSAGE(r.has_value(), (r ? std::string() : r.error().message()));
  return *r;
}
ss::any_policy policy(const char* name, std::int64_t workers, std::int64_t staleness = 3) {
  ss::policy_params pp;
  pp.workers = workers;
  pp.staleness = staleness;
  auto p = ss::make_policy(name, pp);
  BOOST_REQUIRE(p);
  return std::move(*p);
}
}  // namespace

// 3 workers at 10, 20, 40 ms per iteration; the 1 MB model moves in 1 ms each
// way (8 Gbit/s); the server link is unlimited. A BSP round takes
// 40 + 1 + 1 = 42 ms; the run ends when the third commits arrive at
// 2 · 42 + 41 = 125 ms. Worker 0 waits 30 ms in each of the first two rounds.
BOOST_AUTO_TEST_CASE(bsp_round_times_are_the_slowest_worker_plus_transfers) {
  auto spec = spec_of(R"({"model_bytes": 1000000, "header_bytes": 0,
    "workers": [{"seconds_per_iteration": 0.01, "bandwidth_gbps": 8},
                {"seconds_per_iteration": 0.02, "bandwidth_gbps": 8},
                {"seconds_per_iteration": 0.04, "bandwidth_gbps": 8}]})");
  sim::simulator s(spec, policy("bsp", 3));
  auto r = s.run({.commits_per_worker = 3});
  BOOST_TEST(r.end_time == 0.125, tolerance(1e-9));
  BOOST_TEST(r.commits == 9u);
  BOOST_TEST(r.applications == 3u);  // one optimizer step per round
  BOOST_TEST(r.workers[0].wait_s == 0.060, tolerance(1e-9));
  BOOST_TEST(r.workers[1].wait_s == 0.040, tolerance(1e-9));
  BOOST_TEST(r.workers[2].wait_s == 0.0, tolerance(1e-9));
  BOOST_TEST(r.workers[0].compute_s == 0.030, tolerance(1e-9));
  BOOST_TEST(r.workers[2].send_s == 0.003, tolerance(1e-9));
  BOOST_TEST(r.workers[0].bytes_sent == 3000000u);
}

// Two workers at 10 and 30 ms, free network, SSP(1). The fast worker's pull
// is held whenever it is 2 commits ahead: it commits at 10, 20 (held until
// the slow one's commit at 30), 40 (held until 60), 70 (held until 90).
BOOST_AUTO_TEST_CASE(ssp_holds_the_fast_worker_at_the_bound) {
  auto spec = spec_of(R"({"model_bytes": 0, "header_bytes": 0,
    "workers": [{"seconds_per_iteration": 0.01}, {"seconds_per_iteration": 0.03}]})");
  sim::simulator s(spec, policy("ssp", 2, 1));
  auto r = s.run({.until = 0.095});
  BOOST_TEST(r.workers[0].commits == 4u);
  BOOST_TEST(r.workers[1].commits == 3u);
  BOOST_TEST(r.workers[0].wait_s == 0.050, tolerance(1e-9));
  BOOST_TEST(r.workers[1].wait_s == 0.0, tolerance(1e-9));
  BOOST_TEST(r.wait_fraction() == 0.050 / 0.190, tolerance(1e-9));
}

// Two workers send 1 MB at once through a server link of 1 GB/s: each gets
// half, so each transfer takes 2 ms instead of 1.
BOOST_AUTO_TEST_CASE(server_link_is_shared_by_concurrent_transfers) {
  auto spec = spec_of(R"({"model_bytes": 1000000, "header_bytes": 0, "servers": [{"bandwidth_gbps": 8}],
    "workers": [{"count": 2, "seconds_per_iteration": 0.01}]})");
  sim::simulator s(spec, policy("asp", 2));
  auto r = s.run({.commits_per_worker = 1});
  BOOST_TEST(r.end_time == 0.012, tolerance(1e-9));
  BOOST_TEST(r.workers[0].send_s == 0.002, tolerance(1e-9));
}

// Worker 2 dies at 25 ms while computing its third iteration; the server
// evicts it 10 ms later, which completes the BSP round the survivors are
// waiting in (their commits arrived at 30 ms); they go on alone.
BOOST_AUTO_TEST_CASE(a_dead_worker_is_evicted_and_the_survivors_continue) {
  auto spec = spec_of(R"({"model_bytes": 0, "header_bytes": 0, "failure_timeout_s": 0.01,
    "workers": [{"count": 3, "seconds_per_iteration": 0.01}],
    "changes": [{"at": 0.025, "worker": 2, "kind": "die"}]})");
  sim::simulator s(spec, policy("bsp", 3));
  auto r = s.run({.commits_per_worker = 5, .record_trace = true});
  BOOST_TEST(r.workers[0].commits == 5u);
  BOOST_TEST(r.workers[1].commits == 5u);
  BOOST_TEST(r.workers[2].commits == 2u);
  BOOST_TEST(!r.workers[2].alive);
  BOOST_TEST(r.end_time == 0.055, tolerance(1e-9));
  BOOST_TEST(r.workers[0].wait_s == 0.005, tolerance(1e-9));
  BOOST_TEST(!s.policy().is_live(2));
}

BOOST_AUTO_TEST_CASE(a_joining_worker_pulls_then_takes_part) {
  auto spec = spec_of(R"({"model_bytes": 0, "header_bytes": 0,
    "workers": [{"count": 2, "seconds_per_iteration": 0.01}],
    "changes": [{"at": 0.015, "worker": 1, "kind": "join"}]})");
  sim::simulator s(spec, policy("bsp", 2));
  auto r = s.run({.until = 0.0505});
  // Alone: commits at 10 ms; the joiner starts at 15 ms; the round in
  // progress waits for it: rounds complete at 25, 35, 45 ms.
  BOOST_TEST(r.workers[1].commits == 3u);
  BOOST_TEST(r.workers[0].commits == 4u);
}

BOOST_AUTO_TEST_CASE(full_mode_hooks_see_commits_applications_serves_and_metrics) {
  auto spec = spec_of(R"({"model_bytes": 4000, "workers": [{"count": 2, "seconds_per_iteration": 0.01}]})");
  int computed = 0, applied = 0, served = 0, delivered = 0, evaluated = 0;
  sim::hooks h;
  h.compute = [&](ss::worker_id, const ss::worker_plan& p, std::uint32_t iters, std::uint32_t batch,
                  std::uint64_t) -> std::uint64_t {
    BOOST_TEST(iters == p.local_iterations);
    BOOST_TEST(batch == 64u);
    ++computed;
    return 100;
  };
  h.apply = [&](std::span<const ss::weighted_commit> cs) { applied += static_cast<int>(cs.size()); };
  h.serve = [&](ss::worker_id) { ++served; };
  h.deliver = [&](ss::worker_id) { ++delivered; };
  h.evaluate = [&](double t) {
    ++evaluated;
    return sim::evaluation{{{"loss", 1.0 / (1.0 + t)}}, t >= 0.1};
  };
  sim::simulator s(spec, policy("asp", 2), std::move(h));
  auto r = s.run({.metric_interval = 0.05});
  BOOST_TEST(r.stopped_by_hook);
  BOOST_TEST(evaluated == 3);  // 0, 0.05, 0.1
  BOOST_TEST(computed >= 18);
  BOOST_TEST(applied == static_cast<int>(r.commits));
  BOOST_TEST(served >= delivered);
  BOOST_TEST(delivered >= 18);
  BOOST_TEST(r.metrics.size() == 3u);
  BOOST_TEST(r.workers[0].bytes_sent == r.workers[0].commits * (100 + 72));
}

BOOST_AUTO_TEST_CASE(jitter_is_deterministic_per_seed) {
  const char* j = R"({"model_bytes": 0, "seed": 3,
    "workers": [{"count": 2, "seconds_per_iteration": 0.01, "jitter": {"kind": "lognormal", "sigma": 0.3}}]})";
  sim::simulator a(spec_of(j), policy("asp", 2)), b(spec_of(j), policy("asp", 2));
  auto ra = a.run({.commits_per_worker = 50}), rb = b.run({.commits_per_worker = 50});
  BOOST_TEST(ra.end_time == rb.end_time);
  BOOST_TEST(ra.workers[0].compute_s != ra.workers[1].compute_s);
  // mean 1: 50 iterations of 10 ms take about 0.5 s
  BOOST_TEST(ra.workers[0].compute_s == 0.5, tolerance(0.25));
}

// One worker at 10 ms per iteration whose plan sends half the model: after
// each compute it compresses for 4 ms (reference.compress_seconds, its own
// multiplier 1), sends 0.5 MB in 0.5 ms and pulls 1 MB in 1 ms; a worker
// twice as slow compresses in 8 ms. Commits arrive at 14.5 and 30 ms.
BOOST_AUTO_TEST_CASE(compression_time_is_charged_when_the_plan_compresses) {
  auto spec = spec_of(R"({"reference": {"seconds_per_iteration": 0.01, "compress_seconds": 0.004},
    "model_bytes": 1000000, "header_bytes": 0,
    "workers": [{"compute_multiplier": 1, "bandwidth_gbps": 8}, {"compute_multiplier": 2, "bandwidth_gbps": 8}]})");
  BOOST_TEST(spec.workers[1].compress_seconds == 0.008, tolerance(1e-12));
  std::vector<ss::worker_plan> plans(2, ss::worker_plan{.local_iterations = 1, .compression_ratio = 0.5});
  sim::simulator s(spec, ss::asp({.workers = 2, .plans = plans}), {});
  auto r = s.run({.commits_per_worker = 2, .record_trace = true});
  BOOST_TEST(r.workers[0].compress_s == 0.008, tolerance(1e-9));
  BOOST_TEST(r.workers[1].compress_s == 0.016, tolerance(1e-9));
  BOOST_TEST(r.workers[0].send_s == 0.001, tolerance(1e-9));
  BOOST_TEST(r.workers[0].bytes_sent == 1000000u);
  BOOST_TEST(r.end_time == 0.0285 + 0.001 + 0.0285, tolerance(1e-9));  // worker 1: 20 + 8 + 0.5, pull 1, again
  std::size_t compress_spans = 0;
  for (const auto& t : r.trace) compress_spans += t.what == sim::activity::compress;
  BOOST_TEST(compress_spans == 4u);
  // A dense plan is never charged.
  sim::simulator dense(spec, policy("asp", 2), {});
  BOOST_TEST(dense.run({.commits_per_worker = 2}).workers[1].compress_s == 0.0);
}

// ASHL+ in the simulator: two workers profiled for 3 commits each, then the
// fast worker slows down 3x at t = 1 s; the re-planner sees its compute
// measurements drift and gives it fewer local steps and a smaller share.
BOOST_AUTO_TEST_CASE(ashl_replans_when_a_worker_slows_down) {
  auto spec = spec_of(R"({"model_bytes": 100000, "header_bytes": 0,
    "workers": [{"seconds_per_iteration": 0.01, "bandwidth_gbps": 8}, {"seconds_per_iteration": 0.03, "bandwidth_gbps": 8}],
    "changes": [{"at": 1.0, "worker": 0, "kind": "slowdown", "factor": 3}]})");
  auto make = [](bool replan) {
    return ss::ashl_schedule{{.workers = 2, .profile_iterations = 3,
                              .planner = ss::profile_planner({.h_ahl = 4, .h_shl = 2, .r0 = 1.0, .trim = 0}),
                              .to_shl = {.at_time = 1e9},
                              .replanner = replan ? ss::profile_replanner({.h_ahl = 4, .h_shl = 2, .r0 = 1.0, .trim = 0},
                                                                          {.drift = 0.2, .half_life = 2})
                                                  : ss::ashl_replanner_factory{}}};
  };
  std::vector<double> changed;
  sim::hooks h;
  h.plans_changed = [&](double t) { changed.push_back(t); };
  sim::simulator s(spec, make(true), h);
  auto r = s.run({.until = 3.0});
  auto* p = s.policy().target<ss::ashl_schedule>();
  BOOST_TEST_REQUIRE(p != nullptr);
  BOOST_TEST(p->replan_status().ok());
  BOOST_TEST(p->replans() >= 1u);
  // Before the slowdown worker 0 was planned 3x the local steps of worker 1;
  // after it both take about the same time per step.
  const auto& plan = p->current_plan();
  BOOST_TEST(plan.workers[0].h_ahl <= plan.workers[1].h_ahl + 1);
  BOOST_TEST(plan.workers[0].share > 0.4);
  BOOST_TEST(plan.workers[0].share < 0.6);
  BOOST_TEST(std::count_if(changed.begin(), changed.end(), [](double t) { return t > 1.0; }) >= 1);
  // Without the re-planner the first plan stays: worker 0 keeps 3x the steps.
  sim::simulator once(spec, make(false), {});
  (void)once.run({.until = 3.0});
  const auto& first = once.policy().target<ss::ashl_schedule>()->current_plan();
  BOOST_TEST(first.workers[0].h_ahl == 3 * first.workers[1].h_ahl);
  BOOST_TEST(r.workers[0].commits > 0u);
}
