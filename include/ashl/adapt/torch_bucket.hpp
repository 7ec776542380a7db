// ashl/adapt/torch_bucket.hpp — a libtorch module's parameters and
// gradients flattened into buckets, the buffers the C++ adapter
// (adapt/torch.hpp) exchanges: after create() every parameter's data and
// grad are views into its bucket (as PyTorch DDP's gradient_as_bucket_view),
// so a step copies nothing into the model; and torch_update, the kind of
// update a bucket commits.
//
//   auto buckets = ashl::adapt::torch_buckets(*net);     // result<std::vector<torch_bucket>>, "auto" cap
//   auto one = ashl::adapt::torch_bucket::create(*net);  // every trainable parameter in one bucket
//   one->host_params();                                   // float32 host memory a ps::worker pulls into
//
// The partition is adapt::plan_buckets's, the rule ashl.torch runs too
// (adapt/update_builder.hpp), so a worker and its servers agree on it.
// docs/torch.md "C++". Compiled only with libtorch (the ashl::torch
// component, ASHL_HAS_TORCH()); without it this header is empty.
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_TORCH()

#include <ashl/adapt/update_builder.hpp>
#include <ashl/core/status.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace adapt {

enum class torch_update : std::uint8_t { delta = 0, gradient = 1 };

static_assert(static_cast<int>(torch_update::delta) == static_cast<int>(update_kind::delta) &&
              static_cast<int>(torch_update::gradient) == static_cast<int>(update_kind::gradient));

// One bucket: parameters of one dtype (float32, float16 or bfloat16) and
// device flattened into one buffer, their gradients into another; after
// create() every parameter's data and grad are views into them. Values are
// kept. Moves keep the views (the buffers are tensors).
//
// The worker reads and writes float32 host memory: host_params() (what it
// pulls into), host_grads() (what the builder reads) and send() (what it
// commits). For a float32 CPU bucket host_params() and host_grads() are
// params() and grads() themselves (zero copy); for a 16-bit or CUDA bucket
// they are float32 staging copies (pinned for CUDA): stage_in() after a
// pull, stage_params_out() / stage_grads_out() before a build (Python's
// ashl.torch.Bucket, the same buffers).
class torch_bucket {
 public:
  // Every trainable parameter of `m` (tied ones once), in registration
  // order, one dtype and device.
  static result<torch_bucket> create(torch::nn::Module& m) {
    auto [ts, names] = trainable(m);
    return create(std::move(ts), std::move(names));
  }

  // names[i] names tensors[i] in errors (default: its index). Tied tensors
  // (one tensor given twice) own one slot, at their first registration.
  static result<torch_bucket> create(std::vector<torch::Tensor> tensors, std::vector<std::string> names = {}) {
    if (tensors.empty()) return invalid_argument("torch.parameters.size", 0, "needs at least one parameter");
    untie(tensors, names);
    std::vector<std::vector<piece>> plan(1);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const torch::Tensor& p = tensors[i];
      const std::string field = "torch.parameter[" + names[i] + "]";
      ASHL_TRY(check(p, field));
      if (p.scalar_type() != tensors[0].scalar_type())
        return invalid_argument(field + ".dtype", std::string(c10::toString(p.scalar_type())),
                                "differs from the first parameter's " +
                                    std::string(c10::toString(tensors[0].scalar_type())) + " (one bucket holds one)");
      if (p.device() != tensors[0].device())
        return invalid_argument(field + ".device", p.device().str(),
                                "differs from the first parameter's " + tensors[0].device().str());
      plan[0].push_back({tensors[i], names[i], 0, p.numel()});
    }
    auto bs = alias(std::move(plan));
    return std::move(bs[0]);
  }

  // A bucket's share of a parameter: elements [begin, begin + size) of the
  // flattened tensor (adapt::bucket_piece).
  struct piece {
    torch::Tensor tensor;
    std::string name;
    std::int64_t begin = 0, size = 0;
  };

  // The buckets of a plan (adapt::plan_buckets' pieces, checked tensors):
  // per dtype and device one flat parameter and one flat gradient storage,
  // laid out in bucket order, each bucket a contiguous range of it; every
  // parameter's data and grad become views into it (keeping their values),
  // a parameter cut across buckets one view over its buckets' ranges (its
  // pieces are consecutive buckets, in element order).
  static std::vector<torch_bucket> alias(std::vector<std::vector<piece>> plan) {
    std::vector<std::pair<torch::ScalarType, torch::Device>> keys;
    std::vector<std::int64_t> filled;                    // per key: elements laid out so far
    std::vector<std::pair<torch::Tensor, torch::Tensor>> storage;  // per key: flat params, grads
    std::vector<std::size_t> key_of(plan.size());
    std::vector<std::int64_t> base(plan.size());
    std::vector<std::pair<const void*, std::int64_t>> flat;  // tensor impl -> its offset in its key's storage
    auto flat_of = [&](const torch::Tensor& t) {
      for (const auto& [impl, off] : flat)
        if (impl == t.unsafeGetTensorImpl()) return off;
      return std::int64_t{-1};
    };
    for (std::size_t b = 0; b < plan.size(); ++b) {
      const auto& t0 = plan[b].front().tensor;
      const std::pair<torch::ScalarType, torch::Device> key{t0.scalar_type(), t0.device()};
      std::size_t k = 0;
      while (k < keys.size() && keys[k] != key) ++k;
      if (k == keys.size()) {
        keys.push_back(key);
        filled.push_back(0);
      }
      key_of[b] = k;
      base[b] = filled[k];
      for (const auto& pc : plan[b]) {
        if (pc.begin == 0) flat.emplace_back(pc.tensor.unsafeGetTensorImpl(), filled[k]);
        filled[k] += pc.size;
      }
    }
    for (std::size_t k = 0; k < keys.size(); ++k) {
      const auto opts = torch::TensorOptions().dtype(keys[k].first).device(keys[k].second);
      storage.emplace_back(torch::empty({filled[k]}, opts), torch::zeros({filled[k]}, opts));
    }
    {
      torch::NoGradGuard no_grad;
      for (std::size_t b = 0; b < plan.size(); ++b)
        for (auto& pc : plan[b]) {
          if (pc.begin != 0) continue;
          torch::Tensor& p = pc.tensor;
          const auto& [fp, fg] = storage[key_of[b]];
          const auto off = flat_of(p);
          auto v = fp.narrow(0, off, p.numel()).view(p.sizes());
          v.copy_(p.detach());
          p.set_data(v);
          auto g = fg.narrow(0, off, p.numel()).view(p.sizes());
          if (p.grad().defined()) g.copy_(p.grad());
          p.mutable_grad() = g;
        }
    }
    std::vector<torch_bucket> out;
    out.reserve(plan.size());
    for (std::size_t b = 0; b < plan.size(); ++b) {
      torch_bucket& bk = out.emplace_back();
      const auto& [fp, fg] = storage[key_of[b]];
      std::int64_t n = 0;
      for (auto& pc : plan[b]) {
        bk.offsets_.push_back(flat_of(pc.tensor));
        bk.pieces_.emplace_back(pc.begin, pc.size);
        bk.tensors_.push_back(std::move(pc.tensor));
        bk.names_.push_back(std::move(pc.name));
        n += pc.size;
      }
      bk.flat_params_ = fp;
      bk.flat_grads_ = fg;
      bk.params_ = fp.narrow(0, base[b], n);
      bk.grads_ = fg.narrow(0, base[b], n);
      const bool cuda = bk.params_.is_cuda();
      const auto host = torch::TensorOptions().dtype(torch::kFloat).pinned_memory(cuda);
      if (bk.staged()) {
        bk.host_params_ = torch::empty({n}, host);
        bk.host_params_.copy_(bk.params_);
        bk.host_grads_ = torch::empty({n}, host);
      } else {
        bk.host_params_ = bk.params_;
        bk.host_grads_ = bk.grads_;
      }
      bk.send_ = torch::empty({n}, host);
    }
    return out;
  }

  [[nodiscard]] const torch::Tensor& params() const noexcept { return params_; }
  [[nodiscard]] const torch::Tensor& grads() const noexcept { return grads_; }
  [[nodiscard]] const torch::Tensor& host_params() const noexcept { return host_params_; }
  [[nodiscard]] const torch::Tensor& host_grads() const noexcept { return host_grads_; }
  [[nodiscard]] const torch::Tensor& send() const noexcept { return send_; }
  [[nodiscard]] std::size_t size() const noexcept { return static_cast<std::size_t>(params_.numel()); }
  [[nodiscard]] const std::vector<torch::Tensor>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] const std::vector<std::string>& names() const noexcept { return names_; }
  // Per tensor, the elements of it this bucket holds (begin, size): the
  // whole tensor unless it is cut across buckets (torch_options::partition_mb).
  [[nodiscard]] const std::vector<std::pair<std::int64_t, std::int64_t>>& pieces() const noexcept { return pieces_; }
  [[nodiscard]] bool is_cuda() const { return params_.is_cuda(); }
  [[nodiscard]] torch::ScalarType dtype() const { return params_.scalar_type(); }
  // A 16-bit or CUDA bucket: the worker's buffers are float32 host copies.
  [[nodiscard]] bool staged() const { return dtype() != torch::kFloat || is_cuda(); }

  // The pulled float32 parameters into a staged bucket (rounded to its dtype).
  void stage_in() {
    if (!staged()) return;
    torch::NoGradGuard no_grad;
    params_.copy_(host_params_);
  }
  void stage_params_out() {
    if (staged()) host_params_.copy_(params_);
  }
  void stage_grads_out() {
    if (staged()) host_grads_.copy_(grads_);
  }

  // Views again where the caller replaced a parameter's data or grad
  // (optimizer.zero_grad(set_to_none), set_data), its values copied in first.
  void attach() {
    torch::NoGradGuard no_grad;
    const auto* pb = static_cast<const char*>(flat_params_.data_ptr());
    const auto* gb = static_cast<const char*>(flat_grads_.data_ptr());
    const auto es = static_cast<std::ptrdiff_t>(params_.element_size());
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      torch::Tensor& p = tensors_[i];
      const auto off = static_cast<std::ptrdiff_t>(offsets_[i]) * es;
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

  // The module's trainable parameters and their names, every registration
  // (tied ones repeated: create() and torch_buckets() keep the first).
  static std::pair<std::vector<torch::Tensor>, std::vector<std::string>> trainable(torch::nn::Module& m) {
    std::vector<std::string> names;
    std::vector<torch::Tensor> ts;
    for (const auto& item : m.named_parameters(/*recurse=*/true)) {
      if (!item.value().requires_grad()) continue;
      names.push_back(item.key());
      ts.push_back(item.value());
    }
    return {std::move(ts), std::move(names)};
  }

  // Tied parameters: the first registration owns the slot
  // (adapt::first_registrations, the Python adapter's rule); names default
  // to indices.
  static void untie(std::vector<torch::Tensor>& tensors, std::vector<std::string>& names) {
    names.resize(tensors.size());
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i].empty()) names[i] = std::to_string(i);
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

  // What a bucket takes: a defined, contiguous float32/float16/bfloat16 tensor.
  static status check(const torch::Tensor& p, const std::string& field) {
    if (!p.defined()) return invalid_argument(field, "undefined", "is not a tensor");
    const auto d = p.scalar_type();
    if (d != torch::kFloat && d != torch::kHalf && d != torch::kBFloat16)
      return invalid_argument(field + ".dtype", std::string(c10::toString(d)),
                              "must be float32, float16 or bfloat16");
    if (!p.is_contiguous())
      return invalid_argument(field + ".stride", stride_text(p), "must be contiguous (shape " + shape_text(p) + ")");
    return {};
  }

 private:
  // Tensor i's whole view (over every bucket it is cut across).
  torch::Tensor param_view(const torch::Tensor& p, std::size_t i) const {
    return flat_params_.narrow(0, offsets_[i], p.numel()).view(p.sizes());
  }
  torch::Tensor grad_view(const torch::Tensor& p, std::size_t i) const {
    return flat_grads_.narrow(0, offsets_[i], p.numel()).view(p.sizes());
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

  torch::Tensor params_, grads_;            // this bucket's range of the flat storage
  torch::Tensor flat_params_, flat_grads_;  // its dtype's and device's, shared by its buckets
  torch::Tensor host_params_, host_grads_, send_;
  std::vector<torch::Tensor> tensors_;
  std::vector<std::string> names_;
  std::vector<std::int64_t> offsets_;  // per tensor: where it starts in the flat storage
  std::vector<std::pair<std::int64_t, std::int64_t>> pieces_;
};

// The buckets a worker and its servers make of a model (they must agree;
// adapt::plan_buckets, the rule ashl.torch.bucket_plan runs): the
// parameters that own a slot, in reverse registration order, one dtype and
// device per bucket, at most bucket_cap_bytes(model bytes, cap_mb) each; a
// parameter of more than partition_mb MiB cut into pieces across
// consecutive buckets (infinity: not cut), another larger than the cap
// alone; cap_mb nullopt: "auto"; 0: one bucket per dtype and device,
// nothing cut. partition_mb must be > 0.
inline result<std::vector<torch_bucket>> torch_buckets(std::vector<torch::Tensor> tensors,
                                                       std::vector<std::string> names = {},
                                                       std::optional<double> cap_mb = std::nullopt,
                                                       double partition_mb = default_partition_mb) {
  if (cap_mb && !(*cap_mb >= 0.0)) return invalid_argument("torch.bucket_cap_mb", *cap_mb, "must be >= 0 (or auto)");
  if (!valid_partition_mb(partition_mb))
    return invalid_argument("torch.partition_mb", partition_mb, "must be > 0 MiB (infinity: no partitioning)");
  if (tensors.empty()) return invalid_argument("torch.parameters.size", 0, "needs at least one parameter");
  torch_bucket::untie(tensors, names);
  std::vector<std::string> keys;  // dtype@device, the Python adapter's key
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    ASHL_TRY(torch_bucket::check(tensors[i], "torch.parameter[" + names[i] + "]"));
    keys.push_back(std::string(c10::toString(tensors[i].scalar_type())) + "@" + tensors[i].device().str());
    total += static_cast<std::uint64_t>(tensors[i].numel()) * tensors[i].element_size();
  }
  const auto groups = plan_buckets(
      tensors.size(), [&](std::size_t i) { return keys[i]; },
      [&](std::size_t i) { return static_cast<std::uint64_t>(tensors[i].numel()) * tensors[i].element_size(); },
      [&](std::size_t i) { return static_cast<std::uint64_t>(tensors[i].numel()); }, bucket_cap_bytes(total, cap_mb),
      partition_bytes(partition_mb));
  std::vector<std::vector<torch_bucket::piece>> plan;
  for (const auto& g : groups) {
    auto& b = plan.emplace_back();
    for (const auto& pc : g)
      b.push_back({tensors[pc.slot], names[pc.slot], static_cast<std::int64_t>(pc.begin),
                   static_cast<std::int64_t>(pc.size)});
  }
  return torch_bucket::alias(std::move(plan));
}

inline result<std::vector<torch_bucket>> torch_buckets(torch::nn::Module& m,
                                                       std::optional<double> cap_mb = std::nullopt,
                                                       double partition_mb = default_partition_mb) {
  auto [ts, names] = torch_bucket::trainable(m);
  return torch_buckets(std::move(ts), std::move(names), cap_mb, partition_mb);
}

}  // namespace adapt
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_TORCH()
