// ashl/wire/crc32c.hpp — CRC-32C (Castagnoli), software, table-driven.
//
//   std::uint32_t c = ashl::wire::crc32c(bytes);            // one buffer
//   std::uint32_t d = ashl::wire::crc32c(more, c);          // continue: same as crc32c(bytes ++ more)
//   // crc32c("123456789") == 0xE3069283
//
// Every wire message carries the CRC-32C of its header and payload
// (docs/wire-format.md, "Header"). Slicing-by-8: eight 256-entry tables built
// at compile time, eight bytes per step, so the checksum costs a small
// fraction of a memory copy and needs no CPU feature detection. The same
// function is the reference a hardware (SSE 4.2 / ARMv8) path would be
// tested against. Reflected polynomial 0x82F63B78, initial value and final
// XOR 0xFFFFFFFF (RFC 3720, iSCSI).
#pragma once

#include <ashl/config.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

ASHL_NAMESPACE_BEGIN
namespace wire {

namespace detail {
inline constexpr std::uint32_t crc32c_poly = 0x82F63B78u;

constexpr std::array<std::array<std::uint32_t, 256>, 8> make_crc32c_tables() noexcept {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ crc32c_poly : c >> 1;
    t[0][i] = c;
  }
  for (std::uint32_t i = 0; i < 256; ++i)
    for (std::size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xffu];
  return t;
}
inline constexpr auto crc32c_tables = make_crc32c_tables();

// One byte at a time: the definition, used for the tail and as the test oracle.
constexpr std::uint32_t crc32c_bytewise(const std::byte* p, std::size_t n, std::uint32_t state) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    state = (state >> 8) ^ crc32c_tables[0][(state ^ std::to_integer<std::uint32_t>(p[i])) & 0xffu];
  return state;
}
}  // namespace detail

// CRC-32C of `data`, continuing from `previous` (the result of an earlier
// call over the bytes before it; 0 to start).
constexpr std::uint32_t crc32c(std::span<const std::byte> data, std::uint32_t previous = 0) noexcept {
  const auto& t = detail::crc32c_tables;
  std::uint32_t c = ~previous;
  const std::byte* p = data.data();
  std::size_t n = data.size();
  while (n >= 8) {
    // Assemble little-endian words byte by byte: alignment- and endian-free.
    const std::uint32_t lo = c ^ (std::to_integer<std::uint32_t>(p[0]) | std::to_integer<std::uint32_t>(p[1]) << 8 |
                                  std::to_integer<std::uint32_t>(p[2]) << 16 |
                                  std::to_integer<std::uint32_t>(p[3]) << 24);
    c = t[7][lo & 0xffu] ^ t[6][(lo >> 8) & 0xffu] ^ t[5][(lo >> 16) & 0xffu] ^ t[4][lo >> 24] ^
        t[3][std::to_integer<std::uint32_t>(p[4])] ^ t[2][std::to_integer<std::uint32_t>(p[5])] ^
        t[1][std::to_integer<std::uint32_t>(p[6])] ^ t[0][std::to_integer<std::uint32_t>(p[7])];
    p += 8;
    n -= 8;
  }
  return ~detail::crc32c_bytewise(p, n, c);
}

}  // namespace wire
ASHL_NAMESPACE_END
