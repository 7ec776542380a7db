// ashl/compress/dgc.hpp — Deep Gradient Compression: momentum correction and
// momentum-factor masking around a sparsifier (a stateful codec).
//
//   ashl::compress::dgc<ashl::compress::topk> d{ashl::compress::topk{0.001}, {.momentum = 0.9f}};
//   std::vector<std::byte> buf(d.max_encoded_bytes(n, ashl::dtype::f32));
//   auto used = d.encode(ashl::host_view<const float>(g.data(), n), buf, ctx);   // non-const
//   // the server: ashl::compress::topk{}.decode_add(payload, {n, ashl::dtype::f32}, acc, lr, ctx)
//
// Lin et al., "Deep Gradient Compression" (ICLR'18). Per tensor id the worker
// keeps a momentum u and an accumulated velocity v (f32):
//   u <- m u + g;  v <- v + u;  send C(v);  u_i = v_i = 0 at every sent i.
// The server applies the sent values as plain gradients (the momentum is
// already in them). The inner codec must produce the sparse-pair payload
// (topk, topk_sampled, threshold: u64 n, u32 count, u32 index[count], values;
// docs/wire-format.md "Sparse pairs"), from which the sent indices are read.
// The payload is the inner codec's with f32 values, so
// max_encoded_bytes(n, t) = inner.max_encoded_bytes(n, f32) and scratch_bytes
// likewise. On an encode error nothing was sent and nothing is masked: g stays
// accumulated in u and v. A tensor's first encode (or a size change)
// allocates its state unless reserve() was called. Gradient clipping and
// warm-up of the sparsity are the caller's. docs/algorithms.md §4 (decorators).
#pragma once

#include <ashl/compress/detail/codec.hpp>
#include <ashl/compress/detail/decorator.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/compress/registry.hpp>  // codecs, sparse_pair_codec
#include <ashl/compress/threshold.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/compress/topk_sampled.hpp>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

// The inner codec must be one registry.hpp lists with the sparse-pair payload
// layout (sparse_pair_codec), so the sent indices can be read back.
struct dgc_options {
  float momentum = 0.9f;  // m in [0, 1)

  // The one check of the options, for the host dgc and the device one.
  [[nodiscard]] status validate() const {
    if (!(momentum >= 0.0f && momentum < 1.0f)) return invalid_argument("dgc.momentum", momentum, "must be in [0, 1)");
    return {};
  }
};

template <sparse_pair_codec C>
class dgc : public detail::decorator<C, 2> {  // state: momentum u, velocity v
  using base = detail::decorator<C, 2>;
  using base::inner_;
  using base::state_;

 public:
  dgc() = default;
  explicit dgc(C inner, dgc_options o = {}) : base(std::move(inner)), opt_(o) {}
  [[nodiscard]] const dgc_options& options() const noexcept { return opt_; }

  [[nodiscard]] status validate() const { return opt_.validate(); }

  // u (momentum) and v (accumulated velocity) of `tensor`; empty if never encoded.
  [[nodiscard]] std::span<const float> momentum(std::uint32_t tensor) const noexcept { return state_.view(tensor, 0); }
  [[nodiscard]] std::span<const float> velocity(std::uint32_t tensor) const noexcept { return state_.view(tensor, 1); }

  template <gradient_element T>
  result<std::size_t> encode(host_view<const T> gv, std::span<std::byte> out, const codec_context& ctx) {
    ASHL_TRY(validate());
    const std::size_t n = gv.size();
    auto& [us, vs] = state_.slot(ctx.tensor, n);
    const T* g = gv.data();
    float* u = us.data();
    float* v = vs.data();
    const float m = opt_.momentum;
    detail::momentum_accumulate(u, v, g, m, n);  // u = m u + g; v += u
    auto used = inner_.encode(host_view<const float>(v, n), out, ctx);
    if (!used.has_value()) return used;
    // Our own sparse-pair payload (compress/layout.hpp): u64 n, u32 count,
    // count u32 indices (each < n).
    const std::byte* p = out.data();
    const std::uint32_t count = detail::load_le<std::uint32_t>(p + layout::sparse::count_offset);
    ASHL_ASSERT(layout::sparse_values_offset(count) <= *used, "dgc: inner payload is not sparse pairs");
    for (std::uint32_t j = 0; j < count; ++j) {
      const std::uint32_t i = detail::load_le<std::uint32_t>(p + layout::sparse::header_bytes + 4 * std::size_t{j});
      ASHL_ASSERT(i < n, "dgc: inner payload index out of range");
      u[i] = 0.0f;
      v[i] = 0.0f;
    }
    return used;
  }

 private:
  dgc_options opt_{};
};

static_assert(stateful_codec<dgc<topk>>);

ASHL_DETAIL_COMPRESS_HOST_END
