// ashl_experiment_fmnist — the reference experiment (docs/algorithms.md §5):
// Fashion-MNIST, a 784-256-10 MLP, 1 server and 9 workers in three groups.
//
// --mode sim (the default): every policy under the simulator in full mode
// (real gradients in virtual time) through ps::make_policy and the profile
// planners. The server side is ps::server_core (the simulator's): it stores
// each buffered commit's payload, decodes it by codec id and applies
// W += w_i Δ_i; the workers here only train and encode their deltas.
//
// --mode real: the same experiment as 1 server and 9 worker processes over
// UCX on 127.0.0.1, heterogeneity emulated by padding (experiment_real.hpp),
// beside the simulator's prediction for the capabilities measured in the run.
//
//   ashl_experiment_fmnist --mode sim --seeds 3 --budget 30 --target 0.85 --out results
//   ashl_experiment_fmnist --quick
//   ashl_experiment_fmnist --mode real --time-scale 5 --policies bsp,ashl --trace ashl
//
// Prints a progress line per run, a table (median over seeds) and one JSON
// object per policy; writes accuracy-vs-time CSV and, with gnuplot, a PNG.
// docs/perf/time-to-accuracy.md reports a simulated run, docs/perf/real-vs-sim.md
// real ones.
#include "experiment_common.hpp"

#include <ashl/config.hpp>
#if ASHL_HAS_UCX()
#include "experiment_real.hpp"
#endif

#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>

namespace {

using namespace fmnist_experiment;

// --mode sim: every policy and seed in the simulator, `--jobs` at a time.
int run_sim(const settings& s) {
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
  std::filesystem::create_directories(s.out, ec);
  if (ec) {
    std::fprintf(stderr, "ashl_experiment_fmnist: --out = \"%s\": %s\n", s.out.c_str(), ec.message().c_str());
    return 1;
  }
  std::printf("# Fashion-MNIST, MLP 784-256-10, 9 workers (compute 2x/3x/4x, comm 4x/6x/8x of 10 ms / 5 ms), "
              "budget %.1f virtual s, target %.2f, %d seed(s), momentum %.2g, top-k %.3g ms\n",
              s.budget, s.target, s.seeds, s.momentum, s.compress_seconds * 1e3);
  std::printf("# lr:");
  for (const auto& p : s.policies) std::printf(" %s %g", p.c_str(), s.lr_for(p));
  std::printf("\n");
  for (const auto& d : s.slowdowns)
    std::printf("# worker %u becomes %gx slower at %g virtual s\n", d.worker, d.factor, d.at);
  if (s.stragglers > 0.0)
    std::printf("# stragglers: each compute cycle of each worker 5x slower with probability %g (seeded per run)\n",
                s.stragglers);
  std::fflush(stdout);

  struct job {
    std::string policy;
    int seed;
  };
  std::vector<job> jobs;
  for (const auto& p : s.policies)
    for (int k = s.first_seed; k < s.first_seed + s.seeds; ++k) jobs.push_back({p, k});
  std::vector<run_outcome> results(jobs.size());
  std::atomic<std::size_t> next{0};
  std::mutex io;
  // Runs are independent and each is single-threaded and deterministic, so
  // running several at once changes no result.
  auto worker = [&] {
    for (std::size_t j; (j = next.fetch_add(1)) < jobs.size();) {
      const bool trace = jobs[j].seed == s.first_seed && jobs[j].policy == s.trace_policy;
      results[j] = run_one(jobs[j].policy, jobs[j].seed, s, *data, *spec,
                           trace ? s.out + "/trace_" + jobs[j].policy + ".json" : "");
      std::lock_guard<std::mutex> lk(io);
      const auto& r = results[j];
      if (!r.note.empty()) std::printf("[%-10s seed %d] error: %s\n", r.policy.c_str(), r.seed, r.note.c_str());
      else {
        std::printf("[%-10s seed %d] time to %.2f: %s s, final accuracy %.4f, %.1f MB sent per worker, wait %.3f, "
                    "peak sync %.3f MB",
                    r.policy.c_str(), r.seed, s.target, num_or_null(r.time_to_target, "%.2f").c_str(), r.final_accuracy,
                    r.bytes_per_worker / 1e6, r.wait_fraction, r.peak_sync_bytes / 1e6);
        if (r.policy == "ashl" || r.policy == "ashl_plus")
          std::printf(", SHL from %s s, %zu re-plans", num_or_null(r.switch_time, "%.2f").c_str(), r.replans);
        if (!r.detail.empty()) std::printf(", %s", r.detail.c_str());
        std::printf("\n");
      }
      std::fflush(stdout);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < std::min<int>(s.jobs, static_cast<int>(jobs.size())); ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();

  bool failed = false;
  std::printf("\n%-11s %16s %15s %18s %14s\n", "policy", "time_to_target_s", "final_accuracy", "MB_sent_per_worker",
              "wait_fraction");
  std::ostringstream json;
  for (const auto& p : s.policies) {
    std::vector<double> ttt, acc, bytes, wait, peak;
    std::string note;
    for (const auto& r : results) {
      if (r.policy != p) continue;
      if (!r.note.empty()) note = r.note;
      ttt.push_back(std::isnan(r.time_to_target) ? std::numeric_limits<double>::infinity() : r.time_to_target);
      acc.push_back(r.final_accuracy);
      bytes.push_back(r.bytes_per_worker);
      wait.push_back(r.wait_fraction);
      peak.push_back(r.peak_sync_bytes);
    }
    if (!note.empty()) failed = true;
    const double t = median(ttt);
    std::printf("%-11s %16s %15.4f %18.2f %14.3f\n", p.c_str(), num_or_null(t, "%.2f").c_str(), median(acc),
                median(bytes) / 1e6, median(wait));
    json << "{\"policy\":\"" << p << "\",\"seeds\":" << s.seeds << ",\"target_accuracy\":" << s.target
         << ",\"time_to_target_s\":" << num_or_null(t, "%.4f") << ",\"final_accuracy\":" << num_or_null(median(acc), "%.5f")
         << ",\"bytes_per_worker\":" << num_or_null(median(bytes), "%.0f")
         << ",\"wait_fraction\":" << num_or_null(median(wait), "%.5f")
         << ",\"peak_sync_bytes_per_worker\":" << num_or_null(median(peak), "%.0f") << ",\"budget_s\":" << s.budget
         << ",\"lr\":" << s.lr_for(p) << "}\n";
  }
  std::printf("\n%s", json.str().c_str());

  const std::string csv = s.out + "/accuracy_vs_time.csv";
  {
    std::ofstream c(csv);
    c << "policy,seed,time_s,accuracy,loss\n";
    for (const auto& r : results)
      for (const auto& q : r.curve) c << r.policy << ',' << r.seed << ',' << q.t << ',' << q.acc << ',' << q.loss << '\n';
    std::ofstream js(s.out + "/summary.json");
    js << json.str();
  }
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0)
    std::printf("note: gnuplot not found; wrote %s only (apt-get install gnuplot for the PNG)\n", csv.c_str());
  else if (!plot(s, csv)) std::printf("note: gnuplot failed; wrote %s only\n", csv.c_str());
  else std::printf("wrote %s and %s/accuracy_vs_time.png\n", csv.c_str(), s.out.c_str());
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto sp = parse(argc, argv);
  if (!sp) {
    std::fprintf(stderr, "ashl_experiment_fmnist: %s\n", sp.error().message().c_str());
    return 2;
  }
  const settings& s = *sp;
  if (s.mode == "sim" && s.role.empty()) return run_sim(s);
#if ASHL_HAS_UCX()
  if (!s.role.empty()) return fmnist_experiment::run_role(s);
  return fmnist_experiment::run_real(s, argc, argv);
#else
  std::fprintf(stderr, "ashl_experiment_fmnist: --mode real needs the ucx component (UCX and OpenSSL; "
                       "scripts/deps.sh installs them); this build has none\n");
  return 77;
#endif
}
