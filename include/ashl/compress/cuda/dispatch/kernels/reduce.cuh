// ashl/compress/cuda/dispatch/kernels/reduce.cuh — the warp-level reduction
// the counting kernels share.
//
//   std::uint64_t mine = ...;                 // this thread's count over its grid-stride items
//   warp_add_to(&total, mine);                // one atomic per warp
//
// A grid-stride kernel counts per thread, then each warp sums its 32 lanes
// with shuffles and lane 0 adds the warp's total to a device counter: one
// global atomic per warp instead of one per thread. Every lane of the warp
// must reach the call (full mask): call it after the loop, with block sizes
// that are multiples of 32 (all the tunings are). Integer sums only, so the
// order of the adds does not matter. ALGORITHMS.md §4.
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/*.cuh needs nvcc (CUDA C++)"
#endif

#include <ashl/config.hpp>

#include <cstdint>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

inline constexpr unsigned full_warp_mask = 0xffffffffu;

// The sum of v over the warp, in lane 0 (other lanes hold partial sums).
__device__ __forceinline__ unsigned long long warp_sum(unsigned long long v) noexcept {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(full_warp_mask, v, offset);
  return v;
}

// *total += the sum of v over the warp (one atomic, from lane 0).
__device__ __forceinline__ void warp_add_to(unsigned long long* total, unsigned long long v) noexcept {
  v = warp_sum(v);
  if ((threadIdx.x & 31u) == 0 && v != 0) atomicAdd(total, v);
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
