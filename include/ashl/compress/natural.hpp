// ashl/compress/natural.hpp — natural compression: stochastic rounding to powers of two.
//
//   ashl::compress::natural c;
//   std::vector<std::byte> buf(c.max_encoded_bytes(n, ashl::dtype::f32));   // 12 + n
//   auto used = c.encode(ashl::host_view<const float>(g.data(), n), buf, ctx);
//   ashl::compress::natural{}.decode_add({buf.data(), *used}, {n, ashl::dtype::f32}, acc, 1.0f, ctx);
//
// Horváth et al., "Natural compression for distributed deep learning" (2019).
// One byte per element: bit 7 the sign, bits 0..6 a code c; c = 0 is zero
// (sign 0), c >= 1 is 2^(emin + c - 1). The payload's emin is chosen so the top
// code 127 is the power of two just above max |x| (emin = min(e - 126, 1) with
// max |x| < 2^e), so the 127 codes span the tensor's range. |x| in
// [2^(k-1), 2^k) rounds up to 2^k with probability |x| / 2^(k-1) - 1, else down;
// |x| < 2^emin rounds to 2^emin with probability |x| / 2^emin, else to 0. Both
// are unbiased (E[decode] = x); only |x| >= 2^127 (emin clamped to 1) rounds
// down to 2^127 deterministically. Draws u_i from philox_stream(ctx.seed,
// ctx.step, ctx.tensor), word i % 4 of block i / 4 (drawn in bulk by
// detail::random_words). Payload: u64 n, i32 emin,
// n code bytes; max_encoded_bytes(n, t) = 12 + n, whatever t, and every
// payload has exactly that size. docs/algorithms.md §4; docs/wire-format.md,
// "Codec payloads / natural".
#pragma once

#include <ashl/compress/detail/codec.hpp>
#include <ashl/compress/detail/levels.hpp>
#include <ashl/compress/detail/quantize.hpp>
#include <ashl/compress/detail/random_words.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/philox.hpp>

#include <bit>
#include <cmath>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

class natural : public detail::codec_base<codec_id::natural> {
 public:
  // The header (n u64, emin i32) and the emin range are compress/layout.hpp's,
  // shared with the device codec: max |x| = 2^-149 (smallest subnormal) gives
  // -274; the clamp gives 1.
  static constexpr std::size_t header_bytes = layout::natural::header_bytes;
  static constexpr std::int32_t min_emin = layout::natural::min_emin, max_emin = layout::natural::max_emin;

  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n, dtype) const noexcept { return header_bytes + n; }
  [[nodiscard]] std::size_t scratch_bytes(std::size_t, dtype) const noexcept { return 0; }

  template <gradient_element T>
  result<std::size_t> encode(host_view<const T> xv, std::span<std::byte> out, const codec_context& ctx) const {
    const std::size_t n = xv.size();
    const std::size_t need = header_bytes + n;
    if (out.size() < need)
      return make_error(errc::buffer_too_small, "natural.out.size", out.size(),
                        "bytes, fewer than max_encoded_bytes = " + std::to_string(need));
    // Two chunked passes: max |x| (vector max of the |x| bit patterns,
    // which also catches inf/NaN), then 1024 codes at a time from bulk
    // Philox words (detail::natural_codes, branch-free).
    const T* x = xv.data();
    float buf[detail::chunk];
    std::uint32_t max_key = 0;
    for (std::size_t p = 0; p < n; p += detail::chunk) {
      const std::size_t m = n - p < detail::chunk ? n - p : detail::chunk;
      const std::uint32_t k = detail::max_abs_key(detail::as_float(x + p, m, buf), m);
      max_key = k > max_key ? k : max_key;
    }
    const float mx = std::bit_cast<float>(max_key);
    if (!std::isfinite(mx)) return out_of_range("natural.input.max_abs", mx, "must be finite (inf/NaN input)");
    int e = 0;
    (void)std::frexp(mx, &e);
    const std::int32_t emin = mx == 0.0f ? 0 : (e - 126 < max_emin ? e - 126 : max_emin);
    std::byte* const base = out.data();
    detail::store_le<std::uint64_t>(base, n);
    detail::store_le<std::int32_t>(base + 8, emin);
    std::byte* codes = base + header_bytes;
    // 2^(24 - emin) (up to 2^298) as three factors of at most 2^127 each.
    float f[3];
    for (int j = 0, rest = 24 - emin; j < 3; ++j) {
      const int p = rest < 127 ? rest : 127;
      f[j] = std::ldexp(1.0f, p);
      rest -= p;
    }
    const detail::random_words rw(ctx.seed, ctx.step, ctx.tensor);
    std::uint32_t words[detail::chunk];
    for (std::size_t p = 0; p < n; p += detail::chunk) {
      const std::size_t m = n - p < detail::chunk ? n - p : detail::chunk;
      // The second read of x: ask for the chunk after next while this one is coded.
      detail::prefetch_ahead(x, n, p + 2 * detail::chunk);
      rw.fill(p / 4, (m + 3) / 4, words);
      detail::natural_codes(detail::as_float(x + p, m, buf), m, emin, f, words, codes + p);
    }
    return need;
  }

  status decode_add(std::span<const std::byte> in, payload_info info, host_view<float> acc, float scale,
                    const codec_context&) const {
    ASHL_TRY(detail::check_decode_args("natural", info.type, info.count, acc.size(), scale));
    byte_reader r(in);
    std::uint64_t n = 0;
    std::int32_t emin = 0;
    ASHL_TRY(r.get(n, "natural.n"));
    ASHL_TRY(r.get(emin, "natural.emin"));
    if (n != info.count) return malformed("natural.n", n, "must equal info.count = " + std::to_string(info.count));
    if (emin < min_emin || emin > max_emin) return malformed("natural.emin", emin, "must be in [-274, 1]");
    if (in.size() - header_bytes != n)
      return malformed("natural.payload_bytes", in.size(), "must be 12 + n = " + std::to_string(n + header_bytes));
    const std::byte* codes = in.data() + header_bytes;
    for (std::uint64_t i = 0; i < n; ++i)
      if (codes[i] == std::byte{0x80})
        return malformed("natural.code[" + std::to_string(i) + "]", 0x80, "negative zero is not a valid code");
    float table[256];  // every code's scaled value: one lookup per element
    table[0] = 0.0f;
    for (int c = 1; c < 128; ++c) table[c] = scale * std::ldexp(1.0f, emin + c - 1);
    for (int c = 0; c < 128; ++c) table[128 + c] = -table[c];
    float* a = acc.data();
    for (std::uint64_t i = 0; i < n; ++i) a[i] += table[static_cast<unsigned>(codes[i])];
    return {};
  }

};

static_assert(codec<natural>);

ASHL_DETAIL_COMPRESS_HOST_END
