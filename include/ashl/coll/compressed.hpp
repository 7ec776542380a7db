// ashl/coll/compressed.hpp — how a synchronous step moves its buffer:
// the "exchanges" that coll/driver.hpp calls, and the
// iteration-time-model decision between compression and 16-bit dense.
//
//   ashl::coll::dense_exchange dense{ashl::dtype::bf16};           // native 16-bit allreduce
//   ashl::coll::payload_exchange<ashl::compress::error_feedback<ashl::compress::topk>> sparse{
//       ashl::compress::error_feedback<ashl::compress::topk>{ashl::compress::topk{0.01}}};
//   std::vector<double> w(c.size(), 1.0 / c.size());
//   ASHL_TRY(sparse(c, ashl::host_view<float>(g), w, step));      // g = Σ_j w_j · C(g_j + e_j)
//
//   auto e = ashl::coll::estimate_transfer({.elements = n, .ranks = 8, .link = link,
//                                           .payload_bytes = 0.08 * n, .codec = codec});
//   if (e.compress()) ...                                          // compressed beats 16-bit dense
//
// Every exchange computes x ← Σ_j w_j · x_j over the ranks j (weights from
// the synchronous policy: 1/M, or b_j/Σb for DLB), in place:
// - dense_exchange: scale by the own weight, cast to the wire dtype (f32,
//   f16 or bf16), one allreduce-sum in that dtype (MPI/NCCL reduce 16-bit
//   natively), cast back. f16/bf16 halve the bytes and round.
// - payload_exchange<Codec>: encode with the codec (a stateful codec such as
//   error_feedback keeps its residual), all-gather the payload sizes, then
//   the payloads (uneven all-gather of bytes), and decode-add each rank's
//   payload into the zeroed buffer with that rank's weight, in rank order,
//   so every rank computes bitwise the same sum. Sparse and quantized
//   codecs cannot be summed inside an allreduce; this is what
//   sparse-collective libraries do (all-gather, then add).
// - auto_exchange<Codec>: one of the two, chosen by estimate_transfer on
//   rank 0 and broadcast, so every rank takes the same path.
// - plan_exchange: each rank's plan decides (sync_driver hands it every
//   rank's plan before each exchange): a rank whose plan keeps less than
//   everything encodes with ps::commit_encoder, the codec ps::plan_codec
//   picks at the plan's ratio with error feedback, as a ps worker does; a
//   rank whose plan keeps everything sends x and pays its residual off. No
//   rank compressing: one weighted f32 allreduce; else the payload path
//   above, the dense ranks' payloads as identity ones (one
//   encoding rule for the parameter server, the simulator and collectives).
//
// estimate_transfer is the iteration-time model's link term (profile::
// link_model: α + bytes/β) applied to each collective's steps: a ring
// allreduce of 16-bit values takes 2(M−1) steps of 2n/M bytes; an all-gather
// of payloads M−1 steps of P bytes (the largest payload), plus the codec's
// measured time per bucket element. Compression is compared with 16-bit
// dense transfer, not 32-bit (docs/codecs.md; compression measured against dense 16-bit transfer).
// docs/algorithms.md §4 (the per-tensor switch); docs/coll.md.
#pragma once

#include <ashl/config.hpp>
#include <ashl/coll/concepts.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/profile/capability.hpp>
#include <ashl/rules/commit_encoder.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace coll {

namespace detail {
inline status check_weights(std::span<const double> w, rank_t size) {
  if (w.size() != static_cast<std::size_t>(size))
    return invalid_argument("exchange.weights.size", w.size(), "must equal the group size");
  return {};
}
// Every rank's payload of uneven size, gathered in rank order: the sizes
// first (8 bytes from every rank), then the payloads (an uneven all-gather of
// bytes). Buffers are kept, so steady-state calls allocate nothing.
class payload_gather {
 public:
  template <host_collective C>
  status operator()(C& c, std::span<const std::byte> mine) {
    const auto m = static_cast<std::size_t>(c.size());
    sizes_.assign(m, 0);
    const std::uint64_t bytes = mine.size();
    eight_.assign(m, 8);
    ASHL_TRY(all_gather_now(c, in_view<>(&bytes, 8, dtype::u8), out_view<>(sizes_.data(), 8 * m, dtype::u8), eight_));
    counts_.assign(sizes_.begin(), sizes_.end());
    displacements(counts_, displs_);
    gathered_.resize(displs_.back());
    return all_gather_now(c, in_view<>(mine.data(), mine.size(), dtype::u8),
                          out_view<>(gathered_.data(), gathered_.size(), dtype::u8), counts_);
  }
  // Rank j's payload from the last call.
  [[nodiscard]] std::span<const std::byte> of(std::size_t j) const noexcept {
    return {gathered_.data() + displs_[j], counts_[j]};
  }
  [[nodiscard]] std::size_t total_bytes() const noexcept { return gathered_.size(); }

 private:
  std::vector<std::byte> gathered_;
  std::vector<std::uint64_t> sizes_;
  std::vector<std::size_t> counts_, eight_, displs_;
};

}  // namespace detail

// ---------------------------------------------------------------- dense

class dense_exchange {
 public:
  dense_exchange() = default;
  explicit dense_exchange(dtype wire) : wire_(wire) {
    ASHL_ASSERT(wire == dtype::f32 || wire == dtype::f16 || wire == dtype::bf16, "dense_exchange: f32, f16 or bf16");
  }
  [[nodiscard]] dtype wire() const noexcept { return wire_; }

  template <host_collective C>
  status operator()(C& c, host_view<float> x, std::span<const double> weights, std::uint64_t /*step*/ = 0) {
    ASHL_TRY(detail::check_weights(weights, c.size()));
    const auto w = static_cast<float>(weights[static_cast<std::size_t>(c.rank())]);
    const std::size_t n = x.size();
    if (wire_ == dtype::f32) {
      if (w != 1.0f)
        for (auto& v : x) v *= w;
      return allreduce_now(c, in_view<>(x.data(), n, dtype::f32), out_view<>(x.data(), n, dtype::f32), reduce_op::sum);
    }
    wire_buf_.resize(n * 2);
    if (wire_ == dtype::f16) return run16<half>(c, x, w);
    return run16<bfloat16>(c, x, w);
  }

 private:
  template <class T, host_collective C>
  status run16(C& c, host_view<float> x, float w) {
    T* h = reinterpret_cast<T*>(wire_buf_.data());
    const std::size_t n = x.size();
    for (std::size_t i = 0; i < n; ++i) h[i] = T::from_float(x[i] * w);
    ASHL_TRY(allreduce_now(c, in_view<>(h, n, dtype_of<T>), out_view<>(h, n, dtype_of<T>), reduce_op::sum));
    for (std::size_t i = 0; i < n; ++i) x[i] = h[i].to_float();
    return {};
  }

  dtype wire_ = dtype::f32;
  std::vector<std::byte> wire_buf_;
};

// ------------------------------------------------------------- payloads

template <class Codec>
  requires(compress::codec<Codec> || compress::stateful_codec<Codec>)
class payload_exchange {
 public:
  payload_exchange() = default;
  explicit payload_exchange(Codec codec, std::uint64_t seed = 0, std::uint32_t tensor = 0)
      : codec_(std::move(codec)), seed_(seed), tensor_(tensor) {}

  [[nodiscard]] const Codec& codec() const noexcept { return codec_; }
  Codec& codec() noexcept { return codec_; }
  // Bytes this rank sent in the last call (its payload) and received (all payloads).
  [[nodiscard]] std::size_t last_payload_bytes() const noexcept { return last_sent_; }
  [[nodiscard]] std::size_t last_gathered_bytes() const noexcept { return gather_.total_bytes(); }

  template <host_collective C>
  status operator()(C& c, host_view<float> x, std::span<const double> weights, std::uint64_t step = 0) {
    ASHL_TRY(detail::check_weights(weights, c.size()));
    const std::size_t n = x.size();
    const auto m = static_cast<std::size_t>(c.size());
    payload_.resize(codec_.max_encoded_bytes(n, dtype::f32));
    scratch_.resize(codec_.scratch_bytes(n, dtype::f32));
    // Each rank draws its own stream (stochastic codecs), the same one every run.
    compress::codec_context ctx{.seed = seed_ + 0x9e3779b97f4a7c15ull * (static_cast<std::uint64_t>(c.rank()) + 1),
                                .step = step,
                                .tensor = tensor_,
                                .scratch = scratch_};
    auto used = codec_.encode(host_view<const float>(x.data(), n), payload_, ctx);
    if (!used) return used.error();
    last_sent_ = *used;
    ASHL_TRY(gather_(c, std::span<const std::byte>(payload_.data(), *used)));

    std::fill(x.begin(), x.end(), 0.0f);
    for (std::size_t j = 0; j < m; ++j) {
      compress::codec_context dj = ctx;
      dj.seed = seed_ + 0x9e3779b97f4a7c15ull * (j + 1);
      ASHL_TRY(codec_.decode_add(gather_.of(j), compress::payload_info{n, dtype::f32}, x,
                                 static_cast<float>(weights[j]), dj));
    }
    return {};
  }

 private:
  Codec codec_{};
  std::uint64_t seed_ = 0;
  std::uint32_t tensor_ = 0;
  std::vector<std::byte> payload_, scratch_;
  detail::payload_gather gather_;
  std::size_t last_sent_ = 0;
};

// ------------------------------------------------------- the plan's codec

class plan_exchange {
 public:
  struct options {
    codec_id compression = codec_id::topk;  // what a compressing plan commits with (ps::plan_codec)
    codec_options compression_options{};    // its options where a plan leaves them 0 (ps::plan_with_codec_options)
    float compression_ratio = 1.0f;         // the ratio of plans left dense (ps::server_params::compression_ratio)
    bool error_feedback = true;             // ps::commit_encoder's residual rule
    std::uint64_t seed = 0;                 // rank j encodes with seed + golden·(j + 1)
    std::uint32_t tensor = 0;               // the codec_context tensor id (and the encoder's shard)
  };

  plan_exchange() = default;
  explicit plan_exchange(options o) : o_(o) {}

  // The plans in force, one per rank, and this rank (sync_driver calls it
  // before each exchange; every rank sees the same plans). A plan that
  // cannot run is refused, naming its rank.
  status adopt(std::span<const worker_plan> plans, rank_t me) {
    if (me < 0 || static_cast<std::size_t>(me) >= plans.size())
      return invalid_argument("plan_exchange.rank", me, "must be below the number of plans");
    if (me == me_ && std::equal(plans.begin(), plans.end(), plans_.begin(), plans_.end())) return {};  // unchanged
    ASHL_TRY(ps::check_compression_ratio(o_.compression_ratio, o_.compression, "plan_exchange.compression_ratio"));
    for (std::size_t j = 0; j < plans.size(); ++j)
      ASHL_TRY(check_plan(plans[j], "plan_exchange.plans[" + std::to_string(j) + "]"));
    plans_.assign(plans.begin(), plans.end());
    codecs_.resize(plans.size());
    any_compresses_ = false;
    for (std::size_t j = 0; j < plans.size(); ++j) {
      codecs_[j] = ps::plan_codec(
          ps::plan_with_codec_options(plans[j], o_.compression, o_.compression_options, o_.compression_ratio),
          o_.compression);
      any_compresses_ = any_compresses_ || codecs_[j] != codec_id::identity;
    }
    if (!has_encoder_ || me != me_) {  // the encoder's stream is the rank's own
      enc_ = ps::commit_encoder({.error_feedback = o_.error_feedback, .seed = seed_of(static_cast<std::size_t>(me))});
      has_encoder_ = true;
      me_ = me;
    }
    const worker_plan mine =
        ps::plan_with_codec_options(plans[static_cast<std::size_t>(me)], o_.compression, o_.compression_options,
                                    o_.compression_ratio);
    return enc_.set(codecs_[static_cast<std::size_t>(me)], mine.compression_ratio < 1.0f ? mine.compression_ratio : 1.0f,
                    mine.compression_options());
  }

  template <host_collective C>
  status operator()(C& c, host_view<float> x, std::span<const double> weights, std::uint64_t step = 0) {
    ASHL_TRY(detail::check_weights(weights, c.size()));
    const auto m = static_cast<std::size_t>(c.size());
    if (!has_encoder_ || codecs_.size() != m || me_ != c.rank())
      return invalid_argument("plan_exchange.plans", codecs_.size(), "adopt() every rank's plan before exchanging");
    const std::size_t n = x.size();
    const std::span<const float> xs(x.data(), n);
    if (!any_compresses_) {
      // Nobody compresses: x (plus what this rank still owed), weighted, summed.
      const std::span<const float> d = enc_.dense(o_.tensor, xs);
      const auto w = static_cast<float>(weights[static_cast<std::size_t>(c.rank())]);
      for (std::size_t i = 0; i < n; ++i) x[i] = d[i] * w;
      last_sent_ = n * sizeof(float);
      gathered_bytes_ = 0;
      return allreduce_now(c, in_view<>(x.data(), n, dtype::f32), out_view<>(x.data(), n, dtype::f32), reduce_op::sum);
    }
    std::span<const std::byte> mine;
    if (enc_.compresses()) {
      auto p = enc_.encode(o_.tensor, xs, step);
      if (!p) return p.error();
      mine = *p;
    } else {
      mine = std::as_bytes(enc_.dense(o_.tensor, xs));  // an identity payload: the f32 values
    }
    last_sent_ = mine.size();
    ASHL_TRY(gather_(c, mine));
    gathered_bytes_ = gather_.total_bytes();
    std::fill(x.begin(), x.end(), 0.0f);
    for (std::size_t j = 0; j < m; ++j) {
      const compress::codec_context ctx{.seed = seed_of(j), .step = step, .tensor = o_.tensor};
      ASHL_TRY(compress::decode_add(codecs_[j], gather_.of(j), compress::payload_info{n, dtype::f32}, x,
                                    static_cast<float>(weights[j]), ctx));
    }
    return {};
  }

  [[nodiscard]] const ps::commit_encoder& encoder() const noexcept { return enc_; }
  // Bytes this rank sent in the last exchange, and received (payload path; 0 after an allreduce).
  [[nodiscard]] std::size_t last_payload_bytes() const noexcept { return last_sent_; }
  [[nodiscard]] std::size_t last_gathered_bytes() const noexcept { return gathered_bytes_; }

 private:
  [[nodiscard]] std::uint64_t seed_of(std::size_t rank) const noexcept {
    return o_.seed + 0x9e3779b97f4a7c15ull * (static_cast<std::uint64_t>(rank) + 1);
  }

  options o_{};
  ps::commit_encoder enc_;
  bool has_encoder_ = false;
  rank_t me_ = -1;
  std::vector<worker_plan> plans_;  // as last adopted
  std::vector<codec_id> codecs_;
  bool any_compresses_ = false;
  detail::payload_gather gather_;
  std::size_t last_sent_ = 0, gathered_bytes_ = 0;
};

// ------------------------------------------------------------- decision

struct transfer_inputs {
  std::size_t elements = 0;          // n, the bucket
  rank_t ranks = 1;                  // M
  profile::link_model link{};        // one rank's link (α seconds, β bytes/s)
  double payload_bytes = 0.0;        // the largest compressed payload of the bucket
  profile::codec_model codec{};      // encode + decode-adds, seconds per bucket element
};

struct transfer_estimate {
  double dense16_seconds = 0.0;      // ring allreduce of 16-bit values
  double compressed_seconds = 0.0;   // all-gather of payloads + codec
  [[nodiscard]] bool compress() const noexcept { return compressed_seconds < dense16_seconds; }
};

inline transfer_estimate estimate_transfer(const transfer_inputs& in) {
  transfer_estimate e;
  const double m = static_cast<double>(std::max<rank_t>(1, in.ranks));
  if (m <= 1.0) return e;  // nothing moves; neither pays
  const double dense_bytes = 2.0 * static_cast<double>(in.elements);
  e.dense16_seconds = 2.0 * (m - 1.0) * in.link.predict(dense_bytes / m);
  e.compressed_seconds = (m - 1.0) * in.link.predict(in.payload_bytes) +
                         in.codec.predict(static_cast<double>(in.elements));
  return e;
}

template <class Codec>
class auto_exchange {
 public:
  auto_exchange(dtype dense_wire, payload_exchange<Codec> compressed)
      : dense_(dense_wire), compressed_(std::move(compressed)) {}

  // Decides on rank 0 from the model and tells every rank (a 1-byte broadcast).
  template <host_collective C>
  status decide(C& c, const transfer_inputs& in) {
    std::uint8_t choice = c.rank() == 0 && estimate_transfer(in).compress() ? 1 : 0;
    ASHL_TRY(blocking(c, c.broadcast(out_view<>(&choice, 1, dtype::u8), 0, c.default_stream())));
    compress_ = choice != 0;
    return {};
  }
  [[nodiscard]] bool compressing() const noexcept { return compress_; }
  payload_exchange<Codec>& compressed() noexcept { return compressed_; }

  template <host_collective C>
  status operator()(C& c, host_view<float> x, std::span<const double> weights, std::uint64_t step = 0) {
    return compress_ ? compressed_(c, x, weights, step) : dense_(c, x, weights, step);
  }

 private:
  dense_exchange dense_;
  payload_exchange<Codec> compressed_;
  bool compress_ = false;
};

}  // namespace coll
ASHL_NAMESPACE_END
