// ashl/config.hpp — feature macros, host/device annotation, versioned namespace.
//
// Every ashl header includes this first. Feature tests are in call form, so a
// misspelt feature is a preprocessor error instead of a silent 0:
//
//   #include <ashl/config.hpp>
//   #if ASHL_HAS_CUDA()
//   ...                                   // only when linked to ashl::cuda
//   #endif
//
// The values come from the CMake targets (ashl::cuda adds
// ASHL_CONFIG_HAS_CUDA=1, ashl::nccl ASHL_CONFIG_HAS_NCCL=1, ashl::ucx
// ASHL_CONFIG_HAS_UCX=1), never from __has_include guesses. The build defines
// the object-like ASHL_CONFIG_* names because a function-like macro cannot be
// passed portably through CMake's compile definitions. docs/design.md, "Optional
// components".
#pragma once

#ifndef ASHL_CONFIG_HAS_CUDA
#define ASHL_CONFIG_HAS_CUDA 0
#endif
#ifndef ASHL_CONFIG_HAS_NCCL
#define ASHL_CONFIG_HAS_NCCL 0
#endif
#ifndef ASHL_CONFIG_HAS_UCX
#define ASHL_CONFIG_HAS_UCX 0
#endif
#ifndef ASHL_CONFIG_HAS_MPI
#define ASHL_CONFIG_HAS_MPI 0
#endif
#ifndef ASHL_CONFIG_HAS_TORCH
#define ASHL_CONFIG_HAS_TORCH 0
#endif

#define ASHL_HAS_CUDA() (ASHL_CONFIG_HAS_CUDA + 0)
#define ASHL_HAS_NCCL() (ASHL_CONFIG_HAS_NCCL + 0)
#define ASHL_HAS_UCX() (ASHL_CONFIG_HAS_UCX + 0)
#define ASHL_HAS_MPI() (ASHL_CONFIG_HAS_MPI + 0)
#define ASHL_HAS_TORCH() (ASHL_CONFIG_HAS_TORCH + 0)

// True while nvcc (or clang in CUDA mode) compiles this translation unit,
// host and device passes alike.
#if defined(__CUDACC__)
#define ASHL_CUDA_COMPILATION() 1
#else
#define ASHL_CUDA_COMPILATION() 0
#endif

// Functions usable from host and device code. Plain `inline` without a CUDA
// compiler, so host-only tests are ordinary .cpp files (as CuTe does).
#if ASHL_CUDA_COMPILATION()
#define ASHL_HOST_DEVICE __host__ __device__ inline
#define ASHL_DEVICE __device__ inline
#else
#define ASHL_HOST_DEVICE inline
#define ASHL_DEVICE inline
#endif

#define ASHL_VERSION_MAJOR 0
#define ASHL_VERSION_MINOR 1
#define ASHL_VERSION_PATCH 0

// Versioned inline namespace: two shared objects built against different
// ashl versions do not clash on symbol names (as CUB does).
#define ASHL_NAMESPACE_BEGIN \
  namespace ashl {           \
  inline namespace v0 {
#define ASHL_NAMESPACE_END \
  }                        \
  }

// Hidden visibility for kernels and other symbols that must not be exported
// from a user's shared object.
#if defined(__GNUC__) || defined(__clang__)
#define ASHL_DETAIL_HIDDEN __attribute__((visibility("hidden")))
#else
#define ASHL_DETAIL_HIDDEN
#endif

// Programming-error checks (not user input: that gets a status). Active in
// debug builds and whenever ASHL_ENABLE_ASSERTS is defined.
#if !defined(NDEBUG) || defined(ASHL_ENABLE_ASSERTS)
#include <cstdio>
#include <cstdlib>
#define ASHL_ASSERT(cond, msg)                                                       \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "ashl: assertion failed: %s (%s) at %s:%d\n", #cond, msg, \
                   __FILE__, __LINE__);                                              \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)
#else
#define ASHL_ASSERT(cond, msg) ((void)0)
#endif
