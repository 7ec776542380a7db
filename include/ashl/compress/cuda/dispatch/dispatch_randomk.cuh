// ashl/compress/cuda/dispatch/dispatch_randomk.cuh — launch logic of random-k
// on the device: host checks, the two-call scratch protocol, grid sizing.
//
//   ASHL_TRY(detail::dispatch_randomk_encode(c, d_scratch, bytes, x, out, used, ctx, nullptr, stream));
//   ASHL_TRY(detail::dispatch_randomk_decode_add(d_scratch, bytes, in, info, acc, scale, ctx, stream, d_report));
//
// k, and so the payload size, is known on the host: encode needs no scratch
// and no device-side decision. Decode validates the header on the device
// (its fields are in device memory) and adds nothing when it is malformed.
// docs/algorithms.md §4.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/launch.cuh>
#include <ashl/compress/cuda/dispatch/kernels/randomk.cuh>
#include <ashl/compress/cuda/dispatch/kernels/residual.cuh>
#include <ashl/compress/cuda/dispatch/tuning/tuning.cuh>
#include <ashl/compress/randomk.hpp>
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

inline constexpr std::size_t small_scratch_bytes = scratch_carver::alignment;

// `residual` non-null: x is the residual itself (error feedback) and the
// gather also subtracts what it sent.
template <class T>
status dispatch_randomk_encode(const compress::randomk& c, void* d_scratch, std::size_t& scratch_bytes,
                               device_view<const T> x, device_view<std::byte> out, std::size_t& used_bytes,
                               const codec_context& ctx, float* residual, cudaStream_t stream) {
  ASHL_TRY(c.validate());
  const std::size_t n = x.size();
  if (n > layout::randomk::max_elements) return out_of_range("randomk.input.size", n, "exceeds 2^32 (the count is u32)");
  const std::size_t k = c.k_for(n);
  const std::size_t need = layout::randomk::header_bytes + k * sizeof(T);
  used_bytes = need;
  auto go = scratch_protocol("randomk", d_scratch, scratch_bytes, small_scratch_bytes);
  if (!go) return go.error();
  if (!*go) return {};
  if (out.size() < need)
    return make_error(errc::buffer_too_small, "randomk.out.size", out.size(),
                      "bytes, fewer than max_encoded_bytes = " + std::to_string(need));
  device_properties dev;
  ASHL_TRY(cuda_check(current_device(dev), "randomk.device"));
  const auto ew = tuning_for(dev.cc_major, dev.cc_minor).elementwise;
  const bool unbiased = c.options().unbiased;
  randomk_header_kernel<<<1, 1, 0, stream>>>(out.data(), n, static_cast<std::uint32_t>(k), unbiased ? 1 : 0,
                                             ctx.seed);
  if (k != 0)
    randomk_gather_kernel<T>
        <<<grid_for(k, ew.block_threads, ew.items_per_thread, dev.sm_count, ew.blocks_per_sm), ew.block_threads, 0,
           stream>>>(x.data(), out.data(), n, k, philox_stream(ctx.seed, ctx.step, ctx.tensor), residual, unbiased,
                     ew.items_per_thread);
  return cuda_check(cudaGetLastError(), "randomk.encode_kernels");
}

template <class T>
status dispatch_randomk_encode_error_feedback(const compress::randomk& c, void* d_scratch, std::size_t& scratch_bytes,
                                              device_view<const T> x, device_view<float> residual,
                                              device_view<std::byte> out, std::size_t& used_bytes,
                                              const codec_context& ctx, cudaStream_t stream) {
  if (d_scratch != nullptr && residual.size() != x.size())
    return invalid_argument("randomk.residual.size", residual.size(),
                            "must equal the input size " + std::to_string(x.size()));
  if (d_scratch != nullptr) {
    // Checked before the residual changes, so an error leaves it as it was.
    std::size_t probe = scratch_bytes, probe_used = 0;
    ASHL_TRY(dispatch_randomk_encode<float>(c, nullptr, probe, device_view<const float>(residual.data(), x.size()), out,
                                            probe_used, ctx, nullptr, stream));
    if (out.size() < probe_used)
      return make_error(errc::buffer_too_small, "randomk.out.size", out.size(),
                        "bytes, fewer than max_encoded_bytes = " + std::to_string(probe_used));
    if (scratch_bytes < probe)
      return make_error(errc::buffer_too_small, "randomk.scratch_bytes", scratch_bytes,
                        "fewer than the size query's " + std::to_string(probe));
    device_properties dev;
    ASHL_TRY(cuda_check(current_device(dev), "randomk.device"));
    const auto ew = tuning_for(dev.cc_major, dev.cc_minor).elementwise;
    ASHL_TRY(cuda_check(launch_residual_add(x.data(), residual.data(), x.size(), ew.block_threads, ew.items_per_thread,
                                            grid_for(x.size(), ew.block_threads, ew.items_per_thread, dev.sm_count,
                                                     ew.blocks_per_sm),
                                            stream),
                        "randomk.residual_add"));
  }
  return dispatch_randomk_encode<float>(c, d_scratch, scratch_bytes,
                                        device_view<const float>(residual.data(), x.size()), out, used_bytes, ctx,
                                        residual.data(), stream);
}

inline status dispatch_randomk_decode_add(void* d_scratch, std::size_t& scratch_bytes, device_view<const std::byte> in,
                                          payload_info info, device_view<float> acc, float scale,
                                          const codec_context& ctx, cudaStream_t stream, device_report* d_report) {
  return decode_skeleton(
      "randomk", d_scratch, scratch_bytes, in, info, acc, scale, layout::randomk::header_bytes, d_report, stream,
      [&](device_report* verdict, const launch_env& env) -> status {
        const std::size_t vs = size_of(info.type);
        const std::uint64_t max_k = (in.size() - layout::randomk::header_bytes) / vs;
        randomk_validate_kernel<<<1, 1, 0, stream>>>(in.data(), in.size(), info.count, vs, verdict);
        if (max_k == 0) return {};
        const unsigned grid = env.grid(max_k, env.items_per_thread());
        const int bt = env.block(), ipt = env.items_per_thread();
        switch (info.type) {
          case dtype::f32:
            randomk_add_kernel<dtype::f32><<<grid, bt, 0, stream>>>(in.data(), acc.data(), scale, ctx.step,
                                                                    ctx.tensor, verdict, max_k, ipt);
            break;
          case dtype::f16:
            randomk_add_kernel<dtype::f16><<<grid, bt, 0, stream>>>(in.data(), acc.data(), scale, ctx.step,
                                                                    ctx.tensor, verdict, max_k, ipt);
            break;
          default:
            randomk_add_kernel<dtype::bf16><<<grid, bt, 0, stream>>>(in.data(), acc.data(), scale, ctx.step,
                                                                     ctx.tensor, verdict, max_k, ipt);
            break;
        }
        return {};
      });
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
