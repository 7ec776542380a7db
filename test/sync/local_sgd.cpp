#include <ashl/sync/local_sgd.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/counting_new.hpp"
#include "../support/policy_testing.hpp"

#include <vector>

namespace as = ashl::sync;

namespace {
std::vector<as::weighted_commit> round(const as::outcome_sink& out) { return {out.round().begin(), out.round().end()}; }
std::vector<as::worker_id> released(const as::outcome_sink& out) {
  return {out.released().begin(), out.released().end()};
}
}  // namespace

BOOST_AUTO_TEST_CASE(plan_has_h_local_steps_and_rounds_are_synchronous) {
  as::local_sgd p{{.workers = 2, .local_steps = 4}};
  as::outcome_sink out(2);
  BOOST_TEST(p.plan(0).local_iterations == 4u);
  BOOST_TEST((p.plan(1).stage == as::stage_id::local_sgd));
  BOOST_TEST((p.stage() == as::stage_id::local_sgd));
  BOOST_TEST(p.plan(1).data_share == 0.5f);
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST((p.on_pull({.worker = 1}, out) == as::pull_action::hold));
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 1, 0.5}, {1, 1, 0.5}}));
  BOOST_TEST((released(out) == std::vector<as::worker_id>{1}));
  BOOST_TEST(p.rounds() == 1u);
}

BOOST_AUTO_TEST_CASE(eviction_unblocks_a_round) {
  as::local_sgd p{{.workers = 2, .local_steps = 2}};
  as::outcome_sink out(2);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  p.on_evict({.worker = 1}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 1, 1.0}}));
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0}));
  BOOST_TEST(out.every_plan_changed());
}

// DiLoCo's synchronous form is this policy: a joiner's first delta is
// computed from the round's result and averaged in the next round.
BOOST_AUTO_TEST_CASE(a_joiner_counts_from_the_next_round_and_min_workers_holds_rounds) {
  as::local_sgd p{{.workers = 2, .local_steps = 4, .min_workers = 2}};
  as::outcome_sink out(3);
  BOOST_TEST(p.min_workers() == 2u);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  p.on_join({.worker = 2}, out);
  BOOST_TEST(p.is_pending(2));
  BOOST_TEST((p.on_pull({.worker = 2}, out) == as::pull_action::hold));
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 1, 0.5}, {1, 1, 0.5}}));
  BOOST_TEST((released(out) == std::vector<as::worker_id>{2}));
  out.clear();
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);
  p.on_evict({.worker = 1}, out);
  BOOST_TEST(out.round().empty());  // worker 2 has not sent its delta yet
  p.on_evict({.worker = 2}, out);   // one left, below min_workers 2: no round
  BOOST_TEST(out.round().empty());
  BOOST_TEST(p.buffered() == 1u);
}

BOOST_AUTO_TEST_CASE(save_load_round_trip_makes_the_same_decisions) {
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    as::local_sgd p{{.workers = 3, .local_steps = 2, .min_workers = 1 + seed % 3}};
    policy_testing::check_round_trip(p, 4, seed);
  }
  for (std::uint32_t seed = 1; seed <= 6; ++seed) {
    as::local_sgd p{{.workers = 2 + seed % 4, .local_steps = 1 + seed, .weighting = as::round_weighting::samples}};
    policy_testing::check_round_trip(p, 2 + seed % 4, seed);
  }
  as::local_sgd p{{.workers = 2, .local_steps = 3}};
  as::local_sgd q;
  auto bytes = policy_testing::saved(p);
  ashl::state_reader in(bytes);
  BOOST_TEST(q.load(in).ok());
  BOOST_TEST(q.plan(0).local_iterations == 3u);
  policy_testing::check_load_rejects_truncation(p);
}

BOOST_AUTO_TEST_CASE(steady_state_events_allocate_nothing) {
  for (std::uint32_t seed = 1; seed <= 3; ++seed) {
    as::local_sgd p{{.workers = 16, .local_steps = 4}};
    BOOST_TEST(policy_testing::steady_state_allocations(p, 16, seed, counting_new::count) == 0u);
  }
}
