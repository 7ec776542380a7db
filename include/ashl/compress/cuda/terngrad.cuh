// ashl/compress/cuda/terngrad.cuh — TernGrad on the device.
//
//   compress::terngrad c{{.bucket = 512}};
//   compress::codec_context ctx{.seed = s, .step = t, .tensor = id};
//   std::size_t scratch = 0, used = 0;
//   compress::cuda::encode(c, nullptr, scratch, x, out, used, ctx, stream);                // size query
//   ASHL_TRY(compress::cuda::encode(c, d_scratch, scratch, x, out, used, ctx, stream, d_report));
//   ASHL_TRY(compress::cuda::decode_add(compress::terngrad{}, d_scratch2, scratch2, payload,
//                                       {n, dtype::f32}, acc, 1.0f, stream, d_report));
//
// The payload of compress/terngrad.hpp, byte for byte, for the same input and
// codec_context: u64 n, u32 bucket, the f32 bucket scales max |x|, 2-bit
// codes (level 0 or 1, and a sign) drawn with word i % 4 of Philox block
// i / 4. The size is known on the host; an inf/NaN bucket (the CPU codec's
// out_of_range error) is recorded in d_report (nonfinite_input, the first
// such bucket). Error feedback (encode_error_feedback) fuses the
// subtraction into the code pass. Decode validates on the device and adds
// nothing when the payload is malformed. Device views; payload buffers
// 4-byte aligned; two-call scratch pattern; asynchronous on `stream`, no
// host synchronization, graph capturable. ALGORITHMS.md §4;
// docs/wire-format.md, "Codec payloads / terngrad".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/terngrad.cuh needs nvcc; use ashl/compress/terngrad.hpp on the host"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/dispatch_levels.cuh>
#include <ashl/compress/terngrad.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda {

namespace detail {
inline levels_params terngrad_params(const compress::terngrad& c) noexcept {
  return {"terngrad", compress::terngrad::header_bytes, c.options().bucket, 1, false};
}
}  // namespace detail

template <gradient_element T>
status encode(const compress::terngrad& c, void* d_scratch, std::size_t& scratch_bytes, device_view<const T> x,
              device_view<std::byte> out, std::size_t& used_bytes, const codec_context& ctx, cudaStream_t stream,
              device_report* d_report = nullptr) {
  ASHL_TRY(c.validate());
  return detail::dispatch_levels_encode<T>(detail::terngrad_params(c), d_scratch, scratch_bytes, x, out, used_bytes,
                                           ctx, nullptr, stream, d_report);
}

// e <- (x + e) - C(x + e); the payload is of f32 input (C(x + e)).
template <gradient_element T>
status encode_error_feedback(const compress::terngrad& c, void* d_scratch, std::size_t& scratch_bytes,
                             device_view<const T> x, device_view<float> residual, device_view<std::byte> out,
                             std::size_t& used_bytes, const codec_context& ctx, cudaStream_t stream,
                             device_report* d_report = nullptr) {
  ASHL_TRY(c.validate());
  if (d_scratch != nullptr && residual.size() != x.size())
    return invalid_argument("terngrad.residual.size", residual.size(),
                            "must equal the input size " + std::to_string(x.size()));
  return detail::dispatch_levels_encode<T>(detail::terngrad_params(c), d_scratch, scratch_bytes, x, out, used_bytes,
                                           ctx, residual.data(), stream, d_report);
}

inline status decode_add(const compress::terngrad&, void* d_scratch, std::size_t& scratch_bytes,
                         device_view<const std::byte> in, payload_info info, device_view<float> acc, float scale,
                         cudaStream_t stream, device_report* d_report = nullptr) {
  return detail::dispatch_levels_decode_add("terngrad", false, 1, d_scratch, scratch_bytes, in, info, acc, scale,
                                            stream, d_report);
}

}  // namespace compress::cuda
ASHL_NAMESPACE_END
