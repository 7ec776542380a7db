// ashl/compress/cuda/dispatch/dispatch_sparse.cuh — launch logic of exact
// top-k on the device and of the sparse decode-add shared by the sparse
// codecs.
//
//   std::size_t bytes = 0, used = 0;
//   detail::dispatch_topk_encode<float>("topk", k, nullptr, bytes, x, out, used, stream);   // size query
//   detail::dispatch_topk_encode<float>("topk", k, d_scratch, bytes, x, out, used, stream);
//
// Exact top-k: radix selection of the threshold (kernels/radix_select.cuh;
// 3 histogram passes for f32, 2 for f16/bf16, and up to 3 more over indices
// only when ties at the threshold must be split), then one stream compaction
// of the selected indices in increasing order straight into the payload
// (cub::DeviceSelect::If over a counting iterator), then a gather of their
// values. No sort; every count stays on the device; k, and so the payload
// size, is known on the host. Decode: validation of the whole payload on the
// device, then the add, which is skipped when validation failed; the verdict
// is copied to the caller's device_report if one is given. docs/algorithms.md §4.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/concepts.cuh>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/launch.cuh>
#include <ashl/compress/cuda/dispatch/kernels/radix_select.cuh>
#include <ashl/compress/cuda/dispatch/kernels/sparse.cuh>
#include <ashl/compress/cuda/dispatch/tuning/tuning.cuh>
#include <ashl/compress/layout.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

inline constexpr std::size_t device_sparse_payload_bytes(std::size_t count, std::size_t value_bytes) noexcept {
  return layout::sparse_payload_bytes(count, value_bytes);
}

// Digit widths of the magnitude key (high digit first) and of the index.
template <class T>
inline constexpr std::array<int, 3> key_digit_widths =
    std::is_same_v<T, float> ? std::array<int, 3>{11, 11, 9} : std::array<int, 3>{8, 7, 0};
template <class T>
inline constexpr int key_bits = std::is_same_v<T, float> ? 31 : 15;
inline constexpr std::array<int, 3> index_digit_widths{11, 11, 10};
inline constexpr int histogram_passes = 6;

struct topk_scratch {
  select_state* state;
  std::uint32_t* hist;  // histogram_passes * radix_max_bins
  std::int64_t* selected;
  void* cub_temp;
  std::size_t cub_bytes;
};

template <class T>
using index_iterator = thrust::counting_iterator<std::uint32_t>;

// One layout for the size query and the run, carved from `c` (other
// pieces may come before or after it in the same scratch).
template <class T>
inline result<topk_scratch> carve_topk_scratch(scratch_carver& c, std::size_t n) {
  topk_scratch s{};
  s.state = c.take<select_state>(1);
  s.hist = c.take<std::uint32_t>(histogram_passes * radix_max_bins);
  s.selected = c.take<std::int64_t>(1);
  std::size_t cub_bytes = 0;
  const cudaError_t e =
      cub::DeviceSelect::If(nullptr, cub_bytes, index_iterator<T>(0), static_cast<std::uint32_t*>(nullptr),
                            static_cast<std::int64_t*>(nullptr), static_cast<std::int64_t>(n),
                            take_selected<T>{nullptr, nullptr}, cudaStream_t{});
  if (e != cudaSuccess) return cuda_check(e, "topk.scratch_query");
  s.cub_temp = c.take_bytes(cub_bytes);
  s.cub_bytes = cub_bytes;
  return s;
}
template <class T>
inline result<topk_scratch> carve_topk_scratch(void* d_scratch, std::size_t& total, std::size_t n) {
  scratch_carver c(d_scratch);
  auto s = carve_topk_scratch<T>(c, n);
  total = c.bytes();
  return s;
}

// Enqueues the exact selection of the k largest magnitudes (NaN above inf,
// ties to the lower index) and the compaction of their indices, in
// increasing order, to `idx`. k is `*d_k` when d_k is given (decided on the
// device; 0 selects nothing), else `host_k` (>= 1). n >= 1.
template <class T>
status enqueue_topk_select(const std::string& c, const T* x, std::size_t n, std::uint64_t host_k,
                           const unsigned long long* d_k, const topk_scratch& s, std::uint32_t* idx,
                           const device_properties& dev, const codec_tuning& tune, cudaStream_t stream) {
  ASHL_TRY(cuda_check(cudaMemsetAsync(s.hist, 0, sizeof(std::uint32_t) * histogram_passes * radix_max_bins, stream),
                      c + ".memset"));
  if (d_k != nullptr)
    select_init_device_kernel<<<1, 1, 0, stream>>>(s.state, d_k);
  else
    select_init_kernel<<<1, 1, 0, stream>>>(s.state, host_k);

  const auto& h = tune.histogram;
  const unsigned hgrid = grid_for(n, h.block_threads, h.items_per_thread, dev.sm_count, h.blocks_per_sm);
  int pass = 0;
  int done = 0;
  constexpr auto kw = key_digit_widths<T>;
  for (std::size_t d = 0; d < kw.size() && kw[d] != 0; ++d, ++pass) {
    const int w = kw[d];
    const int shift = key_bits<T> - done - w;
    const bool last = d + 1 == kw.size() || kw[d + 1] == 0;
    std::uint32_t* hist = s.hist + pass * radix_max_bins;
    key_histogram_kernel<T><<<hgrid, h.block_threads, 0, stream>>>(x, n, s.state, shift, w, hist,
                                                                  h.items_per_thread);
    select_digit_kernel<false><<<1, select_block_threads, 0, stream>>>(hist, w, s.state, last);
    done += w;
  }
  done = 0;
  for (std::size_t d = 0; d < index_digit_widths.size(); ++d, ++pass) {
    const int w = index_digit_widths[d];
    const int shift = 32 - done - w;
    std::uint32_t* hist = s.hist + pass * radix_max_bins;
    index_histogram_kernel<T><<<hgrid, h.block_threads, 0, stream>>>(x, n, s.state, shift, w, hist,
                                                                    h.items_per_thread);
    select_digit_kernel<true><<<1, select_block_threads, 0, stream>>>(hist, w, s.state,
                                                                      d + 1 == index_digit_widths.size());
    done += w;
  }
  ASHL_TRY(cuda_check(cudaGetLastError(), c + ".select_kernels"));
  std::size_t cub_bytes = s.cub_bytes;
  return cuda_check(cub::DeviceSelect::If(s.cub_temp, cub_bytes, index_iterator<T>(0), idx, s.selected,
                                          static_cast<std::int64_t>(n), take_selected<T>{x, s.state}, stream),
                    c + ".compaction");
}

template <class T>
status dispatch_topk_encode(std::string_view codec, std::size_t k, void* d_scratch, std::size_t& scratch_bytes,
                            device_view<const T> x, device_view<std::byte> out, std::size_t& used_bytes,
                            cudaStream_t stream) {
  const std::string c(codec);
  const std::size_t n = x.size();
  if (n > layout::sparse::max_elements)
    return out_of_range(c + ".input.size", n, "exceeds 2^32 (indices are u32)");
  const std::size_t bytes = device_sparse_payload_bytes(k, sizeof(T));
  used_bytes = bytes;
  std::size_t needed = 0;
  auto layout_query = carve_topk_scratch<T>(nullptr, needed, n);
  if (!layout_query) return layout_query.error();
  auto go = scratch_protocol(codec, d_scratch, scratch_bytes, needed);
  if (!go) return go.error();
  if (!*go) return {};
  ASHL_TRY(check_output(codec, out, bytes));
  launch_env env;
  ASHL_TRY(current_launch_env(c, env));
  const auto& [dev, tune] = env;
  const auto& ew = tune.elementwise;
  std::byte* const o = out.data();

  if (k == n) {  // everything (n = 0 included: the header alone)
    sparse_header_kernel<std::uint32_t><<<1, 1, 0, stream>>>(o, n, nullptr, n);
    if (n != 0)
      sparse_all_kernel<T><<<grid_for(n, ew.block_threads, ew.items_per_thread, dev.sm_count, ew.blocks_per_sm),
                             ew.block_threads, 0, stream>>>(x.data(), o, n, ew.items_per_thread);
    return cuda_check(cudaGetLastError(), c + ".all_kernel");
  }

  std::size_t total = 0;
  auto carved = carve_topk_scratch<T>(d_scratch, total, n);
  if (!carved) return carved.error();
  auto* idx = reinterpret_cast<std::uint32_t*>(o + layout::sparse::header_bytes);
  ASHL_TRY(enqueue_topk_select<T>(c, x.data(), n, k, nullptr, *carved, idx, dev, tune, stream));
  sparse_header_kernel<std::uint32_t><<<1, 1, 0, stream>>>(o, n, nullptr, k);
  sparse_gather_kernel<T, std::uint32_t>
      <<<grid_for(k, ew.block_threads, ew.items_per_thread, dev.sm_count, ew.blocks_per_sm), ew.block_threads, 0,
         stream>>>(x.data(), o, k, nullptr, ew.items_per_thread);
  return cuda_check(cudaGetLastError(), c + ".gather_kernel");
}

// Validated decode-add of a sparse payload. Host checks: dtype, accumulator
// size, finite scale, at least a header, alignment. Device checks (into the
// scratch verdict, copied to d_report when given): everything else that
// compress/detail/sparse.hpp's decode_add_pairs checks.
inline status dispatch_sparse_decode_add(std::string_view codec, bool require_nonempty, void* d_scratch,
                                         std::size_t& scratch_bytes, device_view<const std::byte> in,
                                         payload_info info, device_view<float> acc, float scale,
                                         cudaStream_t stream, device_report* d_report) {
  return decode_skeleton(
      codec, d_scratch, scratch_bytes, in, info, acc, scale, layout::sparse::header_bytes, d_report, stream,
      [&](device_report* verdict, const launch_env& env) -> status {
        const std::size_t vs = size_of(info.type);
        const std::uint64_t max_pairs = (in.size() - layout::sparse::header_bytes) / (4 + vs);
        const unsigned grid = env.grid(max_pairs, env.items_per_thread());
        const int bt = env.block(), ipt = env.items_per_thread();
        with_value_type(info.type, [&](auto type) {
          constexpr dtype V = decltype(type)::value;
          sparse_validate_kernel<V>
              <<<grid, bt, 0, stream>>>(in.data(), in.size(), info.count, require_nonempty, verdict, max_pairs);
          sparse_add_kernel<V><<<grid, bt, 0, stream>>>(in.data(), acc.data(), scale, verdict, max_pairs, ipt);
        });
        return {};
      });
}

// The decode_add of every sparse-pairs codec's device_impl (topk,
// threshold, topk_sampled): one kernel path, the host codec's name and its
// require_nonempty (detail::sparse_codec).
template <class Codec>
struct sparse_pairs_decode {
  static status decode_add(const Codec&, device_view<const std::byte> in, payload_info info, device_view<float> acc,
                           float scale, const codec_context&, device_scratch& scratch, device_report* report,
                           cudaStream_t stream) {
    return dispatch_sparse_decode_add(to_string(Codec::id), Codec::require_nonempty, scratch.data, scratch.bytes, in,
                                      info, acc, scale, stream, report);
  }
};

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
