#include <ashl/core/clock.hpp>

#include <boost/test/unit_test.hpp>

#include <chrono>

// steady_clock::at: the seconds of an instant on the clock, so a driver can
// stamp an event with the instant it describes (an evaluation's tick)
// rather than the instant it was reported.
BOOST_AUTO_TEST_CASE(steady_clock_at_places_instants_on_the_clocks_scale) {
  const auto before = std::chrono::steady_clock::now();
  const ashl::steady_clock c;
  const auto after = std::chrono::steady_clock::now();
  BOOST_TEST(c.at(before) <= 0.0);  // the clock started at or after `before`
  BOOST_TEST(c.at(after) >= 0.0);
  const auto tick = after + std::chrono::milliseconds(1250);
  BOOST_TEST(c.at(tick) - c.at(after) == 1.25, boost::test_tools::tolerance(1e-12));
  const double now = c.now();
  BOOST_TEST(c.at(std::chrono::steady_clock::now()) >= now);  // now() is at() of the present
  BOOST_TEST(now >= c.at(after));
}

BOOST_AUTO_TEST_CASE(virtual_clock_never_runs_backwards) {
  ashl::virtual_clock c;
  c.advance_to(2.5);
  c.advance_to(1.0);
  BOOST_TEST(c.now() == 2.5);
}
