#include <ashl/profile/straggler.hpp>

#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <optional>
#include <vector>

namespace ap = ashl::profile;
namespace tt = boost::test_tools;

namespace {
// `n` samples of each worker at `t[w]` seconds and batch 32; every report.
std::vector<ap::straggler_report> feed(ap::straggler_detector& d, const std::vector<double>& t, int n) {
  std::vector<ap::straggler_report> out;
  for (int k = 0; k < n; ++k) {
    for (std::uint32_t w = 0; w < t.size(); ++w) {
      auto r = d.record(w, t[w], 32);
      BOOST_TEST_REQUIRE(r.has_value());
      if (*r) out.push_back(**r);
    }
  }
  return out;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_slow_worker_at_its_own_predicted_speed_is_never_flagged) {
  // Worker 3 is 4x slower than the others by design, and its model says so.
  ap::straggler_detector d{{.workers = 4, .window = 4, .threshold = 0.5, .consecutive = 1}};
  for (std::uint32_t w = 0; w < 3; ++w) BOOST_TEST(d.set_model(w, {0.002, 0.001}).ok());  // 0.034 s at 32
  BOOST_TEST(d.set_model(3, {0.008, 0.004}).ok());                                         // 0.136 s at 32
  BOOST_TEST(feed(d, {0.034, 0.035, 0.033, 0.136}, 40).empty());
  // Jitter below the line (+40 % < +50 %) is not a straggler either.
  BOOST_TEST(feed(d, {0.034, 0.035, 0.033, 0.19}, 40).empty());
}

BOOST_AUTO_TEST_CASE(a_worker_that_drifts_from_its_prediction_is_flagged_after_n_windows) {
  ap::straggler_detector d{{.workers = 3, .window = 4, .threshold = 0.5, .consecutive = 2}};
  for (std::uint32_t w = 0; w < 3; ++w) BOOST_TEST(d.set_model(w, {0.0, 0.001}).ok());  // 0.032 s at 32
  BOOST_TEST(feed(d, {0.032, 0.032, 0.032}, 8).empty());
  // Worker 1 becomes 2x slower than its own prediction: the first window is
  // over the line, the second reports, once.
  BOOST_TEST(feed(d, {0.032, 0.064, 0.032}, 4).empty());
  BOOST_TEST(d.over(1) == 1u);
  auto r = feed(d, {0.032, 0.064, 0.032}, 4);
  BOOST_TEST_REQUIRE(r.size() == 1u);
  BOOST_TEST(r[0].worker == 1u);
  BOOST_TEST(r[0].time == 0.064);
  BOOST_TEST(r[0].predicted == 0.032, tt::tolerance(1e-12));
  BOOST_TEST(r[0].ratio == 2.0, tt::tolerance(1e-12));
  BOOST_TEST(r[0].line == 0.048, tt::tolerance(1e-12));
  BOOST_TEST(r[0].windows == 2u);
  BOOST_TEST(ap::to_string(r[0]) == "worker 1: 0.064 s > 0.048 s (predicted 0.032 s + 50 %) for 2 windows");
  // The count starts again: one report per `consecutive` windows, never a storm.
  BOOST_TEST(d.over(1) == 0u);
  BOOST_TEST(feed(d, {0.032, 0.064, 0.032}, 4).empty());
  BOOST_TEST(feed(d, {0.032, 0.064, 0.032}, 4).size() == 1u);
  // A new model (the re-plan's basis) makes the new speed the prediction.
  BOOST_TEST(d.set_model(1, {0.0, 0.002}).ok());
  BOOST_TEST(feed(d, {0.032, 0.064, 0.032}, 40).empty());
}

BOOST_AUTO_TEST_CASE(at_most_one_report_per_window_and_recovery_resets) {
  ap::straggler_detector d{{.workers = 2, .window = 3, .threshold = 0.2, .consecutive = 1}};
  BOOST_TEST(d.set_model(0, {0.1, 0.0}).ok());
  BOOST_TEST(d.set_model(1, {0.1, 0.0}).ok());
  // 12 samples of a worker 3x slow: 4 windows, 4 reports, each closing its window.
  std::size_t reports = 0;
  for (int k = 0; k < 12; ++k) {
    auto r = d.record(0, 0.3, 8);
    BOOST_TEST_REQUIRE(r.has_value());
    if (*r) {
      ++reports;
      BOOST_TEST(k % 3 == 2);
    }
  }
  BOOST_TEST(reports == 4u);
  // One spike in a window is not enough: the window's median decides.
  d = ap::straggler_detector{{.workers = 2, .window = 3, .threshold = 0.2, .consecutive = 2}};
  BOOST_TEST(d.set_model(0, {0.1, 0.0}).ok());
  BOOST_TEST(d.record(0, 0.1, 8)->has_value() == false);
  BOOST_TEST(d.record(0, 1.0, 8)->has_value() == false);
  BOOST_TEST(d.record(0, 0.1, 8)->has_value() == false);
  BOOST_TEST(d.over(0) == 0u);
  // Over, then a window at speed: the count resets.
  for (int k = 0; k < 3; ++k) (void)d.record(0, 0.5, 8);
  BOOST_TEST(d.over(0) == 1u);
  for (int k = 0; k < 3; ++k) (void)d.record(0, 0.1, 8);
  BOOST_TEST(d.over(0) == 0u);
}

BOOST_AUTO_TEST_CASE(ratios_follow_the_batch_and_workers_without_a_model_are_not_judged) {
  ap::straggler_detector d{{.workers = 2, .window = 2, .threshold = 0.5, .consecutive = 1}};
  BOOST_TEST(d.set_model(0, {0.0, 0.01}).ok());
  // A batch change within a window: each sample is judged at its own batch.
  BOOST_TEST(!d.record(0, 0.32, 32)->has_value());
  BOOST_TEST(!d.record(0, 0.64, 64)->has_value());
  BOOST_TEST(feed(d, {0.32, 100.0}, 10).empty());  // worker 1 has no model
  BOOST_TEST(!d.has_model(1));
  // A joiner grows the table.
  BOOST_TEST(d.set_model(5, {0.0, 0.01}).ok());
  BOOST_TEST(d.workers() == 6u);
  BOOST_TEST(!d.record(5, 1.0, 32)->has_value());
  BOOST_TEST(d.record(5, 1.0, 32)->has_value());
}

BOOST_AUTO_TEST_CASE(rejects_bad_input) {
  ap::straggler_detector d{{.workers = 2}};
  BOOST_TEST(!d.record(2, 1.0, 1).has_value());
  auto s = d.record(0, -0.5, 1);
  BOOST_TEST_REQUIRE(!s.has_value());
  BOOST_TEST(s.error().message() == "straggler.seconds = -0.5: duration must be finite and > 0");
  BOOST_TEST(!d.set_model(0, {0.0, 0.0}).ok());
  BOOST_TEST(d.set_model(0, {-1.0, 1.0}).message() == "straggler.model.a = -1: must be finite and >= 0");
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
  BOOST_TEST(!ap::straggler_detector::create({.workers = 2, .threshold = -1.0}).has_value());
}

BOOST_AUTO_TEST_CASE(save_and_load_continue_exactly) {
  ap::straggler_detector d{{.workers = 3, .window = 3, .threshold = 0.25, .consecutive = 2}};
  for (std::uint32_t w = 0; w < 3; ++w) BOOST_TEST(d.set_model(w, {0.01, 0.001}).ok());
  (void)feed(d, {0.042, 0.09, 0.05}, 4);  // windows closed, one open with a sample each
  std::vector<std::byte> bytes;
  ashl::state_writer out(bytes);
  d.save(out);
  ashl::state_reader in(bytes);
  auto back = ap::straggler_detector::load(in);
  BOOST_TEST_REQUIRE(back.has_value(), (back ? "" : back.error().message()));
  BOOST_TEST(in.at_end());
  BOOST_TEST((*back == d));
  BOOST_TEST((feed(*back, {0.042, 0.09, 0.05}, 9) == feed(d, {0.042, 0.09, 0.05}, 9)));
  std::vector<std::byte> cut(bytes.begin(), bytes.end() - 3);
  ashl::state_reader short_in(cut);
  BOOST_TEST(!ap::straggler_detector::load(short_in).has_value());
}
