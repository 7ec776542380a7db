#include <ashl/profile/replan.hpp>

#include <boost/test/unit_test.hpp>

#include <vector>

namespace ap = ashl::profile;
namespace tt = boost::test_tools;

BOOST_AUTO_TEST_CASE(initial_plan_is_algorithms_1_and_2) {
  auto r = ap::replanner::create({.h0 = 8, .t_compress = 0.0, .r0 = 0.1},
                                 {{0.10, 0.02, 0.02}, {0.05, 0.02, 0.02}});
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->plan().local[0].h == 8u);
  BOOST_TEST(r->plan().local[1].h == 16u);
  BOOST_TEST(r->plan().ratio.size() == 2u);
}

BOOST_AUTO_TEST_CASE(a_worker_that_slows_mid_run_is_replanned) {
  auto r = ap::replanner::create({.h0 = 8, .t_compress = 0.0, .r0 = 0.1, .drift = 0.6, .half_life = 2.0},
                                 {{0.10, 0.02, 0.02}, {0.05, 0.02, 0.02}});
  BOOST_TEST_REQUIRE(r.has_value());
  // Worker 1's iterations now take 0.1 s; its EWMA goes 0.05 → 0.1 − 0.05·2^(−n/2):
  // 0.0646 (+29 %), 0.075 (+50 %), then 0.0823 (+65 % > 60 %).
  for (int n = 1; n <= 2; ++n) {
    auto o = r->observe(1, ap::timing_kind::iter, 0.1);
    BOOST_TEST_REQUIRE(o.has_value());
    BOOST_TEST(!o->has_value());
  }
  // The other worker staying on its planned times does not re-plan.
  BOOST_TEST(!r->observe(0, ap::timing_kind::iter, 0.1)->has_value());
  auto o = r->observe(1, ap::timing_kind::iter, 0.1);
  BOOST_TEST_REQUIRE(o.has_value());
  BOOST_TEST_REQUIRE(o->has_value());
  const ap::full_plan& p = **o;
  BOOST_TEST(p.basis[1].t_iter == 0.1 - 0.05 * 0.35355339059327373, tt::tolerance(1e-9));
  // T_max = 0.84 (worker 0); H_1 = round(0.80 / 0.08232) = 10.
  BOOST_TEST(p.local[0].h == 8u);
  BOOST_TEST(p.local[1].h == 10u);
  BOOST_TEST(p.local[1].share == 10.0 / 18, tt::tolerance(1e-12));
  // Algorithm 2: worker 1 is now the slowest round (0.8452 s) and sends r0.
  BOOST_TEST(p.ratio[1] == 0.1, tt::tolerance(1e-9));
  BOOST_TEST(p.ratio[0] == 1.0);
  BOOST_TEST(r->replans() == 1u);
  BOOST_TEST(r->plan().local[1].h == 10u);
  // The new basis is what the EWMAs hold, so the next equal sample does not re-plan.
  BOOST_TEST(!r->observe(0, ap::timing_kind::push, 0.02)->has_value());
}

BOOST_AUTO_TEST_CASE(errors) {
  BOOST_TEST(!ap::replanner::create({}, {}).has_value());
  BOOST_TEST(!ap::replanner::create({.drift = 0.0}, {{0.1, 0.1, 0.1}}).has_value());
  auto r = ap::replanner::create({}, {{0.1, 0.1, 0.1}});
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(!r->observe(1, ap::timing_kind::iter, 0.1).has_value());
  auto bad = r->observe(0, ap::timing_kind::pull, -0.5);
  BOOST_TEST_REQUIRE(!bad.has_value());
  BOOST_TEST(bad.error().message() == "profile.sample = -0.5: duration must be finite and > 0");
}
