// ashl/compress/cuda/dispatch/kernels/levels.cuh — kernels of the bucketed
// stochastic level quantizers (qsgd, terngrad) on the device.
//
//   levels_chunk_kernel<float, true><<<g, b, 0, s>>>(x, n, B, cpb, nchunks, chunk_sum, chunk_max);
//   levels_scale_kernel<float, true><<<g, b, 0, s>>>(x, n, B, cpb, nb, chunk_sum, chunk_max, scales, verdict);
//   levels_codes_kernel<float><<<g, b, 0, s>>>(x, n, B, L, bits, scales, codes, rng, residual, verdict);
//   levels_validate_*_kernel, levels_add_kernel: decode.
//
// Bit-exact with compress/detail/levels.hpp as the host compiler builds it
// (gcc/clang, its 4-lane vector path). The one order-dependent quantity is
// qsgd's f32 sum of squares: detail::stats walks a bucket in chunks of 1024
// from the bucket's start; in each chunk, lane l of two 4-lane accumulators
// sums the squares of elements 8g + l and 8g + 4 + l in order of g (eight
// sequential chains), the lanes are combined as
// ((c0 + c4) + (c1 + c5)) + ((c2 + c6) + (c3 + c7)), the m mod 8 tail
// elements are added one by one, and chunk sums are added in order. Here
// eight threads of one warp run the eight chains of a chunk, shuffles do the
// combination, and one thread per bucket adds the chunk sums; every
// operation is __fmul_rn/__fadd_rn, so nothing is contracted to an FMA (the
// CPU build has none either). Everything else (max |x|, the double
// fallback, the rounding of each element) is order-free or done by one
// thread in the CPU's order.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/kernels/reduce.cuh>
#include <ashl/compress/layout.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>

#include <cfloat>
#include <cstddef>
#include <cstdint>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

inline constexpr std::uint64_t stats_chunk = 1024;  // compress/detail/quantize.hpp's chunk

// Chunk q (of cpb per bucket of B elements, n in all) as [lo, lo + m): the
// statistics chunks of levels_chunk_kernel and sign_chunk_kernel.
__device__ __forceinline__ void chunk_extent(std::uint64_t q, std::uint64_t cpb, std::uint64_t B, std::uint64_t n,
                                             std::uint64_t& lo, std::uint64_t& m) noexcept {
  const std::uint64_t b = q / cpb, p = q % cpb;
  const std::uint64_t bend = (b + 1) * B < n ? (b + 1) * B : n;
  lo = b * B + p * stats_chunk;
  m = lo < bend ? (bend - lo < stats_chunk ? bend - lo : stats_chunk) : 0;
}

// The chunk loop of the statistics kernels (levels_chunk_kernel,
// sign_chunk_kernel): Lanes lanes per chunk (a power of two dividing 32),
// 32 / Lanes chunks per warp, grid-stride over warps. Every lane of a warp
// calls f(q, t, lo, m) in the same iteration, so f may shuffle across the
// warp: q is the chunk, t the lane within the chunk's group, [lo, lo + m) its
// elements (m = 0 when q >= nchunks).
template <unsigned Lanes, class F>
__device__ __forceinline__ void for_each_chunk_group(std::uint64_t n, std::uint64_t B, std::uint64_t cpb,
                                                     std::uint64_t nchunks, F&& f) {
  static_assert(Lanes != 0 && 32 % Lanes == 0 && (Lanes & (Lanes - 1)) == 0);
  constexpr unsigned per_warp = 32 / Lanes;
  const unsigned lane = threadIdx.x & 31u;
  const std::uint64_t warps = (static_cast<std::uint64_t>(gridDim.x) * blockDim.x) >> 5;
  for (std::uint64_t cw = (static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
       cw * per_warp < nchunks; cw += warps) {
    const std::uint64_t q = cw * per_warp + lane / Lanes;
    std::uint64_t lo = 0, m = 0;
    if (q < nchunks) chunk_extent(q, cpb, B, n, lo, m);
    f(q, lane & (Lanes - 1), lo, m);
  }
}

// Chunks of stats_chunk per bucket (the last bucket may use fewer).
inline std::uint64_t levels_chunks_per_bucket(std::uint64_t n, std::uint64_t bucket) noexcept {
  const std::uint64_t len = bucket < n ? bucket : n;
  return (len + stats_chunk - 1) / stats_chunk;
}

__device__ __forceinline__ float abs_of(float v) noexcept { return __uint_as_float(__float_as_uint(v) & 0x7fffffffu); }

// Chunk statistics: chunk q is chunk q % cpb of bucket q / cpb. Writes the
// chunk's f32 sum of squares (when L2) and its max |x| key.
template <class T, bool L2>
__global__ ASHL_DETAIL_HIDDEN void levels_chunk_kernel(const T* __restrict__ x, std::uint64_t n, std::uint64_t B,
                                                       std::uint64_t cpb, std::uint64_t nchunks,
                                                       float* __restrict__ chunk_sum,
                                                       std::uint32_t* __restrict__ chunk_max) {
  for_each_chunk_group<8>(n, B, cpb, nchunks, [&](std::uint64_t q, unsigned t, std::uint64_t lo, std::uint64_t m) {
    float sq = 0.0f;
    std::uint32_t mk = 0;
    const std::uint64_t e = m & ~std::uint64_t{7};
    for (std::uint64_t g = t; g < e; g += 8) {
      const float a = abs_of(element_float(x[lo + g]));
      if constexpr (L2) sq = __fadd_rn(sq, __fmul_rn(a, a));
      mk = max(mk, __float_as_uint(a));
    }
    // Lanes 8j .. 8j+7 hold chains 0..7 of chunk 4 cw + j.
    if constexpr (L2) {
      const float v = __fadd_rn(sq, __shfl_down_sync(0xffffffffu, sq, 4));  // t < 4: c_t + c_{t+4}
      const float v2 = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 1));   // t = 0, 2: pairs
      sq = __fadd_rn(v2, __shfl_down_sync(0xffffffffu, v2, 2));             // t = 0: the chunk's lanes
    }
    mk = group_max<8>(mk);
    if (t == 0 && q < nchunks && m != 0) {
      for (std::uint64_t i = e; i < m; ++i) {
        const float a = abs_of(element_float(x[lo + i]));
        if constexpr (L2) sq = __fadd_rn(sq, __fmul_rn(a, a));
        mk = max(mk, __float_as_uint(a));
      }
      if constexpr (L2) chunk_sum[q] = sq;
      chunk_max[q] = mk;
    }
  });
}

// detail::bucket_scale, one thread per bucket: the scale (L2 norm or max
// |x|) into the payload; a non-finite one is recorded (bucket index).
template <class T, bool L2>
__global__ ASHL_DETAIL_HIDDEN void levels_scale_kernel(const T* __restrict__ x, std::uint64_t n, std::uint64_t B,
                                                       std::uint64_t cpb, std::uint64_t nb,
                                                       const float* __restrict__ chunk_sum,
                                                       const std::uint32_t* __restrict__ chunk_max,
                                                       float* __restrict__ scales, device_report* verdict) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t b = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < nb; b += stride) {
    const std::uint64_t lo = b * B, len = lo + B < n ? B : n - lo;
    const std::uint64_t chunks = (len + stats_chunk - 1) / stats_chunk;
    float sum = 0.0f;
    std::uint32_t mk = 0;
    for (std::uint64_t p = 0; p < chunks; ++p) {
      if constexpr (L2) sum = __fadd_rn(sum, chunk_sum[b * cpb + p]);
      mk = max(mk, chunk_max[b * cpb + p]);
    }
    float s;
    if (mk >= 0x7f800000u) {
      s = __uint_as_float(0x7fc00000u);
    } else if constexpr (!L2) {
      s = __uint_as_float(mk);
    } else {
      const float max_abs = __uint_as_float(mk);
      s = __fsqrt_rn(sum);
      if (!(isfinite(s) && s >= max_abs && (sum >= 1e-30f || mk == 0))) {
        double acc = 0.0;
        for (std::uint64_t i = lo; i < lo + len; ++i) {
          const double d = static_cast<double>(element_float(x[i]));
          acc = __dadd_rn(acc, __dmul_rn(d, d));
        }
        const float sd = __double2float_rn(__dsqrt_rn(acc));
        s = sd > max_abs ? sd : max_abs;
      }
    }
    if (!isfinite(s)) report_fault(verdict, device_fault::nonfinite_input, b);
    scales[b] = s;
  }
}

// Code of one element (detail::round_levels / round_levels_exact): level
// floor(r) + [u < frac(r)], r = min(|x| L / s, L), and the sign on a
// non-zero level.
__device__ __forceinline__ std::uint32_t level_code(float xf, float s, float L, std::uint32_t w) noexcept {
  const float kb = s > 0.0f ? __fdiv_rn(L, s) : 0.0f;
  const float a = abs_of(xf);
  float r;
  if (kb <= FLT_MAX) {
    const float r0 = __fmul_rn(a, kb);
    r = r0 < L ? r0 : L;
  } else {
    const double rd = __ddiv_rn(__dmul_rn(static_cast<double>(a), static_cast<double>(L)), static_cast<double>(s));
    r = rd < static_cast<double>(L) ? __double2float_rn(rd) : L;
  }
  const int l = __float2int_rz(r);
  const float frac = __fsub_rn(r, static_cast<float>(l));
  const float u = __fmul_rn(static_cast<float>(w >> 8), 1.0f / 16777216.0f);
  const std::uint32_t level = static_cast<std::uint32_t>(l + (u < frac ? 1 : 0));
  return (level << 1) | ((__float_as_uint(xf) >> 31) & (level != 0 ? 1u : 0u));
}

// A code's value times `scale` (detail::levels_decode_add's arithmetic).
__device__ __forceinline__ float level_value(std::uint32_t code, float s, float L, float scale) noexcept {
  const float unit = __fmul_rn(scale, __fdiv_rn(s, L));
  const float v = __fmul_rn(static_cast<float>(code >> 1), unit);
  return __uint_as_float(__float_as_uint(v) ^ ((code & 1u) << 31));
}

// 8 codes of `bits` (2..16) bits in a 128-bit little-endian group.
struct code_group {
  std::uint64_t lo = 0, hi = 0;
  __device__ __forceinline__ void put(unsigned off, unsigned bits, std::uint32_t v) noexcept {
    const std::uint64_t c = v;
    if (off < 64) {
      lo |= c << off;
      if (off + bits > 64) hi |= c >> (64 - off);
    } else {
      hi |= c << (off - 64);
    }
  }
  __device__ __forceinline__ std::uint32_t get(unsigned off, unsigned bits) const noexcept {
    std::uint64_t v;
    if (off < 64) {
      v = lo >> off;
      if (off + bits > 64) v |= hi << (64 - off);
    } else {
      v = hi >> (off - 64);
    }
    return static_cast<std::uint32_t>(v & ((std::uint64_t{1} << bits) - 1));
  }
  __device__ __forceinline__ std::uint32_t byte(unsigned j) const noexcept {
    return static_cast<std::uint32_t>((j < 8 ? lo >> (8 * j) : hi >> (8 * (j - 8))) & 0xffu);
  }
  __device__ __forceinline__ void set_byte(unsigned j, std::uint32_t b) noexcept {
    if (j < 8)
      lo |= static_cast<std::uint64_t>(b) << (8 * j);
    else
      hi |= static_cast<std::uint64_t>(b) << (8 * (j - 8));
  }
};

// Codes: thread g makes elements 8g .. 8g+7 (exactly `bits` bytes at byte
// g bits; Philox blocks 2g and 2g+1). Nothing when a scale was not finite.
// With a residual (x is then the residual): e[i] = e[i] + value(code) * -1.
template <class T>
__global__ ASHL_DETAIL_HIDDEN void levels_codes_kernel(const T* x, std::uint64_t n, std::uint64_t B, float L,
                                                       unsigned bits, const float* __restrict__ scales,
                                                       std::byte* __restrict__ codes, philox_stream rng,
                                                       float* residual, const device_report* __restrict__ verdict) {
  if (verdict->fault != 0) return;
  const std::uint64_t groups = (n + 7) / 8;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t g = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const std::uint64_t i0 = 8 * g;
    const unsigned m = n - i0 < 8 ? static_cast<unsigned>(n - i0) : 8u;
    const philox_block w[2] = {rng.block(2 * g), rng.block(2 * g + 1)};
    std::uint64_t b = i0 / B, next = (b + 1) * B;
    float s = scales[b];
    code_group cg;
    for (unsigned j = 0; j < m; ++j) {
      const std::uint64_t i = i0 + j;
      if (i >= next) {
        b = i / B;
        next = (b + 1) * B;
        s = scales[b];
      }
      const std::uint32_t c = level_code(element_float(x[i]), s, L, w[j >> 2][static_cast<int>(j & 3u)]);
      cg.put(j * bits, bits, c);
      if (residual != nullptr) residual[i] = __fadd_rn(residual[i], level_value(c, s, L, -1.0f));
    }
    const unsigned nbytes = (m * bits + 7) / 8;
    std::byte* o = codes + g * bits;
    for (unsigned j = 0; j < nbytes; ++j) o[j] = static_cast<std::byte>(cg.byte(j));
  }
}

// --- decode ----------------------------------------------------------------

// The payload header as the kernels read it: n, bucket, levels, the offset
// of the scales (header bytes) and, when the header passed, what follows.
struct levels_header {
  std::uint64_t n, bucket;
  std::uint32_t levels;
};
__device__ __forceinline__ levels_header read_levels_header(const std::byte* in, bool has_levels) noexcept {
  const auto* w = reinterpret_cast<const std::uint32_t*>(in);
  return {static_cast<std::uint64_t>(w[0]) | (static_cast<std::uint64_t>(w[1]) << 32), w[2], has_levels ? w[3] : 1u};
}
__device__ __forceinline__ unsigned level_bits(std::uint32_t levels) noexcept {
  return 1u + static_cast<unsigned>(32 - __clz(static_cast<int>(levels)));
}

// qsgd/terngrad decode_add's header checks, in their order.
static __global__ void levels_validate_header_kernel(const std::byte* __restrict__ in,
                                                                 std::uint64_t in_bytes, std::uint64_t expected_n,
                                                                 bool has_levels, std::uint32_t max_levels,
                                                                 device_report* verdict) {
  const levels_header h = read_levels_header(in, has_levels);
  const std::uint64_t header = has_levels ? 16 : 12;
  if (h.n != expected_n || h.n > layout::bucketed_max_elements) {
    report_fault(verdict, device_fault::payload_n, ~std::uint64_t{0});
  } else if (h.bucket < 1 || h.levels < 1 || h.levels > max_levels) {
    report_fault(verdict, device_fault::payload_field, ~std::uint64_t{0});
  } else {
    const std::uint64_t nb = (h.n + h.bucket - 1) / h.bucket;
    if (in_bytes != header + 4 * nb + (h.n * level_bits(h.levels) + 7) / 8)
      report_fault(verdict, device_fault::payload_bytes, ~std::uint64_t{0});
  }
}

static __global__ void levels_validate_scales_kernel(const std::byte* __restrict__ in, bool has_levels,
                                                                 device_report* verdict) {
  if (verdict->fault != 0) return;
  const levels_header h = read_levels_header(in, has_levels);
  const auto* scales = reinterpret_cast<const float*>(in + (has_levels ? 16 : 12));
  const std::uint64_t nb = (h.n + h.bucket - 1) / h.bucket;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t b = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < nb; b += stride) {
    const float s = scales[b];
    if (!(isfinite(s) && s >= 0.0f)) report_fault(verdict, device_fault::payload_scale, b);
  }
}

__device__ __forceinline__ code_group load_group(const std::byte* codes, std::uint64_t g, unsigned bits,
                                                 unsigned nbytes) noexcept {
  code_group cg;
  const std::byte* p = codes + g * bits;
  for (unsigned j = 0; j < nbytes; ++j) cg.set_byte(j, static_cast<std::uint32_t>(p[j]));
  return cg;
}

// Every code's level <= L and no sign on a zero level (code 1).
static __global__ void levels_validate_codes_kernel(const std::byte* __restrict__ in, bool has_levels,
                                                                device_report* verdict) {
  if (verdict->fault != 0) return;
  const levels_header h = read_levels_header(in, has_levels);
  const std::uint64_t nb = (h.n + h.bucket - 1) / h.bucket;
  const std::byte* codes = in + (has_levels ? 16 : 12) + 4 * nb;
  const unsigned bits = level_bits(h.levels);
  const std::uint64_t groups = (h.n + 7) / 8;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t g = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const unsigned m = h.n - 8 * g < 8 ? static_cast<unsigned>(h.n - 8 * g) : 8u;
    const code_group cg = load_group(codes, g, bits, (m * bits + 7) / 8);
    for (unsigned j = 0; j < m; ++j) {
      const std::uint32_t c = cg.get(j * bits, bits);
      if ((c >> 1) > h.levels || c == 1u) report_fault(verdict, device_fault::payload_code, 8 * g + j);
    }
  }
}

// Unused bits of the last code byte are 0 (after the code check, as on the CPU).
static __global__ void levels_validate_padding_kernel(const std::byte* __restrict__ in, bool has_levels,
                                                                  device_report* verdict) {
  if (verdict->fault != 0) return;
  const levels_header h = read_levels_header(in, has_levels);
  const unsigned bits = level_bits(h.levels);
  const unsigned used = static_cast<unsigned>((h.n % 8) * bits % 8);
  if (used == 0) return;
  const std::uint64_t nb = (h.n + h.bucket - 1) / h.bucket;
  const std::byte* codes = in + (has_levels ? 16 : 12) + 4 * nb;
  if ((static_cast<unsigned>(codes[(h.n * bits + 7) / 8 - 1]) >> used) != 0)
    report_fault(verdict, device_fault::payload_padding, ~std::uint64_t{0});
}

static __global__ void levels_add_kernel(const std::byte* __restrict__ in, bool has_levels,
                                                     float* __restrict__ acc, float scale,
                                                     const device_report* __restrict__ verdict) {
  if (verdict->fault != 0) return;
  const levels_header h = read_levels_header(in, has_levels);
  const std::uint64_t nb = (h.n + h.bucket - 1) / h.bucket;
  const auto* scales = reinterpret_cast<const float*>(in + (has_levels ? 16 : 12));
  const std::byte* codes = in + (has_levels ? 16 : 12) + 4 * nb;
  const unsigned bits = level_bits(h.levels);
  const float L = static_cast<float>(h.levels);
  const std::uint64_t groups = (h.n + 7) / 8;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t g = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const unsigned m = h.n - 8 * g < 8 ? static_cast<unsigned>(h.n - 8 * g) : 8u;
    const code_group cg = load_group(codes, g, bits, (m * bits + 7) / 8);
    std::uint64_t b = 8 * g / h.bucket, next = (b + 1) * h.bucket;
    for (unsigned j = 0; j < m; ++j) {
      const std::uint64_t i = 8 * g + j;
      if (i >= next) {
        b = i / h.bucket;
        next = (b + 1) * h.bucket;
      }
      acc[i] = __fadd_rn(acc[i], level_value(cg.get(j * bits, bits), scales[b], L, scale));
    }
  }
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
