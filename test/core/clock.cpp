#include <ashl/core/clock.hpp>

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstdint>

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

// system_clock: the Unix-epoch wall time that incarnation numbers and trace
// stamps are made of, read between two readings of the standard clock.
BOOST_AUTO_TEST_CASE(system_clock_reads_the_unix_epoch_wall_time) {
  static_assert(ashl::clock<ashl::system_clock>);
  const auto ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  const auto before = ns();
  const std::uint64_t got = ashl::system_clock::nanoseconds_since_epoch();
  const double s = ashl::system_clock{}.now();
  const auto after = ns();
  BOOST_TEST(got >= static_cast<std::uint64_t>(before));
  BOOST_TEST(got <= static_cast<std::uint64_t>(after));
  BOOST_TEST(s >= static_cast<double>(before) * 1e-9 - 1e-6);
  BOOST_TEST(s <= static_cast<double>(after) * 1e-9 + 1e-6);
}
