// ashl/compress/cuda/dispatch/kernels/dense.cuh — element-wise kernels of the
// dense codecs: identity and 16-bit cast encodes, dense decode-add.
//
//   dense_encode_kernel<float, dense_target::f16><<<g, b, 0, s>>>(x, out, n, strict, report, ipt);
//   dense_decode_add_kernel<dtype::bf16><<<g, b, 0, s>>>(payload, acc, n, scale, ipt);
//
// The payloads are those of compress/identity.hpp and compress/cast.hpp: n
// values (identity: the input's own bits; casts: u16 patterns) and nothing
// else. The conversions are core/dtype.hpp's, which give exactly the bits of
// the CPU codecs (test/compress/cast.cpp ties the two). Kernels have hidden
// visibility and live in the versioned namespace.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/core/dtype.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

enum class dense_target { identity, f16, bf16 };

template <class T, dense_target Target>
__device__ __forceinline__ void dense_encode_one(const T* x, void* out, std::size_t i, bool strict,
                                                 device_report* report) noexcept {
  if constexpr (Target == dense_target::identity) {
    static_cast<device_bits_t<T>*>(out)[i] = bits_of(x[i]);
  } else {
    constexpr bool to_half = Target == dense_target::f16;
    constexpr bool own = to_half ? std::is_same_v<T, half> : std::is_same_v<T, bfloat16>;
    std::uint16_t h;
    if constexpr (own) {
      h = x[i].bits;  // already the target format: bit for bit, never an overflow
    } else {
      const float f = to_float(x[i]);
      h = to_half ? ::ashl::detail::f32_to_f16_bits(f) : ::ashl::detail::f32_to_bf16_bits(f);
      if (strict) {
        const bool inf_out = to_half ? (h & 0x7fffu) == 0x7c00u : (h & 0x7fffu) == 0x7f80u;
        if (inf_out && isfinite(f)) report_fault(report, device_fault::overflow, i);
      }
    }
    static_cast<std::uint16_t*>(out)[i] = h;
  }
}

template <class T, dense_target Target>
__global__ ASHL_DETAIL_HIDDEN void dense_encode_kernel(const T* __restrict__ x, void* __restrict__ out,
                                                       std::size_t n, bool strict, device_report* report,
                                                       int items_per_thread) {
  for_each_strided(n, items_per_thread, [&](std::size_t i) {
    dense_encode_one<T, Target>(x, out, i, strict, report);
  });
}

// acc[i] = acc[i] + scale * value[i], rounded as the CPU rounds (no FMA).
template <dtype Type>
__global__ ASHL_DETAIL_HIDDEN void dense_decode_add_kernel(const std::byte* __restrict__ payload,
                                                           float* __restrict__ acc, std::size_t n, float scale,
                                                           int items_per_thread) {
  for_each_strided(n, items_per_thread, [&](std::size_t i) {
    acc[i] = scaled_add(acc[i], scale, payload_value<Type>(payload, i));
  });
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
