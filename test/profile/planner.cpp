#include <ashl/profile/planner.hpp>

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
  BOOST_TEST(!ap::adsp_commit_interval(0.0, 4, 2.0, 0.0).has_value());
  BOOST_TEST(!ap::adsp_commit_interval(60.0, 0, 2.0, 0.0).has_value());
  BOOST_TEST(!ap::adsp_commit_interval(60.0, 1, -2.0, 0.0).has_value());
}
