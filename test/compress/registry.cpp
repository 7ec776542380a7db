#include <ashl/compress/registry.hpp>
#include <boost/test/unit_test.hpp>

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
  BOOST_TEST(s.message() == "codec = 11: no CPU decoder for this codec in this build");
  BOOST_TEST(a == std::vector<float>(4, 1.0f));
}
