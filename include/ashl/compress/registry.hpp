// ashl/compress/registry.hpp — the one list of codecs with their wire ids,
// and type-erased decode by codec id.
//
//   ashl::status s = ashl::compress::decode_add(header.codec, payload,
//                                               {header.element_count, header.dtype}, acc, eta, ctx);
//   using c = ashl::compress::codec_for<ashl::codec_id::qsgd>;     // compress::qsgd
//   static_assert(ashl::compress::sparse_pairs(ashl::codec_id::topk));
//
// `codecs` lists every stateless codec once, with what its payload layout
// lets others rely on (sparse pairs: DGC reads the sent indices). It drives
// decode_add's dispatch (a table indexed by id), the check that the wire's
// codec ids 0..codec_id_count−1 each have exactly one codec, and dgc.hpp's
// sparse_pair_codec. Adding a codec is one line here (and its id in
// wire/ids.hpp). A server learns the codec from the message header and
// decodes with a default-constructed codec of that id (payloads are
// self-describing, so the sender's configuration is not needed).
// DESIGN.md "Codec"; docs/wire-format.md, "Codec payloads".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cast.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/natural.hpp>
#include <ashl/compress/qsgd.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/sign.hpp>
#include <ashl/compress/terngrad.hpp>
#include <ashl/compress/threshold.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/compress/topk_sampled.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/wire/ids.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

ASHL_NAMESPACE_BEGIN
namespace compress {

// What a codec's payload layout promises beyond "decode_add reads it".
enum class payload_layout : std::uint8_t {
  opaque,        // only the codec itself reads it
  sparse_pairs,  // u64 n, u32 count, u32 index[count], values (docs/wire-format.md "Sparse pairs")
};

template <codec C, payload_layout L = payload_layout::opaque>
struct codec_entry {
  using type = C;
  static constexpr codec_id id = C::id;
  static constexpr payload_layout layout = L;
};

template <class... Entries>
struct codec_list {
  static constexpr std::size_t size = sizeof...(Entries);
};

// Every codec of the wire format, once.
using codecs = codec_list<codec_entry<identity>,                                   //
                          codec_entry<fp16>,                                       //
                          codec_entry<bf16>,                                       //
                          codec_entry<topk, payload_layout::sparse_pairs>,         //
                          codec_entry<topk_sampled, payload_layout::sparse_pairs>, //
                          codec_entry<randomk>,                                    //
                          codec_entry<threshold, payload_layout::sparse_pairs>,    //
                          codec_entry<qsgd>,                                       //
                          codec_entry<terngrad>,                                   //
                          codec_entry<sign>,                                       //
                          codec_entry<natural>>;

namespace detail {
template <class... E>
consteval bool covers_each_id_once(codec_list<E...>) {
  std::array<int, codec_id_count> seen{};
  for (codec_id id : {E::id...}) {
    const auto i = static_cast<std::size_t>(id);
    if (i >= seen.size()) return false;
    ++seen[i];
  }
  for (int n : seen)
    if (n != 1) return false;
  return sizeof...(E) == static_cast<std::size_t>(codec_id_count);
}

template <codec_id Id, class... E>
struct find_entry;
template <codec_id Id, class E, class... Rest>
struct find_entry<Id, E, Rest...> {
  using type = std::conditional_t<E::id == Id, E, typename find_entry<Id, Rest...>::type>;
};
template <codec_id Id>
struct find_entry<Id> {
  using type = void;
};
template <codec_id Id, class List>
struct entry_of;
template <codec_id Id, class... E>
struct entry_of<Id, codec_list<E...>> {
  using type = typename find_entry<Id, E...>::type;
};

template <class C, class... E>
consteval bool listed_sparse(codec_list<E...>) {
  return ((std::is_same_v<C, typename E::type> && E::layout == payload_layout::sparse_pairs) || ...);
}
template <class... E>
consteval std::array<payload_layout, codec_id_count> layouts(codec_list<E...>) {
  std::array<payload_layout, codec_id_count> t{};
  ((t[static_cast<std::size_t>(E::id)] = E::layout), ...);
  return t;
}

using decode_fn = status (*)(std::span<const std::byte>, payload_info, host_view<float>, float, const codec_context&);
template <class C>
status decode_with(std::span<const std::byte> payload, payload_info info, host_view<float> acc, float scale,
                   const codec_context& ctx) {
  return C{}.decode_add(payload, info, acc, scale, ctx);
}
template <class... E>
consteval std::array<decode_fn, codec_id_count> decoders(codec_list<E...>) {
  std::array<decode_fn, codec_id_count> t{};
  ((t[static_cast<std::size_t>(E::id)] = &decode_with<typename E::type>), ...);
  return t;
}
}  // namespace detail

static_assert(detail::covers_each_id_once(codecs{}),
              "compress::codecs must list one codec for each codec_id 0..codec_id_count-1 (wire/ids.hpp)");

// The codec type of a wire id.
template <codec_id Id>
using codec_for = typename detail::entry_of<Id, codecs>::type::type;

// Whether codec `id`'s payload is the sparse-pair layout.
constexpr bool sparse_pairs(codec_id id) noexcept {
  constexpr auto table = detail::layouts(codecs{});
  const auto i = static_cast<std::size_t>(id);
  return i < table.size() && table[i] == payload_layout::sparse_pairs;
}

// C is the listed codec of a sparse-pair id (what dgc<C> needs).
template <class C>
concept sparse_pair_codec = codec<C> && detail::listed_sparse<C>(codecs{});

// Adds `scale ×` the payload of codec `id` into `acc`; `unsupported` for an
// id this build has no codec for.
inline status decode_add(codec_id id, std::span<const std::byte> payload, payload_info info, host_view<float> acc,
                         float scale, const codec_context& ctx) {
  static constexpr auto table = detail::decoders(codecs{});
  const auto i = static_cast<std::size_t>(id);
  if (i < table.size()) return table[i](payload, info, acc, scale, ctx);
  return make_error(errc::unsupported, "codec", static_cast<unsigned>(id), "no CPU decoder for this codec in this build");
}

}  // namespace compress
ASHL_NAMESPACE_END
