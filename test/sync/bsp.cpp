#include <ashl/sync/bsp.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/counting_new.hpp"
#include "../support/policy_testing.hpp"

#include <cstdint>
#include <random>
#include <vector>

namespace as = ashl::sync;

namespace {
std::vector<as::weighted_commit> round(const as::outcome_sink& out) { return {out.round().begin(), out.round().end()}; }
std::vector<as::worker_id> released(const as::outcome_sink& out) {
  return {out.released().begin(), out.released().end()};
}
}  // namespace

BOOST_AUTO_TEST_CASE(round_of_all_live_workers_mean) {
  as::bsp p{{.workers = 3}};
  as::outcome_sink out(3);
  auto d0 = p.on_commit({.worker = 0, .sequence = 1}, out);
  BOOST_TEST((d0.action == as::commit_action::buffer));
  BOOST_TEST(out.empty());
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST((p.on_pull({.worker = 1}, out) == as::pull_action::hold));
  BOOST_TEST(out.empty());
  auto d2 = p.on_commit({.worker = 2, .sequence = 1}, out);
  BOOST_TEST((d2.action == as::commit_action::buffer));
  const std::vector<as::weighted_commit> want{{0, 1, 1.0 / 3}, {1, 1, 1.0 / 3}, {2, 1, 1.0 / 3}};
  BOOST_TEST((round(out) == want));
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0, 1}));
  BOOST_TEST(!out.any_plan_changed());
  out.clear();
  BOOST_TEST((p.on_pull({.worker = 2}, out) == as::pull_action::serve));
  BOOST_TEST(p.rounds() == 1u);
  BOOST_TEST(p.buffered() == 0u);
  BOOST_TEST((p.stage() == as::stage_id::bsp));
}

BOOST_AUTO_TEST_CASE(batch_weighted_round) {
  as::bsp p{{.workers = 2, .weighting = as::round_weighting::samples}};
  as::outcome_sink out(2);
  (void)p.on_commit({.worker = 0, .sequence = 1, .samples = 96}, out);
  (void)p.on_commit({.worker = 1, .sequence = 1, .samples = 32}, out);
  BOOST_TEST(out.round().size() == 2u);
  BOOST_TEST(out.round()[0].weight == 0.75);
  BOOST_TEST(out.round()[1].weight == 0.25);
  // Without sample counts from everyone, the mean.
  out.clear();
  (void)p.on_commit({.worker = 0, .sequence = 2, .samples = 96}, out);
  (void)p.on_commit({.worker = 1, .sequence = 2}, out);
  BOOST_TEST(out.round()[0].weight == 0.5);
}

BOOST_AUTO_TEST_CASE(eviction_unblocks_the_barrier_and_keeps_received_commits) {
  as::bsp p{{.workers = 3}};
  as::outcome_sink out(3);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  (void)p.on_commit({.worker = 2, .sequence = 1}, out);
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  // Worker 2 dies after its commit arrived; worker 1 never committed.
  p.on_evict({.worker = 2}, out);
  BOOST_TEST(out.round().empty());  // still waiting for worker 1
  BOOST_TEST(out.every_plan_changed());
  out.clear();
  p.on_evict({.worker = 1}, out);
  const std::vector<as::weighted_commit> want{{0, 1, 0.5}, {2, 1, 0.5}};
  BOOST_TEST((round(out) == want));
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0}));
  BOOST_TEST(out.every_plan_changed());
  BOOST_TEST(p.plan(0).data_share == 1.0f);
  out.clear();
  // Next round has only worker 0.
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 2, 1.0}}));
}

BOOST_AUTO_TEST_CASE(duplicates_never_apply_twice) {
  as::bsp p{{.workers = 2}};
  as::outcome_sink out(2);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 1}, out).action == as::commit_action::drop));
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 1, 0.5}, {1, 1, 0.5}}));
}

// docs/elastic.md §2.4: a joiner counts from the next round boundary. Its
// pull is held until the round in progress completes (so its first commit is
// computed on that round's result), the round does not wait for it, and its
// first commit belongs to the next round.
BOOST_AUTO_TEST_CASE(a_joiner_waits_for_the_round_in_progress_and_counts_in_the_next) {
  as::bsp p{{.workers = 2}};
  as::outcome_sink out(3);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);  // the round is in progress
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  p.on_join({.worker = 2}, out);
  BOOST_TEST(p.is_pending(2));
  BOOST_TEST(!out.every_plan_changed());  // the others' shares change at the boundary
  BOOST_TEST(out.plan_changed_for(2));
  BOOST_TEST(p.plan(2).data_share == static_cast<float>(1.0 / 3));  // the share it will have
  BOOST_TEST(p.plan(0).data_share == 0.5f);
  out.clear();
  BOOST_TEST((p.on_pull({.worker = 2}, out) == as::pull_action::hold));
  BOOST_TEST(p.is_held(2));
  // Worker 1 completes the round without the joiner; the joiner's pull is
  // answered with the round's, after its step.
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 1, 0.5}, {1, 1, 0.5}}));
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0, 2}));
  BOOST_TEST(out.every_plan_changed());
  BOOST_TEST(!p.is_pending(2));
  BOOST_TEST(p.plan(0).data_share == static_cast<float>(1.0 / 3));
  out.clear();
  // Its first commit is in the next round, which now waits for it.
  (void)p.on_commit({.worker = 2, .sequence = 1}, out);
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);
  BOOST_TEST(out.round().empty());
  (void)p.on_commit({.worker = 1, .sequence = 2}, out);
  const double third = 1.0 / 3;
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 2, third}, {1, 2, third}, {2, 1, third}}));
  BOOST_TEST(!out.any_plan_changed());
}

// A round is in progress from the moment the one before it completed (its
// workers are computing on that result), even before its first commit: a
// joiner then still waits for it, and stalls nothing.
BOOST_AUTO_TEST_CASE(a_joiner_before_the_rounds_first_commit_still_waits_for_it) {
  as::bsp p{{.workers = 2}};
  as::outcome_sink out(3);
  p.on_join({.worker = 2}, out);
  BOOST_TEST(p.is_pending(2));
  BOOST_TEST((p.on_pull({.worker = 2}, out) == as::pull_action::hold));
  out.clear();
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 1, 0.5}, {1, 1, 0.5}}));
  BOOST_TEST((released(out) == std::vector<as::worker_id>{2}));
  out.clear();
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);
  (void)p.on_commit({.worker = 1, .sequence = 2}, out);
  BOOST_TEST(out.round().empty());  // the next round waits for the joiner
  (void)p.on_commit({.worker = 2, .sequence = 1}, out);
  BOOST_TEST(out.round().size() == 3u);
}

// A commit a pending joiner sends before its pull (a worker that kept old
// parameters) is not in the round in progress either.
BOOST_AUTO_TEST_CASE(a_pending_joiners_early_commit_goes_to_the_next_round) {
  as::bsp p{{.workers = 2}};
  as::outcome_sink out(3);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  p.on_join({.worker = 2}, out);
  (void)p.on_commit({.worker = 2, .sequence = 1}, out);
  out.clear();
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 1, 0.5}, {1, 1, 0.5}}));
  BOOST_TEST(p.buffered() == 1u);
  out.clear();
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);
  (void)p.on_commit({.worker = 1, .sequence = 2}, out);
  BOOST_TEST(out.round().size() == 3u);
}

// An eviction takes effect at once, also with a joiner pending: the round
// completes without the evicted worker and the joiner is admitted.
BOOST_AUTO_TEST_CASE(an_eviction_takes_effect_at_once_with_a_joiner_pending) {
  as::bsp p{{.workers = 2}};
  as::outcome_sink out(3);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  p.on_join({.worker = 2}, out);
  BOOST_TEST((p.on_pull({.worker = 2}, out) == as::pull_action::hold));
  out.clear();
  p.on_evict({.worker = 1}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 1, 1.0}}));
  BOOST_TEST((released(out) == std::vector<as::worker_id>{2}));
  BOOST_TEST(!p.is_pending(2));
  // Evicting a pending joiner changes no round.
  out.clear();
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);
  p.on_join({.worker = 3}, out);
  BOOST_TEST(p.is_pending(3));
  p.on_evict({.worker = 3}, out);
  BOOST_TEST(!p.is_pending(3));
  BOOST_TEST(out.round().empty());
  (void)p.on_commit({.worker = 2, .sequence = 1}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 2, 0.5}, {2, 1, 0.5}}));
}

// min_workers: no round completes with fewer live workers in rounds; a
// joiner is then in rounds at once (the round waits for it).
BOOST_AUTO_TEST_CASE(a_round_never_completes_below_min_workers) {
  as::bsp p{{.workers = 3, .min_workers = 2}};
  as::outcome_sink out(3);
  BOOST_TEST(p.min_workers() == 2u);
  for (as::worker_id w = 0; w < 3; ++w) (void)p.on_commit({.worker = w, .sequence = 1}, out);
  BOOST_TEST(out.round().size() == 3u);
  out.clear();
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  p.on_evict({.worker = 1}, out);
  BOOST_TEST(out.round().empty());
  p.on_evict({.worker = 2}, out);  // worker 0 alone: below min_workers, the round waits
  BOOST_TEST(out.round().empty());
  BOOST_TEST(out.released().empty());
  BOOST_TEST(p.is_held(0));
  out.clear();
  p.on_join({.worker = 1}, out);
  BOOST_TEST(!p.is_pending(1));  // the round waits for a join: this one counts in it
  BOOST_TEST((p.on_pull({.worker = 1}, out) == as::pull_action::serve));
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 2, 0.5}, {1, 1, 0.5}}));
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0}));
  // With nobody live, what the evicted sent waits for min_workers too.
  out.clear();
  (void)p.on_commit({.worker = 0, .sequence = 3}, out);
  p.on_evict({.worker = 0}, out);
  p.on_evict({.worker = 1}, out);
  BOOST_TEST(out.round().empty());
  BOOST_TEST(p.buffered() == 1u);
  p.drain(out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 3, 1.0}}));
}

// Workers that follow the protocol (pull, compute on what they got, commit,
// pull again) while others join and leave at random: every round's commits
// were computed on the same parameters, the result of the round before.
BOOST_AUTO_TEST_CASE(no_round_mixes_commits_of_different_versions_under_joins) {
  for (std::uint32_t seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    const std::size_t m = 2 + seed % 4;
    const std::size_t ids = m + 3;
    as::bsp p{{.workers = m, .min_workers = 1 + seed % 2}};
    as::outcome_sink out(ids);
    // Per worker: live, has parameters of version base (rounds done), or is waiting for a pull.
    std::vector<bool> live(ids, false), has(ids, true), committed(ids, false);
    std::vector<std::uint64_t> base(ids, 0), seq(ids, 0);
    for (std::size_t w = 0; w < m; ++w) live[w] = true;
    std::vector<std::vector<std::uint64_t>> based(ids);  // per worker, per sequence: the base version
    for (auto& b : based) b.resize(1000, ~std::uint64_t{0});
    std::uint64_t evicted_rounds = 0;
    auto settle = [&](std::uint64_t rounds_before) {
      std::uint64_t r = rounds_before;
      bool any_evicted = false;
      for (const auto& c : out.round()) any_evicted = any_evicted || !live[c.worker];
      if (!out.round().empty()) {
        // One round per settle in this protocol (a worker has one commit out at most).
        BOOST_REQUIRE(p.rounds() == rounds_before + 1);
        for (const auto& c : out.round())
          if (live[c.worker]) BOOST_REQUIRE_MESSAGE(based[c.worker][c.sequence] == r, "seed " << seed);
        evicted_rounds += any_evicted;
      }
      for (as::worker_id w : out.released()) {
        has[w] = true;
        committed[w] = false;
        base[w] = p.rounds();
      }
      out.clear();
    };
    for (int step = 0; step < 600; ++step) {
      const auto w = static_cast<as::worker_id>(rng() % ids);
      const unsigned r = rng() % 100;
      const std::uint64_t before = p.rounds();
      if (r < 80) {
        if (!live[w]) continue;
        if (has[w] && !committed[w]) {
          ++seq[w];
          based[w][seq[w]] = base[w];
          (void)p.on_commit({.worker = w, .sequence = seq[w]}, out);
          committed[w] = true;
          settle(before);
          has[w] = false;
          const std::uint64_t b2 = p.rounds();
          if (p.on_pull({.worker = w}, out) == as::pull_action::serve) {
            has[w] = true;
            committed[w] = false;
            base[w] = p.rounds();
          }
          settle(b2);
        }
      } else if (r < 90) {
        if (live[w]) continue;
        live[w] = true;
        seq[w] = 0;  // a commit from before its eviction still buffered keeps its base (made in this round)
        has[w] = false;
        committed[w] = false;
        p.on_join({.worker = w}, out);
        settle(before);
        const std::uint64_t b2 = p.rounds();
        if (p.on_pull({.worker = w}, out) == as::pull_action::serve) {
          has[w] = true;
          base[w] = p.rounds();
        }
        settle(b2);
      } else {
        if (!live[w]) continue;
        live[w] = false;
        p.on_evict({.worker = w}, out);
        settle(before);
      }
      if (seq[w] > 900) break;
    }
    (void)evicted_rounds;
  }
}

BOOST_AUTO_TEST_CASE(early_second_commit_goes_to_the_next_round_and_drain_flushes) {
  as::bsp p{{.workers = 2}};
  as::outcome_sink out(2);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 1, 0.5}, {1, 1, 0.5}}));
  BOOST_TEST(p.buffered() == 1u);
  out.clear();
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  p.drain(out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 2, 1.0}}));
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0}));
  BOOST_TEST(p.buffered() == 0u);
}

BOOST_AUTO_TEST_CASE(an_evicted_worker_that_rejoins_brings_its_buffered_commit) {
  as::bsp p{{.workers = 2}};
  as::outcome_sink out(2);
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  p.on_evict({.worker = 1}, out);  // nothing from worker 0 yet: the round waits
  BOOST_TEST(out.round().empty());
  p.on_join({.worker = 1}, out);
  out.clear();
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 1, 0.5}, {1, 1, 0.5}}));
}

// Property: rounds against a model. Every completed round names exactly one
// commit of each worker live in rounds (the oldest it has) and every commit
// of evicted workers; a round completes as soon as every worker live in
// rounds has one and at least min_workers are; a joiner while at least
// min_workers are in rounds is pending (held pull, not waited for, its commits not taken)
// until the next boundary; every held pull is of a worker that still has a
// commit buffered or is pending.
BOOST_AUTO_TEST_CASE(rounds_match_a_model_under_random_schedules) {
  for (std::uint32_t seed = 1; seed <= 60; ++seed) {
    std::mt19937 rng(seed);
    const std::size_t m = 1 + seed % 12;
    const std::size_t ids = m + 2;
    const std::size_t min_workers = 1 + (seed / 3) % 3;
    as::bsp p{{.workers = m, .min_workers = static_cast<std::uint32_t>(min_workers)}};
    as::outcome_sink out(ids);
    std::vector<bool> live(ids, false), held(ids, false), pending(ids, false);
    std::vector<std::vector<std::uint64_t>> q(ids);
    std::vector<std::uint64_t> seq(ids, 0);
    for (std::size_t w = 0; w < m; ++w) live[w] = true;
    std::uint64_t rounds = 0;
    auto in_rounds = [&](std::size_t w) { return live[w] && !pending[w]; };
    auto counts = [&](std::size_t& nlive, std::size_t& ready, std::size_t& npending) {
      nlive = ready = npending = 0;
      for (std::size_t w = 0; w < ids; ++w) {
        nlive += in_rounds(w);
        ready += in_rounds(w) && !q[w].empty();
        npending += pending[w];
      }
    };
    auto admit = [&] {
      for (std::size_t w = 0; w < ids; ++w) pending[w] = false;
    };
    auto check = [&] {
      // Expected rounds, in order, from the model.
      std::vector<as::weighted_commit> want;
      std::size_t nlive = 0, ready = 0, npending = 0;
      counts(nlive, ready, npending);
      bool admitted = false;
      if (npending > 0 && nlive < min_workers) admit(), admitted = true;
      for (;;) {
        counts(nlive, ready, npending);
        std::size_t total = 0;
        for (std::size_t w = 0; w < ids; ++w) total += q[w].size();
        const bool complete = nlive < min_workers ? nlive == 0 && min_workers == 1 && total > 0 : ready == nlive;
        if (!complete) break;
        const std::size_t first = want.size();
        for (as::worker_id w = 0; w < ids; ++w) {
          if (pending[w]) continue;
          while (!q[w].empty()) {
            want.push_back({w, q[w].front(), 0.0});
            q[w].erase(q[w].begin());
            if (live[w]) break;
          }
        }
        for (std::size_t k = first; k < want.size(); ++k) want[k].weight = 1.0 / static_cast<double>(want.size() - first);
        ++rounds;
        if (npending > 0) admit(), admitted = true;
      }
      BOOST_REQUIRE_MESSAGE((round(out) == want), "seed " << seed << " got " << out.round().size() << " want " << want.size());
      std::vector<as::worker_id> rel;
      if (!want.empty() || admitted)
        for (as::worker_id w = 0; w < ids; ++w)
          if (live[w] && held[w] && q[w].empty() && !pending[w]) rel.push_back(w), held[w] = false;
      BOOST_REQUIRE((released(out) == rel));
      BOOST_REQUIRE(p.rounds() == rounds);
      for (as::worker_id w = 0; w < ids; ++w) {
        BOOST_REQUIRE(p.is_held(w) == (live[w] && held[w]));
        BOOST_REQUIRE(p.is_pending(w) == pending[w]);
      }
      out.clear();
    };
    for (int step = 0; step < 800; ++step) {
      const auto w = static_cast<as::worker_id>(rng() % ids);
      const unsigned r = rng() % 100;
      if (r < 50) {
        const auto d = p.on_commit({.worker = w, .sequence = ++seq[w]}, out);
        BOOST_REQUIRE((d.action == (live[w] ? as::commit_action::buffer : as::commit_action::drop)));
        if (live[w]) q[w].push_back(seq[w]);
        check();
      } else if (r < 85) {
        const auto a = p.on_pull({.worker = w}, out);
        const bool hold = live[w] && (!q[w].empty() || pending[w]);
        BOOST_REQUIRE((a == (hold ? as::pull_action::hold : as::pull_action::serve)));
        if (hold) held[w] = true;
        check();
      } else if (r < 93) {
        if (!live[w]) {
          seq[w] = 0;  // a rejoining id starts a fresh sequence
          std::size_t nlive = 0, ready = 0, npending = 0;
          counts(nlive, ready, npending);
          // Pending when the round in progress can complete without it; a
          // rejoiner whose old commit is buffered is in that round already.
          pending[w] = q[w].empty() && nlive >= min_workers;
        }
        live[w] = true;
        p.on_join({.worker = w}, out);
        check();
      } else {
        live[w] = false;
        held[w] = false;
        pending[w] = false;
        p.on_evict({.worker = w}, out);
        check();
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(save_load_round_trip_makes_the_same_decisions) {
  for (std::uint32_t seed = 1; seed <= 8; ++seed) {
    as::bsp p{{.workers = 2 + seed % 5,
               .weighting = seed % 2 ? as::round_weighting::samples : as::round_weighting::mean,
               .local_iterations = 1 + seed % 3,
               .batch_size = 32}};
    policy_testing::check_round_trip(p, 2 + seed % 5, seed);
  }
  as::bsp p{{.workers = 3}};
  as::outcome_sink out(3);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  (void)p.on_pull({.worker = 0}, out);
  policy_testing::check_load_rejects_truncation(p);
}

BOOST_AUTO_TEST_CASE(steady_state_events_allocate_nothing) {
  for (std::uint32_t seed = 1; seed <= 3; ++seed) {
    as::bsp p{{.workers = 16, .weighting = as::round_weighting::samples}};
    BOOST_TEST(policy_testing::steady_state_allocations(p, 16, seed, counting_new::count) == 0u);
  }
}
