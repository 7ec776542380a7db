// ashl/rules/finite.hpp — the servers' value rule: no NaN or infinite value in
// a commit's values unless allowed. One body for the server core's check
// (rules/server_core.hpp, as a payload's chunks are read) and the worker's check
// of every shard's part before any is sent (rules/commit_check.hpp), so the
// two cannot disagree; small, so a worker does not include the server core.
//
//   const auto b = ashl::ps::detail::bits_of(ashl::dtype::f16);
//   std::size_t i = ashl::ps::detail::first_non_finite(p, n, b.bytes, b.mask);  // n: all finite
//
// docs/ps.md "All or nothing across shards".
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/wire/ids.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

ASHL_NAMESPACE_BEGIN
namespace ps {

// The values of a dense payload (identity, fp16, bf16 casts) are of this
// type: the cast's for fp16/bf16, the header's for identity.
constexpr dtype dense_values_type(codec_id codec, dtype type) noexcept {
  return codec == codec_id::fp16 ? dtype::f16 : codec == codec_id::bf16 ? dtype::bf16 : type;
}

namespace detail {

// The first of n little-endian floating-point values at p whose exponent
// bits are all ones (NaN or infinite), or n. `bytes` is 4 (f32) or 2, with
// the exponent mask of the 16-bit format (0x7c00 f16, 0x7f80 bf16). Blocks
// of 256 values OR a flag without a branch (the compiler vectorizes it; a
// pass at memory speed), and only a flagged block is searched for the index.
inline std::size_t first_non_finite(const std::byte* p, std::size_t n, std::size_t bytes,
                                    std::uint32_t mask) noexcept {
  constexpr std::size_t block = 256;
  for (std::size_t at = 0; at < n; at += block) {
    const std::size_t k = n - at < block ? n - at : block;
    std::uint32_t bad = 0;
    if (bytes == 4) {
      for (std::size_t j = 0; j < k; ++j) {
        std::uint32_t x;
        std::memcpy(&x, p + 4 * (at + j), 4);
        x = ::ashl::detail::byteswap_if_big(x);
        bad |= static_cast<std::uint32_t>((x & mask) == mask);
      }
    } else {
      for (std::size_t j = 0; j < k; ++j) {
        std::uint16_t x;
        std::memcpy(&x, p + 2 * (at + j), 2);
        x = ::ashl::detail::byteswap_if_big(x);
        bad |= static_cast<std::uint32_t>((x & mask) == mask);
      }
    }
    if (bad == 0) continue;
    for (std::size_t j = at; j < at + k; ++j) {
      std::uint32_t x = 0;
      if (bytes == 4) {
        std::uint32_t v;
        std::memcpy(&v, p + 4 * j, 4);
        x = ::ashl::detail::byteswap_if_big(v);
      } else {
        std::uint16_t v;
        std::memcpy(&v, p + 2 * j, 2);
        x = ::ashl::detail::byteswap_if_big(v);
      }
      if ((x & mask) == mask) return j;
    }
  }
  return n;
}

// The value at index i as a float (for the error: nan, inf or -inf).
inline float non_finite_value(const std::byte* p, std::size_t i, std::size_t bytes, std::uint32_t mask) noexcept {
  std::uint32_t x = 0;
  if (bytes == 4) {
    std::uint32_t v;
    std::memcpy(&v, p + 4 * i, 4);
    x = ::ashl::detail::byteswap_if_big(v);
  } else {
    std::uint16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    x = ::ashl::detail::byteswap_if_big(v);
  }
  const bool negative = (x & (bytes == 4 ? 0x80000000u : 0x8000u)) != 0;
  const std::uint32_t mantissa = x & ~mask & (bytes == 4 ? 0x7fffffffu : 0x7fffu);
  if (mantissa != 0) return std::numeric_limits<float>::quiet_NaN();
  return negative ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
}

struct float_bits {
  std::size_t bytes = 4;
  std::uint32_t mask = 0x7f800000u;
};
constexpr float_bits bits_of(dtype t) noexcept {
  if (t == dtype::f16) return {2, 0x7c00u};
  if (t == dtype::bf16) return {2, 0x7f80u};
  return {4, 0x7f800000u};
}

}  // namespace detail

}  // namespace ps
ASHL_NAMESPACE_END
