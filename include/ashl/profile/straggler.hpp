// ashl/profile/straggler.hpp — straggler detection against each worker's own
// prediction (EP4DDL-like). docs/algorithms.md §3 "Straggler detection".
//
//   ashl::profile::straggler_detector d{{.workers = 4, .window = 8, .threshold = 0.5, .consecutive = 2}};
//   (void)d.set_model(w, cap.compute);               // the capability model the plan was made from
//   auto r = d.record(w, seconds, batch);            // after each iteration of w
//   if (r && *r) { replan(**r); log(to_string(**r)); }  // w is slower than its own prediction
//
// A worker is judged against its own capability model (profile/capability.hpp:
// compute seconds a + b·batch), never against the other workers: in a cluster
// that is heterogeneous by design, the slow group runs at its predicted speed
// and is never flagged, however slow; a worker whose speed drifts from its
// prediction is. Each sample is kept as the ratio measured / predicted (the
// prediction at that sample's batch, by the model in force when it arrived),
// so a window may span a batch change. Every `window` samples of a worker
// close one of its windows (tumbling, per worker): the worker is over the line
// when the window's median ratio exceeds 1 + threshold (with one batch in the
// window: its median time exceeds prediction × (1 + threshold)). After
// `consecutive` windows over the line in a row it is reported once, and its
// count starts again: a caller that re-plans on each report re-plans at most
// once per window per worker, and a worker that stays over without a new
// model is reported again only after `consecutive` more windows. A worker
// without a model is not judged (its samples are not kept).
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/profile/capability.hpp>
#include <ashl/profile/estimators.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace profile {

struct straggler_report {
  std::uint32_t worker = 0;
  double time = 0.0;          // median measured seconds of the window
  double predicted = 0.0;     // the model's seconds at the window's last batch
  double ratio = 0.0;         // median measured / predicted over the window
  double line = 0.0;          // predicted · (1 + threshold), the line it crossed
  std::uint32_t windows = 0;  // consecutive windows over the line
  friend bool operator==(const straggler_report&, const straggler_report&) = default;
};

// For telemetry: "worker 3: 0.2 s > 0.15 s (predicted 0.1 s + 50 %) for 2 windows".
inline std::string to_string(const straggler_report& r) {
  std::ostringstream os;
  const double pct = r.predicted > 0.0 ? std::round((r.line / r.predicted - 1.0) * 1000.0) / 10.0 : 0.0;
  os << "worker " << r.worker << ": " << r.time << " s > " << r.line << " s (predicted " << r.predicted << " s + "
     << pct << " %) for " << r.windows << " windows";
  return os.str();
}

class straggler_detector {
 public:
  struct params {
    std::uint32_t workers = 1;
    std::uint32_t window = 8;       // samples of one worker per window
    double threshold = 0.5;         // over the line: median ratio > 1 + threshold
    std::uint32_t consecutive = 2;  // windows over the line before a report
    friend bool operator==(const params&, const params&) = default;
    // In this order in a saved state (core/fields.hpp's put_fields).
    static constexpr auto fields() {
      return std::tuple{field{"workers", &params::workers}, field{"window", &params::window},
                        field{"threshold", &params::threshold}, field{"consecutive", &params::consecutive}};
    }
  };

  // For parameters from user configuration: errors instead of assertions.
  static result<straggler_detector> create(params p) {
    ASHL_TRY(check(p, false));
    return straggler_detector(p);
  }

  straggler_detector() : straggler_detector(params{}) {}
  explicit straggler_detector(params p) : p_(p) {
    ASHL_ASSERT(p.workers >= 1 && p.window >= 1 && p.consecutive >= 1, "straggler_detector params");
    grow(p.workers);
  }

  [[nodiscard]] const params& parameters() const noexcept { return p_; }
  [[nodiscard]] std::size_t workers() const noexcept { return model_.size(); }
  [[nodiscard]] bool has_model(std::uint32_t w) const noexcept { return w < has_.size() && has_[w] != 0; }
  [[nodiscard]] const compute_model& model(std::uint32_t w) const { return model_[w]; }
  // Consecutive windows over the line so far (reset by a report).
  [[nodiscard]] std::uint32_t over(std::uint32_t w) const noexcept { return w < over_.size() ? over_[w] : 0; }

  // The prediction for `w` from now on (a new id grows the table: a joiner).
  // The samples of its open window and its count stay: they were judged by
  // the model in force when they arrived.
  status set_model(std::uint32_t w, const compute_model& m) {
    if (!(std::isfinite(m.a) && m.a >= 0.0)) return invalid_argument("straggler.model.a", m.a, "must be finite and >= 0");
    if (!(std::isfinite(m.b) && m.b >= 0.0)) return invalid_argument("straggler.model.b", m.b, "must be finite and >= 0");
    if (!(m.a + m.b > 0.0)) return invalid_argument("straggler.model.b", m.b, "a model that predicts no time (a = b = 0)");
    if (w >= model_.size()) grow(std::size_t{w} + 1);
    model_[w] = m;
    has_[w] = 1;
    return {};
  }

  // One iteration of `w` that took `seconds` at `batch`; a report when it
  // closed a window that makes `consecutive` over the line.
  result<std::optional<straggler_report>> record(std::uint32_t w, double seconds, double batch) {
    if (w >= model_.size()) return out_of_range("straggler.worker", w, "no such worker");
    ASHL_TRY(check_duration("straggler.seconds", seconds));
    if (!(std::isfinite(batch) && batch >= 0.0)) return invalid_argument("straggler.batch", batch, "must be finite and >= 0");
    if (has_[w] == 0) return std::optional<straggler_report>{};
    const double pred = model_[w].predict(batch);
    if (!(pred > 0.0)) return invalid_argument("straggler.predicted", pred, "the model predicts no time");
    auto& q = window_[w];
    q.push_back(seconds / pred);
    times_[w].push_back(seconds);
    if (q.size() < p_.window) return std::optional<straggler_report>{};
    const double ratio = median_of(q);
    const double time = median_of(times_[w]);
    q.clear();  // keeps its capacity: a window allocates only the first time
    times_[w].clear();
    if (!(ratio > 1.0 + p_.threshold)) {
      over_[w] = 0;
      return std::optional<straggler_report>{};
    }
    if (++over_[w] < p_.consecutive) return std::optional<straggler_report>{};
    const straggler_report r{w, time, pred, ratio, pred * (1.0 + p_.threshold), over_[w]};
    over_[w] = 0;
    return std::optional<straggler_report>{r};
  }

  // The whole state: parameters, models, open windows and counts.
  void save(state_writer& out) const {
    out.tag("STRG", 1);
    put_fields(out, p_);
    out.put<std::uint64_t>(model_.size());
    for (std::size_t w = 0; w < model_.size(); ++w) {
      out.put(has_[w]);
      out.put(model_[w].a);
      out.put(model_[w].b);
      out.put(over_[w]);
      out.put_vector(window_[w]);
      out.put_vector(times_[w]);
    }
  }
  static result<straggler_detector> load(state_reader& in) {
    params p;
    ASHL_TRY(in.tag("STRG", 1));
    ASHL_TRY(get_fields(in, p, "straggler"));
    ASHL_TRY(check(p, true));
    std::uint64_t n = 0;
    ASHL_TRY(in.count(n, 1 + 8 + 8 + 4 + 8 + 8, "straggler.ids"));
    if (n < p.workers) return malformed("straggler.ids", n, "fewer than straggler.workers");
    straggler_detector d(p);
    d.grow(static_cast<std::size_t>(n));
    for (std::size_t w = 0; w < n; ++w) {
      ASHL_TRY(in.get(d.has_[w], "straggler.has_model"));
      ASHL_TRY(in.get(d.model_[w].a, "straggler.model.a"));
      ASHL_TRY(in.get(d.model_[w].b, "straggler.model.b"));
      ASHL_TRY(in.get(d.over_[w], "straggler.over"));
      ASHL_TRY(in.get_vector(d.window_[w], "straggler.window"));
      ASHL_TRY(in.get_vector(d.times_[w], "straggler.times"));
      if (d.window_[w].size() >= p.window || d.window_[w].size() != d.times_[w].size())
        return malformed("straggler.window.size", d.window_[w].size(), "must be below the window, one time each");
      if (d.over_[w] >= p.consecutive) return malformed("straggler.over", d.over_[w], "must be below consecutive");
    }
    return d;
  }
  friend bool operator==(const straggler_detector& a, const straggler_detector& b) {
    if (!(a.p_ == b.p_ && a.has_ == b.has_ && a.over_ == b.over_ && a.window_ == b.window_ && a.times_ == b.times_))
      return false;
    for (std::size_t w = 0; w < a.model_.size(); ++w)
      if (a.model_[w].a != b.model_[w].a || a.model_[w].b != b.model_[w].b) return false;
    return true;
  }

 private:
  static status check(const params& p, bool loading) {
    const auto bad = [&](const char* f, double v, const char* why) -> status {
      return loading ? malformed(f, v, why) : invalid_argument(f, v, why);
    };
    if (p.workers == 0) return bad("straggler.workers", p.workers, "must be >= 1");
    if (p.window == 0) return bad("straggler.window", p.window, "must be >= 1");
    if (p.consecutive == 0) return bad("straggler.consecutive", p.consecutive, "must be >= 1");
    if (!(std::isfinite(p.threshold) && p.threshold >= 0.0))
      return bad("straggler.threshold", p.threshold, "must be finite and >= 0");
    return {};
  }
  void grow(std::size_t n) {
    model_.resize(n);
    has_.resize(n, 0);
    over_.resize(n, 0);
    window_.resize(n);
    times_.resize(n);
  }

  params p_;
  std::vector<compute_model> model_;
  std::vector<std::uint8_t> has_;
  std::vector<std::uint32_t> over_;
  std::vector<std::vector<double>> window_;  // ratios of the open window
  std::vector<std::vector<double>> times_;   // seconds of the open window
};

}  // namespace profile
ASHL_NAMESPACE_END
