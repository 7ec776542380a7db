// ashl/sim/run_result.hpp — what a simulator run returns: per-worker time
// accounting, counts, metric rows and (optionally) the timeline of spans.
//
//   ashl::sim::run_result r = sim.run({.commits_per_worker = 100, .record_trace = true});
//   std::printf("%.3f s, wait %.1f %%\n", r.end_time, 100 * r.wait_fraction());
//   for (const auto& s : r.trace) use(s.worker, to_string(s.what), s.start, s.end);
//
// Plain values (no simulator state), so trace.hpp writes them and a test can
// build one by hand. docs/sim.md "Outputs".
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/plan.hpp>

#include <cstdint>
#include <string>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sim {

// What a worker does during a span of virtual time.
enum class activity : std::uint8_t { compute, compress, send, wait, receive };

constexpr const char* to_string(activity a) noexcept {
  switch (a) {
    case activity::compute: return "compute";
    case activity::compress: return "compress";
    case activity::send: return "send";
    case activity::wait: return "wait";
    case activity::receive: return "receive";
  }
  return "?";
}

struct trace_span {
  std::uint32_t worker = 0;
  activity what = activity::compute;
  double start = 0.0;
  double end = 0.0;
  friend bool operator==(const trace_span&, const trace_span&) = default;
};

// One evaluated global metric (the evaluate hook's answer; the policy sees it
// as a metric_event).
struct metric_sample {
  metric_id metric = metric_id::loss;
  double value = 0.0;
};

// A metric's column name: its to_string, or "metric_<id>" for an
// application's own id.
inline std::string metric_name(metric_id m) {
  if (static_cast<std::uint32_t>(m) < metric_id_count) return std::string(to_string(m));
  return "metric_" + std::to_string(static_cast<std::uint32_t>(m));
}

struct worker_stats {
  double compute_s = 0.0, compress_s = 0.0, send_s = 0.0, wait_s = 0.0, receive_s = 0.0;
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  std::uint64_t commits = 0, iterations = 0, samples = 0;
  // Measurements messages sent to the servers (ps::worker_cycle's rule,
  // run_options.reports; worker_telemetry::measurement_messages).
  std::uint64_t measurement_messages = 0;
  // The most bytes one synchronisation moved for this worker: a commit
  // (every server's part, headers included) and the reply to it. Without
  // streaming a sync is the whole model; with server_setup::streaming one
  // fragment (docs/sim.md "Streaming fragments").
  std::uint64_t peak_sync_bytes = 0;
  bool alive = false;
  [[nodiscard]] double busy_s() const noexcept { return compute_s + compress_s + send_s + wait_s + receive_s; }
};

struct metric_row {
  double time = 0.0;
  std::vector<metric_sample> metrics;
  std::uint64_t commits = 0;
  std::uint64_t bytes_sent = 0;
};

// The data ledger's run (server_setup::ledger, docs/elastic.md §3): each
// worker trains on the leases server 0 sent it, in order, a commit's
// samples at a time; a position is counted when a commit covering it is
// accepted by server 0. Every sample once per epoch: for each epoch e below
// epochs_completed, used[e] is the data set's size and repeated is 0.
struct ledger_result {
  bool enabled = false;
  std::uint64_t leases = 0;            // leases server 0 granted (sent to their workers)
  std::uint64_t resent = 0;            // outstanding leases sent again at a rejoin
  std::uint64_t epochs_completed = 0;  // the ledger's count at the end of the run
  std::vector<std::uint64_t> used;     // per epoch: distinct positions the workers trained
  std::uint64_t repeated = 0;          // positions trained again within their epoch (must stay 0)
  std::uint64_t overrun = 0;           // samples committed past what a worker's leases held
};

struct run_result {
  double end_time = 0.0;
  std::uint64_t events = 0;        // simulator events processed
  std::uint64_t commits = 0;       // commits that arrived whole at the servers
  std::uint64_t applications = 0;  // optimizer steps of server 0 (server_steps[0])
  std::uint64_t refused = 0;       // messages the servers refused (errors they answered), all servers
  // Membership changes (cluster_spec changes, docs/elastic.md §2.5), each
  // counted once per worker (not per server): joins the servers admitted,
  // joins they refused (an id at or past cluster_spec::max_workers, refused
  // by every core with refusal::max_workers, also counted in `refused`), and
  // leaves sent.
  std::uint64_t joins = 0, refused_joins = 0, leaves = 0;
  std::vector<std::uint64_t> server_steps;  // optimizer steps per server
  bool stopped_by_hook = false;
  std::string error;               // the first refusal by a server (the run stopped there); empty: none
  std::vector<worker_stats> workers;
  std::vector<metric_row> metrics;
  std::vector<trace_span> trace;
  ledger_result ledger;            // enabled only with server_setup::ledger

  [[nodiscard]] double wait_fraction() const noexcept {
    double w = 0.0, b = 0.0;
    for (const auto& s : workers) {
      w += s.wait_s;
      b += s.busy_s();
    }
    return b > 0.0 ? w / b : 0.0;
  }
  [[nodiscard]] double mean_bytes_sent() const noexcept {
    if (workers.empty()) return 0.0;
    double t = 0.0;
    for (const auto& s : workers) t += static_cast<double>(s.bytes_sent);
    return t / static_cast<double>(workers.size());
  }
};

}  // namespace sim
ASHL_NAMESPACE_END
