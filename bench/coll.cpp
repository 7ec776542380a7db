// bench/coll.cpp — allreduce paths of coll/ over MPI, nccl-tests style
// (docs/perf/coll.md): algorithm and bus bandwidth of dense and
// compressed allreduce, 1 MiB to 256 MiB, over MPI on TCP and on shared
// memory, beside a bare MPI_Allreduce of the same bytes in the same run.
//
//   ashl_bench_coll                          # 2 ranks; tcp then shm; 1..256 MiB
//   ashl_bench_coll --ranks 4 --fabrics tcp --sizes 100 --iters 7
//   ashl_bench_coll --fabrics ucx          # MPI's pml ucx over TCP loopback
//
// Started by hand, it re-runs itself under mpiexec once per fabric
// (--oversubscribe, loopback only; as root it adds OMPI_ALLOW_RUN_AS_ROOT*
// to the child's environment; each mpiexec bounded by `timeout`). Inside
// the job, rank 0 prints a table and one JSON object per case. Cases, each
// in place on an f32 buffer of the size (restored from the input before
// every iteration, outside the timed region):
//   mpi_allreduce   MPI_Allreduce(MPI_IN_PLACE, f32, MPI_SUM): the baseline
//   dense_f32       coll::mpi through dense_exchange{f32} (allreduce_now: MPI_Allreduce)
//   dense_f32_nb    the non-blocking request: c.allreduce (MPI_Iallreduce) + c.wait
//   dense_bf16      dense_exchange{bf16}: cast, 16-bit allreduce (user op), cast back
//   topk1_ef        payload_exchange<error_feedback<topk(1 %)>>: encode, all-gather
//                   sizes and payloads, decode-add every rank's payload
// Time of one iteration: the slowest rank's, after a barrier; the cases
// interleaved (each iteration runs every case once); the median over
// iterations. algbw = bytes / time; busbw = algbw · 2(M−1)/M (the
// allreduce factor of nccl-tests, applied to every case so they compare).
// "ratio" is the baseline's median time over the case's: > 1 is faster.
// docs/perf/coll.md has the figures and the method.
#include <ashl/config.hpp>

#include "support.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if ASHL_HAS_MPI()
#include <ashl/coll/compressed.hpp>
#include <ashl/coll/mpi.hpp>
#include <ashl/compress/error_feedback.hpp>
#include <ashl/compress/topk.hpp>

#include <chrono>
#include <functional>
#include <sstream>
#include <unistd.h>

namespace {

struct options {
  int ranks = 2;
  std::vector<std::string> fabrics = {"tcp", "shm"};
  std::vector<double> sizes_mib = {1, 4, 16, 64, 100, 256};
  int iters = 0;  // 0: by size (20 up to 16 MiB, 7 above)
  int warmup = 2;
  double ratio = 0.01;
  std::string fabric;  // inside the job
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) out.push_back(part);
  return out;
}

bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--ranks") o.ranks = std::atoi(next().c_str());
    else if (a == "--fabrics") o.fabrics = split(next());
    else if (a == "--sizes") {
      o.sizes_mib.clear();
      for (auto& s : split(next())) o.sizes_mib.push_back(std::atof(s.c_str()));
    } else if (a == "--iters") o.iters = std::atoi(next().c_str());
    else if (a == "--warmup") o.warmup = std::atoi(next().c_str());
    else if (a == "--ratio") o.ratio = std::atof(next().c_str());
    else if (a == "--fabric") o.fabric = next();
    else {
      std::fprintf(stderr,
                   "usage: %s [--ranks N] [--fabrics tcp,shm] [--sizes MiB,...] [--iters N] [--warmup N] [--ratio R]\n",
                   argv[0]);
      return false;
    }
  }
  return o.ranks >= 2 && !o.sizes_mib.empty();
}

std::string self_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, std::size_t(n)) : std::string("ashl_bench_coll");
}

std::string join(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// Runs this executable under mpiexec once per fabric.
int launch(const options& o) {
  int worst = 0;
  for (const auto& f : o.fabrics) {
    std::string cmd;
    if (::geteuid() == 0) cmd += "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ";
    cmd += "timeout 1800 mpiexec --oversubscribe --bind-to none -n " + std::to_string(o.ranks) +
           " --mca oob_tcp_if_include lo ";
    if (f == "tcp") cmd += "--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo ";
    else if (f == "shm") cmd += "--mca pml ob1 --mca btl self,vader ";
    else if (f == "ucx")  // Open MPI selects pml ucx over TCP only with tls/devices "any"
      cmd += "--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any --mca osc ^ucx "
             "-x UCX_NET_DEVICES=lo -x UCX_TLS=tcp,self ";
    else {
      std::fprintf(stderr, "--fabrics: %s is not tcp, shm or ucx\n", f.c_str());
      return 2;
    }
    cmd += self_path() + " --fabric " + f + " --sizes " + join(o.sizes_mib) + " --iters " + std::to_string(o.iters) +
           " --warmup " + std::to_string(o.warmup) + " --ratio " + std::to_string(o.ratio);
    std::fprintf(stderr, "# %s\n", cmd.c_str());
    const int rc = std::system(cmd.c_str());
    if (rc != 0) worst = rc;
  }
  return worst == 0 ? 0 : 1;
}

using namespace ashl;

// One timed run of `op` after an untimed `reset` and a barrier: the
// slowest rank's seconds (NaN when the op failed).
double time_once(MPI_Comm comm, const std::function<void()>& reset, const std::function<bool()>& op) {
  reset();
  MPI_Barrier(comm);
  const auto t0 = std::chrono::steady_clock::now();
  const bool ok = op();
  double dt = ok ? std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() : std::nan("");
  MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, comm);
  return dt;
}

int run(const options& o) {
  coll::mpi_session session(nullptr, nullptr);
  auto made = coll::mpi::dup(MPI_COMM_WORLD);
  if (!made) {
    std::fprintf(stderr, "%s\n", made.error().to_string().c_str());
    return 1;
  }
  coll::mpi& c = *made;
  const int m = c.size(), me = c.rank();
  const double bus = 2.0 * (m - 1) / m;
  if (me == 0)
    std::printf("# coll over MPI %s, %d ranks, %s, load %s\n%10s %-14s %10s %9s %9s %7s %12s\n", o.fabric.c_str(), m,
                bench::machine().c_str(), bench::loadavg().c_str(), "MiB", "case", "median_ms", "algbw", "busbw",
                "ratio", "payload_B");
  for (double mib : o.sizes_mib) {
    const std::size_t n = static_cast<std::size_t>(mib * 1024 * 1024 / 4);
    const double bytes = 4.0 * double(n);
    const int iters = o.iters > 0 ? o.iters : (mib <= 16 ? 20 : 7);
    std::vector<float> src(n), x(n);
    std::uint64_t s = 0x9e3779b97f4a7c15ull * std::uint64_t(me + 1);
    for (auto& v : src) {  // a gradient-like spread of magnitudes
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      v = float(std::int32_t(s >> 32)) * 1e-9f;
    }
    auto reset = [&] { std::memcpy(x.data(), src.data(), n * 4); };
    const std::vector<double> ones(std::size_t(m), 1.0);

    struct row {
      std::string name;
      std::function<bool()> op;
      std::vector<double> times;
      double t = 0.0;
      std::size_t payload = 0;
    };
    coll::dense_exchange f32{dtype::f32}, bf16{dtype::bf16};
    using ef = compress::error_feedback<compress::topk>;
    coll::payload_exchange<ef> topk{ef(compress::topk(o.ratio))};
    std::uint64_t step = 0;
    std::vector<row> rows;
    rows.push_back({"mpi_allreduce", [&] {
                      return MPI_Allreduce(MPI_IN_PLACE, x.data(), int(n), MPI_FLOAT, MPI_SUM, c.native()) ==
                             MPI_SUCCESS;
                    }});
    rows.push_back({"dense_f32", [&] { return f32(c, host_view<float>(x.data(), n), ones).ok(); }});
    rows.push_back({"dense_f32_nb", [&] {
                      auto r = c.allreduce(coll::in_view<>(x.data(), n, dtype::f32),
                                           coll::out_view<>(x.data(), n, dtype::f32), coll::reduce_op::sum, {});
                      return r && c.wait(*r).ok();
                    }});
    rows.push_back({"dense_bf16", [&] { return bf16(c, host_view<float>(x.data(), n), ones).ok(); }});
    rows.push_back({"topk1_ef", [&] { return topk(c, host_view<float>(x.data(), n), ones, ++step).ok(); }});
    // Interleaved: iteration i runs every case once, so load that comes and
    // goes on a shared machine falls on all cases alike.
    for (int i = 0; i < o.warmup + iters; ++i)
      for (auto& r : rows) {
        const double t = time_once(c.native(), reset, r.op);
        if (i >= o.warmup) r.times.push_back(t);
      }
    for (auto& r : rows) r.t = bench::median(r.times);
    rows.back().payload = topk.last_payload_bytes();

    if (me != 0) continue;
    const double base = rows[0].t;
    for (const auto& r : rows) {
      const double alg = bytes / r.t / 1e9;
      std::printf("%10.0f %-14s %10.3f %9.3f %9.3f %7.2f %12zu\n", mib, r.name.c_str(), r.t * 1e3, alg, alg * bus,
                  base / r.t, r.payload);
      std::printf("{\"bench\":\"coll\",\"machine\":\"%s\",\"date\":\"%s\",\"load\":\"%s\",\"fabric\":\"%s\","
                  "\"ranks\":%d,\"case\":\"%s\",\"bytes\":%.0f,\"iters\":%d,\"median_s\":%.6g,\"algbw_GBps\":%.4g,"
                  "\"busbw_GBps\":%.4g,\"baseline\":\"mpi_allreduce\",\"baseline_median_s\":%.6g,"
                  "\"speedup_vs_baseline\":%.4g,\"payload_bytes\":%zu}\n",
                  bench::machine().c_str(), bench::today().c_str(), bench::loadavg().c_str(), o.fabric.c_str(), m,
                  r.name.c_str(), bytes, iters, r.t, alg, alg * bus, base, base / r.t, r.payload);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (!parse(argc, argv, o)) return 2;
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) return launch(o);
  return run(o);
}

#else

int main() {
  std::printf("ashl_bench_coll: built without the mpi component (ASHL_WITH_MPI); nothing to measure\n");
  return 0;
}

#endif
