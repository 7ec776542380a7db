// ashl/core/philox.hpp — Philox4x32-10 counter-based generator, host and device.
//
//   ashl::philox4x32 g(/*key*/ {seed_lo, seed_hi});
//   auto r = g({element_block, tensor_id, step_lo, step_hi});   // four 32-bit words
//   float u = ashl::uniform01(r[0]);                             // [0, 1)
//
// Stateless: the output is a pure function of (key, counter), so the CPU and
// a CUDA thread that ask for the same counter get the same bits. Codecs map
// (seed, step, tensor, element block) onto (key, counter) with
// philox_stream (below); docs/algorithms.md §4. Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3" (SC'11); known-answer vectors from Random123.
#pragma once

#include <ashl/config.hpp>

#include <cstdint>

ASHL_NAMESPACE_BEGIN

struct philox_key {
  std::uint32_t k0, k1;
};
struct philox_counter {
  std::uint32_t c0, c1, c2, c3;
};
struct philox_block {
  std::uint32_t v[4];
  ASHL_HOST_DEVICE constexpr std::uint32_t operator[](int i) const noexcept { return v[i]; }
  friend constexpr bool operator==(const philox_block& a, const philox_block& b) noexcept {
    return a.v[0] == b.v[0] && a.v[1] == b.v[1] && a.v[2] == b.v[2] && a.v[3] == b.v[3];
  }
};

namespace detail {
ASHL_HOST_DEVICE constexpr void mulhilo32(std::uint32_t a, std::uint32_t b, std::uint32_t& hi,
                                          std::uint32_t& lo) noexcept {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}
}  // namespace detail

class philox4x32 {
 public:
  static constexpr int rounds = 10;
  static constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  static constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;

  ASHL_HOST_DEVICE constexpr explicit philox4x32(philox_key k) noexcept : key_(k) {}

  ASHL_HOST_DEVICE constexpr philox_block operator()(philox_counter c) const noexcept {
    std::uint32_t x0 = c.c0, x1 = c.c1, x2 = c.c2, x3 = c.c3;
    std::uint32_t k0 = key_.k0, k1 = key_.k1;
    for (int r = 0; r < rounds; ++r) {
      std::uint32_t hi0, lo0, hi1, lo1;
      detail::mulhilo32(m0, x0, hi0, lo0);
      detail::mulhilo32(m1, x2, hi1, lo1);
      const std::uint32_t y0 = hi1 ^ x1 ^ k0;
      const std::uint32_t y1 = lo1;
      const std::uint32_t y2 = hi0 ^ x3 ^ k1;
      const std::uint32_t y3 = lo0;
      x0 = y0; x1 = y1; x2 = y2; x3 = y3;
      if (r + 1 < rounds) {
        k0 += w0;
        k1 += w1;
      }
    }
    return philox_block{{x0, x1, x2, x3}};
  }

 private:
  philox_key key_;
};

// 24 random bits to a float in [0, 1); exact, identical on host and device.
ASHL_HOST_DEVICE constexpr float uniform01(std::uint32_t r) noexcept {
  return static_cast<float>(r >> 8) * (1.0f / 16777216.0f);
}

// The stream a stochastic codec draws from for one (seed, step, tensor).
// This mapping is part of the payload contract (CPU and GPU codecs must agree;
// docs/wire-format.md, "Random streams"):
//   key     = (seed low 32 bits, seed high 32 bits XOR step high 32 bits)
//   counter = (block low 32 bits, tensor, step low 32 bits,
//              lane << 16 | block bits 32..47)
// where element i uses word i % 4 of block i / 4. Lanes (0..65535) give
// independent streams for codecs that need several draws per element.
class philox_stream {
 public:
  ASHL_HOST_DEVICE constexpr philox_stream(std::uint64_t seed, std::uint64_t step, std::uint32_t tensor) noexcept
      : gen_(philox_key{static_cast<std::uint32_t>(seed),
                        static_cast<std::uint32_t>(seed >> 32) ^ static_cast<std::uint32_t>(step >> 32)}),
        step_lo_(static_cast<std::uint32_t>(step)),
        tensor_(tensor) {}

  // Four words for element block `block` (elements 4*block .. 4*block+3).
  ASHL_HOST_DEVICE constexpr philox_block block(std::uint64_t block, std::uint32_t lane = 0) const noexcept {
    return gen_(philox_counter{static_cast<std::uint32_t>(block), tensor_, step_lo_,
                               (lane << 16) | (static_cast<std::uint32_t>(block >> 32) & 0xffffu)});
  }
  ASHL_HOST_DEVICE constexpr std::uint32_t word(std::uint64_t i, std::uint32_t lane = 0) const noexcept {
    return block(i >> 2, lane)[static_cast<int>(i & 3u)];
  }
  ASHL_HOST_DEVICE constexpr float uniform(std::uint64_t i, std::uint32_t lane = 0) const noexcept {
    return uniform01(word(i, lane));
  }

 private:
  philox4x32 gen_;
  std::uint32_t step_lo_, tensor_;
};

ASHL_NAMESPACE_END
