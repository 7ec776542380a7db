// test/support/ps_policy_cases.hpp — what the rules/policies tests share: every
// policy make_policy builds (each ASHL planner × re-planner too), and a
// deterministic event script that exercises them all (commits with samples,
// pulls, per-worker timings that drift once, a loss that falls through
// ASHL's switch and rises once for ADSP's re-search, joins and evictions).
//
//   for (const auto& c : ps_cases::every_policy(4)) {
//     auto p = ashl::ps::make_policy(c.name, c.params);
//     ps_cases::script s(4, 1);
//     for (int i = 0; i < 1000; ++i) policy_testing::apply(*p, s.next(), sink);
//   }
#pragma once

#include <ashl/rules/policies.hpp>

#include "policy_testing.hpp"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace ps_cases {

namespace as = ashl::sync;
namespace ps = ashl::ps;

struct policy_case {
  std::string label;  // name, and planner+replanner for ashl
  std::string name;
  ps::policy_params params;
};

// Parameters that make each policy act within a few thousand events of script.
inline ps::policy_params base_params(std::string_view name, std::int64_t workers) {
  ps::policy_params p;
  p.workers = workers;
  if (name == "semi_async") p.sync_every_iterations = 4;
  if (name == "adsp") {
    p.period = 20.0;
    p.search_every = 400.0;
  }
  if (name == "ashl" || name == "ashl_diloco") {
    p.profile_iterations = 5;
    p.profile_trim = 1;
  }
  return p;
}

// Every name in ps::policies; ashl once per planner × re-planner.
inline std::vector<policy_case> every_policy(std::int64_t workers) {
  std::vector<policy_case> out;
  for (const auto& d : ps::policies) {
    const std::string name(d.name);
    if (name != "ashl") {
      out.push_back({name, name, base_params(name, workers)});
      continue;
    }
    for (auto planner : ps::ashl_planner_names) {
      for (auto replanner : ps::ashl_replanner_names) {
        policy_case c{name + "/" + std::string(planner) + "+" + std::string(replanner), name, base_params(name, workers)};
        c.params.planner = planner;
        c.params.replanner = replanner;
        out.push_back(std::move(c));
      }
    }
  }
  return out;
}

// Events over ids [0, workers + 2): ids >= workers start outside and may
// join. Every commit is followed by its worker's compute, push and pull
// timings: an iteration in about 10·(1 + w % 3) ms (worker 1 three times
// slower from t = 350 s on, in ASHL's SHL phase), a push or pull in
// 5·(1 + w % 2) ms, ±4 % noise. The loss is 2 / (1 + 0.02 t) (below 0.3 from
// t ≈ 283 s), ×1.6 for t in [400, 440). With membership off, no join or
// eviction is generated.
class script {
 public:
  script(std::size_t workers, std::uint32_t seed, bool membership = true)
      : rng_(seed), ids_(workers + 2), seq_(workers + 2, 0), blocked_(workers + 2, 0),
        membership_(membership) {}

  void set_membership(bool on) noexcept { membership_ = on; }
  // A driver that keeps to the policy's holds: a worker whose pull is held
  // sends no commit until the pull is released (as a real worker waits).
  void block(as::worker_id w) { blocked_[w] = 1; }
  void unblock(as::worker_id w) { blocked_[w] = 0; }
  [[nodiscard]] double now() const noexcept { return time_; }

  policy_testing::any_event next() {
    time_ += 0.05 * static_cast<double>(1 + rng_() % 20);
    if (queued_ > 0) return timing(queued_w_, kinds_[3 - queued_--]);
    const auto w = static_cast<as::worker_id>(rng_() % ids_);
    const unsigned r = rng_() % 100;
    if (r < 40 && blocked_[w] != 0) return timing(w, as::measurement_kind::commit);
    if (r < 40) {
      std::uint64_t s = ++seq_[w];
      if (rng_() % 12 == 0 && s > 1) s -= 1 + rng_() % s;  // a duplicate
      // The worker reports its cycle's timings with the commit: the next
      // three events are its compute, push and pull.
      queued_ = 3;
      queued_w_ = w;
      return as::commit_event{.worker = w, .sequence = s, .clock = s, .time = time_, .bytes = 4096,
                              .samples = 16 + (rng_() % 4) * 16};
    }
    if (r < 70) return as::pull_event{.worker = w, .time = time_};
    if (r < 78) return timing(w, as::measurement_kind::commit);
    if (r < 97 || !membership_) {
      const double rise = time_ >= 400.0 && time_ < 440.0 ? 1.6 : 1.0;
      return as::metric_event{.metric = ashl::metric_id::loss, .value = rise * 2.0 / (1.0 + 0.02 * time_),
                              .time = time_};
    }
    if (r < 98) return policy_testing::join_event{{.worker = w, .time = time_}};
    return policy_testing::evict_event{{.worker = w, .time = time_}};
  }

 private:
  as::measurement_event timing(as::worker_id w, as::measurement_kind kind) {
    const double noise = 1.0 + 0.04 * (static_cast<double>(rng_() % 201) / 100.0 - 1.0);
    double s = 0.005 * (1 + w % 2), amount = 4096.0;
    if (kind == as::measurement_kind::compute) {
      s = 0.01 * (1 + w % 3) * (w == 1 && time_ >= drift_time ? 3.0 : 1.0);
      amount = 32.0;
    }
    if (kind == as::measurement_kind::commit) s *= 2.0;
    return as::measurement_event{.worker = w, .kind = kind, .seconds = s * noise, .amount = amount, .time = time_};
  }

  static constexpr double drift_time = 350.0;
  static constexpr as::measurement_kind kinds_[3] = {as::measurement_kind::compute, as::measurement_kind::push,
                                                    as::measurement_kind::pull};
  std::mt19937 rng_;
  std::size_t ids_;
  std::vector<std::uint64_t> seq_;
  std::vector<std::uint8_t> blocked_;
  bool membership_;
  int queued_ = 0;
  as::worker_id queued_w_ = 0;
  double time_ = 0.0;
};

// Everything a policy said over `events` events of script(workers, seed):
// each event's effect, then every id's plan, liveness and held pull.
struct trace_entry {
  policy_testing::effect effect;
  std::vector<as::worker_plan> plans;
  std::vector<std::uint8_t> flags;
  friend bool operator==(const trace_entry&, const trace_entry&) = default;
};

inline std::vector<trace_entry> trace(as::any_policy& p, std::size_t workers, std::uint32_t seed, int events) {
  script s(workers, seed);
  as::outcome_sink out(workers + 2);
  std::vector<trace_entry> t;
  t.reserve(static_cast<std::size_t>(events));
  for (int i = 0; i < events; ++i) {
    trace_entry e{policy_testing::apply(p, s.next(), out), {}, {}};
    for (as::worker_id w = 0; w < workers + 2; ++w) {
      e.plans.push_back(p.plan(w));
      e.flags.push_back(static_cast<std::uint8_t>((p.is_live(w) ? 1 : 0) | (p.is_held(w) ? 2 : 0)));
    }
    t.push_back(std::move(e));
  }
  return t;
}

}  // namespace ps_cases
