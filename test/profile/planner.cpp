#include <ashl/profile/planner.hpp>
#include <ashl/profile/replan.hpp>  // make_plan

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <vector>

namespace ap = ashl::profile;
namespace tt = boost::test_tools;

BOOST_AUTO_TEST_CASE(algorithm1_fast_worker_does_more_local_steps) {
  // Rounds at H0 = 8: 0.84 and 0.44; T_max = 0.84; H_1 = round(0.80 / 0.05) = 16.
  const std::vector<ap::worker_timing> t{{0.10, 0.02, 0.02}, {0.05, 0.02, 0.02}};
  auto p = ap::plan_local_iterations(t, 8);
  BOOST_TEST_REQUIRE(p.has_value());
  BOOST_TEST(p->at(0).h == 8u);
  BOOST_TEST(p->at(1).h == 16u);
  BOOST_TEST(p->at(0).share == 1.0 / 3, tt::tolerance(1e-12));
  BOOST_TEST(p->at(1).share == 2.0 / 3, tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(algorithm1_identical_workers_tie) {
  const std::vector<ap::worker_timing> t(3, {0.1, 0.03, 0.01});
  auto p = ap::plan_local_iterations(t, 4);
  BOOST_TEST_REQUIRE(p.has_value());
  for (const auto& w : *p) {
    BOOST_TEST(w.h == 4u);
    BOOST_TEST(w.share == 1.0 / 3, tt::tolerance(1e-12));
  }
  auto r = ap::plan_compression(t, {4, 4, 4}, 0.005, 0.3);
  BOOST_TEST_REQUIRE(r.has_value());
  for (double x : *r) BOOST_TEST(x == 0.3, tt::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(one_worker) {
  const std::vector<ap::worker_timing> t{{0.1, 0.02, 0.03}};
  auto p = ap::plan_local_iterations(t, 4);
  BOOST_TEST_REQUIRE(p.has_value());
  BOOST_TEST(p->at(0).h == 4u);
  BOOST_TEST(p->at(0).share == 1.0);
  auto r = ap::plan_compression(t, {4}, 0.01, 0.25);
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->at(0) == 0.25, tt::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(algorithm2_spare_time_buys_a_larger_ratio) {
  // H from Algorithm 1: T_max = 0.84, H_1 = round(0.77 / 0.06) = 13.
  const std::vector<ap::worker_timing> t{{0.10, 0.02, 0.02}, {0.06, 0.05, 0.02}};
  auto p = ap::plan_local_iterations(t, 8);
  BOOST_TEST_REQUIRE(p.has_value());
  BOOST_TEST(p->at(1).h == 13u);
  // Rounds at r0: 0.8 + 0.01 + 0.002 + 0.02 = 0.832; 0.78 + 0.01 + 0.005 + 0.02 = 0.815.
  // R_1 = (0.832 − 0.81) / 0.05 = 0.44; worker 0 is the slowest and sends r0.
  auto r = ap::plan_compression(t, {8, 13}, 0.01, 0.1);
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->at(0) == 0.1, tt::tolerance(1e-9));
  BOOST_TEST(r->at(1) == 0.44, tt::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(algorithm2_worker_whose_comm_exceeds_the_round_gets_r0) {
  // Worker 1's push + pull (2.5 s) exceeds the whole round (1.5 s); worker 0
  // has spare time for everything (R = 69 before the clamp).
  const std::vector<ap::worker_timing> t{{0.1, 0.01, 0.01}, {0.1, 2.0, 0.5}};
  auto r = ap::plan_compression(t, {8, 8}, 0.0, 0.1);
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->at(0) == 1.0);
  BOOST_TEST(r->at(1) == 0.1, tt::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(errors_name_field_and_value) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<ap::worker_timing> ok{{0.1, 0.01, 0.01}};
  auto e = ap::plan_local_iterations({}, 8);
  BOOST_TEST_REQUIRE(!e.has_value());
  BOOST_TEST(e.error().message() == "planner.workers.size = 0: needs at least one worker");
  auto h0 = ap::plan_local_iterations(ok, 0);
  BOOST_TEST_REQUIRE(!h0.has_value());
  BOOST_TEST(h0.error().message() == "planner.h0 = 0: must be >= 1");
  std::vector<ap::worker_timing> bad(3, {0.1, 0.01, 0.01});
  bad[2].t_iter = nan;
  auto n = ap::plan_local_iterations(bad, 8);
  BOOST_TEST_REQUIRE(!n.has_value());
  BOOST_TEST(n.error().message() == "planner.workers[2].t_iter = nan: must be finite and > 0");
  bad[2].t_iter = 0.1;
  bad[1].t_pull = -1.0;
  auto neg = ap::plan_compression(bad, {1, 1, 1}, 0.0, 0.5);
  BOOST_TEST_REQUIRE(!neg.has_value());
  BOOST_TEST(neg.error().message() == "planner.workers[1].t_pull = -1: must be finite and > 0");
  for (double r0 : {0.0, -0.1, 1.5, nan}) BOOST_TEST(!ap::plan_compression(ok, {1}, 0.0, r0).has_value());
  auto r0 = ap::plan_compression(ok, {1}, 0.0, 1.5);
  BOOST_TEST(r0.error().message() == "planner.r0 = 1.5: must be in (0, 1]");
  BOOST_TEST(!ap::plan_compression(ok, {1, 2}, 0.0, 0.5).has_value());
  BOOST_TEST(!ap::plan_compression(ok, {0}, 0.0, 0.5).has_value());
  BOOST_TEST(!ap::plan_compression(ok, {1}, -1.0, 0.5).has_value());
}

BOOST_AUTO_TEST_CASE(dlb_largest_remainder_preserves_the_sum) {
  // Quotas 2.5, 2.5, 5: floors 2, 2, 5; the one spare unit goes to the lower index.
  auto p = ap::plan_dlb_batches({1.0, 1.0, 2.0}, 10, 1);
  BOOST_TEST_REQUIRE(p.has_value());
  BOOST_TEST((p->batch == std::vector<std::uint32_t>{3, 2, 5}));
  BOOST_TEST(p->weight[0] == 0.3, tt::tolerance(1e-12));
  BOOST_TEST(p->weight[2] == 0.5, tt::tolerance(1e-12));
  // Quotas 17.14, 34.29, 68.57 for B = 120: floors 17, 34, 68, remainders .57 and .29 and .14.
  auto q = ap::plan_dlb_batches({1.0, 2.0, 4.0}, 120, 1);
  BOOST_TEST((q->batch == std::vector<std::uint32_t>{17, 34, 69}));
}

BOOST_AUTO_TEST_CASE(dlb_minimum_batch) {
  auto p = ap::plan_dlb_batches({1.0, 100.0}, 10, 2);
  BOOST_TEST_REQUIRE(p.has_value());
  BOOST_TEST((p->batch == std::vector<std::uint32_t>{2, 8}));
  BOOST_TEST(!ap::plan_dlb_batches({1.0, 1.0}, 3, 2).has_value());
  BOOST_TEST(!ap::plan_dlb_batches({}, 3, 1).has_value());
  auto z = ap::plan_dlb_batches({1.0, 0.0}, 8, 1);
  BOOST_TEST_REQUIRE(!z.has_value());
  BOOST_TEST(z.error().message() == "planner.speeds[1] = 0: must be finite and > 0");
}

BOOST_AUTO_TEST_CASE(adsp_interval) {
  BOOST_TEST(*ap::adsp_commit_interval(60.0, 4, 2.0, 0.0) == 13.0);
  BOOST_TEST(*ap::adsp_commit_interval(60.0, 4, 20.0, 1.0) == 1.0);
  // The same formula as core's (which the ADSP policy uses).
  BOOST_TEST(*ap::adsp_commit_interval(60.0, 7, 2.5, 0.1) == ashl::adsp_commit_interval(60.0, 7.0, 2.5, 0.1));
  BOOST_TEST(!ap::adsp_commit_interval(60.0, 1, 2.0, -1.0).has_value());
  BOOST_TEST(ap::adsp_commit_interval(std::numeric_limits<double>::infinity(), 1, 2.0, 0.0).error().message() ==
             "planner.gamma = inf: must be finite and > 0");
  BOOST_TEST(!ap::adsp_commit_interval(0.0, 4, 2.0, 0.0).has_value());
  BOOST_TEST(!ap::adsp_commit_interval(60.0, 0, 2.0, 0.0).has_value());
  BOOST_TEST(!ap::adsp_commit_interval(60.0, 1, -2.0, 0.0).has_value());
}

BOOST_AUTO_TEST_CASE(dlb_ties_and_one_worker) {
  // Equal speeds: quotas 10/3 each, floors 3, the one residue unit to worker 0.
  auto p = ap::plan_dlb_batches({2.0, 2.0, 2.0}, 10, 1);
  BOOST_TEST_REQUIRE(p.has_value());
  BOOST_TEST((p->batch == std::vector<std::uint32_t>{4, 3, 3}));
  auto one = ap::plan_dlb_batches({5.0}, 64, 8);
  BOOST_TEST_REQUIRE(one.has_value());
  BOOST_TEST((one->batch == std::vector<std::uint32_t>{64}));
  BOOST_TEST(one->weight[0] == 1.0);
  const auto w = ap::to_worker_plans(*p);
  BOOST_TEST_REQUIRE(w.size() == 3u);
  BOOST_TEST(w[0].batch_size == 4u);
  BOOST_TEST(w[0].data_share == 0.4f);
  BOOST_TEST(w[1].local_iterations == 1u);
  BOOST_TEST(w[1].compression_ratio == 1.0f);
  BOOST_TEST((w[1].stage == ashl::stage_id::dlb));
}

BOOST_AUTO_TEST_CASE(adsp_plans_per_worker) {
  auto p = ap::plan_adsp(60.0, 4, {2.0, 14.5, 20.0}, 1.0);
  BOOST_TEST_REQUIRE(p.has_value());
  // Commit by interval (local_iterations 0), in microseconds.
  BOOST_TEST(p->at(0).commit_interval_us == 13'000'000u);
  BOOST_TEST(p->at(0).commit_interval() == 13.0);
  BOOST_TEST(p->at(0).local_iterations == 0u);
  BOOST_TEST(p->at(1).commit_interval_us == 1'000'000u);  // 15 − 14.5 = 0.5 < t_min
  BOOST_TEST(p->at(2).commit_interval_us == 1'000'000u);
  BOOST_TEST(p->at(2).data_share == static_cast<float>(1.0 / 3));
  BOOST_TEST((p->at(2).stage == ashl::stage_id::adsp));
  // A zero interval means "commit at once": every iteration.
  auto z = ap::plan_adsp(60.0, 4, {15.0, 1.0}, 0.0);
  BOOST_TEST_REQUIRE(z.has_value());
  BOOST_TEST(z->at(0).commit_interval_us == 0u);
  BOOST_TEST(z->at(0).local_iterations == 1u);
  BOOST_TEST(z->at(1).commit_interval_us == 14'000'000u);
  auto e = ap::plan_adsp(60.0, 4, {2.0, std::numeric_limits<double>::infinity()}, 0.0);
  BOOST_TEST_REQUIRE(!e.has_value());
  BOOST_TEST(e.error().message() == "planner.o_i = inf: must be finite and >= 0");
  BOOST_TEST(!ap::plan_adsp(60.0, 4, {}, 0.0).has_value());
}

BOOST_AUTO_TEST_CASE(summarize_trims_per_worker_and_rejects_absurd_timings) {
  using k = ap::measurement_kind;
  std::vector<ap::measurement> m;
  for (std::uint32_t w = 0; w < 2; ++w) {
    const double f = w == 0 ? 1.0 : 2.0;
    // A 9 (warm-up), then 1, 2, 3 and a 100 outlier, all scaled by f and a per-kind unit.
    for (double s : {9.0, 1.0, 2.0, 3.0, 100.0}) {
      m.push_back({.worker = w, .kind = k::compute, .seconds = s * f * 0.01, .amount = 32});
      m.push_back({.worker = w, .kind = k::push, .seconds = s * f * 0.002, .amount = 1e6 * f});
      m.push_back({.worker = w, .kind = k::pull, .seconds = s * f * 0.001, .amount = 1e6});
    }
    m.push_back({.worker = w, .kind = k::round, .seconds = 123.0});
    m.push_back({.worker = w, .kind = k::commit, .seconds = 77.0});
  }
  for (double s : {0.5, 0.004, 0.005, 0.006, 0.9}) m.push_back({.worker = 1, .kind = k::compress, .seconds = s});
  // After the warm-up (9) the kept samples are {1, 2, 3, 100}; trim 1 drops 1 and 100: mean 2.5.
  const std::vector<std::uint32_t> live{0, 1};
  auto s = ap::summarize(m, live, {.trim = 1, .warmup = 1});
  BOOST_TEST_REQUIRE(s.has_value());
  BOOST_TEST((s->live == live));
  BOOST_TEST(s->timing[0].t_iter == 0.025, tt::tolerance(1e-12));
  BOOST_TEST(s->timing[0].t_push == 0.005, tt::tolerance(1e-12));
  BOOST_TEST(s->timing[1].t_iter == 0.05, tt::tolerance(1e-12));
  BOOST_TEST(s->timing[1].t_pull == 0.005, tt::tolerance(1e-12));
  BOOST_TEST(s->push_bytes[0] == 1e6);
  BOOST_TEST(s->push_bytes[1] == 2e6);
  // compress: warm-up 0.5, kept {0.004, 0.005, 0.006, 0.9}, trimmed mean 0.0055.
  BOOST_TEST(s->t_compress == 0.0055, tt::tolerance(1e-12));

  // Live workers in any order; a worker that left counts for T_compress only.
  const std::vector<std::uint32_t> one{1};
  auto only = ap::summarize(m, one, {.trim = 1, .warmup = 1});
  BOOST_TEST_REQUIRE(only.has_value());
  BOOST_TEST(only->timing.size() == 1u);
  BOOST_TEST(only->timing[0].t_iter == 0.05, tt::tolerance(1e-12));
  // A live worker with no samples is an error naming it.
  const std::vector<std::uint32_t> three{0, 1, 2};
  auto missing = ap::summarize(m, three, {.trim = 1, .warmup = 1});
  BOOST_TEST_REQUIRE(!missing.has_value());
  BOOST_TEST(missing.error().message() == "profile.summary.worker[2].compute.count = 0: no samples");
  // One absurd timing is rejected, not trimmed away or planned around, even
  // from a worker that is not live.
  m.push_back({.worker = 7, .kind = k::push, .seconds = -3.0, .amount = 1e6});
  auto bad = ap::summarize(m, live, {.trim = 1, .warmup = 1});
  BOOST_TEST_REQUIRE(!bad.has_value());
  BOOST_TEST(bad.error().message() ==
             "profile.summary.measurements[39].seconds = -3: duration must be finite and > 0");
  BOOST_TEST(!ap::summarize({}, {}).has_value());
  const std::vector<std::uint32_t> twice{1, 1};
  BOOST_TEST(ap::summarize(m, twice).error().message() == "profile.summary.live[1] = 1: listed twice");
}

BOOST_AUTO_TEST_CASE(summarize_reduces_warmup_and_trim_when_few_samples) {
  using k = ap::measurement_kind;
  std::vector<ap::measurement> m;
  // One sample of each: warm-up and trim shrink to keep it.
  m.push_back({.worker = 4, .kind = k::compute, .seconds = 0.1, .amount = 32});
  m.push_back({.worker = 4, .kind = k::push, .seconds = 0.02});
  m.push_back({.worker = 4, .kind = k::pull, .seconds = 0.03});
  // Four pulls more: warm-up 3 kept (first pull 0.03 and two more skipped), trim 20 reduced to 0.
  for (double x : {0.5, 0.5, 0.04, 0.06}) m.push_back({.worker = 4, .kind = k::pull, .seconds = x});
  const std::vector<std::uint32_t> live{4};
  auto s = ap::summarize(m, live, {.trim = 20, .warmup = 3});
  BOOST_TEST_REQUIRE(s.has_value());
  BOOST_TEST(s->timing[0].t_iter == 0.1);
  BOOST_TEST(s->timing[0].t_push == 0.02);
  BOOST_TEST(s->timing[0].t_pull == 0.05, tt::tolerance(1e-12));
  BOOST_TEST(s->push_bytes[0] == 0.0);  // no push said how many bytes
  BOOST_TEST(s->t_compress == 0.0);
}

BOOST_AUTO_TEST_CASE(worker_whose_communication_exceeds_everyone_elses_round) {
  // Worker 1 computes fast but its push + pull (2 s) is longer than worker 0's
  // whole round at H0 = 4 (0.42 s). Algorithm 1: T_max = 0.04 + 2 = 2.04,
  // H_0 = round(2.02 / 0.1) = 20, H_1 = round(0.04 / 0.01) = 4.
  const std::vector<ap::worker_timing> t{{0.1, 0.01, 0.01}, {0.01, 1.0, 1.0}};
  auto full = ap::make_plan(t, 4, 0.0, 0.1);
  BOOST_TEST_REQUIRE(full.has_value());
  BOOST_TEST(full->local[0].h == 20u);
  BOOST_TEST(full->local[1].h == 4u);
  BOOST_TEST(full->local[0].share == 20.0 / 24, tt::tolerance(1e-12));
  // Algorithm 2 at r0 = 0.1: rounds 2.0 + 0.001 + 0.01 = 2.011 and 0.04 + 0.1 + 1.0 = 1.14.
  // Worker 0 is now the slowest and sends r0; worker 1 gets (2.011 − 1.04) / 1.0 = 0.971.
  BOOST_TEST(full->ratio[0] == 0.1, tt::tolerance(1e-9));
  BOOST_TEST(full->ratio[1] == 0.971, tt::tolerance(1e-9));
  const auto w = full->workers(ashl::stage_id::ahl);
  BOOST_TEST(w[1].local_iterations == 4u);
  BOOST_TEST(w[1].compression_ratio == static_cast<float>(full->ratio[1]));
  BOOST_TEST(w[0].data_share == static_cast<float>(20.0 / 24));
  BOOST_TEST(w[0].batch_size == 0u);
  BOOST_TEST(w[0].commit_interval_us == 0u);
  BOOST_TEST((w[0].stage == ashl::stage_id::ahl));
}
