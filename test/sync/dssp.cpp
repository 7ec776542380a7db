#include <ashl/sync/dssp.hpp>

#include <boost/test/unit_test.hpp>

#include <random>
#include <vector>

namespace as = ashl::sync;

namespace {
// Worker w commits every period[w] seconds starting at period[w].
void commit_at(as::dssp& p, as::worker_id w, std::uint64_t seq, double t) {
  (void)p.on_commit({.worker = w, .sequence = seq, .time = t});
}
}  // namespace

BOOST_AUTO_TEST_CASE(without_timing_the_bound_is_s_min) {
  as::dssp p{{.workers = 2, .s_min = 1, .s_max = 4}};
  commit_at(p, 0, 1, 1.0);
  commit_at(p, 0, 2, 2.0);
  BOOST_TEST((p.on_pull({.worker = 0, .time = 2.0}).action == as::pull_action::hold));
  BOOST_TEST(p.current_bound() == 1u);
}

BOOST_AUTO_TEST_CASE(far_straggler_widens_the_bound_near_one_keeps_it) {
  // Worker 0 iterates every 1 s, worker 1 every 10 s.
  as::dssp p{{.workers = 2, .s_min = 1, .s_max = 4}};
  commit_at(p, 1, 1, 0.0);
  commit_at(p, 0, 1, 0.0);
  commit_at(p, 1, 2, 10.0);  // T_1 = 10, next predicted at 20
  std::uint64_t s0 = 1;
  for (double t = 1.0; t <= 10.0; t += 1.0) commit_at(p, 0, ++s0, t);
  // c_0 = 11, c_1 = 2: far beyond s_max: held.
  BOOST_TEST((p.on_pull({.worker = 0, .time = 10.0}).action == as::pull_action::hold));
  // Straggler commits at 20: predicted next at 30. c_1 = 3, ahead = 8 > 4: still held.
  auto d = p.on_commit({.worker = 1, .sequence = 3, .time = 20.0});
  BOOST_TEST(d.effects.released.empty());
  // Fresh scenario: ahead = 3 with the straggler's commit 9 s away: bound widens to 4, served.
  as::dssp q{{.workers = 2, .s_min = 1, .s_max = 4}};
  commit_at(q, 1, 1, 0.0);
  commit_at(q, 1, 2, 10.0);
  commit_at(q, 0, 1, 8.0);
  commit_at(q, 0, 2, 9.0);
  commit_at(q, 0, 3, 10.0);
  commit_at(q, 0, 4, 11.0);
  commit_at(q, 0, 5, 12.0);  // c_0 = 5, c_1 = 2: ahead 3
  BOOST_TEST((q.on_pull({.worker = 0, .time = 12.0}).action == as::pull_action::serve));
  BOOST_TEST(q.current_bound() == 4u);
  // Near the straggler's commit (due at 20), ahead 3 > s_min: round(0.5) → small bound: held.
  as::dssp r = q;
  commit_at(r, 0, 6, 19.6);
  BOOST_TEST(r.ahead(0) == 4u);
  BOOST_TEST((r.on_pull({.worker = 0, .time = 19.6}).action == as::pull_action::hold));
  BOOST_TEST(r.current_bound() < 4u);
  // Its commit releases the pull.
  auto e = r.on_commit({.worker = 1, .sequence = 3, .time = 20.0});
  BOOST_TEST((e.effects.released == std::vector<as::worker_id>{0}));
}

BOOST_AUTO_TEST_CASE(eviction_releases_and_bound_never_exceeds_s_max) {
  as::dssp p{{.workers = 3, .s_min = 0, .s_max = 2}};
  std::mt19937 rng(7);
  std::vector<std::uint64_t> seq(3, 0);
  std::vector<bool> waiting(3, false);
  double now = 0.0;
  for (int step = 0; step < 2000; ++step) {
    now += 0.01 * (1 + rng() % 10);
    const auto w = static_cast<as::worker_id>(rng() % 3);
    if (waiting[w] || (rng() % (1 + 3 * w)) != 0) continue;
    auto d = p.on_commit({.worker = w, .sequence = ++seq[w], .time = now});
    for (auto r : d.effects.released) {
      BOOST_REQUIRE(p.ahead(r) <= 2u);
      waiting[r] = false;
    }
    if (p.on_pull({.worker = w, .time = now}).action == as::pull_action::hold) waiting[w] = true;
    else BOOST_REQUIRE(p.ahead(w) <= 2u);
  }
  // Evict the slowest: everyone waiting is released.
  auto o = p.on_evict({.worker = 2, .time = now});
  for (auto r : o.released) waiting[r] = false;
  BOOST_TEST(!p.is_live(2));
  // Whoever is still held is ahead of the slowest live worker: nobody waits for the evicted one.
  for (as::worker_id w = 0; w < 2; ++w) BOOST_TEST((!waiting[w] || p.ahead(w) > 0u));
  BOOST_TEST((p.is_held(0) == waiting[0]));
}
