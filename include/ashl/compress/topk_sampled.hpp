// ashl/compress/topk_sampled.hpp — sampled-threshold top-k (DGC).
//
//   ashl::compress::topk_sampled c{0.001};          // k = max(1, round(0.001 n)), tolerance 10 %
//   std::vector<std::byte> buf(c.max_encoded_bytes(n, ashl::dtype::f32));
//   std::vector<std::byte> scratch(c.scratch_bytes(n, ashl::dtype::f32));
//   ashl::compress::codec_context ctx{.seed = s, .step = t, .tensor = id, .scratch = scratch};
//   auto used = c.encode(ashl::host_view<const float>(g.data(), n), buf, ctx);
//
// Estimates the k-th largest magnitude from a random sample of 16384
// elements drawn from philox_stream(ctx.seed, ctx.step, ctx.tensor) (lane 2):
// θ is the sample key of rank round(16384 k / n), and the result is every
// element with |x| >= θ when that count lies in [lo, hi] =
// [max(1, ceil(k (1 - tol))), max(k, floor(k (1 + tol)))]. When only ties at
// θ make the count exceed hi, those above θ and the lowest-index equal ones
// up to k are sent (all-equal input sends exactly k pairs). Otherwise the
// exact top-k (k pairs) is sent. So the count is always in [lo, hi]: the cap
// k' = hi is never exceeded (1.1 k by default).
//
// One read of x does it: the sample also gives a lower, safe threshold (the
// rank exact top-k uses, detail::topk_sample_rank, which a little more than
// k elements reach with high probability), one pass collects every element
// at or above it, and θ's count, the ties rule and the exact top-k are then
// taken from that list. Only when the list overflows or holds fewer than k
// is x read again. `passes` no longer changes the result: a miss at θ goes
// straight to the exact selection, as passes = 1 always did (the earlier
// encoder's refinement passes read a sample the first pass had overwritten).
// Small tensors (n < 2^17) use exact top-k directly. Payload: the sparse
// layout of topk (u64 n, u32 count, count u32 indices strictly increasing,
// count values in the input dtype); max_encoded_bytes(n, t) = 12 + hi(n) * (4 + size_of(t)).
// docs/algorithms.md §4 (Lin et al., "Deep Gradient Compression", ICLR 2018);
// docs/wire-format.md, "Codec payloads / topk_sampled".
#pragma once

#include <ashl/compress/detail/codec.hpp>
#include <ashl/compress/detail/random_words.hpp>
#include <ashl/compress/detail/sparse.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/core/philox.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

struct topk_sampled_options {
  double ratio = 0.01;     // k = max(1, round(ratio * n)) when count == 0
  std::size_t count = 0;   // absolute k when non-zero
  double tolerance = 0.1;  // accepted relative deviation of the count from k, in (0, 1)
  int passes = 3;          // >= 1; kept for compatibility, no longer changes the result (see above)
};

class topk_sampled : public detail::sparse_codec<topk_sampled, codec_id::topk_sampled, /*RequireNonempty=*/false> {
 public:
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

  [[nodiscard]] std::size_t bound_for(std::size_t n) const noexcept { return hi_for(n); }
  // Max of: the sample (16384 u32), the one-pass list (hi u64) and the
  // candidate list at the safe threshold, which is exact top-k's scratch
  // (detail::topk_candidate_capacity u64); + 7 bytes for alignment.
  [[nodiscard]] std::size_t scratch_bytes(std::size_t n, dtype) const noexcept {
    const std::size_t k = k_for(n);
    const std::size_t exact = k == 0 ? 0 : 8 * detail::topk_candidate_capacity(n, k);
    return std::max({4 * sample_size, 8 * hi_for(n), exact}) + 7;
  }

  // encode and decode_add: detail::sparse_codec (a payload of 0 pairs is valid).

 private:
  friend sparse_codec;

  template <gradient_element T>
  result<std::size_t> encode_pairs(const T* x, std::size_t n, std::span<std::byte> out, const codec_context& ctx) const {
    const std::size_t hi = hi_for(n);
    const std::size_t k = k_for(n);
    if (k == 0) return detail::write_all(x, 0, out);
    if (n < min_sampled_n || k == n) return detail::encode_topk(x, n, k, ctx.scratch, out);
    const std::size_t lo = lo_for(n);

    // The candidate list (at the safe threshold) needs `cap` entries; a
    // caller scratch that holds only the first threshold's (hi) runs the
    // one-pass selection over x instead; a smaller one, exact top-k.
    const std::size_t cap = detail::topk_candidate_capacity(n, k);
    const std::size_t one_pass_entries = std::max(hi, sample_size / 2);
    std::vector<std::uint64_t> owned;
    std::uint64_t* buf = detail::scratch_u64(ctx.scratch, std::max(cap, sample_size / 2));
    bool listed = buf != nullptr;
    if (buf == nullptr && !ctx.scratch.empty()) {
      buf = detail::scratch_u64(ctx.scratch, one_pass_entries);
      if (buf == nullptr) return detail::encode_topk(x, n, k, ctx.scratch, out);
    } else if (buf == nullptr) {
      owned.resize(std::max(cap, sample_size / 2));
      buf = owned.data();
      listed = true;
    }

    // The sample: keys of elements (word_j n) >> 32, j < 16384, word_j of
    // philox_stream lane 2 (drawn in bulk), in the front of buf.
    auto* keys = reinterpret_cast<std::uint32_t*>(buf);
    const detail::random_words rw(ctx.seed, ctx.step, ctx.tensor, 2);
    constexpr std::size_t block = 1024;  // words drawn, then turned into keys, while in L1
    for (std::size_t j = 0; j < sample_size; j += block) {
      rw.fill(j / 4, block / 4, keys + j);
      for (std::size_t q = j; q < j + block; ++q)
        keys[q] = detail::magnitude_key(x[(static_cast<std::uint64_t>(keys[q]) * n) >> 32]);
    }
    // θ = the sample key of rank round(k s / n) (descending, from 1), the
    // threshold the count is judged by; θs = the key of the safe rank of
    // exact top-k (detail::topk_sample_rank), a little more than k elements
    // reach it with high probability, so θs <= θ and every element >= θ is
    // among those >= θs.
    const double base_rank = static_cast<double>(k) * static_cast<double>(sample_size) / static_cast<double>(n);
    const auto clamp_rank = [](double r) {
      return static_cast<std::size_t>(std::clamp(r, 1.0, static_cast<double>(sample_size)));
    };
    const std::size_t r1 = clamp_rank(std::round(base_rank));
    const std::size_t rs = std::max(r1, clamp_rank(std::floor(detail::topk_sample_rank(n, k))));
    std::nth_element(keys, keys + (rs - 1), keys + sample_size, std::greater<>());
    const std::uint32_t theta_s = keys[rs - 1];
    if (r1 < rs) std::nth_element(keys, keys + (r1 - 1), keys + (rs - 1), std::greater<>());
    const std::uint32_t theta = r1 < rs ? keys[r1 - 1] : theta_s;

    if (!listed) return one_pass(x, n, k, lo, hi, theta, buf, ctx.scratch, out);
    const detail::collect_counts cs = detail::collect_ge(x, n, theta_s, buf, cap);
    if (cs.ge > cap) {
      // The list overflowed (heavy ties at θs): with θ = θs the counts are
      // still known; otherwise the one-pass selection at θ.
      if (theta != theta_s) return one_pass(x, n, k, lo, hi, theta, buf, ctx.scratch, out);
      const std::size_t gt = cs.ge - cs.eq;
      if (gt <= hi) return detail::write_selected(x, n, detail::selection{theta, gt, gt >= k ? 0 : k - gt}, out);
      return detail::encode_topk(x, n, k, ctx.scratch, out);
    }
    // Every element >= θ is in the list: count them there.
    std::size_t ge = 0, eq = 0;
    for (std::size_t j = 0; j < cs.ge; ++j) {
      const std::uint32_t key = detail::candidate_key<T>(buf[j]);
      ge += key >= theta;
      eq += key == theta;
    }
    const std::size_t gt = ge - eq;
    if (ge >= lo && ge <= hi) {
      std::size_t m = 0;
      for (std::size_t j = 0; j < cs.ge; ++j)
        if (detail::candidate_key<T>(buf[j]) >= theta) buf[m++] = buf[j];
      return write_candidates(x, n, buf, m, out);
    }
    if (ge > hi && gt <= hi) {
      // Too many only because of ties at θ: those above, and the lowest-index equal ones.
      std::size_t take = gt >= k ? 0 : k - gt, m = 0;
      for (std::size_t j = 0; j < cs.ge; ++j) {
        const std::uint32_t key = detail::candidate_key<T>(buf[j]);
        if (key > theta || (key == theta && take != 0)) {
          take -= key == theta;
          buf[m++] = buf[j];
        }
      }
      return write_candidates(x, n, buf, m, out);
    }
    if (cs.ge < k) return detail::encode_topk(x, n, k, ctx.scratch, out);
    // θ missed: the exact k largest, selected among the candidates (every
    // element outside the list is below all of them).
    std::byte* const base = out.data();
    detail::store_le<std::uint64_t>(base, n);
    detail::store_le<std::uint32_t>(base + 8, static_cast<std::uint32_t>(k));
    std::byte* const idx = base + layout::sparse::header_bytes;
    detail::finish_topk<T>(k, 0, 0, 0, buf, cs.ge, idx, idx + 4 * k);
    return detail::sparse_payload_bytes(k, dtype_of<T>);
  }

  // The selection of one pass over x at θ: the elements >= θ when they are
  // [lo, hi], the ties rule when only equal keys make too many, else exact
  // top-k. buf holds at least max(hi, s / 2) entries.
  template <class T>
  static std::size_t one_pass(const T* x, std::size_t n, std::size_t k, std::size_t lo, std::size_t hi,
                              std::uint32_t theta, std::uint64_t* buf, std::span<std::byte> scratch,
                              std::span<std::byte> out) {
    const detail::collect_counts cc = detail::collect_ge(x, n, theta, buf, hi);
    const std::size_t gt = cc.ge - cc.eq;
    if (cc.ge >= lo && cc.ge <= hi) return write_candidates(x, n, buf, cc.ge, out);
    if (cc.ge > hi && gt <= hi)
      return detail::write_selected(x, n, detail::selection{theta, gt, gt >= k ? 0 : k - gt}, out);
    return detail::encode_topk(x, n, k, scratch, out);
  }

  template <class T>
  static std::size_t write_candidates(const T* x, std::size_t n, const std::uint64_t* cand, std::size_t c,
                                      std::span<std::byte> out) noexcept {
    (void)x;
    std::byte* const base = out.data();
    detail::store_le<std::uint64_t>(base, n);
    detail::store_le<std::uint32_t>(base + 8, static_cast<std::uint32_t>(c));
    std::byte* const idx = base + layout::sparse::header_bytes;
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

ASHL_DETAIL_COMPRESS_HOST_END
