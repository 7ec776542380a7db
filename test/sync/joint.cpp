#include <ashl/sync/joint.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/policy_testing.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace as = ashl::sync;
using ashl::measurement_kind;
using ashl::stage_id;

namespace {
as::outcome_sink sink;
as::outcome_sink& fresh() {
  sink.clear();
  return sink;
}

// The minimum of the objective over every (b_1..b_M, s) of the grid.
double brute_force(const std::vector<as::joint_model>& m, const as::joint_grid& g) {
  std::vector<std::uint32_t> sizes;
  for (std::uint32_t b = g.min_batch; b <= g.max_batch; b += g.batch_step) sizes.push_back(b);
  std::vector<std::size_t> idx(m.size(), 0);
  std::vector<std::uint32_t> batch(m.size());
  double best = std::numeric_limits<double>::infinity();
  for (;;) {
    for (std::size_t i = 0; i < m.size(); ++i) batch[i] = sizes[idx[i]];
    for (std::uint32_t s = g.s_min; s <= g.s_max; ++s) best = std::min(best, as::joint_objective(m, batch, s, g));
    std::size_t k = 0;
    while (k < m.size() && ++idx[k] == sizes.size()) idx[k++] = 0;
    if (k == m.size()) return best;
  }
}

// Compute, push and pull of worker w: `per_sample` seconds per sample at
// `batch`, push and pull `link` seconds each.
void measure(as::joint& p, as::worker_id w, double per_sample, double link, double batch = 16) {
  p.on_measurement({.worker = w, .kind = measurement_kind::compute, .seconds = per_sample * batch, .amount = batch},
                   fresh());
  p.on_measurement({.worker = w, .kind = measurement_kind::push, .seconds = link, .amount = 4096}, fresh());
  p.on_measurement({.worker = w, .kind = measurement_kind::pull, .seconds = link, .amount = 4096}, fresh());
}
}  // namespace

BOOST_AUTO_TEST_CASE(the_choice_is_the_minimum_over_the_grid) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> k(1e-4, 4e-3), o(1e-3, 0.2), lambda(0.0, 0.1), horizon(1.0, 20.0);
  int cases = 0;
  for (std::size_t m = 2; m <= 4; ++m) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<as::joint_model> models(m);
      for (auto& x : models) x = {k(rng), o(rng)};
      const as::joint_grid g{.s_min = static_cast<std::uint32_t>(trial % 2),
                             .s_max = static_cast<std::uint32_t>(2 + trial % 3),
                             .min_batch = 8,
                             .max_batch = m == 4 ? 40u : 64u,
                             .batch_step = 8,
                             .horizon = horizon(rng),
                             .staleness_cost = lambda(rng)};
      const auto c = as::choose_joint(models, g);
      BOOST_TEST_REQUIRE(c.batch.size() == m);
      BOOST_TEST(c.staleness >= g.s_min);
      BOOST_TEST(c.staleness <= g.s_max);
      for (auto b : c.batch) BOOST_TEST((b >= g.min_batch && b <= g.max_batch && (b - g.min_batch) % g.batch_step == 0));
      BOOST_TEST(c.seconds_per_sample == as::joint_objective(models, c.batch, c.staleness, g));
      BOOST_TEST(c.seconds_per_sample == brute_force(models, g), boost::test_tools::tolerance(1e-12));
      ++cases;
    }
  }
  BOOST_TEST(cases == 120);
}

BOOST_AUTO_TEST_CASE(the_objective_is_the_documented_formula) {
  // Two workers: T_0(32) = 0.001·32 + 0.018 = 0.05, T_1(16) = 0.005·16 + 0.02 = 0.1.
  const std::vector<as::joint_model> m{{0.001, 0.018}, {0.005, 0.02}};
  const as::joint_grid g{.horizon = 10.0, .staleness_cost = 0.1};
  const std::vector<std::uint32_t> b{32, 16};
  // s = 0: worker 0 capped at the slowest rate 1/0.1: Θ = (32 + 16) / 0.1 = 480.
  BOOST_TEST(as::joint_objective(m, b, 0, g) == 1.0 / 480.0, boost::test_tools::tolerance(1e-12));
  // s = 5: cap 1.5 / 0.1 = 15 < 1/0.05: Θ = 32·15 + 16·10 = 640, J = 1.5 / 640.
  BOOST_TEST(as::joint_objective(m, b, 5, g) == 1.5 / 640.0, boost::test_tools::tolerance(1e-12));
  // s = 10: worker 0 runs free: Θ = 32·20 + 160 = 800, J = 2 / 800.
  BOOST_TEST(as::joint_objective(m, b, 10, g) == 2.0 / 800.0, boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(chooses_once_measured_rechooses_on_drift_and_not_without) {
  const as::joint_params jp{.workers = 3, .s_min = 0, .s_max = 4, .min_batch = 8, .max_batch = 64, .batch_step = 8,
                            .horizon = 4.0, .staleness_cost = 0.01, .drift = 0.3, .half_life = 1e-9};
  as::joint p{jp};
  BOOST_TEST((p.stage() == stage_id::dssp));
  BOOST_TEST(p.plan(0).batch_size == 8u);
  BOOST_TEST(p.bound() == 0u);
  measure(p, 0, 0.001, 0.01);
  measure(p, 1, 0.002, 0.01);
  BOOST_TEST(p.choices() == 0u);  // worker 2 is not measured yet
  measure(p, 2, 0.004, 0.02);
  BOOST_TEST(p.choices() == 1u);
  const std::vector<as::joint_model> models{{0.001, 0.02}, {0.002, 0.02}, {0.004, 0.04}};
  const auto want = as::choose_joint(models, jp.grid());
  for (as::worker_id w = 0; w < 3; ++w) BOOST_TEST(p.plan(w).batch_size == want.batch[w]);
  BOOST_TEST(p.bound() == want.staleness);
  BOOST_TEST(p.predicted_seconds_per_sample() == want.seconds_per_sample);
  // The same speeds, measured again and again (at the new batches): no re-choice.
  for (int n = 0; n < 20; ++n) {
    measure(p, 0, 0.001, 0.01, p.plan(0).batch_size);
    measure(p, 1, 0.002, 0.01, p.plan(1).batch_size);
    measure(p, 2, 0.004, 0.02, p.plan(2).batch_size);
  }
  BOOST_TEST(p.choices() == 1u);
  // Small noise within the drift (+20 % < 30 %): none either.
  measure(p, 1, 0.0024, 0.01);
  BOOST_TEST(p.choices() == 1u);
  // Worker 0 becomes 4x slower: a new choice, from the new model.
  measure(p, 0, 0.004, 0.01);
  BOOST_TEST(p.choices() == 2u);
  const std::vector<as::joint_model> drifted{{0.004, 0.02}, {0.0024, 0.02}, {0.004, 0.04}};
  const auto again = as::choose_joint(drifted, jp.grid());
  for (as::worker_id w = 0; w < 3; ++w) BOOST_TEST(p.plan(w).batch_size == again.batch[w]);
  BOOST_TEST(p.bound() == again.staleness);
}

BOOST_AUTO_TEST_CASE(the_bound_holds_pulls_like_ssp) {
  // One slow worker far slower than the rest: the choice lets the fast ones run ahead.
  const as::joint_params jp{.workers = 2, .s_min = 2, .s_max = 2, .min_batch = 8, .max_batch = 8, .batch_step = 8};
  as::joint p{jp};
  measure(p, 0, 0.001, 0.01);
  measure(p, 1, 0.01, 0.01);
  BOOST_TEST(p.choices() == 1u);
  BOOST_TEST(p.bound() == 2u);
  // Worker 0 commits 3 times: c_0 − min = 3 > 2: its pull is held.
  for (std::uint64_t s = 1; s <= 2; ++s) {
    BOOST_TEST((p.on_commit({.worker = 0, .sequence = s}, fresh()).action == as::commit_action::apply));
    BOOST_TEST((p.on_pull({.worker = 0}, fresh()) == as::pull_action::serve));
  }
  (void)p.on_commit({.worker = 0, .sequence = 3}, fresh());
  BOOST_TEST((p.on_pull({.worker = 0}, fresh()) == as::pull_action::hold));
  BOOST_TEST(p.is_held(0));
  // The slow worker's commit brings it within the bound: released.
  (void)p.on_commit({.worker = 1, .sequence = 1}, fresh());
  BOOST_TEST(sink.released().size() == 1u);
  BOOST_TEST(sink.released()[0] == 0u);
  BOOST_TEST(!p.is_held(0));
}

BOOST_AUTO_TEST_CASE(a_wider_bound_releases_what_it_allows) {
  // s_min 0: held at once; then a choice at s = 3 (λ = 0 makes the widest bound best) releases.
  const as::joint_params jp{.workers = 2, .s_min = 0, .s_max = 3, .min_batch = 8, .max_batch = 8, .batch_step = 8,
                            .staleness_cost = 0.0};
  as::joint p{jp};
  (void)p.on_commit({.worker = 0, .sequence = 1}, fresh());
  BOOST_TEST((p.on_pull({.worker = 0}, fresh()) == as::pull_action::hold));
  measure(p, 0, 0.001, 0.01);
  measure(p, 1, 0.01, 0.01);  // the choice: worker 0 is 5x faster, s = 3
  BOOST_TEST(p.bound() == 3u);
  BOOST_TEST(!p.is_held(0));
}

BOOST_AUTO_TEST_CASE(save_load_round_trip_and_truncation) {
  policy_testing::check_round_trip(as::joint{{.workers = 4, .s_min = 0, .s_max = 3, .min_batch = 8, .max_batch = 32,
                                              .batch_step = 8, .half_life = 2.0}},
                                   4, 5);
  as::joint p{{.workers = 2, .min_batch = 8, .max_batch = 32, .batch_step = 8}};
  measure(p, 0, 0.001, 0.01);
  measure(p, 1, 0.003, 0.01);
  BOOST_TEST_REQUIRE(p.choices() == 1u);
  policy_testing::check_load_rejects_truncation(p);
}
