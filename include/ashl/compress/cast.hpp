// ashl/compress/cast.hpp — 16-bit casts: fp16 (IEEE binary16) and bf16.
//
//   ashl::compress::fp16 c;                       // or fp16{{.strict = true}}
//   std::vector<std::byte> buf(c.max_encoded_bytes(n, ashl::dtype::f32));   // 2 n
//   auto used = c.encode(ashl::host_view<const float>(g.data(), n), buf, {});
//   if (!used) ...          // strict: "fp16.input[17] = 70000: overflows to inf"
//
// Round to nearest, ties to even, with the exact bits of core/dtype.hpp. A
// 16-bit input of the codec's own type is copied bit for bit (lossless); the
// other 16-bit type goes through f32 (exact) and is rounded once. In strict
// mode a finite input that would round to +-inf is an error naming the first
// such index and its value; inf and NaN inputs are carried as they are.
// Payload: n u16 bit patterns, little-endian, nothing else. The conversion
// loops are branch free, so they vectorize at -O2/-O3 without -march; on x86
// with F16C (detected at run time) fp16 uses vcvtps2ph / vcvtph2ps, same bits.
// docs/algorithms.md §4; docs/wire-format.md, "Codec payloads / fp16, bf16".
#pragma once

#include <ashl/compress/detail/codec.hpp>

#include <bit>
#include <cmath>
#include <type_traits>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

struct cast_options {
  bool strict = false;  // a finite value that overflows to +-inf is an error
};

namespace detail {

template <bool ToHalf, class T>
result<std::size_t> cast_encode(const char* name, host_view<const T> x, std::span<std::byte> out, bool strict) {
  const std::size_t n = x.size();
  if (out.size() < 2 * n)
    return make_error(errc::buffer_too_small, std::string(name) + ".out.size", out.size(),
                      "bytes, fewer than max_encoded_bytes = " + std::to_string(2 * n));
  constexpr bool own = ToHalf ? std::is_same_v<T, half> : std::is_same_v<T, bfloat16>;
  if constexpr (own) {
    store_array_le(out.data(), x.data(), n);  // already the target format: bit for bit
    return 2 * n;
  } else if constexpr (std::is_same_v<T, float>) {
    const bool overflow = convert_f32_to_16<ToHalf>(x.data(), out.data(), n);
    if (strict && overflow) {
      for (std::size_t i = 0; i < n; ++i) {
        const float f = x[i];
        const float back = ToHalf ? f16_to_f32(f32_to_f16_rne(f)) : bf16_to_f32(f32_to_bf16_rne(f));
        if (std::isfinite(f) && std::isinf(back))
          return out_of_range(std::string(name) + ".input[" + std::to_string(i) + "]", f,
                              ToHalf ? "overflows fp16 to inf (|x| >= 65520)" : "overflows bf16 to inf");
      }
    }
    return 2 * n;
  } else {
    // The other 16-bit type: widen exactly to f32 in blocks, then round once
    // (f16 to bf16 in registers where F16C runs).
    constexpr std::size_t block = 1024;
    float tmp[block];
    bool overflow = false;
    std::size_t done = 0;
#if ASHL_DETAIL_F16C_X86
    if constexpr (!ToHalf && std::is_same_v<T, half> && std::endian::native == std::endian::little)
      if (cpu_has_avx2_f16c()) done = f16_to_bf16_f16c(reinterpret_cast<const std::byte*>(x.data()), out.data(), n);
#endif
    for (std::size_t b = done; b < n; b += block) {
      const std::size_t m = n - b < block ? n - b : block;
      widen_16_to_f32(x.data() + b, m, tmp);
      overflow |= convert_f32_to_16<ToHalf>(tmp, out.data() + 2 * b, m);
    }
    if (strict && overflow) {
      for (std::size_t i = 0; i < n; ++i) {
        const float f = to_float(x[i]);
        const float back = ToHalf ? f16_to_f32(f32_to_f16_rne(f)) : bf16_to_f32(f32_to_bf16_rne(f));
        if (std::isfinite(f) && std::isinf(back))
          return out_of_range(std::string(name) + ".input[" + std::to_string(i) + "]", f,
                              ToHalf ? "overflows fp16 to inf (|x| >= 65520)" : "overflows bf16 to inf");
      }
    }
    return 2 * n;
  }
}

inline status cast_decode(const char* name, bool half_payload, std::span<const std::byte> in, payload_info info,
                          host_view<float> acc, float scale) {
  ASHL_TRY(check_decode_args(name, info.type, info.count, acc.size(), scale));
  if (in.size() != 2 * info.count)
    return malformed(std::string(name) + ".payload_bytes", in.size(),
                     "must be 2 * count = " + std::to_string(2 * info.count));
  add_dense(in.data(), half_payload ? dtype::f16 : dtype::bf16, acc.data(), info.count, scale);
  return {};
}

// The two casts differ only in the 16-bit format: Half picks binary16
// (fp16) or bfloat16 (bf16).
template <bool Half>
class cast_codec : public codec_base<Half ? codec_id::fp16 : codec_id::bf16> {
  static constexpr const char* name = Half ? "fp16" : "bf16";

 public:
  cast_codec() = default;
  explicit cast_codec(cast_options o) : opt_(o) {}
  [[nodiscard]] const cast_options& options() const noexcept { return opt_; }

  // Exactly 2 n, whatever the input dtype.
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n, dtype) const noexcept { return 2 * n; }
  [[nodiscard]] std::size_t scratch_bytes(std::size_t, dtype) const noexcept { return 0; }

  template <gradient_element T>
  result<std::size_t> encode(host_view<const T> x, std::span<std::byte> out, const codec_context&) const {
    return cast_encode<Half>(name, x, out, opt_.strict);
  }
  status decode_add(std::span<const std::byte> in, payload_info info, host_view<float> acc, float scale,
                    const codec_context&) const {
    return cast_decode(name, Half, in, info, acc, scale);
  }

 private:
  cast_options opt_{};
};

}  // namespace detail

// IEEE binary16 cast.
class fp16 : public detail::cast_codec<true> {
 public:
  using cast_codec::cast_codec;
};

// bfloat16 cast (the top half of binary32, rounded to nearest even).
class bf16 : public detail::cast_codec<false> {
 public:
  using cast_codec::cast_codec;
};

static_assert(codec<fp16>);
static_assert(codec<bf16>);

ASHL_DETAIL_COMPRESS_HOST_END
