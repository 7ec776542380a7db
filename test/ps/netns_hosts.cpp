#include "../../examples/netns.hpp"

#include <ashl/ps/server.hpp>

#include <cstdio>

// Emulated hosts (examples/netns.hpp; docs/multi-host.md, "Emulated hosts:
// network namespaces"): namespaces, tbf on both directions of each link and
// cgroup quotas are set up as asked and removed afterwards (also a dead run's
// leftovers); a BSP job of ashl_test_ps_node processes, the server in host 0
// and a worker in each of hosts 1 and 2, runs over UCX/TCP between the
// namespaces and ends bit-identical to one server_core; a host cannot reach
// the root namespace. Skipped (exit 77, with the reason) where the machine
// does not allow namespaces, tbf or cgroup quotas, or without root.

#if !ASHL_HAS_UCX()
int main() {
  std::puts("skipped: ps/netns_hosts needs the ucx component (UCX and OpenSSL)");
  return 77;
}
#else

#include <boost/test/unit_test.hpp>

#include "../support/process.hpp"
#include "../support/ps_job.hpp"
#include "../support/node_files.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace ps = ashl::ps;
using namespace std::chrono_literals;

namespace {

// This executable doubles as a one-shot TCP client for the isolation check:
// with ASHL_NETNS_TEST_CONNECT=ipv4:port it connects there (2 s bound) and
// exits 0 when connected, 3 when not, before any test runs.
int connect_probe(const std::string& target) {
  const auto colon = target.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(target.substr(colon + 1))));
  if (::inet_pton(AF_INET, target.substr(0, colon).c_str(), &a.sin_addr) != 1) return 2;
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  int rc = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{s, POLLOUT, 0};
    int err = ETIMEDOUT;
    socklen_t n = sizeof err;
    if (::poll(&p, 1, 2000) == 1) ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &n);
    rc = err == 0 ? 0 : -1;
    errno = err;
  }
  std::printf("connect %s: %s\n", target.c_str(), rc == 0 ? "connected" : std::strerror(errno));
  ::close(s);
  return rc == 0 ? 0 : 3;
}

struct skip_unless_available {
  skip_unless_available() {
    if (const char* t = std::getenv("ASHL_NETNS_TEST_CONNECT")) {
      std::fflush(stdout);
      const int rc = connect_probe(t);
      std::fflush(stdout);
      std::_Exit(rc);
    }
    if (auto s = hosts::netns_cluster::available(); !s) {
      std::printf("skipped: ps/netns_hosts needs emulated hosts: %s\n", s.message().c_str());
      std::fflush(stdout);
      std::_Exit(77);
    }
  }
};

std::string self_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

// ashl_test_ps_node: ASHL_TEST_PS_NODE (environment or compile definition),
// else beside this executable (both are built in the test directory).
std::string ps_node_path() {
  if (const char* p = std::getenv("ASHL_TEST_PS_NODE"); p && *p) return p;
#ifdef ASHL_TEST_PS_NODE
  return ASHL_TEST_PS_NODE;
#else
  const std::string self = self_path();
  return self.substr(0, self.rfind('/') + 1) + "ashl_test_ps_node";
#endif
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

std::string run_text(const std::vector<std::string>& argv) {
  auto r = hosts::detail::run(argv);
  BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.error().message()));
  return *r;
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

using ps_job::bsp_reference;  // the BSP run the processes must equal

// The first number after "key": in tc's JSON (-1 when absent).
double json_number(const std::string& text, const std::string& key) {
  const auto at = text.find("\"" + key + "\":");
  return at == std::string::npos ? -1.0 : std::strtod(text.c_str() + at + key.size() + 3, nullptr);
}

using env_list = std::vector<std::pair<std::string, std::string>>;

// UCX over TCP on the hosts' veth only (the tests' default, UCX_NET_DEVICES=lo,
// would leave UCX nothing that reaches another host).
env_list ucx_env() {
  return {{"UCX_TLS", "tcp,self"}, {"UCX_NET_DEVICES", hosts::netns_cluster::device}};
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(skip_unless_available);

BOOST_AUTO_TEST_CASE(hosts_are_namespaces_with_shaped_links_and_cpu_quotas) {
  const std::string ip = hosts::detail::find_tool("ip"), tc = hosts::detail::find_tool("tc");
  std::vector<std::string> namespaces, cgroups;
  {
    auto made = hosts::netns_cluster::create({{}, {.rate_bytes_per_s = 2e6, .cpu_share = 0.5},
                                              {.rate_bytes_per_s = 1e6, .cpu_share = 0.25}});
    BOOST_TEST_REQUIRE(made.has_value(), (made ? "" : made.error().message()));
    hosts::netns_cluster c = std::move(*made);  // movable; the moved-from one removes nothing
    BOOST_TEST_REQUIRE(c.size() == 3u);
    namespaces.push_back(c.switch_namespace());
    for (std::size_t k = 0; k < 3; ++k) {
      namespaces.push_back(c.namespace_name(k));
      cgroups.push_back(c.cgroup(k));
    }
    for (const auto& n : namespaces) BOOST_TEST(exists("/run/netns/" + n), n);
    BOOST_TEST(c.address(0) == "10.77.0.1");
    BOOST_TEST(c.address(2) == "10.77.0.3");

    const double rates[] = {0, 2e6, 1e6};
    for (std::size_t k = 0; k < 3; ++k) {
      const std::string ns = c.namespace_name(k), what = "host " + std::to_string(k);
      // Upload: the host's own end; download: its port on the bridge.
      const std::string up = run_text({tc, "-n", ns, "-j", "qdisc", "show", "dev", hosts::netns_cluster::device});
      const std::string down = run_text({tc, "-n", c.switch_namespace(), "-j", "qdisc", "show", "dev", c.switch_port(k)});
      if (rates[k] == 0) {
        BOOST_TEST(up.find("tbf") == std::string::npos, what << ": " << up);
        BOOST_TEST(down.find("tbf") == std::string::npos, what << ": " << down);
      } else {
        const std::string rate = "\"rate\":" + std::to_string(static_cast<long>(rates[k]));  // bytes/s in tc's JSON
        BOOST_TEST((up.find("\"kind\":\"tbf\"") != std::string::npos && up.find(rate) != std::string::npos),
                   what << " upload: " << up);
        BOOST_TEST((down.find("\"kind\":\"tbf\"") != std::string::npos && down.find(rate) != std::string::npos),
                   what << " download: " << down);
      }
      const std::string addr = run_text({ip, "-n", ns, "-4", "addr", "show", "dev", hosts::netns_cluster::device});
      BOOST_TEST(addr.find("inet " + c.address(k) + "/16") != std::string::npos, what << ": " << addr);
      BOOST_TEST(run_text({ip, "-n", ns, "link", "show", "lo"}).find(",UP") != std::string::npos, what);
      // The only route is the cluster's own subnet: nothing outside is reachable.
      BOOST_TEST(trimmed(run_text({ip, "-n", ns, "-4", "route", "show"})).find('\n') == std::string::npos, what);
      BOOST_TEST(run_text({ip, "-n", ns, "-4", "route", "show"}).find("default") == std::string::npos, what);
    }

    if (c.cgroup_version() == 1) {
      BOOST_TEST(trimmed(hosts::detail::read_text(c.cgroup(0) + "/cpu.cfs_quota_us")) == "-1");
      BOOST_TEST(trimmed(hosts::detail::read_text(c.cgroup(1) + "/cpu.cfs_quota_us")) == "50000");
      BOOST_TEST(trimmed(hosts::detail::read_text(c.cgroup(1) + "/cpu.cfs_period_us")) == "100000");
      BOOST_TEST(trimmed(hosts::detail::read_text(c.cgroup(2) + "/cpu.cfs_quota_us")) == "25000");
    } else {
      BOOST_TEST(trimmed(hosts::detail::read_text(c.cgroup(0) + "/cpu.max")) == "max 100000");
      BOOST_TEST(trimmed(hosts::detail::read_text(c.cgroup(1) + "/cpu.max")) == "50000 100000");
      BOOST_TEST(trimmed(hosts::detail::read_text(c.cgroup(2) + "/cpu.max")) == "25000 100000");
    }

    // wrap(): the program runs in the host's network namespace and cgroup,
    // and gets its arguments unchanged (spaces, quotes, $, ;, empty).
    const std::string dir = process::temp_dir("ashl-netns");
    BOOST_TEST_REQUIRE(!dir.empty());
    auto o = process::run(c.wrap(1, {"/bin/sh", "-c", "readlink /proc/self/ns/net; cat /proc/self/cgroup; printf '<%s>' \"$@\"",
                                     "sh", "a b", "$HOME;'\"`x`", ""}),
                          {}, 20s, dir + "/wrap.txt");
    BOOST_TEST_REQUIRE(o.exit_code == 0, o.log());
    struct stat st{};
    BOOST_TEST_REQUIRE(::stat(("/run/netns/" + c.namespace_name(1)).c_str(), &st) == 0);
    const std::string log = o.log();
    BOOST_TEST(log.find("net:[" + std::to_string(st.st_ino) + "]") != std::string::npos, log);
    BOOST_TEST(log.find("/" + c.namespace_name(1) + "\n") != std::string::npos, log);
    BOOST_TEST(log.find("<a b><$HOME;'\"`x`><>") != std::string::npos, log);
    std::filesystem::remove_all(dir);
  }
  for (const auto& n : namespaces) BOOST_TEST(!exists("/run/netns/" + n), n << " left behind");
  for (const auto& g : cgroups) BOOST_TEST(!exists(g), g << " left behind");
}

BOOST_AUTO_TEST_CASE(create_removes_what_a_dead_run_left_behind) {
  const std::string ip = hosts::detail::find_tool("ip");
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);  // a pid with no process: the crashed run's owner
  const std::string stale = "ashl" + std::to_string(child) + "-1-0-h0";
  run_text({ip, "netns", "add", stale});
  const auto cg = hosts::detail::find_cgroup();
  BOOST_TEST_REQUIRE(cg.version != 0);
  const std::string stale_cgroup = cg.dir + "/" + stale;
  BOOST_TEST_REQUIRE(::mkdir(stale_cgroup.c_str(), 0755) == 0);
  // This process's own names are not stale, whatever their sequence number.
  auto mine = hosts::netns_cluster::create({{}});
  BOOST_TEST_REQUIRE(mine.has_value(), (mine ? "" : mine.error().message()));
  auto made = hosts::netns_cluster::create({{}});
  BOOST_TEST_REQUIRE(made.has_value(), (made ? "" : made.error().message()));
  BOOST_TEST(!exists("/run/netns/" + stale));
  BOOST_TEST(!exists(stale_cgroup));
  BOOST_TEST(exists("/run/netns/" + mine->namespace_name(0)));
}

BOOST_AUTO_TEST_CASE(bad_specs_are_refused_naming_the_field) {
  auto r = hosts::netns_cluster::create({{}, {.rate_bytes_per_s = 10}});
  BOOST_TEST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find("hosts[1].rate_bytes_per_s = 10") != std::string::npos, r.error().message());
  auto s = hosts::netns_cluster::create({{.cpu_share = -1}});
  BOOST_TEST_REQUIRE(!s.has_value());
  BOOST_TEST(s.error().message().find("hosts[0].cpu_share = -1") != std::string::npos, s.error().message());
}

BOOST_AUTO_TEST_CASE(a_host_cannot_reach_the_root_namespace) {
  auto c = hosts::netns_cluster::create({{}, {}});
  BOOST_TEST_REQUIRE(c.has_value(), (c ? "" : c.error().message()));
  // A listener on the root namespace's loopback ...
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  BOOST_TEST_REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  BOOST_TEST_REQUIRE(::listen(s, 4) == 0);
  BOOST_TEST_REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &n) == 0);
  const std::string target = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  const std::string dir = process::temp_dir("ashl-netns");
  const env_list env = {{"ASHL_NETNS_TEST_CONNECT", target}};
  // ... is reached from the root namespace (the probe works) ...
  auto here = process::run({self_path()}, env, 20s, dir + "/root.txt");
  BOOST_TEST(here.exit_code == 0, here.log());
  // ... and not from host 1, whose 127.0.0.1 is its own loopback.
  auto there = process::run(c->wrap(1, {self_path()}), env, 20s, dir + "/host1.txt");
  BOOST_TEST(there.exit_code == 3, there.log());
  ::close(s);
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(bsp_job_across_hosts_is_bit_identical_to_one_server_core) {
  const std::string node = ps_node_path();
  BOOST_TEST_REQUIRE(exists(node), node << " not found: build ashl_test_ps_node, or set ASHL_TEST_PS_NODE");
  // Host 0: the server, unshaped. Hosts 1 and 2: a worker each, at 4 and
  // 2 MB/s each way and half a core.
  auto c = hosts::netns_cluster::create({{}, {.rate_bytes_per_s = 4e6, .cpu_share = 0.5},
                                         {.rate_bytes_per_s = 2e6, .cpu_share = 0.5}});
  BOOST_TEST_REQUIRE(c.has_value(), (c ? "" : c.error().message()));

  constexpr std::uint32_t workers = 2;
  constexpr std::size_t n = 100'003;  // 400 KB each way per cycle: rendezvous-sized, 0.1-0.2 s on these links
  constexpr int cycles = 6;
  const std::string dir = process::temp_dir("ashl-netns-job");
  BOOST_TEST_REQUIRE(!dir.empty());
  const std::string shared = dir + "/counters";
  {
    std::ofstream f(shared, std::ios::binary);
    std::vector<char> zeros(64 * 8, 0);
    f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  }
  const std::vector<std::string> args = {node,        "--out",    dir,        "--shared", shared, "--policy", "bsp",
                                         "--elements", std::to_string(n), "--cycles", std::to_string(cycles)};
  env_list common = ucx_env();
  // A fixed port is free: host 0's namespace is new, nothing else listens there.
  common.insert(common.end(), {{"ASHL_NUM_WORKERS", std::to_string(workers)}, {"ASHL_NUM_SERVERS", "1"},
                               {"ASHL_SERVER_ADDR", c->address(0) + ":5000"}, {"ASHL_INSECURE", "1"},
                               {"ASHL_VERBOSE", "1"}});
  env_list server_env = common;
  server_env.emplace_back("ASHL_ROLE", "server");
  const pid_t server = process::start(c->wrap(0, args), server_env, dir + "/server.log");
  std::vector<pid_t> pids;
  for (std::uint32_t k = 0; k < workers; ++k) {
    env_list e = common;
    e.insert(e.end(), {{"ASHL_ROLE", "worker"}, {"ASHL_RANK", std::to_string(k)}});
    pids.push_back(process::start(c->wrap(k + 1, args), e, dir + "/worker" + std::to_string(k) + ".log"));
  }
  std::vector<process::outcome> done;
  for (std::uint32_t k = 0; k < workers; ++k)
    done.push_back(process::finish(pids[k], 90s, dir + "/worker" + std::to_string(k) + ".log"));
  const process::outcome srv = process::finish(server, 30s, dir + "/server.log");
  for (std::uint32_t k = 0; k < workers; ++k) BOOST_TEST_REQUIRE(done[k].exit_code == 0, "worker " << k << "\n" << done[k].log());
  BOOST_TEST_REQUIRE(srv.exit_code == 0, srv.log());

  // The workers reached the server from their own hosts' addresses, over TCP.
  const std::string log = srv.log();
  BOOST_TEST(log.find("connected over tcp") != std::string::npos, log);
  for (std::uint32_t k = 0; k < workers; ++k) {
    const std::string wlog = done[k].log();
    BOOST_TEST(wlog.find(c->address(0)) != std::string::npos, wlog);
    BOOST_TEST(wlog.find("connected over tcp") != std::string::npos, wlog);
  }

  std::ifstream f(dir + "/server0.f32", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  BOOST_TEST_REQUIRE(bytes.size() == n * sizeof(float));
  const auto want = bsp_reference(workers, n, cycles);
  BOOST_TEST(std::memcmp(bytes.data(), want.data(), bytes.size()) == 0);
  const auto s = node_files::read_counters(dir + "/server0.txt");
  BOOST_TEST(s.at("commits_applied") == double(workers) * cycles);
  BOOST_TEST(s.at("refused") + s.at("wire_refused") == 0.0);
  BOOST_TEST(s.at("finished") == 1.0);
  for (std::uint32_t k = 0; k < workers; ++k)
    BOOST_TEST(node_files::read_counters(dir + "/worker" + std::to_string(k) + ".txt").at("commits") == cycles, "worker " << k);

  // Each worker's traffic went through its tbf both ways (at least the
  // gradients up and the parameters down), and the shaper held it back.
  const std::string tc = hosts::detail::find_tool("tc");
  const double payload = double(cycles) * n * sizeof(float);
  for (std::size_t k = 1; k <= workers; ++k) {
    const std::string up =
        run_text({tc, "-n", c->namespace_name(k), "-s", "-j", "qdisc", "show", "dev", hosts::netns_cluster::device});
    const std::string down =
        run_text({tc, "-n", c->switch_namespace(), "-s", "-j", "qdisc", "show", "dev", c->switch_port(k)});
    BOOST_TEST(json_number(up, "bytes") >= payload, "host " << k << " upload: " << up);
    BOOST_TEST(json_number(down, "bytes") >= payload, "host " << k << " download: " << down);
    BOOST_TEST(json_number(up, "overlimits") > 0.0, "host " << k << " upload: " << up);
  }
  std::filesystem::remove_all(dir);
}

#endif
