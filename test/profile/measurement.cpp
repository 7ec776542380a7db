#include <ashl/profile/measurement.hpp>

#include <boost/test/unit_test.hpp>

#include <limits>

namespace ap = ashl::profile;

BOOST_AUTO_TEST_CASE(valid_measurements_pass) {
  BOOST_TEST(ap::validate({.worker = 3, .kind = ap::measurement_kind::push, .amount = 4e6, .seconds = 0.012}).ok());
  BOOST_TEST(ap::validate({.kind = ap::measurement_kind::round, .seconds = 1.5}).ok());
  BOOST_TEST(ap::to_string(ap::measurement_kind::compress) == "compress");
  BOOST_TEST(ap::to_string(ap::measurement_kind::round) == "round");
}

BOOST_AUTO_TEST_CASE(bad_measurements_name_field_and_value) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double bad : {0.0, -0.5, inf, -inf, nan}) {
    BOOST_TEST(!ap::validate({.kind = ap::measurement_kind::compute, .amount = 32, .seconds = bad}).ok());
  }
  auto s = ap::validate({.kind = ap::measurement_kind::compute, .amount = 32, .seconds = -0.5});
  BOOST_TEST(s.message() == "measurement.seconds = -0.5: duration must be finite and > 0");
  BOOST_TEST((s.code() == ashl::errc::invalid_argument));
  auto z = ap::validate({.kind = ap::measurement_kind::pull, .amount = 8, .seconds = 0.0});
  BOOST_TEST(z.message() == "measurement.seconds = 0: duration must be finite and > 0");
  auto a = ap::validate({.kind = ap::measurement_kind::push, .amount = -1, .seconds = 0.1});
  BOOST_TEST(a.message() == "measurement.amount = -1: must be finite and >= 0");
  auto k = ap::validate({.kind = static_cast<ap::measurement_kind>(9), .seconds = 0.1});
  BOOST_TEST(k.message() == "measurement.kind = 9: unknown kind");
}
