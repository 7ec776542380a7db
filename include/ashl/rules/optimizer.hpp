// ashl/rules/optimizer.hpp — what a server does with the aggregate of the
// commits it applies at once: add it (model deltas), take one SGD step
// (gradients), or take one outer step on the pseudo-gradient (model deltas
// under DiLoCo's outer optimizer).
//
//   auto opt = ashl::ps::optimizer::create({.mode = ashl::ps::optimizer_params::kind::sgd,
//                                           .lr = 0.1, .momentum = 0.9}, n);   // result<optimizer>
//   opt->begin_step();           // once per step, before its ranges
//   opt->step(W, acc, 0.25f);    // g = 0.25·acc; v = 0.9v + g; W -= 0.1v; acc = 0
//
// model_delta: W += Σ w_i Δ_i (ADSP, Local SGD, ASHL: workers send model
// deltas). sgd: one step with the aggregate g = Σ w_i g_i:
//   g += wd·W;  v = μv + g;  W -= lr·(nesterov ? g + μv : v)
// (without momentum W -= lr·g). outer: the commits are model deltas
// Δ_i = w_i − W (what the worker's inner optimizer did since its pull); the
// step takes the pseudo-gradient g = (−s)·acc + wd·W (s the step's scale,
// acc = Σ w_i Δ_i) and runs the sgd rule on it (DiLoCo, arXiv 2311.08105:
// outer Nesterov, lr 0.7, μ 0.9). With delay N > 1 the momentum is folded in
// only every N-th step (Delayed Nesterov, Async Local-SGD, arXiv
// 2401.09135), the steps between add the pseudo-gradients to a buffer d:
//   d += g;
//   step t with t % N == 0:  v = μv + d;  d = 0;  W -= lr·(cb·v + g)
//   any other step:          W -= lr·(ca·v + g)
// ca = f32(c·μ), cb = f32((1 − c·N + c)·μ) in double, c the momentum
// activation (0 by default: the momentum acts only at the fold). The paper's
// 1/N on each pseudo-gradient is the policy's weight here (1/M for
// async_diloco with N = M, D_i for ASHL), so it is not applied twice. outer
// with lr 1, μ 0, wd 0 is plain averaging and runs as model_delta (adds_deltas(),
// no accumulator), bit for bit the same as Local SGD. The arithmetic is f32
// with the parameters converted once to float, in exactly the order
// written, so a test can compute the expected bits independently. step()
// zeroes the accumulator it consumes, in the same pass, so the server's one
// dense buffer is ready for the next apply without another sweep.
// docs/design.md "Data flow of one commit"; docs/algorithms.md Notation
// (η, W) and "The outer optimizer"; docs/ps.md.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/fields.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

struct optimizer_params {
  enum class kind : std::uint8_t { model_delta = 0, sgd = 1, outer = 2 };
  kind mode = kind::model_delta;
  double lr = 0.1;            // sgd, outer (model deltas carry the worker's own step size)
  double momentum = 0.0;      // sgd, outer: [0, 1)
  double weight_decay = 0.0;  // sgd, outer: >= 0
  bool nesterov = false;      // sgd, outer with momentum > 0 only
  // outer only: Delayed Nesterov's N (1: plain Nesterov every step) and
  // momentum activation c in [0, 1] (N > 1 only).
  std::uint32_t nesterov_delay = 1;
  double nesterov_activation = 0.0;

  // The saved state's fields, in their order (core/state_io.hpp): version 1
  // of the optimizer's section; outer_fields() follow them in version 2.
  static constexpr auto fields() {
    return std::tuple{field{"mode", &optimizer_params::mode}, field{"lr", &optimizer_params::lr},
                      field{"momentum", &optimizer_params::momentum},
                      field{"weight_decay", &optimizer_params::weight_decay},
                      field{"nesterov", &optimizer_params::nesterov}};
  }
  static constexpr auto outer_fields() {
    return std::tuple{field{"nesterov_delay", &optimizer_params::nesterov_delay},
                      field{"nesterov_activation", &optimizer_params::nesterov_activation}};
  }

  [[nodiscard]] status validate() const {
    if (mode != kind::model_delta && mode != kind::sgd && mode != kind::outer)
      return invalid_argument("optimizer.mode", static_cast<unsigned>(mode),
                              "must be model_delta (0), sgd (1) or outer (2)");
    if (mode != kind::outer) {
      if (nesterov_delay != 1)
        return invalid_argument("optimizer.nesterov_delay", nesterov_delay, "applies to outer only");
      if (nesterov_activation != 0.0)
        return invalid_argument("optimizer.nesterov_activation", nesterov_activation, "applies to outer only");
    }
    if (mode == kind::model_delta) {
      if (momentum != 0.0)
        return invalid_argument("optimizer.momentum", momentum,
                                "applies to sgd and outer only (model_delta adds the deltas)");
      if (weight_decay != 0.0)
        return invalid_argument("optimizer.weight_decay", weight_decay, "applies to sgd and outer only");
      if (nesterov) return invalid_argument("optimizer.nesterov", true, "applies to sgd and outer only");
      return {};
    }
    if (!(std::isfinite(lr) && lr > 0.0)) return invalid_argument("optimizer.lr", lr, "must be finite and > 0");
    if (!(momentum >= 0.0 && momentum < 1.0)) return invalid_argument("optimizer.momentum", momentum, "must be in [0, 1)");
    if (!(std::isfinite(weight_decay) && weight_decay >= 0.0))
      return invalid_argument("optimizer.weight_decay", weight_decay, "must be finite and >= 0");
    if (nesterov && momentum == 0.0) return invalid_argument("optimizer.nesterov", true, "needs momentum > 0");
    if (mode == kind::outer) {
      if (nesterov_delay == 0)
        return invalid_argument("optimizer.nesterov_delay", 0, "must be >= 1 (1: the momentum acts every step)");
      if (nesterov_delay > 1 && !nesterov)
        return invalid_argument("optimizer.nesterov_delay", nesterov_delay,
                                "Delayed Nesterov needs nesterov (and momentum > 0); 1 without it");
      if (!(nesterov_activation >= 0.0 && nesterov_activation <= 1.0))
        return invalid_argument("optimizer.nesterov_activation", nesterov_activation, "must be in [0, 1]");
      if (nesterov_activation != 0.0 && nesterov_delay == 1)
        return invalid_argument("optimizer.nesterov_activation", nesterov_activation,
                                "applies with nesterov_delay > 1 only");
    }
    return {};
  }
  // outer at lr 1 without momentum or weight decay: W + Σ w_i Δ_i, plain
  // averaging, which the server runs as model_delta (bit for bit Local SGD).
  [[nodiscard]] bool plain_average() const noexcept {
    return mode == kind::outer && lr == 1.0 && momentum == 0.0 && weight_decay == 0.0;
  }
  friend bool operator==(const optimizer_params&, const optimizer_params&) = default;
};

class optimizer {
 public:
  optimizer() = default;

  static result<optimizer> create(optimizer_params p, std::size_t elements) {
    ASHL_TRY(p.validate());
    optimizer o;
    o.p_ = p;
    if (p.mode != optimizer_params::kind::model_delta && p.momentum > 0.0) o.v_.assign(elements, 0.0f);
    if (p.mode == optimizer_params::kind::outer && p.nesterov_delay > 1) o.d_.assign(elements, 0.0f);
    o.n_ = elements;
    return o;
  }

  [[nodiscard]] const optimizer_params& params() const noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  // Model deltas are added as they are decoded (no accumulator needed):
  // model_delta, and outer at plain averaging.
  [[nodiscard]] bool adds_deltas() const noexcept {
    return p_.mode == optimizer_params::kind::model_delta || p_.plain_average();
  }
  // The momentum buffer (empty without momentum).
  [[nodiscard]] std::span<const float> velocity() const noexcept { return v_; }
  // Delayed Nesterov's buffer of the pseudo-gradients since the last fold
  // (empty unless outer with nesterov_delay > 1).
  [[nodiscard]] std::span<const float> delayed() const noexcept { return d_; }
  // Outer steps begun (Delayed Nesterov's t; 0 for the other modes).
  [[nodiscard]] std::uint64_t outer_steps() const noexcept { return t_; }

  // Starts one step: called once before the step's ranges (the server's
  // parts all see the same t). Only Delayed Nesterov keeps a count.
  void begin_step() noexcept {
    if (p_.mode != optimizer_params::kind::outer) return;
    ++t_;
    fold_ = t_ % p_.nesterov_delay == 0;
  }

  // One step with the aggregate scale · acc; acc is zeroed.
  void step(std::span<float> w, std::span<float> acc, float scale) noexcept {
    begin_step();
    step(w, acc, scale, 0, n_);
  }

  // The step of elements [begin, end) only: each element's arithmetic does
  // not depend on any other's, so steps of disjoint ranges (a server's
  // apply threads, rules/apply_pool.hpp) make the same bits as one step.
  // Call begin_step() once first.
  void step(std::span<float> w, std::span<float> acc, float scale, std::size_t begin, std::size_t end) noexcept {
    ASHL_ASSERT(w.size() == n_ && acc.size() == n_, "optimizer::step: sizes differ from the optimizer's");
    ASHL_ASSERT(begin <= end && end <= n_, "optimizer::step: range outside the parameters");
    float* __restrict__ W = w.data() + begin;
    float* __restrict__ a = acc.data() + begin;
    const std::size_t n = end - begin;
    if (p_.mode == optimizer_params::kind::model_delta) {
      for (std::size_t i = 0; i < n; ++i) {
        W[i] += scale * a[i];
        a[i] = 0.0f;
      }
      return;
    }
    const float lr = static_cast<float>(p_.lr), wd = static_cast<float>(p_.weight_decay),
                mu = static_cast<float>(p_.momentum);
    // outer: the pseudo-gradient points against the deltas; (−s)·a is −(s·a) exactly.
    const float s = p_.mode == optimizer_params::kind::outer ? -scale : scale;
    if (v_.empty()) {
      for (std::size_t i = 0; i < n; ++i) {
        const float g = s * a[i] + wd * W[i];
        W[i] -= lr * g;
        a[i] = 0.0f;
      }
      return;
    }
    float* __restrict__ v = v_.data() + begin;
    if (!d_.empty()) {
      float* __restrict__ d = d_.data() + begin;
      const double c = p_.nesterov_activation, mu_d = p_.momentum;
      if (fold_) {
        const float cb = static_cast<float>((1.0 - c * static_cast<double>(p_.nesterov_delay) + c) * mu_d);
        for (std::size_t i = 0; i < n; ++i) {
          const float g = s * a[i] + wd * W[i];
          const float sum = d[i] + g;
          v[i] = mu * v[i] + sum;
          d[i] = 0.0f;
          W[i] -= lr * (cb * v[i] + g);
          a[i] = 0.0f;
        }
      } else {
        const float ca = static_cast<float>(c * mu_d);
        for (std::size_t i = 0; i < n; ++i) {
          const float g = s * a[i] + wd * W[i];
          d[i] += g;
          W[i] -= lr * (ca * v[i] + g);
          a[i] = 0.0f;
        }
      }
      return;
    }
    if (p_.nesterov) {
      for (std::size_t i = 0; i < n; ++i) {
        const float g = s * a[i] + wd * W[i];
        v[i] = mu * v[i] + g;
        W[i] -= lr * (g + mu * v[i]);
        a[i] = 0.0f;
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const float g = s * a[i] + wd * W[i];
        v[i] = mu * v[i] + g;
        W[i] -= lr * v[i];
        a[i] = 0.0f;
      }
    }
  }

  // Version 1 (model_delta, sgd: the bytes of every build before the outer
  // mode) or 2 (outer: its fields, the step count and the delay buffer).
  void save(state_writer& w) const {
    const bool outer = p_.mode == optimizer_params::kind::outer;
    w.tag("POPT", outer ? 2 : 1);
    put_fields(w, p_);
    if (outer) put_fields(w, p_, optimizer_params::outer_fields());
    w.put<std::uint64_t>(n_);
    w.put_vector(v_);
    if (outer) {
      w.put<std::uint64_t>(t_);
      w.put_vector(d_);
    }
  }
  // Reads into a fresh value; *this changes only on success.
  status load(state_reader& r) {
    std::uint32_t version = 0;
    ASHL_TRY(r.tag("POPT", 1, 2, version));
    optimizer_params p;
    ASHL_TRY(get_fields(r, p, "optimizer"));
    if (version >= 2) ASHL_TRY(get_fields(r, p, "optimizer", optimizer_params::outer_fields()));
    if ((version >= 2) != (p.mode == optimizer_params::kind::outer))
      return make_error(errc::malformed, "optimizer.mode", static_cast<unsigned>(p.mode),
                        "in a version " + std::to_string(version) + " section (version 2 is outer's)");
    ASHL_TRY(p.validate());
    std::uint64_t n = 0;
    ASHL_TRY(r.get(n, "optimizer.elements"));
    std::vector<float> v;
    ASHL_TRY(r.get_vector(v, "optimizer.velocity"));
    const bool wants_v = p.mode != optimizer_params::kind::model_delta && p.momentum > 0.0;
    if (v.size() != (wants_v ? n : 0))
      return make_error(errc::malformed, "optimizer.velocity.size", v.size(),
                        "must be " + std::to_string(wants_v ? n : 0) + " for these parameters");
    std::uint64_t t = 0;
    std::vector<float> d;
    if (version >= 2) {
      ASHL_TRY(r.get(t, "optimizer.outer_steps"));
      ASHL_TRY(r.get_vector(d, "optimizer.delayed"));
      const bool wants_d = p.nesterov_delay > 1;
      if (d.size() != (wants_d ? n : 0))
        return make_error(errc::malformed, "optimizer.delayed.size", d.size(),
                          "must be " + std::to_string(wants_d ? n : 0) + " for these parameters");
    }
    p_ = p;
    n_ = static_cast<std::size_t>(n);
    v_ = std::move(v);
    d_ = std::move(d);
    t_ = t;
    fold_ = false;
    return {};
  }

 private:
  optimizer_params p_{};
  std::size_t n_ = 0;
  std::vector<float> v_;
  std::vector<float> d_;     // outer, nesterov_delay > 1: Σ g since the last fold
  std::uint64_t t_ = 0;      // outer: steps begun
  bool fold_ = false;        // outer: this step folds d into v (t % N == 0)
};

}  // namespace ps
ASHL_NAMESPACE_END
