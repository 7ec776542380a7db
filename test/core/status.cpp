#include <ashl/core/status.hpp>

#include <boost/test/unit_test.hpp>

#include <string>

namespace {
ashl::status check_levels(int levels) {
  if (levels < 1) return ashl::invalid_argument("qsgd.levels", levels, "must be >= 1");
  return {};
}
ashl::result<int> doubled(int levels) {
  ASHL_TRY(check_levels(levels));
  return levels * 2;
}
}  // namespace

BOOST_AUTO_TEST_CASE(ok_status_is_cheap_and_true) {
  const ashl::status s;
  BOOST_TEST(s.ok());
  BOOST_TEST(static_cast<bool>(s));
  BOOST_TEST((s.code() == ashl::errc::ok));
  BOOST_TEST(s.message().empty());
  BOOST_TEST(s.to_string() == "ok");
}

BOOST_AUTO_TEST_CASE(messages_name_field_and_value) {
  const ashl::status s = check_levels(0);
  BOOST_TEST(!s.ok());
  BOOST_TEST((s.code() == ashl::errc::invalid_argument));
  BOOST_TEST(s.message() == "qsgd.levels = 0: must be >= 1");
  BOOST_TEST(s.to_string() == "invalid argument: qsgd.levels = 0: must be >= 1");
  BOOST_TEST(ashl::out_of_range("k", 5u, "").message() == "k = 5");
  BOOST_TEST(ashl::malformed("name", "abc", "bad").message() == "name = \"abc\": bad");
  BOOST_TEST(ashl::make_error(ashl::errc::unsupported, "flag", true, "x").message() == "flag = true: x");
  BOOST_TEST(ashl::make_error(ashl::errc::malformed, "byte", std::uint8_t{200}, "x").message() == "byte = 200: x");
  BOOST_TEST(ashl::make_error(ashl::errc::malformed, "b", std::int8_t{-3}, "x").message() == "b = -3: x");
}

BOOST_AUTO_TEST_CASE(every_errc_has_a_name) {
  for (int i = 0; i <= static_cast<int>(ashl::errc::internal); ++i)
    BOOST_TEST(ashl::to_string(static_cast<ashl::errc>(i)) != "unknown error");
  BOOST_TEST(ashl::to_string(ashl::errc::checksum_mismatch) == "checksum mismatch");
}

BOOST_AUTO_TEST_CASE(result_holds_value_or_error_and_try_propagates) {
  auto good = doubled(3);
  BOOST_TEST(good.has_value());
  BOOST_TEST(*good == 6);
  BOOST_TEST(good.to_status().ok());
  auto bad = doubled(-1);
  BOOST_TEST(!bad);
  BOOST_TEST((bad.error().code() == ashl::errc::invalid_argument));
  BOOST_TEST(bad.error().message() == "qsgd.levels = -1: must be >= 1");
  BOOST_TEST(bad.to_status().message() == bad.error().message());
  ashl::result<std::string> str(std::string("abc"));
  BOOST_TEST(str->size() == 3u);
  std::string moved = std::move(str).value();
  BOOST_TEST(moved == "abc");
}
