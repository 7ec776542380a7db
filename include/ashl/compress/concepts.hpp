// ashl/compress/concepts.hpp — the codec concept.
//
//   ashl::compress::topk c{0.01};                          // keep 1 %
//   std::vector<std::byte> buf(c.max_encoded_bytes(n, ashl::dtype::f32));
//   ashl::compress::codec_context ctx{.seed = 1, .step = t, .tensor = id};
//   auto used = c.encode(grad, buf, ctx);                  // result<size_t>
//   auto s = c.decode_add({buf.data(), *used}, {n, ashl::dtype::f32}, acc, 0.25f, ctx);
//
// A codec is a plain value type. It encodes a dense host view (f32, f16 or
// bf16) into a caller-given byte buffer and decodes a payload by *adding*
// `scale *` its values into a dense f32 accumulator, so a server aggregates
// without a dense temporary. A payload is self-describing: a default
// constructed codec of the same id decodes what any configuration of it
// encoded (a server does not know each worker's ratio). Stochastic codecs
// draw from philox_stream(ctx.seed, ctx.step, ctx.tensor). Stateful parts
// (residuals, velocity) live in decorators. docs/design.md "Codec";
// docs/algorithms.md §4; payload layouts in docs/wire-format.md.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/wire/ids.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

ASHL_NAMESPACE_BEGIN
namespace compress {

// Opt-in tag: `using codec_concept = ashl::compress::codec_tag;`
struct codec_tag {};

struct codec_context {
  std::uint64_t seed = 0;
  std::uint64_t step = 0;
  std::uint32_t tensor = 0;
  // Caller-provided scratch of at least scratch_bytes(n, dtype) bytes, so the
  // hot path never allocates.
  std::span<std::byte> scratch{};
};

// What the wire header says about a payload: element count and input dtype.
struct payload_info {
  std::size_t count = 0;
  dtype type = dtype::f32;
};

template <class C>
concept codec = requires(const C& c, std::size_t n, dtype t, host_view<const float> f32,
                         host_view<const half> f16, host_view<const bfloat16> bf16, std::span<std::byte> out,
                         std::span<const std::byte> in, payload_info info, host_view<float> acc, float scale,
                         const codec_context& ctx) {
  requires std::same_as<typename C::codec_concept, codec_tag>;
  { C::id } -> std::convertible_to<codec_id>;
  { c.max_encoded_bytes(n, t) } -> std::same_as<std::size_t>;
  { c.scratch_bytes(n, t) } -> std::same_as<std::size_t>;
  { c.encode(f32, out, ctx) } -> std::same_as<result<std::size_t>>;
  { c.encode(f16, out, ctx) } -> std::same_as<result<std::size_t>>;
  { c.encode(bf16, out, ctx) } -> std::same_as<result<std::size_t>>;
  { c.decode_add(in, info, acc, scale, ctx) } -> std::same_as<status>;
};

// Opt-in tag of a stateful codec: `using codec_concept = ashl::compress::stateful_codec_tag;`
struct stateful_codec_tag {};

// A stateful codec is a decorator (error_feedback, dgc) that keeps per-tensor
// state across steps (residuals, velocity), so its encode is non-const. It
// wraps a stateless `inner_codec`, and its payloads are the inner codec's:
// decode_add is const and a server decodes them with the inner codec (or the
// registry) by the inner id.
template <class C>
concept stateful_codec = requires(C& c, const C& cc, std::size_t n, dtype t, host_view<const float> f32,
                                  host_view<const half> f16, host_view<const bfloat16> bf16,
                                  std::span<std::byte> out, std::span<const std::byte> in, payload_info info,
                                  host_view<float> acc, float scale, const codec_context& ctx) {
  requires std::same_as<typename C::codec_concept, stateful_codec_tag>;
  requires codec<typename C::inner_codec>;
  { C::id } -> std::convertible_to<codec_id>;
  { cc.max_encoded_bytes(n, t) } -> std::same_as<std::size_t>;
  { cc.scratch_bytes(n, t) } -> std::same_as<std::size_t>;
  { c.encode(f32, out, ctx) } -> std::same_as<result<std::size_t>>;
  { c.encode(f16, out, ctx) } -> std::same_as<result<std::size_t>>;
  { c.encode(bf16, out, ctx) } -> std::same_as<result<std::size_t>>;
  { cc.decode_add(in, info, acc, scale, ctx) } -> std::same_as<status>;
};

}  // namespace compress
ASHL_NAMESPACE_END
