// ashl/sim/trace.hpp — what a simulator run writes: a Chrome trace-event
// timeline (chrome://tracing, Perfetto) and a CSV of metrics over virtual time.
//
//   auto r = sim.run({.metric_interval = 1.0, .record_trace = true});
//   std::ofstream t("run.trace.json");  ashl::sim::write_chrome_trace(t, r);
//   std::ofstream c("run.csv");         ashl::sim::write_metrics_csv(c, r);
//
// Trace: one complete event ("ph": "X") per span, pid 0, tid = worker,
// name = compute | compress | send | wait | receive, times in microseconds of virtual
// time. CSV: time_s, commits, bytes_sent, then one column per metric name in
// the order first seen (empty where a row lacks it; named by metric_name).
// docs/sim.md "Outputs".
#pragma once

#include <ashl/config.hpp>
#include <ashl/sim/run_result.hpp>

#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sim {

inline void write_chrome_trace(std::ostream& os, const run_result& r, const std::string& process_name = "ashl sim") {
  char buf[160];
  os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  os << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"";
  for (char ch : process_name) {
    if (ch == '"' || ch == '\\') os << '\\';
    if (static_cast<unsigned char>(ch) >= 0x20) os << ch;
  }
  os << "\"}}";
  for (std::size_t w = 0; w < r.workers.size(); ++w) {
    std::snprintf(buf, sizeof buf,
                  ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%zu,\"args\":{\"name\":\"worker %zu\"}}", w,
                  w);
    os << buf;
  }
  for (const auto& s : r.trace) {
    std::snprintf(buf, sizeof buf, ",\n{\"name\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f}",
                  to_string(s.what), s.worker, s.start * 1e6, (s.end - s.start) * 1e6);
    os << buf;
  }
  os << "\n]}\n";
}

inline void write_metrics_csv(std::ostream& os, const run_result& r) {
  std::vector<metric_id> names;
  for (const auto& row : r.metrics)
    for (const auto& m : row.metrics) {
      bool seen = false;
      for (const auto n : names) seen = seen || n == m.metric;
      if (!seen) names.push_back(m.metric);
    }
  os << "time_s,commits,bytes_sent";
  for (const auto n : names) os << ',' << metric_name(n);
  os << '\n';
  char buf[64];
  for (const auto& row : r.metrics) {
    std::snprintf(buf, sizeof buf, "%.6f,%llu,%llu", row.time, static_cast<unsigned long long>(row.commits),
                  static_cast<unsigned long long>(row.bytes_sent));
    os << buf;
    for (const auto n : names) {
      os << ',';
      for (const auto& m : row.metrics)
        if (m.metric == n) {
          std::snprintf(buf, sizeof buf, "%.9g", m.value);
          os << buf;
          break;
        }
    }
    os << '\n';
  }
}

}  // namespace sim
ASHL_NAMESPACE_END
