// ashl/compress/cuda/dgc.cuh — Deep Gradient Compression on the device:
// momentum correction and masking around a device sparsifier.
//
//   compress::cuda::dgc<compress::topk> d{compress::topk{0.001}, {.momentum = 0.9f}};
//   ASHL_TRY(d.reserve(ctx.tensor, n, stream));            // optional: no allocation on the hot path
//   compress::cuda::device_output out{.bytes = {d_buf, d.max_encoded_bytes(n, dtype::f32)}};
//   compress::cuda::device_scratch scratch{};
//   ASHL_TRY(compress::cuda::encode(d, g, out, ctx, scratch, d_report, stream));    // size query, then run
//   // the server: compress::topk{}.decode_add(payload, {n, dtype::f32}, acc, lr, ctx)
//
// compress/dgc.hpp on the GPU (Lin et al., ICLR'18). Per tensor id the
// wrapper owns a momentum u and an accumulated velocity v in device memory:
//   u <- m u + g;  v <- v + u;  send C(v);  u_i = v_i = 0 at every sent i.
// One kernel does the update (one rounding per operation, as the CPU loop
// is written), the inner device codec (topk, topk_sampled or threshold: the
// sparse-pair payload) encodes v as f32, and a second kernel clears the sent
// coordinates, reading the count and indices from the payload on the device,
// so the data-dependent count of threshold and topk_sampled needs no host
// synchronization. Payloads and state equal the host decorator's for the
// same inputs and contexts. As on the host, an error of the inner encode
// (a too small buffer, say) leaves g accumulated in u and v and masks
// nothing. State is allocated with cudaMallocAsync on the stream of a
// tensor's first encode (or reserve()); move-only. docs/algorithms.md §4
// (decorators).
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/dgc.cuh needs nvcc; use ashl/compress/dgc.hpp on the host"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/concepts.cuh>
#include <ashl/compress/cuda/decorator.cuh>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/kernels/residual.cuh>
#include <ashl/compress/cuda/dispatch/state.cuh>
#include <ashl/compress/cuda/dispatch/launch.cuh>
#include <ashl/compress/cuda/topk.cuh>
#include <ashl/compress/dgc.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/compress/registry.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/wire/ids.hpp>

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda {

template <class C>
  requires device_codec<C> && sparse_pair_codec<C>
class dgc : public detail::device_decorator<dgc<C>, C, 2> {  // state: momentum u, velocity v
  using base = detail::device_decorator<dgc<C>, C, 2>;
  using base::state_;

 public:
  static constexpr const char* name = "dgc";

  dgc() = default;
  explicit dgc(C inner, dgc_options o = {}) : base(std::move(inner)), opt_(o) {}
  [[nodiscard]] const dgc_options& options() const noexcept { return opt_; }

  [[nodiscard]] status validate() const { return opt_.validate(); }

  // u (momentum) and v (accumulated velocity) of `tensor`; empty if never encoded.
  [[nodiscard]] device_view<const float> momentum(std::uint32_t tensor) const noexcept { return state_.view(tensor, 0); }
  [[nodiscard]] device_view<const float> velocity(std::uint32_t tensor) const noexcept { return state_.view(tensor, 1); }

 private:
  friend struct device_impl<dgc<C>>;
  dgc_options opt_{};
};

template <class C>
struct device_impl<dgc<C>> : detail::decorator_decode<dgc<C>> {
  template <gradient_element T>
  static status encode(dgc<C>& d, device_view<const T> g, device_output& out, const codec_context& ctx,
                       device_scratch& scratch, device_report* report, cudaStream_t stream) {
    ASHL_TRY(d.validate());
    const std::size_t n = g.size();
    if (scratch.data == nullptr)
      return device_impl<C>::encode(d.inner_, device_view<const float>(nullptr, n), out, ctx, scratch, report, stream);
    std::array<float*, 2> uv{};
    ASHL_TRY(d.state_.slot(ctx.tensor, n, stream, "dgc", uv));
    float* const u = uv[0];
    float* const v = uv[1];
    detail::launch_env env;
    ASHL_TRY(detail::current_launch_env("dgc", env));
    const int ipt = env.items_per_thread();
    if (n != 0) {
      detail::dgc_momentum_kernel<T><<<env.grid(n, ipt), env.block(), 0, stream>>>(g.data(), u, v, n, d.opt_.momentum,
                                                                                    ipt);
      ASHL_TRY(detail::cuda_check(cudaGetLastError(), "dgc.momentum_kernel"));
    }
    ASHL_TRY(device_impl<C>::encode(d.inner_, device_view<const float>(v, n), out, ctx, scratch, report, stream));
    const std::uint64_t capacity = (out.used - layout::sparse::header_bytes) / (4 + 4);
    if (capacity == 0) return {};
    detail::sparse_mask_kernel<<<env.grid(capacity, ipt), env.block(), 0, stream>>>(out.bytes.data(), u, v, capacity,
                                                                                  ipt);
    return detail::cuda_check(cudaGetLastError(), "dgc.mask_kernel");
  }
};

static_assert(device_codec<dgc<compress::topk>>);

}  // namespace compress::cuda
ASHL_NAMESPACE_END
