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
// and decode are two contiguous streams. ALGORITHMS.md §4.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/detail/elements.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

ASHL_NAMESPACE_BEGIN
namespace compress::detail {

inline constexpr std::size_t sparse_header_bytes = 12;  // u64 n + u32 count

// Indices are u32, so a sparse codec accepts tensors of up to 2^32 elements.
inline constexpr std::size_t sparse_max_elements = std::size_t{1} << 32;

inline constexpr std::size_t sparse_payload_bytes(std::size_t count, dtype t) noexcept {
  return sparse_header_bytes + count * (4 + size_of(t));
}

inline status check_sparse_encode(std::string_view codec, std::size_t n, std::size_t out_size,
                                  std::size_t needed) {
  if (n > sparse_max_elements)
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
  store_le<std::uint64_t>(base, n);
  store_le<std::uint32_t>(base + 8, static_cast<std::uint32_t>(count));
  std::byte* idx = base + sparse_header_bytes;
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

// Validates a sparse payload completely, then adds scale * value at each
// index. `require_nonempty`: count >= 1 whenever n >= 1 (exact top-k always
// sends at least one pair). Nothing is written to acc unless every check
// passes.
inline status decode_add_pairs(std::string_view codec, std::span<const std::byte> in, payload_info info,
                               host_view<float> acc, float scale, bool require_nonempty) {
  const std::string c(codec);
  ASHL_TRY(check_decode_args(codec, info.type, info.count, acc.size(), scale));
  byte_reader r(in);
  std::uint64_t n = 0;
  std::uint32_t count = 0;
  ASHL_TRY(r.get(n, c + ".n"));
  ASHL_TRY(r.get(count, c + ".count"));
  if (n != info.count) return malformed(c + ".n", n, "must equal info.count = " + std::to_string(info.count));
  if (count > n) return malformed(c + ".count", count, "exceeds n = " + std::to_string(n));
  if (require_nonempty && n != 0 && count == 0) return malformed(c + ".count", count, "must be >= 1");
  const std::size_t vs = size_of(info.type);
  const std::size_t expect = sparse_payload_bytes(count, info.type);
  if (in.size() != expect)
    return malformed(c + ".payload_bytes", in.size(), "must be 12 + count * " + std::to_string(4 + vs) + " = " +
                                                          std::to_string(expect));
  const std::byte* idx = in.data() + sparse_header_bytes;
  const std::byte* val = idx + 4 * std::size_t{count};
  std::uint64_t prev = 0;
  for (std::size_t j = 0; j < count; ++j) {
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
      for (std::size_t j = 0; j < count; ++j) a[load_le<std::uint32_t>(idx + 4 * j)] += scale * load_le<float>(val + 4 * j);
      break;
    case dtype::f16:
      for (std::size_t j = 0; j < count; ++j)
        a[load_le<std::uint32_t>(idx + 4 * j)] += scale * f16_to_f32(load_le<std::uint16_t>(val + 2 * j));
      break;
    default:
      for (std::size_t j = 0; j < count; ++j)
        a[load_le<std::uint32_t>(idx + 4 * j)] += scale * bf16_to_f32(load_le<std::uint16_t>(val + 2 * j));
      break;
  }
  return {};
}

}  // namespace compress::detail
ASHL_NAMESPACE_END
