#include <ashl/ps/server.hpp>

#include <cstdio>

// The chaos test, its first half (docs/elastic.md §5, E12a): an elastic job
// of real ashl_test_ps_node processes (test/support/fault_job.hpp) under a
// seeded schedule of faults: two workers SIGKILLed and restarted as new
// incarnations, one SIGKILLed for good, ranks 3 and 4 joining a job of 3
// initial workers (max_workers 5, BSP's min_workers 2), one worker leaving for
// good; run A (UCX/TCP on 127.0.0.1, BSP) also sends four joins that must be
// refused by name before the core: rank 5 past the maximum, another job
// name, another model size, a wrong token. The workers train a data set of
// N = 1024 sample ids over 3 epochs through server 0's data ledger (their
// positions from its leases; each writes the ids of every commit before
// sending it) on a quadratic, 4 samples per commit, rank 1 30 ms slower
// per iteration than the others (so under BSP a killed worker often has a
// commit in flight). Run B: shared memory, SSP(2), 2 shards. A replicated
// shard (run A's one, run B's shard 1; run B's shard 0 has no backup) runs
// with a backup (E11), and its primary is SIGKILLed once: the backup
// promotes on the workers' failover votes, and the killed primary, started
// again 2 s later, attaches to it as the new backup (E12b).
//
// Checks, per run:
// - every server's core is exactly the replay of its event log (every
//   record the server handed its core, --event-log) into a fresh core loaded
//   from the server's state at creation: the final state's bytes equal,
//   so the parameters are a fault-free replay of what was applied; for the
//   replicated shard, the promoted backup's log: from its snapshot (taken
//   before any worker joined), the records it applied as the backup, the
//   take-over's evictions, then its own calls as the primary;
// - per (rank, incarnation) and shard, the commits the core accepted (the
//   exactly-once table through the replay: sequences 1..A, none twice)
//   equal the commits the process was acknowledged, with at most one more
//   for a SIGKILLed incarnation (its commit in flight); commits lost = 0:
//   every acknowledged sequence is accepted;
// - each accepted commit of shard 0 used exactly the positions its
//   worker wrote (through the ledger's leases as replayed), no commit
//   trained past its leases, and every sample id of each of the 3 epochs
//   was used exactly once;
// - the quadratic's target is reached; every process ended as it should;
// - the replicated shard failed over once (term 2), a re-sent commit
//   dropped as a duplicate at most once per worker, and the restarted
//   primary was taken as the new backup;
// - one JSON line: kills survived, joins, leaves, refused joins by reason,
//   failovers and take-over times, commits lost, recovery times (from a
//   kill to every survivor's next acknowledged commit; from a restart or
//   join to its first).

#if !ASHL_HAS_UCX() || !defined(ASHL_TEST_PS_NODE)
int main() {
  std::puts("skipped: ps/chaos needs the ucx component (UCX and OpenSSL)");
  return 77;
}
#else

#include <boost/test/unit_test.hpp>

#include <ashl/core/state_io.hpp>
#include <ashl/rules/core_events.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/rules/server_core.hpp>

#include "../support/fault_job.hpp"
#include "../support/sample_ids.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

using namespace std::chrono_literals;
namespace ps = ashl::ps;
using fault_job::cat;

namespace {

constexpr std::uint32_t initial_workers = 3, max_workers = 5;
constexpr std::uint64_t samples = 1024, epochs = 3;
constexpr std::size_t elements = 64;
constexpr float target = 2.0f;

// ---- The schedule ----

enum class fault { join, kill_restart, kill, leave, kill_primary };
const char* name_of(fault f) {
  switch (f) {
    case fault::join: return "join";
    case fault::kill_restart: return "kill+restart";
    case fault::kill: return "kill";
    case fault::leave: return "leave";
    case fault::kill_primary: return "kill-primary";
  }
  return "?";
}
// SIGKILL a replicated shard's primary once (E12b): its backup promotes on
// the workers' failover votes (docs/elastic.md §4.5), and the killed
// primary is started again ~2 s later (once the promotion is in the
// backup's log) on its port, where it asks its peer first and attaches as
// the new backup. ASHL_CHAOS_PRIMARY_KILLS=0 runs the backups without the
// kill (E12a's schedule), to tell a failover's failure from the others'.
bool primary_kills() {
  const char* v = std::getenv("ASHL_CHAOS_PRIMARY_KILLS");
  return v == nullptr || std::string(v) != "0";
}
constexpr double primary_restart_after = 2.0;

struct event {
  double at = 0;  // seconds from the start of the schedule
  fault kind = fault::join;
  std::uint32_t rank = 0;
  double restart_after = 0;  // kill_restart
};

// Seeded: the kinds in a random order at jittered times over ~8 s, the
// ranks drawn among the live ones, such that at least min_workers (2) stay
// live at every step (a restarted rank counts again from its restart). The
// primary's kill comes in the first four slots (by ~4.8 s: run A's refused
// joins go to the promoted primary, well before the data is done) and
// never right after a worker's SIGKILL: a worker killed just before may
// still be live in the replicated state, and the backup promotes only on a
// majority of the live workers' votes.
std::vector<event> make_schedule(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<fault> kinds = {fault::join, fault::join, fault::kill_restart, fault::kill_restart, fault::kill, fault::leave};
  if (primary_kills()) kinds.push_back(fault::kill_primary);
  const double span = 8.0, gap = span / static_cast<double>(kinds.size());
  std::uniform_real_distribution<double> jitter(0.0, 0.3 * gap), restart(0.3, 0.8);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    std::shuffle(kinds.begin(), kinds.end(), rng);
    const auto kp = std::find(kinds.begin(), kinds.end(), fault::kill_primary);
    if (kp != kinds.end() &&
        (kp - kinds.begin() > 3 ||
         (kp != kinds.begin() && (*(kp - 1) == fault::kill || *(kp - 1) == fault::kill_restart))))
      continue;
    std::vector<event> out;
    std::vector<std::uint32_t> live = {0, 1, 2}, joinable = {3, 4};
    std::vector<std::pair<double, std::uint32_t>> back;  // (time, rank) restarts
    bool ok = true;
    for (std::size_t k = 0; k < kinds.size() && ok; ++k) {
      event e{.at = 1.0 + gap * static_cast<double>(k) + jitter(rng), .kind = kinds[k]};
      for (auto it = back.begin(); it != back.end();) {
        if (it->first <= e.at) {
          live.push_back(it->second);
          it = back.erase(it);
        } else {
          ++it;
        }
      }
      auto draw = [&](std::vector<std::uint32_t>& from) {
        const std::size_t i = std::uniform_int_distribution<std::size_t>(0, from.size() - 1)(rng);
        const std::uint32_t r = from[i];
        from.erase(from.begin() + static_cast<std::ptrdiff_t>(i));
        return r;
      };
      switch (e.kind) {
        case fault::join:
          e.rank = draw(joinable);
          live.push_back(e.rank);
          break;
        case fault::kill_restart:
          e.rank = draw(live);
          e.restart_after = restart(rng);
          back.emplace_back(e.at + e.restart_after, e.rank);
          break;
        case fault::kill:
        case fault::leave:
          e.rank = draw(live);
          break;
        case fault::kill_primary:
          break;
      }
      ok = live.size() >= 2;
      out.push_back(e);
    }
    // No worker process starts while the killed primary's address is dead
    // (from the kill to its restart as backup, 2 s, and a margin): a fresh
    // worker's create() does not fail over (docs/elastic.md §6 "What E12b
    // built").
    for (const event& k : out) {
      if (k.kind != fault::kill_primary) continue;
      const auto dead = [&](double t) { return t >= k.at - 0.1 && t <= k.at + primary_restart_after + 0.5; };
      for (const event& e : out)
        ok = ok && !(e.kind == fault::join && dead(e.at)) && !(e.kind == fault::kill_restart && dead(e.at + e.restart_after));
    }
    if (ok) return out;
  }
  return {};
}

// ---- The processes ----

struct proc {
  pid_t pid = -1;
  std::uint32_t rank = 0;
  std::size_t slot = 0;
  std::string log;
  double started = 0;
  bool killed = false, left = false;
  double gone_at = -1;  // when killed or told to leave
};

struct run_spec {
  std::string name;     // "A", "B"
  const char* tls;      // UCX_TLS
  std::string policy;   // "bsp", "ssp"
  std::uint32_t servers = 1;
  bool bad_joins = false;
  std::vector<bool> backups;     // per shard
  std::uint32_t killed_shard = 0;  // the replicated shard whose primary is killed
};

// min_workers is the round policies' (docs/elastic.md §2.4); SSP has
// none, and the schedule keeps 2 workers live in both runs.
std::vector<std::string> policy_args(const run_spec& r) {
  if (r.policy == "ssp") return {"--policy", "ssp", "--staleness", "2"};
  return {"--policy", r.policy, "--min-workers", "2"};
}

// ---- The replay of a server's event log ----

std::vector<std::byte> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}

using incarnation_key = std::pair<std::uint32_t, std::uint64_t>;  // (rank, incarnation)

struct accepted_commit {
  std::uint64_t sequence = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> positions;  // (epoch, position), shard 0
};

struct replayed {
  bool ok = false;
  std::string why;
  std::uint64_t records = 0;
  std::map<incarnation_key, std::vector<accepted_commit>> accepted;  // in order
  std::set<incarnation_key> joins;
  std::uint32_t max_rank_joined = 0;
  ps::ledger_stats ledger{};
  bool state_equal = false;
};

// `log`: the event log of the process that served shard `shard` last (a
// promoted backup's goes on from its first snapshot through its take-over).
replayed replay_log(const std::string& log, const run_spec& r, std::uint32_t shard) {
  replayed out;
  const std::vector<std::byte> initial = read_bytes(log + ".initial"), final_state = read_bytes(log + ".final"),
                               records = read_bytes(log);
  if (initial.empty() || final_state.empty()) {
    out.why = "no state files at " + log;
    return out;
  }
  ps::policy_params pp;
  pp.workers = initial_workers;
  pp.staleness = 2;
  pp.min_workers = 2;
  auto policy = ps::make_policy(r.policy, pp);
  auto layout = ps::shard_layout::even(elements, r.servers);
  if (!policy || !layout) {
    out.why = "policy or layout";
    return out;
  }
  const std::vector<float> zeros(layout->range(shard).size(), 0.0f);
  auto core = ps::server_core<>::create(
      {.layout = *layout, .shard = shard, .workers = initial_workers, .max_workers = max_workers}, std::move(*policy),
      zeros);
  if (!core) {
    out.why = core.error().message();
    return out;
  }
  ashl::state_reader in(initial);
  if (auto s = core->load(in); !s) {
    out.why = "load " + log + ".initial: " + s.to_string();
    return out;
  }
  ps::server_actions actions(max_workers);
  std::size_t at = 0;
  while (at < records.size()) {
    std::uint64_t n = 0;
    if (records.size() - at < sizeof n) {
      out.why = "a truncated length at byte " + std::to_string(at);
      return out;
    }
    std::memcpy(&n, records.data() + at, sizeof n);
    at += sizeof n;
    if (records.size() - at < n) {
      out.why = "a truncated record at byte " + std::to_string(at);
      return out;
    }
    const std::span<const std::byte> bytes(records.data() + at, n);
    at += n;
    ps::core_event e;
    if (auto s = ps::decode_core_event(bytes, e); !s) {
      out.why = "record " + std::to_string(out.records) + ": " + s.to_string();
      return out;
    }
    ++out.records;
    const std::uint32_t w = e.worker;
    if (e.kind == ps::core_event_kind::join) {
      out.joins.insert({w, e.incarnation});
      out.max_rank_joined = std::max(out.max_rank_joined, w);
    }
    std::vector<ashl::ps::ledger_lease> held;
    std::uint64_t before = 0;
    if (e.kind == ps::core_event_kind::commit) {
      const auto l = core->ledger().leases(w);
      held.assign(l.begin(), l.end());
      before = core->incarnation(w) == e.incarnation ? core->last_sequence(w) : 0;
    }
    ps::replay(*core, e, actions);
    actions.clear();
    if (e.kind == ps::core_event_kind::commit && core->incarnation(w) == e.incarnation &&
        core->last_sequence(w) == e.commit.sequence && e.commit.sequence > before) {
      accepted_commit c{.sequence = e.commit.sequence};
      std::uint64_t k = e.commit.samples;  // the ledger's cursor moves k positions through the leases held
      for (const auto& l : held) {
        for (std::uint64_t p = l.begin; p < l.end && k > 0; ++p, --k) c.positions.emplace_back(l.epoch, p);
        if (k == 0) break;
      }
      out.accepted[{w, e.incarnation}].push_back(std::move(c));
    }
  }
  core->apply_pending();
  std::vector<std::byte> saved;
  ashl::state_writer wr(saved);
  core->save(wr);
  out.state_equal = saved == final_state;
  out.ledger = core->ledger().stats();
  out.ok = true;
  return out;
}

// A worker's trained-id file: sequence -> (epoch, id) pairs, sorted.
std::map<std::uint64_t, std::vector<std::pair<std::uint64_t, std::uint64_t>>> read_trained(const std::string& path) {
  std::map<std::uint64_t, std::vector<std::pair<std::uint64_t, std::uint64_t>>> m;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::uint64_t seq = 0, n = 0;
    if (!(is >> seq >> n)) continue;
    auto& v = m[seq];
    for (std::uint64_t k = 0; k < n; ++k) {
      std::uint64_t e = 0, id = 0;
      if (is >> e >> id) v.emplace_back(e, id);
    }
    std::sort(v.begin(), v.end());
  }
  return m;
}

std::string join_ms(const std::vector<double>& v) {
  std::string s = "[";
  for (std::size_t k = 0; k < v.size(); ++k) s += (k ? "," : "") + std::to_string(static_cast<long>(v[k] * 1000));
  return s + "]";
}

// ---- One run ----

void chaos_run(const run_spec& r) {
  const auto wall0 = std::chrono::steady_clock::now();
  const std::uint64_t seed = fault_job::chaos_seed("ps/chaos run " + r.name);
  const std::vector<event> schedule = make_schedule(seed);
  BOOST_TEST_REQUIRE(!schedule.empty(), "no schedule for seed " << seed);
  BOOST_TEST_CONTEXT("run " << r.name << " (" << r.policy << " over " << r.tls << "), seed " << seed) {
    for (const event& e : schedule)
      BOOST_TEST_MESSAGE("  at " << e.at << " s: " << name_of(e.kind) << " rank " << e.rank);

    fault_job::job j(initial_workers, "ashl-chaos", r.tls, max_workers, r.servers);
    BOOST_TEST_REQUIRE(j.ok());
    j.set_backups(r.backups);
    const auto common = cat(policy_args(r), {"--elements", std::to_string(elements), "--max-seconds", "90"});
    // Each shard's log: events<s> (its first primary), events<s>-b (its
    // backup, going on once promoted), events<s>-r (the killed primary,
    // restarted as the new backup). give_back_after 3 s: a worker failing
    // over can take ~1.2 s to rejoin (a refused vote sends it to the dead
    // address for failover_attempt, 1 s), and leases given back while it
    // was away stay in its mirror (docs/elastic.md §6 "What E12b built").
    // max_backup_lag_bytes 1 MiB: the default (the store bound) is a few
    // records of this 32-element shard, and a loaded host's backup lags
    // that much.
    const auto server_args = [&](std::uint32_t s, const std::string& log) {
      return cat(common, {"--worker-timeout-ms", "5000", "--no-worker-grace-ms", "1500", "--dataset",
                          std::to_string(samples), "--dataset-epochs", std::to_string(epochs), "--lease-samples", "32",
                          "--give-back-after-ms", "3000", "--max-backup-lag-kib", "1024", "--shuffle-seed", std::to_string(seed), "--event-log",
                          j.dir() + "/events" + std::to_string(s) + log});
    };
    std::vector<pid_t> servers(r.servers), backups(r.servers, -1);  // the primaries and backups running now
    std::vector<std::string> server_log(r.servers), last_log(r.servers);
    for (std::uint32_t s = 0; s < r.servers; ++s) {
      server_log[s] = "server" + std::to_string(s) + ".log";
      last_log[s] = "";
      servers[s] = j.start_server(server_args(s, ""), server_log[s], 30s, {}, s);
      BOOST_TEST_REQUIRE(servers[s] > 0, "server " << s << " did not start");
    }
    for (std::uint32_t s = 0; s < r.servers; ++s) {
      if (!r.backups[s]) continue;
      backups[s] = j.start_backup(s, server_args(s, "-b"), "backup" + std::to_string(s) + ".log");
      BOOST_TEST_REQUIRE(backups[s] > 0, "shard " << s << "'s backup did not catch up: " << j.log_text("backup" + std::to_string(s) + ".log"));
    }
    const auto worker_args =
        cat(common, {"--quadratic", std::to_string(target), "--cycles", "1000000", "--cycle-ms", "40", "--timeout-ms",
                     "30000", "--reconnect-ms", "20000", "--batch", "4", "--dataset", std::to_string(samples),
                     "--slow-rank", "1", "--slow-ms", "30"});

    auto t0 = std::chrono::steady_clock::now();
    const auto now = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    std::vector<proc> procs;
    auto start = [&](std::uint32_t rank) {
      proc p{.rank = rank, .log = "worker" + std::to_string(rank) + "-" + std::to_string(procs.size()) + ".log"};
      p.pid = j.start_worker(rank, worker_args, p.log);
      p.slot = j.slot_of(p.pid);
      p.started = now();
      procs.push_back(p);
      return p.pid > 0 && p.slot < fault_job::job::process_slots;
    };
    for (std::uint32_t k = 0; k < initial_workers; ++k) BOOST_TEST_REQUIRE(start(k));
    // The schedule's clock starts once every initial worker trained (each
    // was acknowledged a commit): process start-up is not part of it.
    for (const proc& p : procs) {
      const auto end = std::chrono::steady_clock::now() + 60s;
      while (j.process_acked(p.slot) == 0 && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(2ms);
      BOOST_TEST_REQUIRE(j.process_acked(p.slot) > 0u, "rank " << p.rank << " never trained: " << p.log);
    }
    t0 = std::chrono::steady_clock::now();
    for (proc& p : procs) p.started = 0;

    // The primary's kill: when, the promotion seen, the restart.
    double primary_killed_at = -1, promoted_seen_at = -1;
    bool primary_restarted = false;
    const std::string ks = std::to_string(r.killed_shard);
    // Refused joins (run A): each fails at its join, naming why.
    struct bad_join {
      std::string what, expect, log;
      pid_t pid = -1;
    };
    std::vector<bad_join> bad;
    auto start_bad = [&](std::string what, std::uint32_t rank, std::vector<std::string> extra_args,
                         fault_job::env_list env, std::string expect) {
      bad_join b{.what = what, .expect = std::move(expect), .log = "bad-" + what + ".log"};
      // To the shard's primary now (the promoted backup), as a job without backups.
      env.emplace_back("ASHL_SERVER_ADDR", promoted_seen_at >= 0 ? j.backup_address(0) : j.server_address(0));
      env.emplace_back("ASHL_BACKUP_ADDR", "");
      b.pid = j.start_worker(rank, cat(cat(common, {"--timeout-ms", "10000", "--connect-timeout", "3"}), extra_args),
                             b.log, false, std::move(env));
      bad.push_back(std::move(b));
    };

    // Drive the schedule; sample every process's acknowledged count.
    std::vector<std::vector<std::pair<double, std::uint64_t>>> acks(fault_job::job::process_slots);
    std::vector<std::pair<double, std::size_t>> pending_restarts;  // (time, index of the killed proc)
    std::size_t next = 0;
    bool bad_started = false;
    std::vector<double> kill_times;
    std::vector<std::size_t> joined_procs;  // procs started by a join or restart
    const double bound = 75.0;
    while (now() < bound) {
      const double t = now();
      for (const proc& p : procs) {
        auto& a = acks[p.slot];
        const std::uint64_t n = j.process_acked(p.slot);
        if (a.empty() || a.back().second != n) a.emplace_back(t, n);
      }
      // The primary's kill: the promotion in the backup's log, then (2 s
      // after the kill) the old primary started again on its port.
      if (primary_killed_at >= 0 && promoted_seen_at < 0 &&
          fault_job::has(j.log_text(server_log[r.killed_shard]), "promoted at term"))
        promoted_seen_at = t;
      if (promoted_seen_at >= 0 && !primary_restarted && t >= primary_killed_at + primary_restart_after) {
        primary_restarted = true;
        backups[r.killed_shard] =
            j.start_server(server_args(r.killed_shard, "-r"), "restarted" + ks + ".log", 30s, {}, r.killed_shard);
        BOOST_TEST(backups[r.killed_shard] > 0, "the killed primary did not start again: "
                                                    << j.log_text("restarted" + ks + ".log"));
      }
      if (r.bad_joins && !bad_started && t >= 2.0 && (promoted_seen_at >= 0 || !primary_kills())) {
        bad_started = true;
        start_bad("rank", 0, {"--join-rank", "5"}, {}, "join.rank = 5: this job admits at most 5 workers");
        start_bad("job", 1, {}, {{"ASHL_JOB", "another-job"}}, "join.job = ");
        start_bad("elements", 2, {"--join-elements", "65"}, {},
                  "join.elements = 65: this job's model has " + std::to_string(elements) + " elements");
        start_bad("token", 0, {}, {{"ASHL_TOKEN", "a wrong token for this job, long enough"}}, "token mismatch");
      }
      for (auto it = pending_restarts.begin(); it != pending_restarts.end();) {
        if (it->first <= t) {
          BOOST_TEST(start(procs[it->second].rank));
          joined_procs.push_back(procs.size() - 1);
          it = pending_restarts.erase(it);
        } else {
          ++it;
        }
      }
      if (next < schedule.size() && schedule[next].at <= t) {
        const event& e = schedule[next++];
        auto live_of = [&](std::uint32_t rank) -> proc* {
          for (proc& p : procs)
            if (p.rank == rank && !p.killed && !p.left) return &p;
          return nullptr;
        };
        BOOST_TEST_MESSAGE("t " << t << ": " << name_of(e.kind) << " rank " << e.rank);
        if (e.kind == fault::join) {
          BOOST_TEST(start(e.rank));
          joined_procs.push_back(procs.size() - 1);
        } else if (e.kind == fault::kill_primary) {
          j.signal(servers[r.killed_shard], SIGKILL);
          primary_killed_at = t;
          servers[r.killed_shard] = backups[r.killed_shard];  // it promotes on the workers' votes
          backups[r.killed_shard] = -1;
          server_log[r.killed_shard] = "backup" + ks + ".log";
          last_log[r.killed_shard] = "-b";
        } else if (proc* p = live_of(e.rank); p != nullptr) {
          p->gone_at = t;
          if (e.kind == fault::leave) {
            p->left = true;
            j.signal(p->pid, SIGTERM);  // leaves at its next cycle
          } else {
            p->killed = true;
            j.signal(p->pid, SIGKILL);
            kill_times.push_back(t);
            if (e.kind == fault::kill_restart)
              pending_restarts.emplace_back(t + e.restart_after, static_cast<std::size_t>(p - procs.data()));
          }
        } else {
          BOOST_ERROR("the schedule's rank " << e.rank << " is not live");
        }
      }
      if (next == schedule.size() && pending_restarts.empty() && j.stop_version() != 0 &&
          (primary_killed_at < 0 || primary_restarted))
        break;
      bool servers_up = true;  // a server that ended before the data is done fails the run at once
      for (pid_t s : servers) servers_up = servers_up && !j.has_exited(s);
      for (pid_t b : backups) servers_up = servers_up && (b <= 0 || !j.has_exited(b));
      if (!servers_up) {
        BOOST_ERROR("a server ended at " << now() << " s, before the data was done");
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    BOOST_TEST(next == schedule.size(), "the data ended (or " << bound << " s passed) before the schedule: "
                                            << next << " of " << schedule.size() << " events");
    BOOST_TEST(j.stop_version() != 0u, "the ledger did not complete its " << epochs << " epochs");

    // Every process ends as it should: the killed were reaped by signal();
    // the others leave (the data is done, or SIGTERM).
    for (proc& p : procs) {
      if (p.killed) continue;
      const auto o = j.finish(p.pid, 60s, p.log);
      BOOST_TEST(o.exit_code == 0, "rank " << p.rank << " (" << p.log << ") exited " << o.exit_code << ": " << o.log());
    }
    for (std::uint32_t s = 0; s < r.servers; ++s) {
      const auto o = j.finish(servers[s], 60s, server_log[s]);
      BOOST_TEST(o.exit_code == 0, "server " << s << " exited " << o.exit_code << ": " << o.log());
    }
    // The killed primary, restarted: its peer (the promoted backup) took it
    // as its backup; with no failover after, it is stopped as one.
    if (primary_kills()) {
      BOOST_TEST(primary_killed_at >= 0, "the schedule killed no primary");
      BOOST_TEST(primary_restarted, "the killed primary was not started again");
    }
    for (std::uint32_t s = 0; s < r.servers; ++s) {
      if (backups[s] <= 0) continue;
      const std::string log = s == r.killed_shard && primary_restarted ? "restarted" + ks + ".log"
                                                                        : "backup" + std::to_string(s) + ".log";
      j.signal(backups[s], SIGTERM);
      const auto o = j.finish(backups[s], 30s, log);
      BOOST_TEST(o.exit_code == 1, "shard " << s << "'s backup exited " << o.exit_code << ": " << o.log());
      BOOST_TEST(fault_job::has(o.log(), "stopped as a backup, never promoted"), o.log());
      if (s == r.killed_shard && primary_restarted)
        BOOST_TEST(fault_job::has(o.log(), "took this server as its backup"), "the restarted primary: " << o.log());
    }
    const double run_seconds = now();

    // Refused joins: each named, counted by reason, nothing changed.
    std::map<std::string, double> refused;
    const auto s0 = j.server_counters(0);
    for (bad_join& b : bad) {
      const auto o = j.finish(b.pid, 30s, b.log);
      BOOST_TEST(o.exit_code == 1, b.what << ": " << o.log());
      BOOST_TEST(fault_job::has(o.log(), b.expect), b.what << ": expected '" << b.expect << "' in " << o.log());
    }
    if (r.bad_joins) {
      refused = {{"rank", s0.at("rank")},
                 {"job", s0.at("job_refused")},
                 {"element_count", s0.at("element_count_refused")},
                 {"token", s0.at("auth_refused")}};
      BOOST_TEST(refused["rank"] == 1.0);
      BOOST_TEST(refused["job"] == 1.0);
      BOOST_TEST(refused["element_count"] == 1.0);
      BOOST_TEST(refused["token"] >= 1.0);
    }
    // Failovers: the killed primary's shard once, by its backup; a commit
    // in flight at the kill, sent again to the new primary, is dropped as a
    // duplicate when the backup had it (at most one per worker).
    std::uint64_t failovers = 0, duplicates = 0;
    std::vector<double> takeover;
    for (std::uint32_t s = 0; s < r.servers; ++s) {
      const auto c = j.server_counters(s);
      BOOST_TEST(c.at("refused") == 0.0, "shard " << s << ": the core refused something");  // nothing reached it
      BOOST_TEST(c.at("finished") == 1.0, "shard " << s);
      const bool failed_over = s == r.killed_shard && primary_killed_at >= 0;
      BOOST_TEST(c.at("failovers") == (failed_over ? 1.0 : 0.0), "shard " << s);
      BOOST_TEST(c.at("duplicates") <= (failed_over ? double{max_workers} : 0.0), "shard " << s);
      failovers += static_cast<std::uint64_t>(c.at("failovers"));
      duplicates += static_cast<std::uint64_t>(c.at("duplicates"));
      if (failed_over) {
        BOOST_TEST(c.at("term") == 2.0, "shard " << s);
        takeover.push_back(c.at("takeover_seconds"));
      }
    }

    // The replays: each core is its event log's replay, bit for bit.
    std::vector<replayed> rep;
    for (std::uint32_t s = 0; s < r.servers; ++s) {
      rep.push_back(replay_log(j.dir() + "/events" + std::to_string(s) + last_log[s], r, s));
      BOOST_TEST_REQUIRE(rep[s].ok, "shard " << s << ": " << rep[s].why);
      BOOST_TEST(rep[s].state_equal, "shard " << s << ": the replay of " << rep[s].records
                                              << " records does not save the server's final state");
      BOOST_TEST(rep[s].max_rank_joined < max_workers, "shard " << s);
    }

    // Exactly once, per (rank, incarnation) and shard; commits lost.
    std::set<incarnation_key> processes;
    std::uint64_t lost = 0, acknowledged = 0, applied = 0;
    for (const proc& p : procs) {
      const std::uint64_t inc = j.process_incarnation(p.slot);
      const std::uint64_t acked = j.process_acked(p.slot), sent = j.process_sent(p.slot);
      acknowledged += acked;
      if (inc == 0) {
        BOOST_TEST(p.killed, "rank " << p.rank << " (" << p.log << ") never joined");
        continue;
      }
      processes.insert({p.rank, inc});
      for (std::uint32_t s = 0; s < r.servers; ++s) {
        const auto it = rep[s].accepted.find({p.rank, inc});
        const std::vector<accepted_commit> none;
        const auto& acc = it == rep[s].accepted.end() ? none : it->second;
        for (std::size_t k = 0; k < acc.size(); ++k)
          BOOST_TEST(acc[k].sequence == k + 1, "shard " << s << " rank " << p.rank << ": sequence " << acc[k].sequence
                                                        << " accepted as the " << k + 1 << "th");
        const std::uint64_t a = acc.size();
        if (s == 0) applied += a;
        if (a < acked) lost += acked - a;
        BOOST_TEST(a >= acked, "shard " << s << " rank " << p.rank << " incarnation " << inc << ": " << a
                                        << " accepted, " << acked << " acknowledged");
        BOOST_TEST(a <= acked + (p.killed ? 1u : 0u), "shard " << s << " rank " << p.rank << ": " << a
                                                               << " accepted, " << acked << " acknowledged");
        BOOST_TEST(a <= sent, "shard " << s << " rank " << p.rank);
      }
    }
    for (std::uint32_t s = 0; s < r.servers; ++s)
      for (const auto& k : rep[s].joins)
        BOOST_TEST(processes.count(k) == 1u, "shard " << s << ": a join of rank " << k.first << " incarnation "
                                                      << k.second << " that no worker process made");
    BOOST_TEST(lost == 0u);

    // The data: each accepted commit trained what it wrote; every id once per epoch.
    std::vector<std::vector<int>> used(epochs, std::vector<int>(samples, 0));
    std::uint64_t used_total = 0;
    for (const auto& [key, commits] : rep[0].accepted) {
      const auto trained = read_trained(j.dir() + "/trained-r" + std::to_string(key.first) + "-i" +
                                        std::to_string(key.second) + ".txt");
      for (const accepted_commit& c : commits) {
        std::vector<std::pair<std::uint64_t, std::uint64_t>> ids;
        for (const auto& [e, p] : c.positions) ids.emplace_back(e, sample_ids::of(seed, e, p, samples));
        std::sort(ids.begin(), ids.end());
        const auto t = trained.find(c.sequence);
        BOOST_TEST_REQUIRE((t != trained.end()), "rank " << key.first << " commit " << c.sequence << " wrote no ids");
        BOOST_TEST((t->second == ids), "rank " << key.first << " commit " << c.sequence
                                               << ": the ids it trained are not the ledger's positions");
        for (const auto& [e, id] : t->second) {
          BOOST_TEST_REQUIRE(e < epochs);
          ++used[e][id];
          ++used_total;
        }
      }
    }
    for (std::uint64_t e = 0; e < epochs; ++e) {
      const auto once = std::count(used[e].begin(), used[e].end(), 1);
      BOOST_TEST(once == static_cast<long>(samples), "epoch " << e << ": " << once << " of " << samples
                                                              << " ids used exactly once");
    }
    BOOST_TEST(used_total == epochs * samples);
    BOOST_TEST(rep[0].ledger.epochs_completed == epochs);
    BOOST_TEST(rep[0].ledger.overrun == 0u);

    // The target.
    for (std::uint32_t s = 0; s < r.servers; ++s)
      BOOST_TEST(fault_job::max_distance(j.parameters(s), target) < 1e-3f, "shard " << s);

    // Recovery times: from each kill to every survivor's next acknowledged
    // commit; from each join or restart to its first.
    std::vector<double> recovery, first_ack, failover_recovery;
    auto all_acked_after = [&](double k, std::vector<double>& into) {
      double worst = 0;
      bool any = false;
      for (const proc& p : procs) {
        if (p.started > k || (p.gone_at >= 0 && p.gone_at <= k)) continue;
        const auto& a = acks[p.slot];
        const auto it = std::find_if(a.begin(), a.end(), [&](const auto& x) { return x.first > k; });
        if (it == a.end() || (p.gone_at >= 0 && it->first > p.gone_at)) continue;
        worst = std::max(worst, it->first - k);
        any = true;
      }
      if (any) into.push_back(worst);
    };
    for (double k : kill_times) all_acked_after(k, recovery);
    if (primary_killed_at >= 0) all_acked_after(primary_killed_at, failover_recovery);
    for (std::size_t i : joined_procs) {
      const proc& p = procs[i];
      const auto& a = acks[p.slot];
      const auto it = std::find_if(a.begin(), a.end(), [](const auto& x) { return x.second > 0; });
      if (it != a.end()) first_ack.push_back(it->first - p.started);
    }
    std::size_t restarts = 0, joins = 0, leaves = 0, kills = 0;
    for (const event& e : schedule) {
      restarts += e.kind == fault::kill_restart;
      joins += e.kind == fault::join;
      leaves += e.kind == fault::leave;
      kills += e.kind == fault::kill || e.kind == fault::kill_restart || e.kind == fault::kill_primary;
    }
    std::ostringstream json;
    json << "{\"test\":\"ps/chaos\",\"run\":\"" << r.name << "\",\"seed\":" << seed << ",\"transport\":\"" << r.tls
         << "\",\"policy\":\"" << r.policy << "\",\"shards\":" << r.servers << ",\"kills_survived\":" << kills
         << ",\"restarts\":" << restarts << ",\"joins\":" << joins << ",\"leaves\":" << leaves
         << ",\"refused_joins\":{";
    bool first = true;
    for (const auto& [k, v] : refused) {
      json << (first ? "" : ",") << "\"" << k << "\":" << v;
      first = false;
    }
    json << "},\"failovers\":" << failovers << ",\"takeover_ms\":" << join_ms(takeover)
         << ",\"failover_recovery_ms\":" << join_ms(failover_recovery) << ",\"duplicates_dropped\":" << duplicates
         << ",\"commits_acknowledged\":" << acknowledged << ",\"commits_applied\":" << applied
         << ",\"commits_lost\":" << lost << ",\"epochs\":" << rep[0].ledger.epochs_completed
         << ",\"recovery_ms\":" << join_ms(recovery) << ",\"first_ack_ms\":" << join_ms(first_ack)
         << ",\"run_s\":" << run_seconds
         << ",\"wall_s\":" << std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count() << "}";
    std::printf("%s\n", json.str().c_str());
    std::fflush(stdout);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(chaos_bsp_over_tcp_with_refused_joins) {
  chaos_run({.name = "A", .tls = "tcp,self", .policy = "bsp", .servers = 1, .bad_joins = true, .backups = {true},
             .killed_shard = 0});
}

BOOST_AUTO_TEST_CASE(chaos_ssp_over_shared_memory_with_two_shards) {
  chaos_run({.name = "B", .tls = "sm,self,tcp", .policy = "ssp", .servers = 2, .bad_joins = false,
             .backups = {false, true}, .killed_shard = 1});
}

#endif
