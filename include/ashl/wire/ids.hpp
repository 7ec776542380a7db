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
#include <ashl/core/enum_table.hpp>

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
  block = 11,        // block-scaled 8/4/2-bit integers (compress/block.hpp)
};
inline constexpr auto codec_id_table =
    make_enum_table<codec_id>("identity", "fp16", "bf16", "topk", "topk_sampled", "randomk", "threshold", "qsgd",
                              "terngrad", "sign", "natural", "block");
static_assert(codec_id_table.name(codec_id::block) == "block", "codec_id_table ends where codec_id does");
inline constexpr int codec_id_count = static_cast<int>(codec_id_table.size());

constexpr std::string_view to_string(codec_id c) noexcept { return codec_id_table.name(c); }

constexpr std::optional<codec_id> codec_id_from_byte(std::uint8_t b) noexcept { return codec_id_table.from_value(b); }
constexpr std::optional<codec_id> codec_id_from_string(std::string_view s) noexcept {
  return codec_id_table.parse(s);
}

ASHL_NAMESPACE_END
