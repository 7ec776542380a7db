// ashl/compress/cuda/randomk.cuh — random-k on the device.
//
//   compress::randomk c{{.ratio = 0.01, .unbiased = true}};
//   compress::codec_context ctx{.seed = s, .step = t, .tensor = id};
//   compress::cuda::device_output out{.bytes = d_out};
//   compress::cuda::device_scratch scratch{};                               // size query first
//   ASHL_TRY(compress::cuda::encode(c, x, out, ctx, scratch, d_report, stream));
//   // ... scratch.data = a buffer of scratch.bytes, then the same call runs
//   ASHL_TRY(compress::cuda::decode_add(c, payload, {n, dtype::f32}, acc, 1.0f, ctx,
//                                       scratch2, d_report, stream));
//
// The payload of compress/randomk.hpp, byte for byte, for the same input and
// codec_context: u64 n, u32 k, u8 flags, u64 seed, the k stratum values in the
// input dtype (f32 for error feedback, as the CPU decorator sends). Indices
// come from the same Philox words (lanes 0 and 1 of philox_stream(seed, step,
// tensor)), so the size, 21 + k * sizeof(T), is known on the host. Decode
// regenerates the indices from the payload's seed and ctx.step / ctx.tensor,
// validates the header on the device, and adds nothing when it is malformed
// (fault in d_report). Error feedback (cuda::error_feedback<randomk>, through
// device_impl::encode_error_feedback): one pass forms y = e + x in e, the
// gather sends y at the k indices and removes there exactly what the CPU
// decoder would add back with scale -1. Device views; payload buffers 4-byte
// aligned; two-call scratch pattern; asynchronous on `stream`, no host
// synchronization, graph capturable. docs/algorithms.md §4; docs/wire-format.md,
// "Codec payloads / randomk".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/randomk.cuh needs nvcc; use ashl/compress/randomk.hpp on the host"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/concepts.cuh>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/dispatch_randomk.cuh>
#include <ashl/compress/randomk.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cuda_runtime.h>

#include <cstddef>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda {

template <>
struct device_impl<compress::randomk> {
  // The report is not used: randomk's encode has nothing to refuse.
  template <gradient_element T>
  static status encode(const compress::randomk& c, device_view<const T> x, device_output& out, const codec_context& ctx,
                       device_scratch& scratch, device_report*, cudaStream_t stream) {
    return detail::run_known_size("randomk", out, scratch, stream, [&](void* s, std::size_t& b, std::size_t& used) {
      return detail::dispatch_randomk_encode<T>(c, s, b, x, out.bytes, used, ctx, nullptr, stream);
    });
  }

  // e <- (x + e) - C(x + e): one pass forms y = e + x in e, the gather sends
  // y at the k indices and removes there what the CPU decoder would add back
  // with scale -1. cuda::error_feedback<randomk> calls it.
  template <gradient_element T>
  static status encode_error_feedback(const compress::randomk& c, device_view<const T> x, device_view<float> residual,
                                      device_output& out, const codec_context& ctx, device_scratch& scratch,
                                      device_report*, cudaStream_t stream) {
    return detail::run_known_size("randomk", out, scratch, stream, [&](void* s, std::size_t& b, std::size_t& used) {
      return detail::dispatch_randomk_encode_error_feedback<T>(c, s, b, x, residual, out.bytes, used, ctx, stream);
    });
  }

  // Indices come from the payload's seed and ctx.step / ctx.tensor.
  static status decode_add(const compress::randomk&, device_view<const std::byte> in, payload_info info,
                           device_view<float> acc, float scale, const codec_context& ctx, device_scratch& scratch,
                           device_report* report, cudaStream_t stream) {
    return detail::dispatch_randomk_decode_add(scratch.data, scratch.bytes, in, info, acc, scale, ctx, stream, report);
  }
};

static_assert(device_codec<compress::randomk>);

}  // namespace compress::cuda
ASHL_NAMESPACE_END
