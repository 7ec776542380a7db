// ashl/compress/detail/levels.hpp — bucketed stochastic level quantization
// shared by qsgd and terngrad (kernels in detail/quantize.hpp).
//
//   detail::level_spec spec{.bucket = 512, .levels = 4, .norm = detail::bucket_norm::l2};
//   detail::levels_encode(x, n, spec, detail::random_words(seed, step, tensor), norms_out, codes_out);
//   ASHL_TRY(detail::levels_validate("qsgd", spec, n, norms, codes)); // then
//   detail::levels_decode_add(spec, n, norms, codes, acc, scale);
//
// Element i of bucket b (elements [b B, min(n, (b+1) B))) with bucket scale
// s_b (L2 norm or max |x|) and L levels is sent as level l_i in [0, L] and a
// sign: with r = |x_i| * L / s_b, l_i = floor(r) + [u_i < r - floor(r)],
// u_i = uniform01(word i % 4 of philox block i / 4) (drawn in bulk by
// detail::random_words: the same bits), so E[l_i] = r and the
// decode s_b * l_i / L * sign is unbiased. Code = l_i << 1 | sign, sign set
// only when l_i > 0 (canonical), packed LSB-first into a continuous bit
// stream of `bits` per element; the final byte's unused bits are 0.
// docs/algorithms.md §4 (QSGD, TernGrad); docs/wire-format.md, "Codec payloads".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/detail/host_simd.hpp>
#include <ashl/compress/detail/elements.hpp>
#include <ashl/compress/detail/quantize.hpp>
#include <ashl/compress/detail/random_words.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/status.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

ASHL_DETAIL_COMPRESS_HOST_BEGIN
namespace detail {

template <gradient_element T>
inline float as_f32(T v) noexcept {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, half>)
    return f16_to_f32(element_bits(v));
  else
    return bf16_to_f32(element_bits(v));
}

inline std::uint64_t bucket_count(std::uint64_t n, std::uint64_t bucket) noexcept {
  return bucket == 0 ? 0 : (n + bucket - 1) / bucket;
}
inline std::uint64_t packed_bytes(std::uint64_t n, unsigned bits) noexcept { return (n * bits + 7) / 8; }

enum class bucket_norm { l2, max_abs };

struct level_spec {
  std::uint64_t bucket = 512;
  std::uint32_t levels = 1;
  bucket_norm norm = bucket_norm::l2;
  [[nodiscard]] unsigned bits() const noexcept { return 1u + static_cast<unsigned>(std::bit_width(levels)); }
};

// The f32 scale of one bucket: max |x|, or the L2 norm (float lanes; redone
// in double when that overflows or underflows, and never below max |x|, so
// |x| L / s <= L). Not finite when the bucket holds an inf or NaN or its L2
// norm exceeds the f32 range.
template <gradient_element T>
float bucket_scale(const T* x, std::uint64_t len, bucket_norm kind, float* buf) noexcept {
  bucket_stats st;
  if (kind == bucket_norm::max_abs) {  // the max alone (exact, whatever the order)
    for (std::uint64_t p = 0; p < len; p += chunk) {
      const std::size_t m = static_cast<std::size_t>(len - p < chunk ? len - p : chunk);
      st.max_key = std::max(st.max_key, max_abs_key(as_float(x + p, m, buf), m));
    }
    return st.finite() ? st.max_abs() : std::numeric_limits<float>::quiet_NaN();
  }
  for (std::uint64_t p = 0; p < len; p += chunk) {
    const std::size_t m = static_cast<std::size_t>(len - p < chunk ? len - p : chunk);
    merge(st, stats(as_float(x + p, m, buf), m));
  }
  if (!st.finite()) return std::numeric_limits<float>::quiet_NaN();
  const float s = std::sqrt(st.sum_sq);
  if (std::isfinite(s) && s >= st.max_abs() && (st.sum_sq >= 1e-30f || st.max_key == 0)) return s;
  double acc = 0.0;
  for (std::uint64_t p = 0; p < len; p += chunk) {
    const std::size_t m = static_cast<std::size_t>(len - p < chunk ? len - p : chunk);
    const float* xf = as_float(x + p, m, buf);
    for (std::size_t i = 0; i < m; ++i) acc += static_cast<double>(xf[i]) * xf[i];
  }
  const float sd = static_cast<float>(std::sqrt(acc));
  return sd > st.max_abs() ? sd : st.max_abs();
}

// Asks for elements [from, from + chunk) of x (those below n) to be brought
// into the cache, one request per 64-byte line.
template <gradient_element T>
inline void prefetch_ahead(const T* x, std::uint64_t n, std::uint64_t from) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  if (from >= n) return;
  const std::uint64_t bytes = (n - from < chunk ? n - from : chunk) * sizeof(T);
  const char* p = reinterpret_cast<const char*>(x + from);
  for (std::uint64_t j = 0; j < bytes; j += 64) __builtin_prefetch(p + j);
#else
  (void)x, (void)n, (void)from;
#endif
}

// Writes bucket_count(n) f32 scales at `norms` and the packed codes at
// `codes`. Returns the index of a bucket whose scale is not finite, or n.
//
// The tensor is walked in chunks of 1024 elements (a multiple of 8, so every
// chunk's codes start on a byte): the scales of the buckets a chunk touches
// are computed first (a bucket of up to a chunk is then still in L1 when its
// codes are made), 1024 Philox words come from detail::random_words (4-16
// blocks per instruction), a branch-free 4-lane loop rounds each bucket
// segment with its L / s, and a group-of-8 packer stores the codes.
template <gradient_element T>
std::uint64_t levels_encode(const T* x, std::uint64_t n, const level_spec& spec, const random_words& rw,
                            std::byte* norms, std::byte* codes) noexcept {
  const unsigned bits = spec.bits();
  const float L = static_cast<float>(spec.levels);
  const std::uint64_t B = spec.bucket;
  const std::uint64_t code_bytes = packed_bytes(n, bits);
  float xbuf[chunk], sbuf[chunk];
  std::uint32_t words[chunk];
  std::uint16_t cbuf[chunk];
  std::uint64_t scaled = 0;  // buckets whose scale is stored
  for (std::uint64_t c0 = 0; c0 < n; c0 += chunk) {
    const std::size_t m = static_cast<std::size_t>(n - c0 < chunk ? n - c0 : chunk);
    // The chunk after next is requested now, so memory streams while this
    // one is computed (the encode is otherwise read, compute, read, ...).
    prefetch_ahead(x, n, c0 + 2 * chunk);
    // The chunk widened once (16-bit inputs): a bucket that lies inside it
    // takes its scale from the widened copy, the same floats the bucket
    // would widen to on its own, so the scale has the same bits.
    const float* xf = as_float(x + c0, m, xbuf);
    const std::uint64_t last = (c0 + m - 1) / B;
    for (; scaled <= last; ++scaled) {
      const std::uint64_t lo = scaled * B, len = lo + B < n ? B : n - lo;
      const bool inside = lo >= c0 && lo + len <= c0 + m;
      const float s = inside ? bucket_scale(xf + (lo - c0), len, spec.norm, sbuf)
                             : bucket_scale(x + lo, len, spec.norm, sbuf);
      if (!std::isfinite(s)) return scaled;
      store_le<float>(norms + 4 * scaled, s);
    }
    rw.fill(c0 / 4, (m + 3) / 4, words);
    // One rounding call per bucket segment of the chunk, with that bucket's
    // L / s; where L / s is not a finite float (subnormal s), exactly.
    for (std::uint64_t b = c0 / B, lo = c0; lo < c0 + m; ++b) {
      const std::uint64_t hi = (b + 1) * B < c0 + m ? (b + 1) * B : c0 + m;
      const std::size_t off = static_cast<std::size_t>(lo - c0), len = static_cast<std::size_t>(hi - lo);
      const float s = load_le<float>(norms + 4 * b);
      const float kb = s > 0.0f ? L / s : 0.0f;
      if (kb <= std::numeric_limits<float>::max())
        round_levels(xf + off, len, kb, L, words + off, cbuf + off);
      else
        round_levels_exact(xf + off, len, s, L, words + off, cbuf + off);
      lo = hi;
    }
    const std::uint64_t o = c0 / 8 * bits;
    pack_chunk(cbuf, m, bits, codes + o, static_cast<std::size_t>(code_bytes - o));
  }
  return n;
}

// Every scale finite and >= 0, every level <= L, no sign on a zero level,
// padding bits zero.
inline status levels_validate(std::string_view codec, const level_spec& spec, std::uint64_t n, const std::byte* norms,
                              const std::byte* codes) {
  const std::uint64_t nb = bucket_count(n, spec.bucket);
  const char* what = spec.norm == bucket_norm::l2 ? ".norm[" : ".scale[";
  for (std::uint64_t b = 0; b < nb; ++b) {
    const float s = load_le<float>(norms + 4 * b);
    if (!(std::isfinite(s) && s >= 0.0f))
      return malformed(std::string(codec) + what + std::to_string(b) + "]", s, "must be finite and >= 0");
  }
  // Chunks of 1024 codes (whole bytes each): a flag pass, and the exact
  // index only for a chunk that holds a bad code.
  const unsigned bits = spec.bits();
  std::uint16_t cbuf[chunk];
  for (std::uint64_t c0 = 0; c0 < n; c0 += chunk) {
    const std::size_t m = static_cast<std::size_t>(n - c0 < chunk ? n - c0 : chunk);
    unpack_chunk(codes + c0 / 8 * bits, m, bits, cbuf);
    unsigned bad = 0;
    for (std::size_t i = 0; i < m; ++i) bad |= static_cast<unsigned>((cbuf[i] >> 1) > spec.levels) | (cbuf[i] == 1u);
    if (bad != 0) {
      for (std::size_t i = 0; i < m; ++i)
        if ((cbuf[i] >> 1) > spec.levels || cbuf[i] == 1u)
          return malformed(std::string(codec) + ".code[" + std::to_string(c0 + i) + "]", cbuf[i],
                           "level must be <= " + std::to_string(spec.levels) + " and a zero level has no sign");
    }
  }
  const unsigned used = static_cast<unsigned>((n % 8) * bits % 8);
  const std::uint64_t rest = used == 0 ? 0 : static_cast<unsigned>(codes[packed_bytes(n, bits) - 1]) >> used;
  if (rest != 0) return malformed(std::string(codec) + ".padding", rest, "unused bits must be 0");
  return {};
}

inline void levels_decode_add(const level_spec& spec, std::uint64_t n, const std::byte* norms, const std::byte* codes,
                              float* acc, float scale) noexcept {
  const unsigned bits = spec.bits();
  const std::uint64_t B = spec.bucket;
  std::uint16_t cbuf[chunk];
  for (std::uint64_t c0 = 0; c0 < n; c0 += chunk) {
    const std::size_t m = static_cast<std::size_t>(n - c0 < chunk ? n - c0 : chunk);
    unpack_chunk(codes + c0 / 8 * bits, m, bits, cbuf);
    for (std::uint64_t b = c0 / B, lo = c0; lo < c0 + m; ++b) {
      const std::uint64_t hi = (b + 1) * B < c0 + m ? (b + 1) * B : c0 + m;
      const float unit = scale * (load_le<float>(norms + 4 * b) / static_cast<float>(spec.levels));
      float* a = acc + lo;
      const std::uint16_t* c = cbuf + (lo - c0);
      for (std::size_t i = 0, e = static_cast<std::size_t>(hi - lo); i < e; ++i) {
        // -m as m with the sign bit flipped: the same bits as a negation.
        const float v = static_cast<float>(c[i] >> 1) * unit;
        a[i] += std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) ^ (static_cast<std::uint32_t>(c[i] & 1u) << 31));
      }
      lo = hi;
    }
  }
}

}  // namespace detail
ASHL_DETAIL_COMPRESS_HOST_END
