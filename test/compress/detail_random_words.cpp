// Bulk Philox words (SSE2 / AVX2 / AVX-512 paths chosen at run time) must be
// exactly philox_stream's blocks in element order, for any start block,
// length, lane and a block index that crosses 2^32.
#include <ashl/compress/detail/random_words.hpp>
#include <boost/test/unit_test.hpp>

#include <ashl/core/philox.hpp>

#include <cstdint>
#include <vector>

using namespace ashl;

BOOST_AUTO_TEST_CASE(words_equal_philox_stream_blocks) {
  using simd = compress::detail::random_words::simd;
  const std::uint64_t seed = 0x0123456789abcdefull, step = (std::uint64_t{5} << 32) | 77u;
  // Every path this CPU has (the wider ones fall back where it lacks them).
  for (simd limit : {simd::best, simd::avx2, simd::sse2, simd::scalar})
  for (std::uint32_t lane : {0u, 3u}) {
    const compress::detail::random_words rw(seed, step, 9, lane);
    const philox_stream s(seed, step, 9);
    for (std::uint64_t first : {std::uint64_t{0}, std::uint64_t{13}, (std::uint64_t{1} << 32) - 21}) {
      for (std::size_t count : {1u, 3u, 4u, 7u, 8u, 15u, 16u, 17u, 31u, 64u, 101u, 256u, 333u}) {
        std::vector<std::uint32_t> w(4 * count + 1, 0xdeadbeefu);
        rw.fill(first, count, w.data(), limit);
        for (std::size_t j = 0; j < count; ++j)
          for (int k = 0; k < 4; ++k) BOOST_REQUIRE_EQUAL(w[4 * j + k], s.block(first + j, lane)[k]);
        BOOST_CHECK_EQUAL(w[4 * count], 0xdeadbeefu);  // nothing written past the blocks asked for
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(words_match_word_of_element) {
  const compress::detail::random_words rw(7, 8, 1);
  const philox_stream s(7, 8, 1);
  std::vector<std::uint32_t> w(4 * 300);
  rw.fill(0, 300, w.data());
  for (std::uint64_t i = 0; i < w.size(); ++i) BOOST_REQUIRE_EQUAL(w[i], s.word(i));
}
