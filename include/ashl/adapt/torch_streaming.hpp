// ashl/adapt/torch_streaming.hpp — Streaming DiLoCo for a libtorch module:
// the C++ side of ashl.torch.StreamingDiLoCo (docs/torch.md "Streaming
// fragments (C++)"; the rule: docs/algorithms.md "Streaming fragments",
// rules/streaming.hpp). The module's parameter tensors (layers) are cut
// into P runs of consecutive tensors (ps::layer_fragments, the split the
// Python adapter makes), and each run is a fragment that ps::streaming_worker
// synchronises with its own servers on the rule's staggered schedule, its
// exchange overlapped with the next τ inner steps, then merged
// (local ← α·local + (1 − α)·servers').
//
//   Net net;                                                      // a torch::nn::Module
//   torch::optim::AdamW inner(net->parameters(), torch::optim::AdamWOptions(1e-3));
//   std::vector<ashl::ps::worker_params> wp(2, {.rank = rank});  // wp[p].servers: fragment p's servers
//   wp[0].servers = {"10.0.0.1:5000"};
//   wp[1].servers = {"10.0.0.1:5001"};
//   auto sd = ashl::adapt::torch_streaming_worker<ashl::transport::ucx>::create(
//       *net, &inner, {.fragments = 2, .interval = 100, .delay = 5, .alpha = 0.5}, std::move(wp),
//       [&](std::size_t) { return ashl::transport::ucx::create({.token = token}); });  // one per fragment
//   if (!sd) return fail(sd.error());                             // names the bad field and value
//   for (auto [x, y] : loader) {
//     sd->zero_grad();
//     loss_fn(net->forward(x), y).backward();
//     if (auto s = sd->step(); !s) return fail(s);               // inner step, then sync / merge
//   }
//   sd->leave();                                                  // merges what is on the wire, leaves
//
// Fragment p's servers are an ordinary job over its elements
// (torch_fragment_sizes(module, P)[p]; Local SGD(H) with model deltas for
// plain averaging, or "diloco" with ps::outer_optimizer_of for DiLoCo's
// outer Nesterov per fragment).
//
// Memory: create() moves the parameters' values into one flat float32
// tensor the adapter owns (allocated once) and makes every parameter's data
// a view into it, in registration order (tied parameters once, at their
// first registration, adapt::first_registrations), so the model *is* the
// flat buffer ps::streaming_worker reads its deltas from and merges into:
// nothing is packed or unpacked, nothing allocates per step. Gradients are
// left as they are (the inner optimizer's own). A parameter whose data the
// caller replaced (set_data) is copied back into its view at the next
// step() (that step allocates the view).
//
// Errors are values naming the field and the value: a parameter that is
// not float32 (the merge is f32), not on the CPU, or not contiguous
// (torch.parameter[name].*); streaming.fragments 0, more than the
// parameter tensors ("layers") or than streaming.interval (H);
// streaming.delay >= H; streaming.alpha outside [0, 1]; a null inner
// optimizer; one worker_params per fragment (torch_streaming_worker.fragments).
// Compiled only with libtorch (the ashl::torch component, ASHL_HAS_TORCH());
// without it this header is empty.
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_TORCH()

#include <ashl/adapt/torch_bucket.hpp>
#include <ashl/core/status.hpp>
#include <ashl/ps/streaming_worker.hpp>
#include <ashl/rules/streaming.hpp>
#include <ashl/transport/concepts.hpp>

#include <torch/torch.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace adapt {

// The layers a streaming worker cuts: the parameters that own a slot, in
// registration order, each checked (float32, CPU, contiguous; named in the
// error), and where each fragment starts (its first layer and element).
struct torch_streaming_layers {
  std::vector<torch::Tensor> tensors;
  std::vector<std::string> names;
  std::vector<std::uint32_t> first_layer;     // per fragment (ps::layer_fragments)
  std::vector<std::uint64_t> first_element;   // per fragment, in the flat model
  std::uint64_t elements = 0;

  // Tied tensors own one slot (names[i] names tensors[i] in errors; default
  // its index). Refuses bad tensors and a fragment count the layers cannot
  // hold by name; the schedule's other bounds are the caller's to check
  // (streaming_params::validate).
  static result<torch_streaming_layers> create(std::vector<torch::Tensor> tensors, std::vector<std::string> names,
                                               std::uint32_t fragments) {
    torch_bucket::untie(tensors, names);
    if (tensors.empty()) return invalid_argument("torch.parameters.size", 0, "needs at least one parameter");
    torch_streaming_layers l;
    std::vector<std::uint64_t> sizes;
    sizes.reserve(tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const torch::Tensor& p = tensors[i];
      const std::string field = "torch.parameter[" + names[i] + "]";
      if (!p.defined()) return invalid_argument(field, "undefined", "is not a tensor");
      if (p.scalar_type() != torch::kFloat)
        return invalid_argument(field + ".dtype", std::string(c10::toString(p.scalar_type())),
                                "must be float32 (streaming fragments are merged in f32)");
      if (!p.device().is_cpu())
        return invalid_argument(field + ".device", p.device().str(),
                                "must be the CPU (streaming fragments are merged on the host)");
      ASHL_TRY(torch_bucket::check(p, field));  // contiguous
      sizes.push_back(static_cast<std::uint64_t>(p.numel()));
    }
    l.first_layer.assign(fragments, 0);
    ASHL_TRY(ps::layer_fragments(sizes, l.first_layer));
    l.first_element.reserve(fragments);
    std::uint64_t at = 0;
    for (std::size_t i = 0, f = 0; i < sizes.size(); ++i) {
      if (f < fragments && l.first_layer[f] == i) {
        l.first_element.push_back(at);
        ++f;
      }
      at += sizes[i];
    }
    l.elements = at;
    l.tensors = std::move(tensors);
    l.names = std::move(names);
    return l;
  }

  // Fragment p's elements (what its servers hold).
  [[nodiscard]] std::uint64_t fragment_size(std::uint32_t p) const noexcept {
    return (p + 1 < first_element.size() ? first_element[p + 1] : elements) - first_element[p];
  }
};

// The elements of each of `fragments` runs of consecutive parameter tensors
// of `m` (its trainable parameters, tied ones once): what fragment p's
// servers hold, the same split torch_streaming_worker makes.
inline result<std::vector<std::uint64_t>> torch_fragment_sizes(torch::nn::Module& m, std::uint32_t fragments) {
  auto [ts, names] = torch_bucket::trainable(m);
  auto l = torch_streaming_layers::create(std::move(ts), std::move(names), fragments);
  if (!l) return l.error();
  std::vector<std::uint64_t> out;
  for (std::uint32_t p = 0; p < fragments; ++p) out.push_back(l->fragment_size(p));
  return out;
}

// Streaming DiLoCo's worker for a torch module (see the top).
template <transport::transport Transport>
class torch_streaming_worker {
 public:
  // The module's trainable parameters (tied ones once, registration order)
  // cut into sp.fragments runs of consecutive tensors; fragment p joins
  // fragments[p].servers over make_transport(p) (a result<Transport> or a
  // Transport) and pulls their values into the module. `inner` is stepped
  // by step() (not owned; it must outlive the worker).
  template <class MakeTransport>
    requires std::invocable<MakeTransport&, std::size_t>
  static result<torch_streaming_worker> create(torch::nn::Module& model, torch::optim::Optimizer* inner,
                                               const ps::streaming_params& sp,
                                               std::vector<ps::worker_params> fragments,
                                               MakeTransport&& make_transport) {
    auto [ts, names] = torch_bucket::trainable(model);
    return create(std::move(ts), inner, sp, std::move(fragments), make_transport, std::move(names));
  }

  // The same over a list of parameter tensors in model order (names[i]
  // names tensors[i] in errors; default its index).
  template <class MakeTransport>
    requires std::invocable<MakeTransport&, std::size_t>
  static result<torch_streaming_worker> create(std::vector<torch::Tensor> params, torch::optim::Optimizer* inner,
                                               const ps::streaming_params& sp,
                                               std::vector<ps::worker_params> fragments,
                                               MakeTransport&& make_transport, std::vector<std::string> names = {}) {
    if (inner == nullptr)
      return invalid_argument("torch_streaming_worker.inner", "null",
                              "step() steps the inner optimizer: pass one");
    // The layers first (the count the fragments are checked against), then
    // the schedule's bounds, all before anything is touched.
    torch_bucket::untie(params, names);
    ASHL_TRY(sp.validate(params.size(), "layers"));
    if (fragments.size() != sp.fragments)
      return invalid_argument("torch_streaming_worker.fragments", fragments.size(),
                              "must hold one worker_params per fragment (streaming.fragments = " +
                                  std::to_string(sp.fragments) + ")");
    auto layers = torch_streaming_layers::create(std::move(params), std::move(names), sp.fragments);
    if (!layers) return layers.error();
    std::vector<Transport> transports;
    transports.reserve(sp.fragments);
    for (std::size_t p = 0; p < sp.fragments; ++p) {
      result<Transport> t = [&]() -> result<Transport> {
        if constexpr (std::is_same_v<std::invoke_result_t<MakeTransport&, std::size_t>, result<Transport>>)
          return make_transport(p);
        else
          return Transport(make_transport(p));
      }();
      if (!t) return status(t.error().code(), "fragment " + std::to_string(p) + ": " + t.error().message());
      transports.push_back(std::move(*t));
    }
    torch_streaming_worker w(inner, std::move(*layers));
    w.alias();
    auto sw = ps::streaming_worker<Transport>::create(sp, std::move(fragments), std::move(transports), w.model(),
                                                      w.layers_.first_element);
    if (!sw) return sw.error();
    w.sw_.emplace(std::move(*sw));
    return w;
  }

  torch_streaming_worker(torch_streaming_worker&&) noexcept = default;
  torch_streaming_worker& operator=(torch_streaming_worker&&) noexcept = default;

  void zero_grad() { inner_->zero_grad(); }

  // One inner step (the inner optimizer's), then the schedule's: the
  // fragment it syncs leaves (its delta, local − reference) without
  // waiting, and the fragment it merges is awaited and merged into the
  // parameters.
  status step() {
    inner_->step();
    reattach();
    return sw_->step();
  }

  // Merges every fragment still on the wire (before reading the model for
  // good); leave() does it, then leaves every fragment's servers.
  status finish() { return sw_->finish(); }
  status leave() { return sw_->leave(); }

  [[nodiscard]] const ps::streaming_params& params() const noexcept { return sw_->params(); }
  [[nodiscard]] std::uint32_t fragments() const noexcept { return sw_->params().fragments; }
  // Inner steps done, fragment commits sent.
  [[nodiscard]] std::uint64_t steps() const noexcept { return sw_->steps(); }
  [[nodiscard]] std::uint64_t syncs() const noexcept { return sw_->syncs(); }
  // Fragment p: its elements in the flat model, its layers [first, end) in
  // names() / tensors(), its ps::worker (telemetry, plan).
  [[nodiscard]] ps::key_range range(std::uint32_t p) const noexcept { return sw_->range(p); }
  [[nodiscard]] std::pair<std::size_t, std::size_t> layers(std::uint32_t p) const noexcept {
    const auto& f = layers_.first_layer;
    return {f[p], p + 1 < f.size() ? f[p + 1] : layers_.tensors.size()};
  }
  [[nodiscard]] std::vector<std::uint64_t> fragment_sizes() const {
    std::vector<std::uint64_t> out;
    for (std::uint32_t p = 0; p < fragments(); ++p) out.push_back(layers_.fragment_size(p));
    return out;
  }
  [[nodiscard]] const std::vector<std::string>& names() const noexcept { return layers_.names; }
  [[nodiscard]] const std::vector<torch::Tensor>& tensors() const noexcept { return layers_.tensors; }
  [[nodiscard]] const ps::worker<Transport>& worker(std::uint32_t p) const { return sw_->fragment(p); }
  // The flat model every parameter is a view into.
  [[nodiscard]] const torch::Tensor& flat() const noexcept { return flat_; }

 private:
  torch_streaming_worker(torch::optim::Optimizer* inner, torch_streaming_layers layers)
      : inner_(inner), layers_(std::move(layers)) {}

  std::span<float> model() { return {flat_.data_ptr<float>(), static_cast<std::size_t>(flat_.numel())}; }

  // The flat model, once: every parameter's data a view into it, values kept.
  void alias() {
    flat_ = torch::empty({static_cast<std::int64_t>(layers_.elements)}, torch::TensorOptions().dtype(torch::kFloat));
    offsets_.reserve(layers_.tensors.size());
    std::int64_t at = 0;
    for (const auto& p : layers_.tensors) {
      offsets_.push_back(at);
      at += p.numel();
    }
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < layers_.tensors.size(); ++i) view_again(i);
  }

  void view_again(std::size_t i) {
    torch::Tensor& p = layers_.tensors[i];
    auto v = flat_.narrow(0, offsets_[i], p.numel()).view(p.sizes());
    v.copy_(p.detach());
    p.set_data(v);
  }

  // A parameter whose data the caller replaced is a view again (its values
  // copied in); the steady state only compares pointers.
  void reattach() {
    const float* base = flat_.data_ptr<float>();
    for (std::size_t i = 0; i < layers_.tensors.size(); ++i)
      if (layers_.tensors[i].data_ptr() != static_cast<const void*>(base + offsets_[i])) {
        torch::NoGradGuard no_grad;
        view_again(i);
      }
  }

  torch::optim::Optimizer* inner_ = nullptr;
  torch_streaming_layers layers_;
  torch::Tensor flat_;
  std::vector<std::int64_t> offsets_;  // per tensor: where it starts in flat_
  std::optional<ps::streaming_worker<Transport>> sw_;
};

}  // namespace adapt
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_TORCH()
