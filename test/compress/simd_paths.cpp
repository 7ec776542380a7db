// Every host SIMD path forced (docs/codecs.md "Speed"): the same cases (test/cuda/
// odr_encode.hpp: every codec, error feedback and DGC, f32/f16/bf16, sizes
// 1..70001) encoded and decoded with the library built at each level of
// ASHL_HOST_SIMD (simd_paths/level.cpp, one translation unit per level),
// compared byte for byte with the portable build. A level this CPU cannot
// run is still compared (its run-time checks fall back to the level below)
// but reported as not run. The test prints which paths ran.
#include <ashl/compress/detail/host_simd.hpp>

#include <boost/test/unit_test.hpp>

#include "simd_paths/level.hpp"

#include <iostream>
#include <string>
#include <vector>

simd_level_result simd_paths_run_host_simd_portable();
simd_level_result simd_paths_run_host_simd_sse2();
#if defined(__x86_64__)
simd_level_result simd_paths_run_host_simd_avx2();
simd_level_result simd_paths_run_host_simd_f16c();
simd_level_result simd_paths_run_host_simd_avx512();
#endif

BOOST_AUTO_TEST_CASE(every_level_matches_portable) {
  const simd_level_result portable = simd_paths_run_host_simd_portable();
  BOOST_TEST(portable.name == "portable");
  BOOST_TEST(portable.payloads.size() > 100u);
  for (const odr_payload& p : portable.payloads) BOOST_TEST(p.error.empty(), p.what << ": " << p.error);

  std::vector<simd_level_result> levels;
  levels.push_back(simd_paths_run_host_simd_sse2());
#if defined(__x86_64__)
  levels.push_back(simd_paths_run_host_simd_avx2());
  levels.push_back(simd_paths_run_host_simd_f16c());
  levels.push_back(simd_paths_run_host_simd_avx512());
  // The names say the translation units really were built at distinct levels.
  BOOST_TEST(levels[1].name == "avx2");
  BOOST_TEST(levels[2].name == "f16c");
  BOOST_TEST(levels[3].name == "avx512");
#endif
  BOOST_TEST(levels[0].name == "sse2");

  std::string ran = "portable", not_run;
  for (const simd_level_result& l : levels) {
    (l.cpu_runs_it ? ran : not_run) += " " + l.name;
    BOOST_TEST_REQUIRE(l.payloads.size() == portable.payloads.size());
    for (std::size_t i = 0; i < l.payloads.size(); ++i) {
      const odr_payload &a = portable.payloads[i], &b = l.payloads[i];
      BOOST_TEST(a.what == b.what);
      BOOST_TEST(a.error == b.error, l.name << " " << b.what);
      BOOST_TEST(a.bytes == b.bytes, l.name << " " << b.what << ": payload bytes differ from portable");
      BOOST_TEST(a.decoded == b.decoded, l.name << " " << b.what << ": decode_add differs from portable");
    }
  }
  std::cout << "host SIMD paths run and checked against portable: " << ran << "\n";
  if (!not_run.empty()) std::cout << "not run (this CPU lacks them; compared on their fallback): " << not_run << "\n";
  BOOST_TEST_MESSAGE("paths run: " << ran);
}
