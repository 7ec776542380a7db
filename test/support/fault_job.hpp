// test/support/fault_job.hpp — a parameter-server job of ashl_test_ps_node
// processes started one by one, so a test can kill, stop, restart or add
// any of them (test/ps/kill.cpp, evict.cpp, checkpoint_restart.cpp). Every
// process runs over UCX on 127.0.0.1 (UCX_NET_DEVICES=lo; UCX_TLS the job's
// tls: "tcp,self" by default, "sm,self,tcp" for shared memory) with a job
// token, writes its log to the job's directory, and is bounded: finish()
// kills what outlives its bound, and the destructor kills what is left.
//
//   fault_job::job j(3);                                   // 3 workers
//   pid_t s = j.start_server({"--policy", "bsp"});         // waits for "listening on"
//   pid_t w0 = j.start_worker(0, {"--cycles", "100"});
//   ::kill(w0, SIGKILL);
//   auto o = j.finish(s, 60s);                             // exit code, log
//
// Elastic jobs (test/ps/chaos.cpp; docs/elastic.md §5): a job of at most
// `max_workers` (ASHL_MAX_WORKERS; ranks past the initial workers join
// later with start_worker) over `servers` shards (start_server(..., shard));
// every worker process gets a slot of the shared file (--process-slot, the
// first 32 processes) where it counts its incarnation, commits sent and
// commits acknowledged (process_incarnation, process_sent, process_acked),
// so a test compares the servers' exactly-once table per (rank, incarnation)
// with what each process was acknowledged. chaos_seed() is a test's seed,
// printed, or ASHL_CHAOS_SEED's to replay one. set_backups() gives shards a
// backup (docs/elastic.md §4.6: every process gets ASHL_BACKUP_ADDR, the
// backups' ports chosen with the servers'); start_backup() starts one
// (ASHL_REPLICA=1) and waits until it caught up with its primary; a
// primary killed and started again with start_server() on its port asks
// its peer first and attaches as the new backup (ashl_test_ps_node).
#pragma once

#include "node_files.hpp"
#include "process.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace fault_job {

using env_list = std::vector<std::pair<std::string, std::string>>;

// a followed by b: argument lists built from common parts.
inline std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Whether a process's log holds `text`.
inline bool has(const std::string& log, const std::string& text) { return log.find(text) != std::string::npos; }

// max |w_i - target| (the workers' --quadratic T pulls every w_i to T), or
// 1e9 for no parameters at all (a job that wrote none did not reach it).
inline float max_distance(const std::vector<float>& w, float target) {
  float d = 0;
  for (float x : w) d = std::max(d, std::fabs(x - target));
  return w.empty() ? 1e9f : d;
}

// A test's seed: ASHL_CHAOS_SEED when set (replaying a run), else a fresh
// one; printed either way, so a failure names the seed that replays it.
inline std::uint64_t chaos_seed(const std::string& what) {
  std::uint64_t seed = 0;
  if (const char* v = std::getenv("ASHL_CHAOS_SEED"); v != nullptr && *v != '\0') {
    seed = std::strtoull(v, nullptr, 0);
  } else {
    std::random_device rd;
    seed = (std::uint64_t{rd()} << 32) ^ rd();
  }
  std::printf("%s: seed %llu (ASHL_CHAOS_SEED=%llu replays it)\n", what.c_str(), static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  return seed;
}

class job {
 public:
  // Slots of the shared file (test/programs/ps_node.cpp's shared_file).
  static constexpr std::size_t slots = 256, process_slots = 32;

  explicit job(std::uint32_t workers, std::string stem = "ashl-fault-job", std::string tls = "tcp,self",
               std::uint32_t max_workers = 0, std::uint32_t servers = 1)
      : workers_(workers), max_workers_(max_workers), servers_(servers), dir_(process::temp_dir(stem)),
        tls_(std::move(tls)), ports_(servers, 0) {
    shared_ = dir_ + "/counters";
    std::ofstream f(shared_, std::ios::binary);
    std::vector<char> zeros(slots * 8, 0);
    f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
    f.close();
    const int fd = ::open(shared_.c_str(), O_RDWR);
    if (fd >= 0) {
      void* m = ::mmap(nullptr, slots * sizeof(std::uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd);
      if (m != MAP_FAILED) counters_ = static_cast<std::uint64_t*>(m);
    }
  }
  job(const job&) = delete;
  job& operator=(const job&) = delete;
  ~job() {
    for (pid_t p : running_) {
      ::kill(-p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
    if (counters_) ::munmap(counters_, slots * sizeof(std::uint64_t));
  }

  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }
  // Every server's address, comma-separated (ASHL_SERVER_ADDR).
  [[nodiscard]] std::string address() const {
    std::string a;
    for (std::size_t s = 0; s < ports_.size(); ++s) a += (s ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(ports_[s]);
    return a;
  }
  // Shard s's backup's address ("" without one).
  [[nodiscard]] std::string backup_address(std::uint32_t s) const {
    return s < backup_ports_.size() && backup_ports_[s] != 0 ? "127.0.0.1:" + std::to_string(backup_ports_[s]) : "";
  }
  [[nodiscard]] std::string server_address(std::uint32_t s) const { return "127.0.0.1:" + std::to_string(ports_.at(s)); }
  // Which shards get a backup (before the first start_server).
  void set_backups(std::vector<bool> shards) {
    backups_ = std::move(shards);
    backups_.resize(servers_, false);
    backup_ports_.assign(servers_, 0);
  }
  // The ranks that may ever join: max_workers, or the initial workers.
  [[nodiscard]] std::uint32_t ranks() const noexcept { return std::max(workers_, max_workers_); }
  [[nodiscard]] bool ok() const noexcept { return !dir_.empty() && counters_ != nullptr; }

  // The server, on a free port (another one when the first was taken), or on
  // the port of the last start (a restart: workers reconnect to it). Returns
  // -1 if it did not start listening within `bound`. `extra` variables go
  // over the job's (ASHL_JOB, ASHL_NUM_WORKERS, ...).
  // With several servers, `shard` says which (ASHL_RANK); every server's
  // port is chosen at the first start of any.
  pid_t start_server(const std::vector<std::string>& args, const std::string& log = "server.log",
                     std::chrono::milliseconds bound = std::chrono::seconds(30), env_list extra = {},
                     std::uint32_t shard = 0) {
    int& port_ = ports_.at(shard);
    const bool restart = port_ != 0;
    for (int attempt = 0; attempt < (restart ? 20 : 5); ++attempt) {
      if (!restart) {
        for (int& p : ports_)
          if (p == 0 || &p == &port_) p = process::free_port();
        for (std::size_t b = 0; b < backup_ports_.size(); ++b)
          if (backups_[b] && backup_ports_[b] == 0) backup_ports_[b] = process::free_port();
      }
      env_list e = {{"ASHL_ROLE", "server"}, {"ASHL_RANK", std::to_string(shard)}};
      e.insert(e.end(), extra.begin(), extra.end());
      const pid_t p = process::start(node_argv(args), env(std::move(e)), dir_ + "/" + log);
      if (p < 0) return -1;
      if (process::wait_for_text(p, dir_ + "/" + log, "listening on", bound)) {
        running_.push_back(p);
        return p;
      }
      ::kill(-p, SIGKILL);
      ::waitpid(p, nullptr, 0);
      // A restart waits for the old listener's port to be free again.
      if (restart) std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return -1;
  }

  // Shard `shard`'s backup (set_backups; its primary started): returns -1
  // if it did not catch up with the primary within `bound`.
  pid_t start_backup(std::uint32_t shard, const std::vector<std::string>& args, const std::string& log,
                     std::chrono::milliseconds bound = std::chrono::seconds(30)) {
    if (backup_address(shard).empty()) return -1;
    const env_list e = {{"ASHL_ROLE", "server"}, {"ASHL_RANK", std::to_string(shard)}, {"ASHL_REPLICA", "1"}};
    const pid_t p = process::start(node_argv(args), env(e), dir_ + "/" + log);
    if (p < 0) return -1;
    running_.push_back(p);
    if (process::wait_for_text(p, dir_ + "/" + log, "backup listening on", bound)) return p;
    return -1;
  }

  // A process's log so far.
  [[nodiscard]] std::string log_text(const std::string& log) const {
    std::ifstream f(dir_ + "/" + log);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  }

  // A worker; with `counters` it counts its commits in the job's shared
  // file (commits_started) and first meets every other worker there (ps_node
  // --shared: a start barrier of at most 30 s).
  pid_t start_worker(std::uint32_t rank, const std::vector<std::string>& args, const std::string& log = "",
                     bool counters = true, env_list extra = {}) {
    const std::string name = log.empty() ? "worker" + std::to_string(rank) + ".log" : log;
    env_list e = {{"ASHL_ROLE", "worker"}, {"ASHL_RANK", std::to_string(rank)}};
    e.insert(e.end(), extra.begin(), extra.end());
    std::vector<std::string> argv = node_argv(args, counters);
    const std::size_t slot = next_slot_;
    if (counters && slot < process_slots) {
      argv.push_back("--process-slot");
      argv.push_back(std::to_string(slot));
    }
    const pid_t p = process::start(argv, env(std::move(e)), dir_ + "/" + name);
    if (p > 0) {
      running_.push_back(p);
      if (counters && slot < process_slots) slot_of_[p] = next_slot_++;
    }
    return p;
  }

  // A worker process's slot (from start_worker; process_slots when it has none).
  [[nodiscard]] std::size_t slot_of(pid_t p) const {
    const auto it = slot_of_.find(p);
    return it == slot_of_.end() ? process_slots : it->second;
  }
  // What the process of a slot counted: its incarnation (0 until it joined),
  // the commits it sent, the commits acknowledged (its wait() succeeded).
  [[nodiscard]] std::uint64_t process_incarnation(std::size_t slot) const { return load(128 + slot); }
  [[nodiscard]] std::uint64_t process_sent(std::size_t slot) const { return load(160 + slot); }
  [[nodiscard]] std::uint64_t process_acked(std::size_t slot) const { return load(192 + slot); }
  // Server 0's data ledger: its epochs completed, and the version after
  // which the workers leave (0 until the data is done).
  [[nodiscard]] std::uint64_t ledger_epochs_done() const { return load(64); }
  [[nodiscard]] std::uint64_t stop_version() const { return load(65); }

  // Waits for pid (killed past `bound`); the outcome's log is its log file.
  process::outcome finish(pid_t pid, std::chrono::milliseconds bound, const std::string& log) {
    process::outcome o;
    if (const auto it = exited_.find(pid); it != exited_.end()) {  // reaped by has_exited
      o.log_path = dir_ + "/" + log;
      o.exit_code = WIFEXITED(it->second) ? WEXITSTATUS(it->second) : 128 + WTERMSIG(it->second);
      exited_.erase(it);
    } else {
      o = process::finish(pid, bound, dir_ + "/" + log);
    }
    running_.erase(std::remove(running_.begin(), running_.end(), pid), running_.end());
    return o;
  }

  // Whether pid has ended (reaped here without waiting; finish() then
  // returns its exit code at once).
  bool has_exited(pid_t pid) {
    if (exited_.count(pid) != 0) return true;
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) != pid) return false;
    exited_[pid] = st;
    return true;
  }

  // Kills pid with `sig` (SIGKILL: reaped here).
  void signal(pid_t pid, int sig) {
    ::kill(pid, sig);
    if (sig == SIGKILL) {
      ::waitpid(pid, nullptr, 0);
      running_.erase(std::remove(running_.begin(), running_.end(), pid), running_.end());
    }
  }

  // The commits worker `rank` has started (ps_node --shared counts before sending).
  [[nodiscard]] std::uint64_t commits_started(std::uint32_t rank) const {
    return std::atomic_ref<std::uint64_t>(counters_[rank]).load();
  }
  [[nodiscard]] std::uint64_t commits_started_total() const {
    std::uint64_t t = 0;
    for (std::uint32_t k = 0; k < ranks(); ++k) t += commits_started(k);
    return t;
  }
  // The commits of worker `rank` (every process of that rank; ranks 0-30)
  // whose wait() succeeded: acknowledged by a server (ps_node counts them
  // after wait()).
  [[nodiscard]] std::uint64_t commits_acknowledged(std::uint32_t rank) const {
    return std::atomic_ref<std::uint64_t>(counters_[32 + rank]).load();
  }
  [[nodiscard]] std::uint64_t commits_acknowledged_total() const {
    std::uint64_t t = 0;
    for (std::uint32_t k = 0; k < ranks(); ++k) t += commits_acknowledged(k);
    return t;
  }
  // Waits (bounded) until worker `rank` has started at least n commits.
  bool wait_commits(std::uint32_t rank, std::uint64_t n, std::chrono::milliseconds bound) const {
    const auto end = std::chrono::steady_clock::now() + bound;
    while (std::chrono::steady_clock::now() < end) {
      if (commits_started(rank) >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }

  [[nodiscard]] std::map<std::string, double> server_counters(std::uint32_t shard = 0) const {
    return node_files::read_counters(dir_ + "/server" + std::to_string(shard) + ".txt");
  }
  [[nodiscard]] std::map<std::string, double> worker_counters(std::uint32_t k) const {
    return node_files::read_counters(dir_ + "/worker" + std::to_string(k) + ".txt");
  }
  [[nodiscard]] std::vector<float> parameters(std::uint32_t shard = 0) const {
    return node_files::read_f32(dir_ + "/server" + std::to_string(shard) + ".f32");
  }

 private:
  std::vector<std::string> node_argv(const std::vector<std::string>& args, bool counters = true) const {
    std::vector<std::string> argv = {ASHL_TEST_PS_NODE, "--out", dir_};
    if (counters) {
      argv.push_back("--shared");
      argv.push_back(shared_);
    }
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  [[nodiscard]] std::uint64_t load(std::size_t i) const { return std::atomic_ref<std::uint64_t>(counters_[i]).load(); }
  env_list env(env_list extra) const {
    env_list e = {{"UCX_TLS", tls_},
                  {"UCX_NET_DEVICES", "lo"},
                  {"ASHL_NUM_WORKERS", std::to_string(workers_)},
                  {"ASHL_SERVER_ADDR", address()},
                  {"ASHL_TOKEN", "fault-job-token-0123456789"}};
    if (max_workers_ != 0) e.emplace_back("ASHL_MAX_WORKERS", std::to_string(max_workers_));
    if (servers_ > 1) e.emplace_back("ASHL_NUM_SERVERS", std::to_string(servers_));
    if (std::find(backups_.begin(), backups_.end(), true) != backups_.end()) {
      std::string b;
      for (std::uint32_t s = 0; s < servers_; ++s) b += (s ? "," : "") + backup_address(s);
      e.emplace_back("ASHL_BACKUP_ADDR", b);
    }
    e.insert(e.end(), extra.begin(), extra.end());
    return e;
  }

  std::uint32_t workers_, max_workers_, servers_;
  std::string dir_, shared_, tls_;
  std::uint64_t* counters_ = nullptr;
  std::vector<int> ports_, backup_ports_;
  std::vector<bool> backups_;
  std::vector<pid_t> running_;
  std::map<pid_t, std::size_t> slot_of_;
  std::map<pid_t, int> exited_;  // statuses has_exited reaped
  std::size_t next_slot_ = 0;
};

}  // namespace fault_job
