#include <ashl/wire/crc32c.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

namespace {
namespace w = ashl::wire;

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

std::vector<std::byte> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(rng() & 0xffu);
  return v;
}
}  // namespace

BOOST_AUTO_TEST_CASE(known_vectors) {
  BOOST_TEST_MESSAGE("crc32c implementation: " << w::crc32c_implementation());
  BOOST_TEST(w::crc32c(as_bytes("123456789")) == 0xE3069283u);
  BOOST_TEST(w::crc32c(as_bytes("")) == 0x00000000u);
  BOOST_TEST(w::crc32c(as_bytes("a")) == 0xC1D04330u);
  // RFC 3720 B.4: 32 bytes of zeros, of 0xff, ascending 0..31, descending 31..0.
  std::vector<std::byte> z(32, std::byte{0}), f(32, std::byte{0xff}), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = std::byte(i);
    down[i] = std::byte(31 - i);
  }
  for (auto crc : {w::crc32c, w::crc32c_software}) {
    BOOST_TEST(crc(as_bytes("123456789"), 0) == 0xE3069283u);
    BOOST_TEST(crc(z, 0) == 0x8A9136AAu);
    BOOST_TEST(crc(f, 0) == 0x62A8AB43u);
    BOOST_TEST(crc(up, 0) == 0x46DD794Eu);
    BOOST_TEST(crc(down, 0) == 0x113FDB5Cu);
  }
  const std::string_view implementation = w::crc32c_implementation();
  BOOST_TEST((implementation == "sse4.2" || implementation == "software"));
}

BOOST_AUTO_TEST_CASE(usable_in_constant_expressions) {
  static_assert(w::crc32c({}) == 0u);
  static constexpr char digits[] = "123456789";
  static constexpr std::array<std::byte, 9> b = [] {
    std::array<std::byte, 9> a{};
    for (std::size_t i = 0; i < 9; ++i) a[i] = std::byte(digits[i]);
    return a;
  }();
  static_assert(w::crc32c(b) == 0xE3069283u);
  static_assert(w::crc32c(std::span<const std::byte>(b).subspan(4), w::crc32c(std::span<const std::byte>(b).first(4))) ==
                0xE3069283u);
  static_assert(w::crc32c_combine(w::crc32c(std::span<const std::byte>(b).first(4)),
                                  w::crc32c(std::span<const std::byte>(b).subspan(4)), 5) == 0xE3069283u);
  BOOST_TEST(w::crc32c(b) == 0xE3069283u);  // the same call at run time
}

BOOST_AUTO_TEST_CASE(matches_bitwise_definition_at_every_length_and_offset) {
  const auto buf = random_bytes(300, 7);
  for (std::size_t off = 0; off < 8; ++off)
    for (std::size_t n = 0; n + off <= buf.size(); n += 1 + n / 16) {
      const std::span<const std::byte> s(buf.data() + off, n);
      BOOST_TEST_REQUIRE(w::crc32c(s) == crc_bitwise(s), "off " << off << " n " << n);
      BOOST_TEST_REQUIRE(w::crc32c_software(s) == crc_bitwise(s), "off " << off << " n " << n);
    }
}

// The dispatched path (hardware here when the CPU has SSE 4.2) against the
// portable one: every length to 4 KiB at a random alignment and start value,
// which crosses the 256-byte block level (768-byte spans) and the word and
// byte tails.
BOOST_AUTO_TEST_CASE(dispatched_equals_software_for_all_lengths_to_4096) {
  const auto buf = random_bytes(4096 + 64, 11);
  std::mt19937 rng(3);
  for (std::size_t n = 0; n <= 4096; ++n) {
    const std::size_t off = rng() % 64;
    const std::uint32_t prev = (n % 3 == 0) ? 0u : static_cast<std::uint32_t>(rng());
    const std::span<const std::byte> s(buf.data() + off, n);
    BOOST_TEST_REQUIRE(w::crc32c(s, prev) == w::crc32c_software(s, prev), "n " << n << " off " << off);
  }
}

// Large sizes cross the 4 KiB and 64 KiB block levels (12 KiB and 192 KiB
// spans), their merges and the hand-over between levels.
BOOST_AUTO_TEST_CASE(dispatched_equals_software_for_large_sizes) {
  const std::size_t big = (std::size_t{1} << 20) + 8 * 1024 + 77;
  const auto buf = random_bytes(big + 8, 5);
  for (std::size_t n : {std::size_t{3 * 4096 - 1}, std::size_t{3 * 4096}, std::size_t{3 * 4096 + 1},
                        std::size_t{2 * 3 * 4096 + 3 * 256 + 13}, std::size_t{3 * 65536 - 1}, std::size_t{3 * 65536},
                        std::size_t{3 * 65536 + 3 * 4096 + 3 * 256 + 15}, std::size_t{100'003}, std::size_t{1} << 20,
                        (std::size_t{1} << 20) + 1, (std::size_t{1} << 20) + 4093, big})
    for (std::size_t off : {0, 1, 3, 7}) {
      const std::span<const std::byte> s(buf.data() + off, n);
      BOOST_TEST_REQUIRE(w::crc32c(s) == w::crc32c_software(s), "n " << n << " off " << off);
    }
  // One against the bit-at-a-time definition, so the reference is itself checked at size.
  const std::span<const std::byte> s(buf.data() + 1, (std::size_t{1} << 20) + 1);
  BOOST_TEST(w::crc32c(s) == crc_bitwise(s));
}

BOOST_AUTO_TEST_CASE(continuation_equals_one_pass) {
  const auto all = as_bytes("The quick brown fox jumps over the lazy dog, twice over.");
  for (std::size_t cut = 0; cut <= all.size(); ++cut) {
    const auto first = w::crc32c(all.first(cut));
    BOOST_TEST_REQUIRE(w::crc32c(all.subspan(cut), first) == w::crc32c(all));
  }
  // Cuts inside and across the three-stream blocks.
  const auto buf = random_bytes(200'000, 9);
  const std::span<const std::byte> big(buf);
  const std::uint32_t whole = w::crc32c(big);
  std::mt19937 rng(13);
  for (int i = 0; i < 40; ++i) {
    const std::size_t a = rng() % big.size(), b = rng() % big.size();
    const std::size_t lo = std::min(a, b), hi = std::max(a, b);
    std::uint32_t c = w::crc32c(big.first(lo));
    c = w::crc32c(big.subspan(lo, hi - lo), c);
    c = w::crc32c(big.subspan(hi), c);
    BOOST_TEST_REQUIRE(c == whole, "cuts " << lo << ", " << hi);
  }
}

BOOST_AUTO_TEST_CASE(combine_equals_crc_of_concatenation) {
  const auto buf = random_bytes(70'000, 17);
  const std::span<const std::byte> all(buf);
  std::vector<std::pair<std::size_t, std::size_t>> cases;
  for (std::size_t a : {0, 1, 3, 8, 72, 255, 4096, 10'000})
    for (std::size_t b : {0, 1, 2, 7, 64, 1000, 24'577, 60'000}) cases.emplace_back(a, b);
  std::mt19937 rng(21);
  for (int i = 0; i < 100; ++i) {
    const std::size_t a = rng() % 5000, b = rng() % (all.size() - a);
    cases.emplace_back(a, b);
  }
  for (auto [la, lb] : cases) {
    const auto A = all.first(la), B = all.subspan(la, lb), AB = all.first(la + lb);
    const std::uint32_t ca = w::crc32c(A), cb = w::crc32c(B), cab = w::crc32c(AB);
    BOOST_TEST_REQUIRE(w::crc32c_combine(ca, cb, lb) == cab, "len_a " << la << " len_b " << lb);
    BOOST_TEST_REQUIRE(w::crc32c_combiner(lb)(ca, cb) == cab, "len_a " << la << " len_b " << lb);
    BOOST_TEST_REQUIRE(w::crc32c_combine(ca, cb, lb) == w::crc32c(B, ca));
  }
  // Identities: an empty A (CRC 0) and an empty B (length 0, CRC 0).
  BOOST_TEST(w::crc32c_combine(0, 0x12345678u, 1234) == 0x12345678u);
  BOOST_TEST(w::crc32c_combine(0x9abcdef0u, 0, 0) == 0x9abcdef0u);
  BOOST_TEST(w::crc32c_combiner(99).length() == 99u);
}

// Lengths far beyond any buffer: combine(c, 0, n) is c·x^(8n) mod P, and
// x^(8n) = x^(8·n1)·x^(8·n2) for n = n1 + n2, so shifting once by n must equal
// shifting by n1 and then by n2 (the 64-bit length's top bits included).
BOOST_AUTO_TEST_CASE(combine_with_huge_lengths_is_consistent) {
  const std::uint32_t ca = 0xdeadbeefu;
  for (std::uint64_t n : {std::uint64_t{1} << 32, (std::uint64_t{1} << 40) + 12345, ~std::uint64_t{0}}) {
    const std::uint64_t n1 = n / 3, n2 = n - n1;
    const std::uint32_t once = w::crc32c_combine(ca, 0, n);
    const std::uint32_t twice = w::crc32c_combine(w::crc32c_combine(ca, 0, n1), 0, n2);
    BOOST_TEST(once == twice, "n " << n);
  }
}

// crc32c_chunked (the CRC pass that wire::decode's visitor and the worker's
// value check ride in): the same CRC as one crc32c call at sizes around
// the 192 KiB chunk, and the visitor sees every byte once, in order, in
// chunks of crc32c_chunk_bytes (the last one shorter), each after the CRC
// read it.
BOOST_AUTO_TEST_CASE(chunked_equals_one_pass_and_visits_every_chunk_in_order) {
  constexpr std::size_t c = w::crc32c_chunk_bytes;
  const auto buf = random_bytes(3 * c + 5, 21);
  const std::span<const std::byte> all(buf);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, c - 1, c, c + 1, 2 * c + 4, 3 * c + 5}) {
    const auto s = all.first(n);
    std::size_t seen = 0, calls = 0;
    bool in_order = true, whole_chunks = true;
    const std::uint32_t got = w::crc32c_chunked(s, 0x1234u, [&](std::span<const std::byte> chunk) {
      in_order = in_order && chunk.data() == s.data() + seen;
      whole_chunks = whole_chunks && (chunk.size() == c || seen + chunk.size() == n);
      seen += chunk.size();
      ++calls;
    });
    BOOST_TEST(got == w::crc32c(s, 0x1234u), "n " << n);
    BOOST_TEST(seen == n, "n " << n);
    BOOST_TEST(calls == (n + c - 1) / c, "n " << n);
    BOOST_TEST(in_order, "n " << n);
    BOOST_TEST(whole_chunks, "n " << n);
  }
}
