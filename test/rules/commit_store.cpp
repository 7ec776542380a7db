#include <ashl/rules/commit_store.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace ps = ashl::ps;

namespace {
std::vector<std::byte> bytes_of(std::size_t n, std::uint8_t fill) { return std::vector<std::byte>(n, std::byte{fill}); }
bool holds(const ps::commit_store& s, std::uint32_t w, std::uint64_t q, const std::vector<std::byte>& b) {
  const auto* e = s.find(w, q);
  if (e == nullptr) return false;
  const auto p = s.payload(*e);
  return std::vector<std::byte>(p.begin(), p.end()) == b;
}
}  // namespace

BOOST_AUTO_TEST_CASE(put_find_erase) {
  ps::commit_store s(1000);
  const ps::commit_meta m{ashl::codec_id::topk, ashl::dtype::f16, 77, 5, 2};
  BOOST_TEST(s.put(1, 4, m, bytes_of(100, 1)).ok());
  BOOST_TEST(s.put(1, 5, m, bytes_of(50, 2)).ok());
  BOOST_TEST(s.put(0, 4, {}, bytes_of(10, 3)).ok());
  BOOST_TEST(s.size() == 3u);
  BOOST_TEST(s.bytes() == 160u);
  BOOST_TEST(s.count(1) == 2u);
  BOOST_TEST(holds(s, 1, 4, bytes_of(100, 1)));
  BOOST_TEST(holds(s, 1, 5, bytes_of(50, 2)));
  BOOST_TEST(holds(s, 0, 4, bytes_of(10, 3)));
  BOOST_TEST((s.find(1, 4)->meta == m));
  BOOST_TEST(s.find(2, 4) == nullptr);
  BOOST_TEST(s.erase(1, 4));
  BOOST_TEST(!s.erase(1, 4));
  BOOST_TEST(s.find(1, 4) == nullptr);
  BOOST_TEST(holds(s, 1, 5, bytes_of(50, 2)));
  BOOST_TEST(s.bytes() == 60u);
}

BOOST_AUTO_TEST_CASE(the_bound_refuses_and_keeps_everything_held) {
  ps::commit_store s(100);
  BOOST_TEST(s.put(0, 1, {}, bytes_of(60, 1)).ok());
  const auto r = s.put(1, 1, {}, bytes_of(41, 2));
  BOOST_TEST(!r.ok());
  BOOST_TEST((r.code() == ashl::errc::out_of_range));
  BOOST_TEST(r.message() == "store_bytes = 100: a payload of 41 bytes would pass it (60 bytes of 1 buffered commits held)");
  BOOST_TEST(s.size() == 1u);
  BOOST_TEST(holds(s, 0, 1, bytes_of(60, 1)));
  BOOST_TEST(s.put(1, 1, {}, bytes_of(40, 2)).ok());  // exactly the bound
  BOOST_TEST(s.bytes() == 100u);
  BOOST_TEST(s.arena_bytes() <= 100u);
}

BOOST_AUTO_TEST_CASE(fragmented_space_is_compacted_and_contents_survive) {
  ps::commit_store s(100);
  for (std::uint32_t w = 0; w < 5; ++w) BOOST_TEST(s.put(w, 1, {}, bytes_of(20, static_cast<std::uint8_t>(w))).ok());
  BOOST_TEST(s.erase(1, 1));
  BOOST_TEST(s.erase(3, 1));  // 40 bytes free, in two holes of 20
  BOOST_TEST(s.put(7, 1, {}, bytes_of(40, 9)).ok());
  BOOST_TEST(holds(s, 0, 1, bytes_of(20, 0)));
  BOOST_TEST(holds(s, 2, 1, bytes_of(20, 2)));
  BOOST_TEST(holds(s, 4, 1, bytes_of(20, 4)));
  BOOST_TEST(holds(s, 7, 1, bytes_of(40, 9)));
  BOOST_TEST(s.arena_bytes() <= 100u);
}

BOOST_AUTO_TEST_CASE(random_churn_matches_a_map_and_never_passes_the_bound) {
  ps::commit_store s(4096);
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<std::byte>> model;
  std::uint64_t x = 88172645463325252ull, used = 0;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (int step = 0; step < 20000; ++step) {
    const auto w = static_cast<std::uint32_t>(next() % 8);
    const std::uint64_t q = next() % 6;
    const auto key = std::make_pair(w, q);
    if (model.count(key)) {
      BOOST_REQUIRE(s.erase(w, q));
      used -= model[key].size();
      model.erase(key);
    } else {
      auto b = bytes_of(next() % 700, static_cast<std::uint8_t>(next()));
      const auto r = s.put(w, q, {}, b);
      BOOST_REQUIRE(r.ok() == (used + b.size() <= 4096));
      if (r.ok()) {
        used += b.size();
        model[key] = std::move(b);
      }
    }
    BOOST_REQUIRE(s.bytes() == used);
    BOOST_REQUIRE(s.arena_bytes() <= 4096u);
  }
  for (const auto& [k, b] : model) BOOST_TEST(holds(s, k.first, k.second, b));
}

BOOST_AUTO_TEST_CASE(save_load_round_trip_and_truncation) {
  ps::commit_store s(500);
  BOOST_TEST(s.put(2, 9, {ashl::codec_id::qsgd, ashl::dtype::bf16, 3, 4, 5}, bytes_of(30, 7)).ok());
  BOOST_TEST(s.put(0, 1, {}, bytes_of(0, 0)).ok());
  std::vector<std::byte> bytes;
  ashl::state_writer w(bytes);
  s.save(w);
  ps::commit_store back(1);
  ashl::state_reader r(bytes);
  BOOST_REQUIRE(back.load(r).ok());
  BOOST_TEST(back.bound() == 500u);
  BOOST_TEST(back.size() == 2u);
  BOOST_TEST(holds(back, 2, 9, bytes_of(30, 7)));
  BOOST_TEST((back.find(2, 9)->meta == ps::commit_meta{ashl::codec_id::qsgd, ashl::dtype::bf16, 3, 4, 5}));
  ps::commit_store cut(1);
  ashl::state_reader t(std::span<const std::byte>(bytes.data(), bytes.size() - 3));
  BOOST_TEST(!cut.load(t).ok());
  BOOST_TEST(cut.empty());
  BOOST_TEST(cut.bound() == 1u);
}
