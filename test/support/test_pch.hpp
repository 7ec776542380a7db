// test/support/test_pch.hpp — the precompiled header of the Boost.Test
// executables (test/CMakeLists.txt, ashl_add_test; docs/perf/ci.md).
//
// Boost.Test and a few standard headers nearly every test includes, parsed
// once per build instead of once per test (about 0.5 s of CPU less per test
// at -O3). Deliberately no ashl header: with GCC 12 a precompiled header of
// Boost.Test alone is 107 MB and one with the ps layer's server, policies and
// worker 334 MB, and loading that costs about as much CPU as parsing those
// headers saves (docs/perf/ci.md has the figures). A test still proves
// nothing about the self-containment of its header (ashl_header_check does).
//
// Nothing here may depend on BOOST_TEST_MODULE: each test's main and master
// suite come from test_main.cpp / test_init.cpp (library ashl_test_main).
#pragma once

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
