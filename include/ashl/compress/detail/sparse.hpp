// ashl/compress/detail/sparse.hpp — the (index, value) payload shared by
// exact top-k, sampled top-k and threshold, and the radix select behind them.
//
//   auto sel = detail::radix_select(x.data(), n, k);   // k-th largest |x| key
//   std::size_t used = detail::write_selected(x.data(), n, sel, out);
//   ASHL_TRY(detail::decode_add_pairs("topk", payload, info, acc, scale, true));
//
// Layout (docs/wire-format.md, "Codec payloads"): u64 n, u32 count,
// count u32 indices (strictly increasing, < n), count values in the input
// dtype (4 bytes for f32, 2 for f16 / bf16). Structure of arrays, so encode
// and decode are two contiguous streams. docs/algorithms.md §4.
#pragma once

#include <ashl/compress/detail/codec.hpp>
#include <ashl/compress/detail/random_words.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/status.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>
#include <span>
#include <string>
#include <string_view>

ASHL_DETAIL_COMPRESS_HOST_BEGIN
namespace detail {

// The header size and the element limit are compress/layout.hpp's, shared
// with the device codecs (compress/cuda/dispatch/kernels/sparse.cuh).
inline constexpr std::size_t sparse_payload_bytes(std::size_t count, dtype t) noexcept {
  return layout::sparse_payload_bytes(count, size_of(t));
}

// The header (u64 n, u32 count at layout::sparse's offsets), the one
// writer of it on the host: the codecs below and the Python adapter's
// device top-k (ashl._ashl.topk_layout). Returns where the indices start.
inline std::byte* write_sparse_header(std::byte* base, std::size_t n, std::size_t count) noexcept {
  store_le<std::uint64_t>(base + layout::sparse::n_offset, n);
  store_le<std::uint32_t>(base + layout::sparse::count_offset, static_cast<std::uint32_t>(count));
  return base + layout::sparse::header_bytes;
}

inline status check_sparse_encode(std::string_view codec, std::size_t n, std::size_t out_size,
                                  std::size_t needed) {
  if (n > layout::sparse::max_elements)
    return out_of_range(std::string(codec) + ".input.size", n, "exceeds 2^32 (indices are u32)");
  if (out_size < needed)
    return make_error(errc::buffer_too_small, std::string(codec) + ".out.size", out_size,
                      "bytes, fewer than max_encoded_bytes = " + std::to_string(needed));
  return {};
}

// The threshold of a selection: take every element whose magnitude key is
// greater than `key`, and the first `equal_to_take` (by index) whose key equals it.
struct selection {
  std::uint32_t key = 0;
  std::size_t greater = 0;        // elements with a larger key
  std::size_t equal_to_take = 0;  // k - greater
};

// Exact selection of the k largest magnitude keys by MSD radix select on the
// key bits: a histogram of the top 11 bits, then of the next 11 among the
// elements that share the chosen prefix, then the last 9 (f32; f16/bf16 keys
// take 8 + 7). Every pass is a linear read with an L1-resident histogram, no
// data movement and no allocation (the histogram is on the stack).
template <gradient_element T>
selection radix_select(const T* x, std::size_t n, std::size_t k) noexcept {
  ASHL_ASSERT(k >= 1 && k <= n, "radix_select: k must be in [1, n]");
  constexpr int key_bits = magnitude_key_bits<T>;
  constexpr std::array<int, 3> widths32{11, 11, 9};
  constexpr std::array<int, 3> widths16{8, 7, 0};
  constexpr auto widths = key_bits == 31 ? widths32 : widths16;
  std::array<std::uint32_t, 2048> hist;
  std::uint32_t prefix = 0;
  int done = 0;                 // key bits already fixed in prefix
  std::size_t want = k;         // how many still to take at or below the prefix
  std::size_t greater = 0;
  for (int w : widths) {
    if (w == 0) break;
    const int shift = key_bits - done - w;
    const std::uint32_t mask = (1u << w) - 1u;
    std::fill(hist.begin(), hist.begin() + (1u << w), 0u);
    if (done == 0) {
      // First digit: no prefix test; four interleaved partial sums would help
      // only for skewed data, and gradients are not skewed in the top bits.
      for (std::size_t i = 0; i < n; ++i) ++hist[magnitude_key(x[i]) >> shift];
    } else {
      const int pshift = shift + w;
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t key = magnitude_key(x[i]);
        if ((key >> pshift) == prefix) ++hist[(key >> shift) & mask];
      }
    }
    // Walk from the largest digit down until the running count reaches want.
    std::size_t above = 0;
    std::uint32_t b = mask;
    for (;; --b) {
      if (above + hist[b] >= want || b == 0) break;
      above += hist[b];
    }
    greater += above;
    want -= above;
    prefix = (prefix << w) | b;
    done += w;
  }
  return selection{prefix, greater, want};
}

// Writes the sparse payload of the selection: the header, then the indices and
// values of every element above the threshold and the first equal_to_take
// equal to it, in increasing index order. `out` must hold
// sparse_payload_bytes(greater + equal_to_take). Returns the bytes written.
template <gradient_element T>
std::size_t write_selected(const T* x, std::size_t n, const selection& sel, std::span<std::byte> out) noexcept {
  const std::size_t count = sel.greater + sel.equal_to_take;
  std::byte* const base = out.data();
  std::byte* idx = write_sparse_header(base, n, count);
  std::byte* val = idx + 4 * count;
  std::size_t c = 0;
  std::size_t eq_left = sel.equal_to_take;
  const std::uint32_t t = sel.key;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t key = magnitude_key(x[i]);
    if (key >= t) {
      if (key == t) {
        if (eq_left == 0) continue;
        --eq_left;
      }
      store_le<std::uint32_t>(idx + 4 * c, static_cast<std::uint32_t>(i));
      store_le(val + sizeof(T) * c, element_bits(x[i]));
      ++c;
    }
  }
  ASHL_ASSERT(c == count, "write_selected: selection count mismatch");
  return sparse_payload_bytes(count, dtype_of<T>);
}

// Writes every element (k = n, or a threshold that selects all).
template <gradient_element T>
std::size_t write_all(const T* x, std::size_t n, std::span<std::byte> out) noexcept {
  std::byte* const base = out.data();
  std::byte* idx = write_sparse_header(base, n, n);
  for (std::size_t i = 0; i < n; ++i) store_le<std::uint32_t>(idx + 4 * i, static_cast<std::uint32_t>(i));
  store_array_le(idx + 4 * n, x, n);
  return sparse_payload_bytes(n, dtype_of<T>);
}

// The magnitude key of +inf; NaN keys lie above it.
template <gradient_element T>
inline constexpr std::uint32_t inf_key = std::is_same_v<T, float> ? 0x7f800000u
                                         : std::is_same_v<T, half> ? 0x7c00u
                                                                   : 0x7f80u;

// The smallest magnitude key of T whose value is >= th (th finite, >= 0), so
// that for every non-NaN x: |x| >= th exactly when key(x) >= key_at_least(th)
// (keys order magnitudes; a 16-bit th is rounded, then stepped up once if
// the rounded value fell below th).
template <gradient_element T>
inline std::uint32_t key_at_least(float th) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<std::uint32_t>(th) & 0x7fffffffu;
  } else {
    constexpr bool is_half = std::is_same_v<T, half>;
    const std::uint32_t h = (is_half ? f32_to_f16_rne(th) : f32_to_bf16_rne(th)) & 0x7fffu;
    const float back = is_half ? f16_to_f32(static_cast<std::uint16_t>(h)) : bf16_to_f32(static_cast<std::uint16_t>(h));
    return back < th ? h + 1u : h;
  }
}

// How many elements have a magnitude key in [lo, hi] (one unsigned compare
// each, so the loop vectorizes). Always inlined, as is write_keys_in: out of
// line, threshold's 16-bit encode ran at 0.7x its f32 element rate on bf16
// (docs/perf/compress-cpu.md).
template <gradient_element T>
[[gnu::always_inline]] inline std::size_t count_keys_in(const T* x, std::size_t n, std::uint32_t lo, std::uint32_t hi) noexcept {
  const std::uint32_t span = hi - lo;
  std::size_t c = 0;
  for (std::size_t i = 0; i < n; ++i) c += (magnitude_key(x[i]) - lo) <= span;
  return c;
}

#if ASHL_DETAIL_PHILOX_X86
// The one AVX2 hit scan of the 16-bit sparse passes (write_keys_in, collect_ge):
// the 15-bit keys of 32 half / bfloat16 elements compared at once with signed
// 16-bit compares against lo (and hi when Upper), and only the hits visited,
// in index order, as visit(j) with j the element's index. The compare masks
// are packed to bytes (packs works per 128-bit half, so the quadwords are put
// back in element order) and each hit taken with tzcnt; a block without a
// hit costs one test. Covers [0, returned), a multiple of 32.
// Needs lo <= 0x8000 (lo - 1 fits an i16; lo = 0 gives -1, below every key)
// and, when Upper, hi < 0x7fff (hi + 1 fits an i16).
template <bool Upper, class Visit>
__attribute__((target("avx2,bmi"))) inline std::size_t visit_keys16_avx2(const std::uint16_t* p, std::size_t n,
                                                                       std::uint32_t lo, std::uint32_t hi,
                                                                       Visit&& visit) noexcept {
  const __m256i key_mask = _mm256_set1_epi16(0x7fff);
  const __m256i below = _mm256_set1_epi16(static_cast<short>(static_cast<int>(lo) - 1));
  const __m256i above = _mm256_set1_epi16(static_cast<short>(Upper ? hi + 1 : 0));
  std::size_t i = 0;
  for (const std::size_t e = n & ~std::size_t{31}; i < e; i += 32) {
    const __m256i k0 = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)), key_mask);
    const __m256i k1 = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 16)), key_mask);
    __m256i h0 = _mm256_cmpgt_epi16(k0, below), h1 = _mm256_cmpgt_epi16(k1, below);
    if constexpr (Upper) {
      h0 = _mm256_and_si256(h0, _mm256_cmpgt_epi16(above, k0));
      h1 = _mm256_and_si256(h1, _mm256_cmpgt_epi16(above, k1));
    }
    const __m256i any = _mm256_or_si256(h0, h1);
    if (_mm256_testz_si256(any, any)) continue;
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi16(h0, h1), 0xd8);
    for (auto bits = static_cast<std::uint32_t>(_mm256_movemask_epi8(packed)); bits != 0; bits &= bits - 1)
      visit(i + static_cast<std::size_t>(_tzcnt_u32(bits)));
  }
  return i;
}

// write_keys_in's loop over [0, returned) for 16-bit elements (keys in
// [lo, hi]; lo <= 0x8000 and hi < 0x7fff). j counts the pairs written.
template <class T>
__attribute__((target("avx2,bmi"))) inline std::size_t write_keys_in_16_avx2(const T* x, std::size_t n, std::uint32_t lo,
                                                                           std::uint32_t hi, std::byte* idx,
                                                                           std::byte* val, std::size_t& j) noexcept {
  return visit_keys16_avx2<true>(reinterpret_cast<const std::uint16_t*>(x), n, lo, hi, [&](std::size_t at) {
    store_le<std::uint32_t>(idx + 4 * j, static_cast<std::uint32_t>(at));
    store_le(val + sizeof(T) * j, element_bits(x[at]));
    ++j;
  });
}
#endif

// The sparse payload of the `count` elements whose key is in [lo, hi], in
// index order (count from count_keys_in). Returns the bytes written.
template <gradient_element T>
[[gnu::always_inline]] inline std::size_t write_keys_in(const T* x, std::size_t n, std::uint32_t lo, std::uint32_t hi, std::size_t count,
                          std::span<std::byte> out) noexcept {
  std::byte* const base = out.data();
  std::byte* const idx = write_sparse_header(base, n, count);
  std::byte* const val = idx + 4 * count;
  const std::uint32_t span = hi - lo;
  std::size_t j = 0;
  std::size_t i = 0;
#if ASHL_DETAIL_PHILOX_X86
  if constexpr (!std::is_same_v<T, float> && std::endian::native == std::endian::little)
    if (lo <= 0x8000u && hi < 0x7fffu && cpu_has_avx2()) i = write_keys_in_16_avx2(x, n, lo, hi, idx, val, j);
#endif
  for (; i < n; ++i) {
    if ((magnitude_key(x[i]) - lo) <= span) {
      store_le<std::uint32_t>(idx + 4 * j, static_cast<std::uint32_t>(i));
      store_le(val + sizeof(T) * j, element_bits(x[i]));
      ++j;
    }
  }
  ASHL_ASSERT(j == count, "write_keys_in: count mismatch");
  return sparse_payload_bytes(count, dtype_of<T>);
}

// Pass 1 of the two-pass exact top-k: the top key digit holding the k-th largest.
struct topk_pass1 {
  std::uint32_t digit = 0;
  std::size_t greater = 0;     // elements with a larger top digit
  std::size_t candidates = 0;  // elements with top digit == digit
};

template <gradient_element T>
inline constexpr int top_digit_bits = std::is_same_v<T, float> ? 11 : 8;

template <gradient_element T>
topk_pass1 topk_histogram(const T* x, std::size_t n, std::size_t k) noexcept {
  constexpr int w = top_digit_bits<T>;
  constexpr int shift = magnitude_key_bits<T> - w;
  constexpr std::size_t bins = std::size_t{1} << w;
  std::array<std::uint32_t, 4 * bins> h{};
  std::size_t i = 0;
  for (; i < (n & ~std::size_t{3}); i += 4) {
    ++h[magnitude_key(x[i]) >> shift];
    ++h[bins + (magnitude_key(x[i + 1]) >> shift)];
    ++h[2 * bins + (magnitude_key(x[i + 2]) >> shift)];
    ++h[3 * bins + (magnitude_key(x[i + 3]) >> shift)];
  }
  for (; i < n; ++i) ++h[magnitude_key(x[i]) >> shift];
  std::size_t above = 0;
  for (std::size_t b = bins; b-- > 0;) {
    const std::size_t c = std::size_t{h[b]} + h[bins + b] + h[2 * bins + b] + h[3 * bins + b];
    if (above + c >= k || b == 0) return topk_pass1{static_cast<std::uint32_t>(b), above, c};
    above += c;
  }
  return {};
}

// Exact top-k: candidates are (element bits << 32 | index) in a u64, so the
// selection among them reads one contiguous array instead of gathering from
// the input (a gather per candidate and digit costs a cache miss each).
template <gradient_element T>
inline std::uint64_t make_candidate(const T* x, std::size_t i) noexcept {
  return (static_cast<std::uint64_t>(element_bits(x[i])) << 32) | static_cast<std::uint32_t>(i);
}
template <gradient_element T>
inline std::uint32_t candidate_key(std::uint64_t c) noexcept {
  return static_cast<std::uint32_t>(c >> 32) & (std::is_same_v<T, float> ? 0x7fffffffu : 0x7fffu);
}

// Exact top-k among the candidates cand[0..c) (increasing indices; every
// element of x not among them is smaller than the smallest of the k largest
// candidates, and `greater` payload slots are already written by the caller
// with such elements that are certainly kept). Resolves the key digits below
// the `done` bits fixed by `prefix`, then merges the chosen candidates with
// the `greater` certain ones (in place, from the back: the payload has
// exactly k slots).
template <gradient_element T>
void finish_topk(std::size_t k, std::size_t greater, std::uint32_t prefix, int done, std::uint64_t* cand,
                 std::size_t c, std::byte* idx, std::byte* val) noexcept {
  constexpr int key_bits = magnitude_key_bits<T>;
  std::array<std::uint32_t, 2048> hist;
  std::size_t want = k - greater;
  while (done < key_bits) {
    const int w = key_bits - done > 11 ? 11 : key_bits - done;
    const int shift = key_bits - done - w;
    const std::uint32_t mask = (1u << w) - 1u;
    std::fill(hist.begin(), hist.begin() + (std::size_t{1} << w), 0u);
    if (done == 0) {
      for (std::size_t j = 0; j < c; ++j) ++hist[candidate_key<T>(cand[j]) >> shift];
    } else {
      for (std::size_t j = 0; j < c; ++j) {
        const std::uint32_t key = candidate_key<T>(cand[j]);
        if ((key >> (shift + w)) == prefix) ++hist[(key >> shift) & mask];
      }
    }
    std::size_t above = 0;
    std::uint32_t b = mask;
    for (;; --b) {
      if (above + hist[b] >= want || b == 0) break;
      above += hist[b];
    }
    want -= above;
    prefix = (prefix << w) | b;
    done += w;
  }
  const std::uint32_t t = prefix;
  std::size_t m = 0;
  for (std::size_t j = 0; j < c; ++j) {
    const std::uint32_t key = candidate_key<T>(cand[j]);
    if (key > t || (key == t && want != 0)) {
      if (key == t) --want;
      cand[m++] = cand[j];
    }
  }
  ASHL_ASSERT(greater + m == k, "finish_topk: selection count mismatch");
  std::size_t gi = greater, ci = m, p = k;
  while (ci != 0) {
    --p;
    const std::uint64_t cv = cand[ci - 1];
    const std::uint32_t cidx = static_cast<std::uint32_t>(cv);
    if (gi != 0 && load_le<std::uint32_t>(idx + 4 * (gi - 1)) > cidx) {
      --gi;
      store_le<std::uint32_t>(idx + 4 * p, load_le<std::uint32_t>(idx + 4 * gi));
      store_le(val + sizeof(T) * p, load_le<bits_of<T>>(val + sizeof(T) * gi));
    } else {
      --ci;
      store_le<std::uint32_t>(idx + 4 * p, cidx);
      store_le(val + sizeof(T) * p, static_cast<bits_of<T>>(cv >> 32));
    }
  }
}

// u64 view of caller scratch (aligned inside it) of at least `count` entries,
// or null when it is too small.
inline std::uint64_t* scratch_u64(std::span<std::byte> scratch, std::size_t count) noexcept {
  void* p = scratch.data();
  std::size_t space = scratch.size();
  if (p == nullptr || std::align(alignof(std::uint64_t), count * 8, p, space) == nullptr) return nullptr;
  return static_cast<std::uint64_t*>(p);
}

// One pass: counts the elements with magnitude key >= theta (and == theta)
// and stores the first `cap` of them as candidates, in index order. For f32
// the keys are tested 32 per step with AVX2 where the CPU has it (chosen at
// run time) and each hit is taken from the compare mask, else 8 per step with
// the vector extension and a scalar re-check of a group holding a candidate;
// every path gives the same counts and list. The pass is a read of x at
// memory speed, which is what sampled top-k costs.
struct collect_counts {
  std::size_t ge = 0, eq = 0;
};

#if ASHL_DETAIL_PHILOX_X86
// The AVX2 part of collect_ge for f32: elements [0, returned) of x, a
// multiple of 32; r continues the counts.
__attribute__((target("avx2,bmi"))) inline std::size_t collect_ge_avx2(const float* x, std::size_t n,
                                                                     std::uint32_t theta, std::uint64_t* cand,
                                                                     std::size_t cap, collect_counts& r) noexcept {
  // Keys are below 2^31, so a signed compare with theta - 1 is key >= theta
  // (theta = 0: -1, every key).
  const __m256i below = _mm256_set1_epi32(static_cast<int>(theta) - 1);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  std::size_t ge = r.ge, eq = r.eq;
  std::size_t i = 0;
  for (const std::size_t e = n & ~std::size_t{31}; i < e; i += 32) {
    const __m256i k0 = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs_mask);
    const __m256i k1 = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8)), abs_mask);
    const __m256i k2 = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 16)), abs_mask);
    const __m256i k3 = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 24)), abs_mask);
    const __m256i h0 = _mm256_cmpgt_epi32(k0, below), h1 = _mm256_cmpgt_epi32(k1, below);
    const __m256i h2 = _mm256_cmpgt_epi32(k2, below), h3 = _mm256_cmpgt_epi32(k3, below);
    const __m256i any = _mm256_or_si256(_mm256_or_si256(h0, h1), _mm256_or_si256(h2, h3));
    if (_mm256_testz_si256(any, any)) continue;
    std::uint32_t bits = static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(h0))) |
                         static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(h1))) << 8 |
                         static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(h2))) << 16 |
                         static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(h3))) << 24;
    while (bits != 0) {
      const std::size_t j = i + static_cast<std::size_t>(_tzcnt_u32(bits));
      bits &= bits - 1;
      std::uint32_t b;
      std::memcpy(&b, x + j, 4);
      if (ge < cap) cand[ge] = (static_cast<std::uint64_t>(b) << 32) | static_cast<std::uint32_t>(j);
      ++ge;
      eq += (b & 0x7fffffffu) == theta;
    }
  }
  r.ge = ge;
  r.eq = eq;
  return i;
}
#endif

#if ASHL_DETAIL_PHILOX_X86
// The same for half / bfloat16 (keys >= theta, theta <= 0x8000: a 15-bit key,
// or one above every key), over [0, returned) of x.
template <class T>
__attribute__((target("avx2,bmi"))) inline std::size_t collect_ge16_avx2(const T* x, std::size_t n,
                                                                       std::uint32_t theta, std::uint64_t* cand,
                                                                       std::size_t cap, collect_counts& r) noexcept {
  const auto* p = reinterpret_cast<const std::uint16_t*>(x);
  std::size_t ge = r.ge, eq = r.eq;
  const std::size_t i = visit_keys16_avx2<false>(p, n, theta, 0, [&](std::size_t j) {
    const std::uint32_t b = p[j];
    if (ge < cap) cand[ge] = (static_cast<std::uint64_t>(b) << 32) | static_cast<std::uint32_t>(j);
    ++ge;
    eq += (b & 0x7fffu) == theta;
  });
  r.ge = ge;
  r.eq = eq;
  return i;
}
#endif

template <gradient_element T>
collect_counts collect_ge(const T* x, std::size_t n, std::uint32_t theta, std::uint64_t* cand,
                          std::size_t cap) noexcept {
  collect_counts r;
  std::size_t i = 0;
  auto one = [&](std::size_t j) {
    const std::uint32_t key = magnitude_key(x[j]);
    if (key >= theta) {
      if (r.ge < cap) cand[r.ge] = make_candidate(x, j);
      ++r.ge;
      r.eq += key == theta;
    }
  };
#if ASHL_DETAIL_PHILOX_X86
  if constexpr (std::is_same_v<T, float>) {
    if (cpu_has_avx2()) i = collect_ge_avx2(x, n, theta, cand, cap, r);
  } else if constexpr (std::endian::native == std::endian::little) {
    if (cpu_has_avx2() && theta <= 0x8000u) i = collect_ge16_avx2(x, n, theta, cand, cap, r);
  }
#endif
#if ASHL_DETAIL_HOST_VECTOR
  if constexpr (std::is_same_v<T, float>) {
    const ashl_i32x4 th = ashl_i32x4{} + static_cast<std::int32_t>(theta);
    for (; i < (n & ~std::size_t{7}); i += 8) {
      ashl_i32x4 a, b;
      std::memcpy(&a, x + i, 16);
      std::memcpy(&b, x + i + 4, 16);
      const ashl_u32x4 m = reinterpret_cast<ashl_u32x4>(((a & 0x7fffffff) >= th) | ((b & 0x7fffffff) >= th));
      if ((m[0] | m[1] | m[2] | m[3]) != 0)
        for (std::size_t j = i; j < i + 8; ++j) one(j);
    }
  }
#endif
  for (; i < n; ++i) one(i);
  return r;
}

// Sample size and the seed of the (fixed, input-independent) sample stream
// used to pick a safe lower bound for exact top-k.
inline constexpr std::size_t topk_sample_size = 16384;
inline constexpr std::uint64_t topk_sample_seed = 0x6b706f74u;  // "topk"

// Sample rank whose key a little more than k elements reach with high
// probability (1.3 times the expected rank plus 3 sigma plus 8), and the
// candidate capacity that goes with it.
inline double topk_sample_rank(std::size_t n, std::size_t k) noexcept {
  const double mean = static_cast<double>(k) / static_cast<double>(n) * static_cast<double>(topk_sample_size);
  return 1.3 * mean + 3.0 * std::sqrt(mean) + 8.0;
}
inline bool topk_sampled_path(std::size_t n, std::size_t k) noexcept {
  return n >= 8 * topk_sample_size && topk_sample_rank(n, k) < static_cast<double>(topk_sample_size) / 2;
}
// Candidate entries encode_topk may use: twice the expected candidate count
// of the sampled path, at least k + 4096 and s / 2, never above n.
inline std::size_t topk_candidate_capacity(std::size_t n, std::size_t k) noexcept {
  if (!topk_sampled_path(n, k)) return n;
  const double expect = topk_sample_rank(n, k) * static_cast<double>(n) / static_cast<double>(topk_sample_size);
  // At least s / 2 entries: the sample's s u32 keys live in the same buffer.
  const std::size_t cap = std::max({static_cast<std::size_t>(2.0 * expect) + 64, k + 4096, topk_sample_size / 2});
  return cap < n ? cap : n;
}

// Exact top-k of x into out (sparse payload of exactly k pairs).
//
// Sampled path (n >= 2^17 and k/n small enough): a fixed pseudo-random
// sample of 16384 magnitudes gives a key θ that a little more than k
// elements reach with high probability. One pass collects the elements with
// key >= θ as candidates (a compare and a rarely taken branch per element);
// if at least k and at most the capacity did, the answer is selected among
// them. The sample affects only speed, never the result: otherwise (and for
// small n) a two-pass path runs: a histogram of the top key digit (11 bits
// for f32, 8 for f16/bf16, four interleaved copies so runs of equal digits
// do not serialize on one counter), then one pass that writes the elements
// above the threshold digit and collects those in it as candidates. When the
// threshold digit holds more candidates than fit (tie-heavy data), the
// multi-pass radix select over the input runs instead (no scratch).
//
// Scratch: topk_candidate_capacity(n, k) u64 entries. With ctx.scratch given
// but too small, the multi-pass radix select runs (no allocation); with
// ctx.scratch empty, the candidate list is allocated.
template <gradient_element T>
std::size_t encode_topk(const T* x, std::size_t n, std::size_t k, std::span<std::byte> scratch,
                        std::span<std::byte> out) {
  if (k == n) return write_all(x, n, out);
  const std::size_t cap = topk_candidate_capacity(n, k);
  std::vector<std::uint64_t> owned;
  std::uint64_t* cand = scratch_u64(scratch, cap);
  if (cand == nullptr) {
    if (!scratch.empty()) return write_selected(x, n, radix_select(x, n, k), out);
    owned.resize(cap);
    cand = owned.data();
  }
  std::byte* const base = out.data();
  std::byte* const idx = write_sparse_header(base, n, k);
  std::byte* const val = idx + 4 * k;
  const std::size_t bytes = sparse_payload_bytes(k, dtype_of<T>);
  constexpr std::size_t s = topk_sample_size;
  if (topk_sampled_path(n, k)) {
    const philox_stream rng(topk_sample_seed, 0, 0);
    auto* keys = reinterpret_cast<std::uint32_t*>(cand);  // s u32 fit: cap >= s / 2 u64
    for (std::size_t j = 0; j < s; ++j) {
      const std::uint64_t i = (static_cast<std::uint64_t>(rng.word(j)) * n) >> 32;
      keys[j] = magnitude_key(x[i]);
    }
    const std::size_t r = static_cast<std::size_t>(topk_sample_rank(n, k));
    std::nth_element(keys, keys + (s - r), keys + s);
    const std::uint32_t theta = keys[s - r];
    const collect_counts cc = collect_ge(x, n, theta, cand, cap);
    const std::size_t c = cc.ge;
    const bool full = c > cap;
    if (!full && c >= k) {
      finish_topk<T>(k, 0, 0, 0, cand, c, idx, val);
      return bytes;
    }
  }
  const topk_pass1 p1 = topk_histogram(x, n, k);
  if (p1.candidates > cap) return write_selected(x, n, radix_select(x, n, k), out);
  constexpr int shift1 = magnitude_key_bits<T> - top_digit_bits<T>;
  std::size_t g = 0, c = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t d = magnitude_key(x[i]) >> shift1;
    if (d >= p1.digit) {
      if (d > p1.digit) {
        store_le<std::uint32_t>(idx + 4 * g, static_cast<std::uint32_t>(i));
        store_le(val + sizeof(T) * g, element_bits(x[i]));
        ++g;
      } else {
        cand[c++] = make_candidate(x, i);
      }
    }
  }
  ASHL_ASSERT(g == p1.greater && c == p1.candidates, "encode_topk: pass 2 disagrees with pass 1");
  finish_topk<T>(k, g, p1.digit, top_digit_bits<T>, cand, c, idx, val);
  return bytes;
}

// "codec.suffix" on the stack: a decode builds no string unless it fails.
struct sparse_field {
  char buf[64];
  std::size_t n = 0;
  sparse_field(std::string_view codec, std::string_view suffix) noexcept {
    for (char ch : codec)
      if (n < sizeof buf) buf[n++] = ch;
    for (char ch : suffix)
      if (n < sizeof buf) buf[n++] = ch;
  }
  operator std::string_view() const noexcept { return {buf, n}; }
};

// Pairs ahead of the one being added whose target line is prefetched: the
// scatter into a shard far larger than the cache is bound by the latency of
// k random lines, and a few dozen misses in flight hide most of it (issue
// 28; bench/sparse_apply.cpp measures it against the bare loop).
inline constexpr std::size_t sparse_prefetch_distance = 16;

template <class Load>
inline void scatter_add(float* a, const std::byte* idx, std::size_t count, float scale, Load value) noexcept {
  constexpr std::size_t d = sparse_prefetch_distance;
  std::size_t j = 0;
#if defined(__GNUC__) || defined(__clang__)
  if constexpr (d > 0)
    for (; j + d < count; ++j) {
      __builtin_prefetch(a + load_le<std::uint32_t>(idx + 4 * (j + d)), 1, 0);
      a[load_le<std::uint32_t>(idx + 4 * j)] += scale * value(j);
    }
#endif
  for (; j < count; ++j) a[load_le<std::uint32_t>(idx + 4 * j)] += scale * value(j);
}

// Validates a sparse payload completely, then adds scale * value at each
// index. `require_nonempty`: count >= 1 whenever n >= 1 (exact top-k always
// sends at least one pair). Nothing is written to acc unless every check
// passes. Allocates nothing unless it refuses the payload.
inline status decode_add_pairs(std::string_view codec, std::span<const std::byte> in, payload_info info,
                               host_view<float> acc, float scale, bool require_nonempty) {
  ASHL_TRY(check_decode_args(codec, info.type, info.count, acc.size(), scale));
  byte_reader r(in);
  std::uint64_t n = 0;
  std::uint32_t count = 0;
  ASHL_TRY(r.get(n, sparse_field(codec, ".n")));
  ASHL_TRY(r.get(count, sparse_field(codec, ".count")));
  const std::string c(codec);  // for the error paths below (every codec name fits the small-string buffer)
  if (n != info.count) return malformed(c + ".n", n, "must equal info.count = " + std::to_string(info.count));
  if (count > n) return malformed(c + ".count", count, "exceeds n = " + std::to_string(n));
  if (require_nonempty && n != 0 && count == 0) return malformed(c + ".count", count, "must be >= 1");
  const std::size_t vs = size_of(info.type);
  const std::size_t expect = sparse_payload_bytes(count, info.type);
  if (in.size() != expect)
    return malformed(c + ".payload_bytes", in.size(), "must be 12 + count * " + std::to_string(4 + vs) + " = " +
                                                          std::to_string(expect));
  const std::byte* idx = in.data() + layout::sparse::header_bytes;
  const std::byte* val = idx + 4 * std::size_t{count};
  // The check as one branch-free pass the compiler vectorizes (each index
  // against n and against its predecessor); only a payload it refuses takes
  // the loop below, which finds and names the first bad index.
  // (32-bit lanes: with n above 2^32 - 1 no index can reach it.)
  const bool small_n = n <= 0xffffffffu;
  const auto n32 = static_cast<std::uint32_t>(small_n ? n : 0xffffffffu);
  bool bad = count != 0 && load_le<std::uint32_t>(idx) >= n;
  unsigned over = 0, order = 0;
  for (std::size_t j = 1; j < count; ++j) {
    const std::uint32_t i = load_le<std::uint32_t>(idx + 4 * j), before = load_le<std::uint32_t>(idx + 4 * (j - 1));
    over |= static_cast<unsigned>(i >= n32);
    order |= static_cast<unsigned>(i <= before);
  }
  bad = bad || (small_n && over != 0) || order != 0;
  std::uint64_t prev = 0;
  for (std::size_t j = 0; bad && j < count; ++j) {
    const std::uint32_t i = load_le<std::uint32_t>(idx + 4 * j);
    if (i >= n)
      return malformed(c + ".index[" + std::to_string(j) + "]", i, "must be < n = " + std::to_string(n));
    if (j != 0 && i <= prev)
      return malformed(c + ".index[" + std::to_string(j) + "]", i,
                       "must be greater than the previous index " + std::to_string(prev));
    prev = i;
  }
  float* a = acc.data();
  switch (info.type) {
    case dtype::f32:
      scatter_add(a, idx, count, scale, [val](std::size_t j) { return load_le<float>(val + 4 * j); });
      break;
    case dtype::f16:
      scatter_add(a, idx, count, scale,
                  [val](std::size_t j) { return f16_to_f32(load_le<std::uint16_t>(val + 2 * j)); });
      break;
    default:
      scatter_add(a, idx, count, scale,
                  [val](std::size_t j) { return bf16_to_f32(load_le<std::uint16_t>(val + 2 * j)); });
      break;
  }
  return {};
}

// The skeleton of a codec whose payload is sparse pairs (topk, threshold,
// topk_sampled), for it to derive from. Derived gives validate(),
// bound_for(n), the most pairs it sends for n elements, and
// encode_pairs(x, n, out, ctx), called once the options were validated and
// `out` was checked to hold bound_for(n) pairs. RequireNonempty: a payload of
// 0 pairs is refused (topk always sends k >= 1).
template <class Derived, codec_id Id, bool RequireNonempty>
class sparse_codec : public codec_base<Id> {
 public:
  static constexpr bool require_nonempty = RequireNonempty;

  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n, dtype t) const noexcept {
    return sparse_payload_bytes(self().bound_for(n), t);
  }

  template <gradient_element T>
  result<std::size_t> encode(host_view<const T> x, std::span<std::byte> out, const codec_context& ctx) const {
    ASHL_TRY(self().validate());
    const std::size_t n = x.size();
    ASHL_TRY(check_sparse_encode(to_string(Id), n, out.size(), sparse_payload_bytes(self().bound_for(n), dtype_of<T>)));
    return self().encode_pairs(x.data(), n, out, ctx);
  }

  status decode_add(std::span<const std::byte> in, payload_info info, host_view<float> acc, float scale,
                    const codec_context&) const {
    return decode_add_pairs(to_string(Id), in, info, acc, scale, require_nonempty);
  }

 private:
  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
};

}  // namespace detail
ASHL_DETAIL_COMPRESS_HOST_END
