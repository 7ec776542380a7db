// ashl/compress/cuda/dispatch/kernels/residual.cuh — the element-wise steps
// of the device decorators: error feedback (compress/error_feedback.hpp),
// forming y = e + x in the residual and removing a sparse payload's values
// from it; DGC (compress/dgc.hpp), the momentum update and the masking of
// the sent coordinates.
//
//   residual_add_kernel<float><<<g, b, 0, s>>>(x, e, n, ipt);          // e[i] = e[i] + x[i]
//   residual_sparse_subtract_kernel<<<g, b, 0, s>>>(payload, e, verdict, cap, ipt);
//   dgc_momentum_kernel<float><<<g, b, 0, s>>>(grad, u, v, n, m, ipt);  // u = m u + g; v += u
//   sparse_mask_kernel<<<g, b, 0, s>>>(payload, u, v, cap, ipt);        // u = v = 0 where sent
//
// Same roundings as the CPU decorator: e + x in f32 (one addition), and the
// inner decoder's scale -1 add, e + (-1 * v), with no FMA contraction. The
// dense quantizers fold their subtraction into their code kernels instead.
// docs/algorithms.md §4 (decorators).
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/kernels/sparse.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

// e[i] = e[i] + float(x[i]) (the CPU's r[i] += to_float(x[i])).
template <class T>
__global__ ASHL_DETAIL_HIDDEN void residual_add_kernel(const T* __restrict__ x, float* __restrict__ e, std::size_t n,
                                                       int items_per_thread) {
  for_each_strided(n, items_per_thread, [&](std::size_t i) {
    e[i] = __fadd_rn(e[i], element_float(x[i]));
  });
}

// e[index[j]] = e[index[j]] + (-1 * value[j]) for the pairs of an f32 sparse
// payload this encode just wrote (count read from its header, at most
// `capacity`). Skipped when the encode recorded a fault in `verdict`.
static __global__ void residual_sparse_subtract_kernel(const std::byte* __restrict__ payload,
                                                                   float* __restrict__ e,
                                                                   const device_report* __restrict__ verdict,
                                                                   std::uint64_t capacity, int items_per_thread) {
  if (verdict != nullptr && verdict->fault != 0) return;
  std::uint64_t count = sparse_read_count(payload);
  if (count > capacity) count = capacity;
  const auto* idx = reinterpret_cast<const std::uint32_t*>(payload + layout::sparse::header_bytes);
  const auto* val = reinterpret_cast<const float*>(payload + layout::sparse::header_bytes + 4 * count);
  for_each_strided(count, items_per_thread, [&](std::size_t p) {
    e[idx[p]] = __fadd_rn(e[idx[p]], __fmul_rn(-1.0f, val[p]));
  });
}

// DGC's momentum correction, the CPU's loop in dgc.hpp:
//   u[i] = m * u[i] + float(g[i]);  v[i] += u[i];
// with one rounding per operation (no FMA), as the CPU source reads.
template <class T>
__global__ ASHL_DETAIL_HIDDEN void dgc_momentum_kernel(const T* __restrict__ g, float* __restrict__ u,
                                                       float* __restrict__ v, std::size_t n, float m,
                                                       int items_per_thread) {
  for_each_strided(n, items_per_thread, [&](std::size_t i) {
    const float ui = __fadd_rn(__fmul_rn(m, u[i]), element_float(g[i]));
    u[i] = ui;
    v[i] = __fadd_rn(v[i], ui);
  });
}

// DGC's masking: u[index[j]] = v[index[j]] = 0 for the pairs of the sparse
// payload this encode just wrote (count read from its header, at most
// `capacity`; indices were produced < n by the encoder).
static __global__ void sparse_mask_kernel(const std::byte* __restrict__ payload, float* __restrict__ u,
                                          float* __restrict__ v, std::uint64_t capacity, int items_per_thread) {
  std::uint64_t count = sparse_read_count(payload);
  if (count > capacity) count = capacity;
  const auto* idx = reinterpret_cast<const std::uint32_t*>(payload + layout::sparse::header_bytes);
  for_each_strided(count, items_per_thread, [&](std::size_t p) {
    u[idx[p]] = 0.0f;
    v[idx[p]] = 0.0f;
  });
}

// Enqueues e = e + x over n elements with the element-wise tuning.
template <class T>
cudaError_t launch_residual_add(const T* x, float* e, std::size_t n, int block_threads, int items_per_thread,
                                unsigned grid, cudaStream_t stream) noexcept {
  if (n == 0) return cudaSuccess;
  residual_add_kernel<T><<<grid, block_threads, 0, stream>>>(x, e, n, items_per_thread);
  return cudaGetLastError();
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
