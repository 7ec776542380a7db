// ashl/compress/cuda/dispatch/kernels/radix_select.cuh — exact k-th largest
// magnitude on the device by MSD radix selection, without sorting.
//
//   select_init_kernel<<<1, 1, 0, s>>>(state, k);
//   key_histogram_kernel<<<g, b, 0, s>>>(x, n, state, shift, width, hist, ipt);  // per digit
//   select_digit_kernel<true><<<1, 256, 0, s>>>(hist, width, state, false, last);
//
// The same selection as compress/detail/sparse.hpp's radix_select: digits of
// 11/11/9 bits of the f32 magnitude key (8/7 for f16/bf16), each pass a
// histogram of the elements that share the prefix chosen so far (one
// shared-memory histogram per block, merged with global atomics), then one
// block picks the digit where the running count from the top reaches k. The
// result is the threshold key t, the number of elements above it, and how
// many of those equal to t to take. Ties go to the lower index, as on the
// CPU: when only some elements equal to t are taken, a second radix select
// over their indices (11/11/10 bits, ascending) finds the cut-off index. Every
// pass reads its inputs from a device-resident select_state, so the host never
// waits for a count and the whole selection is graph capturable.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>

#include <cub/block/block_scan.cuh>

#include <cstddef>
#include <cstdint>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

inline constexpr int radix_max_bins = 2048;  // 11-bit digits
inline constexpr int select_block_threads = 256;
inline constexpr int select_bins_per_thread = radix_max_bins / select_block_threads;

// Device-resident progress of one selection.
struct select_state {
  std::uint64_t want;         // elements still to take at or below `prefix`
  std::uint64_t greater;      // elements with a larger key than the threshold
  std::uint64_t index_want;   // tie-break: rank wanted among the equal elements
  std::uint64_t cutoff;       // take elements equal to the threshold with index < cutoff
  std::uint32_t prefix;       // key digits fixed so far (the threshold key at the end)
  std::uint32_t tie;          // 1 when only some elements equal to the threshold are taken
  std::uint64_t index_prefix; // tie-break: index digits fixed so far
};

static __global__ void select_init_kernel(select_state* st, std::uint64_t k) {
  st->want = k;
  st->greater = 0;
  st->index_want = 0;
  st->cutoff = ~std::uint64_t{0};
  st->prefix = 0;
  st->tie = 0;
  st->index_prefix = 0;
}

// The same with k decided on the device. k = 0 selects nothing: a prefix
// no key has (keys are at most 31 bits) keeps every histogram empty, no
// digit is ever chosen, and take_selected accepts no key.
static __global__ void select_init_device_kernel(select_state* st, const unsigned long long* d_k) {
  const std::uint64_t k = *d_k;
  st->want = k;
  st->greater = 0;
  st->index_want = 0;
  st->cutoff = ~std::uint64_t{0};
  st->prefix = k == 0 ? 0xffffffffu : 0u;
  st->tie = 0;
  st->index_prefix = 0;
}

// Histogram of digit (key >> shift) & mask over the elements whose higher key
// bits equal state->prefix.
template <class T>
__global__ ASHL_DETAIL_HIDDEN void key_histogram_kernel(const T* __restrict__ x, std::size_t n,
                                                        const select_state* __restrict__ st, int shift, int width,
                                                        std::uint32_t* __restrict__ hist, int items_per_thread) {
  __shared__ std::uint32_t local[radix_max_bins];
  const int bins = 1 << width;
  for (int b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const std::uint32_t prefix = st->prefix;
  const int pshift = shift + width;  // <= 31 for f32 keys, <= 15 for 16-bit keys
  const std::uint32_t mask = static_cast<std::uint32_t>(bins - 1);
  for_each_strided(n, items_per_thread, [&](std::size_t i) {
    const std::uint32_t key = magnitude_key(x[i]);
    if ((key >> pshift) == prefix) atomicAdd(&local[(key >> shift) & mask], 1u);
  });
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x)
    if (local[b] != 0) atomicAdd(&hist[b], local[b]);
}

// Tie-break histogram: digit (i >> shift) & mask of the indices of elements
// whose key equals the threshold and whose higher index bits equal
// state->index_prefix. Does nothing when every equal element is taken.
template <class T>
__global__ ASHL_DETAIL_HIDDEN void index_histogram_kernel(const T* __restrict__ x, std::size_t n,
                                                          const select_state* __restrict__ st, int shift, int width,
                                                          std::uint32_t* __restrict__ hist, int items_per_thread) {
  if (st->tie == 0) return;
  __shared__ std::uint32_t local[radix_max_bins];
  const int bins = 1 << width;
  for (int b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const std::uint32_t key_t = st->prefix;
  const std::uint64_t prefix = st->index_prefix;
  const int pshift = shift + width;  // <= 32; indices are 64-bit here
  const std::uint64_t mask = static_cast<std::uint64_t>(bins - 1);
  for_each_strided(n, items_per_thread, [&](std::uint64_t i) {
    if (magnitude_key(x[i]) == key_t && (i >> pshift) == prefix)
      atomicAdd(&local[(i >> shift) & mask], 1u);
  });
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x)
    if (local[b] != 0) atomicAdd(&hist[b], local[b]);
}

// One block of select_block_threads: finds the digit where the running count
// (from the top for keys, from the bottom for tie-break indices) reaches the
// wanted rank, and advances the state. `last` closes the selection.
template <bool IndexPhase>
__global__ ASHL_DETAIL_HIDDEN void select_digit_kernel(const std::uint32_t* __restrict__ hist, int width,
                                                       select_state* __restrict__ st, bool last) {
  using scan_t = cub::BlockScan<std::uint64_t, select_block_threads>;
  __shared__ typename scan_t::TempStorage temp;
  if constexpr (IndexPhase) {
    if (st->tie == 0) return;  // uniform across the block: no barrier is skipped by some threads only
  }
  const int bins = 1 << width;
  const std::uint64_t want = IndexPhase ? st->index_want : st->want;
  // Scan position p visits bin bins-1-p (keys: largest first) or p (indices: smallest first).
  std::uint32_t count[select_bins_per_thread];
  std::uint64_t mine = 0;
  for (int j = 0; j < select_bins_per_thread; ++j) {
    const int p = threadIdx.x * select_bins_per_thread + j;
    const int b = IndexPhase ? p : bins - 1 - p;
    count[j] = p < bins ? hist[b] : 0u;
    mine += count[j];
  }
  std::uint64_t before = 0;
  scan_t(temp).ExclusiveSum(mine, before);
  for (int j = 0; j < select_bins_per_thread; ++j) {
    const int p = threadIdx.x * select_bins_per_thread + j;
    if (p < bins && before < want && before + count[j] >= want) {
      // Exactly one thread gets here: the running count is monotone and want >= 1.
      const std::uint32_t b = static_cast<std::uint32_t>(IndexPhase ? p : bins - 1 - p);
      if constexpr (IndexPhase) {
        st->index_want = want - before;
        st->index_prefix = (st->index_prefix << width) | b;
        if (last) st->cutoff = st->index_prefix + 1;
      } else {
        st->greater += before;
        st->want = want - before;
        st->prefix = (st->prefix << width) | b;
        if (last) {
          st->tie = (want - before) < count[j] ? 1u : 0u;
          st->index_want = want - before;
        }
      }
    }
    before += count[j];
  }
}

// Selection predicate for cub::DeviceSelect over element indices.
template <class T>
struct take_selected {
  const T* x;
  const select_state* st;
  __device__ __forceinline__ bool operator()(std::uint32_t i) const {
    const std::uint32_t key = magnitude_key(x[i]);
    const std::uint32_t t = st->prefix;
    return key > t || (key == t && i < st->cutoff);
  }
};

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
