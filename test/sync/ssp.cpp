#include <ashl/sync/ssp.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/counting_new.hpp"
#include "../support/policy_testing.hpp"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace as = ashl::sync;

// BOOST_REQUIRE only on failure: the property tests check millions of facts.
#define REQUIRE_FAST(cond)          \
  do {                              \
    if (!(cond)) BOOST_REQUIRE(cond); \
  } while (0)

namespace {
std::vector<as::worker_id> released(const as::outcome_sink& out) {
  return {out.released().begin(), out.released().end()};
}
}  // namespace

BOOST_AUTO_TEST_CASE(pull_held_past_the_bound_and_released_by_the_slow_commit) {
  as::ssp p{{.workers = 3, .staleness = 1}};
  as::outcome_sink out(3);
  std::uint64_t seq0 = 0;
  // Worker 0 commits twice: c_0 − min = 2 > 1, its pull is held.
  (void)p.on_commit({.worker = 0, .sequence = ++seq0}, out);
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::serve));
  (void)p.on_commit({.worker = 0, .sequence = ++seq0}, out);
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  BOOST_TEST(p.is_held(0));
  BOOST_TEST(out.empty());
  // Worker 1 commits: min is still 0 (worker 2).
  auto d1 = p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST((d1.action == as::commit_action::apply));
  BOOST_TEST(out.released().empty());
  // Worker 2 commits: min becomes 1, c_0 − 1 = 1 <= 1: released.
  (void)p.on_commit({.worker = 2, .sequence = 1}, out);
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0}));
  BOOST_TEST(!p.is_held(0));
}

BOOST_AUTO_TEST_CASE(zero_bound_is_lock_step) {
  as::ssp p{{.workers = 2, .staleness = 0}};
  as::outcome_sink out(2);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0}));
  out.clear();
  BOOST_TEST((p.on_pull({.worker = 1}, out) == as::pull_action::serve));
}

BOOST_AUTO_TEST_CASE(eviction_of_the_slowest_releases_the_bound) {
  as::ssp p{{.workers = 3, .staleness = 0}};
  as::outcome_sink out(3);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  BOOST_TEST((p.on_pull({.worker = 1}, out) == as::pull_action::hold));
  p.on_evict({.worker = 2}, out);
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0, 1}));
  // The evicted worker is gone for good: its commits are dropped.
  BOOST_TEST((p.on_commit({.worker = 2, .sequence = 1}, out).action == as::commit_action::drop));
}

BOOST_AUTO_TEST_CASE(evicting_a_held_worker_drops_its_pull) {
  as::ssp p{{.workers = 2, .staleness = 0}};
  as::outcome_sink out(2);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  p.on_evict({.worker = 0}, out);
  BOOST_TEST(out.released().empty());
  BOOST_TEST(!p.is_held(0));
  BOOST_TEST(p.held_count() == 0u);
  // Worker 1's commit releases nothing: there is no one to answer.
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST(out.released().empty());
}

BOOST_AUTO_TEST_CASE(joiner_starts_at_the_minimum) {
  as::ssp p{{.workers = 2, .staleness = 1}};
  as::outcome_sink out(3);
  for (std::uint64_t s = 1; s <= 4; ++s) {
    (void)p.on_commit({.worker = 0, .sequence = s}, out);
    (void)p.on_commit({.worker = 1, .sequence = s}, out);
  }
  p.on_join({.worker = 2}, out);
  BOOST_TEST(p.clock(2) == 4u);
  (void)p.on_commit({.worker = 0, .sequence = 5}, out);
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::serve));
}

BOOST_AUTO_TEST_CASE(a_repeated_pull_stays_held_and_a_held_worker_may_commit) {
  as::ssp p{{.workers = 2, .staleness = 1}};
  as::outcome_sink out(2);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  BOOST_TEST(p.held_count() == 1u);
  // It commits again while held: now 3 ahead; one slow commit is not enough.
  (void)p.on_commit({.worker = 0, .sequence = 3}, out);
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST(out.released().empty());
  (void)p.on_commit({.worker = 1, .sequence = 2}, out);
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0}));
}

BOOST_AUTO_TEST_CASE(drain_releases_everything_in_id_order) {
  as::ssp p{{.workers = 4, .staleness = 0}};
  as::outcome_sink out(4);
  for (std::uint64_t s = 1; s <= 3; ++s) (void)p.on_commit({.worker = 3, .sequence = s}, out);
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  for (as::worker_id w : {3u, 1u, 0u}) BOOST_TEST((p.on_pull({.worker = w}, out) == as::pull_action::hold));
  p.drain(out);
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0, 1, 3}));
  BOOST_TEST(p.held_count() == 0u);
}

// Property: under random schedules (any worker commits, pulls, joins or is
// evicted at any time, duplicates included), checked against an independent
// model of the clocks kept here: every pull decision is the model's, no pull
// is served or released while c_i − min_live c_j > s, after every event no
// held pull of a live worker is releasable (released exactly when allowed,
// not later), and at the end committing for the slow workers releases all.
BOOST_AUTO_TEST_CASE(bound_exact_under_random_schedules_against_a_model) {
  std::size_t releases = 0, holds = 0;
  for (std::uint32_t seed = 1; seed <= 480; ++seed) {
    std::mt19937 rng(seed);
    const std::size_t m = 1 + seed % 40;
    const std::uint32_t s = (seed / 40) % 6;
    const std::size_t ids = m + 3;
    as::ssp p{{.workers = m, .staleness = s}};
    as::outcome_sink out(ids);

    // The model.
    std::vector<bool> live(ids, false), held(ids, false), has_seq(ids, false);
    std::vector<std::uint64_t> clock(ids, 0), last_seq(ids, 0), next_seq(ids, 0);
    std::vector<std::uint32_t> speed(ids);
    for (auto& v : speed) v = 1 + rng() % 6;
    for (std::size_t w = 0; w < m; ++w) live[w] = true;
    auto min_live = [&] {
      std::uint64_t mn = 0;
      bool any = false;
      for (std::size_t w = 0; w < ids; ++w)
        if (live[w] && (!any || clock[w] < mn)) mn = clock[w], any = true;
      return mn;
    };
    auto check_outcome = [&] {
      const std::uint64_t mn = min_live();
      for (auto r : out.released()) {
        REQUIRE_FAST(r < ids);
        REQUIRE_FAST(live[r]);
        REQUIRE_FAST(held[r]);
        REQUIRE_FAST(clock[r] - mn <= s);
        held[r] = false;
        ++releases;
      }
      REQUIRE_FAST(out.round().empty());
      for (as::worker_id w = 0; w < ids; ++w) {
        if (live[w] && held[w]) REQUIRE_FAST(clock[w] - mn > s);  // not releasable: not late
        REQUIRE_FAST(p.is_held(w) == (live[w] && held[w]));
        REQUIRE_FAST(p.is_live(w) == live[w]);
      }
      out.clear();
    };
    auto commit = [&](as::worker_id w, std::uint64_t sq) {
      const bool accept = live[w] && (!has_seq[w] || sq > last_seq[w]);
      if (accept) {
        has_seq[w] = true;
        last_seq[w] = sq;
        ++clock[w];
      }
      const auto d = p.on_commit({.worker = w, .sequence = sq}, out);
      REQUIRE_FAST((d.action == (accept ? as::commit_action::apply : as::commit_action::drop)));
      check_outcome();
    };
    auto pull = [&](as::worker_id w) {
      const auto a = p.on_pull({.worker = w}, out);
      bool hold = false;
      if (live[w]) hold = held[w] || clock[w] - min_live() > s;
      REQUIRE_FAST((a == (hold ? as::pull_action::hold : as::pull_action::serve)));
      if (hold) {
        held[w] = true;
        ++holds;
      }
      REQUIRE_FAST(out.empty());
    };

    for (int step = 0; step < 2000; ++step) {
      const auto w = static_cast<as::worker_id>(rng() % ids);
      const unsigned r = rng() % 100;
      if (r < 55) {
        if (rng() % speed[w] != 0) continue;  // skewed speeds
        std::uint64_t sq = ++next_seq[w];
        if (rng() % 12 == 0 && sq > 1) sq -= 1 + rng() % (sq - 1);  // a duplicate
        commit(w, sq);
        if (rng() % 4 != 0) pull(w);
      } else if (r < 85) {
        pull(w);
      } else if (r < 92) {
        const bool joins = !live[w];
        if (joins) {
          const bool any = std::find(live.begin(), live.end(), true) != live.end();
          clock[w] = any ? min_live() : 0;
          has_seq[w] = false;
          held[w] = false;
        }
        p.on_join({.worker = w}, out);
        REQUIRE_FAST(out.empty());
        live[w] = true;
        if (joins) REQUIRE_FAST(p.clock(w) == clock[w]);
        check_outcome();
      } else {
        if (std::count(live.begin(), live.end(), true) <= 1 && rng() % 4 != 0) continue;
        live[w] = false;
        held[w] = false;
        p.on_evict({.worker = w}, out);
        check_outcome();
      }
    }
    // Drive every held pull out: commit for the workers at the minimum.
    for (int round = 0; round < 400; ++round) {
      bool any_held = false;
      for (std::size_t w = 0; w < ids; ++w) any_held = any_held || (live[w] && held[w]);
      if (!any_held) break;
      const std::uint64_t mn = min_live();
      for (as::worker_id w = 0; w < ids; ++w)
        if (live[w] && clock[w] == mn) commit(w, ++next_seq[w]);
    }
    for (as::worker_id w = 0; w < ids; ++w) REQUIRE_FAST(!held[w] && !p.is_held(w));
    REQUIRE_FAST(p.held_count() == 0u);
  }
  BOOST_TEST(releases > 1000u);  // the schedules did exercise holding
  BOOST_TEST(holds >= releases);
}

BOOST_AUTO_TEST_CASE(save_load_round_trip_makes_the_same_decisions) {
  for (std::uint32_t seed = 1; seed <= 8; ++seed) {
    as::ssp p{{.workers = 2 + seed % 5,
               .staleness = seed % 3,
               .scale = 0.5,
               .weights = {0.3},
               .plans = {{.local_iterations = 2}, {.batch_size = 64}},
               .staleness_weight = as::staleness_weighting::inverse(),
               .stage = as::stage_id::shl}};
    policy_testing::check_round_trip(p, 2 + seed % 5, seed);
  }
  as::ssp p{{.workers = 3, .staleness = 0}};
  as::outcome_sink out(3);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  (void)p.on_pull({.worker = 0}, out);
  policy_testing::check_load_rejects_truncation(p);
  // A state holding a pull its own bound allows is refused.
  auto bytes = policy_testing::saved(p);
  bytes[8] = std::byte{5};  // the bound, right after the SSP_ tag and version
  as::ssp q;
  ashl::state_reader in(bytes);
  const auto st = q.load(in);
  BOOST_TEST(!st.ok());
  BOOST_TEST(st.message().find("ssp.held") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(steady_state_events_allocate_nothing) {
  for (std::uint32_t seed = 1; seed <= 3; ++seed) {
    as::ssp p{{.workers = 16, .staleness = 2, .staleness_weight = as::staleness_weighting::inverse()}};
    BOOST_TEST(policy_testing::steady_state_allocations(p, 16, seed, counting_new::count) == 0u);
  }
}
