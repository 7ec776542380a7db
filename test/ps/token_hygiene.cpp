#include <ashl/ps/launch.hpp>

#include <cstdio>

// Token hygiene as real processes (docs/multi-host.md "The token"): a token on a command
// line is refused (ashl_test_ps_node through ps::job_from, and ashl-run),
// naming the flag and ASHL_TOKEN; a token shorter than 16 bytes is refused
// by its length, never printed; --insecure makes every process (server and
// worker) print a warning; and a program a server or worker starts (a data
// loader, a shell) does not inherit ASHL_TOKEN. ashl_test_ps_node under
// ashl-run over UCX/TCP on 127.0.0.1.

#if !ASHL_HAS_UCX() || !defined(ASHL_TEST_PS_NODE)
int main() {
  std::puts("skipped: ps/token_hygiene needs the ucx component (UCX and OpenSSL)");
  return 77;
}
#else

#include <boost/test/unit_test.hpp>

#include "../support/node_files.hpp"
#include "../support/process.hpp"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

const std::string token = "0123456789abcdef0123456789abcdef";  // 32 bytes: accepted

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The contract of one server process, without its token.
std::vector<std::pair<std::string, std::string>> server_env() {
  return {{"UCX_NET_DEVICES", "lo"},
          {"ASHL_ROLE", "server"},
          {"ASHL_NUM_WORKERS", "1"},
          {"ASHL_SERVER_ADDR", "127.0.0.1:" + std::to_string(process::free_port())}};
}

struct scratch {
  std::string dir = process::temp_dir("ashl-token-hygiene");
  ~scratch() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_token_on_the_command_line_is_refused) {
  scratch s;
  BOOST_TEST_REQUIRE(!s.dir.empty());
  // ps::job_from (every program of the runtime contract): before it listens.
  auto o = process::run({ASHL_TEST_PS_NODE, "--token", token, "--elements", "64"}, server_env(), 60s,
                        s.dir + "/node.log");
  BOOST_TEST(o.exit_code == 1, o.log());
  BOOST_TEST(has(o.log(), "--token: a token on the command line is visible to every user of this host"), o.log());
  BOOST_TEST(has(o.log(), "pass it in the environment variable ASHL_TOKEN instead"), o.log());
  BOOST_TEST(!has(o.log(), "listening on"), o.log());
  o = process::run({ASHL_TEST_PS_NODE, "--token=" + token, "--insecure", "--elements", "64"}, server_env(), 60s,
                   s.dir + "/node-inline.log");
  BOOST_TEST(o.exit_code == 1, o.log());
  BOOST_TEST(has(o.log(), "--token: a token on the command line"), o.log());
  // ashl-run: a usage error, nothing started.
  o = process::run({ASHL_RUN_PATH, "-s", "1", "-w", "1", "--token", token, "--", ASHL_TEST_PS_NODE}, {}, 60s,
                   s.dir + "/run.log");
  BOOST_TEST(o.exit_code == 2, o.log());
  BOOST_TEST(has(o.log(), "ashl-run: --token: a token on the command line is visible to every user of this host "
                          "(ps); put it in the environment variable ASHL_TOKEN instead"),
             o.log());
  BOOST_TEST(!has(o.log(), "[server 0]"), o.log());
}

BOOST_AUTO_TEST_CASE(a_short_token_is_refused_by_its_length) {
  scratch s;
  BOOST_TEST_REQUIRE(!s.dir.empty());
  const std::string short_token = "tiny-secret";  // 11 bytes
  auto env = server_env();
  env.emplace_back("ASHL_TOKEN", short_token);
  auto o = process::run({ASHL_TEST_PS_NODE, "--elements", "64"}, env, 60s, s.dir + "/node.log");
  BOOST_TEST(o.exit_code == 1, o.log());
  BOOST_TEST(has(o.log(), "ASHL_TOKEN is 11 bytes: a token must have at least 16"), o.log());
  BOOST_TEST(!has(o.log(), short_token), o.log());
  o = process::run({ASHL_RUN_PATH, "-s", "1", "-w", "1", "--", ASHL_TEST_PS_NODE}, {{"ASHL_TOKEN", short_token}},
                   60s, s.dir + "/run.log");
  BOOST_TEST(o.exit_code == 2, o.log());
  BOOST_TEST(has(o.log(), "ashl-run: ASHL_TOKEN is 11 bytes: a token must have at least 16"), o.log());
  BOOST_TEST(!has(o.log(), short_token), o.log());
}

// One job of a server and two workers with a token; each process runs
// `env` as a child (ps_node --child-env) after it parsed the contract.
BOOST_AUTO_TEST_CASE(children_of_servers_and_workers_do_not_inherit_the_token) {
  scratch s;
  BOOST_TEST_REQUIRE(!s.dir.empty());
  auto o = process::run({ASHL_RUN_PATH, "-s", "1", "-w", "2", "--timeout", "120", "--", ASHL_TEST_PS_NODE, "--out",
                         s.dir, "--child-env", "--policy", "asp", "--elements", "64", "--cycles", "3"},
                        {{"ASHL_TOKEN", token}, {"UCX_NET_DEVICES", "lo"}}, 150s, s.dir + "/job.log");
  BOOST_TEST_REQUIRE(o.exit_code == 0, o.log());
  BOOST_TEST(!has(o.log(), "running without authentication"), o.log());
  for (const char* who : {"server0", "worker0", "worker1"}) {
    const std::string env = read_text(s.dir + "/child-env-" + who + ".txt");
    BOOST_TEST(has(env, std::string("ASHL_ROLE=") + (who[0] == 's' ? "server" : "worker")), who << ": " << env);
    BOOST_TEST(!has(env, "ASHL_TOKEN"), who << ": " << env);
    BOOST_TEST(!has(env, token), who << ": " << env);
  }
  // The job did run with that token: every worker's commits arrived.
  const auto c = node_files::read_counters(s.dir + "/server0.txt");
  BOOST_TEST(c.at("commits") == 6.0);
}

BOOST_AUTO_TEST_CASE(insecure_warns_on_every_start) {
  scratch s;
  BOOST_TEST_REQUIRE(!s.dir.empty());
  auto o = process::run({ASHL_RUN_PATH, "-s", "1", "-w", "1", "--insecure", "--timeout", "120", "--",
                         ASHL_TEST_PS_NODE, "--policy", "asp", "--elements", "64", "--cycles", "2"},
                        {{"UCX_NET_DEVICES", "lo"}}, 150s, s.dir + "/job.log");
  BOOST_TEST_REQUIRE(o.exit_code == 0, o.log());
  const std::string warning =
      "ashl: warning: running without authentication (--insecure / ASHL_INSECURE): any process that reaches the "
      "port can join";
  BOOST_TEST(has(o.log(), "[server 0] " + warning), o.log());
  BOOST_TEST(has(o.log(), "[worker 0] " + warning), o.log());
}

#endif
