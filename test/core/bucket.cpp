#include <ashl/core/bucket.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

BOOST_AUTO_TEST_CASE(offsets_are_aligned_and_packed) {
  auto l = ashl::bucket_layout::make({{"w", {3, 5}, ashl::dtype::f32},
                                      {"b", {3}, ashl::dtype::f16},
                                      {"s", {}, ashl::dtype::f64},
                                      {"e", {0, 4}, ashl::dtype::u8},
                                      {"t", {65}, ashl::dtype::i8}});
  BOOST_TEST_REQUIRE(l.has_value());
  const auto& e = l->entries();
  BOOST_TEST_REQUIRE(e.size() == 5u);
  BOOST_TEST(e[0].offset == 0u);
  BOOST_TEST(e[0].count == 15u);
  BOOST_TEST(e[1].offset == 64u);  // 60 bytes rounded up to 64
  BOOST_TEST(e[1].count == 3u);
  BOOST_TEST(e[2].offset == 128u);  // scalar: one element
  BOOST_TEST(e[2].count == 1u);
  BOOST_TEST(e[3].offset == 192u);
  BOOST_TEST(e[3].count == 0u);
  BOOST_TEST(e[4].offset == 192u);  // an empty tensor takes no space
  BOOST_TEST(l->size_bytes() == 192u + 128u);
  BOOST_TEST(l->alignment() == 64u);
  BOOST_TEST(l->find("b") == &e[1]);
  BOOST_TEST(l->find("nope") == nullptr);

  auto l16 = ashl::bucket_layout::make({{"a", {3}, ashl::dtype::f16}, {"b", {1}, ashl::dtype::f64}}, 16);
  BOOST_TEST_REQUIRE(l16.has_value());
  BOOST_TEST(l16->entries()[1].offset == 16u);
  BOOST_TEST(l16->size_bytes() == 32u);
  auto empty = ashl::bucket_layout::make({});
  BOOST_TEST_REQUIRE(empty.has_value());
  BOOST_TEST(empty->size_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(layout_errors_name_the_entry) {
  auto bad_align = ashl::bucket_layout::make({}, 48);
  BOOST_TEST_REQUIRE(!bad_align);
  BOOST_TEST(bad_align.error().message() == "bucket.alignment = 48: must be a power of two");
  BOOST_TEST(!ashl::bucket_layout::make({}, 0));
  auto unnamed = ashl::bucket_layout::make({{"a", {1}}, {"", {1}}});
  BOOST_TEST_REQUIRE(!unnamed);
  BOOST_TEST(unnamed.error().message() == "bucket.tensors[1].name = \"\": must not be empty");
  auto twice = ashl::bucket_layout::make({{"a", {1}}, {"b", {1}}, {"a", {2}}});
  BOOST_TEST_REQUIRE(!twice);
  BOOST_TEST(twice.error().message() == "bucket.tensors[2].name = \"a\": appears twice");
  auto huge = ashl::bucket_layout::make({{"a", {std::size_t{1} << 40, std::size_t{1} << 30}}});
  BOOST_TEST_REQUIRE(!huge);
  BOOST_TEST((huge.error().code() == ashl::errc::out_of_range));
  BOOST_TEST(huge.error().message().find("bucket.tensors[0].shape[1] = 1073741824") == 0u);
  // Each tensor fits on its own, but together they overflow size_t.
  const std::size_t big = SIZE_MAX / 16 - 1;
  auto sum = ashl::bucket_layout::make({{"a", {big}, ashl::dtype::f64}, {"b", {big}, ashl::dtype::f64}});
  BOOST_TEST_REQUIRE(!sum);
  BOOST_TEST((sum.error().code() == ashl::errc::out_of_range));
  BOOST_TEST(sum.error().message().find("bucket.tensors[1].shape = ") == 0u);
}

BOOST_AUTO_TEST_CASE(owned_bucket_views) {
  auto l = ashl::bucket_layout::make({{"w", {4}, ashl::dtype::f32}, {"h", {2}, ashl::dtype::bf16}});
  BOOST_TEST_REQUIRE(l.has_value());
  ashl::bucket b(*l);
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(b.bytes().data()) % 64 == 0u);
  BOOST_TEST(b.bytes().size() == l->size_bytes());
  auto w = b.view<float>("w");
  BOOST_TEST_REQUIRE(w.has_value());
  BOOST_TEST(w->size() == 4u);
  for (float v : *w) BOOST_TEST(v == 0.0f);  // zeroed
  (*w)[2] = 3.5f;
  BOOST_TEST(b.view<float>("w").value()[2] == 3.5f);
  auto h = b.view<ashl::bfloat16>("h");
  BOOST_TEST_REQUIRE(h.has_value());
  BOOST_TEST(reinterpret_cast<std::byte*>(h->data()) == b.bytes().data() + 64);
  auto wrong = b.view<float>("h");
  BOOST_TEST_REQUIRE(!wrong);
  BOOST_TEST(wrong.error().message() == "bucket.tensor.dtype = \"bf16\": tensor \"h\" is not f32");
  auto missing = b.view<float>("x");
  BOOST_TEST_REQUIRE(!missing);
  BOOST_TEST((missing.error().code() == ashl::errc::not_found));
  BOOST_TEST(missing.error().message() == "bucket.tensor = \"x\": no tensor of that name");
  auto r = b.raw(1);
  BOOST_TEST((r.element_dtype() == ashl::dtype::bf16));
  BOOST_TEST(r.size() == 2u);
}

BOOST_AUTO_TEST_CASE(borrowed_bucket_checks_size_and_alignment) {
  auto l = ashl::bucket_layout::make({{"w", {4}, ashl::dtype::f32}}, 16);
  BOOST_TEST_REQUIRE(l.has_value());
  alignas(64) std::byte mem[64] = {};
  auto ok = ashl::bucket::borrow(*l, std::span<std::byte>(mem, 16));
  BOOST_TEST_REQUIRE(ok.has_value());
  ok->view<float>("w").value()[0] = 2.0f;
  float first;
  std::memcpy(&first, mem, 4);
  BOOST_TEST(first == 2.0f);  // writes go to the caller's memory
  auto small = ashl::bucket::borrow(*l, std::span<std::byte>(mem, 15));
  BOOST_TEST_REQUIRE(!small);
  BOOST_TEST((small.error().code() == ashl::errc::buffer_too_small));
  BOOST_TEST(small.error().message() == "bucket.memory.size = 15: smaller than the layout's size_bytes()");
  auto misaligned = ashl::bucket::borrow(*l, std::span<std::byte>(mem + 4, 32));
  BOOST_TEST_REQUIRE(!misaligned);
  BOOST_TEST(misaligned.error().message().find("bucket.memory.data = ") == 0u);
  BOOST_TEST(misaligned.error().message().find("not aligned") != std::string::npos);
}
