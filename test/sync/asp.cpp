#include <ashl/sync/asp.hpp>

#include <boost/test/unit_test.hpp>

namespace as = ashl::sync;

BOOST_AUTO_TEST_CASE(applies_everything_at_once_and_serves_every_pull) {
  as::asp p{{.workers = 2}};
  for (std::uint64_t s = 1; s <= 5; ++s) {
    auto d = p.on_commit({.worker = 0, .sequence = s});
    BOOST_TEST((d.action == as::commit_action::apply));
    BOOST_TEST(d.weight == 1.0);
    BOOST_TEST(d.effects.empty());
  }
  BOOST_TEST((p.on_pull({.worker = 1}).action == as::pull_action::serve));
  BOOST_TEST(p.plan(0).stage == "asp");
  BOOST_TEST(p.name() == "asp");
}

BOOST_AUTO_TEST_CASE(duplicates_and_unknown_workers_are_dropped) {
  as::asp p{{.workers = 2}};
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 3}).action == as::commit_action::apply));
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 3}).action == as::commit_action::drop));
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 2}).action == as::commit_action::drop));
  BOOST_TEST((p.on_commit({.worker = 5, .sequence = 1}).action == as::commit_action::drop));
  p.on_evict({.worker = 1});
  BOOST_TEST((p.on_commit({.worker = 1, .sequence = 1}).action == as::commit_action::drop));
  p.on_join({.worker = 5});
  BOOST_TEST((p.on_commit({.worker = 5, .sequence = 1}).action == as::commit_action::apply));
}

BOOST_AUTO_TEST_CASE(staleness_aware_weighting_counts_updates_since_last_pull) {
  as::asp p{{.workers = 2, .scale = 0.5, .staleness_weight = as::staleness_weighting::inverse()}};
  // Worker 1 pulls, then worker 0 commits 3 times: worker 1's next commit is 3 stale.
  (void)p.on_pull({.worker = 1});
  for (std::uint64_t s = 1; s <= 3; ++s) (void)p.on_commit({.worker = 0, .sequence = s});
  BOOST_TEST(p.staleness(1) == 3u);
  auto d = p.on_commit({.worker = 1, .sequence = 1});
  BOOST_TEST(d.weight == 0.5 * 0.25);
  (void)p.on_pull({.worker = 1});
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 2}).weight == 0.5);
}

BOOST_AUTO_TEST_CASE(custom_staleness_function_and_per_worker_weights) {
  as::asp p{{.workers = 2,
               .weights = {0.25, 0.75},
               .staleness_weight = as::staleness_weighting::custom([](std::uint64_t t) { return t == 0 ? 1.0 : 0.5; })}};
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 1}).weight == 0.75);
  BOOST_TEST(p.on_commit({.worker = 0, .sequence = 1}).weight == 0.25 * 0.5);
  BOOST_TEST(p.plan(1).data_share == 0.75);
}
