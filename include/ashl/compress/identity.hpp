// ashl/compress/identity.hpp — the lossless codec: the values themselves.
//
//   ashl::compress::identity c;
//   std::vector<std::byte> buf(c.max_encoded_bytes(n, ashl::dtype::f32));   // 4 n
//   auto used = c.encode(ashl::host_view<const float>(g.data(), n), buf, {});
//   auto s = c.decode_add({buf.data(), *used}, {n, ashl::dtype::f32}, acc, 1.0f, {});
//
// Payload: n values in the input dtype, little-endian, nothing else (n and the
// dtype are in the message header, which every decode receives as
// payload_info). Decoding adds exactly scale * value. docs/algorithms.md §4;
// docs/wire-format.md, "Codec payloads / identity".
#pragma once

#include <ashl/compress/detail/codec.hpp>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

class identity : public detail::codec_base<codec_id::identity> {
 public:

  // Exactly n * size_of(t).
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n, dtype t) const noexcept { return n * size_of(t); }
  [[nodiscard]] std::size_t scratch_bytes(std::size_t, dtype) const noexcept { return 0; }

  template <gradient_element T>
  result<std::size_t> encode(host_view<const T> x, std::span<std::byte> out, const codec_context&) const {
    const std::size_t bytes = x.size() * sizeof(T);
    if (out.size() < bytes)
      return make_error(errc::buffer_too_small, "identity.out.size", out.size(),
                        "bytes, fewer than max_encoded_bytes = " + std::to_string(bytes));
    detail::store_array_le(out.data(), x.data(), x.size());
    return bytes;
  }

  status decode_add(std::span<const std::byte> in, payload_info info, host_view<float> acc, float scale,
                    const codec_context&) const {
    ASHL_TRY(detail::check_decode_args("identity", info.type, info.count, acc.size(), scale));
    const std::size_t expect = info.count * size_of(info.type);
    if (in.size() != expect)
      return malformed("identity.payload_bytes", in.size(), "must be count * " +
                                                                std::to_string(size_of(info.type)) + " = " +
                                                                std::to_string(expect));
    detail::add_dense(in.data(), info.type, acc.data(), info.count, scale);
    return {};
  }
};

static_assert(codec<identity>);

ASHL_DETAIL_COMPRESS_HOST_END
