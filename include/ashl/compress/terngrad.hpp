// ashl/compress/terngrad.hpp — TernGrad: per-bucket scale max|x|, ternary 2-bit codes.
//
//   ashl::compress::terngrad c{{.bucket = 512}};
//   std::vector<std::byte> buf(c.max_encoded_bytes(n, ashl::dtype::f32));
//   auto used = c.encode(ashl::host_view<const float>(g.data(), n), buf, ctx);
//   ashl::compress::terngrad{}.decode_add({buf.data(), *used}, {n, ashl::dtype::f32}, acc, 1.0f, ctx);
//
// Wen et al., "TernGrad" (NeurIPS'17). Each bucket sends s = max |x| (f32);
// element i becomes sign(x_i) s with probability |x_i| / s and 0 otherwise
// (u_i from philox_stream(ctx.seed, ctx.step, ctx.tensor), word i % 4 of
// block i / 4), so E[decode] = x. This is the one-level case of
// detail/levels.hpp with the max norm: 2-bit codes 0 (zero), 2 (+s), 3 (-s);
// code 1 is invalid; four codes per byte, LSB-first. Payload: u64 n,
// u32 bucket, ceil(n / B) f32 scales, ceil(n / 4) code bytes;
// max_encoded_bytes(n, t) = 12 + 4 ceil(n / B) + ceil(n / 4), whatever t,
// and every payload has exactly that size.
// docs/algorithms.md §4; docs/wire-format.md, "Codec payloads / terngrad".
#pragma once

#include <ashl/compress/detail/codec.hpp>
#include <ashl/compress/detail/bucketed.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/compress/detail/levels.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/philox.hpp>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

using terngrad_options = detail::bucket_options;

class terngrad : public detail::levels_codec<terngrad_options, codec_id::terngrad, detail::bucket_norm::max_abs> {
 public:
  using levels_codec::levels_codec;
};

static_assert(codec<terngrad>);

ASHL_DETAIL_COMPRESS_HOST_END
