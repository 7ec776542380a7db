// ashl/compress/cuda/dispatch/dispatch_natural.cuh — launch logic of natural
// compression on the device.
//
//   ASHL_TRY(detail::fused_encode(detail::fused_tag{}, compress::natural{}, d_scratch, bytes, x, out, used, ctx,
//                                 residual, stream, d_report));
//
// Two passes: max |x| (one atomicMax per warp into scratch), then header and
// codes, one Philox block per four elements. Error feedback: a residual add
// pass first, and the subtraction inside the code pass. The payload size,
// 12 + n, is known on the host; a non-finite input is recorded in the device
// report (the CPU codec's "natural.input.max_abs" error). docs/algorithms.md §4.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cuda/concepts.cuh>
#include <ashl/compress/natural.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/launch.cuh>
#include <ashl/compress/cuda/dispatch/kernels/natural.cuh>
#include <ashl/compress/cuda/dispatch/kernels/residual.cuh>
#include <ashl/compress/cuda/dispatch/tuning/tuning.cuh>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/status.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

// `residual` non-null: error feedback; x is added into it first and the
// codes are made from it (as f32).
template <class T>
status fused_encode(fused_tag, const compress::natural&, void* d_scratch, std::size_t& scratch_bytes,
                    device_view<const T> x, device_view<std::byte> out, std::size_t& used_bytes,
                    const codec_context& ctx, float* residual, cudaStream_t stream, device_report* d_report) {
  const std::size_t n = x.size();
  used_bytes = layout::natural_payload_bytes(n);
  return encode_skeleton(
      "natural", d_scratch, scratch_bytes, out, used_bytes, d_report, stream,
      [&](scratch_carver& c) { return c.take<std::uint32_t>(1); },
      [&](std::uint32_t* max_key, device_report* verdict, const launch_env& env) -> status {
        const int bt = env.block();
        const int ipt = env.items_per_thread();
        const unsigned grid = env.grid(n, ipt);
        ASHL_TRY(cuda_check(cudaMemsetAsync(max_key, 0, sizeof(std::uint32_t), stream), "natural.memset"));
        const philox_stream rng(ctx.seed, ctx.step, ctx.tensor);
        const unsigned cgrid = env.grid((n + 3) / 4);
        if (residual != nullptr) {
          ASHL_TRY(cuda_check(launch_residual_add(x.data(), residual, n, bt, ipt, grid, stream),
                              "natural.residual_add"));
          const float* xf = residual;
          if (n != 0) max_key_kernel<float><<<grid, bt, 0, stream>>>(xf, n, max_key, ipt);
          natural_codes_kernel<float><<<cgrid, bt, 0, stream>>>(xf, n, max_key, out.data(), rng, residual, verdict);
        } else {
          if (n != 0) max_key_kernel<T><<<grid, bt, 0, stream>>>(x.data(), n, max_key, ipt);
          natural_codes_kernel<T><<<cgrid, bt, 0, stream>>>(x.data(), n, max_key, out.data(), rng, nullptr, verdict);
        }
        return {};
      });
}

inline status fused_decode_add(fused_tag, const compress::natural&, void* d_scratch, std::size_t& scratch_bytes,
                               device_view<const std::byte> in, payload_info info, device_view<float> acc,
                               float scale, cudaStream_t stream, device_report* d_report) {
  return decode_skeleton("natural", d_scratch, scratch_bytes, in, info, acc, scale, layout::natural::header_bytes,
                         d_report, stream, [&](device_report* verdict, const launch_env& env) -> status {
                           const std::size_t n = info.count;
                           natural_validate_header_kernel<<<1, 1, 0, stream>>>(in.data(), in.size(), n, verdict);
                           if (n != 0) {
                             const unsigned grid = env.grid(n, env.items_per_thread());
                             natural_validate_codes_kernel<<<grid, env.block(), 0, stream>>>(in.data(), n, verdict);
                             natural_add_kernel<<<grid, env.block(), 0, stream>>>(in.data(), acc.data(), n, scale,
                                                                                 verdict);
                           }
                           return {};
                         });
}

static_assert(device_codec<compress::natural>);  // through fused_feedback_impl (cuda/concepts.cuh)

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
