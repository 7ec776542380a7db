// ashl/compress/detail/block_kernels.hpp — the hot loops of the block-scaled
// integer codec (compress/block.hpp): codes of one piece of a block, the
// checks of a payload's codes, and the add of a block's codes.
//
//   detail::block_codes(x, len, r, m, bits, nullptr, out);   // nearest-even codes of len elements
//   detail::block_keys(x, len, B, key);                      // each block's max |x| bit pattern
//   detail::block_codes_group(x, len, B, r, m, bits, words, out);  // the codes of every block, r[j] each
//   bool ok = detail::block_codes_valid(codes, bytes, bits);  // no code is -2^(bits-1)
//   detail::block_add(codes, len, bits, scale * step, acc);  // acc[i] += f * q_i
//
// The portable loops are plain element-wise arithmetic that the compiler
// vectorizes (-O3, the SSE2 baseline); the add and the code checks are
// compiled a second time under target("avx2") and chosen at run time
// (cpu_has_avx2); the codes have AVX2 and AVX-512F versions in intrinsics,
// the block magnitudes an AVX-512F one (cpu_has_avx512f). Only exact IEEE
// operations are used (one multiply, one add, a round to nearest even by the
// 1.5·2^23 constant or a floor, comparisons), never a fused multiply-add
// (ASHL_DETAIL_BLOCK_NO_CONTRACT, and a builtin multiply under
// target("avx512f")), so every path writes the same codes.
// docs/codecs.md "block"; docs/wire-format.md "Codec payloads / block".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/detail/elements.hpp>
#include <ashl/compress/detail/host_simd.hpp>
#include <ashl/compress/detail/quantize.hpp>
#include <ashl/compress/detail/random_words.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if ASHL_DETAIL_PHILOX_X86 && defined(__GNUC__) && !defined(__clang__)
// gcc 12 reports its own _mm512_undefined_epi32() as uninitialized when
// AVX-512 intrinsics are inlined into a target("avx512f") function.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define ASHL_DETAIL_BLOCK_POP_DIAGNOSTIC 1
#endif

ASHL_DETAIL_COMPRESS_HOST_BEGIN
namespace detail {

// Elements per inner piece of the block codec (a multiple of 8): one piece's
// int8 codes stay on the stack.
inline constexpr std::size_t block_piece = 1024;

// 1.5 * 2^23: t + c - c rounds |t| < 2^22 to the nearest integer, ties to
// even, in the current (default) rounding mode.
inline constexpr float block_round_constant = 12582912.0f;

// x r is rounded to f32 before anything is added to it, on every path and
// whatever the user's flags: gcc contracts a multiply and an add into an FMA
// wherever the target has one (C++ defaults to -ffp-contract=fast; -mfma,
// -march=haswell or newer), clang within one expression, and one rounding
// of x r + u gives other codes than the device kernel's __fmul_rn /
// __fadd_rn (compress/block `x_r_is_rounded_before_the_add`, built with
// -O2 -mfma at ASHL_HOST_SIMD avx2, failed before this). gcc: this optimize
// attribute on the functions that multiply and add (gcc then does not inline
// them into a caller that would contract); clang: #pragma clang fp
// contract(off) in their bodies.
#if defined(__GNUC__) && !defined(__clang__)
#define ASHL_DETAIL_BLOCK_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define ASHL_DETAIL_BLOCK_NO_CONTRACT
#endif

// q_i = round_nearest_even(x_i * r), clamped to [-m, m]; or, with words,
// q_i = floor(x_i * r + u_i), u_i = (word_i >> 8) 2^-24, clamped.
template <bool Stochastic>
ASHL_DETAIL_BLOCK_NO_CONTRACT inline void block_quantize_body(const float* x, std::size_t len, float r, float m,
                                                              const std::uint32_t* words, std::int8_t* q) noexcept {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  if constexpr (Stochastic) {
    // Integer floor and clamp: gcc 12 does not if-convert a float compare
    // under -ftrapping-math here, and then vectorizes nothing.
    const auto mi = static_cast<std::int32_t>(m);
    for (std::size_t i = 0; i < len; ++i) {
      const float t = x[i] * r + static_cast<float>(static_cast<std::int32_t>(words[i] >> 8)) * 0x1p-24f;  // u < 2^24: exact
      const auto tz = static_cast<std::int32_t>(t);                                 // toward zero
      const std::int32_t fl = tz - static_cast<std::int32_t>(static_cast<float>(tz) > t);  // floor
      q[i] = static_cast<std::int8_t>(fl < -mi ? -mi : (fl > mi ? mi : fl));
    }
  } else {
    (void)words;
    for (std::size_t i = 0; i < len; ++i) {
      float t = x[i] * r;
      t = (t + block_round_constant) - block_round_constant;
      t = t < -m ? -m : t;
      t = t > m ? m : t;
      q[i] = static_cast<std::int8_t>(static_cast<std::int32_t>(t));
    }
  }
}

// Packs len codes (len a multiple of 8 unless it ends the tensor) into
// bits-bit fields, element i in bits [i bits, (i + 1) bits) of the stream.
inline void block_pack_body(const std::int8_t* q, std::size_t len, unsigned bits, std::uint8_t* out) noexcept {
  if (bits == 8) {
    for (std::size_t i = 0; i < len; ++i) out[i] = static_cast<std::uint8_t>(q[i]);
  } else if (bits == 4) {
    const std::size_t pairs = len / 2;
    for (std::size_t j = 0; j < pairs; ++j)
      out[j] = static_cast<std::uint8_t>((static_cast<std::uint8_t>(q[2 * j]) & 0x0fu) |
                                         (static_cast<std::uint8_t>(q[2 * j + 1]) << 4));
    if (len % 2 != 0) out[pairs] = static_cast<std::uint8_t>(static_cast<std::uint8_t>(q[len - 1]) & 0x0fu);
  } else {
    const std::size_t quads = len / 4;
    for (std::size_t j = 0; j < quads; ++j)
      out[j] = static_cast<std::uint8_t>((static_cast<std::uint8_t>(q[4 * j]) & 0x3u) |
                                         ((static_cast<std::uint8_t>(q[4 * j + 1]) & 0x3u) << 2) |
                                         ((static_cast<std::uint8_t>(q[4 * j + 2]) & 0x3u) << 4) |
                                         (static_cast<std::uint8_t>(q[4 * j + 3]) << 6));
    if (len % 4 != 0) {
      std::uint8_t b = 0;
      for (std::size_t i = quads * 4; i < len; ++i)
        b = static_cast<std::uint8_t>(b | ((static_cast<std::uint8_t>(q[i]) & 0x3u) << (2 * (i - quads * 4))));
      out[quads] = b;
    }
  }
}

// acc[i] += f * q_i for len codes starting on a byte (len a multiple of 8
// unless it ends the tensor).
inline void block_add_body(const std::uint8_t* c, std::size_t len, unsigned bits, float f, float* acc) noexcept {
  if (bits == 8) {
    for (std::size_t i = 0; i < len; ++i) acc[i] += f * static_cast<float>(static_cast<std::int8_t>(c[i]));
  } else if (bits == 4) {
    const std::size_t pairs = len / 2;
    for (std::size_t j = 0; j < pairs; ++j) {
      const std::uint8_t b = c[j];
      // Sign-extend each nibble: shift it to the top of an int8, then back.
      const auto lo = static_cast<std::int8_t>(static_cast<std::uint8_t>(b << 4)) >> 4;
      const auto hi = static_cast<std::int8_t>(b) >> 4;
      acc[2 * j] += f * static_cast<float>(lo);
      acc[2 * j + 1] += f * static_cast<float>(hi);
    }
    if (len % 2 != 0)
      acc[len - 1] += f * static_cast<float>(static_cast<std::int8_t>(static_cast<std::uint8_t>(c[pairs] << 4)) >> 4);
  } else {
    // Four 2-bit codes per byte, each sign-extended from the top of an int32.
    const std::size_t quads = len / 4;
    for (std::size_t j = 0; j < quads; ++j) {
      const std::uint32_t b = c[j];
      for (unsigned k = 0; k < 4; ++k)
        acc[4 * j + k] += f * static_cast<float>(static_cast<std::int32_t>(b << (30 - 2 * k)) >> 30);
    }
    for (std::size_t i = quads * 4; i < len; ++i) {
      const std::uint32_t b = c[quads];
      acc[i] += f * static_cast<float>(static_cast<std::int32_t>(b << (30 - 2 * (i - quads * 4))) >> 30);
    }
  }
}

// Whether no code of `bytes` packed bytes is -2^(bits-1) (0x80, 0x8, 0b10).
inline bool block_codes_valid_body(const std::uint8_t* c, std::size_t bytes, unsigned bits) noexcept {
  unsigned bad = 0;
  if (bits == 8) {
    for (std::size_t i = 0; i < bytes; ++i) bad |= static_cast<unsigned>(c[i] == 0x80u);
  } else if (bits == 4) {
    for (std::size_t i = 0; i < bytes; ++i)
      bad |= static_cast<unsigned>((c[i] & 0x0fu) == 0x08u) | static_cast<unsigned>((c[i] & 0xf0u) == 0x80u);
  } else {
    // A 2-bit field is 0b10 when its high bit is set and its low bit is not.
    for (std::size_t i = 0; i < bytes; ++i) bad |= static_cast<unsigned>(c[i] & ~(c[i] << 1) & 0xaau);
  }
  return bad == 0;
}

#if ASHL_DETAIL_PHILOX_X86
__attribute__((target("avx2"))) inline void block_add_avx2(const std::uint8_t* c, std::size_t len, unsigned bits,
                                                          float f, float* acc) noexcept {
  block_add_body(c, len, bits, f, acc);
}
__attribute__((target("avx2"))) inline bool block_codes_valid_avx2(const std::uint8_t* c, std::size_t bytes,
                                                                  unsigned bits) noexcept {
  return block_codes_valid_body(c, bytes, bits);
}

// The codes with AVX-512F intrinsics, quantized and packed in registers, 16
// elements a step. (gcc 12 vectorizes block_quantize_body and
// block_pack_body under target("avx512f") too, but its int32 -> int8
// narrowing, integer floor and nibble interleave kept both at the AVX2 rate:
// 0.36 + 0.17 ns per element here against about 0.1 for these loops.) The
// same exact operations, so the same codes: t = x r (one f32 multiply) plus,
// when stochastic, u = (word >> 8) 2^-24 (exact), one f32 add; then floor
// (vrndscaleps, exact, as the integer floor of block_quantize_body) or
// (t + c) - c (its nearest-even rounding), clamped to [-m, m] (t is integral
// by then, so clamping before or after the conversion is the same),
// converted (exact), packed: the low 2 Bits bytes of the result.
template <bool Stochastic, unsigned Bits>
__attribute__((target("avx512f"), always_inline)) inline __m128i block_step_avx512(__m512 x, __m512i w, __m512 r,
                                                                                 __m512 lo, __m512 hi) noexcept {
  // x r through the builtin: gcc contracts _mm512_mul_ps into a following
  // add (C++ defaults to -ffp-contract=fast and target("avx512f") brings
  // FMA), and one rounding of x r + u is not the codec's two. (u's own
  // product is exact, so contracting that one changes nothing.)
  __m512 t = _mm512_mul_round_ps(x, r, _MM_FROUND_CUR_DIRECTION);
  if constexpr (Stochastic) {
    t = _mm512_add_ps(t, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(w, 8)), _mm512_set1_ps(0x1p-24f)));
    t = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  } else {
    (void)w;
    const __m512 c = _mm512_set1_ps(block_round_constant);
    t = _mm512_sub_ps(_mm512_add_ps(t, c), c);
  }
  const __m512i q = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(t, lo), hi));
  const __m512i low4 = _mm512_set1_epi32(0x0f);
  if constexpr (Bits == 8) {
    return _mm512_cvtepi32_epi8(q);
  } else if constexpr (Bits == 4) {
    // Per 64-bit lane: the even code's nibble, the odd one's 4 bits up
    // (bits 32..35 shifted to 4..7); the lane's low byte is kept.
    return _mm512_cvtepi64_epi8(_mm512_ternarylogic_epi32(low4, q, _mm512_srli_epi64(q, 28), 0xca));  // A ? B : C
  } else {
    // Per 64-bit lane two 2-bit codes in bits 0..3, per 128-bit lane four
    // in bits 0..7 of its dword 0; those four dwords (0, 4, 8, 12) to the front.
    const __m512i two = _mm512_ternarylogic_epi32(_mm512_set1_epi32(0x03), q, _mm512_srli_epi64(q, 30), 0xca);
    const __m512i up = _mm512_slli_epi32(_mm512_shuffle_epi32(two, _MM_PERM_AAAC), 4);
    const __m512i every4th = _mm512_set_epi32(15, 14, 13, 11, 10, 9, 7, 6, 5, 3, 2, 1, 12, 8, 4, 0);
    return _mm512_cvtepi32_epi8(_mm512_permutexvar_epi32(every4th, _mm512_ternarylogic_epi32(low4, two, up, 0xca)));
  }
}

// The codes of the blocks of B elements (the last may be shorter) that make
// up len elements, block j at multiplier r[j]. A block's whole steps load
// and store plainly; its last partial step (B % 16 == 8, or the tensor's
// end) reads masked (a masked-off lane reads x = 0 and word 0, so its code
// is 0 and the unused bits of a tensor's last byte stay 0) and stores its
// bytes through a buffer: the masked store forms of the narrowing (vpmovqb
// to memory) are microcoded on Zen 4 and cost more than the rest of the loop.
template <bool Stochastic, unsigned Bits>
__attribute__((target("avx512f"))) inline void block_codes_avx512(const float* x, std::size_t len, std::size_t B,
                                                                 const float* r, float m,
                                                                 const std::uint32_t* words,
                                                                 std::uint8_t* out) noexcept {
  const __m512 hi = _mm512_set1_ps(m), lo = _mm512_set1_ps(-m);
  for (std::size_t b0 = 0, j = 0; b0 < len; b0 += B, ++j) {
    const std::size_t end = len - b0 < B ? len : b0 + B;
    const __m512 rv = _mm512_set1_ps(r[j]);
    std::size_t i = b0;
    for (; i + 16 <= end; i += 16) {
      const __m512i w = Stochastic ? _mm512_loadu_si512(words + i) : _mm512_setzero_si512();
      const __m128i p = block_step_avx512<Stochastic, Bits>(_mm512_loadu_ps(x + i), w, rv, lo, hi);
      std::uint8_t* o = out + i * Bits / 8;
      if constexpr (Bits == 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o), p);
      } else if constexpr (Bits == 4) {
        _mm_storel_epi64(reinterpret_cast<__m128i*>(o), p);
      } else {
        const auto v = static_cast<std::uint32_t>(_mm_cvtsi128_si32(p));
        std::memcpy(o, &v, 4);
      }
    }
    if (i < end) {
      const auto k = static_cast<__mmask16>((1u << (end - i)) - 1u);
      const __m512i w = Stochastic ? _mm512_maskz_loadu_epi32(k, words + i) : _mm512_setzero_si512();
      alignas(16) std::uint8_t tmp[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(tmp),
                      block_step_avx512<Stochastic, Bits>(_mm512_maskz_loadu_ps(k, x + i), w, rv, lo, hi));
      std::memcpy(out + i * Bits / 8, tmp, ((end - i) * Bits + 7) / 8);
    }
  }
}

// The codes of the blocks of B elements (the last may be shorter) that make
// up len elements, block j at multiplier r[j], with AVX2 intrinsics for
// CPUs without AVX-512F: 32 elements a step, the same operations as
// block_step_avx512 (floor by vroundps), the 32 codes narrowed to bytes by
// two saturating packs (|q| <= 127) and put back in order, then packed. A
// block's partial last step reads through vmaskmovps (masked-off lanes read
// 0: code 0) and stores through a buffer. Not contracted to FMA
// (ASHL_DETAIL_BLOCK_NO_CONTRACT) when the user's flags bring it.
template <bool Stochastic, unsigned Bits>
__attribute__((target("avx2"))) ASHL_DETAIL_BLOCK_NO_CONTRACT inline void block_codes_avx2(
    const float* x, std::size_t len, std::size_t B, const float* r, float m, const std::uint32_t* words,
    std::uint8_t* out) noexcept {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  const __m256 hi = _mm256_set1_ps(m), lo = _mm256_set1_ps(-m);
  const __m256 unit = _mm256_set1_ps(0x1p-24f), c = _mm256_set1_ps(block_round_constant);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (std::size_t b0 = 0, j = 0; b0 < len; b0 += B, ++j) {
    const std::size_t end = len - b0 < B ? len : b0 + B;
    const __m256 rv = _mm256_set1_ps(r[j]);
    for (std::size_t i = b0; i < end; i += 32) {
      const std::size_t rem = end - i < 32 ? end - i : 32;
      __m256i q[4];
      for (std::size_t v = 0; v < 4; ++v) {
        __m256 xv;
        __m256i wv = _mm256_setzero_si256();
        const std::size_t at = i + 8 * v;
        if (rem == 32) {
          xv = _mm256_loadu_ps(x + at);
          if constexpr (Stochastic) wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + at));
        } else {
          // Lane l is read when 8 v + l < rem.
          const auto k = static_cast<int>(rem > 8 * v ? rem - 8 * v : 0);
          const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
          xv = _mm256_maskload_ps(x + at, mask);
          if constexpr (Stochastic) wv = _mm256_maskload_epi32(reinterpret_cast<const int*>(words + at), mask);
        }
        __m256 t = _mm256_mul_ps(xv, rv);
        if constexpr (Stochastic) {
          t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(wv, 8)), unit));
          t = _mm256_floor_ps(t);
        } else {
          (void)wv;
          t = _mm256_sub_ps(_mm256_add_ps(t, c), c);
        }
        q[v] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(t, lo), hi));
      }
      // Bytes in element order: the packs interleave the 128-bit lanes.
      const __m256i b = _mm256_permutevar8x32_epi32(
          _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])), order);
      alignas(32) std::uint8_t tmp[32];
      std::uint8_t* o = rem == 32 ? out + i * Bits / 8 : tmp;
      if constexpr (Bits == 8) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), b);
      } else if constexpr (Bits == 4) {
        // e0 + 16 e1 per byte pair (unsigned nibbles), then to bytes.
        const __m256i nib = _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
        const __m256i pair = _mm256_maddubs_epi16(nib, _mm256_set1_epi16(0x1001));
        const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi16(pair, pair), 0x08);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm256_castsi256_si128(p));
      } else {
        // e0 + 4 e1 per byte pair, then (e0 + 4 e1) + 16 (e2 + 4 e3) per quad.
        const __m256i two = _mm256_and_si256(b, _mm256_set1_epi8(0x03));
        const __m256i pair = _mm256_maddubs_epi16(two, _mm256_set1_epi16(0x0401));
        const __m256i quad = _mm256_madd_epi16(pair, _mm256_set1_epi32(0x00100001));
        const __m256i w16 = _mm256_packus_epi32(quad, quad);
        const __m256i p =
            _mm256_permutevar8x32_epi32(_mm256_packus_epi16(w16, w16), _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(o), _mm256_castsi256_si128(p));
      }
      if (rem != 32) std::memcpy(out + i * Bits / 8, tmp, (rem * Bits + 7) / 8);
    }
  }
}

template <bool Stochastic>
inline void block_codes_avx2(const float* x, std::size_t len, std::size_t B, const float* r, float m, unsigned bits,
                             const std::uint32_t* words, std::uint8_t* out) noexcept {
  if (bits == 8) block_codes_avx2<Stochastic, 8>(x, len, B, r, m, words, out);
  else if (bits == 4) block_codes_avx2<Stochastic, 4>(x, len, B, r, m, words, out);
  else block_codes_avx2<Stochastic, 2>(x, len, B, r, m, words, out);
}

// The magnitude keys (max_abs_key) of the blocks of B elements (the last
// may be shorter) that make up len elements: one pass, one horizontal
// reduction per block.
__attribute__((target("avx512f"))) inline void block_keys_avx512(const float* x, std::size_t len, std::size_t B,
                                                                std::uint32_t* key) noexcept {
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  for (std::size_t b0 = 0, j = 0; b0 < len; b0 += B, ++j) {
    const std::size_t end = len - b0 < B ? len : b0 + B;
    __m512i mx = _mm512_setzero_si512();
    std::size_t i = b0;
    for (; i + 16 <= end; i += 16) mx = _mm512_max_epu32(mx, _mm512_and_si512(_mm512_loadu_si512(x + i), magnitude));
    if (i < end) {
      const auto k = static_cast<__mmask16>((1u << (end - i)) - 1u);
      mx = _mm512_max_epu32(mx, _mm512_and_si512(_mm512_maskz_loadu_epi32(k, x + i), magnitude));
    }
    key[j] = static_cast<std::uint32_t>(_mm512_reduce_max_epu32(mx));
  }
}

template <bool Stochastic>
inline void block_codes_avx512(const float* x, std::size_t len, std::size_t B, const float* r, float m, unsigned bits,
                               const std::uint32_t* words, std::uint8_t* out) noexcept {
  if (bits == 8) block_codes_avx512<Stochastic, 8>(x, len, B, r, m, words, out);
  else if (bits == 4) block_codes_avx512<Stochastic, 4>(x, len, B, r, m, words, out);
  else block_codes_avx512<Stochastic, 2>(x, len, B, r, m, words, out);
}
#endif

// The codes of len (<= block_piece) elements at multiplier r (the block's
// m / absmax), largest magnitude m, written packed to out; words: the
// elements' Philox words for stochastic rounding, nullptr for nearest even.
inline void block_codes(const float* x, std::size_t len, float r, float m, unsigned bits, const std::uint32_t* words,
                        std::byte* out) noexcept {
  std::int8_t q[block_piece];
  auto* o = reinterpret_cast<std::uint8_t*>(out);
#if ASHL_DETAIL_PHILOX_X86
  if (cpu_has_avx512f()) {
    if (words != nullptr) block_codes_avx512<true>(x, len, len, &r, m, bits, words, o);
    else block_codes_avx512<false>(x, len, len, &r, m, bits, words, o);
    return;
  }
  if (cpu_has_avx2()) {
    if (words != nullptr) block_codes_avx2<true>(x, len, len, &r, m, bits, words, o);
    else block_codes_avx2<false>(x, len, len, &r, m, bits, words, o);
    return;
  }
#endif
  if (words != nullptr) block_quantize_body<true>(x, len, r, m, words, q);
  else block_quantize_body<false>(x, len, r, m, words, q);
  block_pack_body(q, len, bits, o);
}

// key[j] = max_abs_key of block j of the blocks of B elements (the last may
// be shorter) that make up len elements.
inline void block_keys(const float* x, std::size_t len, std::size_t B, std::uint32_t* key) noexcept {
#if ASHL_DETAIL_PHILOX_X86
  if (cpu_has_avx512f()) return block_keys_avx512(x, len, B, key);
#endif
  for (std::size_t lo = 0, j = 0; lo < len; lo += B, ++j) key[j] = max_abs_key(x + lo, len - lo < B ? len - lo : B);
}

// The codes of the blocks of B elements (the last may be shorter) that make
// up len (<= block_piece) elements, block j at multiplier r[j]: block_codes
// for each, with the SIMD path chosen once.
inline void block_codes_group(const float* x, std::size_t len, std::size_t B, const float* r, float m, unsigned bits,
                              const std::uint32_t* words, std::byte* out) noexcept {
#if ASHL_DETAIL_PHILOX_X86
  if (cpu_has_avx512f()) {
    auto* o = reinterpret_cast<std::uint8_t*>(out);
    if (words != nullptr) block_codes_avx512<true>(x, len, B, r, m, bits, words, o);
    else block_codes_avx512<false>(x, len, B, r, m, bits, words, o);
    return;
  }
  if (cpu_has_avx2()) {
    auto* o = reinterpret_cast<std::uint8_t*>(out);
    if (words != nullptr) block_codes_avx2<true>(x, len, B, r, m, bits, words, o);
    else block_codes_avx2<false>(x, len, B, r, m, bits, words, o);
    return;
  }
#endif
  for (std::size_t lo = 0, j = 0; lo < len; lo += B, ++j)
    block_codes(x + lo, len - lo < B ? len - lo : B, r[j], m, bits, words != nullptr ? words + lo : nullptr,
                out + lo * bits / 8);
}

inline void block_add(const std::byte* codes, std::size_t len, unsigned bits, float f, float* acc) noexcept {
  const auto* c = reinterpret_cast<const std::uint8_t*>(codes);
#if ASHL_DETAIL_PHILOX_X86
  if (cpu_has_avx2()) return block_add_avx2(c, len, bits, f, acc);
#endif
  block_add_body(c, len, bits, f, acc);
}

inline bool block_codes_valid(const std::byte* codes, std::size_t bytes, unsigned bits) noexcept {
  const auto* c = reinterpret_cast<const std::uint8_t*>(codes);
#if ASHL_DETAIL_PHILOX_X86
  if (cpu_has_avx2()) return block_codes_valid_avx2(c, bytes, bits);
#endif
  return block_codes_valid_body(c, bytes, bits);
}

}  // namespace detail
ASHL_DETAIL_COMPRESS_HOST_END

#undef ASHL_DETAIL_BLOCK_NO_CONTRACT
#if defined(ASHL_DETAIL_BLOCK_POP_DIAGNOSTIC)
#pragma GCC diagnostic pop
#undef ASHL_DETAIL_BLOCK_POP_DIAGNOSTIC
#endif
