// test/compress/simd_paths/level.cpp — the codecs at one forced host SIMD
// level: test/CMakeLists.txt compiles this file once per ASHL_HOST_SIMD
// (portable, sse2, avx2, f16c, avx512; the last three on x86-64 only) into
// test_compress_simd_paths. Each copy's library code is in its own inline
// namespace compress::host_simd_<level> (compress/detail/host_simd.hpp), so
// the copies do not merge at link time and each runs its own kernels.
#include <ashl/compress/detail/elements.hpp>
#include <ashl/compress/detail/host_simd.hpp>
#include <ashl/compress/detail/random_words.hpp>

#include "level.hpp"

namespace cd = ::ashl::compress::detail;

namespace {
// Whether this CPU has what the level adds (the library's own run-time
// checks, which say false above the level the file was built for).
bool cpu_runs_level() {
#if ASHL_HOST_SIMD == ASHL_HOST_SIMD_PORTABLE
  return true;
#elif ASHL_HOST_SIMD == ASHL_HOST_SIMD_SSE2
#if ASHL_DETAIL_HOST_X86
  return __builtin_cpu_supports("sse2");
#else
  return true;  // the 4-lane vector extension only
#endif
#elif ASHL_HOST_SIMD == ASHL_HOST_SIMD_AVX2
  return cd::cpu_has_avx2();
#elif ASHL_HOST_SIMD == ASHL_HOST_SIMD_F16C
  return cd::cpu_has_avx2_f16c();
#else
  return cd::cpu_has_avx512f();
#endif
}
}  // namespace

simd_level_result ASHL_TEST_SIMD_PATHS_CAT(simd_paths_run_, ASHL_DETAIL_HOST_SIMD_NS)() {
  simd_level_result r;
  r.name = cd::host_simd_name;
  r.level = cd::host_simd_level;
  r.cpu_runs_it = cpu_runs_level();
  r.payloads = odr_detail::encode_all();
  return r;
}
