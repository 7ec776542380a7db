// ashl/rules/compensation.hpp — staleness compensation (SpecTrain, Chen et al.
// 2018): a worker whose parameters are τ versions old when its update lands
// computes on a prediction of the parameters it will meet instead,
// Ŵ = W − τ·η·v (v: its momentum, η: its learning rate), the step momentum
// SGD would take τ more times. docs/seed-algorithms.md, "Staleness
// compensation".
//
//   wk->wait();                                       // w: the servers' parameters
//   ashl::ps::compensate(w, momentum, wk->staleness(), lr);   // τ from the pull reply
//   local training from w ...
//
// τ comes from the server (server_core::serve_staleness: the versions other
// workers added between two replies to this worker, in the pull reply's
// header; the simulator's staleness(w) in virtual time), so the prediction
// follows the policy's real staleness: 0 under BSP, about the number of
// faster workers under ASP. Off unless called: every asynchronous policy and
// ASHL's stages can use it, none needs it. τ = 0 leaves w bit for bit as it
// was.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

ASHL_NAMESPACE_BEGIN
namespace ps {

// w[i] -= (τ·η)·v[i], the scale rounded to f32 once; nothing when τ = 0 or
// η = 0. Sizes must match.
inline status compensate(std::span<float> w, std::span<const float> momentum, std::uint64_t tau, double lr) {
  if (w.size() != momentum.size())
    return invalid_argument("compensate.momentum.size", momentum.size(),
                            "must equal the parameters' " + std::to_string(w.size()));
  if (tau == 0 || lr == 0.0) return {};
  const auto scale = static_cast<float>(static_cast<double>(tau) * lr);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] -= scale * momentum[i];
  return {};
}

}  // namespace ps
ASHL_NAMESPACE_END
