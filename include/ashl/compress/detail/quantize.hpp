// ashl/compress/detail/quantize.hpp — pieces shared by the dense quantizers
// (qsgd, terngrad, sign, natural): chunked float conversion, bucket
// statistics, stochastic level rounding, packing of w-bit codes, sign bits,
// natural-compression codes.
//
//   float buf[detail::chunk];
//   const float* xf = detail::as_float(x + pos, len, buf);       // f16/bf16 widened
//   detail::bucket_stats st = detail::stats(xf, len);            // sum x^2, sum |x|, max key
//   detail::round_levels(xf, k, len, L, words, codes);           // codes[i] = level << 1 | sign
//   detail::pack_chunk(codes, len, w, out + pos * w / 8, room);
//
// Codes are one little-endian bit stream, element i in bits [i w, (i+1) w)
// (LSB first, detail/levels.hpp); chunks start at multiples of 8 elements,
// so eight codes fill exactly w bytes and every chunk starts on a byte.
// Hot loops use the compilers' 4-lane vector extension (SSE2/NEON width, no
// -march flag) and no per-element division. docs/algorithms.md §4.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/detail/host_simd.hpp>
#include <ashl/compress/detail/elements.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/compress/detail/random_words.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if ASHL_DETAIL_HOST_X86
#include <immintrin.h>
#endif

ASHL_DETAIL_COMPRESS_HOST_BEGIN
namespace detail {

// Elements per inner chunk: 1024 floats and 1024 random words (8 KiB of
// stack) stay in L1 while a bucket is read twice (statistics, then codes).
inline constexpr std::size_t chunk = 1024;

// A pointer to len floats: x itself for f32, else widened into buf.
template <gradient_element T>
inline const float* as_float(const T* x, std::size_t len, float* buf) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    (void)buf;
    (void)len;
    return x;
  } else {
    widen_16_to_f32(x, len, buf);
    return buf;
  }
}

// Bucket statistics in one pass. max_key is the largest |x| bit pattern, so
// max_key >= 0x7f800000 means the bucket holds an inf or NaN.
struct bucket_stats {
  float sum_sq = 0.0f;
  float sum_abs = 0.0f;
  std::uint32_t max_key = 0;
  [[nodiscard]] bool finite() const noexcept { return max_key < 0x7f800000u; }
  [[nodiscard]] float max_abs() const noexcept { return std::bit_cast<float>(max_key); }
};

inline void merge(bucket_stats& a, const bucket_stats& b) noexcept {
  a.sum_sq += b.sum_sq;
  a.sum_abs += b.sum_abs;
  a.max_key = std::max(a.max_key, b.max_key);
}

#if ASHL_DETAIL_PHILOX_X86
// stats and max_abs_key on 8 lanes for CPUs with AVX2 (chosen at run time):
// lane j takes elements i + j of every 8, which is exactly what the two
// 4-lane accumulator sets of the portable loop take, and the lanes are
// combined in the same order, so the float sums have the same bits. They
// do elements [0, len & ~7); the caller adds the tail as the portable loop does.
__attribute__((target("avx2"))) inline bucket_stats stats_avx2(const float* x, std::size_t len) noexcept {
  typedef float f32x8 __attribute__((vector_size(32)));
  typedef std::int32_t i32x8 __attribute__((vector_size(32)));
  f32x8 sq{}, ab{};
  i32x8 mk{};
  for (std::size_t i = 0, e = len & ~std::size_t{7}; i < e; i += 8) {
    i32x8 b;
    std::memcpy(&b, x + i, 32);
    b &= 0x7fffffff;
    const f32x8 a = reinterpret_cast<f32x8>(b);
    sq += a * a;
    ab += a;
    mk = b > mk ? b : mk;  // keys have the sign bit clear: a signed compare orders them
  }
  bucket_stats st;
  const float q0 = sq[0] + sq[4], q1 = sq[1] + sq[5], q2 = sq[2] + sq[6], q3 = sq[3] + sq[7];
  const float a0 = ab[0] + ab[4], a1 = ab[1] + ab[5], a2 = ab[2] + ab[6], a3 = ab[3] + ab[7];
  st.sum_sq = (q0 + q1) + (q2 + q3);
  st.sum_abs = (a0 + a1) + (a2 + a3);
  std::uint32_t m = 0;
  for (int l = 0; l < 8; ++l) m = std::max(m, static_cast<std::uint32_t>(mk[l]));
  st.max_key = m;
  return st;
}
__attribute__((target("avx2"))) inline std::uint32_t max_abs_key_avx2(const float* x, std::size_t len) noexcept {
  typedef std::int32_t i32x8 __attribute__((vector_size(32)));
  i32x8 m0{}, m1{};
  std::size_t i = 0;
  for (const std::size_t e = len & ~std::size_t{15}; i < e; i += 16) {
    i32x8 b0, b1;
    std::memcpy(&b0, x + i, 32);
    std::memcpy(&b1, x + i + 8, 32);
    b0 &= 0x7fffffff;
    b1 &= 0x7fffffff;
    m0 = b0 > m0 ? b0 : m0;
    m1 = b1 > m1 ? b1 : m1;
  }
  if (i < (len & ~std::size_t{7})) {
    i32x8 b;
    std::memcpy(&b, x + i, 32);
    b &= 0x7fffffff;
    m0 = b > m0 ? b : m0;
  }
  m0 = m1 > m0 ? m1 : m0;
  std::uint32_t r = 0;
  for (int l = 0; l < 8; ++l) r = std::max(r, static_cast<std::uint32_t>(m0[l]));
  return r;
}
#endif

#if ASHL_DETAIL_HOST_VECTOR
// Magnitude keys (detail::magnitude_key) of x[0], ..., x[3], and the lane-wise
// larger of two key vectors: keys have the sign bit clear, so a signed
// compare orders them. stats and max_abs_key share these.
inline ashl_u32x4 magnitude_keys_x4(const float* x) noexcept {
  ashl_u32x4 b;
  std::memcpy(&b, x, 16);
  return b & 0x7fffffffu;
}
inline ashl_u32x4 max_keys_x4(ashl_u32x4 a, ashl_u32x4 b) noexcept {
  return vsel(reinterpret_cast<ashl_i32x4>(a) > reinterpret_cast<ashl_i32x4>(b), a, b);
}
#endif

inline bucket_stats stats(const float* x, std::size_t len) noexcept {
  bucket_stats st;
  std::size_t i = 0;
#if ASHL_DETAIL_PHILOX_X86
  if (cpu_has_avx2()) {
    st = stats_avx2(x, len);
    i = len & ~std::size_t{7};
  } else
#endif
#if ASHL_DETAIL_HOST_VECTOR
  if constexpr (ASHL_DETAIL_VECTOR_EXT) {
    // Two independent accumulator sets hide the add latency.
    ashl_f32x4 sq0{}, sq1{}, ab0{}, ab1{};
    ashl_u32x4 mk0{}, mk1{};
    for (const std::size_t e = len & ~std::size_t{7}; i < e; i += 8) {
      const ashl_u32x4 b0 = magnitude_keys_x4(x + i), b1 = magnitude_keys_x4(x + i + 4);
      const ashl_f32x4 a0 = reinterpret_cast<ashl_f32x4>(b0), a1 = reinterpret_cast<ashl_f32x4>(b1);
      sq0 += a0 * a0;
      sq1 += a1 * a1;
      ab0 += a0;
      ab1 += a1;
      mk0 = max_keys_x4(b0, mk0);
      mk1 = max_keys_x4(b1, mk1);
    }
    const ashl_f32x4 sq = sq0 + sq1, ab = ab0 + ab1;
    mk0 = max_keys_x4(mk1, mk0);
    st.sum_sq = (sq[0] + sq[1]) + (sq[2] + sq[3]);
    st.sum_abs = (ab[0] + ab[1]) + (ab[2] + ab[3]);
    st.max_key = std::max(std::max(mk0[0], mk0[1]), std::max(mk0[2], mk0[3]));
  }
#endif
  if (i == 0 && len >= 8) {
    // Portable build (ASHL_HOST_SIMD_PORTABLE): the same eight lanes,
    // combined in the same order, so the sums have the bits of the vector
    // paths (test/compress/simd_paths.cpp compares them).
    float sq[8] = {}, ab[8] = {};
    for (const std::size_t e = len & ~std::size_t{7}; i < e; i += 8)
      for (std::size_t l = 0; l < 8; ++l) {
        const std::uint32_t k = magnitude_key(x[i + l]);
        const float a = std::bit_cast<float>(k);
        sq[l] += a * a;
        ab[l] += a;
        st.max_key = std::max(st.max_key, k);
      }
    st.sum_sq = ((sq[0] + sq[4]) + (sq[1] + sq[5])) + ((sq[2] + sq[6]) + (sq[3] + sq[7]));
    st.sum_abs = ((ab[0] + ab[4]) + (ab[1] + ab[5])) + ((ab[2] + ab[6]) + (ab[3] + ab[7]));
  }
  for (; i < len; ++i) {
    const std::uint32_t k = magnitude_key(x[i]);
    const float a = std::bit_cast<float>(k);
    st.sum_sq += a * a;
    st.sum_abs += a;
    st.max_key = std::max(st.max_key, k);
  }
  return st;
}

// max over |x| bit patterns (>= 0x7f800000: an inf or NaN is present).
inline std::uint32_t max_abs_key(const float* x, std::size_t len) noexcept {
  std::size_t i = 0;
  std::uint32_t r = 0;
#if ASHL_DETAIL_PHILOX_X86
  if (cpu_has_avx2()) {
    r = max_abs_key_avx2(x, len);
    i = len & ~std::size_t{7};
  } else
#endif
#if ASHL_DETAIL_HOST_VECTOR
  if constexpr (ASHL_DETAIL_VECTOR_EXT) {
    ashl_u32x4 m0{}, m1{};
    for (const std::size_t e = len & ~std::size_t{7}; i < e; i += 8) {
      m0 = max_keys_x4(magnitude_keys_x4(x + i), m0);
      m1 = max_keys_x4(magnitude_keys_x4(x + i + 4), m1);
    }
    m0 = max_keys_x4(m1, m0);
    r = std::max(std::max(m0[0], m0[1]), std::max(m0[2], m0[3]));
  }
#endif
  for (; i < len; ++i) r = std::max(r, magnitude_key(x[i]));
  return r;
}

// sum |x_i| in double (the sign codec's mean |x|): two 2-lane double
// accumulators, exact for the usual gradient ranges whatever the order
// (24-bit mantissas over fewer than ~29 binades fit double's 53 bits).
inline double sum_abs_f64(const float* x, std::size_t len) noexcept {
  std::size_t i = 0;
  double s = 0.0;
#if ASHL_DETAIL_HOST_VECTOR
  if constexpr (ASHL_DETAIL_VECTOR_EXT) {
    typedef double ashl_f64x2 __attribute__((vector_size(16)));
    typedef float ashl_f32x2 __attribute__((vector_size(8)));
    ashl_f64x2 a0{}, a1{};
    for (const std::size_t e = len & ~std::size_t{3}; i < e; i += 4) {
      ashl_u32x4 b;
      std::memcpy(&b, x + i, 16);
      b &= 0x7fffffffu;
      ashl_f32x2 lo, hi;
      std::memcpy(&lo, &b, 8);
      std::memcpy(&hi, reinterpret_cast<const char*>(&b) + 8, 8);
      a0 += __builtin_convertvector(lo, ashl_f64x2);
      a1 += __builtin_convertvector(hi, ashl_f64x2);
    }
    const ashl_f64x2 a = a0 + a1;
    s = a[0] + a[1];
  }
#endif
  if (i == 0 && len >= 4) {  // portable build: the vector path's lanes and order
    double l[4] = {};
    for (const std::size_t e = len & ~std::size_t{3}; i < e; i += 4)
      for (std::size_t j = 0; j < 4; ++j) l[j] += std::fabs(static_cast<double>(x[i + j]));
    s = (l[0] + l[2]) + (l[1] + l[3]);
  }
  for (; i < len; ++i) s += std::fabs(static_cast<double>(x[i]));
  return s;
}

#if ASHL_DETAIL_F16C_X86
// Four 16-bit elements at p widened exactly to f32 (half: vcvtph2ps,
// bfloat16: the pattern in the top half).
template <class T>
__attribute__((target("avx2,f16c"))) inline __m128 widen4_16(const T* p) noexcept {
  const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  if constexpr (std::is_same_v<T, half>)
    return _mm_cvtph_ps(h);
  else
    return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16));
}

// sum_abs_f64 of the widened elements [0, returned) (a multiple of 4), from
// the 16-bit patterns: one 4-lane double accumulator holds sum_abs_f64's
// lanes (l0, l1 | l2, l3), combined as it does.
template <class T>
__attribute__((target("avx2,f16c"))) inline std::size_t sum_abs_16_avx2(const T* x, std::size_t len,
                                                                      double& s) noexcept {
  const __m128i abs_mask = _mm_set1_epi32(0x7fffffff);
  __m256d acc = _mm256_setzero_pd();
  std::size_t i = 0;
  for (const std::size_t e = len & ~std::size_t{3}; i < e; i += 4) {
    const __m128 f = _mm_castsi128_ps(_mm_and_si128(_mm_castps_si128(widen4_16(x + i)), abs_mask));
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(f));
  }
  alignas(32) double l[4];
  _mm256_store_pd(l, acc);
  s = i == 0 ? 0.0 : (l[0] + l[2]) + (l[1] + l[3]);
  return i;
}

// negative_bits of the widened elements [0, returned) (a multiple of 8).
template <class T>
__attribute__((target("avx2,f16c"))) inline std::size_t negative_bits_16_avx2(const T* x, std::size_t len,
                                                                            std::byte* out) noexcept {
  const __m256 zero = _mm256_setzero_ps();
  std::size_t i = 0;
  for (const std::size_t e = len & ~std::size_t{7}; i < e; i += 8) {
    const __m256 f = _mm256_set_m128(widen4_16(x + i + 4), widen4_16(x + i));
    out[i / 8] = static_cast<std::byte>(_mm256_movemask_ps(_mm256_cmp_ps(f, zero, _CMP_LT_OQ)));
  }
  return i;
}
#endif

// Whether sum_abs_f64_16 and negative_bits_16 run on this CPU (16-bit T,
// AVX2 and F16C): a 16-bit caller then needs no widened copy.
template <class T>
inline bool direct_16() noexcept {
#if ASHL_DETAIL_F16C_X86
  if constexpr (!std::is_same_v<T, float> && std::endian::native == std::endian::little) return cpu_has_avx2_f16c();
#endif
  return false;
}

// sum_abs_f64 and negative_bits of the widened 16-bit elements, read from
// the 16-bit patterns (only where direct_16<T>(): same sums, same bits).
template <class T>
inline double sum_abs_f64_16(const T* x, std::size_t len) noexcept {
  double s = 0.0;
  std::size_t i = 0;
#if ASHL_DETAIL_F16C_X86
  i = sum_abs_16_avx2(x, len, s);
#endif
  for (; i < len; ++i) s += std::fabs(static_cast<double>(to_float(x[i])));
  return s;
}
template <class T>
inline void negative_bits_16(const T* x, std::size_t len, std::byte* out) noexcept {
  std::size_t i = 0;
#if ASHL_DETAIL_F16C_X86
  i = negative_bits_16_avx2(x, len, out);
#endif
  for (; i < len; i += 8) {
    unsigned byte = 0;
    for (std::size_t j = i; j < len && j < i + 8; ++j) byte |= (to_float(x[j]) < 0.0f ? 1u : 0u) << (j - i);
    out[i / 8] = static_cast<std::byte>(byte);
  }
}

// Bit i of out (LSB first) = x_i < 0 (so -0 and +0 send 0), for len
// elements; writes ceil(len / 8) bytes, unused bits of the last one 0.
inline void negative_bits(const float* x, std::size_t len, std::byte* out) noexcept {
  std::size_t i = 0;
#if ASHL_DETAIL_HOST_X86
  const __m128 zero = _mm_setzero_ps();
  for (const std::size_t e = len & ~std::size_t{7}; i < e; i += 8) {
    const int lo = _mm_movemask_ps(_mm_cmplt_ps(_mm_loadu_ps(x + i), zero));
    const int hi = _mm_movemask_ps(_mm_cmplt_ps(_mm_loadu_ps(x + i + 4), zero));
    out[i / 8] = static_cast<std::byte>(lo | (hi << 4));
  }
#endif
  for (; i < len; i += 8) {
    unsigned byte = 0;
    for (std::size_t l = 0; l < 8 && i + l < len; ++l) byte |= (x[i + l] < 0.0f ? 1u : 0u) << l;
    out[i / 8] = static_cast<std::byte>(byte);
  }
}

#if ASHL_DETAIL_PHILOX_X86
// The rounding of 8 elements with their 8 words (AVX2 intrinsics; the same
// float operations as the loops: min(|x| k, L), truncation, the fraction,
// the 24-bit uniform by an exact 2^-24 scaling, and min(level, 1) as the
// level != 0 test of the sign).
__attribute__((target("avx2"), always_inline)) inline __m256i level_codes8_avx2(const float* x, __m256i w,
                                                                               __m256 k, __m256 L) noexcept {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256 r0 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff))), k);
  const __m256 r = _mm256_min_ps(r0, L);  // r0 < L ? r0 : L
  const __m256i l = _mm256_cvttps_epi32(r);
  const __m256 frac = _mm256_sub_ps(r, _mm256_cvtepi32_ps(l));
  const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(w, 8)), _mm256_set1_ps(1.0f / 16777216.0f));
  const __m256i level = _mm256_sub_epi32(l, _mm256_castps_si256(_mm256_cmp_ps(u, frac, _CMP_LT_OQ)));
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(b, 31), _mm256_min_epu32(level, _mm256_set1_epi32(1)));
  return _mm256_or_si256(_mm256_slli_epi32(level, 1), sign);
}

// round_levels on 8 lanes for CPUs with AVX2 (chosen at run time); returns
// how many elements it did (a multiple of 16). Same arithmetic as the 4-lane
// loop, so the codes do not depend on the path taken.
__attribute__((target("avx2"))) inline std::size_t round_levels_avx2(const float* x, std::size_t len, float k, float L,
                                                                    const std::uint32_t* words,
                                                                    std::uint16_t* codes) noexcept {
  const __m256 kv = _mm256_set1_ps(k), Lv = _mm256_set1_ps(L);
  std::size_t i = 0;
  for (const std::size_t e = len & ~std::size_t{15}; i < e; i += 16) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + i));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + i + 8));
    const __m256i c0 = level_codes8_avx2(x + i, w0, kv, Lv), c1 = level_codes8_avx2(x + i + 8, w1, kv, Lv);
    // Codes are below 2^16: the unsigned-saturating pack keeps them; it
    // works per 128-bit half, so the quadwords are put back in order.
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(c0, c1), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), p);
  }
  return i;
}
// The same on 16 lanes for CPUs with AVX-512F.
__attribute__((target("avx512f"))) inline std::size_t round_levels_avx512(const float* x, std::size_t len,
                                                                        float k, float L,
                                                                        const std::uint32_t* words,
                                                                        std::uint16_t* codes) noexcept {
  typedef float f32x16 __attribute__((vector_size(64)));
  typedef std::int32_t i32x16 __attribute__((vector_size(64)));
  typedef std::uint32_t u32x16 __attribute__((vector_size(64)));
  typedef std::uint16_t u16x16 __attribute__((vector_size(32)));
  std::size_t i = 0;
  const f32x16 top = f32x16{} + L;
  for (const std::size_t e = len & ~std::size_t{15}; i < e; i += 16) {
    u32x16 b, w;
    std::memcpy(&b, x + i, 64);
    std::memcpy(&w, words + i, 64);
    const f32x16 r0 = reinterpret_cast<f32x16>(b & 0x7fffffffu) * k;
    const f32x16 r = r0 < L ? r0 : top;
    const i32x16 l = __builtin_convertvector(r, i32x16);
    const f32x16 frac = r - __builtin_convertvector(l, f32x16);
    const f32x16 u = __builtin_convertvector(reinterpret_cast<i32x16>(w >> 8), f32x16) * (1.0f / 16777216.0f);
    const i32x16 level = l - (u < frac);
    const u32x16 sign = (b >> 31) & reinterpret_cast<u32x16>(level != 0);
    const u32x16 code = (reinterpret_cast<u32x16>(level) << 1) | sign;
    const u16x16 c16 = __builtin_convertvector(code, u16x16);
    std::memcpy(codes + i, &c16, 32);
  }
  return i;
}
#endif

// Stochastic rounding of r_i = min(|x_i| k, L) to level floor(r_i) + 1
// with probability frac(r_i) (decided by the 24-bit uniform of words[i]),
// else floor(r_i), so E[level] = r_i (to 2^-24 of one level step).
// codes[i] = level << 1 | sign, the sign bit only on a non-zero level
// (canonical codes, detail/levels.hpp). L <= 32767.
inline void round_levels(const float* x, std::size_t len, float k, float L, const std::uint32_t* words,
                         std::uint16_t* codes) noexcept {
  std::size_t i = 0;
#if ASHL_DETAIL_PHILOX_X86
  if (cpu_has_avx512f())
    i = round_levels_avx512(x, len, k, L, words, codes);
  else if (cpu_has_avx2())
    i = round_levels_avx2(x, len, k, L, words, codes);
#endif
#if ASHL_DETAIL_HOST_VECTOR
  if constexpr (ASHL_DETAIL_VECTOR_EXT) {
    const ashl_u32x4 top = reinterpret_cast<ashl_u32x4>(ashl_f32x4{} + L);
    for (const std::size_t e = len & ~std::size_t{3}; i < e; i += 4) {
      ashl_u32x4 b, w;
      std::memcpy(&b, x + i, 16);
      std::memcpy(&w, words + i, 16);
      const ashl_f32x4 r0 = reinterpret_cast<ashl_f32x4>(b & 0x7fffffffu) * k;
      const ashl_f32x4 r = reinterpret_cast<ashl_f32x4>(vsel(r0 < L, reinterpret_cast<ashl_u32x4>(r0), top));
      const ashl_i32x4 l = __builtin_convertvector(r, ashl_i32x4);
      const ashl_f32x4 frac = r - __builtin_convertvector(l, ashl_f32x4);
      const ashl_f32x4 u =
          __builtin_convertvector(reinterpret_cast<ashl_i32x4>(w >> 8), ashl_f32x4) * (1.0f / 16777216.0f);
      const ashl_i32x4 level = l - (u < frac);
      const ashl_u32x4 sign = (b >> 31) & reinterpret_cast<ashl_u32x4>(level != 0);
      const ashl_u32x4 code = (reinterpret_cast<ashl_u32x4>(level) << 1) | sign;
      const ashl_u16x4 c16 = __builtin_convertvector(code, ashl_u16x4);
      std::memcpy(codes + i, &c16, 8);
    }
  }
#endif
  for (; i < len; ++i) {
    const std::uint32_t b = std::bit_cast<std::uint32_t>(x[i]);
    float r = std::bit_cast<float>(b & 0x7fffffffu) * k;
    r = r < L ? r : L;
    const auto l = static_cast<std::int32_t>(r);
    const float frac = r - static_cast<float>(l);
    const std::int32_t level = l + (uniform01(words[i]) < frac ? 1 : 0);
    codes[i] = static_cast<std::uint16_t>((static_cast<std::uint32_t>(level) << 1) | ((b >> 31) & (level != 0)));
  }
}

// The same rounding with r_i = |x_i| * L / norm in double, for buckets whose
// L / norm is not a finite float (tiny subnormal norms).
inline void round_levels_exact(const float* x, std::size_t len, float norm, float L, const std::uint32_t* words,
                               std::uint16_t* codes) noexcept {
  for (std::size_t i = 0; i < len; ++i) {
    const std::uint32_t b = std::bit_cast<std::uint32_t>(x[i]);
    const double rd = static_cast<double>(std::fabs(x[i])) * L / norm;
    const float r = rd < L ? static_cast<float>(rd) : L;
    const auto l = static_cast<std::int32_t>(r);
    const float frac = r - static_cast<float>(l);
    const std::int32_t level = l + (uniform01(words[i]) < frac ? 1 : 0);
    codes[i] = static_cast<std::uint16_t>((static_cast<std::uint32_t>(level) << 1) | ((b >> 31) & (level != 0)));
  }
}

// Packs len codes of w bits (1..16), LSB first, into exactly
// ceil(len w / 8) bytes at out (unused bits of a last partial byte are 0).
// `room` bytes are writable at out: while 8 remain, a group of eight w <= 8
// codes is one 8-byte store of which w bytes count.
inline void pack_chunk(const std::uint16_t* codes, std::size_t len, unsigned w, std::byte* out,
                       std::size_t room) noexcept {
  std::size_t g = 0, o = 0;
  const std::size_t groups = len & ~std::size_t{7};
  // The common widths (terngrad 2, qsgd levels 7 -> 4, 127 -> 8) as plain
  // loops the compiler vectorizes; others as 8-code groups in one u64.
  if (w == 8) {
#if ASHL_DETAIL_HOST_VECTOR
    if constexpr (ASHL_DETAIL_VECTOR_EXT) {
      typedef std::uint16_t ashl_u16x8 __attribute__((vector_size(16)));
      typedef std::uint8_t ashl_u8x8 __attribute__((vector_size(8)));
      for (; g < groups; g += 8) {
        ashl_u16x8 c;
        std::memcpy(&c, codes + g, 16);
        const ashl_u8x8 b = __builtin_convertvector(c, ashl_u8x8);
        std::memcpy(out + g, &b, 8);
      }
    }
#endif
    for (; g < groups; ++g) out[g] = static_cast<std::byte>(codes[g]);
    o = groups;
  } else if (w == 4) {
#if ASHL_DETAIL_HOST_X86
    // 16 codes per step: pmaddwd joins neighbours (c0 + 16 c1 is a byte),
    // two saturating packs narrow the sums (each <= 255) to bytes.
    const __m128i join = _mm_set1_epi32(0x00100001);
    for (; g + 16 <= groups; g += 16) {
      const __m128i a = _mm_madd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + g)), join);
      const __m128i b = _mm_madd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + g + 8)), join);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + g / 2), _mm_packus_epi16(_mm_packs_epi32(a, b), a));
    }
#endif
    for (; g < groups; g += 2) out[g / 2] = static_cast<std::byte>(codes[g] | (codes[g + 1] << 4));
    o = groups / 2;
  } else if (w == 2) {
#if ASHL_DETAIL_HOST_X86
    // 16 codes per step: c0 + 4 c1 (pmaddwd), pack, then q0 + 16 q1 is the byte.
    const __m128i join2 = _mm_set1_epi32(0x00040001), join4 = _mm_set1_epi32(0x00100001);
    for (; g + 16 <= groups; g += 16) {
      const __m128i a = _mm_madd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + g)), join2);
      const __m128i b = _mm_madd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + g + 8)), join2);
      const __m128i q = _mm_madd_epi16(_mm_packs_epi32(a, b), join4);
      const __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(q, q), q);
      const std::uint32_t four = static_cast<std::uint32_t>(_mm_cvtsi128_si32(bytes));
      std::memcpy(out + g / 4, &four, 4);
    }
#endif
    for (; g < groups; g += 4)
      out[g / 4] =
          static_cast<std::byte>(codes[g] | (codes[g + 1] << 2) | (codes[g + 2] << 4) | (codes[g + 3] << 6));
    o = groups / 4;
  } else if (w < 8) {
    for (; g < groups; g += 8, o += w) {
      std::uint64_t v = 0;
      for (unsigned j = 0; j < 8; ++j) v |= static_cast<std::uint64_t>(codes[g + j]) << (j * w);
      if (o + 8 <= room)
        store_le<std::uint64_t>(out + o, v);
      else
        for (unsigned j = 0; j < w; ++j) out[o + j] = static_cast<std::byte>(v >> (8 * j));
    }
  }
  std::uint64_t acc = 0;
  unsigned fill = 0;
  for (; g < len; ++g) {
    acc |= static_cast<std::uint64_t>(codes[g]) << fill;
    fill += w;
    while (fill >= 8) {
      out[o++] = static_cast<std::byte>(acc & 0xffu);
      acc >>= 8;
      fill -= 8;
    }
  }
  if (fill > 0) out[o] = static_cast<std::byte>(acc & 0xffu);
}

#if ASHL_DETAIL_PHILOX_X86
// natural codes of 8 elements (AVX2 intrinsics): the integer tests of the
// 4-lane loop; the below-range test (three float multiplies) only when some
// lane has low < 1, which gradients rarely do (emin sits 126 binades below
// max |x|).
__attribute__((target("avx2"), always_inline)) inline __m256i natural_codes8_avx2(const float* x, __m256i w,
                                                                                 __m256i emin_126,
                                                                                 const float* f) noexcept {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i ab = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
  const __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x00800000), ab);
  // Subnormals normalized by an exact 2^64 scaling (exponent then 64 too high).
  const __m256 af = _mm256_castsi256_ps(ab);
  const __m256i nb = _mm256_castps_si256(_mm256_mul_ps(af, _mm256_set1_ps(18446744073709551616.0f)));
  const __m256i bits = _mm256_blendv_epi8(ab, nb, sub);
  const __m256i E = _mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_and_si256(sub, _mm256_set1_epi32(64)));
  const __m256i M2 = _mm256_slli_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffff)), 1);
  const __m256i u = _mm256_srli_epi32(w, 8);
  const __m256i low = _mm256_sub_epi32(E, emin_126);  // E - 126 - emin
  const __m256i in_range = _mm256_sub_epi32(low, _mm256_cmpgt_epi32(M2, u));  // low + [u < M2]
  const __m256i below_one = _mm256_cmpgt_epi32(_mm256_set1_epi32(1), low);
  __m256i c = in_range;
  if (!_mm256_testz_si256(below_one, below_one)) {
    const __m256 t = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(af, _mm256_set1_ps(f[0])), _mm256_set1_ps(f[1])),
                                   _mm256_set1_ps(f[2]));
    const __m256i below = _mm256_srli_epi32(_mm256_castps_si256(_mm256_cmp_ps(_mm256_cvtepi32_ps(u), t, _CMP_LT_OQ)), 31);
    c = _mm256_blendv_epi8(in_range, below, below_one);
  }
  c = _mm256_min_epi32(c, _mm256_set1_epi32(127));
  c = _mm256_andnot_si256(_mm256_cmpeq_epi32(ab, _mm256_setzero_si256()), c);
  const __m256i nonzero = _mm256_min_epu32(c, _mm256_set1_epi32(1));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(b, 31), nonzero), 7);
  return _mm256_or_si256(c, sign);
}

// natural_codes on 8 lanes for CPUs with AVX2 (chosen at run time); returns
// how many elements it did (a multiple of 32). Same tests as the 4-lane loop.
__attribute__((target("avx2"))) inline std::size_t natural_codes_avx2(const float* x, std::size_t len,
                                                                     std::int32_t emin, const float* f,
                                                                     const std::uint32_t* words,
                                                                     std::byte* out) noexcept {
  const __m256i emin_126 = _mm256_set1_epi32(126 + emin);
  std::size_t i = 0;
  for (const std::size_t e = len & ~std::size_t{31}; i < e; i += 32) {
    __m256i c[4];
    for (int j = 0; j < 4; ++j)
      c[j] = natural_codes8_avx2(x + i + 8 * j,
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + i + 8 * j)), emin_126, f);
    // Codes are bytes: two saturating packs (per 128-bit half), then the
    // dwords back in element order.
    const __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
    const __m256i o = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), o);
  }
  return i;
}
#endif

// Natural compression codes (compress/natural.hpp) for len elements: with
// a = |x| = m 2^k (m in [0.5, 1)) and low = k - emin, code
// c = low + [u < 2m - 1] when low >= 1, else [u < a 2^-emin], at most 127,
// 0 for a = 0; bit 7 = sign when c != 0. Integer form of the same tests:
// u < 2m - 1 is (w >> 8) < 2 M (M the mantissa field, subnormals normalized
// by an exact 2^64 scaling) and u < a 2^-emin is (w >> 8) < a 2^(24 - emin),
// the power applied as up to three exact factors f[0..2].
inline void natural_codes(const float* x, std::size_t len, std::int32_t emin, const float* f,
                          const std::uint32_t* words, std::byte* out) noexcept {
  std::size_t i = 0;
#if ASHL_DETAIL_PHILOX_X86
  if (cpu_has_avx2()) i = natural_codes_avx2(x, len, emin, f, words, out);
#endif
#if ASHL_DETAIL_HOST_VECTOR
  if constexpr (ASHL_DETAIL_VECTOR_EXT) {
    typedef std::uint8_t ashl_u8x4 __attribute__((vector_size(4)));
    for (const std::size_t e = len & ~std::size_t{3}; i < e; i += 4) {
      ashl_u32x4 b, w;
      std::memcpy(&b, x + i, 16);
      std::memcpy(&w, words + i, 16);
      const ashl_u32x4 ab = b & 0x7fffffffu;
      const ashl_f32x4 af = reinterpret_cast<ashl_f32x4>(ab);
      const ashl_u32x4 nb = reinterpret_cast<ashl_u32x4>(af * 18446744073709551616.0f);  // a 2^64
      const ashl_i32x4 sub = reinterpret_cast<ashl_i32x4>(ab) < 0x00800000;
      const ashl_u32x4 bits = vsel(sub, nb, ab);
      const ashl_i32x4 E = reinterpret_cast<ashl_i32x4>(bits >> 23) - (sub & 64);
      const ashl_i32x4 M2 = reinterpret_cast<ashl_i32x4>((bits & 0x7fffffu) << 1);
      const ashl_i32x4 u = reinterpret_cast<ashl_i32x4>(w >> 8);
      const ashl_i32x4 low = E - 126 - emin;
      const ashl_i32x4 in_range = low - (u < M2);
      const ashl_f32x4 t = af * f[0] * f[1] * f[2];
      const ashl_i32x4 below = -(__builtin_convertvector(u, ashl_f32x4) < t);
      ashl_i32x4 c = low >= 1 ? in_range : below;
      c = c > 127 ? ashl_i32x4{} + 127 : c;
      c = reinterpret_cast<ashl_i32x4>(ab) == 0 ? ashl_i32x4{} : c;
      const ashl_u32x4 sign = ((b >> 31) & reinterpret_cast<ashl_u32x4>(c != 0)) << 7;
      const ashl_u8x4 c8 = __builtin_convertvector(reinterpret_cast<ashl_u32x4>(c) | sign, ashl_u8x4);
      std::memcpy(out + i, &c8, 4);
    }
  }
#endif
  for (; i < len; ++i) {
    const std::uint32_t b = std::bit_cast<std::uint32_t>(x[i]), ab = b & 0x7fffffffu;
    const float af = std::bit_cast<float>(ab);
    const bool sub = ab < 0x00800000u;
    const std::uint32_t bits = sub ? std::bit_cast<std::uint32_t>(af * 18446744073709551616.0f) : ab;
    const std::int32_t E = static_cast<std::int32_t>(bits >> 23) - (sub ? 64 : 0);
    const auto M2 = static_cast<std::int32_t>((bits & 0x7fffffu) << 1);
    const auto u = static_cast<std::int32_t>(words[i] >> 8);
    const std::int32_t low = E - 126 - emin;
    std::int32_t c = low >= 1 ? low + (u < M2 ? 1 : 0) : (static_cast<float>(u) < af * f[0] * f[1] * f[2] ? 1 : 0);
    c = c > 127 ? 127 : c;
    c = ab == 0 ? 0 : c;
    out[i] = static_cast<std::byte>(static_cast<std::uint32_t>(c) | (((b >> 31) & (c != 0 ? 1u : 0u)) << 7));
  }
}

// Unpacks len codes of w bits (1..16) written by pack_chunk from exactly
// ceil(len w / 8) bytes at in.
inline void unpack_chunk(const std::byte* in, std::size_t len, unsigned w, std::uint16_t* codes) noexcept {
  std::size_t g = 0;
  const std::size_t groups = len & ~std::size_t{7};
  if (w == 8) {
    for (; g < groups; ++g) codes[g] = static_cast<std::uint16_t>(in[g]);
  } else if (w == 4) {
    for (; g < groups; g += 2) {
      const unsigned b = static_cast<unsigned>(in[g / 2]);
      codes[g] = static_cast<std::uint16_t>(b & 15u);
      codes[g + 1] = static_cast<std::uint16_t>(b >> 4);
    }
  } else if (w == 2) {
    for (; g < groups; g += 4) {
      const unsigned b = static_cast<unsigned>(in[g / 4]);
      for (unsigned j = 0; j < 4; ++j) codes[g + j] = static_cast<std::uint16_t>((b >> (2 * j)) & 3u);
    }
  }
  std::size_t o = g * w / 8;
  const std::uint64_t mask = (std::uint64_t{1} << w) - 1;
  std::uint64_t acc = 0;
  unsigned fill = 0;
  for (; g < len; ++g) {
    while (fill < w) {
      acc |= static_cast<std::uint64_t>(in[o++]) << fill;
      fill += 8;
    }
    codes[g] = static_cast<std::uint16_t>(acc & mask);
    acc >>= w;
    fill -= w;
  }
}

}  // namespace detail
ASHL_DETAIL_COMPRESS_HOST_END
