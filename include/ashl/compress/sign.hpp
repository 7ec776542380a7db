// ashl/compress/sign.hpp — scaled 1-bit sign compression (EF-signSGD).
//
//   ashl::compress::sign c{{.bucket = 512}};
//   std::vector<std::byte> buf(c.max_encoded_bytes(n, ashl::dtype::f32));
//   auto used = c.encode(ashl::host_view<const float>(g.data(), n), buf, ctx);
//   ashl::compress::sign{}.decode_add({buf.data(), *used}, {n, ashl::dtype::f32}, acc, 1.0f, ctx);
//
// Karimireddy et al., "Error feedback fixes SignSGD" (ICML'19). Each bucket of
// B elements sends one f32 scale d = mean |x| over the bucket and one bit per
// element (1 when x < 0, so +0 and -0 both send +d); decode adds scale * d *
// (bit ? -1 : +1), deterministically. Biased: pair it with error_feedback.
// Payload: u64 n, u32 bucket, ceil(n / B) f32 scales, ceil(n / 8) bit bytes
// (LSB-first, unused bits 0); max_encoded_bytes(n, t) = 12 + 4 ceil(n / B) +
// ceil(n / 8), whatever t, and every payload has exactly that size.
// docs/algorithms.md §4; docs/wire-format.md, "Codec payloads / sign".
#pragma once

#include <ashl/compress/detail/codec.hpp>
#include <ashl/compress/detail/bucketed.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/compress/detail/levels.hpp>
#include <ashl/compress/detail/quantize.hpp>
#include <ashl/core/bytes.hpp>

#include <bit>
#include <cmath>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

using sign_options = detail::bucket_options;

class sign : public detail::bucketed_codec<sign_options, codec_id::sign> {
 public:
  using bucketed_codec::bucketed_codec;

  template <gradient_element T>
  result<std::size_t> encode(host_view<const T> xv, std::span<std::byte> out, const codec_context&) const {
    ASHL_TRY(validate());
    const std::size_t n = xv.size();
    auto w = detail::write_bucketed_header(payload_format, {n, opt_.bucket}, out);
    if (!w) return w.error();
    const std::size_t need = w->bytes;
    std::byte* scales = w->scales;
    std::byte* bits = w->codes;
    // Chunks of 1024 elements (multiples of 8, so each starts on a bit
    // byte): the scales of the buckets the chunk touches first, then the
    // chunk's bits. 16-bit input is read as it is where AVX2 and F16C run
    // (detail::direct_16); otherwise each chunk is widened once and both the
    // bucket means of the buckets inside it and its bits come from that
    // copy. A bucket that crosses a chunk boundary sums its pieces
    // separately (detail/levels.hpp does the same for qsgd and terngrad).
    // Every route sums the same floats in the same order: the same bytes.
    const T* x = xv.data();
    const std::uint64_t B = opt_.bucket;
    const bool direct = detail::direct_16<T>();
    float xbuf[detail::chunk], sbuf[detail::chunk];
    const auto sum_abs = [&](std::uint64_t lo, std::size_t len, const float* widened) {
      if constexpr (!std::is_same_v<T, float>)
        if (direct) return detail::sum_abs_f64_16(x + lo, len);
      return detail::sum_abs_f64(widened != nullptr ? widened : detail::as_float(x + lo, len, sbuf), len);
    };
    std::uint64_t scaled = 0;
    for (std::uint64_t c0 = 0; c0 < n; c0 += detail::chunk) {
      const std::size_t m = static_cast<std::size_t>(n - c0 < detail::chunk ? n - c0 : detail::chunk);
      detail::prefetch_ahead(x, n, c0 + 2 * detail::chunk);
      const float* xf = direct ? nullptr : detail::as_float(x + c0, m, xbuf);
      for (const std::uint64_t last = (c0 + m - 1) / B; scaled <= last; ++scaled) {
        const std::uint64_t lo = scaled * B, len = lo + B < n ? B : n - lo;
        double sum = 0.0;
        if (lo >= c0 && lo + len <= c0 + m) {
          sum = sum_abs(lo, static_cast<std::size_t>(len), xf != nullptr ? xf + (lo - c0) : nullptr);
        } else {
          for (std::uint64_t p = 0; p < len; p += detail::chunk) {
            const std::size_t k = static_cast<std::size_t>(len - p < detail::chunk ? len - p : detail::chunk);
            sum += sum_abs(lo + p, k, nullptr);
          }
        }
        const float d = static_cast<float>(sum / static_cast<double>(len));
        if (!std::isfinite(d))
          return out_of_range("sign.input.bucket[" + std::to_string(scaled) + "]", scaled,
                              "has a non-finite mean |x| (inf/NaN input)");
        detail::store_le<float>(scales + 4 * scaled, d);
      }
      if constexpr (!std::is_same_v<T, float>)
        if (direct) {
          detail::negative_bits_16(x + c0, m, bits + c0 / 8);
          continue;
        }
      detail::negative_bits(xf, m, bits + c0 / 8);
    }
    return need;
  }

  status decode_add(std::span<const std::byte> in, payload_info info, host_view<float> acc, float scale,
                    const codec_context&) const {
    const auto p = detail::read_bucketed_header(payload_format, in, info, acc.size(), scale);
    if (!p) return p.error();
    const std::uint64_t n = p->header.n, bucket = p->header.bucket;
    const std::uint64_t nb = detail::bucket_count(n, bucket);
    const std::byte* scales = p->scales;
    const std::byte* bits = p->codes;
    for (std::uint64_t b = 0; b < nb; ++b) {
      const float d = detail::load_le<float>(scales + 4 * b);
      if (!(std::isfinite(d) && d >= 0.0f))
        return malformed("sign.scale[" + std::to_string(b) + "]", d, "must be finite and >= 0");
    }
    if (n % 8 != 0) {
      const unsigned pad = static_cast<unsigned>(bits[n / 8]) >> (n % 8);
      if (pad != 0) return malformed("sign.padding", pad, "unused bits must be 0");
    }
    float* a = acc.data();
    for (std::uint64_t b = 0; b < nb; ++b) {
      const std::uint64_t lo = b * bucket, hi = lo + bucket < n ? lo + bucket : n;
      // -d as d with the sign bit flipped (the same bits), so signs that
      // are random do not cost a mispredicted branch each.
      const std::uint32_t du = std::bit_cast<std::uint32_t>(scale * detail::load_le<float>(scales + 4 * b));
      std::uint64_t i = lo;
      for (; i < hi && (i & 7u) != 0; ++i)
        a[i] += std::bit_cast<float>(du ^ (((static_cast<std::uint32_t>(bits[i >> 3]) >> (i & 7u)) & 1u) << 31));
      for (; i + 8 <= hi; i += 8) {  // whole bytes: eight lanes from one load
        const std::uint32_t byte = static_cast<std::uint32_t>(bits[i >> 3]);
        for (unsigned j = 0; j < 8; ++j) a[i + j] += std::bit_cast<float>(du ^ (((byte >> j) & 1u) << 31));
      }
      for (; i < hi; ++i)
        a[i] += std::bit_cast<float>(du ^ (((static_cast<std::uint32_t>(bits[i >> 3]) >> (i & 7u)) & 1u) << 31));
    }
    return {};
  }
};

static_assert(codec<sign>);

ASHL_DETAIL_COMPRESS_HOST_END
