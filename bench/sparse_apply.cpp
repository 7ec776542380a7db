// ashl_bench_sparse_apply — the server's apply of a sparse (top-k style)
// commit: compress::decode_add of a sparse-pairs payload into a shard,
// against a bare `w[idx[i]] += s * v[i]` loop over the same pairs in the same
// run (goal >= 0.9x the bare loop) and against std::memcpy
// of the payload bytes (docs/perf/ps-ucx.md).
//
//   ashl_bench_sparse_apply                      # n = 2^24 and 25,557,032; k = 1 % and 0.1 %
//   ashl_bench_sparse_apply --quick --reps 5
//
// The pairs are random: k distinct indices drawn uniformly over the shard
// (sorted, as the payload requires) with normal values, so the scatter
// touches k random cache lines of a shard far larger than the last-level
// cache; that random access, not the bytes of the payload, is what bounds
// an apply (the honest limit is the bare loop). The bare loop reads the
// indices and values from two plain arrays (no validation); decode_add
// validates every index first (nothing is written unless all are valid),
// then adds. Every figure is the median of --reps runs after one warm-up,
// the three cases interleaved (ashl, bare, memcpy, ashl, ...) so load drift
// reaches them alike. Prints a table, then one JSON object per case. Never
// an assertion on time.
#include "support.hpp"

#include <ashl/compress/registry.hpp>
#include <ashl/compress/topk.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using bench::time_interleaved;

// A sparse-pairs payload (compress/detail/sparse.hpp layout: u64 n, u32
// count, count u32 indices, count f32 values) of k random distinct sorted
// indices, and the same pairs as two arrays.
struct pairs {
  std::vector<std::byte> payload;
  std::vector<std::uint32_t> idx;
  std::vector<float> val;
};

pairs make_pairs(std::size_t n, std::size_t k, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> idx;
  idx.reserve(k + k / 8);
  std::uniform_int_distribution<std::uint32_t> pick(0, static_cast<std::uint32_t>(n - 1));
  while (idx.size() < k + k / 16) idx.push_back(pick(rng));
  std::sort(idx.begin(), idx.end());
  idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  while (idx.size() > k) idx.erase(idx.begin() + static_cast<std::ptrdiff_t>(rng() % idx.size()));
  std::normal_distribution<float> normal;
  pairs p;
  p.idx = idx;
  p.val.resize(idx.size());
  for (auto& v : p.val) v = normal(rng);
  const std::uint64_t n64 = n;
  const auto count = static_cast<std::uint32_t>(idx.size());
  p.payload.resize(12 + 8 * std::size_t{count});
  std::memcpy(p.payload.data(), &n64, 8);
  std::memcpy(p.payload.data() + 8, &count, 4);
  std::memcpy(p.payload.data() + 12, p.idx.data(), 4 * std::size_t{count});
  std::memcpy(p.payload.data() + 12 + 4 * std::size_t{count}, p.val.data(), 4 * std::size_t{count});
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 15;
  bool quick = false, json_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--json-only") json_only = true;
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: ashl_bench_sparse_apply [--quick] [--reps N] [--json-only]\n");
      return 2;
    }
  }
  std::vector<std::size_t> sizes{std::size_t{1} << 24};
  if (!quick) sizes.push_back(25557032);
  const std::string mach = bench::machine(), date = bench::today();
  struct result {
    std::size_t n, k;
    double ashl_s, bare_s, copy_s;
  };
  std::vector<result> rows;
  for (std::size_t n : sizes) {
    std::vector<float> w(n, 0.0f);
    for (double ratio : {0.01, 0.001}) {
      const std::size_t k = std::max<std::size_t>(1, static_cast<std::size_t>(ratio * double(n)));
      const pairs p = make_pairs(n, k, 17 + n + k);
      std::vector<std::byte> sink(p.payload.size());
      const float s = 1e-3f;
      const ashl::compress::payload_info info{n, ashl::dtype::f32};
      bool ok = true;
      const auto t = time_interleaved(
          reps,
          [&] {
            ok = ok && ashl::compress::decode_add(ashl::codec_id::topk, p.payload, info,
                                                  ashl::host_view<float>(w.data(), n), s, {})
                           .ok();
          },
          [&] {
            float* a = w.data();
            const std::uint32_t* ix = p.idx.data();
            const float* v = p.val.data();
            for (std::size_t j = 0; j < p.idx.size(); ++j) a[ix[j]] += s * v[j];
            asm volatile("" : : "r"(a) : "memory");
          },
          [&] {
            std::memcpy(sink.data(), p.payload.data(), p.payload.size());
            asm volatile("" : : "r"(sink.data()) : "memory");
          });
      if (!ok) {
        std::fprintf(stderr, "ashl_bench_sparse_apply: decode_add refused the payload (n %zu, k %zu)\n", n, k);
        return 1;
      }
      rows.push_back({n, p.idx.size(), t[0], t[1], t[2]});
    }
  }
  if (!json_only) {
    std::printf("# %s, %s, load %s, %d reps (medians)\n", mach.c_str(), date.c_str(), bench::loadavg().c_str(), reps);
    std::printf("%10s %9s %12s %12s %12s %10s %10s %12s\n", "n", "k", "ashl_us", "bare_us", "memcpy_us", "vs_bare",
                "vs_memcpy", "Mpairs/s");
    for (const auto& r : rows)
      std::printf("%10zu %9zu %12.1f %12.1f %12.1f %10.3f %10.3f %12.1f\n", r.n, r.k, r.ashl_s * 1e6, r.bare_s * 1e6,
                  r.copy_s * 1e6, r.bare_s / r.ashl_s, r.copy_s / r.ashl_s, double(r.k) / r.ashl_s * 1e-6);
  }
  for (const auto& r : rows)
    std::printf(
        "{\"bench\":\"sparse_apply\",\"machine\":\"%s\",\"date\":\"%s\",\"n\":%zu,\"k\":%zu,\"payload_bytes\":%zu,"
        "\"ashl_s\":%.9f,\"bare_loop_s\":%.9f,\"memcpy_s\":%.9f,\"ratio_vs_bare\":%.4f,\"ratio_vs_memcpy\":%.4f}\n",
        mach.c_str(), date.c_str(), r.n, r.k, 12 + 8 * r.k, r.ashl_s, r.bare_s, r.copy_s, r.bare_s / r.ashl_s,
        r.copy_s / r.ashl_s);
  return 0;
}
