// ashl/compress/qsgd.hpp — QSGD: per-bucket L2 norm, sign and s stochastic levels.
//
//   ashl::compress::qsgd c{{.levels = 15, .bucket = 512}};     // 5 bits per element
//   std::vector<std::byte> buf(c.max_encoded_bytes(n, ashl::dtype::f32));
//   auto used = c.encode(ashl::host_view<const float>(g.data(), n), buf, ctx);
//   ashl::compress::qsgd{}.decode_add({buf.data(), *used}, {n, ashl::dtype::f32}, acc, 1.0f, ctx);
//
// Alistarh et al., "QSGD" (NeurIPS'17). Each bucket of B elements sends its
// f32 L2 norm; element i is sent as a level l in [0, s] drawn so that
// E[l] = |x_i| s / norm (stochastic rounding from philox_stream(ctx.seed,
// ctx.step, ctx.tensor), word i % 4 of block i / 4), so E[decode] = x. Codes
// are l << 1 | sign in bits = 1 + bit_width(s) bits, packed LSB-first
// (detail/levels.hpp). Payload: u64 n, u32 bucket, u32 levels, ceil(n / B)
// f32 norms, ceil(n * bits / 8) code bytes;
// max_encoded_bytes(n, t) = 16 + 4 ceil(n / B) + ceil(n (1 + bit_width(s)) / 8),
// whatever t, and every payload has exactly that size.
// docs/algorithms.md §4; docs/wire-format.md, "Codec payloads / qsgd".
#pragma once

#include <ashl/compress/detail/codec.hpp>
#include <ashl/compress/detail/bucketed.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/compress/detail/levels.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/philox.hpp>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

struct qsgd_options {
  std::uint32_t levels = 127;  // s >= 1; 127 gives 8 bits per element
  std::uint32_t bucket = 512;  // elements per norm, >= 1
};

class qsgd : public detail::levels_codec<qsgd_options, codec_id::qsgd, detail::bucket_norm::l2> {
 public:
  static constexpr std::uint32_t max_levels = layout::qsgd::max_levels;  // codes fit in 16 bits

  using levels_codec::levels_codec;
};

static_assert(codec<qsgd>);

ASHL_DETAIL_COMPRESS_HOST_END
