// ashl/compress/cuda/topk.cuh — exact top-k on the device.
//
//   compress::topk c{0.01};
//   compress::codec_context ctx{.seed = s, .step = t, .tensor = id};
//   compress::cuda::device_output out{.bytes = d_out};
//   compress::cuda::device_scratch scratch{};                               // size query first
//   ASHL_TRY(compress::cuda::encode(c, x, out, ctx, scratch, d_report, stream));
//   // ... scratch.data = a buffer of scratch.bytes, then the same call runs
//   ASHL_TRY(compress::cuda::decode_add(c, payload, {n, dtype::f32}, acc, 1.0f, ctx,
//                                       scratch2, d_report, stream));
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
// docs/algorithms.md §4; docs/wire-format.md, "Codec payloads / topk".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/topk.cuh needs nvcc; use ashl/compress/topk.hpp on the host"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/concepts.cuh>
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

template <>
struct device_impl<compress::topk> : detail::sparse_pairs_decode<compress::topk> {
  // Deterministic and never refuses: the context and report are not used.
  template <gradient_element T>
  static status encode(const compress::topk& c, device_view<const T> x, device_output& out, const codec_context&,
                       device_scratch& scratch, device_report*, cudaStream_t stream) {
    ASHL_TRY(c.validate());
    return detail::run_known_size("topk", out, scratch, stream, [&](void* s, std::size_t& b, std::size_t& used) {
      return detail::dispatch_topk_encode<T>("topk", c.k_for(x.size()), s, b, x, out.bytes, used, stream);
    });
  }
  // decode_add: accepts any k in [1, n], as the CPU decoder does.
};

static_assert(device_codec<compress::topk>);

}  // namespace compress::cuda
ASHL_NAMESPACE_END
