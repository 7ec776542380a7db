// ashl/wire/ids.hpp — the numeric identifiers that appear on the wire.
//
//   ashl::codec_id c = ashl::codec_id::topk;
//   auto name = ashl::to_string(c);                 // "topk"
//   auto back = ashl::codec_id_from_string("qsgd"); // optional<codec_id>
//
// Values are part of the wire format (docs/wire-format.md): never renumber,
// only append, and bump wire::version when the meaning of one changes.
#pragma once

#include <ashl/config.hpp>

#include <cstdint>
#include <optional>
#include <string_view>

ASHL_NAMESPACE_BEGIN

enum class codec_id : std::uint8_t {
  identity = 0,
  fp16 = 1,
  bf16 = 2,
  topk = 3,          // exact top-k
  topk_sampled = 4,  // sampled-threshold top-k (DGC)
  randomk = 5,
  threshold = 6,
  qsgd = 7,
  terngrad = 8,
  sign = 9,          // scaled 1-bit sign
  natural = 10,      // natural compression
};
inline constexpr int codec_id_count = 11;

constexpr std::string_view to_string(codec_id c) noexcept {
  switch (c) {
    case codec_id::identity: return "identity";
    case codec_id::fp16: return "fp16";
    case codec_id::bf16: return "bf16";
    case codec_id::topk: return "topk";
    case codec_id::topk_sampled: return "topk_sampled";
    case codec_id::randomk: return "randomk";
    case codec_id::threshold: return "threshold";
    case codec_id::qsgd: return "qsgd";
    case codec_id::terngrad: return "terngrad";
    case codec_id::sign: return "sign";
    case codec_id::natural: return "natural";
  }
  return "?";
}

constexpr std::optional<codec_id> codec_id_from_byte(std::uint8_t b) noexcept {
  if (b < codec_id_count) return static_cast<codec_id>(b);
  return std::nullopt;
}

constexpr std::optional<codec_id> codec_id_from_string(std::string_view s) noexcept {
  for (int i = 0; i < codec_id_count; ++i)
    if (to_string(static_cast<codec_id>(i)) == s) return static_cast<codec_id>(i);
  return std::nullopt;
}

ASHL_NAMESPACE_END
