#include <ashl/core/tensor_view.hpp>

#include <boost/test/unit_test.hpp>

#include <span>
#include <type_traits>
#include <vector>

static_assert(!std::is_convertible_v<ashl::device_view<float>, ashl::host_view<float>>,
              "memory spaces must not mix");
static_assert(std::is_convertible_v<ashl::host_view<float>, ashl::host_view<const float>>);
static_assert(!std::is_convertible_v<ashl::host_view<const float>, ashl::host_view<float>>);

BOOST_AUTO_TEST_CASE(typed_view_basics) {
  std::vector<float> g{1, 2, 3, 4, 5};
  ashl::host_view<float> v(g.data(), g.size());
  BOOST_TEST(v.size() == 5u);
  BOOST_TEST(v.size_bytes() == 20u);
  BOOST_TEST(!v.empty());
  BOOST_TEST((ashl::host_view<float>::element_dtype() == ashl::dtype::f32));
  v[1] = 7;
  BOOST_TEST(g[1] == 7.0f);
  float sum = 0;
  for (float x : v) sum += x;
  BOOST_TEST(sum == 1 + 7 + 3 + 4 + 5);
  auto sub = v.subview(2, 3);
  BOOST_TEST(sub.data() == g.data() + 2);
  BOOST_TEST(sub.size() == 3u);
  BOOST_TEST(v.subview(5, 0).empty());
  ashl::host_view<const float> c = v;
  BOOST_TEST(c.data() == g.data());
  ashl::tensor_view from_span{std::span<float>(g)};
  BOOST_TEST(from_span.size() == 5u);
  BOOST_TEST(from_span.span().data() == g.data());
  BOOST_TEST(ashl::host_view<int8_t>().empty());
}

BOOST_AUTO_TEST_CASE(raw_view_checks_dtype) {
  std::vector<ashl::half> h(3);
  ashl::host_view<ashl::half> v(h.data(), h.size());
  ashl::raw_view<ashl::host_space> r = v;
  BOOST_TEST((r.element_dtype() == ashl::dtype::f16));
  BOOST_TEST(r.size_bytes() == 6u);
  auto back = r.as<ashl::half>();
  BOOST_TEST_REQUIRE(back.has_value());
  BOOST_TEST(back->data() == h.data());
  auto wrong = r.as<float>();
  BOOST_TEST_REQUIRE(!wrong);
  BOOST_TEST((wrong.error().code() == ashl::errc::invalid_argument));
  BOOST_TEST(wrong.error().message() == "view.dtype = \"f16\": expected f32");
  ashl::raw_view<ashl::host_space, true> cr(static_cast<const void*>(h.data()), 3, ashl::dtype::f16);
  auto cv = cr.as<ashl::half>();
  BOOST_TEST_REQUIRE(cv.has_value());
  static_assert(std::is_same_v<decltype(cv->data()), const ashl::half*>);
}
