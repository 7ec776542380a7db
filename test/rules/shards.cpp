#include <ashl/rules/shards.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <vector>

namespace ps = ashl::ps;

BOOST_AUTO_TEST_CASE(even_ranges_cover_everything_and_differ_by_at_most_one) {
  for (std::uint64_t n : {0ull, 1ull, 7ull, 10ull, 1'000'003ull}) {
    for (std::uint32_t s : {1u, 2u, 3u, 4u, 16u}) {
      auto l = ps::shard_layout::even(n, s);
      BOOST_REQUIRE(l.has_value());
      BOOST_TEST(l->elements() == n);
      BOOST_TEST(l->servers() == s);
      std::uint64_t at = 0, lo = n, hi = 0;
      for (std::uint32_t k = 0; k < s; ++k) {
        const auto r = l->range(k);
        BOOST_TEST(r.begin == at);
        at = r.end;
        lo = std::min(lo, r.size());
        hi = std::max(hi, r.size());
        for (std::uint64_t e : {r.begin, r.end - 1})
          if (!r.empty()) BOOST_TEST(l->server_of(e) == k);
      }
      BOOST_TEST(at == n);
      BOOST_TEST(hi - lo <= 1);
    }
  }
}

BOOST_AUTO_TEST_CASE(known_split) {
  auto l = ps::shard_layout::even(10, 4);  // 3 3 2 2
  BOOST_REQUIRE(l.has_value());
  BOOST_TEST((l->range(0) == ps::key_range{0, 3}));
  BOOST_TEST((l->range(1) == ps::key_range{3, 6}));
  BOOST_TEST((l->range(2) == ps::key_range{6, 8}));
  BOOST_TEST((l->range(3) == ps::key_range{8, 10}));
  for (std::uint64_t e = 0; e < 10; ++e) BOOST_TEST(l->server_of(e) == (e < 3 ? 0u : e < 6 ? 1u : e < 8 ? 2u : 3u));
}

BOOST_AUTO_TEST_CASE(zero_servers_refused_and_default_is_timing_only) {
  auto l = ps::shard_layout::even(5, 0);
  BOOST_REQUIRE(!l.has_value());
  BOOST_TEST(l.error().message() == "shard_layout.servers = 0: must be >= 1");
  ps::shard_layout d;
  BOOST_TEST(d.timing_only());
  BOOST_TEST(d.servers() == 1u);
  BOOST_TEST(d.range(0).empty());
}

BOOST_AUTO_TEST_CASE(save_load_round_trip_and_truncation) {
  auto l = ps::shard_layout::even(123, 5);
  std::vector<std::byte> bytes;
  ashl::state_writer w(bytes);
  l->save(w);
  ps::shard_layout back;
  ashl::state_reader r(bytes);
  BOOST_TEST(back.load(r).ok());
  BOOST_TEST((back == *l));
  ps::shard_layout cut;
  ashl::state_reader t(std::span<const std::byte>(bytes.data(), bytes.size() - 1));
  BOOST_TEST(!cut.load(t).ok());
  BOOST_TEST((cut == ps::shard_layout{}));
}
