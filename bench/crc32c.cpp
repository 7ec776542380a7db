// ashl_bench_crc32c — CRC-32C throughput against memcpy of the same bytes
// (docs/perf/crc32c.md).
//
//   ashl_bench_crc32c                  # 4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB
//   ashl_bench_crc32c --reps 21 --json-only
//   ashl_bench_crc32c --quick          # fewer reps, up to 16 MiB
//
// Cases per size, one thread, timed interleaved run by run (crc32c, software,
// memcpy, crc32c, ...) so load drift on a shared machine reaches all alike;
// every figure is the median of --reps timed runs after one warm-up:
//   crc32c           wire::crc32c as the library calls it (the hardware path
//                    when the CPU has SSE 4.2; "impl" says which ran).
//   crc32c_software  wire::crc32c_software, slicing-by-8, for reference.
//   memcpy           std::memcpy of the same bytes into a second buffer: the
//                    baseline; ratio = case GB/s / memcpy GB/s.
// GB/s = bytes checksummed (or copied) / s, 10^9. Small sizes repeat the
// operation on the same buffer within a timed run, so they are cache-resident
// figures; 16 and 64 MiB exceed the last-level cache of the machines we use
// and measure memory.
// Also timed: crc32c_combine(a, b, 64 MiB - 1) and crc32c_combiner(64 MiB - 1)(a, b),
// nanoseconds per call (the cost of checksumming one more header in front of
// an already checksummed snapshot).
//
// Output: a human table, then one JSON object per case:
//   {"bench":"crc32c","op":...,"impl":...,"bytes":...,"gbps":...,
//    "baseline":"memcpy","baseline_gbps":...,"ratio":...,"reps":...,"machine":...,"date":...}
#include "support.hpp"

#include <ashl/wire/crc32c.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

using bench::machine;
using bench::median;
using bench::today;

namespace w = ashl::wire;
using clock_type = std::chrono::steady_clock;

struct options {
  int reps = 11;
  bool quick = false;
  bool json_only = false;
};

using bench::time_interleaved;

struct row {
  std::string op, impl;
  std::size_t bytes = 0;
  double gbps = 0, baseline_gbps = 0;
};

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    if (!bench::common_option(o, argc, argv, i)) {
      std::fprintf(stderr, "usage: ashl_bench_crc32c [--quick] [--reps N] [--json-only]\n");
      return 2;
    }
  }
  std::vector<std::size_t> sizes = {std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{1} << 20,
                                    std::size_t{16} << 20, std::size_t{64} << 20};
  if (o.quick) sizes.pop_back();
  const std::size_t largest = sizes.back();
  std::vector<std::byte> src(largest), dst(largest);
  std::mt19937_64 rng(1);
  for (std::size_t i = 0; i < largest; i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(src.data() + i, &v, std::min<std::size_t>(8, largest - i));
  }
  std::fill(dst.begin(), dst.end(), std::byte{1});  // fault the pages in before timing

  const std::string mach = machine(), date = today(), impl = w::crc32c_implementation();
  std::vector<row> rows;
  volatile std::uint32_t sink = 0;
  for (const std::size_t n : sizes) {
    const std::span<const std::byte> data(src.data(), n);
    // Enough work per timed run (>= 32 MiB) to be far above the clock's resolution.
    const int runs = static_cast<int>(std::max<std::size_t>(1, (std::size_t{32} << 20) / n));
    const auto t = time_interleaved(
        o.reps,
        [&] {
          std::uint32_t c = 0;
          for (int k = 0; k < runs; ++k) c ^= w::crc32c(data, k);
          sink = sink + c;
        },
        [&] {
          std::uint32_t c = 0;
          for (int k = 0; k < runs; ++k) c ^= w::crc32c_software(data, k);
          sink = sink + c;
        },
        [&] {
          for (int k = 0; k < runs; ++k) {
            std::memcpy(dst.data(), src.data(), n);
            asm volatile("" : : "r"(dst.data()) : "memory");
          }
        });
    const double per = static_cast<double>(n) * runs * 1e-9;
    const double base = per / t[2];
    rows.push_back({"crc32c", impl, n, per / t[0], base});
    rows.push_back({"crc32c_software", "software", n, per / t[1], base});
    rows.push_back({"memcpy", "libc", n, base, base});
  }

  // Combination of CRCs (no bytes touched): ns per call.
  // 64 MiB - 1: 26 one bits, the most products crc32c_combine needs below 64 MiB.
  const std::uint64_t len_b = (std::uint64_t{64} << 20) - 1;
  const w::crc32c_combiner combiner(len_b);
  constexpr int calls = 100'000;
  const auto tc = time_interleaved(
      o.reps,
      [&] {
        std::uint32_t c = 0;
        for (int k = 0; k < calls; ++k) c ^= w::crc32c_combine(c + static_cast<std::uint32_t>(k), 0x1234567u, len_b);
        sink = sink + c;
      },
      [&] {
        std::uint32_t c = 0;
        for (int k = 0; k < calls; ++k) c ^= combiner(c + static_cast<std::uint32_t>(k), 0x1234567u);
        sink = sink + c;
      });
  const double combine_ns = tc[0] / calls * 1e9, combiner_ns = tc[1] / calls * 1e9;

  if (!o.json_only) {
    std::printf("crc32c on %s, %s, implementation %s, median of %d\n\n", mach.c_str(), date.c_str(), impl.c_str(),
                o.reps);
    std::printf("%10s %18s %18s %14s %22s\n", "bytes", "crc32c GB/s", "software GB/s", "memcpy GB/s",
                "crc32c / memcpy");
    for (std::size_t i = 0; i + 2 < rows.size(); i += 3)
      std::printf("%10zu %18.2f %18.2f %14.2f %22.2f\n", rows[i].bytes, rows[i].gbps, rows[i + 1].gbps,
                  rows[i + 2].gbps, rows[i].gbps / rows[i].baseline_gbps);
    std::printf("\ncrc32c_combine(a, b, %llu): %.1f ns per call; crc32c_combiner: %.1f ns per call\n\n",
                static_cast<unsigned long long>(len_b), combine_ns, combiner_ns);
  }
  for (const auto& r : rows)
    std::printf(
        "{\"bench\":\"crc32c\",\"op\":\"%s\",\"impl\":\"%s\",\"bytes\":%zu,\"gbps\":%.4f,\"baseline\":\"memcpy\","
        "\"baseline_gbps\":%.4f,\"ratio\":%.4f,\"reps\":%d,\"machine\":\"%s\",\"date\":\"%s\"}\n",
        r.op.c_str(), r.impl.c_str(), r.bytes, r.gbps, r.baseline_gbps, r.gbps / r.baseline_gbps, o.reps,
        mach.c_str(), date.c_str());
  std::printf(
      "{\"bench\":\"crc32c\",\"op\":\"crc32c_combine\",\"len_b\":%llu,\"ns_per_call\":%.2f,\"reps\":%d,"
      "\"machine\":\"%s\",\"date\":\"%s\"}\n",
      static_cast<unsigned long long>(len_b), combine_ns, o.reps, mach.c_str(), date.c_str());
  std::printf(
      "{\"bench\":\"crc32c\",\"op\":\"crc32c_combiner\",\"len_b\":%llu,\"ns_per_call\":%.2f,\"reps\":%d,"
      "\"machine\":\"%s\",\"date\":\"%s\"}\n",
      static_cast<unsigned long long>(len_b), combiner_ns, o.reps, mach.c_str(), date.c_str());
  return 0;
}
