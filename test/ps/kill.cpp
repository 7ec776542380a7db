#include <ashl/ps/server.hpp>

#include <cstdio>

// Faults as real processes (docs/ps.md "Faults, checkpoints and rejoining"): a worker SIGKILLed in the middle of
// training is evicted (its UCX endpoint fails) and the others reach the
// target; a new process for its rank joins later and gets the current
// parameters and its plan; a SIGKILLed server makes every worker exit with a
// clear error, within its timeout. ashl_test_ps_node over UCX/TCP on
// 127.0.0.1 (test/support/fault_job.hpp); training is a quadratic (gradient
// w - T), so "reached the target" is |w - T| small. On the server's side
// every commit a worker was acknowledged (its wait() succeeded) was applied
// exactly once: commits_applied is the acknowledged count, plus at most the
// one commit the killed worker had in flight (applied, its reply lost with
// the process), and nothing was dropped as a duplicate. BSP runs over
// shared memory too (UCX_TLS sm,self,tcp).

constexpr const char* over_tcp = "tcp,self";
constexpr const char* over_shm = "sm,self,tcp";

#if !ASHL_HAS_UCX() || !defined(ASHL_TEST_PS_NODE)
int main() {
  std::puts("skipped: ps/kill needs the ucx component (UCX and OpenSSL)");
  return 77;
}
#else

#include <boost/test/unit_test.hpp>

#include "../support/fault_job.hpp"

#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

constexpr float target = 2.0f;

std::vector<std::string> policy_args(const std::string& policy) {
  if (policy == "ssp") return {"--policy", "ssp", "--staleness", "2"};
  if (policy == "ashl")
    return {"--policy", "ashl", "--profile-iterations", "3", "--h-ahl", "2", "--h-shl", "1", "--loss-switch-cycle", "40"};
  return {"--policy", policy};
}

using fault_job::cat;

float max_distance(const std::vector<float>& w) { return fault_job::max_distance(w, target); }

// The server's counters against the workers' acknowledged commits: applied
// once each, at most `in_flight` more (commits of killed processes whose
// replies were lost), no duplicates.
void applied_is_acknowledged(const fault_job::job& j, const std::map<std::string, double>& s, std::uint64_t in_flight,
                             const std::string& what) {
  const double acked = static_cast<double>(j.commits_acknowledged_total());
  BOOST_TEST(acked > 0.0, what);
  BOOST_TEST(s.at("duplicates") == 0.0, what);
  BOOST_TEST(s.at("commits_applied") >= acked, what << ": applied " << s.at("commits_applied") << ", acknowledged " << acked);
  BOOST_TEST(s.at("commits_applied") <= acked + static_cast<double>(in_flight),
             what << ": applied " << s.at("commits_applied") << ", acknowledged " << acked);
  BOOST_TEST(s.at("commits_applied") + s.at("commits_dropped") <= static_cast<double>(j.commits_started_total()), what);
}

// 3 workers train; worker 2 is SIGKILLed after 15 commits; 0 and 1 finish.
void kill_one_worker(const std::string& policy, const char* tls = over_tcp) {
  fault_job::job j(3, "ashl-fault-job", tls);
  BOOST_TEST_REQUIRE(j.ok());
  const auto common = cat(policy_args(policy), {"--elements", "64"});
  // Rank 2 never leaves: the server ends 2 s after the survivors left.
  const pid_t srv = j.start_server(cat(common, {"--worker-timeout-ms", "20000", "--no-worker-grace-ms", "2000"}));
  BOOST_TEST_REQUIRE(srv > 0);
  const auto worker_args = cat(common, {"--quadratic", "2", "--cycles", "150", "--cycle-ms", "3", "--timeout-ms", "30000"});
  pid_t w[3];
  for (std::uint32_t k = 0; k < 3; ++k) w[k] = j.start_worker(k, worker_args);
  BOOST_TEST_REQUIRE(j.wait_commits(2, 15, 60s));
  j.signal(w[2], SIGKILL);
  for (std::uint32_t k = 0; k < 2; ++k) {
    const auto o = j.finish(w[k], 90s, "worker" + std::to_string(k) + ".log");
    BOOST_TEST(o.exit_code == 0, policy << ": worker " << k << " " << o.log());
  }
  const auto so = j.finish(srv, 60s, "server.log");
  BOOST_TEST(so.exit_code == 0, policy << ": server " << so.log());
  BOOST_TEST(so.log().find("server ended: no_worker") != std::string::npos, policy << ": server " << so.log());
  const auto s = j.server_counters();
  BOOST_TEST(s.at("peers_failed") >= 1.0, policy);
  BOOST_TEST(s.at("evictions") >= 1.0, policy);
  BOOST_TEST(s.at("refused") == 0.0, policy);
  // Every commit of the survivors was applied once (ASP-like policies apply
  // each; BSP's rounds apply each in its round).
  BOOST_TEST(j.worker_counters(0).at("commits") == 150.0);
  BOOST_TEST(j.worker_counters(1).at("commits") == 150.0);
  BOOST_TEST(max_distance(j.parameters()) < 1e-3f, policy << ": the survivors did not reach the target");
  applied_is_acknowledged(j, s, 1, policy + " over " + tls);
}

}  // namespace

BOOST_AUTO_TEST_CASE(kill_worker_bsp) { kill_one_worker("bsp"); }
BOOST_AUTO_TEST_CASE(kill_worker_ssp) { kill_one_worker("ssp"); }
BOOST_AUTO_TEST_CASE(kill_worker_ashl) { kill_one_worker("ashl"); }
BOOST_AUTO_TEST_CASE(kill_worker_bsp_over_shared_memory) { kill_one_worker("bsp", over_shm); }

// A killed worker's rank is taken by a new process (a larger incarnation,
// the fresh one every process start gets): it joins mid-training, receives
// the current parameters and its plan, and finishes with the others.
BOOST_AUTO_TEST_CASE(kill_worker_then_a_new_one_joins) {
  fault_job::job j(3);
  BOOST_TEST_REQUIRE(j.ok());
  const std::vector<std::string> common = {"--policy", "bsp", "--elements", "64"};
  const pid_t srv = j.start_server(common);
  BOOST_TEST_REQUIRE(srv > 0);
  const auto worker_args = cat(common, {"--quadratic", "2", "--cycles", "120", "--cycle-ms", "3", "--timeout-ms", "30000"});
  pid_t w[3];
  for (std::uint32_t k = 0; k < 3; ++k) w[k] = j.start_worker(k, worker_args);
  BOOST_TEST_REQUIRE(j.wait_commits(2, 10, 60s));
  j.signal(w[2], SIGKILL);
  BOOST_TEST_REQUIRE(j.wait_commits(0, 40, 60s));
  const pid_t again = j.start_worker(2, worker_args, "worker2-again.log");
  const auto o2 = j.finish(again, 90s, "worker2-again.log");
  BOOST_TEST(o2.exit_code == 0, o2.log());
  for (std::uint32_t k = 0; k < 2; ++k) {
    const auto o = j.finish(w[k], 90s, "worker" + std::to_string(k) + ".log");
    BOOST_TEST(o.exit_code == 0, o.log());
  }
  const auto so = j.finish(srv, 60s, "server.log");
  BOOST_TEST(so.exit_code == 0, so.log());
  const auto s = j.server_counters();
  BOOST_TEST(s.at("joins") >= 1.0);  // the new incarnation (ranks 0-2 are live from creation)
  BOOST_TEST(s.at("evictions") >= 1.0);
  BOOST_TEST(s.at("duplicates") == 0.0);
  BOOST_TEST(so.log().find("server ended: all_left") != std::string::npos, so.log());
  BOOST_TEST(j.worker_counters(2).at("commits") == 120.0);  // the new process's file
  BOOST_TEST(j.worker_counters(2).at("plans") >= 1.0);
  BOOST_TEST(max_distance(j.parameters()) < 1e-3f);
  applied_is_acknowledged(j, s, 1, "rank 2 replaced");  // both processes of rank 2 count in slot 34
}

// The server dies: every worker (no reconnect) exits with an error naming
// the server, well within its 10 s timeout, and none hangs.
BOOST_AUTO_TEST_CASE(kill_server_workers_fail_clearly) {
  fault_job::job j(3);
  BOOST_TEST_REQUIRE(j.ok());
  const std::vector<std::string> common = {"--policy", "asp", "--elements", "64"};
  const pid_t srv = j.start_server(common);
  BOOST_TEST_REQUIRE(srv > 0);
  const auto worker_args = cat(common, {"--quadratic", "2", "--cycles", "100000", "--cycle-ms", "2", "--timeout-ms", "10000"});
  pid_t w[3];
  for (std::uint32_t k = 0; k < 3; ++k) w[k] = j.start_worker(k, worker_args);
  BOOST_TEST_REQUIRE(j.wait_commits(0, 20, 60s));
  j.signal(srv, SIGKILL);
  for (std::uint32_t k = 0; k < 3; ++k) {
    const auto o = j.finish(w[k], 60s, "worker" + std::to_string(k) + ".log");
    BOOST_TEST(!o.timed_out, "worker " << k << " hung: " << o.log());
    BOOST_TEST(o.exit_code == 1, o.log());
    BOOST_TEST(o.log().find("server 0 at " + j.address()) != std::string::npos, o.log());
  }
}

#endif
