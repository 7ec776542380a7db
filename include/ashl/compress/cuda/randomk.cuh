// ashl/compress/cuda/randomk.cuh — random-k on the device.
//
//   compress::randomk c{{.ratio = 0.01, .unbiased = true}};
//   compress::codec_context ctx{.seed = job_seed, .step = t, .tensor = id};
//   std::size_t scratch = 0, used = 0;
//   compress::cuda::encode(c, nullptr, scratch, x, out, used, ctx, stream);           // size query
//   ASHL_TRY(compress::cuda::encode(c, d_scratch, scratch, x, out, used, ctx, stream));
//   ASHL_TRY(compress::cuda::decode_add(c, d_scratch2, scratch2, payload, {n, dtype::f32}, acc, 1.0f,
//                                       ctx, stream, d_report));
//   // error feedback, e <- (x + e) - C(x + e), e a device f32 residual of n elements:
//   ASHL_TRY(compress::cuda::encode_error_feedback(c, d_scratch, scratch, x, e, out, used, ctx, stream));
//
// The payload of compress/randomk.hpp, byte for byte, for the same input and
// codec_context: u64 n, u32 k, u8 flags, u64 seed, the k stratum values in
// the input dtype (f32 for error feedback, as the CPU decorator sends).
// Indices come from the same Philox words (lanes 0 and 1 of
// philox_stream(seed, step, tensor)), so the size, 21 + k * sizeof(T), is
// known on the host. Decode regenerates the indices from the payload's seed
// and ctx.step / ctx.tensor, validates the header on the device, and adds
// nothing when it is malformed (fault in d_report). Error feedback: one pass
// forms y = e + x in e, the gather sends y at the k indices and removes
// there exactly what the CPU decoder would add back with scale -1. Device
// views; payload buffers 4-byte aligned; two-call scratch pattern;
// asynchronous on `stream`, no host synchronization, graph capturable.
// ALGORITHMS.md §4; docs/wire-format.md, "Codec payloads / randomk".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/randomk.cuh needs nvcc; use ashl/compress/randomk.hpp on the host"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
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

template <gradient_element T>
status encode(const compress::randomk& c, void* d_scratch, std::size_t& scratch_bytes, device_view<const T> x,
              device_view<std::byte> out, std::size_t& used_bytes, const codec_context& ctx, cudaStream_t stream) {
  return detail::dispatch_randomk_encode<T>(c, d_scratch, scratch_bytes, x, out, used_bytes, ctx, nullptr, stream);
}

// e <- (x + e) - C(x + e); the payload is of f32 input (C(x + e)).
template <gradient_element T>
status encode_error_feedback(const compress::randomk& c, void* d_scratch, std::size_t& scratch_bytes,
                             device_view<const T> x, device_view<float> residual, device_view<std::byte> out,
                             std::size_t& used_bytes, const codec_context& ctx, cudaStream_t stream) {
  return detail::dispatch_randomk_encode_error_feedback<T>(c, d_scratch, scratch_bytes, x, residual, out, used_bytes,
                                                           ctx, stream);
}

inline status decode_add(const compress::randomk&, void* d_scratch, std::size_t& scratch_bytes,
                         device_view<const std::byte> in, payload_info info, device_view<float> acc, float scale,
                         const codec_context& ctx, cudaStream_t stream, device_report* d_report = nullptr) {
  return detail::dispatch_randomk_decode_add(d_scratch, scratch_bytes, in, info, acc, scale, ctx, stream, d_report);
}

}  // namespace compress::cuda
ASHL_NAMESPACE_END
