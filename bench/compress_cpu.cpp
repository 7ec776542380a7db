// ashl_bench_compress_cpu — throughput of the CPU codecs against memcpy and
// std::nth_element measured in the same run (docs/perf/compress-cpu.md).
//
//   ashl_bench_compress_cpu              # n = 2^20, 2^24, 25,557,032
//   ashl_bench_compress_cpu --quick      # n = 2^24 only, under a minute
//   ashl_bench_compress_cpu --codecs topk,topk_sampled --reps 9 --json-only
//
// For every (codec, n, k, dtype, threads): encode and decode-add throughput in
// GB/s of *input* bytes (n x sizeof(dtype)), the compression ratio (input
// bytes / payload bytes), and the ratio of encode throughput to its baseline:
// memcpy of the input buffer for the dense codecs (casts, quantizers, sign,
// natural), and exact top-k by std::nth_element for the sparsifiers. The
// nth_element baseline copies |x| into a float scratch vector and runs
// std::nth_element for the k-th largest magnitude (copy included: a codec
// cannot modify its input either). Baselines are single-threaded; with T
// threads a codec encodes T independent chunks of n/T elements (chunked
// parallelism, as a per-tensor codec is used on a bucket of tensors), and its
// ratio is still against the single-threaded baseline. Every figure is the
// median of --reps timed runs after one warm-up, rotating over two input
// buffers so the cache does not flatter small sizes.
#include <ashl/compress/cast.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/threshold.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/compress/topk_sampled.hpp>
#include <ashl/core/philox.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

namespace cx = ashl::compress;
using clock_type = std::chrono::steady_clock;

struct options {
  bool quick = false;
  bool json_only = false;
  int reps = 7;
  std::vector<std::string> codecs;  // empty: all
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double time_median(int reps, F&& f) {  // seconds; f(rep) runs one repetition
  f(0);                                // warm-up
  std::vector<double> t;
  for (int r = 1; r <= reps; ++r) {
    const auto a = clock_type::now();
    f(r);
    t.push_back(std::chrono::duration<double>(clock_type::now() - a).count());
  }
  return median(t);
}

// Gradient-like input: normal values with a heavier tail on 1 % of them.
std::vector<float> make_input(std::size_t n, std::uint64_t seed) {
  std::vector<float> x(n);
  const ashl::philox_stream s(seed, 0, 0);
  for (std::size_t i = 0; i < n; i += 4) {
    const auto b = s.block(i / 4);
    for (int j = 0; j < 4 && i + j < n; j += 2) {
      const float u1 = (static_cast<float>(b[j] >> 8) + 0.5f) * (1.0f / 16777216.0f);
      const float u2 = static_cast<float>(b[j + 1] >> 8) * (1.0f / 16777216.0f);
      const float r = std::sqrt(-2.0f * std::log(u1));
      x[i + j] = r * std::cos(6.2831853f * u2) * ((b[j] & 127u) == 0 ? 8.0f : 1.0f);
      if (i + j + 1 < n) x[i + j + 1] = r * std::sin(6.2831853f * u2);
    }
  }
  return x;
}

struct inputs {
  std::vector<float> f32[2];
  std::vector<ashl::bfloat16> bf16[2];
};

struct baselines {
  double memcpy_gbps = 0;
  double nth_gbps_1 = 0, nth_gbps_01 = 0;  // k = 1 %, 0.1 %
};

struct row {
  std::string codec;
  std::size_t n, k;
  double k_ratio;
  std::string dtype;
  unsigned threads;
  double gbps, decode_gbps, base_memcpy, base_nth, ratio, compression;
  bool sparse;
};

std::string machine_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}
std::string today() {
  const std::time_t t = std::time(nullptr);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%d", std::gmtime(&t));
  return b;
}

template <class T>
baselines measure_baselines(const std::vector<T> (&in)[2], int reps) {
  const std::size_t n = in[0].size();
  const double bytes = static_cast<double>(n * sizeof(T));
  baselines b;
  std::vector<T> dst(n);
  b.memcpy_gbps = bytes / time_median(reps, [&](int r) {
                    std::memcpy(dst.data(), in[r & 1].data(), n * sizeof(T));
                  }) / 1e9;
  std::vector<float> mag(n);
  for (double kr : {0.01, 0.001}) {
    const std::size_t k = std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(kr * n)));
    const double t = time_median(std::max(3, reps / 2), [&](int r) {
      const auto& x = in[r & 1];
      for (std::size_t i = 0; i < n; ++i) mag[i] = std::fabs(ashl::to_float(x[i]));
      std::nth_element(mag.begin(), mag.begin() + static_cast<std::ptrdiff_t>(k - 1), mag.end(), std::greater<>());
    });
    (kr == 0.01 ? b.nth_gbps_1 : b.nth_gbps_01) = bytes / t / 1e9;
  }
  return b;
}

// Encodes and decodes one codec configuration with `threads` chunks.
template <class Codec, class T>
row run_case(const std::string& name, const Codec& codec, bool sparse, double k_ratio, const std::vector<T> (&in)[2],
             unsigned threads, const baselines& base, int reps) {
  const std::size_t n = in[0].size();
  const ashl::dtype dt = ashl::dtype_of<T>;
  const std::size_t chunk = (n + threads - 1) / threads;
  struct part {
    std::size_t off, len;
    std::vector<std::byte> out, scratch;
    std::size_t used = 0;
  };
  std::vector<part> parts;
  for (unsigned t = 0; t < threads; ++t) {
    const std::size_t off = std::min(n, t * chunk), len = std::min(chunk, n - off);
    parts.push_back({off, len, std::vector<std::byte>(codec.max_encoded_bytes(len, dt)),
                     std::vector<std::byte>(codec.scratch_bytes(len, dt))});
  }
  std::vector<float> acc(n, 0.0f);
  bool failed = false;
  auto parallel = [&](auto&& body) {
    if (threads == 1) return body(parts[0], 0u);
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) pool.emplace_back([&, t] { body(parts[t], t); });
    for (auto& th : pool) th.join();
  };
  std::uint64_t step = 0;
  const double te = time_median(reps, [&](int r) {
    ++step;
    parallel([&](part& p, unsigned t) {
      cx::codec_context ctx{.seed = 42, .step = step, .tensor = t, .scratch = p.scratch};
      auto u = codec.encode(ashl::host_view<const T>(in[r & 1].data() + p.off, p.len), p.out, ctx);
      if (!u) failed = true;
      else p.used = *u;
    });
  });
  const double td = time_median(reps, [&](int) {
    parallel([&](part& p, unsigned t) {
      cx::codec_context ctx{.seed = 42, .step = step, .tensor = t};
      auto s = codec.decode_add({p.out.data(), p.used}, {p.len, dt}, ashl::host_view<float>(acc.data() + p.off, p.len),
                                1.0f, ctx);
      if (!s.ok()) failed = true;
    });
  });
  if (failed) std::fprintf(stderr, "warning: %s failed to encode or decode (n = %zu)\n", name.c_str(), n);
  std::size_t payload = 0;
  for (auto& p : parts) payload += p.used;
  const double bytes = static_cast<double>(n * sizeof(T));
  row rw{name, n, sparse ? std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(k_ratio * n))) : 0,
         sparse ? k_ratio : 0.0, std::string(ashl::to_string(dt)), threads, bytes / te / 1e9, bytes / td / 1e9,
         base.memcpy_gbps, k_ratio == 0.001 ? base.nth_gbps_01 : base.nth_gbps_1, 0, bytes / std::max<std::size_t>(payload, 1),
         sparse};
  rw.ratio = rw.gbps / (sparse ? rw.base_nth : rw.base_memcpy);
  return rw;
}

struct codec_entry {
  std::string name;
  bool sparse;
  std::function<void(double k_ratio, const inputs&, unsigned threads, const baselines& bf32, const baselines& bbf16,
                     int reps, std::vector<row>& out)>
      run;
};

template <class Make>
codec_entry entry(std::string name, bool sparse, Make make) {
  return {name, sparse,
          [name, sparse, make](double kr, const inputs& in, unsigned threads, const baselines& b32, const baselines& b16,
                               int reps, std::vector<row>& out) {
            const auto c = make(kr);
            out.push_back(run_case(name, c, sparse, kr, in.f32, threads, b32, reps));
            out.push_back(run_case(name, c, sparse, kr, in.bf16, threads, b16, reps));
          }};
}

std::vector<codec_entry> all_codecs() {
  return {
      entry("identity", false, [](double) { return cx::identity{}; }),
      entry("fp16", false, [](double) { return cx::fp16{}; }),
      entry("bf16", false, [](double) { return cx::bf16{}; }),
      entry("topk", true, [](double kr) { return cx::topk{kr}; }),
      entry("topk_sampled", true, [](double kr) { return cx::topk_sampled{kr}; }),
      entry("randomk", true, [](double kr) { return cx::randomk{cx::randomk_options{.ratio = kr}}; }),
      // A threshold at the 1 % / 0.1 % quantile of |N(0,1)| (2.576, 3.291) with a cap of 2k.
      entry("threshold", true,
            [](double kr) {
              return cx::threshold{cx::threshold_options{.theta = kr == 0.01 ? 2.576f : 3.291f, .max_ratio = 2 * kr}};
            }),
  };
}

void print_json(const row& r, const std::string& machine, const std::string& date) {
  std::printf(
      "{\"codec\":\"%s\",\"n\":%zu,\"k\":%zu,\"k_ratio\":%g,\"dtype\":\"%s\",\"threads\":%u,\"gbps\":%.4f,"
      "\"decode_gbps\":%.4f,\"baseline_memcpy_gbps\":%.4f,\"baseline_nth_element_gbps\":%.4f,\"ratio\":%.4f,"
      "\"ratio_baseline\":\"%s\",\"compression_ratio\":%.3f,\"machine\":\"%s\",\"nproc\":%u,\"date\":\"%s\"}\n",
      r.codec.c_str(), r.n, r.k, r.k_ratio, r.dtype.c_str(), r.threads, r.gbps, r.decode_gbps, r.base_memcpy, r.base_nth,
      r.ratio, r.sparse ? "nth_element" : "memcpy", r.compression, machine.c_str(), std::thread::hardware_concurrency(),
      date.c_str());
}

int usage(int rc) {
  std::puts(
      "usage: ashl_bench_compress_cpu [--quick] [--json-only] [--reps N] [--codecs a,b,...]\n"
      "  --quick      only n = 2^24 (under a minute)\n"
      "  --json-only  print only the JSON lines\n"
      "  --reps N     timed repetitions per figure, median reported (default 7)\n"
      "  --codecs     identity,fp16,bf16,topk,topk_sampled,randomk,threshold (default: all)");
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") opt.quick = true;
    else if (a == "--json-only") opt.json_only = true;
    else if (a == "--help" || a == "-h") return usage(0);
    else if (a == "--reps" && i + 1 < argc) {
      opt.reps = std::atoi(argv[++i]);
      if (opt.reps < 1) return std::fprintf(stderr, "--reps = %s: must be >= 1\n", argv[i]), 2;
    } else if (a == "--codecs" && i + 1 < argc) {
      std::string s = argv[++i];
      for (std::size_t p = 0; p <= s.size();) {
        const std::size_t q = std::min(s.find(',', p), s.size());
        if (q > p) opt.codecs.push_back(s.substr(p, q - p));
        p = q + 1;
      }
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return usage(2);
    }
  }
  auto codecs = all_codecs();
  for (const auto& c : opt.codecs)
    if (std::none_of(codecs.begin(), codecs.end(), [&](const codec_entry& e) { return e.name == c; }))
      return std::fprintf(stderr, "--codecs: unknown codec \"%s\"\n", c.c_str()), 2;
  if (opt.quick) opt.reps = std::min(opt.reps, 5);

  const std::string machine = machine_name(), date = today();
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  std::vector<unsigned> thread_counts{1};
  if (hw > 1) thread_counts.push_back(hw);
  std::vector<std::size_t> sizes = opt.quick ? std::vector<std::size_t>{std::size_t{1} << 24}
                                             : std::vector<std::size_t>{std::size_t{1} << 20, std::size_t{1} << 24,
                                                                        25557032};
  std::vector<row> rows;
  for (std::size_t n : sizes) {
    if (!opt.json_only) std::fprintf(stderr, "ashl_bench_compress_cpu: n = %zu ...\n", n);
    inputs in;
    for (int b = 0; b < 2; ++b) {
      in.f32[b] = make_input(n, 1000 + b);
      in.bf16[b].resize(n);
      for (std::size_t i = 0; i < n; ++i) in.bf16[b][i] = ashl::bfloat16::from_float(in.f32[b][i]);
    }
    const baselines b32 = measure_baselines(in.f32, opt.reps), b16 = measure_baselines(in.bf16, opt.reps);
    for (const auto& c : codecs) {
      if (!opt.codecs.empty() && std::find(opt.codecs.begin(), opt.codecs.end(), c.name) == opt.codecs.end()) continue;
      for (unsigned th : thread_counts) {
        if (c.sparse) {
          for (double kr : {0.01, 0.001}) c.run(kr, in, th, b32, b16, opt.reps, rows);
        } else {
          c.run(0.01, in, th, b32, b16, opt.reps, rows);
        }
      }
    }
  }

  for (const auto& r : rows) print_json(r, machine, date);
  if (opt.json_only) return 0;

  std::printf("\n%-13s %9s %7s %5s %3s %9s %9s %9s %9s %7s %8s\n", "codec", "n", "k", "dtype", "thr", "enc GB/s",
              "dec GB/s", "memcpy", "nth_elem", "ratio", "compress");
  for (const auto& r : rows)
    std::printf("%-13s %9zu %7s %5s %3u %9.2f %9.2f %9.2f %9.3f %6.2fx %7.1fx\n", r.codec.c_str(), r.n,
                r.sparse ? (r.k_ratio == 0.01 ? "1%" : "0.1%") : "-", r.dtype.c_str(), r.threads, r.gbps, r.decode_gbps,
                r.base_memcpy, r.base_nth, r.ratio, r.compression);

  // The goals, at the largest size run, f32, single thread.
  struct goal {
    const char* what;
    std::vector<std::string> codecs;
    double need;
  };
  const std::vector<goal> goals{{"casts >= 0.5 x memcpy", {"fp16", "bf16"}, 0.5},
                                {"quantizers, sign >= 0.5 x memcpy", {"qsgd", "terngrad", "sign", "natural"}, 0.5},
                                {"sampled top-k >= 10 x nth_element", {"topk_sampled"}, 10.0},
                                {"exact top-k >= 3 x nth_element", {"topk"}, 3.0}};
  const std::size_t nmax = sizes.back();
  std::printf("\nGoals (n = %zu, f32, 1 thread, median of %d; %s, %u threads):\n", nmax, opt.reps, machine.c_str(), hw);
  for (const auto& g : goals) {
    for (const auto& r : rows) {
      if (r.n != nmax || r.dtype != "f32" || r.threads != 1) continue;
      if (std::find(g.codecs.begin(), g.codecs.end(), r.codec) == g.codecs.end()) continue;
      std::printf("  %-4s %-36s %-13s k=%-5s ratio %6.2fx (need %.1fx)\n", r.ratio >= g.need ? "PASS" : "MISS", g.what,
                  r.codec.c_str(), r.sparse ? (r.k_ratio == 0.01 ? "1%" : "0.1%") : "-", r.ratio, g.need);
    }
  }
  return 0;
}
