#include <ashl/sync/coded_bsp.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/counting_new.hpp"
#include "../support/policy_testing.hpp"

#include <ashl/sync/any_policy.hpp>
#include <ashl/sync/bsp.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <variant>
#include <vector>

namespace as = ashl::sync;
namespace ap = ashl::profile;

namespace {
std::vector<as::weighted_commit> round(const as::outcome_sink& out) { return {out.round().begin(), out.round().end()}; }
std::vector<as::worker_id> released(const as::outcome_sink& out) {
  return {out.released().begin(), out.released().end()};
}
ap::gradient_code code_of(std::size_t m, std::size_t r) {
  auto c = ap::gradient_code::make(m, r);
  BOOST_REQUIRE(c.has_value());
  return std::move(*c);
}
// The round a set of workers (by id = position) decodes to: weights a_i / M, in id order.
std::vector<as::weighted_commit> decoded(std::size_t m, std::size_t r, std::uint64_t set, std::uint64_t seq) {
  auto code = code_of(m, r);
  const auto d = code.decode(set);
  BOOST_REQUIRE(d.has_value());
  std::vector<as::weighted_commit> want;
  for (as::worker_id w = 0; w < m; ++w)
    if ((set >> w) & 1u) want.push_back({w, seq, d->weights[w] * (1.0 / static_cast<double>(m))});
  return want;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_round_completes_after_m_minus_r_commits_and_the_late_one_is_dropped) {
  as::coded_bsp p{{.workers = 4, .stragglers = 1}};
  as::outcome_sink out(4);
  BOOST_TEST(p.partitions() == 4u);
  BOOST_TEST(p.needed() == 3u);
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 1}, out).action == as::commit_action::buffer));
  BOOST_TEST((p.on_pull({.worker = 0}, out) == as::pull_action::hold));
  (void)p.on_commit({.worker = 2, .sequence = 1}, out);
  BOOST_TEST((p.on_pull({.worker = 2}, out) == as::pull_action::hold));
  BOOST_TEST(out.empty());
  (void)p.on_commit({.worker = 3, .sequence = 1}, out);  // the third of M − r = 3: complete
  BOOST_TEST((round(out) == decoded(4, 1, 0b1101, 1)));
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0, 2}));
  BOOST_TEST(!out.any_plan_changed());
  BOOST_TEST(p.rounds() == 1u);
  out.clear();
  // Worker 1, the straggler: its commit of round 0 is dropped, its pull served at once.
  BOOST_TEST((p.on_commit({.worker = 1, .sequence = 1}, out).action == as::commit_action::drop));
  BOOST_TEST(p.late_commits() == 1u);
  BOOST_TEST(out.empty());
  BOOST_TEST((p.on_pull({.worker = 1}, out) == as::pull_action::serve));
  // Its next commit counts for round 1, and so do the others'.
  BOOST_TEST((p.on_commit({.worker = 1, .sequence = 2}, out).action == as::commit_action::buffer));
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);
  (void)p.on_commit({.worker = 2, .sequence = 2}, out);
  BOOST_TEST(out.round().size() == 3u);
  BOOST_TEST(out.round()[0].worker == 0u);
  BOOST_TEST(out.round()[1].worker == 1u);
  BOOST_TEST(out.round()[2].worker == 2u);
  BOOST_TEST(out.round()[1].sequence == 2u);
  out.clear();
  BOOST_TEST((p.on_commit({.worker = 3, .sequence = 2}, out).action == as::commit_action::drop));
  BOOST_TEST(p.late_commits() == 2u);
  BOOST_TEST(p.buffered() == 0u);
}

// For every set of M − r first arrivals, the round's weights are that set's
// decoding weights over M, and applying them to commits made from encoding()
// gives the mean of the partition gradients.
BOOST_AUTO_TEST_CASE(round_weights_are_the_decoding_weights_and_recover_the_mean) {
  for (std::size_t m : {3u, 5u, 7u}) {
    for (std::uint32_t r = 0; r < m && r <= 3; ++r) {
      as::coded_bsp p{{.workers = m, .stragglers = r}};
      as::outcome_sink out(m);
      std::mt19937_64 rng(m * 10 + r);
      std::uniform_real_distribution<double> u(-1.0, 1.0);
      std::vector<std::uint64_t> seq(m, 0);
      for (std::uint64_t set = 1; set < (std::uint64_t{1} << m); ++set) {
        if (static_cast<std::size_t>(std::popcount(set)) != m - r) continue;
        // Partition gradients for this round and each worker's coded commit.
        std::vector<double> g(m), c(m, 0.0);
        for (auto& v : g) v = u(rng);
        for (as::worker_id w = 0; w < m; ++w)
          for (const auto& [j, b] : p.encoding(w)) c[w] += b * g[j];
        out.clear();
        std::vector<as::worker_id> order;
        for (as::worker_id w = 0; w < m; ++w)
          if ((set >> w) & 1u) order.push_back(w);
        std::shuffle(order.begin(), order.end(), rng);  // arrival order does not matter
        for (auto w : order) (void)p.on_commit({.worker = w, .sequence = ++seq[w]}, out);
        BOOST_TEST_REQUIRE(out.round().size() == m - r);
        double got = 0.0;
        const auto want = decoded(m, r, set, 0);
        for (std::size_t k = 0; k < want.size(); ++k) {
          BOOST_TEST(out.round()[k].worker == want[k].worker);
          BOOST_TEST(out.round()[k].weight == want[k].weight);
          got += out.round()[k].weight * c[out.round()[k].worker];
        }
        const double mean = std::accumulate(g.begin(), g.end(), 0.0) / static_cast<double>(m);
        BOOST_TEST(std::abs(got - mean) < 1e-12, "M = " << m << ", r = " << r << ", set " << set);
        // The stragglers' commits of this round arrive late.
        out.clear();
        for (as::worker_id w = 0; w < m; ++w)
          if (((set >> w) & 1u) == 0)
            BOOST_TEST((p.on_commit({.worker = w, .sequence = ++seq[w]}, out).action == as::commit_action::drop));
      }
    }
  }
}

// r = 0 is BSP: the same decisions, sinks, plans and holds after every event.
BOOST_AUTO_TEST_CASE(r_zero_makes_bsp_decisions_event_by_event) {
  for (std::uint32_t seed = 1; seed <= 12; ++seed) {
    const std::size_t m = 1 + seed % 7;
    as::coded_bsp c{{.workers = m, .stragglers = 0}};
    as::bsp b{{.workers = m}};
    policy_testing::event_script script(m, seed);
    as::outcome_sink oc(m + 2), ob(m + 2);
    int compared = 0;
    for (int i = 0; i < 3000; ++i) {
      const auto e = script.next();
      if (std::holds_alternative<policy_testing::join_event>(e) ||
          std::holds_alternative<policy_testing::evict_event>(e))
        continue;  // membership changes are where the two differ (documented)
      const auto fc = policy_testing::apply(c, e, oc);
      const auto fb = policy_testing::apply(b, e, ob);
      BOOST_REQUIRE((fc == fb));
      for (as::worker_id w = 0; w < m + 2; ++w) {
        if (w < m) BOOST_REQUIRE((c.plan(w) == b.plan(w)));
        BOOST_REQUIRE(c.is_live(w) == b.is_live(w));
        BOOST_REQUIRE(c.is_held(w) == b.is_held(w));
      }
      compared += fc.kind == 0 && !fc.round.empty();
    }
    BOOST_TEST(compared > 20);
    BOOST_TEST(c.rounds() == b.rounds());
    oc.clear();
    ob.clear();
    // A drain releases the same pulls; its round differs when commits of
    // later rounds are buffered (BSP averages them in, coded_bsp discards
    // them: documented), and is the same otherwise.
    const bool only_current = c.buffered() <= m;
    c.drain(oc);
    b.drain(ob);
    BOOST_TEST((released(oc) == released(ob)));
    if (only_current && oc.round().size() == ob.round().size()) BOOST_TEST((round(oc) == round(ob)));
  }
}

BOOST_AUTO_TEST_CASE(an_eviction_replans_the_code_over_the_live_workers_at_the_round_boundary) {
  as::coded_bsp p{{.workers = 4, .stragglers = 1}};
  as::outcome_sink out(4);
  (void)p.on_commit({.worker = 3, .sequence = 1}, out);
  p.on_evict({.worker = 3}, out);  // its received commit still counts for round 0
  BOOST_TEST(out.empty());
  BOOST_TEST(p.partitions() == 4u);  // round 0 keeps its code
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST(out.round().empty());
  (void)p.on_commit({.worker = 2, .sequence = 1}, out);  // 3 of the 4-worker code
  BOOST_TEST((round(out) == decoded(4, 1, 0b1110, 1)));
  BOOST_TEST(out.every_plan_changed());
  // The new code: 3 live workers (0, 1, 2), r = 1, needs 2.
  BOOST_TEST(p.partitions() == 3u);
  BOOST_TEST(p.needed() == 2u);
  const auto code3 = code_of(3, 1);
  for (as::worker_id w = 0; w < 3; ++w) {
    BOOST_TEST((p.encoding(w) == code3.encoding(w)));
    BOOST_TEST(p.plan(w).data_share == static_cast<float>(2.0 / 3.0));
  }
  BOOST_TEST(p.encoding(3).empty());
  BOOST_TEST(!p.position(3).has_value());
  out.clear();
  // Worker 0 is late for round 0: dropped; round 1 needs 2 of 0, 1, 2.
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 1}, out).action == as::commit_action::drop));
  (void)p.on_commit({.worker = 2, .sequence = 2}, out);
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);
  BOOST_TEST((round(out) == decoded(3, 1, 0b101, 2)));
  out.clear();
  // Down to 1 live worker: r = 1 is not < 1, so r = 0 and the round needs it.
  p.on_evict({.worker = 1}, out);
  p.on_evict({.worker = 2}, out);
  (void)p.on_commit({.worker = 1, .sequence = 2}, out);  // not live: dropped
  (void)p.on_commit({.worker = 0, .sequence = 3}, out);
  // Round 2 was under the 3-worker code with workers 1 and 2 gone before
  // committing: only worker 0 can arrive, fewer than M − r = 2 ⇒ least squares.
  BOOST_TEST(out.round().size() == 1u);
  BOOST_TEST(p.inexact_rounds() == 1u);
  BOOST_TEST(std::isfinite(out.round()[0].weight));
  BOOST_TEST(p.partitions() == 1u);
  BOOST_TEST(p.tolerated() == 0u);
  out.clear();
  (void)p.on_commit({.worker = 0, .sequence = 4}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 4, 1.0}}));
}

BOOST_AUTO_TEST_CASE(with_live_workers_at_most_r_every_round_needs_all_of_them) {
  as::coded_bsp p{{.workers = 3, .stragglers = 2}};
  as::outcome_sink out(3);
  BOOST_TEST(p.needed() == 1u);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);  // one of three suffices
  BOOST_TEST(out.round().size() == 1u);
  BOOST_TEST(std::abs(out.round()[0].weight - 1.0 / 3.0) < 1e-15);  // every row of B is all ones: a = 1
  out.clear();
  p.on_evict({.worker = 2}, out);  // the round in progress still decodes from any one
  BOOST_TEST((p.on_commit({.worker = 1, .sequence = 1}, out).action == as::commit_action::drop));  // round 0's
  (void)p.on_commit({.worker = 1, .sequence = 2}, out);
  BOOST_TEST(out.round().size() == 1u);
  BOOST_TEST(out.every_plan_changed());
  BOOST_TEST(p.tolerated() == 0u);  // live 2 <= r = 2
  BOOST_TEST(p.needed() == 2u);
  out.clear();
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);  // worker 0 was late for round 1: dropped
  BOOST_TEST(out.round().empty());
  (void)p.on_commit({.worker = 0, .sequence = 3}, out);
  BOOST_TEST(out.round().empty());
  (void)p.on_commit({.worker = 1, .sequence = 3}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{{0, 3, 0.5}, {1, 3, 0.5}}));
}

BOOST_AUTO_TEST_CASE(a_joiner_counts_from_the_next_round_boundary) {
  as::coded_bsp p{{.workers = 2, .stragglers = 1}};
  as::outcome_sink out(3);
  p.on_join({.worker = 2}, out);
  BOOST_TEST(!out.any_plan_changed());  // plans change at the boundary
  BOOST_TEST(p.encoding(2).empty());
  BOOST_TEST((p.on_commit({.worker = 2, .sequence = 1}, out).action == as::commit_action::drop));
  BOOST_TEST(p.outside_commits() == 1u);
  BOOST_TEST((p.on_pull({.worker = 2}, out) == as::pull_action::serve));
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);  // 1 of 2 (r = 1): complete
  BOOST_TEST(out.round().size() == 1u);
  BOOST_TEST(out.every_plan_changed());
  BOOST_TEST(p.partitions() == 3u);
  BOOST_TEST(p.needed() == 2u);
  BOOST_TEST((p.encoding(2) == code_of(3, 1).encoding(2)));
  out.clear();
  (void)p.on_commit({.worker = 2, .sequence = 2}, out);
  (void)p.on_commit({.worker = 1, .sequence = 2}, out);
  BOOST_TEST((round(out) == decoded(3, 1, 0b110, 2)));
}

BOOST_AUTO_TEST_CASE(early_commits_wait_for_their_round_and_late_workers_rejoin_the_next) {
  as::coded_bsp p{{.workers = 3, .stragglers = 1}};
  as::outcome_sink out(3);
  // Every worker commits rounds 0 and 1 before anything completes.
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);
  (void)p.on_commit({.worker = 1, .sequence = 1}, out);  // round 0 completes (0, 1); round 1 has 0 already
  BOOST_TEST((round(out) == decoded(3, 1, 0b011, 1)));
  out.clear();
  (void)p.on_commit({.worker = 1, .sequence = 2}, out);  // round 1: 0 and 1
  BOOST_TEST((round(out) == decoded(3, 1, 0b011, 2)));
  out.clear();
  // Worker 2 commits twice: its first is late for round 0, its second counts for round 2.
  BOOST_TEST((p.on_commit({.worker = 2, .sequence = 1}, out).action == as::commit_action::drop));
  BOOST_TEST((p.on_commit({.worker = 2, .sequence = 2}, out).action == as::commit_action::buffer));
  BOOST_TEST((p.on_pull({.worker = 2}, out) == as::pull_action::hold));
  p.drain(out);  // one arrival of round 2: least squares, and the pull released
  BOOST_TEST(out.round().size() == 1u);
  BOOST_TEST((released(out) == std::vector<as::worker_id>{2}));
  BOOST_TEST(p.inexact_rounds() == 1u);
  BOOST_TEST(p.buffered() == 0u);
  // A late worker's next commit counts for the round in progress.
  out.clear();
  as::coded_bsp q{{.workers = 3, .stragglers = 1}};
  (void)q.on_commit({.worker = 0, .sequence = 1}, out);
  (void)q.on_commit({.worker = 0, .sequence = 2}, out);
  (void)q.on_commit({.worker = 2, .sequence = 1}, out);  // round 0: 0, 2
  (void)q.on_commit({.worker = 2, .sequence = 2}, out);  // round 1: 0, 2
  BOOST_TEST(q.rounds() == 2u);
  out.clear();
  BOOST_TEST((q.on_commit({.worker = 1, .sequence = 1}, out).action == as::commit_action::drop));
  BOOST_TEST((q.on_commit({.worker = 1, .sequence = 2}, out).action == as::commit_action::buffer));  // round 2
  BOOST_TEST(q.late_commits() == 1u);
  BOOST_TEST(out.round().empty());
  (void)q.on_commit({.worker = 0, .sequence = 3}, out);
  BOOST_TEST((round(out) == std::vector<as::weighted_commit>{decoded(3, 1, 0b011, 3)[0],
                                                             {1, 2, decoded(3, 1, 0b011, 3)[1].weight}}));
}

BOOST_AUTO_TEST_CASE(any_policy_holds_it_and_save_load_round_trips) {
  as::any_policy a = as::coded_bsp{{.workers = 4, .stragglers = 2}};
  as::outcome_sink out(4);
  (void)a.on_commit({.worker = 1, .sequence = 1}, out);
  (void)a.on_commit({.worker = 3, .sequence = 1}, out);
  BOOST_TEST(out.round().size() == 2u);
  BOOST_TEST_REQUIRE(a.target<as::coded_bsp>() != nullptr);
  BOOST_TEST(a.target<as::coded_bsp>()->needed() == 2u);
  for (std::uint32_t seed = 1; seed <= 10; ++seed) {
    const std::size_t m = 2 + seed % 6;
    policy_testing::check_round_trip(
        as::coded_bsp{{.workers = m, .stragglers = static_cast<std::uint32_t>(seed % m), .batch_size = 16}}, m, seed);
  }
  as::coded_bsp p{{.workers = 3, .stragglers = 1}};
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  (void)p.on_commit({.worker = 0, .sequence = 2}, out);
  (void)p.on_pull({.worker = 0}, out);
  p.on_join({.worker = 4}, out);
  policy_testing::check_load_rejects_truncation(p);
  as::bsp other{{.workers = 3}};
  const auto bytes = policy_testing::saved(other);
  ashl::state_reader in(bytes);
  BOOST_TEST(!p.load(in).ok());
}

// Random events with membership changes: nothing is held for ever (a worker
// whose pull is held has a commit of the current code buffered), every
// buffered commit is named once, and drained rounds leave nothing behind.
BOOST_AUTO_TEST_CASE(random_schedules_keep_the_invariants) {
  for (std::uint32_t seed = 1; seed <= 30; ++seed) {
    const std::size_t m = 2 + seed % 9;
    as::coded_bsp p{{.workers = m, .stragglers = seed % 4}};
    policy_testing::event_script script(m, seed);
    as::outcome_sink out(m + 2);
    std::uint64_t buffered = 0, named = 0;
    for (int i = 0; i < 1500; ++i) {
      const auto e = script.next();
      const auto f = policy_testing::apply(p, e, out);
      if (f.kind == 0 && f.commit.action == as::commit_action::buffer) ++buffered;
      if (f.kind == 0) BOOST_REQUIRE((f.commit.action != as::commit_action::apply));
      for (const auto& c : f.round) {
        BOOST_REQUIRE(std::isfinite(c.weight));
        ++named;
      }
      BOOST_REQUIRE(buffered == named + p.buffered());
    }
    out.clear();
    p.drain(out);
    named += out.round().size();
    BOOST_TEST(buffered == named);
    BOOST_TEST(p.buffered() == 0u);
    for (as::worker_id w = 0; w < m + 2; ++w) BOOST_TEST(!p.is_held(w));
  }
}

// Workers that wait for their pulls, one of them late each round in turn:
// after every arrival set has been seen once, rounds allocate nothing.
BOOST_AUTO_TEST_CASE(steady_state_rounds_allocate_nothing) {
  const std::size_t m = 8;
  as::coded_bsp p{{.workers = m, .stragglers = 2}};
  as::outcome_sink out(m);
  std::vector<std::uint64_t> seq(m, 0);
  const auto run_round = [&](std::size_t k) {
    for (std::size_t t = 0; t < m; ++t) {
      const auto w = static_cast<as::worker_id>((k + t) % m);  // workers k+6, k+7 are late
      out.clear();
      (void)p.on_commit({.worker = w, .sequence = ++seq[w]}, out);
      out.clear();
      (void)p.on_pull({.worker = w}, out);
    }
  };
  for (std::size_t k = 0; k < m; ++k) run_round(k);
  const std::size_t before = counting_new::count();
  for (std::size_t k = 0; k < 4 * m; ++k) run_round(k);
  BOOST_TEST(counting_new::count() == before);
  BOOST_TEST(p.rounds() == 5 * m);
  BOOST_TEST(p.late_commits() == 2 * 5 * m);  // two stragglers a round
}
