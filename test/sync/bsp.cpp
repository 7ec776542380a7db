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

BOOST_AUTO_TEST_CASE(duplicates_never_apply_twice_and_joiners_wait_for_next_commit) {
  as::bsp p{{.workers = 2}};
  as::outcome_sink out(3);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 1}, out).action == as::commit_action::drop));
  p.on_join({.worker = 2}, out);
  BOOST_TEST(out.every_plan_changed());
  BOOST_TEST(p.plan(2).data_share == static_cast<float>(1.0 / 3));
  out.clear();
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST(out.round().empty());
  (void)p.on_commit({.worker = 2, .sequence = 1}, out);
  BOOST_TEST(out.round().size() == 3u);
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
// commit of each live worker (the oldest it has) and every commit of evicted
// workers; a round completes as soon as every live worker has one; every held
// pull is of a worker that still has a commit buffered.
BOOST_AUTO_TEST_CASE(rounds_match_a_model_under_random_schedules) {
  for (std::uint32_t seed = 1; seed <= 60; ++seed) {
    std::mt19937 rng(seed);
    const std::size_t m = 1 + seed % 12;
    const std::size_t ids = m + 2;
    as::bsp p{{.workers = m}};
    as::outcome_sink out(ids);
    std::vector<bool> live(ids, false), held(ids, false);
    std::vector<std::vector<std::uint64_t>> q(ids);
    std::vector<std::uint64_t> seq(ids, 0);
    for (std::size_t w = 0; w < m; ++w) live[w] = true;
    std::uint64_t rounds = 0;
    auto check = [&] {
      // Expected rounds, in order, from the model.
      std::vector<as::weighted_commit> want;
      for (;;) {
        std::size_t nlive = 0, ready = 0, total = 0;
        for (std::size_t w = 0; w < ids; ++w) {
          nlive += live[w];
          ready += live[w] && !q[w].empty();
          total += q[w].size();
        }
        if (!(nlive > 0 ? ready == nlive : total > 0)) break;
        const std::size_t first = want.size();
        for (as::worker_id w = 0; w < ids; ++w) {
          while (!q[w].empty()) {
            want.push_back({w, q[w].front(), 0.0});
            q[w].erase(q[w].begin());
            if (live[w]) break;
          }
        }
        for (std::size_t k = first; k < want.size(); ++k) want[k].weight = 1.0 / static_cast<double>(want.size() - first);
        ++rounds;
      }
      BOOST_REQUIRE((round(out) == want));
      std::vector<as::worker_id> rel;
      if (!want.empty())
        for (as::worker_id w = 0; w < ids; ++w)
          if (live[w] && held[w] && q[w].empty()) rel.push_back(w), held[w] = false;
      BOOST_REQUIRE((released(out) == rel));
      BOOST_REQUIRE(p.rounds() == rounds);
      for (as::worker_id w = 0; w < ids; ++w) BOOST_REQUIRE(p.is_held(w) == (live[w] && held[w]));
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
        const bool hold = live[w] && !q[w].empty();
        BOOST_REQUIRE((a == (hold ? as::pull_action::hold : as::pull_action::serve)));
        if (hold) held[w] = true;
        check();
      } else if (r < 93) {
        if (!live[w]) seq[w] = 0;  // a rejoining id starts a fresh sequence
        live[w] = true;
        p.on_join({.worker = w}, out);
        check();
      } else {
        live[w] = false;
        held[w] = false;
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
