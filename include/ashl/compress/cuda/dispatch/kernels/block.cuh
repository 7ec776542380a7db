// ashl/compress/cuda/dispatch/kernels/block.cuh — kernels of the block-scaled
// integer codec on the device: per-block steps, codes (with the
// error-feedback subtraction fused), validation and decode-add.
//
//   block_steps_kernel<float><<<g, b, 0, s>>>(x, n, B, m, steps, r, verdict);   // one warp per block
//   block_codes_kernel<float><<<g, b, 0, s>>>(x, n, B, bits, m, r, steps, codes, stochastic, rng, residual, verdict);
//   block_validate_header_kernel<<<1, 1, 0, s>>>(in, in_bytes, n, verdict);
//   block_validate_body_kernel<<<g, b, 0, s>>>(in, n, verdict);
//   block_add_kernel<<<g, b, 0, s>>>(in, acc, n, scale, verdict);
//
// The arithmetic is compress/block.hpp's, operation for operation, with the
// rounding of each step explicit (__fdiv_rn, __fmul_rn, __fadd_rn, never a
// contracted multiply-add): step = absmax / m, r = m / absmax, t = x r,
// nearest q = round-half-even(t) (the CPU's 1.5 2^23 constant rounds the
// same way), stochastic q = floor(t + u 2^-24) with u = word >> 8 of
// Philox block i / 4, word i % 4; q clamped to [-m, m]; a block with
// absmax < 2^-120 sends step 0 and codes 0. So the payload is the CPU's, bit
// for bit. One thread writes one code byte (8 / bits elements, never two
// blocks: B is a multiple of 8). docs/codecs.md "block".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/kernels/reduce.cuh>
#include <ashl/compress/layout.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>

#include <cstddef>
#include <cstdint>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

// compress::block_quant::min_absmax (2^-120), as a device constant.
inline constexpr float block_min_absmax = 0x1p-120f;

// One warp per block b: absmax over the block's elements (f32 |x| bit
// patterns), then lane 0 writes step b into the payload and the block's
// multiplier r into scratch (0 for a block sent as zero). A non-finite
// absmax is recorded in `verdict` with the block's index.
template <class T>
__global__ ASHL_DETAIL_HIDDEN void block_steps_kernel(const T* __restrict__ x, std::uint64_t n, std::uint64_t B,
                                                      float m, std::byte* __restrict__ steps, float* __restrict__ r,
                                                      device_report* verdict) {
  const std::uint64_t nb = layout::bucket_count(n, B);
  const std::uint64_t warps = (static_cast<std::uint64_t>(gridDim.x) * blockDim.x) / 32;
  const unsigned lane = threadIdx.x & 31u;
  for (std::uint64_t b = (static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; b < nb;
       b += warps) {
    const std::uint64_t lo = b * B, hi = lo + B < n ? lo + B : n;
    std::uint32_t key = 0;
    for (std::uint64_t i = lo + lane; i < hi; i += 32) key = max(key, __float_as_uint(element_float(x[i])) & 0x7fffffffu);
    key = __reduce_max_sync(full_warp_mask, key);
    if (lane == 0) {
      float step = 0.0f, mult = 0.0f;
      if (key >= 0x7f800000u) {
        report_fault(verdict, device_fault::nonfinite_input, b);
      } else {
        const float absmax = __uint_as_float(key);
        if (!(absmax < block_min_absmax)) {
          step = __fdiv_rn(absmax, m);
          mult = __fdiv_rn(m, absmax);
        }
      }
      reinterpret_cast<float*>(steps)[b] = step;
      r[b] = mult;
    }
  }
}

__device__ __forceinline__ std::int32_t block_clamp(std::int32_t q, std::int32_t m) noexcept {
  return q < -m ? -m : (q > m ? m : q);
}

// The code of one element: x times the block's multiplier, rounded.
__device__ __forceinline__ std::int32_t block_code(float xf, float r, std::int32_t m, bool stochastic,
                                                   std::uint32_t word) noexcept {
  const float t = __fmul_rn(xf, r);
  if (!stochastic) return block_clamp(__float2int_rn(t), m);
  const float tu = __fadd_rn(t, __fmul_rn(static_cast<float>(static_cast<std::int32_t>(word >> 8)), 0x1p-24f));
  const std::int32_t tz = __float2int_rz(tu);
  return block_clamp(tz - (static_cast<float>(tz) > tu ? 1 : 0), m);
}

// One thread per code byte j: elements j * (8 / bits) .. + 8 / bits - 1
// (those past n are padding, 0). Nothing is written once `verdict` holds a
// fault (a non-finite block). With a residual (x is then the residual):
// e[i] = e[i] + (-step) q, what the CPU decorator's decode_add(-1) adds.
template <class T>
__global__ ASHL_DETAIL_HIDDEN void block_codes_kernel(const T* x, std::uint64_t n, std::uint64_t B, unsigned bits,
                                                      std::int32_t m, const float* __restrict__ r,
                                                      const std::byte* steps, std::byte* __restrict__ codes,
                                                      bool stochastic, philox_stream rng, float* residual,
                                                      const device_report* verdict) {
  if (verdict->fault != 0) return;
  const unsigned per = 8 / bits;
  const std::uint64_t nbytes = layout::packed_bytes(n, bits);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint32_t mask = (1u << bits) - 1u;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < nbytes; j += stride) {
    const std::uint64_t i0 = j * per;
    const std::uint64_t b = i0 / B;
    const float rb = r[b];
    const float neg_step = -reinterpret_cast<const float*>(steps)[b];
    std::uint32_t byte = 0;
    for (unsigned k = 0; k < per; ++k) {
      const std::uint64_t i = i0 + k;
      if (i >= n) break;
      const std::uint32_t word = stochastic ? rng.block(i / 4)[static_cast<int>(i % 4)] : 0u;
      const std::int32_t q = block_code(element_float(x[i]), rb, m, stochastic, word);
      byte |= (static_cast<std::uint32_t>(q) & mask) << (k * bits);
      if (residual != nullptr) residual[i] = __fadd_rn(residual[i], __fmul_rn(neg_step, static_cast<float>(q)));
    }
    codes[j] = static_cast<std::byte>(byte);
  }
}

// block_quant::decode_add's header checks, in its order (one thread).
static __global__ void block_validate_header_kernel(const std::byte* __restrict__ in, std::uint64_t in_bytes,
                                                    std::uint64_t expected_n, device_report* verdict) {
  const auto* h = reinterpret_cast<const std::uint32_t*>(in);
  const std::uint64_t n = static_cast<std::uint64_t>(h[0]) | (static_cast<std::uint64_t>(h[1]) << 32);
  const std::uint32_t B = h[2];
  const unsigned bits = h[3] & 0xffu, rounding = (h[3] >> 8) & 0xffu, reserved = h[3] >> 16;
  if (n != expected_n || n > layout::bucketed_max_elements)
    report_fault(verdict, device_fault::payload_n, ~std::uint64_t{0});
  else if (!layout::block_size_valid(B) || !layout::block_bits_valid(bits) ||
           rounding > layout::block::rounding_stochastic || reserved != 0)
    report_fault(verdict, device_fault::payload_field, ~std::uint64_t{0});
  else if (in_bytes != layout::block_payload_bytes(n, B, bits))
    report_fault(verdict, device_fault::payload_bytes, ~std::uint64_t{0});
}

// Steps (finite, >= +0), codes (never -2^(bits-1)) and the last byte's
// padding, once the header is known good (the caller launches its check first).
static __global__ void block_validate_body_kernel(const std::byte* __restrict__ in, std::uint64_t n,
                                                  device_report* verdict) {
  if (verdict->fault != 0) return;
  const auto* h = reinterpret_cast<const std::uint32_t*>(in);
  const std::uint64_t B = h[2];
  const unsigned bits = h[3] & 0xffu;
  const std::uint64_t nb = layout::bucket_count(n, B);
  const auto* steps = reinterpret_cast<const std::uint32_t*>(in + layout::block::header_bytes);
  const std::byte* codes = in + layout::block_codes_offset(n, B);
  const std::uint64_t nbytes = layout::packed_bytes(n, bits);
  const unsigned per = 8 / bits;
  const std::uint32_t mask = (1u << bits) - 1u, bad = 1u << (bits - 1);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t first = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::uint64_t b = first; b < nb; b += stride)
    if (steps[b] >= 0x7f800000u) report_fault(verdict, device_fault::payload_scale, b);
  for (std::uint64_t j = first; j < nbytes; j += stride) {
    const auto byte = static_cast<std::uint32_t>(codes[j]);
    for (unsigned k = 0; k < per; ++k)
      if (((byte >> (k * bits)) & mask) == bad) report_fault(verdict, device_fault::payload_code, j * per + k);
    if (j == nbytes - 1 && (n * bits) % 8 != 0 && (byte >> ((n * bits) % 8)) != 0)
      report_fault(verdict, device_fault::payload_padding, ~std::uint64_t{0});
  }
}

// acc[i] = acc[i] + (scale step_b) q_i, the CPU's two roundings.
static __global__ void block_add_kernel(const std::byte* __restrict__ in, float* __restrict__ acc, std::uint64_t n,
                                        float scale, const device_report* __restrict__ verdict) {
  if (verdict->fault != 0) return;
  const auto* h = reinterpret_cast<const std::uint32_t*>(in);
  const std::uint64_t B = h[2];
  const unsigned bits = h[3] & 0xffu;
  const auto* steps = reinterpret_cast<const float*>(in + layout::block::header_bytes);
  const std::byte* codes = in + layout::block_codes_offset(n, B);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float f = __fmul_rn(scale, steps[i / B]);
    const std::uint64_t bit = i * bits;
    const auto field = static_cast<std::uint32_t>(static_cast<std::uint32_t>(codes[bit / 8]) >> (bit % 8));
    // Sign-extend the bits-bit field from the top of an int32.
    const std::int32_t q = static_cast<std::int32_t>(field << (32 - bits)) >> (32 - bits);
    acc[i] = __fadd_rn(acc[i], __fmul_rn(f, static_cast<float>(q)));
  }
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
