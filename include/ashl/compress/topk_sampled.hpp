// ashl/compress/topk_sampled.hpp — sampled-threshold top-k (DGC).
//
//   ashl::compress::topk_sampled c{0.001};          // k = max(1, round(0.001 n)), tolerance 10 %
//   std::vector<std::byte> buf(c.max_encoded_bytes(n, ashl::dtype::f32));
//   std::vector<std::byte> scratch(c.scratch_bytes(n, ashl::dtype::f32));
//   ashl::compress::codec_context ctx{.seed = s, .step = t, .tensor = id, .scratch = scratch};
//   auto used = c.encode(ashl::host_view<const float>(g.data(), n), buf, ctx);
//
// Estimates the k-th largest magnitude from a random sample of 16384
// elements drawn from philox_stream(ctx.seed, ctx.step, ctx.tensor) (lane 2),
// selects |x| >= θ in one linear pass, and accepts the result when the count
// lies in [lo, hi] = [max(1, ceil(k (1 - tol))), max(k, floor(k (1 + tol)))].
// Otherwise θ is refined (a rescaled sample rank, or bisection on the key
// bits inside the bracket the earlier passes established) for at most
// `passes` passes; ties at θ are broken by taking the lowest indices, which
// makes all-equal input send exactly k pairs. If no pass lands in range, the
// exact top-k (k pairs) is sent. So the count is always in [lo, hi]: the cap
// k' = hi is never exceeded (1.1 k by default). Small tensors (n < 2^17)
// use exact top-k directly. Payload: the sparse layout of topk (u64 n,
// u32 count, count u32 indices strictly increasing, count values in the input
// dtype); max_encoded_bytes(n, t) = 12 + hi(n) * (4 + size_of(t)).
// ALGORITHMS.md §4 (Lin et al., "Deep Gradient Compression", ICLR 2018);
// docs/wire-format.md, "Codec payloads / topk_sampled".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/detail/elements.hpp>
#include <ashl/compress/detail/sparse.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/wire/ids.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace compress {

struct topk_sampled_options {
  double ratio = 0.01;     // k = max(1, round(ratio * n)) when count == 0
  std::size_t count = 0;   // absolute k when non-zero
  double tolerance = 0.1;  // accepted relative deviation of the count from k, in (0, 1)
  int passes = 3;          // selection passes before falling back to exact top-k, >= 1
};

class topk_sampled {
 public:
  using codec_concept = codec_tag;
  static constexpr codec_id id = codec_id::topk_sampled;
  static constexpr std::size_t sample_size = 16384;
  static constexpr std::size_t min_sampled_n = 8 * sample_size;

  topk_sampled() = default;
  explicit topk_sampled(double ratio) { opt_.ratio = ratio; }
  explicit topk_sampled(topk_sampled_options o) : opt_(o) {}
  [[nodiscard]] const topk_sampled_options& options() const noexcept { return opt_; }

  [[nodiscard]] status validate() const {
    if (opt_.count == 0 && !(opt_.ratio > 0.0 && opt_.ratio <= 1.0))
      return invalid_argument("topk_sampled.ratio", opt_.ratio, "must be in (0, 1]");
    if (!(opt_.tolerance > 0.0 && opt_.tolerance < 1.0))
      return invalid_argument("topk_sampled.tolerance", opt_.tolerance, "must be in (0, 1)");
    if (opt_.passes < 1) return invalid_argument("topk_sampled.passes", opt_.passes, "must be >= 1");
    return {};
  }

  [[nodiscard]] std::size_t k_for(std::size_t n) const noexcept {
    return detail::k_spec{opt_.ratio, opt_.count}.k_for(n);
  }
  // The accepted count range [lo, hi]; hi is the cap k'.
  [[nodiscard]] std::size_t lo_for(std::size_t n) const noexcept {
    const std::size_t k = k_for(n);
    const auto lo = static_cast<std::size_t>(std::ceil(static_cast<double>(k) * (1.0 - opt_.tolerance)));
    return k == 0 ? 0 : std::clamp<std::size_t>(lo, 1, k);
  }
  [[nodiscard]] std::size_t hi_for(std::size_t n) const noexcept {
    const std::size_t k = k_for(n);
    const auto hi = static_cast<std::size_t>(std::floor(static_cast<double>(k) * (1.0 + opt_.tolerance)));
    return std::min(n, std::max(k, hi));
  }

  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n, dtype t) const noexcept {
    return detail::sparse_payload_bytes(hi_for(n), t);
  }
  // Max of: the sample (16384 u32), the candidate list (hi u64) and exact
  // top-k's scratch for the fallback; + 7 bytes for alignment.
  [[nodiscard]] std::size_t scratch_bytes(std::size_t n, dtype) const noexcept {
    const std::size_t k = k_for(n);
    const std::size_t exact = k == 0 ? 0 : 8 * detail::topk_candidate_capacity(n, k);
    return std::max({4 * sample_size, 8 * hi_for(n), exact}) + 7;
  }

  result<std::size_t> encode(host_view<const float> x, std::span<std::byte> out, const codec_context& ctx) const {
    return encode_impl(x, out, ctx);
  }
  result<std::size_t> encode(host_view<const half> x, std::span<std::byte> out, const codec_context& ctx) const {
    return encode_impl(x, out, ctx);
  }
  result<std::size_t> encode(host_view<const bfloat16> x, std::span<std::byte> out,
                             const codec_context& ctx) const {
    return encode_impl(x, out, ctx);
  }

  status decode_add(std::span<const std::byte> in, payload_info info, host_view<float> acc, float scale,
                    const codec_context&) const {
    return detail::decode_add_pairs("topk_sampled", in, info, acc, scale, /*require_nonempty=*/false);
  }

 private:
  template <class T>
  result<std::size_t> encode_impl(host_view<const T> xv, std::span<std::byte> out, const codec_context& ctx) const {
    ASHL_TRY(validate());
    const std::size_t n = xv.size();
    const std::size_t hi = hi_for(n);
    ASHL_TRY(detail::check_sparse_encode("topk_sampled", n, out.size(), detail::sparse_payload_bytes(hi, dtype_of<T>)));
    const T* x = xv.data();
    const std::size_t k = k_for(n);
    if (k == 0) return detail::write_all(x, 0, out);
    if (n < min_sampled_n || k == n) return detail::encode_topk(x, n, k, ctx.scratch, out);
    const std::size_t lo = lo_for(n);

    std::vector<std::uint64_t> owned;
    std::uint64_t* buf = detail::scratch_u64(ctx.scratch, std::max(hi, sample_size / 2));
    if (buf == nullptr) {
      if (!ctx.scratch.empty()) return detail::encode_topk(x, n, k, ctx.scratch, out);
      owned.resize(std::max(hi, sample_size / 2));
      buf = owned.data();
    }
    // The sample, sorted descending once; each refinement reads a rank from it.
    auto* keys = reinterpret_cast<std::uint32_t*>(buf);
    const philox_stream rng(ctx.seed, ctx.step, ctx.tensor);
    for (std::size_t j = 0; j < sample_size; ++j) {
      const std::uint64_t i = (static_cast<std::uint64_t>(rng.word(j, 2)) * n) >> 32;
      keys[j] = detail::magnitude_key(x[i]);
    }
    std::sort(keys, keys + sample_size, [](std::uint32_t a, std::uint32_t b) { return a > b; });
    auto key_at_rank = [&](double rank) {
      const auto r = static_cast<std::size_t>(std::clamp(rank, 1.0, static_cast<double>(sample_size)));
      return keys[r - 1];
    };
    const double base_rank = static_cast<double>(k) * static_cast<double>(sample_size) / static_cast<double>(n);
    std::uint32_t theta = key_at_rank(std::round(base_rank));
    // Bracket on the key: counts at `low` are above hi, counts at `high` below lo.
    std::uint64_t low = 0, high = std::uint64_t{1} << 32;
    double rank = base_rank;
    for (int pass = 0; pass < opt_.passes; ++pass) {
      const detail::collect_counts cc = detail::collect_ge(x, n, theta, buf, hi);
      const std::size_t ge = cc.ge, eq = cc.eq;
      const std::size_t gt = ge - eq;
      if (ge >= lo && ge <= hi) return write_candidates(x, n, buf, ge, out);
      if (ge > hi && gt <= hi) {
        // Too many only because of ties at θ: keep those above and the lowest-index equal ones.
        const std::size_t take = gt >= k ? 0 : k - gt;
        return detail::write_selected(x, n, detail::selection{theta, gt, take}, out);
      }
      // Refine: rescale the sample rank by how far the count was off; bisect
      // on the key bits when that does not land strictly inside the bracket.
      if (ge > hi)
        low = theta;
      else
        high = theta;
      rank = rank * static_cast<double>(k) / static_cast<double>(std::max<std::size_t>(ge, 1));
      std::uint64_t next = key_at_rank(std::round(rank));
      if (next <= low || next >= high) next = (low + high) / 2;
      if (next <= low || next >= high) break;
      theta = static_cast<std::uint32_t>(next);
    }
    return detail::encode_topk(x, n, k, ctx.scratch, out);
  }

  template <class T>
  static std::size_t write_candidates(const T* x, std::size_t n, const std::uint64_t* cand, std::size_t c,
                                      std::span<std::byte> out) noexcept {
    (void)x;
    std::byte* const base = out.data();
    detail::store_le<std::uint64_t>(base, n);
    detail::store_le<std::uint32_t>(base + 8, static_cast<std::uint32_t>(c));
    std::byte* const idx = base + detail::sparse_header_bytes;
    std::byte* const val = idx + 4 * c;
    for (std::size_t j = 0; j < c; ++j) {
      detail::store_le<std::uint32_t>(idx + 4 * j, static_cast<std::uint32_t>(cand[j]));
      detail::store_le(val + sizeof(T) * j, static_cast<detail::bits_of<T>>(cand[j] >> 32));
    }
    return detail::sparse_payload_bytes(c, dtype_of<T>);
  }

  topk_sampled_options opt_{};
};

static_assert(codec<topk_sampled>);

}  // namespace compress
ASHL_NAMESPACE_END
