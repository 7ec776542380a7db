// ashl/adapt/torch.hpp — libtorch under ashl's parameter servers: a module's
// parameters and gradients flattened once into one contiguous float32 bucket
// each (every parameter's data and grad are views into them, as PyTorch DDP's
// gradient_as_bucket_view), so a step copies nothing: the worker commits from
// the gradient bucket (or a model delta) and pulls into the parameter bucket,
// following the servers' plan (DESIGN.md "Layers", adapt/; docs/torch.md).
//
//   Net net;                                                  // a torch::nn::Module
//   torch::optim::SGD local(net->parameters(), 0.05);
//   auto t = ashl::transport::ucx::create({.token = j.token});
//   auto d = ashl::adapt::torch_worker<ashl::transport::ucx>::create(
//       *net, &local, {.rank = j.rank, .servers = j.server_addresses, .batch = 64}, std::move(*t));
//   while (training) {
//     d->zero_grad();
//     auto [x, y] = next_batch(d->batch());                    // the plan's batch size
//     torch::nll_loss(net->forward(x), y).backward();
//     if (auto s = d->step(); !s) return fail(s);              // local step; commit + pull when the plan says
//   }
//   d->leave();
//
// Tied parameters (one tensor registered twice) own one slot, at their
// first registration (adapt::first_registrations, the Python adapter's rule
// too). The update a step commits is built by adapt::update_builder, the
// same code ashl.torch runs through the Python module, so both adapters send
// the same bytes for the same step.
//
// Updates (torch_update): delta (servers with optimizer model_delta, the
// default): the local optimizer steps every iteration and the change since
// the last pull is committed after the plan's local iterations (local SGD).
// gradient (servers with optimizer sgd): nothing steps locally; the gradient
// bucket itself is committed (the mean over the plan's local iterations when
// H > 1) and the servers take the SGD step. With BSP, one worker and the
// identity codec that is plain SGD, bit for bit (test/adapt/torch.cpp).
//
// The plan: iteration_done() (ps::worker_cycle) decides when to commit (H
// iterations or a commit interval); batch() and data_share() are the plan's,
// for the caller's data loader; the codec and compression ratio apply inside
// ps::worker. CUDA tensors: the buckets live on the device and the worker
// reads and writes a pinned host copy (one device-host copy of the update and
// one host-device copy of the parameters per commit); the CUDA codecs run
// there once ps::worker takes device buffers.
//
// Errors are values naming the parameter and the value: a dtype other than
// float32, a non-contiguous tensor, tensors on different devices, a model
// whose size differs from the servers' (ps::worker's join). Compiled only
// with libtorch (the ashl::torch component, ASHL_HAS_TORCH()); without it
// this header is empty.
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_TORCH()

#include <ashl/adapt/update_builder.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>
#include <ashl/ps/worker.hpp>
#include <ashl/transport/concepts.hpp>

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace adapt {

enum class torch_update : std::uint8_t { delta = 0, gradient = 1 };

static_assert(static_cast<int>(torch_update::delta) == static_cast<int>(update_kind::delta) &&
              static_cast<int>(torch_update::gradient) == static_cast<int>(update_kind::gradient));

// A module's trainable parameters in one float32 buffer and their gradients
// in another; after create() every parameter's data and grad are views into
// them. Values are kept. Moves keep the views (the buffers are tensors).
class torch_bucket {
 public:
  static result<torch_bucket> create(torch::nn::Module& m) {
    std::vector<std::string> names;
    std::vector<torch::Tensor> ts;
    for (const auto& item : m.named_parameters(/*recurse=*/true)) {
      if (!item.value().requires_grad()) continue;
      names.push_back(item.key());
      ts.push_back(item.value());
    }
    return create(std::move(ts), std::move(names));
  }

  // names[i] names tensors[i] in errors (default: its index).
  static result<torch_bucket> create(std::vector<torch::Tensor> tensors, std::vector<std::string> names = {}) {
    if (tensors.empty()) return invalid_argument("torch.parameters.size", 0, "needs at least one parameter");
    names.resize(tensors.size());
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i].empty()) names[i] = std::to_string(i);
    {  // tied parameters: the first registration owns the slot
      std::vector<std::uintptr_t> keys;
      for (const auto& t : tensors)
        keys.push_back(t.defined() ? reinterpret_cast<std::uintptr_t>(t.unsafeGetTensorImpl()) : 0);
      const auto own = first_registrations(std::span<const std::uintptr_t>(keys));
      std::size_t k = 0;
      for (std::size_t i = 0; i < tensors.size(); ++i)
        if (own[i] || !tensors[i].defined()) {
          tensors[k] = tensors[i];
          names[k] = names[i];
          ++k;
        }
      tensors.resize(k);
      names.resize(k);
    }
    torch_bucket b;
    std::int64_t n = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const torch::Tensor& p = tensors[i];
      const std::string field = "torch.parameter[" + names[i] + "]";
      if (!p.defined()) return invalid_argument(field, "undefined", "is not a tensor");
      if (p.scalar_type() != torch::kFloat)
        return invalid_argument(field + ".dtype", std::string(c10::toString(p.scalar_type())), "must be float32");
      if (!p.is_contiguous())
        return invalid_argument(field + ".stride", stride_text(p), "must be contiguous (shape " + shape_text(p) + ")");
      if (p.device() != tensors[0].device())
        return invalid_argument(field + ".device", p.device().str(),
                                "differs from the first parameter's " + tensors[0].device().str());
      b.offsets_.push_back(n);
      n += p.numel();
    }
    const auto opts = torch::TensorOptions().dtype(torch::kFloat).device(tensors[0].device());
    b.params_ = torch::empty({n}, opts);
    b.grads_ = torch::zeros({n}, opts);
    {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        torch::Tensor& p = tensors[i];
        b.param_view(p, i).copy_(p.detach());
        p.set_data(b.param_view(p, i));
        if (p.grad().defined()) b.grad_view(p, i).copy_(p.grad());
        p.mutable_grad() = b.grad_view(p, i);
      }
    }
    b.tensors_ = std::move(tensors);
    b.names_ = std::move(names);
    return b;
  }

  [[nodiscard]] const torch::Tensor& params() const noexcept { return params_; }
  [[nodiscard]] const torch::Tensor& grads() const noexcept { return grads_; }
  [[nodiscard]] std::size_t size() const noexcept { return static_cast<std::size_t>(params_.numel()); }
  [[nodiscard]] const std::vector<torch::Tensor>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] const std::vector<std::string>& names() const noexcept { return names_; }
  [[nodiscard]] bool is_cuda() const { return params_.is_cuda(); }

  // Views again where the caller replaced a parameter's data or grad
  // (optimizer.zero_grad(set_to_none), set_data), its values copied in first.
  void attach() {
    torch::NoGradGuard no_grad;
    const auto* pb = static_cast<const char*>(params_.data_ptr());
    const auto* gb = static_cast<const char*>(grads_.data_ptr());
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      torch::Tensor& p = tensors_[i];
      const auto off = static_cast<std::ptrdiff_t>(offsets_[i]) * 4;
      if (static_cast<const char*>(p.data_ptr()) != pb + off) {
        auto v = param_view(p, i);
        v.copy_(p.detach());
        p.set_data(v);
      }
      const torch::Tensor& g = p.grad();
      if (!g.defined() || static_cast<const char*>(g.data_ptr()) != gb + off) {
        auto v = grad_view(p, i);
        if (g.defined()) v.copy_(g);
        else v.zero_();
        p.mutable_grad() = v;
      }
    }
  }

 private:
  torch::Tensor param_view(const torch::Tensor& p, std::size_t i) const {
    return params_.narrow(0, offsets_[i], p.numel()).view(p.sizes());
  }
  torch::Tensor grad_view(const torch::Tensor& p, std::size_t i) const {
    return grads_.narrow(0, offsets_[i], p.numel()).view(p.sizes());
  }
  static std::string stride_text(const torch::Tensor& t) {
    std::string s = "(";
    for (std::size_t i = 0; i < t.strides().size(); ++i) s += (i ? ", " : "") + std::to_string(t.strides()[i]);
    return s + ")";
  }
  static std::string shape_text(const torch::Tensor& t) {
    std::string s = "(";
    for (std::size_t i = 0; i < t.sizes().size(); ++i) s += (i ? ", " : "") + std::to_string(t.sizes()[i]);
    return s + ")";
  }

  torch::Tensor params_, grads_;
  std::vector<torch::Tensor> tensors_;
  std::vector<std::string> names_;
  std::vector<std::int64_t> offsets_;
};

// A training loop's side of ps::worker for a torch module (see the top).
template <transport::transport Transport>
class torch_worker {
 public:
  // `local` steps the module each iteration (torch_update::delta; required
  // there) and is unused with torch_update::gradient (may be null). Joins the
  // servers and pulls their parameters into the module.
  static result<torch_worker> create(torch::nn::Module& model, torch::optim::Optimizer* local, ps::worker_params p,
                                     Transport t, torch_update update = torch_update::delta) {
    auto b = torch_bucket::create(model);
    if (!b) return b.error();
    return create(std::move(*b), local, std::move(p), std::move(t), update);
  }

  static result<torch_worker> create(torch_bucket bucket, torch::optim::Optimizer* local, ps::worker_params p,
                                     Transport t, torch_update update = torch_update::delta) {
    if (update != torch_update::delta && update != torch_update::gradient)
      return invalid_argument("torch_worker.update", static_cast<unsigned>(update), "must be delta (0) or gradient (1)");
    if (update == torch_update::delta && local == nullptr)
      return invalid_argument("torch_worker.local", "null", "torch_update::delta steps a local optimizer: pass one");
    auto st = std::make_unique<state>(std::move(bucket), local, update);
    // The worker reads and writes host memory: the buckets themselves on the
    // CPU, a pinned copy of them for CUDA tensors; the update is built on the
    // host (adapt::update_builder) into host_update.
    const auto n = static_cast<std::int64_t>(st->bucket.size());
    if (st->bucket.is_cuda()) {
      const auto pinned = torch::TensorOptions().dtype(torch::kFloat).pinned_memory(true);
      st->host_params = torch::empty({n}, pinned);
      st->host_grads = torch::empty({n}, pinned);
      st->host_update = torch::empty({n}, pinned);
      st->host_params.copy_(st->bucket.params());
    } else {
      st->host_params = st->bucket.params();
      st->host_grads = st->bucket.grads();
      st->host_update = torch::empty({n}, torch::TensorOptions().dtype(torch::kFloat));
    }
    auto wk = ps::worker<Transport>::create(std::move(p), std::move(t), span_of(st->host_params));
    if (!wk) return wk.error();
    st->worker.emplace(std::move(*wk));
    st->after_pull();
    return torch_worker(std::move(st));
  }

  torch_worker(torch_worker&&) noexcept = default;
  torch_worker& operator=(torch_worker&&) noexcept = default;

  // Zeroes the gradient bucket (gradients stay views into it).
  void zero_grad() {
    s_->bucket.attach();
    s_->bucket.grads().zero_();
  }

  // One local iteration, after backward(): the local step (delta), then,
  // when the plan's iterations or interval are done, commit and pull.
  status step() {
    torch::NoGradGuard no_grad;
    state& s = *s_;
    s.bucket.attach();
    ++s.iterations;
    if (s.update == torch_update::delta) {
      s.local->step();
      s.builder.add({});  // counts the iteration
      if (!s.worker->iteration_done()) return {};
      // params - w0, from the parameters as they are now (on the host).
      if (s.bucket.is_cuda()) {
        s.host_update.copy_(s.bucket.params());
        s.builder.build(span_of(s.host_update), span_of(s.host_update));
      } else {
        s.builder.build(span_of(s.bucket.params()), span_of(s.host_update));
      }
      return exchange();
    }
    if (s.bucket.is_cuda()) s.host_grads.copy_(s.bucket.grads());
    s.builder.add(span_of(s.host_grads));
    if (!s.worker->iteration_done()) return {};
    s.builder.build(span_of(s.host_params), span_of(s.host_update));  // the mean of the cycle's gradients
    return exchange();
  }

  // Pulls the servers' parameters into the module now (outside a cycle).
  status synchronize() {
    ASHL_TRY(s_->worker->pull());
    ASHL_TRY(s_->worker->wait());
    s_->after_pull();
    return {};
  }

  status report_metric(metric_id m, double v) { return s_->worker->report_metric(m, v); }
  status leave() { return s_->worker->leave(); }

  [[nodiscard]] worker_plan plan() const { return s_->worker->plan(); }
  [[nodiscard]] std::uint32_t batch() const { return s_->worker->batch(); }
  [[nodiscard]] float data_share() const { return plan().data_share; }
  [[nodiscard]] std::uint64_t iterations() const noexcept { return s_->iterations; }
  [[nodiscard]] std::uint64_t commits() const noexcept { return s_->commits; }
  [[nodiscard]] torch_bucket& bucket() noexcept { return s_->bucket; }
  [[nodiscard]] ps::worker<Transport>& worker() noexcept { return *s_->worker; }

 private:
  struct state {
    torch_bucket bucket;
    torch::optim::Optimizer* local;
    torch_update update;
    std::optional<ps::worker<Transport>> worker;
    update_builder builder;  // delta: w0; gradient: the cycle's sum
    // The worker's host buffers: the parameters it pulls into (the bucket
    // itself on the CPU), the gradients the builder reads (the bucket on the
    // CPU) and the update it commits; pinned copies for CUDA tensors.
    torch::Tensor host_params, host_grads, host_update;
    std::uint64_t iterations = 0, commits = 0;
    state(torch_bucket b, torch::optim::Optimizer* l, torch_update u)
        : bucket(std::move(b)), local(l), update(u),
          builder(static_cast<update_kind>(u), bucket.size()) {}

    // The servers' parameters arrived in host_params: into the module, and
    // the builder's next cycle starts from them.
    void after_pull() {
      if (bucket.is_cuda()) bucket.params().copy_(host_params);
      builder.pulled(span_of(host_params));
    }
  };

  explicit torch_worker(std::unique_ptr<state> s) : s_(std::move(s)) {}

  static std::span<float> span_of(const torch::Tensor& t) {
    return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())};
  }

  status exchange() {
    state& s = *s_;
    ASHL_TRY(s.worker->commit(span_of(s.host_update)));
    ASHL_TRY(s.worker->wait());  // the servers' parameters are in the (host) bucket now
    s.after_pull();
    ++s.commits;
    return {};
  }

  std::unique_ptr<state> s_;
};

}  // namespace adapt
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_TORCH()
