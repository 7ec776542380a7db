// ashl/compress/cuda/dispatch/kernels/select.cuh — the kernels of the
// data-dependent sparsifiers (threshold, topk_sampled): counts over the
// input, the sample of sampled top-k, and the one-thread decisions that turn
// counts into the k the exact selection then takes.
//
//   threshold_count_kernel<float><<<g, b, 0, s>>>(x, n, theta, &counts[0], ipt);
//   threshold_decide_kernel<<<1, 1, 0, s>>>(counts, cap);          // counts[1] = count, counts[2] = k
//
// Every decision is the CPU codec's rule, restated in terms of the k of an
// exact top-k (dispatch/dispatch_select.cuh says why each is equivalent).
// docs/algorithms.md §4.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/kernels/reduce.cuh>
#include <ashl/compress/layout.hpp>
#include <ashl/core/philox.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

// Slots of the u64 counters a data-dependent encode keeps in scratch.
enum counter_slot : int {
  counter_primary = 0,    // threshold: #{|x| >= theta}; topk_sampled: #{key >= theta}
  counter_equal = 1,      // topk_sampled: #{key == theta}
  counter_count = 2,      // the payload's pair count
  counter_select_k = 3,   // the k the exact selection takes (0: none)
  counter_slots = 4,
};

// counts[counter_primary] += #{ |float(x[i])| >= theta } (NaN never counts),
// the CPU's std::fabs(to_float(x[i])) >= theta.
template <class T>
__global__ ASHL_DETAIL_HIDDEN void threshold_count_kernel(const T* __restrict__ x, std::size_t n, float theta,
                                                          unsigned long long* __restrict__ counts,
                                                          int items_per_thread) {
  unsigned long long mine = 0;
  for_each_strided(n, items_per_thread, [&](std::size_t i) {
    mine += fabsf(element_float(x[i])) >= theta ? 1u : 0u;
  });
  warp_add_to(&counts[counter_primary], mine);
}

// The CPU's threshold rule: c <= cap sends the c elements with |x| >= theta
// (a compaction; no selection), c > cap sends the exact top-cap.
static __global__ void threshold_decide_kernel(unsigned long long* counts, std::uint64_t cap) {
  const unsigned long long c = counts[counter_primary];
  counts[counter_count] = c > cap ? cap : c;
  counts[counter_select_k] = c > cap ? cap : 0;
}

// Compaction predicate of the c <= cap case; selects nothing when c > cap,
// so it and the exact selection never both write indices.
template <class T>
struct threshold_take {
  const T* x;
  float theta;
  const unsigned long long* counts;
  std::uint64_t cap;
  __device__ __forceinline__ bool operator()(std::uint32_t i) const {
    return counts[counter_primary] <= cap && fabsf(element_float(x[i])) >= theta;
  }
};

// The sample of sampled top-k: keys[j] = |x| key of element
// (word_j * n) >> 32, word_j = word j of philox_stream(seed, step, tensor)
// lane 2, for j < count: the CPU's random_words(..., 2) fill and its keys.
template <class T>
__global__ ASHL_DETAIL_HIDDEN void sample_keys_kernel(const T* __restrict__ x, std::uint64_t n, philox_stream rng,
                                                      std::uint32_t* __restrict__ keys, std::uint32_t count) {
  const std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= count) return;
  const std::uint64_t w = rng.word(j, 2);
  keys[j] = magnitude_key(x[(w * n) >> 32]);
}

// counts[primary] += #{key >= theta}, counts[equal] += #{key == theta};
// theta = sorted_keys[rank - 1] (the sample sorted in descending order).
template <class T>
__global__ ASHL_DETAIL_HIDDEN void count_ge_eq_kernel(const T* __restrict__ x, std::size_t n,
                                                      const std::uint32_t* __restrict__ sorted_keys,
                                                      std::uint32_t rank, unsigned long long* __restrict__ counts,
                                                      int items_per_thread) {
  const std::uint32_t theta = sorted_keys[rank - 1];
  unsigned long long ge = 0, eq = 0;
  for_each_strided(n, items_per_thread, [&](std::size_t i) {
    const std::uint32_t key = magnitude_key(x[i]);
    ge += key >= theta ? 1u : 0u;
    eq += key == theta ? 1u : 0u;
  });
  warp_add_to(&counts[counter_primary], ge);
  warp_add_to(&counts[counter_equal], eq);
}

// The CPU's sampled top-k rule with ge = #{key >= theta}, gt = ge - #{== theta}:
//   ge in [lo, hi]             -> every element >= theta   = exact top-ge
//   ge > hi and gt <= hi       -> those > theta and the lowest-index equal
//                                 ones up to k             = exact top-max(gt, k)
//   otherwise                  -> exact top-k
static __global__ void topk_sampled_decide_kernel(unsigned long long* counts, std::uint64_t k, std::uint64_t lo,
                                                  std::uint64_t hi) {
  const unsigned long long ge = counts[counter_primary];
  const unsigned long long gt = ge - counts[counter_equal];
  unsigned long long take = k;
  if (ge >= lo && ge <= hi)
    take = ge;
  else if (ge > hi && gt <= hi)
    take = gt > k ? gt : k;
  counts[counter_count] = take;
  counts[counter_select_k] = take;
}

// *d_used = 12 + count * (4 + value bytes), the exact payload size.
static __global__ void sparse_used_kernel(const unsigned long long* __restrict__ counts, std::uint64_t value_bytes,
                                          std::uint64_t* __restrict__ d_used) {
  *d_used = layout::sparse_payload_bytes(counts[counter_count], value_bytes);
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
