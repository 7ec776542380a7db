// ashl/rules/commit_encoder.hpp — how a worker turns an update into what it
// commits, pure and shared by every driver: which codec a plan
// commits with (plan_codec, the server's choice sent in the plan_update)
// and with which codec options (plan_with_codec_options, codec_spec names
// such as "block4:128"), whether a plan_update's plan and codec go together
// (check_plan_codec),
// and the error-feedback rule, held once here for ps::worker and the
// simulator's hooks alike:
//
//   ashl::ps::commit_encoder enc({.error_feedback = true, .seed = 7});
//   enc.set(ashl::ps::plan_codec(plan, ashl::codec_id::topk), plan.compression_ratio, plan.compression_options());
//   if (enc.compresses()) {
//     auto payload = enc.encode(/*shard*/ 0, update, step);   // e <- e + x; send C(e); e <- e - C(e)
//   } else {
//     auto dense = enc.dense(0, update);   // update itself, or update + e when something is owed
//   }
//
// Residuals are per shard (the tensor id of the payload) and survive a
// change of codec or ratio: what compression dropped is owed whatever codec
// sends it. A dense commit pays the debt off: it sends x + e and clears e
// (the real worker once dropped the residual when its plan
// stopped compressing, while the simulator's hook sent it). Nothing is
// lost, and a worker that never compressed sends its caller's buffer
// itself (no copy). A shard's first encode (or a size change) allocates
// its buffers unless reserve() was called; after that, nothing allocates.
// docs/algorithms.md §4 (error feedback); docs/design.md "Data flow of one commit".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/error_feedback.hpp>
#include <ashl/compress/registry.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/wire/ids.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

// The codec a plan commits with: the servers' compression codec when the
// plan keeps less than everything (ratio < 1), identity otherwise. A codec
// of fixed rate (block, qsgd, terngrad, sign, natural, the casts) is turned
// on by any ratio < 1 and otherwise ignores the value.
[[nodiscard]] constexpr codec_id plan_codec(const worker_plan& plan, codec_id compression) noexcept {
  return plan.compression_ratio < 1.0f ? compression : codec_id::identity;
}

// Which codec options a codec takes (core/plan.hpp codec_options): the
// block codec both (bits 2, 4, 8; block a multiple of 8 in [8, 65536]),
// the bucketed quantizers qsgd, terngrad and sign a block (their bucket,
// >= 1), every other codec none.
[[nodiscard]] constexpr bool takes_codec_bits(codec_id id) noexcept { return id == codec_id::block; }
[[nodiscard]] constexpr bool takes_codec_block(codec_id id) noexcept {
  return id == codec_id::block || id == codec_id::qsgd || id == codec_id::terngrad || id == codec_id::sign;
}

// Options for codec `id`, each field named `<prefix>bits` / `<prefix>block`
// (0 is always the codec's default).
inline status check_codec_options(codec_id id, codec_options o, std::string_view prefix) {
  if (o.bits == 0 && o.block == 0) return {};  // no text built: commit_encoder::set allocates nothing
  if (o.bits == 0 || takes_codec_bits(id)) {
    const bool bits_ok = o.bits == 0 || compress::layout::block_bits_valid(o.bits);
    const bool block_ok = o.block == 0 || (takes_codec_block(id) &&
                                           (id != codec_id::block || compress::layout::block_size_valid(o.block)));
    if (bits_ok && block_ok) return {};
  }
  const std::string p(prefix);
  if (o.bits != 0) {
    if (!takes_codec_bits(id))
      return invalid_argument(p + "bits", o.bits, "codec " + std::string(to_string(id)) + " takes no bits (must be 0)");
    if (!compress::layout::block_bits_valid(o.bits)) return invalid_argument(p + "bits", o.bits, "must be 2, 4 or 8");
  }
  if (o.block != 0) {
    if (!takes_codec_block(id))
      return invalid_argument(p + "block", o.block,
                              "codec " + std::string(to_string(id)) + " takes no block (must be 0)");
    if (id == codec_id::block && !compress::layout::block_size_valid(o.block))
      return invalid_argument(p + "block", o.block, "must be a multiple of 8 in [8, 65536]");
  }
  return {};
}

// A plan_update's plan and codec: the plan's own rules (core/plan.hpp), a
// known codec, identity exactly when the plan keeps everything, and codec
// options the codec takes (plan_update.codec_bits, plan_update.codec_block).
inline status check_plan_codec(const worker_plan& plan, codec_id codec, std::string_view field = "plan_update") {
  ASHL_TRY(check_plan(plan, field));
  const auto id = static_cast<unsigned>(codec);
  const std::string f = std::string(field) + ".codec";
  if (id >= static_cast<unsigned>(codec_id_count)) return make_error(errc::unsupported, f, id, "unknown codec id");
  if (plan.compression_ratio < 1.0f && codec == codec_id::identity)
    return invalid_argument(f, to_string(codec),
                            "must compress: the plan's compression_ratio is " + std::to_string(plan.compression_ratio));
  if (plan.compression_ratio >= 1.0f && codec != codec_id::identity)
    return invalid_argument(f, to_string(codec), "must be identity: the plan's compression_ratio is 1");
  return check_codec_options(codec, plan.compression_options(), std::string(field) + ".codec_");
}

// The plan a server sends: a plan its policy left dense (ratio 1) made to
// compress at the server's `ratio` when that is below 1
// (server_params::compression_ratio: DiLoCo's low-bit pseudo-gradients under
// any policy, e.g. block4 for every commit), a compressing plan's codec
// options that the policy left 0 filled from the server's
// (server_params::compression_options), and a dense plan's cleared
// (identity takes none). The one rule of the real server, the simulator and
// the collectives.
[[nodiscard]] constexpr worker_plan plan_with_codec_options(worker_plan plan, codec_id compression,
                                                            codec_options server, float ratio = 1.0f) noexcept {
  if (!(plan.compression_ratio < 1.0f) && ratio < 1.0f && ratio > 0.0f) plan.compression_ratio = ratio;
  if (plan_codec(plan, compression) == codec_id::identity) {
    plan.codec_bits = 0;
    plan.codec_block = 0;
    return plan;
  }
  if (plan.codec_bits == 0) plan.codec_bits = server.bits;
  if (plan.codec_block == 0) plan.codec_block = server.block;
  return plan;
}

// A server's ratio for the plans its policy leaves dense (1: they stay
// dense; plan_with_codec_options): in (0, 1], with a compressing codec when
// below 1. Errors name `field`.
inline status check_compression_ratio(float ratio, codec_id compression, std::string_view field) {
  if (!(ratio > 0.0f && ratio <= 1.0f))
    return invalid_argument(field, ratio, "must be in (0, 1] (1: a plan the policy leaves dense stays dense)");
  if (ratio < 1.0f && compression == codec_id::identity)
    return invalid_argument(field, ratio, "must be 1 with compression identity (nothing would compress)");
  return {};
}

// A codec and its options, as a user names them (ps_node, the Python
// module's compression=): "<codec>[<bits>][:<block>]", the bits suffix
// only for the block codec. "block4" is block with 4 bits, "block8:128"
// 8 bits and B = 128, "block" the defaults (4 bits, B = 64), "qsgd:256"
// qsgd with buckets of 256, "topk" top-k. Errors name `field`.
struct codec_spec {
  codec_id id = codec_id::identity;
  codec_options options{};
  friend constexpr bool operator==(const codec_spec&, const codec_spec&) = default;
};

inline result<codec_spec> parse_codec_spec(std::string_view text, std::string_view field = "compression") {
  const std::string f(field);
  const auto colon = text.find(':');
  std::string_view name = text.substr(0, colon);
  codec_spec s;
  const auto number = [&](std::string_view digits, std::uint32_t& out) -> bool {
    if (digits.empty() || digits.size() > 9) return false;
    std::uint32_t v = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + static_cast<std::uint32_t>(c - '0');
    }
    out = v;
    return true;
  };
  if (name.size() > 5 && name.substr(0, 5) == "block") {
    if (!number(name.substr(5), s.options.bits))
      return invalid_argument(f, text, "unknown codec (the block codec is block, block8, block4 or block2)");
    name = "block";
  }
  const auto id = codec_id_from_string(name);
  if (!id) return invalid_argument(f, text, "unknown codec");
  s.id = *id;
  if (colon != std::string_view::npos && !number(text.substr(colon + 1), s.options.block))
    return invalid_argument(f, text, "the part after ':' must be a block size (elements)");
  if (colon != std::string_view::npos && s.options.block == 0)
    return invalid_argument(f, text, "the block size after ':' must be >= 1");
  ASHL_TRY(check_codec_options(s.id, s.options, f + "."));
  return s;
}

// The canonical name of a spec: the block codec with its defaults filled
// in ("block" and "block4" are "block4:64"), any other codec its name and,
// when set, ":<block>". parse_codec_spec(to_string(s)) gives s back with the
// block codec's defaults filled in.
inline std::string to_string(const codec_spec& s) {
  std::string r(to_string(s.id));
  if (s.id == codec_id::block) {
    const std::uint32_t bits = s.options.bits != 0 ? s.options.bits : compress::block_quant_options{}.bits;
    const std::uint32_t block = s.options.block != 0 ? s.options.block : compress::block_quant_options{}.block;
    return r + std::to_string(bits) + ":" + std::to_string(block);
  }
  if (s.options.block != 0) r += ":" + std::to_string(s.options.block);
  return r;
}

namespace detail {

// A codec of wire id `Id` at a plan's compression ratio (codecs without a
// ratio take none) and codec options (0: the codec's default; the options
// were checked with check_codec_options).
template <codec_id Id>
auto make_codec(double ratio, codec_options o = {}) {
  using C = compress::codec_for<Id>;
  if constexpr (std::is_constructible_v<C, double>) {
    return C{ratio};
  } else if constexpr (Id == codec_id::randomk) {
    return C{compress::randomk_options{.ratio = ratio}};
  } else if constexpr (Id == codec_id::block) {
    compress::block_quant_options bo;
    if (o.bits != 0) bo.bits = o.bits;
    if (o.block != 0) bo.block = o.block;
    return C{bo};
  } else if constexpr (Id == codec_id::qsgd) {
    compress::qsgd_options qo;
    if (o.block != 0) qo.bucket = o.block;
    return C{qo};
  } else if constexpr (Id == codec_id::terngrad || Id == codec_id::sign) {
    compress::sign_options bo;  // terngrad_options is the same bucket_options
    if (o.block != 0) bo.bucket = o.block;
    return C{bo};
  } else {
    return C{};
  }
}

template <class Seq>
struct codec_variant;
template <std::size_t... I>
struct codec_variant<std::index_sequence<I...>> {
  using type = std::variant<std::monostate, compress::codec_for<static_cast<codec_id>(I)>...>;
};
using any_codec = typename codec_variant<std::make_index_sequence<codec_id_count>>::type;

template <std::size_t I = 0>
any_codec make_any_codec(codec_id id, double ratio, codec_options o = {}) {
  if constexpr (I == codec_id_count) {
    return std::monostate{};
  } else {
    if (static_cast<std::size_t>(id) == I) return make_codec<static_cast<codec_id>(I)>(ratio, o);
    return make_any_codec<I + 1>(id, ratio, o);
  }
}

// The largest payload of n f32 elements under codec c (a monostate: n
// dense f32 values).
inline std::size_t max_encoded_bytes(const any_codec& c, std::size_t n) {
  return std::visit(
      [&](const auto& k) -> std::size_t {
        if constexpr (std::is_same_v<std::decay_t<decltype(k)>, std::monostate>) return n * sizeof(float);
        else return k.max_encoded_bytes(n, dtype::f32);
      },
      c);
}

}  // namespace detail

class commit_encoder {
 public:
  struct options {
    bool error_feedback = true;  // keep what compression dropped and send it later
    std::uint64_t seed = 0;      // Philox seed of the stochastic codecs (codec_context.seed)
  };

  commit_encoder() = default;
  explicit commit_encoder(options o) : o_(o) {}

  // The codec, ratio and codec options of the next commits (a plan's:
  // set(codec, plan.compression_ratio, plan.compression_options())).
  // Residuals are kept.
  status set(codec_id id, float ratio, codec_options o = {}) {
    if (static_cast<unsigned>(id) >= static_cast<unsigned>(codec_id_count))
      return make_error(errc::unsupported, "commit_encoder.codec", static_cast<unsigned>(id), "unknown codec id");
    if (!(ratio > 0.0f && ratio <= 1.0f))
      return invalid_argument("commit_encoder.ratio", ratio, "must be in (0, 1]");
    ASHL_TRY(check_codec_options(id, o, "commit_encoder.codec_"));
    if (id == id_ && ratio == ratio_ && o == options_ && codec_.index() != 0) return {};
    id_ = id;
    ratio_ = ratio;
    options_ = o;
    codec_ = detail::make_any_codec(id, ratio, o);
    return {};
  }

  [[nodiscard]] codec_id codec() const noexcept { return id_; }
  [[nodiscard]] float ratio() const noexcept { return ratio_; }
  [[nodiscard]] codec_options compression_options() const noexcept { return options_; }
  [[nodiscard]] bool compresses() const noexcept { return id_ != codec_id::identity; }
  [[nodiscard]] const options& config() const noexcept { return o_; }

  // The largest payload of an n-element shard under the codec in force.
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n) const { return detail::max_encoded_bytes(codec_, n); }

  // Sizes shard `shard`'s buffers for n elements now, so commits allocate nothing.
  void reserve(std::uint32_t shard, std::size_t n) {
    state& st = slot(shard, n);
    const std::size_t cap = max_encoded_bytes(n);
    if (st.payload.capacity() < cap) st.payload.reserve(cap);
    if (st.folded.capacity() < n) st.folded.reserve(n);
  }

  // Encodes shard `shard` (x, its elements) of an update at `step` (the
  // codec's Philox step) with the codec in force. With error feedback, the
  // decorator's step on this shard's residual (compress::error_feedback_step):
  // e <- e + x, payload = C(e), e <- e - C(e) (C as the decoder computes
  // it); on an error nothing was sent and e keeps e + x (all of it owed).
  // The payload stays valid until this shard's next encode.
  result<std::span<const std::byte>> encode(std::uint32_t shard, std::span<const float> x, std::uint64_t step) {
    if (!compresses())
      return invalid_argument("commit_encoder.codec", "identity", "does not encode: use dense()");
    state& st = slot(shard, x.size());
    return std::visit(
        [&](auto& c) -> result<std::span<const std::byte>> {
          using C = std::decay_t<decltype(c)>;
          if constexpr (std::is_same_v<C, std::monostate>) {
            return make_error(errc::internal, "commit_encoder.codec", to_string(id_), "no codec");
          } else {
            const std::size_t n = x.size();
            const std::size_t cap = c.max_encoded_bytes(n, dtype::f32);
            if (st.payload.size() < cap) st.payload.resize(cap);
            const std::size_t sb = c.scratch_bytes(n, dtype::f32);
            if (scratch_.size() < sb) scratch_.resize(sb);
            const compress::codec_context ctx{
                .seed = o_.seed, .step = step, .tensor = shard, .scratch = std::span<std::byte>(scratch_.data(), sb)};
            const std::span<std::byte> out(st.payload.data(), cap);
            if (!o_.error_feedback) {
              auto used = c.encode(host_view<const float>(x.data(), n), out, ctx);
              if (!used) return used.error();
              return std::span<const std::byte>(st.payload.data(), *used);
            }
            st.owed = true;
            auto used = compress::error_feedback_step(c, host_view<const float>(x.data(), n),
                                                      host_view<float>(st.residual.data(), n), out, ctx);
            if (!used) return used.error();
            return std::span<const std::byte>(st.payload.data(), *used);
          }
        },
        codec_);
  }

  // A dense commit of shard `shard`: x itself when nothing is owed (no
  // copy), else x + e in the encoder's buffer, and e is cleared (paid off).
  // The span stays valid until this shard's next call.
  std::span<const float> dense(std::uint32_t shard, std::span<const float> x) {
    if (shard >= shards_.size() || !shards_[shard].owed || shards_[shard].residual.size() != x.size()) return x;
    state& st = shards_[shard];
    if (st.folded.size() != x.size()) st.folded.resize(x.size());
    float* e = st.residual.data();
    for (std::size_t i = 0; i < x.size(); ++i) {
      st.folded[i] = x[i] + e[i];
      e[i] = 0.0f;
    }
    st.owed = false;
    return st.folded;
  }

  // What shard `shard` still owes (empty before its first compressed commit).
  [[nodiscard]] std::span<const float> residual(std::uint32_t shard) const noexcept {
    if (shard >= shards_.size()) return {};
    return shards_[shard].residual;
  }
  // Whether any shard owes anything (a dense commit would not be zero-copy).
  [[nodiscard]] bool owes() const noexcept {
    return std::any_of(shards_.begin(), shards_.end(), [](const state& s) { return s.owed; });
  }

  // Forgets every residual (a restarted worker owes nothing).
  void clear() noexcept {
    for (auto& s : shards_) {
      std::fill(s.residual.begin(), s.residual.end(), 0.0f);
      s.owed = false;
    }
  }

 private:
  struct state {
    std::vector<float> residual;    // e, what compression dropped and is still owed
    std::vector<float> folded;      // x + e of a dense commit that pays e off
    std::vector<std::byte> payload;
    bool owed = false;
  };

  state& slot(std::uint32_t shard, std::size_t n) {
    if (shard >= shards_.size()) shards_.resize(std::size_t{shard} + 1);
    state& st = shards_[shard];
    if (st.residual.size() != n) {  // a new shape starts with no debt
      st.residual.assign(n, 0.0f);
      st.owed = false;
    }
    return st;
  }

  options o_{};
  codec_id id_ = codec_id::identity;
  float ratio_ = 1.0f;
  codec_options options_{};
  detail::any_codec codec_{};
  std::vector<state> shards_;
  std::vector<std::byte> scratch_;
};

}  // namespace ps
ASHL_NAMESPACE_END
