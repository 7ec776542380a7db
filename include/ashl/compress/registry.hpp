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
// docs/design.md "Codec"; docs/wire-format.md, "Codec payloads".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/detail/host_simd.hpp>
#include <ashl/compress/block.hpp>
#include <ashl/compress/cast.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/compress/natural.hpp>
#include <ashl/compress/qsgd.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/sign.hpp>
#include <ashl/compress/terngrad.hpp>
#include <ashl/compress/threshold.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/compress/topk_sampled.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/wire/ids.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

// What a codec's payload layout promises beyond "decode_add reads it".
enum class payload_layout : std::uint8_t {
  opaque,        // only the codec itself reads it
  sparse_pairs,  // u64 n, u32 count, u32 index[count], values (docs/wire-format.md "Sparse pairs")
  dense,         // a cast: exactly max_encoded_bytes(n, dtype) bytes, every byte pattern decodes
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
using codecs = codec_list<codec_entry<identity, payload_layout::dense>,            //
                          codec_entry<fp16, payload_layout::dense>,                //
                          codec_entry<bf16, payload_layout::dense>,                //
                          codec_entry<topk, payload_layout::sparse_pairs>,         //
                          codec_entry<topk_sampled, payload_layout::sparse_pairs>, //
                          codec_entry<randomk>,                                    //
                          codec_entry<threshold, payload_layout::sparse_pairs>,    //
                          codec_entry<qsgd>,                                       //
                          codec_entry<terngrad>,                                   //
                          codec_entry<sign>,                                       //
                          codec_entry<natural>,                                    //
                          codec_entry<block_quant>>;

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
using size_fn = std::size_t (*)(std::size_t, dtype);
template <class C>
std::size_t max_bytes_of(std::size_t n, dtype t) {
  return C{}.max_encoded_bytes(n, t);
}
template <class... E>
consteval std::array<size_fn, codec_id_count> dense_sizes(codec_list<E...>) {
  std::array<size_fn, codec_id_count> t{};
  ((t[static_cast<std::size_t>(E::id)] = E::layout == payload_layout::dense ? &max_bytes_of<typename E::type> : nullptr),
   ...);
  return t;
}

inline std::uint32_t load_le32(const std::byte* b) noexcept {  // one load on little-endian targets
  return std::uint32_t(b[0]) | std::uint32_t(b[1]) << 8 | std::uint32_t(b[2]) << 16 | std::uint32_t(b[3]) << 24;
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

// Bytes of codec `id`'s payload for `info` when it is a dense cast (its only
// rule is that size); 0 for any other codec.
inline std::size_t dense_payload_bytes(codec_id id, payload_info info) noexcept {
  constexpr auto table = detail::dense_sizes(codecs{});
  const auto i = static_cast<std::size_t>(id);
  return i < table.size() && table[i] != nullptr ? table[i](info.count, info.type) : 0;
}

// True when `p` is a well-formed sparse-pair payload for `info` with at least
// one pair: the header's n, the count, the size, and strictly increasing
// indices below n (the rules decode_add of a sparse-pair codec checks),
// without adding anything. False says nothing more: decode_add names the
// fault (and knows whether its codec allows no pairs). Lets a server check
// a commit before its policy decides, and decode it once afterwards.
inline bool sparse_pairs_well_formed(std::span<const std::byte> p, payload_info info) noexcept {
  const std::uint64_t n = info.count;
  if (p.size() < layout::sparse::header_bytes) return false;
  const std::uint64_t pn = detail::load_le32(p.data()) | std::uint64_t{detail::load_le32(p.data() + 4)} << 32;
  const std::uint32_t count = detail::load_le32(p.data() + layout::sparse::count_offset);
  if (pn != n || count == 0 || count > n) return false;
  if (p.size() != layout::sparse_payload_bytes(count, size_of(info.type))) return false;
  const std::byte* idx = p.data() + layout::sparse::header_bytes;
  // Strictly increasing and the last below n: every index is below n.
  if (detail::load_le32(idx + 4 * std::size_t{count - 1}) >= n) return false;
  std::uint32_t bad = 0;
  if constexpr (std::endian::native == std::endian::little) {
    // Adjacent pairs compared without a branch: the compiler vectorizes it.
    std::uint32_t a = 0, b = 0;
    for (std::uint32_t j = 1; j < count; ++j) {
      std::memcpy(&a, idx + 4 * std::size_t{j - 1}, 4);
      std::memcpy(&b, idx + 4 * std::size_t{j}, 4);
      bad |= static_cast<std::uint32_t>(b <= a);
    }
  } else {
    for (std::uint32_t j = 1; j < count; ++j)
      bad |= static_cast<std::uint32_t>(detail::load_le32(idx + 4 * std::size_t{j}) <=
                                        detail::load_le32(idx + 4 * std::size_t{j - 1}));
  }
  return bad == 0;
}

// Adds scale x the pairs of a sparse-pair payload whose index lies in
// [lo, hi) into acc[i] (acc is the whole tensor's base): the pairs are found by binary
// search over the strictly increasing indices, then added as decode_add adds
// them (the same additions, in index order). For a payload decode_add takes
// (the caller checked it: sparse_pairs_well_formed, or a decode that passed);
// a server applies one payload with several threads this way, each on its
// own part of the shard (rules/apply_pool.hpp). A payload shorter than its
// header says adds nothing.
inline void add_pairs_in_range(std::span<const std::byte> p, dtype t, float* acc, float scale, std::uint64_t lo,
                               std::uint64_t hi) noexcept {
  if (p.size() < layout::sparse::header_bytes || lo >= hi) return;
  const std::uint32_t count = detail::load_le32(p.data() + layout::sparse::count_offset);
  const std::size_t vs = size_of(t);
  if (p.size() != layout::sparse_payload_bytes(count, vs)) return;
  const std::byte* idx = p.data() + layout::sparse::header_bytes;
  const std::byte* val = idx + 4 * std::size_t{count};
  const auto first_at_or_above = [&](std::uint64_t x) {
    std::size_t a = 0, b = count;
    while (a < b) {
      const std::size_t m = a + (b - a) / 2;
      if (detail::load_le32(idx + 4 * m) < x) a = m + 1;
      else b = m;
    }
    return a;
  };
  const std::size_t j0 = first_at_or_above(lo), j1 = first_at_or_above(hi);
  if (j1 <= j0) return;
  float* a = acc;
  const std::byte* ix = idx + 4 * j0;
  const std::byte* v = val + vs * j0;
  switch (t) {
    case dtype::f32:
      detail::scatter_add(a, ix, j1 - j0, scale, [v](std::size_t j) { return detail::load_le<float>(v + 4 * j); });
      break;
    case dtype::f16:
      detail::scatter_add(a, ix, j1 - j0, scale,
                          [v](std::size_t j) { return detail::f16_to_f32(detail::load_le<std::uint16_t>(v + 2 * j)); });
      break;
    default:
      detail::scatter_add(a, ix, j1 - j0, scale,
                          [v](std::size_t j) { return detail::bf16_to_f32(detail::load_le<std::uint16_t>(v + 2 * j)); });
      break;
  }
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

ASHL_DETAIL_COMPRESS_HOST_END
