// ashl/profile/capability.hpp — per-worker capability models fitted from
// measurements: compute time a + b·batch, link time α + bytes/β, codec
// seconds per element. docs/algorithms.md §3 "Iteration-time model".
//
//   std::vector<ashl::profile::sample> s{{32, 0.021}, {64, 0.037}, {128, 0.069}};
//   auto c = ashl::profile::fit_compute(s);   // c->predict(96) ≈ 0.053
//
//   auto cap = ashl::profile::fit_capability(measurements, /*worker=*/3);
//
// Fits are ordinary least squares; each sample's duration is validated like
// every other measurement (finite and > 0).
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>
#include <ashl/profile/estimators.hpp>
#include <ashl/profile/measurement.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace profile {

// One measurement: x is the batch size, the byte count or the element count.
struct sample {
  double x = 0.0;
  double seconds = 0.0;
};

struct linear_fit {
  double intercept = 0.0;
  double slope = 0.0;
};

namespace detail {
inline status check_samples(const char* what, const std::vector<sample>& s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    const std::string base = std::string(what) + "[" + std::to_string(i) + "]";
    if (!std::isfinite(s[i].x) || s[i].x < 0.0) return invalid_argument(base + ".x", s[i].x, "must be finite and >= 0");
    ASHL_TRY(check_duration(base + ".seconds", s[i].seconds));
  }
  return {};
}
}  // namespace detail

// Least-squares line through (x, seconds); needs two distinct x.
inline result<linear_fit> fit_linear(const char* what, const std::vector<sample>& s) {
  ASHL_TRY(detail::check_samples(what, s));
  const double n = static_cast<double>(s.size());
  double mx = 0.0, my = 0.0;
  for (const auto& p : s) {
    mx += p.x;
    my += p.seconds;
  }
  if (s.empty()) return invalid_argument(std::string(what) + ".size", 0, "needs two distinct x");
  mx /= n;
  my /= n;
  double sxx = 0.0, sxy = 0.0;
  for (const auto& p : s) {
    sxx += (p.x - mx) * (p.x - mx);
    sxy += (p.x - mx) * (p.seconds - my);
  }
  if (!(sxx > 0.0)) return invalid_argument(std::string(what) + ".size", s.size(), "needs two distinct x");
  const double slope = sxy / sxx;
  return linear_fit{my - slope * mx, slope};
}

// Compute time of one local iteration: a + b·batch.
struct compute_model {
  double a = 0.0;
  double b = 0.0;
  [[nodiscard]] double predict(double batch) const noexcept { return a + b * batch; }
};

// Link time: α + bytes / β (α seconds, β bytes per second). A link shared by
// n transfers at once gives each β / n.
struct link_model {
  double alpha = 0.0;
  double beta = 0.0;
  [[nodiscard]] double predict(double bytes, double sharing = 1.0) const noexcept {
    return alpha + bytes * sharing / beta;
  }
};

// Codec time: seconds per element, through the origin.
struct codec_model {
  double seconds_per_element = 0.0;
  [[nodiscard]] double predict(double elements) const noexcept { return seconds_per_element * elements; }
};

struct worker_capability {
  compute_model compute;
  link_model push;
  link_model pull;
  codec_model codec;
};

// From (batch, seconds) samples.
inline result<compute_model> fit_compute(const std::vector<sample>& s) {
  auto f = fit_linear("capability.compute", s);
  if (!f) return f.error();
  return compute_model{f->intercept, f->slope};
}

// From (bytes, seconds) samples; the time must grow with the bytes.
inline result<link_model> fit_link(const std::vector<sample>& s) {
  auto f = fit_linear("capability.link", s);
  if (!f) return f.error();
  if (!(f->slope > 0.0)) {
    return invalid_argument("capability.link.slope", f->slope, "time must grow with bytes");
  }
  return link_model{f->intercept, 1.0 / f->slope};
}

// From (elements, seconds) samples: Σ x·t / Σ x².
inline result<codec_model> fit_codec(const std::vector<sample>& s) {
  ASHL_TRY(detail::check_samples("capability.codec", s));
  double sxx = 0.0, sxy = 0.0;
  for (const auto& p : s) {
    sxx += p.x * p.x;
    sxy += p.x * p.seconds;
  }
  if (!(sxx > 0.0)) return invalid_argument("capability.codec.size", s.size(), "needs an x > 0");
  return codec_model{sxy / sxx};
}

// From (bytes, seconds) samples when the latency α is known, e.g. when every
// sample has the same size and α cannot be separated from bytes/β: least
// squares of t − α = bytes / β through the origin, 1/β = Σ x(t − α) / Σ x².
inline result<link_model> fit_link_at_latency(const std::vector<sample>& s, double alpha) {
  ASHL_TRY(detail::check_samples("capability.link", s));
  if (!std::isfinite(alpha) || alpha < 0.0) {
    return invalid_argument("capability.link.alpha", alpha, "must be finite and >= 0");
  }
  double sxx = 0.0, sxy = 0.0;
  for (const auto& p : s) {
    sxx += p.x * p.x;
    sxy += p.x * (p.seconds - alpha);
  }
  if (!(sxx > 0.0)) return invalid_argument("capability.link.size", s.size(), "needs a sample with bytes > 0");
  if (!(sxy > 0.0)) return invalid_argument("capability.link.alpha", alpha, "must be below the measured times");
  return link_model{alpha, sxx / sxy};
}

struct capability_fit_params {
  // Latency of the worker's link in seconds, used when all push (or all
  // pull) samples have one size; unknown by default.
  std::optional<double> link_latency;
};

namespace detail {
inline std::size_t distinct_x(const std::vector<sample>& s) {
  std::vector<double> x;
  for (const auto& p : s) x.push_back(p.x);
  std::sort(x.begin(), x.end());
  return static_cast<std::size_t>(std::unique(x.begin(), x.end()) - x.begin());
}
inline std::string worker_field(std::uint32_t w, const char* what) {
  return "capability.worker[" + std::to_string(w) + "]." + what;
}
inline result<link_model> fit_link_of(const std::vector<sample>& s, std::uint32_t w, const char* what,
                                      const capability_fit_params& p) {
  if (s.empty()) return invalid_argument(worker_field(w, what) + ".size", 0, "no samples");
  if (distinct_x(s) >= 2) return fit_link(s);
  if (!p.link_latency) {
    return invalid_argument(worker_field(w, what) + ".sizes", 1,
                            "samples of one size need a given link_latency");
  }
  return fit_link_at_latency(s, *p.link_latency);
}
}  // namespace detail

// Fits worker `worker`'s capability from a mixed list of measurements (other
// workers' and `round` measurements are ignored):
// - compute from (batch, seconds); with a single batch size the intercept
//   cannot be separated, so compute is taken as proportional to the batch
//   (a = 0, b = mean seconds / batch);
// - push and pull from (bytes, seconds) of several sizes (least squares), or
//   of one size with params.link_latency;
// - codec from (elements or bytes, seconds); no compress samples means no codec time;
// - commit and round measurements are not part of the model.
// Every measurement of the worker is validated first, so an absurd timing is
// an error here rather than a distorted model.
inline result<worker_capability> fit_capability(const std::vector<measurement>& ms, std::uint32_t worker,
                                                const capability_fit_params& params = {}) {
  std::vector<sample> compute, push, pull, codec;
  for (const auto& m : ms) {
    if (m.worker != worker) continue;
    ASHL_TRY(validate(m));
    const sample s{m.amount, m.seconds};
    switch (m.kind) {
      case measurement_kind::compute: compute.push_back(s); break;
      case measurement_kind::push: push.push_back(s); break;
      case measurement_kind::pull: pull.push_back(s); break;
      case measurement_kind::compress: codec.push_back(s); break;
      case measurement_kind::commit:
      case measurement_kind::round: break;
    }
  }
  worker_capability c;
  if (compute.empty()) return invalid_argument(detail::worker_field(worker, "compute") + ".size", 0, "no samples");
  if (detail::distinct_x(compute) >= 2) {
    auto f = fit_compute(compute);
    if (!f) return f.error();
    c.compute = *f;
  } else {
    if (!(compute.front().x > 0.0)) {
      return invalid_argument(detail::worker_field(worker, "compute") + ".batch", compute.front().x, "must be > 0");
    }
    double sum = 0.0;
    for (const auto& s : compute) sum += s.seconds;
    c.compute = {0.0, sum / static_cast<double>(compute.size()) / compute.front().x};
  }
  auto up = detail::fit_link_of(push, worker, "push", params);
  if (!up) return up.error();
  c.push = *up;
  auto down = detail::fit_link_of(pull, worker, "pull", params);
  if (!down) return down.error();
  c.pull = *down;
  if (!codec.empty()) {
    auto f = fit_codec(codec);
    if (!f) return f.error();
    c.codec = *f;
  }
  return c;
}

}  // namespace profile
ASHL_NAMESPACE_END
