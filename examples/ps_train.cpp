// ashl_ps_train — a training program on the real runtime: one binary that is
// a parameter server or a worker by the runtime contract (ps/launch.hpp),
// over UCX. The model is deliberately small (a noisy quadratic per worker,
// whose joint optimum is the mean of the workers' targets), so the example
// shows the runtime and not a network: how a program builds a server, how a
// worker commits and pulls with its own buffers, follows the plans, reports
// its loss, and how a job is started.
//
//   ashl-run -s 2 -w 4 -- ashl_ps_train --policy ssp --cycles 200 --progress 2
//   ashl-run -s 1 -w 4 -- ashl_ps_train --policy ashl --profile-iterations 10 --slow 0:5
//
// Flags (after the runtime contract's, see docs/multi-host.md):
//   --policy NAME        bsp asp ssp local_sgd dssp semi_async adsp ashl dlb (ps::policy_help())
//   --dim N              parameters (default 100000)
//   --cycles N           commits per worker (default 100)
//   --lr X               the workers' local step size (default 0.1)
//   --print-every N      worker 0 prints its loss every N cycles (default 20)
//   --slow RANK:MS       worker RANK sleeps MS per local iteration (a slow worker)
//   --NAME VALUE         any policy parameter of ps::policy_params::fields(), dashes for
//                        underscores: --staleness 3, --h-ahl 4, --compression-ratio 0.1,
//                        --sync-every-iterations 8, --staleness-weight inverse (--help lists them)
//   --expect-loss-below X  exit 1 unless worker 0's final loss is below X (used by the test)
// Faults (docs/ps.md, "Faults, checkpoints and rejoining"):
//   --checkpoint-dir DIR   servers checkpoint there (at the end, and as below)
//   --checkpoint-every S   ... every S seconds too
//   --restore              a server restores DIR's checkpoint at start (a restart)
//   --worker-timeout S     a server evicts a worker silent this long (default 20; 0: never)
//   --no-worker-grace S    (the runtime contract's, ASHL_NO_WORKER_GRACE) a server ends after S
//                          seconds with no worker connected (default 60); an evicted worker may
//                          rejoin within it. A server also ends when every worker left.
//   --job NAME             (ASHL_JOB) part of the job id: servers refuse a worker, and a
//                          restore refuses a checkpoint, of another job (docs/ps.md, "Job identity")
// A worker process joins with a fresh incarnation (from the clock), so a
// worker restarted by hand has its commits applied, never taken for duplicates.
//   --reconnect S          a worker whose server fails waits up to S seconds for it to come back
//   --timeout S            a worker's bound on every wait (default 30)
// Server limits (docs/ps.md, "Server limits"):
//   --store-bytes N        bound on a server's buffered commit bytes (default 0: automatic,
//                          workers x the largest commit of its shard)
//   --max-commit-samples N a commit saying it covers more samples is refused (default 2^30)
//   --allow-non-finite     accept NaN/infinite updates (refused by default)
//   --max-receive-bytes N  receive buffers over all connections (default 0: (workers + 1) x the
//                          largest message of the shard)
//   --max-snapshots N      parameter snapshots pinned by pull replies (default 0: 2 x workers + 2)
//   --apply-threads N      threads a server applies commits with, each on its own part of the
//                          shard (default 1; 1..64; bit-identical results; docs/ps.md "Apply threads")
//   --max-incarnation-ahead S  a join whose incarnation is more than S seconds ahead of the
//                          clock is refused (default 86400; 0: no bound)
// Every worker does plan.local_iterations local steps on its own copy, then
// commits the model delta (the servers add deltas: optimizer model_delta).
#include <ashl/ps/launch.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/ps/worker.hpp>
#include <ashl/transport/ucx.hpp>

#include <atomic>
#include <chrono>
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace ps = ashl::ps;
namespace tr = ashl::transport;

namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop = true; }

struct options {
  std::string policy = "ssp";
  ps::policy_params pp{};
  std::size_t dim = 100000;
  int cycles = 100;
  double lr = 0.1;
  int slow_rank = -1, slow_ms = 0;
  double expect_loss_below = -1;
  int print_every = 20;
  std::string checkpoint_dir;
  double checkpoint_every = 0, worker_timeout = 20, reconnect = 0, timeout = 30;
  bool restore = false;
  std::uint64_t store_bytes = 0;                           // ps::server_core_params::store_bytes (0: automatic)
  std::uint64_t max_commit_samples = std::uint64_t{1} << 30;  // ps::server_core_params::max_commit_samples
  bool allow_non_finite = false;                           // ps::server_core_params::allow_non_finite
  std::uint64_t max_receive_bytes = 0;                     // ps::server_params::max_receive_bytes (0: automatic)
  std::uint64_t max_snapshots = 0;                         // ps::server_params::max_snapshots (0: automatic)
  double max_incarnation_ahead = 86400;                    // ps::server_params::max_incarnation_ahead, seconds
  std::uint64_t apply_threads = 1;                         // ps::server_params::apply_threads
};

int fail(const std::string& m) {
  std::fprintf(stderr, "ashl_ps_train: %s\n", m.c_str());
  return 1;
}

ashl::status parse(const std::vector<std::string>& a, options& o) {
  for (std::size_t i = 1; i < a.size(); ++i) {
    auto value = [&]() -> const std::string& {
      static const std::string none;
      return i + 1 < a.size() ? a[++i] : none;
    };
    const std::string& f = a[i];
    char* end = nullptr;
    auto number = [&](const std::string& v) {
      const double x = std::strtod(v.c_str(), &end);
      return (end == v.c_str() || *end != '\0') ? std::nan("") : x;
    };
    // A policy parameter: --NAME for each field of ps::policy_params::fields(),
    // dashes for underscores (--h-ahl 4, --staleness-weight inverse).
    std::string field = f.size() > 2 && f.starts_with("--") ? f.substr(2) : std::string();
    std::replace(field.begin(), field.end(), '-', '_');
    double x = 0;
    if (!field.empty() && field != "workers" && ashl::has_field<ps::policy_params>(field)) {
      ASHL_TRY(ashl::set_field(o.pp, field, value(), "policy"));
      continue;
    }
    if (f == "--policy") o.policy = value();
    else if (f == "--checkpoint-dir") o.checkpoint_dir = value();
    else if (f == "--restore") o.restore = true;
    else if (f == "--allow-non-finite") o.allow_non_finite = true;
    else if (f == "--store-bytes" || f == "--max-commit-samples" || f == "--max-receive-bytes" ||
             f == "--max-snapshots" || f == "--apply-threads") {
      const std::string& v = value();
      char* e = nullptr;
      const unsigned long long n = std::strtoull(v.c_str(), &e, 10);
      const char* what = f == "--max-commit-samples" ? "samples"
                         : f == "--max-snapshots"    ? "snapshots"
                         : f == "--apply-threads"    ? "threads"
                                                     : "bytes";
      if (v.empty() || e == v.c_str() || *e != '\0' || v[0] == '-')
        return ashl::invalid_argument(f, v, std::string("expected a count of ") + what);
      if (f == "--max-snapshots" && n > 0xffffffffull)
        return ashl::invalid_argument(f, v, "must fit in 32 bits");
      if (f == "--apply-threads") ASHL_TRY(ashl::ps::apply_pool::check_threads(n, "--apply-threads"));
      (f == "--store-bytes"          ? o.store_bytes
       : f == "--max-commit-samples" ? o.max_commit_samples
       : f == "--max-receive-bytes"  ? o.max_receive_bytes
       : f == "--apply-threads"      ? o.apply_threads
                                     : o.max_snapshots) = n;
    }
    else if (f == "--slow") {
      const std::string v = value();
      const auto colon = v.find(':');
      if (colon == std::string::npos) return ashl::invalid_argument("--slow", v, "expected RANK:MS");
      // Whole numbers in range, never atoi's wrap (docs/ps.md "Bounds on counts and durations").
      auto rank = ashl::ps::detail::parse_count("--slow RANK", v.substr(0, colon), 0, ashl::ps::max_workers - 1,
                                                "ps::max_workers - 1");
      if (!rank) return rank.error();
      auto ms = ashl::ps::detail::parse_count("--slow MS", v.substr(colon + 1), 0, 3600 * 1000, "an hour");
      if (!ms) return ms.error();
      o.slow_rank = static_cast<int>(*rank);
      o.slow_ms = static_cast<int>(*ms);
    } else if (f == "--dim" || f == "--cycles" || f == "--print-every") {
      // Counts: whole numbers in range (a double cast to an integer past
      // its range is undefined); a model of at most wire::limits' elements.
      const std::string& v = value();
      auto n = f == "--dim" ? ashl::ps::detail::parse_count(f, v, 1) : ashl::ps::detail::parse_count(f, v, 0, 0x7fffffff);
      if (!n) return n.error();
      if (f == "--dim") o.dim = *n;
      else if (f == "--cycles") o.cycles = static_cast<int>(*n);
      else o.print_every = std::max(1, static_cast<int>(*n));
    } else if (std::isnan(x = number(value()))) {
      return ashl::invalid_argument(f, a[i], "expected a number after " + f);
    }
    else if (f == "--lr") o.lr = x;
    else if (f == "--expect-loss-below") o.expect_loss_below = x;
    else if (f == "--checkpoint-every") o.checkpoint_every = x;
    else if (f == "--worker-timeout") o.worker_timeout = x;
    else if (f == "--reconnect") o.reconnect = x;
    else if (f == "--timeout") o.timeout = x;
    else if (f == "--max-incarnation-ahead") o.max_incarnation_ahead = x;
    else return ashl::invalid_argument("argument", f, "unknown (see the comment at the top of examples/ps_train.cpp)");
  }
  if (o.dim == 0) return ashl::invalid_argument("--dim", 0, "must be >= 1");
  if (o.restore && o.checkpoint_dir.empty()) return ashl::invalid_argument("--restore", "", "needs --checkpoint-dir");
  if (!(o.timeout > 0)) return ashl::invalid_argument("--timeout", o.timeout, "must be > 0 seconds");
  // Every duration within ps::max_duration_seconds (a deadline now + it cannot wrap).
  for (auto [name, v] : {std::pair{"--max-incarnation-ahead", o.max_incarnation_ahead},
                         std::pair{"--worker-timeout", o.worker_timeout}, std::pair{"--reconnect", o.reconnect},
                         std::pair{"--checkpoint-every", o.checkpoint_every}, std::pair{"--timeout", o.timeout}})
    if (auto d = ashl::ps::checked_millis(name, v); !d) return d.error();
  return {};
}

// Worker k's target: a common one plus a small part of its own (its data
// differs a little from the others'); the joint optimum is their mean.
float target(std::uint32_t k, std::size_t i) {
  return std::sin(0.001f * static_cast<float>(i)) + 0.1f * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(k));
}

int serve(const ps::job& j, const options& o) {
  auto t = tr::ucx::create({.listen = j.server_addresses[j.rank], .token = j.token, .insecure = j.insecure,
                            .verbose = j.verbose});
  if (!t) return fail(t.error().message());
  auto layout = ps::shard_layout::even(o.dim, j.num_servers);
  if (!layout) return fail(layout.error().message());
  ps::policy_params pp = o.pp;
  pp.workers = j.num_workers;
  auto policy = ps::make_policy(o.policy, pp);
  if (!policy) return fail(policy.error().message());
  auto srv = ps::server<tr::ucx>::create(
      {.core = {.layout = *layout,
                .shard = j.rank,
                .workers = j.num_workers,
                .max_workers = ps::max_workers_of(j),  // ASHL_MAX_WORKERS: ranks past the initial ones join
                .store_bytes = o.store_bytes,
                .allow_non_finite = o.allow_non_finite,
                .max_commit_samples = o.max_commit_samples},
       .progress_seconds = j.progress_seconds,
       .worker_timeout = *ashl::ps::checked_millis("--worker-timeout", o.worker_timeout),
       .no_worker_grace = std::chrono::milliseconds(static_cast<long>(j.no_worker_grace_seconds * 1000)),
       .checkpoint_dir = o.checkpoint_dir,
       .checkpoint_every_seconds = o.checkpoint_every,
       .restore = o.restore,
       .max_receive_bytes = o.max_receive_bytes,
       .max_snapshots = static_cast<std::uint32_t>(o.max_snapshots),
       .max_incarnation_ahead = std::chrono::seconds(static_cast<long long>(o.max_incarnation_ahead)),
       .job = ps::job_id_of(j, o.dim),
       .policy = o.policy,
       .apply_threads = static_cast<std::uint32_t>(o.apply_threads)},
      std::move(*policy), std::move(*t));
  if (!srv) return fail(srv.error().message());
  if (srv->restored_version() != 0)
    std::fprintf(stderr, "server %u restored version %llu from %s\n", j.rank,
                 static_cast<unsigned long long>(srv->restored_version()), o.checkpoint_dir.c_str());
  std::fprintf(stderr, "server %u listening on %s (%s)\n", j.rank, srv->transport().listen_address().c_str(),
               o.policy.c_str());
  srv->run(g_stop);  // until every worker left, nobody came for no_worker_grace, or a signal
  std::fprintf(stderr, "%s\nserver %u ended: %s\n", srv->progress_line().c_str(), j.rank,
               std::string(ps::to_string(srv->end())).c_str());
  // The job's last state not on disk is a failure, whatever else went well.
  if (!srv->final_checkpoint()) return fail("the final checkpoint failed: " + srv->final_checkpoint().message());
  return srv->end() == ps::server_end::stopped ? 1 : 0;
}

int train(const ps::job& j, const options& o) {
  auto t = tr::ucx::create({.token = j.token, .insecure = j.insecure, .verbose = j.verbose});
  if (!t) return fail(t.error().message());
  std::vector<float> w(o.dim), local(o.dim), delta(o.dim), mean_target(o.dim);
  for (std::size_t i = 0; i < o.dim; ++i) {
    float s = 0;
    for (std::uint32_t k = 0; k < j.num_workers; ++k) s += target(k, i);
    mean_target[i] = s / static_cast<float>(j.num_workers);
  }
  auto loss_of = [&](const std::vector<float>& v) {
    double l = 0;
    for (std::size_t i = 0; i < o.dim; ++i) l += 0.5 * (v[i] - mean_target[i]) * (v[i] - mean_target[i]);
    return l / static_cast<double>(o.dim);
  };
  // w is this program's parameter buffer: the worker pulls into it.
  auto wk = ps::worker<tr::ucx>::create({.rank = j.rank,
                                         .servers = j.server_addresses,
                                         .batch = 32,
                                         .job = ps::job_id_of(j, o.dim),
                                         .timeout = *ashl::ps::checked_millis("--timeout", o.timeout),
                                         .progress_seconds = j.progress_seconds,
                                         .reconnect = *ashl::ps::checked_millis("--reconnect", o.reconnect)},
                                        std::move(*t), w);
  if (!wk) return fail(wk.error().message());
  std::uint64_t noise = 0x9e3779b97f4a7c15ull * (j.rank + 1);
  const double first = loss_of(w);
  double loss = first;
  for (int c = 0; c < o.cycles && !g_stop; ++c) {
    local = w;
    do {  // local iterations on this worker's own objective, as the plan says
      for (std::size_t i = 0; i < o.dim; ++i) {
        noise = noise * 6364136223846793005ull + 1442695040888963407ull;
        const float xi = static_cast<float>(static_cast<std::int64_t>(noise >> 40) - (1 << 23)) / float(1 << 23);
        local[i] -= static_cast<float>(o.lr) * (local[i] - target(j.rank, i) + 0.1f * xi);
      }
      if (static_cast<int>(j.rank) == o.slow_rank) std::this_thread::sleep_for(std::chrono::milliseconds(o.slow_ms));
    } while (!wk->iteration_done());
    for (std::size_t i = 0; i < o.dim; ++i) delta[i] = local[i] - w[i];
    if (auto s = wk->commit(delta); !s) return fail(s.to_string());
    if (auto s = wk->wait(); !s) return fail(s.to_string());  // w now holds the servers' parameters
    loss = loss_of(w);
    (void)wk->report_metric(ashl::metric_id::loss, loss);
    if (j.rank == 0 && (c % o.print_every == 0 || c + 1 == o.cycles)) {
      const auto p = wk->plan();
      std::printf("cycle %4d  loss %.5f  plan H=%u stage %s ratio %.2f\n", c, loss, p.local_iterations,
                  std::string(ashl::to_string(p.stage)).c_str(), static_cast<double>(p.compression_ratio));
      std::fflush(stdout);
    }
  }
  if (auto s = wk->leave(); !s) return fail(s.to_string());
  if (j.rank == 0) std::printf("worker 0: loss %.5f -> %.5f\n", first, loss);
  if (o.expect_loss_below > 0 && j.rank == 0 && !(loss < o.expect_loss_below))
    return fail("final loss " + std::to_string(loss) + " is not below " + std::to_string(o.expect_loss_below));
  return 0;
}

}  // namespace

// --help: the flags, then the policies and every policy parameter, read off
// ps::policies and ps::policy_params::fields().
void print_help() {
  std::printf(
      "ashl_ps_train [runtime flags, docs/multi-host.md] [--policy NAME] [--dim N] [--cycles N] [--lr X]\n"
      "              [--print-every N] [--slow RANK:MS] [--expect-loss-below X] [--checkpoint-dir DIR]\n"
      "              [--checkpoint-every S] [--restore] [--worker-timeout S] [--reconnect S] [--timeout S]\n"
      "              [--store-bytes N] [--max-commit-samples N] [--allow-non-finite] [--max-receive-bytes N]\n"
      "              [--max-snapshots N] [--max-incarnation-ahead S] [--apply-threads N]\n"
      "              [--NAME VALUE for any policy parameter below]\n\npolicies:\n%s\npolicy parameters:\n",
      ps::policy_help().c_str());
  ashl::for_each_field_of<ps::policy_params>([](const auto& fd) {
    std::string flag = "--" + std::string(fd.name);
    std::replace(flag.begin(), flag.end(), '_', '-');
    std::printf("  %-26s %s\n", flag.c_str(), std::string(fd.help).c_str());
  });
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--help") {
      print_help();
      return 0;
    }
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  auto j = ps::job_from(argc, argv);
  if (!j) return fail(j.error().message());
  options o;
  if (auto s = parse(j->rest, o); !s) return fail(s.message());
  return j->role == ps::role::server ? serve(*j, o) : train(*j, o);
}
