// ashl_bench_sim — wall time and events per second of the simulator in
// timing-only mode: N workers (default 1,024) × R commits each (default
// 1,000) under SSP(3) built by name (ps::make_policy, driven through
// sync::any_policy and ps::server_core as every run is), against a baseline
// measured in the same run: a bare std::priority_queue push/pop of the same
// number of events (the floor any event-driven simulator pays).
//
//   ashl_bench_sim [--workers N] [--rounds R]
//
// Prints a table and one JSON object per case. docs/perf/sim.md.
#include <ashl/rules/policies.hpp>
#include <ashl/sim/simulator.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <time.h>
#include <queue>
#include <string>
#include <sys/utsname.h>
#include <vector>

namespace {
// CPU time of this process: on a machine shared with other jobs the wall
// time of a single-threaded run includes time it waited for a core.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
struct bare_event {
  double time;
  std::uint64_t order;
  std::uint32_t kind, target;
  std::uint64_t tag;
  bool operator<(const bare_event& o) const { return time > o.time || (time == o.time && order > o.order); }
};
// Keeps as many events pending as the simulator (one per worker and some),
// and pushes one new event per pop, with pseudo-random increments.
double baseline(std::uint64_t events, std::size_t pending, std::uint64_t& checksum) {
  std::priority_queue<bare_event> q;
  std::uint64_t x = 88172645463325252ull, order = 0;
  for (std::size_t i = 0; i < pending; ++i) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    q.push({static_cast<double>(x >> 40) * 1e-9, order++, 0, static_cast<std::uint32_t>(i), 0});
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t n = 0; n < events; ++n) {
    bare_event e = q.top();
    q.pop();
    checksum += e.target;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    q.push({e.time + static_cast<double>(x >> 40) * 1e-9, order++, e.kind, e.target, e.tag});
  }
  return seconds_since(t0);
}
}  // namespace

int main(int argc, char** argv) {
  std::size_t workers = 1024;
  std::uint64_t rounds = 1000;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--workers") && i + 1 < argc) workers = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::strtoull(argv[++i], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: ashl_bench_sim [--workers N] [--rounds R]\n");
      return 2;
    }
  }
  // Four speed groups (1x to 4x the 10 ms reference), lognormal jitter, 1
  // Gbit/s worker links with 50 us latency, one server with a 100 Gbit/s
  // link (5 us) shared by all transfers, a 1 MB model.
  ashl::sim::cluster_spec spec;
  spec.model_bytes = 1'000'000;
  spec.seed = 1;
  spec.servers = {{.latency_s = 5e-6, .bandwidth_bytes_per_s = ashl::sim::gbps_to_bytes_per_s(100)}};
  for (std::size_t w = 0; w < workers; ++w) {
    const std::size_t g = w * 4 / workers;  // contiguous groups, sizes differ by at most one
    spec.workers.push_back({.seconds_per_iteration = 0.01 * static_cast<double>(1 + g),
                            .latency_s = 50e-6,
                            .bandwidth_bytes_per_s = ashl::sim::gbps_to_bytes_per_s(1),
                            .compute_jitter = {ashl::sim::jitter_kind::lognormal, 0.1}});
  }
  ashl::ps::policy_params pp;
  pp.workers = static_cast<std::int64_t>(workers);
  pp.staleness = 3;
  auto policy = ashl::ps::make_policy("ssp", pp);
  if (!policy) {
    std::fprintf(stderr, "%s\n", policy.error().message().c_str());
    return 1;
  }
  auto s = ashl::sim::simulator<>::create(std::move(spec), std::move(*policy));
  if (!s) {
    std::fprintf(stderr, "%s\n", s.error().message().c_str());
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = cpu_seconds();
  auto r = s->run({.commits_per_worker = rounds});
  const double sim_s = seconds_since(t0), sim_cpu_s = cpu_seconds() - c0;
  std::uint64_t checksum = 0;
  const double base_s = baseline(r.events, workers + 8, checksum);

  utsname u{};
  uname(&u);
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const double eps = static_cast<double>(r.events) / sim_s, base_eps = static_cast<double>(r.events) / base_s;
  std::printf("%-28s %12s %10s %14s %10s\n", "case", "events", "wall s", "events/s", "cpu s");
  std::printf("%-28s %12llu %10.3f %14.0f %10.3f\n", "simulator ssp(3) timing", static_cast<unsigned long long>(r.events),
              sim_s, eps, sim_cpu_s);
  std::printf("%-28s %12llu %10.3f %14.0f\n", "baseline priority_queue", static_cast<unsigned long long>(r.events),
              base_s, base_eps);
  std::printf("ratio (simulator / baseline time): %.2f; virtual time %.2f s, commits %llu (%.0f per s), wait fraction %.3f\n",
              sim_s / base_s, r.end_time, static_cast<unsigned long long>(r.commits),
              static_cast<double>(r.commits) / sim_s, r.wait_fraction());
  std::printf(
      "{\"bench\":\"sim\",\"machine\":\"%s %s\",\"date\":\"%s\",\"workers\":%zu,\"rounds\":%llu,\"policy\":\"ssp(3)\","
      "\"events\":%llu,\"commits\":%llu,\"wall_s\":%.4f,\"cpu_s\":%.4f,\"events_per_s\":%.0f,\"baseline\":\"std::priority_queue push+pop\","
      "\"baseline_wall_s\":%.4f,\"baseline_events_per_s\":%.0f,\"ratio\":%.3f,\"virtual_s\":%.4f,\"checksum\":%llu}\n",
      u.nodename, u.machine, date, workers, static_cast<unsigned long long>(rounds),
      static_cast<unsigned long long>(r.events), static_cast<unsigned long long>(r.commits), sim_s, sim_cpu_s, eps, base_s, base_eps, sim_s / base_s, r.end_time,
      static_cast<unsigned long long>(checksum % 1000));
  return 0;
}
