// examples/netns.hpp — emulated hosts on one machine: each host its own
// network namespace, linked through a bridge that lives in a namespace of its
// own (the "switch"), its link shaped with tc tbf and its CPU capped by a
// cgroup quota. The experiment's `--hosts netns` mode and the multi-host test
// (test/ps/netns_hosts.cpp) run servers and workers in such hosts, so UCX
// runs over TCP between real network stacks (docs/multi-host.md, "Emulated
// hosts: network namespaces").
//
//   if (auto s = hosts::netns_cluster::available(); !s) skip(s.message());
//   auto c = hosts::netns_cluster::create({{}, {.rate_bytes_per_s = 25e6, .cpu_share = 0.5}});
//   auto argv = c->wrap(1, {"/path/to/worker", "--epochs", "3"});   // runs in host 1
//   // env: ASHL_SERVER_ADDR = c->address(0) + ":5000", UCX_NET_DEVICES = hosts::netns_cluster::device
//
// Safety: nothing here touches the root namespace's interfaces, routes or
// firewall. The bridge and every veth are created inside the cluster's own
// namespaces (`ip -n SWITCH link add ... peer ... netns HOST`), so the
// emulated hosts reach each other and nothing else. Names carry the owning
// process's pid and start time (ashl<pid>-<start>-<n>-sw, ...-h<k>); create()
// first removes what a dead owner left behind (a crashed run).
//
// Needs root, iproute2 (`ip`, `tc`), the kernel's veth, bridge and tbf, and a
// cgroup cpu controller (v1 cpu.cfs_quota_us or v2 cpu.max); available() says
// which is missing. `ip` and `tc` run through posix_spawn with argument
// vectors: no shell ever sees a caller's string.
#pragma once

#include <ashl/core/status.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace hosts {

struct host_spec {
  double rate_bytes_per_s = 0;  // both directions of the host's link; 0: unshaped
  double cpu_share = 0;         // of one core (0.5: half a core; 2: two cores); 0: unlimited
};

namespace detail {

inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

inline bool write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.flush();
  return static_cast<bool>(f);
}

inline bool is_executable(const std::string& p) { return ::access(p.c_str(), X_OK) == 0; }

// iproute2 lives in /sbin or /usr/sbin, which a non-login PATH may lack.
inline std::string find_tool(std::string_view name) {
  std::vector<std::string> dirs = {"/usr/sbin", "/sbin", "/usr/bin", "/bin"};
  if (const char* p = std::getenv("PATH")) {
    std::string_view rest(p);
    while (!rest.empty()) {
      const auto colon = rest.find(':');
      if (colon != 0) dirs.emplace_back(rest.substr(0, colon));
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
  }
  for (const auto& d : dirs) {
    std::string p = d + "/" + std::string(name);
    if (is_executable(p)) return p;
  }
  return {};
}

inline std::string join(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) {
    if (!s.empty()) s += ' ';
    s += a;
  }
  return s;
}

// Runs argv (argv[0] an absolute path) with stdin from /dev/null; its stdout
// and stderr together, or an error naming the command and what it said.
inline ashl::result<std::string> run(const std::vector<std::string>& argv) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ashl::status(ashl::errc::io_error, "pipe: " + std::string(std::strerror(errno)));
  posix_spawn_file_actions_t fa;
  ::posix_spawn_file_actions_init(&fa);
  ::posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  ::posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  ::posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int e = ::posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  ::posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (e != 0) {
    ::close(fds[0]);
    return ashl::status(ashl::errc::io_error, "cannot start '" + argv[0] + "': " + std::strerror(e));
  }
  std::string out;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0) out.append(buf, static_cast<std::size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  ::close(fds[0]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return ashl::status(ashl::errc::io_error, "'" + join(argv) + "' failed (" +
                                                  (WIFEXITED(st) ? "exit " + std::to_string(WEXITSTATUS(st))
                                                                 : "signal " + std::to_string(WTERMSIG(st))) +
                                                  "): " + out);
  }
  return out;
}

inline ashl::status run_status(const std::vector<std::string>& argv) { return run(argv).to_status(); }

// Field 22 of /proc/<pid>/stat: the process's start time in clock ticks since
// boot. A pid plus its start time names one process for the machine's uptime,
// even after the pid is reused. Empty when there is no such process, or when
// it has exited and waits to be reaped (state Z or X: a crashed run whose
// parent has not collected it yet is dead all the same).
inline std::string start_time(long pid) {
  const std::string s = read_text("/proc/" + std::to_string(pid) + "/stat");
  const auto close = s.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return {};
  std::istringstream is(s.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && (is >> field); ++i) {
    if (i == 3 && (field == "Z" || field == "X")) return {};
    if (i == 22) return field;
  }
  return {};
}

// The cgroup cpu controller: v1 (a hierarchy with the "cpu" option;
// cpu.cfs_quota_us) preferred, since a hybrid machine binds the controller
// there and leaves the v2 tree without it; else v2 (cpu.max), when the root
// of the unified tree delegates "cpu" to its children.
struct cgroup_root {
  int version = 0;  // 0: none
  std::string dir;
  std::string why;  // when none
};

inline cgroup_root find_cgroup() {
  std::ifstream f("/proc/self/mounts");
  std::string dev, dir, type, opts, line;
  std::string v2;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    if (!(is >> dev >> dir >> type >> opts)) continue;
    if (type == "cgroup") {
      std::istringstream o(opts);
      std::string opt;
      while (std::getline(o, opt, ','))
        if (opt == "cpu" && is_executable(dir) && !read_text(dir + "/cpu.cfs_quota_us").empty()) return {1, dir, {}};
    } else if (type == "cgroup2" && v2.empty()) {
      v2 = dir;
    }
  }
  if (!v2.empty()) {
    auto has_cpu = [](const std::string& text) {
      std::istringstream is(text);
      std::string w;
      while (is >> w)
        if (w == "cpu") return true;
      return false;
    };
    if (has_cpu(read_text(v2 + "/cgroup.subtree_control"))) return {2, v2, {}};
    return {0, {}, "the cgroup v2 tree at " + v2 + " does not delegate the cpu controller (cgroup.subtree_control)"};
  }
  return {0, {}, "no cgroup cpu controller is mounted (neither v1 cpu.cfs_quota_us nor v2 cpu.max)"};
}

inline constexpr long cfs_period_us = 100'000;

// Every name this file creates starts with "ashl<pid>-<start>-": the owner.
struct owner_name {
  long pid = 0;
  std::string start;
};

inline bool parse_owner(std::string_view name, owner_name& o) {
  if (name.substr(0, 4) != "ashl") return false;
  name.remove_prefix(4);
  const auto dash = name.find('-');
  if (dash == 0 || dash == std::string_view::npos) return false;
  long pid = 0;
  for (char c : name.substr(0, dash)) {
    if (c < '0' || c > '9') return false;
    pid = pid * 10 + (c - '0');
  }
  name.remove_prefix(dash + 1);
  const auto dash2 = name.find('-');
  if (dash2 == 0 || dash2 == std::string_view::npos) return false;
  for (char c : name.substr(0, dash2))
    if (c < '0' || c > '9') return false;
  o.pid = pid;
  o.start = std::string(name.substr(0, dash2));
  return true;
}

inline bool owner_alive(const owner_name& o) { return start_time(o.pid) == o.start; }

inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
  }
  return out;
}

inline std::vector<long> pids_in(const std::string& text) {
  std::vector<long> v;
  std::istringstream is(text);
  long p = 0;
  while (is >> p) v.push_back(p);
  return v;
}

// SIGKILLs every process in a cgroup (bounded wait for it to empty), then
// removes it. They are processes started into one of the cluster's hosts.
inline void remove_cgroup(const std::string& dir) {
  if (::access(dir.c_str(), F_OK) != 0) return;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (true) {
    const auto pids = pids_in(read_text(dir + "/cgroup.procs"));
    if (pids.empty() || std::chrono::steady_clock::now() >= end) break;
    for (long p : pids) ::kill(static_cast<pid_t>(p), SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::rmdir(dir.c_str());
}

// Kills what runs in a namespace (a process started there with `ip netns
// exec` outside wrap()), then removes it; the veths with an end in it go with it.
inline void remove_netns(const std::string& ip, const std::string& name) {
  if (auto pids = run({ip, "netns", "pids", name}))
    for (long p : pids_in(*pids)) ::kill(static_cast<pid_t>(p), SIGKILL);
  (void)run({ip, "netns", "delete", name});
}

inline void remove_stale(const std::string& ip, const cgroup_root& cg) {
  owner_name o;
  for (const auto& n : list_dir(cg.dir))
    if (parse_owner(n, o) && !owner_alive(o)) remove_cgroup(cg.dir + "/" + n);
  for (const auto& n : list_dir("/run/netns"))
    if (parse_owner(n, o) && !owner_alive(o)) remove_netns(ip, n);
}

inline std::string prefix() {
  static int sequence = 0;  // several clusters (and probes) of one process
  const long pid = static_cast<long>(::getpid());
  return "ashl" + std::to_string(pid) + "-" + start_time(pid) + "-" + std::to_string(sequence++) + "-";
}

// tbf's bucket and queue for a rate (bytes/s). burst: 5 ms of traffic, at
// least 16 KiB (a few full-size frames; tbf segments larger GSO packets) and
// at most 4 MiB. limit (bytes queued before tbf drops): burst plus 200 ms of
// traffic, at least 256 KiB, at most 64 MiB, so a TCP stream with no RTT to
// speak of queues rather than loses packets (a drop costs a 200 ms
// retransmission timeout), at the price of up to 200 ms of queueing delay.
struct tbf_params {
  std::uint64_t rate_bits = 0, burst = 0, limit = 0;
};
inline tbf_params tbf_for(double rate_bytes_per_s) {
  tbf_params t;
  t.rate_bits = static_cast<std::uint64_t>(std::llround(rate_bytes_per_s * 8));
  t.burst = std::clamp<std::uint64_t>(static_cast<std::uint64_t>(rate_bytes_per_s * 0.005), 16 << 10, 4 << 20);
  t.limit = t.burst + std::clamp<std::uint64_t>(static_cast<std::uint64_t>(rate_bytes_per_s * 0.2), 256 << 10, 64 << 20);
  return t;
}

inline std::vector<std::string> tbf_command(const std::string& tc, const std::string& ns, const std::string& dev,
                                            double rate) {
  const tbf_params t = tbf_for(rate);
  return {tc, "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", std::to_string(t.rate_bits) + "bit",
          "burst", std::to_string(t.burst), "limit", std::to_string(t.limit)};
}

}  // namespace detail

class netns_cluster {
 public:
  // The veth end inside every host (the same name in each: one
  // UCX_NET_DEVICES value serves every process), and its subnet.
  static constexpr const char* device = "ashlnet";
  static constexpr int prefix_length = 16;  // 10.77.0.0/16
  static constexpr std::size_t max_hosts = 10'000;

  netns_cluster(const netns_cluster&) = delete;
  netns_cluster& operator=(const netns_cluster&) = delete;
  netns_cluster(netns_cluster&& o) noexcept { *this = std::move(o); }
  netns_cluster& operator=(netns_cluster&& o) noexcept {
    if (this != &o) {
      teardown();
      ip_ = std::move(o.ip_);
      tc_ = std::move(o.tc_);
      cgroup_version_ = o.cgroup_version_;
      switch_ = std::move(o.switch_);
      hosts_ = std::move(o.hosts_);
      o.switch_.clear();
      o.hosts_.clear();
    }
    return *this;
  }
  ~netns_cluster() { teardown(); }

  // ok, or why the mode cannot run here (naming what is missing). Tries what
  // create() needs in a throw-away namespace and cgroup.
  static ashl::status available() {
    if (::geteuid() != 0)
      return {ashl::errc::unavailable, "emulated hosts need root (network namespaces, tc, cgroups); euid = " +
                                           std::to_string(::geteuid())};
    const std::string ip = detail::find_tool("ip"), tc = detail::find_tool("tc");
    if (ip.empty() || tc.empty())
      return {ashl::errc::unavailable, std::string("emulated hosts need iproute2: ") + (ip.empty() ? "'ip' " : "") +
                                           (tc.empty() ? "'tc' " : "") + "not found (Debian package iproute2)"};
    const detail::cgroup_root cg = detail::find_cgroup();
    if (cg.version == 0) return {ashl::errc::unavailable, "emulated hosts need a cgroup cpu controller: " + cg.why};
    detail::remove_stale(ip, cg);
    const std::string p = detail::prefix(), ns = p + "probe";
    if (auto s = detail::run_status({ip, "netns", "add", ns}); !s)
      return {ashl::errc::unavailable, "network namespaces refused: " + s.message()};
    ashl::status s = detail::run_status({ip, "-n", ns, "link", "add", "ashlbr", "type", "bridge"});
    if (!s) s = ashl::status(ashl::errc::unavailable, "bridge devices refused: " + s.message());
    if (s) {
      s = detail::run_status({ip, "-n", ns, "link", "add", "ashla", "type", "veth", "peer", "name", "ashlb"});
      if (!s) s = ashl::status(ashl::errc::unavailable, "veth pairs refused: " + s.message());
    }
    if (s) {
      s = detail::run_status(detail::tbf_command(tc, ns, "ashla", 1e6));
      if (!s) s = ashl::status(ashl::errc::unavailable, "tc tbf refused: " + s.message());
    }
    detail::remove_netns(ip, ns);
    if (!s) return s;
    const std::string dir = cg.dir + "/" + p + "probe";
    if (::mkdir(dir.c_str(), 0755) != 0)
      return {ashl::errc::unavailable, "cannot create a cgroup in " + cg.dir + ": " + std::strerror(errno)};
    const bool quota = cg.version == 1 ? detail::write_text(dir + "/cpu.cfs_quota_us", "50000")
                                       : detail::write_text(dir + "/cpu.max", "50000 100000");
    ::rmdir(dir.c_str());
    if (!quota)
      return {ashl::errc::unavailable, "the cgroup cpu controller refused a quota in " + dir};
    return {};
  }

  // Host k in namespace <prefix>h<k> at address(k), linked to the switch;
  // any error removes what was made and names the command that failed.
  static ashl::result<netns_cluster> create(const std::vector<host_spec>& hosts) {
    if (hosts.empty()) return ashl::invalid_argument("hosts.size()", 0, "needs at least one host");
    if (hosts.size() > max_hosts) return ashl::out_of_range("hosts.size()", hosts.size(), "at most 10000");
    for (std::size_t k = 0; k < hosts.size(); ++k) {
      const auto& h = hosts[k];
      const std::string at = "hosts[" + std::to_string(k) + "]";
      if (!std::isfinite(h.rate_bytes_per_s) || (h.rate_bytes_per_s != 0 && h.rate_bytes_per_s < 1000) ||
          h.rate_bytes_per_s > 1e12)
        return ashl::invalid_argument(at + ".rate_bytes_per_s", h.rate_bytes_per_s,
                                      "must be 0 (unshaped) or in [1000, 1e12] bytes/s");
      if (!std::isfinite(h.cpu_share) || (h.cpu_share != 0 && h.cpu_share < 0.01) || h.cpu_share > 1024)
        return ashl::invalid_argument(at + ".cpu_share", h.cpu_share, "must be 0 (unlimited) or in [0.01, 1024] cores");
    }
    if (::geteuid() != 0) return ashl::status(ashl::errc::unavailable, "emulated hosts need root");
    netns_cluster c;
    c.ip_ = detail::find_tool("ip");
    c.tc_ = detail::find_tool("tc");
    if (c.ip_.empty() || c.tc_.empty())
      return ashl::status(ashl::errc::unavailable, "emulated hosts need iproute2 ('ip' and 'tc')");
    const detail::cgroup_root cg = detail::find_cgroup();
    if (cg.version == 0) return ashl::status(ashl::errc::unavailable, cg.why);
    c.cgroup_version_ = cg.version;
    detail::remove_stale(c.ip_, cg);

    const std::string p = detail::prefix();
    const std::string& ip = c.ip_;
    c.switch_ = p + "sw";
    ASHL_TRY(detail::run_status({ip, "netns", "add", c.switch_}));
    ASHL_TRY(detail::run_status({ip, "-n", c.switch_, "link", "add", "ashlbr", "type", "bridge"}));
    ASHL_TRY(detail::run_status({ip, "-n", c.switch_, "link", "set", "ashlbr", "up"}));
    for (std::size_t k = 0; k < hosts.size(); ++k) {
      host h;
      h.spec = hosts[k];
      h.ns = p + "h" + std::to_string(k);
      h.port = "ashlh" + std::to_string(k);
      h.address = "10.77." + std::to_string((k + 1) / 256) + "." + std::to_string((k + 1) % 256);
      ASHL_TRY(detail::run_status({ip, "netns", "add", h.ns}));
      c.hosts_.push_back(h);  // from here the destructor removes it
      ASHL_TRY(detail::run_status({ip, "-n", h.ns, "link", "set", "lo", "up"}));
      ASHL_TRY(detail::run_status({ip, "-n", c.switch_, "link", "add", h.port, "type", "veth", "peer", "name", device,
                                   "netns", h.ns}));
      ASHL_TRY(detail::run_status({ip, "-n", c.switch_, "link", "set", h.port, "master", "ashlbr"}));
      ASHL_TRY(detail::run_status({ip, "-n", c.switch_, "link", "set", h.port, "up"}));
      ASHL_TRY(detail::run_status(
          {ip, "-n", h.ns, "addr", "add", h.address + "/" + std::to_string(prefix_length), "dev", device}));
      ASHL_TRY(detail::run_status({ip, "-n", h.ns, "link", "set", device, "up"}));
      if (h.spec.rate_bytes_per_s > 0) {
        ASHL_TRY(detail::run_status(detail::tbf_command(c.tc_, h.ns, device, h.spec.rate_bytes_per_s)));      // upload
        ASHL_TRY(detail::run_status(detail::tbf_command(c.tc_, c.switch_, h.port, h.spec.rate_bytes_per_s)));  // download
      }
      // Every host has a cgroup, limited or not: wrap() puts its processes
      // there, and the destructor finds the ones still running through it.
      c.hosts_.back().cgroup = cg.dir + "/" + h.ns;
      const std::string& dir = c.hosts_.back().cgroup;
      if (::mkdir(dir.c_str(), 0755) != 0)
        return ashl::make_error(ashl::errc::io_error, "cgroup", dir, std::strerror(errno));
      if (h.spec.cpu_share > 0) {
        const long quota = std::max<long>(1000, std::lround(h.spec.cpu_share * detail::cfs_period_us));
        const bool ok = cg.version == 1
                            ? detail::write_text(dir + "/cpu.cfs_period_us", std::to_string(detail::cfs_period_us)) &&
                                  detail::write_text(dir + "/cpu.cfs_quota_us", std::to_string(quota))
                            : detail::write_text(dir + "/cpu.max",
                                                 std::to_string(quota) + " " + std::to_string(detail::cfs_period_us));
        if (!ok) return ashl::make_error(ashl::errc::io_error, "cgroup cpu quota", dir, "the kernel refused it");
      }
    }
    return c;
  }

  [[nodiscard]] std::size_t size() const noexcept { return hosts_.size(); }
  [[nodiscard]] const host_spec& spec(std::size_t k) const { return at(k).spec; }
  // Host k's IPv4 address on the cluster's own 10.77.0.0/16 (host 0: 10.77.0.1).
  [[nodiscard]] std::string address(std::size_t k) const { return at(k).address; }
  // The namespace names (for `ip -n NAME ...`, `tc -n NAME ...`).
  [[nodiscard]] std::string namespace_name(std::size_t k) const { return at(k).ns; }
  [[nodiscard]] const std::string& switch_namespace() const noexcept { return switch_; }
  // Host k's port on the bridge, in the switch namespace (its tbf shapes host k's download).
  [[nodiscard]] std::string switch_port(std::size_t k) const { return at(k).port; }
  // Host k's cgroup directory, and which cgroup version it is (1: cpu.cfs_quota_us, 2: cpu.max).
  [[nodiscard]] std::string cgroup(std::size_t k) const { return at(k).cgroup; }
  [[nodiscard]] int cgroup_version() const noexcept { return cgroup_version_; }

  // argv that runs `argv` (argv[0] a path or a PATH name) in host k: a shell
  // moves itself into the host's cgroup, then execs `ip netns exec NS argv...`.
  // The caller's arguments reach the program as they are: they are positional
  // parameters of the fixed script, never part of it. The environment passes
  // through; argv[0] of the result is /bin/sh.
  [[nodiscard]] std::vector<std::string> wrap(std::size_t k, std::vector<std::string> argv) const {
    const host& h = at(k);
    std::vector<std::string> out = {
        "/bin/sh", "-c",
        "echo $$ > \"$0\" || exit 126; ns=$1; ip=$2; shift 2; exec \"$ip\" netns exec \"$ns\" \"$@\"",
        h.cgroup + "/cgroup.procs", h.ns, ip_};
    out.insert(out.end(), std::make_move_iterator(argv.begin()), std::make_move_iterator(argv.end()));
    return out;
  }

 private:
  struct host {
    host_spec spec;
    std::string ns, port, address, cgroup;
  };

  netns_cluster() = default;

  const host& at(std::size_t k) const {
    ASHL_ASSERT(k < hosts_.size(), "netns_cluster: host index out of range");
    return hosts_[k];
  }

  // Processes first (through the cgroups), then the hosts' namespaces (their
  // veths go with them), then the switch with its bridge.
  void teardown() noexcept {
    for (const auto& h : hosts_) {
      if (!h.cgroup.empty()) detail::remove_cgroup(h.cgroup);
      detail::remove_netns(ip_, h.ns);
    }
    if (!switch_.empty()) detail::remove_netns(ip_, switch_);
    hosts_.clear();
    switch_.clear();
  }

  std::string ip_, tc_;
  int cgroup_version_ = 0;
  std::string switch_;
  std::vector<host> hosts_;
};

}  // namespace hosts
