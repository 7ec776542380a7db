// ashl/compress/cuda/sign.cuh — scaled sign compression (EF-signSGD) on the device.
//
//   compress::sign c{{.bucket = 512}};   // ctx is accepted for a uniform call shape, unused
//   compress::codec_context ctx{.seed = s, .step = t, .tensor = id};
//   std::size_t scratch = 0, used = 0;
//   compress::cuda::encode(c, nullptr, scratch, x, out, used, ctx, stream);                // size query
//   ASHL_TRY(compress::cuda::encode(c, d_scratch, scratch, x, out, used, ctx, stream, d_report));
//   ASHL_TRY(compress::cuda::decode_add(compress::sign{}, d_scratch2, scratch2, payload,
//                                       {n, dtype::f32}, acc, 1.0f, stream, d_report));
//
// The payload of compress/sign.hpp, byte for byte, for the same input: u64
// n, u32 bucket, the f32 bucket scales d = mean |x| (summed in double in the
// CPU's order, see dispatch/kernels/sign.cuh), one bit per element (x < 0).
// Deterministic: the codec_context is not used. The size is known on the
// host; a bucket whose mean is not finite (the CPU codec's out_of_range
// error) is recorded in d_report (nonfinite_input, the first such bucket).
// Error feedback (encode_error_feedback) fuses the subtraction into the bit
// pass. Decode validates on the device and adds
// nothing when the payload is malformed. Device views; payload buffers
// 4-byte aligned; two-call scratch pattern; asynchronous on `stream`, no
// host synchronization, graph capturable. ALGORITHMS.md §4;
// docs/wire-format.md, "Codec payloads / sign".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/sign.cuh needs nvcc; use ashl/compress/sign.hpp on the host"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/dispatch_sign.cuh>
#include <ashl/compress/sign.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda {

template <gradient_element T>
status encode(const compress::sign& c, void* d_scratch, std::size_t& scratch_bytes, device_view<const T> x,
              device_view<std::byte> out, std::size_t& used_bytes, const codec_context& ctx, cudaStream_t stream,
              device_report* d_report = nullptr) {
  ASHL_TRY(c.validate());
  (void)ctx;
  return detail::dispatch_sign_encode<T>(c.options().bucket, d_scratch, scratch_bytes, x, out, used_bytes, nullptr,
                                         stream, d_report);
}

// e <- (x + e) - C(x + e); the payload is of f32 input (C(x + e)).
template <gradient_element T>
status encode_error_feedback(const compress::sign& c, void* d_scratch, std::size_t& scratch_bytes,
                             device_view<const T> x, device_view<float> residual, device_view<std::byte> out,
                             std::size_t& used_bytes, const codec_context& ctx, cudaStream_t stream,
                             device_report* d_report = nullptr) {
  ASHL_TRY(c.validate());
  if (d_scratch != nullptr && residual.size() != x.size())
    return invalid_argument("sign.residual.size", residual.size(),
                            "must equal the input size " + std::to_string(x.size()));
  (void)ctx;
  return detail::dispatch_sign_encode<T>(c.options().bucket, d_scratch, scratch_bytes, x, out, used_bytes,
                                         residual.data(), stream, d_report);
}

inline status decode_add(const compress::sign&, void* d_scratch, std::size_t& scratch_bytes,
                         device_view<const std::byte> in, payload_info info, device_view<float> acc, float scale,
                         cudaStream_t stream, device_report* d_report = nullptr) {
  return detail::dispatch_sign_decode_add(d_scratch, scratch_bytes, in, info, acc, scale, stream, d_report);
}

}  // namespace compress::cuda
ASHL_NAMESPACE_END
