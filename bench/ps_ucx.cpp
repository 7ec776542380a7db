// ashl_bench_ps_ucx — ps::server and ps::worker over transport::ucx, process
// to process on this host, against ucx_perftest on the same sizes, transports
// and CPUs (docs/perf/ps-ucx.md).
//
//   ashl_bench_ps_ucx                       # shm and tcp; 4 KiB .. 64 MiB; fan-in of 8 workers
//   ashl_bench_ps_ucx --ops fan_in,fan_in_push --fan-in-workers 32   # fan-in of 32 worker processes
//                                           # (1..64; --fan-workers is the same option)
//   ashl_bench_ps_ucx --quick               # fewer sizes and reps (under a minute)
//   ashl_bench_ps_ucx --transports tcp --ops pull,commit --reps 9 --json-only
//   ashl_bench_ps_ucx --progress poll       # ucx_params.blocking = false (spin instead of the event fd)
//   ashl_bench_ps_ucx --spin-us 0           # ucx_params.spin: poll this long before sleeping (default: the library's)
//   ashl_bench_ps_ucx --ops fan_in,fan_in_push --apply-threads 2   # server_params.apply_threads;
//                                           # the server is then pinned to CPUs 0..N-1 (the workers stay on CPU 1)
//   ashl_bench_ps_ucx --ops fan_in_push --apply-batch 8   # server_params.apply_batch: commits that arrive
//                                           # together added in one pass; rows report the
//                                           # share of commits that were (batched)
//   ashl_bench_ps_ucx --commit-chunk-kib 1024 --apply-as-landed   # server_params.apply_parts_as_they_land
//                                           # = true: a commit in parts is added as its parts land (default:
//                                           # applied whole at its last part); commit rows report the share
//                                           # of commits applied that way (as_landed)
//   ashl_bench_ps_ucx --ops fan_in --fuse-checks off   # server_core_params.fuse_checks (off, beside, always;
//                                           # default: the library's): the check pass also computes a commit's
//                                           # apply beside a pinned version; rows report the share of commits
//                                           # applied from it (fused) and of applies made beside (beside)
//   ashl_bench_ps_ucx --no-pin              # leave placement to the scheduler (for comparison)
//   ashl_bench_ps_ucx --in-place-replies    # worker_params.stage_replies = false (replies unchecked in the caller's buffer)
//   ashl_bench_ps_ucx --flip-replies        # worker_params.flip_replies = true (replies checked in the buffer that is
//                                           # not the parameters, which then becomes them: no copy per pull)
//   ashl_bench_ps_ucx --trust-local-lanes   # server_params/worker_params.trust_local_lanes = true: no CRC-32C
//                                           # on these loopback lanes (wire flag `unchecked`; rows say crc "off")
//   ashl_bench_ps_ucx --chunk-kib 256       # server_params.reply_part_bytes and worker_params.commit_part_bytes
//                                           # = 256 KiB (replies and dense commits in parts; 0: whole)
//   ashl_bench_ps_ucx --commit-chunk-kib 1024 --commit-window 4   # commits alone in parts (overrides --chunk-kib
//                                           # for commits), worker_params.commit_window parts in flight
//   ashl_bench_ps_ucx --backup --ops commit,fan_in   # the cost of a backup (docs/elastic.md §4.7): each
//                                           # repetition runs the case again with server_params.take_backup and
//                                           # a ps::server_backup process (CPU 1, caught up before the workers
//                                           # start); rows commit_backup, fan_in_backup, fan_in_push_backup
//                                           # compare it with the same case without one in the same repetition
//
// Every case forks its own processes from a parent that never creates a UCX
// object: one ps::server (ASP, model deltas, one shard holding the whole
// model, dense f32) and one worker (--fan-in-workers N for fan_in and
// fan_in_push, default 8), or a ucx_perftest server and client
// (/usr/bin/ucx_perftest; --perftest PATH). Each child sets UCX_TLS (shm:
// "sm,self,tcp" — tcp carries the sockaddr connection setup; tcp:
// "tcp,self") and UCX_NET_DEVICES=lo before UCX starts, and is pinned with
// sched_setaffinity: the server on CPU 0 (CPUs 0..N-1 with --apply-threads
// N), every worker, however many, and the perftest client on CPU 1 (UCX
// #5322: shm bandwidth depends on placement; CPU numbers wrap modulo the
// CPUs online). Addresses are 127.0.0.1 only; ports are free loopback ports.
// Every child is bounded: alarm(900), the parent reaps each with a deadline
// and kills what is left, a fan-in worker waits at most 120 s at a
// repetition's start barrier (then fails by name), and worker_params.timeout
// (120 s) bounds every wait on the server.
//
// Operations (X = bytes of f32 parameters, the model size):
//   pull        ps::worker::pull() + wait(): a 72-byte pull request out, X
//               bytes of parameters back into the worker's buffer, checked,
//               and copied into the caller's (--in-place-replies: straight
//               into the caller's, checked after they landed).
//               gbps = X / time; baseline ucp_am_bw at X (one stream, one
//               direction); ratio = gbps / baseline_gbps (goal >= 0.8 at >= 1 MiB).
//   commit      iteration_done() + commit(X bytes) + wait(): the commit goes
//               out, the server checks and applies it, and the pull reply of
//               X bytes comes back — two transfers of X, one after the other.
//               gbps = 2X / time, against the same ucp_am_bw at X; ratio =
//               gbps / baseline_gbps (goal >= 0.8 at >= 1 MiB).
//               commit_oneway_gbps = X / (commit time - pull time): what the
//               commit alone adds (transfer, CRC, decode/apply, snapshot).
//   round_trip  the commit at 4 KiB: commit + pull reply of 4 KiB each way.
//               usec = time of one; baseline_usec = the round trip of
//               ucp_am_lat at 4 KiB (ucx_perftest prints half a round trip:
//               the value here is twice that); ratio = usec / baseline_usec
//               (goal <= 2).
//   fan_in      N worker processes (--fan-in-workers, default 8; all on
//               CPU 1), each committing 4 MiB (commit + wait, so each commit
//               also brings 4 MiB back) in a loop, started together: 128
//               commits in all per repetition (16 each for 8 workers, 4 for
//               32; at least 2 each; a quarter with --quick). gbps = commit
//               bytes applied by the server / wall time (first start to last
//               end): the server's goodput. moved_gbps counts the replies as
//               well. Baseline: one ucp_am_bw stream at 4 MiB; ratio = gbps /
//               baseline_gbps (goal >= 0.6 for 8 workers, docs/perf/ps-ucx.md).
//               server_cpu / server_runq (JSON): the server thread's share of
//               its lifetime on a CPU / runnable but waiting for one
//               (/proc/thread-self/schedstat); with server_idle (in
//               transport.wait) they tell a busy server from a starved one.
//               server_us_per_commit (JSON): that thread's CPU time over
//               its life (warm-up and handshakes included) per commit
//               applied, the figure other load moves least. fused / beside:
//               shares of commits applied from the check pass
//               (server_core_params.fuse_checks) / beside a pinned version.
//   fan_in_push the same with ps::worker::push(): each commit is answered
//               with a 72-byte acknowledgement instead of its 4 MiB reply;
//               gbps and the baseline as for fan_in, moved_gbps = gbps.
// For reference, tag_bw (bandwidth sizes) and tag_lat (4 KiB) run too and
// are reported as ref_tag_gbps / ref_tag_usec; and the same ucp_am_bw /
// ucp_am_lat with -e (endpoints with peer error handling, which ashl's
// endpoints always have: UCX 1.13 then leaves out the transports that cannot
// report a dead peer) as ref_eh_gbps / ref_eh_usec with their lanes.
// UCX_* variables in the environment (other than UCX_TLS and
// UCX_NET_DEVICES) reach every child and are recorded (ucx_env), as is the
// load average before and after (load).
//
// Every figure is the median of --reps repetitions. An ashl repetition is
// the mean of `iters` operations in a row (after warm-up) by freshly started
// processes; a perftest repetition is one ucx_perftest run (its "overall"
// figure, -n iters, -w warm-up). Per size, each repetition runs perftest,
// then ashl, then the reference perftests, one after the other, and `ratio`
// is the median of the repetitions' own ratios (ashl / the perftest run next
// to it), so that load from other work on a shared machine, which moves
// every figure, cancels as far as it can. GB/s = 10^9 bytes/s (perftest's MB/s are MiB/s and converted).
// Also recorded per case: the UCX lanes of the worker's endpoint
// (transport::ucx::describe) and of perftest's (UCX_LOG_LEVEL=info, ep_cfg).
//
// Output: a human table, then one JSON object per case:
//   {"bench":"ps_ucx","op":...,"transport":...,"bytes":...,"gbps":...,"usec":...,
//    "baseline":...,"baseline_gbps":...,"baseline_usec":...,"ratio":...,"goal":...,"met":...,
//    "lanes":...,"baseline_lanes":...,"progress":...,"replies":...,"placement":...,"reps":...,...}
#include "support.hpp"

#include <ashl/config.hpp>

#if !ASHL_HAS_UCX()
#include <cstdio>
int main() {
  std::fprintf(stderr, "ashl_bench_ps_ucx: built without UCX\n");
  return 77;
}
#else

#include <ashl/rules/policies.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/ps/server_replica.hpp>
#include <ashl/ps/worker.hpp>
#include <ashl/transport/ucx.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using bench::machine;
using bench::median;
using bench::today;
using bench::loadavg;

namespace ps = ashl::ps;
namespace tr = ashl::transport;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;
constexpr int max_reps = 64;
constexpr int max_workers = 64;  // --fan-in-workers: 1..64
constexpr const char* token = "ashl-bench-ps-ucx";

struct options {
  int reps = 7;
  bool quick = false;
  bool json_only = false;
  bool poll = false;  // ucx_params.blocking = false
  bool pin = true;
  bool describe = false;  // print the worker endpoint's whole ucp_ep_print_info
  bool baseline = true;   // false: ashl only (for profiling)
  long spin_us = -1;      // >= 0: ucx_params.spin (else the library's default)
  int iters = 0;          // > 0: ashl operations per repetition (--iters; for profiles of the steady state)
  std::vector<std::string> transports = {"shm", "tcp"};
  std::vector<std::string> ops = {"pull", "commit", "round_trip", "fan_in", "fan_in_push"};
  std::vector<std::size_t> sizes;
  std::string perftest = "/usr/bin/ucx_perftest";
  int fan_workers = 8;
  std::uint32_t apply_threads = 1;  // server_params.apply_threads (--apply-threads N)
  std::uint32_t apply_batch = 1;    // server_params.apply_batch (--apply-batch N)
  bool as_landed = false;           // server_params.apply_parts_as_they_land (--apply-as-landed: true)
  ps::fused_apply fuse = ps::server_core_params{}.fuse_checks;  // server_core_params.fuse_checks (--fuse-checks)
  bool stage_replies = true;  // worker_params.stage_replies (--in-place-replies: false)
  bool flip_replies = false;  // worker_params.flip_replies (--flip-replies)
  bool trust_local_lanes = false;  // server_params/worker_params.trust_local_lanes (--trust-local-lanes)
  std::uint64_t chunk_kib = 0;  // server_params.reply_part_bytes / 1024 (--chunk-kib; 0: replies whole)
  std::uint64_t commit_chunk_kib = 0;  // worker_params.commit_part_bytes / 1024 (--chunk-kib, or --commit-chunk-kib)
  std::uint32_t commit_window = 4;     // worker_params.commit_window (--commit-window)
  bool backup = false;  // --backup: each case again with a backup of the shard (server_params.take_backup)
  std::vector<std::string> server_env;  // --server-ucx-env NAME=VALUE: set in the server's process alone
};

// Where the worker's pull replies land: "staged" (checked, then copied),
// "flipped" (checked in the other buffer, which becomes the parameters) or
// "in_place" (unchecked in the caller's buffer).
const char* replies_mode(const options& o) {
  return !o.stage_replies ? "in_place" : o.flip_replies ? "flipped" : "staged";
}

const char* tls_of(const std::string& transport) { return transport == "shm" ? "sm,self,tcp" : "tcp,self"; }

double now_s() { return std::chrono::duration<double>(clock_type::now().time_since_epoch()).count(); }

// UCX_* variables the children inherit (besides UCX_TLS and UCX_NET_DEVICES, set per case).
std::string ucx_environment() {
  std::string out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    if (v.rfind("UCX_", 0) == 0 && v.rfind("UCX_TLS=", 0) != 0 && v.rfind("UCX_NET_DEVICES=", 0) != 0)
      out += (out.empty() ? "" : " ") + v;
  }
  return out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep))
    if (!cur.empty()) out.push_back(cur);
  return out;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

int cpus() { return static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN))); }

// Pins the calling process to one CPU (when the machine has more than one).
void pin_to(int cpu, bool pin) {
  if (!pin || cpus() < 2) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % cpus(), &set);
  ::sched_setaffinity(0, sizeof set, &set);
}

// The server with apply threads: CPUs 0..threads-1.
void pin_server(const options& o) {
  if (o.apply_threads <= 1 || !o.pin || cpus() < 2) return pin_to(0, o.pin);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (std::uint32_t k = 0; k < o.apply_threads; ++k) CPU_SET(static_cast<int>(k) % cpus(), &set);
  ::sched_setaffinity(0, sizeof set, &set);
}

std::string placement(const options& o, bool fan) {
  if (!o.pin || cpus() < 2) return "unpinned";
  const std::string server =
      o.apply_threads > 1 ? "server cpu0-" + std::to_string(std::min<int>(static_cast<int>(o.apply_threads), cpus()) - 1)
                          : "server cpu0";
  return server + (fan ? ", " + std::to_string(o.fan_workers) + " workers cpu1" : ", client cpu1");
}

// UCX's environment for a child, before any UCX object exists in it.
void set_ucx_env(const std::string& transport) {
  ::setenv("UCX_TLS", tls_of(transport), 1);
  ::setenv("UCX_NET_DEVICES", "lo", 1);  // the tcp lanes use loopback only
}

// A free TCP port on 127.0.0.1 (bound and released; perftest's server binds it next).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// True once something listens on `port` (any local address), from /proc/net/tcp.
bool listening(int port) {
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(file);
    std::string line;
    std::getline(f, line);
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string sl, local, remote, state;
      in >> sl >> local >> remote >> state;
      const auto colon = local.rfind(':');
      if (colon == std::string::npos || state != "0A") continue;
      if (std::strtol(local.c_str() + colon + 1, nullptr, 16) == port) return true;
    }
  }
  return false;
}

// Waits for a child up to `seconds`; kills it (SIGKILL) past that. Exit code, or -signal.
int reap(pid_t pid, double seconds) {
  const double end = now_s() + seconds;
  int st = 0;
  while (true) {
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) break;
    if (r < 0) return -1;
    if (now_s() > end) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      return -SIGKILL;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

// Reads a pipe to its end (or until `seconds` pass).
std::string read_all(int fd, double seconds) {
  std::string out;
  const double end = now_s() + seconds;
  char buf[4096];
  while (now_s() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}


// ------------------------------------------------------------------ ashl side

// What the children of one ashl case share with the parent (MAP_SHARED).
struct shared_area {
  std::atomic<std::uint64_t> arrived;  // barrier of the fan-in workers
  double pull_s[max_reps];             // per repetition: mean seconds per pull
  double commit_s[max_reps];           // per repetition: mean seconds per commit + wait
  double start[max_reps][max_workers], end[max_reps][max_workers];
  double server_idle;                  // server's share of time in transport.wait
  double server_cpu, server_runq;      // server thread's share of its time on a CPU / runnable but waiting for one
  std::uint64_t snapshots, commits_applied, copied_replies, batched_commits, applied_as_landed;
  std::uint64_t fused_applies, applied_beside;
  double server_us_per_commit;         // the server thread's CPU time over its life, per commit applied
  std::uint64_t backup_records;        // records the backup applied (--backup)
  char lanes[1024];                    // the worker's endpoint (describe, summarized)
  char describe[8192];                 // the worker's endpoint (describe, whole)
  char error[1024];
};

void set_error(shared_area* sh, const std::string& m) {
  std::snprintf(sh->error, sizeof sh->error, "%s", m.c_str());
}

struct ashl_case {
  std::size_t bytes = 0;
  int workers = 1;
  int reps = 1;
  int iters = 1;  // operations per repetition
  bool fan = false;
  bool push = false;  // fan: ps::worker::push (acknowledged, no reply) instead of commit
  bool do_pull = true, do_commit = true;
};

tr::ucx_params ucx_params_of(const options& o, std::string listen) {
  tr::ucx_params p{.listen = std::move(listen), .token = token, .blocking = !o.poll};
  if (o.spin_us >= 0) p.spin = std::chrono::microseconds(o.spin_us);
  return p;
}

// The server's parameters and policy (ASP, model deltas, one shard), the
// same for the primary and for its backup (--backup).
struct server_setup {
  ps::server_params params;
  ashl::sync::any_policy policy;
};
ashl::result<server_setup> server_setup_of(const options& o, const ashl_case& c, bool with_backup) {
  const std::size_t n = c.bytes / sizeof(float);
  auto layout = ps::shard_layout::even(n, 1);
  if (!layout) return layout.error();
  ps::policy_params pp;
  pp.workers = c.workers;
  auto policy = ps::make_policy("asp", pp);
  if (!policy) return policy.error();
  ps::server_params sp{.core = {.layout = *layout,
                                .shard = 0,
                                .workers = static_cast<std::uint32_t>(c.workers),
                                .optimizer = {.mode = ps::optimizer_params::kind::model_delta}}};
  sp.apply_threads = o.apply_threads;
  sp.apply_batch = o.apply_batch;
  sp.apply_parts_as_they_land = o.as_landed;
  sp.core.fuse_checks = o.fuse;
  sp.trust_local_lanes = o.trust_local_lanes;
  sp.reply_part_bytes = o.chunk_kib * 1024;
  if (with_backup) {
    sp.take_backup = true;
    sp.replica_timeout = std::chrono::milliseconds(30000);  // no drop on a loaded host: the bench measures the cost
  }
  return server_setup{std::move(sp), std::move(*policy)};
}

int run_server(const options& o, const ashl_case& c, shared_area* sh, int addr_fd, bool with_backup) {
  const std::size_t n = c.bytes / sizeof(float);
  auto t = tr::ucx::create(ucx_params_of(o, "127.0.0.1:0"));
  if (!t) return set_error(sh, "server: " + t.error().message()), 1;
  auto setup = server_setup_of(o, c, with_backup);
  if (!setup) return set_error(sh, "server: " + setup.error().message()), 1;
  std::vector<float> initial(n, 0.5f);
  auto srv = ps::server<tr::ucx>::create(setup->params, std::move(setup->policy), std::move(*t), initial);
  if (!srv) return set_error(sh, "server: " + srv.error().message()), 1;
  const std::string addr = srv->transport().listen_address() + "\n";
  if (::write(addr_fd, addr.data(), addr.size()) != static_cast<ssize_t>(addr.size())) return 1;
  ::close(addr_fd);
  std::atomic<bool> stop{false};
  srv->run(stop);  // until every worker left
  const ps::server_telemetry s = srv->telemetry();
  sh->server_idle = s.seconds > 0 ? s.wait_seconds / s.seconds : 0.0;
  // Where the server thread's time went (the kernel's schedstat: on a CPU,
  // runnable but waiting for one): on a shared machine a server that is
  // neither idle nor running is waiting for its CPU.
  if (std::ifstream f("/proc/thread-self/schedstat"); f && s.seconds > 0) {
    double on_cpu_ns = 0, runq_ns = 0;
    f >> on_cpu_ns >> runq_ns;
    sh->server_cpu = on_cpu_ns * 1e-9 / s.seconds;
    sh->server_runq = runq_ns * 1e-9 / s.seconds;
    sh->server_us_per_commit = on_cpu_ns * 1e-3 / static_cast<double>(std::max<std::uint64_t>(1, s.core.commits_applied));
  }
  sh->snapshots = s.snapshots;
  sh->commits_applied = s.core.commits_applied;
  sh->batched_commits = s.batched_commits;
  sh->applied_as_landed = s.applied_as_landed;
  sh->fused_applies = s.fused_applies;
  sh->applied_beside = s.applied_beside;
  return 0;
}

// The shard's backup (--backup): attaches to the primary at `addr`, writes
// one line to `ready_fd` once it caught up (the snapshot applied), then
// applies and acknowledges records until the primary's link ends (the
// primary exits when its workers left), bounded by `alarm`.
int run_backup(const options& o, const ashl_case& c, shared_area* sh, const std::string& addr, int ready_fd) {
  const std::size_t n = c.bytes / sizeof(float);
  auto t = tr::ucx::create(ucx_params_of(o, ""));
  if (!t) return set_error(sh, "backup: " + t.error().message()), 1;
  auto setup = server_setup_of(o, c, true);
  if (!setup) return set_error(sh, "backup: " + setup.error().message()), 1;
  std::vector<float> initial(n, 0.5f);
  auto b = ps::server_backup<tr::ucx>::create(setup->params, std::move(setup->policy), std::move(*t), addr, initial);
  if (!b) return set_error(sh, "backup: " + b.error().message()), 1;
  const double give_up = now_s() + 60;
  while (!b->caught_up()) {
    if (now_s() > give_up)
      return set_error(sh, "backup: not caught up after 60 s: " + b->last_refusal().to_string()), 1;
    b->run_once(std::chrono::microseconds(1000));
  }
  if (::write(ready_fd, "ok\n", 3) != 3) return 1;
  ::close(ready_fd);
  while (b->connected()) b->run_once(std::chrono::microseconds(1000));
  sh->backup_records = b->telemetry().records;
  return 0;
}

int run_worker(const options& o, const ashl_case& c, shared_area* sh, const std::string& addr, std::uint32_t rank) {
  const std::size_t n = c.bytes / sizeof(float);
  auto t = tr::ucx::create(ucx_params_of(o, ""));
  if (!t) return set_error(sh, "worker: " + t.error().message()), 1;
  std::vector<float> w(n), g(n, 1.0f / 1024);
  auto wk = ps::worker<tr::ucx>::create(
      {.rank = rank,
       .servers = {addr},
       .batch = 1,
       .timeout = std::chrono::seconds(120),
       .measurement_interval = std::chrono::milliseconds(1),  // batched: what a small-message job sets
       .stage_replies = o.stage_replies,
       .flip_replies = o.flip_replies,
       .trust_local_lanes = o.trust_local_lanes,
       .commit_part_bytes = o.commit_chunk_kib * 1024,
       .commit_window = o.commit_window},
      std::move(*t), w);
  if (!wk) return set_error(sh, "worker: " + wk.error().message()), 1;
  if (rank == 0 && !wk->transport().peers().empty()) {
    const std::string d = wk->transport().describe(wk->transport().peers()[0]);
    std::snprintf(sh->lanes, sizeof sh->lanes, "%s", tr::ucx::lanes_of(d).c_str());
    std::snprintf(sh->describe, sizeof sh->describe, "%s", d.c_str());
  }
  auto commit = [&]() -> bool {
    while (!wk->iteration_done()) {
    }
    if (auto s = c.push ? wk->push(g) : wk->commit(g); !s) return set_error(sh, s.to_string()), false;
    if (auto s = wk->wait(); !s) return set_error(sh, s.to_string()), false;
    return true;
  };
  auto pull = [&]() -> bool {
    if (auto s = wk->pull(); !s) return set_error(sh, s.to_string()), false;
    if (auto s = wk->wait(); !s) return set_error(sh, s.to_string()), false;
    return true;
  };
  // Warm-up: buffers, pools, UCX's registration cache and rendezvous paths.
  for (int k = 0; k < 3; ++k)
    if (!commit() || (c.do_pull && !pull())) return 1;
  for (int r = 0; r < c.reps; ++r) {
    if (c.fan) {
      // Everyone starts together: a barrier per repetition.
      // Bounded: a worker that died before it arrived fails the case by
      // name instead of leaving the others to the alarm.
      sh->arrived.fetch_add(1);
      const std::uint64_t target = static_cast<std::uint64_t>(c.workers) * (r + 1);
      const double give_up = now_s() + 120;
      while (sh->arrived.load() < target) {
        if (now_s() > give_up)
          return set_error(sh, "worker " + std::to_string(rank) + ": barrier of repetition " + std::to_string(r) +
                                   ": " + std::to_string(sh->arrived.load()) + " of " + std::to_string(target) +
                                   " arrivals after 120 s"),
                 1;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      sh->start[r][rank] = now_s();
      for (int k = 0; k < c.iters; ++k)
        if (!commit()) return 1;
      sh->end[r][rank] = now_s();
      continue;
    }
    if (c.do_pull) {
      const double t0 = now_s();
      for (int k = 0; k < c.iters; ++k)
        if (!pull()) return 1;
      sh->pull_s[r] = (now_s() - t0) / c.iters;
    }
    if (c.do_commit) {
      const double t0 = now_s();
      for (int k = 0; k < c.iters; ++k)
        if (!commit()) return 1;
      sh->commit_s[r] = (now_s() - t0) / c.iters;
    }
  }
  if (rank == 0) {
    const ps::worker_telemetry wt = wk->telemetry();
    sh->copied_replies = wt.copied_replies;
    if (o.describe)
      std::fprintf(stderr, "worker 0: commits %llu pulls %llu plans %llu messages out %llu in %llu copied replies %llu\n",
                   static_cast<unsigned long long>(wt.commits), static_cast<unsigned long long>(wt.pulls),
                   static_cast<unsigned long long>(wt.plans),
                   static_cast<unsigned long long>(wt.transport.messages_sent),
                   static_cast<unsigned long long>(wt.transport.messages_received),
                   static_cast<unsigned long long>(wt.copied_replies));
  }
  if (auto s = wk->leave(); !s) return set_error(sh, s.to_string()), 1;
  return 0;
}

struct ashl_result {
  bool ok = false;
  std::string error, lanes;
  std::vector<double> pull_s, commit_s, fan_gbps;
  double server_idle = 0, server_cpu = 0, server_runq = 0;
  std::uint64_t snapshots = 0, commits_applied = 0, copied_replies = 0, batched_commits = 0, applied_as_landed = 0;
  std::uint64_t fused_applies = 0, applied_beside = 0;
  double server_us_per_commit = 0;
  std::uint64_t backup_records = 0;
};

ashl_result run_ashl(const options& o, const std::string& transport, const ashl_case& c, bool with_backup = false) {
  ashl_result res;
  void* m = ::mmap(nullptr, sizeof(shared_area), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return res.error = "mmap failed", res;
  auto* sh = new (m) shared_area{};
  int fds[2];
  if (::pipe(fds) != 0) return res.error = "pipe failed", res;
  std::fflush(nullptr);
  const pid_t server = ::fork();
  if (server == 0) {
    ::close(fds[0]);
    set_ucx_env(transport);
    for (const std::string& kv : o.server_env) ::putenv(const_cast<char*>(kv.c_str()));  // lives as long as o
    pin_server(o);
    ::alarm(900);
    std::_Exit(run_server(o, c, sh, fds[1], with_backup));
  }
  ::close(fds[1]);
  std::string addr = read_all(fds[0], 30);
  ::close(fds[0]);
  while (!addr.empty() && (addr.back() == '\n' || addr.back() == '\r')) addr.pop_back();
  pid_t backup = -1;
  if (with_backup && !addr.empty()) {
    int ready[2];
    if (::pipe(ready) != 0) return res.error = "pipe failed", res;
    std::fflush(nullptr);
    backup = ::fork();
    if (backup == 0) {
      ::close(ready[0]);
      set_ucx_env(transport);
      pin_to(1, o.pin);
      ::alarm(900);
      std::_Exit(run_backup(o, c, sh, addr, ready[1]));
    }
    ::close(ready[1]);
    if (read_all(ready[0], 90).rfind("ok", 0) != 0) addr.clear();  // no backup: no workers, the case fails
    ::close(ready[0]);
  }
  std::vector<pid_t> workers;
  if (!addr.empty()) {
    for (int k = 0; k < c.workers; ++k) {
      const pid_t p = ::fork();
      if (p == 0) {
        set_ucx_env(transport);
        pin_to(1, o.pin);
        ::alarm(900);
        std::_Exit(run_worker(o, c, sh, addr, static_cast<std::uint32_t>(k)));
      }
      workers.push_back(p);
    }
  }
  int bad = addr.empty() ? 1 : 0;
  for (pid_t p : workers) bad |= reap(p, 900) != 0;
  if (bad) ::kill(server, SIGTERM);
  bad |= reap(server, bad ? 5 : 60) != 0;
  if (backup > 0) bad |= reap(backup, bad ? 5 : 60) != 0;
  res.ok = !bad;
  res.error = sh->error[0] ? sh->error : (bad ? "a process failed" : "");
  res.lanes = sh->lanes;
  if (o.describe) std::fprintf(stderr, "worker endpoint (%s, %zu bytes):\n%s\n", transport.c_str(), c.bytes, sh->describe);
  for (int r = 0; r < c.reps; ++r) {
    if (c.fan) {
      double a = 1e300, b = 0;
      for (int k = 0; k < c.workers; ++k) {
        a = std::min(a, sh->start[r][k]);
        b = std::max(b, sh->end[r][k]);
      }
      const double bytes = static_cast<double>(c.bytes) * c.iters * c.workers;
      res.fan_gbps.push_back(b > a ? bytes / (b - a) * 1e-9 : 0.0);
      continue;
    }
    if (c.do_pull) res.pull_s.push_back(sh->pull_s[r]);
    if (c.do_commit) res.commit_s.push_back(sh->commit_s[r]);
  }
  res.server_idle = sh->server_idle;
  res.server_cpu = sh->server_cpu;
  res.server_runq = sh->server_runq;
  res.snapshots = sh->snapshots;
  res.commits_applied = sh->commits_applied;
  res.batched_commits = sh->batched_commits;
  res.applied_as_landed = sh->applied_as_landed;
  res.fused_applies = sh->fused_applies;
  res.applied_beside = sh->applied_beside;
  res.server_us_per_commit = sh->server_us_per_commit;
  res.copied_replies = sh->copied_replies;
  res.backup_records = sh->backup_records;
  sh->~shared_area();
  ::munmap(m, sizeof(shared_area));
  return res;
}

// ------------------------------------------------------------- ucx_perftest

struct perftest_result {
  bool ok = false;
  double gbps = 0, usec = 0;  // overall bandwidth (10^9 B/s), overall latency (perftest's: half a round trip for *_lat)
  std::string lanes, error;
};

// One ucx_perftest run: server (cpu 0) and client (cpu 1) with the case's UCX_TLS.
perftest_result run_perftest_once(const options& o, const std::string& transport, const std::string& test,
                                  std::size_t bytes, long iters, bool eh) {
  perftest_result res;
  const int port = free_port();
  if (port == 0) return res.error = "no free port", res;
  const std::string port_s = std::to_string(port);
  std::fflush(nullptr);
  const pid_t server = ::fork();
  if (server == 0) {
    set_ucx_env(transport);
    pin_to(0, o.pin);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execl(o.perftest.c_str(), "ucx_perftest", "-p", port_s.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  const double until = now_s() + 10;
  while (!listening(port) && now_s() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  int fds[2];
  if (::pipe(fds) != 0) return res.error = "pipe failed", res;
  const std::string size = std::to_string(bytes), n = std::to_string(iters),
                    warm = std::to_string(std::max<long>(iters / 10, 2));
  const pid_t client = ::fork();
  if (client == 0) {
    set_ucx_env(transport);
    ::setenv("UCX_LOG_LEVEL", "info", 1);  // prints the endpoint's lanes (ep_cfg) at start
    pin_to(1, o.pin);
    ::close(fds[0]);
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::execl(o.perftest.c_str(), "ucx_perftest", "127.0.0.1", "-p", port_s.c_str(), "-t", test.c_str(), "-s", size.c_str(),
            "-n", n.c_str(), "-w", warm.c_str(), "-f", "-v", eh ? "-e" : static_cast<char*>(nullptr),
            static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  ::close(fds[1]);
  const std::string out = read_all(fds[0], 300);
  ::close(fds[0]);
  const int rc = reap(client, 10);
  reap(server, 10);
  // The last line that starts with a number is the CSV of the final figures:
  // iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr
  std::istringstream in(out);
  std::string line, last;
  while (std::getline(in, line)) {
    const auto p = line.find_first_not_of(' ');
    if (p != std::string::npos && std::isdigit(static_cast<unsigned char>(line[p]))) last = line.substr(p);
    if (const auto e = line.find("ep_cfg["); e != std::string::npos) {
      const auto colon = line.find(": ", e);
      if (colon != std::string::npos && res.lanes.empty()) res.lanes = line.substr(colon + 2);
    }
  }
  const auto f = split(last, ',');
  if (rc != 0 || f.size() < 8) {
    res.error = "ucx_perftest " + test + " -s " + size + " failed (exit " + std::to_string(rc) + "): " +
                out.substr(out.size() > 300 ? out.size() - 300 : 0);
    return res;
  }
  res.usec = std::strtod(f[3].c_str(), nullptr);
  res.gbps = std::strtod(f[5].c_str(), nullptr) * double(MiB) * 1e-9;  // perftest's MB/s are MiB/s
  res.ok = true;
  return res;
}

struct perftest_figure {
  bool ok = false;
  double gbps = std::nan(""), usec = std::nan("");
  std::string lanes, error;
};

perftest_figure run_perftest(const options& o, const std::string& transport, const std::string& test,
                             std::size_t bytes, long iters, bool eh, int reps) {
  std::vector<double> g, u;
  perftest_figure fig;
  if (!o.baseline) return fig;
  for (int r = 0; r < reps; ++r) {
    auto p = run_perftest_once(o, transport, test, bytes, iters, eh);
    if (!p.ok) {
      fig.error = p.error;
      continue;
    }
    g.push_back(p.gbps);
    u.push_back(p.usec);
    if (fig.lanes.empty()) fig.lanes = p.lanes;
  }
  if (!g.empty()) {
    fig.ok = true;
    fig.gbps = median(g);
    fig.usec = median(u);
  }
  return fig;
}

// ------------------------------------------------------------------- output

struct row {
  std::string op, transport;
  std::size_t bytes = 0;
  int workers = 1;  // worker processes (fan_in, fan_in_push: --fan-in-workers)
  double gbps = std::nan(""), usec = std::nan("");
  std::string baseline;
  double baseline_gbps = std::nan(""), baseline_usec = std::nan("");
  double ratio = std::nan("");
  std::string goal;  // ">= 0.8", "<= 2", ... or "" (no goal at this size)
  bool met = false;
  double ref_tag_gbps = std::nan(""), ref_tag_usec = std::nan("");
  double ref_eh_gbps = std::nan(""), ref_eh_usec = std::nan("");  // perftest -e (peer error handling, as ashl)
  std::string ref_eh_lanes;
  double extra = std::nan("");  // commit_oneway_gbps (commit), moved_gbps (fan_in)
  std::string lanes, baseline_lanes, placement;
  int reps = 0, iters = 0;
  double server_idle = std::nan("");
  double server_cpu = std::nan(""), server_runq = std::nan("");  // fan-in: the server thread on a CPU / waiting for one
  double batched = std::nan("");  // the share of commits added in a batched pass (server_params.apply_batch)
  double as_landed = std::nan("");  // the share of commits added as their parts landed (commits in parts)
  double fused = std::nan(""), beside = std::nan("");  // fan-in: shares of commits applied from the check pass / beside
  double server_us = std::nan("");  // fan-in: the server thread's CPU µs per commit (its life, warm-up included)
  std::string error;
};

const char* fuse_name(ps::fused_apply f) {
  return f == ps::fused_apply::off ? "off" : f == ps::fused_apply::beside ? "beside" : "always";
}

std::string num(double v, int prec = 4) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

std::string human_bytes(std::size_t b) {
  if (b >= MiB) return std::to_string(b / MiB) + " MiB";
  return std::to_string(b / KiB) + " KiB";
}

long perftest_iters(const options& o, std::size_t bytes) {
  const double target = o.quick ? 64.0 * MiB : 256.0 * MiB;
  return std::clamp<long>(static_cast<long>(target / static_cast<double>(bytes)), 16, 100000);
}

int ashl_iters(const options& o, std::size_t bytes) {
  if (o.iters > 0) return o.iters;
  const double target = o.quick ? 16.0 * MiB : 64.0 * MiB;
  return std::clamp<int>(static_cast<int>(target / static_cast<double>(bytes)), 2, o.quick ? 500 : 2000);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  bool reps_given = false, commit_chunk_given = false;
  std::string sizes_arg;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--quick") o.quick = true;
    else if (a == "--json-only") o.json_only = true;
    else if (a == "--reps") o.reps = std::clamp(std::atoi(next().c_str()), 1, max_reps), reps_given = true;
    else if (a == "--progress") {
      const std::string v = next();
      if (v != "poll" && v != "wait") return std::fprintf(stderr, "--progress: poll or wait\n"), 2;
      o.poll = v == "poll";
    } else if (a == "--no-pin") o.pin = false;
    else if (a == "--in-place-replies") o.stage_replies = false;
    else if (a == "--flip-replies") o.flip_replies = true;
    else if (a == "--trust-local-lanes") o.trust_local_lanes = true;
    else if (a == "--chunk-kib") o.chunk_kib = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--commit-chunk-kib") {
      o.commit_chunk_kib = std::strtoull(next().c_str(), nullptr, 10);
      commit_chunk_given = true;
    } else if (a == "--commit-window") o.commit_window = static_cast<std::uint32_t>(std::strtoul(next().c_str(), nullptr, 10));
    else if (a == "--describe") o.describe = true;
    else if (a == "--no-baseline") o.baseline = false;
    else if (a == "--spin-us") o.spin_us = std::atol(next().c_str());
    else if (a == "--iters") o.iters = std::max(std::atoi(next().c_str()), 0);
    else if (a == "--transports") o.transports = split(next(), ',');
    else if (a == "--ops") o.ops = split(next(), ',');
    else if (a == "--sizes") sizes_arg = next();
    else if (a == "--perftest") o.perftest = next();
    else if (a == "--fan-in-workers" || a == "--fan-workers") {
      const long v = std::atol(next().c_str());
      if (v < 1 || v > max_workers)
        return std::fprintf(stderr, "%s = %ld: must be in 1..%d\n", a.c_str(), v, max_workers), 2;
      o.fan_workers = static_cast<int>(v);
    }
    else if (a == "--apply-batch") {
      const long v = std::atol(next().c_str());
      if (v < 1 || v > static_cast<long>(ps::server<tr::ucx>::max_apply_batch))
        return std::fprintf(stderr, "--apply-batch = %ld: must be in 1..%u\n", v, ps::server<tr::ucx>::max_apply_batch), 2;
      o.apply_batch = static_cast<std::uint32_t>(v);
    }
    else if (a == "--apply-as-landed") o.as_landed = true;
    else if (a == "--backup") o.backup = true;
    else if (a == "--server-ucx-env") {
      const std::string v = next();
      if (v.rfind("UCX_", 0) != 0 || v.find('=') == std::string::npos)
        return std::fprintf(stderr, "--server-ucx-env = '%s': must be UCX_NAME=VALUE\n", v.c_str()), 2;
      o.server_env.push_back(v);
    }
    else if (a == "--fuse-checks" && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v == "off") o.fuse = ps::fused_apply::off;
      else if (v == "beside") o.fuse = ps::fused_apply::beside;
      else if (v == "always") o.fuse = ps::fused_apply::always;
      else {
        std::fprintf(stderr, "--fuse-checks = %s: must be off, beside or always\n", v.c_str());
        return 2;
      }
    }
    else if (a == "--apply-threads") {
      const long v = std::atol(next().c_str());
      if (auto s = ps::apply_pool::check_threads(v < 0 ? 0 : static_cast<std::uint64_t>(v), "--apply-threads"); !s)
        return std::fprintf(stderr, "%s\n", s.message().c_str()), 2;
      o.apply_threads = static_cast<std::uint32_t>(v);
    }
    else {
      std::fprintf(stderr,
                   "usage: ashl_bench_ps_ucx [--quick] [--reps N] [--json-only] [--progress wait|poll] [--no-pin]\n"
                   "         [--transports shm,tcp] [--ops pull,commit,round_trip,fan_in,fan_in_push] [--sizes 4K,1M,...]\n"
                   "         [--apply-threads N] [--apply-batch N] [--apply-as-landed] [--fuse-checks off|beside|always]\n"
                   "         [--perftest PATH] [--fan-in-workers N] [--describe] [--no-baseline] [--spin-us N]\n"
                   "         [--in-place-replies] [--flip-replies] [--trust-local-lanes] [--chunk-kib N] [--commit-chunk-kib N] [--commit-window N]\n"
                   "         [--iters N]  (ashl operations per repetition; default 64 MiB worth, 2..2000) [--backup]\n"
                   "         [--server-ucx-env UCX_NAME=VALUE]  (the server's process alone; repeatable)\n");
      return 2;
    }
  }
  if (o.backup && o.apply_batch != 1)
    return std::fprintf(stderr, "--backup with --apply-batch = %u: a primary with a backup applies one commit per event "
                                "(server_params.take_backup needs apply_batch 1)\n", o.apply_batch), 2;
  if (o.quick && !reps_given) o.reps = 3;
  if (!commit_chunk_given) o.commit_chunk_kib = o.chunk_kib;
  if (!sizes_arg.empty()) {
    for (const auto& s : split(sizes_arg, ',')) {
      const double v = std::strtod(s.c_str(), nullptr);
      const char u = s.back();
      o.sizes.push_back(static_cast<std::size_t>(v * (u == 'K' ? KiB : u == 'M' ? MiB : 1)));
    }
  } else if (o.quick) {
    o.sizes = {4 * KiB, 1 * MiB, 16 * MiB};
  } else {
    o.sizes = {4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB};
  }
  auto has = [&](const char* op) { return std::find(o.ops.begin(), o.ops.end(), op) != o.ops.end(); };
  if (::access(o.perftest.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "ashl_bench_ps_ucx: %s not found (Debian: apt-get install ucx-utils; or --perftest PATH)\n",
                 o.perftest.c_str());
    return 2;
  }
  std::signal(SIGPIPE, SIG_IGN);

  std::string ucx_env = ucx_environment();
  for (const std::string& kv : o.server_env) ucx_env += (ucx_env.empty() ? "server " : " server ") + kv;
  const std::string mach = machine(), date = today(), load_before = loadavg();
  const char* progress = o.poll ? "poll" : "wait";
  std::vector<row> rows;
  for (const auto& transport : o.transports) {
    if (transport != "shm" && transport != "tcp") {
      std::fprintf(stderr, "--transports: shm or tcp, not '%s'\n", transport.c_str());
      return 2;
    }
    // Bandwidth and the 4 KiB round trip: per size, each repetition runs
    // perftest, then a fresh ashl server and worker, then the reference
    // perftests, so load from elsewhere reaches a repetition's figures alike;
    // ratios are medians of the repetitions' paired ratios.
    for (const std::size_t bytes : o.sizes) {
      const bool want_pull = has("pull"), want_commit = has("commit") || (has("round_trip") && bytes == 4 * KiB);
      if (!want_pull && !want_commit) continue;
      const bool rt = has("round_trip") && bytes == 4 * KiB;
      const ashl_case c{.bytes = bytes, .workers = 1, .reps = 1, .iters = ashl_iters(o, bytes),
                        .do_pull = true, .do_commit = want_commit};
      const long n_bw = perftest_iters(o, bytes), n_lat = o.quick ? 5000 : 10000;
      std::vector<double> am_g, tag_g, eh_g, lat_u, tlat_u, elat_u, pull_s, commit_s, r_pull, r_commit, r_rt, idle,
          landed, backup_s, r_backup;
      std::string lanes, am_lanes, eh_lanes, lat_lanes, elat_lanes, error;
      for (int rep = 0; rep < o.reps; ++rep) {
        const perftest_figure am = run_perftest(o, transport, "ucp_am_bw", bytes, n_bw, false, 1);
        const ashl_result a = run_ashl(o, transport, c);
        // The same case with a backup, right after it: the pair's ratio is
        // the backup's cost, whatever the load did between repetitions.
        const ashl_result ab = o.backup && want_commit ? run_ashl(o, transport, c, true) : ashl_result{};
        if (o.backup && want_commit && !ab.ok && error.empty()) error = "with a backup: " + ab.error;
        const perftest_figure tag = run_perftest(o, transport, "tag_bw", bytes, n_bw, false, 1);
        const perftest_figure eh = run_perftest(o, transport, "ucp_am_bw", bytes, n_bw, true, 1);
        perftest_figure lat, tlat, elat;
        if (rt) {
          lat = run_perftest(o, transport, "ucp_am_lat", bytes, n_lat, false, 1);
          tlat = run_perftest(o, transport, "tag_lat", bytes, n_lat, false, 1);
          elat = run_perftest(o, transport, "ucp_am_lat", bytes, n_lat, true, 1);
        }
        if (!a.ok && error.empty()) error = a.error;
        if (!am.ok && error.empty() && o.baseline) error = am.error;
        if (lanes.empty()) lanes = a.lanes;
        if (am_lanes.empty()) am_lanes = am.lanes;
        if (eh_lanes.empty()) eh_lanes = rt ? elat.lanes : eh.lanes;
        if (lat_lanes.empty()) lat_lanes = lat.lanes;
        if (am.ok) am_g.push_back(am.gbps);
        if (tag.ok) tag_g.push_back(tag.gbps);
        if (eh.ok) eh_g.push_back(eh.gbps);
        if (lat.ok) lat_u.push_back(2.0 * lat.usec);  // perftest prints half a round trip
        if (tlat.ok) tlat_u.push_back(2.0 * tlat.usec);
        if (elat.ok) elat_u.push_back(2.0 * elat.usec);
        if (!a.ok) continue;
        idle.push_back(a.server_idle);
        pull_s.push_back(a.pull_s[0]);
        if (am.ok) r_pull.push_back(static_cast<double>(bytes) / a.pull_s[0] * 1e-9 / am.gbps);
        if (want_commit) {
          commit_s.push_back(a.commit_s[0]);
          if (a.commits_applied > 0) landed.push_back(static_cast<double>(a.applied_as_landed) / a.commits_applied);
          if (am.ok) r_commit.push_back(2.0 * static_cast<double>(bytes) / a.commit_s[0] * 1e-9 / am.gbps);
          if (lat.ok) r_rt.push_back(a.commit_s[0] * 1e6 / (2.0 * lat.usec));
          if (ab.ok) {
            backup_s.push_back(ab.commit_s[0]);
            r_backup.push_back(a.commit_s[0] / ab.commit_s[0]);
          }
        }
      }
      const double pull_m = median(pull_s), commit_m = median(commit_s), am_m = median(am_g);
      auto base = [&](const std::string& op) {
        row r{.op = op, .transport = transport, .bytes = bytes, .baseline = "ucp_am_bw", .baseline_gbps = am_m,
              .ref_tag_gbps = median(tag_g), .lanes = lanes, .baseline_lanes = am_lanes,
              .placement = placement(o, false), .reps = o.reps, .iters = c.iters, .server_idle = median(idle)};
        r.error = error;
        r.ref_eh_gbps = median(eh_g);
        r.ref_eh_lanes = eh_lanes;
        return r;
      };
      if (has("pull")) {
        row r = base("pull");
        r.gbps = static_cast<double>(bytes) / pull_m * 1e-9;
        r.usec = pull_m * 1e6;
        r.baseline_usec = static_cast<double>(bytes) / (am_m * 1e9) * 1e6;
        r.ratio = median(r_pull);
        if (bytes >= MiB) r.goal = ">= 0.8", r.met = r.ratio >= 0.8;
        rows.push_back(r);
      }
      if (has("commit")) {
        row r = base("commit");
        r.gbps = 2.0 * static_cast<double>(bytes) / commit_m * 1e-9;
        r.usec = commit_m * 1e6;
        r.baseline_usec = 2.0 * static_cast<double>(bytes) / (am_m * 1e9) * 1e6;
        r.ratio = median(r_commit);
        r.extra = commit_m > pull_m ? static_cast<double>(bytes) / (commit_m - pull_m) * 1e-9 : std::nan("");
        r.as_landed = median(landed);
        if (bytes >= MiB) r.goal = ">= 0.8", r.met = r.ratio >= 0.8;
        rows.push_back(r);
      }
      if (has("commit") && o.backup) {
        // ratio = the commit cycle's rate with a backup / without, paired per
        // repetition (1: free; 0.5: a cycle twice as long).
        row r = base("commit_backup");
        const double b_m = median(backup_s);
        r.gbps = 2.0 * static_cast<double>(bytes) / b_m * 1e-9;
        r.usec = b_m * 1e6;
        r.baseline = "commit";
        r.baseline_gbps = 2.0 * static_cast<double>(bytes) / commit_m * 1e-9;
        r.baseline_usec = commit_m * 1e6;
        r.ref_tag_gbps = std::nan("");
        r.ref_eh_gbps = std::nan("");
        r.ratio = median(r_backup);
        r.placement += ", backup cpu1";
        rows.push_back(r);
      }
      if (rt) {
        row r = base("round_trip");
        r.baseline = "ucp_am_lat";
        r.baseline_gbps = std::nan("");
        r.ref_tag_gbps = std::nan("");
        r.baseline_lanes = lat_lanes;
        r.usec = commit_m * 1e6;
        r.baseline_usec = median(lat_u);
        r.ref_tag_usec = median(tlat_u);
        r.ref_eh_gbps = std::nan("");
        r.ref_eh_usec = median(elat_u);
        r.ratio = median(r_rt);
        r.goal = "<= 2";
        r.met = r.ratio <= 2.0;
        rows.push_back(r);
      }
      if (!o.json_only)
        std::fprintf(stderr, "  %s %s: done (pull %.1f us, commit %.1f us, am_bw %.2f GB/s)%s%s\n", transport.c_str(),
                     human_bytes(bytes).c_str(), pull_m * 1e6, commit_m * 1e6, am_m,
                     error.empty() ? "" : " ERROR ", error.c_str());
    }
    for (const bool push : {false, true}) {
      const char* op = push ? "fan_in_push" : "fan_in";
      if (!has(op)) continue;
      const std::size_t bytes = 4 * MiB;
      // 128 commits in all per repetition (32 with --quick), 16 each for 8
      // workers; at least 2 each for more.
      const int fan_iters = std::max(2, (o.quick ? 32 : 128) / std::max(8, o.fan_workers));
      const ashl_case c{.bytes = bytes, .workers = o.fan_workers, .reps = 1, .iters = fan_iters,
                        .fan = true, .push = push, .do_pull = false, .do_commit = true};
      std::vector<double> am_g, eh_g, fan_g, ratios, idle, batched, on_cpu, runq, fused, beside, server_us, backup_g,
          r_backup, backup_server_us;
      std::string lanes, am_lanes, eh_lanes, error;
      for (int rep = 0; rep < o.reps; ++rep) {
        const perftest_figure am = run_perftest(o, transport, "ucp_am_bw", bytes, perftest_iters(o, bytes), false, 1);
        const ashl_result a = run_ashl(o, transport, c);
        const ashl_result ab = o.backup ? run_ashl(o, transport, c, true) : ashl_result{};
        if (o.backup && !ab.ok && error.empty()) error = "with a backup: " + ab.error;
        const perftest_figure eh = run_perftest(o, transport, "ucp_am_bw", bytes, perftest_iters(o, bytes), true, 1);
        if (!a.ok && error.empty()) error = a.error;
        if (!am.ok && error.empty() && o.baseline) error = am.error;
        if (lanes.empty()) lanes = a.lanes;
        if (am_lanes.empty()) am_lanes = am.lanes;
        if (eh_lanes.empty()) eh_lanes = eh.lanes;
        if (am.ok) am_g.push_back(am.gbps);
        if (eh.ok) eh_g.push_back(eh.gbps);
        if (!a.ok) continue;
        idle.push_back(a.server_idle);
        on_cpu.push_back(a.server_cpu);
        runq.push_back(a.server_runq);
        if (a.commits_applied > 0) batched.push_back(static_cast<double>(a.batched_commits) / a.commits_applied);
        if (a.commits_applied > 0) fused.push_back(static_cast<double>(a.fused_applies) / a.commits_applied);
        if (a.commits_applied > 0) beside.push_back(static_cast<double>(a.applied_beside) / a.commits_applied);
        if (a.server_us_per_commit > 0) server_us.push_back(a.server_us_per_commit);
        fan_g.push_back(a.fan_gbps[0]);
        if (am.ok) ratios.push_back(a.fan_gbps[0] / am.gbps);
        if (ab.ok && a.fan_gbps[0] > 0) {
          backup_g.push_back(ab.fan_gbps[0]);
          r_backup.push_back(ab.fan_gbps[0] / a.fan_gbps[0]);
          if (ab.server_us_per_commit > 0) backup_server_us.push_back(ab.server_us_per_commit);
        }
      }
      row r{.op = op, .transport = transport, .bytes = bytes, .workers = o.fan_workers, .baseline = "ucp_am_bw",
            .baseline_gbps = median(am_g), .lanes = lanes, .baseline_lanes = am_lanes,
            .placement = placement(o, true), .reps = o.reps, .iters = c.iters, .server_idle = median(idle),
            .batched = median(batched)};
      r.gbps = median(fan_g);
      r.usec = static_cast<double>(bytes) / (r.gbps * 1e9) * 1e6;  // per commit, at the server
      r.baseline_usec = static_cast<double>(bytes) / (r.baseline_gbps * 1e9) * 1e6;
      r.extra = push ? r.gbps : 2.0 * r.gbps;  // a commit brings its 4 MiB pull reply back; a push its ack
      r.ratio = median(ratios);
      r.ref_eh_gbps = median(eh_g);
      r.ref_eh_lanes = eh_lanes;
      r.server_cpu = median(on_cpu);
      r.server_runq = median(runq);
      r.fused = median(fused);
      r.beside = median(beside);
      r.server_us = median(server_us);
      r.goal = ">= 0.6";
      r.met = r.ratio >= 0.6;
      r.error = error;
      rows.push_back(r);
      if (o.backup) {
        // ratio = the fan-in's goodput with a backup / without, paired per repetition.
        row b = r;
        b.op = std::string(op) + "_backup";
        b.baseline = op;
        b.baseline_gbps = r.gbps;
        b.baseline_usec = r.usec;
        b.gbps = median(backup_g);
        b.usec = static_cast<double>(bytes) / (b.gbps * 1e9) * 1e6;
        b.extra = push ? b.gbps : 2.0 * b.gbps;
        b.ratio = median(r_backup);
        b.ref_eh_gbps = std::nan("");
        b.server_us = median(backup_server_us);
        b.goal.clear();
        b.placement = r.placement + ", backup cpu1";
        rows.push_back(b);
      }
      if (!o.json_only)
        std::fprintf(stderr, "  %s %s (%d workers): done (%.2f GB/s)%s%s\n", transport.c_str(), op, o.fan_workers, r.gbps,
                     error.empty() ? "" : " ERROR ", error.c_str());
    }
  }

  const std::string load = load_before + " -> " + loadavg();
  if (!o.json_only) {
    std::printf("ps_ucx on %s (%d CPUs), %s, progress %s, replies %s, reply parts %llu KiB, commit parts %llu KiB "
                "(window %u), median of %d; ratio = gbps / baseline_gbps (round_trip: usec / baseline_usec)\n\n",
                mach.c_str(), cpus(), date.c_str(), progress, replies_mode(o),
                static_cast<unsigned long long>(o.chunk_kib), static_cast<unsigned long long>(o.commit_chunk_kib),
                o.commit_window, o.reps);
    std::printf("load average %s; UCX env: %s; crc %s\n\n", load.c_str(), ucx_env.empty() ? "(none)" : ucx_env.c_str(),
                o.trust_local_lanes ? "off (--trust-local-lanes)" : "on");
    if (o.apply_threads > 1) std::printf("server apply threads: %u\n\n", o.apply_threads);
    if (o.commit_chunk_kib > 0) {
      std::printf("commits in parts, %s; share of commits added as their parts landed:",
                  o.as_landed ? "added as they land (--apply-as-landed)" : "applied whole");
      for (const auto& r : rows)
        if (std::isfinite(r.as_landed)) std::printf(" %s %s %s", r.transport.c_str(), human_bytes(r.bytes).c_str(), num(r.as_landed, 2).c_str());
      std::printf("\n\n");
    }
    std::printf("server fuse_checks: %s; shares of commits applied from the check pass (fused) and beside a pinned "
                "version:", fuse_name(o.fuse));
    for (const auto& r : rows)
      if (std::isfinite(r.fused))
        std::printf(" %s %s %s/%s", r.op.c_str(), r.transport.c_str(), num(r.fused, 2).c_str(), num(r.beside, 2).c_str());
    std::printf("\n\n");
    if (o.apply_batch > 1) {
      std::printf("server apply batch: %u; share of commits added in a batched pass:", o.apply_batch);
      for (const auto& r : rows)
        if (std::isfinite(r.batched)) std::printf(" %s %s %s", r.op.c_str(), r.transport.c_str(), num(r.batched, 2).c_str());
      std::printf("\n\n");
    }
    std::printf("%-18s %3s %-4s %8s %10s %10s %-10s %10s %10s %7s %7s %4s %10s  %s | %s | %s\n", "op", "wk", "tl", "bytes", "GB/s",
                "usec", "baseline", "base GB/s", "base usec", "ratio", "goal", "met", "-e GB/s|us", "ashl lanes",
                "perftest lanes", "perftest -e lanes");
    for (const auto& r : rows) {
      std::printf("%-18s %3d %-4s %8s %10s %10s %-10s %10s %10s %7s %7s %4s %10s  %s | %s | %s%s%s\n", r.op.c_str(),
                  r.workers, r.transport.c_str(), human_bytes(r.bytes).c_str(), num(r.gbps, 3).c_str(), num(r.usec, 1).c_str(),
                  r.baseline.c_str(), num(r.baseline_gbps, 3).c_str(), num(r.baseline_usec, 1).c_str(),
                  num(r.ratio, 2).c_str(), r.goal.empty() ? "-" : r.goal.c_str(),
                  r.goal.empty() ? "-" : (r.met ? "yes" : "no"),
                  std::isfinite(r.ref_eh_gbps) ? num(r.ref_eh_gbps, 3).c_str() : num(r.ref_eh_usec, 1).c_str(),
                  r.lanes.c_str(), r.baseline_lanes.c_str(), r.ref_eh_lanes.c_str(),
                  r.error.empty() ? "" : "  ERROR: ", r.error.c_str());
    }
    std::printf("\n");
  }
  for (const auto& r : rows) {
    std::printf(
        "{\"bench\":\"ps_ucx\",\"fuse_checks\":\"%s\",\"fused\":%s,\"beside\":%s,\"server_us_per_commit\":%s,\"apply_threads\":%u,\"apply_batch\":%u,\"batched\":%s,\"as_landed\":%s,\"op\":\"%s\",\"workers\":%d,\"transport\":\"%s\",\"ucx_tls\":\"%s\",\"bytes\":%zu,\"gbps\":%s,"
        "\"usec\":%s,\"baseline\":\"%s\",\"baseline_gbps\":%s,\"baseline_usec\":%s,\"ratio\":%s,\"goal\":\"%s\","
        "\"met\":%s,\"ref_tag_gbps\":%s,\"ref_tag_usec\":%s,\"ref_eh_gbps\":%s,\"ref_eh_usec\":%s,\"ref_eh_lanes\":\"%s\",\"%s\":%s,\"server_idle\":%s,\"server_cpu\":%s,\"server_runq\":%s,\"lanes\":\"%s\","
        "\"baseline_lanes\":\"%s\",\"progress\":\"%s\",\"crc\":\"%s\",\"replies\":\"%s\",\"chunk_kib\":%llu,\"commit_chunk_kib\":%llu,\"commit_window\":%u,\"placement\":\"%s\",\"reps\":%d,\"iters\":%d,"
        "\"machine\":\"%s\",\"date\":\"%s\",\"ucx_env\":\"%s\",\"load\":\"%s\","
        "\"error\":\"%s\"}\n",
        fuse_name(o.fuse), num(r.fused, 3).c_str(), num(r.beside, 3).c_str(), num(r.server_us, 1).c_str(), o.apply_threads, o.apply_batch, num(r.batched, 3).c_str(), num(r.as_landed, 3).c_str(), r.op.c_str(), r.workers, r.transport.c_str(), tls_of(r.transport), r.bytes, num(r.gbps).c_str(), num(r.usec, 2).c_str(),
        r.baseline.c_str(), num(r.baseline_gbps).c_str(), num(r.baseline_usec, 2).c_str(), num(r.ratio).c_str(),
        r.goal.c_str(), r.goal.empty() ? "null" : (r.met ? "true" : "false"), num(r.ref_tag_gbps).c_str(),
        num(r.ref_tag_usec, 2).c_str(), num(r.ref_eh_gbps).c_str(), num(r.ref_eh_usec, 2).c_str(),
        json_escape(r.ref_eh_lanes).c_str(), r.op.rfind("fan_in", 0) == 0 ? "moved_gbps" : "commit_oneway_gbps", num(r.extra).c_str(),
        num(r.server_idle, 3).c_str(), num(r.server_cpu, 3).c_str(), num(r.server_runq, 3).c_str(), json_escape(r.lanes).c_str(), json_escape(r.baseline_lanes).c_str(), progress,
        o.trust_local_lanes ? "off" : "on", replies_mode(o), static_cast<unsigned long long>(o.chunk_kib),
        static_cast<unsigned long long>(o.commit_chunk_kib), o.commit_window, r.placement.c_str(), r.reps, r.iters, json_escape(mach).c_str(), date.c_str(), json_escape(ucx_env).c_str(), load.c_str(),
        json_escape(r.error).c_str());
  }
  bool errors = false;
  for (const auto& r : rows) errors |= !r.error.empty();
  return errors ? 1 : 0;
}

#endif  // ASHL_HAS_UCX()
