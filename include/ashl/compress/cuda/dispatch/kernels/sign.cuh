// ashl/compress/cuda/dispatch/kernels/sign.cuh — kernels of scaled sign
// compression (EF-signSGD) on the device.
//
//   sign_chunk_kernel<float><<<g, b, 0, s>>>(x, n, B, cpb, nchunks, chunk_sum);
//   sign_scale_kernel<<<g, b, 0, s>>>(n, B, cpb, nb, chunk_sum, scales, verdict);
//   sign_bits_kernel<float><<<g, b, 0, s>>>(x, n, B, scales, bits, residual, verdict);
//   sign_validate_*_kernel, sign_add_kernel: decode.
//
// Bit-exact with compress/sign.hpp as the host compiler builds it. The scale
// d = float(sum |x| / len) sums in double in detail::sum_abs_f64's order:
// chunks of 1024 from the bucket's start, in each two 2-lane accumulators
// (lane j of accumulator a sums elements 4g + 2a + j in order of g: four
// chains), combined as (c0 + c2) + (c1 + c3), the m mod 4 tail added one
// by one, chunk sums added in order. Four threads of a warp run a chunk's
// chains. Bits: one warp ballot per 32 elements (bit i = x_i < 0).
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/kernels/levels.cuh>
#include <ashl/compress/layout.hpp>
#include <ashl/core/dtype.hpp>

#include <cstddef>
#include <cstdint>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

template <class T>
__global__ ASHL_DETAIL_HIDDEN void sign_chunk_kernel(const T* __restrict__ x, std::uint64_t n, std::uint64_t B,
                                                     std::uint64_t cpb, std::uint64_t nchunks,
                                                     double* __restrict__ chunk_sum) {
  for_each_chunk_group<4>(n, B, cpb, nchunks, [&](std::uint64_t q, unsigned t, std::uint64_t lo, std::uint64_t m) {
    const std::uint64_t e = m & ~std::uint64_t{3};
    double acc = 0.0;
    for (std::uint64_t g = t; g < e; g += 4) acc = __dadd_rn(acc, static_cast<double>(abs_of(element_float(x[lo + g]))));
    const double v = __dadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 2));  // t < 2: c_t + c_{t+2}
    double s = __dadd_rn(v, __shfl_down_sync(0xffffffffu, v, 1));            // t = 0: a[0] + a[1]
    if (t == 0 && q < nchunks && m != 0) {
      for (std::uint64_t i = e; i < m; ++i) s = __dadd_rn(s, static_cast<double>(abs_of(element_float(x[lo + i]))));
      chunk_sum[q] = s;
    }
  });
}

static __global__ void sign_scale_kernel(std::uint64_t n, std::uint64_t B, std::uint64_t cpb, std::uint64_t nb,
                                         const double* __restrict__ chunk_sum, float* __restrict__ scales,
                                         device_report* verdict) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t b = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < nb; b += stride) {
    const std::uint64_t lo = b * B, len = lo + B < n ? B : n - lo;
    const std::uint64_t chunks = (len + stats_chunk - 1) / stats_chunk;
    double sum = 0.0;
    for (std::uint64_t p = 0; p < chunks; ++p) sum = __dadd_rn(sum, chunk_sum[b * cpb + p]);
    const float d = __double2float_rn(__ddiv_rn(sum, static_cast<double>(len)));
    if (!isfinite(d)) report_fault(verdict, device_fault::nonfinite_input, b);
    scales[b] = d;
  }
}

// Bits (LSB first, unused bits 0). Nothing when a scale was not finite. With a
// residual (x is then the residual): e[i] = e[i] + (bit ? d : -d), the CPU
// decoder's value at scale -1.
template <class T>
__global__ ASHL_DETAIL_HIDDEN void sign_bits_kernel(const T* x, std::uint64_t n, std::uint64_t B,
                                                    const float* __restrict__ scales, std::byte* __restrict__ bits,
                                                    float* residual, const device_report* __restrict__ verdict) {
  if (verdict->fault != 0) return;
  const unsigned lane = threadIdx.x & 31u;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t first = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + (threadIdx.x & ~31u);
  for (std::uint64_t w0 = first; w0 < n; w0 += stride) {  // warp-uniform
    const std::uint64_t i = w0 + lane;
    bool neg = false;
    if (i < n) {
      const float xf = element_float(x[i]);
      neg = xf < 0.0f;
      if (residual != nullptr) {
        const std::uint32_t du = __float_as_uint(__fmul_rn(-1.0f, scales[i / B]));
        residual[i] = __fadd_rn(residual[i], __uint_as_float(du ^ (neg ? 0x80000000u : 0u)));
      }
    }
    const std::uint32_t word = __ballot_sync(0xffffffffu, neg);
    if (lane == 0) {
      std::byte* o = bits + w0 / 8;
      if (w0 + 32 <= n) {
        *reinterpret_cast<std::uint32_t*>(o) = word;  // 32-element words are 4-byte aligned in the payload
      } else {
        for (std::uint64_t b = 0; b < (n - w0 + 7) / 8; ++b) o[b] = static_cast<std::byte>((word >> (8 * b)) & 0xffu);
      }
    }
  }
}

static __global__ void sign_validate_header_kernel(const std::byte* __restrict__ in, std::uint64_t in_bytes,
                                                   std::uint64_t expected_n, device_report* verdict) {
  const levels_header h = read_levels_header(in, false);
  if (h.n != expected_n || h.n > layout::bucketed_max_elements)
    report_fault(verdict, device_fault::payload_n, ~std::uint64_t{0});
  else if (h.bucket < 1)
    report_fault(verdict, device_fault::payload_field, ~std::uint64_t{0});
  else if (in_bytes != layout::sign_payload_bytes(h.n, h.bucket))
    report_fault(verdict, device_fault::payload_bytes, ~std::uint64_t{0});
}

// Padding of the last bit byte (after the scale check, as on the CPU).
static __global__ void sign_validate_padding_kernel(const std::byte* __restrict__ in, device_report* verdict) {
  if (verdict->fault != 0) return;
  const levels_header h = read_levels_header(in, false);
  if (h.n % 8 == 0) return;
  const std::byte* bits = in + 12 + 4 * ((h.n + h.bucket - 1) / h.bucket);
  if ((static_cast<unsigned>(bits[h.n / 8]) >> (h.n % 8)) != 0)
    report_fault(verdict, device_fault::payload_padding, ~std::uint64_t{0});
}

static __global__ void sign_add_kernel(const std::byte* __restrict__ in, float* __restrict__ acc, float scale,
                                       const device_report* __restrict__ verdict) {
  if (verdict->fault != 0) return;
  const levels_header h = read_levels_header(in, false);
  const auto* scales = reinterpret_cast<const float*>(in + 12);
  const std::byte* bits = in + 12 + 4 * ((h.n + h.bucket - 1) / h.bucket);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < h.n; i += stride) {
    const std::uint32_t du = __float_as_uint(__fmul_rn(scale, scales[i / h.bucket]));
    const std::uint32_t bit = (static_cast<std::uint32_t>(bits[i >> 3]) >> (i & 7u)) & 1u;
    acc[i] = __fadd_rn(acc[i], __uint_as_float(du ^ (bit << 31)));
  }
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
