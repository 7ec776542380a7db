#include <ashl/sync/bsp.hpp>

#include <boost/test/unit_test.hpp>

#include <vector>

namespace as = ashl::sync;

BOOST_AUTO_TEST_CASE(round_of_all_live_workers_mean) {
  as::bsp p{{.workers = 3}};
  auto d0 = p.on_commit({.worker = 0, .sequence = 1});
  BOOST_TEST((d0.action == as::commit_action::buffer));
  BOOST_TEST(d0.effects.empty());
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::hold));
  (void)p.on_commit({.worker = 1, .sequence = 1});
  BOOST_TEST((p.on_pull({.worker = 1}).action == as::pull_action::hold));
  auto d2 = p.on_commit({.worker = 2, .sequence = 1});
  BOOST_TEST((d2.action == as::commit_action::buffer));
  const std::vector<as::weighted_commit> want{{0, 1, 1.0 / 3}, {1, 1, 1.0 / 3}, {2, 1, 1.0 / 3}};
  BOOST_TEST((d2.effects.round == want));
  BOOST_TEST((d2.effects.released == std::vector<as::worker_id>{0, 1}));
  BOOST_TEST((p.on_pull({.worker = 2}).action == as::pull_action::serve));
  BOOST_TEST(p.rounds() == 1u);
  BOOST_TEST(p.buffered() == 0u);
}

BOOST_AUTO_TEST_CASE(batch_weighted_round) {
  as::bsp p{{.workers = 2, .weighting = as::round_weighting::samples}};
  (void)p.on_commit({.worker = 0, .sequence = 1, .samples = 96});
  auto d = p.on_commit({.worker = 1, .sequence = 1, .samples = 32});
  BOOST_TEST(d.effects.round.size() == 2u);
  BOOST_TEST(d.effects.round[0].weight == 0.75);
  BOOST_TEST(d.effects.round[1].weight == 0.25);
}

BOOST_AUTO_TEST_CASE(eviction_unblocks_the_barrier_and_keeps_received_commits) {
  as::bsp p{{.workers = 3}};
  (void)p.on_commit({.worker = 0, .sequence = 1});
  (void)p.on_commit({.worker = 2, .sequence = 1});
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::hold));
  // Worker 2 dies after its commit arrived; worker 1 never committed.
  auto o2 = p.on_evict({.worker = 2});
  BOOST_TEST(o2.round.empty());  // still waiting for worker 1
  auto o1 = p.on_evict({.worker = 1});
  const std::vector<as::weighted_commit> want{{0, 1, 0.5}, {2, 1, 0.5}};
  BOOST_TEST((o1.round == want));
  BOOST_TEST((o1.released == std::vector<as::worker_id>{0}));
  BOOST_TEST(p.plan(0).data_share == 1.0);
  // Next round has only worker 0.
  auto d = p.on_commit({.worker = 0, .sequence = 2});
  BOOST_TEST((d.effects.round == std::vector<as::weighted_commit>{{0, 2, 1.0}}));
}

BOOST_AUTO_TEST_CASE(duplicates_never_apply_twice_and_joiners_wait_for_next_commit) {
  as::bsp p{{.workers = 2}};
  (void)p.on_commit({.worker = 0, .sequence = 1});
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 1}).action == as::commit_action::drop));
  (void)p.on_join({.worker = 2});
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 1}).effects.round.empty());
  auto d = p.on_commit({.worker = 2, .sequence = 1});
  BOOST_TEST(d.effects.round.size() == 3u);
}

BOOST_AUTO_TEST_CASE(early_second_commit_goes_to_the_next_round_and_drain_flushes) {
  as::bsp p{{.workers = 2}};
  (void)p.on_commit({.worker = 0, .sequence = 1});
  (void)p.on_commit({.worker = 0, .sequence = 2});
  auto d = p.on_commit({.worker = 1, .sequence = 1});
  BOOST_TEST((d.effects.round == std::vector<as::weighted_commit>{{0, 1, 0.5}, {1, 1, 0.5}}));
  BOOST_TEST(p.buffered() == 1u);
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::hold));
  auto o = p.drain();
  BOOST_TEST((o.round == std::vector<as::weighted_commit>{{0, 2, 1.0}}));
  BOOST_TEST((o.released == std::vector<as::worker_id>{0}));
  BOOST_TEST(p.buffered() == 0u);
}
