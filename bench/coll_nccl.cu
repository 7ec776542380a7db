// ashl_bench_coll_nccl — dense allreduce through coll::nccl against a bare
// ncclAllReduce of the same bytes on the same communicator and stream
// (goal: ashl >= 0.95x bare), nccl-tests style.
//
//   ashl_bench_coll_nccl [--iters N] [--warmup N] [--rounds N] [--min-mib A] [--max-mib B]
//
// One process, one GPU, one rank (NCCL refuses two ranks on one device), f32
// sum out of place, sizes 1 MiB .. 256 MiB by powers of two. Method: both
// paths enqueue `iters` back-to-back allreduces between two CUDA events on
// one stream (ashl: each call returns a request, dropped at once, as a
// training step that never waits on the host would); warm-up first; the two
// paths alternate for `rounds` rounds and the median time per call of each
// is kept. Algorithm bandwidth = bytes / time; bus bandwidth = algbw x
// 2(n-1)/n (nccl-tests' allreduce factor: 0 for one rank, printed anyway).
// Prints a table, then one JSON object per size. Never an assertion on time.
#include <ashl/coll/nccl.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

bool ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::fprintf(stderr, "ashl_bench_coll_nccl: %s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

struct options {
  int iters = 20, warmup = 5, rounds = 7;
  std::size_t min_mib = 1, max_mib = 256;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
#if !ASHL_HAS_NCCL()
  (void)argc;
  (void)argv;
  std::printf("ashl_bench_coll_nccl: built without NCCL (component nccl off)\n");
  return 77;
#else
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> long { return i + 1 < argc ? std::atol(argv[++i]) : 0; };
    if (a == "--iters") o.iters = static_cast<int>(next());
    else if (a == "--warmup") o.warmup = static_cast<int>(next());
    else if (a == "--rounds") o.rounds = static_cast<int>(next());
    else if (a == "--min-mib") o.min_mib = static_cast<std::size_t>(next());
    else if (a == "--max-mib") o.max_mib = static_cast<std::size_t>(next());
    else {
      std::fprintf(stderr, "usage: %s [--iters N] [--warmup N] [--rounds N] [--min-mib A] [--max-mib B]\n", argv[0]);
      return 2;
    }
  }
  if (o.iters < 1 || o.rounds < 1 || o.min_mib < 1 || o.max_mib < o.min_mib) {
    std::fprintf(stderr, "ashl_bench_coll_nccl: iters, rounds >= 1 and 1 <= min-mib <= max-mib\n");
    return 2;
  }
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::printf("ashl_bench_coll_nccl: no CUDA device (%s)\n", cudaGetErrorString(e));
    return 77;
  }
  cudaDeviceProp prop{};
  if (!ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties")) return 1;
  auto c = ashl::coll::nccl::create_single(0);
  if (!c) {
    std::fprintf(stderr, "ashl_bench_coll_nccl: %s\n", c.error().message().c_str());
    return 1;
  }
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char date[32] = {};
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));

  cudaStream_t s = nullptr;
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  if (!ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate") ||
      !ok(cudaEventCreate(&t0), "cudaEventCreate") || !ok(cudaEventCreate(&t1), "cudaEventCreate"))
    return 1;
  const std::size_t max_bytes = o.max_mib << 20;
  void *in = nullptr, *out = nullptr;
  if (!ok(cudaMalloc(&in, max_bytes), "cudaMalloc") || !ok(cudaMalloc(&out, max_bytes), "cudaMalloc")) return 1;
  if (!ok(cudaMemset(in, 0, max_bytes), "cudaMemset")) return 1;
  const int ranks = c->size();
  const double bus_factor = 2.0 * (ranks - 1) / ranks;

  std::printf("# %s, %s, NCCL %d, %d rank(s), f32 sum out of place, %d iters x %d rounds\n", host, prop.name,
              nccl_version, ranks, o.iters, o.rounds);
  std::printf("%12s %12s %12s %12s %10s %10s %8s\n", "bytes", "bare_us", "ashl_us", "ratio", "algbw", "busbw", "");
  std::vector<std::string> json;
  int rc = 0;
  for (std::size_t mib = o.min_mib; mib <= o.max_mib; mib *= 2) {
    const std::size_t bytes = mib << 20, count = bytes / sizeof(float);
    const ashl::coll::in_view<ashl::device_space> vin(in, count, ashl::dtype::f32);
    const ashl::coll::out_view<ashl::device_space> vout(out, count, ashl::dtype::f32);
    auto bare = [&] {
      for (int i = 0; i < o.iters; ++i)
        if (ncclAllReduce(in, out, count, ncclFloat32, ncclSum, c->native_handle(), s) != ncclSuccess) return false;
      return true;
    };
    auto through_ashl = [&] {
      for (int i = 0; i < o.iters; ++i)
        if (!c->allreduce(vin, vout, ashl::coll::reduce_op::sum, s)) return false;
      return true;
    };
    auto timed = [&](auto& body, double& us) {
      if (!ok(cudaEventRecord(t0, s), "cudaEventRecord")) return false;
      if (!body()) return false;
      if (!ok(cudaEventRecord(t1, s), "cudaEventRecord") || !ok(cudaEventSynchronize(t1), "cudaEventSynchronize"))
        return false;
      float ms = 0;
      if (!ok(cudaEventElapsedTime(&ms, t0, t1), "cudaEventElapsedTime")) return false;
      us = 1000.0 * ms / o.iters;
      return true;
    };
    for (int w = 0; w < o.warmup; ++w)
      if (!bare() || !through_ashl()) rc = 1;
    if (!ok(cudaStreamSynchronize(s), "cudaStreamSynchronize")) rc = 1;
    std::vector<double> b_us, a_us;
    for (int r = 0; r < o.rounds && rc == 0; ++r) {
      double x = 0, y = 0;
      if (!timed(bare, x) || !timed(through_ashl, y)) rc = 1;
      b_us.push_back(x);
      a_us.push_back(y);
    }
    if (rc != 0) {
      std::fprintf(stderr, "ashl_bench_coll_nccl: %zu bytes failed\n", bytes);
      break;
    }
    const double bu = median(b_us), au = median(a_us);
    const double ratio = au > 0 ? bu / au : 0.0;  // > 1: ashl faster
    const double algbw = au > 0 ? bytes / (au * 1e3) : 0.0;  // GB/s
    const double busbw = algbw * bus_factor;
    const double bare_algbw = bu > 0 ? bytes / (bu * 1e3) : 0.0;
    std::printf("%12zu %12.1f %12.1f %12.3f %10.1f %10.1f %8s\n", bytes, bu, au, ratio, algbw, busbw,
                ratio >= 0.95 ? "" : "< 0.95");
    char line[768];
    std::snprintf(line, sizeof line,
                  "{\"bench\":\"coll_nccl\",\"machine\":\"%s\",\"gpu\":\"%s\",\"nccl\":%d,\"date\":\"%s\",\"op\":"
                  "\"allreduce\",\"dtype\":\"f32\",\"ranks\":%d,\"bytes\":%zu,\"iters\":%d,\"rounds\":%d,"
                  "\"bare_us\":%.2f,\"ashl_us\":%.2f,\"ratio\":%.4f,\"algbw_gbps\":%.2f,\"busbw_gbps\":%.2f,"
                  "\"bare_algbw_gbps\":%.2f,\"bare_busbw_gbps\":%.2f}",
                  host, prop.name, nccl_version, date, ranks, bytes, o.iters, o.rounds, bu, au, ratio, algbw, busbw,
                  bare_algbw, bare_algbw * bus_factor);
    json.emplace_back(line);
  }
  for (const auto& j : json) std::printf("%s\n", j.c_str());
  cudaFree(in);
  cudaFree(out);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaStreamDestroy(s);
  return rc;
#endif
}
