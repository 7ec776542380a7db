// ashl/profile/iteration_model.hpp — predicted round time of each worker and
// of a BSP round from fitted capabilities. docs/algorithms.md §3 "Iteration-time
// model".
//
//   ashl::profile::round_input w{.cap = cap, .batch = 64, .h = 4,
//                                .push_bytes = 4e6, .pull_bytes = 4e6};
//   double t = ashl::profile::predict_round(w, server, 8);   // 8 talk at once
//   double r = ashl::profile::bsp_round(workers, server, 0.002);
//
// T_i = compute(b_i)·H_i + codec(elements_i) + push(bytes_i) + pull(bytes_i).
// A transfer goes as fast as the slower of the worker's link and its share
// β_server / n of the server's link; both latencies add. n is the number of
// workers talking to the server at once: M for BSP, where all transfer in
// the same phase; fewer for asynchronous policies (the caller's estimate).
#pragma once

#include <ashl/config.hpp>
#include <ashl/profile/capability.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace profile {

struct round_input {
  worker_capability cap;
  double batch = 0.0;
  std::uint32_t h = 1;
  double push_bytes = 0.0;
  double pull_bytes = 0.0;
  double codec_elements = 0.0;  // elements encoded per round; 0: no compression
};

// One transfer over the worker's link and the server link shared by n.
inline double transfer_time(const link_model& worker, const link_model& server, double bytes,
                            std::uint32_t n_concurrent) {
  const double share = server.beta / std::max<std::uint32_t>(1, n_concurrent);
  return worker.alpha + server.alpha + bytes / std::min(worker.beta, share);
}

inline double predict_round(const round_input& w, const link_model& server, std::uint32_t n_concurrent) {
  return w.cap.compute.predict(w.batch) * w.h + w.cap.codec.predict(w.codec_elements) +
         transfer_time(w.cap.push, server, w.push_bytes, n_concurrent) +
         transfer_time(w.cap.pull, server, w.pull_bytes, n_concurrent);
}

// BSP: every worker talks to the server in the same round, so n = M; the
// round ends with the slowest worker, plus the server's aggregation.
inline double bsp_round(const std::vector<round_input>& workers, const link_model& server,
                        double aggregation_seconds) {
  double t = 0.0;
  const auto n = static_cast<std::uint32_t>(workers.size());
  for (const auto& w : workers) t = std::max(t, predict_round(w, server, n));
  return t + aggregation_seconds;
}

}  // namespace profile
ASHL_NAMESPACE_END
