// test/compress/simd_paths/level.hpp — what each forced host SIMD level of
// test/compress/simd_paths.cpp reports (level.cpp, compiled once per level).
#pragma once

#include "../../cuda/odr_encode.hpp"

#include <string>
#include <vector>

struct simd_level_result {
  std::string name;                   // "avx2", as detail::host_simd_name
  int level = 0;                      // ASHL_HOST_SIMD of that translation unit
  bool cpu_runs_it = false;           // this CPU has the level's instructions
  std::vector<odr_payload> payloads;  // odr_encode.hpp's cases at that level
};

// One per level: simd_paths_run_host_simd_portable() ... _avx512().
#define ASHL_TEST_SIMD_PATHS_CAT2(a, b) a##b
#define ASHL_TEST_SIMD_PATHS_CAT(a, b) ASHL_TEST_SIMD_PATHS_CAT2(a, b)
