#include <ashl/sim/event_queue.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <vector>

using ashl::sim::event_queue;

BOOST_AUTO_TEST_CASE(pops_in_time_order_and_fifo_among_equal_times) {
  event_queue q;
  q.push(3.0, 0, 30);
  q.push(1.0, 0, 10);
  q.push(2.0, 0, 20);
  q.push(1.0, 0, 11);  // same time as target 10, scheduled later
  q.push(1.0, 0, 12);
  std::vector<std::uint32_t> got;
  while (!q.empty()) got.push_back(q.pop().target);
  BOOST_TEST(got == (std::vector<std::uint32_t>{10, 11, 12, 20, 30}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(many_pseudo_random_times_come_out_sorted) {
  event_queue q;
  std::uint64_t x = 12345;
  for (int i = 0; i < 20000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    q.push(static_cast<double>(x >> 44) * 1e-3, 1, static_cast<std::uint32_t>(i));
  }
  BOOST_TEST(q.size() == 20000u);
  double last = -1.0;
  std::uint64_t last_order = 0;
  while (!q.empty()) {
    auto e = q.pop();
    BOOST_TEST(e.time >= last);
    if (e.time == last) BOOST_TEST(e.order > last_order);
    last = e.time;
    last_order = e.order;
  }
}
