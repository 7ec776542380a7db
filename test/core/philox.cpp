#include <ashl/core/philox.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <set>

// Known-answer vectors from Random123's kat_vectors (philox4x32 10 rounds).
BOOST_AUTO_TEST_CASE(random123_known_answers) {
  struct kat {
    ashl::philox_counter ctr;
    ashl::philox_key key;
    ashl::philox_block want;
  };
  const kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const auto& k : kats) {
    const auto got = ashl::philox4x32(k.key)(k.ctr);
    for (int i = 0; i < 4; ++i) BOOST_TEST(got[i] == k.want[i]);
  }
}

BOOST_AUTO_TEST_CASE(usable_in_constant_expressions) {
  constexpr auto r = ashl::philox4x32({0, 0})({0, 0, 0, 0});
  static_assert(r[0] == 0x6627e8d5u && r[3] == 0x9b00dbd8u);
}

BOOST_AUTO_TEST_CASE(uniform01_range_and_exactness) {
  BOOST_TEST(ashl::uniform01(0) == 0.0f);
  BOOST_TEST(ashl::uniform01(0xffffffffu) < 1.0f);
  BOOST_TEST(ashl::uniform01(0xffffffffu) == 16777215.0f / 16777216.0f);
  BOOST_TEST(ashl::uniform01(0x80000000u) == 0.5f);
  BOOST_TEST(ashl::uniform01(0xffu) == 0.0f);  // low 8 bits are dropped
}

// The documented mapping (docs/wire-format.md, "Random streams").
BOOST_AUTO_TEST_CASE(stream_mapping_matches_the_documented_key_and_counter) {
  const std::uint64_t seed = 0x0123456789abcdefull, step = 0xfedcba9876543210ull;
  const std::uint32_t tensor = 77;
  const ashl::philox_stream s(seed, step, tensor);
  const ashl::philox4x32 g({0x89abcdefu, 0x01234567u ^ 0xfedcba98u});
  for (std::uint64_t block : {0ull, 1ull, 0xffffffffull, 0x1234500000007ull}) {
    for (std::uint32_t lane : {0u, 1u, 65535u}) {
      const ashl::philox_counter c{static_cast<std::uint32_t>(block), tensor, 0x76543210u,
                                   (lane << 16) | static_cast<std::uint32_t>((block >> 32) & 0xffffu)};
      BOOST_TEST((s.block(block, lane) == g(c)));
      for (std::uint64_t j = 0; j < 4; ++j) {
        BOOST_TEST(s.word(block * 4 + j, lane) == g(c)[static_cast<int>(j)]);
        BOOST_TEST(s.uniform(block * 4 + j, lane) == ashl::uniform01(g(c)[static_cast<int>(j)]));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(streams_differ_by_seed_step_tensor_and_lane) {
  const ashl::philox_stream base(1, 2, 3);
  std::set<std::uint32_t> firsts;
  firsts.insert(base.word(0));
  firsts.insert(ashl::philox_stream(2, 2, 3).word(0));
  firsts.insert(ashl::philox_stream(1, 3, 3).word(0));
  firsts.insert(ashl::philox_stream(1, 2, 4).word(0));
  firsts.insert(ashl::philox_stream(1, 2ull | (1ull << 32), 3).word(0));
  firsts.insert(base.word(0, 1));
  firsts.insert(base.word(4));
  BOOST_TEST(firsts.size() == 7u);
  // Same inputs, same bits: the stream is a pure function.
  BOOST_TEST(ashl::philox_stream(1, 2, 3).word(12345, 9) == base.word(12345, 9));
}

BOOST_AUTO_TEST_CASE(uniform_mean_is_plausible) {
  const ashl::philox_stream s(42, 7, 1);
  double sum = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const float u = s.uniform(static_cast<std::uint64_t>(i));
    BOOST_TEST_REQUIRE((u >= 0.0f && u < 1.0f));
    sum += u;
  }
  // Standard error of the mean is 1/sqrt(12 n) ~ 0.0009; 6 sigma.
  BOOST_TEST(std::abs(sum / n - 0.5) < 0.0055);
}
