// ashl/compress/cuda/topk.cuh — exact top-k on the device.
//
//   compress::topk c{0.01};
//   std::size_t scratch = 0, used = 0;
//   compress::cuda::encode(c, nullptr, scratch, x, out, used, stream);      // size query
//   ASHL_TRY(compress::cuda::encode(c, d_scratch, scratch, x, out, used, stream));
//   ASHL_TRY(compress::cuda::decode_add(c, d_scratch2, scratch2, payload, {n, dtype::f32}, acc, 1.0f,
//                                       stream, d_report));
//
// The payload of compress/topk.hpp, byte for byte: u64 n, u32 k, the k
// indices of largest |x| in increasing order (ties to the lower index, NaN
// above inf), their values in the input dtype. k = c.k_for(n), so the size
// (used_bytes) is known on the host. Selection by radix histograms over the
// magnitude bits, compaction with cub::DeviceSelect: no sort
// (dispatch/dispatch_sparse.cuh). The decode validates the payload on the
// device; a malformed one adds nothing and leaves its fault in d_report.
// Device views; payload buffers 4-byte aligned; two-call scratch pattern;
// asynchronous on `stream`, no host synchronization, graph capturable.
// ALGORITHMS.md §4; docs/wire-format.md, "Codec payloads / topk".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/topk.cuh needs nvcc; use ashl/compress/topk.hpp on the host"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/dispatch_sparse.cuh>
#include <ashl/compress/topk.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cuda_runtime.h>

#include <cstddef>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda {

template <gradient_element T>
status encode(const compress::topk& c, void* d_scratch, std::size_t& scratch_bytes, device_view<const T> x,
              device_view<std::byte> out, std::size_t& used_bytes, cudaStream_t stream) {
  ASHL_TRY(c.validate());
  return detail::dispatch_topk_encode<T>("topk", c.k_for(x.size()), d_scratch, scratch_bytes, x, out, used_bytes,
                                         stream);
}

// Accepts any k in [1, n], as the CPU decoder does.
inline status decode_add(const compress::topk&, void* d_scratch, std::size_t& scratch_bytes,
                         device_view<const std::byte> in, payload_info info, device_view<float> acc, float scale,
                         cudaStream_t stream, device_report* d_report = nullptr) {
  return detail::dispatch_sparse_decode_add("topk", /*require_nonempty=*/true, d_scratch, scratch_bytes, in, info,
                                            acc, scale, stream, d_report);
}

}  // namespace compress::cuda
ASHL_NAMESPACE_END
