// ashl/compress/registry.hpp — type-erased decode by codec id.
//
//   ashl::status s = ashl::compress::decode_add(header.codec, payload,
//                                               {header.element_count, header.dtype}, acc, eta, ctx);
//
// A server learns the codec from the message header; this dispatches to a
// default-constructed codec of that id (payloads are self-describing, so the
// sender's configuration is not needed). Ids this build has no codec for are
// `unsupported`. DESIGN.md "Codec"; docs/wire-format.md, "Codec payloads".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cast.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/natural.hpp>
#include <ashl/compress/qsgd.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/sign.hpp>
#include <ashl/compress/terngrad.hpp>
#include <ashl/compress/threshold.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/compress/topk_sampled.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/wire/ids.hpp>

#include <cstddef>
#include <span>

ASHL_NAMESPACE_BEGIN
namespace compress {

inline status decode_add(codec_id id, std::span<const std::byte> payload, payload_info info, host_view<float> acc,
                         float scale, const codec_context& ctx) {
  switch (id) {
    case codec_id::identity: return identity{}.decode_add(payload, info, acc, scale, ctx);
    case codec_id::fp16: return fp16{}.decode_add(payload, info, acc, scale, ctx);
    case codec_id::bf16: return bf16{}.decode_add(payload, info, acc, scale, ctx);
    case codec_id::topk: return topk{}.decode_add(payload, info, acc, scale, ctx);
    case codec_id::topk_sampled: return topk_sampled{}.decode_add(payload, info, acc, scale, ctx);
    case codec_id::randomk: return randomk{}.decode_add(payload, info, acc, scale, ctx);
    case codec_id::threshold: return threshold{}.decode_add(payload, info, acc, scale, ctx);
    case codec_id::qsgd: return qsgd{}.decode_add(payload, info, acc, scale, ctx);
    case codec_id::terngrad: return terngrad{}.decode_add(payload, info, acc, scale, ctx);
    case codec_id::sign: return sign{}.decode_add(payload, info, acc, scale, ctx);
    case codec_id::natural: return natural{}.decode_add(payload, info, acc, scale, ctx);
    default: break;
  }
  return make_error(errc::unsupported, "codec", to_string(id), "no CPU decoder for this codec in this build");
}

}  // namespace compress
ASHL_NAMESPACE_END
