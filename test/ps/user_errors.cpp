#include <ashl/ps/server.hpp>

#include <cstdio>

// Mistakes a user makes when starting a job, as real processes over UCX:
// each one ends within a bound, with a non-zero exit and one message that
// names the value at fault.

#if !ASHL_HAS_UCX() || !defined(ASHL_TEST_PS_NODE) || !defined(ASHL_RUN_PATH)
int main() {
  std::puts("skipped: ps/user_errors needs the ucx component (UCX and OpenSSL) and ashl-run");
  return 77;
}
#else

#include <boost/test/unit_test.hpp>

#include "../support/process.hpp"

#include <string>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using env_t = std::vector<std::pair<std::string, std::string>>;

namespace {

const std::string dir = process::temp_dir("ashl-user-errors");

env_t contract(const std::string& role, const std::string& addr, const std::string& token) {
  env_t e = {{"ASHL_ROLE", role}, {"ASHL_RANK", "0"}, {"ASHL_NUM_WORKERS", "1"}, {"ASHL_NUM_SERVERS", "1"},
             {"ASHL_SERVER_ADDR", addr}, {"UCX_TLS", "tcp,self"}, {"UCX_NET_DEVICES", "lo"}};
  if (!token.empty()) e.emplace_back("ASHL_TOKEN", token);
  return e;
}

std::string addr_of(int port) { return "127.0.0.1:" + std::to_string(port); }

// Runs ps_node with `args`; checks it failed within `bound` and its output
// names `what`.
void expect_failure(const std::string& name, const env_t& env, const std::vector<std::string>& args,
                    const std::string& what, std::chrono::milliseconds bound = 20s) {
  std::vector<std::string> argv = {ASHL_TEST_PS_NODE};
  argv.insert(argv.end(), args.begin(), args.end());
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = process::run(argv, env, bound + 10s, dir + "/" + name + ".log");
  const auto took = std::chrono::steady_clock::now() - t0;
  const std::string log = r.log();
  BOOST_TEST(!r.timed_out, name);
  BOOST_TEST(r.exit_code != 0, name << ": " << log);
  BOOST_TEST((took < bound), name << " took too long");
  BOOST_TEST(log.find(what) != std::string::npos, name << ": expected '" << what << "' in:\n" << log);
}

// A server of its own on a free loopback port (another one if a port found
// free was taken before the server bound it), until the test ends.
struct running_server {
  pid_t pid = -1;
  std::string addr, log;
  explicit running_server(const std::string& token, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {ASHL_TEST_PS_NODE, "--max-seconds", "30"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    for (int attempt = 0; attempt < 5; ++attempt) {
      addr = addr_of(process::free_port());
      log = dir + "/server-" + std::to_string(attempt) + "-" + addr.substr(addr.find(':') + 1) + ".log";
      pid = process::start(argv, contract("server", addr, token), log);
      if (process::wait_for_text(pid, log, "listening on", 10s)) return;
      (void)process::finish(pid, 5s, log);
      pid = -1;
    }
    BOOST_TEST_REQUIRE(pid > 0, "no server came up on a free port in 5 attempts");
  }
  ~running_server() {
    if (pid <= 0) return;
    ::kill(-pid, SIGKILL);
    (void)process::finish(pid, 5s, log);
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_malformed_address_is_named) {
  expect_failure("malformed-address", contract("worker", "localhost", "user-errors-test-token"), {}, "ASHL_SERVER_ADDR = 'localhost'");
}

BOOST_AUTO_TEST_CASE(a_job_without_a_token_refuses_to_start) {
  expect_failure("no-token", contract("worker", "127.0.0.1:1", ""), {}, "ASHL_TOKEN");
}

BOOST_AUTO_TEST_CASE(a_server_that_never_comes_up_is_named_after_the_deadline) {
  const std::string addr = addr_of(process::free_port());
  expect_failure("never-up", contract("worker", addr, "user-errors-test-token"), {"--connect-timeout", "2"}, addr, 15s);
}

BOOST_AUTO_TEST_CASE(a_port_in_use_is_named) {
  running_server first("user-errors-test-token");
  expect_failure("port-in-use", contract("server", first.addr, "user-errors-test-token"), {}, first.addr);
  process::outcome o{.log_path = dir + "/port-in-use.log"};
  BOOST_TEST(o.log().find("in use") != std::string::npos, o.log());
}

BOOST_AUTO_TEST_CASE(a_token_mismatch_is_named) {
  running_server srv("the right token, long enough");
  expect_failure("token", contract("worker", srv.addr, "a wrong token, long enough"), {}, "token mismatch");
}

// The model's size is part of the job id (ps/identity.hpp): the join is
// refused, naming both ids and the server's shape.
BOOST_AUTO_TEST_CASE(a_model_of_another_size_is_named) {
  running_server srv("user-errors-test-token", {"--elements", "1000"});
  expect_failure("size", contract("worker", srv.addr, "user-errors-test-token"), {"--elements", "999"},
                 "join.job = " + ashl::ps::job_id_text(ashl::ps::make_job_id("", 999, 1, 1)));
  process::outcome o{.log_path = dir + "/size.log"};
  BOOST_TEST(o.log().find("a model of 1000 elements, at most 1 workers, 1 servers") != std::string::npos, o.log());
}

// Issue 44, item 6: a worker count past ps::max_workers aborted a server
// with an uncaught std::bad_alloc (its per-worker tables sized by it); it is
// refused by name before anything is sized, with a clean exit status.
BOOST_AUTO_TEST_CASE(a_worker_count_past_the_bound_is_named_not_an_abort) {
  env_t e = contract("server", addr_of(process::free_port()), "user-errors-test-token");
  for (auto& [k, v] : e)
    if (k == "ASHL_NUM_WORKERS") v = "100000000";
  expect_failure("too-many-workers", e, {}, "ASHL_NUM_WORKERS = '100000000': must be at most 65536 (ps::max_workers)");
  process::outcome o{.log_path = dir + "/too-many-workers.log"};
  BOOST_TEST(o.log().find("bad_alloc") == std::string::npos, o.log());
}

#endif
