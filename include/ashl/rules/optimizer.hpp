// ashl/rules/optimizer.hpp — what a server does with the aggregate of the
// commits it applies at once: add it (model deltas) or take one SGD step.
//
//   auto opt = ashl::ps::optimizer::create({.mode = ashl::ps::optimizer_params::kind::sgd,
//                                           .lr = 0.1, .momentum = 0.9}, n);   // result<optimizer>
//   opt->step(W, acc, 0.25f);    // g = 0.25·acc; v = 0.9v + g; W -= 0.1v; acc = 0
//
// model_delta: W += Σ w_i Δ_i (ADSP, Local SGD, ASHL: workers send model
// deltas). sgd: one step with the aggregate g = Σ w_i g_i:
//   g += wd·W;  v = μv + g;  W -= lr·(nesterov ? g + μv : v)
// (without momentum W -= lr·g). The arithmetic is f32 with the parameters
// converted once to float, in exactly the order written, so a test can
// compute the expected bits independently. step() zeroes the accumulator it
// consumes, in the same pass, so the server's one dense buffer is ready for
// the next apply without another sweep. docs/design.md "Data flow of one commit";
// docs/algorithms.md Notation (η, W); docs/ps.md.
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
  enum class kind : std::uint8_t { model_delta = 0, sgd = 1 };
  kind mode = kind::model_delta;
  double lr = 0.1;            // sgd only (model deltas carry the worker's own step size)
  double momentum = 0.0;      // sgd only, [0, 1)
  double weight_decay = 0.0;  // sgd only, >= 0
  bool nesterov = false;      // sgd with momentum > 0 only

  // The saved state's fields, in their order (core/state_io.hpp).
  static constexpr auto fields() {
    return std::tuple{field{"mode", &optimizer_params::mode}, field{"lr", &optimizer_params::lr},
                      field{"momentum", &optimizer_params::momentum},
                      field{"weight_decay", &optimizer_params::weight_decay},
                      field{"nesterov", &optimizer_params::nesterov}};
  }

  [[nodiscard]] status validate() const {
    if (mode != kind::model_delta && mode != kind::sgd)
      return invalid_argument("optimizer.mode", static_cast<unsigned>(mode), "must be model_delta (0) or sgd (1)");
    if (mode == kind::model_delta) {
      if (momentum != 0.0)
        return invalid_argument("optimizer.momentum", momentum, "applies to sgd only (model_delta adds the deltas)");
      if (weight_decay != 0.0)
        return invalid_argument("optimizer.weight_decay", weight_decay, "applies to sgd only");
      if (nesterov) return invalid_argument("optimizer.nesterov", true, "applies to sgd only");
      return {};
    }
    if (!(std::isfinite(lr) && lr > 0.0)) return invalid_argument("optimizer.lr", lr, "must be finite and > 0");
    if (!(momentum >= 0.0 && momentum < 1.0)) return invalid_argument("optimizer.momentum", momentum, "must be in [0, 1)");
    if (!(std::isfinite(weight_decay) && weight_decay >= 0.0))
      return invalid_argument("optimizer.weight_decay", weight_decay, "must be finite and >= 0");
    if (nesterov && momentum == 0.0) return invalid_argument("optimizer.nesterov", true, "needs momentum > 0");
    return {};
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
    if (p.mode == optimizer_params::kind::sgd && p.momentum > 0.0) o.v_.assign(elements, 0.0f);
    o.n_ = elements;
    return o;
  }

  [[nodiscard]] const optimizer_params& params() const noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  // Model deltas are added as they are decoded (no accumulator needed).
  [[nodiscard]] bool adds_deltas() const noexcept { return p_.mode == optimizer_params::kind::model_delta; }
  // The momentum buffer (empty without momentum).
  [[nodiscard]] std::span<const float> velocity() const noexcept { return v_; }

  // One step with the aggregate g = scale · acc; acc is zeroed.
  void step(std::span<float> w, std::span<float> acc, float scale) noexcept { step(w, acc, scale, 0, n_); }

  // The step of elements [begin, end) only: each element's arithmetic does
  // not depend on any other's, so steps of disjoint ranges (a server's
  // apply threads, rules/apply_pool.hpp) make the same bits as one step.
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
    if (v_.empty()) {
      for (std::size_t i = 0; i < n; ++i) {
        const float g = scale * a[i] + wd * W[i];
        W[i] -= lr * g;
        a[i] = 0.0f;
      }
      return;
    }
    float* __restrict__ v = v_.data() + begin;
    if (p_.nesterov) {
      for (std::size_t i = 0; i < n; ++i) {
        const float g = scale * a[i] + wd * W[i];
        v[i] = mu * v[i] + g;
        W[i] -= lr * (g + mu * v[i]);
        a[i] = 0.0f;
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const float g = scale * a[i] + wd * W[i];
        v[i] = mu * v[i] + g;
        W[i] -= lr * v[i];
        a[i] = 0.0f;
      }
    }
  }

  void save(state_writer& w) const {
    w.tag("POPT", 1);
    put_fields(w, p_);
    w.put<std::uint64_t>(n_);
    w.put_vector(v_);
  }
  // Reads into a fresh value; *this changes only on success.
  status load(state_reader& r) {
    ASHL_TRY(r.tag("POPT", 1));
    optimizer_params p;
    ASHL_TRY(get_fields(r, p, "optimizer"));
    ASHL_TRY(p.validate());
    std::uint64_t n = 0;
    ASHL_TRY(r.get(n, "optimizer.elements"));
    std::vector<float> v;
    ASHL_TRY(r.get_vector(v, "optimizer.velocity"));
    const bool wants_v = p.mode == optimizer_params::kind::sgd && p.momentum > 0.0;
    if (v.size() != (wants_v ? n : 0))
      return make_error(errc::malformed, "optimizer.velocity.size", v.size(),
                        "must be " + std::to_string(wants_v ? n : 0) + " for these parameters");
    p_ = p;
    n_ = static_cast<std::size_t>(n);
    v_ = std::move(v);
    return {};
  }

 private:
  optimizer_params p_{};
  std::size_t n_ = 0;
  std::vector<float> v_;
};

}  // namespace ps
ASHL_NAMESPACE_END
