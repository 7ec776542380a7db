// ashl/compress/cuda/dispatch/kernels/natural.cuh — kernels of natural
// compression on the device: max |x|, codes (with the error-feedback
// subtraction fused), validation and decode-add.
//
//   max_key_kernel<float><<<g, b, 0, s>>>(x, n, d_max, ipt);            // after d_max = 0
//   natural_codes_kernel<float><<<g, b, 0, s>>>(x, n, d_max, out, rng, residual, verdict);
//   natural_validate_kernel<<<g, b, 0, s>>>(in, in_bytes, n, verdict);
//   natural_add_kernel<<<g, b, 0, s>>>(in, acc, n, scale, verdict);
//
// The codes are compress/detail/quantize.hpp's natural_codes, statement for
// statement (integer tests on the exponent and mantissa, subnormals
// normalized by an exact 2^64 factor, the small-|x| test against
// u < a 2^(24 - emin) as three exact power-of-two factors), so they are the
// CPU's bits. Each thread makes the four codes of one Philox block.
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

// max over elements of the f32 |x| bit pattern, into *d_max (zeroed first).
template <class T>
__global__ ASHL_DETAIL_HIDDEN void max_key_kernel(const T* __restrict__ x, std::size_t n,
                                                  std::uint32_t* __restrict__ d_max, int items_per_thread) {
  std::uint32_t m = 0;
  for_each_strided(n, items_per_thread, [&](std::size_t i) {
    m = max(m, __float_as_uint(element_float(x[i])) & 0x7fffffffu);
  });
  warp_max_to(d_max, m);
}

// 2^e as a float for e in [-274, 127], exactly as std::ldexp(1.0f, e) rounds
// (2^-150 and below round to 0).
__device__ __forceinline__ float pow2f(int e) noexcept {
  if (e >= -126) return __uint_as_float(static_cast<std::uint32_t>(e + 127) << 23);
  if (e >= -149) return __uint_as_float(1u << (e + 149));
  return 0.0f;
}

// emin of natural.hpp's encode from max |x| (finite): frexp exponent e of
// max |x| (max |x| = m 2^e, m in [0.5, 1)), emin = min(e - 126, 1); 0 for 0.
__device__ __forceinline__ std::int32_t natural_emin(std::uint32_t max_key) noexcept {
  if (max_key == 0) return 0;
  const std::int32_t e = max_key >= 0x00800000u ? static_cast<std::int32_t>(max_key >> 23) - 126
                                                : (31 - __clz(static_cast<int>(max_key))) - 148;
  return e - 126 < layout::natural::max_emin ? e - 126 : layout::natural::max_emin;
}

__device__ __forceinline__ std::uint32_t natural_code(float xf, std::uint32_t w, std::int32_t emin, float f0, float f1,
                                                      float f2) noexcept {
  const std::uint32_t b = __float_as_uint(xf), ab = b & 0x7fffffffu;
  const float af = __uint_as_float(ab);
  const bool sub = ab < 0x00800000u;
  const std::uint32_t bits = sub ? __float_as_uint(__fmul_rn(af, 18446744073709551616.0f)) : ab;
  const std::int32_t E = static_cast<std::int32_t>(bits >> 23) - (sub ? 64 : 0);
  const auto M2 = static_cast<std::int32_t>((bits & 0x7fffffu) << 1);
  const auto u = static_cast<std::int32_t>(w >> 8);
  const std::int32_t low = E - 126 - emin;
  std::int32_t c = low >= 1 ? low + (u < M2 ? 1 : 0)
                            : (static_cast<float>(u) < __fmul_rn(__fmul_rn(__fmul_rn(af, f0), f1), f2) ? 1 : 0);
  c = c > 127 ? 127 : c;
  c = ab == 0 ? 0 : c;
  return static_cast<std::uint32_t>(c) | (((b >> 31) & (c != 0 ? 1u : 0u)) << 7);
}

// The value a code decodes to times `scale` (natural::decode_add's table).
__device__ __forceinline__ float natural_value(std::uint32_t code, std::int32_t emin, float scale) noexcept {
  const std::uint32_t c = code & 127u;
  const float v = c == 0 ? 0.0f : __fmul_rn(scale, pow2f(emin + static_cast<std::int32_t>(c) - 1));
  return (code & 128u) != 0 ? -v : v;
}

// Header and codes; thread q makes the codes of elements 4q .. 4q+3 from
// Philox block q. A non-finite max |x| is recorded in `verdict` and nothing
// is written. With a residual (x is then the residual): e[i] = e[i] + the
// code's value times -1, what the CPU decorator's decode_add(-1) adds.
template <class T>
__global__ ASHL_DETAIL_HIDDEN void natural_codes_kernel(const T* x, std::size_t n,
                                                        const std::uint32_t* __restrict__ d_max,
                                                        std::byte* __restrict__ out, philox_stream rng,
                                                        float* residual, device_report* verdict) {
  const std::uint32_t mk = *d_max;
  const std::uint64_t gid = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (mk >= 0x7f800000u) {
    if (gid == 0) report_fault(verdict, device_fault::nonfinite_input, ~std::uint64_t{0});
    return;
  }
  const std::int32_t emin = natural_emin(mk);
  if (gid == 0) {
    auto* h = reinterpret_cast<std::uint32_t*>(out);
    h[0] = static_cast<std::uint32_t>(n);
    h[1] = static_cast<std::uint32_t>(static_cast<std::uint64_t>(n) >> 32);
    h[2] = static_cast<std::uint32_t>(emin);
  }
  float f[3];
  for (int j = 0, rest = 24 - emin; j < 3; ++j) {
    const int p = rest < 127 ? rest : 127;
    f[j] = pow2f(p);
    rest -= p;
  }
  std::byte* codes = out + layout::natural::header_bytes;
  const std::uint64_t quads = (n + 3) / 4;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t q = gid; q < quads; q += stride) {
    const philox_block w = rng.block(q);
    const std::uint64_t i0 = 4 * q;
    if (i0 + 4 <= n) {
      std::uint32_t word = 0;
      for (int l = 0; l < 4; ++l) {
        const float xf = element_float(x[i0 + l]);
        const std::uint32_t c = natural_code(xf, w[l], emin, f[0], f[1], f[2]);
        word |= c << (8 * l);
        if (residual != nullptr) residual[i0 + l] = __fadd_rn(residual[i0 + l], natural_value(c, emin, -1.0f));
      }
      *reinterpret_cast<std::uint32_t*>(codes + i0) = word;  // codes start 4-byte aligned (12-byte header)
    } else {
      for (std::uint64_t i = i0; i < n; ++i) {
        const std::uint32_t c = natural_code(element_float(x[i]), w[static_cast<int>(i - i0)], emin, f[0], f[1], f[2]);
        codes[i] = static_cast<std::byte>(c);
        if (residual != nullptr) residual[i] = __fadd_rn(residual[i], natural_value(c, emin, -1.0f));
      }
    }
  }
}

// natural::decode_add's checks: header (one thread), then every code (0x80,
// a negative zero, is the only invalid one). `n` is info.count; the code
// loop runs only once the header (n, emin, size) is known to be good, which
// the caller orders by launching the header check first.
static __global__ void natural_validate_header_kernel(const std::byte* __restrict__ in,
                                                                  std::uint64_t in_bytes, std::uint64_t expected_n,
                                                                  device_report* verdict) {
  const auto* h = reinterpret_cast<const std::uint32_t*>(in);
  const std::uint64_t n = static_cast<std::uint64_t>(h[0]) | (static_cast<std::uint64_t>(h[1]) << 32);
  const auto emin = static_cast<std::int32_t>(h[2]);
  if (n != expected_n)
    report_fault(verdict, device_fault::payload_n, ~std::uint64_t{0});
  else if (emin < layout::natural::min_emin || emin > layout::natural::max_emin)
    report_fault(verdict, device_fault::payload_field, ~std::uint64_t{0});
  else if (in_bytes - layout::natural::header_bytes != n)
    report_fault(verdict, device_fault::payload_bytes, ~std::uint64_t{0});
}

static __global__ void natural_validate_codes_kernel(const std::byte* __restrict__ in, std::uint64_t n,
                                                                 device_report* verdict) {
  if (verdict->fault != 0) return;
  const std::byte* codes = in + layout::natural::header_bytes;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    if (codes[i] == std::byte{0x80}) report_fault(verdict, device_fault::payload_code, i);
}

// acc[i] = acc[i] + value(code i) * scale (the CPU table's bits).
static __global__ void natural_add_kernel(const std::byte* __restrict__ in, float* __restrict__ acc,
                                                      std::uint64_t n, float scale,
                                                      const device_report* __restrict__ verdict) {
  if (verdict->fault != 0) return;
  const auto emin = static_cast<std::int32_t>(reinterpret_cast<const std::uint32_t*>(in)[2]);
  const std::byte* codes = in + layout::natural::header_bytes;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    acc[i] = __fadd_rn(acc[i], natural_value(static_cast<std::uint32_t>(codes[i]), emin, scale));
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
