#include <ashl/profile/straggler.hpp>

#include <boost/test/unit_test.hpp>

#include <vector>

namespace ap = ashl::profile;
namespace tt = boost::test_tools;

namespace {
void fill(ap::straggler_detector& d, const std::vector<double>& t, int per_worker) {
  for (int k = 0; k < per_worker; ++k) {
    for (std::uint32_t w = 0; w < t.size(); ++w) BOOST_TEST(d.record(w, t[w]).ok());
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(flagged_after_n_windows_and_not_before) {
  ap::straggler_detector d{{.workers = 4, .window = 4, .k = 3.0, .consecutive = 3}};
  fill(d, {1.0, 1.1, 0.9, 1.0}, 4);
  BOOST_TEST(d.evaluate().empty());
  // Worker 3 slows: median 1.05, MAD of deviations {.05, .05, .15, 1.95} = 0.1.
  for (int window = 1; window <= 2; ++window) {
    fill(d, {1.0, 1.1, 0.9, 3.0}, 4);
    BOOST_TEST(d.evaluate().empty());
  }
  fill(d, {1.0, 1.1, 0.9, 3.0}, 4);
  auto r = d.evaluate();
  BOOST_TEST_REQUIRE(r.size() == 1u);
  BOOST_TEST(r[0].worker == 3u);
  BOOST_TEST(r[0].time == 3.0);
  BOOST_TEST(r[0].median == 1.05, tt::tolerance(1e-12));
  BOOST_TEST(r[0].mad == 0.1, tt::tolerance(1e-9));
  BOOST_TEST(r[0].windows == 3u);
  BOOST_TEST(r[0].threshold == 1.35, tt::tolerance(1e-9));
  // It recovers: the count resets.
  fill(d, {1.0, 1.1, 0.9, 1.0}, 4);
  BOOST_TEST(d.evaluate().empty());
  fill(d, {1.0, 1.1, 0.9, 3.0}, 4);
  BOOST_TEST(d.evaluate().empty());
}

BOOST_AUTO_TEST_CASE(mildly_slow_worker_and_identical_workers_are_not_flagged) {
  ap::straggler_detector d{{.workers = 4, .window = 2, .k = 3.0, .consecutive = 1}};
  fill(d, {1.0, 1.1, 0.9, 1.2}, 2);  // 1.2 < 1.05 + 3 * 0.1
  BOOST_TEST(d.evaluate().empty());
  ap::straggler_detector e{{.workers = 3, .window = 2, .k = 3.0, .consecutive = 1}};
  fill(e, {1.0, 1.0, 1.02}, 2);  // MAD 0, floored at 0.01 * median
  BOOST_TEST(e.evaluate().empty());
  fill(e, {1.0, 1.0, 1.5}, 2);
  auto r = e.evaluate();
  BOOST_TEST_REQUIRE(r.size() == 1u);
  BOOST_TEST(r[0].worker == 2u);
  BOOST_TEST(r[0].mad == 0.01, tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(window_uses_the_median_of_recent_iterations) {
  ap::straggler_detector d{{.workers = 3, .window = 3, .k = 3.0, .consecutive = 1}};
  fill(d, {1.0, 1.0, 1.0}, 3);
  BOOST_TEST(d.record(2, 10.0).ok());  // one spike in a window of three
  BOOST_TEST(d.evaluate().empty());
}

BOOST_AUTO_TEST_CASE(rejects_bad_input) {
  ap::straggler_detector d{{.workers = 2}};
  BOOST_TEST(!d.record(2, 1.0).ok());
  auto s = d.record(0, -0.5);
  BOOST_TEST(s.message() == "straggler.seconds = -0.5: duration must be finite and > 0");
  BOOST_TEST(d.evaluate().empty());
}

BOOST_AUTO_TEST_CASE(create_checks_parameters) {
  BOOST_TEST(ap::straggler_detector::create({.workers = 3}).has_value());
  auto w = ap::straggler_detector::create({.workers = 0});
  BOOST_TEST_REQUIRE(!w.has_value());
  BOOST_TEST(w.error().message() == "straggler.workers = 0: must be >= 1");
  auto n = ap::straggler_detector::create({.workers = 2, .consecutive = 0});
  BOOST_TEST_REQUIRE(!n.has_value());
  BOOST_TEST(n.error().message() == "straggler.consecutive = 0: must be >= 1");
  BOOST_TEST(!ap::straggler_detector::create({.workers = 2, .window = 0}).has_value());
  BOOST_TEST(!ap::straggler_detector::create({.workers = 2, .k = -1.0}).has_value());
}

BOOST_AUTO_TEST_CASE(report_says_why) {
  ap::straggler_detector d{{.workers = 3, .window = 1, .k = 3.0, .consecutive = 2}};
  for (int i = 0; i < 2; ++i) {
    fill(d, {1.0, 1.0, 4.0}, 1);
    const auto r = d.evaluate();
    BOOST_TEST(r.size() == (i == 0 ? 0u : 1u));
    if (r.empty()) continue;
    BOOST_TEST(r[0].threshold == 1.03, tt::tolerance(1e-12));  // 1 + 3 · (floor 0.01 · 1)
    BOOST_TEST(ap::to_string(r[0], d.parameters().k) ==
               "worker 2: 4 s > 1.03 s (median 1 s + 3 x MAD 0.01 s) for 2 windows");
  }
}

BOOST_AUTO_TEST_CASE(two_workers_cannot_single_one_out) {
  ap::straggler_detector d{{.workers = 2, .window = 1, .k = 3.0, .consecutive = 1}};
  fill(d, {1.0, 100.0}, 1);  // each is one MAD (49.5) from the median 50.5
  BOOST_TEST(d.evaluate().empty());
}
