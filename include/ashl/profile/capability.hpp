// ashl/profile/capability.hpp — per-worker capability models fitted from
// measurements: compute time a + b·batch, link time α + bytes/β, codec
// seconds per element. ALGORITHMS.md §3 "Iteration-time model".
//
//   std::vector<ashl::profile::sample> s{{32, 0.021}, {64, 0.037}, {128, 0.069}};
//   auto c = ashl::profile::fit_compute(s);   // c->predict(96) ≈ 0.053
//
// Fits are ordinary least squares; each sample's duration is validated like
// every other measurement (finite and > 0).
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>
#include <ashl/profile/estimators.hpp>

#include <cmath>
#include <cstddef>
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

}  // namespace profile
ASHL_NAMESPACE_END
