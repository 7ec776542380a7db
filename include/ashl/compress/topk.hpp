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
// exactly that. ALGORITHMS.md §4; docs/wire-format.md, "Codec payloads / topk".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/detail/host_simd.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/detail/elements.hpp>
#include <ashl/compress/detail/sparse.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/wire/ids.hpp>

#include <cstddef>
#include <span>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

class topk {
 public:
  using codec_concept = codec_tag;
  static constexpr codec_id id = codec_id::topk;

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

  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n, dtype t) const noexcept {
    return detail::sparse_payload_bytes(k_for(n), t);
  }
  // The candidate list (detail::topk_candidate_capacity u64 entries, + 7 for alignment).
  [[nodiscard]] std::size_t scratch_bytes(std::size_t n, dtype) const noexcept {
    return 8 * detail::topk_candidate_capacity(n, k_for(n)) + 7;
  }

  template <gradient_element T>
  result<std::size_t> encode(host_view<const T> x, std::span<std::byte> out, const codec_context& ctx) const {
    ASHL_TRY(validate());
    const std::size_t n = x.size();
    const std::size_t k = k_for(n);
    ASHL_TRY(detail::check_sparse_encode("topk", n, out.size(), detail::sparse_payload_bytes(k, dtype_of<T>)));
    return detail::encode_topk(x.data(), n, k, ctx.scratch, out);
  }

  // Accepts any k in [1, n] (a server does not know the sender's ratio).
  status decode_add(std::span<const std::byte> in, payload_info info, host_view<float> acc, float scale,
                    const codec_context&) const {
    return detail::decode_add_pairs("topk", in, info, acc, scale, /*require_nonempty=*/true);
  }

 private:
  detail::k_spec spec_{};
};

static_assert(codec<topk>);

ASHL_DETAIL_COMPRESS_HOST_END
