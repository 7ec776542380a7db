// ashl/compress/cuda/dispatch/dispatch_select.cuh — launch logic of the
// sparsifiers whose pair count depends on the data: threshold and sampled
// top-k.
//
//   std::size_t bytes = 0;                                  // size query, then the run
//   detail::dispatch_threshold_encode<float>(c, nullptr, bytes, x, out, d_used, stream);
//   detail::dispatch_threshold_encode<float>(c, d_scratch, bytes, x, out, d_used, stream);
//
// Both are an exact top-k (dispatch_sparse.cuh's radix selection) whose k is
// decided on the device, so no count ever reaches the host and the calls
// stay asynchronous and graph capturable:
//   threshold: c = #{|x| >= theta}. With c <= cap the CPU sends exactly those
//     c elements in index order: one stream compaction with that predicate.
//     With c > cap it sends its exact top-cap: the radix selection with
//     k = cap. Each path is enqueued with a device-side guard (the
//     compaction's predicate tests c <= cap; the selection gets k = 0,
//     which selects nothing, when c <= cap), so exactly one writes indices.
//     NaN is the one element where the two orders differ (never >= theta,
//     but the largest key of top-k), which is why the c <= cap case is not
//     itself a top-c. When cap = n, c > cap cannot happen and the selection
//     is not enqueued.
//   topk_sampled: theta = the key of rank r1 = round(16384 k / n) (clamped to
//     [1, 16384]) among 16384 sampled keys (the CPU's sample: lane 2 of the
//     tensor's Philox stream), sorted on the device (cub radix sort of the
//     16384 keys). ge = #{key >= theta}, gt = ge - #{key == theta}. The CPU
//     sends every element >= theta when ge is in [lo, hi] (that is the exact
//     top-ge: the ge-th largest key is theta and every other key is below
//     it), those above theta plus the lowest-index equal ones up to k when
//     only ties make too many (the exact top-max(gt, k): ties at theta are
//     taken by lower index, and there are more equal ones than taken), and
//     its exact top-k otherwise, whichever of its internal routes (one-pass
//     list, candidate list, overflow) it takes: each ends in one of these
//     three sets. So the payload is the CPU's byte for byte for the same
//     input and context, when the CPU encoder is given no scratch or at
//     least scratch_bytes() (a smaller caller scratch makes it fall back to
//     exact top-k). Below n = 2^17, or for k = n, both send the exact top-k.
// The cost is that of exact top-k plus one counting pass (and the sample);
// the sample decides the count, not the work. ALGORITHMS.md §4 (Lin et al.,
// DGC); docs/wire-format.md "Sparse pairs".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/dispatch_sparse.cuh>
#include <ashl/compress/cuda/dispatch/kernels/radix_select.cuh>
#include <ashl/compress/cuda/dispatch/kernels/select.cuh>
#include <ashl/compress/cuda/dispatch/kernels/sparse.cuh>
#include <ashl/compress/cuda/dispatch/launch.cuh>
#include <ashl/compress/layout.hpp>
#include <ashl/compress/threshold.hpp>
#include <ashl/compress/topk_sampled.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

// Header, values and (when asked) the exact size, from the device count.
template <class T>
status finish_device_count(const std::string& c, const T* x, std::byte* o, std::uint64_t n, std::uint64_t capacity,
                           const unsigned long long* counts, std::uint64_t* d_used, const device_properties& dev,
                           const elementwise_tuning& ew, cudaStream_t stream) {
  sparse_header_kernel<unsigned long long><<<1, 1, 0, stream>>>(o, n, counts + counter_count, 0);
  if (capacity != 0)
    sparse_gather_kernel<T, unsigned long long>
        <<<grid_for(capacity, ew.block_threads, ew.items_per_thread, dev.sm_count, ew.blocks_per_sm), ew.block_threads,
           0, stream>>>(x, o, capacity, counts + counter_count, ew.items_per_thread);
  if (d_used != nullptr) sparse_used_kernel<<<1, 1, 0, stream>>>(counts, sizeof(T), d_used);
  return cuda_check(cudaGetLastError(), c + ".finish_kernels");
}

template <class T>
status dispatch_threshold_encode(const compress::threshold& codec, void* d_scratch, std::size_t& scratch_bytes,
                                 device_view<const T> x, device_view<std::byte> out, std::uint64_t* d_used,
                                 cudaStream_t stream) {
  const std::string c = "threshold";
  ASHL_TRY(codec.validate());
  const std::size_t n = x.size();
  if (n > layout::sparse::max_elements) return out_of_range(c + ".input.size", n, "exceeds 2^32 (indices are u32)");
  const std::size_t cap = codec.cap_for(n);
  const bool may_cap = cap < n;  // with cap = n every count fits

  // Layout: counters, the compaction's count and CUB storage, then the
  // selection's pieces when the cap can bind.
  const auto carve = [&](void* base, unsigned long long*& counts, std::int64_t*& selected, void*& cub_temp,
                         std::size_t& cub_bytes, topk_scratch& sel) -> result<std::size_t> {
    scratch_carver cv(base);
    counts = cv.take<unsigned long long>(counter_slots);
    selected = cv.take<std::int64_t>(1);
    cub_bytes = 0;
    ASHL_TRY(cuda_check(cub::DeviceSelect::If(nullptr, cub_bytes, index_iterator<T>(0),
                                              static_cast<std::uint32_t*>(nullptr),
                                              static_cast<std::int64_t*>(nullptr), static_cast<std::int64_t>(n),
                                              threshold_take<T>{nullptr, 0.0f, nullptr, 0}, cudaStream_t{}),
                        c + ".scratch_query"));
    cub_temp = cv.take_bytes(cub_bytes);
    if (may_cap) {
      auto s = carve_topk_scratch<T>(cv, n);
      if (!s) return s.error();
      sel = *s;
    }
    return cv.bytes();
  };
  unsigned long long* counts = nullptr;
  std::int64_t* selected = nullptr;
  void* cub_temp = nullptr;
  std::size_t cub_bytes = 0;
  topk_scratch sel{};
  auto needed = carve(nullptr, counts, selected, cub_temp, cub_bytes, sel);
  if (!needed) return needed.error();
  auto go = scratch_protocol(c, d_scratch, scratch_bytes, *needed);
  if (!go) return go.error();
  if (!*go) return {};
  ASHL_TRY(check_output(c, out, layout::sparse_payload_bytes(cap, sizeof(T))));
  ASHL_TRY(carve(d_scratch, counts, selected, cub_temp, cub_bytes, sel).to_status());
  launch_env env;
  ASHL_TRY(current_launch_env(c, env));
  const auto& [dev, tune] = env;
  const auto& ew = tune.elementwise;
  std::byte* const o = out.data();
  auto* idx = reinterpret_cast<std::uint32_t*>(o + layout::sparse::header_bytes);

  ASHL_TRY(cuda_check(cudaMemsetAsync(counts, 0, sizeof(unsigned long long) * counter_slots, stream), c + ".memset"));
  if (n != 0) {
    const float theta = codec.options().theta;
    threshold_count_kernel<T>
        <<<grid_for(n, ew.block_threads, ew.items_per_thread, dev.sm_count, ew.blocks_per_sm), ew.block_threads, 0,
           stream>>>(x.data(), n, theta, counts, ew.items_per_thread);
    threshold_decide_kernel<<<1, 1, 0, stream>>>(counts, cap);
    ASHL_TRY(cuda_check(cudaGetLastError(), c + ".count_kernels"));
    if (may_cap) ASHL_TRY(enqueue_topk_select<T>(c, x.data(), n, 0, counts + counter_select_k, sel, idx, dev, tune, stream));
    std::size_t bytes = cub_bytes;
    ASHL_TRY(cuda_check(cub::DeviceSelect::If(cub_temp, bytes, index_iterator<T>(0), idx, selected,
                                              static_cast<std::int64_t>(n),
                                              threshold_take<T>{x.data(), theta, counts, cap}, stream),
                        c + ".compaction"));
  }
  return finish_device_count<T>(c, x.data(), o, n, cap, counts, d_used, dev, ew, stream);
}

// The sample rank r1 of the CPU encoder (topk_sampled.hpp), in the same
// double arithmetic.
inline std::uint32_t topk_sampled_rank(std::size_t n, std::size_t k) noexcept {
  constexpr double s = static_cast<double>(compress::topk_sampled::sample_size);
  const double base_rank = static_cast<double>(k) * s / static_cast<double>(n);
  return static_cast<std::uint32_t>(std::clamp(std::round(base_rank), 1.0, s));
}

template <class T>
status dispatch_topk_sampled_encode(const compress::topk_sampled& codec, void* d_scratch, std::size_t& scratch_bytes,
                                    device_view<const T> x, device_view<std::byte> out, std::uint64_t* d_used,
                                    const codec_context& ctx, cudaStream_t stream) {
  const std::string c = "topk_sampled";
  const std::size_t n = x.size();
  if (n > layout::sparse::max_elements) return out_of_range(c + ".input.size", n, "exceeds 2^32 (indices are u32)");
  const std::size_t k = codec.k_for(n);
  const std::size_t hi = codec.hi_for(n);
  constexpr std::uint32_t s = static_cast<std::uint32_t>(compress::topk_sampled::sample_size);
  const bool exact = n < compress::topk_sampled::min_sampled_n || k == n;

  const auto carve = [&](void* base, unsigned long long*& counts, std::uint32_t*& keys, std::uint32_t*& sorted,
                         void*& sort_temp, std::size_t& sort_bytes, topk_scratch& sel) -> result<std::size_t> {
    scratch_carver cv(base);
    counts = cv.take<unsigned long long>(counter_slots);
    if (!exact) {
      keys = cv.take<std::uint32_t>(s);
      sorted = cv.take<std::uint32_t>(s);
      sort_bytes = 0;
      ASHL_TRY(cuda_check(cub::DeviceRadixSort::SortKeysDescending(nullptr, sort_bytes,
                                                                   static_cast<const std::uint32_t*>(nullptr),
                                                                   static_cast<std::uint32_t*>(nullptr),
                                                                   static_cast<int>(s), 0, 32, cudaStream_t{}),
                          c + ".scratch_query"));
      sort_temp = cv.take_bytes(sort_bytes);
    }
    if (n != 0) {
      auto t = carve_topk_scratch<T>(cv, n);
      if (!t) return t.error();
      sel = *t;
    }
    return cv.bytes();
  };
  unsigned long long* counts = nullptr;
  std::uint32_t *keys = nullptr, *sorted = nullptr;
  void* sort_temp = nullptr;
  std::size_t sort_bytes = 0;
  topk_scratch sel{};
  auto needed = carve(nullptr, counts, keys, sorted, sort_temp, sort_bytes, sel);
  if (!needed) return needed.error();
  auto go = scratch_protocol(c, d_scratch, scratch_bytes, *needed);
  if (!go) return go.error();
  if (!*go) return {};
  ASHL_TRY(check_output(c, out, layout::sparse_payload_bytes(hi, sizeof(T))));
  ASHL_TRY(carve(d_scratch, counts, keys, sorted, sort_temp, sort_bytes, sel).to_status());
  launch_env env;
  ASHL_TRY(current_launch_env(c, env));
  const auto& [dev, tune] = env;
  const auto& ew = tune.elementwise;
  std::byte* const o = out.data();
  auto* idx = reinterpret_cast<std::uint32_t*>(o + layout::sparse::header_bytes);

  // counts[count] = counts[select_k] = k, unless the sampled rule says otherwise.
  ASHL_TRY(cuda_check(cudaMemsetAsync(counts, 0, sizeof(unsigned long long) * counter_slots, stream), c + ".memset"));
  if (n == 0) return finish_device_count<T>(c, x.data(), o, n, 0, counts, d_used, dev, ew, stream);
  if (!exact) {
    sample_keys_kernel<T><<<(s + 255) / 256, 256, 0, stream>>>(x.data(), n, philox_stream(ctx.seed, ctx.step, ctx.tensor),
                                                              keys, s);
    ASHL_TRY(cuda_check(cudaGetLastError(), c + ".sample_kernel"));
    std::size_t bytes = sort_bytes;
    ASHL_TRY(cuda_check(cub::DeviceRadixSort::SortKeysDescending(sort_temp, bytes, keys, sorted, static_cast<int>(s),
                                                                 0, 32, stream),
                        c + ".sort"));
    count_ge_eq_kernel<T>
        <<<grid_for(n, ew.block_threads, ew.items_per_thread, dev.sm_count, ew.blocks_per_sm), ew.block_threads, 0,
           stream>>>(x.data(), n, sorted, topk_sampled_rank(n, k), counts, ew.items_per_thread);
    topk_sampled_decide_kernel<<<1, 1, 0, stream>>>(counts, k, codec.lo_for(n), hi);
  } else {
    topk_sampled_decide_kernel<<<1, 1, 0, stream>>>(counts, k, k + 1, k);  // an empty [lo, hi]: exactly k
  }
  ASHL_TRY(cuda_check(cudaGetLastError(), c + ".decide_kernels"));
  ASHL_TRY(enqueue_topk_select<T>(c, x.data(), n, 0, counts + counter_select_k, sel, idx, dev, tune, stream));
  return finish_device_count<T>(c, x.data(), o, n, hi, counts, d_used, dev, ew, stream);
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
