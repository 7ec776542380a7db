// ashl/compress/detail/codec.hpp — what every host codec header builds on.
//
//   #include <ashl/compress/detail/codec.hpp>      // first, in a codec file
//   #include <ashl/compress/detail/sparse.hpp>     // then only what is its own
//
// The codec concept and its vocabulary (dtype, status, tensor views, codec
// ids), the host SIMD namespace (ASHL_DETAIL_COMPRESS_HOST_BEGIN/END) and the
// element conversions. A codec file includes this one header and then only
// the parts that are its own (sparse pairs, bucketed headers, levels, random
// words); docs/codecs.md, "Adding a codec".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/detail/elements.hpp>
#include <ashl/compress/detail/host_simd.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/wire/ids.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

ASHL_DETAIL_COMPRESS_HOST_BEGIN
namespace detail {

// A host codec's identity, for its class to derive from: the opt-in tag of
// the codec concept and the payload's wire id.
template <codec_id Id>
struct codec_base {
  using codec_concept = codec_tag;
  static constexpr codec_id id = Id;
};

}  // namespace detail
ASHL_DETAIL_COMPRESS_HOST_END
