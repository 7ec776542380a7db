// rules/core_events.hpp: a server_core driven through recorded_core, each
// record encoded, decoded and replayed into a fresh core, leaves that core
// equal to the first (save() bytes, at points along the way and at the end,
// and the actions of every event), for every policy of rules/policies.hpp
// (test/support/ps_policy_cases.hpp), under a seeded random sequence of
// joins, rejoins, restarts, stale joins, commits (dense and compressed,
// duplicates, and refused ones: sequence 0, another incarnation, another
// size, a NaN, too many samples, unknown workers), pulls, metrics,
// measurements (some refused), evictions, leaves and drains; also a replica
// that starts from the primary's save() a third of the way in, and the
// whole log replayed into a fresh core at the end. The same with
// apply threads, batched applies and applies as parts land on the
// primary's side only, and with apply threads on the replaying side only;
// and with the data ledger on (docs/elastic.md §3: joins with a batch,
// ticks, leases out in the actions, the ledger in save()).
// Corrupt record bytes are refused naming the field, and the replaying
// core is unchanged; encode, decode and replay allocate nothing once warm.
#include <ashl/rules/core_events.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/core_event_script.hpp"
#include "../support/counting_new.hpp"
#include "../support/ps_policy_cases.hpp"

#include <ashl/compress/cast.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/rules/apply_pool.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/rules/server_core.hpp>
#include <ashl/wire/crc32c.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace core_script;  // ps, as, core_t, workers, seed, value, saved, side, make_side, events, call

bool same_actions(const ps::server_actions& a, const ps::server_actions& b) {
  if (a.steps() != b.steps() || !std::ranges::equal(a.pull_replies(), b.pull_replies()) ||
      !std::ranges::equal(a.plans(), b.plans()) || !std::ranges::equal(a.leases(), b.leases()) ||
      a.errors().size() != b.errors().size())
    return false;
  for (std::size_t i = 0; i < a.errors().size(); ++i) {
    const auto &x = a.errors()[i], &y = b.errors()[i];
    if (x.worker != y.worker || x.code != y.code || x.in_reply_to != y.in_reply_to || x.reason != y.reason ||
        x.text != y.text)
      return false;
  }
  return true;
}

struct setup {
  const char* what;
  std::size_t n;
  unsigned primary_threads;
  std::uint32_t primary_batch;  // >= 2: batched applies, payloads kept, applies as parts land
  std::vector<unsigned> replica_threads;
  // Also: a replica that starts from the primary's save() a third of the
  // way in (a backup's catch-up, docs/elastic.md §4.2), and the whole log
  // of records replayed at the end into a fresh core (the chaos test's
  // replay). The log keeps every record: small shards only.
  bool snapshot_and_log = false;
  ps::ledger_params ledger{};  // samples > 0: the data ledger on (every side)
};

// What the primary's driver choices did over a run.
// What a run did: the primary's counters (summed over a sweep) and what its
// driver choices did.
struct run_counts {
  ps::counters core{};
  ps::ledger_stats ledger{};
  std::uint64_t leases_out = 0;  // leases in the primary's actions
  std::uint64_t batched_commits = 0, applied_as_landed = 0, pooled = 0;
  void add(const run_counts& o) {
    const auto sum = [](auto& a, const auto& b) { a += b; };
    sum(core.commits_applied, o.core.commits_applied);
    sum(core.commits_buffered, o.core.commits_buffered);
    sum(core.duplicates, o.core.duplicates);
    sum(core.joins, o.core.joins);
    sum(core.evictions, o.core.evictions);
    sum(core.leaves, o.core.leaves);
    sum(core.pulls_held, o.core.pulls_held);
    for (std::size_t r = 0; r < core.refused.size(); ++r) core.refused[r] += o.core.refused[r];
    ledger.leases_granted += o.ledger.leases_granted;
    ledger.leases_resent += o.ledger.leases_resent;
    ledger.leases_returned += o.ledger.leases_returned;
    ledger.expiries += o.ledger.expiries;
    ledger.epochs_completed += o.ledger.epochs_completed;
    leases_out += o.leases_out;
    batched_commits += o.batched_commits;
    applied_as_landed += o.applied_as_landed;
    pooled += o.pooled;
  }
};

// The sweep exercised what it claims (else equal states would prove little).
void check_coverage(const run_counts& t) {
  const ps::counters& st = t.core;
  BOOST_TEST(st.commits_applied > 0u);
  BOOST_TEST(st.commits_buffered > 0u);
  BOOST_TEST(st.duplicates > 0u);
  BOOST_TEST(st.joins > 0u);
  BOOST_TEST(st.evictions > 0u);
  BOOST_TEST(st.leaves > 0u);
  BOOST_TEST(st.pulls_held > 0u);
  for (ps::refusal r : {ps::refusal::unknown_worker, ps::refusal::not_live, ps::refusal::incarnation,
                        ps::refusal::sequence, ps::refusal::element_count, ps::refusal::measurement,
                        ps::refusal::non_finite, ps::refusal::samples}) {
    BOOST_TEST_INFO("refusal " << ps::to_string(r));
    BOOST_TEST(st.refused_for(r) > 0u);
  }
}

// One policy case under `n_events` events: the primary through recorded_core,
// every record through its bytes into each replica.
run_counts run_case(const ps_cases::policy_case& c, std::size_t variant, const setup& su, int n_events,
              std::uint32_t rng_seed) {
  run_counts fp;
  BOOST_TEST_CONTEXT(su.what << ", " << c.label << (variant % 2 == 0 ? "" : " (sgd)")) {
    const bool extras = su.primary_batch >= 2;
    side primary = make_side(c, variant, su.n, su.primary_threads, su.primary_batch, su.ledger);
    std::vector<side> replicas;
    for (unsigned t : su.replica_threads) replicas.push_back(make_side(c, variant, su.n, t, 1, su.ledger));
    std::vector<ps::server_actions> replica_out(replicas.size(), ps::server_actions(workers + 2));
    ps::server_actions out(workers + 2);
    std::vector<std::byte> bytes;
    ps::core_event decoded;
    std::uint64_t records = 0, replay_failures = 0;
    std::optional<side> late;  // from a snapshot
    ps::server_actions late_out(workers + 2);
    std::vector<std::vector<std::byte>> log;
    auto rc = ps::recorded_core(*primary.core, [&](const ps::core_event& e) {
      ps::encode_core_event(e, bytes);
      ++records;
      if (!ps::decode_core_event(bytes, decoded).ok()) {
        ++replay_failures;
        return;
      }
      for (std::size_t k = 0; k < replicas.size(); ++k) ps::replay(*replicas[k].core, decoded, replica_out[k]);
      if (late) ps::replay(*late->core, decoded, late_out);
      if (su.snapshot_and_log) log.push_back(bytes);
    });

    events ev(su.n, rng_seed, extras, su.ledger.samples > 0);
    std::vector<std::byte> first_state;
    std::uint64_t action_mismatches = 0, state_checks = 0, speculated = 0;
    auto check_states = [&](int at) {
      const auto p = saved(*primary.core);
      for (std::size_t k = 0; k < replicas.size(); ++k) {
        BOOST_TEST_INFO("replica " << k << " after " << at << " events");
        BOOST_TEST((saved(*replicas[k].core) == p));
      }
      ++state_checks;
      if (first_state.empty()) first_state = p;
    };
    for (int i = 0; i < n_events; ++i) {
      if (su.snapshot_and_log && i == n_events / 3) {
        late.emplace(make_side(c, variant, su.n, 1, 1, su.ledger));
        const auto snapshot = saved(*primary.core);
        ashl::state_reader in(snapshot);
        const ashl::status loaded = late->core->load(in);
        BOOST_REQUIRE_MESSAGE(loaded.ok(), loaded.to_string());
      }
      if (extras && ev.reuses_ring()) primary.core->apply_pending();  // the kept payloads are about to be reused
      const ps::core_event e = ev.next();
      if (extras && ev.speculable() && i % 3 == 0) {  // the commit's halves land one after the other
        const std::size_t half = su.n / 2;
        const ps::commit_in& c = ev.last_commit();
        if (primary.core->speculate(c, 0, half) && primary.core->speculate(c, half, su.n)) ++speculated;
      }
      call(rc, e, ev.last_commit(), out);
      if (!same_actions(out, replica_out[0])) ++action_mismatches;
      fp.leases_out += out.leases().size();
      if (late && !same_actions(out, late_out)) ++action_mismatches;
      out.clear();
      late_out.clear();
      for (auto& o : replica_out) o.clear();
      if (i == 100 || i == n_events / 2) check_states(i);
    }
    check_states(n_events);
    rc.drain(out);
    check_states(n_events + 1);
    if (su.snapshot_and_log) {
      const auto p = saved(*primary.core);
      BOOST_TEST_INFO("the replica started from a snapshot after " << n_events / 3 << " events");
      BOOST_TEST((saved(*late->core) == p));
      side fresh = make_side(c, variant, su.n, 1, 1, su.ledger);
      ps::server_actions ignored(workers + 2);
      for (const auto& b : log) {
        ps::core_event e;
        BOOST_REQUIRE(ps::decode_core_event(b, e).ok());
        ps::replay(*fresh.core, e, ignored);
        ignored.clear();
      }
      BOOST_TEST_INFO("a fresh core fed the whole log of " << log.size() << " records at the end");
      BOOST_TEST((saved(*fresh.core) == p));
      BOOST_TEST(log.size() == records);
    }

    BOOST_TEST(records == static_cast<std::uint64_t>(n_events) + 1);
    BOOST_TEST(replay_failures == 0u);
    BOOST_TEST(action_mismatches == 0u);
    BOOST_TEST(state_checks == 4u);
    BOOST_TEST(primary.core->stats().commits_applied > 0u);
    BOOST_TEST((saved(*primary.core) != first_state));  // the state moved after the first check
    fp.core = primary.core->stats();
    fp.ledger = primary.core->ledger().stats();
    BOOST_TEST(primary.core->ledger().check().ok());
    fp.batched_commits = primary.core->batched_commits();
    fp.applied_as_landed = primary.core->applied_as_landed();
    fp.pooled = primary.core->apply_pool_in_use() != nullptr ? 1 : 0;
    BOOST_TEST(primary.core->applied_as_landed() <= speculated);
  }
  return fp;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_policy_replayed_from_its_records_saves_the_same_bytes) {
  const auto cases = ps_cases::every_policy(workers);
  BOOST_REQUIRE(cases.size() >= ps::policies.size());
  const setup plain{"plain", 257, 1, 1, {1}, true};
  run_counts total;
  for (std::size_t i = 0; i < cases.size(); ++i)
    total.add(run_case(cases[i], i, plain, 700, 100 + static_cast<std::uint32_t>(i)));
  check_coverage(total);
  BOOST_TEST(total.leases_out == 0u);  // no ledger: no lease
}

// The data ledger on (server 0's core): its leases are actions the replica
// makes alike, its state is part of save(), ticks are records; the run
// grants, resends at rejoins, gives back (leaves, restarts, expiries after
// give_back_after) and completes epochs.
BOOST_AUTO_TEST_CASE(every_policy_with_the_data_ledger_on_replays_bit_for_bit) {
  const auto cases = ps_cases::every_policy(workers);
  setup with_ledger{"ledger", 129, 1, 1, {1}, true};
  with_ledger.ledger = {.samples = 997, .shuffle_seed = 11, .lease_samples = 0, .ahead = 1, .give_back_after = 2.0};
  run_counts total;
  for (std::size_t i = 0; i < cases.size(); ++i)
    total.add(run_case(cases[i], i, with_ledger, 700, 300 + static_cast<std::uint32_t>(i)));
  check_coverage(total);
  BOOST_TEST(total.leases_out > 0u);
  BOOST_TEST(total.ledger.leases_granted > 0u);
  BOOST_TEST(total.ledger.leases_resent > 0u);
  BOOST_TEST(total.ledger.leases_returned > 0u);
  BOOST_TEST(total.ledger.expiries > 0u);
  BOOST_TEST(total.ledger.epochs_completed > 0u);
}

BOOST_AUTO_TEST_CASE(apply_threads_and_batched_applies_on_one_side_only_change_nothing) {
  // A shard large enough that a pool of 3 runs its passes in parts (2 x
  // min_part_elements) and a dense commit spans several apply chunks; the
  // primary applies with 3 threads, batches of 4 and applies as parts land,
  // one replica plainly, another with 2 threads.
  const auto cases = ps_cases::every_policy(workers);
  const setup fast{"primary with threads and batches", 2 * core_t::min_part_elements + 37, 3, 4, {1, 2}};
  run_counts total;
  for (std::size_t i = 0; i < cases.size(); ++i)
    total.add(run_case(cases[i], i, fast, 500, 200 + static_cast<std::uint32_t>(i)));
  check_coverage(total);
  // The primary's fast paths did run (some policies buffer every commit for
  // a round, and sgd never batches: the sweep as a whole must use them).
  BOOST_TEST(total.pooled == cases.size());
  BOOST_TEST(total.batched_commits > 0u);
  BOOST_TEST(total.applied_as_landed > 0u);
}

namespace {

// A few records of each shape, as encoded bytes.
struct recorded {
  std::string what;
  std::vector<std::byte> bytes;
};

std::vector<recorded> sample_records(std::span<const std::byte> payload, std::size_t n) {
  std::vector<recorded> out;
  auto add = [&](std::string what, const ps::core_event& e) {
    recorded r{std::move(what), {}};
    ps::encode_core_event(e, r.bytes);
    out.push_back(std::move(r));
  };
  add("commit", ps::core_event::of_commit({.worker = 1, .incarnation = 0, .sequence = 1, .clock = 1, .samples = 16,
                                           .bytes = payload.size() + 72, .element_count = n, .step = 1,
                                           .payload = payload, .pull = true},
                                          1.5));
  add("join", ps::core_event::of_join(4, 3, 2.0));
  add("pull", ps::core_event::of_pull(2, 2.5));
  add("metric", ps::core_event::of_metric(ashl::metric_id::loss, 0.75, 3.0));
  add("measurement", ps::core_event::of_measurement({.worker = 0, .kind = ashl::measurement_kind::compute,
                                                     .seconds = 0.01, .amount = 32.0, .time = 3.5}));
  add("evict", ps::core_event::of_evict(3, 4.0));
  add("leave", ps::core_event::of_leave(0, 4.5));
  add("drain", ps::core_event::of_drain());
  add("tick", ps::core_event::of_tick(5.0));
  return out;
}

template <class T>
void put_at(std::vector<std::byte>& b, std::size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));  // little-endian hosts (the test's; the library's writer swaps)
}
// A field rewritten with the prefix's CRC made right again: the record
// passes its CRC and must be refused by the field's own rule.
template <class T>
std::vector<std::byte> with_field(std::vector<std::byte> b, std::size_t at, T v) {
  put_at(b, at, v);
  put_at(b, 116, ashl::wire::crc32c(std::span<const std::byte>(b.data(), 116)));
  return b;
}

}  // namespace

BOOST_AUTO_TEST_CASE(records_round_trip_field_for_field) {
  std::vector<std::byte> payload(4 * 10);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 7);
  ps::commit_in c{.worker = 5, .incarnation = 9, .sequence = 11, .clock = 12, .samples = 13, .bytes = 14,
                  .codec = codec_id::qsgd, .type = ashl::dtype::bf16, .element_count = 10, .step = 15, .tensor = 16,
                  .payload = payload, .pull = true, .ack_only = true, .reply_unchecked = false,
                  .values_checked = true, .payload_kept = true};
  const ps::core_event e = ps::core_event::of_commit(c, 17.25);
  std::vector<std::byte> b;
  ps::encode_core_event(e, b);
  BOOST_TEST(b.size() == ps::core_event_prefix_bytes + payload.size());
  BOOST_TEST(ps::core_event_bytes(e) == b.size());
  // The prefix's first bytes as the header documents them.
  const std::array<unsigned char, 8> head{'A', 'C', 'E', 'V', 1, 0, 4, 3};
  BOOST_TEST(std::memcmp(b.data(), head.data(), head.size()) == 0);
  ps::core_event d;
  BOOST_REQUIRE(ps::decode_core_event(b, d).ok());
  BOOST_TEST((d.kind == ps::core_event_kind::commit));
  BOOST_TEST(d.now == 17.25);
  BOOST_TEST(d.commit.worker == 5u);
  BOOST_TEST(d.commit.incarnation == 9u);
  BOOST_TEST(d.commit.sequence == 11u);
  BOOST_TEST(d.commit.clock == 12u);
  BOOST_TEST(d.commit.samples == 13u);
  BOOST_TEST(d.commit.bytes == 14u);
  BOOST_TEST((d.commit.codec == codec_id::qsgd));
  BOOST_TEST((d.commit.type == ashl::dtype::bf16));
  BOOST_TEST(d.commit.element_count == 10u);
  BOOST_TEST(d.commit.step == 15u);
  BOOST_TEST(d.commit.tensor == 16u);
  BOOST_TEST(d.commit.pull);
  BOOST_TEST(d.commit.ack_only);
  BOOST_TEST(!d.commit.reply_unchecked);
  BOOST_TEST(!d.commit.values_checked);  // the driver's facts are not recorded
  BOOST_TEST(!d.commit.payload_kept);
  BOOST_TEST(d.commit.payload.data() == b.data() + ps::core_event_prefix_bytes);  // a view, not a copy
  BOOST_TEST(std::ranges::equal(d.commit.payload, payload));

  // The prefix alone, with the payload sent from where it lies: the same bytes.
  std::array<std::byte, ps::core_event_prefix_bytes> prefix{};
  ps::encode_core_event_prefix(e, prefix);
  BOOST_TEST(std::memcmp(prefix.data(), b.data(), prefix.size()) == 0);

  const ashl::measurement m{.worker = 3, .kind = ashl::measurement_kind::pull, .seconds = 0.25, .amount = 4096.0,
                            .time = 8.5};
  ps::encode_core_event(ps::core_event::of_measurement(m), b);
  BOOST_REQUIRE(ps::decode_core_event(b, d).ok());
  BOOST_TEST((d.kind == ps::core_event_kind::measurement));
  BOOST_TEST((d.measurement == m));
  BOOST_TEST(d.now == 8.5);
  ps::encode_core_event(ps::core_event::of_metric(static_cast<ashl::metric_id>(2000), -1.0, 9.0), b);
  BOOST_REQUIRE(ps::decode_core_event(b, d).ok());
  BOOST_TEST((d.kind == ps::core_event_kind::metric && d.metric == static_cast<ashl::metric_id>(2000)));
  BOOST_TEST(d.value == -1.0);
  ps::encode_core_event(ps::core_event::of_join(7, 42, 10.0), b);
  BOOST_REQUIRE(ps::decode_core_event(b, d).ok());
  BOOST_TEST((d.kind == ps::core_event_kind::join && d.worker == 7u && d.incarnation == 42u && d.now == 10.0));
  BOOST_TEST(d.batch == 0u);
  BOOST_TEST(b.size() == ps::core_event_prefix_bytes);
  // A join's batch (the data ledger's lease size) rides in the samples field.
  ps::encode_core_event(ps::core_event::of_join(7, 42, 10.0, 96), b);
  std::uint64_t at48 = 0;
  std::memcpy(&at48, b.data() + 48, 8);
  BOOST_TEST(at48 == 96u);
  BOOST_REQUIRE(ps::decode_core_event(b, d).ok());
  BOOST_TEST(d.batch == 96u);
  ps::encode_core_event(ps::core_event::of_tick(11.5), b);
  BOOST_TEST(static_cast<unsigned>(b[6]) == 9u);
  BOOST_REQUIRE(ps::decode_core_event(b, d).ok());
  BOOST_TEST((d.kind == ps::core_event_kind::tick && d.now == 11.5 && d.worker == 0u));
}

BOOST_AUTO_TEST_CASE(corrupt_records_refused_by_name_and_the_replaying_core_unchanged) {
  constexpr std::size_t n = 64;
  core_t core = make_ssp_core(n);
  std::vector<float> g(n, 0.25f);
  const auto payload = std::as_bytes(std::span<const float>(g));
  const auto records = sample_records(payload, n);
  ps::server_actions out(workers + 2);
  const auto before = saved(core);

  // Receives one record: decoded, then replayed only when it decoded.
  auto receive = [&](std::span<const std::byte> bytes) -> ashl::status {
    ps::core_event e;
    ASHL_TRY(ps::decode_core_event(bytes, e));
    ps::replay(core, e, out);
    return {};
  };
  struct bad {
    std::string what, field;
    std::vector<std::byte> bytes;
  };
  std::vector<bad> bads;
  for (const auto& r : records) {
    const auto& b = r.bytes;
    bads.push_back({r.what + " truncated to its first 100 bytes", "core_event.size", {b.begin(), b.begin() + 100}});
    bads.push_back({r.what + " empty", "core_event.size", {}});
    auto m = b;
    m[0] = std::byte{'X'};
    bads.push_back({r.what + " with another magic", "core_event.magic", m});
    bads.push_back({r.what + " of version 2", "core_event.version", with_field<std::uint16_t>(b, 4, 2)});
    for (std::size_t at : {6u, 9u, 17u, 30u, 60u, 90u, 110u, 113u, 117u}) {
      auto f = b;
      f[at] ^= std::byte{0x10};
      bads.push_back({r.what + " with a bit flipped at byte " + std::to_string(at), "core_event.prefix_crc", f});
    }
    bads.push_back({r.what + " of kind 12", "core_event.kind", with_field<std::uint8_t>(b, 6, 12)});
    bads.push_back({r.what + " of kind 0 (a snapshot)", "core_event.kind", with_field<std::uint8_t>(b, 6, 0)});
    bads.push_back({r.what + " of kind 10", "core_event.kind", with_field<std::uint8_t>(b, 6, 10)});
    bads.push_back({r.what + " with flag bit 3", "core_event.flags", with_field<std::uint8_t>(b, 7, 8)});
    bads.push_back({r.what + " with a reserved byte set", "core_event.reserved", with_field<std::uint8_t>(b, 83, 1)});
    auto longer = b;
    longer.push_back(std::byte{0});
    bads.push_back({r.what + " with a byte appended", "core_event.payload_bytes", longer});
  }
  // The fields a kind does not use, each set on a record that does not use it.
  const auto& join = records[1].bytes;
  const auto& drain = records[7].bytes;
  const auto& metric = records[3].bytes;
  bads.push_back({"join with a sequence", "core_event.sequence", with_field<std::uint64_t>(join, 32, 5)});
  bads.push_back({"join with a payload length", "core_event.payload_bytes", with_field<std::uint64_t>(join, 104, 1)});
  bads.push_back({"join with a codec", "core_event.codec", with_field<std::uint8_t>(join, 80, 3)});
  bads.push_back({"metric with a worker", "core_event.worker", with_field<std::uint32_t>(metric, 16, 2)});
  bads.push_back({"metric with an amount", "core_event.amount", with_field<double>(metric, 96, 1.0)});
  bads.push_back({"drain with a time", "core_event.now", with_field<double>(drain, 8, 2.0)});
  bads.push_back({"drain with an incarnation", "core_event.incarnation", with_field<std::uint64_t>(drain, 24, 1)});
  const auto& tick = records[8].bytes;
  bads.push_back({"tick with a worker", "core_event.worker", with_field<std::uint32_t>(tick, 16, 1)});
  bads.push_back({"tick with samples", "core_event.samples", with_field<std::uint64_t>(tick, 48, 1)});
  bads.push_back({"join with a batch past u32", "core_event.samples",
                  with_field<std::uint64_t>(join, 48, std::uint64_t{1} << 32)});
  // A commit's payload: cut short (its length then disagrees) or changed.
  const auto& commit = records[0].bytes;
  bads.push_back({"commit missing its last payload byte", "core_event.payload_bytes",
                  {commit.begin(), commit.end() - 1}});
  auto flipped = commit;
  flipped[ps::core_event_prefix_bytes + 5] ^= std::byte{1};
  bads.push_back({"commit with a payload bit flipped", "core_event.payload_crc", flipped});
  auto stale_crc = commit;
  put_at<std::uint32_t>(stale_crc, 112, 0);
  bads.push_back({"commit with a payload CRC of 0", "core_event.prefix_crc", stale_crc});
  bads.push_back({"commit with its payload CRC changed and the prefix CRC made right", "core_event.payload_crc",
                  with_field<std::uint32_t>(commit, 112, 1234)});

  for (const auto& x : bads) {
    BOOST_TEST_CONTEXT(x.what) {
      ps::core_event sentinel = ps::core_event::of_join(3, 77, 1.0), d = sentinel;
      const ashl::status s = ps::decode_core_event(x.bytes, d);
      BOOST_TEST(!s.ok());
      BOOST_CHECK_MESSAGE(s.message().rfind(x.field + " = ", 0) == 0, s.message() << " (expected " << x.field << ")");
      BOOST_TEST((d.kind == sentinel.kind && d.worker == 3u && d.incarnation == 77u));  // unchanged
      BOOST_TEST(!receive(x.bytes).ok());
    }
  }
  BOOST_TEST((saved(core) == before));
  BOOST_TEST(out.empty());
  // The same records uncorrupted replay, and change the core.
  for (const auto& r : records) BOOST_CHECK_MESSAGE(receive(r.bytes).ok(), r.what);
  BOOST_TEST((saved(core) != before));
}

BOOST_AUTO_TEST_CASE(recording_encoding_decoding_and_replaying_allocate_nothing_once_warm) {
  constexpr std::size_t n = 1000;
  core_t primary = make_ssp_core(n), replica = make_ssp_core(n);
  ps::server_actions out(workers), replica_out(workers);
  std::vector<std::byte> bytes;
  ps::core_event decoded;
  std::uint64_t failures = 0;
  auto rc = ps::recorded_core(primary, [&](const ps::core_event& e) {
    ps::encode_core_event(e, bytes);
    if (!ps::decode_core_event(bytes, decoded).ok()) {
      ++failures;
      return;
    }
    ps::replay(replica, decoded, replica_out);
  });
  std::vector<float> g(n);
  std::vector<std::uint64_t> seq(workers, 0);
  // Valid events of live workers only: what the core itself does without
  // allocating once warm (refusals build their error texts).
  auto step = [&](int i) {
    const auto w = static_cast<as::worker_id>(i % workers);
    const double now = 0.01 * i;
    for (std::size_t k = 0; k < n; ++k) g[k] = value(w, seq[w] + 1, k);
    if (i % 5 == 4) {
      rc.measurement({.worker = w, .kind = ashl::measurement_kind::compute, .seconds = 0.01, .amount = 32.0,
                      .time = now},
                     out);
    } else if (i % 7 == 6) {
      rc.metric(ashl::metric_id::loss, 1.0 / (1.0 + now), now, out);
    } else {
      ++seq[w];
      rc.commit({.worker = w, .sequence = seq[w], .clock = seq[w], .samples = 16, .bytes = 4 * n + 72,
                 .element_count = n, .step = seq[w], .payload = std::as_bytes(std::span<const float>(g)),
                 .pull = i % 2 == 0},
                now, out);
    }
    out.clear();
    replica_out.clear();
  };
  int i = 0;
  for (; i < 200; ++i) step(i);  // warm: every buffer at its working size
  const std::size_t before = counting_new::count();
  for (; i < 600; ++i) step(i);
  BOOST_TEST(counting_new::count() == before);
  BOOST_TEST(failures == 0u);
  BOOST_TEST(primary.stats().commits_applied > 300u);
  BOOST_TEST((saved(primary) == saved(replica)));
}

// Wire version 6 (docs/elastic.md §4.2): a replicate message carries these
// records as they are, behind its own prefix. Every kind of record goes
// through a message and back, whole and in pieces, and decodes to the
// same event; a piece whose event disagrees with its record is refused by
// the wire before decode_core_event sees it.
BOOST_AUTO_TEST_CASE(records_travel_in_wire_replicate_messages) {
  namespace w = ashl::wire;
  std::vector<std::byte> payload(4 * 300);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 13);
  const ps::commit_in c{.worker = 2, .incarnation = 3, .sequence = 4, .clock = 5, .samples = 6, .bytes = 1272,
                        .codec = codec_id::identity, .type = ashl::dtype::f32, .element_count = 300, .step = 7,
                        .tensor = 0, .payload = payload, .pull = true};
  const ps::core_event events[] = {
      ps::core_event::of_join(1, 9, 1.5),
      ps::core_event::of_commit(c, 2.5),
      ps::core_event::of_metric(ashl::metric_id::loss, 0.75, 3.5),
      ps::core_event::of_measurement({.worker = 1, .kind = ashl::measurement_kind::compute, .seconds = 0.5,
                                      .amount = 16, .time = 4.5}),
      ps::core_event::of_leave(1, 5.5),
      ps::core_event::of_evict(2, 6.5),
      ps::core_event::of_pull(1, 7.5),
      ps::core_event::of_drain(),
      ps::core_event::of_tick(8.5),  // a record like the others: its now is the primary's clock
  };
  std::vector<std::byte> record, message, whole;
  for (const ps::core_event& e : events) {
    ps::encode_core_event(e, record);
    // Whole: one message.
    const w::replicate_body body{.event = static_cast<w::replica_event>(e.kind), .version_after = 11, .offset = 0,
                                 .total = record.size(), .record = record};
    message.assign(w::encoded_size(body), std::byte{0});
    const auto n = w::encode(w::header{.rank = 1, .sequence = 100, .clock = 1}, body, message);
    BOOST_TEST_REQUIRE(n.has_value(), (n ? "" : n.error().message()));
    const auto m = w::decode(message, w::limits{});
    BOOST_TEST_REQUIRE(m.has_value(), (m ? "" : m.error().message()));
    const auto* got = m->get<w::replicate_body>();
    BOOST_TEST_REQUIRE(got != nullptr);
    ps::core_event d;
    BOOST_TEST_REQUIRE(ps::decode_core_event(got->record, d).ok());
    BOOST_TEST((d.kind == e.kind));
    BOOST_TEST(d.now == e.now);
    // In pieces of 128 bytes (the first holds the 120-byte prefix), put back
    // together by offset: the same record.
    whole.assign(record.size(), std::byte{0});
    for (std::size_t at = 0; at < record.size(); at += 128) {
      const std::size_t k = std::min<std::size_t>(128, record.size() - at);
      const w::replicate_body piece{.event = body.event, .offset = at, .total = record.size(),
                                    .record = std::span<const std::byte>(record).subspan(at, k)};
      message.assign(w::encoded_size(piece), std::byte{0});
      BOOST_TEST_REQUIRE(w::encode(w::header{}, piece, message).has_value());
      const auto pm = w::decode(message, w::limits{});
      BOOST_TEST_REQUIRE(pm.has_value(), (pm ? "" : pm.error().message()));
      const auto* p = pm->get<w::replicate_body>();
      std::memcpy(whole.data() + p->offset, p->record.data(), p->record.size());
    }
    BOOST_TEST((whole == record));
    // The event must be the record's kind.
    const w::replicate_body wrong{.event = e.kind == ps::core_event_kind::join ? w::replica_event::leave : w::replica_event::join,
                                  .total = record.size(), .record = record};
    message.assign(w::encoded_size(wrong), std::byte{0});
    const auto r = w::encode(w::header{}, wrong, message);
    BOOST_TEST_REQUIRE(!r.has_value());
    BOOST_TEST(r.error().message().rfind("replicate.record_kind = ", 0) == 0u, r.error().message());
  }
  ps::core_event d;
  BOOST_TEST_REQUIRE(ps::decode_core_event(std::span<const std::byte>(whole), d).ok());  // the last record, put together
  BOOST_TEST((d.kind == ps::core_event_kind::tick));
}
