#include <ashl/ps/server.hpp>

#include <cstdio>

// Parameter-server jobs as real processes over UCX on loopback: ashl-run
// starts S servers and 4 workers of test/programs/ps_node.cpp, once with
// UCX's shared-memory transports and once with TCP; the files the
// processes write are checked against a single-process server_core run.

#if !ASHL_HAS_UCX() || !defined(ASHL_TEST_PS_NODE) || !defined(ASHL_RUN_PATH)
int main() {
  std::puts("skipped: ps/ucx_job needs the ucx component (UCX and OpenSSL) and ashl-run");
  return 77;
}
#else

#include <boost/test/unit_test.hpp>

#include "../support/process.hpp"
#include "../support/ps_job.hpp"
#include "../support/node_files.hpp"

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace ps = ashl::ps;
using namespace std::chrono_literals;

namespace {

// Shared memory (sysv/posix/cma) for data, TCP for the connection's setup
// (docs/transport.md), or TCP for everything; --verbose logs which.
// UCX_NET_DEVICES=lo: TCP only over loopback (UCX would also use the host's
// other interfaces for a worker-address endpoint; tests talk to 127.0.0.1 only).
const std::vector<std::pair<std::string, std::string>> shm = {{"UCX_TLS", "sm,self,tcp"}, {"UCX_NET_DEVICES", "lo"}};
const std::vector<std::pair<std::string, std::string>> tcp = {{"UCX_TLS", "tcp,self"}, {"UCX_NET_DEVICES", "lo"}};

struct job_out {
  process::outcome run;
  std::string dir;
  std::vector<float> params;  // every server's shard, in order
  std::vector<std::map<std::string, double>> servers, workers;
  std::vector<std::vector<std::vector<double>>> cycles;  // per worker: stage, plan H, iterations run, ratio
};

// Every job's workers meet in a shared counter file before their first
// commit (ps_node --shared), so they train together.
job_out run_job(std::uint32_t servers, std::uint32_t workers, const std::vector<std::string>& args,
                const std::vector<std::pair<std::string, std::string>>& env) {
  job_out o;
  o.dir = process::temp_dir("ashl-ucx-job");
  BOOST_TEST_REQUIRE(!o.dir.empty());
  const std::string shared = o.dir + "/counters";
  {
    std::ofstream f(shared, std::ios::binary);
    std::vector<char> zeros(64 * 8, 0);
    f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  }
  std::vector<std::string> argv = {ASHL_RUN_PATH, "-s", std::to_string(servers), "-w", std::to_string(workers),
                                   "--timeout", "120", "--verbose", "--", ASHL_TEST_PS_NODE, "--out", o.dir,
                                   "--shared", shared};
  argv.insert(argv.end(), args.begin(), args.end());
  o.run = process::run(argv, env, 150s, o.dir + "/log.txt");
  for (std::uint32_t s = 0; s < servers; ++s) {
    std::ifstream f(o.dir + "/server" + std::to_string(s) + ".f32", std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const std::size_t n0 = o.params.size();
    o.params.resize(n0 + bytes.size() / sizeof(float));
    if (!bytes.empty()) std::memcpy(o.params.data() + n0, bytes.data(), bytes.size());
    o.servers.push_back(node_files::read_counters(o.dir + "/server" + std::to_string(s) + ".txt"));
  }
  o.cycles.resize(workers);
  for (std::uint32_t k = 0; k < workers; ++k)
    o.workers.push_back(node_files::read_counters(o.dir + "/worker" + std::to_string(k) + ".txt", &o.cycles[k]));
  return o;
}

using ps_job::bsp_reference;  // the BSP run the processes must equal

}  // namespace

// The two-server jobs send their replies and their commits in parts of 64
// KiB (4 parts of a 200 KB shard, each a rendezvous;
// server_params.reply_part_bytes, worker_params.commit_part_bytes with two
// in flight; docs/ps.md "Commits in parts"), the one-server jobs whole.
BOOST_AUTO_TEST_CASE(bsp_over_ucx_is_bit_identical_to_one_server_core) {
  constexpr std::size_t n = 100'003;  // 400 KB: rendezvous-sized replies
  constexpr int cycles = 12;
  const auto want = bsp_reference(4, n, cycles);
  for (std::uint32_t servers : {1u, 2u}) {
    for (const auto* env : {&shm, &tcp}) {
      const std::string what = "servers " + std::to_string(servers) + ", " + env->front().second;
      auto o = run_job(servers, 4,
                       {"--policy", "bsp", "--elements", std::to_string(n), "--cycles", std::to_string(cycles),
                        "--reply-part-kib", servers == 2 ? "64" : "0", "--commit-part-kib", servers == 2 ? "64" : "0",
                        "--commit-window", "2"},
                       *env);
      BOOST_TEST_REQUIRE(o.run.exit_code == 0, what << "\n" << o.run.log());
      // --verbose: each connection says which transports carry its data.
      const std::string log = o.run.log();
      if (env == &shm) BOOST_TEST(log.find("/memory") != std::string::npos, what << ": no shared memory in\n" << log);
      else BOOST_TEST((log.find("connected over tcp") != std::string::npos && log.find("/memory") == std::string::npos),
                      what << ": not tcp only in\n" << log);
      BOOST_TEST_REQUIRE(o.params.size() == n, what);
      BOOST_TEST(std::memcmp(o.params.data(), want.data(), n * sizeof(float)) == 0, what);
      for (const auto& s : o.servers) {
        BOOST_TEST(s.at("commits_applied") == 4.0 * cycles, what);
        BOOST_TEST(s.at("refused") + s.at("wire_refused") == 0.0, what);
        BOOST_TEST(s.at("finished") == 1.0, what);
        BOOST_TEST(s.at("commits_in_parts") == (servers == 2 ? 4.0 * cycles : 0.0), what);
      }
      for (const auto& w : o.workers) {
        BOOST_TEST(w.at("commits") == cycles, what);
        // Parts of the join's pull and every cycle's, from each server.
        BOOST_TEST(w.at("reply_parts") == (servers == 2 ? 2.0 * 4 * (cycles + 1) : 0.0), what);
        BOOST_TEST(w.at("commit_parts") == (servers == 2 ? 2.0 * 4 * cycles : 0.0), what);
      }
    }
  }
}

// Lanes without CRC over real UCX (ps_node --trust-local-lanes: every end
// trusts its peers on this host; docs/ps.md "Lanes without CRC"): the
// workers reach the servers at 127.0.0.1, so every commit part and reply
// part goes without a CRC-32C, and the result is BSP's, bit for bit.
BOOST_AUTO_TEST_CASE(bsp_over_ucx_on_trusted_local_lanes_sends_no_crc_and_is_bit_identical) {
  constexpr std::size_t n = 100'003;
  constexpr int cycles = 8;
  const auto want = bsp_reference(4, n, cycles);
  auto o = run_job(2, 4,
                   {"--policy", "bsp", "--elements", std::to_string(n), "--cycles", std::to_string(cycles),
                    "--reply-part-kib", "64", "--commit-part-kib", "64", "--commit-window", "2", "--trust-local-lanes"},
                   shm);
  BOOST_TEST_REQUIRE(o.run.exit_code == 0, o.run.log());
  BOOST_TEST_REQUIRE(o.params.size() == n);
  BOOST_TEST(std::memcmp(o.params.data(), want.data(), n * sizeof(float)) == 0);
  for (const auto& s : o.servers) {
    BOOST_TEST(s.at("refused") + s.at("wire_refused") == 0.0);
    BOOST_TEST(s.at("unchecked_in") == 4.0 * 4 * cycles);        // every commit part of the four workers
    BOOST_TEST(s.at("unchecked_out") == 4.0 * 4 * (cycles + 1));  // every reply part, the joins' too
  }
  for (const auto& w : o.workers) {
    BOOST_TEST(w.at("unchecked_out") == 2.0 * 4 * cycles);
    BOOST_TEST(w.at("unchecked_in") == 2.0 * 4 * (cycles + 1));
  }
}

BOOST_AUTO_TEST_CASE(ssp_over_ucx_never_exceeds_the_bound) {
  auto o = run_job(1, 4,
                   {"--policy", "ssp", "--staleness", "2", "--optimizer", "delta", "--cycles", "30", "--slow-rank", "0",
                    "--slow-ms", "4", "--ssp-check"},
                   shm);
  BOOST_TEST_REQUIRE(o.run.exit_code == 0, o.run.log());
  double max_gap = 0;
  for (const auto& w : o.workers) {
    BOOST_TEST(w.at("violations") == 0.0);
    max_gap = std::max(max_gap, w.at("max_gap"));
  }
  BOOST_TEST(max_gap >= 1.0);                     // the fast workers ran ahead ...
  BOOST_TEST(o.servers[0].at("pulls_held") > 0.0);  // ... and were held at the bound
  BOOST_TEST(o.servers[0].at("commits_applied") == 4.0 * 30);
}

// With batched applies (server_params.apply_batch 8; 400 KB shards, so
// commits arrive by rendezvous into the server's receive buffers): commits
// that one progress pass delivers wait and are added in one pass; every
// commit is applied once and every pull answered, whatever the batches were.
BOOST_AUTO_TEST_CASE(asp_over_ucx_never_holds_a_pull) {
  auto o = run_job(2, 4, {"--policy", "asp", "--optimizer", "delta", "--cycles", "20", "--slow-rank", "0", "--slow-ms", "2",
                          "--apply-batch", "8", "--elements", "200000"},
                   tcp);
  BOOST_TEST_REQUIRE(o.run.exit_code == 0, o.run.log());
  for (const auto& s : o.servers) {
    BOOST_TEST(s.at("pulls_held") == 0.0);
    BOOST_TEST(s.at("pulls_served") == s.at("pulls"));
    BOOST_TEST(s.at("commits_applied") == 4.0 * 20);
    BOOST_TEST(s.at("wire_refused") == 0.0);
    BOOST_TEST(s.at("batched_commits") <= s.at("commits_applied"));
    BOOST_TEST(s.at("batched_commits") >= 2.0 * s.at("batched_applies"));  // a pass adds 2 or more
  }
  for (const auto& w : o.workers) {
    BOOST_TEST(w.at("commits") == 20.0);
    BOOST_TEST(w.at("errors") == 0.0);
  }
}

BOOST_AUTO_TEST_CASE(ashl_over_ucx_switches_stages_and_workers_follow) {
  auto o = run_job(2, 4,
                   {"--policy", "ashl", "--optimizer", "delta", "--cycles", "30", "--profile-iterations", "3", "--h-ahl",
                    "4", "--h-shl", "2", "--compression-ratio", "0.1", "--switch-loss", "0.5", "--loss-switch-cycle", "15",
                    "--together", "2"},
                   shm);
  BOOST_TEST_REQUIRE(o.run.exit_code == 0, o.run.log());
  const double ahl = static_cast<double>(ashl::stage_id::ahl), shl = static_cast<double>(ashl::stage_id::shl);
  for (std::size_t k = 0; k < o.cycles.size(); ++k) {
    bool saw_ahl = false, saw_shl = false;
    BOOST_TEST_REQUIRE(o.cycles[k].size() == 30u);
    for (const auto& c : o.cycles[k]) {
      // stage, plan H, iterations run, ratio
      if (c[1] > 0) BOOST_TEST(c[2] == c[1], "worker " << k);
      if (c[0] == ahl) {
        saw_ahl = true;
        BOOST_TEST(c[1] == 4.0);
        BOOST_TEST(c[3] < 1.0);  // AHL compresses
      }
      if (c[0] == shl) {
        saw_shl = true;
        BOOST_TEST(c[1] == 2.0);
      }
    }
    BOOST_TEST(saw_ahl, "worker " << k);
    BOOST_TEST(saw_shl, "worker " << k);
  }
  for (const auto& s : o.servers) {
    BOOST_TEST(s.at("stage") == shl);
    BOOST_TEST(s.at("refused") + s.at("wire_refused") == 0.0);
  }
}

#endif
