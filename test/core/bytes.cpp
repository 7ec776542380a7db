#include <ashl/core/bytes.hpp>

#include <boost/test/unit_test.hpp>

#include <array>
#include <cstddef>
#include <cstdint>

namespace {
enum class small_enum : std::uint16_t { a = 0x1234 };
}

BOOST_AUTO_TEST_CASE(writes_little_endian_and_reads_back) {
  std::array<std::byte, 32> buf{};
  ashl::byte_writer w(buf);
  w.put<std::uint32_t>(0x01020304u);
  w.put<std::uint16_t>(0xa0b0u);
  w.put<float>(1.5f);
  w.put<std::int64_t>(-2);
  w.put(small_enum::a);
  w.put<std::uint8_t>(9);
  BOOST_TEST(w.ok());
  BOOST_TEST(w.position() == 4u + 2 + 4 + 8 + 2 + 1);
  BOOST_TEST(w.remaining() == buf.size() - w.position());
  BOOST_TEST(std::to_integer<int>(buf[0]) == 0x04);
  BOOST_TEST(std::to_integer<int>(buf[3]) == 0x01);
  BOOST_TEST(std::to_integer<int>(buf[4]) == 0xb0);
  BOOST_TEST(std::to_integer<int>(buf[5]) == 0xa0);
  BOOST_TEST(std::to_integer<int>(buf[9]) == 0x3f);  // 1.5f = 0x3fc00000
  BOOST_TEST(std::to_integer<int>(buf[8]) == 0xc0);

  ashl::byte_reader r(w.written());
  std::uint32_t a; std::uint16_t b; float c; std::int64_t d; small_enum e; std::uint8_t f;
  BOOST_TEST(r.get(a, "a").ok());
  BOOST_TEST(r.get(b, "b").ok());
  BOOST_TEST(r.get(c, "c").ok());
  BOOST_TEST(r.get(d, "d").ok());
  BOOST_TEST(r.get(e, "e").ok());
  BOOST_TEST(r.get(f, "f").ok());
  BOOST_TEST(a == 0x01020304u);
  BOOST_TEST(b == 0xa0b0u);
  BOOST_TEST(c == 1.5f);
  BOOST_TEST(d == -2);
  BOOST_TEST((e == small_enum::a));
  BOOST_TEST(f == 9);
  BOOST_TEST(r.at_end());
  BOOST_TEST(r.expect_end("msg").ok());
}

BOOST_AUTO_TEST_CASE(writer_overflow_writes_nothing_and_latches) {
  std::array<std::byte, 6> buf{};
  buf.fill(std::byte{0xee});
  ashl::byte_writer w(buf);
  w.put<std::uint32_t>(1);
  w.put<std::uint32_t>(2);  // does not fit: nothing written
  BOOST_TEST(!w.ok());
  BOOST_TEST(w.position() == 4u);
  BOOST_TEST(std::to_integer<int>(buf[4]) == 0xee);
  w.put<std::uint8_t>(3);  // latched: even a fitting value is refused
  BOOST_TEST(std::to_integer<int>(buf[4]) == 0xee);
  BOOST_TEST(w.position() == 4u);
  const auto s = w.to_status("commit");
  BOOST_TEST((s.code() == ashl::errc::buffer_too_small));
  BOOST_TEST(s.message() == "commit = 6: bytes of output space are not enough");

  std::array<std::byte, 4> small{};
  ashl::byte_writer w2(small);
  const std::array<std::byte, 5> five{};
  w2.put_bytes(five);
  BOOST_TEST(!w2.ok());
  ashl::byte_writer w3(small);
  BOOST_TEST(w3.reserve(4).size() == 4u);
  BOOST_TEST(w3.reserve(1).empty());
  BOOST_TEST(!w3.ok());
  BOOST_TEST(ashl::byte_writer(small).to_status("x").ok());
}

BOOST_AUTO_TEST_CASE(reader_bounds_name_the_field) {
  const std::array<std::byte, 3> buf{std::byte{1}, std::byte{2}, std::byte{3}};
  ashl::byte_reader r(buf);
  std::uint32_t v = 0;
  auto s = r.get(v, "header.count");
  BOOST_TEST((s.code() == ashl::errc::malformed));
  BOOST_TEST(s.message().find("header.count = 3") == 0u);
  BOOST_TEST(r.position() == 0u);  // failed read consumes nothing
  std::uint16_t h = 0;
  BOOST_TEST(r.get(h, "h").ok());
  BOOST_TEST(h == 0x0201u);
  auto bad = r.get_bytes(2, "payload");
  BOOST_TEST(!bad);
  BOOST_TEST(bad.error().message().find("payload = 2") == 0u);
  BOOST_TEST(!r.at_end());
  const auto trailing = r.expect_end("message");
  BOOST_TEST((trailing.code() == ashl::errc::malformed));
  BOOST_TEST(trailing.message().find("message = 1") == 0u);
  auto one = r.get_bytes(1, "payload");
  BOOST_TEST_REQUIRE(one.has_value());
  BOOST_TEST(one->data() == buf.data() + 2);  // a view, not a copy
  BOOST_TEST(r.at_end());
  BOOST_TEST(r.rest().empty());
  BOOST_TEST(!r.skip(1, "pad").ok());
  ashl::byte_reader r2(buf);
  BOOST_TEST(r2.skip(3, "pad").ok());
  BOOST_TEST(r2.at_end());
}
