// examples/experiment_real.hpp — `ashl_experiment_fmnist --mode real`: the
// reference experiment (docs/algorithms.md §5) as 1 server and 9 worker processes
// over UCX on 127.0.0.1, beside the simulator's prediction for the
// capabilities measured during the run (docs/perf/real-vs-sim.md).
//
//   ashl_experiment_fmnist --mode real --policies bsp,ashl --time-scale 5 --trace ashl
//
// Heterogeneity is emulated by padding, in wall time K times slower than the
// reference (K = --time-scale): worker k of group g = k / 3 pads each local
// iteration to f_c × K × 10 ms (× batch / 64) after it began, and its
// ps::worker holds every transfer of b bytes for f_m × K × 5 ms × b /
// dense_model_bytes (worker_params::link_bytes_per_second), with
// (f_c, f_m) = (2, 4), (3, 6), (4, 8). The server process runs ps::server in
// its own loop (run_once) and evaluates off that loop: at every tick it copies
// the parameters and a thread computes the training loss (reported to the
// policy with report_metric, as the simulator's evaluate hook does) and the
// test accuracy. The budget and the evaluation period are reference seconds
// × K; the table reports wall seconds / K, so a real run and its simulated
// twin read on one scale.
//
// With --hosts netns there is no padding: each process runs in its own
// network namespace (netns.hpp), UCX over TCP through tbf-shaped links at the
// emulated rates, and each local iteration performs a fixed amount of real
// CPU work (netns_share × K × 10 ms) under a cgroup quota of netns_share / f_c
// of a core, so the kernel stretches it to f_c × K × 10 ms. The links' TCP
// rate is probed before the runs (probe_link) and given to the prediction.
//
// The orchestrator (this process) writes the data set once as a raw file the
// children map, starts the server (a free port, retried when taken, a random
// token in ASHL_TOKEN), the workers, and the start instant (CLOCK_MONOTONIC,
// shared by the processes of one machine) once every worker has joined; it
// measures the CPU the processes used during the budget (/proc/<pid>/stat) and
// the machine's busy fraction (/proc/stat), ends every process that outlives
// the budget and a grace period (SIGTERM, then SIGKILL; children die with it:
// PR_SET_PDEATHSIG), and reads what each wrote: the server its accuracy
// curve, the workers their time spans and the capabilities they measured
// (median seconds per iteration at batch 64, link bytes per second, top-k
// time). From those it builds a cluster_spec in reference units and runs the
// same policy and seed in the simulator (run_one): the prediction. It writes
// the same table, JSON lines, CSV and (--trace POLICY) Chrome trace as the
// simulated mode, plus trace_sim_POLICY.json, the twin's. docs/perf/real-vs-sim.md.
#pragma once

#include "experiment_common.hpp"
#include "netns.hpp"

#include <ashl/ps/server.hpp>
#include <ashl/ps/worker.hpp>
#include <ashl/transport/ucx.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

namespace fmnist_experiment {
namespace real {

namespace ps = ashl::ps;
using ucx = ashl::transport::ucx;

inline constexpr double compute_factor[3] = {2, 3, 4}, comm_factor[3] = {4, 6, 8};
inline constexpr double reference_compute_s = 0.010, reference_comm_s = 0.005;  // sim::cluster of §5

// --hosts netns: compute heterogeneity by CPU quota over a fixed amount of
// real work. Every local iteration (batch 64) performs netns_share × K × 10 ms
// of CPU time (the MLP step, then further forward/backward passes on its batch
// whose results are discarded, until the thread's CPU clock says so), and a
// worker of group g gets netns_share / f_c of a core, so the quota alone
// stretches an iteration to f_c × K × 10 ms. 0.4 keeps the nine workers'
// demand at 3 × 0.4 × (1/2 + 1/3 + 1/4) = 1.3 cores of the machine's 2, the
// server (unlimited) beside them. A 20 ms CFS period throttles in steps of at
// most 20 ms within an iteration of 100-200 ms (the smallest quota, 0.1 core,
// is then 2 ms per period, above the kernel's 1 ms floor).
inline constexpr double netns_share = 0.4;
inline constexpr long netns_period_us = 20'000;

// CPU seconds this thread has run (not waited, not been throttled).
inline double thread_cpu_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Seconds on CLOCK_MONOTONIC (steady_clock), which every process of one
// machine shares: the start instant is passed between processes as a number.
inline double mono_now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
inline void sleep_until_mono(double t) {
  std::this_thread::sleep_until(std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(t))));
}

inline std::atomic<bool> g_stop{false};
inline void on_terminate(int) { g_stop.store(true); }

// ------------------------------------------------------------- files

inline std::string data_file(const settings& s) { return s.out + "/real/data.bin"; }
inline std::string run_dir_of(const settings& s, const std::string& policy, int seed) {
  return s.out + "/real/" + policy + "-seed" + std::to_string(seed);
}

// Written whole under another name, then renamed: a reader never sees half.
inline bool write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    if (!f) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

inline bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// The data set as one raw file (header, train images, labels, test images,
// labels): ten processes map it instead of each inflating the gzip files.
struct data_view {
  const std::uint8_t *train_images = nullptr, *train_labels = nullptr, *test_images = nullptr, *test_labels = nullptr;
  std::size_t train_count = 0, test_count = 0;
};
inline constexpr char data_magic[8] = {'A', 'S', 'H', 'L', 'F', 'M', 'N', '1'};

inline ashl::status write_data(const std::string& path, const fmnist::dataset& d) {
  std::ofstream f(path + ".tmp", std::ios::binary | std::ios::trunc);
  const std::uint64_t counts[2] = {d.train.count, d.test.count};
  f.write(data_magic, 8);
  f.write(reinterpret_cast<const char*>(counts), sizeof counts);
  auto put = [&](const std::vector<std::uint8_t>& v) { f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size())); };
  put(d.train.images);
  put(d.train.labels);
  put(d.test.images);
  put(d.test.labels);
  f.close();
  if (!f || std::rename((path + ".tmp").c_str(), path.c_str()) != 0)
    return ashl::make_error(ashl::errc::io_error, "data_file", path, "cannot write");
  return {};
}

inline ashl::result<data_view> map_data(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return ashl::make_error(ashl::errc::not_found, "data_file", path, "cannot open");
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size < 24) {
    ::close(fd);
    return ashl::malformed("data_file.size", path, "too short");
  }
  void* m = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return ashl::make_error(ashl::errc::io_error, "data_file", path, "mmap failed");
  const auto* b = static_cast<const std::uint8_t*>(m);
  std::uint64_t counts[2];
  std::memcpy(counts, b + 8, sizeof counts);
  data_view v;
  v.train_count = counts[0];
  v.test_count = counts[1];
  const std::size_t need = 24 + (counts[0] + counts[1]) * (fmnist::pixels + 1);
  if (std::memcmp(b, data_magic, 8) != 0 || static_cast<std::size_t>(st.st_size) != need)
    return ashl::malformed("data_file", path, "not a data file of this program");
  v.train_images = b + 24;
  v.train_labels = v.train_images + counts[0] * fmnist::pixels;
  v.test_images = v.train_labels + counts[0];
  v.test_labels = v.test_images + counts[1] * fmnist::pixels;
  return v;
}

// The start instant, written by the orchestrator once every worker joined.
inline double wait_for_start(const std::string& run_dir, double deadline) {
  const std::string p = run_dir + "/start";
  while (mono_now() < deadline && !g_stop.load()) {
    std::ifstream f(p);
    double t0 = 0;
    if (f >> t0) return t0;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return -1.0;
}

inline int fail(const std::string& run_dir, const std::string& who, const std::string& why) {
  std::fprintf(stderr, "%s: %s\n", who.c_str(), why.c_str());
  write_file(run_dir + "/error-" + who, why + "\n");
  return 1;
}

// ------------------------------------------------------------- worker

inline int worker_role(const settings& s) {
  const std::string who = "worker-" + std::to_string(s.rank);
  auto dv = map_data(data_file(s));
  if (!dv) return fail(s.run_dir, who, dv.error().message());
  const data_view& d = *dv;
  auto spec = cluster(s);
  if (!spec) return fail(s.run_dir, who, spec.error().message());
  auto setup = make_setup(s.run_policy, s, *spec);
  if (!setup) return fail(s.run_dir, who, setup.error().message());
  const std::size_t n = mlp::size();
  const std::uint32_t g = s.rank / 3;
  const double K = s.time_scale;
  const double iteration_s = compute_factor[g] * reference_compute_s * K;  // at batch 64
  const double model_bytes = 4.0 * static_cast<double>(n);
  const double rate = model_bytes / (comm_factor[g] * reference_comm_s * K);
  const char* token_env = std::getenv("ASHL_TOKEN");
  const std::string token = token_env ? token_env : "";
  ::unsetenv("ASHL_TOKEN");  // read: not inherited by what this process starts (docs/multi-host.md)
  auto t = ucx::create({.token = token});
  if (!t) return fail(s.run_dir, who, t.error().message());
  std::vector<float> W(n);  // the pulled parameters
  auto wk = ps::worker<ucx>::create({.rank = s.rank,
                                     .servers = {s.server_host + ":" + std::to_string(s.port)},
                                     .batch = 64,
                                     .timeout = std::chrono::milliseconds(120000),
                                     .error_feedback = setup->error_feedback,
                                     .link_bytes_per_second = s.hosts == "padding" ? rate : 0.0},
                                    std::move(*t), W);
  if (!wk) return fail(s.run_dir, who, wk.error().message());
  write_file(s.run_dir + "/ready-" + std::to_string(s.rank), "1\n");
  const double t0 = wait_for_start(s.run_dir, mono_now() + 300.0);
  if (t0 < 0) return fail(s.run_dir, who, "no start instant within 300 s");
  // A fresh cycle just before the start: the cycle's compute measurement
  // (ASHL profiles it) must not count the wait for the other processes. The
  // pull of the initial parameters is held for its emulated time, so it
  // starts that much before t0.
  sleep_until_mono(t0 - (s.hosts == "padding" ? (model_bytes + 72) / rate : 0.0) - 0.005);
  if (auto st = wk->pull(); !st) return fail(s.run_dir, who, st.message());
  if (auto st = wk->wait(); !st) return fail(s.run_dir, who, st.message());
  sleep_until_mono(t0);
  const double t_end = t0 + s.budget * K;

  std::vector<float> local(n), base(n), v(n, 0.0f), grad(n), delta(n), scratch(n), xb;
  std::vector<std::uint8_t> yb;
  mlp net;
  const std::uint64_t rng_seed = mix(static_cast<std::uint64_t>(s.run_seed) * 7919 + 17);
  const double lr_policy = s.lr_for(s.run_policy);
  std::uint64_t step = 0, iterations = 0, overruns = 0, commits = 0, samples = 0;
  double compute_s = 0, compress_s = 0, send_s = 0, wait_s = 0, receive_s = 0;
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  std::ostringstream rec;  // capabilities and spans, seconds since t0 (wall)
  rec.precision(9);
  std::string error;
  while (!g_stop.load() && mono_now() < t_end) {
    local = W;
    base = W;
    const double cycle0 = mono_now();
    std::uint32_t iters = 0, batch = 64;
    do {
      // Local SGD with momentum, the simulated workers' sampling (run_one).
      const double it0 = mono_now(), cpu0 = thread_cpu_now();
      batch = wk->batch();
      xb.resize(std::size_t{batch} * mlp::in);
      yb.resize(batch);
      for (std::uint32_t b = 0; b < batch; ++b) {
        const std::size_t idx = mix(rng_seed ^ (std::uint64_t{s.rank} << 40) ^ (step * 65536 + b)) % d.train_count;
        mlp::to_float(&d.train_images[idx * mlp::in], 1, &xb[std::size_t{b} * mlp::in]);
        yb[b] = d.train_labels[idx];
      }
      ++step;
      net.forward_backward(local, xb.data(), yb.data(), batch, grad);
      const float mu = static_cast<float>(s.momentum), lr = static_cast<float>(lr_policy);
      for (std::size_t i = 0; i < n; ++i) {
        v[i] = mu * v[i] + grad[i];
        local[i] -= lr * v[i];
      }
      const double until = it0 + iteration_s * batch / 64.0;
      if (s.hosts == "padding") {
        // The padding: this iteration takes f_c × K × 10 ms in all.
        if (mono_now() > until) ++overruns;
        else sleep_until_mono(until);
      } else {
        // Namespaces: netns_share × K × 10 ms of real CPU work (× batch /
        // 64); the cgroup's quota, netns_share / f_c of a core, makes it last
        // f_c × K × 10 ms. The filler passes use 16 samples (≈ 0.4 ms), so
        // the work overshoots its amount by little.
        const double work = netns_share * reference_compute_s * K * batch / 64.0;
        const std::uint32_t fill = std::min<std::uint32_t>(batch, 16);
        while (thread_cpu_now() - cpu0 < work && !g_stop.load())
          net.forward_backward(local, xb.data(), yb.data(), fill, scratch);
        if (mono_now() > it0 + 1.1 * (until - it0)) ++overruns;  // over the emulated time by > 10 %
      }
      ++iters;
    } while (!wk->iteration_done());
    for (std::size_t i = 0; i < n; ++i) delta[i] = local[i] - base[i];
    const double c0 = mono_now();
    const ps::worker_telemetry a = wk->telemetry();
    if (auto st = wk->commit(delta); !st) {
      error = st.message();
      break;
    }
    const double c1 = mono_now();
    const ps::worker_telemetry b = wk->telemetry();
    if (auto st = wk->wait(); !st) {
      error = st.message();
      break;
    }
    const double w1 = mono_now();
    const ps::worker_telemetry c = wk->telemetry();
    const double comp = b.compress_seconds - a.compress_seconds;
    const double hold_in = c.link_seconds - b.link_seconds;
    const std::uint64_t up = b.bytes_out - a.bytes_out, down = c.bytes_in - b.bytes_in;
    // Spans as the simulator names them: compute, compress, send (the
    // emulated push and posting it), wait (for the server's reply), receive
    // (the emulated pull).
    auto span = [&](const char* what, double x, double y) {
      if (y > x) rec << "span " << what << ' ' << x - t0 << ' ' << y - t0 << '\n';
    };
    span("compute", cycle0, c0);
    span("compress", c0, c0 + comp);
    span("send", c0 + comp, c1);
    span("wait", c1, w1 - hold_in);
    span("receive", w1 - hold_in, w1);
    compute_s += c0 - cycle0;
    compress_s += comp;
    send_s += c1 - c0 - comp;
    wait_s += std::max(0.0, w1 - hold_in - c1);
    receive_s += hold_in;
    rec << "iter " << (c0 - cycle0) / iters * 64.0 / batch << '\n';
    if (comp > 0) rec << "compress " << comp << '\n';
    rec << "push " << up << ' ' << c1 - c0 - comp << '\n';
    rec << "pull " << down << ' ' << hold_in << '\n';
    bytes_sent += up;
    bytes_received += down;
    iterations += iters;
    samples += std::uint64_t{iters} * batch;
    ++commits;
  }
  (void)wk->leave();
  std::ostringstream out;
  out.precision(9);
  out << "stats " << compute_s << ' ' << compress_s << ' ' << send_s << ' ' << wait_s << ' ' << receive_s << ' '
      << bytes_sent << ' ' << bytes_received << ' ' << commits << ' ' << iterations << ' ' << samples << '\n'
      << "overruns " << overruns << ' ' << iterations << '\n'
      << rec.str();
  if (!error.empty()) out << "error " << error << '\n';
  write_file(s.run_dir + "/" + who + ".txt", out.str());
  return error.empty() ? 0 : fail(s.run_dir, who, error);
}

// ------------------------------------------------------------- server

inline int server_role(const settings& s) {
  const std::string who = "server";
  auto dv = map_data(data_file(s));
  if (!dv) return fail(s.run_dir, who, dv.error().message());
  const data_view& d = *dv;
  auto spec = cluster(s);
  if (!spec) return fail(s.run_dir, who, spec.error().message());
  auto setup = make_setup(s.run_policy, s, *spec, s.time_scale);
  if (!setup) return fail(s.run_dir, who, setup.error().message());
  const std::size_t n = mlp::size();
  const std::vector<float> W0 = mlp::init(1000 + static_cast<std::uint64_t>(s.run_seed));
  const char* token_env = std::getenv("ASHL_TOKEN");
  const std::string token = token_env ? token_env : "";
  ::unsetenv("ASHL_TOKEN");  // read: not inherited by what this process starts (docs/multi-host.md)
  auto t = ucx::create({.listen = s.server_host + ":" + std::to_string(s.port), .token = token});
  if (!t) {
    std::fprintf(stderr, "server: %s\n", t.error().message().c_str());
    return 75;  // the orchestrator tries another port
  }
  auto layout = ps::shard_layout::even(n, 1);
  if (!layout) return fail(s.run_dir, who, layout.error().message());
  auto srv = ps::server<ucx>::create(
      {.core = {.layout = *layout, .shard = 0, .workers = static_cast<std::uint32_t>(workers_n),
                .optimizer = setup->optimizer},  // model_delta, or a DiLoCo row's outer optimizer
       .stop_when_all_left = false},
      std::move(setup->policy), std::move(*t), W0);
  if (!srv) return fail(s.run_dir, who, srv.error().message());
  const double created = mono_now();  // the server's clock (policy times) starts here
  write_file(s.run_dir + "/listening", "1\n");

  double t0 = -1;
  const double start_deadline = mono_now() + 300.0;
  while (!g_stop.load() && mono_now() < start_deadline) {  // workers join meanwhile
    srv->run_once(std::chrono::microseconds(2000));
    std::ifstream f(s.run_dir + "/start");
    if (f >> t0) break;
    t0 = -1;
  }
  if (t0 < 0) return fail(s.run_dir, who, "no start instant within 300 s");
  const double K = s.time_scale;
  const double t_end = t0 + s.budget * K, period = s.eval_every * K;

  // Evaluation off the event loop: the loss first (the policy waits for it),
  // then the accuracy; the final snapshot on the whole test set.
  struct job {
    double t;
    std::vector<float> w;
    bool final;
  };
  struct done {
    double t, acc, loss;
    int kind;  // 0: loss only, 1: accuracy and loss, 2: final accuracy
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<job> jobs;
  std::vector<done> ready;
  bool closing = false;
  std::thread evaluator([&] {
    mlp net;
    for (;;) {
      job j;
      {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return !jobs.empty() || closing; });
        if (jobs.empty()) return;
        j = std::move(jobs.front());
        jobs.pop_front();
      }
      if (j.final) {
        const double acc = net.evaluate(j.w, d.test_images, d.test_labels, d.test_count).first;
        std::lock_guard lk(mu);
        ready.push_back({j.t, acc, 0, 2});
        continue;
      }
      double loss = net.evaluate(j.w, d.train_images, d.train_labels, s.eval_train).second;
      if (!std::isfinite(loss)) loss = 1e9;
      {
        std::lock_guard lk(mu);
        ready.push_back({j.t, 0, loss, 0});
      }
      const double acc = net.evaluate(j.w, d.test_images, d.test_labels, s.eval_test).first;
      std::lock_guard lk(mu);
      ready.push_back({j.t, acc, loss, 1});
    }
  });
  auto submit = [&](double at, bool final) {
    const auto p = srv->parameters();
    std::lock_guard lk(mu);
    jobs.push_back({at, std::vector<float>(p.begin(), p.end()), final});
    cv.notify_one();
  };

  std::ofstream curve(s.run_dir + "/curve.txt");
  curve.precision(9);
  std::vector<done> got;
  std::ostringstream results;
  results.precision(9);
  double final_acc = nan_v;
  bool final_taken = false;
  std::uint64_t tick = 0;
  const double grace = 60.0 + 0.25 * s.budget * K;
  for (;;) {
    const double now = mono_now();
    const double next_tick = t0 + static_cast<double>(tick) * period;
    if (now >= next_tick && static_cast<double>(tick) * s.eval_every <= s.budget + 1e-9) {
      submit(static_cast<double>(tick) * period, false);
      ++tick;
      continue;
    }
    if (now >= t_end && !final_taken) {
      submit(s.budget * K, true);
      final_taken = true;
    }
    got.clear();
    {
      std::lock_guard lk(mu);
      got.swap(ready);
    }
    for (const done& e : got) {
      // Stamped with its tick (the instant its parameters were taken), as
      // the simulator stamps its evaluations, not with the evaluation's end.
      const auto tick_at = std::chrono::steady_clock::time_point(
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(t0 + e.t)));
      if (e.kind == 0) {
        srv->report_metric(ashl::metric_id::loss, e.loss, tick_at);
      } else if (e.kind == 1) {
        srv->report_metric(ashl::metric_id::accuracy, e.acc, tick_at);
        curve << e.t << ' ' << e.acc << ' ' << e.loss << std::endl;
        results << "curve " << e.t << ' ' << e.acc << ' ' << e.loss << '\n';
      } else {
        final_acc = e.acc;
      }
    }
    if (final_taken && !std::isnan(final_acc) && srv->all_left()) break;
    if (g_stop.load() || now > t_end + grace) break;
    const double wait = std::min(0.002, std::max(0.0, next_tick - mono_now()));
    srv->run_once(std::chrono::microseconds(static_cast<std::int64_t>(wait * 1e6)));
  }
  {
    std::lock_guard lk(mu);
    closing = true;
    cv.notify_one();
  }
  evaluator.join();
  for (const done& e : ready) {
    if (e.kind == 1) results << "curve " << e.t << ' ' << e.acc << ' ' << e.loss << '\n';
    if (e.kind == 2) final_acc = e.acc;
  }
  results << "final " << final_acc << '\n';
  if (auto a = ps::ashl_summary_of(srv->core().policy())) {
    results << "replans " << a->replans << '\n';
    if (a->stage == ashl::stage_id::shl) results << "switch " << created + a->switched_at - t0 << '\n';
  }
  results << "server " << srv->progress_line() << '\n';
  write_file(s.run_dir + "/server.txt", results.str());
  return 0;
}

inline int run_role(const settings& s) {
  std::signal(SIGTERM, on_terminate);
  std::signal(SIGINT, on_terminate);
  if (s.run_dir.empty() || s.run_policy.empty() || s.port == 0) {
    std::fprintf(stderr, "ashl_experiment_fmnist: --role is internal to --mode real (needs --run-dir, --run-policy, --port)\n");
    return 2;
  }
  return s.role == "server" ? server_role(s) : worker_role(s);
}

// ------------------------------------------------------------- orchestrator

struct child {
  pid_t pid = -1;
  std::string name;
  int status = -1;  // exit code once reaped; 128 + signal when killed
  bool running() const { return pid > 0 && status < 0; }
};

// args[0] is the program's path (this program, or /bin/sh from
// netns_cluster::wrap); ucx_device: UCX_NET_DEVICES of the child.
inline pid_t spawn(const std::vector<std::string>& args, const std::string& log, const std::string& token,
                   const std::string& ucx_device) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  // The child: dies with the orchestrator, logs to its file, and runs this
  // program again in its role.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ::setenv("ASHL_TOKEN", token.c_str(), 1);
  ::setenv("UCX_NET_DEVICES", ucx_device.c_str(), 1);  // loopback, or the emulated host's link only
  // Between emulated hosts only TCP: shared memory would pass by their
  // shaped links (the namespaces share the file system).
  if (ucx_device != "lo") ::setenv("UCX_TLS", "tcp,self", 1);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(argv[0], argv.data());
  ::_exit(127);
}

inline void reap(std::vector<child>& cs) {
  for (auto& c : cs) {
    if (!c.running()) continue;
    int st = 0;
    if (::waitpid(c.pid, &st, WNOHANG) == c.pid)
      c.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  }
}

// Ends every child still running: SIGTERM, then SIGKILL after `patience`.
inline void end_all(std::vector<child>& cs, double patience) {
  reap(cs);
  for (auto& c : cs)
    if (c.running()) ::kill(c.pid, SIGTERM);
  const double until = mono_now() + patience;
  for (;;) {
    reap(cs);
    bool any = false;
    for (auto& c : cs) any = any || c.running();
    if (!any) return;
    if (mono_now() > until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& c : cs)
    if (c.running()) ::kill(c.pid, SIGKILL);
  for (auto& c : cs)
    if (c.running()) {
      int st = 0;
      ::waitpid(c.pid, &st, 0);
      c.status = 128 + SIGKILL;
    }
}

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

inline std::string random_token() {
  std::random_device rd;
  char b[65];
  for (int i = 0; i < 32; ++i) std::snprintf(b + 2 * i, 3, "%02x", rd() & 0xff);
  return std::string(b, 64);
}

// CPU seconds (user + system, all threads) of a process so far.
inline double cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return 0;
  const auto rp = line.rfind(')');
  if (rp == std::string::npos) return 0;
  std::istringstream is(line.substr(rp + 2));
  std::string x;
  unsigned long long ut = 0, st = 0;
  for (int field = 3; field <= 15 && is >> x; ++field) {
    if (field == 14) ut = std::strtoull(x.c_str(), nullptr, 10);
    if (field == 15) st = std::strtoull(x.c_str(), nullptr, 10);
  }
  return static_cast<double>(ut + st) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// The machine's (busy, total) jiffies from /proc/stat (every process, ours
// and everyone else's).
inline std::pair<double, double> machine_jiffies() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  double v[10] = {};
  f >> cpu;
  double total = 0;
  for (int i = 0; i < 10 && f >> v[i]; ++i) total += i < 8 ? v[i] : 0.0;  // guest time is in user already
  return {total - v[3] - v[4], total};
}

// What one worker measured (wall seconds).
struct measured_worker {
  std::vector<double> iteration_s, compress_s;
  double link_bytes = 0, link_seconds = 0;
  std::uint64_t overruns = 0, iterations = 0;
};

struct real_result {
  std::string policy;
  int seed = 0;
  run_outcome o;  // reference seconds: wall / K
  double wall_time_to_target = nan_v;
  double cpu_cores = nan_v, machine_busy = nan_v, overrun_fraction = nan_v;
  ashl::sim::run_result timeline;  // the workers' spans and stats, reference seconds
  std::vector<measured_worker> measured;
  ashl::sim::cluster_spec measured_spec;  // reference units
  run_outcome predicted, reference;
  bool have_prediction = false, have_reference = false;
};

// The cluster the run measured, in reference units: per worker the median
// seconds per iteration at batch 64 and per top-k, and the link's bytes per
// second over every push and pull.
// probed_rate: with --hosts netns, each worker's TCP rate through its tbf
// links measured before the runs (wall bytes/s, probe_link), 0 where none.
inline ashl::sim::cluster_spec measured_cluster(const settings& s, const ashl::sim::cluster_spec& reference,
                                                const std::vector<measured_worker>& m, bool error_feedback,
                                                const std::vector<double>& probed_rate = {}) {
  ashl::sim::cluster_spec spec = reference;
  const double K = s.time_scale;
  for (std::size_t w = 0; w < spec.workers.size() && w < m.size(); ++w) {
    auto& ws = spec.workers[w];
    if (!m[w].iteration_s.empty()) ws.seconds_per_iteration = median(m[w].iteration_s) / K;
    if (!m[w].compress_s.empty()) ws.compress_seconds = median(m[w].compress_s) / K;
    else if (error_feedback) ws.compress_seconds *= s.ef_compress_factor;  // never measured: the reference's
    // With --hosts netns the transfer hides in wait() (no emulated hold to
    // time): the link is the TCP rate probed through its tbf before the runs.
    if (m[w].link_seconds > 0 && s.hosts == "padding") ws.bandwidth_bytes_per_s = m[w].link_bytes / m[w].link_seconds * K;
    if (s.hosts == "netns" && w < probed_rate.size() && probed_rate[w] > 0) ws.bandwidth_bytes_per_s = probed_rate[w] * K;
  }
  return spec;
}

inline bool read_worker(const std::string& path, std::uint32_t w, double K, measured_worker& m,
                        ashl::sim::run_result& tl, std::string& note) {
  std::ifstream f(path);
  if (!f) return false;
  std::string kind;
  auto& st = tl.workers[w];
  while (f >> kind) {
    if (kind == "stats") {
      f >> st.compute_s >> st.compress_s >> st.send_s >> st.wait_s >> st.receive_s >> st.bytes_sent >>
          st.bytes_received >> st.commits >> st.iterations >> st.samples;
      st.compute_s /= K, st.compress_s /= K, st.send_s /= K, st.wait_s /= K, st.receive_s /= K;
      st.alive = true;
    } else if (kind == "overruns") {
      f >> m.overruns >> m.iterations;
    } else if (kind == "iter") {
      double x;
      f >> x;
      m.iteration_s.push_back(x);
    } else if (kind == "compress") {
      double x;
      f >> x;
      m.compress_s.push_back(x);
    } else if (kind == "push" || kind == "pull") {
      double b, x;
      f >> b >> x;
      m.link_bytes += b;
      m.link_seconds += x;
    } else if (kind == "span") {
      std::string what;
      double a, b;
      f >> what >> a >> b;
      ashl::sim::activity act = ashl::sim::activity::compute;
      if (what == "compress") act = ashl::sim::activity::compress;
      else if (what == "send") act = ashl::sim::activity::send;
      else if (what == "wait") act = ashl::sim::activity::wait;
      else if (what == "receive") act = ashl::sim::activity::receive;
      if (tl.trace.size() < 400000) tl.trace.push_back({w, act, a / K, b / K});
    } else if (kind == "error") {
      std::string rest;
      std::getline(f, rest);
      if (note.empty()) note = "worker " + std::to_string(w) + ":" + rest;
    } else {
      std::string rest;
      std::getline(f, rest);
    }
  }
  return true;
}

inline std::string last_line(const std::string& path) {
  std::ifstream f(path);
  std::string line, last;
  while (std::getline(f, line))
    if (!line.empty()) last = line;
  return last;
}

// One policy, one seed, as processes. `self_args`: this program's arguments,
// passed on to the children with their role.
// With `net`, server and workers run in its hosts 0 and 1..9 (their own
// network namespaces, shaped links and CPU quotas) and UCX over TCP between them.
inline real_result run_processes(const settings& s, const std::string& policy, int seed,
                                 const std::vector<std::string>& self_args, std::mutex& io,
                                 const hosts::netns_cluster* net) {
  real_result r;
  r.policy = policy;
  r.seed = seed;
  r.o.policy = policy;
  r.o.seed = seed;
  const double K = s.time_scale;
  const std::string rd = run_dir_of(s, policy, seed);
  std::error_code ec;
  std::filesystem::remove_all(rd, ec);
  std::filesystem::create_directories(rd, ec);
  const std::string token = random_token();
  const std::string server_host = net ? net->address(0) : std::string("127.0.0.1");
  const std::string device = net ? std::string(hosts::netns_cluster::device) : std::string("lo");
  auto args_for = [&](const std::string& role, std::uint32_t rank, int port) {
    std::vector<std::string> a = self_args;
    for (std::string x : {std::string("--role"), role, std::string("--rank"), std::to_string(rank),
                          std::string("--run-dir"), rd, std::string("--run-policy"), policy, std::string("--run-seed"),
                          std::to_string(seed), std::string("--port"), std::to_string(port),
                          std::string("--server-host"), server_host})
      a.push_back(std::move(x));
    if (net) a = net->wrap(role == "server" ? 0 : 1 + rank, std::move(a));
    return a;
  };
  std::vector<child> cs;
  auto give_up = [&](const std::string& why) {
    end_all(cs, 5.0);
    r.o.note = why;
    return r;
  };
  // The server, on a free port (another process may take it between our
  // probe and its listen: then it exits 75 and we try another).
  int port = 0;
  for (int attempt = 0; attempt < 5 && port == 0; ++attempt) {
    const int p = net ? 5000 + attempt : free_port();  // a fresh namespace has every port free
    if (p == 0) continue;
    child c{spawn(args_for("server", 0, p), rd + "/server.log", token, device), "server"};
    if (c.pid < 0) return give_up("fork failed");
    const double deadline = mono_now() + 60.0;
    cs.assign(1, c);
    while (mono_now() < deadline && !file_exists(rd + "/listening")) {
      reap(cs);
      if (!cs[0].running()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (file_exists(rd + "/listening")) port = p;
    else if (cs[0].running()) return give_up("the server did not listen within 60 s (" + rd + "/server.log)");
    else if (cs[0].status != 75) return give_up("the server exited with " + std::to_string(cs[0].status) + " (" + rd + "/server.log)");
  }
  if (port == 0) return give_up("no free port on 127.0.0.1 after 5 tries");
  for (std::uint32_t w = 0; w < workers_n; ++w)
    cs.push_back({spawn(args_for("worker", w, port), rd + "/worker-" + std::to_string(w) + ".log", token, device),
                  "worker " + std::to_string(w)});
  // Every worker joins (and pulls the initial parameters) before the start.
  const double join_deadline = mono_now() + 180.0;
  for (;;) {
    reap(cs);
    for (const auto& c : cs)
      if (!c.running()) return give_up(c.name + " exited with " + std::to_string(c.status) + " before the start (" + rd + ")");
    std::uint32_t ready = 0;
    for (std::uint32_t w = 0; w < workers_n; ++w) ready += file_exists(rd + "/ready-" + std::to_string(w)) ? 1 : 0;
    if (ready == workers_n) break;
    if (mono_now() > join_deadline) return give_up("the workers did not join within 180 s (" + rd + ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double t0 = mono_now() + 0.5;
  {
    char b[64];
    std::snprintf(b, sizeof b, "%.9f\n", t0);
    write_file(rd + "/start", b);
  }
  sleep_until_mono(t0);
  double cpu0 = 0;
  for (const auto& c : cs) cpu0 += cpu_seconds(c.pid);
  const auto m0 = machine_jiffies();
  const double t_end = t0 + s.budget * K, hard = t_end + 60.0 + 0.25 * s.budget * K;
  bool measured_cpu = false;
  const double progress_every = std::max(1.0, std::round(s.budget / 5.0)) * K;
  double next_progress = t0 + progress_every;
  for (;;) {
    reap(cs);
    bool any = false;
    for (const auto& c : cs) any = any || c.running();
    if (!any) break;
    const double now = mono_now();
    if (!measured_cpu && now >= t_end) {
      double cpu1 = 0;
      for (const auto& c : cs) cpu1 += c.running() ? cpu_seconds(c.pid) : 0.0;
      const auto m1 = machine_jiffies();
      r.cpu_cores = (cpu1 - cpu0) / (now - t0);
      r.machine_busy = (m1.second > m0.second) ? (m1.first - m0.first) / (m1.second - m0.second) : nan_v;
      measured_cpu = true;
    }
    if (now >= next_progress && now < t_end) {
      next_progress += progress_every;
      double t = 0, acc = 0, loss = 0;
      std::istringstream is(last_line(rd + "/curve.txt"));
      if (is >> t >> acc >> loss) {
        std::lock_guard lk(io);
        std::printf("[%-10s seed %d]   %5.1f of %.1f s: accuracy %.4f, loss %.4f (wall %.0f s)\n", policy.c_str(),
                    seed, t / K, s.budget, acc, loss, now - t0);
        std::fflush(stdout);
      }
    }
    if (now > hard) {
      end_all(cs, 10.0);
      r.o.note = "processes still running " + std::to_string(static_cast<int>(hard - t0)) + " s after the start were ended";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (const auto& c : cs)
    if (c.status != 0 && r.o.note.empty())
      r.o.note = c.name + " exited with " + std::to_string(c.status) + " (" + rd + ")";

  // What the processes wrote.
  {
    std::ifstream f(rd + "/server.txt");
    std::string kind;
    while (f >> kind) {
      if (kind == "curve") {
        double t, acc, loss;
        f >> t >> acc >> loss;
        r.o.curve.push_back({t / K, acc, loss});
        if (std::isnan(r.wall_time_to_target) && acc >= s.target) r.wall_time_to_target = t;
      } else if (kind == "final") {
        f >> r.o.final_accuracy;
      } else if (kind == "replans") {
        f >> r.o.replans;
      } else if (kind == "switch") {
        f >> r.o.switch_time;
        r.o.switch_time /= K;
      } else {
        std::string rest;
        std::getline(f, rest);
      }
    }
  }
  r.o.time_to_target = r.wall_time_to_target / K;
  r.timeline.workers.assign(workers_n, ashl::sim::worker_stats{});
  r.measured.assign(workers_n, measured_worker{});
  std::uint64_t overruns = 0, iterations = 0;
  for (std::uint32_t w = 0; w < workers_n; ++w) {
    std::string note;
    if (!read_worker(rd + "/worker-" + std::to_string(w) + ".txt", w, K, r.measured[w], r.timeline, note) &&
        r.o.note.empty())
      r.o.note = "worker " + std::to_string(w) + " wrote no results (" + rd + ")";
    if (!note.empty() && r.o.note.empty()) r.o.note = note;
    overruns += r.measured[w].overruns;
    iterations += r.measured[w].iterations;
  }
  r.timeline.end_time = s.budget;
  r.o.bytes_per_worker = r.timeline.mean_bytes_sent();
  r.o.wait_fraction = r.timeline.wait_fraction();
  r.overrun_fraction = iterations ? static_cast<double>(overruns) / static_cast<double>(iterations) : nan_v;
  return r;
}

// Policies ordered by time to target (not reached last); equal times as "=".
inline std::string order_of(std::vector<std::pair<std::string, double>> v) {
  for (auto& p : v)
    if (!std::isfinite(p.second)) p.second = 1e300;
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  std::string out;
  for (std::size_t k = 0; k < v.size(); ++k)
    out += (k == 0 ? "" : v[k].second == v[k - 1].second ? " = " : " < ") + v[k].first;
  return out;
}

// The orders agree when no two policies are strictly ordered one way by the
// real runs and the other way by the simulator (a tie agrees with either).
inline bool orders_agree(const std::vector<std::pair<std::string, double>>& a,
                         const std::vector<std::pair<std::string, double>>& b) {
  auto val = [](double x) { return std::isfinite(x) ? x : 1e300; };
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = 0; j < a.size(); ++j)
      if (val(a[i].second) < val(a[j].second) && val(b[i].second) > val(b[j].second)) return false;
  return true;
}

// The TCP rate (bytes/s) from host `from` to host `to` of the cluster: a
// stream of `bytes` from a thread in one namespace to a thread in the other
// (setns moves only the calling thread), timed by the receiver from the
// connection's acceptance to the end of the stream. What tbf lets a real TCP
// stream through, slow start and queueing included; UCX's TCP transport
// carries the run's messages over such streams.
inline double probe_link(const hosts::netns_cluster& net, std::size_t from, std::size_t to, std::size_t bytes, int port) {
  auto enter = [&](std::size_t k) {
    const int fd = ::open(("/run/netns/" + net.namespace_name(k)).c_str(), O_RDONLY | O_CLOEXEC);
    const bool ok = fd >= 0 && ::setns(fd, CLONE_NEWNET) == 0;
    if (fd >= 0) ::close(fd);
    return ok;
  };
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, net.address(to).c_str(), &a.sin_addr) != 1) return 0;
  std::atomic<int> listening{0};  // 1: listening, -1: failed
  double rate = 0;
  std::thread rx([&] {
    const int ls = enter(to) ? ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
    const int one = 1;
    if (ls < 0 || ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        ::bind(ls, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 1) != 0) {
      if (ls >= 0) ::close(ls);
      listening.store(-1);
      return;
    }
    const timeval patience{30, 0};  // accept and read give up after 30 s (a sender that never came)
    ::setsockopt(ls, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience);
    listening.store(1);
    const int c = ::accept(ls, nullptr, nullptr);
    ::close(ls);
    if (c < 0) return;
    ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience);
    const double t0 = mono_now();
    std::vector<char> buf(1 << 16);
    std::size_t got = 0;
    for (ssize_t k; (k = ::read(c, buf.data(), buf.size())) != 0;) {
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) break;
      got += static_cast<std::size_t>(k);
    }
    const double t1 = mono_now();
    ::close(c);
    if (got == bytes && t1 > t0) rate = static_cast<double>(bytes) / (t1 - t0);
  });
  std::thread tx([&] {
    while (listening.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (listening.load() < 0 || !enter(from)) return;
    const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c < 0) return;
    if (::connect(c, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) {
      std::vector<char> buf(1 << 16, 1);
      for (std::size_t sent = 0; sent < bytes;) {
        const ssize_t k = ::write(c, buf.data(), std::min(buf.size(), bytes - sent));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        sent += static_cast<std::size_t>(k);
      }
    }
    ::close(c);
  });
  tx.join();
  rx.join();
  return rate;
}

// The CPU seconds of one batch-64 step of the MLP here (median of 15); with
// --hosts netns for the record (an iteration's work is netns_share × K × 10 ms
// of CPU, the step and filler passes).
inline double step_seconds(const data_view& d) {
  mlp net;
  std::vector<float> w = mlp::init(7), g(mlp::size()), x(64 * mlp::in);
  std::vector<std::uint8_t> y(64);
  std::vector<double> t;
  for (int k = 0; k < 17; ++k) {
    mlp::to_float(d.train_images + std::size_t{64} * k * mlp::in, 64, x.data());
    std::copy(d.train_labels + 64 * k, d.train_labels + 64 * (k + 1), y.begin());
    const double a = mono_now();
    net.forward_backward(w, x.data(), y.data(), 64, g);
    if (k >= 2) t.push_back(mono_now() - a);
  }
  return median(t);
}

inline int run_real(const settings& s, int argc, char** argv) {
  if (s.hosts == "netns") {
    if (auto st = hosts::netns_cluster::available(); !st) {
      std::fprintf(stderr, "ashl_experiment_fmnist: --hosts netns cannot run here: %s\n", st.message().c_str());
      return 77;
    }
  }
  auto data = fmnist::load(s.data_dir);
  if (!data) {
    std::fprintf(stderr, "ashl_experiment_fmnist: %s\n", data.error().message().c_str());
    return data.error().code() == ashl::errc::not_found ? 77 : 1;
  }
  auto spec = cluster(s);
  if (!spec) {
    std::fprintf(stderr, "ashl_experiment_fmnist: %s\n", spec.error().message().c_str());
    return 1;
  }
  std::error_code ec;
  std::filesystem::create_directories(s.out + "/real", ec);
  if (ec) {
    std::fprintf(stderr, "ashl_experiment_fmnist: --out = \"%s\": %s\n", s.out.c_str(), ec.message().c_str());
    return 1;
  }
  if (auto st = write_data(data_file(s), *data); !st) {
    std::fprintf(stderr, "ashl_experiment_fmnist: %s\n", st.message().c_str());
    return 1;
  }
  std::signal(SIGINT, on_terminate);
  std::signal(SIGTERM, on_terminate);
  const double K = s.time_scale;
  std::printf("# Fashion-MNIST, MLP 784-256-10, real processes: 1 server and 9 workers over UCX on 127.0.0.1 "
              "(%u CPUs), padded to compute 2x/3x/4x of %.0f ms and links 4x/6x/8x of %.0f ms per dense model "
              "(time scale %g), budget %.1f reference s (%.0f wall s) per run, target %.2f, %d seed(s), top-k measured\n",
              std::thread::hardware_concurrency(), reference_compute_s * K * 1e3, reference_comm_s * K * 1e3, K,
              s.budget, s.budget * K, s.target, s.seeds);
  std::printf("# times in reference seconds (wall / %g); predicted: the simulator on the capabilities measured in "
              "the run\n# lr:", K);
  for (const auto& p : s.policies) std::printf(" %s %g", p.c_str(), s.lr_for(p));
  std::printf("\n");
  std::fflush(stdout);

  std::vector<std::string> self_args;
  for (int i = 0; i < argc; ++i) self_args.emplace_back(argv[i]);
  self_args[0] = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) self_args[0] = argv[0];
  std::optional<hosts::netns_cluster> net;
  std::vector<double> probed_rate(workers_n, 0.0);  // --hosts netns: TCP through tbf, wall bytes/s
  if (s.hosts == "netns") {
    auto dv = map_data(data_file(s));
    if (!dv) {
      std::fprintf(stderr, "ashl_experiment_fmnist: %s\n", dv.error().message().c_str());
      return 1;
    }
    const double step = step_seconds(*dv);
    std::vector<hosts::host_spec> hs(1 + workers_n);  // host 0: the server, unshaped and unlimited
    const double model_bytes = 4.0 * static_cast<double>(mlp::size());
    for (std::uint32_t w = 0; w < workers_n; ++w)
      hs[1 + w] = {.rate_bytes_per_s = model_bytes / (comm_factor[w / 3] * reference_comm_s * K),
                   .cpu_share = netns_share / compute_factor[w / 3]};
    auto c = hosts::netns_cluster::create(hs);
    if (!c) {
      std::fprintf(stderr, "ashl_experiment_fmnist: --hosts netns: %s\n", c.error().message().c_str());
      return 1;
    }
    net.emplace(std::move(*c));
    // netns_cluster sets 100 ms periods; a quota stretches work smoothly
    // only when a period is short beside an iteration (netns_period_us).
    for (std::uint32_t w = 0; w < workers_n; ++w) {
      const std::string dir = net->cgroup(1 + w);
      const long quota = std::max<long>(1000, std::lround(hs[1 + w].cpu_share * netns_period_us));
      bool ok;
      if (net->cgroup_version() == 1) {
        ok = static_cast<bool>(std::ofstream(dir + "/cpu.cfs_period_us") << netns_period_us);
        ok = static_cast<bool>(std::ofstream(dir + "/cpu.cfs_quota_us") << quota) && ok;
      } else {
        ok = static_cast<bool>(std::ofstream(dir + "/cpu.max") << quota << ' ' << netns_period_us);
      }
      if (!ok) std::fprintf(stderr, "ashl_experiment_fmnist: %s refused a %ld us period\n", dir.c_str(), netns_period_us);
    }
    // The links as TCP sees them: 4 dense models each way per group, before
    // any run (the prediction's link rate; tbf's own is the emulated one).
    for (std::uint32_t g = 0; g < 3; ++g) {
      const auto bytes = static_cast<std::size_t>(4 * model_bytes);
      const double down = probe_link(*net, 0, 1 + 3 * g, bytes, 6000 + 2 * static_cast<int>(g));
      const double up = probe_link(*net, 1 + 3 * g, 0, bytes, 6001 + 2 * static_cast<int>(g));
      const double r = down > 0 && up > 0 ? 2.0 / (1.0 / down + 1.0 / up) : std::max(down, up);
      for (std::uint32_t w = 3 * g; w < 3 * g + 3; ++w) probed_rate[w] = r;
      std::printf("# --hosts netns: group %u link: tbf %.3f MB/s, TCP through it %.3f MB/s down, %.3f MB/s up (%.1f %% of "
                  "tbf's)\n",
                  g, hs[1 + 3 * g].rate_bytes_per_s / 1e6, down / 1e6, up / 1e6, 100.0 * r / hs[1 + 3 * g].rate_bytes_per_s);
    }
    std::printf("# --hosts netns: each process in its own network namespace (UCX over TCP on %s), links shaped by tbf "
                "to %.2f/%.2f/%.2f MB/s, worker CPU quotas %.3f/%.3f/%.3f cores (%ld us periods) over %.1f ms of CPU "
                "work per iteration (a batch-64 step takes %.1f ms here); no padding\n",
                hosts::netns_cluster::device, hs[1].rate_bytes_per_s / 1e6, hs[4].rate_bytes_per_s / 1e6,
                hs[7].rate_bytes_per_s / 1e6, hs[1].cpu_share, hs[4].cpu_share, hs[7].cpu_share, netns_period_us,
                netns_share * reference_compute_s * K * 1e3, step * 1e3);
  }
  std::vector<real_result> results;
  std::mutex io;
  for (const auto& p : s.policies)
    for (int k = s.first_seed; k < s.first_seed + s.seeds && !g_stop.load(); ++k) {
      {
        std::lock_guard lk(io);
        std::printf("[%-10s seed %d] starting 10 processes\n", p.c_str(), k);
        std::fflush(stdout);
      }
      results.push_back(run_processes(s, p, k, self_args, io, net ? &*net : nullptr));
      const auto& r = results.back();
      std::lock_guard lk(io);
      if (!r.o.note.empty()) std::printf("[%-10s seed %d] error: %s\n", p.c_str(), k, r.o.note.c_str());
      std::printf("[%-10s seed %d] time to %.2f: %s s (wall %s s), final accuracy %.4f, %.1f MB sent per worker, "
                  "wait %.3f, CPU %.2f cores (machine busy %.0f %%), padded iterations overrun %.1f %%",
                  p.c_str(), k, s.target, num_or_null(r.o.time_to_target, "%.2f").c_str(),
                  num_or_null(r.wall_time_to_target, "%.1f").c_str(), r.o.final_accuracy, r.o.bytes_per_worker / 1e6,
                  r.o.wait_fraction, r.cpu_cores, 100.0 * r.machine_busy, 100.0 * r.overrun_fraction);
      if (p == "ashl" || p == "ashl_plus")
        std::printf(", SHL from %s s, %zu re-plans", num_or_null(r.o.switch_time, "%.2f").c_str(), r.o.replans);
      // The compute the run measured: per group, the median wall ms per
      // iteration (batch 64) over its workers' cycles.
      std::printf(", iteration ms");
      for (std::uint32_t g = 0; g < 3; ++g) {
        std::vector<double> it;
        for (std::uint32_t w = 3 * g; w < 3 * g + 3 && w < r.measured.size(); ++w)
          it.insert(it.end(), r.measured[w].iteration_s.begin(), r.measured[w].iteration_s.end());
        std::printf("%s%.1f", g ? "/" : " ", 1e3 * median(it));
      }
      std::printf("\n");
      std::fflush(stdout);
    }

  // The simulator's prediction for what each run measured, and the
  // reference cluster's simulation, `--jobs` at a time (after the real
  // runs: they would compete with them for the CPU).
  struct task {
    std::size_t i;
    bool twin;
  };
  std::vector<task> tasks;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (!results[i].o.note.empty()) continue;
    auto setup = make_setup(results[i].policy, s, *spec);
    results[i].measured_spec =
        measured_cluster(s, *spec, results[i].measured, setup && setup->error_feedback, probed_rate);
    tasks.push_back({i, true});
    if (s.reference_sim) tasks.push_back({i, false});
  }
  std::atomic<std::size_t> next{0};
  auto simulate = [&] {
    for (std::size_t j; (j = next.fetch_add(1)) < tasks.size();) {
      auto& r = results[tasks[j].i];
      const bool trace = r.seed == s.first_seed && r.policy == s.trace_policy;
      if (tasks[j].twin) {
        r.predicted = run_one(r.policy, r.seed, s, *data, r.measured_spec,
                              trace ? s.out + "/trace_sim_" + r.policy + ".json" : "", false);
        r.have_prediction = true;
      } else {
        r.reference = run_one(r.policy, r.seed, s, *data, *spec, "");
        r.have_reference = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < std::min<int>(s.jobs, static_cast<int>(tasks.size())); ++t) pool.emplace_back(simulate);
  for (auto& t : pool) t.join();
  for (const auto& r : results) {
    if (!r.have_prediction) continue;
    const double err = (r.predicted.time_to_target - r.o.time_to_target) / r.o.time_to_target;
    std::printf("[%-10s seed %d] simulator: %s s predicted for the measured capabilities (measured %s s, error %s %%), "
                "final accuracy %.4f; reference cluster %s s\n",
                r.policy.c_str(), r.seed, num_or_null(r.predicted.time_to_target, "%.2f").c_str(),
                num_or_null(r.o.time_to_target, "%.2f").c_str(), num_or_null(100.0 * err, "%+.1f").c_str(),
                r.predicted.final_accuracy,
                r.have_reference ? num_or_null(r.reference.time_to_target, "%.2f").c_str() : "-");
    if (!r.predicted.note.empty()) std::printf("[%-10s seed %d] simulator error: %s\n", r.policy.c_str(), r.seed, r.predicted.note.c_str());
  }
  if (!s.trace_policy.empty())
    for (const auto& r : results)
      if (r.seed == s.first_seed && r.policy == s.trace_policy) {
        std::ofstream t(s.out + "/trace_" + r.policy + ".json");
        ashl::sim::write_chrome_trace(t, r.timeline, "fmnist " + r.policy + " real (wall s / " + num_or_null(K, "%g") + ")");
        std::printf("wrote %s/trace_%s.json (real) and %s/trace_sim_%s.json (simulated twin)\n", s.out.c_str(),
                    r.policy.c_str(), s.out.c_str(), r.policy.c_str());
      }

  bool failed = false;
  std::printf("\n%-11s %16s %15s %18s %14s %12s %12s %8s %13s %9s\n", "policy", "time_to_target_s", "final_accuracy",
              "MB_sent_per_worker", "wait_fraction", "wall_to_tgt_s", "predicted_s", "error", "reference_sim", "cpu_cores");
  std::ostringstream json;
  std::vector<std::pair<std::string, double>> order_real, order_sim;
  for (const auto& p : s.policies) {
    std::vector<double> ttt, wall, pred, ref, acc, pacc, bytes, wait, cpu, busy;
    for (const auto& r : results) {
      if (r.policy != p) continue;
      if (!r.o.note.empty()) failed = true;
      auto inf = [](double x) { return std::isnan(x) ? std::numeric_limits<double>::infinity() : x; };
      ttt.push_back(inf(r.o.time_to_target));
      wall.push_back(inf(r.wall_time_to_target));
      if (r.have_prediction) pred.push_back(inf(r.predicted.time_to_target)), pacc.push_back(r.predicted.final_accuracy);
      if (r.have_reference) ref.push_back(inf(r.reference.time_to_target));
      acc.push_back(r.o.final_accuracy);
      bytes.push_back(r.o.bytes_per_worker);
      wait.push_back(r.o.wait_fraction);
      cpu.push_back(r.cpu_cores);
      busy.push_back(r.machine_busy);
    }
    const double t = median(ttt), pr = median(pred), err = (pr - t) / t;
    order_real.push_back({p, t});
    order_sim.push_back({p, pr});
    std::printf("%-11s %16s %15.4f %18.2f %14.3f %12s %12s %8s %13s %9.2f\n", p.c_str(), num_or_null(t, "%.2f").c_str(),
                median(acc), median(bytes) / 1e6, median(wait), num_or_null(median(wall), "%.1f").c_str(),
                num_or_null(pr, "%.2f").c_str(), num_or_null(100.0 * err, "%+.1f%%").c_str(),
                num_or_null(median(ref), "%.2f").c_str(), median(cpu));
    json << "{\"policy\":\"" << p << "\",\"mode\":\"real\",\"seeds\":" << s.seeds << ",\"target_accuracy\":" << s.target
         << ",\"time_to_target_s\":" << num_or_null(t, "%.4f")
         << ",\"wall_time_to_target_s\":" << num_or_null(median(wall), "%.3f")
         << ",\"predicted_s\":" << num_or_null(pr, "%.4f") << ",\"error\":" << num_or_null(err, "%.4f")
         << ",\"reference_sim_s\":" << num_or_null(median(ref), "%.4f")
         << ",\"final_accuracy\":" << num_or_null(median(acc), "%.5f")
         << ",\"predicted_final_accuracy\":" << num_or_null(median(pacc), "%.5f")
         << ",\"bytes_per_worker\":" << num_or_null(median(bytes), "%.0f")
         << ",\"wait_fraction\":" << num_or_null(median(wait), "%.5f") << ",\"budget_s\":" << s.budget
         << ",\"lr\":" << s.lr_for(p) << ",\"time_scale\":" << K << ",\"cpu_cores\":" << num_or_null(median(cpu), "%.3f")
         << ",\"machine_busy\":" << num_or_null(median(busy), "%.3f") << "}\n";
  }
  const std::string real_order = order_of(order_real), sim_order = order_of(order_sim);
  std::printf("\norder by time to target: real %s; simulator %s: %s\n", real_order.c_str(), sim_order.c_str(),
              orders_agree(order_real, order_sim) ? "agree" : "DIFFER");
  std::printf("\n%s", json.str().c_str());

  const std::string csv = s.out + "/accuracy_vs_time.csv", twin = s.out + "/accuracy_vs_time_sim.csv";
  {
    std::ofstream c(csv), c2(twin);
    c << "policy,seed,time_s,accuracy,loss\n";
    c2 << "policy,seed,time_s,accuracy,loss\n";
    for (const auto& r : results) {
      for (const auto& q : r.o.curve) c << r.policy << ',' << r.seed << ',' << q.t << ',' << q.acc << ',' << q.loss << '\n';
      for (const auto& q : r.predicted.curve)
        c2 << r.policy << ',' << r.seed << ',' << q.t << ',' << q.acc << ',' << q.loss << '\n';
    }
    std::ofstream js(s.out + "/summary.json");
    js << json.str();
  }
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0)
    std::printf("note: gnuplot not found; wrote %s and %s only (apt-get install gnuplot for the PNG)\n", csv.c_str(),
                twin.c_str());
  else if (!plot(s, csv, twin, "reference time (s): wall s / " + num_or_null(K, "%g") + " for real runs", " (real)"))
    std::printf("note: gnuplot failed; wrote %s only\n", csv.c_str());
  else std::printf("wrote %s, %s and %s/accuracy_vs_time.png\n", csv.c_str(), twin.c_str(), s.out.c_str());
  return failed || g_stop.load() ? 1 : 0;
}

}  // namespace real

using real::run_real;
using real::run_role;

}  // namespace fmnist_experiment
