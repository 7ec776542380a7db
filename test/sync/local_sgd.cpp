#include <ashl/sync/local_sgd.hpp>

#include <boost/test/unit_test.hpp>

#include <vector>

namespace as = ashl::sync;

BOOST_AUTO_TEST_CASE(plan_has_h_local_steps_and_rounds_are_synchronous) {
  as::local_sgd p{{.workers = 2, .local_steps = 4}};
  BOOST_TEST(p.plan(0).local_iterations == 4u);
  BOOST_TEST(p.plan(1).stage == "local_sgd");
  BOOST_TEST(p.plan(1).data_share == 0.5);
  (void)p.on_commit({.worker = 1, .sequence = 1});
  BOOST_TEST((p.on_pull({.worker = 1}).action == as::pull_action::hold));
  auto d = p.on_commit({.worker = 0, .sequence = 1});
  BOOST_TEST((d.effects.round == std::vector<as::weighted_commit>{{0, 1, 0.5}, {1, 1, 0.5}}));
  BOOST_TEST((d.effects.released == std::vector<as::worker_id>{1}));
  BOOST_TEST(p.rounds() == 1u);
}

BOOST_AUTO_TEST_CASE(eviction_unblocks_a_round) {
  as::local_sgd p{{.workers = 2, .local_steps = 2}};
  (void)p.on_commit({.worker = 0, .sequence = 1});
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::hold));
  auto o = p.on_evict({.worker = 1});
  BOOST_TEST((o.round == std::vector<as::weighted_commit>{{0, 1, 1.0}}));
  BOOST_TEST((o.released == std::vector<as::worker_id>{0}));
}
