#include <ashl/sync/dssp.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/counting_new.hpp"
#include "../support/policy_testing.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace as = ashl::sync;

// BOOST_REQUIRE only on failure: the property tests check millions of facts.
#define REQUIRE_FAST(cond)          \
  do {                              \
    if (!(cond)) BOOST_REQUIRE(cond); \
  } while (0)

namespace {
void commit_at(as::dssp& p, as::worker_id w, std::uint64_t seq, double t) {
  as::outcome_sink out(4);
  (void)p.on_commit({.worker = w, .sequence = seq, .time = t}, out);
}
std::vector<as::worker_id> released(const as::outcome_sink& out) {
  return {out.released().begin(), out.released().end()};
}
}  // namespace

BOOST_AUTO_TEST_CASE(without_timing_the_bound_is_s_min) {
  as::dssp p{{.workers = 2, .s_min = 1, .s_max = 4}};
  as::outcome_sink out(2);
  commit_at(p, 0, 1, 1.0);
  commit_at(p, 0, 2, 2.0);
  BOOST_TEST((p.on_pull({.worker = 0, .time = 2.0}, out) == as::pull_action::hold));
  BOOST_TEST(p.current_bound() == 1u);
  BOOST_TEST((p.stage() == as::stage_id::dssp));
}

BOOST_AUTO_TEST_CASE(far_straggler_widens_the_bound_near_one_keeps_it) {
  // Worker 0 iterates every 1 s, worker 1 every 10 s.
  as::dssp p{{.workers = 2, .s_min = 1, .s_max = 4}};
  as::outcome_sink out(2);
  commit_at(p, 1, 1, 0.0);
  commit_at(p, 0, 1, 0.0);
  commit_at(p, 1, 2, 10.0);  // T_1 = 10, next predicted at 20
  std::uint64_t s0 = 1;
  for (double t = 1.0; t <= 10.0; t += 1.0) commit_at(p, 0, ++s0, t);
  // c_0 = 11, c_1 = 2: far beyond s_max: held.
  BOOST_TEST((p.on_pull({.worker = 0, .time = 10.0}, out) == as::pull_action::hold));
  // Straggler commits at 20: predicted next at 30. c_1 = 3, ahead = 8 > 4: still held.
  (void)p.on_commit({.worker = 1, .sequence = 3, .time = 20.0}, out);
  BOOST_TEST(out.released().empty());
  // Fresh scenario: ahead = 3 with the straggler's commit 9 s away: bound widens to 4, served.
  as::dssp q{{.workers = 2, .s_min = 1, .s_max = 4}};
  commit_at(q, 1, 1, 0.0);
  commit_at(q, 1, 2, 10.0);
  commit_at(q, 0, 1, 8.0);
  commit_at(q, 0, 2, 9.0);
  commit_at(q, 0, 3, 10.0);
  commit_at(q, 0, 4, 11.0);
  commit_at(q, 0, 5, 12.0);  // c_0 = 5, c_1 = 2: ahead 3
  BOOST_TEST((q.on_pull({.worker = 0, .time = 12.0}, out) == as::pull_action::serve));
  BOOST_TEST(q.current_bound() == 4u);
  BOOST_TEST(q.iteration_time(0) == 1.0);
  BOOST_TEST(q.bound_for(0, 12.0) == 4u);
  // Near the straggler's commit (due at 20), ahead 3 > s_min: round(0.5) → small bound: held.
  as::dssp r = q;
  commit_at(r, 0, 6, 19.6);
  BOOST_TEST(r.ahead(0) == 4u);
  BOOST_TEST((r.on_pull({.worker = 0, .time = 19.6}, out) == as::pull_action::hold));
  BOOST_TEST(r.current_bound() < 4u);
  // Its commit releases the pull.
  (void)r.on_commit({.worker = 1, .sequence = 3, .time = 20.0}, out);
  BOOST_TEST((released(out) == std::vector<as::worker_id>{0}));
  // The copy was independent.
  BOOST_TEST(q.ahead(0) == 3u);
  BOOST_TEST(!q.is_held(0));
}

BOOST_AUTO_TEST_CASE(eviction_releases_and_bound_never_exceeds_s_max) {
  as::dssp p{{.workers = 3, .s_min = 0, .s_max = 2}};
  as::outcome_sink out(3);
  std::mt19937 rng(7);
  std::vector<std::uint64_t> seq(3, 0);
  std::vector<bool> waiting(3, false);
  double now = 0.0;
  for (int step = 0; step < 2000; ++step) {
    now += 0.01 * (1 + rng() % 10);
    const auto w = static_cast<as::worker_id>(rng() % 3);
    if (waiting[w] || (rng() % (1 + 3 * w)) != 0) continue;
    out.clear();
    (void)p.on_commit({.worker = w, .sequence = ++seq[w], .time = now}, out);
    for (auto r : out.released()) {
      BOOST_REQUIRE(p.ahead(r) <= 2u);
      waiting[r] = false;
    }
    if (p.on_pull({.worker = w, .time = now}, out) == as::pull_action::hold) waiting[w] = true;
    else BOOST_REQUIRE(p.ahead(w) <= 2u);
  }
  // Evict the slowest: everyone waiting is released.
  out.clear();
  p.on_evict({.worker = 2, .time = now}, out);
  for (auto r : out.released()) waiting[r] = false;
  BOOST_TEST(!p.is_live(2));
  // Whoever is still held is ahead of the slowest live worker: nobody waits for the evicted one.
  for (as::worker_id w = 0; w < 2; ++w) BOOST_TEST((!waiting[w] || p.ahead(w) > 0u));
  BOOST_TEST((p.is_held(0) == waiting[0]));
}

// Property: the rule of the header comment, recomputed here from scratch
// (own clocks, own iteration-time windows, own t_next over the live workers at
// the minimum), under random commits, pulls, joins and evictions at any time:
// every pull decision is the model's; every release is allowed by the model
// at that event (so never past s_max); after every event no held pull of a
// live worker is allowed (released exactly when allowed, not later); and at
// the end committing for the slow workers releases every held pull.
BOOST_AUTO_TEST_CASE(rule_exact_under_random_schedules_against_a_model) {
  std::size_t releases = 0, widened = 0;
  for (std::uint32_t seed = 1; seed <= 480; ++seed) {
    std::mt19937 rng(seed * 7919u);
    const std::size_t m = 1 + seed % 40;
    const std::uint32_t s_min = seed % 6;
    const std::uint32_t s_max = s_min + (seed / 6) % (6 - s_min);
    const std::uint32_t window = 1 + seed % 5;
    const std::size_t ids = m + 3;
    as::dssp p{{.workers = m, .s_min = s_min, .s_max = s_max, .window = window}};
    as::outcome_sink out(ids);

    struct worker {
      bool live = false, held = false, has_seq = false;
      std::uint64_t clock = 0, last_seq = 0, next_seq = 0;
      std::uint64_t since_join = 0;
      double last_time = 0.0;
      std::deque<double> times;
      std::uint32_t speed = 1;
    };
    std::vector<worker> ws(ids);
    for (auto& x : ws) x.speed = 1 + rng() % 8;
    for (std::size_t w = 0; w < m; ++w) ws[w].live = true;
    double now = 0.0;
    const double nan = std::numeric_limits<double>::quiet_NaN();

    auto min_live = [&] {
      std::uint64_t mn = 0;
      bool any = false;
      for (const auto& x : ws)
        if (x.live && (!any || x.clock < mn)) mn = x.clock, any = true;
      return mn;
    };
    auto mean = [&](const worker& x) {
      if (x.times.empty()) return nan;
      return std::accumulate(x.times.begin(), x.times.end(), 0.0) / static_cast<double>(x.times.size());
    };
    auto t_next = [&] {
      const std::uint64_t mn = min_live();
      double t = std::numeric_limits<double>::infinity();
      bool any = false;
      for (const auto& x : ws) {
        if (!x.live || x.clock != mn) continue;
        any = true;
        const double tj = mean(x);
        if (!(tj > 0.0)) return nan;
        t = std::min(t, x.last_time + tj);
      }
      return any && std::isfinite(t) ? t : nan;
    };
    auto bound = [&](const worker& x, double at, double tn) -> std::uint64_t {
      const double ti = mean(x);
      if (!(ti > 0.0) || std::isnan(tn)) return s_min;
      const double r = std::round((tn - at) / ti);
      if (!(r > 0.0)) return s_min;
      return s_min + static_cast<std::uint64_t>(std::min(r, static_cast<double>(s_max - s_min)));
    };
    auto check_outcome = [&] {
      const std::uint64_t mn = min_live();
      const double tn = t_next();
      for (auto r : out.released()) {
        REQUIRE_FAST(r < ids);
        auto& x = ws[r];
        REQUIRE_FAST(x.live);
        REQUIRE_FAST(x.held);
        REQUIRE_FAST(x.clock - mn <= bound(x, now, tn));
        REQUIRE_FAST(x.clock - mn <= s_max);
        if (x.clock - mn > s_min) ++widened;
        x.held = false;
        ++releases;
      }
      REQUIRE_FAST(out.round().empty());
      for (as::worker_id w = 0; w < ids; ++w) {
        const auto& x = ws[w];
        if (x.live && x.held) REQUIRE_FAST(x.clock - mn > bound(x, now, tn));  // not late
        REQUIRE_FAST(p.is_held(w) == (x.live && x.held));
        REQUIRE_FAST(p.is_live(w) == x.live);
      }
      out.clear();
    };
    auto commit = [&](as::worker_id w, std::uint64_t sq) {
      auto& x = ws[w];
      const bool accept = x.live && (!x.has_seq || sq > x.last_seq);
      if (accept) {
        x.has_seq = true;
        x.last_seq = sq;
        ++x.clock;
        if (++x.since_join >= 2) {
          x.times.push_back(now - x.last_time);
          if (x.times.size() > window) x.times.pop_front();
        }
        x.last_time = now;
      }
      const auto d = p.on_commit({.worker = w, .sequence = sq, .time = now}, out);
      REQUIRE_FAST((d.action == (accept ? as::commit_action::apply : as::commit_action::drop)));
      check_outcome();
    };
    auto pull = [&](as::worker_id w) {
      auto& x = ws[w];
      const auto a = p.on_pull({.worker = w, .time = now}, out);
      bool hold = false;
      if (x.live) hold = x.held || x.clock - min_live() > bound(x, now, t_next());
      REQUIRE_FAST((a == (hold ? as::pull_action::hold : as::pull_action::serve)));
      if (x.live && !x.held) REQUIRE_FAST(p.current_bound() == bound(x, now, t_next()));
      x.held = x.held || hold;
      REQUIRE_FAST(out.empty());
      check_outcome();
    };

    for (int step = 0; step < 2000; ++step) {
      now += 0.01 * static_cast<double>(rng() % 20);
      const auto w = static_cast<as::worker_id>(rng() % ids);
      const unsigned r = rng() % 100;
      if (r < 55) {
        if (rng() % ws[w].speed != 0) continue;  // skewed speeds
        std::uint64_t sq = ++ws[w].next_seq;
        if (rng() % 12 == 0 && sq > 1) sq -= 1 + rng() % (sq - 1);  // a duplicate
        commit(w, sq);
        if (rng() % 4 != 0) pull(w);
      } else if (r < 85) {
        pull(w);
      } else if (r < 92) {
        auto& x = ws[w];
        const bool joins = !x.live;
        if (joins) {
          const bool any = std::any_of(ws.begin(), ws.end(), [](const worker& y) { return y.live; });
          const std::uint64_t start = any ? min_live() : 0;
          const std::uint32_t speed = x.speed;
          const std::uint64_t next = x.next_seq;
          x = worker{};
          x.clock = start;
          x.speed = speed;
          x.next_seq = next;
        }
        p.on_join({.worker = w, .time = now}, out);
        REQUIRE_FAST(out.empty());
        x.live = true;
        if (joins) REQUIRE_FAST(p.clock(w) == x.clock);
        check_outcome();
      } else {
        const auto live = std::count_if(ws.begin(), ws.end(), [](const worker& y) { return y.live; });
        if (live <= 1 && rng() % 4 != 0) continue;
        ws[w].live = false;
        ws[w].held = false;
        p.on_evict({.worker = w, .time = now}, out);
        check_outcome();
      }
    }
    // Drive every held pull out: commit for the workers at the minimum.
    for (int round = 0; round < 400; ++round) {
      const bool any_held = std::any_of(ws.begin(), ws.end(), [](const worker& y) { return y.live && y.held; });
      if (!any_held) break;
      now += 1.0;
      const std::uint64_t mn = min_live();
      for (as::worker_id w = 0; w < ids; ++w)
        if (ws[w].live && ws[w].clock == mn) commit(w, ++ws[w].next_seq);
    }
    for (as::worker_id w = 0; w < ids; ++w) REQUIRE_FAST(!ws[w].held && !p.is_held(w));
  }
  BOOST_TEST(releases > 1000u);
  BOOST_TEST(widened > 50u);  // the timing rule did release within (s_min, s_max]
}

BOOST_AUTO_TEST_CASE(save_load_round_trip_makes_the_same_decisions) {
  for (std::uint32_t seed = 1; seed <= 8; ++seed) {
    as::dssp p{{.workers = 2 + seed % 5,
                .s_min = seed % 2,
                .s_max = 1 + seed % 4,
                .window = 1 + seed % 3,
                .scale = 0.5,
                .weights = {0.25},
                .staleness_weight = as::staleness_weighting::power(1.5)}};
    policy_testing::check_round_trip(p, 2 + seed % 5, seed);
  }
  as::dssp p{{.workers = 3, .s_min = 0, .s_max = 3}};
  as::outcome_sink out(3);
  for (std::uint64_t s = 1; s <= 4; ++s) (void)p.on_commit({.worker = 0, .sequence = s, .time = 1.0 * s}, out);
  (void)p.on_pull({.worker = 0, .time = 4.0}, out);
  BOOST_TEST(p.is_held(0));
  policy_testing::check_load_rejects_truncation(p);
}

BOOST_AUTO_TEST_CASE(steady_state_events_allocate_nothing) {
  for (std::uint32_t seed = 1; seed <= 3; ++seed) {
    as::dssp p{{.workers = 16, .s_min = 1, .s_max = 4, .window = 3}};
    BOOST_TEST(policy_testing::steady_state_allocations(p, 16, seed, counting_new::count) == 0u);
  }
}
