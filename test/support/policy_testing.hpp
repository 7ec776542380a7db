// test/support/policy_testing.hpp — helpers shared by the consistency-policy
// tests: a random event script and the save/load round-trip check.
//
//   policy_testing::check_round_trip(ashl::sync::ssp{{.workers = 5, .staleness = 2}}, 5, seed);
//
// The round trip runs random events on a policy, saves it mid-run, loads the
// bytes into a default-constructed value (so nothing comes from construction
// parameters), then feeds both the same further events and requires the same
// decisions, sinks, plans and membership after every one, and the same bytes
// when both are saved again. check_steady_state runs a driver-like schedule
// (a worker commits, pulls, and waits while its pull is held) and counts the
// allocations after warm-up with an allocation counter the test provides
// (test/support/counting_new.hpp).
#pragma once

#include <ashl/sync/concepts.hpp>
#include <ashl/sync/events.hpp>

#include <boost/test/unit_test.hpp>

#include "saved_state.hpp"

#include <cstddef>
#include <cstdint>
#include <random>
#include <variant>
#include <vector>

namespace policy_testing {

namespace as = ashl::sync;

struct join_event : as::membership_event {};
struct evict_event : as::membership_event {};
using any_event = std::variant<as::commit_event, as::pull_event, as::metric_event, join_event, evict_event,
                               as::measurement_event>;

// Random events over ids [0, workers + 2): commits (some duplicates), pulls,
// joins, evictions, metrics and measurements, at non-decreasing times.
class event_script {
 public:
  event_script(std::size_t workers, std::uint32_t seed) : rng_(seed), ids_(workers + 2), seq_(workers + 2, 0) {}

  any_event next() {
    time_ += 0.05 * static_cast<double>(1 + rng_() % 20);
    const auto w = static_cast<as::worker_id>(rng_() % ids_);
    const unsigned r = rng_() % 100;
    if (r < 45) {
      std::uint64_t s = ++seq_[w];
      if (rng_() % 10 == 0 && s > 1) s -= 1 + rng_() % s;  // a duplicate
      return as::commit_event{.worker = w, .sequence = s, .clock = s, .time = time_, .bytes = 64,
                              .samples = 16 + rng_() % 48};
    }
    if (r < 78) return as::pull_event{.worker = w, .time = time_};
    if (r < 84) return join_event{{.worker = w, .time = time_}};
    if (r < 88) return evict_event{{.worker = w, .time = time_}};
    if (r < 94)
      return as::metric_event{.metric = as::metric_id::loss, .value = 2.0 / (1.0 + time_), .time = time_};
    return as::measurement_event{.worker = w,
                                 .kind = static_cast<as::measurement_kind>(rng_() % 6),
                                 .seconds = 0.01 * static_cast<double>(1 + rng_() % 50),
                                 .amount = 1024.0,
                                 .time = time_};
  }

 private:
  std::mt19937 rng_;
  std::size_t ids_;
  std::vector<std::uint64_t> seq_;
  double time_ = 0.0;
};

// What one event produced, for comparing two policies.
struct effect {
  int kind = 0;  // 0 commit, 1 pull, 2 other
  as::commit_decision commit{};
  as::pull_action pull = as::pull_action::serve;
  std::vector<as::weighted_commit> round;
  std::vector<as::worker_id> released;
  std::vector<as::worker_id> changed;
  bool all = false;
  friend bool operator==(const effect&, const effect&) = default;
};

template <as::consistency_policy P>
effect apply(P& p, const any_event& e, as::outcome_sink& out) {
  out.clear();
  effect f;
  if (auto* c = std::get_if<as::commit_event>(&e)) {
    f.commit = p.on_commit(*c, out);
  } else if (auto* q = std::get_if<as::pull_event>(&e)) {
    f.kind = 1;
    f.pull = p.on_pull(*q, out);
  } else {
    f.kind = 2;
    if (auto* m = std::get_if<as::metric_event>(&e)) p.on_metric(*m, out);
    else if (auto* j = std::get_if<join_event>(&e)) p.on_join(*j, out);
    else if (auto* v = std::get_if<evict_event>(&e)) p.on_evict(*v, out);
    else p.on_measurement(std::get<as::measurement_event>(e), out);
  }
  f.round.assign(out.round().begin(), out.round().end());
  f.released.assign(out.released().begin(), out.released().end());
  f.changed.assign(out.plans_changed().begin(), out.plans_changed().end());
  f.all = out.every_plan_changed();
  return f;
}

using test_support::saved;

template <as::consistency_policy P>
void require_same_view(const P& a, const P& b, std::size_t ids) {
  BOOST_REQUIRE((a.stage() == b.stage()));
  for (as::worker_id w = 0; w < ids; ++w) {
    BOOST_REQUIRE((a.plan(w) == b.plan(w)));
    BOOST_REQUIRE(a.is_live(w) == b.is_live(w));
    BOOST_REQUIRE(a.is_held(w) == b.is_held(w));
  }
}

template <as::consistency_policy P>
void check_round_trip(P original, std::size_t workers, std::uint32_t seed, int before = 300, int after = 600) {
  event_script script(workers, seed);
  as::outcome_sink out(workers + 2);
  P a = std::move(original);
  for (int i = 0; i < before; ++i) (void)apply(a, script.next(), out);
  const auto bytes = saved(a);
  P b{};
  ashl::state_reader in(bytes);
  const auto st = b.load(in);
  BOOST_REQUIRE_MESSAGE(st.ok(), st.message());
  BOOST_REQUIRE(in.at_end());
  BOOST_REQUIRE((saved(b) == bytes));
  require_same_view(a, b, workers + 2);
  as::outcome_sink out_b(workers + 2);
  for (int i = 0; i < after; ++i) {
    const auto e = script.next();
    const effect fa = apply(a, e, out);
    const effect fb = apply(b, e, out_b);
    BOOST_REQUIRE((fa == fb));
    require_same_view(a, b, workers + 2);
  }
  BOOST_REQUIRE((saved(a) == saved(b)));
  // A drain names the same things too.
  out.clear();
  out_b.clear();
  a.drain(out);
  b.drain(out_b);
  BOOST_REQUIRE((std::vector<as::weighted_commit>(out.round().begin(), out.round().end()) ==
                 std::vector<as::weighted_commit>(out_b.round().begin(), out_b.round().end())));
  BOOST_REQUIRE((std::vector<as::worker_id>(out.released().begin(), out.released().end()) ==
                 std::vector<as::worker_id>(out_b.released().begin(), out_b.released().end())));
}

// Raw event delivery, recording nothing (no allocation of its own).
template <as::consistency_policy P>
void feed(P& p, const any_event& e, as::outcome_sink& out) {
  if (auto* c = std::get_if<as::commit_event>(&e)) (void)p.on_commit(*c, out);
  else if (auto* q = std::get_if<as::pull_event>(&e)) (void)p.on_pull(*q, out);
  else if (auto* m = std::get_if<as::metric_event>(&e)) p.on_metric(*m, out);
  else if (auto* j = std::get_if<join_event>(&e)) p.on_join(*j, out);
  else if (auto* v = std::get_if<evict_event>(&e)) p.on_evict(*v, out);
  else p.on_measurement(std::get<as::measurement_event>(e), out);
}

// Workers 0..workers-1 (all joined first) run commit → pull → wait while
// held, at random speeds; now and then one is evicted and rejoins, metrics and
// measurements arrive. Returns the allocations counted (by `count`) during
// the events after `warmup`.
template <as::consistency_policy P, class Count>
std::size_t steady_state_allocations(P& p, std::size_t workers, std::uint32_t seed, Count&& count,
                                     int warmup = 2000, int measured = 4000) {
  std::mt19937 rng(seed);
  as::outcome_sink out(workers);
  std::vector<std::uint64_t> seq(workers, 0);
  std::vector<std::uint8_t> waiting(workers, 0), live(workers, 1);
  for (as::worker_id w = 0; w < workers; ++w) p.on_join({.worker = w}, out);
  double now = 0.0;
  std::size_t before = 0;
  for (int i = 0; i < warmup + measured; ++i) {
    if (i == warmup) before = count();
    out.clear();
    now += 0.001 * static_cast<double>(1 + rng() % 10);
    const auto w = static_cast<as::worker_id>(rng() % workers);
    const unsigned r = rng() % 100;
    if (r < 2) {
      if (live[w]) {
        p.on_evict({.worker = w, .time = now}, out);
        live[w] = 0;
      } else {
        p.on_join({.worker = w, .time = now}, out);
        live[w] = 1;
        seq[w] = 0;
      }
      waiting[w] = 0;
    } else if (r < 4) {
      p.on_metric({.metric = as::metric_id::loss, .value = 1.0 / (1.0 + now), .time = now}, out);
    } else if (r < 6) {
      p.on_measurement({.worker = w, .kind = as::measurement_kind::compute, .seconds = 0.01, .time = now}, out);
    } else if (live[w] && !waiting[w] && rng() % (1 + w % 4) == 0) {
      (void)p.on_commit({.worker = w, .sequence = ++seq[w], .clock = seq[w], .time = now, .samples = 32}, out);
      for (auto x : out.released()) waiting[x] = 0;
      out.clear();
      if (p.on_pull({.worker = w, .time = now}, out) == as::pull_action::hold) waiting[w] = 1;
    }
    for (auto x : out.released()) waiting[x] = 0;
  }
  return count() - before;
}

// A load of damaged bytes fails and leaves the target as it was.
template <as::consistency_policy P>
void check_load_rejects_truncation(const P& p) {
  const auto bytes = saved(p);
  for (std::size_t cut = 0; cut < bytes.size(); cut += 1 + bytes.size() / 64) {
    P target = p;
    ashl::state_reader in(std::span<const std::byte>(bytes.data(), cut));
    BOOST_REQUIRE(!target.load(in).ok());
    BOOST_REQUIRE((saved(target) == bytes));
  }
}

}  // namespace policy_testing
