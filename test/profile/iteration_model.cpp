#include <ashl/profile/iteration_model.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace ap = ashl::profile;
namespace tt = boost::test_tools;

BOOST_AUTO_TEST_CASE(hand_computed_round) {
  ap::round_input w{.cap = {.compute = {0.01, 0.001}, .push = {1e-3, 1e9}, .pull = {1e-3, 1e9}},
                    .batch = 10, .h = 2, .push_bytes = 1e6, .pull_bytes = 2e6};
  const ap::link_model server{0.0, 2e9};
  // compute 0.02 · 2; push 1e-3 + 1e6 / min(1e9, 2e9/4); pull 1e-3 + 2e6 / 5e8.
  BOOST_TEST(ap::predict_round(w, server, 4) == 0.04 + 0.003 + 0.005, tt::tolerance(1e-12));
  // Alone the worker's own link (1e9) is the bottleneck.
  BOOST_TEST(ap::predict_round(w, server, 1) == 0.04 + 0.002 + 0.003, tt::tolerance(1e-12));
}

// A synthetic BSP round: true parameters, per-iteration jitter, the server
// link split fairly between the workers; the model is fitted from jittered
// profiling samples and must predict the round within 10 %.
BOOST_AUTO_TEST_CASE(predicts_a_synthetic_round_within_ten_percent) {
  struct truth {
    double a, b, alpha, beta;
  };
  const std::vector<truth> workers{{0.004, 0.0003, 50e-6, 1.25e9}, {0.006, 0.0006, 80e-6, 1.0e9},
                                   {0.003, 0.0002, 40e-6, 2.5e9}};
  const ap::link_model server{20e-6, 2.5e9};
  const double bytes = 8e6, batch = 64, aggregation = 0.003;
  const std::uint32_t h = 4;
  const auto jitter = [](std::size_t i) { return 1.0 + 0.03 * static_cast<double>(static_cast<int>(i % 5) - 2); };

  std::vector<ap::round_input> fitted;
  for (const auto& t : workers) {
    std::vector<ap::sample> cs, ls;
    for (std::size_t i = 0; i < 30; ++i) {
      const double x = 16.0 * static_cast<double>(1 + i % 6);
      cs.push_back({x, (t.a + t.b * x) * jitter(i)});
      const double by = 1e6 * static_cast<double>(1 + i % 6);
      ls.push_back({by, (t.alpha + by / t.beta) * jitter(i + 1)});
    }
    auto c = ap::fit_compute(cs);
    auto l = ap::fit_link(ls);
    BOOST_TEST_REQUIRE(c.has_value());
    BOOST_TEST_REQUIRE(l.has_value());
    fitted.push_back({.cap = {.compute = *c, .push = *l, .pull = *l}, .batch = batch, .h = h,
                      .push_bytes = bytes, .pull_bytes = bytes});
  }

  double measured = 0.0;
  const double share = server.beta / static_cast<double>(workers.size());
  for (std::size_t w = 0; w < workers.size(); ++w) {
    const auto& t = workers[w];
    double ti = 0.0;
    for (std::uint32_t k = 0; k < h; ++k) ti += (t.a + t.b * batch) * jitter(w + k);
    for (int dir = 0; dir < 2; ++dir) {
      ti += (t.alpha + server.alpha + bytes / std::min(t.beta, share)) * jitter(w + 3 + dir);
    }
    measured = std::max(measured, ti);
  }
  measured += aggregation;
  const double predicted = ap::bsp_round(fitted, server, aggregation);
  BOOST_TEST(predicted == measured, tt::tolerance(0.10));
}

BOOST_AUTO_TEST_CASE(codec_time_adds_to_the_round) {
  ap::round_input w{.cap = {.compute = {0.0, 0.001}, .push = {0.0, 1e9}, .pull = {0.0, 1e9}, .codec = {2e-9}},
                    .batch = 10, .h = 1, .push_bytes = 1e6, .pull_bytes = 1e6, .codec_elements = 1e6};
  const ap::link_model server{0.0, 1e12};
  BOOST_TEST(ap::predict_round(w, server, 1) == 0.01 + 0.002 + 0.001 + 0.001, tt::tolerance(1e-12));
  // Ten workers at once: the server's 1e12 B/s become 1e11 each, still above the worker's link.
  BOOST_TEST(ap::predict_round(w, server, 10) == 0.014, tt::tolerance(1e-12));
}
