// ashl/compress/block.hpp — block-scaled 8-, 4- and 2-bit integers (absmax
// per block, symmetric): the low-bit pseudo-gradients of Streaming DiLoCo
// (4 bits) and SparseLoCo (2 bits).
//
//   ashl::compress::block_quant c{{.bits = 4, .block = 128}};   // 4 + 32/128 bits per element
//   std::vector<std::byte> buf(c.max_encoded_bytes(n, ashl::dtype::f32));
//   auto used = c.encode(ashl::host_view<const float>(g.data(), n), buf, ctx);
//   ashl::compress::block_quant{}.decode_add({buf.data(), *used}, {n, ashl::dtype::f32}, acc, 1.0f, ctx);
//
// The tensor is cut into blocks of B elements (the last one may be shorter:
// the tail block, scaled by its own absmax). Block b sends one f32 step
// d_b = absmax_b / m with m = 2^(bits-1) - 1 (127, 7 or 1), and each
// element one `bits`-bit two's-complement code q in [-m, m] (the code -m-1
// is never sent and a decoder refuses it); decode adds scale * d_b * q.
// Rounding: nearest, ties to even, of x * r with r = m / absmax_b (both f32,
// r computed once per block), so |x - d_b q| <= d_b (1/2 + m 2^-22) (the
// f32 roundings of r, x r, d_b and d_b q add the second term); or, with `stochastic`,
// q = floor(x r + u), u = (word >> 8) 2^-24 from philox_stream(ctx.seed,
// ctx.step, ctx.tensor), word i % 4 of block i / 4 (as qsgd), which is
// unbiased (E[d_b q] = x) up to the f32 rounding of x r + u, with
// |x - d_b q| < d_b. A block whose absmax is below 2^-120 (where m / absmax
// would overflow f32) is sent as zero, step 0: its error is below 2^-120.
// Non-finite input is refused (block.input.block[b]). Biased in nearest
// mode: pair it with error feedback (compress::error_feedback, or the
// commit encoder's residuals), as the papers do.
// Payload (compress/layout.hpp): u64 n, u32 B, u8 bits, u8 rounding (0
// nearest, 1 stochastic), u16 0, nb = ceil(n / B) f32 steps, then the codes
// as one LSB-first bit stream: 8 bits one int8 per element, 4 bits element
// 2j in the low nibble of byte j and 2j + 1 in the high one, 2 bits element
// 4j + k in bits 2k..2k+1 of byte j; the unused bits of the last byte are 0.
// B is a multiple of 8 in [8, 65536], so every block starts on a byte.
// max_encoded_bytes(n, t) = 16 + 4 ceil(n / B) + ceil(n bits / 8), whatever
// t, and every payload has exactly that size. docs/codecs.md "block";
// docs/algorithms.md §6 (the DiLoCo family); docs/wire-format.md "Codec
// payloads / block".
#pragma once

#include <ashl/compress/detail/codec.hpp>
#include <ashl/compress/detail/block_kernels.hpp>
#include <ashl/compress/detail/levels.hpp>
#include <ashl/compress/detail/quantize.hpp>
#include <ashl/compress/detail/random_words.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/core/bytes.hpp>

#include <bit>
#include <cmath>
#include <string>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

struct block_quant_options {
  std::uint32_t bits = 4;     // 2, 4 or 8
  std::uint32_t block = 64;   // B: elements per step, a multiple of 8 in [8, 65536]
  bool stochastic = false;    // stochastic rounding (unbiased) instead of nearest even
};

class block_quant : public detail::codec_base<codec_id::block> {
 public:
  static constexpr std::size_t header_bytes = layout::block::header_bytes;
  // Below this absmax a block is sent as zero (m / absmax would overflow).
  static constexpr float min_absmax = 0x1p-120f;

  block_quant() = default;
  explicit block_quant(block_quant_options o) : opt_(o) {}
  [[nodiscard]] const block_quant_options& options() const noexcept { return opt_; }

  // Options a payload can carry, named by field: <prefix>bits and
  // <prefix>block ("block.bits"; a plan's "plan_update.codec_bits").
  [[nodiscard]] static status validate(const block_quant_options& o, std::string_view prefix = "block.") {
    if (!layout::block_bits_valid(o.bits))
      return invalid_argument(std::string(prefix) + "bits", o.bits, "must be 2, 4 or 8");
    if (!layout::block_size_valid(o.block))
      return invalid_argument(std::string(prefix) + "block", o.block, "must be a multiple of 8 in [8, 65536]");
    return {};
  }
  [[nodiscard]] status validate() const { return validate(opt_); }

  static std::size_t payload_bytes(std::uint64_t n, std::uint32_t block, unsigned bits) noexcept {
    return static_cast<std::size_t>(layout::block_payload_bytes(n, block, bits));
  }
  // A refused option still gives a size (the largest bits, the smallest block).
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n, dtype) const noexcept {
    return payload_bytes(n, layout::block_size_valid(opt_.block) ? opt_.block : layout::block::min_block,
                         layout::block_bits_valid(opt_.bits) ? opt_.bits : 8u);
  }
  [[nodiscard]] std::size_t scratch_bytes(std::size_t, dtype) const noexcept { return 0; }

  template <gradient_element T>
  result<std::size_t> encode(host_view<const T> xv, std::span<std::byte> out, const codec_context& ctx) const {
    ASHL_TRY(validate());
    const std::uint64_t n = xv.size();
    if (n > layout::bucketed_max_elements) return out_of_range("block.input.size", n, "exceeds 2^48");
    const unsigned bits = opt_.bits;
    const std::uint64_t B = opt_.block;
    const std::size_t need = payload_bytes(n, opt_.block, bits);
    if (out.size() < need)
      return make_error(errc::buffer_too_small, "block.out.size", out.size(),
                        "bytes, fewer than max_encoded_bytes = " + std::to_string(need));
    std::byte* const base = out.data();
    detail::store_le<std::uint64_t>(base, n);
    detail::store_le<std::uint32_t>(base + layout::block::block_offset, opt_.block);
    base[layout::block::bits_offset] = static_cast<std::byte>(bits);
    base[layout::block::rounding_offset] =
        static_cast<std::byte>(opt_.stochastic ? layout::block::rounding_stochastic : layout::block::rounding_nearest);
    detail::store_le<std::uint16_t>(base + layout::block::reserved_offset, 0);
    std::byte* const steps = base + header_bytes;
    std::byte* const codes = base + layout::block_codes_offset(n, B);
    const float m = static_cast<float>(layout::block_max_code(bits));
    const T* x = xv.data();
    const detail::random_words rw(ctx.seed, ctx.step, ctx.tensor);
    float buf[detail::block_piece];
    std::uint32_t words[detail::block_piece];
    // Blocks of up to block_piece elements go in groups that fill a piece:
    // a 16-bit group is widened once and its random words drawn at once
    // (one Philox call per piece, not per block). A larger block goes in
    // pieces, read twice (absmax, then codes).
    const std::uint64_t group = B <= detail::block_piece ? (detail::block_piece / B) * B : B;
    for (std::uint64_t g0 = 0; g0 < n; g0 += group) {
      const std::uint64_t glen = n - g0 < group ? n - g0 : group;
      detail::prefetch_ahead(x, n, g0 + 2 * group);
      if (B <= detail::block_piece) {
        const std::size_t k = static_cast<std::size_t>(glen);
        const float* xf = detail::as_float(x + g0, k, buf);
        if (opt_.stochastic) rw.fill(g0 / 4, (k + 3) / 4, words);
        ASHL_TRY(encode_group(g0 / B, xf, k, static_cast<std::size_t>(B), m, opt_.stochastic ? words : nullptr, bits,
                              steps, codes + g0 * bits / 8));
        continue;
      }
      // One block of more than a piece.
      std::uint32_t key = 0;
      for (std::uint64_t p = 0; p < glen; p += detail::block_piece) {
        const std::size_t k = static_cast<std::size_t>(glen - p < detail::block_piece ? glen - p : detail::block_piece);
        const std::uint32_t kk = detail::max_abs_key(detail::as_float(x + g0 + p, k, buf), k);
        key = kk > key ? kk : key;
      }
      const std::uint64_t b = g0 / B;
      ASHL_TRY(check_key(b, key));
      const float absmax = std::bit_cast<float>(key);
      if (absmax < min_absmax) {
        zero_block(b, static_cast<std::size_t>(glen), bits, steps, codes + g0 * bits / 8);
        continue;
      }
      detail::store_le<float>(steps + 4 * b, absmax / m);
      const float r = m / absmax;
      for (std::uint64_t p = 0; p < glen; p += detail::block_piece) {
        const std::size_t k = static_cast<std::size_t>(glen - p < detail::block_piece ? glen - p : detail::block_piece);
        const float* piece = detail::as_float(x + g0 + p, k, buf);
        if (opt_.stochastic) rw.fill((g0 + p) / 4, (k + 3) / 4, words);
        detail::block_codes(piece, k, r, m, bits, opt_.stochastic ? words : nullptr, codes + (g0 + p) * bits / 8);
      }
    }
    return need;
  }

  status decode_add(std::span<const std::byte> in, payload_info info, host_view<float> acc, float scale,
                    const codec_context&) const {
    ASHL_TRY(detail::check_decode_args("block", info.type, info.count, acc.size(), scale));
    byte_reader r(in);
    std::uint64_t n = 0;
    std::uint32_t B = 0;
    std::uint8_t bits = 0, rounding = 0;
    std::uint16_t reserved = 0;
    ASHL_TRY(r.get(n, "block.n"));
    ASHL_TRY(r.get(B, "block.block"));
    ASHL_TRY(r.get(bits, "block.bits"));
    ASHL_TRY(r.get(rounding, "block.rounding"));
    ASHL_TRY(r.get(reserved, "block.reserved"));
    if (n != info.count) return malformed("block.n", n, "must equal info.count = " + std::to_string(info.count));
    if (n > layout::bucketed_max_elements) return malformed("block.n", n, "exceeds 2^48");
    if (!layout::block_size_valid(B)) return malformed("block.block", B, "must be a multiple of 8 in [8, 65536]");
    if (!layout::block_bits_valid(bits)) return malformed("block.bits", bits, "must be 2, 4 or 8");
    if (rounding > layout::block::rounding_stochastic)
      return malformed("block.rounding", rounding, "must be 0 (nearest) or 1 (stochastic)");
    if (reserved != 0) return malformed("block.reserved", reserved, "must be 0");
    const std::size_t expect = payload_bytes(n, B, bits);
    if (in.size() != expect)
      return malformed("block.payload_bytes", in.size(),
                       "must be 16 + 4 ceil(n / block) + ceil(n bits / 8) = " + std::to_string(expect));
    const std::uint64_t nb = layout::bucket_count(n, B);
    const std::byte* steps = in.data() + header_bytes;
    const std::byte* codes = in.data() + layout::block_codes_offset(n, B);
    // Validation first, whole: steps, codes, padding; then the add.
    std::uint32_t bad_steps = 0;
    for (std::uint64_t b = 0; b < nb; ++b)  // finite and >= +0: the bits are below 0x7f800000
      bad_steps |= static_cast<std::uint32_t>(detail::load_le<std::uint32_t>(steps + 4 * b) >= 0x7f800000u);
    if (bad_steps != 0)
      for (std::uint64_t b = 0; b < nb; ++b) {
        const float d = detail::load_le<float>(steps + 4 * b);
        if (!(std::isfinite(d) && d >= 0.0f) || std::signbit(d))
          return malformed("block.step[" + std::to_string(b) + "]", d, "must be finite and >= 0");
      }
    const std::size_t code_bytes = static_cast<std::size_t>(layout::packed_bytes(n, bits));
    if (!detail::block_codes_valid(codes, code_bytes, bits)) {
      for (std::size_t j = 0; j < code_bytes; ++j)
        if (!detail::block_codes_valid(codes + j, 1, bits))
          return malformed("block.code_byte[" + std::to_string(j) + "]", static_cast<unsigned>(codes[j]),
                           "holds the code -2^(bits-1), which is never sent");
    }
    if (const unsigned used = static_cast<unsigned>((n * bits) % 8); used != 0) {
      const unsigned pad = static_cast<unsigned>(codes[code_bytes - 1]) >> used;
      if (pad != 0) return malformed("block.padding", pad, "unused bits must be 0");
    }
    float* a = acc.data();
    for (std::uint64_t b = 0; b < nb; ++b) {
      const std::uint64_t lo = b * B, len = lo + B < n ? B : n - lo;
      const float f = scale * detail::load_le<float>(steps + 4 * b);
      detail::block_add(codes + lo * bits / 8, static_cast<std::size_t>(len), bits, f, a + lo);
    }
    return {};
  }

 private:
  static status check_key(std::uint64_t b, std::uint32_t key) {
    if (key >= 0x7f800000u)  // the |x| bit pattern of an inf or NaN
      return out_of_range("block.input.block[" + std::to_string(b) + "]", b, "holds an inf or NaN");
    return {};
  }
  static void zero_block(std::uint64_t b, std::size_t len, unsigned bits, std::byte* steps, std::byte* codes) {
    detail::store_le<float>(steps + 4 * b, 0.0f);
    const std::size_t cb = (len * bits + 7) / 8;
    for (std::size_t j = 0; j < cb; ++j) codes[j] = std::byte{0};
  }
  // The blocks b0, b0 + 1, ... of len (<= block_piece) widened elements xf
  // in blocks of B (the last may be shorter): their steps and codes. All
  // magnitudes first, then the steps and multipliers, then the codes in one
  // call: no block waits on its own max and divisions before its codes
  // start, and the SIMD path is chosen once per group, not per block.
  static status encode_group(std::uint64_t b0, const float* xf, std::size_t len, std::size_t B, float m,
                             const std::uint32_t* words, unsigned bits, std::byte* steps, std::byte* codes) {
    constexpr std::size_t most = detail::block_piece / layout::block::min_block;
    std::uint32_t key[most];
    float r[most];
    const std::size_t nb = (len + B - 1) / B;
    detail::block_keys(xf, len, B, key);
    std::uint32_t bad = 0;
    for (std::size_t j = 0; j < nb; ++j) bad |= static_cast<std::uint32_t>(key[j] >= 0x7f800000u);
    if (bad != 0)
      for (std::size_t j = 0; j < nb; ++j) ASHL_TRY(check_key(b0 + j, key[j]));
    for (std::size_t j = 0; j < nb; ++j) {
      // A block below min_absmax sends step 0 and multiplier 0: x 0 + u
      // (u < 1) and x 0 both give the code 0.
      const float absmax = std::bit_cast<float>(key[j]);
      const bool zero = absmax < min_absmax;
      detail::store_le<float>(steps + 4 * (b0 + j), zero ? 0.0f : absmax / m);
      r[j] = zero ? 0.0f : m / absmax;
    }
    detail::block_codes_group(xf, len, B, r, m, bits, words, codes);
    return {};
  }

  block_quant_options opt_{};
};

static_assert(codec<block_quant>);

ASHL_DETAIL_COMPRESS_HOST_END
