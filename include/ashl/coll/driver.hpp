// ashl/coll/driver.hpp — the collective driver of the synchronous policies:
// BSP and DLB average the gradients every step, Local
// SGD and semi-async interval sync average the models every H steps or at
// the barrier. The same sync/ policy objects the parameter server runs
// decide H, the interval and the weights.
//
//   auto d = ashl::coll::sync_driver<ashl::coll::mpi, ashl::sync::dlb>::create(
//       comm, ashl::sync::dlb{{.workers = M, .total_batch = 256}});
//   while (training) {
//     auto t0 = now(); compute_gradient(w, g, d->plan().batch_size);
//     ASHL_TRY(d->reduce_gradients(g, {.samples = b, .compute_seconds = now() - t0, .time = now()}).to_status());
//     local_step(w, g);                      // g is the weighted mean (BSP, DLB) or the own gradient
//     ASHL_TRY(d->sync_models(w).to_status());   // w is averaged when Local SGD / the barrier says so
//   }
//
// Every rank holds a copy of the policy and feeds it the same events, so
// every copy makes the same decisions without a server (docs/design.md: policies
// are pure; drivers own time and I/O): at each step the ranks all-gather
// (samples, compute seconds, time) — 24 bytes each — and the driver hands
// every rank's compute measurement and then, on the ranks' commit steps
// (every plan.local_iterations steps), every rank's commit to the policy,
// in rank order, with the largest of the ranks' times (so a time-based
// barrier fires on the same step everywhere). When the policy completes a
// round (out.round() non-empty), the driver exchanges: rank j's buffer
// counts with the round's weight of j (1/M, or b_j/Σb). A commit a policy
// applies at once (semi-async between barriers) stays local: without a
// server there is nothing to apply it to.
//
// DiLoCo over collectives (use_outer_optimizer; docs/coll.md "DiLoCo"): a
// model policy's round exchanges the ranks' deltas d_j = w_j − W from the
// last synchronised W instead of the models, and every rank takes the same
// outer step on their weighted sum (rules/optimizer.hpp, outer mode: one
// step per round, Nesterov), W ← W − lr·(...); w = W. The arithmetic is
// the server's; the sum's order is the exchange's.
//
// The exchange is a template (coll/compressed.hpp): dense f32, dense 16-bit,
// a codec's payloads, or chosen by the iteration-time model. Policies whose
// stage is not bsp, dlb, local_sgd or semi_async are refused at create():
// asynchronous policies need a server (ps/).
#pragma once

#include <ashl/config.hpp>
#include <ashl/coll/compressed.hpp>
#include <ashl/coll/concepts.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/rules/optimizer.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/events.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace coll {

// What this rank did in the step just computed.
struct step_info {
  double samples = 0.0;          // mini-batch samples (DLB weights, batch-weighted rounds)
  double compute_seconds = 0.0;  // > 0: reported to the policy as a compute measurement
  double time = 0.0;             // the driver's clock (semi-async's Δt barrier)
};

enum class step_exchange : std::uint8_t { none = 0, gradients = 1, models = 2 };

template <host_collective C, sync::consistency_policy P, class Exchange = dense_exchange>
class sync_driver {
 public:
  static result<sync_driver> create(C& c, P policy, Exchange exchange = Exchange{}) {
    const stage_id s = policy.stage();
    if (s != stage_id::bsp && s != stage_id::dlb && s != stage_id::local_sgd && s != stage_id::semi_async)
      return invalid_argument("sync_driver.policy.stage", to_string(s),
                              "collective drivers run bsp, dlb, local_sgd or semi_async");
    return sync_driver(c, std::move(policy), std::move(exchange));
  }

  // Gradient policies (bsp, dlb): every commit step averages g (weighted) and
  // returns true. Model policies: counts the step, returns false, g untouched.
  result<bool> reduce_gradients(std::span<float> g, const step_info& info) {
    auto round = step(info);
    if (!round) return round.error();
    if (!*round || models_) return false;
    ASHL_TRY(adopt_plans());
    ASHL_TRY(exchange_(c_, host_view<float>(g), weights_, steps_));
    return true;
  }

  // Model policies (local_sgd, semi_async): averages w when the step that
  // reduce_gradients counted completed a round; returns whether it did.
  result<bool> sync_models(std::span<float> w) {
    if (!models_ || !pending_models_) return false;
    pending_models_ = false;
    ASHL_TRY(adopt_plans());
    if (outer_) {
      if (w.size() != anchor_.size())
        return invalid_argument("sync_driver.sync_models.w.size", w.size(),
                                "the outer optimizer holds " + std::to_string(anchor_.size()) + " elements");
      for (std::size_t i = 0; i < w.size(); ++i) delta_[i] = w[i] - anchor_[i];
      ASHL_TRY(exchange_(c_, host_view<float>(std::span<float>(delta_)), weights_, steps_));
      opt_.begin_step();
      opt_.step(anchor_, delta_, 1.0f, 0, anchor_.size());  // zeroes delta_
      std::copy(anchor_.begin(), anchor_.end(), w.begin());
      return true;
    }
    ASHL_TRY(exchange_(c_, host_view<float>(w), weights_, steps_));
    return true;
  }

  // DiLoCo: each round's exchange sums the ranks' deltas from W (the
  // parameters every rank starts from, `w0`, then the last round's result)
  // and every rank takes the outer step `o` (optimizer_params::kind::outer;
  // ps::outer_optimizer_of("diloco", ...)) on it. Model policies only
  // (local_sgd, semi_async); buffers sized once here, none per round.
  status use_outer_optimizer(const ps::optimizer_params& o, std::span<const float> w0) {
    if (!models_)
      return invalid_argument("sync_driver.outer_optimizer", to_string(policy_.stage()),
                              "an outer optimizer steps on model deltas: local_sgd or semi_async");
    if (o.mode != ps::optimizer_params::kind::outer)
      return invalid_argument("sync_driver.outer_optimizer.mode", static_cast<unsigned>(o.mode), "must be outer (2)");
    auto opt = ps::optimizer::create(o, w0.size());
    if (!opt) return opt.error();
    opt_ = std::move(*opt);
    anchor_.assign(w0.begin(), w0.end());
    delta_.assign(w0.size(), 0.0f);
    outer_ = true;
    return {};
  }
  [[nodiscard]] const ps::optimizer* outer_optimizer() const noexcept { return outer_ ? &opt_ : nullptr; }

  [[nodiscard]] worker_plan plan() const { return policy_.plan(static_cast<sync::worker_id>(c_.rank())); }
  [[nodiscard]] const P& policy() const noexcept { return policy_; }
  [[nodiscard]] Exchange& exchange() noexcept { return exchange_; }
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  [[nodiscard]] std::uint64_t rounds() const noexcept { return rounds_; }
  // The weights of the last round, per rank.
  [[nodiscard]] std::span<const double> weights() const noexcept { return weights_; }
  [[nodiscard]] bool exchanges_models() const noexcept { return models_; }

 private:
  sync_driver(C& c, P policy, Exchange exchange)
      : c_(c), policy_(std::move(policy)), exchange_(std::move(exchange)),
        out_(static_cast<std::size_t>(c.size())), m_(static_cast<std::size_t>(c.size())) {
    const stage_id s = policy_.stage();
    models_ = s == stage_id::local_sgd || s == stage_id::semi_async;
    since_.assign(m_, 0);
    started_.assign(m_, 0.0);
    samples_since_.assign(m_, 0.0);
    sequence_.assign(m_, 0);
    weights_.assign(m_, 0.0);
  }

  // An exchange that follows the plans (plan_exchange) is handed every
  // rank's plan in force before it runs: the same on every rank.
  status adopt_plans() {
    if constexpr (requires(Exchange& e, std::span<const worker_plan> p, rank_t r) { e.adopt(p, r); }) {
      plans_.resize(m_);
      for (std::size_t j = 0; j < m_; ++j) plans_[j] = policy_.plan(static_cast<sync::worker_id>(j));
      return exchange_.adopt(plans_, c_.rank());
    } else {
      return {};
    }
  }

  // Feeds the step to the policy; true when a round completed.
  result<bool> step(const step_info& info) {
    ++steps_;
    const double mine[3] = {info.samples, info.compute_seconds, info.time};
    all_.resize(3 * m_);
    three_.assign(m_, 3);
    ASHL_TRY(blocking(c_, c_.all_gather(in_view<>(mine, 3, dtype::f64), out_view<>(all_.data(), all_.size(), dtype::f64),
                                        three_, c_.default_stream())));
    double now = 0.0;
    for (std::size_t j = 0; j < m_; ++j) now = std::max(now, all_[3 * j + 2]);
    out_.clear();
    for (std::size_t j = 0; j < m_; ++j) {
      if (all_[3 * j + 1] > 0.0)
        policy_.on_measurement({.worker = static_cast<std::uint32_t>(j),
                                .kind = measurement_kind::compute,
                                .seconds = all_[3 * j + 1],
                                .amount = all_[3 * j],
                                .time = now},
                               out_);
    }
    bool round = false;
    std::fill(weights_.begin(), weights_.end(), 0.0);
    for (std::size_t j = 0; j < m_; ++j) {
      const auto w = static_cast<sync::worker_id>(j);
      // The commit rule every driver shares (core/plan.hpp cycle_complete):
      // H steps, or the plan's commit interval in the ranks' common time.
      samples_since_[j] += all_[3 * j];
      // A cycle begins where the previous step ended (the first one: this
      // step's own compute time before now).
      if (++since_[j] == 1) started_[j] = have_previous_ ? previous_now_ : now - std::max(0.0, all_[3 * j + 1]);
      if (!cycle_complete(policy_.plan(w), since_[j], now - started_[j])) continue;
      const double samples = samples_since_[j];
      since_[j] = 0;
      samples_since_[j] = 0.0;
      ++sequence_[j];
      const std::size_t from = out_.round().size();
      (void)policy_.on_commit({.worker = w,
                               .sequence = sequence_[j],
                               .clock = commit_clock(sequence_[j]),
                               .time = now,
                               .bytes = 0,
                               .samples = samples > 0.0 ? static_cast<std::uint64_t>(std::llround(samples)) : 0},
                              out_);
      if (out_.round().size() > from) round = true;
    }
    previous_now_ = now;
    have_previous_ = true;
    if (!round) return false;
    for (const auto& wc : out_.round())
      if (wc.worker < m_) weights_[wc.worker] += wc.weight;
    ++rounds_;
    if (models_) pending_models_ = true;
    return true;
  }

  C& c_;
  P policy_;
  Exchange exchange_;
  std::vector<worker_plan> plans_;  // every rank's plan, for an exchange that adopts them
  sync::outcome_sink out_;
  std::size_t m_;
  bool models_ = false;
  bool pending_models_ = false;
  std::uint64_t steps_ = 0, rounds_ = 0;
  std::vector<std::uint32_t> since_;         // per rank: steps in its current cycle
  std::vector<double> started_;              // per rank: the time its cycle began (the previous step's time)
  std::vector<double> samples_since_;        // per rank: samples of its current cycle (all H steps, not the last)
  double previous_now_ = 0.0;                // the time of the last step
  bool have_previous_ = false;
  std::vector<std::uint64_t> sequence_;
  std::vector<double> weights_, all_;
  bool outer_ = false;           // use_outer_optimizer: rounds exchange deltas, then the outer step
  ps::optimizer opt_;
  std::vector<float> anchor_;    // W: the last round's parameters
  std::vector<float> delta_;     // this rank's w − W, then the round's weighted sum
  std::vector<std::size_t> three_;
};

}  // namespace coll
ASHL_NAMESPACE_END
