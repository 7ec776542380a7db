// Generator of old_simulator_digests.inc: builds against the tree at commit 8b411ee
// (the simulator before it drove server_core), not against this one:
//   git worktree add /tmp/old 8b411ee && g++ -std=c++20 -O2 -I/tmp/old/include old_simulator_digests.cpp
// It also writes each run's spans to /tmp/digest/old_<scenario>_<policy>.txt for diffing.
// Old simulator trace digests (commit 8b411ee), printed as C++ initializers.
#include <ashl/sim/simulator.hpp>
#include <ashl/sync/ashl_profile.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
namespace sim = ashl::sim;
namespace ss = ashl::sync;

static const char* kSpec[] = {
  // 0: one server, heterogeneous, jitter, compress time, shared server link
  R"({"reference": {"seconds_per_iteration": 0.01, "batch": 64, "compress_seconds": 0.002},
      "model_bytes": 1000000, "header_bytes": 72, "seed": 5,
      "servers": [{"bandwidth_gbps": 4, "latency_us": 5}],
      "workers": [{"compute_multiplier": 1, "bandwidth_gbps": 1, "latency_us": 50,
                   "jitter": {"kind": "lognormal", "sigma": 0.1}, "comm_jitter": {"kind": "uniform", "a": 0.05}},
                  {"compute_multiplier": 1.5, "bandwidth_gbps": 2, "latency_us": 50,
                   "jitter": {"kind": "lognormal", "sigma": 0.1}},
                  {"compute_multiplier": 2, "bandwidth_gbps": 0.5, "latency_us": 100,
                   "jitter": {"kind": "uniform", "a": 0.2}},
                  {"compute_multiplier": 4, "bandwidth_gbps": 1, "latency_us": 20}]})",
  // 1: two servers, no jitter
  R"({"reference": {"seconds_per_iteration": 0.01, "batch": 64},
      "model_bytes": 2000000, "header_bytes": 72, "seed": 1,
      "servers": [{"bandwidth_gbps": 8, "latency_us": 5}, {"bandwidth_gbps": 4, "latency_us": 10}],
      "workers": [{"count": 2, "compute_multiplier": 1, "bandwidth_gbps": 2, "latency_us": 30},
                  {"compute_multiplier": 3, "bandwidth_gbps": 1, "latency_us": 30}]})",
  // 2: changes: slowdown, death, join
  R"({"reference": {"seconds_per_iteration": 0.01, "batch": 64},
      "model_bytes": 500000, "header_bytes": 72, "seed": 2, "failure_timeout_s": 0.05,
      "servers": [{"bandwidth_gbps": 10, "latency_us": 5}],
      "workers": [{"count": 4, "compute_multiplier": 1, "bandwidth_gbps": 1, "latency_us": 50,
                   "jitter": {"kind": "lognormal", "sigma": 0.05}}],
      "changes": [{"at": 0.1, "worker": 0, "kind": "slowdown", "factor": 2},
                  {"at": 0.23, "worker": 1, "kind": "die"},
                  {"at": 0.15, "worker": 3, "kind": "join"}]})",
};

static ss::any_policy make(const std::string& name, std::int64_t m) {
  ss::policy_params pp;
  pp.workers = m;
  std::string base = name;
  if (name == "ssp") pp.staleness = 2;
  if (name == "local_sgd") pp.local_steps = 3;
  if (name == "dssp") { pp.s_min = 1; pp.s_max = 4; pp.window = 3; }
  if (name == "semi_async") pp.sync_every_iterations = 6;
  if (name == "adsp") { pp.period = 0.5; pp.initial_commit_rate = 4; }
  if (name == "ashl" || name == "ashl_profile") {
    base = "ashl";
    pp.profile_iterations = 3; pp.h_ahl = 4; pp.h_shl = 2; pp.compression_ratio = 0.5;
    if (name == "ashl_profile") pp.planner = ss::profile_planner({.h_ahl = 4, .h_shl = 2, .r0 = 0.5, .trim = 0});
  }
  auto p = ss::make_policy(base, pp);
  if (!p) { std::fprintf(stderr, "%s\n", p.error().message().c_str()); std::exit(1); }
  return std::move(*p);
}

int main() {
  const char* names[] = {"bsp", "asp", "ssp", "local_sgd", "dssp", "semi_async", "adsp", "ashl", "ashl_profile"};
  for (int k = 0; k < 3; ++k) {
    auto spec = sim::parse_cluster_spec(kSpec[k]);
    if (!spec) { std::fprintf(stderr, "%s\n", spec.error().message().c_str()); return 1; }
    for (const char* n : names) {
      sim::simulator s(*spec, make(n, static_cast<std::int64_t>(spec->workers.size())));
      sim::run_options o;
      o.record_trace = true;
      if (k == 2) o.until = 0.6; else o.commits_per_worker = 12;
      auto r = s.run(o);
      { std::string fn = std::string("/tmp/digest/old_") + std::to_string(k) + "_" + n + ".txt";
        FILE* f = std::fopen(fn.c_str(), "w");
        for (const auto& t : r.trace) std::fprintf(f, "%u %s %.9f %.9f\n", t.worker, sim::to_string(t.what), t.start, t.end);
        std::fclose(f); }
      std::uint64_t h = 1469598103934665603ull;
      auto mixin = [&](std::uint64_t v) { for (int b = 0; b < 8; ++b) { h ^= (v >> (8 * b)) & 0xff; h *= 1099511628211ull; } };
      auto spans = r.trace;
      std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
        if (a.worker != b.worker) return a.worker < b.worker;
        if (a.start != b.start) return a.start < b.start;
        return a.what < b.what; });
      for (const auto& t : spans) {
        mixin(t.worker); mixin(static_cast<std::uint64_t>(t.what));
        mixin(static_cast<std::uint64_t>(std::llround(t.start * 1e9)));
        mixin(static_cast<std::uint64_t>(std::llround(t.end * 1e9)));
      }
      std::printf("    {%d, \"%s\", %.17g, %llu, %llu, {", k, n, r.end_time, (unsigned long long)r.commits,
                  (unsigned long long)r.applications);
      for (std::size_t w = 0; w < r.workers.size(); ++w) std::printf("%s%llu", w ? ", " : "", (unsigned long long)r.workers[w].commits);
      std::printf("}, %zu, 0x%016llxull},\n", r.trace.size(), (unsigned long long)h);
    }
  }
}
