// bench/chaos.cpp — ashl_bench_chaos: an elastic job with replicated shards
// under random faults for a while (docs/elastic.md §5 "Benchmark"), against
// a fault-free run of the same length in the same invocation.
//
//   flock /tmp/ashl-bench.lock ashl_bench_chaos --quick            # 15 s per run, shm and tcp
//   ashl_bench_chaos --seconds 600 --shards 4 --worker-kill-rate 0.2 --primary-kill-rate 0.05
//
// Real ashl_test_ps_node processes through test/support/fault_job.hpp on
// 127.0.0.1 (one host: a primary and its backup share it): S shards (2,
// --shards up to 4), each with a backup; 8 workers at first, max_workers
// 16, ASP on a quadratic, a commit every ~10 ms per worker. Faults, each a
// Poisson process (rates per second): a worker SIGKILLed and restarted
// 0.5 s later as a new incarnation; a shard's primary SIGKILLed (its backup
// promotes on the workers' votes) and started again 2 s later on its port,
// where it attaches as the new backup; a rank joining; a worker leaving
// for good (SIGTERM). A primary is killed only while its backup is
// attached and not within 1 s of a worker's kill (a worker killed just
// before may still be live in the replicated state: the promotion needs a
// majority of its live workers' votes), and no worker process starts while
// a primary's address is dead (a fresh worker's create() does not fail
// over; docs/elastic.md §6 "What E12b built").
//
// Per run, a table and one JSON line: kills survived, joins, leaves,
// failovers, commits lost (per shard, the final primary's commits applied
// against the commits the workers were acknowledged: 0), time to recover
// (p50, p95, max; a primary's kill: until every worker live at the kill was
// acknowledged a later commit; a worker's: until its restarted process was
// acknowledged its first), commits acknowledged per second against the
// fault-free run's (the baseline: the same job and length, no faults), the
// machine, date, placement and load average. Never a timing assertion.
#if !defined(ASHL_TEST_PS_NODE)
#include <cstdio>
int main() {
  std::puts("skipped: ashl_bench_chaos needs the tests' ashl_test_ps_node (ASHL_BUILD_TESTS and the ucx component)");
  return 0;
}
#else

#include "../test/support/fault_job.hpp"
#include "support.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using fault_job::cat;

struct options {
  double seconds = 60;
  std::uint32_t shards = 2, workers = 8, max_workers = 16;
  double worker_kill_rate = 0.1, primary_kill_rate = 0.05, join_rate = 0.05, leave_rate = 0.03;
  std::vector<std::string> transports = {"shm", "tcp"};
  std::uint64_t seed = 0;
  bool quick = false;
};

struct percentiles {
  double p50 = 0, p95 = 0, max = 0;
};
percentiles of(std::vector<double> v) {
  percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  const auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<std::size_t>(q * (v.size() - 1) + 0.5))]; };
  return {at(0.5), at(0.95), v.back()};
}

struct result {
  double measured_s = 0;
  std::uint64_t acknowledged = 0;
  std::uint64_t worker_kills = 0, primary_kills = 0, joins = 0, leaves = 0, failovers = 0;
  std::uint64_t lost = 0, applied_extra = 0;
  std::vector<double> primary_recovery, worker_recovery;
  bool ok = true;
  std::string why;
  double rate() const { return measured_s > 0 ? static_cast<double>(acknowledged) / measured_s : 0; }
};

struct worker_proc {
  pid_t pid = -1;
  std::uint32_t rank = 0;
  bool gone = false, killed = false;
};

result run(const options& o, const std::string& transport, bool faults, std::uint64_t seed) {
  result res;
  const char* tls = transport == "shm" ? "sm,self,tcp" : "tcp,self";
  fault_job::job j(o.workers, "ashl-bench-chaos", tls, o.max_workers, o.shards);
  if (!j.ok()) return {.ok = false, .why = "no job directory"};
  j.set_backups(std::vector<bool>(o.shards, true));
  const std::string bound = std::to_string(static_cast<long>(o.seconds + 120));
  const auto common = std::vector<std::string>{"--policy", "asp", "--elements", "256", "--max-seconds", bound};
  // Server 0's data ledger, unbounded (no epoch count): a worker that
  // follows it leaves at SIGTERM (ashl_test_ps_node), so a run ends when
  // the harness says.
  const auto server_args =
      cat(common, {"--worker-timeout-ms", "5000", "--no-worker-grace-ms", "1500", "--max-backup-lag-kib", "4096",
                   "--dataset", "1000000", "--lease-samples", "64", "--give-back-after-ms", "3000"});
  const auto worker_args = cat(common, {"--quadratic", "2", "--cycles", "1000000000", "--cycle-ms", "10",
                                        "--timeout-ms", "30000", "--reconnect-ms", "20000", "--dataset", "1000000",
                                        "--batch", "4"});
  std::vector<pid_t> primary(o.shards, -1), backup(o.shards, -1);
  std::vector<std::string> primary_log(o.shards), backup_log(o.shards);
  auto fail = [&](std::string why) {
    res.ok = false;
    res.why = std::move(why);
    return res;
  };
  for (std::uint32_t s = 0; s < o.shards; ++s) {
    primary_log[s] = "server" + std::to_string(s) + ".log";
    primary[s] = j.start_server(server_args, primary_log[s], 30s, {}, s);
    if (primary[s] <= 0) return fail("server " + std::to_string(s) + " did not start");
  }
  for (std::uint32_t s = 0; s < o.shards; ++s) {
    backup_log[s] = "backup" + std::to_string(s) + ".log";
    backup[s] = j.start_backup(s, server_args, backup_log[s]);
    if (backup[s] <= 0) return fail("backup " + std::to_string(s) + " did not catch up");
  }
  std::vector<worker_proc> procs;
  std::vector<std::uint8_t> live(o.max_workers, 0);
  auto start = [&](std::uint32_t rank) {
    const pid_t p = j.start_worker(rank, worker_args, "worker" + std::to_string(rank) + "-" +
                                                          std::to_string(procs.size()) + ".log");
    procs.push_back({p, rank, false});
    live[rank] = 1;
  };
  for (std::uint32_t r = 0; r < o.workers; ++r) start(r);
  for (std::uint32_t r = 0; r < o.workers; ++r) {
    const auto end = std::chrono::steady_clock::now() + 60s;
    while (j.commits_acknowledged(r) == 0 && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(5ms);
    if (j.commits_acknowledged(r) == 0) return fail("worker " + std::to_string(r) + " never trained");
  }

  std::mt19937_64 rng(seed);
  const auto t0 = std::chrono::steady_clock::now();
  const auto now = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const std::uint64_t acked0 = j.commits_acknowledged_total();
  auto next_at = [&](double rate, double from) {
    return rate > 0 ? from + std::exponential_distribution<double>(rate)(rng) : 1e18;
  };
  double next_wkill = next_at(o.worker_kill_rate, 0), next_pkill = next_at(o.primary_kill_rate, 0),
         next_join = next_at(o.join_rate, 0), next_leave = next_at(o.leave_rate, 0);
  double last_wkill = -10;
  std::vector<double> dead_until(o.shards, -1);    // a killed primary's address is dead until its restart
  std::vector<double> restart_primary(o.shards, -1);
  // Whether shard s's primary now serves on its backup's port (promoted):
  // a killed primary comes back on its own port, as the backup of the other.
  std::vector<std::uint8_t> on_backup_port(o.shards, 0);
  std::vector<std::pair<double, std::uint32_t>> restarts;  // (time, rank)
  struct pending {
    double at;
    std::vector<std::uint64_t> acked;  // per rank at the kill
    std::vector<std::uint8_t> live;
    std::uint32_t rank = ~0u;  // a worker's kill: its rank; else a primary's
  };
  std::vector<pending> waiting;
  auto pick = [&](bool want_live) -> std::uint32_t {
    std::vector<std::uint32_t> c;
    for (std::uint32_t r = 0; r < o.max_workers; ++r)
      if ((live[r] != 0) == want_live) c.push_back(r);
    if (c.empty()) return ~0u;
    return c[std::uniform_int_distribution<std::size_t>(0, c.size() - 1)(rng)];
  };
  auto live_count = [&] { return static_cast<std::uint32_t>(std::count(live.begin(), live.end(), 1)); };
  auto any_dead = [&](double t) {
    for (double d : dead_until)
      if (t < d) return true;
    return false;
  };
  auto process_of = [&](std::uint32_t rank) -> worker_proc* {
    for (auto& p : procs)
      if (p.rank == rank && !p.gone) return &p;
    return nullptr;
  };

  while (now() < o.seconds) {
    const double t = now();
    for (std::uint32_t s = 0; s < o.shards; ++s) {  // a server that ended stops the run
      if (j.has_exited(primary[s])) return fail("shard " + std::to_string(s) + "'s primary ended at " + std::to_string(t) + " s: " + j.log_text(primary_log[s]));
    }
    // Recoveries.
    for (auto it = waiting.begin(); it != waiting.end();) {
      bool done = true;
      if (it->rank != ~0u) {
        done = j.commits_acknowledged(it->rank) > it->acked[it->rank];
      } else {
        for (std::uint32_t r = 0; r < o.max_workers; ++r)
          if (it->live[r] && live[r] && j.commits_acknowledged(r) <= it->acked[r]) done = false;
      }
      if (done) {
        (it->rank != ~0u ? res.worker_recovery : res.primary_recovery).push_back(t - it->at);
        it = waiting.erase(it);
      } else {
        ++it;
      }
    }
    auto snapshot = [&](double at, std::uint32_t rank) {
      pending p{at, std::vector<std::uint64_t>(o.max_workers), live, rank};
      for (std::uint32_t r = 0; r < o.max_workers; ++r) p.acked[r] = j.commits_acknowledged(r);
      waiting.push_back(std::move(p));
    };
    // A killed primary comes back as the new backup, once promoted and 2 s on.
    for (std::uint32_t s = 0; s < o.shards; ++s) {
      if (restart_primary[s] < 0 || t < restart_primary[s]) continue;
      if (!fault_job::has(j.log_text(primary_log[s]), "promoted at term")) continue;
      restart_primary[s] = -1;
      backup_log[s] = "restarted" + std::to_string(s) + "-" + std::to_string(res.primary_kills) + ".log";
      // on_backup_port: flipped at the kill, so it says where the killed one was not.
      backup[s] = on_backup_port[s] ? j.start_server(server_args, backup_log[s], 30s, {}, s)  // asks its peer first
                                    : j.start_backup(s, server_args, backup_log[s]);          // ASHL_REPLICA
      dead_until[s] = -1;
      if (backup[s] <= 0 || !fault_job::has(j.log_text(backup_log[s]), "backup listening on"))
        return fail("shard " + std::to_string(s) + "'s old primary did not attach as backup: " + j.log_text(backup_log[s]));
    }
    for (auto it = restarts.begin(); it != restarts.end();) {
      if (it->first <= t && !any_dead(t)) {
        start(it->second);
        it = restarts.erase(it);
      } else {
        ++it;
      }
    }
    if (faults && t >= next_wkill) {
      next_wkill = next_at(o.worker_kill_rate, t);
      const std::uint32_t r = live_count() > o.workers / 2 ? pick(true) : ~0u;
      if (worker_proc* p = r == ~0u ? nullptr : process_of(r); p != nullptr) {
        j.signal(p->pid, SIGKILL);
        p->gone = p->killed = true;
        live[r] = 0;
        snapshot(t, r);
        restarts.emplace_back(t + 0.5, r);
        ++res.worker_kills;
        last_wkill = t;
      }
    }
    if (faults && t >= next_pkill) {
      const std::uint32_t s = std::uniform_int_distribution<std::uint32_t>(0, o.shards - 1)(rng);
      if (backup[s] > 0 && t - last_wkill >= 1.0 && !any_dead(t) && restarts.empty()) {
        next_pkill = next_at(o.primary_kill_rate, t);
        j.signal(primary[s], SIGKILL);
        on_backup_port[s] ^= 1;
        primary[s] = backup[s];
        primary_log[s] = backup_log[s];
        backup[s] = -1;
        dead_until[s] = t + 10;
        restart_primary[s] = t + 2.0;
        snapshot(t, ~0u);
        ++res.primary_kills;
      }
    }
    if (faults && t >= next_join) {
      next_join = next_at(o.join_rate, t);
      const std::uint32_t r = any_dead(t) ? ~0u : pick(false);
      bool restarting = false;
      for (const auto& x : restarts) restarting = restarting || x.second == r;
      if (r != ~0u && !restarting) {
        start(r);
        ++res.joins;
      }
    }
    if (faults && t >= next_leave) {
      next_leave = next_at(o.leave_rate, t);
      const std::uint32_t r = live_count() > o.workers / 2 + 1 ? pick(true) : ~0u;
      if (worker_proc* p = r == ~0u ? nullptr : process_of(r); p != nullptr) {
        j.signal(p->pid, SIGTERM);
        p->gone = true;
        live[r] = 0;
        ++res.leaves;
      }
    }
    std::this_thread::sleep_for(5ms);
  }
  res.measured_s = now();
  res.acknowledged = j.commits_acknowledged_total() - acked0;

  // The end: every worker leaves; the servers end; the backups are stopped.
  for (auto& p : procs)
    if (!p.gone) j.signal(p.pid, SIGTERM);
  for (auto& p : procs)
    if (!p.killed) (void)j.finish(p.pid, 20s, "worker" + std::to_string(p.rank) + ".log");
  const std::uint64_t acked_all = j.commits_acknowledged_total();  // every worker's last commit included
  for (std::uint32_t s = 0; s < o.shards; ++s) {
    const auto out = j.finish(primary[s], 60s, primary_log[s]);
    if (out.exit_code != 0 && res.ok) {
      res.ok = false;
      res.why = "shard " + std::to_string(s) + "'s primary exited " + std::to_string(out.exit_code) + ": " + out.log();
    }
    if (backup[s] > 0) {
      j.signal(backup[s], SIGTERM);
      (void)j.finish(backup[s], 30s, backup_log[s]);
    }
    const auto c = j.server_counters(s);
    const auto it = c.find("commits_applied");
    const double applied = it == c.end() ? 0 : it->second;
    const auto f = c.find("failovers");
    res.failovers += f == c.end() ? 0 : static_cast<std::uint64_t>(f->second);
    // Every acknowledged commit reached every shard; a killed worker's
    // commit in flight may be applied without an acknowledgement.
    if (applied < static_cast<double>(acked_all)) res.lost += acked_all - static_cast<std::uint64_t>(applied);
    res.applied_extra = std::max<std::uint64_t>(res.applied_extra, applied > acked_all ? static_cast<std::uint64_t>(applied) - acked_all : 0);
  }
  // Each promotion is a failover; the final primary's telemetry counts only its own.
  res.failovers = res.primary_kills;
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto num = [&] { return i + 1 < argc ? std::atof(argv[++i]) : 0.0; };
    if (a == "--quick") {
      o.quick = true;
      o.seconds = 15;
    } else if (a == "--seconds") o.seconds = num();
    else if (a == "--shards") o.shards = static_cast<std::uint32_t>(num());
    else if (a == "--worker-kill-rate") o.worker_kill_rate = num();
    else if (a == "--primary-kill-rate") o.primary_kill_rate = num();
    else if (a == "--join-rate") o.join_rate = num();
    else if (a == "--leave-rate") o.leave_rate = num();
    else if (a == "--seed") o.seed = static_cast<std::uint64_t>(num());
    else if (a == "--transport" && i + 1 < argc) o.transports = {argv[++i]};
    else {
      std::fprintf(stderr,
                   "usage: ashl_bench_chaos [--quick] [--seconds S] [--shards 1..4] [--worker-kill-rate R] "
                   "[--primary-kill-rate R] [--join-rate R] [--leave-rate R] [--seed N] [--transport shm|tcp]\n");
      return 2;
    }
  }
  if (o.shards < 1 || o.shards > 4) {
    std::fprintf(stderr, "--shards = %u: must be 1..4\n", o.shards);
    return 2;
  }
  if (o.quick) {  // enough faults to see in 15 s
    o.worker_kill_rate = std::max(o.worker_kill_rate, 0.3);
    o.primary_kill_rate = std::max(o.primary_kill_rate, 0.15);
    o.join_rate = std::max(o.join_rate, 0.2);
    o.leave_rate = std::max(o.leave_rate, 0.1);
  }
  if (o.seed == 0) o.seed = std::random_device{}();
  const std::string mach = bench::machine(), date = bench::today();
  std::printf("ashl_bench_chaos: %s, %s, seed %llu, %u shards each with a backup, %u workers (max %u), %.0f s per run\n",
              mach.c_str(), date.c_str(), static_cast<unsigned long long>(o.seed), o.shards, o.workers, o.max_workers,
              o.seconds);
  std::fflush(stdout);
  std::printf("%-9s %9s %9s %6s %6s %9s %5s %9s %9s %9s %9s %9s %9s\n", "transport", "commit/s", "baseline", "ratio",
              "kills", "failovers", "joins", "lost", "prim p50", "prim p95", "prim max", "work p50", "work max");
  int rc = 0;
  for (const std::string& tr : o.transports) {
    const std::string load0 = bench::loadavg();
    const result base = run(o, tr, false, o.seed);
    const result r = run(o, tr, true, o.seed);
    const std::string load = load0 + " -> " + bench::loadavg();
    if (!base.ok || !r.ok) {
      std::printf("%s: failed: %s\n", tr.c_str(), (!base.ok ? base.why : r.why).c_str());
      rc = 1;
      continue;
    }
    const percentiles pr = of(r.primary_recovery), wr = of(r.worker_recovery);
    const double ratio = base.rate() > 0 ? r.rate() / base.rate() : 0;
    std::printf("%-9s %9.1f %9.1f %6.3f %6llu %9llu %5llu %9llu %9.0f %9.0f %9.0f %9.0f %9.0f\n", tr.c_str(), r.rate(),
                base.rate(), ratio, static_cast<unsigned long long>(r.worker_kills + r.primary_kills),
                static_cast<unsigned long long>(r.failovers), static_cast<unsigned long long>(r.joins),
                static_cast<unsigned long long>(r.lost), 1e3 * pr.p50, 1e3 * pr.p95, 1e3 * pr.max, 1e3 * wr.p50,
                1e3 * wr.max);
    std::printf(
        "{\"bench\":\"chaos\",\"transport\":\"%s\",\"seconds\":%.1f,\"shards\":%u,\"backups\":%u,\"workers\":%u,"
        "\"max_workers\":%u,\"seed\":%llu,\"worker_kills\":%llu,\"primary_kills\":%llu,\"kills_survived\":%llu,"
        "\"joins\":%llu,\"leaves\":%llu,\"failovers\":%llu,\"commits_acknowledged\":%llu,\"commits_lost\":%llu,"
        "\"applied_unacknowledged_max\":%llu,\"primary_recovery_ms\":{\"n\":%zu,\"p50\":%.0f,\"p95\":%.0f,\"max\":%.0f},"
        "\"worker_recovery_ms\":{\"n\":%zu,\"p50\":%.0f,\"p95\":%.0f,\"max\":%.0f},\"commits_per_s\":%.1f,"
        "\"baseline_commits_per_s\":%.1f,\"ratio\":%.3f,\"machine\":\"%s\",\"date\":\"%s\","
        "\"placement\":\"one host, 127.0.0.1: every primary, backup and worker a process on it\",\"load\":\"%s\"}\n",
        tr.c_str(), r.measured_s, o.shards, o.shards, o.workers, o.max_workers, static_cast<unsigned long long>(o.seed),
        static_cast<unsigned long long>(r.worker_kills), static_cast<unsigned long long>(r.primary_kills),
        static_cast<unsigned long long>(r.worker_kills + r.primary_kills), static_cast<unsigned long long>(r.joins),
        static_cast<unsigned long long>(r.leaves), static_cast<unsigned long long>(r.failovers),
        static_cast<unsigned long long>(r.acknowledged), static_cast<unsigned long long>(r.lost),
        static_cast<unsigned long long>(r.applied_extra), r.primary_recovery.size(), 1e3 * pr.p50, 1e3 * pr.p95,
        1e3 * pr.max, r.worker_recovery.size(), 1e3 * wr.p50, 1e3 * wr.p95, 1e3 * wr.max, r.rate(), base.rate(), ratio,
        mach.c_str(), date.c_str(), load.c_str());
    std::fflush(stdout);
    if (r.lost != 0) rc = 1;
  }
  return rc;
}

#endif
