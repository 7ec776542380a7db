// ashl/compress/cuda/error_feedback.cuh — the error-feedback decorator on the
// device: a wrapper around a device codec that owns its device residuals.
//
//   compress::cuda::error_feedback<compress::topk> ef{compress::topk{0.01}};
//   ASHL_TRY(ef.reserve(ctx.tensor, n, stream));          // optional: no allocation on the hot path
//   compress::cuda::device_output out{.bytes = {d_buf, ef.max_encoded_bytes(n, dtype::f32)}};
//   compress::cuda::device_scratch scratch{};
//   ASHL_TRY(compress::cuda::encode(ef, x, out, ctx, scratch, d_report, stream));   // size query
//   // ... scratch.data = a buffer of scratch.bytes, then the same call runs
//   // the server: compress::topk{}.decode_add(payload, {n, dtype::f32}, acc, 1, ctx) (host or device)
//
// compress/error_feedback.hpp on the GPU: per tensor id (ctx.tensor) an f32
// residual e, and e <- (x + e) - C(x + e); what is sent is C(x + e), the
// inner codec's payload of f32 input (so the header's dtype is f32 whatever
// the gradient's), max_encoded_bytes(n, t) = inner.max_encoded_bytes(n, f32).
// Payloads and residuals equal the host decorator's bit for bit for the same
// inputs and contexts, by the route each inner codec takes:
//   - fused (sign, qsgd, terngrad, natural, randomk): the inner codec's
//     device_impl::encode_error_feedback forms x + e and subtracts what its
//     decoder would add back inside its own kernels;
//   - sparse pairs (topk, topk_sampled, threshold): e += x, the inner encode
//     of e, then e[index] += -1 * value for the pairs written (the count is
//     read on the device, so data-dependent sizes need no host sync);
//   - the rest (identity, fp16, bf16): e += x, the inner encode of e, then
//     the inner decode_add of that payload into e with scale -1, exactly as
//     the host decorator does. fp16/bf16 in strict mode are refused
//     (`error_feedback.inner.strict`): the host keeps x + e on an overflow,
//     which the device cannot know without synchronizing.
// A refused input (a non-finite bucket scale; its fault in the report)
// leaves x + e in the residual, as on the host. Residuals are allocated with
// cudaMallocAsync on the stream of a tensor's first encode (or reserve());
// move-only; not thread-safe across tensors. The stateless codecs are models
// of cuda::device_codec, and so is this wrapper (static_assert below).
// docs/algorithms.md §4 (decorators); docs/design.md "Codec".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/error_feedback.cuh needs nvcc; use ashl/compress/error_feedback.hpp on the host"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/concepts.cuh>
#include <ashl/compress/cuda/decorator.cuh>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/kernels/residual.cuh>
#include <ashl/compress/cuda/dispatch/state.cuh>
#include <ashl/compress/cuda/dispatch/launch.cuh>
#include <ashl/compress/cuda/identity.cuh>
#include <ashl/compress/layout.hpp>
#include <ashl/compress/registry.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/wire/ids.hpp>

#include <cuda_runtime.h>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda {

// C's device implementation folds error feedback into its own kernels.
template <class C>
concept fused_error_feedback =
    requires(const C& c, device_view<const float> x, device_view<float> e, device_output& out,
             const codec_context& ctx, device_scratch& scratch, device_report* report, cudaStream_t stream) {
      { device_impl<C>::encode_error_feedback(c, x, e, out, ctx, scratch, report, stream) } -> std::same_as<status>;
    };

namespace detail {

// The scratch a step will need (the inner encode of f32, and for the generic
// route the inner decode too), without touching any residual.
template <class C>
status error_feedback_size_query(C& inner, std::size_t n, device_output& out, const codec_context& ctx,
                                 device_scratch& scratch, cudaStream_t stream) {
  const device_view<const float> probe(nullptr, n);
  device_scratch q{};
  if constexpr (fused_error_feedback<C>) {
    ASHL_TRY(device_impl<C>::encode_error_feedback(inner, probe, device_view<float>(nullptr, n), out, ctx, q, nullptr,
                                                   stream));
    scratch.bytes = q.bytes;
    return {};
  } else {
    ASHL_TRY(device_impl<C>::encode(inner, probe, out, ctx, q, nullptr, stream));
    std::size_t bytes = q.bytes;
    if constexpr (!sparse_pair_codec<C>) {
      device_scratch d{};
      ASHL_TRY(device_impl<C>::decode_add(inner, device_view<const std::byte>(nullptr, out.used), {n, dtype::f32},
                                          device_view<float>(nullptr, n), -1.0f, ctx, d, nullptr, stream));
      if (d.bytes > bytes) bytes = d.bytes;
    }
    scratch.bytes = bytes;
    return {};
  }
}

}  // namespace detail

// One error-feedback step on the device, on a residual the caller owns: the
// body of the decorator below (which keeps one residual per tensor id) and
// of ps::device_worker (one residual over its shards). e <- e + x;
// out <- C(e); e <- e - C(e) by the inner codec's route (see above), all on
// `stream`, with no host synchronization and no allocation. With
// scratch.data == nullptr only the sizes are set (scratch.bytes, out.used)
// and e is not touched. `report` gets the encode's faults, `decode_report`
// (may be null) those of the generic route's decode.
template <device_codec C, gradient_element T>
status error_feedback_step(C& inner, device_view<const T> x, device_view<float> e, device_output& out,
                           const codec_context& ctx, device_scratch& scratch, device_report* report,
                           device_report* decode_report, cudaStream_t stream) {
  const std::size_t n = x.size();
  if constexpr (requires { inner.options().strict; }) {
    if (inner.options().strict)
      return invalid_argument("error_feedback.inner.strict", "true",
                              "a strict cast cannot keep x + e on overflow without a host synchronization");
  }
  if (scratch.data == nullptr) return detail::error_feedback_size_query(inner, n, out, ctx, scratch, stream);
  if (e.size() != n)
    return invalid_argument("error_feedback.residual.size", e.size(), "must equal the input's " + std::to_string(n));
  if constexpr (fused_error_feedback<C>) {
    return device_impl<C>::encode_error_feedback(inner, x, e, out, ctx, scratch, report, stream);
  } else {
    float* const r = e.data();
    detail::launch_env env;
    ASHL_TRY(detail::current_launch_env("error_feedback", env));
    const int ipt = env.items_per_thread();
    ASHL_TRY(detail::cuda_check(detail::launch_residual_add(x.data(), r, n, env.block(), ipt, env.grid(n, ipt), stream),
                                "error_feedback.residual_add"));
    ASHL_TRY(device_impl<C>::encode(inner, device_view<const float>(r, n), out, ctx, scratch, report, stream));
    if constexpr (sparse_pair_codec<C>) {
      // e[index] -= value for the pairs written; the count is read on the
      // device, so a data-dependent size needs no host synchronization.
      const std::uint64_t capacity =
          (inner.max_encoded_bytes(n, dtype::f32) - layout::sparse::header_bytes) / (4 + 4);
      if (capacity == 0) return {};
      detail::residual_sparse_subtract_kernel<<<env.grid(capacity, ipt), env.block(), 0, stream>>>(
          out.bytes.data(), r, nullptr, capacity, ipt);
      return detail::cuda_check(cudaGetLastError(), "error_feedback.subtract");
    } else {
      // The inner decoder's own scale -1 add; its scratch fits in the
      // encode's (the size query takes the larger of the two).
      device_scratch dscratch{scratch.data, scratch.bytes};
      return device_impl<C>::decode_add(inner, device_view<const std::byte>(out.bytes.data(), out.used),
                                        {n, dtype::f32}, e, -1.0f, ctx, dscratch, decode_report, stream);
    }
  }
}

template <device_codec C>
class error_feedback : public detail::device_decorator<error_feedback<C>, C, 1> {  // state: the residual e
  using base = detail::device_decorator<error_feedback<C>, C, 1>;
  using base::inner_;
  using base::state_;

 public:
  static constexpr const char* name = "error_feedback";

  error_feedback() = default;
  explicit error_feedback(C inner) : base(std::move(inner)) {}
  using base::inner;
  // The inner codec may be replaced between encodes; the residuals are kept.
  C& inner() noexcept { return inner_; }

  // The residual of `tensor` (device memory; empty if never encoded).
  [[nodiscard]] device_view<const float> residual(std::uint32_t tensor) const noexcept {
    return state_.view(tensor, 0);
  }

 private:
  friend struct device_impl<error_feedback<C>>;
};

template <class C>
struct device_impl<error_feedback<C>> : detail::decorator_decode<error_feedback<C>> {
  template <gradient_element T>
  static status encode(error_feedback<C>& ef, device_view<const T> x, device_output& out, const codec_context& ctx,
                       device_scratch& scratch, device_report* report, cudaStream_t stream) {
    const std::size_t n = x.size();
    // The size query touches no residual: none is allocated for it.
    if (scratch.data == nullptr)
      return error_feedback_step(ef.inner_, x, device_view<float>(nullptr, n), out, ctx, scratch, report, nullptr,
                                 stream);
    std::array<float*, 1> arrays{};
    ASHL_TRY(ef.state_.slot(ctx.tensor, n, stream, "error_feedback", arrays));
    return error_feedback_step(ef.inner_, x, device_view<float>(arrays[0], n), out, ctx, scratch, report, nullptr,
                               stream);
  }
};

static_assert(device_codec<error_feedback<compress::identity>>);

}  // namespace compress::cuda
ASHL_NAMESPACE_END
