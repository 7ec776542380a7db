// ashl/rules/reply_encoder.hpp — compressed pull replies, one rule for the
// server (server_core holds it), the simulator (through the same core) and
// the worker (apply_compressed_reply): low-bit or sparse replies with error
// feedback, so that a DiLoCo round's download is as small as its upload.
//
//   server_core_params p;  p.replies = {.codec = ashl::codec_id::block, .options = {.bits = 4}};
//   auto r = core.serve_reply(w, slot_body);       // r.compressed: send r.bytes of slot_body
//   ...                                            // else: the parameters, dense, wire flag `view`
//   // the worker: view += decode(payload) (apply_compressed_reply); its parameters = view
//
// The server keeps, per worker, the parameters as that worker holds them
// (its *view* V_w). The first reply to a worker (and the first after it
// joined again) is dense and sets V_w = W; every later one carries
// C(W − V_w), the codec's encoding of what the worker lacks, and both sides
// then add the decoded payload into their copy of V_w: V_w ← V_w + D(C(W − V_w)),
// the same f32 additions in the same order (compress::decode_add with scale
// 1), so the two views stay equal bit for bit. What the codec dropped stays
// in W − V_w and is sent by the next reply: error feedback without a
// residual buffer. A reply says which view it applies to (its version,
// header.sequence) and the worker refuses one that does not fit its own;
// a worker that lost its connection drops its views, and a (re)join makes
// the server forget V_w, so the reply after a reconnect is dense again.
// Memory: one copy of the shard per worker that pulled, on the server.
// docs/algorithms.md §6 "Low-bit pseudo-gradients"; docs/wire-format.md
// "pull_reply"; docs/ps.md "Compressed replies".
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/rules/commit_encoder.hpp>
#include <ashl/sync/events.hpp>
#include <ashl/wire/ids.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

using sync::worker_id;

// How a server compresses its pull replies (server_core_params::replies;
// ps::server_params.core.replies, sim::server_setup::replies, Python
// serve(reply_compression=...), ps_node --reply-codec). identity: every
// reply dense (the default). `ratio` is the kept share of the ratio codecs
// (topk, randomk, ...); fixed-rate codecs (block, qsgd, the casts) ignore it.
struct reply_compression {
  codec_id codec = codec_id::identity;
  codec_options options{};
  float ratio = 1.0f;
  friend constexpr bool operator==(const reply_compression&, const reply_compression&) = default;
};

// Errors name `prefix` + the field ("server.replies.codec", ...).
inline status check_reply_compression(const reply_compression& c, std::string_view prefix) {
  const std::string p(prefix);
  if (static_cast<unsigned>(c.codec) >= static_cast<unsigned>(codec_id_count))
    return make_error(errc::unsupported, p + "codec", static_cast<unsigned>(c.codec), "unknown codec id");
  if (!(c.ratio > 0.0f && c.ratio <= 1.0f)) return invalid_argument(p + "ratio", c.ratio, "must be in (0, 1]");
  if (c.codec == codec_id::identity && c.options != codec_options{})
    return invalid_argument(p + "options", "set", "identity (dense replies) takes no codec options");
  return check_codec_options(c.codec, c.options, p + "options.");
}

// The Philox stream of a reply's stochastic codec: the shard's tensor id
// with the top bit set, so that a reply never draws a commit's numbers.
inline constexpr std::uint32_t reply_stream_bit = 0x80000000u;

class reply_encoder {
 public:
  // `elements`: the shard's (0 in the simulator's timing mode); workers:
  // the views to expect (more are added as they pull).
  status configure(const reply_compression& c, std::size_t elements, std::uint32_t workers, std::uint64_t seed,
                   std::uint32_t tensor) {
    ASHL_TRY(check_reply_compression(c, "server.replies."));
    c_ = c;
    n_ = elements;
    seed_ = seed;
    tensor_ = tensor | reply_stream_bit;
    codec_ = detail::make_any_codec(c.codec, c.ratio, c.options);
    views_.clear();
    views_.resize(workers);
    if (compresses()) delta_.assign(n_, 0.0f);
    return {};
  }

  [[nodiscard]] bool compresses() const noexcept { return c_.codec != codec_id::identity; }
  [[nodiscard]] const reply_compression& config() const noexcept { return c_; }

  // The largest compressed reply of n elements (the shard's by default).
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n) const { return detail::max_encoded_bytes(codec_, n); }
  [[nodiscard]] std::size_t max_encoded_bytes() const { return max_encoded_bytes(n_); }

  struct served {
    bool compressed = false;      // false: the parameters go dense, and the worker keeps them as its view
    std::size_t bytes = 0;        // the payload's bytes (compressed: written at the front of `out`)
    std::uint64_t base = 0;       // compressed: the version of the view the payload applies to
    std::span<const float> view;  // the parameters the worker holds after it (empty in timing mode)
  };

  // Worker w's reply of `params` (version `version`), the payload of a
  // compressed one encoded into `out` (at least max_encoded_bytes()). A
  // worker without a view, or an encode that fails (a buffer too small),
  // gets the parameters dense and its view becomes them. Timing mode
  // (params empty): sizes only, of `timing_elements` elements.
  served serve(worker_id w, std::span<const float> params, std::uint64_t version, std::span<std::byte> out,
               std::size_t timing_elements = 0) {
    const bool timing = params.empty();
    const std::size_t n = timing ? timing_elements : params.size();
    if (!compresses()) return {.bytes = n * sizeof(float), .view = params};
    if (w >= views_.size()) views_.resize(std::size_t{w} + 1);
    view_state& v = views_[w];
    if (v.valid && timing) {
      const std::uint64_t base = v.version;
      v.version = version;
      return {.compressed = true, .bytes = max_encoded_bytes(n), .base = base};
    }
    if (v.valid && !timing && v.values.size() == n && delta_.size() == n) {
      const std::uint64_t base = v.version;
      auto used = encode_delta(params, v.values, out, version);
      if (used) {
        v.version = version;
        return {.compressed = true, .bytes = *used, .base = base, .view = v.values};
      }
    }
    // Dense: the worker's view becomes the parameters (allocated once per worker).
    v.valid = true;
    v.version = version;
    if (!timing) v.values.assign(params.begin(), params.end());
    return {.bytes = n * sizeof(float), .view = params};
  }

  // w joined (again), left or was evicted: its next reply is dense.
  void forget(worker_id w) noexcept {
    if (w < views_.size()) views_[w].valid = false;
  }
  [[nodiscard]] bool holds_view(worker_id w) const noexcept { return w < views_.size() && views_[w].valid; }

 private:
  struct view_state {
    std::vector<float> values;
    std::uint64_t version = 0;
    bool valid = false;
  };

  // out ← C(params − view); view ← view + D(out) (the worker's addition).
  result<std::size_t> encode_delta(std::span<const float> params, std::vector<float>& view, std::span<std::byte> out,
                                   std::uint64_t version) {
    const std::size_t n = params.size();
    for (std::size_t i = 0; i < n; ++i) delta_[i] = params[i] - view[i];
    return std::visit(
        [&](const auto& c) -> result<std::size_t> {
          using C = std::decay_t<decltype(c)>;
          if constexpr (std::is_same_v<C, std::monostate>) {
            return make_error(errc::internal, "server.replies.codec", to_string(c_.codec), "no codec");
          } else {
            const std::size_t sb = c.scratch_bytes(n, dtype::f32);
            if (scratch_.size() < sb) scratch_.resize(sb);
            const compress::codec_context ctx{.seed = seed_, .step = version, .tensor = tensor_,
                                              .scratch = std::span<std::byte>(scratch_.data(), sb)};
            auto used = c.encode(host_view<const float>(delta_.data(), n), out, ctx);
            if (!used) return used.error();
            ASHL_TRY(apply_compressed_reply(c_.codec, out.first(*used), view, seed_, version, tensor_));
            return *used;
          }
        },
        codec_);
  }

 public:
  // The worker's side, and the server's own copy of it: view ← view +
  // D(payload), compress::decode_add with scale 1 (the one addition both
  // make), with the context the encode drew from (seed: the servers'
  // server_core_params::seed; version: the reply's, header.clock; tensor:
  // the shard's id | reply_stream_bit). On an error the view is not to be
  // used again (a decoder may have added part of a payload before it found
  // the fault).
  static status apply_compressed_reply(codec_id codec, std::span<const std::byte> payload, std::span<float> view,
                                       std::uint64_t seed, std::uint64_t version, std::uint32_t tensor) {
    return compress::decode_add(codec, payload, {view.size(), dtype::f32}, host_view<float>(view.data(), view.size()),
                                1.0f, compress::codec_context{.seed = seed, .step = version, .tensor = tensor});
  }

 private:
  reply_compression c_{};
  std::size_t n_ = 0;
  std::uint64_t seed_ = 0;
  std::uint32_t tensor_ = reply_stream_bit;
  detail::any_codec codec_{};
  std::vector<view_state> views_;
  std::vector<float> delta_;
  std::vector<std::byte> scratch_;
};

}  // namespace ps
ASHL_NAMESPACE_END
