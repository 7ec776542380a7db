// ashl/compress/cuda/identity.cuh — the identity codec on the device.
//
//   std::size_t scratch = 0, used = 0;
//   compress::cuda::encode(compress::identity{}, nullptr, scratch, x, out, used, stream);  // size query
//   cudaMallocAsync(&d_scratch, scratch, stream);
//   ASHL_TRY(compress::cuda::encode(compress::identity{}, d_scratch, scratch, x, out, used, stream));
//   ASHL_TRY(compress::cuda::decode_add(compress::identity{}, d_scratch, scratch, payload,
//                                       {n, dtype::f32}, acc, 1.0f, stream));
//
// Same payload as compress/identity.hpp, byte for byte: the n input values.
// Device views in and out; `out` and `in` 4-byte aligned. The two-call
// scratch pattern of CUB: a null d_scratch only sets scratch_bytes (and
// used_bytes). Asynchronous on `stream`, no host synchronization, capturable
// into a CUDA graph. ALGORITHMS.md §4; docs/wire-format.md, "Codec payloads".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/identity.cuh needs nvcc; use ashl/compress/identity.hpp on the host"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/dispatch_dense.cuh>
#include <ashl/compress/identity.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cuda_runtime.h>

#include <cstddef>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda {

// Writes exactly n * sizeof(T) bytes (used_bytes, known on the host).
template <gradient_element T>
status encode(const compress::identity&, void* d_scratch, std::size_t& scratch_bytes, device_view<const T> x,
              device_view<std::byte> out, std::size_t& used_bytes, cudaStream_t stream) {
  return detail::dispatch_dense_encode<T>("identity", detail::dense_target::identity, false, d_scratch,
                                          scratch_bytes, x, out, used_bytes, nullptr, stream);
}

// acc[i] += scale * value[i]; the payload's dtype is info.type.
inline status decode_add(const compress::identity&, void* d_scratch, std::size_t& scratch_bytes,
                         device_view<const std::byte> in, payload_info info, device_view<float> acc, float scale,
                         cudaStream_t stream) {
  return detail::dispatch_dense_decode_add("identity", info.type, d_scratch, scratch_bytes, in, info, acc, scale,
                                           stream);
}

}  // namespace compress::cuda
ASHL_NAMESPACE_END
