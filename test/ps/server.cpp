#include <ashl/ps/server.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/ps/policies.hpp>
#include <ashl/ps/worker.hpp>
#include <ashl/transport/inproc.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

// ps::server and ps::worker over the inproc transport, one thread per
// process: the whole runtime path (wire, transport, server_core, worker_cycle)
// without UCX. test/ps/ucx_job.cpp runs the same jobs as real processes.

namespace ps = ashl::ps;
namespace tr = ashl::transport;
using namespace std::chrono_literals;

namespace {

// A gradient whose values are multiples of 1/8 in [-4, 4]: sums of a few of
// them are exact in f32 whatever the order, so a round's result does not
// depend on the order in which the commits arrived.
float grad_value(std::uint32_t rank, std::uint64_t step, std::size_t i) {
  const std::uint64_t h = (rank * 2654435761u) ^ (step * 40503u) ^ (i * 2246822519u);
  return static_cast<float>(static_cast<int>((h >> 7) % 65) - 32) / 8.0f;
}

struct job_spec {
  std::string policy = "bsp";
  ps::policy_params pp{};
  std::uint32_t workers = 4;
  std::uint32_t servers = 1;
  std::size_t elements = 1000;
  int cycles = 20;
  ps::optimizer_params opt{.mode = ps::optimizer_params::kind::sgd, .lr = 0.125};
  std::function<void(std::uint32_t rank, int cycle)> before_commit = [](std::uint32_t, int) {};
  std::function<void(std::uint32_t rank, int cycle, const std::vector<float>& w)> after_wait =
      [](std::uint32_t, int, const std::vector<float>&) {};
  std::function<double(std::uint32_t rank, int cycle)> metric;  // reported after wait when set
  std::size_t eager_bytes = 256;
};

struct job_result {
  std::vector<std::vector<float>> server_params;  // per server
  std::vector<ps::server_telemetry> servers;
  std::vector<ps::worker_telemetry> workers;
  std::vector<std::vector<std::uint32_t>> iterations;  // per worker, per cycle: local iterations run
  std::vector<std::vector<ashl::worker_plan>> plans;   // per worker, per cycle: the plan in force
  std::vector<std::string> worker_errors;
};

job_result run_job(const job_spec& spec) {
  auto fabric = tr::inproc_fabric::create({.eager_bytes = spec.eager_bytes});
  auto layout = ps::shard_layout::even(spec.elements, spec.servers);
  BOOST_TEST_REQUIRE(layout.has_value());
  std::vector<float> initial(spec.elements, 0.5f);

  job_result res;
  res.server_params.resize(spec.servers);
  res.servers.resize(spec.servers);
  res.workers.resize(spec.workers);
  res.iterations.resize(spec.workers);
  res.plans.resize(spec.workers);
  res.worker_errors.resize(spec.workers);

  std::vector<std::thread> threads;
  std::atomic<bool> stop{false};
  std::atomic<int> servers_up{0};
  for (std::uint32_t s = 0; s < spec.servers; ++s) {
    threads.emplace_back([&, s] {
      auto node = fabric->node("server" + std::to_string(s));
      BOOST_TEST_REQUIRE(node.has_value());
      ps::policy_params pp = spec.pp;
      pp.workers = spec.workers;
      auto policy = ps::make_policy(spec.policy, pp);
      BOOST_TEST_REQUIRE(policy.has_value(), (policy ? "" : policy.error().message()));
      const auto r = layout->range(s);
      ps::server_params sp{.core = {.layout = *layout, .shard = s, .workers = spec.workers, .optimizer = spec.opt}};
      auto srv = ps::server<tr::inproc>::create(
          sp, std::move(*policy), std::move(*node),
          std::span<const float>(initial).subspan(r.begin, r.size()));
      BOOST_TEST_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
      ++servers_up;
      srv->run(stop);
      res.server_params[s].assign(srv->parameters().begin(), srv->parameters().end());
      res.servers[s] = srv->telemetry();
    });
  }
  while (servers_up.load() < static_cast<int>(spec.servers)) std::this_thread::sleep_for(1ms);

  for (std::uint32_t k = 0; k < spec.workers; ++k) {
    threads.emplace_back([&, k] {
      auto node = fabric->node();
      BOOST_TEST_REQUIRE(node.has_value());
      std::vector<std::string> addrs;
      for (std::uint32_t s = 0; s < spec.servers; ++s) addrs.push_back("server" + std::to_string(s));
      std::vector<float> w(spec.elements), g(spec.elements);
      auto wk = ps::worker<tr::inproc>::create({.rank = k, .servers = addrs, .batch = 16, .timeout = 20s},
                                               std::move(*node), w);
      if (!wk) {
        res.worker_errors[k] = wk.error().message();
        return;
      }
      for (int c = 0; c < spec.cycles; ++c) {
        res.plans[k].push_back(wk->plan());
        std::uint32_t iters = 0;
        do {
          ++iters;
        } while (!wk->iteration_done());
        res.iterations[k].push_back(iters);
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = grad_value(k, static_cast<std::uint64_t>(c), i);
        spec.before_commit(k, c);
        if (auto s = wk->commit(g); !s) {
          res.worker_errors[k] = s.message();
          return;
        }
        if (auto s = wk->wait(); !s) {
          res.worker_errors[k] = s.message();
          return;
        }
        spec.after_wait(k, c, w);
        if (spec.metric) (void)wk->report_metric(ashl::metric_id::loss, spec.metric(k, c));
      }
      res.workers[k] = wk->telemetry();
      if (auto s = wk->leave(); !s) res.worker_errors[k] = s.message();
    });
  }
  for (std::size_t i = spec.servers; i < threads.size(); ++i) threads[i].join();
  // The servers stop by themselves once every worker joined and left; a
  // worker that failed may never have joined, so then they are told to.
  bool any_error = false;
  for (auto& e : res.worker_errors) any_error |= !e.empty();
  if (any_error) stop = true;
  for (std::uint32_t s = 0; s < spec.servers; ++s) threads[s].join();
  return res;
}

}  // namespace

BOOST_AUTO_TEST_CASE(bsp_matches_a_single_process_server_core_bit_for_bit) {
  for (std::uint32_t servers : {1u, 2u}) {
    job_spec spec;
    spec.servers = servers;
    spec.cycles = 15;
    const job_result r = run_job(spec);
    for (const auto& e : r.worker_errors) BOOST_TEST_REQUIRE(e.empty(), e);

    // The same commits into one server_core holding the whole model: every
    // worker's cycle-c gradient is in round c (BSP).
    auto layout = ps::shard_layout::even(spec.elements, 1);
    ps::policy_params pp;
    pp.workers = spec.workers;
    auto core = ps::server_core<ashl::sync::any_policy>::create(
        {.layout = *layout, .workers = spec.workers, .optimizer = spec.opt}, *ps::make_policy("bsp", pp),
        std::vector<float>(spec.elements, 0.5f));
    BOOST_TEST_REQUIRE(core.has_value());
    ps::server_actions out(spec.workers);
    std::vector<float> g(spec.elements);
    for (int c = 0; c < spec.cycles; ++c) {
      for (std::uint32_t k = 0; k < spec.workers; ++k) {
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = grad_value(k, static_cast<std::uint64_t>(c), i);
        core->commit({.worker = k, .sequence = static_cast<std::uint64_t>(c) + 1, .clock = static_cast<std::uint64_t>(c) + 1,
                      .samples = 16, .codec = ashl::codec_id::identity, .element_count = spec.elements,
                      .payload = std::as_bytes(std::span<const float>(g))},
                     0.0, out);
        out.clear();
      }
    }
    std::vector<float> joined;
    for (const auto& s : r.server_params) joined.insert(joined.end(), s.begin(), s.end());
    BOOST_TEST_REQUIRE(joined.size() == spec.elements);
    BOOST_TEST(std::memcmp(joined.data(), core->parameters().data(), joined.size() * sizeof(float)) == 0,
               "servers = " << servers);
    BOOST_TEST(core->version() == static_cast<std::uint64_t>(spec.cycles));
    for (const auto& st : r.servers) {
      BOOST_TEST(st.core.commits_applied == std::uint64_t{spec.workers} * spec.cycles);
      BOOST_TEST(st.core.refused_total() == 0u);
      BOOST_TEST(st.wire_refused_total() == 0u);
      BOOST_TEST(st.core.steps == static_cast<std::uint64_t>(spec.cycles));
      BOOST_TEST(st.core.pulls_held > 0u);  // BSP holds the fast workers' pulls
    }
    for (const auto& w : r.workers) {
      BOOST_TEST(w.commits == static_cast<std::uint64_t>(spec.cycles));
      BOOST_TEST(w.errors == 0u);
    }
  }
}

BOOST_AUTO_TEST_CASE(ssp_never_answers_a_pull_beyond_the_bound) {
  // Worker 0 is slow; the others would run ahead. When worker k's pull is
  // answered after its c-th commit, every worker must have sent at least
  // c - s commits (a commit counts as sent before it leaves, so this is
  // implied by the bound the server enforces on accepted commits).
  constexpr std::uint32_t M = 4;
  constexpr std::int64_t s = 2;
  std::array<std::atomic<int>, M> sent{};
  std::atomic<int> violations{0}, max_gap{0};
  job_spec spec;
  spec.policy = "ssp";
  spec.pp.staleness = s;
  spec.workers = M;
  spec.cycles = 25;
  spec.opt = {.mode = ps::optimizer_params::kind::model_delta};
  spec.before_commit = [&](std::uint32_t k, int) {
    if (k == 0) std::this_thread::sleep_for(2ms);
    ++sent[k];
  };
  spec.after_wait = [&](std::uint32_t k, int c, const std::vector<float>&) {
    int mn = 1 << 30;
    for (auto& x : sent) mn = std::min(mn, x.load());
    const int mine = c + 1;
    if (mine - mn > s) ++violations;
    int gap = mine - mn;
    int prev = max_gap.load();
    while (gap > prev && !max_gap.compare_exchange_weak(prev, gap)) {}
    (void)k;
  };
  const job_result r = run_job(spec);
  for (const auto& e : r.worker_errors) BOOST_TEST_REQUIRE(e.empty(), e);
  BOOST_TEST(violations.load() == 0);
  BOOST_TEST(max_gap.load() >= 1);                // the fast workers did run ahead ...
  BOOST_TEST(r.servers[0].core.pulls_held > 0u);  // ... and were held at the bound
  BOOST_TEST(r.servers[0].core.commits_applied == std::uint64_t{M} * spec.cycles);
}

BOOST_AUTO_TEST_CASE(asp_never_holds_a_pull) {
  job_spec spec;
  spec.policy = "asp";
  spec.servers = 2;
  spec.opt = {.mode = ps::optimizer_params::kind::model_delta};
  spec.before_commit = [](std::uint32_t k, int) {
    if (k == 0) std::this_thread::sleep_for(1ms);
  };
  const job_result r = run_job(spec);
  for (const auto& e : r.worker_errors) BOOST_TEST_REQUIRE(e.empty(), e);
  for (const auto& st : r.servers) {
    BOOST_TEST(st.core.pulls_held == 0u);
    BOOST_TEST(st.core.pulls_served == st.core.pulls);
    BOOST_TEST(st.core.commits_applied == std::uint64_t{spec.workers} * spec.cycles);
  }
}

BOOST_AUTO_TEST_CASE(ashl_switches_stages_and_the_workers_follow_the_plans) {
  // Profiling for 3 iterations per worker, then AHL (H = 4, compressed at
  // ratio 0.1 with top-k and error feedback), then SHL (H = 2) once the
  // reported loss falls below switch_loss.
  job_spec spec;
  spec.policy = "ashl";
  spec.pp.profile_iterations = 3;
  spec.pp.h_ahl = 4;
  spec.pp.h_shl = 2;
  spec.pp.compression_ratio = 0.1;
  spec.pp.switch_loss = 0.5;
  spec.cycles = 30;
  spec.opt = {.mode = ps::optimizer_params::kind::model_delta};
  spec.metric = [](std::uint32_t, int c) { return c < 15 ? 1.0 : 0.1; };
  const job_result r = run_job(spec);
  for (const auto& e : r.worker_errors) BOOST_TEST_REQUIRE(e.empty(), e);
  for (std::uint32_t k = 0; k < spec.workers; ++k) {
    bool saw_ahl = false, saw_shl = false;
    for (std::size_t c = 0; c < r.plans[k].size(); ++c) {
      const ashl::worker_plan& p = r.plans[k][c];
      // The cycle ran exactly the plan's local iterations.
      if (p.local_iterations > 0) BOOST_TEST(r.iterations[k][c] == p.local_iterations, "worker " << k << " cycle " << c);
      if (p.stage == ashl::stage_id::ahl) {
        saw_ahl = true;
        BOOST_TEST(p.local_iterations == 4u);
      }
      if (p.stage == ashl::stage_id::shl) {
        saw_shl = true;
        BOOST_TEST(p.local_iterations == 2u);
      }
      if (saw_shl) BOOST_TEST((p.stage == ashl::stage_id::shl));  // no way back
    }
    BOOST_TEST(saw_ahl, "worker " << k);
    BOOST_TEST(saw_shl, "worker " << k);
    BOOST_TEST(r.workers[k].plan_changes >= 2u);
  }
  for (const auto& st : r.servers) {
    BOOST_TEST(st.core.refused_total() == 0u);
    BOOST_TEST(st.wire_refused_total() == 0u);
  }
}
