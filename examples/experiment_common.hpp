// examples/experiment_common.hpp — what both modes of ashl_experiment_fmnist
// share: the settings and their flags, the reference cluster of docs/algorithms.md
// §5, the policies' set-up (ps::make_policy and the profile planners), one
// simulated run in full mode (run_one: real gradients in virtual time, the
// server is ps::server_core), and the CSV and plot writers.
//
//   auto s = fmnist_experiment::parse(argc, argv);                  // result<settings>
//   auto spec = fmnist_experiment::cluster(*s);                     // the reference cluster
//   auto o = fmnist_experiment::run_one("ashl", 1, *s, data, *spec, "");   // one policy, one seed
//
// --mode sim runs run_one for every policy and seed (experiment_fmnist.cpp);
// --mode real (experiment_real.hpp) runs the same policies as processes and
// run_one on the capabilities it measured. docs/perf/time-to-accuracy.md,
// docs/perf/real-vs-sim.md.
#pragma once

#include "fmnist.hpp"
#include "mlp.hpp"

#include <ashl/rules/commit_encoder.hpp>
#include <ashl/rules/compensation.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/rules/streaming.hpp>
#include <ashl/sim/simulator.hpp>
#include <ashl/sim/trace.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace fmnist_experiment {

inline constexpr double nan_v = std::numeric_limits<double>::quiet_NaN();
inline constexpr std::size_t workers_n = 9;

struct settings {
  std::string mode = "sim";
  int seeds = 3;
  std::vector<std::string> policies{"bsp", "asp", "ssp", "local_sgd", "adsp", "semi_async", "dlb", "ashl", "ashl_plus"};
  double budget = 20.0;  // virtual seconds
  double target = 0.85;
  std::string out = "fmnist-results";
  bool quick = false;
  double lr = 0.02;
  // Per-policy learning rates (override lr): each policy's best of the grid
  // {0.005, 0.01, 0.02} (policies that add whole deltas) or {0.02, 0.05,
  // 0.1, 0.2} (policies that average them) by time to 0.85 on seed 11, which
  // the reported seeds 1-3 do not include (docs/perf/time-to-accuracy.md).
  // --lr X sets every policy to X.
  std::map<std::string, double> lr_of{{"bsp", 0.2},  {"asp", 0.005}, {"ssp", 0.02},  {"local_sgd", 0.1},
                                      {"adsp", 0.1}, {"semi_async", 0.005}, {"dlb", 0.1}, {"ashl", 0.1},
                                      {"ashl_plus", 0.05},
                                      // The DiLoCo rows: the inner rate of the rows they vary (local_sgd, ashl).
                                      {"local_sgd8", 0.1}, {"diloco", 0.1}, {"async_diloco", 0.1},
                                      {"ashl_diloco", 0.1}, {"async_diloco_m5", 0.1}, {"ashl_diloco_m5", 0.1},
                                      {"async_diloco_m8", 0.1}, {"async_diloco_lr35", 0.1},
                                      {"async_diloco_sw", 0.1}, {"ashl_diloco_sw", 0.1},
                                      // The seed algorithms' rows: coded BSP (the server's SGD rate) and joint
                                      // tuned by the same rule (coded BSP {0.05, 0.1, 0.2}, joint
                                      // {0.005, 0.01, 0.02, 0.05}); the compensated and straggler rows
                                      // keep the rate of the row they vary, for a like-for-like comparison.
                                      {"coded_bsp1", 0.2}, {"coded_bsp2", 0.2}, {"coded_bsp3", 0.2},
                                      {"coded_bsp1_split", 0.2}, {"coded_bsp2_split", 0.2},
                                      {"coded_bsp3_split", 0.2}, {"ssp_comp", 0.02},
                                      {"asp_comp", 0.005}, {"joint", 0.005}, {"dlb_straggler", 0.1},
                                      // The streaming rows keep Local SGD's rate.
                                      {"streaming8", 0.1}, {"streaming8_a0", 0.1},
                                      {"streaming8_t0", 0.1}, {"diloco8", 0.1}, {"streaming_diloco8", 0.1},
                                      {"streaming_diloco8_4bit", 0.1}, {"streaming_diloco8_4bit_2way", 0.1}};
  int first_seed = 1;
  double momentum = 0.9;
  double eval_every = 0.25;
  std::size_t eval_test = 2000;   // test images for the periodic accuracy
  std::size_t eval_train = 1000;  // training images for the periodic loss
  double ratio = 0.1;             // top-k r0 for ASHL
  // The reference worker's time to top-k one dense update (r = 0.1, 203,530
  // f32): 10 % of its 10 ms iteration, the ratio measured on this machine
  // (1.56 ms top-k vs 15.6 ms for a batch-64 MLP step); error feedback's two
  // extra passes cost another 32 % (2.06 ms).
  double compress_seconds = 0.001;
  double ef_compress_factor = 1.32;
  double drift = 0.2;             // ASHL+ re-plans when a smoothed time drifts by this fraction
  bool replan = true;             // --no-replan: ASHL+ without re-planning (an ablation)
  struct slowdown {
    std::uint32_t worker;
    double at, factor;
  };
  std::vector<slowdown> slowdowns;
  // The straggler scenario (docs/seed-algorithms.md): each compute cycle of each worker runs
  // 5x slower with this probability, drawn from the run's seed (0: steady).
  double stragglers = 0.0;
  int jobs = 2;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string trace_policy;       // write a Chrome trace of this policy's first seed
  // --mode real (experiment_real.hpp): reference time runs K times slower in
  // wall time: base_compute = K x 10 ms, base_comm = K x 5 ms, and the budget
  // and the evaluation period are reference seconds x K.
  double time_scale = 5.0;
  std::string hosts = "padding";  // real mode: padding (sleeps, emulated link) or netns
  bool reference_sim = true;      // real mode: also run the reference cluster in the simulator
  // Internal flags of the processes real mode starts (--role server|worker).
  std::string role;
  std::uint32_t rank = 0;
  std::string run_dir, run_policy, server_host = "127.0.0.1";
  int run_seed = 1;
  int port = 0;

  [[nodiscard]] double lr_for(const std::string& policy) const {
    const auto it = lr_of.find(policy);
    return it == lr_of.end() ? lr : it->second;
  }
};

// The library's policy names (ps::policies, listed once there) and this
// experiment's variants (make_setup): "ashl_plus" (ASHL with the profile
// re-planner and error feedback), and the seed algorithms' rows (docs/seed-algorithms.md), which exist in --mode
// sim only (their workers do what run_one's hooks do): "coded_bsp1" and
// "coded_bsp2" (coded_bsp with r = 1, 2; workers commit coded gradients to a
// server-side SGD), "ssp_comp" and "asp_comp" (SSP(3) and ASP with staleness
// compensation) and "dlb_straggler" (DLB with straggler-triggered
// re-planning). Its "joint" row is the library's joint policy (make_setup
// sets its fields).
// "coded_bsp3" (r = 3) and the "_split" rows: the worker's 64 samples are
// split over its r + 1 partitions (64 / (r + 1) each), so a round costs the
// compute of a BSP round instead of r + 1 times it.
// Streaming DiLoCo's rows (docs/perf/diloco-streaming.md), plain averaging
// (outer lr 1, no momentum): "local_sgd8" is Local SGD with H = 8, whole
// model per sync; "streaming8" the same H in P = 4 fragments (the servers'
// fragment cores, rules/streaming.hpp), each merged τ = 2 steps after its
// sync with α = 0.5; "streaming8_a0" the same with α = 0 (the servers'
// value replaces the local one); "streaming8_t0" τ = 0, α = 0 (fragments
// without overlap: each merge waits for its own sync's reply); "diloco8"
// DiLoCo with H = 8 (outer Nesterov, lr 0.7, momentum 0.9) and
// "streaming_diloco8" the same outer optimizer per fragment with
// streaming8's fragments; "streaming_diloco8_4bit" the same with 4-bit
// block-quantized pseudo-gradients (B = 64, error feedback: the servers'
// compression_ratio makes DiLoCo's dense plans commit with the block codec);
// "streaming_diloco8_4bit_2way" also compresses the pull replies to 4 bits
// (server_setup::replies: each worker's view, error feedback).
inline constexpr std::string_view sim_variants[] = {"coded_bsp1",       "coded_bsp2",       "coded_bsp3",
                                                    "coded_bsp1_split", "coded_bsp2_split", "coded_bsp3_split",
                                                    "ssp_comp",         "asp_comp",         "dlb_straggler",
                                                    "local_sgd8",       "async_diloco_m5",  "ashl_diloco_m5",
                                                    "streaming8",       "streaming8_a0",    "streaming8_t0",
                                                    "diloco8",          "streaming_diloco8",
                                                    "streaming_diloco8_4bit", "streaming_diloco8_4bit_2way",
                                                    "async_diloco_m8",
                                                    "async_diloco_lr35",      "async_diloco_sw",
                                                    "ashl_diloco_sw"};
inline bool sim_only_policy(std::string_view name) {
  return std::find(std::begin(sim_variants), std::end(sim_variants), name) != std::end(sim_variants);
}
inline bool known_policy(std::string_view name) {
  return name == "ashl_plus" || sim_only_policy(name) || ashl::ps::policy_kind_of(name).has_value();
}
inline std::string known_policies_text() {
  std::string t = ashl::ps::policy_names_text() + " ashl_plus";
  for (const auto v : sim_variants) {
    t += ' ';
    t += v;
  }
  return t;
}

inline void usage() {
  std::printf(
      "usage: ashl_experiment_fmnist [--mode sim|real] [--seeds N] [--policies a,b,...] [--budget S]\n"
      "                              [--target A] [--out DIR] [--quick] [--jobs J] [--lr X]\n"
      "                              [--eval-every S] [--data DIR] [--trace POLICY]\n"
      "                              [--compress-seconds S] [--slowdown W,AT,F] [--first-seed K]\n"
      "                              [--help]\n"
      "policies: %s (default: all but dssp)\n"
      "  --budget S    virtual seconds per run (default 20)\n"
      "  --target A    test accuracy to reach, in (0, 1] (default 0.85)\n"
      "  --lr X        learning rate of every policy; or per policy on top of the defaults:\n"
      "                --lr bsp=0.05,asp=0.02 (defaults, tuned on seed 11: bsp 0.2, asp 0.005,\n"
      "                ssp 0.02, local_sgd 0.1, adsp 0.1, semi_async 0.005, dlb 0.1, ashl 0.1,\n"
      "                ashl_plus 0.05; coded_bsp1 0.2, coded_bsp2 0.2, ssp_comp 0.02, asp_comp 0.005,\n"
      "                joint 0.005, dlb_straggler 0.1)\n"
      "  --first-seed K  seeds K .. K+N-1 (default 1)\n"
      "  --quick       a small run for tests: 1 seed, bsp,asp,ashl,ashl_plus, 1 virtual second\n"
      "  --compress-seconds S  reference worker's time to top-k one update (default 0.001; 0: free)\n"
      "  --slowdown W,AT,F     worker W (0-8) becomes F times slower at virtual time AT (repeatable)\n"
      "  --no-replan           ASHL+ keeps error feedback but plans once (ablation)\n"
      "  --stragglers P        each compute cycle of each worker is 5x slower with probability P\n"
      "                        (seeded per run; default 0)\n"
      "  the seed algorithms' rows (not in the default list; all but joint sim only; docs/perf/time-to-accuracy.md):\n"
      "    coded_bsp1, coded_bsp2, coded_bsp3  coded BSP, r = 1, 2, 3 (workers commit coded gradients;\n"
      "                            server SGD; r + 1 batches of 64 per round)\n"
      "    coded_bspR_split        the same, the worker's 64 samples split over its r + 1 partitions\n"
      "    ssp_comp, asp_comp      SSP(3), ASP with staleness compensation (W - tau*lr*v on each pull)\n"
      "    joint                   the joint (batch, staleness) controller\n"
      "    dlb_straggler           DLB with straggler-triggered re-planning\n"
      "real mode (1 server and 9 worker processes over UCX on 127.0.0.1; docs/perf/real-vs-sim.md):\n"
      "  --mode real           default policies bsp,adsp,ashl,ashl_plus, 1 seed; --quick: bsp,ashl, 2 s\n"
      "  --time-scale K        wall seconds per reference second (default 5: an iteration of the\n"
      "                        reference worker is padded to 50 ms, its dense transfer to 25 ms)\n"
      "  --hosts padding|netns padding: sleeps and an emulated link (default); netns: a network\n"
      "                        namespace, tbf link and cgroup CPU quota per process (root)\n"
      "  --no-reference-sim    skip the reference cluster's simulation beside the real run\n",
      known_policies_text().c_str());
}

inline ashl::status bad(const char* field, const std::string& v, const char* why) { return ashl::invalid_argument(field, v, why); }

inline ashl::result<settings> parse(int argc, char** argv) {
  settings s;
  bool policies_given = false, budget_given = false, seeds_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](const char* f) -> ashl::result<std::string> {
      if (i + 1 >= argc) return bad(f, "", "needs a value");
      return std::string(argv[++i]);
    };
    auto num = [&](const char* f, double& out) -> ashl::status {
      auto v = next(f);
      if (!v) return v.error();
      char* end = nullptr;
      out = std::strtod(v->c_str(), &end);
      if (end == v->c_str() || *end) return bad(f, *v, "must be a number");
      return {};
    };
    if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else if (a == "--mode") {
      auto v = next("--mode");
      if (!v) return v.error();
      if (*v != "sim" && *v != "real") return bad("--mode", *v, "must be sim or real");
      s.mode = *v;
    } else if (a == "--seeds") {
      double v;
      ASHL_TRY(num("--seeds", v));
      if (!(v >= 1 && v <= 100 && v == std::floor(v))) return ashl::invalid_argument("--seeds", v, "must be an integer in [1, 100]");
      s.seeds = static_cast<int>(v);
      seeds_given = true;
    } else if (a == "--policies") {
      auto v = next("--policies");
      if (!v) return v.error();
      s.policies.clear();
      std::stringstream ss(*v);
      std::string p;
      while (std::getline(ss, p, ',')) {
        if (!known_policy(p)) return bad("--policies", p, ("unknown policy (" + known_policies_text() + ")").c_str());
        s.policies.push_back(p);
      }
      if (s.policies.empty()) return bad("--policies", *v, "must name at least one policy");
      policies_given = true;
    } else if (a == "--budget") {
      ASHL_TRY(num("--budget", s.budget));
      if (!(s.budget > 0.0) || !std::isfinite(s.budget)) return ashl::invalid_argument("--budget", s.budget, "must be > 0");
      budget_given = true;
    } else if (a == "--target") {
      ASHL_TRY(num("--target", s.target));
      if (!(s.target > 0.0 && s.target <= 1.0)) return ashl::invalid_argument("--target", s.target, "must be in (0, 1]");
    } else if (a == "--lr") {
      if (i + 1 < argc && std::strchr(argv[i + 1], '=') != nullptr) {
        std::stringstream ss(argv[++i]);
        std::string item;
        while (std::getline(ss, item, ',')) {
          const auto eq = item.find('=');
          const std::string name = item.substr(0, eq == std::string::npos ? item.size() : eq);
          if (!known_policy(name) || eq == std::string::npos) return bad("--lr", item, "must be POLICY=RATE with a known policy");
          char* end = nullptr;
          const double v = std::strtod(item.c_str() + eq + 1, &end);
          if (end == item.c_str() + eq + 1 || *end) return bad("--lr", item, "the rate must be a number");
          if (!(v > 0.0 && v < 10.0)) return ashl::invalid_argument("--lr." + name, v, "must be in (0, 10)");
          s.lr_of[name] = v;
        }
      } else {
        ASHL_TRY(num("--lr", s.lr));
        if (!(s.lr > 0.0 && s.lr < 10.0)) return ashl::invalid_argument("--lr", s.lr, "must be in (0, 10)");
        s.lr_of.clear();
      }
    } else if (a == "--first-seed") {
      double v;
      ASHL_TRY(num("--first-seed", v));
      if (!(v >= 1 && v <= 1e6 && v == std::floor(v))) return ashl::invalid_argument("--first-seed", v, "must be an integer in [1, 1000000]");
      s.first_seed = static_cast<int>(v);
    } else if (a == "--eval-every") {
      ASHL_TRY(num("--eval-every", s.eval_every));
      if (!(s.eval_every > 0.0)) return ashl::invalid_argument("--eval-every", s.eval_every, "must be > 0");
    } else if (a == "--jobs") {
      double v;
      ASHL_TRY(num("--jobs", v));
      if (!(v >= 1 && v <= 64)) return ashl::invalid_argument("--jobs", v, "must be in [1, 64]");
      s.jobs = static_cast<int>(v);
    } else if (a == "--out") {
      auto v = next("--out");
      if (!v) return v.error();
      s.out = *v;
    } else if (a == "--data") {
      auto v = next("--data");
      if (!v) return v.error();
      s.data_dir = *v;
    } else if (a == "--trace") {
      auto v = next("--trace");
      if (!v) return v.error();
      s.trace_policy = *v;
    } else if (a == "--compress-seconds") {
      ASHL_TRY(num("--compress-seconds", s.compress_seconds));
      if (!(s.compress_seconds >= 0.0 && s.compress_seconds < 10.0))
        return ashl::invalid_argument("--compress-seconds", s.compress_seconds, "must be in [0, 10)");
    } else if (a == "--slowdown") {
      auto v = next("--slowdown");
      if (!v) return v.error();
      double w = 0, at = 0, f = 0;
      char tail = 0;
      if (std::sscanf(v->c_str(), "%lf,%lf,%lf%c", &w, &at, &f, &tail) != 3)
        return bad("--slowdown", *v, "must be WORKER,AT,FACTOR (e.g. 0,5,3)");
      if (!(w >= 0 && w < static_cast<double>(workers_n) && w == std::floor(w)))
        return ashl::invalid_argument("--slowdown.worker", w, "must be an integer in [0, 8]");
      if (!(at >= 0.0 && std::isfinite(at))) return ashl::invalid_argument("--slowdown.at", at, "must be >= 0");
      if (!(f > 0.0 && std::isfinite(f))) return ashl::invalid_argument("--slowdown.factor", f, "must be > 0");
      s.slowdowns.push_back({static_cast<std::uint32_t>(w), at, f});
    } else if (a == "--stragglers") {
      ASHL_TRY(num("--stragglers", s.stragglers));
      if (!(s.stragglers >= 0.0 && s.stragglers <= 1.0))
        return ashl::invalid_argument("--stragglers", s.stragglers, "must be in [0, 1]");
    } else if (a == "--no-replan") {
      s.replan = false;
    } else if (a == "--quick") {
      s.quick = true;
    } else if (a == "--time-scale") {
      ASHL_TRY(num("--time-scale", s.time_scale));
      if (!(s.time_scale >= 0.5 && s.time_scale <= 100.0))
        return ashl::invalid_argument("--time-scale", s.time_scale, "must be in [0.5, 100]");
    } else if (a == "--hosts") {
      auto v = next("--hosts");
      if (!v) return v.error();
      if (*v != "padding" && *v != "netns") return bad("--hosts", *v, "must be padding or netns");
      s.hosts = *v;
    } else if (a == "--no-reference-sim") {
      s.reference_sim = false;
    } else if (a == "--role") {  // internal: a process of a real run
      auto v = next("--role");
      if (!v) return v.error();
      if (*v != "server" && *v != "worker") return bad("--role", *v, "must be server or worker");
      s.role = *v;
    } else if (a == "--rank") {
      double v;
      ASHL_TRY(num("--rank", v));
      if (!(v >= 0 && v < static_cast<double>(workers_n) && v == std::floor(v)))
        return ashl::invalid_argument("--rank", v, "must be an integer in [0, 8]");
      s.rank = static_cast<std::uint32_t>(v);
    } else if (a == "--run-dir") {
      auto v = next("--run-dir");
      if (!v) return v.error();
      s.run_dir = *v;
    } else if (a == "--run-policy") {
      auto v = next("--run-policy");
      if (!v) return v.error();
      if (!known_policy(*v)) return bad("--run-policy", *v, "unknown policy");
      s.run_policy = *v;
    } else if (a == "--run-seed") {
      double v;
      ASHL_TRY(num("--run-seed", v));
      s.run_seed = static_cast<int>(v);
    } else if (a == "--server-host") {
      auto v = next("--server-host");
      if (!v) return v.error();
      s.server_host = *v;
    } else if (a == "--port") {
      double v;
      ASHL_TRY(num("--port", v));
      if (!(v >= 1 && v <= 65535)) return ashl::invalid_argument("--port", v, "must be in [1, 65535]");
      s.port = static_cast<int>(v);
    } else {
      return bad("argument", a, "unknown (see --help)");
    }
  }
  if (s.mode == "real") {
    // Real runs take budget x K wall seconds each: one seed and the four
    // policies of the README's main job unless told otherwise.
    if (!policies_given) s.policies = {"bsp", "adsp", "ashl", "ashl_plus"};
    if (!seeds_given) s.seeds = 1;
  }
  if (s.quick) {
    if (!policies_given) s.policies = s.mode == "real" ? std::vector<std::string>{"bsp", "ashl"}
                                                       : std::vector<std::string>{"bsp", "asp", "ashl", "ashl_plus"};
    if (!budget_given) s.budget = s.mode == "real" ? 2.0 : 1.0;
    if (!seeds_given) s.seeds = 1;
    s.eval_test = 500;
    s.eval_train = 250;
  }
  if (s.mode == "real")
    for (const auto& p : s.policies)
      if (sim_only_policy(p)) return bad("--policies", p, "is a --mode sim row (its workers are run_one's hooks)");
  if (s.eval_every > s.budget) return ashl::invalid_argument("--eval-every", s.eval_every, "must be <= --budget");
  return s;
}

// The cluster of docs/algorithms.md §5: the reference worker computes one batch-64
// iteration in 10 ms and moves the dense model in 5 ms; groups of three are
// (compute, comm) = (2×, 4×), (3×, 6×), (4×, 8×) slower. Built in code: only
// a JSON spec file needs nlohmann_json.
inline ashl::result<ashl::sim::cluster_spec> cluster(const settings& s) {
  ashl::sim::cluster_spec spec;
  spec.reference_seconds_per_iteration = 0.01;
  spec.reference_batch = 64;
  spec.reference_compress_seconds = s.compress_seconds;
  spec.model_bytes = 4 * std::uint64_t{mlp::size()};
  const double ref_bytes_per_s = static_cast<double>(spec.model_bytes) / 0.005;
  const double comp[3] = {2, 3, 4}, comm[3] = {4, 6, 8};
  for (int g = 0; g < 3; ++g) {
    ashl::sim::worker_spec w;
    w.seconds_per_iteration = spec.reference_seconds_per_iteration * comp[g];
    // A codec runs on the worker's processor: it scales like its compute.
    w.compress_seconds = spec.reference_compress_seconds * comp[g];
    w.batch = spec.reference_batch;
    w.bandwidth_bytes_per_s = ref_bytes_per_s / comm[g];
    for (int k = 0; k < 3; ++k) spec.workers.push_back(w);
  }
  for (const auto& d : s.slowdowns)
    spec.changes.push_back({.at = d.at, .worker = d.worker, .kind = ashl::sim::change_kind::slowdown, .factor = d.factor});
  spec.stragglers = {.probability = s.stragglers, .factor = 5.0};
  ASHL_TRY(ashl::sim::validate(spec));
  return spec;
}

struct point {
  double t, acc, loss;
};

struct run_outcome {
  std::string policy;
  int seed = 0;
  double time_to_target = nan_v;
  double final_accuracy = 0.0;
  double bytes_per_worker = 0.0;
  double wait_fraction = 0.0;
  double peak_sync_bytes = 0.0;  // per worker, mean: the most bytes one sync (commit + reply) moved
  std::size_t replans = 0;  // ASHL+: plans the re-planner made
  std::string detail;       // the seed algorithms' rows: what the policy did (late commits, flags, bound)
  double switch_time = nan_v;  // ASHL: when AHL switched to SHL
  std::string note;
  std::vector<point> curve;
};

inline std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct policy_setup {
  ashl::sync::any_policy policy;
  bool error_feedback = false;
  // coded_bsp rows: workers commit Σ_j B[i][j]·g_j (gradients at the pulled
  // W, 64 samples of partition j each) and the server takes the SGD step.
  bool coded = false;
  bool compensate = false;  // ssp_comp, asp_comp: W − τ·η·v on every pull
  // The servers' optimizer: model_delta, or a DiLoCo name's outer optimizer
  // (ps::outer_optimizer_of).
  ashl::ps::optimizer_params optimizer{};
  std::optional<ashl::ps::streaming_params> streaming;  // streaming rows: the servers' fragments
  // The servers' codec for compressing plans, its options, and the ratio
  // that makes the plans a policy leaves dense compress (4-bit rows).
  ashl::codec_id compression = ashl::codec_id::topk;
  ashl::codec_options compression_options{};
  float compression_ratio = 1.0f;
  ashl::ps::reply_compression replies{};  // the servers' pull replies (_2way rows: 4-bit)
};

// time_scale: wall seconds per reference second (real mode's K): the
// policy's own durations (ADSP's period, a barrier or profile in seconds)
// stretch with it, since a real server's policy reads wall time.
inline ashl::result<policy_setup> make_setup(const std::string& name, const settings& s, const ashl::sim::cluster_spec& spec,
                                             double time_scale = 1.0) {
  ashl::ps::policy_params pp;
  pp.workers = static_cast<std::int64_t>(spec.workers.size());
  policy_setup out;
  std::string base = name;
  if (name == "ssp") pp.staleness = 3;
  if (name == "local_sgd") pp.local_steps = 2;
  // The DiLoCo rows (docs/perf/diloco.md): 8 inner steps per commit (4x
  // fewer commits than local_sgd's 2), DiLoCo's outer Nesterov (lr 0.7,
  // μ 0.9); local_sgd8 is their plain-averaging baseline at the same H.
  if (name == "local_sgd8") {
    base = "local_sgd";
    pp.local_steps = 8;
  }
  if (name == "diloco" || name == "async_diloco") pp.local_steps = 8;
  // async_diloco_m5: the asynchronous form with outer momentum 0.5 (the
  // paper's 0.9 is tuned for synchronous rounds).
  if (name == "async_diloco_m5") {
    base = "async_diloco";
    pp.local_steps = 8;
    pp.outer_momentum = 0.5;
  }
  // Why the asynchronous form diverges at μ 0.9 (docs/perf/diloco.md
  // "Stability of the asynchronous form"): μ 0.8 (_m8); half the outer rate
  // (_lr35: 0.35, μ 0.9); μ 0.9 with each pseudo-gradient weighed by
  // (1 + τ)^-1/2, τ its staleness in commits (_sw).
  if (name == "async_diloco_m8" || name == "async_diloco_lr35" || name == "async_diloco_sw") {
    base = "async_diloco";
    pp.local_steps = 8;
    if (name == "async_diloco_m8") pp.outer_momentum = 0.8;
    if (name == "async_diloco_lr35") pp.outer_lr = 0.35;
    if (name == "async_diloco_sw") {
      pp.staleness_weight = "power";
      pp.staleness_exponent = 0.5;
    }
  }
  // The Streaming DiLoCo rows (docs/perf/diloco-streaming.md): H = 8 in
  // P = 4 fragments, merged τ = 2 steps later with α = 0.5 (streaming8; _a0:
  // α = 0, _t0: τ = 0, no overlap); diloco8 and streaming_diloco8 with
  // DiLoCo's outer Nesterov per fragment (the optimizer follows the base name).
  if (name == "diloco8" || name.rfind("streaming_diloco8", 0) == 0) {
    base = "diloco";
    pp.local_steps = 8;
    if (name != "diloco8")
      out.streaming = ashl::ps::streaming_params{.fragments = 4, .interval = 8, .delay = 2, .alpha = 0.5};
    if (name.rfind("streaming_diloco8_4bit", 0) == 0) {
      out.compression = ashl::codec_id::block;
      out.compression_options = {.bits = 4, .block = 64};
      out.compression_ratio = 0.125f;  // 4 of 32 bits (the block scales aside)
      out.error_feedback = true;
    }
    if (name == "streaming_diloco8_4bit_2way")
      out.replies = {.codec = ashl::codec_id::block, .options = {.bits = 4, .block = 64}};
  }
  if (name.rfind("streaming8", 0) == 0) {
    base = "local_sgd";
    pp.local_steps = 8;
    out.streaming = ashl::ps::streaming_params{.fragments = 4,
                                               .interval = 8,
                                               .delay = name == "streaming8_t0" ? 0u : 2u,
                                               .alpha = name == "streaming8" ? 0.5 : 0.0};
  }
  if (name == "adsp") {
    // Scaled to runs of tens of seconds: period Γ = 1 s (60 s in the paper).
    pp.period = 1.0;
    pp.search_every = 1000.0;
    pp.target_loss = 0.4;
    pp.initial_commit_rate = 1;
  }
  if (name == "semi_async") pp.sync_every_iterations = 8;
  if (name.rfind("coded_bsp", 0) == 0 && name.size() >= 10) {
    // r + 1 partitions of 64 samples per worker per round: the plan's batch
    // makes the simulator charge r + 1 batches of compute. _split: 64 in
    // all, 64 / (r + 1) per partition, the compute of a BSP round.
    base = "coded_bsp";
    pp.stragglers = name[9] - '0';
    const bool split = name.size() > 10;
    pp.batch_size = split ? 64 : 64 * (pp.stragglers + 1);
    out.coded = true;
  }
  if (name == "ssp_comp") {
    base = "ssp";
    pp.staleness = 3;
    out.compensate = true;
  }
  if (name == "asp_comp") {
    base = "asp";
    out.compensate = true;
  }
  if (name == "joint") {
    // Batches 16..128 in steps of 16 around the reference 64, bound in
    // [1, 5] around SSP's 3; horizon, λ, drift and half-life the defaults.
    pp.s_min = 1;
    pp.s_max = 5;
    pp.min_batch = 16;
    pp.max_batch = 128;
    pp.batch_step = 16;
    pp.horizon = 10.0;
    pp.staleness_cost = 0.02;
    pp.replan_drift = 0.2;
    pp.speed_half_life = 8;
  }
  if (name == "dlb_straggler") {
    base = "dlb";
    pp.straggler_replan = true;  // window 8, threshold 0.5, 2 consecutive windows (defaults)
  }
  if (base == "dlb") {
    // Batches b_i = B v_i / Σv from the measured throughput (EWMA), B = 64 per
    // worker, at least 8; the rounds weigh each commit by its samples.
    pp.total_batch = 64 * pp.workers;
    pp.min_batch = 8;
  }
  if (name == "ashl" || name == "ashl_plus" || name == "ashl_diloco" || name == "ashl_diloco_m5" ||
      name == "ashl_diloco_sw") {
    // Algorithms 1 and 2 on the per-worker trimmed means of the 5 profiling
    // commits (2 off each end), T_compress measured.
    if (name.rfind("ashl_diloco", 0) != 0) base = "ashl";
    else out.error_feedback = true;  // top-k pseudo-gradients keep their residual
    if (name == "ashl_diloco_m5") {
      base = "ashl_diloco";
      pp.outer_momentum = 0.5;
    }
    // ashl_diloco_sw: μ 0.9 with the AHL stage's pseudo-gradients weighed
    // by (1 + τ)^-1/2 (as async_diloco_sw).
    if (name == "ashl_diloco_sw") {
      base = "ashl_diloco";
      pp.staleness_weight = "power";
      pp.staleness_exponent = 0.5;
    }
    pp.profile_iterations = 5;
    pp.h_ahl = 8;
    pp.h_shl = 2;
    pp.shl_staleness = 3;
    pp.compression_ratio = s.ratio;
    pp.switch_loss = 0.5;  // scaled for Fashion-MNIST (0.3 on CIFAR-10 in the paper)
    pp.planner = "profile";
    pp.profile_trim = 2;
    if (name == "ashl_plus") {
      // ASHL+: error feedback on the top-k residual and online re-planning.
      if (s.replan) {
        pp.replanner = "profile";
        pp.replan_drift = s.drift;
        pp.replan_half_life = 8;
      }
      out.error_feedback = true;
    }
  }
  pp.period *= time_scale;
  pp.t_min *= time_scale;
  pp.search_every *= time_scale;
  pp.sync_every_seconds *= time_scale;
  pp.profile_seconds *= time_scale;
  auto p = ashl::ps::make_policy(base, pp);
  if (!p) return p.error();
  out.policy = std::move(*p);
  auto opt = ashl::ps::outer_optimizer_of(base, pp);
  if (!opt) return opt.error();
  out.optimizer = *opt;
  return out;
}

// One run: a policy, a seed, the full budget.
//
// trace_file: write the run's Chrome trace there (empty: none). ef_factor:
// scale the workers' compress time by settings.ef_compress_factor when the
// policy uses error feedback (false for a spec whose compress times were
// measured with it, as the real run's twin is).
inline run_outcome run_one(const std::string& name, int seed, const settings& s, const fmnist::dataset& d,
                    const ashl::sim::cluster_spec& spec0, const std::string& trace_file, bool ef_factor = true) {
  run_outcome o;
  o.policy = name;
  o.seed = seed;
  ashl::sim::cluster_spec spec = spec0;
  spec.seed = static_cast<std::uint64_t>(seed);
  auto setup = make_setup(name, s, spec);
  if (!setup) {
    o.note = setup.error().message();
    return o;
  }
  if (setup->error_feedback && ef_factor)
    for (auto& w : spec.workers) w.compress_seconds *= s.ef_compress_factor;
  const std::size_t n = mlp::size(), m = spec.workers.size();
  mlp net;
  const std::vector<float> W0 = mlp::init(1000 + static_cast<std::uint64_t>(seed));
  struct worker_state {
    std::vector<float> w, base, v, grad, delta, snapshot;
    ashl::ps::commit_encoder enc;  // the plan's codec; ASHL+: the residual of what top-k dropped
    std::uint64_t step = 0;
  };
  std::vector<worker_state> ws(m);
  for (auto& x : ws) {
    x.enc = ashl::ps::commit_encoder({.error_feedback = setup->error_feedback});
    x.w = W0;
    x.base = W0;
    x.v.assign(n, 0.0f);
    x.grad.assign(n, 0.0f);
    x.delta.assign(n, 0.0f);
    x.snapshot = W0;
  }
  std::vector<float> xb;
  std::vector<std::uint8_t> yb;
  const bool coded = setup->coded, compensated = setup->compensate;
  const double lr_policy = s.lr_for(name);
  const std::uint64_t rng_seed = mix(static_cast<std::uint64_t>(seed) * 7919 + 17);

  // Workers: local SGD with momentum from the last pulled model, then the
  // model delta Δ = w − w(pulled), one shard per server: identity (dense) or
  // top-k at the plan's ratio (with error feedback for ASHL+). The server
  // (ps::server_core) applies W += weight · Δ as the policy says.
  ashl::sim::hooks h;
  const ashl::sim::simulator<>* running = nullptr;
  h.compute = [&](const ashl::sim::compute_request& q, std::span<ashl::sim::shard_payload> out) {
    auto& x = ws[q.worker];
    const std::uint32_t batch = q.batch;
    xb.resize(std::size_t{batch} * mlp::in);
    yb.resize(batch);
    if (coded) {
      // Gradient coding: the gradient g_j of each of the worker's partitions
      // at the pulled W (partition j: the training images with index % M ==
      // j), combined as Σ_j B[i][j]·g_j with the policy's own coefficients.
      // The commit is that combination; no local step and no local momentum
      // (the server's SGD has the momentum). Decoding recovers Σ_j g_j only
      // if every holder of partition j computes the same g_j, so its 64
      // samples are drawn from (round, partition), not from the worker: the
      // round in progress when this compute ends is the one the commit is
      // for unless it arrives late, and a late commit is dropped.
      ASHL_ASSERT(q.iterations == 1, "coded_bsp plans one iteration per round");
      const auto* cb = running->policy().target<ashl::sync::coded_bsp>();
      ASHL_ASSERT(cb != nullptr, "a coded row runs coded_bsp");
      const auto enc = cb->encoding(q.worker);
      const std::size_t parts = cb->partitions();
      const std::uint32_t per = enc.empty() ? batch : batch / static_cast<std::uint32_t>(enc.size());
      const std::uint64_t round = cb->rounds();
      std::fill(x.delta.begin(), x.delta.end(), 0.0f);
      for (std::size_t t = 0; t < enc.size(); ++t) {
        const std::size_t j = enc[t].partition;
        const std::size_t count_j = (d.train.count - j + parts - 1) / parts;
        for (std::uint32_t b = 0; b < per; ++b) {
          const std::uint64_t key = round * 65536 + b;
          const std::size_t idx = j + parts * (mix(rng_seed ^ (std::uint64_t{j} << 40) ^ key) % count_j);
          mlp::to_float(&d.train.images[idx * mlp::in], 1, &xb[std::size_t{b} * mlp::in]);
          yb[b] = d.train.labels[idx];
        }
        net.forward_backward(x.w, xb.data(), yb.data(), per, x.grad);
        const auto c = static_cast<float>(enc[t].coefficient);
        for (std::size_t i = 0; i < n; ++i) x.delta[i] += c * x.grad[i];
      }
      ++x.step;
    }
    for (std::uint32_t k = 0; k < (coded ? 0 : q.iterations); ++k) {
      for (std::uint32_t b = 0; b < batch; ++b) {
        const std::size_t idx = mix(rng_seed ^ (std::uint64_t{q.worker} << 40) ^ (x.step * 65536 + b)) % d.train.count;
        mlp::to_float(&d.train.images[idx * mlp::in], 1, &xb[std::size_t{b} * mlp::in]);
        yb[b] = d.train.labels[idx];
      }
      ++x.step;
      net.forward_backward(x.w, xb.data(), yb.data(), batch, x.grad);
      const float mu = static_cast<float>(s.momentum), lr = static_cast<float>(lr_policy);
      for (std::size_t i = 0; i < n; ++i) {
        x.v[i] = mu * x.v[i] + x.grad[i];
        x.w[i] -= lr * x.v[i];
      }
    }
    if (!coded)
      for (std::size_t i = 0; i < n; ++i) x.delta[i] = x.w[i] - x.base[i];
    // The codec in force with the plan (the worker's cycle adopted both, as
    // ps::worker does) and the error-feedback rule are ps::commit_encoder's:
    // a dense commit pays off what earlier top-k commits left (ASHL+'s residual).
    (void)x.enc.set(q.codec, q.plan->compression_ratio, q.plan->compression_options());
    // Out[k] is server k's shard, or with fragments (streaming rows) fragment
    // q.fragment's part on server k: core k·P + p of the layout.
    for (std::uint32_t k = 0; k < out.size(); ++k) {
      const std::uint32_t j = q.fragments == 0 ? k : k * q.fragments + q.fragment;
      const ashl::ps::key_range r = q.layout->range(j);
      const std::span<const float> delta(x.delta.data() + r.begin, static_cast<std::size_t>(r.size()));
      out[k] = {.codec = x.enc.codec(), .element_count = r.size(), .step = q.sequence, .tensor = j};
      if (x.enc.compresses()) {
        auto payload = x.enc.encode(j, delta, q.sequence);
        ASHL_ASSERT(payload.has_value(), "worker encode failed");
        out[k].bytes = *payload;
      } else {
        out[k].bytes = std::as_bytes(x.enc.dense(j, delta));
      }
    }
  };
  // The servers' layout (the simulator splits the parameters the same way:
  // with fragments, P cores per server).
  const std::uint32_t fragments = setup->streaming ? setup->streaming->fragments : 1;
  const auto layout = ashl::ps::shard_layout::even(n, static_cast<std::uint32_t>(spec.servers.size()) * fragments);
  if (!layout) {
    o.note = layout.error().message();
    return o;
  }
  h.serve = [&](ashl::sync::worker_id w, std::uint32_t server, std::span<const float> p) {
    const ashl::ps::key_range r = layout->range(server);
    std::copy(p.begin(), p.end(), ws[w].snapshot.begin() + static_cast<std::ptrdiff_t>(r.begin));
  };
  h.deliver = [&](ashl::sync::worker_id w) {
    ws[w].w = ws[w].snapshot;
    if (compensated) {
      // SpecTrain: start from the prediction Ŵ = W − τ·η·v of the
      // parameters this worker's update will meet (τ: the versions others
      // added since its last reply). The delta is taken from Ŵ, so the
      // prediction itself is not pushed back to the server.
      const auto st = ashl::ps::compensate(ws[w].w, ws[w].v, running->staleness(w), lr_policy);
      ASHL_ASSERT(st.ok(), "compensate: sizes match");
      ws[w].base = ws[w].w;
    } else {
      ws[w].base = ws[w].snapshot;
    }
  };
  // Streaming rows: fragment p's answers merge into the worker's model
  // (local ← α·local + (1 − α)·global) and become its reference for the
  // next delta of that fragment.
  const double alpha = setup->streaming ? setup->streaming->alpha : 0.0;
  h.merge = [&](ashl::sync::worker_id w, std::uint32_t p) {
    for (std::uint32_t k = 0; k < spec.servers.size(); ++k) {
      const ashl::ps::key_range r = layout->range(k * fragments + p);
      const auto at = static_cast<std::size_t>(r.begin), len = static_cast<std::size_t>(r.size());
      ashl::ps::streaming_merge(std::span(ws[w].w).subspan(at, len), std::span<const float>(ws[w].snapshot).subspan(at, len),
                                std::span(ws[w].base).subspan(at, len), alpha);
    }
  };
  h.evaluate = [&](double t, std::span<const float> W) {
    auto [acc, tl] = net.evaluate(W, d.test.images.data(), d.test.labels.data(), s.eval_test);
    auto [tracc, loss] = net.evaluate(W, d.train.images.data(), d.train.labels.data(), s.eval_train);
    (void)tl;
    (void)tracc;
    if (!std::isfinite(loss)) loss = 1e9;
    o.curve.push_back({t, acc, loss});
    if (std::isnan(o.time_to_target) && acc >= s.target) o.time_to_target = t;
    return ashl::sim::evaluation{{{ashl::metric_id::loss, loss}, {ashl::metric_id::accuracy, acc}}, false};
  };

  h.plans_changed = [&](double t) {
    if (running && std::isnan(o.switch_time) && running->policy().stage() == ashl::stage_id::shl) o.switch_time = t;
  };
  auto sim = ashl::sim::simulator<>::create(spec, std::move(setup->policy), std::move(h),
                                            {.elements = n,
                                             .optimizer = coded ? ashl::ps::optimizer_params{.mode = ashl::ps::optimizer_params::kind::sgd,
                                                                                             .lr = lr_policy,
                                                                                             .momentum = s.momentum}
                                                                : setup->optimizer,
                                             .initial = W0,
                                             .compression = setup->compression,
                                             .compression_options = setup->compression_options,
                                             .compression_ratio = setup->compression_ratio,
                                             .replies = setup->replies,
                                             .streaming = setup->streaming});
  if (!sim) {
    o.note = sim.error().message();
    return o;
  }
  running = &*sim;
  const bool trace = !trace_file.empty();
  auto r = sim->run({.until = s.budget, .metric_interval = s.eval_every, .record_trace = trace, .trace_limit = 200000});
  const std::vector<float> W = sim->parameters();
  o.final_accuracy = net.evaluate(W, d.test.images.data(), d.test.labels.data(), d.test.count).first;
  o.bytes_per_worker = r.mean_bytes_sent();
  for (const auto& st : r.workers) o.peak_sync_bytes += static_cast<double>(st.peak_sync_bytes) / static_cast<double>(m);
  o.wait_fraction = r.wait_fraction();
  if (auto a = ashl::ps::ashl_summary_of(sim->policy())) o.replans = a->replans;
  {
    std::ostringstream det;
    if (const auto* cb = sim->policy().target<ashl::sync::coded_bsp>())
      det << "rounds " << cb->rounds() << ", late commits " << cb->late_commits();
    if (name == "dlb_straggler")
      if (auto rr = ashl::ps::replan_report_of(sim->policy()))
        det << "straggler re-plans " << rr->straggler_replans;
    if (const auto* jp = sim->policy().target<ashl::sync::joint>()) {
      det << "bound " << jp->bound() << ", choices " << jp->choices() << ", batches";
      for (std::uint32_t w = 0; w < m; ++w) det << (w ? "/" : " ") << jp->plan(w).batch_size;
    }
    if (spec.stragglers.probability > 0.0) {
      std::uint64_t slowed = 0;
      for (std::uint32_t w = 0; w < m; ++w) slowed += sim->straggles(w);
      det << (det.tellp() > 0 ? ", " : "") << "slowed cycles " << slowed;
    }
    o.detail = det.str();
  }
  if (trace) {
    std::ofstream t(trace_file);
    ashl::sim::write_chrome_trace(t, r, "fmnist " + name);
  }
  return o;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return nan_v;
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

inline std::string num_or_null(double v, const char* fmt = "%.3f") {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}


// accuracy_vs_time.png from `csv` (policy,seed,time_s,accuracy,loss): one
// line per policy for the first seed; with `twin_csv`, the same policies'
// curves from there dashed (the simulator's prediction beside a real run).
// Returns false when gnuplot is missing or failed (the caller says so).
inline bool plot(const settings& s, const std::string& csv, const std::string& twin_csv = "",
                 const std::string& xlabel = "virtual time (s)", const std::string& suffix = "") {
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) return false;
  const std::string gp = s.out + "/accuracy_vs_time.gp";
  const char* const colors[9] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                 "#8c564b", "#e377c2", "#000000", "#17becf"};
  std::ofstream g(gp);
  g << "set datafile separator ','\nset terminal pngcairo size 1000,600\nset output '" << s.out
    << "/accuracy_vs_time.png'\nset xlabel '" << xlabel << "'\nset ylabel 'test accuracy (seed " << s.first_seed << ")'\n"
       "set yrange [0.5:0.92]\nset key bottom right\nset grid\nset termoption noenhanced\n"
    << "set arrow from graph 0, first " << s.target << " to graph 1, first " << s.target << " nohead dt 2\n"
    << "plot ";
  for (std::size_t k = 0; k < s.policies.size(); ++k)
    g << (k ? ", " : "") << "'" << csv << "' using (strcol(1) eq '" << s.policies[k]
      << "' && $2 == " << s.first_seed << " ? $3 : 1/0):4 with lines lw 2 lc rgb '" << colors[k % 9] << "' title '"
      << s.policies[k] << suffix << "'";
  if (!twin_csv.empty())
    for (std::size_t k = 0; k < s.policies.size(); ++k)
      g << ", '" << twin_csv << "' using (strcol(1) eq '" << s.policies[k] << "' && $2 == " << s.first_seed
        << " ? $3 : 1/0):4 with lines lw 1 dt 2 lc rgb '" << colors[k % 9] << "' title '" << s.policies[k]
        << " (simulator)'";
  g << "\n";
  g.close();
  return std::system(("gnuplot " + gp + " 2>/dev/null").c_str()) == 0;
}

}  // namespace fmnist_experiment
