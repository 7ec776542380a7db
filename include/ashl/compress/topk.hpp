// ashl/compress/topk.hpp — exact top-k sparsification.
//
//   ashl::compress::topk c{0.01};                 // k = max(1, round(0.01 n))
//   ashl::compress::topk d{ashl::compress::topk::count(1000)};   // k = 1000
//   std::vector<std::byte> buf(c.max_encoded_bytes(n, ashl::dtype::f32));
//   auto used = c.encode(ashl::host_view<const float>(g.data(), n), buf, {});
//   ashl::compress::topk{}.decode_add({buf.data(), *used}, {n, ashl::dtype::f32}, acc, 1.0f, {});
//
// Keeps the k elements of largest |x|; among equal magnitudes the lower
// index wins, so the result is a deterministic function of the input. NaN
// counts as larger than inf. Selection is an MSD radix select on the bit
// pattern of |x| (detail/sparse.hpp: 3 histogram passes of 11/11/9 bits for
// f32, 2 of 8/7 for f16/bf16, then one collection pass), linear and free of
// allocation; no scratch is needed. Payload: u64 n, u32 k, k u32 indices
// strictly increasing, k values in the input dtype;
// max_encoded_bytes(n, t) = 12 + k(n) * (4 + size_of(t)), and encode writes
// exactly that. docs/algorithms.md §4; docs/wire-format.md, "Codec payloads / topk".
#pragma once

#include <ashl/compress/detail/codec.hpp>
#include <ashl/compress/detail/sparse.hpp>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

class topk : public detail::sparse_codec<topk, codec_id::topk, /*RequireNonempty=*/true> {
 public:

  // An absolute k (clamped to n), as opposed to a ratio.
  struct count {
    std::size_t k;
  };

  topk() = default;
  // ratio in (0, 1]: k = max(1, round(ratio * n)); validate() reports a bad one.
  explicit topk(double ratio) { spec_.ratio = ratio; }
  explicit topk(count c) { spec_.count = c.k; spec_.ratio = 1.0; }

  [[nodiscard]] status validate() const {
    if (spec_.count == 0 && !(spec_.ratio > 0.0 && spec_.ratio <= 1.0))
      return invalid_argument("topk.ratio", spec_.ratio, "must be in (0, 1]");
    return {};
  }
  [[nodiscard]] std::size_t k_for(std::size_t n) const noexcept { return spec_.k_for(n); }

  [[nodiscard]] std::size_t bound_for(std::size_t n) const noexcept { return k_for(n); }
  // The candidate list (detail::topk_candidate_capacity u64 entries, + 7 for alignment).
  [[nodiscard]] std::size_t scratch_bytes(std::size_t n, dtype) const noexcept {
    return 8 * detail::topk_candidate_capacity(n, k_for(n)) + 7;
  }

  // encode and decode_add: detail::sparse_codec; a decode accepts any k in
  // [1, n] (a server does not know the sender's ratio).

 private:
  friend sparse_codec;

  template <gradient_element T>
  result<std::size_t> encode_pairs(const T* x, std::size_t n, std::span<std::byte> out, const codec_context& ctx) const {
    return detail::encode_topk(x, n, k_for(n), ctx.scratch, out);
  }

  detail::k_spec spec_{};
};

static_assert(codec<topk>);

ASHL_DETAIL_COMPRESS_HOST_END
