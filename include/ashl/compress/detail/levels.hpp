// ashl/compress/detail/levels.hpp — bucketed stochastic level quantization
// shared by qsgd and terngrad, plus the small bit-stream helpers they and
// sign use.
//
//   detail::level_spec spec{.bucket = 512, .levels = 4, .norm = detail::bucket_norm::l2};
//   detail::levels_encode(x, n, spec, rng, norms_out, codes_out);   // after validating spec
//   ASHL_TRY(detail::levels_validate("qsgd", spec, n, norms, codes)); // then
//   detail::levels_decode_add(spec, n, norms, codes, acc, scale);
//
// Element i of bucket b (elements [b B, min(n, (b+1) B))) with bucket scale
// s_b (L2 norm or max |x|) and L levels is sent as level l_i in [0, L] and a
// sign: with r = |x_i| * L / s_b, l_i = floor(r) + [u_i < r - floor(r)],
// u_i = uniform01(word i % 4 of philox block i / 4), so E[l_i] = r and the
// decode s_b * l_i / L * sign is unbiased. Code = l_i << 1 | sign, sign set
// only when l_i > 0 (canonical), packed LSB-first into a continuous bit
// stream of `bits` per element; the final byte's unused bits are 0.
// ALGORITHMS.md §4 (QSGD, TernGrad); docs/wire-format.md, "Codec payloads".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/detail/elements.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/status.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

ASHL_NAMESPACE_BEGIN
namespace compress::detail {

// Largest element count the bucketed codecs accept (keeps n * bits in 64 bits).
inline constexpr std::uint64_t bucketed_max_elements = std::uint64_t{1} << 48;

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

// LSB-first bit stream writer over a caller-sized buffer (no bounds checks:
// callers size the buffer with packed_bytes first).
class bit_sink {
 public:
  explicit bit_sink(std::byte* out) noexcept : out_(out) {}
  void put(std::uint32_t code, unsigned bits) noexcept {
    acc_ |= static_cast<std::uint64_t>(code) << fill_;
    fill_ += bits;
    if (fill_ >= 32) {
      store_le<std::uint32_t>(out_, static_cast<std::uint32_t>(acc_));
      out_ += 4;
      acc_ >>= 32;
      fill_ -= 32;
    }
  }
  void finish() noexcept {
    for (; fill_ > 0; fill_ = fill_ > 8 ? fill_ - 8 : 0, acc_ >>= 8) *out_++ = static_cast<std::byte>(acc_ & 0xffu);
  }

 private:
  std::byte* out_;
  std::uint64_t acc_ = 0;
  unsigned fill_ = 0;
};

class bit_source {
 public:
  bit_source(const std::byte* in, std::uint64_t bytes) noexcept : in_(in), left_(bytes) {}
  std::uint32_t get(unsigned bits) noexcept {
    while (fill_ < bits) {
      const std::uint64_t b = left_ ? static_cast<std::uint64_t>(*in_++) : 0;
      left_ -= left_ ? 1 : 0;
      acc_ |= b << fill_;
      fill_ += 8;
    }
    const std::uint32_t v = static_cast<std::uint32_t>(acc_ & ((std::uint64_t{1} << bits) - 1));
    acc_ >>= bits;
    fill_ -= bits;
    return v;
  }
  // The bits left in the partially consumed byte (padding after the last code).
  [[nodiscard]] std::uint64_t rest() const noexcept { return acc_; }

 private:
  const std::byte* in_;
  std::uint64_t left_;
  std::uint64_t acc_ = 0;
  unsigned fill_ = 0;
};

enum class bucket_norm { l2, max_abs };

struct level_spec {
  std::uint64_t bucket = 512;
  std::uint32_t levels = 1;
  bucket_norm norm = bucket_norm::l2;
  [[nodiscard]] unsigned bits() const noexcept { return 1u + static_cast<unsigned>(std::bit_width(levels)); }
};

// Writes bucket_count(n) f32 scales at `norms` and the packed codes at
// `codes`. Returns the index of a bucket whose scale is not finite, or n.
template <gradient_element T>
std::uint64_t levels_encode(const T* x, std::uint64_t n, const level_spec& spec, const philox_stream& rng,
                            std::byte* norms, std::byte* codes) noexcept {
  const unsigned bits = spec.bits();
  const float L = static_cast<float>(spec.levels);
  bit_sink sink(codes);
  const std::uint64_t nb = bucket_count(n, spec.bucket);
  for (std::uint64_t b = 0; b < nb; ++b) {
    const std::uint64_t lo = b * spec.bucket, hi = lo + spec.bucket < n ? lo + spec.bucket : n;
    double acc = 0.0;
    for (std::uint64_t i = lo; i < hi; ++i) {
      const double a = std::fabs(static_cast<double>(as_f32(x[i])));
      acc = spec.norm == bucket_norm::l2 ? acc + a * a : (a > acc || a != a ? a : acc);
    }
    const float s = static_cast<float>(spec.norm == bucket_norm::l2 ? std::sqrt(acc) : acc);
    if (!std::isfinite(s)) return b;
    store_le<float>(norms + 4 * b, s);
    const float k = s > 0.0f ? L / s : 0.0f;
    philox_block blk = rng.block(lo >> 2);
    for (std::uint64_t i = lo; i < hi; ++i) {
      if ((i & 3u) == 0) blk = rng.block(i >> 2);
      const float v = as_f32(x[i]);
      const float r = std::fabs(v) * k;
      const float f = std::floor(r);
      std::uint32_t l = static_cast<std::uint32_t>(f) + (uniform01(blk[static_cast<int>(i & 3u)]) < r - f ? 1u : 0u);
      l = l > spec.levels ? spec.levels : l;
      const std::uint32_t sign = (v < 0.0f && l != 0) ? 1u : 0u;
      sink.put(l << 1 | sign, bits);
    }
  }
  sink.finish();
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
  const unsigned bits = spec.bits();
  bit_source src(codes, packed_bytes(n, bits));
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint32_t c = src.get(bits);
    if ((c >> 1) > spec.levels || c == 1u)
      return malformed(std::string(codec) + ".code[" + std::to_string(i) + "]", c,
                       "level must be <= " + std::to_string(spec.levels) + " and a zero level has no sign");
  }
  if (src.rest() != 0) return malformed(std::string(codec) + ".padding", src.rest(), "unused bits must be 0");
  return {};
}

inline void levels_decode_add(const level_spec& spec, std::uint64_t n, const std::byte* norms, const std::byte* codes,
                              float* acc, float scale) noexcept {
  const unsigned bits = spec.bits();
  bit_source src(codes, packed_bytes(n, bits));
  const std::uint64_t nb = bucket_count(n, spec.bucket);
  for (std::uint64_t b = 0; b < nb; ++b) {
    const std::uint64_t lo = b * spec.bucket, hi = lo + spec.bucket < n ? lo + spec.bucket : n;
    const float unit = scale * (load_le<float>(norms + 4 * b) / static_cast<float>(spec.levels));
    for (std::uint64_t i = lo; i < hi; ++i) {
      const std::uint32_t c = src.get(bits);
      const float m = static_cast<float>(c >> 1) * unit;
      acc[i] += (c & 1u) ? -m : m;
    }
  }
}

}  // namespace compress::detail
ASHL_NAMESPACE_END
