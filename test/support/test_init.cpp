// The master test suite of a Boost.Test executable built with the shared
// precompiled header: named as BOOST_TEST_MODULE=<layer>_<name> named it
// before, from the executable's name (test_<layer>_<name>).
#include <boost/test/unit_test.hpp>

#include <string>

bool init_unit_test() {
  auto& suite = ::boost::unit_test::framework::master_test_suite();
  if (suite.argc > 0 && suite.argv[0] != nullptr) {
    std::string name = suite.argv[0];
    name = name.substr(name.find_last_of('/') + 1);
    if (name.rfind("test_", 0) == 0) name = name.substr(5);
    suite.p_name.value = name;
  }
  return true;
}
