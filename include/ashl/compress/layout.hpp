// ashl/compress/layout.hpp — the codec payload layouts, once, for host and device.
//
//   namespace L = ashl::compress::layout;
//   std::size_t bytes = L::qsgd_payload_bytes(n, 512, 127);       // 16 + 4 ceil(n/512) + ceil(8n/8)
//   const std::byte* norms = payload + L::qsgd::header_bytes;
//   const std::byte* codes = norms + 4 * L::bucket_count(n, 512);
//   std::size_t pairs = L::sparse_payload_bytes(count, L::value_bytes(dtype::bf16));
//
// Every codec payload starts with a small little-endian header and then one
// or two arrays whose sizes follow from header fields. The header sizes, the
// field offsets and the size formulas are defined here as constexpr
// ASHL_HOST_DEVICE functions, so the CPU codecs (compress/*.hpp), the device
// codecs (compress/cuda/*.cuh, in host and in kernel code) and the registry
// agree by construction instead of by copy. Only arithmetic lives here:
// reading and writing the fields stays with byte_reader/byte_writer on the
// host and the kernels on the device. Sizes are u64 so that a 32-bit device
// size_t never truncates them. docs/wire-format.md, "Codec payloads";
// docs/algorithms.md §4.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/dtype.hpp>

#include <cstdint>

ASHL_NAMESPACE_BEGIN
namespace compress::layout {

// Bytes of one value carried "in the input dtype" (identity, the sparse
// codecs, randomk): 4 for f32, 2 for f16 and bf16. The device cannot call
// core's size_of (a plain constexpr function), hence this copy of the three
// cases the codecs accept.
constexpr ASHL_HOST_DEVICE std::uint64_t value_bytes(dtype t) noexcept { return t == dtype::f32 ? 4u : 2u; }

// ---- bucketed quantizers (qsgd, terngrad, sign) ----------------------------

// Buckets [b B, min(n, (b + 1) B)); 0 buckets for B = 0 (refused by validation).
constexpr ASHL_HOST_DEVICE std::uint64_t bucket_count(std::uint64_t n, std::uint64_t bucket) noexcept {
  return bucket == 0 ? 0 : (n + bucket - 1) / bucket;
}
// n codes of `bits` bits packed LSB-first in one bit stream.
constexpr ASHL_HOST_DEVICE std::uint64_t packed_bytes(std::uint64_t n, unsigned bits) noexcept {
  return (n * bits + 7) / 8;
}
// 1 + bit_width(levels): a sign bit and the level (std::bit_width is not
// usable in device code).
constexpr ASHL_HOST_DEVICE unsigned qsgd_code_bits(std::uint32_t levels) noexcept {
  unsigned w = 0;
  while (levels != 0) {
    ++w;
    levels >>= 1;
  }
  return 1u + w;
}
// Elements a bucketed payload may describe (the codecs' `<codec>.n` check).
inline constexpr std::uint64_t bucketed_max_elements = std::uint64_t{1} << 48;

struct qsgd {
  static constexpr std::uint64_t n_offset = 0;        // u64
  static constexpr std::uint64_t bucket_offset = 8;   // u32
  static constexpr std::uint64_t levels_offset = 12;  // u32
  static constexpr std::uint64_t header_bytes = 16;   // then f32 norm[nb], codes
  static constexpr std::uint32_t max_levels = 32767;  // codes fit in 16 bits
};
struct terngrad {
  static constexpr std::uint64_t n_offset = 0;       // u64
  static constexpr std::uint64_t bucket_offset = 8;  // u32
  static constexpr std::uint64_t header_bytes = 12;  // then f32 scale[nb], 2-bit codes
  static constexpr unsigned code_bits = 2;
};
struct sign {
  static constexpr std::uint64_t n_offset = 0;       // u64
  static constexpr std::uint64_t bucket_offset = 8;  // u32
  static constexpr std::uint64_t header_bytes = 12;  // then f32 scale[nb], 1-bit codes
  static constexpr unsigned code_bits = 1;
};

// Offset of the packed codes: after the header and the nb f32 scales.
constexpr ASHL_HOST_DEVICE std::uint64_t bucketed_codes_offset(std::uint64_t header_bytes, std::uint64_t n,
                                                               std::uint64_t bucket) noexcept {
  return header_bytes + 4 * bucket_count(n, bucket);
}
constexpr ASHL_HOST_DEVICE std::uint64_t bucketed_payload_bytes(std::uint64_t header_bytes, std::uint64_t n,
                                                                std::uint64_t bucket, unsigned bits) noexcept {
  return bucketed_codes_offset(header_bytes, n, bucket) + packed_bytes(n, bits);
}
constexpr ASHL_HOST_DEVICE std::uint64_t qsgd_payload_bytes(std::uint64_t n, std::uint64_t bucket,
                                                            std::uint32_t levels) noexcept {
  return bucketed_payload_bytes(qsgd::header_bytes, n, bucket, qsgd_code_bits(levels));
}
constexpr ASHL_HOST_DEVICE std::uint64_t terngrad_payload_bytes(std::uint64_t n, std::uint64_t bucket) noexcept {
  return bucketed_payload_bytes(terngrad::header_bytes, n, bucket, terngrad::code_bits);
}
constexpr ASHL_HOST_DEVICE std::uint64_t sign_payload_bytes(std::uint64_t n, std::uint64_t bucket) noexcept {
  return bucketed_payload_bytes(sign::header_bytes, n, bucket, sign::code_bits);
}

// ---- natural ---------------------------------------------------------------

struct natural {
  static constexpr std::uint64_t n_offset = 0;       // u64
  static constexpr std::uint64_t emin_offset = 8;    // i32
  static constexpr std::uint64_t header_bytes = 12;  // then u8 code[n]
  static constexpr std::int32_t min_emin = -274, max_emin = 1;
};
constexpr ASHL_HOST_DEVICE std::uint64_t natural_payload_bytes(std::uint64_t n) noexcept {
  return natural::header_bytes + n;
}

// ---- block (block-scaled integers) ------------------------------------------

// u64 n, u32 block B, u8 bits, u8 rounding, u16 reserved (0); then nb f32
// steps d_b (absmax_b / (2^(bits-1) - 1)), then n codes of `bits` bits
// (two's complement, LSB-first bit stream). B is a multiple of 8, so every
// block's codes start on a byte.
struct block {
  static constexpr std::uint64_t n_offset = 0;          // u64
  static constexpr std::uint64_t block_offset = 8;      // u32
  static constexpr std::uint64_t bits_offset = 12;      // u8: 2, 4 or 8
  static constexpr std::uint64_t rounding_offset = 13;  // u8: 0 nearest even, 1 stochastic
  static constexpr std::uint64_t reserved_offset = 14;  // u16, 0
  static constexpr std::uint64_t header_bytes = 16;     // then f32 step[nb], codes
  static constexpr std::uint32_t min_block = 8, max_block = 65536, block_multiple = 8;
  static constexpr std::uint8_t rounding_nearest = 0, rounding_stochastic = 1;
};
// The largest code magnitude of a `bits`-bit code: 127, 7, 1. The code
// -2^(bits-1) (0x80, 0x8, 0b10) is never sent.
constexpr ASHL_HOST_DEVICE std::int32_t block_max_code(unsigned bits) noexcept {
  return (std::int32_t{1} << (bits - 1)) - 1;
}
constexpr ASHL_HOST_DEVICE bool block_bits_valid(unsigned bits) noexcept { return bits == 2 || bits == 4 || bits == 8; }
constexpr ASHL_HOST_DEVICE bool block_size_valid(std::uint64_t b) noexcept {
  return b >= block::min_block && b <= block::max_block && b % block::block_multiple == 0;
}
constexpr ASHL_HOST_DEVICE std::uint64_t block_codes_offset(std::uint64_t n, std::uint64_t b) noexcept {
  return block::header_bytes + 4 * bucket_count(n, b);
}
constexpr ASHL_HOST_DEVICE std::uint64_t block_payload_bytes(std::uint64_t n, std::uint64_t b, unsigned bits) noexcept {
  return block_codes_offset(n, b) + packed_bytes(n, bits);
}

// ---- sparse pairs (topk, topk_sampled, threshold) --------------------------

struct sparse {
  static constexpr std::uint64_t n_offset = 0;       // u64
  static constexpr std::uint64_t count_offset = 8;   // u32
  static constexpr std::uint64_t header_bytes = 12;  // then u32 index[count], value[count]
  // Indices are u32, so a sparse payload describes at most 2^32 elements.
  static constexpr std::uint64_t max_elements = std::uint64_t{1} << 32;
};
constexpr ASHL_HOST_DEVICE std::uint64_t sparse_values_offset(std::uint64_t count) noexcept {
  return sparse::header_bytes + 4 * count;
}
constexpr ASHL_HOST_DEVICE std::uint64_t sparse_payload_bytes(std::uint64_t count, std::uint64_t value_bytes) noexcept {
  return sparse::header_bytes + count * (4 + value_bytes);
}

// ---- randomk ---------------------------------------------------------------

struct randomk {
  static constexpr std::uint64_t n_offset = 0;       // u64
  static constexpr std::uint64_t k_offset = 8;       // u32
  static constexpr std::uint64_t flags_offset = 12;  // u8, bit 0 unbiased
  static constexpr std::uint64_t seed_offset = 13;   // u64
  static constexpr std::uint64_t header_bytes = 21;  // then value[k] (unaligned)
  static constexpr std::uint8_t flag_unbiased = 1;
  static constexpr std::uint64_t max_elements = std::uint64_t{1} << 32;
};
constexpr ASHL_HOST_DEVICE std::uint64_t randomk_payload_bytes(std::uint64_t k, std::uint64_t value_bytes) noexcept {
  return randomk::header_bytes + k * value_bytes;
}

// ---- dense (identity, fp16, bf16): no header -------------------------------

constexpr ASHL_HOST_DEVICE std::uint64_t identity_payload_bytes(std::uint64_t n, std::uint64_t value_bytes) noexcept {
  return n * value_bytes;
}
// fp16 and bf16 carry 2 bytes per element whatever the input dtype.
constexpr ASHL_HOST_DEVICE std::uint64_t cast_payload_bytes(std::uint64_t n) noexcept { return 2 * n; }

// The formulas pinned against docs/wire-format.md's examples.
static_assert(qsgd_code_bits(127) == 8 && qsgd_code_bits(1) == 2 && qsgd_code_bits(32767) == 16);
static_assert(qsgd_payload_bytes(1000, 512, 127) == 16 + 4 * 2 + 1000);
static_assert(terngrad_payload_bytes(5, 4) == 12 + 8 + 2);
static_assert(sign_payload_bytes(9, 512) == 12 + 4 + 2);
static_assert(sparse_payload_bytes(3, 2) == 12 + 18);
static_assert(randomk_payload_bytes(2, 4) == 29);
static_assert(block_payload_bytes(100, 64, 4) == 16 + 8 + 50 && block_payload_bytes(9, 8, 2) == 16 + 8 + 3);
static_assert(block_max_code(8) == 127 && block_max_code(4) == 7 && block_max_code(2) == 1);

}  // namespace compress::layout
ASHL_NAMESPACE_END
