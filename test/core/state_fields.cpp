// put_fields/get_fields (core/fields.hpp) over a state_writer/state_reader
// (core/state_io.hpp): a table with a nested table and an enum writes the
// bytes of the put() sequence it replaces, an explicit table saves only the
// members it lists, and a short state names the nested field it ran out at.
#include <ashl/core/fields.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/core/state_io.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace {

enum class mode : std::uint8_t { off = 0, on = 1 };

struct inner {
  double t = 0.0;
  std::uint32_t k = 0;
  static constexpr auto fields() { return std::tuple{ashl::field{"t", &inner::t}, ashl::field{"k", &inner::k}}; }
};

struct outer {
  std::uint64_t n = 0;
  bool live = false;
  mode m = mode::off;
  inner at{};
  float not_saved = 0.0f;
  static constexpr auto fields() {
    return std::tuple{ashl::field{"n", &outer::n}, ashl::field{"live", &outer::live}, ashl::field{"m", &outer::m},
                      ashl::field{"at", &outer::at}};
  }
  static constexpr auto some() { return std::tuple{ashl::field{"at", &outer::at}, ashl::field{"n", &outer::n}}; }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_table_writes_the_put_sequence_it_replaces_and_reads_it_back) {
  const outer o{.n = 7, .live = true, .m = mode::on, .at = {.t = 2.5, .k = 9}, .not_saved = 1.0f};
  std::vector<std::byte> got, want;
  ashl::state_writer g(got), w(want);
  ashl::put_fields(g, o);
  w.put(std::uint64_t{7});
  w.put(true);
  w.put(std::uint8_t{1});
  w.put(2.5);
  w.put(std::uint32_t{9});
  BOOST_TEST((got == want));

  outer back;
  ashl::state_reader r(got);
  BOOST_TEST(ashl::get_fields(r, back, "o").ok());
  BOOST_TEST(r.at_end());
  BOOST_TEST(back.n == 7u);
  BOOST_TEST(back.live);
  BOOST_TEST((back.m == mode::on));
  BOOST_TEST(back.at.t == 2.5);
  BOOST_TEST(back.at.k == 9u);
  BOOST_TEST(back.not_saved == 0.0f);

  // Cut inside the nested table: the error names o.at.k.
  ashl::state_reader cut(std::span<const std::byte>(got.data(), got.size() - 1));
  outer c;
  const auto s = ashl::get_fields(cut, c, "o");
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("o.at.k") != std::string::npos, s.message());
  // A bool that is not 0 or 1 is refused by name (state_reader's rule).
  auto bad = got;
  bad[8] = std::byte{2};
  ashl::state_reader br(bad);
  const auto sb = ashl::get_fields(br, c, "o");
  BOOST_TEST(sb.message().find("o.live") != std::string::npos, sb.message());
}

BOOST_AUTO_TEST_CASE(an_explicit_table_saves_only_its_members_in_its_order) {
  const outer o{.n = 3, .live = true, .at = {.t = -1.0, .k = 4}};
  std::vector<std::byte> got, want;
  ashl::state_writer g(got), w(want);
  ashl::put_fields(g, o, outer::some());
  w.put(-1.0);
  w.put(std::uint32_t{4});
  w.put(std::uint64_t{3});
  BOOST_TEST((got == want));
  outer back;
  ashl::state_reader r(got);
  BOOST_TEST(ashl::get_fields(r, back, "o", outer::some()).ok());
  BOOST_TEST(back.n == 3u);
  BOOST_TEST(!back.live);  // not in the table: untouched
  BOOST_TEST(back.at.k == 4u);
}
