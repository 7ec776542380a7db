// ashl/sim/cluster_spec.hpp — the simulated cluster: workers (compute speed,
// link, jitter), servers (shared links) and scheduled changes, and validate().
// A spec built in code needs nothing but the compiler; loading one from JSON
// is sim/cluster_spec_json.hpp (which needs nlohmann_json).
//
//   ashl::sim::cluster_spec spec;
//   spec.model_bytes = 814120;
//   spec.servers = {{.latency_s = 5e-6, .bandwidth_bytes_per_s = ashl::sim::gbps_to_bytes_per_s(10)}};
//   spec.workers.assign(3, {.seconds_per_iteration = 0.02, .latency_s = 50e-6,
//                           .bandwidth_bytes_per_s = ashl::sim::gbps_to_bytes_per_s(0.65),
//                           .compute_jitter = {ashl::sim::jitter_kind::lognormal, 0.1}});
//   spec.changes = {{.at = 30, .worker = 1, .kind = ashl::sim::change_kind::slowdown, .factor = 2}};
//   if (auto s = ashl::sim::validate(spec); !s.ok()) std::cerr << s.message();
//   // "workers[0].bandwidth_gbps = -1: must be > 0"
//
// A worker's speed is its own seconds per iteration at the reference batch;
// its compute time scales linearly with the batch it is told to use.
// Bandwidths are in bytes per second (the JSON form takes gigabits per
// second), latencies in seconds. compress_seconds is the worker's time to
// compress one dense update, charged after the compute of a commit whose plan
// has a compression ratio below 1. A server with an infinite bandwidth has an
// unlimited link; with a finite one, its link is shared by the transfers that
// use it at the same time (sim/network.hpp). Changes: "slowdown" multiplies a
// worker's compute and transfer times by factor from time "at" on (factor 1
// restores it); "die" stops the worker (the server notices after
// failure_timeout_s and evicts it); "leave" lets the worker finish the cycle
// in progress and then send leave to every server (it is gone at once, no
// timeout); "join" starts a worker that is absent until then. Membership
// (docs/elastic.md §2.5): the workers without a join change are the job's
// initial set, ids 0..M0-1 (initial_workers); the servers' cores start with
// M0 workers and admit joiners up to max_workers (0: workers.size()); a join
// of an id at or past it is refused by the cores (refusal::max_workers) and
// counted (run_result::refused_joins). validate() names the field (in the
// JSON spelling) and the bad value. docs/design.md "Layers / sim";
// docs/sim.md "Cluster spec".
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>
#include <ashl/rules/job_limits.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sim {

enum class jitter_kind : std::uint8_t { none, uniform, lognormal };

// A random multiplier of a duration, mean 1: uniform on [1 − a, 1 + a]
// (0 <= a < 1), or lognormal exp(σZ − σ²/2).
struct jitter_spec {
  jitter_kind kind = jitter_kind::none;
  double param = 0.0;  // a for uniform, σ for lognormal
};

struct worker_spec {
  double seconds_per_iteration = 0.0;  // at the reference batch
  double compress_seconds = 0.0;       // to compress one dense update (charged when the plan's ratio < 1)
  std::uint32_t batch = 64;            // the worker's own batch when the plan names none
  double latency_s = 0.0;
  double bandwidth_bytes_per_s = std::numeric_limits<double>::infinity();
  jitter_spec compute_jitter{};
  jitter_spec comm_jitter{};
  // The worker pushes (ps::worker::push): each server answers its commit with
  // a header-only acknowledgement, when its policy releases the pull, instead
  // of its parameters; hooks.serve and hooks.deliver are not called for it.
  // JSON: "push": true.
  bool push = false;
};

struct server_spec {
  double latency_s = 0.0;
  double bandwidth_bytes_per_s = std::numeric_limits<double>::infinity();  // shared by concurrent transfers
};

// Random stragglers (the straggler scenario of the reference experiment,
// docs/perf/time-to-accuracy.md): each compute cycle of each worker (a
// round, under BSP) runs `factor` times slower with probability
// `probability`, drawn from the worker's own stream of cluster_spec.seed
// (independent of the jitter streams, so adding stragglers moves no jitter
// draw). 0: none.
struct straggler_spec {
  double probability = 0.0;  // [0, 1]
  double factor = 5.0;       // >= 1
};

enum class change_kind : std::uint8_t { slowdown, die, join, leave };

// The JSON spelling of a change kind.
constexpr const char* to_string(change_kind k) noexcept {
  switch (k) {
    case change_kind::slowdown: return "slowdown";
    case change_kind::die: return "die";
    case change_kind::join: return "join";
    case change_kind::leave: return "leave";
  }
  return "?";
}

struct scheduled_change {
  double at = 0.0;
  std::uint32_t worker = 0;
  change_kind kind = change_kind::slowdown;
  double factor = 1.0;  // slowdown only
};

struct cluster_spec {
  double reference_seconds_per_iteration = 0.01;
  std::uint32_t reference_batch = 64;
  double reference_compress_seconds = 0.0;  // the reference worker's time to compress one dense update
  std::uint64_t model_bytes = 0;        // dense parameters, the size of a pull and of an uncompressed commit
  std::uint64_t header_bytes = 72;      // per message (wire header)
  // ps::server_params::reply_part_bytes: a dense reply above it goes as
  // wire::parts_for(...) messages, a header each (0: one message).
  std::uint64_t reply_part_bytes = 0;
  // ps::worker_params::commit_part_bytes: a dense commit's shard above it
  // goes as wire::parts_for(..., wire::max_commit_parts) messages, a header
  // each (0: one message; compressed commits go whole).
  std::uint64_t commit_part_bytes = 0;
  double failure_timeout_s = 0.0;       // from a worker's death to its eviction
  std::uint64_t seed = 1;               // jitter streams
  std::vector<server_spec> servers{server_spec{}};
  std::vector<worker_spec> workers;
  std::vector<scheduled_change> changes;
  straggler_spec stragglers{};
  // The most workers the job admits (ps::server_core_params::max_workers):
  // ids up to it may join; 0: workers.size(). At least initial_workers(),
  // at most ps::max_workers. JSON: "max_workers".
  std::uint32_t max_workers = 0;
};

inline double gbps_to_bytes_per_s(double gbps) { return gbps * 1e9 / 8.0; }

// The job's initial set: the workers without a join change (validate()
// requires them to be ids 0..M0-1, as a real job's initial ranks are).
inline std::uint32_t initial_workers(const cluster_spec& s) {
  std::vector<bool> joins(s.workers.size(), false);
  for (const auto& c : s.changes)
    if (c.kind == change_kind::join && c.worker < joins.size()) joins[c.worker] = true;
  std::uint32_t m0 = 0;
  for (const bool j : joins) m0 += j ? 0u : 1u;
  return m0;
}

// cluster_spec::max_workers with 0 read as workers.size().
inline std::uint64_t max_workers_of(const cluster_spec& s) {
  return s.max_workers != 0 ? s.max_workers : s.workers.size();
}

// Checks every field; the message names the field and its value.
inline status validate(const cluster_spec& s) {
  const auto pos = [](std::string_view f, double v) -> status {
    if (!(v > 0.0) || std::isnan(v)) return invalid_argument(f, v, "must be > 0");
    return {};
  };
  const auto nonneg = [](std::string_view f, double v) -> status {
    if (!(v >= 0.0) || !std::isfinite(v)) return invalid_argument(f, v, "must be finite and >= 0");
    return {};
  };
  const auto jit = [](const std::string& f, const jitter_spec& j) -> status {
    if (j.kind == jitter_kind::uniform && !(j.param >= 0.0 && j.param < 1.0))
      return invalid_argument(f + ".a", j.param, "must be in [0, 1)");
    if (j.kind == jitter_kind::lognormal && !(j.param >= 0.0 && j.param <= 3.0))
      return invalid_argument(f + ".sigma", j.param, "must be in [0, 3]");
    return {};
  };
  ASHL_TRY(pos("reference.seconds_per_iteration", s.reference_seconds_per_iteration));
  if (!std::isfinite(s.reference_seconds_per_iteration))
    return invalid_argument("reference.seconds_per_iteration", s.reference_seconds_per_iteration, "must be finite");
  if (s.reference_batch == 0) return invalid_argument("reference.batch", 0, "must be >= 1");
  ASHL_TRY(nonneg("reference.compress_seconds", s.reference_compress_seconds));
  ASHL_TRY(nonneg("failure_timeout_s", s.failure_timeout_s));
  if (s.reply_part_bytes != 0 && s.reply_part_bytes < 4096)
    return invalid_argument("reply_part_bytes", s.reply_part_bytes, "must be 0 (one message) or >= 4096");
  if (s.commit_part_bytes != 0 && s.commit_part_bytes < 4096)
    return invalid_argument("commit_part_bytes", s.commit_part_bytes, "must be 0 (one message) or >= 4096");
  if (s.servers.empty()) return invalid_argument("servers.size", 0, "must be >= 1");
  if (s.workers.empty()) return invalid_argument("workers.size", 0, "must be >= 1");
  for (std::size_t i = 0; i < s.servers.size(); ++i) {
    const std::string f = "servers[" + std::to_string(i) + "]";
    ASHL_TRY(pos(f + ".bandwidth_gbps", s.servers[i].bandwidth_bytes_per_s * 8e-9));
    ASHL_TRY(nonneg(f + ".latency_us", s.servers[i].latency_s * 1e6));
  }
  for (std::size_t i = 0; i < s.workers.size(); ++i) {
    const auto& w = s.workers[i];
    const std::string f = "workers[" + std::to_string(i) + "]";
    ASHL_TRY(pos(f + ".seconds_per_iteration", w.seconds_per_iteration));
    if (!std::isfinite(w.seconds_per_iteration))
      return invalid_argument(f + ".seconds_per_iteration", w.seconds_per_iteration, "must be finite");
    if (w.batch == 0) return invalid_argument(f + ".batch", 0, "must be >= 1");
    ASHL_TRY(nonneg(f + ".latency_us", w.latency_s * 1e6));
    ASHL_TRY(nonneg(f + ".compress_seconds", w.compress_seconds));
    ASHL_TRY(pos(f + ".bandwidth_gbps", w.bandwidth_bytes_per_s * 8e-9));
    ASHL_TRY(jit(f + ".jitter", w.compute_jitter));
    ASHL_TRY(jit(f + ".comm_jitter", w.comm_jitter));
  }
  for (std::size_t i = 0; i < s.changes.size(); ++i) {
    const auto& c = s.changes[i];
    const std::string f = "changes[" + std::to_string(i) + "]";
    ASHL_TRY(nonneg(f + ".at", c.at));
    if (c.worker >= s.workers.size())
      return out_of_range(f + ".worker", c.worker, "must name a worker (< workers.size)");
    if (c.kind == change_kind::slowdown) {
      ASHL_TRY(pos(f + ".factor", c.factor));
      if (!std::isfinite(c.factor)) return invalid_argument(f + ".factor", c.factor, "must be finite");
    }
  }
  // Membership: the initial set is ids 0..M0-1, the joiners after it.
  const std::uint32_t m0 = initial_workers(s);
  if (m0 == 0)
    return invalid_argument("changes", "every worker joins",
                            "at least one worker (worker 0) must start the job without a join change");
  for (std::size_t i = 0; i < s.changes.size(); ++i) {
    const auto& c = s.changes[i];
    if (c.kind == change_kind::join && c.worker < m0)
      return invalid_argument("changes[" + std::to_string(i) + "].worker", c.worker,
                              "joins, but the initial workers (those without a join change, " +
                                  std::to_string(m0) + " here) must be ids 0.." + std::to_string(m0 - 1) +
                                  " and the joiners after them");
  }
  const std::uint64_t mmax = max_workers_of(s);
  if (mmax > ps::max_workers)
    return out_of_range("max_workers", mmax,
                        "must be at most " + std::to_string(ps::max_workers) + " (ps::max_workers)");
  if (mmax < m0)
    return invalid_argument("max_workers", mmax,
                            "must be at least the initial workers (" + std::to_string(m0) +
                                ": those without a join change)");
  if (!(s.stragglers.probability >= 0.0 && s.stragglers.probability <= 1.0))
    return invalid_argument("stragglers.probability", s.stragglers.probability, "must be in [0, 1]");
  if (!(s.stragglers.factor >= 1.0) || !std::isfinite(s.stragglers.factor))
    return invalid_argument("stragglers.factor", s.stragglers.factor, "must be finite and >= 1");
  return {};
}

}  // namespace sim
ASHL_NAMESPACE_END
