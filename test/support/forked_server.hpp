// test/support/forked_server.hpp — one ps::server<ucx> of a multi-process
// test (ps/commit_shards, ps/stuck_receives, ps/worker_drop, ps/limits,
// ps/liveness) in a child forked before the test has any UCX object: it says
// its address, serves until SIGTERM or a bound, and says its counters as
// "key=value" pairs, which stop_and_read() turns back into a map.
//
//   std::string address;
//   ashl_test::child s = ashl_test::start_server(
//       {.token = token, .elements = 1024}, {}, {.stop_when_all_left = false}, address,
//       [](auto& srv, int) {},                                         // after every run_once
//       [](auto& srv) { return "applied=" + std::to_string(srv.telemetry().core.commits_applied); });
//   ... a worker in this process talks to `address` ...
//   auto counters = ashl_test::stop_and_read(s);                      // {"applied": 3}
#pragma once

#include <ashl/ps/server.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/transport/ucx.hpp>

#include "forked.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// The short names every multi-process ps test uses.
namespace ps = ashl::ps;
namespace tr = ashl::transport;
namespace wire = ashl::wire;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

// Set by SIGTERM in a forked child (stop_on_term): its loop ends and it
// reports.
inline std::atomic<bool> ashl_test_term_requested{false};
extern "C" inline void ashl_test_on_term(int) { ashl_test_term_requested = true; }

namespace ashl_test {

inline void stop_on_term() { std::signal(SIGTERM, ashl_test_on_term); }
inline bool term_requested() noexcept { return ashl_test_term_requested; }

// "key=value key=value" → map (a child's counter line; other words are skipped).
inline std::map<std::string, double> parse_counters(const std::string& line) {
  std::map<std::string, double> out;
  std::istringstream in(line);
  std::string kv;
  while (in >> kv)
    if (const auto eq = kv.find('='); eq != std::string::npos) out[kv.substr(0, eq)] = std::stod(kv.substr(eq + 1));
  return out;
}

// SIGTERMs c and reads its counter line: the first line holding a '=' among
// the next `lines` (lines a child said before it, such as "lent", are
// passed over), each waited for at most 30 s; then reaps c.
inline std::map<std::string, double> stop_and_read(child& c, int lines = 1) {
  ::kill(c.pid, SIGTERM);
  std::string line;
  for (int i = 0; i < lines && line.find('=') == std::string::npos; ++i)
    line = c.read_line(std::chrono::seconds(30)).value_or("");
  c.finish(std::chrono::seconds(10));
  return parse_counters(line);
}

// One server of a test: shard `shard` of an even layout of `elements` over
// `shards`, `workers` workers live from the start, the policy by name,
// every parameter `initial`; it serves at most `limit`.
struct server_child {
  std::string token;
  std::uint64_t elements = 1024;
  std::uint32_t shard = 0, shards = 1, workers = 1;
  std::string policy = "asp";
  float initial = 0.25f;
  std::chrono::seconds limit{60};
  std::chrono::seconds address_wait{30};
};

// Forks the server `o` over ucx (transport parameters `tp`, listening on
// 127.0.0.1, o's token; server parameters `sp`, whose core layout, shard
// and workers come from `o`). The child says its address (or "error
// <message>"), calls each(server, fd) after every run_once until SIGTERM or
// o.limit, then says report(server) and exits 0. `address`: its first line
// (empty when none came within o.address_wait).
template <class Each, class Report>
child start_server(const server_child& o, ashl::transport::ucx_params tp, ashl::ps::server_params sp,
                   std::string& address, Each each, Report report) {
  child c = spawn([&](int fd) {
    stop_on_term();
    tp.listen = "127.0.0.1:0";
    tp.token = o.token;
    auto t = ashl::transport::ucx::create(tp);
    if (!t) {
      say(fd, "error " + t.error().message());
      return 2;
    }
    auto layout = ashl::ps::shard_layout::even(o.elements, o.shards);
    ashl::ps::policy_params pp{};
    pp.workers = o.workers;
    auto policy = ashl::ps::make_policy(o.policy, pp);
    if (!layout || !policy) return 2;
    sp.core.layout = *layout;
    sp.core.shard = o.shard;
    sp.core.workers = o.workers;
    std::vector<float> initial(layout->range(o.shard).size(), o.initial);
    auto srv = ashl::ps::server<ashl::transport::ucx>::create(sp, std::move(*policy), std::move(*t), initial);
    if (!srv) {
      say(fd, "error " + srv.error().message());
      return 3;
    }
    say(fd, srv->transport().listen_address());
    const auto until = std::chrono::steady_clock::now() + o.limit;
    while (!term_requested() && std::chrono::steady_clock::now() < until) {
      srv->run_once(std::chrono::milliseconds(10));
      each(*srv, fd);
    }
    say(fd, report(*srv));
    return 0;
  });
  address = c.read_line(o.address_wait).value_or("");
  return c;
}

}  // namespace ashl_test
