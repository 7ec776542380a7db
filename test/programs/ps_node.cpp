// ashl_test_ps_node — one process of a parameter-server job for the
// multi-process tests (test/ps/ucx_job.cpp) and the benchmark: a server or a
// worker over UCX, by the runtime contract (ps/launch.hpp; started by
// ashl-run). Workers commit a deterministic gradient (multiples of 1/8, so a
// BSP round's sum is exact in any order) for --cycles cycles and write what
// they saw; servers write their parameters and counters. The tests compare
// these files with a single-process server_core run.
//
//   ashl-run -s 2 -w 4 -- ashl_test_ps_node --policy bsp --elements 1000 --cycles 20 --out DIR
//
// Files in --out: server<r>.f32 (the shard's parameters, raw little-endian
// f32), server<r>.txt and worker<k>.txt (key value lines; a worker also
// writes one "cycle" line per cycle: stage, plan's local iterations, the
// iterations it ran, compression ratio). --shared FILE: a file of 64 u64
// counters shared by the workers (mmap): the workers meet there before their
// first commit (a barrier: a worker that finished before another connected
// would leave an asynchronous policy with nobody to switch stages with),
// each counts its commits there before sending (with --together N it first
// waits, at most 5 s, while the slowest worker is more than N commits
// behind: the workers train together on a loaded machine), counts each
// commit whose wait() succeeded in slot 32 + rank (acknowledged: the fault
// tests compare them with the server's commits_applied; ranks 0-30 only,
// slot 63 is the barrier's), and with --ssp-check after
// each wait checks that no worker is more than --staleness commits behind
// its own count.
//
// Elastic jobs and the chaos test (test/ps/chaos.cpp; docs/elastic.md §5),
// grouped under "Elastic jobs" below: --min-workers (policy_params), the
// launch contract's --max-workers; --dataset N runs server 0's data ledger
// (--dataset-epochs, --lease-samples, --give-back-after-ms, --shuffle-seed)
// and makes a worker train the positions of its leases (sample ids of
// test/support/sample_ids.hpp), writing each commit's ids before sending it
// to <out>/trained-r<rank>-i<incarnation>.txt ("<sequence> <count> then
// epoch id pairs"), leaving at SIGTERM or once server 0 said the data is
// done; --event-log FILE makes a server write its core's records
// (rules/core_events.hpp) with its state before the first and after the
// last (FILE.initial, FILE.final) for a replay (a backup from its
// snapshot: the records it applied, then, promoted, its own; FILE.initial
// is the snapshot's state); --process-slot K counts a
// worker process's incarnation, commits sent and acknowledged in --shared
// (fault_job's 256-slot file); --join-rank and --join-elements make a
// worker that joins as another rank or with another model size under the
// job's id (refused joins); --max-backup-lag-kib a replicated shard's
// server_params::max_backup_lag_bytes.
#include <ashl/ps/launch.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/ps/server_replica.hpp>
#include <ashl/ps/worker.hpp>
#include <ashl/rules/core_events.hpp>
#include <ashl/transport/ucx.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../support/sample_ids.hpp"

#if !ASHL_HAS_UCX()
int main() {
  std::fprintf(stderr, "ashl_test_ps_node: built without UCX\n");
  return 77;
}
#else

namespace ps = ashl::ps;
namespace tr = ashl::transport;

namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop = true; }

float grad_value(std::uint32_t rank, std::uint64_t step, std::size_t i) {
  const std::uint64_t h = (rank * 2654435761u) ^ (step * 40503u) ^ (i * 2246822519u);
  return static_cast<float>(static_cast<int>((h >> 7) % 65) - 32) / 8.0f;
}

struct options {
  std::string policy = "bsp";
  ps::policy_params pp{};
  std::size_t elements = 1000;
  int cycles = 20;
  std::string out;
  std::string shared;
  bool ssp_check = false;
  int together = -1;  // with --shared: wait (bounded) before a commit while the slowest worker is more than this many commits behind
  int slow_rank = -1;
  int slow_ms = 0;
  double max_seconds = 120;
  int loss_switch_cycle = -1;  // report loss 1.0 before this cycle, 0.1 from it (ASHL's switch)
  std::string optimizer = "sgd";
  double connect_timeout = 30;  // seconds a worker keeps trying to reach the servers
  // Faults (test/ps/kill_*.cpp, evict_*.cpp, checkpoint_*.cpp):
  double quadratic = std::numeric_limits<double>::quiet_NaN();  // gradient w - T: training converges to T
  // T_i = T + spread·((i mod 7) − 3): targets that differ per element (a
  // lossy codec then drops something; test/ps/diloco_sim).
  float quadratic_spread = 0.0f;
  int cycle_ms = 0;               // a worker sleeps this long per cycle (training lasts)
  long timeout_ms = 60000;        // worker_params.timeout
  long reconnect_ms = 0;          // worker_params.reconnect
  std::uint64_t incarnation = 0;  // worker_params.incarnation (0: a fresh one, from the clock)
  std::string checkpoint_dir;     // server_params.checkpoint_dir
  double checkpoint_every_seconds = 0;
  std::uint64_t checkpoint_every_commits = 0;
  bool restore = false;
  long worker_timeout_ms = 20000;  // server_params.worker_timeout
  long no_worker_grace_ms = -1;     // server_params.no_worker_grace (-1: ASHL_NO_WORKER_GRACE's, 60 s)
  std::string codec = "topk";        // server_params.compression
  float codec_ratio = 1.0f;          // server_params.compression_ratio (plans the policy leaves dense)
  std::string reply_codec = "identity";  // server_core_params::replies (compressed pull replies)
  float reply_ratio = 1.0f;              // its ratio (topk and the other ratio codecs)
  bool trust_local_lanes = false;        // server_params/worker_params.trust_local_lanes (no CRC on loopback)
  std::uint32_t apply_batch = 1;     // server_params.apply_batch (batched applies; 1: each commit as it arrives)
  std::uint64_t reply_part_kib = 0;  // server_params.reply_part_bytes / 1024 (replies in parts; 0: whole)
  std::uint64_t commit_part_kib = 0;  // worker_params.commit_part_bytes / 1024 (dense commits in parts; 0: whole)
  std::uint32_t commit_window = 4;    // worker_params.commit_window
  long pause_after = -1, pause_ms = 0;  // a worker sleeps pause_ms before commit number pause_after (no messages)
  bool child_env = false;  // runs `env` as a child into <out>/child-env-<role><rank>.txt (test/ps/token_hygiene.cpp)
  // Elastic jobs (test/ps/chaos.cpp; docs/elastic.md §5): see the header.
  std::uint64_t dataset = 0;           // --dataset N: the data ledger's samples (0: none)
  std::uint64_t dataset_epochs = 0;    // its epochs (0: unbounded)
  std::uint64_t lease_samples = 0;     // ledger_params.lease_samples
  long give_back_after_ms = 30000;     // ledger_params.give_back_after
  std::uint64_t shuffle_seed = 0;      // ledger_params.shuffle_seed
  std::string event_log;               // a server's core records, with FILE.initial and FILE.final
  int process_slot = -1;               // a worker's slot in the 256-slot --shared file
  long join_rank = -1;                 // a worker joins as this rank (refused joins)
  std::uint64_t join_elements = 0;     // a worker's model has this many elements, its job id --elements'
  std::uint32_t batch = 16;            // worker_params.batch (a --dataset worker's positions per iteration)
  std::uint64_t max_backup_lag_kib = 0;  // server_params.max_backup_lag_bytes / 1024 (0: the default, the store bound)
};

int fail(const std::string& m) {
  std::fprintf(stderr, "ashl_test_ps_node: %s\n", m.c_str());
  return 1;
}

bool parse(const std::vector<std::string>& rest, options& o, std::string& err) {
  for (std::size_t i = 1; i < rest.size(); ++i) {
    const std::string& a = rest[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= rest.size()) {
        err = a + ": needs a value";
        return {};
      }
      return rest[++i];
    };
    if (a == "--policy") o.policy = next();
    else if (a == "--elements") o.elements = std::stoull(next());
    else if (a == "--cycles") o.cycles = std::stoi(next());
    else if (a == "--out") o.out = next();
    else if (a == "--shared") o.shared = next();
    else if (a == "--ssp-check") o.ssp_check = true;
    else if (a == "--together") o.together = std::stoi(next());
    else if (a == "--staleness") o.pp.staleness = std::stoll(next());
    else if (a == "--slow-rank") o.slow_rank = std::stoi(next());
    else if (a == "--slow-ms") o.slow_ms = std::stoi(next());
    else if (a == "--max-seconds") o.max_seconds = std::stod(next());
    else if (a == "--profile-iterations") o.pp.profile_iterations = std::stoll(next());
    else if (a == "--h-ahl") o.pp.h_ahl = std::stoll(next());
    else if (a == "--h-shl") o.pp.h_shl = std::stoll(next());
    else if (a == "--compression-ratio") o.pp.compression_ratio = std::stod(next());
    else if (a == "--switch-loss") o.pp.switch_loss = std::stod(next());
    else if (a == "--loss-switch-cycle") o.loss_switch_cycle = std::stoi(next());
    else if (a == "--optimizer") o.optimizer = next();
    else if (a == "--outer-delay") o.pp.outer_delay = std::stoll(next());
    else if (a == "--connect-timeout") o.connect_timeout = std::stod(next());
    else if (a == "--quadratic") o.quadratic = std::stod(next());
    else if (a == "--quadratic-spread") o.quadratic_spread = std::stof(next());
    else if (a == "--cycle-ms") o.cycle_ms = std::stoi(next());
    else if (a == "--timeout-ms") o.timeout_ms = std::stol(next());
    else if (a == "--reconnect-ms") o.reconnect_ms = std::stol(next());
    else if (a == "--incarnation") o.incarnation = std::stoull(next());
    else if (a == "--checkpoint-dir") o.checkpoint_dir = next();
    else if (a == "--checkpoint-every-seconds") o.checkpoint_every_seconds = std::stod(next());
    else if (a == "--checkpoint-every-commits") o.checkpoint_every_commits = std::stoull(next());
    else if (a == "--restore") o.restore = true;
    else if (a == "--worker-timeout-ms") o.worker_timeout_ms = std::stol(next());
    else if (a == "--no-worker-grace-ms") o.no_worker_grace_ms = std::stol(next());
    else if (a == "--codec") o.codec = next();
    else if (a == "--codec-ratio") o.codec_ratio = std::stof(next());
    else if (a == "--reply-codec") o.reply_codec = next();
    else if (a == "--reply-ratio") o.reply_ratio = std::stof(next());
    else if (a == "--trust-local-lanes") o.trust_local_lanes = true;
    else if (a == "--reply-part-kib") o.reply_part_kib = std::stoull(next());
    else if (a == "--apply-batch") o.apply_batch = static_cast<std::uint32_t>(std::stoul(next()));
    else if (a == "--commit-part-kib") o.commit_part_kib = std::stoull(next());
    else if (a == "--commit-window") o.commit_window = static_cast<std::uint32_t>(std::stoul(next()));
    else if (a == "--pause-after") o.pause_after = std::stol(next());
    else if (a == "--pause-ms") o.pause_ms = std::stol(next());
    else if (a == "--child-env") o.child_env = true;
    // Elastic jobs (test/ps/chaos.cpp):
    else if (a == "--min-workers") o.pp.min_workers = std::stoll(next());
    else if (a == "--dataset") o.dataset = std::stoull(next());
    else if (a == "--dataset-epochs") o.dataset_epochs = std::stoull(next());
    else if (a == "--lease-samples") o.lease_samples = std::stoull(next());
    else if (a == "--give-back-after-ms") o.give_back_after_ms = std::stol(next());
    else if (a == "--shuffle-seed") o.shuffle_seed = std::stoull(next());
    else if (a == "--event-log") o.event_log = next();
    else if (a == "--process-slot") o.process_slot = std::stoi(next());
    else if (a == "--join-rank") o.join_rank = std::stol(next());
    else if (a == "--join-elements") o.join_elements = std::stoull(next());
    else if (a == "--batch") o.batch = static_cast<std::uint32_t>(std::stoul(next()));
    else if (a == "--max-backup-lag-kib") o.max_backup_lag_kib = std::stoull(next());
    else {
      err = "unknown argument '" + a + "'";
      return false;
    }
    if (!err.empty()) return false;
  }
  return true;
}

template <class T>
void write_file(const std::string& path, const T* data, std::size_t n) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(T)));
}

// A DiLoCo name (--policy diloco, async_diloco, ...) runs its outer
// optimizer (ps::outer_optimizer_of, DiLoCo's values, --outer-delay N).
ps::optimizer_params optimizer_of(const options& o, const ps::policy_params& pp) {
  if (ps::runs_outer_optimizer(o.policy)) return ps::outer_optimizer_of(o.policy, pp).value();
  if (o.optimizer == "delta") return {.mode = ps::optimizer_params::kind::model_delta};
  return {.mode = ps::optimizer_params::kind::sgd, .lr = 0.125};
}

// ---- Elastic jobs: the data ledger, the event log and the chaos test's
// shared slots (test/ps/chaos.cpp; docs/elastic.md §5) ----

// The --shared file, mapped whole: 64 u64 slots (every fault test), or 256
// (test/support/fault_job.hpp): 0-30 commits started per rank, 32-62
// acknowledged per rank, 63 the start barrier; then 64 the data ledger's
// epochs completed and 65 the stop version (written by server 0), 128+k,
// 160+k, 192+k a worker process's incarnation, commits sent and commits
// acknowledged (--process-slot k < 32).
struct shared_file {
  std::uint64_t* slot = nullptr;
  std::size_t slots = 0;
  static constexpr std::size_t epochs_done = 64, stop_version = 65, incarnation = 128, sent = 160, acked = 192;
  [[nodiscard]] bool has(std::size_t i) const noexcept { return slot != nullptr && i < slots; }
  [[nodiscard]] std::uint64_t load(std::size_t i) const { return has(i) ? std::atomic_ref<std::uint64_t>(slot[i]).load() : 0; }
  void store(std::size_t i, std::uint64_t v) const {
    if (has(i)) std::atomic_ref<std::uint64_t>(slot[i]).store(v);
  }
  void add(std::size_t i) const {
    if (has(i)) std::atomic_ref<std::uint64_t>(slot[i]).fetch_add(1);
  }
};

std::string map_shared(const std::string& path, shared_file& f) {
  const int fd = ::open(path.c_str(), O_RDWR);
  if (fd < 0) return "--shared " + path + ": cannot open";
  struct stat st {};
  const std::size_t slots = ::fstat(fd, &st) == 0 && st.st_size >= 256 * 8 ? 256 : 64;
  void* m = ::mmap(nullptr, slots * sizeof(std::uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return "--shared: mmap failed";
  f.slot = static_cast<std::uint64_t*>(m);
  f.slots = slots;
  return {};
}

// A server's side: the ledger's parameters, the event log (every record its
// core is handed, length-prefixed, with the state before and after) and,
// on server 0, the end of the data for the workers (--shared slots 64, 65).
class elastic_server {
 public:
  static void configure(const options& o, ps::server_params& sp) {
    if (o.dataset == 0) return;
    sp.ledger = {.samples = o.dataset, .shuffle_seed = o.shuffle_seed, .lease_samples = o.lease_samples,
                 .give_back_after = static_cast<double>(o.give_back_after_ms) / 1000.0, .epochs = o.dataset_epochs};
  }

  template <class Server>
  std::string start(const options& o, Server& srv) {
    if (!o.shared.empty() && shared_.slot == nullptr) {
      if (auto e = map_shared(o.shared, shared_); !e.empty()) return e;
    }
    epochs_ = o.dataset_epochs;
    if (o.event_log.empty()) return {};
    if (log_.is_open()) {  // a promoted backup: its log goes on (take_over kept the sink)
      srv.record_core_calls([this](const ps::core_event& e) { write(e); });
      return {};
    }
    path_ = o.event_log;
    if (auto e = save_state(srv.core(), path_ + ".initial"); !e.empty()) return e;
    log_.open(path_, std::ios::binary);
    if (!log_) return "--event-log " + path_ + ": cannot write";
    srv.record_core_calls([this](const ps::core_event& e) { write(e); });
    return {};
  }

  // A backup's log (ASHL_REPLICA, or a restarted primary its peer took):
  // the state at each snapshot (the log starts again there), then each
  // record it applied; promoted, the server's calls go on in the same log
  // (server_backup::record_core_calls), so one replay covers the shard's
  // whole run from the backup's first snapshot.
  template <class Backup>
  std::string start_backup(const options& o, Backup& backup) {
    if (!o.shared.empty() && shared_.slot == nullptr) {
      if (auto e = map_shared(o.shared, shared_); !e.empty()) return e;
    }
    if (o.event_log.empty()) return {};
    path_ = o.event_log;
    const auto restart_at = [this](const auto& core) {
      if (log_.is_open()) log_.close();
      (void)save_state(core, path_ + ".initial");
      log_.open(path_, std::ios::binary | std::ios::trunc);
    };
    if (backup.caught_up()) restart_at(backup.core());  // ask_peer caught up already
    backup.record_core_calls(restart_at, [this](const ps::core_event& e) { write(e); });
    return {};
  }

  // After every pass, on the server's thread: once the ledger completed
  // its epochs, the version every worker a later release reaches, after
  // which it leaves (a round policy's workers then all leave at the same
  // round: none waits in a round the others left below min_workers).
  template <class Server>
  void between(const Server& srv) const {
    if (!srv.core().ledger().enabled() || epochs_ == 0 || !shared_.has(shared_file::stop_version)) return;
    const std::uint64_t done = srv.core().ledger().stats().epochs_completed;
    shared_.store(shared_file::epochs_done, done);
    if (done >= epochs_ && shared_.load(shared_file::stop_version) == 0)
      shared_.store(shared_file::stop_version, srv.core().version() + 1);
  }

  template <class Server>
  std::string finish(Server& srv) {
    if (path_.empty()) return {};
    srv.record_core_calls({});
    log_.close();
    if (!log_) return "--event-log " + path_ + ": a write failed";
    return save_state(srv.core(), path_ + ".final");
  }

 private:
  void write(const ps::core_event& e) {
    ps::encode_core_event(e, bytes_);
    const std::uint64_t n = bytes_.size();
    log_.write(reinterpret_cast<const char*>(&n), sizeof n);
    log_.write(reinterpret_cast<const char*>(bytes_.data()), static_cast<std::streamsize>(n));
  }

  template <class Core>
  static std::string save_state(const Core& core, const std::string& file) {
    std::vector<std::byte> b;
    ashl::state_writer w(b);
    core.save(w);
    write_file(file, b.data(), b.size());
    return std::ifstream(file) ? std::string{} : "--event-log: cannot write " + file;
  }

  shared_file shared_;
  std::uint64_t epochs_ = 0;
  std::string path_;
  std::ofstream log_;
  std::vector<std::byte> bytes_;
};

// A worker's side: the positions of its leases (each iteration the next
// ones, up to its batch), the ids it trains written before each commit, its
// process slot's counters, and when to leave.
class data_follower {
 public:
  std::string start(const ps::job& j, const options& o, std::uint64_t incarnation, const shared_file& shared) {
    shared_ = shared;
    slot_ = o.process_slot;
    if (slot_ >= 32) return "--process-slot " + std::to_string(slot_) + ": must be < 32";
    if (slot_ >= 0) shared_.store(shared_file::incarnation + static_cast<std::size_t>(slot_), incarnation);
    if (o.dataset == 0) return {};
    const std::string file =
        o.out + "/trained-r" + std::to_string(j.rank) + "-i" + std::to_string(incarnation) + ".txt";
    fd_ = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_TRUNC, 0644);
    if (fd_ < 0) return "--dataset: cannot write " + file;
    return {};
  }
  ~data_follower() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] bool on() const noexcept { return fd_ >= 0; }

  // One iteration: the next positions of the leases held (waiting at most
  // 50 ms for one when none is), none when there is none (a round policy's
  // round still needs this worker's commit). True: commit now.
  template <class Worker>
  bool iteration(Worker& wk) {
    const std::uint32_t batch = wk.batch();
    std::uint32_t k = 0;
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    while (true) {
      std::uint64_t skip = taken_;
      for (const ashl::ps::ledger_lease& l : wk.leases()) {
        if (skip >= l.size()) {
          skip -= l.size();
          continue;
        }
        for (std::uint64_t p = l.begin + skip; p < l.end && k < batch; ++p, ++k) {
          ids_ += " " + std::to_string(l.epoch) + " " +
                  std::to_string(sample_ids::of(wk.ledger_shuffle_seed(), l.epoch, p, wk.ledger_samples()));
        }
        skip = 0;
        if (k == batch) break;
      }
      if (k > 0 || std::chrono::steady_clock::now() >= end || g_stop) break;
      (void)wk.test();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    taken_ += k;
    count_ += k;
    return wk.iteration_done(std::uint64_t{k});
  }

  // Before a commit: its line, written through (a SIGKILL loses nothing).
  std::string before_commit() {
    ++sequence_;
    if (slot_ >= 0) shared_.add(shared_file::sent + static_cast<std::size_t>(slot_));
    if (fd_ < 0) return {};
    const std::string line = std::to_string(sequence_) + " " + std::to_string(count_) + ids_ + "\n";
    ids_.clear();
    count_ = 0;
    taken_ = 0;
    if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return "--dataset: a write failed";
    return {};
  }
  void acknowledged() const {
    if (slot_ >= 0) shared_.add(shared_file::acked + static_cast<std::size_t>(slot_));
  }

  // Leave before the next cycle: SIGTERM (a worker leaving for good), or
  // server 0 said the data is done and this worker holds that version.
  template <class Worker>
  [[nodiscard]] bool should_leave(const Worker& wk) const {
    if (g_stop) return true;
    const std::uint64_t stop = shared_.load(shared_file::stop_version);
    return stop != 0 && wk.parameters_version() >= stop;
  }

 private:
  shared_file shared_;
  int slot_ = -1, fd_ = -1;
  std::uint64_t sequence_ = 0, taken_ = 0, count_ = 0;
  std::string ids_;
};

// A shard with a backup (ASHL_BACKUP_ADDR; docs/elastic.md §4.5-4.6).
// The backup (ASHL_REPLICA=1) replays its primary's records until it
// promotes itself, then serves as the primary. The primary asks its peer
// first: a primary there (the backup, promoted while this one was down)
// takes it as its backup, and it replays until it promotes in turn.
ashl::result<ps::server<tr::ucx>> replicated_server(const ps::job& j, const options& o, ps::server_params sp,
                                                    const ps::policy_params& pp, tr::ucx t,
                                                    const std::vector<float>& initial, elastic_server& elastic) {
  sp.take_backup = true;
  sp.max_backup_lag_bytes = o.max_backup_lag_kib * 1024;
  std::optional<ps::server_backup<tr::ucx>> backup;
  if (j.replica) {
    auto b = ps::server_backup<tr::ucx>::create(sp, *ps::make_policy(o.policy, pp), std::move(t),
                                                j.server_addresses[j.rank], initial);
    if (!b) return b.error();
    backup.emplace(std::move(*b));
  } else {
    auto a = ps::server_backup<tr::ucx>::ask_peer(sp, *ps::make_policy(o.policy, pp), std::move(t),
                                                  j.backup_addresses[j.rank], initial, std::chrono::seconds(1));
    if (!a) return a.error();
    if (!a->backup) return ps::server<tr::ucx>::create(sp, *ps::make_policy(o.policy, pp), std::move(*a->transport), initial);
    backup.emplace(std::move(*a->backup));
  }
  std::fprintf(stderr, "server %u: the backup of %s\n", j.rank, j.replica ? j.server_addresses[j.rank].c_str() : j.backup_addresses[j.rank].c_str());
  if (auto e = elastic.start_backup(o, *backup); !e.empty()) return ashl::status(ashl::errc::invalid_argument, e);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.max_seconds);
  bool said = false;  // the harness waits for this line (test/support/fault_job.hpp start_backup)
  while (!g_stop && !backup->promoted() && std::chrono::steady_clock::now() < end) {
    backup->run_once(std::chrono::microseconds(1000));
    if (!said && backup->caught_up()) {
      said = true;
      std::fprintf(stderr, "server %u (backup): caught up; backup listening on %s\n", j.rank,
                   backup->transport().listen_address().c_str());
    }
  }
  if (!backup->promoted()) return ashl::status(ashl::errc::unavailable, "stopped as a backup, never promoted");
  return std::move(*backup).take_over();
}

int serve(const ps::job& j, const options& o) {
  const bool replicated = !j.backup_addresses.empty() && !j.backup_addresses[j.rank].empty();
  auto t = tr::ucx::create({.listen = j.replica ? j.backup_addresses[j.rank] : j.server_addresses[j.rank],
                            .token = j.token, .insecure = j.insecure, .verbose = j.verbose});
  if (!t) return fail(t.error().message());
  auto layout = ps::shard_layout::even(o.elements, j.num_servers);
  if (!layout) return fail(layout.error().message());
  ps::policy_params pp = o.pp;
  pp.workers = j.num_workers;
  auto policy = ps::make_policy(o.policy, pp);
  if (!policy) return fail(policy.error().message());
  const auto r = layout->range(j.rank);
  std::vector<float> initial(r.size(), 0.5f);
  auto codec = ps::parse_codec_spec(o.codec, "--codec");  // "topk", "block4:128" (docs/codecs.md "block")
  if (!codec) return fail(codec.error().message());
  auto reply_codec = ps::parse_codec_spec(o.reply_codec, "--reply-codec");
  if (!reply_codec) return fail(reply_codec.error().message());
  ps::server_params sp{.core = {.layout = *layout, .shard = j.rank, .workers = j.num_workers,
                                .max_workers = ps::max_workers_of(j),  // ASHL_MAX_WORKERS (docs/elastic.md)
                                .optimizer = optimizer_of(o, pp),
                                .replies = {.codec = reply_codec->id, .options = reply_codec->options,
                                            .ratio = o.reply_ratio}},
                       .compression = codec->id,
                       .compression_options = codec->options,
                       .compression_ratio = o.codec_ratio,
                       .progress_seconds = j.progress_seconds,
                       .worker_timeout = std::chrono::milliseconds(o.worker_timeout_ms),
                       .no_worker_grace = std::chrono::milliseconds(
                           o.no_worker_grace_ms >= 0 ? o.no_worker_grace_ms
                                                     : static_cast<long>(j.no_worker_grace_seconds * 1000)),
                       .checkpoint_dir = o.checkpoint_dir,
                       .checkpoint_every_seconds = o.checkpoint_every_seconds,
                       .checkpoint_every_commits = o.checkpoint_every_commits,
                       .restore = o.restore,
                       .reply_part_bytes = o.reply_part_kib * 1024,
                       .trust_local_lanes = o.trust_local_lanes,
                       .job = ps::job_id_of(j, o.elements),
                       .policy = o.policy,
                       .apply_batch = o.apply_batch};
  elastic_server::configure(o, sp);
  elastic_server elastic;
  auto srv = replicated ? replicated_server(j, o, sp, pp, std::move(*t), initial, elastic)
                        : ps::server<tr::ucx>::create(sp, std::move(*policy), std::move(*t), initial);
  if (!srv) return fail(srv.error().message());
  if (auto e = elastic.start(o, *srv); !e.empty()) return fail(e);
  const std::uint64_t restored_applied = srv->core().stats().commits_applied;
  if (srv->restored_version() != 0)
    std::fprintf(stderr, "restored version %llu (%llu commits applied) from %s\n",
                 static_cast<unsigned long long>(srv->restored_version()),
                 static_cast<unsigned long long>(restored_applied), o.checkpoint_dir.c_str());
  std::fprintf(stderr, "listening on %s\n", srv->transport().listen_address().c_str());
  // Bounded: the workers leave, or a signal, or --max-seconds.
  std::thread guard([&] {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.max_seconds);
    while (!g_stop && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    g_stop = true;
  });
  srv->run(g_stop, [&] { elastic.between(*srv); });
  // The job ended as configured: every rank left, or nobody was connected
  // for no_worker_grace (a signal or --max-seconds is a failure).
  const bool finished = srv->end() == ps::server_end::all_left || srv->end() == ps::server_end::no_worker;
  g_stop = true;
  guard.join();
  const ps::server_telemetry s = srv->telemetry();
  if (!o.out.empty()) {
    write_file(o.out + "/server" + std::to_string(j.rank) + ".f32", srv->parameters().data(), srv->parameters().size());
    std::ofstream f(o.out + "/server" + std::to_string(j.rank) + ".txt");
    f << "commits " << s.core.commits << "\ncommits_applied " << s.core.commits_applied << "\ncommits_dropped "
      << s.core.commits_dropped << "\nsteps " << s.core.steps
      << "\npulls " << s.core.pulls << "\npulls_served " << s.core.pulls_served << "\npulls_held " << s.core.pulls_held
      << "\nrefused " << s.core.refused_total() << "\nwire_refused " << s.wire_refused_total() << "\nmalformed "
      << s.wire_refused_for(ps::wire_refusal::malformed) << "\noversized " << s.wire_refused_for(ps::wire_refusal::oversized)
      << "\nunbound " << s.wire_refused_for(ps::wire_refusal::unbound) << "\nrank "
      << s.wire_refused_for(ps::wire_refusal::rank) << "\nerrors_sent " << s.errors_sent << "\nauth_refused "
      << s.transport.auth_refused << "\nunauthenticated_dropped " << s.transport.unauthenticated_dropped
      << "\nreceives_refused " << s.transport.receives_refused << "\nsends_failed " << s.transport.sends_failed << "\nplans_sent " << s.plans << "\nmessages_out " << s.messages_out << "\nunsendable " << s.unsendable << "\npeers_failed " << s.peers_failed << "\nevictions " << s.core.evictions << "\nevicted_silent "
      << s.evicted_silent << "\njoins " << s.core.joins << "\nduplicates " << s.core.duplicates << "\ncheckpoints "
      << s.checkpoints << "\ncheckpoint_failures " << s.checkpoint_failures << "\ncheckpoints_deferred "
      << s.checkpoints_deferred << "\ncheckpoint_seconds " << s.checkpoint_seconds << "\ncheckpoint_loop_seconds "
      << s.checkpoint_loop_seconds << "\ncheckpoint_bytes " << s.checkpoint_bytes << "\nrestored_version "
      << srv->restored_version() << "\nrestored_applied " << restored_applied << "\nend "
      << static_cast<unsigned>(srv->end()) << "\nstale " << s.wire_refused_for(ps::wire_refusal::stale)
      << "\njob_refused " << s.wire_refused_for(ps::wire_refusal::job) << "\nincarnation_refused "
      << s.core.refused_for(ps::refusal::incarnation) << "\ncommits_applied_now "
      << s.core.commits_applied - restored_applied << "\nstage "
      << static_cast<unsigned>(srv->core().policy().stage()) << "\ncommits_in_parts " << s.commits_in_parts
      << "\ncommit_parts_dropped " << s.commit_parts_dropped << "\nbatched_applies " << s.batched_applies
      << "\nbatched_commits " << s.batched_commits << "\ncompressed_replies " << s.compressed_replies
      << "\ncompressed_reply_bytes " << s.compressed_reply_bytes << "\nunchecked_in " << s.unchecked_in
      << "\nunchecked_out " << s.unchecked_out << "\nfinished " << finished << "\nterm " << srv->term()
      << "\nfailovers " << s.failovers << "\ntakeover_seconds " << s.takeover_seconds << "\n";
    // Elastic jobs: refused joins by reason, the data ledger.
    f << "element_count_refused " << s.wire_refused_for(ps::wire_refusal::element_count) << "\nrank_taken "
      << s.wire_refused_for(ps::wire_refusal::rank_taken) << "\nmax_workers_refused "
      << s.core.refused_for(ps::refusal::max_workers) << "\nleases_sent " << s.leases << "\nledger_leases_granted "
      << s.ledger.leases_granted << "\nledger_leases_returned " << s.ledger.leases_returned
      << "\nledger_overrun " << s.ledger.overrun << "\nledger_epochs_completed " << s.ledger.epochs_completed
      << "\nledger_expiries " << s.ledger.expiries << "\n";
  }
  std::fprintf(stderr, "%s\n", srv->progress_line().c_str());
  std::fprintf(stderr, "server ended: %s\n", std::string(ps::to_string(srv->end())).c_str());
  if (auto e = elastic.finish(*srv); !e.empty()) return fail(e);
  if (!srv->final_checkpoint()) return fail("the final checkpoint failed: " + srv->final_checkpoint().message());
  return finished ? 0 : fail("stopped before every worker left (signal or --max-seconds)");
}

int train(const ps::job& j, const options& o) {
  auto t = tr::ucx::create({.token = j.token,
                            .insecure = j.insecure,
                            .connect_timeout = std::chrono::milliseconds(static_cast<long>(o.connect_timeout * 1000)),
                            .verbose = j.verbose});
  if (!t) return fail(t.error().message());
  const std::size_t model = o.join_elements != 0 ? o.join_elements : o.elements;  // --join-elements: another size
  std::vector<float> w(model), g(model);
  auto wk = ps::worker<tr::ucx>::create({.rank = o.join_rank >= 0 ? static_cast<std::uint32_t>(o.join_rank) : j.rank,
                                         .servers = j.server_addresses,
                                         .batch = o.batch,
                                         .incarnation = o.incarnation,
                                         .job = ps::job_id_of(j, o.elements),
                                         .timeout = std::chrono::milliseconds(o.timeout_ms),
                                         .reconnect = std::chrono::milliseconds(o.reconnect_ms),
                                         .backups = j.backup_addresses,
                                         .trust_local_lanes = o.trust_local_lanes,
                                         .commit_part_bytes = o.commit_part_kib * 1024,
                                         .commit_window = o.commit_window},
                                        std::move(*t), w);
  if (!wk) return fail(wk.error().message());
  std::fprintf(stderr, "worker %u joined as incarnation %llu\n", j.rank,
               static_cast<unsigned long long>(wk->incarnation()));
  shared_file shared_slots;
  if (!o.shared.empty()) {
    if (auto e = map_shared(o.shared, shared_slots); !e.empty()) return fail(e);
  }
  std::uint64_t* shared = shared_slots.slot;
  data_follower data;  // --dataset, --process-slot (elastic jobs)
  if (auto e = data.start(j, o, wk->incarnation(), shared_slots); !e.empty()) return fail(e);
  const auto started = std::chrono::steady_clock::now();
  if (shared) {  // every worker joined before anyone commits (slot 63 counts the joined)
    std::atomic_ref<std::uint64_t>(shared[63]).fetch_add(1);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::atomic_ref<std::uint64_t>(shared[63]).load() < j.num_workers && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::string cycles;
  long violations = 0, max_gap = 0;
  for (int c = 0; c < o.cycles; ++c) {
    if (data.on()) {  // a worker following the data ledger leaves by itself, bounded by --max-seconds
      if (data.should_leave(*wk)) break;
      if (std::chrono::steady_clock::now() - started > std::chrono::duration<double>(o.max_seconds))
        return fail("--max-seconds " + std::to_string(o.max_seconds) + " passed before the data was done");
    }
    const ashl::worker_plan plan = wk->plan();
    std::uint32_t iters = 0;
    do {
      ++iters;
      if (static_cast<int>(j.rank) == o.slow_rank) std::this_thread::sleep_for(std::chrono::milliseconds(o.slow_ms));
    } while (!(data.on() ? data.iteration(*wk) : wk->iteration_done()));
    cycles += "cycle " + std::to_string(c) + " " + std::to_string(static_cast<unsigned>(plan.stage)) + " " +
              std::to_string(plan.local_iterations) + " " + std::to_string(iters) + " " +
              std::to_string(plan.compression_ratio) + "\n";
    if (std::isnan(o.quadratic)) {
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = grad_value(j.rank, static_cast<std::uint64_t>(c), i);
    } else {
      // A DiLoCo policy takes model deltas: one inner step of lr 0.5, 0.5 (T - w).
      const auto target = [&](std::size_t i) {
        return static_cast<float>(o.quadratic) +
               o.quadratic_spread * static_cast<float>(static_cast<int>(i % 7) - 3);
      };
      if (ps::runs_outer_optimizer(o.policy))
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = 0.5f * (target(i) - w[i]);
      else
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = w[i] - target(i);
    }
    if (o.cycle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.cycle_ms));
    if (shared && o.together >= 0) {
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (std::chrono::steady_clock::now() < end) {
        std::uint64_t mn = ~std::uint64_t{0};
        for (std::uint32_t k = 0; k < j.num_workers; ++k) mn = std::min(mn, std::atomic_ref<std::uint64_t>(shared[k]).load());
        if (static_cast<long>(c) - static_cast<long>(mn) <= o.together) break;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    if (c == o.pause_after && o.pause_ms > 0) {  // silent: the server evicts it past worker_timeout
      std::fprintf(stderr, "worker %u: pausing %ld ms\n", j.rank, o.pause_ms);
      std::this_thread::sleep_for(std::chrono::milliseconds(o.pause_ms));
    }
    if (shared) std::atomic_ref<std::uint64_t>(shared[j.rank]).fetch_add(1);
    if (auto e = data.before_commit(); !e.empty()) return fail(e);
    if (auto s = wk->commit(g); !s) return fail(s.to_string());
    if (auto s = wk->wait(); !s) return fail(s.to_string());
    data.acknowledged();
    if (shared && j.rank < 31) std::atomic_ref<std::uint64_t>(shared[32 + j.rank]).fetch_add(1);  // acknowledged
    if (shared && o.ssp_check) {
      std::uint64_t mn = ~std::uint64_t{0};
      for (std::uint32_t k = 0; k < j.num_workers; ++k) mn = std::min(mn, std::atomic_ref<std::uint64_t>(shared[k]).load());
      const long gap = static_cast<long>(c + 1) - static_cast<long>(mn);
      max_gap = std::max(max_gap, gap);
      if (gap > o.pp.staleness) ++violations;
    }
    if (o.loss_switch_cycle >= 0) (void)wk->report_metric(ashl::metric_id::loss, c < o.loss_switch_cycle ? 1.0 : 0.1);
  }
  const ps::worker_telemetry tel = wk->telemetry();
  if (auto s = wk->leave(); !s) return fail(s.to_string());
  if (!o.out.empty()) {
    std::ofstream f(o.out + "/worker" + std::to_string(j.rank) + ".txt");
    f << cycles << "commits " << tel.commits << "\nplans " << tel.plans << "\nplans_ignored " << tel.plans_ignored << "\nplan_changes " << tel.plan_changes
      << "\nerrors " << tel.errors << "\ncopied_replies " << tel.copied_replies << "\nviolations " << violations
      << "\nmax_gap " << max_gap << "\nreconnects " << tel.reconnects << "\nreply_parts " << tel.reply_parts << "\ncommit_parts " << tel.commit_parts << "\ncompressed_replies " << tel.compressed_replies << "\nunchecked_in " << tel.unchecked_in
      << "\nunchecked_out " << tel.unchecked_out << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  auto j = ps::job_from(argc, argv);
  if (!j) return fail(j.error().message());
  options o;
  std::string err;
  try {
    if (!parse(j->rest, o, err)) return fail(err);
  } catch (const std::exception& e) {
    return fail(std::string("bad number: ") + e.what());
  }
  if (o.child_env) {  // what a program this process starts inherits (a data loader, a shell)
    const std::string file = o.out + "/child-env-" + std::string(ps::to_string(j->role)) + std::to_string(j->rank) + ".txt";
    if (std::system(("env > '" + file + "'").c_str()) != 0) return fail("--child-env: env failed");
  }
  return j->role == ps::role::server ? serve(*j, o) : train(*j, o);
}

#endif
