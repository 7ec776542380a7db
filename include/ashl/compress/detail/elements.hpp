// ashl/compress/detail/elements.hpp — element access, little-endian bulk
// stores and loads, and branch-free 16-bit float conversions shared by the CPU
// codecs.
//
//   detail::store_le(out + 4 * i, v);                 // v: float, half or bfloat16
//   float f = detail::load_value_le(in + 2 * i, dtype::f16);
//   std::uint16_t h = detail::f32_to_f16_rne(x);      // same bits as half::from_float
//
// The conversions here give exactly the bits of core/dtype.hpp (the tests of
// compress/cast.hpp compare them) but are written without data-dependent
// branches so that gcc and clang vectorize the codec loops at -O2/-O3 without
// -march flags. docs/algorithms.md §4; payload layouts in docs/wire-format.md.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/detail/host_simd.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if ASHL_DETAIL_HOST_X86
#include <cpuid.h>
#include <immintrin.h>
#endif

ASHL_DETAIL_COMPRESS_HOST_BEGIN
namespace detail {

// The bit pattern of a gradient element (float -> u32, half/bfloat16 -> u16).
template <gradient_element T>
using bits_of = std::conditional_t<std::is_same_v<T, float>, std::uint32_t, std::uint16_t>;

template <gradient_element T>
inline bits_of<T> element_bits(T v) noexcept {
  bits_of<T> b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Magnitude key: the bit pattern with the sign cleared. For non-NaN values the
// key order is the order of |x| (IEEE layout); NaN keys sort above +inf, so a
// NaN counts as the largest magnitude.
template <gradient_element T>
inline std::uint32_t magnitude_key(T v) noexcept {
  if constexpr (std::is_same_v<T, float>)
    return element_bits(v) & 0x7fffffffu;
  else
    return static_cast<std::uint32_t>(element_bits(v) & 0x7fffu);
}
template <gradient_element T>
inline constexpr int magnitude_key_bits = std::is_same_v<T, float> ? 31 : 15;

// Unaligned little-endian store/load of one scalar (a plain move on x46/ARM).
template <class T>
inline void store_le(std::byte* p, T v) noexcept {
  v = ::ashl::detail::byteswap_if_big(v);
  std::memcpy(p, &v, sizeof(T));
}
template <class T>
inline T load_le(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return ::ashl::detail::byteswap_if_big(v);
}

// Copy n elements into the payload in little-endian order.
template <class T>
inline void store_array_le(std::byte* out, const T* in, std::size_t n) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    if (n != 0) std::memcpy(out, in, n * sizeof(T));
  } else {
    for (std::size_t i = 0; i < n; ++i) store_le(out + i * sizeof(T), in[i]);
  }
}

// Branch-free f32 -> f16, round to nearest even, identical to
// ashl::detail::f32_to_f16_bits (NaN quiet with the top payload bits kept,
// overflow to inf, subnormals exact). Subnormals use the float-add trick
// (the addition rounds with the default nearest-even mode), so it must not
// run with flush-to-zero enabled.
inline std::uint16_t f32_to_f16_rne(float f) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7fffffffu;
  // Normal range: rebias and round the 13 dropped bits to nearest even.
  const std::uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  // Subnormal range: adding 0.5 (2^-1) aligns the half subnormal unit with
  // the float ulp, so the hardware rounding does the work.
  float af;
  std::memcpy(&af, &a, 4);
  const float sum = af + 0.5f;
  std::uint32_t sb;
  std::memcpy(&sb, &sum, 4);
  const std::uint32_t sub = sb - 0x3f000000u;
  const std::uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  std::uint32_t h = a < 0x38800000u ? sub : normal;
  h = a >= 0x477ff000u ? 0x7c00u : h;
  h = a > 0x7f800000u ? nan : h;
  return static_cast<std::uint16_t>(h | sign);
}

// Branch-free f16 -> f32, exact, identical to ashl::detail::f16_bits_to_f32.
inline float f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t em = static_cast<std::uint32_t>(h & 0x7fffu) << 13;
  const std::uint32_t e = em & 0x0f800000u;
  const std::uint32_t normal = em + 0x38000000u;            // rebias 15 -> 127
  const std::uint32_t infnan = em + 0x70000000u;            // exponent 31 -> 255
  // Subnormal: m * 2^-24 computed exactly as (2^-14 + m*2^-24) - 2^-14.
  const std::uint32_t subb = em + 0x38800000u;
  float subf;
  std::memcpy(&subf, &subb, 4);
  subf -= 6.103515625e-05f;  // 2^-14
  std::uint32_t sub;
  std::memcpy(&sub, &subf, 4);
  std::uint32_t r = e == 0x0f800000u ? infnan : normal;
  r = e == 0 ? sub : r;
  r |= sign;
  float out;
  std::memcpy(&out, &r, 4);
  return out;
}

inline std::uint16_t f32_to_bf16_rne(float f) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (x >> 16) | 0x0040u;
  return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

inline float bf16_to_f32(std::uint16_t b) noexcept {
  const std::uint32_t x = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// One payload value of type `t` (f32, f16 or bf16) as float.
inline float load_value_le(const std::byte* p, dtype t) noexcept {
  switch (t) {
    case dtype::f32: return load_le<float>(p);
    case dtype::f16: return f16_to_f32(load_le<std::uint16_t>(p));
    case dtype::bf16: return bf16_to_f32(load_le<std::uint16_t>(p));
    default: return 0.0f;
  }
}

inline bool is_gradient_dtype(dtype t) noexcept { return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16; }

// Bulk conversion kernels. With gcc/clang on a little-endian host they use
// the compilers' generic vector extension (4 lanes, one SSE2/NEON
// register, so no -march flag is needed and no AVX calling-convention issue), because gcc -O2 does not
// auto-vectorize the select chains above (its very-cheap cost model refuses,
// and -ftrapping-math blocks if-conversion around the float add). The lanes
// compute exactly the scalar functions; the tail uses those directly.
#if ASHL_DETAIL_HOST_VECTOR
#define ASHL_DETAIL_VECTOR_EXT (std::endian::native == std::endian::little)
typedef std::uint32_t ashl_u32x4 __attribute__((vector_size(16)));
typedef std::int32_t ashl_i32x4 __attribute__((vector_size(16)));
typedef float ashl_f32x4 __attribute__((vector_size(16)));
typedef std::uint16_t ashl_u16x4 __attribute__((vector_size(8)));

inline ashl_u32x4 vsel(ashl_i32x4 mask, ashl_u32x4 a, ashl_u32x4 b) noexcept {
  const ashl_u32x4 m = reinterpret_cast<ashl_u32x4>(mask);
  return (a & m) | (b & ~m);
}

// 4 floats -> 4 binary16 patterns; `overflow` gets lanes where a finite input became inf.
inline void f32_to_f16_x4(const float* in, std::byte* out, ashl_u32x4& overflow) noexcept {
  ashl_u32x4 x;
  std::memcpy(&x, in, 16);
  const ashl_u32x4 sign = (x >> 16) & 0x8000u;
  const ashl_u32x4 a = x & 0x7fffffffu;
  const ashl_i32x4 ai = reinterpret_cast<ashl_i32x4>(a);  // sign cleared: signed compares are exact
  const ashl_u32x4 normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  const ashl_f32x4 sum = reinterpret_cast<ashl_f32x4>(a) + 0.5f;
  const ashl_u32x4 sub = reinterpret_cast<ashl_u32x4>(sum) - 0x3f000000u;
  const ashl_u32x4 nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  ashl_u32x4 h = vsel(ai < 0x38800000, sub, normal);
  h = vsel(ai >= 0x477ff000, ashl_u32x4{} + 0x7c00u, h);
  h = vsel(ai > 0x7f800000, nan, h);
  const ashl_i32x4 finite = ai < 0x7f800000;
  overflow |= reinterpret_cast<ashl_u32x4>(finite & (reinterpret_cast<ashl_i32x4>(h) == 0x7c00));
  const ashl_u16x4 r = __builtin_convertvector(h | sign, ashl_u16x4);
  std::memcpy(out, &r, 8);
}

inline void f32_to_bf16_x4(const float* in, std::byte* out, ashl_u32x4& overflow) noexcept {
  ashl_u32x4 x;
  std::memcpy(&x, in, 16);
  const ashl_i32x4 ai = reinterpret_cast<ashl_i32x4>(x & 0x7fffffffu);
  const ashl_u32x4 rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const ashl_u32x4 nan = (x >> 16) | 0x0040u;
  const ashl_u32x4 h = vsel(ai > 0x7f800000, nan, rounded);
  const ashl_i32x4 finite = ai < 0x7f800000;
  overflow |= reinterpret_cast<ashl_u32x4>(finite & (reinterpret_cast<ashl_i32x4>(h & 0x7fffu) == 0x7f80));
  const ashl_u16x4 r = __builtin_convertvector(h, ashl_u16x4);
  std::memcpy(out, &r, 8);
}

inline ashl_f32x4 f16_to_f32_x4(const std::byte* in) noexcept {
  ashl_u16x4 h16;
  std::memcpy(&h16, in, 8);
  const ashl_u32x4 h = __builtin_convertvector(h16, ashl_u32x4);
  const ashl_u32x4 sign = (h & 0x8000u) << 16;
  const ashl_u32x4 em = (h & 0x7fffu) << 13;
  const ashl_i32x4 e = reinterpret_cast<ashl_i32x4>(em & 0x0f800000u);
  const ashl_u32x4 normal = em + 0x38000000u;
  const ashl_u32x4 infnan = em + 0x70000000u;
  const ashl_f32x4 subf = reinterpret_cast<ashl_f32x4>(em + 0x38800000u) - 6.103515625e-05f;
  ashl_u32x4 r = vsel(e == 0x0f800000, infnan, normal);
  r = vsel(e == 0, reinterpret_cast<ashl_u32x4>(subf), r);
  return reinterpret_cast<ashl_f32x4>(r | sign);
}

inline ashl_f32x4 bf16_to_f32_x4(const std::byte* in) noexcept {
  ashl_u16x4 h16;
  std::memcpy(&h16, in, 8);
  return reinterpret_cast<ashl_f32x4>(__builtin_convertvector(h16, ashl_u32x4) << 16);
}
#else
#define ASHL_DETAIL_VECTOR_EXT false
#endif

// x86 with F16C and AVX2 (chosen at run time, so the default build without
// -march has it; function-level target attributes): vcvtps2ph rounds to
// nearest even by its immediate (not MXCSR) and vcvtph2ps widens exactly,
// with the bits of the functions above (the codec tests compare every 16-bit
// pattern and the float rounding boundaries). The one difference, a
// signalling NaN half widened quiet, disappears in decode-add's multiply,
// which quiets it the same way. Like the float-add trick, this expects the
// default MXCSR (no flush-to-zero or denormals-are-zero).
#if ASHL_DETAIL_HOST_X86
#define ASHL_DETAIL_F16C_X86 1
inline bool cpu_has_avx2_f16c() noexcept {
  if constexpr (ASHL_HOST_SIMD < ASHL_HOST_SIMD_F16C) return false;
  // clang's __builtin_cpu_supports does not know "f16c": cpuid leaf 1, ECX bit 29.
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0 && __builtin_cpu_supports("avx2");
  }();
  return yes;
}

// Elements [0, returned) of in (a multiple of 16) to binary16; `overflow`
// set when one of them is finite and becomes +-inf (|x| >= 65520, a key in
// (0x477fefff, 0x7f800000)).
__attribute__((target("avx2,f16c"))) inline std::size_t f32_to_f16_f16c(const float* in, std::byte* out, std::size_t n,
                                                                      bool& overflow) noexcept {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i big = _mm256_set1_epi32(0x477fefff), inf = _mm256_set1_epi32(0x7f800000);
  __m256i ov = _mm256_setzero_si256();
  std::size_t i = 0;
  for (const std::size_t e = n & ~std::size_t{15}; i < e; i += 16) {
    const __m256 v0 = _mm256_loadu_ps(in + i), v1 = _mm256_loadu_ps(in + i + 8);
    const __m128i h0 = _mm256_cvtps_ph(v0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i h1 = _mm256_cvtps_ph(v1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i + 16), h1);
    const __m256i a0 = _mm256_and_si256(_mm256_castps_si256(v0), abs_mask);
    const __m256i a1 = _mm256_and_si256(_mm256_castps_si256(v1), abs_mask);
    ov = _mm256_or_si256(ov, _mm256_and_si256(_mm256_cmpgt_epi32(a0, big), _mm256_cmpgt_epi32(inf, a0)));
    ov = _mm256_or_si256(ov, _mm256_and_si256(_mm256_cmpgt_epi32(a1, big), _mm256_cmpgt_epi32(inf, a1)));
  }
  overflow = _mm256_testz_si256(ov, ov) == 0;
  return i;
}

// acc[i] += scale * f16 value i for i < returned (a multiple of 8): the
// multiply and the add of the portable loop, in that order.
__attribute__((target("avx2,f16c"))) inline std::size_t add_f16_f16c(const std::byte* in, float* acc, std::size_t n,
                                                                   float scale) noexcept {
  const __m256 s = _mm256_set1_ps(scale);
  std::size_t i = 0;
  for (const std::size_t e = n & ~std::size_t{7}; i < e; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i)));
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(s, v)));
  }
  return i;
}

// Halves [0, returned) of in (a multiple of 16) widened exactly (vcvtph2ps).
__attribute__((target("avx2,f16c"))) inline std::size_t widen_f16_f16c(const std::byte* in, float* out,
                                                                     std::size_t n) noexcept {
  std::size_t i = 0;
  for (const std::size_t e = n & ~std::size_t{15}; i < e; i += 16) {
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i)));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i + 16)));
    _mm256_storeu_ps(out + i, a);
    _mm256_storeu_ps(out + i + 8, b);
  }
  return i;
}
// bfloat16 [0, returned) (a multiple of 16) widened: the pattern in the top half.
__attribute__((target("avx2"))) inline std::size_t widen_bf16_avx2(const std::byte* in, float* out,
                                                                 std::size_t n) noexcept {
  std::size_t i = 0;
  for (const std::size_t e = n & ~std::size_t{15}; i < e; i += 16) {
    const __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i)));
    const __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i + 16)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_slli_epi32(a, 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 8), _mm256_slli_epi32(b, 16));
  }
  return i;
}
// Eight f16 at p widened exactly (vcvtph2ps), then rounded to bfloat16 as
// f32_to_bf16_x4 does (round to nearest even, NaN kept quiet), one pattern
// per 32-bit lane.
__attribute__((target("avx2,f16c"))) inline __m256i f16_to_bf16_x8(const std::byte* p) noexcept {
  const __m256i x = _mm256_castps_si256(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x0040));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                            _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, nan, is_nan);
}
// f16 [0, returned) (a multiple of 16) to bfloat16 in registers, no f32
// buffer. A finite f16 never rounds to a bf16 inf.
__attribute__((target("avx2,f16c"))) inline std::size_t f16_to_bf16_f16c(const std::byte* in, std::byte* out,
                                                                       std::size_t n) noexcept {
  std::size_t i = 0;
  for (const std::size_t e = n & ~std::size_t{15}; i < e; i += 16) {
    // packus works per 128-bit lane, (a0..3, b0..3, a4..7, b4..7): the quadwords go back in order.
    const __m256i packed = _mm256_packus_epi32(f16_to_bf16_x8(in + 2 * i), f16_to_bf16_x8(in + 2 * i + 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), _mm256_permute4x64_epi64(packed, 0xD8));
  }
  return i;
}
#else
#define ASHL_DETAIL_F16C_X86 0
#endif

// n half or bfloat16 elements widened exactly into out: 16 per step with
// F16C (halves) or AVX2 (bfloat16, a zero-extend and a shift) where the CPU
// has them, the vector extension's 4 lanes otherwise, then the scalar
// functions. Every path gives the same floats (a signalling NaN half comes
// out quiet from vcvtph2ps; every caller either refuses a NaN input or
// quiets it in its next float operation).
template <class T>
inline void widen_16_to_f32(const T* x, std::size_t n, float* out) noexcept {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16>, "widen_16_to_f32: half or bfloat16");
  const auto* in = reinterpret_cast<const std::byte*>(x);
  std::size_t i = 0;
#if ASHL_DETAIL_F16C_X86
  if constexpr (std::endian::native == std::endian::little)
    if (cpu_has_avx2_f16c())
      i = std::is_same_v<T, half> ? widen_f16_f16c(in, out, n) : widen_bf16_avx2(in, out, n);
#endif
#if ASHL_DETAIL_HOST_VECTOR
  if constexpr (ASHL_DETAIL_VECTOR_EXT) {
    for (const std::size_t e = n & ~std::size_t{3}; i < e; i += 4) {
      const ashl_f32x4 v = std::is_same_v<T, half> ? f16_to_f32_x4(in + 2 * i) : bf16_to_f32_x4(in + 2 * i);
      std::memcpy(out + i, &v, 16);
    }
  }
#endif
  for (; i < n; ++i) {
    const std::uint16_t b = load_le<std::uint16_t>(in + 2 * i);
    out[i] = std::is_same_v<T, half> ? f16_to_f32(b) : bf16_to_f32(b);
  }
}

// r[i] += x[i] (as float) for n elements: 16-bit inputs widened a block at a
// time into L1 (the same sums as adding to_float(x[i]) one by one).
template <gradient_element T>
inline void add_widened(float* r, const T* x, std::size_t n) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    for (std::size_t i = 0; i < n; ++i) r[i] += x[i];
  } else {
    constexpr std::size_t block = 1024;
    float buf[block];
    for (std::size_t p = 0; p < n; p += block) {
      const std::size_t m = n - p < block ? n - p : block;
      widen_16_to_f32(x + p, m, buf);
      for (std::size_t i = 0; i < m; ++i) r[p + i] += buf[i];
    }
  }
}

// DGC's momentum step: u = m u + g, v += u, for n elements (16-bit g widened
// a block at a time; the same float operations in the same order).
template <gradient_element T>
inline void momentum_accumulate(float* u, float* v, const T* g, float m, std::size_t n) noexcept {
  constexpr std::size_t block = 1024;
  float buf[block];
  for (std::size_t p = 0; p < n; p += block) {
    const std::size_t len = n - p < block ? n - p : block;
    const float* gf = buf;
    if constexpr (std::is_same_v<T, float>)
      gf = g + p;
    else
      widen_16_to_f32(g + p, len, buf);
    float* up = u + p;
    float* vp = v + p;
    for (std::size_t i = 0; i < len; ++i) {
      up[i] = m * up[i] + gf[i];
      vp[i] += up[i];
    }
  }
}


// Which kernels the bulk conversions may use: the best this CPU has, or only
// the portable ones (the tests compare the two).
enum class convert_path { best, portable };

// n floats to binary16 (ToHalf) or bfloat16 patterns, little-endian. Returns
// whether some finite input became +-inf.
template <bool ToHalf>
inline bool convert_f32_to_16(const float* in, std::byte* out, std::size_t n,
                              convert_path path = convert_path::best) noexcept {
  std::size_t i = 0;
  bool overflow = false;
#if ASHL_DETAIL_F16C_X86
  if constexpr (ToHalf && std::endian::native == std::endian::little)
    if (path == convert_path::best && cpu_has_avx2_f16c()) i = f32_to_f16_f16c(in, out, n, overflow);
#else
  (void)path;
#endif
#if ASHL_DETAIL_HOST_VECTOR
  if constexpr (ASHL_DETAIL_VECTOR_EXT) {
    ashl_u32x4 ov{};
    for (; i < (n & ~std::size_t{3}); i += 4) {
      if constexpr (ToHalf)
        f32_to_f16_x4(in + i, out + 2 * i, ov);
      else
        f32_to_bf16_x4(in + i, out + 2 * i, ov);
    }
    for (int l = 0; l < 4; ++l) overflow |= ov[l] != 0;
  }
#endif
  for (; i < n; ++i) {
    const std::uint16_t h = ToHalf ? f32_to_f16_rne(in[i]) : f32_to_bf16_rne(in[i]);
    const bool inf_out = ToHalf ? (h & 0x7fffu) == 0x7c00u : (h & 0x7fffu) == 0x7f80u;
    overflow |= inf_out && std::isfinite(in[i]);
    store_le<std::uint16_t>(out + 2 * i, h);
  }
  return overflow;
}

// acc[i] += scale * value(payload element i) for n dense values of type t.
inline void add_dense(const std::byte* in, dtype t, float* acc, std::size_t n, float scale,
                      convert_path path = convert_path::best) noexcept {
  std::size_t i = 0;
#if ASHL_DETAIL_F16C_X86
  if (t == dtype::f16 && std::endian::native == std::endian::little && path == convert_path::best &&
      cpu_has_avx2_f16c())
    i = add_f16_f16c(in, acc, n, scale);
#else
  (void)path;
#endif
#if ASHL_DETAIL_HOST_VECTOR
  if constexpr (ASHL_DETAIL_VECTOR_EXT) {
    for (; i < (n & ~std::size_t{3}); i += 4) {
      ashl_f32x4 v;
      if (t == dtype::f32)
        std::memcpy(&v, in + 4 * i, 16);
      else if (t == dtype::f16)
        v = f16_to_f32_x4(in + 2 * i);
      else
        v = bf16_to_f32_x4(in + 2 * i);
      ashl_f32x4 a;
      std::memcpy(&a, acc + i, 16);
      a += scale * v;
      std::memcpy(acc + i, &a, 16);
    }
  }
#endif
  const std::size_t w = size_of(t);
  for (; i < n; ++i) acc[i] += scale * load_value_le(in + w * i, t);
}

// The checks every decoder makes before reading its payload: a gradient
// dtype, an accumulator of exactly info.count elements, a finite scale.
inline status check_decode_args(std::string_view codec, dtype t, std::size_t count, std::size_t acc_size,
                                float scale) {
  if (!is_gradient_dtype(t))
    return invalid_argument(std::string(codec) + ".info.type", to_string(t), "must be f32, f16 or bf16");
  if (acc_size != count)
    return invalid_argument(std::string(codec) + ".acc.size", acc_size,
                            "must equal info.count = " + std::to_string(count));
  if (!std::isfinite(scale)) return invalid_argument(std::string(codec) + ".scale", scale, "must be finite");
  return {};
}

// k from a ratio in (0, 1] or an absolute count: max(1, round(ratio * n)),
// never above n (0 only for n = 0).
struct k_spec {
  double ratio = 0.01;       // used when count == 0
  std::size_t count = 0;     // absolute k when non-zero
  [[nodiscard]] std::size_t k_for(std::size_t n) const noexcept {
    if (n == 0) return 0;
    std::size_t k = count;
    if (k == 0) {
      const double r = std::nearbyint(ratio * static_cast<double>(n));
      k = r < 1.0 ? 1 : static_cast<std::size_t>(r);
    }
    return k > n ? n : k;
  }
  [[nodiscard]] status validate(std::string_view codec) const {
    if (count == 0 && !(ratio > 0.0 && ratio <= 1.0))
      return invalid_argument(std::string(codec) + ".ratio", ratio, "must be in (0, 1]");
    return {};
  }
};

}  // namespace detail
ASHL_DETAIL_COMPRESS_HOST_END
