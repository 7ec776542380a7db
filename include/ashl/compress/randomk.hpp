// ashl/compress/randomk.hpp — random-k sparsification with seed-regenerated indices.
//
//   ashl::compress::randomk c{{.ratio = 0.01, .unbiased = true}};
//   ashl::compress::codec_context ctx{.seed = job_seed, .step = t, .tensor = id};
//   auto used = c.encode(ashl::host_view<const float>(g.data(), n), buf, ctx);
//   ashl::compress::randomk{}.decode_add({buf.data(), *used}, {n, ashl::dtype::f32}, acc, 1.0f, ctx);
//
// Only the k values travel; the decoder regenerates the indices from the
// payload's seed and ctx.step / ctx.tensor (the message header's step and
// tensor). Indices come from stratified selection, which makes them distinct
// and increasing by construction: [0, n) is cut into k strata
// [floor(j n / k), floor((j+1) n / k)) and one index is drawn uniformly in
// each from the 64-bit word (lane 1 << 32 | lane 0) of philox_stream(seed,
// step, tensor) at element j (offset = (word * len) >> 64, relative bias
// below len / 2^64). With `unbiased`, each value is scaled by its stratum length
// len_j on decode (n / k when k divides n), so E[decode] = x exactly up to
// that bias. Payload: u64 n, u32 k, u8 flags (bit 0 unbiased), u64 seed,
// k values in the input dtype; max_encoded_bytes(n, t) = 21 + k(n) * size_of(t).
// docs/algorithms.md §4; docs/wire-format.md, "Codec payloads / randomk".
#pragma once

#include <ashl/compress/detail/codec.hpp>
#include <ashl/compress/detail/sparse.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/philox.hpp>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

struct randomk_options {
  double ratio = 0.01;    // k = max(1, round(ratio * n)) when count == 0
  std::size_t count = 0;  // absolute k when non-zero
  bool unbiased = false;  // decode scales each value by its stratum length (~ n / k)
};

class randomk : public detail::codec_base<codec_id::randomk> {
 public:
  static constexpr std::size_t header_bytes = layout::randomk::header_bytes;  // compress/layout.hpp

  randomk() = default;
  explicit randomk(randomk_options o) : opt_(o) {}
  [[nodiscard]] const randomk_options& options() const noexcept { return opt_; }

  [[nodiscard]] status validate() const {
    if (opt_.count == 0 && !(opt_.ratio > 0.0 && opt_.ratio <= 1.0))
      return invalid_argument("randomk.ratio", opt_.ratio, "must be in (0, 1]");
    return {};
  }
  [[nodiscard]] std::size_t k_for(std::size_t n) const noexcept {
    return detail::k_spec{opt_.ratio, opt_.count}.k_for(n);
  }

  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n, dtype t) const noexcept {
    return header_bytes + k_for(n) * size_of(t);
  }
  [[nodiscard]] std::size_t scratch_bytes(std::size_t, dtype) const noexcept { return 0; }

  // Stratum j of k over [0, n): its start and the index drawn in it.
  struct stratum {
    std::uint64_t start, length, index;
  };
  static stratum draw(const philox_stream& rng, std::uint64_t n, std::uint64_t k, std::uint64_t j) noexcept {
    // n <= 2^32 and j < k < 2^32, so none of these products overflow 64 bits.
    const std::uint64_t start = j * n / k;
    const std::uint64_t len = (j + 1) * n / k - start;
    const std::uint64_t hi = rng.word(j, 1), lo = rng.word(j, 0);
    const std::uint64_t off = (hi * len + ((lo * len) >> 32)) >> 32;  // (word * len) >> 64, exact
    return {start, len, start + off};
  }

  template <gradient_element T>
  result<std::size_t> encode(host_view<const T> xv, std::span<std::byte> out, const codec_context& ctx) const {
    ASHL_TRY(validate());
    const std::size_t n = xv.size();
    const std::size_t k = k_for(n);
    if (n > layout::randomk::max_elements)
      return out_of_range("randomk.input.size", n, "exceeds 2^32 (the count is u32)");
    const std::size_t need = header_bytes + k * sizeof(T);
    if (out.size() < need)
      return make_error(errc::buffer_too_small, "randomk.out.size", out.size(),
                        "bytes, fewer than max_encoded_bytes = " + std::to_string(need));
    std::byte* const base = out.data();
    detail::store_le<std::uint64_t>(base, n);
    detail::store_le<std::uint32_t>(base + 8, static_cast<std::uint32_t>(k));
    detail::store_le<std::uint8_t>(base + 12, opt_.unbiased ? 1 : 0);
    detail::store_le<std::uint64_t>(base + 13, ctx.seed);
    std::byte* const val = base + header_bytes;
    const philox_stream rng(ctx.seed, ctx.step, ctx.tensor);
    const T* x = xv.data();
    for (std::size_t j = 0; j < k; ++j) detail::store_le(val + sizeof(T) * j, detail::element_bits(x[draw(rng, n, k, j).index]));
    return need;
  }

  status decode_add(std::span<const std::byte> in, payload_info info, host_view<float> acc, float scale,
                    const codec_context& ctx) const {
    ASHL_TRY(detail::check_decode_args("randomk", info.type, info.count, acc.size(), scale));
    byte_reader r(in);
    std::uint64_t n = 0, seed = 0;
    std::uint32_t k = 0;
    std::uint8_t flags = 0;
    ASHL_TRY(r.get(n, "randomk.n"));
    ASHL_TRY(r.get(k, "randomk.k"));
    ASHL_TRY(r.get(flags, "randomk.flags"));
    ASHL_TRY(r.get(seed, "randomk.seed"));
    if (n != info.count) return malformed("randomk.n", n, "must equal info.count = " + std::to_string(info.count));
    if (n > layout::randomk::max_elements) return malformed("randomk.n", n, "exceeds 2^32");
    if (k > n) return malformed("randomk.k", k, "exceeds n = " + std::to_string(n));
    if (n != 0 && k == 0) return malformed("randomk.k", k, "must be >= 1");
    if ((flags & ~1u) != 0) return malformed("randomk.flags", flags, "only bit 0 (unbiased) is defined");
    const std::size_t vs = size_of(info.type);
    const std::size_t expect = header_bytes + std::size_t{k} * vs;
    if (in.size() != expect)
      return malformed("randomk.payload_bytes", in.size(),
                       "must be 21 + k * " + std::to_string(vs) + " = " + std::to_string(expect));
    const std::byte* val = in.data() + header_bytes;
    const philox_stream rng(seed, ctx.step, ctx.tensor);
    const bool unbiased = (flags & 1u) != 0;
    float* a = acc.data();
    for (std::uint64_t j = 0; j < k; ++j) {
      const stratum s = draw(rng, n, k, j);
      const float w = unbiased ? scale * static_cast<float>(s.length) : scale;
      a[s.index] += w * detail::load_value_le(val + vs * j, info.type);
    }
    return {};
  }

 private:
  randomk_options opt_{};
};

static_assert(codec<randomk>);

ASHL_DETAIL_COMPRESS_HOST_END
