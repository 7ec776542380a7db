#include <ashl/ps/server.hpp>

#include <cstdio>

// Lifetimes as real processes (docs/ps.md "Exactly once, incarnations"): a worker process
// killed and started again (a fresh incarnation by default) has every commit
// applied, none taken for a duplicate; an older incarnation is refused by
// name and a superseded process fails with the reason; a lone worker paused
// past worker_timeout is evicted, reconnects, and the server goes on; a
// worker that starts after worker_timeout still joins; a server with nobody
// ends after no_worker_grace; after a whole-job restore, fresh workers'
// commits are applied. ashl_test_ps_node over UCX/TCP on 127.0.0.1
// (test/support/fault_job.hpp); ASP applies each commit at once, so the
// server's applied count is the sum of the workers' commits.

#if !ASHL_HAS_UCX() || !defined(ASHL_TEST_PS_NODE)
int main() {
  std::puts("skipped: ps/lifetime needs the ucx component (UCX and OpenSSL)");
  return 77;
}
#else

#include <boost/test/unit_test.hpp>

#include "../support/fault_job.hpp"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

using fault_job::cat;

using fault_job::has;

}  // namespace

// Issue 24's reproduction: a worker restarted by hand had all its commits
// dropped as duplicates and every process exited 0.
BOOST_AUTO_TEST_CASE(restarted_worker_commits_are_applied) {
  fault_job::job j(2);
  BOOST_TEST_REQUIRE(j.ok());
  const std::vector<std::string> common = {"--policy", "asp", "--elements", "64"};
  const pid_t srv = j.start_server(common);
  BOOST_TEST_REQUIRE(srv > 0);
  const auto worker_args = cat(common, {"--quadratic", "2", "--cycle-ms", "3", "--timeout-ms", "20000"});
  const pid_t w0 = j.start_worker(0, cat(worker_args, {"--cycles", "60"}));
  const pid_t w1 = j.start_worker(1, cat(worker_args, {"--cycles", "1000"}));
  BOOST_TEST_REQUIRE(j.wait_commits(1, 12, 60s));
  j.signal(w1, SIGKILL);
  const std::uint64_t killed_started = j.commits_started(1);
  // The same rank, a new process, no incarnation given: a fresh one.
  const pid_t again = j.start_worker(1, cat(worker_args, {"--cycles", "30"}), "worker1-again.log");
  const auto oa = j.finish(again, 60s, "worker1-again.log");
  BOOST_TEST(oa.exit_code == 0, oa.log());
  const auto o0 = j.finish(w0, 60s, "worker0.log");
  BOOST_TEST(o0.exit_code == 0, o0.log());
  const auto so = j.finish(srv, 60s, "server.log");
  BOOST_TEST(so.exit_code == 0, so.log());
  BOOST_TEST(has(so.log(), "server ended: all_left"), so.log());
  const auto s = j.server_counters();
  BOOST_TEST(j.worker_counters(1).at("commits") == 30.0);  // the new process's file
  BOOST_TEST(s.at("duplicates") == 0.0, so.log());
  BOOST_TEST(s.at("refused") == 0.0, so.log());
  BOOST_TEST(s.at("joins") >= 1.0);
  // Every commit of the survivors and of the new process, and those of the
  // killed one that reached the server (at most the one in flight lost).
  BOOST_TEST(s.at("commits_applied") >= 60.0 + 30.0 + static_cast<double>(killed_started) - 1.0,
             "applied " << s.at("commits_applied") << ", killed process had begun " << killed_started);
  BOOST_TEST(s.at("commits_applied") <= 60.0 + 30.0 + static_cast<double>(killed_started));
  BOOST_TEST(s.at("commits_applied") == s.at("commits"));
}

// Issue 24's reproduction: after a whole-job restore, fresh workers got
// every commit refused as a duplicate and the version never moved. BSP, two
// workers, a checkpoint at the end of the first job; the second job's new
// processes have every commit applied.
BOOST_AUTO_TEST_CASE(whole_job_restore_applies_fresh_workers_commits) {
  fault_job::job j(2);
  BOOST_TEST_REQUIRE(j.ok());
  const std::string ckpt = j.dir() + "/ckpt";
  std::filesystem::create_directories(ckpt);
  const std::vector<std::string> common = {"--policy", "bsp", "--elements", "64"};
  const auto server_args = cat(common, {"--checkpoint-dir", ckpt});
  const auto worker_args = cat(common, {"--quadratic", "2", "--cycles", "10", "--timeout-ms", "20000"});
  for (int run = 0; run < 2; ++run) {
    const std::string tag = run == 0 ? "first" : "restored";
    const pid_t srv = j.start_server(run == 0 ? server_args : cat(server_args, {"--restore"}), tag + "-server.log");
    BOOST_TEST_REQUIRE(srv > 0);
    pid_t w[2];
    for (std::uint32_t k = 0; k < 2; ++k)
      w[k] = j.start_worker(k, worker_args, tag + "-worker" + std::to_string(k) + ".log", false);
    for (std::uint32_t k = 0; k < 2; ++k) {
      const auto o = j.finish(w[k], 60s, tag + "-worker" + std::to_string(k) + ".log");
      BOOST_TEST(o.exit_code == 0, tag << " worker " << k << ": " << o.log());
    }
    const auto so = j.finish(srv, 60s, tag + "-server.log");
    BOOST_TEST(so.exit_code == 0, tag << ": " << so.log());
    const auto s = j.server_counters();
    BOOST_TEST(s.at("duplicates") == 0.0, tag << ": " << so.log());
    BOOST_TEST(s.at("refused") == 0.0, tag << ": " << so.log());
    BOOST_TEST(s.at("commits_applied_now") == 20.0, tag << ": " << so.log());
    if (run == 1) {
      BOOST_TEST(s.at("restored_applied") == 20.0, so.log());
      BOOST_TEST(s.at("commits_applied") == 40.0, so.log());
    }
  }
}

// An older incarnation of a rank is refused with an error naming it, and a
// process whose rank a later one took fails at once naming both: neither
// commits silently into nothing.
BOOST_AUTO_TEST_CASE(stale_incarnation_is_refused_by_name) {
  fault_job::job j(1);
  BOOST_TEST_REQUIRE(j.ok());
  const std::vector<std::string> common = {"--policy", "asp", "--elements", "64"};
  const pid_t srv = j.start_server(common);
  BOOST_TEST_REQUIRE(srv > 0);
  const auto worker_args = cat(common, {"--quadratic", "2", "--cycle-ms", "3", "--timeout-ms", "20000"});
  const pid_t first = j.start_worker(0, cat(worker_args, {"--cycles", "100000", "--incarnation", "1000"}));
  BOOST_TEST_REQUIRE(j.wait_commits(0, 5, 60s));
  // Older than the rank's: refused at join.
  const pid_t old = j.start_worker(0, cat(worker_args, {"--cycles", "5", "--incarnation", "5"}), "old.log", false);
  const auto oo = j.finish(old, 60s, "old.log");
  BOOST_TEST(oo.exit_code == 1, oo.log());
  BOOST_TEST(has(oo.log(), "join.incarnation = 5: stale: worker 0 is at incarnation 1000"), oo.log());
  // A fresh process takes the rank; the first one is told it is stale.
  // 100 cycles (0.3 s at least): the first process hears it is stale
  // long before this one leaves and the server ends.
  const pid_t fresh = j.start_worker(0, cat(worker_args, {"--cycles", "100"}), "fresh.log", false);
  const auto of = j.finish(fresh, 60s, "fresh.log");
  BOOST_TEST(of.exit_code == 0, of.log());
  const auto o1 = j.finish(first, 60s, "worker0.log");
  BOOST_TEST(!o1.timed_out, o1.log());
  BOOST_TEST(o1.exit_code == 1, o1.log());
  BOOST_TEST(has(o1.log(), "join.incarnation = 1000: stale: worker 0 joined again as incarnation"), o1.log());
  const auto so = j.finish(srv, 60s, "server.log");
  BOOST_TEST(so.exit_code == 0, so.log());
  const auto s = j.server_counters();
  BOOST_TEST(s.at("incarnation_refused") == 1.0);
  BOOST_TEST(s.at("stale") >= 1.0);
  BOOST_TEST(s.at("duplicates") == 0.0);
  BOOST_TEST(s.at("errors_sent") >= 2.0);
}

// Issue 24's reproduction: a lone worker paused past worker_timeout was
// evicted and the server exited before it could reconnect.
BOOST_AUTO_TEST_CASE(lone_worker_paused_past_timeout_reconnects) {
  fault_job::job j(1);
  BOOST_TEST_REQUIRE(j.ok());
  const std::vector<std::string> common = {"--policy", "asp", "--elements", "64"};
  const pid_t srv = j.start_server(cat(common, {"--worker-timeout-ms", "800", "--no-worker-grace-ms", "20000"}));
  BOOST_TEST_REQUIRE(srv > 0);
  const pid_t w = j.start_worker(0, cat(common, {"--quadratic", "2", "--cycles", "15", "--timeout-ms", "20000",
                                                 "--reconnect-ms", "20000", "--pause-after", "5", "--pause-ms",
                                                 "2500"}));
  const auto o = j.finish(w, 60s, "worker0.log");
  BOOST_TEST(o.exit_code == 0, o.log());
  const auto so = j.finish(srv, 60s, "server.log");
  BOOST_TEST(so.exit_code == 0, so.log());
  BOOST_TEST(has(so.log(), "worker 0 evicted: silent"), so.log());
  BOOST_TEST(has(so.log(), "server ended: all_left"), so.log());
  const auto s = j.server_counters();
  BOOST_TEST(s.at("evicted_silent") >= 1.0);
  BOOST_TEST(j.worker_counters(0).at("reconnects") >= 1.0);
  BOOST_TEST(j.worker_counters(0).at("commits") == 15.0);
  BOOST_TEST(s.at("commits_applied") == 15.0, so.log());
  BOOST_TEST(s.at("duplicates") == 0.0);
}

// A worker that starts after worker_timeout (evicted as never joined) still
// joins within no_worker_grace and the job runs to its end.
BOOST_AUTO_TEST_CASE(late_worker_joins_after_worker_timeout) {
  fault_job::job j(1);
  BOOST_TEST_REQUIRE(j.ok());
  const std::vector<std::string> common = {"--policy", "asp", "--elements", "64"};
  const pid_t srv = j.start_server(cat(common, {"--worker-timeout-ms", "300", "--no-worker-grace-ms", "20000"}));
  BOOST_TEST_REQUIRE(srv > 0);
  // Bounded: the eviction is printed at most a few hundred ms after 300 ms.
  BOOST_TEST_REQUIRE(process::wait_for_text(srv, j.dir() + "/server.log", "worker 0 evicted: never joined", 30s));
  const pid_t w = j.start_worker(0, cat(common, {"--quadratic", "2", "--cycles", "10", "--timeout-ms", "20000"}));
  const auto o = j.finish(w, 60s, "worker0.log");
  BOOST_TEST(o.exit_code == 0, o.log());
  const auto so = j.finish(srv, 60s, "server.log");
  BOOST_TEST(so.exit_code == 0, so.log());
  BOOST_TEST(has(so.log(), "server ended: all_left"), so.log());
  BOOST_TEST(j.server_counters().at("commits_applied") == 10.0);
}

// Nobody comes: the server ends after no_worker_grace, saying why.
BOOST_AUTO_TEST_CASE(server_ends_after_grace_with_no_worker) {
  fault_job::job j(2);
  BOOST_TEST_REQUIRE(j.ok());
  const pid_t srv = j.start_server({"--policy", "bsp", "--elements", "64", "--no-worker-grace-ms", "1000"});
  BOOST_TEST_REQUIRE(srv > 0);
  const auto so = j.finish(srv, 30s, "server.log");
  BOOST_TEST(!so.timed_out, so.log());
  BOOST_TEST(so.exit_code == 0, so.log());
  BOOST_TEST(has(so.log(), "no worker connected for"), so.log());
  BOOST_TEST(has(so.log(), "no_worker_grace 1.0 s"), so.log());
  BOOST_TEST(has(so.log(), "server ended: no_worker"), so.log());
}

// The grace is also read from the launch contract (ASHL_NO_WORKER_GRACE).
BOOST_AUTO_TEST_CASE(grace_from_the_environment) {
  fault_job::job j(1);
  BOOST_TEST_REQUIRE(j.ok());
  const pid_t srv =
      j.start_server({"--policy", "asp", "--elements", "64"}, "server.log", 30s, {{"ASHL_NO_WORKER_GRACE", "0.5"}});
  BOOST_TEST_REQUIRE(srv > 0);
  const auto so = j.finish(srv, 30s, "server.log");
  BOOST_TEST(so.exit_code == 0, so.log());
  BOOST_TEST(has(so.log(), "no_worker_grace 0.5 s"), so.log());
}

#endif
