#include <ashl/ps/checkpoint.hpp>

#include <cstdio>

// Server failure and checkpoints as real processes (docs/checkpoints.md): a server
// checkpointing every 30 applied commits is SIGKILLed in the middle of
// training; restarted with --restore on the same address it restores the
// checkpoint, the workers (worker_params::reconnect) rejoin and re-send what
// was in flight, and training resumes, having lost at most one checkpoint
// interval. A corrupt, truncated or wrong-format checkpoint makes the
// restarting server refuse to start, naming the file and the field.
// ashl_test_ps_node over UCX/TCP on 127.0.0.1 (test/support/fault_job.hpp);
// the restart over shared memory too.
//
// What the restart asserts of the counts (A: commits acknowledged to the
// workers over the whole run, all 450; K: of them, acknowledged by the
// first server, read once the workers are reconnecting; R: commits in the
// restored checkpoint; N, D: commits the restarted server applied and the
// duplicates it dropped):
//   N == (A - K) - D   the restarted server applied every commit it
//                      acknowledged once, except D commits the checkpoint
//                      already held (applied by the first server, their
//                      replies lost in the kill, sent again): D <= 3, one
//                      in flight per worker;
//   K - (R - D) <= 2 every + 3   the acknowledged commits the checkpoint
//                      lacks, lost with the first server: the interval
//                      since the last checkpoint serialised, and, when the
//                      kill lands while that one is still being written by
//                      the writer thread (the kill comes near commit 180, a
//                      checkpoint's), the interval before it too; plus the
//                      commits the loop's pass that crossed the interval
//                      applied and acknowledged before serialising (one per
//                      worker: each has one commit in flight). It assumes a
//                      write ends within one interval's commits (3-11 ms
//                      here against ~90 ms for 30 commits). With synchronous
//                      writes runs lost 0 to 30 of every 30;
//   so R + N == A - lost: nothing applied twice, nothing lost beyond it.

#if !ASHL_HAS_UCX() || !defined(ASHL_TEST_PS_NODE)
int main() {
  std::puts("skipped: ps/checkpoint_restart needs the ucx component (UCX and OpenSSL)");
  return 77;
}
#else

#include <ashl/core/bytes.hpp>
#include <ashl/wire/crc32c.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/fault_job.hpp"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

using fault_job::cat;
using fault_job::max_distance;

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {(std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<char>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
}

// A short job that leaves a checkpoint in <dir>/ckpt; returns its file.
std::string make_checkpoint(fault_job::job& j, const std::vector<std::string>& common) {
  const std::string ckpt = j.dir() + "/ckpt";
  std::filesystem::create_directories(ckpt);
  const pid_t srv = j.start_server(cat(common, {"--checkpoint-dir", ckpt}));
  BOOST_TEST_REQUIRE(srv > 0);
  const pid_t w = j.start_worker(0, cat(common, {"--quadratic", "2", "--cycles", "10"}));
  BOOST_TEST_REQUIRE(j.finish(w, 60s, "worker0.log").exit_code == 0);
  BOOST_TEST_REQUIRE(j.finish(srv, 60s, "server.log").exit_code == 0);
  const std::string file = ashl::ps::checkpoint_file(ckpt, 0);
  BOOST_TEST_REQUIRE(std::filesystem::exists(file));
  BOOST_TEST_REQUIRE(ashl::ps::read_checkpoint(file).has_value());
  return file;
}

// Starts a server restoring from `file` after `damage`; it must exit (not
// listen) with a log naming the file and `expected`.
void refused_at_restart(const std::string& name, const std::function<void(std::vector<char>&)>& damage,
                        const std::string& expected) {
  fault_job::job j(1);
  BOOST_TEST_REQUIRE(j.ok());
  const std::vector<std::string> common = {"--policy", "asp", "--elements", "64"};
  const std::string file = make_checkpoint(j, common);
  std::vector<char> b = read_bytes(file);
  damage(b);
  write_bytes(file, b);
  const std::string log = "restart.log";
  const pid_t again = process::start(
      {ASHL_TEST_PS_NODE, "--out", j.dir(), "--policy", "asp", "--elements", "64", "--checkpoint-dir",
       j.dir() + "/ckpt", "--restore"},
      {{"UCX_NET_DEVICES", "lo"}, {"ASHL_ROLE", "server"}, {"ASHL_NUM_WORKERS", "1"},
       {"ASHL_SERVER_ADDR", "127.0.0.1:" + std::to_string(process::free_port())}, {"ASHL_TOKEN", "checkpoint-restart-token"}},
      j.dir() + "/" + log);
  const auto o = j.finish(again, 60s, log);
  BOOST_TEST(o.exit_code == 1, name << ": " << o.log());
  BOOST_TEST(o.log().find(file) != std::string::npos, name << ": " << o.log());
  BOOST_TEST(o.log().find(expected) != std::string::npos, name << ": " << o.log());
  BOOST_TEST(o.log().find("listening on") == std::string::npos, name << ": " << o.log());
}

// parts: 4096 elements whose replies and commits go in 4 parts of 4 KiB
// (server_params.reply_part_bytes, worker_params.commit_part_bytes with two
// in flight; docs/ps.md "Commits in parts"): the kill can cut a reply or a commit between its
// parts; the reconnected worker takes the re-sent reply from its first
// part and sends its commit again from part 0, applied once by its sequence.
void checkpoint_kill_server_restore_resumes(const char* tls, bool parts = false) {
  fault_job::job j(3, "ashl-fault-job", tls);
  BOOST_TEST_REQUIRE(j.ok());
  const std::string ckpt = j.dir() + "/ckpt";
  std::filesystem::create_directories(ckpt);
  const std::uint64_t every = 30;
  const std::vector<std::string> common = {"--policy", "ssp", "--staleness", "2", "--elements", parts ? "4096" : "64"};
  const auto server_args = cat(common, {"--checkpoint-dir", ckpt, "--checkpoint-every-commits", std::to_string(every),
                                        "--reply-part-kib", parts ? "4" : "0"});
  const pid_t srv = j.start_server(server_args, "server-first.log");
  BOOST_TEST_REQUIRE(srv > 0);
  const auto worker_args = cat(common, {"--quadratic", "2", "--cycles", "150", "--cycle-ms", "3", "--timeout-ms",
                                        "30000", "--reconnect-ms", "40000", "--commit-part-kib", parts ? "4" : "0",
                                        "--commit-window", "2"});
  pid_t w[3];
  for (std::uint32_t k = 0; k < 3; ++k) w[k] = j.start_worker(k, worker_args);
  BOOST_TEST_REQUIRE(j.wait_commits(0, 60, 60s));
  j.signal(srv, SIGKILL);
  // Commits begun by now: those the dead server applied, at most one in
  // flight per worker, and at most one more per worker begun after the kill
  // (it fails, and is sent again after the restart).
  const std::uint64_t begun = j.commits_started_total();
  std::this_thread::sleep_for(300ms);  // the workers notice and start reconnecting
  const std::uint64_t acked_first = j.commits_acknowledged_total();  // K: no server answers now
  const pid_t again = j.start_server(cat(server_args, {"--restore"}), "server.log");
  BOOST_TEST_REQUIRE(again > 0);
  for (std::uint32_t k = 0; k < 3; ++k) {
    const auto o = j.finish(w[k], 90s, "worker" + std::to_string(k) + ".log");
    BOOST_TEST(o.exit_code == 0, "worker " << k << ": " << o.log());
    BOOST_TEST(j.worker_counters(k).at("reconnects") >= 1.0, o.log());
    if (parts) BOOST_TEST(j.worker_counters(k).at("reply_parts") >= 4.0 * 150, o.log());
    if (parts) BOOST_TEST(j.worker_counters(k).at("commit_parts") >= 4.0 * 150, o.log());
  }
  const auto so = j.finish(again, 60s, "server.log");
  BOOST_TEST(so.exit_code == 0, so.log());
  const auto s = j.server_counters();
  BOOST_TEST(s.at("restored_version") > 0.0, so.log());
  // At most one checkpoint interval (and the commits in flight) lost.
  BOOST_TEST(s.at("restored_applied") + static_cast<double>(every) + 6.0 >= static_cast<double>(begun),
             "restored " << s.at("restored_applied") << " of " << begun << " begun");
  BOOST_TEST(s.at("refused") == 0.0);
  BOOST_TEST(s.at("checkpoint_failures") == 0.0);
  if (parts) BOOST_TEST(s.at("commits_in_parts") == s.at("commits_applied_now") + s.at("duplicates"), so.log());
  BOOST_TEST(max_distance(j.parameters(), 2.0f) < 1e-3f);
  const double A = static_cast<double>(j.commits_acknowledged_total()), K = static_cast<double>(acked_first);
  const double R = s.at("restored_applied"), N = s.at("commits_applied_now"), D = s.at("duplicates");
  BOOST_TEST(A == 450.0, tls);
  BOOST_TEST(D <= 3.0, tls << ": duplicates " << D);
  BOOST_TEST(N == (A - K) - D, tls << ": the restarted server applied " << N << ", acknowledged " << A - K
                                   << " with " << D << " duplicates");
  BOOST_TEST(K - (R - D) >= 0.0, tls << ": acknowledged by the first server " << K << ", restored " << R);
  BOOST_TEST(K - (R - D) <= 2.0 * static_cast<double>(every) + 3.0,
             tls << ": lost " << K - (R - D) << " acknowledged commits (first server " << K << ", restored " << R << ")");
}

// The DiLoCo outer optimizer's state (velocity, Delayed Nesterov's buffer
// and step count) is in the checkpoint: one worker commits deltas
// 0.5 (2 - w) under async_diloco with N = 3; a server that stops after 7
// commits (8 is not a multiple of 3: the buffer is mid-way) and is restarted
// from its checkpoint for 9 more ends with the parameters of one server
// that took all 16, bit for bit. Losing any of the three would change them.
std::vector<float> diloco_run(const std::vector<int>& cycles) {
  fault_job::job j(1);
  BOOST_TEST_REQUIRE(j.ok());
  const std::string ckpt = j.dir() + "/ckpt";
  std::filesystem::create_directories(ckpt);
  const std::vector<std::string> common = {"--policy", "async_diloco", "--outer-delay", "3", "--elements", "64",
                                           "--codec", "identity"};
  for (std::size_t k = 0; k < cycles.size(); ++k) {
    auto server_args = cat(common, {"--checkpoint-dir", ckpt});
    if (k > 0) server_args.push_back("--restore");
    const std::string slog = "server" + std::to_string(k) + ".log";
    const pid_t srv = j.start_server(server_args, slog);
    BOOST_TEST_REQUIRE(srv > 0);
    const std::string wlog = "worker" + std::to_string(k) + ".log";
    const pid_t w = j.start_worker(0, cat(common, {"--quadratic", "2", "--cycles", std::to_string(cycles[k])}), wlog);
    const auto wo = j.finish(w, 60s, wlog);
    BOOST_TEST_REQUIRE(wo.exit_code == 0, wo.log());
    const auto so = j.finish(srv, 60s, slog);
    BOOST_TEST_REQUIRE(so.exit_code == 0, so.log());
  }
  return j.parameters();
}

}  // namespace

BOOST_AUTO_TEST_CASE(diloco_outer_state_survives_a_server_restart_bit_for_bit) {
  const auto whole = diloco_run({16});
  const auto restarted = diloco_run({7, 9});
  BOOST_TEST_REQUIRE(whole.size() == 64u);
  BOOST_TEST_REQUIRE(restarted.size() == 64u);
  BOOST_TEST(std::memcmp(whole.data(), restarted.data(), 64 * sizeof(float)) == 0,
             "whole " << whole[0] << ", restarted " << restarted[0]);
  BOOST_TEST(std::abs(whole[0] - 2.0f) < std::abs(0.5f - 2.0f));  // it trained towards 2
}

BOOST_AUTO_TEST_CASE(checkpoint_kill_server_restore_resumes_over_tcp) { checkpoint_kill_server_restore_resumes("tcp,self"); }
BOOST_AUTO_TEST_CASE(checkpoint_kill_server_restore_resumes_over_shared_memory) {
  checkpoint_kill_server_restore_resumes("sm,self,tcp", true);
}

BOOST_AUTO_TEST_CASE(checkpoint_corrupt_is_refused) {
  refused_at_restart(
      "corrupt", [](std::vector<char>& b) { b[b.size() / 2] = static_cast<char>(b[b.size() / 2] ^ 0x20); },
      "corrupt state");
}

BOOST_AUTO_TEST_CASE(checkpoint_truncated_is_refused) {
  refused_at_restart("truncated", [](std::vector<char>& b) { b.resize(b.size() * 2 / 3); }, "truncated");
}

BOOST_AUTO_TEST_CASE(checkpoint_wrong_format_is_refused) {
  // Format 99 at offset 8, with the header's CRC-32C (over its first 56
  // bytes, stored at 56) made right again: the format check refuses it.
  refused_at_restart(
      "wrong format",
      [](std::vector<char>& b) {
        ashl::byte_writer w(std::as_writable_bytes(std::span<char>(b.data() + 8, 4)));
        w.put(std::uint32_t{99});
        const std::uint32_t crc = ashl::wire::crc32c(std::as_bytes(std::span<const char>(b.data(), 56)));
        ashl::byte_writer c(std::as_writable_bytes(std::span<char>(b.data() + 56, 4)));
        c.put(crc);
      },
      "checkpoint.format = 99");
}

#endif
