// ashl/compress/cuda/natural.cuh — natural compression on the device.
//
//   compress::codec_context ctx{.seed = s, .step = t, .tensor = id};
//   std::size_t scratch = 0, used = 0;
//   compress::cuda::encode(compress::natural{}, nullptr, scratch, x, out, used, ctx, stream);   // size query
//   ASHL_TRY(compress::cuda::encode(compress::natural{}, d_scratch, scratch, x, out, used, ctx, stream, d_report));
//   // after the caller's next synchronization: d_report->fault == nonfinite_input means the CPU
//   // codec would have refused this input (inf/NaN); the payload must not be sent.
//   ASHL_TRY(compress::cuda::decode_add(compress::natural{}, d_scratch2, scratch2, payload, {n, dtype::f32},
//                                       acc, 1.0f, stream, d_report));
//
// The payload of compress/natural.hpp, byte for byte, for the same input and
// codec_context: u64 n, i32 emin, n code bytes, the codes drawn with word
// i % 4 of Philox block i / 4 of philox_stream(seed, step, tensor). The size,
// 12 + n, is known on the host. Error feedback (encode_error_feedback):
// e <- (x + e) - C(x + e) with the subtraction fused into the code pass; on
// a non-finite input the residual keeps x + e, as on the CPU. Decode
// validates on the device and adds nothing when the payload is malformed.
// Device views; payload buffers 4-byte aligned; two-call scratch pattern;
// asynchronous on `stream`, no host synchronization, graph capturable.
// ALGORITHMS.md §4; docs/wire-format.md, "Codec payloads / natural".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/natural.cuh needs nvcc; use ashl/compress/natural.hpp on the host"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/dispatch_natural.cuh>
#include <ashl/compress/natural.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda {

template <gradient_element T>
status encode(const compress::natural&, void* d_scratch, std::size_t& scratch_bytes, device_view<const T> x,
              device_view<std::byte> out, std::size_t& used_bytes, const codec_context& ctx, cudaStream_t stream,
              device_report* d_report = nullptr) {
  return detail::dispatch_natural_encode<T>(d_scratch, scratch_bytes, x, out, used_bytes, ctx, nullptr, stream,
                                            d_report);
}

// e <- (x + e) - C(x + e); the payload is of f32 input (C(x + e)).
template <gradient_element T>
status encode_error_feedback(const compress::natural&, void* d_scratch, std::size_t& scratch_bytes,
                             device_view<const T> x, device_view<float> residual, device_view<std::byte> out,
                             std::size_t& used_bytes, const codec_context& ctx, cudaStream_t stream,
                             device_report* d_report = nullptr) {
  if (d_scratch != nullptr && residual.size() != x.size())
    return invalid_argument("natural.residual.size", residual.size(),
                            "must equal the input size " + std::to_string(x.size()));
  return detail::dispatch_natural_encode<T>(d_scratch, scratch_bytes, x, out, used_bytes, ctx, residual.data(),
                                            stream, d_report);
}

inline status decode_add(const compress::natural&, void* d_scratch, std::size_t& scratch_bytes,
                         device_view<const std::byte> in, payload_info info, device_view<float> acc, float scale,
                         cudaStream_t stream, device_report* d_report = nullptr) {
  return detail::dispatch_natural_decode_add(d_scratch, scratch_bytes, in, info, acc, scale, stream, d_report);
}

}  // namespace compress::cuda
ASHL_NAMESPACE_END
