// bench/ucx_connect.cpp — how long transport::ucx takes to connect: from
// connect() until both sides report the peer connected (the HMAC handshake
// and the exchange of worker addresses included), with server and client in
// one process and thread, both in polling mode (docs/perf/ucx-connect.md).
// The same source compiled against an older tree gives the baseline (the
// connect path has no switch to run both in one binary).
//
//   ashl_bench_ucx_connect [--quick] [--reps N] [--json-only]
#include <ashl/transport/ucx.hpp>

#include "support.hpp"

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#if ASHL_HAS_UCX()
namespace t = ashl::transport;

namespace {
struct counter {
  int connected = 0, other = 0;
  std::span<std::byte> receive_buffer(t::peer_id, std::span<const std::byte>, std::size_t) { return {}; }
  void on_message(t::peer_id, std::span<const std::byte>, std::span<const std::byte>) {}
  void on_sent(t::peer_id, std::uint64_t, const ashl::status&) {}
  void on_peer(t::peer_id, t::peer_event e, const ashl::status&) { (e == t::peer_event::connected ? connected : other)++; }
};

struct options {
  int reps = 30;
  bool quick = false, json_only = false;
};
}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    if (!bench::common_option(o, argc, argv, i)) {
      std::fprintf(stderr, "usage: %s [--quick] [--reps N] [--json-only]\n", argv[0]);
      return 2;
    }
  }
  const std::string token = "bench-token-0123456789";
  auto server = t::ucx::create({.listen = "127.0.0.1:0", .token = token, .blocking = false});
  auto client = t::ucx::create({.token = token, .blocking = false});
  if (!server || !client) {
    std::fprintf(stderr, "cannot create the transports\n");
    return 1;
  }
  counter hs, hc;
  std::vector<double> seconds;
  for (int r = 0; r <= o.reps; ++r) {  // the first one is a warm-up
    const int s0 = hs.connected, c0 = hc.connected;
    const auto start = std::chrono::steady_clock::now();
    auto p = client->connect(server->listen_address());
    if (!p) return 1;
    while (hs.connected == s0 || hc.connected == c0) {
      server->progress(hs);
      client->progress(hc);
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(10)) {
        std::fprintf(stderr, "no connection within 10 s\n");
        return 1;
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r > 0) seconds.push_back(s);
    client->close(*p);
    for (int i = 0; i < 200; ++i) {  // let the server see the close before the next connect
      server->progress(hs);
      client->progress(hc);
    }
  }
  const double med = bench::median(seconds);
  if (!o.json_only) {
    std::printf("ucx connect (one process, polling, loopback)\n");
    std::printf("  reps %d  median %.1f us  min %.1f us  max %.1f us\n", o.reps, med * 1e6,
                *std::min_element(seconds.begin(), seconds.end()) * 1e6,
                *std::max_element(seconds.begin(), seconds.end()) * 1e6);
  }
  std::printf("{\"bench\":\"ucx_connect\",\"machine\":\"%s\",\"date\":\"%s\",\"load\":\"%s\",\"reps\":%d,"
              "\"median_us\":%.2f}\n",
              bench::machine().c_str(), bench::today().c_str(), bench::loadavg().c_str(), o.reps, med * 1e6);
  return 0;
}
#else
int main() {
  std::puts("ashl_bench_ucx_connect: needs the ucx component");
  return 0;
}
#endif
