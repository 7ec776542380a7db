#include <ashl/sim/network.hpp>

#include <boost/test/unit_test.hpp>

#include <limits>

using ashl::sim::shared_link;
constexpr double inf = std::numeric_limits<double>::infinity();

BOOST_AUTO_TEST_CASE(processor_sharing_divides_bandwidth_among_active_transfers) {
  shared_link l{100.0};  // bytes per second
  l.add(0.0, 1, 100.0, inf);
  auto c = l.next_completion(0.0);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->time == 1.0);
  // At 0.5 s, 50 bytes of transfer 1 are left; a second transfer of 50 bytes
  // joins: both now run at 50 B/s and finish together at 1.5 s.
  l.add(0.5, 2, 50.0, inf);
  BOOST_TEST(l.remaining(1) == 50.0);
  c = l.next_completion(0.5);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->time == 1.5);
  BOOST_TEST(c->id == 1u);  // tie: lower id
  BOOST_TEST(l.remove(1.5, 1));
  c = l.next_completion(1.5);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->time == 1.5);  // transfer 2 is done as well
  BOOST_TEST(l.remove(1.5, 2));
  BOOST_TEST(!l.next_completion(1.5));
  BOOST_TEST(!l.remove(1.5, 2));
}

BOOST_AUTO_TEST_CASE(a_transfer_is_capped_by_its_own_link) {
  shared_link l{100.0};
  l.add(0.0, 1, 10.0, 10.0);    // sender link: 10 B/s
  l.add(0.0, 2, 100.0, inf);    // share 50 B/s
  BOOST_TEST(l.rate(10.0) == 10.0);
  BOOST_TEST(l.rate(inf) == 50.0);
  auto c = l.next_completion(0.0);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->id == 1u);
  BOOST_TEST(c->time == 1.0);
  BOOST_TEST(l.remove(1.0, 1));
  // 50 bytes of transfer 2 left, now alone at 100 B/s.
  c = l.next_completion(1.0);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->time == 1.5);
}

BOOST_AUTO_TEST_CASE(unlimited_link_runs_each_transfer_at_its_cap) {
  shared_link l;
  l.add(0.0, 1, 100.0, 50.0);
  l.add(0.0, 2, 100.0, 25.0);
  auto c = l.next_completion(0.0);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->time == 2.0);
}
