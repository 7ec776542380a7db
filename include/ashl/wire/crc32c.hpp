// ashl/wire/crc32c.hpp — CRC-32C (Castagnoli): hardware where the CPU has it,
// table-driven software otherwise, and the combination of two CRCs.
//
//   std::uint32_t a = ashl::wire::crc32c(header);           // one buffer
//   std::uint32_t d = ashl::wire::crc32c(payload, a);       // continue: == crc32c(header ++ payload)
//   std::uint32_t b = ashl::wire::crc32c(payload);          // checksummed once, on its own ...
//   std::uint32_t e = ashl::wire::crc32c_combine(a, b, payload.size());  // ... e == d
//   // crc32c("123456789") == 0xE3069283
//
// Every wire message carries the CRC-32C of its header and payload
// (docs/wire-format.md, "Header"); payloads reach 64 MiB, so the checksum must
// run at memory speed (docs/perf/crc32c.md has the figures). Reflected
// polynomial 0x82F63B78, initial value and final XOR 0xFFFFFFFF (RFC 3720,
// iSCSI).
//
// Paths, all bit-identical (test/wire/crc32c.cpp checks them against each
// other and against a bit-at-a-time definition):
// - x86-64 with SSE 4.2, detected at run time once (the library is built for
//   generic x86-64, so only the functions that use the `crc32` instruction
//   carry target("sse4.2")): three independent streams over adjacent blocks,
//   because the instruction has a latency of 3 cycles and a throughput of 1,
//   merged with precomputed "append this many zero bytes" tables.
// - Everything else, and constant evaluation: slicing-by-8, eight 256-entry
//   tables built at compile time, eight bytes per step.
//
// The algebra, in the register ("raw") domain where the CRC is linear: with
// R(d, s) the register after feeding bytes d to a register holding s, and
// Z_n(s) = s·x^(8n) mod P (feeding n zero bytes with no XORs),
//   R(A ++ B, s) = Z_|B|(R(A, s)) ^ R(B, 0).
// The hardware path uses it to merge its streams; crc32c_combine is the same
// identity after the initial and final XORs cancel (see its comment).
#pragma once

#include <ashl/config.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define ASHL_DETAIL_CRC32C_X86 1
#else
#define ASHL_DETAIL_CRC32C_X86 0
#endif

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

// Slicing-by-8 on the raw register (no initial or final XOR).
constexpr std::uint32_t crc32c_software(const std::byte* p, std::size_t n, std::uint32_t c) noexcept {
  const auto& t = crc32c_tables;
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
  return crc32c_bytewise(p, n, c);
}

// a·b mod P in GF(2)[x], reflected: bit 31 is x^0, bit 0 is x^31 (the CRC
// register's own order, so a register value is a valid operand). Branch-free,
// 32 steps.
constexpr std::uint32_t crc32c_multiply(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t p = 0;
  for (int i = 31; i >= 0; --i) {
    p ^= b & (0u - ((a >> i) & 1u));
    b = (b >> 1) ^ (crc32c_poly & (0u - (b & 1u)));
  }
  return p;
}

// x^(2^k) mod P for k = 0..66: enough for x^(8·n) with any 64-bit byte count n.
inline constexpr auto crc32c_x_pow2 = [] {
  std::array<std::uint32_t, 67> t{};
  t[0] = 0x40000000u;  // x^1
  for (std::size_t k = 1; k < t.size(); ++k) t[k] = crc32c_multiply(t[k - 1], t[k - 1]);
  return t;
}();

// x^(8·n) mod P: the operator that appends n zero bytes, O(log n) products.
constexpr std::uint32_t crc32c_x_pow_8n(std::uint64_t n) noexcept {
  std::uint32_t r = 0x80000000u;  // x^0
  for (std::size_t k = 3; n != 0; n >>= 1, ++k)
    if (n & 1u) r = crc32c_multiply(crc32c_x_pow2[k], r);
  return r;
}

#if ASHL_DETAIL_CRC32C_X86
// Multiplication by x^(8·Bytes) as four byte-indexed tables (the operator is
// linear, so it is the XOR of its values on the four bytes of the register):
// four loads instead of a 32-step product, which matters for the short blocks.
template <std::size_t Bytes>
struct crc32c_zeros {
  static constexpr auto table = [] {
    std::array<std::array<std::uint32_t, 256>, 4> t{};
    const std::uint32_t op = crc32c_x_pow_8n(Bytes);
    for (std::uint32_t j = 0; j < 4; ++j)
      for (std::uint32_t b = 0; b < 256; ++b) t[j][b] = crc32c_multiply(op, b << (8 * j));
    return t;
  }();
  static std::uint32_t apply(std::uint32_t c) noexcept {
    return table[0][c & 0xffu] ^ table[1][(c >> 8) & 0xffu] ^ table[2][(c >> 16) & 0xffu] ^ table[3][c >> 24];
  }
};

// Block sizes of the three-stream loops, largest first; each level takes
// whole 3·Block spans and leaves the rest to the next. 64 KiB blocks keep the
// merges (two table applications) negligible and give the prefetcher three
// long sequential streams, which is what moves a 64 MiB buffer at memory
// speed (8 KiB blocks: 13–14 GB/s there, 64 KiB: about 20); 4 KiB and 256 B
// let buffers from 768 bytes up use all three streams. Measured in
// docs/perf/crc32c.md.
inline constexpr std::array<std::size_t, 3> crc32c_blocks = {65536, 4096, 256};

inline std::uint64_t crc32c_load64(const std::byte* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, 8);  // x86 is little-endian; memcpy is the aligned-or-not load
  return v;
}

// Three streams over `Block`-byte thirds of each 3·Block span, merged
// serially: c = Z(Z(c0) ^ c1) ^ c2, which is the CRC of the span in order.
template <std::size_t Block>
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_sse42_blocks(const std::byte*& p, std::size_t& n,
                                                                              std::uint32_t c) noexcept {
  while (n >= 3 * Block) {
    std::uint64_t c0 = c, c1 = 0, c2 = 0;
    const std::byte* const end = p + Block;
    do {
      c0 = _mm_crc32_u64(c0, crc32c_load64(p));
      c1 = _mm_crc32_u64(c1, crc32c_load64(p + Block));
      c2 = _mm_crc32_u64(c2, crc32c_load64(p + 2 * Block));
      p += 8;
    } while (p != end);
    c = crc32c_zeros<Block>::apply(static_cast<std::uint32_t>(c0)) ^ static_cast<std::uint32_t>(c1);
    c = crc32c_zeros<Block>::apply(c) ^ static_cast<std::uint32_t>(c2);
    p += 2 * Block;
    n -= 3 * Block;
  }
  return c;
}

// The raw register after feeding p[0..n) with the `crc32` instruction.
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_sse42(const std::byte* p, std::size_t n,
                                                                     std::uint32_t c) noexcept {
  static_assert(crc32c_blocks[0] % 8 == 0 && crc32c_blocks[1] % 8 == 0 && crc32c_blocks[2] % 8 == 0);
  c = crc32c_sse42_blocks<crc32c_blocks[0]>(p, n, c);
  c = crc32c_sse42_blocks<crc32c_blocks[1]>(p, n, c);
  c = crc32c_sse42_blocks<crc32c_blocks[2]>(p, n, c);
  std::uint64_t c64 = c;
  for (; n >= 8; p += 8, n -= 8) c64 = _mm_crc32_u64(c64, crc32c_load64(p));
  c = static_cast<std::uint32_t>(c64);
  for (; n > 0; ++p, --n) c = _mm_crc32_u8(c, std::to_integer<std::uint8_t>(*p));
  return c;
}

// Read once; __builtin_cpu_init first, since the first call may come from a
// static initializer that runs before the runtime's own.
inline bool crc32c_has_sse42() noexcept {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return has;
}
#endif
}  // namespace detail

// Which implementation crc32c uses at run time on this machine:
// "sse4.2" or "software" (the benchmark and tests report it).
inline const char* crc32c_implementation() noexcept {
#if ASHL_DETAIL_CRC32C_X86
  if (detail::crc32c_has_sse42()) return "sse4.2";
#endif
  return "software";
}

// CRC-32C of `data` with the portable table-driven code, whatever the CPU;
// same contract as crc32c. The reference the hardware path is tested against.
constexpr std::uint32_t crc32c_software(std::span<const std::byte> data, std::uint32_t previous = 0) noexcept {
  return ~detail::crc32c_software(data.data(), data.size(), ~previous);
}

// CRC-32C of `data`, continuing from `previous` (the finished CRC of the bytes
// before it; 0 to start, which is also the CRC of no bytes). Usable in
// constant expressions (then the software path runs).
constexpr std::uint32_t crc32c(std::span<const std::byte> data, std::uint32_t previous = 0) noexcept {
#if ASHL_DETAIL_CRC32C_X86
  if (!std::is_constant_evaluated() && detail::crc32c_has_sse42())
    return ~detail::crc32c_sse42(data.data(), data.size(), ~previous);
#endif
  return ~detail::crc32c_software(data.data(), data.size(), ~previous);
}

// crc32c_chunked reads in chunks of this size: three of crc32c's 64 KiB
// streams (its fastest path), small enough for a core's L2 cache.
inline constexpr std::size_t crc32c_chunk_bytes = std::size_t{192} << 10;

// crc32c(data, previous), read in chunks of crc32c_chunk_bytes (the last
// one shorter): visit(chunk) sees each chunk, in order, right after the CRC
// read it, while it is in the cache, so a read-only check of the same bytes
// costs no pass of its own. The one body of that fusion: wire::decode's
// visitor (ps::server's CRC check with its finite scan) and
// ps::check_commit_parts (ps::worker's finite check with the commit's CRC).
template <class Visit>
inline std::uint32_t crc32c_chunked(std::span<const std::byte> data, std::uint32_t previous, Visit&& visit) {
  for (std::size_t at = 0; at < data.size(); at += crc32c_chunk_bytes) {
    const auto chunk = data.subspan(at, std::min(crc32c_chunk_bytes, data.size() - at));
    previous = crc32c(chunk, previous);
    visit(chunk);
  }
  return previous;
}

// crc32c(A ++ B) from crc_a = crc32c(A), crc_b = crc32c(B) and len_b = |B|,
// without the bytes, in O(log len_b):
//   crc32c_combine(crc32c(A), crc32c(B), B.size()) == crc32c(B, crc32c(A)) == crc32c(A ++ B).
// Both inputs are finished CRCs as crc32c returns them (final XOR applied,
// each started from `previous` = 0). The initial and final XORs cancel, so the
// result is crc_a·x^(8·len_b) mod P, XOR crc_b; crc_a = 0 (A empty) gives crc_b,
// len_b = 0 (so crc_b = 0) gives crc_a.
constexpr std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b) noexcept {
  return detail::crc32c_multiply(detail::crc32c_x_pow_8n(len_b), crc_a) ^ crc_b;
}

// crc32c_combine with len_b fixed and its operator x^(8·len_b) computed once:
// for many short prefixes (72-byte headers) in front of one checksummed
// buffer, each combination is then a single 32-step product.
//
//   const crc32c_combiner after_snapshot(snapshot.size());
//   const std::uint32_t s = crc32c(snapshot);                    // once
//   std::uint32_t crc = after_snapshot(crc32c(header_bytes), s); // per header
class crc32c_combiner {
 public:
  constexpr explicit crc32c_combiner(std::uint64_t len_b) noexcept
      : len_b_(len_b), op_(detail::crc32c_x_pow_8n(len_b)) {}
  constexpr std::uint32_t operator()(std::uint32_t crc_a, std::uint32_t crc_b) const noexcept {
    return detail::crc32c_multiply(op_, crc_a) ^ crc_b;
  }
  constexpr std::uint64_t length() const noexcept { return len_b_; }

 private:
  std::uint64_t len_b_;
  std::uint32_t op_;
};

}  // namespace wire
ASHL_NAMESPACE_END
