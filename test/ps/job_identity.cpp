#include <ashl/ps/identity.hpp>

#include <cstdio>

// Job identity as real processes (docs/checkpoints.md "The state a server writes"): a server restoring a
// checkpoint of another job (elements, workers, policy, codec or job name
// differ) refuses to start, naming the field and both values; a worker of
// another job (its ASHL_JOB differs) is refused at join naming both job ids,
// and the server goes on with its own workers. ashl_test_ps_node over
// UCX/TCP on 127.0.0.1 (test/support/fault_job.hpp).

#if !ASHL_HAS_UCX() || !defined(ASHL_TEST_PS_NODE)
int main() {
  std::puts("skipped: ps/job_identity needs the ucx component (UCX and OpenSSL)");
  return 77;
}
#else

#include <ashl/ps/checkpoint.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/fault_job.hpp"

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

using fault_job::cat;

using fault_job::has;

}  // namespace

// Issue 24's reproduction: a 3-worker BSP checkpoint restored with 2
// workers hung waiting for rank 2. Every field of the job's identity is
// changed in turn; each restart is refused before it listens.
BOOST_AUTO_TEST_CASE(checkpoint_of_another_job_is_refused_by_field) {
  fault_job::job j(3);
  BOOST_TEST_REQUIRE(j.ok());
  const std::string ckpt = j.dir() + "/ckpt";
  std::filesystem::create_directories(ckpt);
  const std::vector<std::string> common = {"--policy", "bsp", "--elements", "64"};
  const pid_t srv = j.start_server(cat(common, {"--checkpoint-dir", ckpt}), "server.log", 30s, {{"ASHL_JOB", "a"}});
  BOOST_TEST_REQUIRE(srv > 0);
  std::vector<pid_t> w;
  for (std::uint32_t k = 0; k < 3; ++k)
    w.push_back(j.start_worker(k, cat(common, {"--quadratic", "2", "--cycles", "5"}), "", true, {{"ASHL_JOB", "a"}}));
  for (std::uint32_t k = 0; k < 3; ++k)
    BOOST_TEST_REQUIRE(j.finish(w[k], 60s, "worker" + std::to_string(k) + ".log").exit_code == 0);
  BOOST_TEST_REQUIRE(j.finish(srv, 60s, "server.log").exit_code == 0);
  const std::string file = ashl::ps::checkpoint_file(ckpt, 0);
  BOOST_TEST_REQUIRE(std::filesystem::exists(file));

  struct change {
    std::string name;
    std::vector<std::string> args;
    std::string workers, job, expected;
  };
  const std::vector<change> changes = {
      {"workers", common, "2", "a", "checkpoint.max_workers = 3: this server's job admits at most 2 workers"},
      {"elements", {"--policy", "bsp", "--elements", "32"}, "3", "a",
       "checkpoint.elements = 64: this server's model has 32 elements"},
      {"policy", {"--policy", "asp", "--elements", "64"}, "3", "a",
       "checkpoint.policy = \"bsp\": this server runs \"asp\""},
      {"codec", cat(common, {"--codec", "qsgd"}), "3", "a",
       "checkpoint.codec = \"topk\": this server compresses with qsgd"},
      {"job", common, "3", "b",
       "checkpoint.job = \"" + ashl::ps::job_id_text(ashl::ps::make_job_id("a", 64, 3, 1)) +
           "\": this server's job is " + ashl::ps::job_id_text(ashl::ps::make_job_id("b", 64, 3, 1))},
  };
  for (const change& c : changes) {
    const std::string log = "restore-" + c.name + ".log";
    const pid_t again = process::start(
        cat({ASHL_TEST_PS_NODE, "--out", j.dir()}, cat(c.args, {"--checkpoint-dir", ckpt, "--restore"})),
        {{"UCX_NET_DEVICES", "lo"}, {"ASHL_ROLE", "server"}, {"ASHL_NUM_WORKERS", c.workers}, {"ASHL_JOB", c.job},
         {"ASHL_SERVER_ADDR", "127.0.0.1:" + std::to_string(process::free_port())}, {"ASHL_TOKEN", "job-identity-test-token"}},
        j.dir() + "/" + log);
    const auto o = j.finish(again, 60s, log);
    BOOST_TEST(o.exit_code == 1, c.name << ": " << o.log());
    BOOST_TEST(has(o.log(), file), c.name << ": " << o.log());
    BOOST_TEST(has(o.log(), c.expected), c.name << ": " << o.log());
    BOOST_TEST(!has(o.log(), "listening on"), c.name << ": " << o.log());
  }
  // The same job restores (and ends at once: nobody comes within the grace).
  const pid_t same = process::start(
      cat({ASHL_TEST_PS_NODE, "--out", j.dir()}, cat(common, {"--checkpoint-dir", ckpt, "--restore",
                                                               "--no-worker-grace-ms", "200"})),
      {{"UCX_NET_DEVICES", "lo"}, {"ASHL_ROLE", "server"}, {"ASHL_NUM_WORKERS", "3"}, {"ASHL_JOB", "a"},
       {"ASHL_SERVER_ADDR", "127.0.0.1:" + std::to_string(process::free_port())}, {"ASHL_TOKEN", "job-identity-test-token"}},
      j.dir() + "/restore-same.log");
  const auto os = j.finish(same, 60s, "restore-same.log");
  BOOST_TEST(os.exit_code == 0, os.log());
  BOOST_TEST(has(os.log(), "restored version"), os.log());
  // Fewer workers of the same maximum (docs/elastic.md §2.2): 2 of at most
  // 3 is the 3-worker job (the same id, PSID's max_workers) and restores.
  const pid_t fewer = process::start(
      cat({ASHL_TEST_PS_NODE, "--out", j.dir()}, cat(common, {"--checkpoint-dir", ckpt, "--restore",
                                                               "--no-worker-grace-ms", "200"})),
      {{"UCX_NET_DEVICES", "lo"}, {"ASHL_ROLE", "server"}, {"ASHL_NUM_WORKERS", "2"}, {"ASHL_MAX_WORKERS", "3"},
       {"ASHL_JOB", "a"}, {"ASHL_SERVER_ADDR", "127.0.0.1:" + std::to_string(process::free_port())},
       {"ASHL_TOKEN", "job-identity-test-token"}},
      j.dir() + "/restore-fewer.log");
  const auto of = j.finish(fewer, 60s, "restore-fewer.log");
  BOOST_TEST(of.exit_code == 0, of.log());
  BOOST_TEST(has(of.log(), "restored version"), of.log());
}

// A worker of another job (same token, another ASHL_JOB) reaches this
// server's address: refused at join naming both job ids; the server's own
// worker then trains and the job ends normally.
BOOST_AUTO_TEST_CASE(worker_of_another_job_is_refused) {
  fault_job::job j(1);
  BOOST_TEST_REQUIRE(j.ok());
  const std::vector<std::string> common = {"--policy", "asp", "--elements", "64"};
  const pid_t srv = j.start_server(common, "server.log", 30s, {{"ASHL_JOB", "alpha"}});
  BOOST_TEST_REQUIRE(srv > 0);
  const auto worker_args = cat(common, {"--quadratic", "2", "--cycles", "10", "--timeout-ms", "20000"});
  const pid_t other = j.start_worker(0, worker_args, "other.log", false, {{"ASHL_JOB", "beta"}});
  const auto oo = j.finish(other, 60s, "other.log");
  BOOST_TEST(oo.exit_code == 1, oo.log());
  const std::string beta = ashl::ps::job_id_text(ashl::ps::make_job_id("beta", 64, 1, 1));
  const std::string alpha = ashl::ps::job_id_text(ashl::ps::make_job_id("alpha", 64, 1, 1));
  BOOST_TEST(has(oo.log(), "join.job = " + beta + ": this server (0) runs job " + alpha), oo.log());
  const pid_t own = j.start_worker(0, worker_args, "", false, {{"ASHL_JOB", "alpha"}});
  const auto o = j.finish(own, 60s, "worker0.log");
  BOOST_TEST(o.exit_code == 0, o.log());
  const auto so = j.finish(srv, 60s, "server.log");
  BOOST_TEST(so.exit_code == 0, so.log());
  const auto s = j.server_counters();
  BOOST_TEST(s.at("job_refused") == 1.0);
  BOOST_TEST(s.at("commits_applied") == 10.0);
}

#endif
