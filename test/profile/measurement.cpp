#include <ashl/profile/measurement.hpp>

#include <boost/test/unit_test.hpp>

#include <limits>
#include <type_traits>

namespace ap = ashl::profile;

BOOST_AUTO_TEST_CASE(valid_measurements_pass) {
  BOOST_TEST(ap::validate({.worker = 3, .kind = ap::measurement_kind::push, .seconds = 0.012, .amount = 4e6}).ok());
  BOOST_TEST(ap::validate({.kind = ap::measurement_kind::round, .seconds = 1.5}).ok());
  BOOST_TEST(ap::validate({.kind = ap::measurement_kind::commit, .seconds = 0.5, .time = -3.0}).ok());
  // One type and one enum with core/plan.hpp (and so with sync/ and the wire).
  static_assert(std::is_same_v<ap::measurement, ashl::measurement>);
  static_assert(std::is_same_v<ap::measurement_kind, ashl::measurement_kind>);
  BOOST_TEST(ap::to_string(ap::measurement_kind::compress) == "compress");
  BOOST_TEST(ap::to_string(ap::measurement_kind::round) == "round");
}

BOOST_AUTO_TEST_CASE(bad_measurements_name_field_and_value) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double bad : {0.0, -0.5, inf, -inf, nan}) {
    BOOST_TEST(!ap::validate({.kind = ap::measurement_kind::compute, .seconds = bad, .amount = 32}).ok());
  }
  auto s = ap::validate({.kind = ap::measurement_kind::compute, .seconds = -0.5, .amount = 32});
  BOOST_TEST(s.message() == "measurement.seconds = -0.5: duration must be finite and > 0");
  BOOST_TEST((s.code() == ashl::errc::invalid_argument));
  auto z = ap::validate({.kind = ap::measurement_kind::pull, .seconds = 0.0, .amount = 8});
  BOOST_TEST(z.message() == "measurement.seconds = 0: duration must be finite and > 0");
  auto a = ap::validate({.kind = ap::measurement_kind::push, .seconds = 0.1, .amount = -1});
  BOOST_TEST(a.message() == "measurement.amount = -1: must be finite and >= 0");
  auto k = ap::validate({.kind = static_cast<ap::measurement_kind>(6), .seconds = 0.1});
  BOOST_TEST(k.message() == "measurement.kind = 6: unknown kind");
  auto t = ap::validate({.kind = ap::measurement_kind::pull, .seconds = 0.1, .time = nan});
  BOOST_TEST(t.message() == "measurement.time = nan: must be finite");
}
