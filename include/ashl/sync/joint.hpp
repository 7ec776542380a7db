// ashl/sync/joint.hpp — a joint (batch, staleness) controller over SSP: each
// worker's batch size and the global staleness bound s are chosen together
// from an iteration-time model, for the lowest predicted time per sample
// (load balancing by multi-task learning).
//
//   ashl::sync::joint p{{.workers = 4, .s_min = 1, .s_max = 4, .min_batch = 16, .max_batch = 128,
//                        .batch_step = 16}};
//   ashl::sync::outcome_sink out(4);
//   p.on_measurement({.worker = 0, .kind = ashl::measurement_kind::compute, .seconds = 0.1, .amount = 16}, out);
//   ...                                          // compute, push and pull of every live worker
//   p.plan(0).batch_size;  p.bound();            // the choice, once every live worker is measured
//
// Model (ours). Worker i's cycle at batch b is T_i(b) = k_i·b + o_i: k_i the
// EWMA of compute seconds per sample (compute measurement seconds / amount;
// amount 0 means the batch of its plan), o_i the EWMAs of its push and pull
// seconds added. With T_max = max_i T_i(b_i), SSP(s) lets worker i run at
// its own rate 1/T_i only until it is s iterations ahead: over a horizon of
// R cycles of the slowest worker it makes at most R + s iterations, so its
// rate is min(1/T_i, (1 + s/R)/T_max) (a fluid bound: the restart after a
// wait is not modelled). Throughput Θ(b, s) = Σ_i b_i·min(1/T_i, (1 + s/R)/T_max)
// samples per second; a larger bound costs statistical efficiency, charged
// as a factor 1 + λ·s. The objective is the predicted seconds per effective
// sample
//
//     J(b, s) = (1 + λ·s) / Θ(b, s),
//
// minimised over s ∈ [s_min, s_max] and each b_i ∈ {min_batch,
// min_batch + step, ..., ≤ max_batch}. choose_joint finds the exact minimum
// without enumerating the grid: for each s and each candidate T_max τ (one
// of the M·G values T_i(b)), each worker independently takes the b with
// T_i(b) ≤ τ that maximises b·min(1/T_i(b), (1 + s/R)/τ); since a smaller
// true T_max only raises every cap, the best (s, τ) is the optimum.
// O((s_max − s_min + 1)·(M·G)·M·G) per choice, G batches in the grid.
//
// The choice is made once every live worker has compute, push and pull
// measurements, and made again when a worker's smoothed k_i or o_i drifts
// more than `drift` from the values of the last choice (as the ASHL+
// re-planner does); workers not measured yet keep min_batch. Commits are
// applied at once (weight 1, ASP-like), pulls held while c_i − min_j c_j > s
// as in sync/ssp.hpp (an ssp held by value; a wider new bound releases what
// it allows). Plans carry b_i in batch_size; the stage is dssp (an SSP whose
// bound moves). docs/algorithms.md §1 "DSSP", §3 "Iteration-time model".
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/events.hpp>
#include <ashl/sync/ssp.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

// T(b) = per_sample·b + overhead.
struct joint_model {
  double per_sample = 0.0;
  double overhead = 0.0;
  [[nodiscard]] double cycle(double batch) const noexcept { return per_sample * batch + overhead; }
  friend bool operator==(const joint_model&, const joint_model&) = default;
};

// The allowed choices and the objective's constants.
struct joint_grid {
  std::uint32_t s_min = 1;
  std::uint32_t s_max = 5;
  std::uint32_t min_batch = 16;
  std::uint32_t max_batch = 128;
  std::uint32_t batch_step = 16;
  double horizon = 10.0;        // R, cycles of the slowest worker
  double staleness_cost = 0.02; // λ
  friend bool operator==(const joint_grid&, const joint_grid&) = default;
};

struct joint_choice {
  std::vector<std::uint32_t> batch;  // by position in the models
  std::uint32_t staleness = 0;
  double seconds_per_sample = 0.0;   // J at the choice
  friend bool operator==(const joint_choice&, const joint_choice&) = default;
};

// J(b, s) of the header comment; +inf when nothing is computed.
inline double joint_objective(std::span<const joint_model> m, std::span<const std::uint32_t> batch, std::uint32_t s,
                              const joint_grid& g) {
  double tmax = 0.0;
  for (std::size_t i = 0; i < m.size(); ++i) tmax = std::max(tmax, m[i].cycle(batch[i]));
  const double cap = (1.0 + static_cast<double>(s) / g.horizon) / tmax;
  double theta = 0.0;
  for (std::size_t i = 0; i < m.size(); ++i)
    theta += static_cast<double>(batch[i]) * std::min(1.0 / m[i].cycle(batch[i]), cap);
  if (!(theta > 0.0)) return std::numeric_limits<double>::infinity();
  return (1.0 + g.staleness_cost * static_cast<double>(s)) / theta;
}

// The minimum of joint_objective over the grid (see the header comment).
// Preconditions: !m.empty(), every cycle > 0, a valid grid.
inline joint_choice choose_joint(std::span<const joint_model> m, const joint_grid& g) {
  ASHL_ASSERT(!m.empty() && g.batch_step >= 1 && g.min_batch >= 1 && g.min_batch <= g.max_batch && g.s_min <= g.s_max &&
                  g.horizon > 0.0,
              "choose_joint: bad grid");
  std::vector<std::uint32_t> sizes;
  for (std::uint64_t b = g.min_batch; b <= g.max_batch; b += g.batch_step) sizes.push_back(static_cast<std::uint32_t>(b));
  std::vector<double> taus;
  for (const auto& w : m)
    for (auto b : sizes) taus.push_back(w.cycle(b));
  std::sort(taus.begin(), taus.end());
  taus.erase(std::unique(taus.begin(), taus.end()), taus.end());
  joint_choice best{std::vector<std::uint32_t>(m.size(), g.min_batch), g.s_min, std::numeric_limits<double>::infinity()};
  std::vector<std::uint32_t> pick(m.size());
  for (std::uint32_t s = g.s_min; s <= g.s_max; ++s) {
    const double c = 1.0 + static_cast<double>(s) / g.horizon;
    for (double tau : taus) {
      double theta = 0.0;
      bool feasible = true;
      for (std::size_t i = 0; i < m.size() && feasible; ++i) {
        double top = -1.0;
        for (auto b : sizes) {
          const double t = m[i].cycle(b);
          if (t > tau) break;  // cycles grow with the batch
          const double v = static_cast<double>(b) * std::min(1.0 / t, c / tau);
          if (v > top) {
            top = v;
            pick[i] = b;
          }
        }
        if (top < 0.0) feasible = false;
        theta += top;
      }
      if (!feasible || !(theta > 0.0)) continue;
      const double j = (1.0 + g.staleness_cost * static_cast<double>(s)) / theta;
      if (j < best.seconds_per_sample) best = {pick, s, j};
    }
  }
  // Report J as the objective states it (at the true T_max of the choice).
  best.seconds_per_sample = joint_objective(m, best.batch, best.staleness, g);
  return best;
}

struct joint_params {
  std::size_t workers = 0;
  std::uint32_t s_min = 1;
  std::uint32_t s_max = 5;
  std::uint32_t min_batch = 16;
  std::uint32_t max_batch = 128;
  std::uint32_t batch_step = 16;
  double horizon = 10.0;         // R of the objective
  double staleness_cost = 0.02;  // λ of the objective
  double drift = 0.2;            // re-choose when a smoothed k_i or o_i is off its basis by more than this
  double half_life = 8.0;        // EWMA half-life, in measurements of one kind of one worker
  friend bool operator==(const joint_params&, const joint_params&) = default;

  [[nodiscard]] joint_grid grid() const noexcept {
    return {s_min, s_max, min_batch, max_batch, batch_step, horizon, staleness_cost};
  }
};

class joint {
 public:
  using policy_concept = policy_tag;

  joint() : joint(joint_params{}) {}
  explicit joint(joint_params p)
      : p_(p), ssp_(ssp_params{.workers = p.workers, .staleness = p.s_min, .stage = stage_id::dssp}) {
    ASHL_ASSERT(p.batch_step >= 1 && p.min_batch >= 1 && p.min_batch <= p.max_batch && p.s_min <= p.s_max &&
                    p.horizon > 0.0 && p.drift > 0.0 && p.half_life > 0.0,
                "joint: bad parameters");
    grow(p.workers);
    live_.reserve(p.workers);
    models_.reserve(p.workers);
  }

  commit_decision on_commit(const commit_event& c, outcome_sink& out) { return ssp_.on_commit(c, out); }
  pull_action on_pull(const pull_event& q, outcome_sink& out) { return ssp_.on_pull(q, out); }
  void on_metric(const metric_event& m, outcome_sink& out) { ssp_.on_metric(m, out); }
  void on_join(const membership_event& j, outcome_sink& out) {
    const bool fresh = !ssp_.is_live(j.worker);
    ssp_.on_join(j, out);
    if (!fresh) return;
    grow(std::size_t{j.worker} + 1);
    w_[j.worker] = worker_state{};  // a new incarnation is measured anew
    w_[j.worker].batch = p_.min_batch;
    out.plan_changed(j.worker);
  }
  void on_evict(const membership_event& j, outcome_sink& out) { ssp_.on_evict(j, out); }
  void on_measurement(const measurement_event& x, outcome_sink& out) {
    ssp_.on_measurement(x, out);
    if (!ssp_.is_live(x.worker) || x.worker >= w_.size()) return;
    if (!(x.seconds > 0.0) || !std::isfinite(x.seconds) || !(x.amount >= 0.0) || !std::isfinite(x.amount)) return;
    worker_state& s = w_[x.worker];
    switch (x.kind) {
      case measurement_kind::compute: {
        const double b = x.amount > 0.0 ? x.amount : static_cast<double>(s.batch);
        smooth(s.per_sample, x.seconds / b);
        break;
      }
      case measurement_kind::push: smooth(s.push, x.seconds); break;
      case measurement_kind::pull: smooth(s.pull, x.seconds); break;
      default: return;
    }
    if (!(s.per_sample > 0.0 && s.push > 0.0 && s.pull > 0.0)) return;
    if (chosen_ && s.basis_per_sample > 0.0 && !off(s.per_sample, s.basis_per_sample) &&
        !off(s.push + s.pull, s.basis_overhead))
      return;
    choose(out);
  }
  void drain(outcome_sink& out) { ssp_.drain(out); }

  [[nodiscard]] worker_plan plan(worker_id w) const {
    worker_plan p = ssp_.plan(w);
    p.batch_size = w < w_.size() ? w_[w].batch : p_.min_batch;
    return p;
  }
  [[nodiscard]] stage_id stage() const noexcept { return ssp_.stage(); }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return ssp_.is_live(w); }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return ssp_.is_held(w); }

  [[nodiscard]] const joint_params& params() const noexcept { return p_; }
  // The staleness bound s in force.
  [[nodiscard]] std::uint32_t bound() const noexcept { return ssp_.bound(); }
  [[nodiscard]] std::uint64_t clock(worker_id w) const { return ssp_.clock(w); }
  [[nodiscard]] std::uint64_t min_clock() const noexcept { return ssp_.min_clock(); }
  // Choices made (the first one included).
  [[nodiscard]] std::uint64_t choices() const noexcept { return choices_; }
  // J of the latest choice (seconds per effective sample); +inf before it.
  [[nodiscard]] double predicted_seconds_per_sample() const noexcept { return objective_; }
  // Worker w's smoothed model (zeros until measured).
  [[nodiscard]] joint_model model(worker_id w) const noexcept {
    if (w >= w_.size()) return {};
    return {w_[w].per_sample, w_[w].push + w_[w].pull};
  }

 private:
  // The saved fields (core/fields.hpp), in their order: the parameters
  // after the worker count, each worker's model, the last choice.
  static constexpr auto saved_params() {
    return std::tuple{field{"s_min", &joint_params::s_min},
                      field{"s_max", &joint_params::s_max},
                      field{"min_batch", &joint_params::min_batch},
                      field{"max_batch", &joint_params::max_batch},
                      field{"batch_step", &joint_params::batch_step},
                      field{"horizon", &joint_params::horizon},
                      field{"staleness_cost", &joint_params::staleness_cost},
                      field{"drift", &joint_params::drift},
                      field{"half_life", &joint_params::half_life}};
  }
  static constexpr auto saved_worker() {
    return std::tuple{field{"batch", &worker_state::batch}, field{"per_sample", &worker_state::per_sample},
                      field{"push", &worker_state::push}, field{"pull", &worker_state::pull},
                      field{"basis_per_sample", &worker_state::basis_per_sample},
                      field{"basis_overhead", &worker_state::basis_overhead}};
  }
  static constexpr auto saved_choice() {
    return std::tuple{field{"chosen", &joint::chosen_}, field{"choices", &joint::choices_},
                      field{"objective", &joint::objective_}};
  }

 public:
  void save(state_writer& out) const {
    out.tag("JNT_", 1);
    out.put<std::uint64_t>(p_.workers);
    put_fields(out, p_, saved_params());
    ssp_.save(out);
    out.put<std::uint64_t>(w_.size());
    for (const auto& s : w_) put_fields(out, s, saved_worker());
    put_fields(out, *this, saved_choice());
  }
  status load(state_reader& in) {
    joint n;
    std::uint64_t workers = 0, ids = 0;
    ASHL_TRY(in.tag("JNT_", 1));
    ASHL_TRY(in.get(workers, "joint.workers"));
    n.p_.workers = static_cast<std::size_t>(workers);
    ASHL_TRY(get_fields(in, n.p_, "joint", saved_params()));
    if (n.p_.s_max < n.p_.s_min) return malformed("joint.s_max", n.p_.s_max, "below s_min");
    if (n.p_.min_batch < 1 || n.p_.max_batch < n.p_.min_batch || n.p_.batch_step < 1)
      return malformed("joint.batch_step", n.p_.batch_step, "a batch grid needs 1 <= min <= max and step >= 1");
    if (!(n.p_.horizon > 0.0 && std::isfinite(n.p_.horizon)))
      return malformed("joint.horizon", n.p_.horizon, "must be finite and > 0");
    if (!(n.p_.staleness_cost >= 0.0 && std::isfinite(n.p_.staleness_cost)))
      return malformed("joint.staleness_cost", n.p_.staleness_cost, "must be finite and >= 0");
    if (!(n.p_.drift > 0.0 && std::isfinite(n.p_.drift))) return malformed("joint.drift", n.p_.drift, "must be finite and > 0");
    if (!(n.p_.half_life > 0.0 && std::isfinite(n.p_.half_life)))
      return malformed("joint.half_life", n.p_.half_life, "must be finite and > 0");
    ASHL_TRY(n.ssp_.load(in));
    if (n.ssp_.bound() < n.p_.s_min || n.ssp_.bound() > n.p_.s_max)
      return malformed("joint.bound", n.ssp_.bound(), "outside [s_min, s_max]");
    ASHL_TRY(in.count(ids, 4 + 5 * 8, "joint.ids"));
    n.w_.assign(static_cast<std::size_t>(ids), worker_state{});
    for (auto& s : n.w_) {
      ASHL_TRY(get_fields(in, s, "joint", saved_worker()));
      for (double v : {s.per_sample, s.push, s.pull, s.basis_per_sample, s.basis_overhead})
        if (!(std::isfinite(v) && v >= 0.0)) return malformed("joint.model", v, "must be finite and >= 0");
    }
    ASHL_TRY(get_fields(in, n, "joint", saved_choice()));
    n.live_.reserve(n.w_.size());
    n.models_.reserve(n.w_.size());
    *this = std::move(n);
    return {};
  }

 private:
  struct worker_state {
    std::uint32_t batch = 16;
    double per_sample = 0.0;  // EWMA of k_i; 0: not measured
    double push = 0.0;        // EWMA of push seconds
    double pull = 0.0;        // EWMA of pull seconds
    double basis_per_sample = 0.0;  // k_i and o_i of the latest choice; 0: not in it
    double basis_overhead = 0.0;
  };

  void grow(std::size_t ids) {
    if (w_.size() >= ids) return;
    worker_state fresh;
    fresh.batch = p_.min_batch;
    w_.resize(ids, fresh);
  }
  [[nodiscard]] double alpha() const noexcept { return 1.0 - std::exp2(-1.0 / p_.half_life); }
  void smooth(double& v, double x) const noexcept { v = v > 0.0 ? v + alpha() * (x - v) : x; }
  [[nodiscard]] bool off(double now, double basis) const noexcept {
    return std::fabs(now - basis) > p_.drift * basis;
  }

  // Choose over the live workers, once every one of them is measured.
  void choose(outcome_sink& out) {
    live_.clear();
    models_.clear();
    for (worker_id w = 0; w < w_.size(); ++w) {
      if (!ssp_.is_live(w)) continue;
      const worker_state& s = w_[w];
      if (!(s.per_sample > 0.0 && s.push > 0.0 && s.pull > 0.0)) return;
      live_.push_back(w);
      models_.push_back({s.per_sample, s.push + s.pull});
    }
    if (live_.empty()) return;
    const joint_choice c = choose_joint(models_, p_.grid());
    for (std::size_t i = 0; i < live_.size(); ++i) {
      worker_state& s = w_[live_[i]];
      s.basis_per_sample = s.per_sample;
      s.basis_overhead = s.push + s.pull;
      if (s.batch != c.batch[i]) {
        s.batch = c.batch[i];
        out.plan_changed(live_[i]);
      }
    }
    ssp_.set_bound(c.staleness, out);
    objective_ = c.seconds_per_sample;
    chosen_ = true;
    ++choices_;
  }

  joint_params p_;
  ssp ssp_;
  std::vector<worker_state> w_;
  bool chosen_ = false;
  std::uint64_t choices_ = 0;
  double objective_ = std::numeric_limits<double>::infinity();
  std::vector<worker_id> live_;      // scratch of choose()
  std::vector<joint_model> models_;  // scratch of choose()
};

static_assert(consistency_policy<joint>);

}  // namespace sync
ASHL_NAMESPACE_END
