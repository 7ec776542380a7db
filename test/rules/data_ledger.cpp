#include <ashl/rules/data_ledger.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

// Counts every allocation of this program (docs/elastic.md §3.2: no
// allocation per event after warm-up).
#include "../support/counting_new.hpp"

namespace ps = ashl::ps;

namespace {

using lease = ps::ledger_lease;
constexpr auto live = ps::ledger_worker_state::live;
constexpr auto suspended = ps::ledger_worker_state::suspended;
constexpr auto gone = ps::ledger_worker_state::gone;

ps::data_ledger make(const ps::ledger_params& p) {
  auto l = ps::data_ledger::create(p);
  BOOST_REQUIRE_MESSAGE(l.has_value(), (l ? std::string() : l.error().message()));
  return std::move(*l);
}

// What the last events sent, emptying the sink.
std::vector<lease> sent(ps::ledger_sink& out) {
  std::vector<lease> v(out.leases().begin(), out.leases().end());
  out.clear();
  return v;
}
std::vector<lease> held(const ps::data_ledger& l, ps::worker_id w) {
  return {l.leases(w).begin(), l.leases(w).end()};
}
lease at(ps::worker_id w, std::uint64_t number, std::uint64_t epoch, std::uint64_t begin, std::uint64_t end,
         std::uint32_t flags = 0) {
  return {.worker = w, .flags = flags, .number = number, .epoch = epoch, .begin = begin, .end = end};
}

std::vector<std::byte> bytes_of(const ps::data_ledger& l) {
  std::vector<std::byte> b;
  ashl::state_writer w(b);
  l.save(w);
  return b;
}
ashl::status load_into(ps::data_ledger& l, std::span<const std::byte> b) {
  ashl::state_reader r(b);
  return l.load(r);
}

void require_ok(const ashl::status& s) { BOOST_REQUIRE_MESSAGE(s.ok(), s.message()); }

}  // namespace

// ------------------------------------------------------------ one event at a time

BOOST_AUTO_TEST_CASE(a_join_gets_one_lease_and_the_next_comes_once_it_is_in_use) {
  auto l = make({.samples = 100, .lease_samples = 10});
  ps::ledger_sink out;
  require_ok(l.join(0, 0, 8, 0.0, out));
  BOOST_TEST((sent(out) == std::vector{at(0, 1, 0, 0, 10)}));
  require_ok(l.commit(0, 1, 8, 1.0, out));  // 9 unused < ahead (1) x 10
  BOOST_TEST((sent(out) == std::vector{at(0, 2, 0, 10, 20)}));
  BOOST_TEST((held(l, 0) == std::vector{at(0, 1, 0, 1, 10), at(0, 2, 0, 10, 20)}));
  BOOST_TEST(l.unused(0) == 19u);
  BOOST_TEST(l.used(0) == 1u);
  BOOST_TEST(l.stats().leases_granted == 2u);
  require_ok(l.check());

  auto two = make({.samples = 100, .lease_samples = 10, .ahead = 2});
  require_ok(two.join(3, 0, 8, 0.0, out));
  BOOST_TEST((sent(out) == std::vector{at(3, 1, 0, 0, 10), at(3, 2, 0, 10, 20)}));
  auto none = make({.samples = 100, .lease_samples = 10, .ahead = 0});
  require_ok(none.join(0, 0, 8, 0.0, out));
  require_ok(none.commit(0, 9, 8, 1.0, out));
  BOOST_TEST(sent(out).size() == 1u);  // ahead 0: the next lease only once none is left
  require_ok(none.commit(0, 1, 8, 2.0, out));
  BOOST_TEST((sent(out) == std::vector{at(0, 2, 0, 10, 20)}));
}

BOOST_AUTO_TEST_CASE(lease_samples_0_derives_each_lease_from_the_worker_s_cycle) {
  auto l = make({.samples = 1000});
  ps::ledger_sink out;
  require_ok(l.join(0, 0, 8, 0.0, out));  // 4 x batch x H = 4 x 8
  BOOST_TEST((sent(out) == std::vector{at(0, 1, 0, 0, 32)}));
  require_ok(l.commit(0, 32, 50, 1.0, out));  // its plan changed: 4 x 50
  BOOST_TEST((sent(out) == std::vector{at(0, 2, 0, 32, 232)}));
  BOOST_TEST(l.lease_size(0) == 200u);
  require_ok(l.join(1, 0, 0, 2.0, out));  // 0: unknown, counts as 1
  BOOST_TEST((sent(out) == std::vector{at(1, 1, 0, 232, 236)}));
  require_ok(l.join(2, 0, 300, 3.0, out));  // 4 x 300 > N: the rest of the pool
  // ... and, being short of ahead x 1000 still, epoch 1's first lease: epoch 0's pool is empty.
  BOOST_TEST((sent(out) == std::vector{at(2, 1, 0, 236, 1000, ps::lease_epoch_end), at(2, 2, 1, 0, 1000, ps::lease_epoch_end)}));
  BOOST_TEST(l.lease_size(2) == 1000u);
  require_ok(l.check());
}

BOOST_AUTO_TEST_CASE(progress_moves_through_leases_in_order_and_overrun_is_clamped_and_counted) {
  auto l = make({.samples = 100, .lease_samples = 10});
  ps::ledger_sink out;
  require_ok(l.join(0, 0, 1, 0.0, out));
  require_ok(l.commit(0, 5, 1, 1.0, out));
  BOOST_TEST((sent(out) == std::vector{at(0, 1, 0, 0, 10), at(0, 2, 0, 10, 20)}));
  require_ok(l.commit(0, 12, 1, 2.0, out));  // the rest of lease 1 and 7 of lease 2
  BOOST_TEST((sent(out) == std::vector{at(0, 3, 0, 20, 30)}));
  BOOST_TEST((held(l, 0) == std::vector{at(0, 2, 0, 17, 20), at(0, 3, 0, 20, 30)}));
  require_ok(l.commit(0, 50, 1, 3.0, out));  // holds 13: 37 trained without a lease
  BOOST_TEST(l.stats().overrun == 37u);
  BOOST_TEST(l.used(0) == 30u);
  BOOST_TEST((sent(out) == std::vector{at(0, 4, 0, 30, 40)}));
  require_ok(l.commit(0, 0, 1, 4.0, out));  // nothing covered: nothing moves
  BOOST_TEST(sent(out).empty());
  BOOST_TEST(l.used(0) == 30u);
  require_ok(l.check());
}

BOOST_AUTO_TEST_CASE(a_leave_gives_back_at_once_and_the_lowest_returned_range_goes_first) {
  auto l = make({.samples = 100, .lease_samples = 10});
  ps::ledger_sink out;
  require_ok(l.join(0, 0, 1, 0.0, out));  // [0, 10)
  require_ok(l.join(1, 0, 1, 0.0, out));  // [10, 20)
  require_ok(l.commit(0, 3, 1, 1.0, out));  // 0: [3, 10) and [20, 30)
  sent(out);
  require_ok(l.leave(0, 2.0, out));
  BOOST_TEST(sent(out).empty());  // 1 is not short
  BOOST_TEST((l.state(0) == gone));
  BOOST_TEST(l.leases(0).empty());
  BOOST_TEST(l.stats().leases_returned == 2u);
  BOOST_TEST(l.stats().positions_returned == 17u);
  BOOST_TEST(l.next(0) == 20u);  // [20, 30) was the tail: the pool's tail moved down over it
  require_ok(l.check());
  require_ok(l.commit(1, 10, 1, 3.0, out));
  BOOST_TEST((sent(out) == std::vector{at(1, 2, 0, 3, 10), at(1, 3, 0, 20, 30)}));
  BOOST_TEST(l.used(0) == 13u);
  require_ok(l.check());
  BOOST_TEST(l.leave(0, 4.0, out).message() ==
             "leave.worker = 0: not live in the ledger (never joined, left, or evicted)");
}

BOOST_AUTO_TEST_CASE(an_evicted_worker_that_rejoins_in_time_resumes_its_leases_sent_again) {
  auto l = make({.samples = 100, .lease_samples = 10, .give_back_after = 30.0});
  ps::ledger_sink out;
  require_ok(l.join(0, 7, 1, 0.0, out));
  require_ok(l.commit(0, 4, 1, 0.5, out));  // [4, 10), [10, 20)
  sent(out);
  l.evict(0, 1.0, out);
  BOOST_TEST((l.state(0) == suspended));
  require_ok(l.join(1, 0, 1, 2.0, out));
  BOOST_TEST((sent(out) == std::vector{at(1, 1, 0, 20, 30)}));  // nothing of 0's
  BOOST_TEST(l.commit(0, 1, 1, 3.0, out).message() ==
             "commit.worker = 0: not live in the ledger (never joined, left, or evicted)");
  l.tick(30.9, out);
  BOOST_TEST((l.state(0) == suspended));
  require_ok(l.join(0, 7, 1, 30.95, out));
  BOOST_TEST((sent(out) == std::vector{at(0, 1, 0, 4, 10, ps::lease_resent), at(0, 2, 0, 10, 20, ps::lease_resent)}));
  BOOST_TEST((l.state(0) == live));
  BOOST_TEST(l.stats().leases_returned == 0u);
  BOOST_TEST(l.stats().leases_resent == 2u);
  require_ok(l.commit(0, 6, 1, 31.0, out));  // the commit it had in flight covers what it resumed
  BOOST_TEST((held(l, 0) == std::vector{at(0, 2, 0, 10, 20)}));
  // A duplicate join of a live worker (it reconnected unnoticed) is sent its leases again too.
  sent(out);
  require_ok(l.join(0, 7, 1, 32.0, out));
  BOOST_TEST((sent(out) == std::vector{at(0, 2, 0, 10, 20, ps::lease_resent)}));
  require_ok(l.check());
}

BOOST_AUTO_TEST_CASE(an_evicted_worker_s_leases_go_back_after_give_back_after) {
  auto l = make({.samples = 100, .lease_samples = 10, .give_back_after = 30.0});
  ps::ledger_sink out;
  require_ok(l.join(0, 0, 1, 0.0, out));
  require_ok(l.commit(0, 4, 1, 0.5, out));  // [4, 10), [10, 20)
  require_ok(l.join(1, 0, 1, 0.5, out));    // [20, 30)
  sent(out);
  l.evict(0, 1.0, out);
  l.tick(30.99, out);
  BOOST_TEST(l.stats().expiries == 0u);
  l.tick(31.0, out);
  BOOST_TEST(sent(out).empty());  // 1 holds a full lease: not short
  BOOST_TEST((l.state(0) == gone));
  BOOST_TEST(l.stats().expiries == 1u);
  BOOST_TEST(l.stats().positions_returned == 16u);
  require_ok(l.check());
  require_ok(l.commit(1, 10, 1, 32.0, out));  // [4, 10) and [10, 20) went back as one range
  BOOST_TEST((sent(out) == std::vector{at(1, 2, 0, 4, 14)}));
  require_ok(l.join(0, 0, 1, 40.0, out));  // the same incarnation, too late: new leases, none resent
  BOOST_TEST((sent(out) == std::vector{at(0, 3, 0, 14, 20), at(0, 4, 0, 30, 40)}));

  // Any event's time expires too, and give_back_after = 0 gives back at the eviction.
  l.evict(0, 50.0, out);
  require_ok(l.commit(1, 1, 1, 80.0, out));
  BOOST_TEST((l.state(0) == gone));
  auto now = make({.samples = 100, .lease_samples = 10, .give_back_after = 0.0});
  require_ok(now.join(0, 0, 1, 0.0, out));
  now.evict(0, 1.0, out);
  BOOST_TEST((now.state(0) == gone));
  BOOST_TEST(now.next(0) == 0u);
  require_ok(now.check());
}

BOOST_AUTO_TEST_CASE(a_restart_gives_the_old_incarnation_s_leases_back_at_once) {
  auto l = make({.samples = 100, .lease_samples = 10});
  ps::ledger_sink out;
  require_ok(l.join(0, 0, 1, 0.0, out));
  require_ok(l.commit(0, 2, 1, 1.0, out));  // [2, 10), [10, 20)
  sent(out);
  require_ok(l.join(0, 1, 1, 2.0, out));  // live and restarted: the old process never commits again
  BOOST_TEST((sent(out) == std::vector{at(0, 3, 0, 2, 12)}));
  BOOST_TEST(l.stats().leases_returned == 2u);
  const auto before = bytes_of(l);
  BOOST_TEST(l.join(0, 0, 1, 3.0, out).message() == "join.incarnation = 0: stale: worker 0 is at incarnation 1 in the ledger");
  BOOST_TEST((bytes_of(l) == before));
  BOOST_TEST(out.empty());
  l.evict(0, 4.0, out);
  require_ok(l.join(0, 2, 1, 5.0, out));  // suspended and restarted: back at once, not after give_back_after
  BOOST_TEST((sent(out) == std::vector{at(0, 4, 0, 2, 12)}));
  BOOST_TEST(l.stats().leases_returned == 3u);
  require_ok(l.check());
}

BOOST_AUTO_TEST_CASE(two_epochs_are_open_at_most_and_the_next_opens_when_one_completes) {
  auto l = make({.samples = 20, .lease_samples = 10});
  ps::ledger_sink out;
  require_ok(l.join(0, 0, 1, 0.0, out));
  require_ok(l.join(1, 0, 1, 0.0, out));
  BOOST_TEST((sent(out) == std::vector{at(0, 1, 0, 0, 10), at(1, 1, 0, 10, 20, ps::lease_epoch_end)}));
  require_ok(l.commit(0, 1, 1, 1.0, out));  // epoch 0's pool is empty: epoch 1 opens
  BOOST_TEST((sent(out) == std::vector{at(0, 2, 1, 0, 10)}));
  require_ok(l.commit(0, 19, 1, 2.0, out));  // across the epochs: 9 of 0, 10 of 1
  BOOST_TEST((sent(out) == std::vector{at(0, 3, 1, 10, 20, ps::lease_epoch_end)}));
  BOOST_TEST(l.used(0) == 10u);
  BOOST_TEST(l.used(1) == 10u);
  require_ok(l.commit(0, 10, 1, 3.0, out));
  BOOST_TEST(sent(out).empty());  // epoch 1 all used, epoch 0 not complete: epoch 2 waits
  BOOST_TEST(l.used(1) == 20u);
  BOOST_TEST(l.epoch() == 0u);
  BOOST_TEST(l.leases(0).empty());
  require_ok(l.check());
  require_ok(l.commit(1, 10, 1, 4.0, out));  // epoch 0 completes, and with it epoch 1
  BOOST_TEST(l.stats().epochs_completed == 2u);
  BOOST_TEST(l.epoch() == 2u);
  BOOST_TEST(l.used(0) == 20u);
  BOOST_TEST((sent(out) == std::vector{at(1, 2, 2, 0, 10), at(0, 4, 2, 10, 20, ps::lease_epoch_end)}));
  require_ok(l.check());
}

BOOST_AUTO_TEST_CASE(no_lease_past_the_last_epoch) {
  auto l = make({.samples = 10, .lease_samples = 10, .epochs = 1});
  ps::ledger_sink out;
  require_ok(l.join(0, 0, 1, 0.0, out));
  require_ok(l.commit(0, 3, 1, 1.0, out));
  BOOST_TEST((sent(out) == std::vector{at(0, 1, 0, 0, 10, ps::lease_epoch_end)}));  // no epoch 1
  require_ok(l.commit(0, 7, 1, 2.0, out));
  BOOST_TEST(l.finished());
  require_ok(l.commit(0, 5, 1, 3.0, out));
  BOOST_TEST(sent(out).empty());
  BOOST_TEST(l.stats().overrun == 5u);
  require_ok(l.join(1, 0, 1, 4.0, out));
  BOOST_TEST(sent(out).empty());
  require_ok(l.check());
}

BOOST_AUTO_TEST_CASE(samples_0_is_no_ledger) {
  auto l = make({});
  ps::ledger_sink out;
  BOOST_TEST(!l.enabled());
  require_ok(l.join(0, 0, 1, 0.0, out));
  require_ok(l.commit(0, 5, 1, 1.0, out));
  l.evict(0, 2.0, out);
  BOOST_TEST(out.empty());
  BOOST_TEST((l.state(0) == ps::ledger_worker_state::absent));
  require_ok(l.check());
}

BOOST_AUTO_TEST_CASE(parameters_are_refused_by_name) {
  auto bad = [](const ps::ledger_params& p) {
    auto l = ps::data_ledger::create(p);
    BOOST_REQUIRE(!l.has_value());
    return l.error().message();
  };
  BOOST_TEST(bad({.samples = 10, .lease_samples = 11}) ==
             "ledger.lease_samples = 11: must be at most ledger.samples = 10 (0: 4 x the worker's batch x H)");
  BOOST_TEST(bad({.samples = 10, .ahead = 65}) == "ledger.ahead = 65: must be at most 64 (ps::max_ledger_ahead)");
  BOOST_TEST(bad({.samples = 10, .give_back_after = -1.0}) ==
             "ledger.give_back_after = -1: must be finite seconds in [0, 1000000000] (ps::max_duration_seconds)");
  BOOST_TEST(bad({.samples = 10, .give_back_after = std::numeric_limits<double>::quiet_NaN()}).starts_with(
      "ledger.give_back_after = nan"));
  BOOST_TEST(bad({.samples = 10, .give_back_after = 2e9}).starts_with("ledger.give_back_after = 2e+09"));
  BOOST_TEST(bad({.samples = ps::max_ledger_samples + 1}) ==
             "ledger.samples = 281474976710657: must be at most 281474976710656 (ps::max_ledger_samples)");
  BOOST_TEST(ps::check_ledger_params({.samples = 10, .ahead = 99}, "server.ledger.").message().starts_with(
      "server.ledger.ahead = 99"));
  auto l = make({.samples = 10});
  ps::ledger_sink out;
  BOOST_TEST(l.join(ps::max_workers, 0, 1, 0.0, out).message() ==
             "join.worker = 65536: must be below 65536 (ps::max_workers)");
}

// ------------------------------------------------------------ bytes

BOOST_AUTO_TEST_CASE(bad_bytes_are_refused_by_name_and_change_nothing) {
  auto l = make({.samples = 100, .lease_samples = 10});
  ps::ledger_sink out;
  require_ok(l.join(0, 0, 1, 0.0, out));
  require_ok(l.join(1, 0, 1, 0.0, out));
  const auto good = bytes_of(l);
  {
    ps::data_ledger copy;
    require_ok(load_into(copy, good));
    BOOST_TEST((bytes_of(copy) == good));
  }
  auto patched = [&](std::size_t offset, std::uint64_t value, std::size_t width = 8) {
    auto b = good;
    for (std::size_t i = 0; i < width; ++i) b[offset + i] = static_cast<std::byte>(value >> (8 * i));
    return b;
  };
  auto refusal = [&](const std::vector<std::byte>& b) {
    auto target = make({.samples = 5, .lease_samples = 5});
    const auto before = bytes_of(target);
    const auto s = load_into(target, b);
    BOOST_TEST(!s.ok());
    BOOST_TEST((bytes_of(target) == before));
    return s.message();
  };
  BOOST_TEST(refusal(patched(0, 'X', 1)) == "state.tag = \"XDGR\": expected the section LDGR");
  BOOST_TEST(refusal(patched(4, 2, 4)) == "LDGR.version = 2: this build reads version 1");
  // Layout: tag 8, params 44 (samples, shuffle_seed, lease_samples 8 each, ahead 4, give_back_after 8,
  // epochs 8), then epoch 0: open 1, epoch 8, next 8, used 8, ...
  BOOST_TEST(refusal(patched(8 + 24, 65, 4)) == "data_ledger.params.ahead = 65: must be at most 64 (ps::max_ledger_ahead)");
  BOOST_TEST(refusal(patched(52 + 9, 101)) == "data_ledger.epoch.next = 101: past samples = 100");
  BOOST_TEST(refusal(patched(52, 0, 1)) == "data_ledger.epoch.open = false: no epoch open with epochs left");
  // Worker 1's lease [10, 20) made [5, 20): it overlaps worker 0's [0, 10).
  std::size_t begin_at = 0;
  for (std::size_t i = 0; i + 16 <= good.size(); ++i)
    if (good[i] == std::byte{10} && good[i + 8] == std::byte{20} && i > 8 + 44) {
      begin_at = i;
      break;
    }
  BOOST_REQUIRE(begin_at > 0);
  BOOST_TEST(refusal(patched(begin_at, 5)) == "data_ledger.check.overlap = 5: held twice in epoch 0");
  BOOST_TEST(refusal(patched(begin_at, 12)) ==
             "data_ledger.check.used = 0: plus the 98 positions not used is not samples in epoch 0");
  // Every truncation is refused; every one-byte change is refused or loads a consistent state.
  for (std::size_t n = 0; n < good.size(); ++n) {
    ps::data_ledger t;
    BOOST_TEST(!load_into(t, std::span(good).first(n)).ok());
  }
  for (std::size_t i = 0; i < good.size(); ++i) {
    auto b = good;
    b[i] ^= std::byte{0x41};
    ps::data_ledger t;
    if (load_into(t, b).ok()) require_ok(t.check());
  }
}

// ------------------------------------------------------------ random sequences

namespace {

// A worker process as the test models it: it trains the positions of the
// leases it was sent, in order, and its commits say how many.
struct process {
  std::uint64_t incarnation = 0;
  bool joined = false;
  bool alive = true;        // evicted while alive (it rejoins as itself) or dead (it restarts)
  std::uint64_t cycle = 1;  // its batch x H
  std::vector<lease> queue; // what it was sent and has not trained, the first from its cursor
};

struct run_result {
  std::vector<lease> log;  // every lease sent
  std::vector<std::byte> bytes;
  std::uint64_t epochs = 0;
};

// Joins, leaves, deaths (evictions), rejoins, restarts, ticks and commits of
// random sizes over N = 997, checking after every event that the ledger's
// accounting holds, that the live workers' leases are what they were sent,
// disjoint and unused, and at each completed epoch that every position was
// used exactly once. `reload_at`: the ledger is saved and replaced by a
// loaded copy before that event.
struct sequence {
  static constexpr std::uint64_t n = 997;
  static constexpr ps::worker_id ids = 8;

  std::mt19937_64 rng;
  ps::data_ledger ledger;
  ps::ledger_sink out;
  std::array<process, ids> procs{};
  std::vector<std::vector<std::uint8_t>> used;  // [epoch][position]
  std::vector<std::uint64_t> used_count;         // [epoch]
  std::uint64_t completed = 0;
  double now = 0.0;
  run_result result;

  explicit sequence(std::uint64_t seed) : rng(seed) {
    ps::ledger_params p{.samples = n, .shuffle_seed = seed};
    p.lease_samples = pick(3) == 0 ? 0 : 1 + pick(60);
    p.ahead = static_cast<std::uint32_t>(pick(3));
    p.give_back_after = std::array{0.0, 4.0, 20.0}[pick(3)];
    p.epochs = pick(4) == 0 ? 2 + pick(3) : 0;
    ledger = make(p);
  }

  std::uint64_t pick(std::uint64_t k) { return std::uniform_int_distribution<std::uint64_t>(0, k - 1)(rng); }
  std::uint64_t queued(const process& q) const {
    std::uint64_t s = 0;
    for (const lease& l : q.queue) s += l.size();
    return s;
  }

  // The leases an event sent go to their workers; resent ones must be what
  // the worker still held (`before`, for the worker that joined).
  void deliver(ps::worker_id joiner = ids, const std::vector<lease>& before = {}) {
    std::size_t resent = 0;
    for (const lease& l : out.leases()) {
      result.log.push_back(l);
      process& q = procs[l.worker];
      if ((l.flags & ps::lease_resent) != 0) {
        BOOST_REQUIRE(l.worker == joiner);
        BOOST_REQUIRE(resent < before.size());
        const lease& b = before[resent++];
        BOOST_REQUIRE((b.number == l.number && b.epoch == l.epoch && b.begin == l.begin && b.end == l.end));
      } else {
        // A new lease holds no position already used.
        grow(l.epoch);
        for (std::uint64_t p = l.begin; p < l.end; ++p)
          BOOST_REQUIRE_MESSAGE(used[l.epoch][p] == 0, "position " << p << " of epoch " << l.epoch << " leased once used");
      }
      q.queue.push_back(l);
    }
    BOOST_REQUIRE((resent == 0 || resent == before.size()));
    out.clear();
  }

  void grow(std::uint64_t epoch) {
    if (used.size() > epoch) return;
    used.resize(epoch + 1, std::vector<std::uint8_t>(n, 0));
    used_count.resize(epoch + 1, 0);
  }

  // The worker trains and commits k samples: the positions it used.
  void train(ps::worker_id w, std::uint64_t k) {
    process& q = procs[w];
    std::size_t done = 0;
    while (k > 0 && done < q.queue.size()) {
      lease& l = q.queue[done];
      const std::uint64_t take = std::min(k, l.size());
      grow(l.epoch);
      for (std::uint64_t p = l.begin; p < l.begin + take; ++p) {
        BOOST_REQUIRE_MESSAGE(used[l.epoch][p] == 0, "position " << p << " of epoch " << l.epoch << " used twice");
        used[l.epoch][p] = 1;
      }
      used_count[l.epoch] += take;
      l.begin += take;
      k -= take;
      if (l.begin == l.end) ++done;
    }
    q.queue.erase(q.queue.begin(), q.queue.begin() + static_cast<std::ptrdiff_t>(done));
  }

  void join(ps::worker_id w, std::uint64_t incarnation) {
    process& q = procs[w];
    const bool restart = !q.joined || incarnation != q.incarnation;
    const std::vector<lease> before = restart ? std::vector<lease>{} : std::exchange(q.queue, {});
    q.queue.clear();
    q.joined = true;
    q.alive = true;
    q.incarnation = incarnation;
    q.cycle = 1 + pick(16);
    require_ok(ledger.join(w, incarnation, q.cycle, now, out));
    deliver(w, before);
  }

  void step() {
    now += static_cast<double>(pick(300)) / 100.0;
    const ps::worker_id w = static_cast<ps::worker_id>(pick(ids));
    process& q = procs[w];
    const auto st = ledger.state(w);
    const std::uint64_t r = pick(100);
    if (st == live) {
      if (r < 70) {
        const std::uint64_t h = queued(q);
        const std::uint64_t k = r < 3 ? 0 : r < 8 ? h + 1 + pick(5) : h == 0 ? 0 : 1 + pick(h);
        train(w, k);
        require_ok(ledger.commit(w, k, q.cycle, now, out));
        deliver();
      } else if (r < 78) {
        require_ok(ledger.leave(w, now, out));
        q.queue.clear();
        deliver();
      } else if (r < 90) {
        ledger.evict(w, now, out);
        q.alive = pick(2) == 0;
        if (!q.alive) q.queue.clear();
        deliver();
      } else if (r < 94) {
        join(w, q.incarnation + 1);  // restarted before its death was noticed
      } else {
        join(w, q.incarnation);  // a duplicate join: it reconnected
      }
    } else if (st == ps::ledger_worker_state::absent) {
      if (r < 30) join(w, 0);
    } else if (r < 40) {
      join(w, q.alive ? q.incarnation : q.incarnation + 1);
    } else {
      ledger.tick(now, out);
      deliver();
    }
  }

  // After every event: the ledger's own accounting, and the workers' view
  // of it: the live workers hold what they were sent, and no two hold a
  // position (new leases held no used position: deliver()).
  void verify() {
    require_ok(ledger.check());
    const std::uint64_t first = ledger.epoch();
    std::vector<lease> all;
    for (ps::worker_id w = 0; w < ids; ++w) {
      if (ledger.state(w) != live) continue;
      const auto mine = ledger.leases(w);
      const auto& q = procs[w].queue;
      BOOST_REQUIRE_MESSAGE(mine.size() == q.size(), "worker " << w << " ledger " << mine.size() << " queue " << q.size());
      for (std::size_t i = 0; i < q.size(); ++i) {
        const lease& l = q[i];
        BOOST_REQUIRE((mine[i].number == l.number && mine[i].epoch == l.epoch && mine[i].begin == l.begin &&
                       mine[i].end == l.end));
        BOOST_REQUIRE((l.epoch == first || l.epoch == first + 1));
        all.push_back(l);
      }
    }
    std::sort(all.begin(), all.end(),
              [](const lease& a, const lease& b) { return std::pair(a.epoch, a.begin) < std::pair(b.epoch, b.begin); });
    for (std::size_t i = 1; i < all.size(); ++i)
      BOOST_REQUIRE_MESSAGE(all[i - 1].epoch != all[i].epoch || all[i - 1].end <= all[i].begin,
                            "position " << all[i].begin << " of epoch " << all[i].epoch << " leased to workers "
                                        << all[i - 1].worker << " and " << all[i].worker);
    // Epochs complete in order; each one's positions were used exactly once (no duplicate: train()).
    for (; completed < ledger.stats().epochs_completed; ++completed) {
      BOOST_REQUIRE(completed < used.size());
      BOOST_REQUIRE_MESSAGE(used_count[completed] == n,
                            "epoch " << completed << " complete with " << used_count[completed] << " positions used");
    }
    for (std::uint64_t e = first; e < used.size(); ++e) BOOST_REQUIRE(used_count[e] == ledger.used(e));
  }

  void run(std::size_t events, std::size_t reload_at = ~std::size_t{0}) {
    for (std::size_t i = 0; i < events; ++i) {
      if (i == reload_at) {
        const auto b = bytes_of(ledger);
        ps::data_ledger fresh;
        require_ok(load_into(fresh, b));
        BOOST_REQUIRE((bytes_of(fresh) == b));
        ledger = std::move(fresh);
      }
      step();
      verify();
    }
  }

  // Everyone comes back and trains what it holds: the epoch in progress
  // completes (nothing was lost), unless the last one already did.
  void drain() {
    now += 1000.0;
    ledger.tick(now, out);
    deliver();
    for (ps::worker_id w = 0; w < ids; ++w)
      if (ledger.state(w) != live) join(w, procs[w].incarnation + 1);
    verify();
    const std::uint64_t target = ledger.epoch() + 1;
    for (int round = 0; round < 100000 && ledger.epoch() < target && !ledger.finished(); ++round) {
      const ps::worker_id w = static_cast<ps::worker_id>(round % ids);
      const std::uint64_t k = queued(procs[w]);
      train(w, k);
      require_ok(ledger.commit(w, k, procs[w].cycle, now, out));
      deliver();
      verify();
    }
    BOOST_REQUIRE_MESSAGE(ledger.epoch() >= target || ledger.finished(),
                          "epoch " << ledger.epoch() << " never completed: positions were lost");
    result.bytes = bytes_of(ledger);
    result.epochs = ledger.stats().epochs_completed;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(every_position_of_each_epoch_is_used_once_over_200_random_sequences) {
  std::uint64_t epochs = 0, returned = 0, resent = 0, expiries = 0, overrun = 0;
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    BOOST_TEST_CONTEXT("seed " << seed) {
      sequence s(seed);
      s.run(600);
      s.drain();
      epochs += s.result.epochs;
      returned += s.ledger.stats().leases_returned;
      resent += s.ledger.stats().leases_resent;
      expiries += s.ledger.stats().expiries;
      overrun += s.ledger.stats().overrun;
    }
  }
  // The sequences did what they are for: epochs completed through every kind of give-back.
  BOOST_TEST_MESSAGE("epochs " << epochs << ", leases returned " << returned << ", resent " << resent
                               << ", expiries " << expiries << ", overrun " << overrun);
  BOOST_TEST(epochs >= 400u);
  BOOST_TEST(returned > 0u);
  BOOST_TEST(resent > 0u);
  BOOST_TEST(expiries > 0u);
  BOOST_TEST(overrun > 0u);
}

BOOST_AUTO_TEST_CASE(a_ledger_saved_and_loaded_mid_sequence_continues_identically) {
  for (std::uint64_t seed : {3u, 17u, 99u}) {
    sequence straight(seed);
    straight.run(600);
    straight.drain();
    sequence reloaded(seed);
    reloaded.run(600, 300);
    reloaded.drain();
    BOOST_TEST((reloaded.result.log == straight.result.log), "seed " << seed);
    BOOST_TEST((reloaded.result.bytes == straight.result.bytes), "seed " << seed);
    BOOST_TEST(straight.result.log.size() > 50u);
  }
}

// ------------------------------------------------------------ allocation

BOOST_AUTO_TEST_CASE(no_allocation_per_event_after_warm_up) {
  constexpr ps::worker_id ids = 6;
  auto l = make({.samples = 997, .ahead = 2, .give_back_after = 3.0});
  ps::ledger_sink out;
  std::mt19937_64 rng(5);
  auto pick = [&](std::uint64_t k) { return std::uniform_int_distribution<std::uint64_t>(0, k - 1)(rng); };
  std::array<std::uint64_t, ids> incarnation{};
  double now = 0.0;
  // Commits of random sizes and plans, evictions with rejoins in time and
  // too late, leaves, restarts and ticks, all on workers that joined once.
  auto step = [&] {
    now += 0.25;
    const ps::worker_id w = static_cast<ps::worker_id>(pick(ids));
    const std::uint64_t r = pick(100);
    const std::uint64_t cycle = 1 + pick(16);
    ashl::status s;
    switch (l.state(w)) {
      case live:
        if (r < 85) s = l.commit(w, pick(l.unused(w) + 3), cycle, now, out);
        else if (r < 92) l.evict(w, now, out);
        else if (r < 96) s = l.leave(w, now, out);
        else s = l.join(w, ++incarnation[w], cycle, now, out);
        break;
      case suspended:
      case gone:
        if (r < 30) s = l.join(w, incarnation[w], cycle, now, out);
        else l.tick(now, out);
        break;
      default: s = l.join(w, 0, cycle, now, out);
    }
    BOOST_REQUIRE(s.ok());
    out.clear();
  };
  for (int i = 0; i < 5000; ++i) step();
  BOOST_REQUIRE(l.known_workers() == ids);
  const std::uint64_t epochs = l.stats().epochs_completed;
  const std::size_t before = counting_new::count();
  for (int i = 0; i < 20000; ++i) step();
  const std::size_t n = counting_new::count() - before;
  BOOST_TEST(n == 0u, n << " allocations in 20000 events after warm-up");
  BOOST_TEST(l.stats().epochs_completed > epochs + 5);
  require_ok(l.check());
}

BOOST_AUTO_TEST_CASE(the_counter_counts) {
  const std::size_t before = counting_new::count();
  auto* v = new std::vector<int>(100);
  BOOST_TEST(counting_new::count() > before);
  delete v;
}
