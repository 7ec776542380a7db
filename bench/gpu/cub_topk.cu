// bench/gpu/cub_topk.cu — the cub::DeviceTopK baseline for ashl's exact
// device top-k (docs/perf/compress-gpu.md): the k largest |x| and their indices, as ashl's
// compress::cuda topk computes them, through cub::DeviceTopK::MaxPairs with
// keys |x| (a transform iterator, nothing materialized) and values the
// element indices (a counting iterator), in the fastest configuration CUB
// offers (unsorted output, determinism not guaranteed).
//
//   nvcc -std=c++20 -O3 -arch=sm_90 -I CCCL/cub -I CCCL/libcudacxx/include -I CCCL/thrust \
//        bench/gpu/cub_topk.cu -o cub_topk
//   cub_topk --runs 25 --sizes 1048576 25557032
//
// DeviceTopK arrived in CCCL 3.3; the CUDA 13.0 toolkit ships an older CCCL,
// so bench/gpu/run.sh builds this file only against a newer CCCL checkout
// (ASHL_CCCL_DIR) and skips it, saying so, otherwise. Same method as
// ashl_bench_compress_cuda (docs/perf/compress-gpu.md): inputs rotate over
// enough buffers that the working set exceeds L2, warm-up runs, each run
// timed alone with CUDA events, the median reported with min and max. One
// JSON object per case, in the benchmark's schema ("codec": "cub_topk_1%").
#include <cub/device/device_topk.cuh>
#include <cuda/iterator>
#include <cuda/std/execution>
#include <cuda/stream>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "cub_topk: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

struct magnitude_f32 {
  __host__ __device__ float operator()(float v) const { return fabsf(v); }
};
struct magnitude_bf16 {
  __host__ __device__ __nv_bfloat16 operator()(__nv_bfloat16 v) const { return __habs(v); }
};

template <class T, class Abs>
bool run_case(const char* dtype, std::size_t n, double fraction, int warmup, int runs, cudaStream_t stream) {
  const std::size_t k = std::max<std::size_t>(1, static_cast<std::size_t>(fraction * double(n) + 0.5));
  const std::size_t bytes = n * sizeof(T);
  const int rotate = static_cast<int>(std::clamp<std::size_t>((256u << 20) / bytes, 2, 8));
  std::vector<T*> in(rotate, nullptr);
  {
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal;
    std::vector<T> h(n);
    for (auto& v : h) v = T(normal(rng));
    for (auto& p : in) {
      if (!ok(cudaMalloc(&p, bytes), "cudaMalloc input")) return false;
      if (!ok(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice), "upload")) return false;
    }
  }
  T* keys_out = nullptr;
  std::uint32_t* idx_out = nullptr;
  if (!ok(cudaMalloc(&keys_out, k * sizeof(T)), "cudaMalloc keys") ||
      !ok(cudaMalloc(&idx_out, k * sizeof(std::uint32_t)), "cudaMalloc indices"))
    return false;
  auto requirements =
      cuda::execution::require(cuda::execution::determinism::not_guaranteed, cuda::execution::output_ordering::unsorted);
  auto env = cuda::std::execution::env{cuda::stream_ref{stream}, requirements};
  auto indices = cuda::make_counting_iterator<std::uint32_t>(0);
  std::size_t temp_bytes = 0;
  if (!ok(cub::DeviceTopK::MaxPairs(nullptr, temp_bytes, cuda::make_transform_iterator(in[0], Abs{}), keys_out,
                                    indices, idx_out, n, k, env),
          "MaxPairs (size)"))
    return false;
  void* temp = nullptr;
  if (!ok(cudaMalloc(&temp, std::max<std::size_t>(temp_bytes, 1)), "cudaMalloc scratch")) return false;
  auto once = [&](int i) {
    return cub::DeviceTopK::MaxPairs(temp, temp_bytes, cuda::make_transform_iterator(in[i % rotate], Abs{}), keys_out,
                                     indices, idx_out, n, k, env);
  };
  for (int i = 0; i < warmup; ++i)
    if (!ok(once(i), "MaxPairs")) return false;
  if (!ok(cudaStreamSynchronize(stream), "warm-up")) return false;
  // Correctness spot check: the k-th largest |x| bounds every selected key
  // from below and no selected index repeats.
  {
    std::vector<std::uint32_t> idx(k);
    if (!ok(cudaMemcpy(idx.data(), idx_out, k * 4, cudaMemcpyDeviceToHost), "download")) return false;
    std::sort(idx.begin(), idx.end());
    if (std::adjacent_find(idx.begin(), idx.end()) != idx.end() || idx.back() >= n) {
      std::fprintf(stderr, "cub_topk: indices out of range or repeated at n=%zu k=%zu\n", n, k);
      return false;
    }
  }
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> us;
  for (int i = 0; i < runs; ++i) {
    cudaEventRecord(a, stream);
    if (!ok(once(i + warmup), "MaxPairs")) return false;
    cudaEventRecord(b, stream);
    if (!ok(cudaEventSynchronize(b), "timed run")) return false;
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    us.push_back(ms * 1e3);
  }
  std::sort(us.begin(), us.end());
  const double med = us[us.size() / 2];
  std::printf(
      "{\"bench\": \"compress_cuda\", \"codec\": \"cub_topk_%s%%\", \"dtype\": \"%s\", \"n\": %zu, \"k\": %zu, "
      "\"median_us\": %.3f, \"min_us\": %.3f, \"max_us\": %.3f, \"gbps\": %.2f, \"cccl\": \"%d.%d.%d\"}\n",
      fraction == 0.01 ? "1" : "0.1", dtype, n, k, med, us.front(), us.back(), double(bytes) / (med * 1e3),
      CCCL_MAJOR_VERSION, CCCL_MINOR_VERSION, CCCL_PATCH_VERSION);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(temp);
  cudaFree(keys_out);
  cudaFree(idx_out);
  for (auto* p : in) cudaFree(p);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 25;
  std::vector<std::size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--sizes")) {
      while (i + 1 < argc && argv[i + 1][0] != '-') sizes.push_back(std::strtoull(argv[++i], nullptr, 10));
    } else {
      std::fprintf(stderr, "usage: %s [--runs N] --sizes N...\n", argv[0]);
      return 2;
    }
  }
  if (sizes.empty()) sizes = {std::size_t{1} << 20, std::size_t{1} << 24, 25557032, std::size_t{1} << 28};
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("SKIPPED: no CUDA device");
    return 77;
  }
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  for (std::size_t n : sizes) {
    for (double f : {0.01, 0.001}) {
      if (!run_case<float, magnitude_f32>("f32", n, f, 3, runs, stream)) return 1;
      if (!run_case<__nv_bfloat16, magnitude_bf16>("bf16", n, f, 3, runs, stream)) return 1;
    }
  }
  cudaStreamDestroy(stream);
  return 0;
}
