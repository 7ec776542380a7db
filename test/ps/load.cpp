#include <ashl/ps/server.hpp>

#include <cstdio>

// Load: one server and 32 worker processes (test/programs/ps_node.cpp) over
// UCX's TCP transport on loopback, ASP (every commit applied at once), a
// small model, a few thousand commits per worker. Nothing is lost or
// applied twice: the server applied exactly the commits the workers had
// acknowledged (a worker fails on any wait error, so the commits of a worker
// that exited 0 are all acknowledged), no duplicate and no refusal, and the
// parameters are the exact sum of every gradient sent. And the server does
// not grow: its resident memory near the end is within 10 % of what it was
// after warm-up.
//
// Why the 10 % holds: the server's buffers are pools (receive buffers, send
// slots, parameter snapshots on free lists; the exactly-once table one entry
// per worker), sized by the first commits of the 32 connected workers, so a
// steady stream allocates nothing per message. A leak of even 100 bytes per
// commit would add 100 B x ~90k commits = 9 MB to a server of ~12 MB
// (Debug; ~35 MB under ASan): far past 10 %. Each reading is the median of
// several samples of VmRSS, which moves by a few pages as UCX's TCP buffers
// breathe.
//
// docs/perf/ps-load.md has the throughput and the memory figures.

#if !ASHL_HAS_UCX() || !defined(ASHL_TEST_PS_NODE)
int main() {
  std::puts("skipped: ps/load needs the ucx component (UCX and OpenSSL) and ashl_test_ps_node");
  return 77;
}
#else

#include <boost/test/results_collector.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/process.hpp"
#include "../support/node_files.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>

using namespace std::chrono_literals;

namespace {

constexpr std::uint32_t workers = 32;
constexpr int cycles = 3000;  // per worker: 96,000 commits; 15-27 s in Debug and in ASan on a shared 2 vCPU machine
constexpr std::size_t elements = 128;
const std::string token = "ashl-load-test-token";

// ps_node's gradient (test/programs/ps_node.cpp): multiples of 1/8 in
// [-4, 4]. With sgd at lr 1/8 from 0.5 every parameter stays a multiple of
// 1/64 below 2^24/64 in magnitude (96,000 updates of at most 1/2), so f32
// holds every partial sum exactly and the result is the same in any order.
float grad_value(std::uint32_t rank, std::uint64_t step, std::size_t i) {
  const std::uint64_t h = (rank * 2654435761u) ^ (step * 40503u) ^ (i * 2246822519u);
  return static_cast<float>(static_cast<int>((h >> 7) % 65) - 32) / 8.0f;
}

// VmRSS of pid in KiB; nothing once it has exited (a zombie has no VmRSS).
std::optional<long> resident_kib(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return std::nullopt;
}

// The median of up to n samples `gap` apart, taken while pid runs.
std::vector<long> sample_resident(pid_t pid, int n, std::chrono::milliseconds gap) {
  std::vector<long> v;
  for (int i = 0; i < n; ++i) {
    if (i) std::this_thread::sleep_for(gap);
    const auto r = resident_kib(pid);
    if (!r) break;
    v.push_back(*r);
  }
  return v;
}

long median(std::vector<long> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Exit status of pid if it has exited, without reaping it (finish() does).
std::optional<int> exited(pid_t pid) {
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != pid)
    return std::nullopt;
  return info.si_code == CLD_EXITED ? info.si_status : 128 + info.si_status;
}

std::string tail(const std::string& text, std::size_t n = 3000) {
  return text.size() > n ? text.substr(text.size() - n) : text;
}

}  // namespace

BOOST_AUTO_TEST_CASE(thirty_two_workers_lose_nothing_and_the_server_does_not_grow) {
  const std::string node = ASHL_TEST_PS_NODE;
  const std::string dir = process::temp_dir("ashl-load");
  BOOST_TEST_REQUIRE(!dir.empty());
  const auto begin = std::chrono::steady_clock::now();
  const auto deadline = begin + 240s;  // the whole job; past it every process is killed
  auto left = [&] {
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
  };

  // The workers' shared counters (ps_node --shared): slot k counts worker
  // k's commits, counted before each is sent; slot 63 the workers that met.
  const std::string shared = dir + "/counters";
  {
    std::ofstream f(shared, std::ios::binary);
    const std::vector<char> zeros(64 * 8, 0);
    f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  }
  const int fd = ::open(shared.c_str(), O_RDWR);
  BOOST_TEST_REQUIRE(fd >= 0);
  void* map = ::mmap(nullptr, 64 * sizeof(std::uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  BOOST_TEST_REQUIRE(map != MAP_FAILED);
  auto* counts = static_cast<std::uint64_t*>(map);
  auto made = [&] {
    std::uint64_t sum = 0;
    for (std::uint32_t k = 0; k < workers; ++k) sum += std::atomic_ref<std::uint64_t>(counts[k]).load();
    return sum;
  };

  const std::vector<std::string> args = {"--policy", "asp", "--elements", std::to_string(elements), "--cycles",
                                         std::to_string(cycles), "--out", dir, "--max-seconds", "220"};
  auto env = [&](const std::string& role, std::uint32_t rank, const std::string& addr) {
    return std::vector<std::pair<std::string, std::string>>{
        {"ASHL_ROLE", role},   {"ASHL_RANK", std::to_string(rank)}, {"ASHL_NUM_WORKERS", std::to_string(workers)},
        {"ASHL_NUM_SERVERS", "1"}, {"ASHL_SERVER_ADDR", addr},      {"ASHL_TOKEN", token},
        {"UCX_TLS", "tcp,self"},   {"UCX_NET_DEVICES", "lo"}};
  };

  // The server, on a port that was free a moment ago; another port when
  // someone took it first.
  std::string addr;
  pid_t server = -1;
  const std::string server_log = dir + "/server.log";
  for (int attempt = 0; attempt < 5 && server < 0; ++attempt) {
    const int port = process::free_port();
    BOOST_TEST_REQUIRE(port > 0);
    addr = "127.0.0.1:" + std::to_string(port);
    std::vector<std::string> argv = {node};
    argv.insert(argv.end(), args.begin(), args.end());
    const pid_t p = process::start(argv, env("server", 0, addr), server_log);
    BOOST_TEST_REQUIRE(p > 0);
    if (process::wait_for_text(p, server_log, "listening on", 30s)) server = p;
    else (void)process::finish(p, 0ms, server_log);
  }
  BOOST_TEST_REQUIRE(server > 0, "the server did not start:\n" << tail(process::outcome{.log_path = server_log}.log()));

  std::vector<pid_t> pids(workers, -1);
  for (std::uint32_t k = 0; k < workers; ++k) {
    std::vector<std::string> argv = {node};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--shared", shared});
    pids[k] = process::start(argv, env("worker", k, addr), dir + "/worker" + std::to_string(k) + ".log");
    BOOST_TEST_REQUIRE(pids[k] > 0);
  }

  // Memory after warm-up (10 % of the commits made: every worker connected
  // before the first, the pools have met the full load) and near the end
  // (95 %, the server still serving). Progress is watched until then; a
  // worker or the server that exits early ends the watch.
  const std::uint64_t total = std::uint64_t{workers} * cycles;
  std::vector<long> warm, end;
  std::uint64_t warm_made = 0, end_made = 0;
  auto warm_at = begin, end_at = begin;
  std::string stopped;
  auto watch_until = [&](std::uint64_t target) {
    while (made() < target) {
      if (left() == 0ms) {
        stopped = "the deadline passed at " + std::to_string(made()) + " commits";
        return false;
      }
      if (auto rc = exited(server)) {
        stopped = "the server exited (" + std::to_string(*rc) + ") at " + std::to_string(made()) + " commits";
        return false;
      }
      for (std::uint32_t k = 0; k < workers; ++k)
        if (auto rc = exited(pids[k]); rc && *rc != 0) {
          stopped = "worker " + std::to_string(k) + " exited (" + std::to_string(*rc) + ")";
          return false;
        }
      std::this_thread::sleep_for(1ms);
    }
    return true;
  };
  if (watch_until(total / 10)) {
    warm_at = std::chrono::steady_clock::now();
    warm_made = made();
    warm = sample_resident(server, 7, 10ms);
    if (watch_until(total * 95 / 100)) {
      end_at = std::chrono::steady_clock::now();
      end_made = made();
      end = sample_resident(server, 7, 2ms);
    }
  }

  // Every process ends by itself (the server once every worker left),
  // within the deadline.
  std::vector<process::outcome> outs;
  for (std::uint32_t k = 0; k < workers; ++k)
    outs.push_back(process::finish(pids[k], stopped.empty() ? left() : 0ms, dir + "/worker" + std::to_string(k) + ".log"));
  const auto srv = process::finish(server, stopped.empty() ? left() : 5000ms, server_log);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  ::munmap(map, 64 * sizeof(std::uint64_t));

  BOOST_TEST_REQUIRE(stopped.empty(), stopped << " (files in " << dir << ")\nserver:\n" << tail(srv.log()));
  for (std::uint32_t k = 0; k < workers; ++k)
    BOOST_TEST_REQUIRE(outs[k].exit_code == 0, "worker " << k << " (files in " << dir << "):\n" << tail(outs[k].log()));
  BOOST_TEST_REQUIRE(srv.exit_code == 0, "server (files in " << dir << "):\n" << tail(srv.log()));

  // Applied = acknowledged, once each.
  const auto s = node_files::read_counters(dir + "/server0.txt");
  double acknowledged = 0;
  for (std::uint32_t k = 0; k < workers; ++k) {
    const auto w = node_files::read_counters(dir + "/worker" + std::to_string(k) + ".txt");
    BOOST_TEST_REQUIRE(w.count("commits") == 1u, "worker " << k << " wrote no counters");
    BOOST_TEST(w.at("commits") == cycles, "worker " << k);
    BOOST_TEST(w.at("errors") == 0.0, "worker " << k);
    acknowledged += w.at("commits");
  }
  BOOST_TEST_REQUIRE(s.count("commits_applied") == 1u, "the server wrote no counters");
  BOOST_TEST(s.at("commits_applied") == acknowledged);
  BOOST_TEST(s.at("commits") == acknowledged);  // accepted: none buffered or dropped
  BOOST_TEST(s.at("steps") == acknowledged);    // one optimizer step per commit
  BOOST_TEST(s.at("refused") == 0.0);
  BOOST_TEST(s.at("wire_refused") == 0.0);
  BOOST_TEST(s.at("peers_failed") == 0.0);
  BOOST_TEST(s.at("finished") == 1.0);
  BOOST_TEST(s.at("duplicates") == 0.0);  // nothing applied twice (the exactly-once table saw no repeat)
  BOOST_TEST(s.at("evictions") == 0.0);

  // The parameters: 0.5 - 1/8 x every gradient sent, exactly.
  std::vector<float> params(elements);
  {
    std::ifstream f(dir + "/server0.f32", std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    BOOST_TEST_REQUIRE(bytes.size() == elements * sizeof(float));
    std::memcpy(params.data(), bytes.data(), bytes.size());
  }
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < elements; ++i) {
    double sum = 0;
    for (std::uint32_t k = 0; k < workers; ++k)
      for (int c = 0; c < cycles; ++c) sum += grad_value(k, static_cast<std::uint64_t>(c), i);
    const float want = static_cast<float>(0.5 - 0.125 * sum);
    if (params[i] != want) {
      if (++wrong <= 5) BOOST_TEST(params[i] == want, "parameter " << i);
    }
  }
  BOOST_TEST(wrong == 0u);

  // The server did not grow.
  BOOST_TEST_REQUIRE(!warm.empty());
  BOOST_TEST_REQUIRE(!end.empty(), "the server exited before its memory near the end was read");
  const long warm_kib = median(warm), end_kib = median(end);
  const double rate = static_cast<double>(end_made - warm_made) / std::chrono::duration<double>(end_at - warm_at).count();
  BOOST_TEST_MESSAGE("ps/load: " << total << " commits in " << seconds << " s; server " << rate
                                 << " commits/s between " << warm_made << " and " << end_made << "; VmRSS " << warm_kib
                                 << " KiB after warm-up, " << end_kib << " KiB near the end (" << end.size()
                                 << " samples)");
  BOOST_TEST(end_kib <= warm_kib * 1.10, "VmRSS after warm-up " << warm_kib << " KiB, near the end " << end_kib << " KiB");

  // The processes' files stay for a look when anything failed.
  namespace ut = boost::unit_test;
  if (ut::results_collector.results(ut::framework::current_test_case().p_id).passed())
    std::filesystem::remove_all(dir);
  else
    BOOST_TEST_MESSAGE("the processes' files: " << dir);
}

#endif
