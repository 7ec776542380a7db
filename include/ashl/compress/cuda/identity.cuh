// ashl/compress/cuda/identity.cuh — the identity codec on the device.
//
//   compress::cuda::device_output out{.bytes = d_out};
//   compress::cuda::device_scratch scratch{};                               // size query first
//   ASHL_TRY(compress::cuda::encode(compress::identity{}, x, out, ctx, scratch, nullptr, stream));
//   // ... scratch.data = a buffer of scratch.bytes, then the same call runs
//   ASHL_TRY(compress::cuda::decode_add(compress::identity{}, payload, {n, dtype::f32}, acc, 1.0f, ctx,
//                                       scratch2, nullptr, stream));
//
// Same payload as compress/identity.hpp, byte for byte: the n input values.
// Device views in and out; `out` and `in` 4-byte aligned. The two-call
// scratch pattern of CUB: a null d_scratch only sets scratch_bytes (and
// used_bytes). Asynchronous on `stream`, no host synchronization, capturable
// into a CUDA graph. docs/algorithms.md §4; docs/wire-format.md, "Codec payloads".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/identity.cuh needs nvcc; use ashl/compress/identity.hpp on the host"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/concepts.cuh>
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

template <>
struct device_impl<compress::identity> {
  // Writes exactly n * sizeof(T) bytes; the context and report are not used.
  template <gradient_element T>
  static status encode(const compress::identity&, device_view<const T> x, device_output& out, const codec_context&,
                       device_scratch& scratch, device_report*, cudaStream_t stream) {
    return detail::run_known_size("identity", out, scratch, stream, [&](void* s, std::size_t& b, std::size_t& used) {
      return detail::dispatch_dense_encode<T>("identity", detail::dense_target::identity, false, s, b, x, out.bytes,
                                              used, nullptr, stream);
    });
  }

  // acc[i] += scale * value[i]; the payload's dtype is info.type. Every byte
  // pattern is a payload, so there is nothing to report.
  static status decode_add(const compress::identity&, device_view<const std::byte> in, payload_info info,
                           device_view<float> acc, float scale, const codec_context&, device_scratch& scratch,
                           device_report*, cudaStream_t stream) {
    return detail::dispatch_dense_decode_add("identity", info.type, scratch.data, scratch.bytes, in, info, acc, scale,
                                             stream);
  }
};

static_assert(device_codec<compress::identity>);

}  // namespace compress::cuda
ASHL_NAMESPACE_END
