#include <ashl/sync/semi_async.hpp>

#include <boost/test/unit_test.hpp>

#include <vector>

namespace as = ashl::sync;

BOOST_AUTO_TEST_CASE(barrier_every_k_iterations_averages) {
  as::semi_async p{{.workers = 2, .sync_every_iterations = 3}};
  for (std::uint64_t s = 1; s <= 2; ++s) {
    BOOST_TEST((p.on_commit({.worker = 0, .sequence = s}).action == as::commit_action::apply));
    BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::serve));
  }
  auto b0 = p.on_commit({.worker = 0, .sequence = 3});
  BOOST_TEST((b0.action == as::commit_action::buffer));
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::hold));
  BOOST_TEST((p.on_commit({.worker = 1, .sequence = 1}).action == as::commit_action::apply));
  BOOST_TEST((p.on_commit({.worker = 1, .sequence = 2}).action == as::commit_action::apply));
  auto b1 = p.on_commit({.worker = 1, .sequence = 3});
  BOOST_TEST((b1.effects.round == std::vector<as::weighted_commit>{{0, 3, 0.5}, {1, 3, 0.5}}));
  BOOST_TEST((b1.effects.released == std::vector<as::worker_id>{0}));
  BOOST_TEST(p.barriers() == 1u);
  // The count restarts after the barrier.
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 4}).action == as::commit_action::apply));
}

BOOST_AUTO_TEST_CASE(barrier_every_dt_seconds) {
  as::semi_async p{{.workers = 2, .sync_every_seconds = 10.0}};
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 1, .time = 4.0}).action == as::commit_action::apply));
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 2, .time = 10.5}).action == as::commit_action::buffer));
  BOOST_TEST((p.on_pull({.worker = 0, .time = 10.6}).action == as::pull_action::hold));
  auto d = p.on_commit({.worker = 1, .sequence = 1, .time = 12.0});
  BOOST_TEST(d.effects.round.size() == 2u);
  BOOST_TEST((d.effects.released == std::vector<as::worker_id>{0}));
  BOOST_TEST(p.next_barrier_time() == 20.0);
  BOOST_TEST((p.on_commit({.worker = 1, .sequence = 2, .time = 15.0}).action == as::commit_action::apply));
}

BOOST_AUTO_TEST_CASE(eviction_completes_the_barrier) {
  as::semi_async p{{.workers = 3, .sync_every_iterations = 1}};
  (void)p.on_commit({.worker = 0, .sequence = 1});
  (void)p.on_commit({.worker = 1, .sequence = 1});
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::hold));
  BOOST_TEST((p.on_pull({.worker = 1}).action == as::pull_action::hold));
  auto o = p.on_evict({.worker = 2});
  BOOST_TEST(o.round.size() == 2u);
  BOOST_TEST((o.released == std::vector<as::worker_id>{0, 1}));
}

BOOST_AUTO_TEST_CASE(staleness_weighting_applies_to_async_commits) {
  as::semi_async p{{.workers = 2, .sync_every_iterations = 100, .scale = 1.0,
                    .staleness_weight = as::staleness_weighting::inverse()}};
  (void)p.on_commit({.worker = 0, .sequence = 1});
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 1}).weight == 0.5);
}
