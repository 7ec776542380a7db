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
// ALGORITHMS.md §4; docs/wire-format.md, "Codec payloads / terngrad".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/detail/host_simd.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/detail/bucketed.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/compress/detail/elements.hpp>
#include <ashl/compress/detail/levels.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/wire/ids.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

struct terngrad_options {
  std::uint32_t bucket = 512;  // elements per scale, >= 1
};

class terngrad : public detail::bucketed_codec<terngrad, terngrad_options> {
 public:
  static constexpr codec_id id = codec_id::terngrad;
  static constexpr std::size_t header_bytes = layout::terngrad::header_bytes;  // n u64, bucket u32
  static constexpr detail::bucketed_format payload_format{
      "terngrad", header_bytes, layout::terngrad::code_bits, "ceil(n / 4)", "terngrad.n", "terngrad.bucket", ""};

  using bucketed_codec::bucketed_codec;

  template <gradient_element T>
  result<std::size_t> encode(host_view<const T> xv, std::span<std::byte> out, const codec_context& ctx) const {
    ASHL_TRY(validate());
    return detail::levels_payload_encode(payload_format, {xv.size(), opt_.bucket}, 1, detail::bucket_norm::max_abs,
                                         xv.data(), out, ctx, "has a non-finite max |x| (inf/NaN input)");
  }

  status decode_add(std::span<const std::byte> in, payload_info info, host_view<float> acc, float scale,
                    const codec_context&) const {
    return detail::levels_payload_decode_add(payload_format, 1, detail::bucket_norm::max_abs, in, info, acc, scale);
  }
};

static_assert(codec<terngrad>);

ASHL_DETAIL_COMPRESS_HOST_END
