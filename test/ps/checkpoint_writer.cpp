#include <ashl/ps/checkpoint.hpp>

// Checkpoints off the event loop (docs/checkpoints.md "The writer thread and the lock"). In process: the
// writer thread of ps::checkpoint_writer does the (here deliberately
// stalled) write while the caller goes on; a second checkpoint while one is
// being written is refused and counted, never queued; write_now waits for
// the write in flight; the shard's lock refuses a second writer, by pid, per
// shard file; files are created 0600. As real processes
// (ashl_test_ps_node over UCX/TCP on 127.0.0.1, test/support/fault_job.hpp):
// a second server on a checkpoint directory in use is refused naming it and
// the holder's pid, and a final checkpoint that cannot be written (the
// directory replaced by a regular file after the start; root ignores
// permission bits, so a read-only directory would not do) makes the server
// exit non-zero naming the file and the error.

#include <boost/test/unit_test.hpp>

#include "../support/checks.hpp"
#include "../support/ps_job.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace ps = ashl::ps;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

struct temp_dir {
  std::string path;
  temp_dir() {
    std::string t = (fs::temp_directory_path() / "ashl-checkpoint-writer-XXXXXX").string();
    path = ::mkdtemp(t.data()) ? t : std::string();
  }
  ~temp_dir() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A write that stalls until released, and says on which thread it ran.
struct stalled_write {
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  int started = 0;
  std::thread::id thread;

  ps::checkpoint_writer::write_function function() {
    return [this](const std::string& f, const ps::checkpoint_meta& m, std::span<const std::byte> state) {
      {
        std::unique_lock g(mu);
        ++started;
        thread = std::this_thread::get_id();
        cv.notify_all();
        const bool ok = cv.wait_for(g, 60s, [&] { return released; });  // bounded: a hung test fails, never hangs
        ASHL_TEST(ok);
      }
      return ps::write_checkpoint(f, m, state);
    };
  }
  bool wait_started(int n) {
    std::unique_lock g(mu);
    return cv.wait_for(g, 60s, [&] { return started >= n; });
  }
  int started_now() {
    std::lock_guard g(mu);
    return started;
  }
  void release() {
    std::lock_guard g(mu);
    released = true;
    cv.notify_all();
  }
};

void fill(std::vector<std::byte>& b, std::size_t n, unsigned char v) {
  b.assign(n, std::byte{v});
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_write_runs_on_the_writer_thread_and_never_queues) {
  temp_dir d;
  BOOST_TEST_REQUIRE(!d.path.empty());
  const std::string file = ps::checkpoint_file(d.path, 0);
  stalled_write stall;
  auto w = ps::checkpoint_writer::open(file, "server 0", stall.function());
  BOOST_TEST_REQUIRE(w.has_value());
  ps::checkpoint_writer& cw = **w;

  fill(cw.buffer(), 1000, 1);
  BOOST_TEST(!cw.busy());
  BOOST_TEST(cw.submit({.shard = 0, .servers = 1, .version = 1}));  // returns while the write is stalled
  BOOST_TEST_REQUIRE(stall.wait_started(1));
  BOOST_TEST((stall.thread != std::this_thread::get_id()));
  BOOST_TEST(cw.busy());
  // The caller goes on: its buffer is free (the other one is being written).
  fill(cw.buffer(), 2000, 2);
  BOOST_TEST(!cw.submit({.shard = 0, .servers = 1, .version = 2}));  // refused, not queued
  BOOST_TEST(cw.stats().deferred == 1u);
  BOOST_TEST(cw.stats().written == 0u);
  BOOST_TEST(!fs::exists(file));

  stall.release();
  cw.wait();
  BOOST_TEST(!cw.busy());
  auto c = ps::read_checkpoint(file);
  BOOST_TEST_REQUIRE(c.has_value());
  BOOST_TEST(c->meta.version == 1u);
  BOOST_TEST(c->state.size() == 1000u);
  // write_now writes the caller's buffer (version 2's bytes, still there) here.
  BOOST_TEST(cw.write_now({.shard = 0, .servers = 1, .version = 2}).ok());
  c = ps::read_checkpoint(file);
  BOOST_TEST_REQUIRE(c.has_value());
  BOOST_TEST(c->meta.version == 2u);
  BOOST_TEST(c->state.size() == 2000u);
  const auto st = cw.stats();
  BOOST_TEST(st.written == 2u);
  BOOST_TEST(st.failed == 0u);
  BOOST_TEST(st.bytes == 2000u);
  BOOST_TEST(st.write_seconds > 0.0);
  BOOST_TEST(cw.last_status().ok());
}

BOOST_AUTO_TEST_CASE(write_now_waits_for_the_write_in_flight) {
  temp_dir d;
  BOOST_TEST_REQUIRE(!d.path.empty());
  const std::string file = ps::checkpoint_file(d.path, 0);
  stalled_write stall;
  auto w = ps::checkpoint_writer::open(file, "server 0", stall.function());
  BOOST_TEST_REQUIRE(w.has_value());
  fill((*w)->buffer(), 10, 1);
  BOOST_TEST((*w)->submit({.shard = 0, .servers = 1, .version = 1}));
  BOOST_TEST_REQUIRE(stall.wait_started(1));
  fill((*w)->buffer(), 20, 2);
  std::thread releaser([&] {
    std::this_thread::sleep_for(50ms);
    stall.release();
  });
  // Returns only after the first write finished and its own did: the file
  // ends as version 2, never overwritten by the older one.
  BOOST_TEST((*w)->write_now({.shard = 0, .servers = 1, .version = 2}).ok());
  releaser.join();
  BOOST_TEST(stall.started_now() == 2);
  auto c = ps::read_checkpoint(file);
  BOOST_TEST_REQUIRE(c.has_value());
  BOOST_TEST(c->meta.version == 2u);
  BOOST_TEST((*w)->stats().written == 2u);
}

BOOST_AUTO_TEST_CASE(a_failed_write_is_counted_and_kept) {
  temp_dir d;
  BOOST_TEST_REQUIRE(!d.path.empty());
  const std::string file = ps::checkpoint_file(d.path, 0);
  auto w = ps::checkpoint_writer::open(file);
  BOOST_TEST_REQUIRE(w.has_value());
  // The directory replaced by a regular file (root ignores permission bits).
  fs::remove_all(d.path);
  { std::FILE* f = std::fopen(d.path.c_str(), "w"); BOOST_TEST_REQUIRE(f != nullptr); std::fclose(f); }
  fill((*w)->buffer(), 10, 1);
  BOOST_TEST((*w)->submit({.shard = 0, .servers = 1, .version = 1}));
  (*w)->wait();
  BOOST_TEST((*w)->stats().failed == 1u);
  BOOST_TEST(!(*w)->last_status().ok());
  const auto s = (*w)->write_now({.shard = 0, .servers = 1, .version = 2});
  BOOST_TEST(!s.ok());
  BOOST_TEST(contains(s.message(), "checkpoint \"" + file + "\""), s.message());
  BOOST_TEST(contains(s.message(), "Not a directory"), s.message());
  BOOST_TEST((*w)->stats().failed == 2u);
  BOOST_TEST((*w)->stats().written == 0u);
  w->reset();
  fs::remove(d.path);
}

BOOST_AUTO_TEST_CASE(one_writer_per_shard_file_and_files_are_private) {
  temp_dir d;
  BOOST_TEST_REQUIRE(!d.path.empty());
  const std::string f0 = ps::checkpoint_file(d.path, 0), f1 = ps::checkpoint_file(d.path, 1);
  auto a = ps::checkpoint_writer::open(f0);
  BOOST_TEST_REQUIRE(a.has_value());
  // flock: a second open file description conflicts, in this process too.
  auto b = ps::checkpoint_writer::open(f0);
  BOOST_TEST_REQUIRE(!b.has_value());
  BOOST_TEST(b.error().message() == "checkpoint_dir \"" + d.path + "\" is locked by another server (pid " +
                                        std::to_string(::getpid()) + ", lock file \"" + f0 +
                                        ".lock\"): one server per shard checkpoint");
  // Another shard of the job in the same directory has a lock of its own.
  auto c = ps::checkpoint_writer::open(f1);
  BOOST_TEST_REQUIRE(c.has_value());
  // Released with the writer.
  a->reset();
  auto again = ps::checkpoint_writer::open(f0);
  BOOST_TEST_REQUIRE(again.has_value());

  fill((*again)->buffer(), 100, 3);
  BOOST_TEST((*again)->write_now({.shard = 0, .servers = 2}).ok());
  struct stat st{};
  BOOST_TEST_REQUIRE(::stat(f0.c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == 0600u);
  BOOST_TEST_REQUIRE(::stat((f0 + ".lock").c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777 & ~0600) == 0u);

  // A directory that is not there: refused at open, naming it.
  auto missing = ps::checkpoint_writer::open(ps::checkpoint_file(d.path + "/absent", 0));
  BOOST_TEST_REQUIRE(!missing.has_value());
  BOOST_TEST(contains(missing.error().message(), "checkpoint_dir \"" + d.path + "/absent\": cannot create the lock file"),
             missing.error().message());
}

// A ps::server (inproc, in this process) whose every commit makes a
// checkpoint due, on a disk that stalls the first write until both workers
// have finished all their cycles: they can finish only if the event loop
// answers them while that write is in progress (a server writing on its
// loop would hold them until the stall's 60 s bound, and fail).
BOOST_AUTO_TEST_CASE(a_server_keeps_answering_while_its_checkpoint_is_written) {
  temp_dir d;
  BOOST_TEST_REQUIRE(!d.path.empty());
  stalled_write stall;
  std::atomic<int> finished{0};
  ps_job::job_spec spec;
  spec.policy = "asp";
  spec.workers = 2;
  spec.cycles = 10;
  spec.configure_server = [&](ps::server_params& sp) {
    sp.checkpoint_dir = d.path;
    sp.checkpoint_every_commits = 1;
    sp.checkpoint_write = stall.function();
  };
  spec.after_wait = [&](std::uint32_t, int c, const std::vector<float>&) {
    // The first commit made a checkpoint due; its write starts on the writer
    // thread, which on a loaded machine may lag the inproc workers: wait
    // (bounded) until it is in progress, so every later cycle runs beside it.
    if (c == 0) ASHL_TEST(stall.wait_started(1));
    if (c + 1 == spec.cycles && ++finished == static_cast<int>(spec.workers)) {
      ASHL_TEST(stall.started_now() == 1);  // the first write is still stalled: every reply came meanwhile
      stall.release();
    }
  };
  const ps_job::job_result r = ps_job::run_job(spec);
  for (const auto& e : r.worker_errors) BOOST_TEST_REQUIRE(e.empty(), e);
  BOOST_TEST(finished.load() == 2);
  const ps::server_telemetry& t = r.servers[0];
  BOOST_TEST(t.core.commits_applied == 20u);
  BOOST_TEST(t.checkpoints_deferred >= 1u);  // due while the first write ran: waited, not queued
  BOOST_TEST(t.checkpoints >= 2u);           // the stalled one and the final one at least
  BOOST_TEST(t.checkpoint_failures == 0u);
  BOOST_TEST(t.checkpoint_loop_seconds <= t.checkpoint_seconds);
  auto c = ps::read_checkpoint(ps::checkpoint_file(d.path, 0));
  BOOST_TEST_REQUIRE(c.has_value());
  BOOST_TEST(c->meta.commits_applied == 20u);  // the final checkpoint: after every commit
}

#if ASHL_HAS_UCX() && defined(ASHL_TEST_PS_NODE)

#include "../support/fault_job.hpp"

BOOST_AUTO_TEST_CASE(a_second_server_on_a_checkpoint_in_use_is_refused) {
  fault_job::job j(1, "ashl-checkpoint-lock");
  BOOST_TEST_REQUIRE(j.ok());
  const std::string ckpt = j.dir() + "/ckpt";
  fs::create_directories(ckpt);
  const std::vector<std::string> common = {"--policy", "asp", "--elements", "64"};
  const pid_t srv = j.start_server(fault_job::cat(common, {"--checkpoint-dir", ckpt, "--checkpoint-every-commits", "2"}));
  BOOST_TEST_REQUIRE(srv > 0);
  // Another server of the same shard and directory (its own port).
  const std::string log = "second.log";
  const pid_t second = process::start(
      fault_job::cat({ASHL_TEST_PS_NODE}, fault_job::cat(common, {"--checkpoint-dir", ckpt})),
      {{"UCX_NET_DEVICES", "lo"}, {"ASHL_ROLE", "server"}, {"ASHL_NUM_WORKERS", "1"},
       {"ASHL_SERVER_ADDR", "127.0.0.1:" + std::to_string(process::free_port())},
       {"ASHL_TOKEN", "checkpoint-lock-test-token"}},
      j.dir() + "/" + log);
  const auto o = j.finish(second, 60s, log);
  BOOST_TEST(o.exit_code == 1, o.log());
  BOOST_TEST(contains(o.log(), "checkpoint_dir \"" + ckpt + "\" is locked by another server (pid " +
                                   std::to_string(srv) + ", lock file \"" + ps::checkpoint_file(ckpt, 0) + ".lock\")"),
             o.log());
  // The first one is undisturbed: a worker trains and leaves, it checkpoints
  // along the way (writer thread) and at the end, into a 0600 file.
  const pid_t w = j.start_worker(0, fault_job::cat(common, {"--quadratic", "2", "--cycles", "10"}));
  BOOST_TEST_REQUIRE(j.finish(w, 60s, "worker0.log").exit_code == 0);
  const auto s = j.finish(srv, 60s, "server.log");
  BOOST_TEST_REQUIRE(s.exit_code == 0, s.log());
  const auto c = j.server_counters();
  BOOST_TEST(c.at("checkpoints") >= 2.0);
  BOOST_TEST(c.at("checkpoint_failures") == 0.0);
  struct stat st{};
  BOOST_TEST_REQUIRE(::stat(ps::checkpoint_file(ckpt, 0).c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == 0600u);
  auto ck = ps::read_checkpoint(ps::checkpoint_file(ckpt, 0));
  BOOST_TEST_REQUIRE(ck.has_value());
  BOOST_TEST(ck->meta.commits_applied == 10u);
}

BOOST_AUTO_TEST_CASE(a_failed_final_checkpoint_is_a_non_zero_exit) {
  fault_job::job j(1, "ashl-checkpoint-final");
  BOOST_TEST_REQUIRE(j.ok());
  const std::string ckpt = j.dir() + "/ckpt";
  fs::create_directories(ckpt);
  const std::vector<std::string> common = {"--policy", "asp", "--elements", "64"};
  const pid_t srv = j.start_server(fault_job::cat(common, {"--checkpoint-dir", ckpt}));
  BOOST_TEST_REQUIRE(srv > 0);
  // After the start: the directory goes, a regular file takes its name.
  fs::rename(ckpt, ckpt + ".gone");
  { std::FILE* f = std::fopen(ckpt.c_str(), "w"); BOOST_TEST_REQUIRE(f != nullptr); std::fclose(f); }
  const pid_t w = j.start_worker(0, fault_job::cat(common, {"--quadratic", "2", "--cycles", "5"}));
  BOOST_TEST_REQUIRE(j.finish(w, 60s, "worker0.log").exit_code == 0);
  const auto s = j.finish(srv, 60s, "server.log");
  BOOST_TEST(s.exit_code == 1, s.log());
  BOOST_TEST(contains(s.log(), "the final checkpoint failed: checkpoint \"" + ps::checkpoint_file(ckpt, 0) + "\""),
             s.log());
  BOOST_TEST(contains(s.log(), "Not a directory"), s.log());
  // The job itself ended as it should; only its last state is not on disk.
  BOOST_TEST(contains(s.log(), "server ended: all_left"), s.log());
}

#endif
