#include <ashl/compress/registry.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../support/codec_testing.hpp"

using namespace ashl;
using namespace codec_testing;

namespace {
template <class C>
void same_as_direct(const C& c, const std::vector<float>& x) {
  const compress::codec_context ctx{.seed = 4, .step = 2, .tensor = 1};
  auto p = encode_to_vector(c, std::span<const float>(x), ctx);
  const compress::payload_info info{x.size(), dtype::f32};
  std::vector<float> a(x.size(), 0.5f), b(x.size(), 0.5f);
  BOOST_REQUIRE(C{}.decode_add(p, info, host_view<float>(a.data(), a.size()), 0.25f, ctx).ok());
  BOOST_REQUIRE(compress::decode_add(C::id, p, info, host_view<float>(b.data(), b.size()), 0.25f, ctx).ok());
  BOOST_CHECK(a == b);
  // A damaged payload is refused through the registry too, accumulator untouched.
  p.pop_back();
  std::vector<float> c2(x.size(), 0.5f);
  BOOST_CHECK(!compress::decode_add(C::id, p, info, host_view<float>(c2.data(), c2.size()), 1.0f, ctx).ok());
  BOOST_CHECK(c2 == std::vector<float>(x.size(), 0.5f));
}
}  // namespace

BOOST_AUTO_TEST_CASE(dispatches_to_default_constructed_codecs) {
  const auto x = normal_values(400, 51);
  same_as_direct(compress::identity{}, x);
  same_as_direct(compress::fp16{}, x);
  same_as_direct(compress::bf16{}, x);
  same_as_direct(compress::topk{0.1}, x);
  same_as_direct(compress::topk_sampled{0.1}, x);
  same_as_direct(compress::randomk{{.ratio = 0.1, .unbiased = true}}, x);
  same_as_direct(compress::threshold{{.theta = 1.0f}}, x);
  same_as_direct(compress::qsgd{}, x);
  same_as_direct(compress::terngrad{}, x);
  same_as_direct(compress::sign{}, x);
  same_as_direct(compress::natural{}, x);
  same_as_direct(compress::block_quant{{.bits = 2, .block = 16}}, x);
}

// The one list drives the wire ids, the dispatch and DGC's check.
BOOST_AUTO_TEST_CASE(the_codec_list_is_the_wire_ids) {
  static_assert(compress::codecs::size == static_cast<std::size_t>(codec_id_count));
  static_assert(std::is_same_v<compress::codec_for<codec_id::identity>, compress::identity>);
  static_assert(std::is_same_v<compress::codec_for<codec_id::fp16>, compress::fp16>);
  static_assert(std::is_same_v<compress::codec_for<codec_id::bf16>, compress::bf16>);
  static_assert(std::is_same_v<compress::codec_for<codec_id::topk>, compress::topk>);
  static_assert(std::is_same_v<compress::codec_for<codec_id::topk_sampled>, compress::topk_sampled>);
  static_assert(std::is_same_v<compress::codec_for<codec_id::randomk>, compress::randomk>);
  static_assert(std::is_same_v<compress::codec_for<codec_id::threshold>, compress::threshold>);
  static_assert(std::is_same_v<compress::codec_for<codec_id::qsgd>, compress::qsgd>);
  static_assert(std::is_same_v<compress::codec_for<codec_id::terngrad>, compress::terngrad>);
  static_assert(std::is_same_v<compress::codec_for<codec_id::sign>, compress::sign>);
  static_assert(std::is_same_v<compress::codec_for<codec_id::natural>, compress::natural>);
  static_assert(std::is_same_v<compress::codec_for<codec_id::block>, compress::block_quant>);
  // Exactly the sparse-pair codecs of docs/wire-format.md.
  for (int i = 0; i < codec_id_count; ++i) {
    const auto id = static_cast<codec_id>(i);
    const bool sparse = id == codec_id::topk || id == codec_id::topk_sampled || id == codec_id::threshold;
    BOOST_TEST(compress::sparse_pairs(id) == sparse, to_string(id));
  }
  BOOST_TEST(!compress::sparse_pairs(static_cast<codec_id>(200)));
  static_assert(compress::sparse_pair_codec<compress::topk> && compress::sparse_pair_codec<compress::topk_sampled> &&
                compress::sparse_pair_codec<compress::threshold>);
  static_assert(!compress::sparse_pair_codec<compress::randomk> && !compress::sparse_pair_codec<compress::qsgd> &&
                !compress::sparse_pair_codec<compress::identity>);
}

BOOST_AUTO_TEST_CASE(an_unknown_id_is_unsupported) {
  std::vector<float> a(4, 1.0f);
  const std::vector<std::byte> p(16);
  auto s = compress::decode_add(static_cast<codec_id>(codec_id_count), p, {4, dtype::f32},
                                host_view<float>(a.data(), a.size()), 1.0f, {});
  BOOST_TEST((s.code() == errc::unsupported));
  BOOST_TEST(s.message() == "codec = 12: no CPU decoder for this codec in this build");
  BOOST_TEST(a == std::vector<float>(4, 1.0f));
}

BOOST_AUTO_TEST_CASE(dense_casts_are_checked_by_size) {
  for (int i = 0; i < codec_id_count; ++i) {
    const auto id = static_cast<codec_id>(i);
    const std::size_t want = id == codec_id::identity ? 40 : (id == codec_id::fp16 || id == codec_id::bf16) ? 20 : 0;
    BOOST_TEST(compress::dense_payload_bytes(id, {10, dtype::f32}) == want, to_string(id));
  }
  BOOST_TEST(compress::dense_payload_bytes(codec_id::identity, {10, dtype::bf16}) == 20u);
  BOOST_TEST(compress::dense_payload_bytes(static_cast<codec_id>(200), {10, dtype::f32}) == 0u);
}

BOOST_AUTO_TEST_CASE(sparse_pairs_are_checked_without_decoding) {
  const std::size_t n = 1000;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 37) % 101) - 50.0f;
  const compress::topk c{0.05};
  std::vector<std::byte> p(c.max_encoded_bytes(n, dtype::f32));
  std::vector<std::byte> scratch(c.scratch_bytes(n, dtype::f32));
  auto used = c.encode(host_view<const float>(x.data(), n), p, {.scratch = scratch});
  BOOST_TEST_REQUIRE(used.has_value());
  p.resize(*used);
  BOOST_TEST(compress::sparse_pairs_well_formed(p, {n, dtype::f32}));
  BOOST_TEST(!compress::sparse_pairs_well_formed(p, {n + 1, dtype::f32}));           // header's n differs
  BOOST_TEST(!compress::sparse_pairs_well_formed({p.data(), p.size() - 1}, {n, dtype::f32}));  // truncated
  auto swapped = p;  // indices 0 and 1 swapped: no longer strictly increasing
  std::swap_ranges(swapped.begin() + 12, swapped.begin() + 16, swapped.begin() + 16);
  BOOST_TEST(!compress::sparse_pairs_well_formed(swapped, {n, dtype::f32}));
  auto far = p;  // the last index at n
  const auto k = static_cast<std::uint32_t>((p.size() - 12) / 8);
  const std::uint32_t big = static_cast<std::uint32_t>(n);
  std::memcpy(far.data() + 12 + 4 * (k - 1), &big, 4);
  BOOST_TEST(!compress::sparse_pairs_well_formed(far, {n, dtype::f32}));
  // Every case the check refuses, decode_add refuses too (it names the fault).
  std::vector<float> acc(n + 1, 0.0f);
  BOOST_TEST(!compress::decode_add(codec_id::topk, swapped, {n, dtype::f32}, host_view<float>(acc.data(), n), 1.0f, {}).ok());
  BOOST_TEST(!compress::decode_add(codec_id::topk, far, {n, dtype::f32}, host_view<float>(acc.data(), n), 1.0f, {}).ok());
}

namespace {
// A default-constructed codec C of the list encodes 16-bit input T; the
// registry decodes it by C::id exactly as C does.
template <class C, class T>
void listed_codec_decodes(const std::vector<float>& xf) {
  std::vector<T> x;
  for (float v : xf) x.push_back(from_float<T>(v));
  const C c{};
  std::vector<std::byte> scratch(c.scratch_bytes(x.size(), dtype_of<T>));
  const compress::codec_context ctx{.seed = 9, .step = 3, .tensor = 2, .scratch = scratch};
  std::vector<std::byte> p(c.max_encoded_bytes(x.size(), dtype_of<T>));
  const auto used = c.encode(host_view<const T>(x.data(), x.size()), p, ctx);
  BOOST_REQUIRE_MESSAGE(used.has_value(), to_string(C::id));
  p.resize(*used);
  const compress::payload_info info{x.size(), dtype_of<T>};
  std::vector<float> a(x.size(), -0.5f), b(x.size(), -0.5f);
  BOOST_REQUIRE(c.decode_add(p, info, host_view<float>(a.data(), a.size()), 1.5f, ctx).ok());
  BOOST_REQUIRE(compress::decode_add(C::id, p, info, host_view<float>(b.data(), b.size()), 1.5f, ctx).ok());
  BOOST_TEST(a == b, to_string(C::id));
  BOOST_TEST(a != std::vector<float>(x.size(), -0.5f), to_string(C::id) << ": decode added nothing");
}
template <class... E>
std::size_t every_listed_codec(compress::codec_list<E...>, const std::vector<float>& x) {
  (listed_codec_decodes<typename E::type, half>(x), ...);
  (listed_codec_decodes<typename E::type, bfloat16>(x), ...);
  return sizeof...(E);
}
}  // namespace

// Every codec id, through the one list, with f16 and bf16 inputs.
BOOST_AUTO_TEST_CASE(every_codec_id_dispatches_16_bit_payloads) {
  const auto x = normal_values(300, 52);
  BOOST_TEST(every_listed_codec(compress::codecs{}, x) == static_cast<std::size_t>(codec_id_count));
}

// Every id past the list is refused, named, and adds nothing.
BOOST_AUTO_TEST_CASE(every_unknown_id_is_unsupported) {
  std::vector<float> a(4, 1.0f);
  const std::vector<std::byte> p(16);
  for (int i = codec_id_count; i <= 255; ++i) {
    auto s = compress::decode_add(static_cast<codec_id>(i), p, {4, dtype::f32}, host_view<float>(a.data(), a.size()),
                                  1.0f, {});
    BOOST_TEST((s.code() == errc::unsupported), i);
    BOOST_TEST(s.message() == "codec = " + std::to_string(i) + ": no CPU decoder for this codec in this build");
    BOOST_TEST(!compress::sparse_pairs(static_cast<codec_id>(i)));
    BOOST_TEST(compress::dense_payload_bytes(static_cast<codec_id>(i), {4, dtype::f32}) == 0u);
  }
  BOOST_TEST(a == std::vector<float>(4, 1.0f));
}
