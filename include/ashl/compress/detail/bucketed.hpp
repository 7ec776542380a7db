// ashl/compress/detail/bucketed.hpp — the header of a bucketed payload
// (qsgd, terngrad, sign), written and read in one place.
//
//   constexpr detail::bucketed_format fmt{"sign", layout::sign::header_bytes, 1, "ceil(n / 8)",
//                                         "sign.n", "sign.bucket", ""};
//   auto w = detail::write_bucketed_header(fmt, {n, bucket}, out);          // encode: w->scales, w->codes
//   auto r = detail::read_bucketed_header(fmt, in, info, acc.size(), scale);  // decode: r->header.n
//
// Layout (compress/layout.hpp): u64 n, u32 bucket, [u32 levels,] f32
// scale[ceil(n / bucket)], then n codes of a fixed width packed LSB-first.
// The writer checks n and the output size; the reader checks the decode
// arguments, every header field, and the exact payload size, with the error
// messages the codecs gave before (the field names come from the format).
// docs/wire-format.md "Codec payloads"; docs/algorithms.md §4.
#pragma once

#include <ashl/compress/detail/codec.hpp>
#include <ashl/compress/detail/levels.hpp>
#include <ashl/compress/detail/random_words.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/core/bytes.hpp>

#include <string_view>

ASHL_DETAIL_COMPRESS_HOST_BEGIN
namespace detail {

// One bucketed payload kind.
struct bucketed_format {
  std::string_view codec;         // "qsgd": prefix of the encode-side fields
  std::uint64_t header_bytes;     // layout::<codec>::header_bytes
  unsigned code_bits;             // bits per element; 0: from the levels field (qsgd)
  std::string_view size_rule;     // how the codes' bytes follow from n, for the size message
  std::string_view n_field, bucket_field, levels_field;  // "qsgd.n", ...; levels_field only for qsgd
  std::uint32_t max_levels = 0;   // qsgd: the largest levels field accepted
};

struct bucketed_header {
  std::uint64_t n = 0;
  std::uint32_t bucket = 0;
  std::uint32_t levels = 0;  // qsgd only
};

// The three bucketed payload kinds, by wire id (layout.hpp has their sizes).
constexpr bucketed_format bucketed_format_of(codec_id id) noexcept {
  switch (id) {
    case codec_id::sign:
      return {"sign", layout::sign::header_bytes, layout::sign::code_bits, "ceil(n / 8)", "sign.n", "sign.bucket", ""};
    case codec_id::terngrad:
      return {"terngrad", layout::terngrad::header_bytes, layout::terngrad::code_bits, "ceil(n / 4)", "terngrad.n",
              "terngrad.bucket", ""};
    default:
      return {"qsgd",        layout::qsgd::header_bytes, 0, "ceil(n bits / 8)", "qsgd.n", "qsgd.bucket",
              "qsgd.levels", layout::qsgd::max_levels};
  }
}

// The options of a bucketed codec that has nothing but its bucket (sign, terngrad).
struct bucket_options {
  std::uint32_t bucket = 512;  // elements per scale, >= 1
};

inline std::uint64_t bucketed_bytes(const bucketed_format& f, const bucketed_header& h) noexcept {
  const unsigned bits = f.code_bits != 0 ? f.code_bits : layout::qsgd_code_bits(h.levels);
  return layout::bucketed_payload_bytes(f.header_bytes, h.n, h.bucket, bits);
}

// Where the scales and the codes go (encode) or come from (decode).
template <class Byte>
struct bucketed_parts {
  bucketed_header header;
  Byte* scales = nullptr;
  Byte* codes = nullptr;
  std::size_t bytes = 0;  // the whole payload
};

// Checks n and out's size, writes the header.
inline result<bucketed_parts<std::byte>> write_bucketed_header(const bucketed_format& f, const bucketed_header& h,
                                                               std::span<std::byte> out) {
  if (h.n > layout::bucketed_max_elements)
    return out_of_range(std::string(f.codec) + ".input.size", h.n, "exceeds 2^48");
  const std::size_t need = bucketed_bytes(f, h);
  if (out.size() < need)
    return make_error(errc::buffer_too_small, std::string(f.codec) + ".out.size", out.size(),
                      "bytes, fewer than max_encoded_bytes = " + std::to_string(need));
  std::byte* const base = out.data();
  store_le<std::uint64_t>(base, h.n);
  store_le<std::uint32_t>(base + 8, h.bucket);
  if (f.code_bits == 0) store_le<std::uint32_t>(base + 12, h.levels);
  std::byte* scales = base + f.header_bytes;
  return bucketed_parts<std::byte>{h, scales, scales + 4 * layout::bucket_count(h.n, h.bucket), need};
}

// Checks the decode arguments, the header's fields and the payload's size.
inline result<bucketed_parts<const std::byte>> read_bucketed_header(const bucketed_format& f,
                                                                    std::span<const std::byte> in, payload_info info,
                                                                    std::size_t acc_size, float scale) {
  ASHL_TRY(check_decode_args(f.codec, info.type, info.count, acc_size, scale));
  byte_reader r(in);
  bucketed_header h;
  ASHL_TRY(r.get(h.n, f.n_field));
  ASHL_TRY(r.get(h.bucket, f.bucket_field));
  if (f.code_bits == 0) ASHL_TRY(r.get(h.levels, f.levels_field));
  if (h.n != info.count)
    return malformed(f.n_field, h.n, "must equal info.count = " + std::to_string(info.count));
  if (h.n > layout::bucketed_max_elements) return malformed(f.n_field, h.n, "exceeds 2^48");
  if (h.bucket < 1) return malformed(f.bucket_field, h.bucket, "must be >= 1");
  if (f.code_bits == 0 && (h.levels < 1 || h.levels > f.max_levels))
    return malformed(f.levels_field, h.levels, "must be in [1, " + std::to_string(f.max_levels) + "]");
  const std::size_t expect = bucketed_bytes(f, h);
  if (in.size() != expect)
    return malformed(std::string(f.codec) + ".payload_bytes", in.size(),
                     "must be " + std::to_string(f.header_bytes) + " + 4 ceil(n / bucket) + " +
                         std::string(f.size_rule) + " = " + std::to_string(expect));
  const std::byte* scales = in.data() + f.header_bytes;
  return bucketed_parts<const std::byte>{h, scales, scales + 4 * layout::bucket_count(h.n, h.bucket), expect};
}

// The options half of a bucketed codec (sign, terngrad, qsgd), which the
// codec derives from: Options has `bucket` (and `levels` for qsgd), Id picks
// the payload_format. validate() refuses a bucket (or levels) the payload
// cannot carry; payload_bytes is the layout.hpp size, and max_encoded_bytes
// that size for the options, a refused 0 taken as 1 so that it is still a
// size.
template <class Options, codec_id Id>
class bucketed_codec : public codec_base<Id> {
 protected:
  static constexpr bool has_levels = requires(const Options& o) { o.levels; };

 public:
  static constexpr bucketed_format payload_format = bucketed_format_of(Id);

  bucketed_codec() = default;
  explicit bucketed_codec(Options o) : opt_(o) {}
  [[nodiscard]] const Options& options() const noexcept { return opt_; }

  [[nodiscard]] status validate() const {
    constexpr const bucketed_format& f = payload_format;
    if constexpr (has_levels)
      if (opt_.levels < 1 || opt_.levels > f.max_levels)
        return invalid_argument(f.levels_field, opt_.levels, "must be in [1, " + std::to_string(f.max_levels) + "]");
    if (opt_.bucket < 1) return invalid_argument(f.bucket_field, opt_.bucket, "must be >= 1");
    return {};
  }

  // The payload of n elements; every payload has exactly this size.
  static std::size_t payload_bytes(std::uint64_t n, std::uint32_t bucket) noexcept
    requires(!has_levels)
  {
    return static_cast<std::size_t>(bucketed_bytes(payload_format, {n, bucket, 0}));
  }
  static std::size_t payload_bytes(std::uint64_t n, std::uint32_t bucket, std::uint32_t levels) noexcept
    requires has_levels
  {
    return static_cast<std::size_t>(bucketed_bytes(payload_format, {n, bucket, levels}));
  }
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n, dtype) const noexcept {
    if constexpr (has_levels)
      return payload_bytes(n, opt_.bucket == 0 ? 1 : opt_.bucket, opt_.levels == 0 ? 1 : opt_.levels);
    else
      return payload_bytes(n, opt_.bucket == 0 ? 1 : opt_.bucket);
  }
  [[nodiscard]] std::size_t scratch_bytes(std::size_t, dtype) const noexcept { return 0; }

 protected:
  Options opt_{};
};

// qsgd and terngrad whole: a bucketed payload of stochastic levels
// (detail/levels.hpp) with `levels` levels per sign and per-bucket `norm`.
// `bad_norm` says why a bucket's norm was refused.
template <gradient_element T>
result<std::size_t> levels_payload_encode(const bucketed_format& f, const bucketed_header& h, std::uint32_t levels,
                                          bucket_norm norm, const T* x, std::span<std::byte> out,
                                          const codec_context& ctx, std::string_view bad_norm) {
  const auto w = write_bucketed_header(f, h, out);
  if (!w) return w.error();
  const level_spec spec{h.bucket, levels, norm};
  const random_words rw(ctx.seed, ctx.step, ctx.tensor);
  const std::uint64_t bad = levels_encode(x, h.n, spec, rw, w->scales, w->codes);
  if (bad != h.n)
    return out_of_range(std::string(f.codec) + ".input.bucket[" + std::to_string(bad) + "]", bad, bad_norm);
  return w->bytes;
}
// `levels`: the count the format fixes (terngrad: 1), or 0 to take the header's (qsgd).
inline status levels_payload_decode_add(const bucketed_format& f, std::uint32_t levels, bucket_norm norm,
                                        std::span<const std::byte> in, payload_info info, host_view<float> acc,
                                        float scale) {
  const auto p = read_bucketed_header(f, in, info, acc.size(), scale);
  if (!p) return p.error();
  const level_spec spec{p->header.bucket, levels != 0 ? levels : p->header.levels, norm};
  ASHL_TRY(levels_validate(f.codec, spec, p->header.n, p->scales, p->codes));
  levels_decode_add(spec, p->header.n, p->scales, p->codes, acc.data(), scale);
  return {};
}

// qsgd and terngrad as one codec: a bucketed payload of stochastic levels
// with Norm per bucket; `levels` levels per sign from the options (qsgd) or
// one (terngrad, whose options have no levels).
template <class Options, codec_id Id, bucket_norm Norm>
class levels_codec : public bucketed_codec<Options, Id> {
  using base = bucketed_codec<Options, Id>;

 public:
  using base::base;

  template <gradient_element T>
  result<std::size_t> encode(host_view<const T> xv, std::span<std::byte> out, const codec_context& ctx) const {
    ASHL_TRY(this->validate());
    constexpr std::string_view bad_norm = Norm == bucket_norm::l2
                                              ? "has a non-finite L2 norm (inf/NaN input or overflow)"
                                              : "has a non-finite max |x| (inf/NaN input)";
    const std::uint32_t levels = levels_of(this->opt_);
    return levels_payload_encode(base::payload_format, {xv.size(), this->opt_.bucket, base::has_levels ? levels : 0},
                                 levels, Norm, xv.data(), out, ctx, bad_norm);
  }

  // qsgd reads its levels from the header; terngrad's are fixed at one.
  status decode_add(std::span<const std::byte> in, payload_info info, host_view<float> acc, float scale,
                    const codec_context&) const {
    return levels_payload_decode_add(base::payload_format, base::has_levels ? 0 : 1, Norm, in, info, acc, scale);
  }

 private:
  static std::uint32_t levels_of(const Options& o) noexcept {
    if constexpr (base::has_levels)
      return o.levels;
    else
      return 1;
  }
};

}  // namespace detail
ASHL_DETAIL_COMPRESS_HOST_END
