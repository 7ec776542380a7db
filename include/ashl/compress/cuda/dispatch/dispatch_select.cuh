// ashl/compress/cuda/dispatch/dispatch_select.cuh — launch logic of the
// sparsifiers whose pair count depends on the data: threshold and sampled
// top-k.
//
//   std::size_t bytes = 0;                                  // size query, then the run
//   detail::counted_encode(c, nullptr, bytes, x, out, d_used, ctx, stream);
//   detail::counted_encode(c, d_scratch, bytes, x, out, d_used, ctx, stream);
//
// (cuda/threshold.cuh and cuda/topk_sampled.cuh are the codecs' headers;
// device_impl of both is here.)
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
// the sample decides the count, not the work. docs/algorithms.md §4 (Lin et al.,
// DGC); docs/wire-format.md "Sparse pairs".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cuda/concepts.cuh>
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
namespace compress::cuda {
namespace detail {

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

// The skeleton of both encoders. The scratch is the counter block, then
// what `carve(cv)` takes from the carver (a size query: from nullptr). On a
// run (d_scratch given) the output is checked to hold `bound` pairs, the
// counters are zeroed, and `body(env, counts, idx)` enqueues the count,
// decide and selection kernels (idx: the payload's index array) and returns
// the capacity up to which finish_device_count gathers the values. A size
// query writes scratch_bytes and enqueues nothing.
template <class T, class Carve, class Body>
status counted_skeleton(const std::string& c, void* d_scratch, std::size_t& scratch_bytes, device_view<const T> x,
                        device_view<std::byte> out, std::size_t bound, std::uint64_t* d_used, cudaStream_t stream,
                        Carve&& carve, Body&& body) {
  if (x.size() > layout::sparse::max_elements)
    return out_of_range(c + ".input.size", x.size(), "exceeds 2^32 (indices are u32)");
  unsigned long long* counts = nullptr;
  const auto lay_out = [&](void* base) -> result<std::size_t> {
    scratch_carver cv(base);
    counts = cv.take<unsigned long long>(counter_slots);
    ASHL_TRY(carve(cv));
    return cv.bytes();
  };
  auto needed = lay_out(nullptr);
  if (!needed) return needed.error();
  auto go = scratch_protocol(c, d_scratch, scratch_bytes, *needed);
  if (!go) return go.error();
  if (!*go) return {};
  ASHL_TRY(check_output(c, out, layout::sparse_payload_bytes(bound, sizeof(T))));
  ASHL_TRY(lay_out(d_scratch).to_status());
  launch_env env;
  ASHL_TRY(current_launch_env(c, env));
  ASHL_TRY(cuda_check(cudaMemsetAsync(counts, 0, sizeof(unsigned long long) * counter_slots, stream), c + ".memset"));
  std::byte* const o = out.data();
  const result<std::uint64_t> capacity =
      body(env, counts, reinterpret_cast<std::uint32_t*>(o + layout::sparse::header_bytes));
  if (!capacity) return capacity.error();
  return finish_device_count<T>(c, x.data(), o, x.size(), *capacity, counts, d_used, env.dev, env.tune.elementwise,
                                stream);
}

// Exact top-k's pieces (dispatch_sparse.cuh), carved into `sel`.
template <class T>
status take_topk_scratch(scratch_carver& cv, std::size_t n, topk_scratch& sel) {
  auto t = carve_topk_scratch<T>(cv, n);
  if (!t) return t.error();
  sel = *t;
  return {};
}

template <class T>
status counted_encode(const compress::threshold& codec, void* d_scratch, std::size_t& scratch_bytes,
                      device_view<const T> x, device_view<std::byte> out, std::uint64_t* d_used, const codec_context&,
                      cudaStream_t stream) {
  const std::string c = "threshold";
  const std::size_t n = x.size();
  const std::size_t cap = codec.cap_for(n);
  const bool may_cap = cap < n;  // with cap = n every count fits

  // Layout: counters, the compaction's count and CUB storage, then the
  // selection's pieces when the cap can bind.
  std::int64_t* selected = nullptr;
  void* cub_temp = nullptr;
  std::size_t cub_bytes = 0;
  topk_scratch sel{};
  const auto carve = [&](scratch_carver& cv) -> status {
    selected = cv.take<std::int64_t>(1);
    cub_bytes = 0;
    ASHL_TRY(cuda_check(cub::DeviceSelect::If(nullptr, cub_bytes, index_iterator<T>(0),
                                              static_cast<std::uint32_t*>(nullptr),
                                              static_cast<std::int64_t*>(nullptr), static_cast<std::int64_t>(n),
                                              threshold_take<T>{nullptr, 0.0f, nullptr, 0}, cudaStream_t{}),
                        c + ".scratch_query"));
    cub_temp = cv.take_bytes(cub_bytes);
    return may_cap ? take_topk_scratch<T>(cv, n, sel) : status{};
  };
  return counted_skeleton<T>(
      c, d_scratch, scratch_bytes, x, out, cap, d_used, stream, carve,
      [&](const launch_env& env, unsigned long long* counts, std::uint32_t* idx) -> result<std::uint64_t> {
        if (n == 0) return std::uint64_t{cap};
        const float theta = codec.options().theta;
        const auto& ew = env.tune.elementwise;
        threshold_count_kernel<T><<<env.grid(n, ew.items_per_thread), ew.block_threads, 0, stream>>>(
            x.data(), n, theta, counts, ew.items_per_thread);
        threshold_decide_kernel<<<1, 1, 0, stream>>>(counts, cap);
        ASHL_TRY(cuda_check(cudaGetLastError(), c + ".count_kernels"));
        if (may_cap)
          ASHL_TRY(enqueue_topk_select<T>(c, x.data(), n, 0, counts + counter_select_k, sel, idx, env.dev, env.tune,
                                          stream));
        std::size_t bytes = cub_bytes;
        ASHL_TRY(cuda_check(cub::DeviceSelect::If(cub_temp, bytes, index_iterator<T>(0), idx, selected,
                                                  static_cast<std::int64_t>(n),
                                                  threshold_take<T>{x.data(), theta, counts, cap}, stream),
                            c + ".compaction"));
        return std::uint64_t{cap};
      });
}

// The sample rank r1 of the CPU encoder (topk_sampled.hpp), in the same
// double arithmetic.
inline std::uint32_t topk_sampled_rank(std::size_t n, std::size_t k) noexcept {
  constexpr double s = static_cast<double>(compress::topk_sampled::sample_size);
  const double base_rank = static_cast<double>(k) * s / static_cast<double>(n);
  return static_cast<std::uint32_t>(std::clamp(std::round(base_rank), 1.0, s));
}

template <class T>
status counted_encode(const compress::topk_sampled& codec, void* d_scratch, std::size_t& scratch_bytes,
                      device_view<const T> x, device_view<std::byte> out, std::uint64_t* d_used,
                      const codec_context& ctx, cudaStream_t stream) {
  const std::string c = "topk_sampled";
  const std::size_t n = x.size();
  const std::size_t k = codec.k_for(n);
  const std::size_t hi = codec.hi_for(n);
  constexpr std::uint32_t s = static_cast<std::uint32_t>(compress::topk_sampled::sample_size);
  const bool exact = n < compress::topk_sampled::min_sampled_n || k == n;

  std::uint32_t *keys = nullptr, *sorted = nullptr;
  void* sort_temp = nullptr;
  std::size_t sort_bytes = 0;
  topk_scratch sel{};
  const auto carve = [&](scratch_carver& cv) -> status {
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
    return n != 0 ? take_topk_scratch<T>(cv, n, sel) : status{};
  };
  // counts[count] = counts[select_k] = k, unless the sampled rule says otherwise.
  return counted_skeleton<T>(
      c, d_scratch, scratch_bytes, x, out, hi, d_used, stream, carve,
      [&](const launch_env& env, unsigned long long* counts, std::uint32_t* idx) -> result<std::uint64_t> {
        if (n == 0) return std::uint64_t{0};
        if (!exact) {
          const auto& ew = env.tune.elementwise;
          sample_keys_kernel<T><<<(s + 255) / 256, 256, 0, stream>>>(
              x.data(), n, philox_stream(ctx.seed, ctx.step, ctx.tensor), keys, s);
          ASHL_TRY(cuda_check(cudaGetLastError(), c + ".sample_kernel"));
          std::size_t bytes = sort_bytes;
          ASHL_TRY(cuda_check(cub::DeviceRadixSort::SortKeysDescending(sort_temp, bytes, keys, sorted,
                                                                       static_cast<int>(s), 0, 32, stream),
                              c + ".sort"));
          count_ge_eq_kernel<T><<<env.grid(n, ew.items_per_thread), ew.block_threads, 0, stream>>>(
              x.data(), n, sorted, topk_sampled_rank(n, k), counts, ew.items_per_thread);
          topk_sampled_decide_kernel<<<1, 1, 0, stream>>>(counts, k, codec.lo_for(n), hi);
        } else {
          topk_sampled_decide_kernel<<<1, 1, 0, stream>>>(counts, k, k + 1, k);  // an empty [lo, hi]: exactly k
        }
        ASHL_TRY(cuda_check(cudaGetLastError(), c + ".decide_kernels"));
        ASHL_TRY(enqueue_topk_select<T>(c, x.data(), n, 0, counts + counter_select_k, sel, idx, env.dev, env.tune,
                                        stream));
        return std::uint64_t{hi};
      });
}

// The device_impl of both: `out.used` is the bound max_encoded_bytes, the
// exact size is written to *out.d_used on the device (cuda/concepts.cuh).
template <class Codec>
struct counted_sparse_impl : sparse_pairs_decode<Codec> {
  template <gradient_element T>
  static status encode(const Codec& c, device_view<const T> x, device_output& out, const codec_context& ctx,
                       device_scratch& scratch, device_report*, cudaStream_t stream) {
    ASHL_TRY(c.validate());
    out.used = c.max_encoded_bytes(x.size(), dtype_of<T>);
    out.size_known = false;
    return counted_encode(c, scratch.data, scratch.bytes, x, out.bytes, out.d_used, ctx, stream);
  }
};

}  // namespace detail

template <>
struct device_impl<compress::threshold> : detail::counted_sparse_impl<compress::threshold> {};
template <>
struct device_impl<compress::topk_sampled> : detail::counted_sparse_impl<compress::topk_sampled> {};

static_assert(device_codec<compress::threshold>);
static_assert(device_codec<compress::topk_sampled>);

}  // namespace compress::cuda
ASHL_NAMESPACE_END
