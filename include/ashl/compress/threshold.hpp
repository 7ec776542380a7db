// ashl/compress/threshold.hpp — fixed-threshold sparsification, capped.
//
//   ashl::compress::threshold c{{.theta = 1e-3f, .max_ratio = 0.05}};
//   std::vector<std::byte> buf(c.max_encoded_bytes(n, ashl::dtype::f32));
//   auto used = c.encode(ashl::host_view<const float>(g.data(), n), buf, {});
//
// Sends the (index, value) pairs with |x| >= theta (compared in f32; NaN is
// never >= theta). When more than the cap max(1, round(max_ratio * n)) pass,
// the cap largest magnitudes are sent instead (exact top-k, ties to the lower
// index), so the payload never exceeds max_encoded_bytes(n, t) =
// 12 + cap(n) * (4 + size_of(t)). Payload: the sparse layout of topk (u64 n,
// u32 count, count u32 indices strictly increasing, count values in the
// input dtype); count may be 0. docs/algorithms.md §4; docs/wire-format.md,
// "Codec payloads / threshold".
#pragma once

#include <ashl/compress/detail/codec.hpp>
#include <ashl/compress/detail/sparse.hpp>

#include <cmath>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

struct threshold_options {
  float theta = 1e-3f;     // finite, >= 0
  double max_ratio = 1.0;  // cap = max(1, round(max_ratio * n)), in (0, 1]
};

class threshold : public detail::sparse_codec<threshold, codec_id::threshold, /*RequireNonempty=*/false> {
 public:
  threshold() = default;
  explicit threshold(threshold_options o) : opt_(o) {}
  [[nodiscard]] const threshold_options& options() const noexcept { return opt_; }

  [[nodiscard]] status validate() const {
    if (!std::isfinite(opt_.theta) || opt_.theta < 0.0f)
      return invalid_argument("threshold.theta", opt_.theta, "must be finite and >= 0");
    if (!(opt_.max_ratio > 0.0 && opt_.max_ratio <= 1.0))
      return invalid_argument("threshold.max_ratio", opt_.max_ratio, "must be in (0, 1]");
    return {};
  }
  [[nodiscard]] std::size_t cap_for(std::size_t n) const noexcept {
    return detail::k_spec{opt_.max_ratio, 0}.k_for(n);
  }

  [[nodiscard]] std::size_t bound_for(std::size_t n) const noexcept { return cap_for(n); }
  // Exact top-k's candidate list for k = cap (used when the cap binds), + 7.
  [[nodiscard]] std::size_t scratch_bytes(std::size_t n, dtype) const noexcept {
    const std::size_t cap = cap_for(n);
    return cap == 0 ? 0 : 8 * detail::topk_candidate_capacity(n, cap) + 7;
  }

  // encode and decode_add: detail::sparse_codec (a payload of 0 pairs is valid).

 private:
  friend sparse_codec;

  template <gradient_element T>
  result<std::size_t> encode_pairs(const T* x, std::size_t n, std::span<std::byte> out, const codec_context& ctx) const {
    const std::size_t cap = cap_for(n);
    // |x| >= theta as a compare of magnitude keys (NaN keys lie above inf's).
    const std::uint32_t lo = detail::key_at_least<T>(opt_.theta), hi = detail::inf_key<T>;
    const std::size_t c = detail::count_keys_in(x, n, lo, hi);
    if (c > cap) return detail::encode_topk(x, n, cap, ctx.scratch, out);
    return detail::write_keys_in(x, n, lo, hi, c, out);
  }

  threshold_options opt_{};
};

static_assert(codec<threshold>);

ASHL_DETAIL_COMPRESS_HOST_END
