// ashl/compress/detail/host_simd.hpp — the one switch that decides which host
// SIMD kernels the CPU codecs compile, and the inline namespace that keeps
// builds with different switches apart.
//
//   g++ -DASHL_HOST_SIMD=ASHL_HOST_SIMD_AVX2 ...   // cap the kernels at AVX2
//   ashl::compress::detail::host_simd_name         // "avx2"
//
// Levels, each adding one set of kernels to the one below:
//   ASHL_HOST_SIMD_PORTABLE  plain C++ only
//   ASHL_HOST_SIMD_SSE2      the compilers' 4-lane vector extension (SSE2 on
//                            x86-64, NEON elsewhere) and SSE2 intrinsics
//   ASHL_HOST_SIMD_AVX2      AVX2 kernels (target attributes, chosen at run time)
//   ASHL_HOST_SIMD_F16C      AVX2 + F16C 16-bit conversions (run time)
//   ASHL_HOST_SIMD_AVX512    AVX-512F kernels (run time)
// Unless the user sets ASHL_HOST_SIMD, it is derived here, once, from the
// target the compiler builds for: gcc/clang for x86-64 get every x86 level
// (the kernels carry target attributes and check the CPU at run time, so no
// -march flag is needed), other gcc/clang targets the vector extension, any
// other compiler the portable code. The derivation reads only __x86_64__ and
// __GNUC__/__clang__, which nvcc's host pass defines exactly as its host
// compiler does, so a .cu and a .cpp file of one program compile the same
// kernels. (Before, __CUDACC__ removed them from the .cu files: two bodies
// of one inline function, an ODR violation that changed qsgd payloads.)
//
// Every host codec header opens ASHL_DETAIL_COMPRESS_HOST_BEGIN, i.e.
// ashl::v0::compress::host_simd_<level>: code built at different levels
// (a test that forces each level in its own translation unit, or a user who
// sets the macro in one library only) never shares a mangled name, so the
// linker cannot merge two different bodies into one. Types that do not
// depend on the level (compress/concepts.hpp, compress/layout.hpp) stay in
// ashl::compress. Issue 12 item 1; docs/algorithms.md §4.
#pragma once

#include <ashl/config.hpp>

#define ASHL_HOST_SIMD_PORTABLE 0
#define ASHL_HOST_SIMD_SSE2 1
#define ASHL_HOST_SIMD_AVX2 2
#define ASHL_HOST_SIMD_F16C 3
#define ASHL_HOST_SIMD_AVX512 4

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define ASHL_DETAIL_HOST_SIMD_X86_TARGET 1
#else
#define ASHL_DETAIL_HOST_SIMD_X86_TARGET 0
#endif

#if !defined(ASHL_HOST_SIMD)
#if ASHL_DETAIL_HOST_SIMD_X86_TARGET
#define ASHL_HOST_SIMD ASHL_HOST_SIMD_AVX512
#elif defined(__GNUC__) || defined(__clang__)
#define ASHL_HOST_SIMD ASHL_HOST_SIMD_SSE2
#else
#define ASHL_HOST_SIMD ASHL_HOST_SIMD_PORTABLE
#endif
#endif

#if ASHL_HOST_SIMD < ASHL_HOST_SIMD_PORTABLE || ASHL_HOST_SIMD > ASHL_HOST_SIMD_AVX512
#error "ASHL_HOST_SIMD must be one of ASHL_HOST_SIMD_PORTABLE .. ASHL_HOST_SIMD_AVX512 (0..4)"
#endif
#if ASHL_HOST_SIMD >= ASHL_HOST_SIMD_SSE2 && !(defined(__GNUC__) || defined(__clang__))
#error "ASHL_HOST_SIMD above ASHL_HOST_SIMD_PORTABLE needs gcc or clang (vector extension)"
#endif
#if ASHL_HOST_SIMD >= ASHL_HOST_SIMD_AVX2 && !ASHL_DETAIL_HOST_SIMD_X86_TARGET
#error "ASHL_HOST_SIMD_AVX2 and above need an x86-64 target"
#endif

// The generic 4-lane vector extension (gcc/clang, any target).
#define ASHL_DETAIL_HOST_VECTOR (ASHL_HOST_SIMD >= ASHL_HOST_SIMD_SSE2)
// x86 intrinsics (<immintrin.h>, SSE2 as baseline, wider kernels by target
// attribute behind a run-time CPU check).
#define ASHL_DETAIL_HOST_X86 (ASHL_DETAIL_HOST_SIMD_X86_TARGET && ASHL_HOST_SIMD >= ASHL_HOST_SIMD_SSE2)

#if ASHL_HOST_SIMD == ASHL_HOST_SIMD_PORTABLE
#define ASHL_DETAIL_HOST_SIMD_NS host_simd_portable
#define ASHL_DETAIL_HOST_SIMD_NAME "portable"
#elif ASHL_HOST_SIMD == ASHL_HOST_SIMD_SSE2
#define ASHL_DETAIL_HOST_SIMD_NS host_simd_sse2
#define ASHL_DETAIL_HOST_SIMD_NAME "sse2"
#elif ASHL_HOST_SIMD == ASHL_HOST_SIMD_AVX2
#define ASHL_DETAIL_HOST_SIMD_NS host_simd_avx2
#define ASHL_DETAIL_HOST_SIMD_NAME "avx2"
#elif ASHL_HOST_SIMD == ASHL_HOST_SIMD_F16C
#define ASHL_DETAIL_HOST_SIMD_NS host_simd_f16c
#define ASHL_DETAIL_HOST_SIMD_NAME "f16c"
#else
#define ASHL_DETAIL_HOST_SIMD_NS host_simd_avx512
#define ASHL_DETAIL_HOST_SIMD_NAME "avx512"
#endif

// Open / close ashl::v0::compress::host_simd_<level> (the host codecs and
// compress::detail live there).
#define ASHL_DETAIL_COMPRESS_HOST_BEGIN \
  ASHL_NAMESPACE_BEGIN namespace compress { inline namespace ASHL_DETAIL_HOST_SIMD_NS {
#define ASHL_DETAIL_COMPRESS_HOST_END \
  }                                   \
  }                                   \
  ASHL_NAMESPACE_END

ASHL_DETAIL_COMPRESS_HOST_BEGIN
namespace detail {
// The level this translation unit compiled, for tests and diagnostics.
inline constexpr int host_simd_level = ASHL_HOST_SIMD;
inline constexpr const char* host_simd_name = ASHL_DETAIL_HOST_SIMD_NAME;
}  // namespace detail
ASHL_DETAIL_COMPRESS_HOST_END
