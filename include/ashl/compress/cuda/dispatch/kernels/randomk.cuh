// ashl/compress/cuda/dispatch/kernels/randomk.cuh — kernels of random-k on
// the device: header, per-stratum gather, validation and decode-add.
//
//   randomk_header_kernel<<<1, 1, 0, s>>>(out, n, k, unbiased, seed);
//   randomk_gather_kernel<float><<<g, b, 0, s>>>(x, out, n, k, rng, residual, ipt);
//   randomk_validate_kernel<<<1, 1, 0, s>>>(in, in_bytes, expected_n, value_bytes, verdict);
//   randomk_add_kernel<dtype::f32><<<g, b, 0, s>>>(in, acc, scale, step, tensor, verdict, max_k, ipt);
//
// Payload of compress/randomk.hpp: u64 n, u32 k, u8 flags, u64 seed at byte
// 13, k values at byte 21 (unaligned: byte-wise access). Stratum j covers
// [floor(j n / k), floor((j + 1) n / k)) and its index is drawn from the 64-bit
// word (lane 1 << 32 | lane 0) of philox_stream(seed, step, tensor) at element
// j, exactly as randomk::draw does on the host (that function is not
// host-device, so its four lines are restated in randomk_draw below).
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/layout.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>

#include <cstddef>
#include <cstdint>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

struct randomk_stratum {
  std::uint64_t length, index;
};

// randomk::draw (compress/randomk.hpp), on the device.
__device__ __forceinline__ randomk_stratum randomk_draw(const philox_stream& rng, std::uint64_t n, std::uint64_t k,
                                                        std::uint64_t j) noexcept {
  const std::uint64_t start = j * n / k;
  const std::uint64_t len = (j + 1) * n / k - start;
  const philox_block b = rng.block(j >> 2, 1);
  const philox_block a = rng.block(j >> 2, 0);
  const std::uint64_t hi = b[static_cast<int>(j & 3u)], lo = a[static_cast<int>(j & 3u)];
  const std::uint64_t off = (hi * len + ((lo * len) >> 32)) >> 32;
  return {len, start + off};
}

static __global__ void randomk_header_kernel(std::byte* out, std::uint64_t n, std::uint32_t k,
                                                         std::uint8_t flags, std::uint64_t seed) {
  store_unaligned<std::uint64_t>(out, n);
  store_unaligned<std::uint32_t>(out + 8, k);
  out[12] = static_cast<std::byte>(flags);
  store_unaligned<std::uint64_t>(out + 13, seed);
}

// values[j] = bits of x[index_j]. With a residual (error feedback, x is then
// the residual itself): also what the CPU decorator's decode_add with scale
// -1 does, e[index_j] = e[index_j] + w * value with w = -1 (times the stratum
// length when unbiased).
template <class T>
__global__ ASHL_DETAIL_HIDDEN void randomk_gather_kernel(const T* x, std::byte* __restrict__ out,
                                                         std::uint64_t n, std::uint64_t k, philox_stream rng,
                                                         float* residual, bool unbiased, int items_per_thread) {
  std::byte* val = out + layout::randomk::header_bytes;
  for_each_strided(k, items_per_thread, [&](std::uint64_t j) {
    const randomk_stratum s = randomk_draw(rng, n, k, j);
    const T v = x[s.index];
    store_unaligned<device_bits_t<T>>(val + sizeof(T) * j, bits_of(v));
    if constexpr (std::is_same_v<T, float>) {
      if (residual != nullptr) {
        const float w = unbiased ? __fmul_rn(-1.0f, __ull2float_rn(s.length)) : -1.0f;
        residual[s.index] = __fadd_rn(residual[s.index], __fmul_rn(w, v));
      }
    }
  });
}

// The checks of randomk::decode_add, in its order; faults go to `verdict`.
static __global__ void randomk_validate_kernel(const std::byte* __restrict__ in, std::uint64_t in_bytes,
                                                           std::uint64_t expected_n, std::uint64_t value_bytes,
                                                           device_report* verdict) {
  const std::uint64_t n = load_unaligned<std::uint64_t>(in);
  const std::uint64_t k = load_unaligned<std::uint32_t>(in + 8);
  const unsigned flags = static_cast<unsigned>(in[12]);
  if (n != expected_n)
    report_fault(verdict, device_fault::payload_n, ~std::uint64_t{0});
  else if (n > layout::randomk::max_elements || k > n || (n != 0 && k == 0))
    report_fault(verdict, device_fault::payload_count, ~std::uint64_t{0});
  else if ((flags & ~1u) != 0)
    report_fault(verdict, device_fault::payload_field, ~std::uint64_t{0});
  else if (in_bytes != layout::randomk::header_bytes + k * value_bytes)
    report_fault(verdict, device_fault::payload_bytes, ~std::uint64_t{0});
}

// acc[index_j] = acc[index_j] + w * value_j, w = scale (times the stratum
// length when unbiased), as the CPU rounds (no FMA). Strata are disjoint and
// increasing, so no two threads touch one element. Nothing when the payload
// failed validation; `max_k` (from the buffer size) bounds every read.
template <dtype Type>
__global__ ASHL_DETAIL_HIDDEN void randomk_add_kernel(const std::byte* __restrict__ in, float* __restrict__ acc,
                                                      float scale, std::uint64_t step, std::uint32_t tensor,
                                                      const device_report* __restrict__ verdict, std::uint64_t max_k,
                                                      int items_per_thread) {
  if (verdict->fault != 0) return;
  const std::uint64_t n = load_unaligned<std::uint64_t>(in);
  std::uint64_t k = load_unaligned<std::uint32_t>(in + 8);
  if (k > max_k) k = max_k;
  const bool unbiased = (static_cast<unsigned>(in[12]) & 1u) != 0;
  const philox_stream rng(load_unaligned<std::uint64_t>(in + 13), step, tensor);
  const std::byte* val = in + layout::randomk::header_bytes;
  constexpr std::size_t vs = Type == dtype::f32 ? 4 : 2;
  for_each_strided(k, items_per_thread, [&](std::uint64_t j) {
    const randomk_stratum s = randomk_draw(rng, n, k, j);
    const float w = unbiased ? __fmul_rn(scale, __ull2float_rn(s.length)) : scale;
    float v;
    if constexpr (Type == dtype::f32)
      v = __uint_as_float(load_unaligned<std::uint32_t>(val + vs * j));
    else if constexpr (Type == dtype::f16)
      v = ::ashl::detail::f16_bits_to_f32(load_unaligned<std::uint16_t>(val + vs * j));
    else
      v = ::ashl::detail::bf16_bits_to_f32(load_unaligned<std::uint16_t>(val + vs * j));
    acc[s.index] = scaled_add(acc[s.index], w, v);
  });
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
