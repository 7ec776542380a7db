#include <ashl/wire/ids.hpp>

#include <boost/test/unit_test.hpp>

#include <set>
#include <string_view>

BOOST_AUTO_TEST_CASE(codec_ids_are_stable_and_named) {
  // Wire values: these numbers are in docs/wire-format.md and must never change.
  static_assert(static_cast<int>(ashl::codec_id::identity) == 0);
  static_assert(static_cast<int>(ashl::codec_id::topk) == 3);
  static_assert(static_cast<int>(ashl::codec_id::natural) == 10);
  std::set<std::string_view> names;
  for (int i = 0; i < ashl::codec_id_count; ++i) {
    const auto c = static_cast<ashl::codec_id>(i);
    BOOST_TEST(ashl::to_string(c) != "?");
    names.insert(ashl::to_string(c));
    BOOST_TEST((ashl::codec_id_from_string(ashl::to_string(c)).value() == c));
    BOOST_TEST((ashl::codec_id_from_byte(static_cast<std::uint8_t>(i)).value() == c));
  }
  BOOST_TEST(names.size() == static_cast<std::size_t>(ashl::codec_id_count));
  BOOST_TEST(!ashl::codec_id_from_byte(static_cast<std::uint8_t>(ashl::codec_id_count)).has_value());
  BOOST_TEST(!ashl::codec_id_from_byte(255).has_value());
  BOOST_TEST(!ashl::codec_id_from_string("gzip").has_value());
  BOOST_TEST(ashl::to_string(static_cast<ashl::codec_id>(99)) == "?");
}
