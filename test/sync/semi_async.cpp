#include <ashl/sync/semi_async.hpp>

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

BOOST_AUTO_TEST_CASE(barrier_every_k_iterations_averages) {
  as::semi_async p{{.workers = 2, .sync_every_iterations = 3}};
  as::outcome_sink out(2);
  for (std::uint64_t s = 1; s <= 2; ++s) {
    BOOST_TEST((p.on_commit({.worker = 0, .sequence = s}, out).action == as::commit_action::apply));
    BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::serve));
  }
  auto b0 = p.on_commit({.worker = 0, .sequence = 3}, out);
  BOOST_TEST((b0.action == as::commit_action::buffer));
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  BOOST_TEST((p.on_commit({.worker = 1, .sequence = 1}, out).action == as::commit_action::apply));
  BOOST_TEST((p.on_commit({.worker = 1, .sequence = 2}, out).action == as::commit_action::apply));
  BOOST_TEST(out.empty());
  (void)p.on_commit({.worker = 1, .sequence = 3}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 3, 0.5}, {1, 3, 0.5}}));
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0}));
  BOOST_TEST(p.barriers() == 1u);
  out.clear();
  // The count restarts after the barrier.
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 4}, out).action == as::commit_action::apply));
}

BOOST_AUTO_TEST_CASE(barrier_every_dt_seconds) {
  as::semi_async p{{.workers = 2, .sync_every_seconds = 10.0}};
  as::outcome_sink out(2);
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 1, .time = 4.0}, out).action == as::commit_action::apply));
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 2, .time = 10.5}, out).action == as::commit_action::buffer));
  BOOST_TEST((p.on_pull({.worker = 0, .time = 10.6}, out) == as::pull_action::hold));
  (void)p.on_commit({.worker = 1, .sequence = 1, .time = 12.0}, out);
  BOOST_TEST(out.round().size() == 2u);
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0}));
  BOOST_TEST(p.next_barrier_time() == 20.0);
  out.clear();
  BOOST_TEST((p.on_commit({.worker = 1, .sequence = 2, .time = 15.0}, out).action == as::commit_action::apply));
}

BOOST_AUTO_TEST_CASE(eviction_completes_the_barrier) {
  as::semi_async p{{.workers = 3, .sync_every_iterations = 1}};
  as::outcome_sink out(3);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  BOOST_TEST((p.on_pull({.worker = 1}, out) == as::pull_action::hold));
  p.on_evict({.worker = 2}, out);
  BOOST_TEST(out.round().size() == 2u);
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0, 1}));
}

BOOST_AUTO_TEST_CASE(staleness_weighting_applies_to_async_commits) {
  as::semi_async p{{.workers = 2, .sync_every_iterations = 100, .scale = 1.0,
                    .staleness_weight = as::staleness_weighting::inverse()}};
  as::outcome_sink out(2);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 1}, out).weight == 0.5);
  BOOST_TEST((p.plan(0).stage == as::stage_id::semi_async));
}

// A joiner starts at a barrier, aligned with everyone: pending (pull held)
// until the barrier in progress completes, then its count starts at 0.
BOOST_AUTO_TEST_CASE(a_joiner_counts_from_zero_from_the_next_barrier) {
  as::semi_async p{{.workers = 1, .sync_every_iterations = 2}};
  as::outcome_sink out(2);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  p.on_join({.worker = 1}, out);
  BOOST_TEST(out.empty());
  BOOST_TEST(p.is_pending(1));
  BOOST_TEST((p.on_pull({.worker = 1}, out) == as::pull_action::hold));
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);  // barrier commit: the barrier completes without the joiner
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 2, 1.0}}));
  BOOST_TEST((released(out) == std::vector<as::worker_id>{1}));
  out.clear();
  BOOST_TEST((p.on_commit({.worker = 1, .sequence = 1}, out).action == as::commit_action::apply));
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 3}, out).action == as::commit_action::apply));
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 4}, out).action == as::commit_action::buffer));
  BOOST_TEST(out.round().empty());  // waits for the joiner's second commit
  BOOST_TEST((p.on_commit({.worker = 1, .sequence = 2}, out).action == as::commit_action::buffer));
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 4, 0.5}, {1, 2, 0.5}}));
}

// docs/elastic.md §2.4: a worker that joins while a barrier is in progress
// is pending: its pull is held until the barrier completes without it, and
// it counts in the next barrier.
BOOST_AUTO_TEST_CASE(a_joiner_during_a_barrier_waits_for_it_and_counts_in_the_next) {
  as::semi_async p{{.workers = 2, .sync_every_iterations = 1}};
  as::outcome_sink out(3);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);  // barrier commit: the barrier is in progress
  p.on_join({.worker = 2}, out);
  BOOST_TEST(p.is_pending(2));
  BOOST_TEST((p.on_pull({.worker = 2}, out) == as::pull_action::hold));
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 1, 0.5}, {1, 1, 0.5}}));
  BOOST_TEST((released(out) == std::vector<as::worker_id>{2}));
  BOOST_TEST(!p.is_pending(2));
  out.clear();
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);
  (void)p.on_commit({.worker = 1, .sequence = 2}, out);
  BOOST_TEST(out.round().empty());  // the next barrier waits for the joiner
  (void)p.on_commit({.worker = 2, .sequence = 1}, out);
  BOOST_TEST(out.round().size() == 3u);
}

BOOST_AUTO_TEST_CASE(a_barrier_never_completes_below_min_workers) {
  as::semi_async p{{.workers = 2, .sync_every_iterations = 1, .min_workers = 2}};
  as::outcome_sink out(2);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  p.on_evict({.worker = 1}, out);  // one live worker: below min_workers
  BOOST_TEST(out.round().empty());
  BOOST_TEST(p.is_held(0));
  p.on_join({.worker = 1}, out);
  BOOST_TEST(!p.is_pending(1));  // the barrier waits for a join: this one
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 1, 0.5}, {1, 1, 0.5}}));
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0}));
}

BOOST_AUTO_TEST_CASE(save_load_round_trip_makes_the_same_decisions) {
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    as::semi_async p{{.workers = 3, .sync_every_iterations = 2, .min_workers = 1 + seed % 3}};
    policy_testing::check_round_trip(p, 4, seed);
  }
  for (std::uint32_t seed = 1; seed <= 8; ++seed) {
    as::semi_async p{{.workers = 2 + seed % 5,
                      .sync_every_iterations = seed % 3 == 0 ? 0u : 1 + seed % 4,
                      .sync_every_seconds = (seed % 3 == 0 || seed % 2 == 1) ? 3.0 : 0.0,
                      .scale = 0.5,
                      .staleness_weight = as::staleness_weighting::inverse()}};
    policy_testing::check_round_trip(p, 2 + seed % 5, seed);
  }
  as::semi_async p{{.workers = 2, .sync_every_iterations = 1}};
  as::outcome_sink out(2);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  policy_testing::check_load_rejects_truncation(p);
}

BOOST_AUTO_TEST_CASE(steady_state_events_allocate_nothing) {
  for (std::uint32_t seed = 1; seed <= 3; ++seed) {
    as::semi_async p{{.workers = 16, .sync_every_iterations = 5, .sync_every_seconds = 0.5}};
    BOOST_TEST(policy_testing::steady_state_allocations(p, 16, seed, counting_new::count) == 0u);
  }
}
