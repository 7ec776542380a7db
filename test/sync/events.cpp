#include <ashl/sync/events.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>

namespace as = ashl::sync;

BOOST_AUTO_TEST_CASE(staleness_weighting_modes) {
  BOOST_TEST(as::staleness_weighting::none()(7) == 1.0);
  BOOST_TEST(as::staleness_weighting::inverse()(0) == 1.0);
  BOOST_TEST(as::staleness_weighting::inverse()(3) == 0.25);
  auto f = as::staleness_weighting::custom([](std::uint64_t t) { return std::exp(-static_cast<double>(t)); });
  BOOST_TEST(f(0) == 1.0);
  BOOST_TEST(std::abs(f(2) - std::exp(-2.0)) < 1e-15);
}

BOOST_AUTO_TEST_CASE(outcome_merge_keeps_order) {
  as::outcome a{{{0, 1, 0.5}}, {2}, false};
  as::outcome b{{{1, 4, 0.5}}, {3, 0}, true};
  BOOST_TEST(!a.empty());
  a.merge(std::move(b));
  BOOST_TEST(a.round.size() == 2u);
  BOOST_TEST((a.round[1] == as::weighted_commit{1, 4, 0.5}));
  BOOST_TEST((a.released == std::vector<as::worker_id>{2, 3, 0}));
  BOOST_TEST(a.plans_changed);
  BOOST_TEST(as::outcome{}.empty());
}
