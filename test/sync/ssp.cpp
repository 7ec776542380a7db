#include <ashl/sync/ssp.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <random>
#include <vector>

namespace as = ashl::sync;

BOOST_AUTO_TEST_CASE(pull_held_past_the_bound_and_released_by_the_slow_commit) {
  as::ssp p{{.workers = 3, .staleness = 1}};
  std::uint64_t seq0 = 0;
  // Worker 0 commits twice: c_0 − min = 2 > 1, its pull is held.
  (void)p.on_commit({.worker = 0, .sequence = ++seq0});
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::serve));
  (void)p.on_commit({.worker = 0, .sequence = ++seq0});
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::hold));
  BOOST_TEST(p.is_held(0));
  // Worker 1 commits: min is still 0 (worker 2).
  auto d1 = p.on_commit({.worker = 1, .sequence = 1});
  BOOST_TEST((d1.action == as::commit_action::apply));
  BOOST_TEST(d1.effects.released.empty());
  // Worker 2 commits: min becomes 1, c_0 − 1 = 1 <= 1: released.
  auto d2 = p.on_commit({.worker = 2, .sequence = 1});
  BOOST_TEST((d2.effects.released == std::vector<as::worker_id>{0}));
  BOOST_TEST(!p.is_held(0));
}

BOOST_AUTO_TEST_CASE(zero_bound_is_lock_step) {
  as::ssp p{{.workers = 2, .staleness = 0}};
  (void)p.on_commit({.worker = 0, .sequence = 1});
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::hold));
  auto d = p.on_commit({.worker = 1, .sequence = 1});
  BOOST_TEST((d.effects.released == std::vector<as::worker_id>{0}));
  BOOST_TEST((p.on_pull({.worker = 1}).action == as::pull_action::serve));
}

BOOST_AUTO_TEST_CASE(eviction_of_the_slowest_releases_the_bound) {
  as::ssp p{{.workers = 3, .staleness = 0}};
  (void)p.on_commit({.worker = 0, .sequence = 1});
  (void)p.on_commit({.worker = 1, .sequence = 1});
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::hold));
  BOOST_TEST((p.on_pull({.worker = 1}).action == as::pull_action::hold));
  auto o = p.on_evict({.worker = 2});
  BOOST_TEST((o.released == std::vector<as::worker_id>{0, 1}));
  // The evicted worker is gone for good: its commits are dropped.
  BOOST_TEST((p.on_commit({.worker = 2, .sequence = 1}).action == as::commit_action::drop));
}

BOOST_AUTO_TEST_CASE(evicting_a_held_worker_drops_its_pull) {
  as::ssp p{{.workers = 2, .staleness = 0}};
  (void)p.on_commit({.worker = 0, .sequence = 1});
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::hold));
  auto o = p.on_evict({.worker = 0});
  BOOST_TEST(o.released.empty());
  BOOST_TEST(!p.is_held(0));
}

BOOST_AUTO_TEST_CASE(joiner_starts_at_the_minimum) {
  as::ssp p{{.workers = 2, .staleness = 1}};
  for (std::uint64_t s = 1; s <= 4; ++s) {
    (void)p.on_commit({.worker = 0, .sequence = s});
    (void)p.on_commit({.worker = 1, .sequence = s});
  }
  (void)p.on_join({.worker = 2});
  BOOST_TEST(p.clock(2) == 4u);
  (void)p.on_commit({.worker = 0, .sequence = 5});
  BOOST_TEST((p.on_pull({.worker = 0}).action == as::pull_action::serve));
}

// Property: under a random schedule (random worker speeds, evictions and
// joins), no pull is ever answered while its worker is more than s ahead of
// the slowest live worker, and every held pull of a live worker is released
// eventually.
BOOST_AUTO_TEST_CASE(bound_never_exceeded_under_random_schedules) {
  for (std::uint32_t seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    const std::uint32_t s = seed % 4;
    const std::size_t m = 2 + seed % 5;
    as::ssp p{{.workers = m, .staleness = s}};
    std::vector<std::uint64_t> seq(m + 2, 0);
    std::vector<bool> waiting(m + 2, false), live(m + 2, false);
    for (std::size_t w = 0; w < m; ++w) live[w] = true;
    auto check_served = [&](as::worker_id w) {
      BOOST_REQUIRE(p.ahead(w) <= s);
      waiting[w] = false;
    };
    bool joined = false;
    for (int step = 0; step < 3000; ++step) {
      const auto w = static_cast<as::worker_id>(rng() % (m + (joined ? 1 : 0)));
      if (!live[w] || waiting[w]) continue;
      if (step == 1500 && m > 2) {  // evict one, join one
        const auto victim = static_cast<as::worker_id>(rng() % m);
        if (live[victim]) {
          live[victim] = false;
          waiting[victim] = false;
          for (auto r : p.on_evict({.worker = victim}).released) check_served(r);
        }
        (void)p.on_join({.worker = static_cast<as::worker_id>(m)});
        live[m] = true;
        joined = true;
        continue;
      }
      // A worker commits, then pulls (skewed speeds: low ids commit more often).
      if (rng() % (w + 1) != 0) continue;
      auto d = p.on_commit({.worker = w, .sequence = ++seq[w]});
      BOOST_REQUIRE((d.action == as::commit_action::apply));
      for (auto r : d.effects.released) check_served(r);
      auto q = p.on_pull({.worker = w});
      if (q.action == as::pull_action::serve) check_served(w);
      else waiting[w] = true;
    }
    // Nothing is stuck for good: the min-clock workers are never held.
    for (std::size_t w = 0; w <= m; ++w) {
      if (live[w] && waiting[w]) BOOST_TEST(p.ahead(static_cast<as::worker_id>(w)) > s);
    }
  }
}
