// ashl/profile/straggler.hpp — straggler detection over a sliding window of
// per-worker iteration times (EP4DDL-like). ALGORITHMS.md §3 "Straggler
// detection".
//
//   ashl::profile::straggler_detector d{{.workers = 4, .window = 8, .k = 3.0, .consecutive = 2}};
//   (void)d.record(worker, seconds);             // after each iteration
//   for (const auto& r : d.evaluate()) {          // once per window
//     // r.worker is slow: r.time > r.median + k·r.mad, for r.windows windows
//     log(to_string(r, d.parameters().k));
//   }
//
// Each worker's time is the median of its last `window` iterations. A worker
// is over the line when its time exceeds median + k·MAD across the workers;
// it is reported once it has been over for `consecutive` evaluations in a
// row, and again at every evaluation after that while it stays over. The MAD
// is floored at mad_floor·median: with identical workers MAD is 0 and any
// jitter would otherwise flag someone. With one or two workers nobody can be
// flagged (with two, each is exactly one MAD from the median): the test needs
// a majority to compare against, so use at least three.

#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>
#include <ashl/profile/estimators.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <sstream>
#include <string>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace profile {

struct straggler_report {
  std::uint32_t worker = 0;
  double time = 0.0;          // the worker's windowed iteration time
  double median = 0.0;        // across workers
  double mad = 0.0;           // across workers, after the floor
  double threshold = 0.0;     // median + k·mad, the line it crossed
  std::uint32_t windows = 0;  // consecutive evaluations over the line
};

// For telemetry: "worker 3: 3 s > 1.35 s (median 1.05 s + 3 x MAD 0.1 s) for 3 windows".
inline std::string to_string(const straggler_report& r, double k) {
  std::ostringstream os;
  os << "worker " << r.worker << ": " << r.time << " s > " << r.threshold << " s (median " << r.median
     << " s + " << k << " x MAD " << r.mad << " s) for " << r.windows << " windows";
  return os.str();
}

class straggler_detector {
 public:
  struct params {
    std::uint32_t workers = 1;
    std::uint32_t window = 8;
    double k = 3.0;
    std::uint32_t consecutive = 2;
    double mad_floor = 0.01;
  };

  // For parameters from user configuration: errors instead of assertions.
  static result<straggler_detector> create(params p) {
    if (p.workers == 0) return invalid_argument("straggler.workers", p.workers, "must be >= 1");
    if (p.window == 0) return invalid_argument("straggler.window", p.window, "must be >= 1");
    if (p.consecutive == 0) return invalid_argument("straggler.consecutive", p.consecutive, "must be >= 1");
    if (!std::isfinite(p.k) || p.k < 0.0) return invalid_argument("straggler.k", p.k, "must be finite and >= 0");
    if (!std::isfinite(p.mad_floor) || p.mad_floor < 0.0) {
      return invalid_argument("straggler.mad_floor", p.mad_floor, "must be finite and >= 0");
    }
    return straggler_detector(p);
  }

  explicit straggler_detector(params p) : p_(p), times_(p.workers), over_(p.workers, 0) {
    ASHL_ASSERT(p.workers >= 1 && p.window >= 1 && p.consecutive >= 1, "straggler_detector params");
  }

  [[nodiscard]] const params& parameters() const noexcept { return p_; }

  status record(std::uint32_t worker, double seconds) {
    if (worker >= p_.workers) return out_of_range("straggler.worker", worker, "no such worker");
    ASHL_TRY(check_duration("straggler.seconds", seconds));
    auto& q = times_[worker];
    q.push_back(seconds);
    if (q.size() > p_.window) q.pop_front();
    return {};
  }

  // One evaluation ("window"). Workers with no samples yet take no part and
  // keep their count.
  std::vector<straggler_report> evaluate() {
    std::vector<double> t(p_.workers, 0.0);
    std::vector<double> present;
    for (std::uint32_t w = 0; w < p_.workers; ++w) {
      if (times_[w].empty()) continue;
      t[w] = median_of({times_[w].begin(), times_[w].end()});
      present.push_back(t[w]);
    }
    std::vector<straggler_report> out;
    if (present.empty()) return out;
    const double med = median_of(present);
    const double mad = std::max(mad_of(present, med), p_.mad_floor * med);
    const double line = med + p_.k * mad;
    for (std::uint32_t w = 0; w < p_.workers; ++w) {
      if (times_[w].empty()) continue;
      over_[w] = t[w] > line ? over_[w] + 1 : 0;
      if (over_[w] >= p_.consecutive) out.push_back({w, t[w], med, mad, line, over_[w]});
    }
    return out;
  }

 private:
  params p_;
  std::vector<std::deque<double>> times_;
  std::vector<std::uint32_t> over_;
};

}  // namespace profile
ASHL_NAMESPACE_END
