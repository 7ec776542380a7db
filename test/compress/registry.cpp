#include <ashl/compress/registry.hpp>
#include <boost/test/unit_test.hpp>

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
}
