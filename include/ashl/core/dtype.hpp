// ashl/core/dtype.hpp — element types and host 16-bit float conversions.
//
//   ashl::half h = ashl::half::from_float(1.5f);     // round to nearest even
//   float f = h.to_float();
//   static_assert(ashl::dtype_of<ashl::bfloat16> == ashl::dtype::bf16);
//   std::size_t bytes = ashl::size_of(ashl::dtype::f16) * n;
//
// f32 <-> f16 and f32 <-> bf16 round to nearest, ties to even; NaN stays NaN
// (quiet, sign and top payload bits kept), overflow goes to +-inf, subnormals
// are produced and consumed exactly. The conversions are pure bit arithmetic,
// usable on host and device (ASHL_HOST_DEVICE). docs/design.md, core/.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/enum_table.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

ASHL_NAMESPACE_BEGIN

// The numeric values are part of the wire format (docs/wire-format.md): never
// renumber, only append.
enum class dtype : std::uint8_t { f32 = 0, f16 = 1, bf16 = 2, f64 = 3, i8 = 4, u8 = 5 };

constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::f16: return 2;
    case dtype::bf16: return 2;
    case dtype::f64: return 8;
    case dtype::i8: return 1;
    case dtype::u8: return 1;
  }
  return 0;
}

inline constexpr auto dtype_table = make_enum_table<dtype>("f32", "f16", "bf16", "f64", "i8", "u8");
static_assert(dtype_table.name(dtype::u8) == "u8", "dtype_table ends where dtype does");

constexpr std::string_view to_string(dtype t) noexcept { return dtype_table.name(t); }

inline constexpr int dtype_count = static_cast<int>(dtype_table.size());

constexpr std::optional<dtype> dtype_from_byte(std::uint8_t b) noexcept { return dtype_table.from_value(b); }
constexpr std::optional<dtype> dtype_from_string(std::string_view s) noexcept { return dtype_table.parse(s); }

constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16 || t == dtype::f64;
}

namespace detail {
ASHL_HOST_DEVICE std::uint32_t float_bits(float f) noexcept {
#if ASHL_CUDA_COMPILATION() && defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
ASHL_HOST_DEVICE float bits_float(std::uint32_t u) noexcept {
#if ASHL_CUDA_COMPILATION() && defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// IEEE binary32 -> binary16, round to nearest even.
ASHL_HOST_DEVICE std::uint16_t f32_to_f16_bits(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN
    if (absx == 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
    // NaN: keep the top mantissa bits, force quiet so it never becomes inf.
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((absx >> 13) & 0x3ffu));
  }
  if (absx >= 0x477ff000u)  // rounds to >= 65520 -> inf
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (absx < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (absx < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25: rounds to 0
    // value = m * 2^(e-150) with implicit bit; half subnormal unit is 2^-24.
    const std::uint32_t e = absx >> 23;
    const std::uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // 14..24 (e in 102..112)
    std::uint32_t q = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half_ulp = 1u << (shift - 1u);
    if (rem > half_ulp || (rem == half_ulp && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped bits.
  std::uint32_t h = ((absx - 0x38000000u) >> 13);
  const std::uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into inf: correct
  return static_cast<std::uint16_t>(sign | h);
}

ASHL_HOST_DEVICE float f16_bits_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  std::uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return bits_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    // Subnormal: normalise.
    std::uint32_t exp = 113;  // 127 - 14
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --exp;
    }
    m &= 0x3ffu;
    return bits_float(sign | (exp << 23) | (m << 13));
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

ASHL_HOST_DEVICE std::uint16_t f32_to_bf16_bits(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)  // NaN: quiet, keep sign and top payload
    return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  const std::uint32_t lsb = (x >> 16) & 1u;
  return static_cast<std::uint16_t>((x + 0x7fffu + lsb) >> 16);  // overflow -> inf is exact RNE
}

ASHL_HOST_DEVICE float bf16_bits_to_f32(std::uint16_t b) noexcept {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}
}  // namespace detail

// IEEE binary16 storage type. Arithmetic goes through float.
struct half {
  std::uint16_t bits;
  ASHL_HOST_DEVICE static half from_float(float f) noexcept { return half{detail::f32_to_f16_bits(f)}; }
  ASHL_HOST_DEVICE float to_float() const noexcept { return detail::f16_bits_to_f32(bits); }
  friend constexpr bool operator==(half a, half b) noexcept { return a.bits == b.bits; }
};

// bfloat16 storage type (the top half of a binary32).
struct bfloat16 {
  std::uint16_t bits;
  ASHL_HOST_DEVICE static bfloat16 from_float(float f) noexcept { return bfloat16{detail::f32_to_bf16_bits(f)}; }
  ASHL_HOST_DEVICE float to_float() const noexcept { return detail::bf16_bits_to_f32(bits); }
  friend constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept { return a.bits == b.bits; }
};

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);

template <class T> inline constexpr bool has_dtype = false;
template <> inline constexpr bool has_dtype<float> = true;
template <> inline constexpr bool has_dtype<half> = true;
template <> inline constexpr bool has_dtype<bfloat16> = true;
template <> inline constexpr bool has_dtype<double> = true;
template <> inline constexpr bool has_dtype<std::int8_t> = true;
template <> inline constexpr bool has_dtype<std::uint8_t> = true;

template <class T> inline constexpr dtype dtype_of = [] {
  static_assert(has_dtype<T>, "ashl::dtype_of: no dtype for this element type");
  return dtype::f32;
}();
template <> inline constexpr dtype dtype_of<float> = dtype::f32;
template <> inline constexpr dtype dtype_of<half> = dtype::f16;
template <> inline constexpr dtype dtype_of<bfloat16> = dtype::bf16;
template <> inline constexpr dtype dtype_of<double> = dtype::f64;
template <> inline constexpr dtype dtype_of<std::int8_t> = dtype::i8;
template <> inline constexpr dtype dtype_of<std::uint8_t> = dtype::u8;

// Uniform load/store through float for the gradient element types.
ASHL_HOST_DEVICE float to_float(float v) noexcept { return v; }
ASHL_HOST_DEVICE float to_float(half v) noexcept { return v.to_float(); }
ASHL_HOST_DEVICE float to_float(bfloat16 v) noexcept { return v.to_float(); }

template <class T> ASHL_HOST_DEVICE T from_float(float f) noexcept;
template <> ASHL_HOST_DEVICE float from_float<float>(float f) noexcept { return f; }
template <> ASHL_HOST_DEVICE half from_float<half>(float f) noexcept { return half::from_float(f); }
template <> ASHL_HOST_DEVICE bfloat16 from_float<bfloat16>(float f) noexcept { return bfloat16::from_float(f); }

// The gradient element types codecs accept.
template <class T>
concept gradient_element = std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

ASHL_NAMESPACE_END
