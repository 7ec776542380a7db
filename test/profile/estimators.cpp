#include <ashl/profile/estimators.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>

namespace ap = ashl::profile;

BOOST_AUTO_TEST_CASE(trimmed_mean_skips_warmup_and_drops_extremes) {
  ap::trimmed_mean tm{{.trim = 1, .warmup = 2}};
  // Warm-up 100, 90 are skipped; of {1, 2, 3, 50, 0.5} drop 50 and 0.5.
  for (double s : {100.0, 90.0, 1.0, 2.0, 3.0, 50.0, 0.5}) BOOST_TEST(tm.add(s).ok());
  BOOST_TEST(tm.count() == 5u);
  auto v = tm.value();
  BOOST_TEST_REQUIRE(v.has_value());
  BOOST_TEST(*v == 2.0, boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(trimmed_mean_needs_more_than_two_trim_samples) {
  ap::trimmed_mean tm{{.trim = 2, .warmup = 0}};
  for (double s : {1.0, 2.0, 3.0, 4.0}) BOOST_TEST(tm.add(s).ok());
  BOOST_TEST(!tm.value().has_value());
  BOOST_TEST(tm.add(5.0).ok());
  BOOST_TEST(*tm.value() == 3.0);
}

BOOST_AUTO_TEST_CASE(ewma_half_life) {
  ap::ewma e{1.0};  // alpha = 1/2
  BOOST_TEST(e.alpha() == 0.5);
  BOOST_TEST(!e.value().has_value());
  BOOST_TEST(e.add(4.0).ok());
  BOOST_TEST(*e.value() == 4.0);
  BOOST_TEST(e.add(2.0).ok());
  BOOST_TEST(*e.value() == 3.0);
  // After h samples at a new level, half of the old gap remains.
  ap::ewma f{4.0};
  BOOST_TEST(f.add(1.0).ok());
  for (int i = 0; i < 4; ++i) BOOST_TEST(f.add(3.0).ok());
  BOOST_TEST(*f.value() == 2.0, boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(median_and_mad) {
  ap::median_mad m;
  BOOST_TEST(!m.median().has_value());
  for (double s : {1.0, 2.0, 3.0, 4.0, 100.0}) BOOST_TEST(m.add(s).ok());
  BOOST_TEST(*m.median() == 3.0);
  BOOST_TEST(*m.mad() == 1.0);  // deviations {2, 1, 0, 1, 97}
  BOOST_TEST(ap::median_of({4.0, 1.0, 3.0, 2.0}) == 2.5);
}

BOOST_AUTO_TEST_CASE(rejects_bad_durations_naming_the_value) {
  ap::trimmed_mean tm;
  ap::ewma e;
  ap::median_mad m;
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double bad : {-0.5, 0.0, inf, nan}) {
    BOOST_TEST(!tm.add(bad).ok());
    BOOST_TEST(!e.add(bad).ok());
    BOOST_TEST(!m.add(bad).ok());
  }
  auto s = tm.add(-0.5);
  BOOST_TEST(s.message() == "profile.sample = -0.5: duration must be finite and > 0");
  BOOST_TEST((s.code() == ashl::errc::invalid_argument));
  BOOST_TEST(tm.count() == 0u);
  BOOST_TEST(e.count() == 0u);
  BOOST_TEST(m.count() == 0u);
}

BOOST_AUTO_TEST_CASE(ewma_create_checks_the_half_life) {
  BOOST_TEST(ap::ewma::create(4.0).has_value());
  auto e = ap::ewma::create(0.0);
  BOOST_TEST_REQUIRE(!e.has_value());
  BOOST_TEST(e.error().message() == "ewma.half_life = 0: must be finite and > 0");
  BOOST_TEST(!ap::ewma::create(std::numeric_limits<double>::quiet_NaN()).has_value());
}

BOOST_AUTO_TEST_CASE(trimmed_mean_is_robust_to_outliers_ewma_is_not) {
  // 20 samples of 1.0 with two large spikes: trim 2 removes them.
  ap::trimmed_mean tm{{.trim = 2, .warmup = 3}};
  ap::ewma e{2.0};
  for (int i = 0; i < 3; ++i) BOOST_TEST(tm.add(50.0).ok());  // warm-up
  for (int i = 0; i < 20; ++i) {
    const double s = (i == 5 || i == 19) ? 40.0 : 1.0;
    BOOST_TEST(tm.add(s).ok());
    BOOST_TEST(e.add(s).ok());
  }
  BOOST_TEST(*tm.value() == 1.0, boost::test_tools::tolerance(1e-12));
  // The EWMA carries both spikes: alpha = 1 − 2^(−1/2); the first has decayed
  // for 14 samples, the last not at all: 1 + 39·alpha·(1 + (1 − alpha)^14).
  const double a = 1.0 - std::exp2(-0.5);
  BOOST_TEST(*e.value() == 1.0 + 39.0 * a * (1.0 + std::pow(1.0 - a, 14)), boost::test_tools::tolerance(1e-12));
}
