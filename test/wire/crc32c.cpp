#include <ashl/wire/crc32c.hpp>

#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

namespace {
std::span<const std::byte> as_bytes(std::string_view s) { return std::as_bytes(std::span<const char>(s.data(), s.size())); }

// Bit-at-a-time definition, independent of the tables.
std::uint32_t crc_bitwise(std::span<const std::byte> d) {
  std::uint32_t c = 0xffffffffu;
  for (std::byte b : d) {
    c ^= std::to_integer<std::uint32_t>(b);
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}
}  // namespace

BOOST_AUTO_TEST_CASE(known_vectors) {
  BOOST_TEST(ashl::wire::crc32c(as_bytes("123456789")) == 0xE3069283u);
  BOOST_TEST(ashl::wire::crc32c(as_bytes("")) == 0x00000000u);
  BOOST_TEST(ashl::wire::crc32c(as_bytes("a")) == 0xC1D04330u);
  // RFC 3720 B.4: 32 bytes of zeros, of 0xff, and ascending 0..31.
  std::vector<std::byte> z(32, std::byte{0}), f(32, std::byte{0xff}), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = std::byte(i);
    down[i] = std::byte(31 - i);
  }
  BOOST_TEST(ashl::wire::crc32c(z) == 0x8A9136AAu);
  BOOST_TEST(ashl::wire::crc32c(f) == 0x62A8AB43u);
  BOOST_TEST(ashl::wire::crc32c(up) == 0x46DD794Eu);
  BOOST_TEST(ashl::wire::crc32c(down) == 0x113FDB5Cu);
  static_assert(ashl::wire::crc32c({}) == 0u);
}

BOOST_AUTO_TEST_CASE(matches_bitwise_definition_at_every_length_and_offset) {
  std::mt19937 rng(7);
  std::vector<std::byte> buf(300);
  for (auto& b : buf) b = std::byte(rng() & 0xffu);
  for (std::size_t off = 0; off < 8; ++off)
    for (std::size_t n = 0; n + off <= buf.size(); n += 1 + n / 16) {
      const std::span<const std::byte> s(buf.data() + off, n);
      BOOST_TEST_REQUIRE(ashl::wire::crc32c(s) == crc_bitwise(s), "off " << off << " n " << n);
    }
}

BOOST_AUTO_TEST_CASE(continuation_equals_one_pass) {
  const auto all = as_bytes("The quick brown fox jumps over the lazy dog, twice over.");
  for (std::size_t cut = 0; cut <= all.size(); ++cut) {
    const auto first = ashl::wire::crc32c(all.first(cut));
    BOOST_TEST_REQUIRE(ashl::wire::crc32c(all.subspan(cut), first) == ashl::wire::crc32c(all));
  }
}
