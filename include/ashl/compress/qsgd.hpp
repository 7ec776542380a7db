// ashl/compress/qsgd.hpp — QSGD: per-bucket L2 norm, sign and s stochastic levels.
//
//   ashl::compress::qsgd c{{.levels = 15, .bucket = 512}};     // 5 bits per element
//   std::vector<std::byte> buf(c.max_encoded_bytes(n, ashl::dtype::f32));
//   auto used = c.encode(ashl::host_view<const float>(g.data(), n), buf, ctx);
//   ashl::compress::qsgd{}.decode_add({buf.data(), *used}, {n, ashl::dtype::f32}, acc, 1.0f, ctx);
//
// Alistarh et al., "QSGD" (NeurIPS'17). Each bucket of B elements sends its
// f32 L2 norm; element i is sent as a level l in [0, s] drawn so that
// E[l] = |x_i| s / norm (stochastic rounding from philox_stream(ctx.seed,
// ctx.step, ctx.tensor), word i % 4 of block i / 4), so E[decode] = x. Codes
// are l << 1 | sign in bits = 1 + bit_width(s) bits, packed LSB-first
// (detail/levels.hpp). Payload: u64 n, u32 bucket, u32 levels, ceil(n / B)
// f32 norms, ceil(n * bits / 8) code bytes;
// max_encoded_bytes(n, t) = 16 + 4 ceil(n / B) + ceil(n (1 + bit_width(s)) / 8),
// whatever t, and every payload has exactly that size.
// ALGORITHMS.md §4; docs/wire-format.md, "Codec payloads / qsgd".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/detail/host_simd.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/detail/elements.hpp>
#include <ashl/compress/detail/levels.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/wire/ids.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

struct qsgd_options {
  std::uint32_t levels = 127;  // s >= 1; 127 gives 8 bits per element
  std::uint32_t bucket = 512;  // elements per norm, >= 1
};

class qsgd {
 public:
  using codec_concept = codec_tag;
  static constexpr codec_id id = codec_id::qsgd;
  static constexpr std::size_t header_bytes = 16;  // n u64, bucket u32, levels u32
  static constexpr std::uint32_t max_levels = 32767;  // codes fit in 16 bits

  qsgd() = default;
  explicit qsgd(qsgd_options o) : opt_(o) {}
  [[nodiscard]] const qsgd_options& options() const noexcept { return opt_; }

  [[nodiscard]] status validate() const {
    if (opt_.levels < 1 || opt_.levels > max_levels)
      return invalid_argument("qsgd.levels", opt_.levels, "must be in [1, 32767]");
    if (opt_.bucket < 1) return invalid_argument("qsgd.bucket", opt_.bucket, "must be >= 1");
    return {};
  }

  static std::size_t payload_bytes(std::uint64_t n, std::uint32_t bucket, std::uint32_t levels) noexcept {
    const detail::level_spec s{bucket, levels};
    return header_bytes + 4 * detail::bucket_count(n, bucket) + detail::packed_bytes(n, s.bits());
  }
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n, dtype) const noexcept {
    return payload_bytes(n, opt_.bucket == 0 ? 1 : opt_.bucket, opt_.levels == 0 ? 1 : opt_.levels);
  }
  [[nodiscard]] std::size_t scratch_bytes(std::size_t, dtype) const noexcept { return 0; }

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
    ASHL_TRY(detail::check_decode_args("qsgd", info.type, info.count, acc.size(), scale));
    byte_reader r(in);
    std::uint64_t n = 0;
    std::uint32_t bucket = 0, levels = 0;
    ASHL_TRY(r.get(n, "qsgd.n"));
    ASHL_TRY(r.get(bucket, "qsgd.bucket"));
    ASHL_TRY(r.get(levels, "qsgd.levels"));
    if (n != info.count) return malformed("qsgd.n", n, "must equal info.count = " + std::to_string(info.count));
    if (n > detail::bucketed_max_elements) return malformed("qsgd.n", n, "exceeds 2^48");
    if (bucket < 1) return malformed("qsgd.bucket", bucket, "must be >= 1");
    if (levels < 1 || levels > max_levels) return malformed("qsgd.levels", levels, "must be in [1, 32767]");
    const std::size_t expect = payload_bytes(n, bucket, levels);
    if (in.size() != expect)
      return malformed("qsgd.payload_bytes", in.size(),
                       "must be 16 + 4 ceil(n / bucket) + ceil(n bits / 8) = " + std::to_string(expect));
    const detail::level_spec spec{bucket, levels, detail::bucket_norm::l2};
    const std::byte* norms = in.data() + header_bytes;
    const std::byte* codes = norms + 4 * detail::bucket_count(n, bucket);
    ASHL_TRY(detail::levels_validate("qsgd", spec, n, norms, codes));
    detail::levels_decode_add(spec, n, norms, codes, acc.data(), scale);
    return {};
  }

 private:
  template <class T>
  result<std::size_t> encode_impl(host_view<const T> xv, std::span<std::byte> out, const codec_context& ctx) const {
    ASHL_TRY(validate());
    const std::size_t n = xv.size();
    if (n > detail::bucketed_max_elements) return out_of_range("qsgd.input.size", n, "exceeds 2^48");
    const std::size_t need = payload_bytes(n, opt_.bucket, opt_.levels);
    if (out.size() < need)
      return make_error(errc::buffer_too_small, "qsgd.out.size", out.size(),
                        "bytes, fewer than max_encoded_bytes = " + std::to_string(need));
    std::byte* const base = out.data();
    detail::store_le<std::uint64_t>(base, n);
    detail::store_le<std::uint32_t>(base + 8, opt_.bucket);
    detail::store_le<std::uint32_t>(base + 12, opt_.levels);
    std::byte* norms = base + header_bytes;
    std::byte* codes = norms + 4 * detail::bucket_count(n, opt_.bucket);
    const detail::level_spec spec{opt_.bucket, opt_.levels, detail::bucket_norm::l2};
    const std::uint64_t bad =
        detail::levels_encode(xv.data(), n, spec, detail::random_words(ctx.seed, ctx.step, ctx.tensor), norms, codes);
    if (bad != n)
      return out_of_range("qsgd.input.bucket[" + std::to_string(bad) + "]", bad,
                          "has a non-finite L2 norm (inf/NaN input or overflow)");
    return need;
  }

  qsgd_options opt_{};
};

static_assert(codec<qsgd>);

ASHL_DETAIL_COMPRESS_HOST_END
