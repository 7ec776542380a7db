// ashl_bench_compress_cpu — throughput of the CPU codecs against memcpy and
// std::nth_element measured in the same run (docs/perf/compress-cpu.md).
//
//   ashl_bench_compress_cpu              # n = 2^20, 2^24, 25,557,032
//   ashl_bench_compress_cpu --quick      # n = 2^24 only, under a minute
//   ashl_bench_compress_cpu --codecs topk,topk_sampled --reps 9 --json-only
//
// For every (codec, n, k, dtype, threads): encode and decode-add throughput in
// GB/s of *input* bytes (n x sizeof(dtype)) and in elements per second, the
// compression ratio (input bytes / payload bytes), and the ratio of encode
// throughput to its baseline:
// memcpy of the input buffer for the dense codecs (identity, casts,
// quantizers, sign, natural), and exact top-k by std::nth_element for the
// sparsifiers (top-k variants, threshold, random-k, DGC).
//
// Baselines, measured in the same run on the same buffers as the codecs:
//   memcpy       std::memcpy of the n-element input into a second buffer.
//   nth_element  copy |x| (as float) of the n inputs into a float scratch
//                vector, then std::nth_element(greater) for the k-th largest
//                magnitude: the copy is included, since a codec may not
//                modify its input either; only the magnitude is selected
//                (no indices), which flatters the baseline slightly.
//   Both count input bytes (n x sizeof(dtype)) for their GB/s.
//
// 16-bit inputs: every case runs on f32, f16 and bf16 copies of the same
// values, timed interleaved (one f32, one f16, one bf16 repetition, then the
// next round), so load drift hits the three alike; the "16-bit inputs" table
// gives each codec's f16 and bf16 *element* rate as a ratio to its f32 rate
// (goal >= 0.9x) beside the f32 rate against memcpy.
//
// Threads: no codec has a multi-thread option, so "threads = T" is chunked
// parallelism: T std::threads each encode (and decode-add) an independent
// n/T-element chunk with their own codec, output and scratch, as a bucket of
// per-tensor codecs would run. The baselines are run the same way (T threads,
// T chunks, nth_element of each chunk's own k), so each row's ratio compares
// like with like; the goals use the single-thread rows.
//
// Timing: every figure is the median of --reps timed runs after one warm-up.
// Inputs and decode accumulators rotate through a pool of identical-content
// buffers (two distinct contents, alternating) whose total size is at least
// twice the last-level cache, so every timed run starts from memory even at
// n = 2^20. The encoded payloads are per case and may sit in cache at small n.
//
// Goals (the final summary): at the largest size, f32, one thread, each goal
// codec is timed again between two runs of its baseline, and its ratio is
// against their mean, so load drift on a shared machine between a size's
// baselines and the codec's turn stays out of PASS/MISS. Those rows are also
// printed as JSON with "goal_check":true (a baseline they do not use is 0).
//
// Adding a codec: one entry(...) line in all_codecs().
#include <ashl/compress/cast.hpp>
#include <ashl/compress/block.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/threshold.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/compress/topk_sampled.hpp>
#include <ashl/core/philox.hpp>

// Codecs written in parallel with this driver: each is benchmarked when its
// header is in the tree and reported as not built otherwise.
#if __has_include(<ashl/compress/qsgd.hpp>)
#include <ashl/compress/qsgd.hpp>
#define ASHL_BENCH_HAS_QSGD 1
#else
#define ASHL_BENCH_HAS_QSGD 0
#endif
#if __has_include(<ashl/compress/terngrad.hpp>)
#include <ashl/compress/terngrad.hpp>
#define ASHL_BENCH_HAS_TERNGRAD 1
#else
#define ASHL_BENCH_HAS_TERNGRAD 0
#endif
#if __has_include(<ashl/compress/sign.hpp>)
#include <ashl/compress/sign.hpp>
#define ASHL_BENCH_HAS_SIGN 1
#else
#define ASHL_BENCH_HAS_SIGN 0
#endif
#if __has_include(<ashl/compress/natural.hpp>)
#include <ashl/compress/natural.hpp>
#define ASHL_BENCH_HAS_NATURAL 1
#else
#define ASHL_BENCH_HAS_NATURAL 0
#endif
#if __has_include(<ashl/compress/error_feedback.hpp>)
#include <ashl/compress/error_feedback.hpp>
#define ASHL_BENCH_HAS_ERROR_FEEDBACK 1
#else
#define ASHL_BENCH_HAS_ERROR_FEEDBACK 0
#endif
#if __has_include(<ashl/compress/dgc.hpp>)
#include <ashl/compress/dgc.hpp>
#define ASHL_BENCH_HAS_DGC 1
#else
#define ASHL_BENCH_HAS_DGC 0
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
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
double time_median(int reps, F&& f) {  // seconds; f() runs one repetition
  f();                                 // warm-up
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = clock_type::now();
    f();
    t.push_back(std::chrono::duration<double>(clock_type::now() - a).count());
  }
  return median(t);
}

std::size_t last_level_cache_bytes() {
  for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long v = sysconf(name);
    if (v > 0) return static_cast<std::size_t>(v);
  }
  return std::size_t{64} << 20;
}

// Gradient-like input: normal values, 1 in 128 of them scaled by 8 (heavy tail).
std::vector<float> make_input(std::size_t n, std::uint64_t seed) {
  std::vector<float> x(n);
  const ashl::philox_stream s(seed, 0, 0);
  for (std::size_t i = 0; i < n; i += 4) {
    const auto b = s.block(i / 4);
    for (std::size_t j = 0; j < 4 && i + j < n; j += 2) {
      const float u1 = (static_cast<float>(b[j] >> 8) + 0.5f) * (1.0f / 16777216.0f);
      const float u2 = static_cast<float>(b[j + 1] >> 8) * (1.0f / 16777216.0f);
      const float r = std::sqrt(-2.0f * std::log(u1));
      x[i + j] = r * std::cos(6.2831853f * u2) * ((b[j] & 127u) == 0 ? 8.0f : 1.0f);
      if (i + j + 1 < n) x[i + j + 1] = r * std::sin(6.2831853f * u2);
    }
  }
  return x;
}

// Buffers of one size, handed out round-robin so that a buffer's previous use
// is at least pool_bytes of traffic ago (>= 2 x LLC): no timed run is warm.
template <class T>
class pool {
 public:
  pool(const std::vector<T> (&base)[2], std::size_t llc) {
    const std::size_t bytes = base[0].size() * sizeof(T);
    const std::size_t cap = std::size_t{1} << 30;  // memory bound per pool
    std::size_t count = std::max<std::size_t>(2, (2 * llc + bytes - 1) / bytes);
    count = std::max<std::size_t>(2, std::min(count, cap / std::max<std::size_t>(bytes, 1)));
    for (std::size_t b = 0; b < count; ++b) bufs_.push_back(base[b & 1]);
  }
  std::vector<T>& next() { return bufs_[cursor_++ % bufs_.size()]; }
  std::size_t size() const { return bufs_.size(); }
  std::size_t n() const { return bufs_[0].size(); }

 private:
  std::vector<std::vector<T>> bufs_;
  std::size_t cursor_ = 0;
};

struct inputs {
  pool<float>* f32;
  pool<ashl::half>* f16;
  pool<ashl::bfloat16>* bf16;
  pool<float>* acc;
};

enum class baseline_kind { memcpy, nth_element };

struct baselines {
  double memcpy_gbps = 0;
  double nth_gbps_1 = 0, nth_gbps_01 = 0;  // k = 1 %, 0.1 %
  double nth(double k_ratio) const { return k_ratio == 0.001 ? nth_gbps_01 : nth_gbps_1; }
};

struct row {
  std::string codec;
  std::size_t n, k;
  double k_ratio;
  std::string dtype;
  unsigned threads;
  double gbps, decode_gbps, base_memcpy, base_nth, ratio, compression;
  double melems, decode_melems;  // million elements per second
  baseline_kind base;
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

std::size_t k_of(double k_ratio, std::size_t n) {
  return std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(k_ratio * static_cast<double>(n))));
}

struct chunk {
  std::size_t off, len;
};
std::vector<chunk> chunks(std::size_t n, unsigned threads) {
  const std::size_t c = (n + threads - 1) / threads;
  std::vector<chunk> v;
  for (unsigned t = 0; t < threads; ++t) {
    const std::size_t off = std::min(n, t * c);
    v.push_back({off, std::min(c, n - off)});
  }
  return v;
}

// Runs body(t) for t in [0, threads): inline for one thread, else one std::thread each.
template <class F>
void parallel(unsigned threads, F&& body) {
  if (threads == 1) return body(0u);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back([&body, t] { body(t); });
  for (auto& th : pool) th.join();
}

// Measures the memcpy baseline and the nth_element baselines for the k ratios
// in `nth_ratios` (default both; none when empty). What is not measured stays 0.
template <class T>
baselines measure_baselines(pool<T>& in, unsigned threads, int reps, bool with_memcpy = true,
                            std::vector<double> nth_ratios = {0.01, 0.001}) {
  const std::size_t n = in.n();
  const double bytes = static_cast<double>(n * sizeof(T));
  const auto parts = chunks(n, threads);
  baselines b;
  if (with_memcpy) {
    std::vector<T> dst(n);
    b.memcpy_gbps = bytes /
                    time_median(reps,
                                [&] {
                                  const T* src = in.next().data();
                                  parallel(threads, [&](unsigned t) {
                                    std::memcpy(dst.data() + parts[t].off, src + parts[t].off,
                                                parts[t].len * sizeof(T));
                                  });
                                }) /
                    1e9;
  }
  if (nth_ratios.empty()) return b;
  std::vector<float> mag(n);
  for (double kr : nth_ratios) {
    const double secs = time_median(std::max(3, reps / 2), [&] {
      const T* x = in.next().data();
      parallel(threads, [&](unsigned t) {
        const auto [off, len] = parts[t];
        if (len == 0) return;
        for (std::size_t i = off; i < off + len; ++i) mag[i] = std::fabs(ashl::to_float(x[i]));
        const auto first = mag.begin() + static_cast<std::ptrdiff_t>(off);
        std::nth_element(first, first + static_cast<std::ptrdiff_t>(k_of(kr, len) - 1),
                         first + static_cast<std::ptrdiff_t>(len), std::greater<>());
      });
    });
    (kr == 0.01 ? b.nth_gbps_1 : b.nth_gbps_01) = bytes / secs / 1e9;
  }
  return b;
}

// Stateful decorators (error feedback, DGC) send their inner codec's payload
// of f32 input whatever the gradient's dtype; the header then says f32.
template <class Codec>
constexpr bool payload_is_f32 = std::same_as<typename Codec::codec_concept, cx::stateful_codec_tag>;

// One codec configuration on one input dtype with `threads` chunks; each
// chunk has its own codec value (decorators keep per-tensor state).
// encode_once / decode_once run one repetition; the caller times them, so
// several dtypes can be timed interleaved.
template <class Codec, class T>
class case_run {
 public:
  case_run(const Codec& proto, pool<T>& in, pool<float>& acc, unsigned threads)
      : in_(in), acc_(acc), threads_(threads) {
    const ashl::dtype dt = ashl::dtype_of<T>;
    for (const chunk& c : chunks(in.n(), threads))
      parts_.push_back({c, proto, std::vector<std::byte>(proto.max_encoded_bytes(c.len, dt)),
                        std::vector<std::byte>(proto.scratch_bytes(c.len, dt))});
  }
  void encode_once() {
    ++step_;
    const T* x = in_.next().data();
    parallel(threads_, [&](unsigned t) {
      part& p = parts_[t];
      cx::codec_context ctx{.seed = 42, .step = step_, .tensor = t, .scratch = p.scratch};
      auto u = p.codec.encode(ashl::host_view<const T>(x + p.c.off, p.c.len), p.out, ctx);
      if (!u) failed_ = true;
      else p.used = *u;
    });
  }
  void decode_once() {
    const ashl::dtype payload_dt = payload_is_f32<Codec> ? ashl::dtype::f32 : ashl::dtype_of<T>;
    float* a = acc_.next().data();
    parallel(threads_, [&](unsigned t) {
      part& p = parts_[t];
      cx::codec_context ctx{.seed = 42, .step = step_, .tensor = t, .scratch = p.scratch};
      auto s = p.codec.decode_add({p.out.data(), p.used}, {p.c.len, payload_dt},
                                  ashl::host_view<float>(a + p.c.off, p.c.len), 1.0f, ctx);
      if (!s.ok()) failed_ = true;
    });
  }
  [[nodiscard]] bool failed() const { return failed_; }
  [[nodiscard]] std::size_t payload() const {
    std::size_t b = 0;
    for (const auto& p : parts_) b += p.used;
    return b;
  }
  [[nodiscard]] std::size_t n() const { return in_.n(); }

 private:
  struct part {
    chunk c;
    Codec codec;
    std::vector<std::byte> out, scratch;
    std::size_t used = 0;
  };
  pool<T>& in_;
  pool<float>& acc_;
  unsigned threads_;
  std::vector<part> parts_;
  std::atomic<bool> failed_{false};
  std::uint64_t step_ = 0;
};

// Times the encode and then the decode-add of several runs interleaved: one
// warm-up each, then `reps` rounds of one repetition of every run in turn.
// Returns per run the median encode and decode seconds.
template <class... Runs>
std::array<std::pair<double, double>, sizeof...(Runs)> time_interleaved(int reps, Runs&... runs) {
  constexpr std::size_t m = sizeof...(Runs);
  std::array<std::vector<double>, m> te, td;
  auto timed = [](auto&& f) {
    const auto a = clock_type::now();
    f();
    return std::chrono::duration<double>(clock_type::now() - a).count();
  };
  (runs.encode_once(), ...);
  for (int r = 0; r < reps; ++r) {
    std::size_t i = 0;
    ((te[i++].push_back(timed([&] { runs.encode_once(); }))), ...);
  }
  (runs.decode_once(), ...);
  for (int r = 0; r < reps; ++r) {
    std::size_t i = 0;
    ((td[i++].push_back(timed([&] { runs.decode_once(); }))), ...);
  }
  std::array<std::pair<double, double>, m> out;
  for (std::size_t i = 0; i < m; ++i) out[i] = {median(te[i]), median(td[i])};
  return out;
}

template <class Codec, class T>
row make_row(const std::string& name, const case_run<Codec, T>& run, std::pair<double, double> secs,
             baseline_kind kind, bool sparse, double k_ratio, unsigned threads, const baselines& base) {
  const std::size_t n = run.n();
  if (run.failed()) std::fprintf(stderr, "warning: %s failed to encode or decode (n = %zu)\n", name.c_str(), n);
  const double bytes = static_cast<double>(n * sizeof(T));
  const auto [te, td] = secs;
  row rw{name,
         n,
         sparse ? k_of(k_ratio, n) : 0,
         sparse ? k_ratio : 0.0,
         std::string(ashl::to_string(ashl::dtype_of<T>)),
         threads,
         bytes / te / 1e9,
         bytes / td / 1e9,
         base.memcpy_gbps,
         base.nth(k_ratio),
         0,
         bytes / static_cast<double>(std::max<std::size_t>(run.payload(), 1)),
         static_cast<double>(n) / te / 1e6,
         static_cast<double>(n) / td / 1e6,
         kind,
         sparse};
  rw.ratio = rw.gbps / (kind == baseline_kind::nth_element ? rw.base_nth : rw.base_memcpy);
  return rw;
}

struct case_env {
  inputs in;
  unsigned threads;
  const baselines* b32;  // for this thread count
  const baselines* bf16;
  const baselines* bh16;  // f16 input
  int reps;
};

struct codec_entry {
  std::string name;
  baseline_kind kind;
  bool sparse;  // runs k = 1 % and 0.1 %
  // Appends the f32 row, and with with_16 the f16 and bf16 rows (timed interleaved with it).
  std::function<void(double k_ratio, const case_env&, std::vector<row>&, bool with_16)> run;
};

// One line per codec: its name, its baseline, whether it takes k, and how to
// build it for a given k ratio (ignored by dense codecs).
template <class Make>
codec_entry entry(std::string name, baseline_kind kind, bool sparse, Make make) {
  return {name, kind, sparse, [name, kind, sparse, make](double kr, const case_env& e, std::vector<row>& out, bool with_16) {
            const auto c = make(kr);
            using C = std::remove_const_t<decltype(c)>;
            case_run<C, float> r32(c, *e.in.f32, *e.in.acc, e.threads);
            if (!with_16) {
              const auto t = time_interleaved(e.reps, r32);
              out.push_back(make_row(name, r32, t[0], kind, sparse, kr, e.threads, *e.b32));
              return;
            }
            case_run<C, ashl::half> rh(c, *e.in.f16, *e.in.acc, e.threads);
            case_run<C, ashl::bfloat16> rb(c, *e.in.bf16, *e.in.acc, e.threads);
            const auto t = time_interleaved(e.reps, r32, rh, rb);
            out.push_back(make_row(name, r32, t[0], kind, sparse, kr, e.threads, *e.b32));
            out.push_back(make_row(name, rh, t[1], kind, sparse, kr, e.threads, *e.bh16));
            out.push_back(make_row(name, rb, t[2], kind, sparse, kr, e.threads, *e.bf16));
          }};
}

constexpr auto dense = baseline_kind::memcpy;
constexpr auto sparse = baseline_kind::nth_element;

std::vector<codec_entry> all_codecs() {
  std::vector<codec_entry> v{
      entry("identity", dense, false, [](double) { return cx::identity{}; }),
      entry("fp16", dense, false, [](double) { return cx::fp16{}; }),
      entry("bf16", dense, false, [](double) { return cx::bf16{}; }),
      entry("topk", sparse, true, [](double kr) { return cx::topk{kr}; }),
      entry("topk_sampled", sparse, true, [](double kr) { return cx::topk_sampled{kr}; }),
      entry("randomk", sparse, true, [](double kr) { return cx::randomk{cx::randomk_options{.ratio = kr}}; }),
      // A threshold at the 1 % / 0.1 % two-sided quantile of |N(0,1)| (2.576, 3.291), capped at 2k.
      entry("threshold", sparse, true,
            [](double kr) {
              return cx::threshold{cx::threshold_options{.theta = kr == 0.01 ? 2.576f : 3.291f, .max_ratio = 2 * kr}};
            }),
  };
#if ASHL_BENCH_HAS_QSGD
  // The default: s = 127 levels (8 bits per element), one f32 norm per 512 elements.
  v.push_back(entry("qsgd", dense, false, [](double) { return cx::qsgd{}; }));
#endif
#if ASHL_BENCH_HAS_TERNGRAD
  v.push_back(entry("terngrad", dense, false, [](double) { return cx::terngrad{}; }));  // bucket 512
#endif
#if ASHL_BENCH_HAS_SIGN
  v.push_back(entry("sign", dense, false, [](double) { return cx::sign{}; }));  // bucket 512
#endif
#if ASHL_BENCH_HAS_NATURAL
  v.push_back(entry("natural", dense, false, [](double) { return cx::natural{}; }));
#endif
  // Block-scaled integers (Streaming DiLoCo's 4 bits, SparseLoCo's 2), B = 64.
  v.push_back(entry("block8", dense, false, [](double) { return cx::block_quant{{.bits = 8, .block = 64}}; }));
  v.push_back(entry("block4", dense, false, [](double) { return cx::block_quant{{.bits = 4, .block = 64}}; }));
  v.push_back(entry("block2", dense, false, [](double) { return cx::block_quant{{.bits = 2, .block = 64}}; }));
  v.push_back(entry("block4s", dense, false,
                    [](double) { return cx::block_quant{{.bits = 4, .block = 64, .stochastic = true}}; }));
#if ASHL_BENCH_HAS_ERROR_FEEDBACK
  // Each chunk's decorator keeps its own residual (allocated in the warm-up).
  // Encode = residual add + inner encode + inner decode into the residual.
#if ASHL_BENCH_HAS_SIGN
  v.push_back(entry("ef+sign", dense, false, [](double) { return cx::error_feedback<cx::sign>{cx::sign{}}; }));
#endif
  v.push_back(entry("ef+topk", sparse, true, [](double kr) { return cx::error_feedback<cx::topk>{cx::topk{kr}}; }));
#endif
#if ASHL_BENCH_HAS_DGC
  // DGC as in the paper: momentum 0.9 around the sampled-threshold top-k.
  v.push_back(entry("dgc", sparse, true, [](double kr) {
    return cx::dgc<cx::topk_sampled>{cx::topk_sampled{kr}, cx::dgc_options{.momentum = 0.9f}};
  }));
#endif
  return v;
}

// Codecs whose headers were not in this build.
const std::vector<std::string> not_built = [] {
  std::vector<std::string> v;
  if (!ASHL_BENCH_HAS_QSGD) v.push_back("qsgd");
  if (!ASHL_BENCH_HAS_TERNGRAD) v.push_back("terngrad");
  if (!ASHL_BENCH_HAS_SIGN) v.push_back("sign");
  if (!ASHL_BENCH_HAS_NATURAL) v.push_back("natural");
  if (!ASHL_BENCH_HAS_ERROR_FEEDBACK) v.push_back("ef+sign,ef+topk");
  if (!ASHL_BENCH_HAS_DGC) v.push_back("dgc");
  return v;
}();

// goal: a back-to-back re-measurement for the goal summary (baselines are the
// mean of one run before and one after the codec).
void print_json(const row& r, const std::string& machine, const std::string& date, int reps, bool goal) {
  std::printf(
      "{\"codec\":\"%s\",\"n\":%zu,\"k\":%zu,\"k_ratio\":%g,\"dtype\":\"%s\",\"threads\":%u,\"parallelism\":\"%s\","
      "\"gbps\":%.4f,\"decode_gbps\":%.4f,\"melems\":%.2f,\"decode_melems\":%.2f,\"baseline_memcpy_gbps\":%.4f,\"baseline_nth_element_gbps\":%.4f,"
      "\"ratio\":%.4f,\"ratio_baseline\":\"%s\",\"compression_ratio\":%.3f,\"reps\":%d,\"machine\":\"%s\","
      "\"nproc\":%u,\"date\":\"%s\",\"goal_check\":%s}\n",
      r.codec.c_str(), r.n, r.k, r.k_ratio, r.dtype.c_str(), r.threads, r.threads == 1 ? "none" : "chunked", r.gbps,
      r.decode_gbps, r.melems, r.decode_melems, r.base_memcpy, r.base_nth, r.ratio, r.base == baseline_kind::nth_element ? "nth_element" : "memcpy",
      r.compression, reps, machine.c_str(), std::thread::hardware_concurrency(), date.c_str(),
      goal ? "true" : "false");
}

int usage(int rc, const std::vector<codec_entry>& codecs) {
  std::string names;
  for (const auto& c : codecs) names += (names.empty() ? "" : ",") + c.name;
  std::string missing;
  for (const auto& c : not_built) missing += (missing.empty() ? "" : ",") + c;
  std::printf(
      "usage: ashl_bench_compress_cpu [--quick] [--json-only] [--reps N] [--codecs a,b,...]\n"
      "  --quick      only n = 2^24, 3 reps unless --reps is given (about a minute on 2 cores)\n"
      "  --json-only  print only the JSON lines (one per case)\n"
      "  --reps N     timed repetitions per figure after one warm-up, median reported (default 7)\n"
      "  --codecs     comma-separated subset of: %s (default: all)\n"
      "Sizes n = 2^20, 2^24, 25557032; k = 1%% and 0.1%% for sparsifiers; f32, f16 and bf16 input\n"
      "(timed interleaved; the 16-bit table gives their element rates as ratios to f32's);\n"
      "threads 1 and hardware_concurrency (chunked: T independent n/T-element encodes).\n"
      "Not in this build (header missing): %s\n",
      names.c_str(), missing.empty() ? "none" : missing.c_str());
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  bool reps_given = false;
  auto codecs = all_codecs();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") opt.quick = true;
    else if (a == "--json-only") opt.json_only = true;
    else if (a == "--help" || a == "-h") return usage(0, codecs);
    else if (a == "--reps" && i + 1 < argc) {
      reps_given = true;
      opt.reps = std::atoi(argv[++i]);
      if (opt.reps < 1) return std::fprintf(stderr, "--reps = %s: must be >= 1\n", argv[i]), 2;
    } else if (a == "--codecs" && i + 1 < argc) {
      const std::string s = argv[++i];
      for (std::size_t p = 0; p <= s.size();) {
        const std::size_t q = std::min(s.find(',', p), s.size());
        if (q > p) opt.codecs.push_back(s.substr(p, q - p));
        p = q + 1;
      }
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return usage(2, codecs);
    }
  }
  for (const auto& c : opt.codecs)
    if (std::none_of(codecs.begin(), codecs.end(), [&](const codec_entry& e) { return e.name == c; }))
      return std::fprintf(stderr, "--codecs = %s: unknown codec (see --help)\n", c.c_str()), 2;
  if (opt.quick && !reps_given) opt.reps = 3;

  const std::string machine = machine_name(), date = today();
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t llc = last_level_cache_bytes();
  std::vector<unsigned> thread_counts{1};
  if (hw > 1) thread_counts.push_back(hw);
  const std::vector<std::size_t> sizes = opt.quick ? std::vector<std::size_t>{std::size_t{1} << 24}
                                                   : std::vector<std::size_t>{std::size_t{1} << 20,
                                                                              std::size_t{1} << 24, 25557032};
  struct goal {
    const char* what;
    std::vector<std::string> codecs;
    double need;
  };
  const std::vector<goal> goal_list{{"casts >= 0.5x memcpy", {"fp16", "bf16"}, 0.5},
                                    {"quantizers, sign >= 0.5x memcpy", {"qsgd", "terngrad", "natural", "sign"}, 0.5},
                                    {"block codecs >= 0.5x memcpy", {"block8", "block4", "block2", "block4s"}, 0.5},
                                    {"sampled top-k >= 10x nth_element", {"topk_sampled"}, 10.0},
                                    {"exact top-k >= 3x nth_element", {"topk"}, 3.0}};
  std::vector<row> rows, goal_rows;
  for (std::size_t n : sizes) {
    std::vector<float> base32[2];
    std::vector<ashl::bfloat16> base16[2];
    std::vector<ashl::half> baseh[2];
    for (int b = 0; b < 2; ++b) {
      base32[b] = make_input(n, 1000 + b);
      base16[b].resize(n);
      baseh[b].resize(n);
      for (std::size_t i = 0; i < n; ++i) base16[b][i] = ashl::bfloat16::from_float(base32[b][i]);
      for (std::size_t i = 0; i < n; ++i) baseh[b][i] = ashl::half::from_float(base32[b][i]);
    }
    const std::vector<float> zeros[2] = {std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
    pool<float> p32(base32, llc), acc(zeros, llc);
    pool<ashl::bfloat16> p16(base16, llc);
    pool<ashl::half> ph(baseh, llc);
    if (!opt.json_only)
      std::fprintf(stderr,
                   "ashl_bench_compress_cpu: n = %zu (%zu f32 / %zu f16 / %zu bf16 buffers in rotation, LLC %zu MiB)\n",
                   n, p32.size(), ph.size(), p16.size(), llc >> 20);
    for (unsigned th : thread_counts) {
      // The 16-bit rows' memcpy baseline is the same bytes whatever the
      // 16-bit type; nth_element is measured for each (its conversion differs).
      const baselines b32 = measure_baselines(p32, th, opt.reps), b16 = measure_baselines(p16, th, opt.reps);
      const baselines bh = measure_baselines(ph, th, opt.reps, false);
      baselines bh16 = bh;
      bh16.memcpy_gbps = b16.memcpy_gbps;
      const case_env env{{&p32, &ph, &p16, &acc}, th, &b32, &b16, &bh16, opt.reps};
      for (const auto& c : codecs) {
        if (!opt.codecs.empty() && std::find(opt.codecs.begin(), opt.codecs.end(), c.name) == opt.codecs.end())
          continue;
        if (c.sparse) {
          for (double kr : {0.01, 0.001}) c.run(kr, env, rows, true);
        } else {
          c.run(0.01, env, rows, true);
        }
      }
    }
    // The goal rows again, back to back with their own baseline: baseline,
    // codec, baseline, the ratio against the mean of the two, so load drift
    // on a shared machine between the start of this size and the codec's turn
    // does not enter the PASS/MISS verdict.
    if (n != sizes.back()) continue;
    for (const auto& c : codecs) {
      if (!opt.codecs.empty() && std::find(opt.codecs.begin(), opt.codecs.end(), c.name) == opt.codecs.end()) continue;
      if (std::none_of(goal_list.begin(), goal_list.end(), [&](const goal& g) {
            return std::find(g.codecs.begin(), g.codecs.end(), c.name) != g.codecs.end();
          }))
        continue;
      for (double kr : c.sparse ? std::vector<double>{0.01, 0.001} : std::vector<double>{0.01}) {
        const bool mem = c.kind == baseline_kind::memcpy;
        const std::vector<double> nth = mem ? std::vector<double>{} : std::vector<double>{kr};
        const baselines before = measure_baselines(p32, 1, opt.reps, mem, nth);
        const case_env env{{&p32, &ph, &p16, &acc}, 1, &before, &before, &before, opt.reps};
        std::vector<row> one;
        c.run(kr, env, one, false);
        const baselines after = measure_baselines(p32, 1, opt.reps, mem, nth);
        row& r = one.front();
        r.base_memcpy = 0.5 * (before.memcpy_gbps + after.memcpy_gbps);
        r.base_nth = 0.5 * (before.nth(kr) + after.nth(kr));
        r.ratio = r.gbps / (r.base == baseline_kind::nth_element ? r.base_nth : r.base_memcpy);
        goal_rows.push_back(r);
      }
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [&](const row& a, const row& b) {
    const auto pos = [&](const std::string& name) {
      return std::find_if(codecs.begin(), codecs.end(), [&](const codec_entry& e) { return e.name == name; }) -
             codecs.begin();
    };
    if (a.n != b.n) return a.n < b.n;
    return pos(a.codec) < pos(b.codec);
  });

  for (const auto& r : rows) print_json(r, machine, date, opt.reps, false);
  for (const auto& r : goal_rows) print_json(r, machine, date, opt.reps, true);
  if (opt.json_only) return 0;

  std::printf("\n%s, %u threads; median of %d reps; GB/s of input bytes; ratio = enc / baseline (m = memcpy,\n"
              "n = nth_element, same thread count); threads > 1 are chunked (T independent n/T encodes)\n",
              machine.c_str(), hw, opt.reps);
  std::printf("%-14s %9s %5s %5s %3s %9s %9s %8s %8s %8s %8s\n", "codec", "n", "k", "dtype", "thr", "enc GB/s",
              "dec GB/s", "memcpy", "nth_elem", "ratio", "compress");
  for (const auto& r : rows)
    std::printf("%-14s %9zu %5s %5s %3u %9.3f %9.3f %8.2f %8.3f %6.2fx%c %7.1fx\n", r.codec.c_str(), r.n,
                r.sparse ? (r.k_ratio == 0.01 ? "1%" : "0.1%") : "-", r.dtype.c_str(), r.threads, r.gbps,
                r.decode_gbps, r.base_memcpy, r.base_nth, r.ratio, r.base == baseline_kind::nth_element ? 'n' : 'm',
                r.compression);

  // 16-bit inputs: each codec's f16 and bf16 element rate against its own f32
  // rate of the same interleaved rounds (goal >= 0.9x), and f32 against memcpy.
  std::printf("\n16-bit inputs (1 thread): element rates, Melem/s, encode (decode-add); ratio = 16-bit / f32\n"
              "element rate of the same interleaved rounds (goal >= 0.90x); f32 GB/s against memcpy\n");
  std::printf("%-14s %9s %5s %15s %8s %15s %13s %15s %13s\n", "codec", "n", "k", "f32 Melem/s", "f32/mcpy",
              "f16 Melem/s", "f16/f32", "bf16 Melem/s", "bf16/f32");
  for (std::size_t i = 0; i + 2 < rows.size(); ++i) {
    const row &a = rows[i], &h = rows[i + 1], &b = rows[i + 2];
    if (a.dtype != "f32" || h.dtype != "f16" || b.dtype != "bf16" || a.threads != 1 || h.codec != a.codec ||
        b.codec != a.codec || h.threads != 1 || b.threads != 1 || h.k_ratio != a.k_ratio || b.k_ratio != a.k_ratio)
      continue;
    const double rh = h.melems / a.melems, rb = b.melems / a.melems;
    std::printf("%-14s %9zu %5s %7.0f (%5.0f) %7.2fx %7.0f (%5.0f) %5.2fx%c (%4.2f) %7.0f (%5.0f) %5.2fx%c (%4.2f)\n",
                a.codec.c_str(), a.n, a.sparse ? (a.k_ratio == 0.01 ? "1%" : "0.1%") : "-", a.melems,
                a.decode_melems, a.gbps / a.base_memcpy, h.melems, h.decode_melems, rh, rh >= 0.9 ? ' ' : '!',
                h.decode_melems / a.decode_melems, b.melems, b.decode_melems, rb, rb >= 0.9 ? ' ' : '!',
                b.decode_melems / a.decode_melems);
  }

  // The goals, at the largest size run, f32, one thread, from the back-to-back runs.
  const std::size_t nmax = sizes.back();
  std::printf("\nGoals (n = %zu, f32, 1 thread; each re-measured between two baselines):\n",
              nmax);
  for (const auto& g : goal_list) {
    for (const auto& name : g.codecs) {
      if (std::find(not_built.begin(), not_built.end(), name) != not_built.end()) {
        std::printf("  n/a  %-33s %-13s not in this build (header missing)\n", g.what, name.c_str());
        continue;
      }
      for (const auto& r : goal_rows) {
        if (r.codec != name) continue;
        std::printf("  %-4s %-33s %-13s k=%-4s %6.2fx  (%.3f vs %.3f GB/s)\n", r.ratio >= g.need ? "PASS" : "MISS",
                    g.what, name.c_str(), r.sparse ? (r.k_ratio == 0.01 ? "1%" : "0.1%") : "-", r.ratio, r.gbps,
                    r.base == baseline_kind::nth_element ? r.base_nth : r.base_memcpy);
      }
    }
  }
  return 0;
}
