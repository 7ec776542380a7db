// ashl/compress/cuda/dispatch/kernels/reduce.cuh — the warp-level
// reductions the kernels share.
//
//   std::uint64_t mine = ...;                 // this thread's count over its grid-stride items
//   warp_add_to(&total, mine);                // one atomic per warp
//   warp_max_to(&max_key, key);               // natural's max |x| key
//   mk = group_max<8>(mk);                    // a chunk's 8 lanes (levels' max |x|)
//
// A grid-stride kernel counts per thread, then each warp sums its 32 lanes
// with shuffles and lane 0 adds the warp's total to a device counter: one
// global atomic per warp instead of one per thread. Every lane of the warp
// must reach the call (full mask): call it after the loop, with block sizes
// that are multiples of 32 (all the tunings are). Integer sums and maxima
// only, where the order does not matter; the float chunk sums of qsgd and
// sign keep their own lane order (kernels/levels.cuh, kernels/sign.cuh),
// because it is the CPU's summation order, which the payload bits depend on.
// docs/algorithms.md §4.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>

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

// *total = max(*total, the max of v over the warp) (one atomic, from lane 0).
__device__ __forceinline__ void warp_max_to(std::uint32_t* total, std::uint32_t v) noexcept {
  v = __reduce_max_sync(full_warp_mask, v);
  if ((threadIdx.x & 31u) == 0 && v != 0) atomicMax(total, v);
}

// The max of v over each aligned group of Width lanes (a power of two, at
// most 32), in the group's first lane; every lane of the warp must call it.
template <unsigned Width>
__device__ __forceinline__ std::uint32_t group_max(std::uint32_t v) noexcept {
  static_assert(Width >= 1 && Width <= 32 && (Width & (Width - 1)) == 0, "Width: a power of two <= 32");
  for (unsigned offset = Width / 2; offset > 0; offset >>= 1) v = max(v, __shfl_down_sync(full_warp_mask, v, offset));
  return v;
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
