// main() of the Boost.Test executables built with the shared precompiled
// header (test/CMakeLists.txt, ashl_add_test). It is in the static library
// ashl_test_main, so a test that defines its own main (one that reports
// itself skipped without a component) keeps it: the linker takes this one
// only when main is still undefined.
#include <boost/test/unit_test.hpp>

bool init_unit_test();

int main(int argc, char* argv[]) { return ::boost::unit_test::unit_test_main(&init_unit_test, argc, argv); }
