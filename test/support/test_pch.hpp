// test/support/test_pch.hpp — the precompiled header of the Boost.Test
// executables (test/CMakeLists.txt, ashl_add_test; docs/perf/ci.md).
//
// Parsed once per build instead of once per test: Boost.Test and the ps
// layer's headers (server, policies, worker: about 4 s of parsing each,
// included by most ps and sync tests). Only tests that include one of those
// use it (loading it costs about 3 s). Such a test sees these first
// (-include), so it cannot change them with a #define before its own
// includes; a test that needs that (or other compile definitions these
// headers read, such as ASHL_CONFIG_HAS_MPI) is built without it. Header
// self-containment is proven by ashl_header_check, not by the tests.
//
// Nothing here may depend on BOOST_TEST_MODULE: each test's main and master
// suite come from test_main.cpp / test_init.cpp (library ashl_test_main).
#pragma once

#include <boost/test/unit_test.hpp>

#include <ashl/ps/policies.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/ps/worker.hpp>
#include <ashl/transport/inproc.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>
