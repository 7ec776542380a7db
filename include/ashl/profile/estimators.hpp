// ashl/profile/estimators.hpp — robust estimators of measured durations:
// trimmed mean (warm-up profiling), EWMA with a half-life (online), median
// and MAD (outlier detection). docs/algorithms.md §2 "Phase 0", §3 "Measurements".
//
//   ashl::profile::trimmed_mean tm{{.trim = 20, .warmup = 10}};
//   if (auto s = tm.add(0.031); !s) return s;   // rejects nan, inf, <= 0
//   ashl::result<double> t = tm.value();        // error until enough samples
//
// Every add() validates its duration, so a bad sample is reported where it
// enters, with its value, instead of silently skewing a plan later.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/profile/measurement.hpp>  // check_duration

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace profile {

// Median of `v` (the mean of the two middle values for an even count).
// Precondition: !v.empty().
inline double median_of(std::vector<double> v) {
  ASHL_ASSERT(!v.empty(), "median_of an empty set");
  const std::size_t n = v.size();
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n / 2), v.end());
  const double hi = v[n / 2];
  if (n % 2 == 1) return hi;
  const double lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n / 2));
  return 0.5 * (lo + hi);
}

// Median absolute deviation from `center` (unscaled). Precondition: !v.empty().
inline double mad_of(const std::vector<double>& v, double center) {
  std::vector<double> d;
  d.reserve(v.size());
  for (double x : v) d.push_back(std::fabs(x - center));
  return median_of(std::move(d));
}

// Mean after skipping the first `warmup` samples and dropping the `trim`
// largest and `trim` smallest of the rest (the original ASHL: trim 20, skip
// the first epoch).
class trimmed_mean {
 public:
  struct params {
    std::size_t trim = 20;
    std::size_t warmup = 0;
  };
  trimmed_mean() = default;
  explicit trimmed_mean(params p) : p_(p) {}

  status add(double seconds) {
    ASHL_TRY(check_duration("profile.sample", seconds));
    if (seen_++ >= p_.warmup) kept_.push_back(seconds);
    return {};
  }
  // Samples kept after the warm-up.
  [[nodiscard]] std::size_t count() const noexcept { return kept_.size(); }

  // Needs more than 2·trim samples after the warm-up.
  [[nodiscard]] result<double> value() const {
    if (kept_.size() <= 2 * p_.trim) {
      return out_of_range("profile.trimmed_mean.count", kept_.size(),
                          "needs more than 2 * trim samples after the warm-up");
    }
    std::vector<double> v = kept_;
    std::sort(v.begin(), v.end());
    double sum = 0.0;
    for (std::size_t i = p_.trim; i < v.size() - p_.trim; ++i) sum += v[i];
    return sum / static_cast<double>(v.size() - 2 * p_.trim);
  }

 private:
  params p_{};
  std::size_t seen_ = 0;
  std::vector<double> kept_;
};

// Exponentially weighted moving average whose weight on a sample halves every
// `half_life` samples: alpha = 1 − 2^(−1/half_life). The first sample sets the
// value, so there is no bias toward zero at the start.
class ewma {
 public:
  explicit ewma(double half_life = 8.0) : alpha_(1.0 - std::exp2(-1.0 / half_life)) {
    ASHL_ASSERT(std::isfinite(half_life) && half_life > 0.0, "ewma half-life must be finite and > 0");
  }
  // For a half-life that comes from user configuration.
  static result<ewma> create(double half_life) {
    if (!std::isfinite(half_life) || half_life <= 0.0) {
      return invalid_argument("ewma.half_life", half_life, "must be finite and > 0");
    }
    return ewma(half_life);
  }

  status add(double seconds) {
    ASHL_TRY(check_duration("profile.sample", seconds));
    value_ = count_ == 0 ? seconds : value_ + alpha_ * (seconds - value_);
    ++count_;
    return {};
  }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] double alpha() const noexcept { return alpha_; }
  [[nodiscard]] result<double> value() const {
    if (count_ == 0) return out_of_range("profile.ewma.count", count_, "needs at least one sample");
    return value_;
  }

 private:
  // The saved fields before the count (core/fields.hpp; the count as u64).
  static constexpr auto saved() { return std::tuple{field{"alpha", &ewma::alpha_}, field{"value", &ewma::value_}}; }

 public:
  // The whole state (alpha too), so a loaded ewma continues exactly.
  void save(state_writer& w) const {
    put_fields(w, *this, saved());
    w.put<std::uint64_t>(count_);
  }
  status load(state_reader& r) {
    ewma n(*this);
    std::uint64_t count = 0;
    ASHL_TRY(get_fields(r, n, "ewma", saved()));
    ASHL_TRY(r.get(count, "ewma.count"));
    if (!(n.alpha_ > 0.0 && n.alpha_ < 1.0))
      return make_error(errc::malformed, "ewma.alpha", n.alpha_, "must be in (0, 1)");
    if (count > 0 && !(std::isfinite(n.value_) && n.value_ > 0.0))
      return make_error(errc::malformed, "ewma.value", n.value_, "must be finite and > 0");
    alpha_ = n.alpha_;
    value_ = count > 0 ? n.value_ : 0.0;
    count_ = static_cast<std::size_t>(count);
    return {};
  }
  friend bool operator==(const ewma&, const ewma&) = default;

 private:
  double alpha_;
  double value_ = 0.0;
  std::size_t count_ = 0;
};

// Median and MAD of all samples added.
class median_mad {
 public:
  status add(double seconds) {
    ASHL_TRY(check_duration("profile.sample", seconds));
    samples_.push_back(seconds);
    return {};
  }
  [[nodiscard]] std::size_t count() const noexcept { return samples_.size(); }
  [[nodiscard]] result<double> median() const {
    if (samples_.empty()) return out_of_range("profile.median_mad.count", 0, "needs at least one sample");
    return median_of(samples_);
  }
  [[nodiscard]] result<double> mad() const {
    if (samples_.empty()) return out_of_range("profile.median_mad.count", 0, "needs at least one sample");
    return mad_of(samples_, median_of(samples_));
  }

 private:
  std::vector<double> samples_;
};

}  // namespace profile
ASHL_NAMESPACE_END
