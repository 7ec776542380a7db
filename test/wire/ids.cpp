#include <ashl/wire/ids.hpp>

#include <boost/test/unit_test.hpp>

#include <set>
#include <string_view>

BOOST_AUTO_TEST_CASE(codec_ids_are_stable_and_named) {
  // Wire values: these numbers are in docs/wire-format.md and must never change.
  using c = ashl::codec_id;
  static_assert(static_cast<int>(c::identity) == 0 && static_cast<int>(c::fp16) == 1 && static_cast<int>(c::bf16) == 2 &&
                static_cast<int>(c::topk) == 3 && static_cast<int>(c::topk_sampled) == 4 &&
                static_cast<int>(c::randomk) == 5 && static_cast<int>(c::threshold) == 6 &&
                static_cast<int>(c::qsgd) == 7 && static_cast<int>(c::terngrad) == 8 && static_cast<int>(c::sign) == 9 &&
                static_cast<int>(c::natural) == 10 && static_cast<int>(c::block) == 11 && ashl::codec_id_count == 12);
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
