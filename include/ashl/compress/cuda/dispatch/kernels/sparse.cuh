// ashl/compress/cuda/dispatch/kernels/sparse.cuh — kernels of the (index,
// value) payload shared by the sparse device codecs: header, value gather,
// the all-elements payload, and validated decode-add.
//
//   sparse_header_kernel<<<1, 1, 0, s>>>(out, n, d_count_or_null, count);
//   sparse_gather_kernel<<<g, b, 0, s>>>(x, out, k, ipt);
//   sparse_validate_kernel<dtype::f32><<<g, b, 0, s>>>(in, in_bytes, n, nonempty, report, max_pairs);
//   sparse_add_kernel<dtype::f32><<<g, b, 0, s>>>(in, acc, scale, report, max_pairs);
//
// Layout, as compress/detail/sparse.hpp: u64 n, u32 count, count u32 indices
// (strictly increasing, < n), count values in the input dtype. The payload
// base must be 4-byte aligned; n is read and written as two u32 halves so
// that 8-byte alignment is not needed.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/layout.hpp>
#include <ashl/core/dtype.hpp>

#include <cstddef>
#include <cstdint>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

// Header: n, and the count from `d_count` when given (decided on the device),
// else `count`.
template <class CountT>
__global__ ASHL_DETAIL_HIDDEN void sparse_header_kernel(std::byte* out, std::uint64_t n, const CountT* d_count,
                                                        std::uint64_t count) {
  auto* w = reinterpret_cast<std::uint32_t*>(out);
  w[0] = static_cast<std::uint32_t>(n);
  w[1] = static_cast<std::uint32_t>(n >> 32);
  w[2] = static_cast<std::uint32_t>(d_count != nullptr ? static_cast<std::uint64_t>(*d_count) : count);
}

// values[j] = bits of x[indices[j]] for j < count; the indices were written
// by the compaction. `d_count` (optional) bounds count on the device.
template <class T, class CountT>
__global__ ASHL_DETAIL_HIDDEN void sparse_gather_kernel(const T* __restrict__ x, std::byte* __restrict__ out,
                                                        std::uint64_t capacity, const CountT* d_count,
                                                        int items_per_thread) {
  const std::uint64_t count = d_count != nullptr ? static_cast<std::uint64_t>(*d_count) : capacity;
  const auto* idx = reinterpret_cast<const std::uint32_t*>(out + layout::sparse::header_bytes);
  auto* val = reinterpret_cast<device_bits_t<T>*>(out + layout::sparse::header_bytes + 4 * count);
  for_each_strided(count, items_per_thread, [&](std::size_t p) {
    val[p] = bits_of(x[idx[p]]);
  });
}

// Every element: indices 0..n-1 and the values (k = n).
template <class T>
__global__ ASHL_DETAIL_HIDDEN void sparse_all_kernel(const T* __restrict__ x, std::byte* __restrict__ out,
                                                     std::uint64_t n, int items_per_thread) {
  auto* idx = reinterpret_cast<std::uint32_t*>(out + layout::sparse::header_bytes);
  auto* val = reinterpret_cast<device_bits_t<T>*>(out + layout::sparse::header_bytes + 4 * n);
  for_each_strided(n, items_per_thread, [&](std::size_t i) {
    idx[i] = static_cast<std::uint32_t>(i);
    val[i] = bits_of(x[i]);
  });
}

__device__ __forceinline__ std::uint64_t sparse_read_n(const std::byte* in) noexcept {
  const auto* w = reinterpret_cast<const std::uint32_t*>(in);
  return static_cast<std::uint64_t>(w[0]) | (static_cast<std::uint64_t>(w[1]) << 32);
}
__device__ __forceinline__ std::uint32_t sparse_read_count(const std::byte* in) noexcept {
  return reinterpret_cast<const std::uint32_t*>(in)[2];
}

// The checks of compress/detail/sparse.hpp's decode_add_pairs, in parallel:
// header fields (one thread) and every index (range, strictly increasing).
// `max_pairs` = (in_bytes - 12) / (4 + value bytes): the most pairs the
// buffer can hold, so no thread reads past it whatever count says.
template <dtype Type>
__global__ ASHL_DETAIL_HIDDEN void sparse_validate_kernel(const std::byte* __restrict__ in, std::uint64_t in_bytes,
                                                          std::uint64_t expected_n, bool require_nonempty,
                                                          device_report* report, std::uint64_t max_pairs) {
  constexpr std::uint64_t vs = Type == dtype::f32 ? 4 : 2;
  const std::uint64_t n = sparse_read_n(in);
  const std::uint64_t count = sparse_read_count(in);
  const std::uint64_t gid = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (gid == 0) {
    if (n != expected_n)
      report_fault(report, device_fault::payload_n, ~std::uint64_t{0});
    else if (count > n || (require_nonempty && n != 0 && count == 0))
      report_fault(report, device_fault::payload_count, ~std::uint64_t{0});
    else if (in_bytes != layout::sparse::header_bytes + count * (4 + vs))
      report_fault(report, device_fault::payload_bytes, ~std::uint64_t{0});
  }
  const std::uint64_t pairs = count < max_pairs ? count : max_pairs;
  const auto* idx = reinterpret_cast<const std::uint32_t*>(in + layout::sparse::header_bytes);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t j = gid; j < pairs; j += stride) {
    const std::uint32_t i = idx[j];
    if (i >= n)
      report_fault(report, device_fault::index_out_of_range, j);
    else if (j != 0 && i <= idx[j - 1])
      report_fault(report, device_fault::index_not_increasing, j);
  }
}

// acc[index[j]] += scale * value[j], unless validation found a fault (then
// nothing is written, as on the CPU). Indices are strictly increasing, so no
// two threads touch one accumulator element and no atomics are needed.
template <dtype Type>
__global__ ASHL_DETAIL_HIDDEN void sparse_add_kernel(const std::byte* __restrict__ in, float* __restrict__ acc,
                                                     float scale, const device_report* __restrict__ verdict,
                                                     std::uint64_t max_pairs, int items_per_thread) {
  if (verdict->fault != 0) return;
  const std::uint64_t count = sparse_read_count(in);
  const std::uint64_t pairs = count < max_pairs ? count : max_pairs;
  const auto* idx = reinterpret_cast<const std::uint32_t*>(in + layout::sparse::header_bytes);
  const std::byte* val = in + layout::sparse::header_bytes + 4 * count;
  for_each_strided(pairs, items_per_thread, [&](std::size_t p) {
    const std::uint32_t i = idx[p];
    acc[i] = scaled_add(acc[i], scale, payload_value<Type>(val, p));
  });
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
