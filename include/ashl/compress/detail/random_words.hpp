// ashl/compress/detail/random_words.hpp — many Philox blocks at once, for the
// quantizers' one-draw-per-element hot loops.
//
//   std::uint32_t w[256];                       // element-ordered words
//   detail::random_words rw(ctx.seed, ctx.step, ctx.tensor);
//   rw.fill(first_element / 4, 64, w);          // w[j] = philox_stream(...).word(first_element + j)
//
// The words are exactly philox_stream(seed, step, tensor).block(b, lane)
// laid out in element order (element i uses word i % 4 of block i / 4,
// docs/wire-format.md "Random streams"), so a GPU decoder or encoder draws the
// same bits. Scalar Philox costs ~25 integer operations per element, which
// alone would hold a quantizer below memcpy speed; here 4 (SSE2), 8 (AVX2) or
// 8 (AVX-512F, one block per 64-bit lane) blocks, chosen at run time, run
// side by side as 32x32->64 lane multiplies, several such states interleaved
// to hide the multiply latency, followed by a transpose into element order.
// Other targets use the scalar generator. docs/algorithms.md §4.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/detail/host_simd.hpp>
#include <ashl/core/philox.hpp>

#include <cstddef>
#include <cstdint>

#if ASHL_DETAIL_HOST_X86
#define ASHL_DETAIL_PHILOX_X86 1
#include <immintrin.h>
// gcc 12 reports its own _mm512_undefined_epi32() as uninitialized when
// AVX-512 intrinsics are inlined into a target("avx512f") function.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define ASHL_DETAIL_PHILOX_POP_DIAGNOSTIC 1
#endif
#else
#define ASHL_DETAIL_PHILOX_X86 0
#endif

ASHL_DETAIL_COMPRESS_HOST_BEGIN
namespace detail {

#if ASHL_DETAIL_PHILOX_X86
// Run-time CPU features for the codec kernels built with target attributes,
// false above the level ASHL_HOST_SIMD allows (detail/host_simd.hpp).
inline bool cpu_has_avx2() noexcept {
  if constexpr (ASHL_HOST_SIMD < ASHL_HOST_SIMD_AVX2) return false;
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
inline bool cpu_has_avx512f() noexcept {
  if constexpr (ASHL_HOST_SIMD < ASHL_HOST_SIMD_AVX512) return false;
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}
#endif

class random_words {
 public:
  random_words(std::uint64_t seed, std::uint64_t step, std::uint32_t tensor, std::uint32_t lane = 0) noexcept
      : stream_(seed, step, tensor),
        k0_(static_cast<std::uint32_t>(seed)),
        k1_(static_cast<std::uint32_t>(seed >> 32) ^ static_cast<std::uint32_t>(step >> 32)),
        step_lo_(static_cast<std::uint32_t>(step)),
        tensor_(tensor),
        lane_(lane) {}

  // The widest instruction set fill() may use (tests pin narrower ones).
  enum class simd { best, avx2, sse2, scalar };

  // out[4 j + w] = word w of block first_block + j, for j < nblocks.
  void fill(std::uint64_t first_block, std::size_t nblocks, std::uint32_t* out,
            simd limit = simd::best) const noexcept {
    std::size_t j = 0;
#if ASHL_DETAIL_PHILOX_X86
    if (limit == simd::best && cpu_has_avx512f()) {
      for (; j + 32 <= nblocks; j += 32) blocks_avx512<4>(first_block + j, out + 4 * j);
      for (; j + 8 <= nblocks; j += 8) blocks_avx512<1>(first_block + j, out + 4 * j);
    }
    if ((limit == simd::best || limit == simd::avx2) && cpu_has_avx2()) {
      for (; j + 16 <= nblocks; j += 16) blocks_avx2<2>(first_block + j, out + 4 * j);
      for (; j + 8 <= nblocks; j += 8) blocks_avx2<1>(first_block + j, out + 4 * j);
    }
    if (limit != simd::scalar)
      for (; j + 4 <= nblocks; j += 4) blocks4_sse2(first_block + j, out + 4 * j);
#else
    (void)limit;
#endif
    // The tail, walked by pointer: g++ cannot bound j after the SIMD loops
    // and warned (-Waggressive-loop-optimizations) that 4 * j might wrap.
    for (std::uint32_t* o = out + 4 * j; j < nblocks; ++j, o += 4) {
      const philox_block b = stream_.block(first_block + j, lane_);
      for (int w = 0; w < 4; ++w) o[w] = b.v[w];
    }
  }

  [[nodiscard]] const philox_stream& stream() const noexcept { return stream_; }

 private:
#if ASHL_DETAIL_PHILOX_X86

  // Counter word 3 of block b: lane << 16 | block bits 32..47.
  std::uint32_t c3(std::uint64_t b) const noexcept {
    return (lane_ << 16) | (static_cast<std::uint32_t>(b >> 32) & 0xffffu);
  }

  static inline __m128i mulhi_lo_sse2(__m128i x, __m128i m, __m128i& lo) noexcept {
    const __m128i even = _mm_mul_epu32(x, m);                        // lanes 0, 2 as u64
    const __m128i odd = _mm_mul_epu32(_mm_srli_epi64(x, 32), m);     // lanes 1, 3 as u64
    const __m128i low_mask = _mm_set_epi32(0, -1, 0, -1);
    lo = _mm_or_si128(_mm_and_si128(even, low_mask), _mm_slli_epi64(odd, 32));
    return _mm_or_si128(_mm_srli_epi64(even, 32), _mm_andnot_si128(low_mask, odd));
  }

  void blocks4_sse2(std::uint64_t b, std::uint32_t* out) const noexcept {
    __m128i x0 = _mm_set_epi32(static_cast<int>(static_cast<std::uint32_t>(b + 3)),
                               static_cast<int>(static_cast<std::uint32_t>(b + 2)),
                               static_cast<int>(static_cast<std::uint32_t>(b + 1)),
                               static_cast<int>(static_cast<std::uint32_t>(b)));
    __m128i x1 = _mm_set1_epi32(static_cast<int>(tensor_));
    __m128i x2 = _mm_set1_epi32(static_cast<int>(step_lo_));
    __m128i x3 = _mm_set_epi32(static_cast<int>(c3(b + 3)), static_cast<int>(c3(b + 2)),
                               static_cast<int>(c3(b + 1)), static_cast<int>(c3(b)));
    const __m128i m0 = _mm_set1_epi32(static_cast<int>(philox4x32::m0));
    const __m128i m1 = _mm_set1_epi32(static_cast<int>(philox4x32::m1));
    std::uint32_t k0 = k0_, k1 = k1_;
    for (int r = 0; r < philox4x32::rounds; ++r) {
      __m128i lo0, lo1;
      const __m128i hi0 = mulhi_lo_sse2(x0, m0, lo0);
      const __m128i hi1 = mulhi_lo_sse2(x2, m1, lo1);
      x0 = _mm_xor_si128(_mm_xor_si128(hi1, x1), _mm_set1_epi32(static_cast<int>(k0)));
      x1 = lo1;
      x2 = _mm_xor_si128(_mm_xor_si128(hi0, x3), _mm_set1_epi32(static_cast<int>(k1)));
      x3 = lo0;
      k0 += philox4x32::w0;
      k1 += philox4x32::w1;
    }
    // Transpose: lane j of xw is word w of block b + j.
    const __m128i t0 = _mm_unpacklo_epi32(x0, x1), t1 = _mm_unpacklo_epi32(x2, x3);
    const __m128i t2 = _mm_unpackhi_epi32(x0, x1), t3 = _mm_unpackhi_epi32(x2, x3);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 0), _mm_unpacklo_epi64(t0, t1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 4), _mm_unpackhi_epi64(t0, t1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8), _mm_unpacklo_epi64(t2, t3));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 12), _mm_unpackhi_epi64(t2, t3));
  }

  __attribute__((target("avx2"))) static inline __m256i mulhi_lo_avx2(__m256i x, __m256i m, __m256i& lo) noexcept {
    const __m256i even = _mm256_mul_epu32(x, m);
    const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
    lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xaa);
    return _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xaa);
  }

  // 8 S blocks, S interleaved 8-lane states (as blocks_avx512).
  template <int S>
  __attribute__((target("avx2"))) void blocks_avx2(std::uint64_t b, std::uint32_t* out) const noexcept {
    alignas(32) std::uint32_t c0v[8 * S], c3v[8 * S];
    for (int j = 0; j < 8 * S; ++j) {
      c0v[j] = static_cast<std::uint32_t>(b + static_cast<std::uint64_t>(j));
      c3v[j] = c3(b + static_cast<std::uint64_t>(j));
    }
    __m256i x0[S], x1[S], x2[S], x3[S];
    for (int q = 0; q < S; ++q) {
      x0[q] = _mm256_load_si256(reinterpret_cast<const __m256i*>(c0v + 8 * q));
      x1[q] = _mm256_set1_epi32(static_cast<int>(tensor_));
      x2[q] = _mm256_set1_epi32(static_cast<int>(step_lo_));
      x3[q] = _mm256_load_si256(reinterpret_cast<const __m256i*>(c3v + 8 * q));
    }
    const __m256i m0 = _mm256_set1_epi32(static_cast<int>(philox4x32::m0));
    const __m256i m1 = _mm256_set1_epi32(static_cast<int>(philox4x32::m1));
    std::uint32_t k0 = k0_, k1 = k1_;
    for (int r = 0; r < philox4x32::rounds; ++r) {
      const __m256i kv0 = _mm256_set1_epi32(static_cast<int>(k0)), kv1 = _mm256_set1_epi32(static_cast<int>(k1));
      for (int q = 0; q < S; ++q) {
        __m256i lo0, lo1;
        const __m256i hi0 = mulhi_lo_avx2(x0[q], m0, lo0);
        const __m256i hi1 = mulhi_lo_avx2(x2[q], m1, lo1);
        x0[q] = _mm256_xor_si256(_mm256_xor_si256(hi1, x1[q]), kv0);
        x1[q] = lo1;
        x2[q] = _mm256_xor_si256(_mm256_xor_si256(hi0, x3[q]), kv1);
        x3[q] = lo0;
      }
      k0 += philox4x32::w0;
      k1 += philox4x32::w1;
    }
    for (int q = 0; q < S; ++q) {
      // In-lane 4x4 transposes: 128-bit half h holds blocks 4h .. 4h+3.
      const __m256i t0 = _mm256_unpacklo_epi32(x0[q], x1[q]), t1 = _mm256_unpacklo_epi32(x2[q], x3[q]);
      const __m256i t2 = _mm256_unpackhi_epi32(x0[q], x1[q]), t3 = _mm256_unpackhi_epi32(x2[q], x3[q]);
      const __m256i r0 = _mm256_unpacklo_epi64(t0, t1), r1 = _mm256_unpackhi_epi64(t0, t1);
      const __m256i r2 = _mm256_unpacklo_epi64(t2, t3), r3 = _mm256_unpackhi_epi64(t2, t3);
      // r0 = (block 0 | block 4), r1 = (1 | 5), r2 = (2 | 6), r3 = (3 | 7).
      std::uint32_t* o = out + 32 * q;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 0), _mm256_permute2x128_si256(r0, r1, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 8), _mm256_permute2x128_si256(r2, r3, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 16), _mm256_permute2x128_si256(r0, r1, 0x31));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 24), _mm256_permute2x128_si256(r2, r3, 0x31));
    }
  }

  // 8 S blocks: S independent states, interleaved so that the multiply
  // latency of one hides behind the others. Each block sits in the low half
  // of a 64-bit lane (the high half is never read), so one vpmuludq gives a
  // lane's whole 32x32->64 product: lo is the product itself, hi one shift
  // away, and the two xors of a round are one vpternlogq. A round costs 6
  // instructions per 8 blocks, against 18 per 16 when the 16 lanes of a
  // register each hold a block (even and odd products, shifts and blends).
  // It then runs at about the vector pipes' throughput, 1 to 1.4 cycles per
  // word on Zen 4 (docs/perf/compress-cpu.md, eighth session).
  template <int S>
  __attribute__((target("avx512f"))) void blocks_avx512(std::uint64_t b, std::uint32_t* out) const noexcept {
    const __m512i iota = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i lane_bits = _mm512_set1_epi64(static_cast<long long>(lane_) << 16);
    const __m512i low16 = _mm512_set1_epi64(0xffff);
    __m512i x0[S], x1[S], x2[S], x3[S];
    for (int q = 0; q < S; ++q) {
      const auto first = static_cast<long long>(b + 8 * static_cast<unsigned>(q));
      const __m512i c = _mm512_add_epi64(_mm512_set1_epi64(first), iota);
      x0[q] = c;  // block low 32 bits
      // c3: lane << 16 | block bits 32..47, as (c >> 32) & 0xffff | lane_bits.
      x3[q] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(c, 32), low16, lane_bits, 0xea);  // (A & B) | C
      x1[q] = _mm512_set1_epi64(static_cast<long long>(tensor_));
      x2[q] = _mm512_set1_epi64(static_cast<long long>(step_lo_));
    }
    const __m512i m0 = _mm512_set1_epi64(static_cast<long long>(philox4x32::m0));
    const __m512i m1 = _mm512_set1_epi64(static_cast<long long>(philox4x32::m1));
    std::uint32_t k0 = k0_, k1 = k1_;
    for (int r = 0; r < philox4x32::rounds; ++r) {
      const __m512i kv0 = _mm512_set1_epi64(static_cast<long long>(k0));
      const __m512i kv1 = _mm512_set1_epi64(static_cast<long long>(k1));
      for (int q = 0; q < S; ++q) {
        const __m512i p0 = _mm512_mul_epu32(x0[q], m0);
        const __m512i p1 = _mm512_mul_epu32(x2[q], m1);
        x0[q] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), x1[q], kv0, 0x96);  // hi1 ^ x1 ^ k0
        x2[q] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), x3[q], kv1, 0x96);  // hi0 ^ x3 ^ k1
        x1[q] = p1;
        x3[q] = p0;
      }
      k0 += philox4x32::w0;
      k1 += philox4x32::w1;
    }
    // Element order: (w0, w1) and (w2, w3) of each block side by side in a
    // 64-bit lane, then the pairs of blocks 0..3 and 4..7 interleaved.
    const __m512i pair = _mm512_set_epi32(30, 14, 28, 12, 26, 10, 24, 8, 22, 6, 20, 4, 18, 2, 16, 0);
    const __m512i first = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0);
    const __m512i second = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
    for (int q = 0; q < S; ++q) {
      const __m512i w01 = _mm512_permutex2var_epi32(x0[q], pair, x1[q]);
      const __m512i w23 = _mm512_permutex2var_epi32(x2[q], pair, x3[q]);
      _mm512_storeu_si512(out + 32 * q, _mm512_permutex2var_epi64(w01, first, w23));
      _mm512_storeu_si512(out + 32 * q + 16, _mm512_permutex2var_epi64(w01, second, w23));
    }
  }
#endif

  philox_stream stream_;
  // The key and counter words of the vector kernels (unused when
  // ASHL_HOST_SIMD leaves them out).
  [[maybe_unused]] std::uint32_t k0_, k1_, step_lo_, tensor_;
  std::uint32_t lane_;
};

}  // namespace detail
ASHL_DETAIL_COMPRESS_HOST_END

#if defined(ASHL_DETAIL_PHILOX_POP_DIAGNOSTIC)
#pragma GCC diagnostic pop
#undef ASHL_DETAIL_PHILOX_POP_DIAGNOSTIC
#endif
