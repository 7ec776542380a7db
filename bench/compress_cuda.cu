// ashl_bench_compress_cuda — device codec throughput against a device-to-
// device copy and (optionally) torch.topk.
//
//   ashl_bench_compress_cuda [--quick] [--runs N] [--torch-script bench/gpu/torch_topk.py]
//
// Cases: sizes 2^20 .. 2^28 and 25,557,032 (ResNet-50's parameter count),
// f32 and bf16 inputs; codecs: copy (cudaMemcpyAsync D2D, the bandwidth
// ceiling), bf16 cast (f32 input only), fp16 cast, exact top-k at k = 1 % and
// 0.1 %, random-k 1 %, qsgd (127 levels, bucket 512), terngrad, sign,
// natural, threshold (theta 2, about 4.6 % of normal data, cap 10 %), sampled
// top-k 1 %, and the decorators error_feedback<topk 1 %> and dgc<topk 1 %>
// (stochastic codecs with a fixed codec_context). Every codec is called
// through the one device-codec concept (compress/cuda/concepts.cuh). The
// payload of a data-dependent size (threshold, topk_sampled) is read back
// from device_output::d_used after the runs; `ratio` is payload bytes over
// input bytes. Method (docs/perf/compress-gpu.md): scratch and outputs allocated
// once per case; inputs rotate over enough buffers that the working set
// exceeds the L2 cache; warm-up runs, then each run timed alone with CUDA
// events on one stream; the median is reported with min and max. Copy
// bandwidth counts bytes read + written; codec "input GB/s" counts the input
// bytes read once. Prints a table, then one JSON object per case. Never an
// assertion on time.
#include <ashl/compress/cuda/cast.cuh>
#include <ashl/compress/cuda/concepts.cuh>
#include <ashl/compress/cuda/dgc.cuh>
#include <ashl/compress/cuda/error_feedback.cuh>
#include <ashl/compress/cuda/natural.cuh>
#include <ashl/compress/cuda/qsgd.cuh>
#include <ashl/compress/cuda/randomk.cuh>
#include <ashl/compress/cuda/sign.cuh>
#include <ashl/compress/cuda/terngrad.cuh>
#include <ashl/compress/cuda/threshold.cuh>
#include <ashl/compress/cuda/topk.cuh>
#include <ashl/compress/cuda/topk_sampled.cuh>

#include <ashl/compress/cast.hpp>
#include <ashl/compress/natural.hpp>
#include <ashl/compress/qsgd.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/sign.hpp>
#include <ashl/compress/terngrad.hpp>
#include <ashl/compress/threshold.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/compress/topk_sampled.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace cc = ashl::compress;

namespace {

bool ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "ashl_bench_compress_cuda: %s: %s\n", what, cudaGetErrorString(e));
    return false;
  }
  return true;
}

struct timing {
  double median_us = 0, min_us = 0, max_us = 0;
};

// fn(run_index) enqueues one run on `stream`.
timing time_runs(cudaStream_t stream, int warmup, int runs, const std::function<bool(int)>& fn) {
  for (int i = 0; i < warmup; ++i)
    if (!fn(i)) return {};
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> us;
  for (int i = 0; i < runs; ++i) {
    cudaEventRecord(a, stream);
    if (!fn(warmup + i)) break;
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    us.push_back(1000.0 * ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (us.empty()) return {};
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.front(), us.back()};
}

struct result_row {
  std::string codec, dtype;
  std::size_t n = 0, k = 0, payload = 0;
  double read_bytes = 0;  // bytes the rate is computed over
  timing t;
};

// Payload bytes over input bytes (the copy row: 1).
double ratio(const result_row& r) {
  const double in = r.codec == "copy" ? static_cast<double>(r.payload) : r.read_bytes;
  return in > 0 ? static_cast<double>(r.payload) / in : 0.0;
}

void print_json(const result_row& r) {
  std::printf(
      "{\"bench\":\"compress_cuda\",\"codec\":\"%s\",\"dtype\":\"%s\",\"n\":%zu,\"k\":%zu,\"payload_bytes\":%zu,"
      "\"ratio\":%.6f,\"median_us\":%.3f,\"min_us\":%.3f,\"max_us\":%.3f,\"gbps\":%.2f}\n",
      r.codec.c_str(), r.dtype.c_str(), r.n, r.k, r.payload, ratio(r), r.t.median_us, r.t.min_us, r.t.max_us,
      r.t.median_us > 0 ? r.read_bytes / (r.t.median_us * 1e3) : 0.0);
}

template <class T>
bool run_size(std::size_t n, int warmup, int runs, cudaStream_t stream, std::vector<result_row>& rows) {
  const std::size_t bytes = n * sizeof(T);
  // Rotate over enough inputs that they do not stay in L2 (50 MB on H100/H200).
  const std::size_t rotate = std::max<std::size_t>(2, std::min<std::size_t>(8, (std::size_t{256} << 20) / bytes));
  std::vector<T*> in(rotate, nullptr);
  std::vector<float> host(n);
  std::mt19937 rng(static_cast<unsigned>(n));
  std::normal_distribution<float> nd;
  for (auto& v : host) v = nd(rng);
  std::vector<T> typed(n);
  for (std::size_t i = 0; i < n; ++i) typed[i] = ashl::from_float<T>(host[i]);
  for (auto& p : in) {
    if (!ok(cudaMalloc(&p, bytes), "cudaMalloc input")) return false;
    if (!ok(cudaMemcpy(p, typed.data(), bytes, cudaMemcpyHostToDevice), "upload")) return false;
  }
  std::byte* out = nullptr;
  const std::size_t out_bytes = std::max(bytes, cc::topk{0.01}.max_encoded_bytes(n, ashl::dtype_of<T>));
  if (!ok(cudaMalloc(&out, out_bytes), "cudaMalloc output")) return false;
  const char* dt = ashl::to_string(ashl::dtype_of<T>).data();
  auto view = [&](int i) { return ashl::device_view<const T>(in[static_cast<std::size_t>(i) % rotate], n); };
  const ashl::device_view<std::byte> ov(out, out_bytes);

  {
    result_row r{"copy", dt, n, n, bytes, 2.0 * static_cast<double>(bytes), {}};
    r.t = time_runs(stream, warmup, runs, [&](int i) {
      return ok(cudaMemcpyAsync(out, in[static_cast<std::size_t>(i) % rotate], bytes, cudaMemcpyDeviceToDevice, stream),
                "copy");
    });
    rows.push_back(r);
  }
  // Every codec through the one call shape; `codec` by value, so the
  // decorators keep their state across the runs of a case.
  const ashl::compress::codec_context ctx{.seed = 42, .step = 7, .tensor = 1};
  std::uint64_t* d_used = nullptr;
  if (!ok(cudaMalloc(&d_used, sizeof(std::uint64_t)), "cudaMalloc d_used")) return false;
  auto codec_case = [&](const char* name, auto codec, std::size_t k) {
    cc::cuda::device_output o{.bytes = ov, .d_used = d_used};
    cc::cuda::device_scratch scratch{};
    if (!cc::cuda::encode(codec, view(0), o, ctx, scratch, nullptr, stream).ok()) return false;
    if (!ok(cudaMalloc(&scratch.data, scratch.bytes == 0 ? 1 : scratch.bytes), "cudaMalloc scratch")) return false;
    result_row r{name, dt, n, k, o.used, static_cast<double>(bytes), {}};
    r.t = time_runs(stream, warmup, runs, [&](int i) {
      const ashl::status s = cc::cuda::encode(codec, view(i), o, ctx, scratch, nullptr, stream);
      if (!s.ok()) std::fprintf(stderr, "%s: %s\n", name, s.message().c_str());
      return s.ok();
    });
    std::uint64_t used = 0;
    if (!ok(cudaMemcpy(&used, d_used, sizeof used, cudaMemcpyDeviceToHost), "d_used")) return false;
    r.payload = static_cast<std::size_t>(used);
    rows.push_back(r);
    cudaFree(scratch.data);
    return true;
  };
  bool good = true;
  if constexpr (std::is_same_v<T, float>) good &= codec_case("bf16_cast", cc::bf16{}, n);
  good &= codec_case("fp16_cast", cc::fp16{}, n);
  good &= codec_case("topk_1%", cc::topk{0.01}, cc::topk{0.01}.k_for(n));
  good &= codec_case("topk_0.1%", cc::topk{0.001}, cc::topk{0.001}.k_for(n));
  good &= codec_case("randomk_1%", cc::randomk{{0.01, 0, false}}, cc::randomk{{0.01, 0, false}}.k_for(n));
  good &= codec_case("qsgd_127", cc::qsgd{}, n);
  good &= codec_case("terngrad", cc::terngrad{}, n);
  good &= codec_case("sign", cc::sign{}, n);
  good &= codec_case("natural", cc::natural{}, n);
  good &= codec_case("threshold", cc::threshold{{.theta = 2.0f, .max_ratio = 0.1}}, 0);
  good &= codec_case("topk_s_1%", cc::topk_sampled{0.01}, cc::topk_sampled{0.01}.k_for(n));
  good &= codec_case("ef_topk_1%", cc::cuda::error_feedback<cc::topk>{cc::topk{0.01}}, cc::topk{0.01}.k_for(n));
  good &= codec_case("dgc_topk_1%", cc::cuda::dgc<cc::topk>{cc::topk{0.01}}, cc::topk{0.01}.k_for(n));
  cudaFree(d_used);
  for (auto* p : in) cudaFree(p);
  cudaFree(out);
  return good;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int runs = 25;
  std::string torch_script = "bench/gpu/torch_topk.py";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) runs = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--torch-script") && i + 1 < argc) torch_script = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--runs N] [--torch-script PATH]\n", argv[0]);
      return 2;
    }
  }
  // Skip only without a device (or without any driver); any other error fails.
  int devices = 0;
  const cudaError_t de = cudaGetDeviceCount(&devices);
  int driver = 0;
  cudaDriverGetVersion(&driver);
  if ((de == cudaSuccess && devices == 0) || de == cudaErrorNoDevice || (de != cudaSuccess && driver == 0)) {
    std::puts("SKIPPED: no CUDA device");
    return 77;
  }
  if (!ok(de, "cudaGetDeviceCount")) return 1;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("# device: %s (sm_%d%d, %d SMs, L2 %d MiB)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.l2CacheSize >> 20);
  std::vector<std::size_t> sizes;
  for (int e = 20; e <= (quick ? 22 : 28); ++e) sizes.push_back(std::size_t{1} << e);
  sizes.push_back(25557032);
  std::sort(sizes.begin(), sizes.end());
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::vector<result_row> rows;
  const int warmup = 3;
  for (std::size_t n : sizes) {
    if (!run_size<float>(n, warmup, runs, stream, rows)) return 1;
    if (!run_size<ashl::bfloat16>(n, warmup, runs, stream, rows)) return 1;
  }
  std::printf("%-12s %-5s %11s %10s %12s %9s %11s %11s %9s %8s\n", "codec", "dtype", "n", "k", "payload_B", "ratio",
              "median_us", "min_us", "GB/s", "vs_copy");
  for (const auto& r : rows) {
    // vs_copy: the copy of the same input (same n and dtype) over this codec's median time.
    double copy_us = 0;
    for (const auto& c : rows)
      if (c.codec == "copy" && c.n == r.n && c.dtype == r.dtype) copy_us = c.t.median_us;
    std::printf("%-12s %-5s %11zu %10zu %12zu %9.5f %11.1f %11.1f %9.1f %8.3f\n", r.codec.c_str(), r.dtype.c_str(),
                r.n, r.k, r.payload, ratio(r), r.t.median_us, r.t.min_us,
                r.t.median_us > 0 ? r.read_bytes / (r.t.median_us * 1e3) : 0.0,
                r.t.median_us > 0 ? copy_us / r.t.median_us : 0.0);
  }
  for (const auto& r : rows) print_json(r);
  std::fflush(stdout);

  // torch.topk on the same sizes, for reference; the script says so itself if torch is missing.
  std::string cmd = "python3 " + torch_script + " --runs " + std::to_string(runs) + " --sizes";
  for (std::size_t n : sizes) cmd += " " + std::to_string(n);
  const int rc = std::system(cmd.c_str());
  if (rc != 0) std::printf("# torch.topk comparison did not run (exit status %d)\n", rc);
  cudaStreamDestroy(stream);
  return 0;
}
