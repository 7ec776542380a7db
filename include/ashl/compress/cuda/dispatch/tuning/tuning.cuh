// ashl/compress/cuda/dispatch/tuning/tuning.cuh — launch parameters of the
// device codecs, one aggregate per kernel family, chosen by compute capability.
//
//   auto dev = detail::current_device();          // cc and SM count, no sync
//   auto t = detail::tuning_for(dev.cc_major, dev.cc_minor);
//   kernel<<<detail::grid_for(n, t.elementwise.block_threads, ...), ...>>>(...);
//
// UNMEASURED DEFAULTS. None of these values has been timed on a device yet
// (no GPU was available when they were written; docs/perf/compress-gpu.md).
// They are the usual starting points for memory-bound kernels on sm_80/sm_90
// (256-thread blocks, a few items per thread, enough resident blocks per SM to
// hide DRAM latency) and must be replaced by figures from
// bench/gpu/run.sh on the target GPU, with the GPU and figure noted here.
// The dispatch code reads nothing else, so retuning is local.
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/*.cuh needs nvcc (CUDA C++)"
#endif

#include <ashl/config.hpp>

#include <cuda_runtime.h>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

// Element-wise kernels (casts, dense decode-add, gathers): grid-stride loops.
struct elementwise_tuning {
  int block_threads;
  int items_per_thread;  // consecutive elements per thread per grid step
  int blocks_per_sm;     // grid cap, in resident blocks per SM
};

// Radix-select histogram passes: one shared-memory histogram per block.
struct histogram_tuning {
  int block_threads;
  int items_per_thread;
  int blocks_per_sm;
};

struct codec_tuning {
  elementwise_tuning elementwise;
  histogram_tuning histogram;
};

// sm_90 (H100/H200) defaults: unmeasured.
inline constexpr codec_tuning tuning_sm90{{256, 4, 8}, {512, 8, 4}};
// sm_80/sm_86/sm_89 defaults: unmeasured.
inline constexpr codec_tuning tuning_sm80{{256, 4, 8}, {512, 8, 3}};
// Anything older or unknown: conservative, unmeasured.
inline constexpr codec_tuning tuning_generic{{256, 4, 4}, {256, 8, 4}};

constexpr codec_tuning tuning_for(int cc_major, int /*cc_minor*/) noexcept {
  if (cc_major >= 9) return tuning_sm90;
  if (cc_major == 8) return tuning_sm80;
  return tuning_generic;
}

struct device_properties {
  int cc_major = 0, cc_minor = 0, sm_count = 1;
};

// Attribute queries do not touch a stream, so they are allowed while a
// stream is being captured into a graph.
inline cudaError_t current_device(device_properties& p) noexcept {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&p.cc_major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&p.cc_minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&p.sm_count, cudaDevAttrMultiProcessorCount, dev);
  return e;
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
