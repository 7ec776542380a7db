// test/support/ps_job.hpp — runs a parameter-server job in one process over
// the inproc transport: S server threads (ps::server) and M worker threads
// (ps::worker), each worker committing a deterministic gradient for a
// number of cycles, with hooks around each commit. Used by test/ps/server.cpp
// and test/ps/worker.cpp. And bsp_reference, the single-process result that
// the jobs of ashl_test_ps_node processes must equal (test/ps/ucx_job.cpp,
// big_model.cpp, netns_hosts.cpp).
#pragma once

#include <ashl/rules/policies.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/ps/worker.hpp>
#include <ashl/transport/inproc.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>
#include "checks.hpp"

namespace ps_job {
namespace ps = ashl::ps;
namespace tr = ashl::transport;
using namespace std::chrono_literals;


// A gradient whose values are multiples of 1/8 in [-4, 4]: sums of a few of
// them are exact in f32 whatever the order, so a round's result does not
// depend on the order in which the commits arrived.
inline float grad_value(std::uint32_t rank, std::uint64_t step, std::size_t i) {
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
  bool progress_thread = false;
  ashl::codec_id compression = ashl::codec_id::topk;
  std::function<void(ps::server_params&)> configure_server = [](ps::server_params&) {};  // before create()
  std::function<void(ps::worker_params&)> configure_worker = [](ps::worker_params&) {};  // before create()
  // Each server after create() (before it runs) and after it stopped, on its thread.
  std::function<void(ps::server<tr::inproc>&, std::uint32_t shard)> server_created = [](auto&, std::uint32_t) {};
  std::function<void(ps::server<tr::inproc>&, std::uint32_t shard)> server_stopped = [](auto&, std::uint32_t) {};
};

struct job_result {
  std::vector<std::vector<float>> server_params;  // per server
  std::vector<ps::server_telemetry> servers;
  std::vector<ps::worker_telemetry> workers;
  std::vector<std::vector<std::uint32_t>> iterations;  // per worker, per cycle: local iterations run
  std::vector<std::vector<ashl::worker_plan>> plans;   // per worker, per cycle: the plan in force
  std::vector<std::string> worker_errors;
};

inline job_result run_job(const job_spec& spec) {
  auto fabric = tr::inproc_fabric::create({.eager_bytes = spec.eager_bytes});
  auto layout = ps::shard_layout::even(spec.elements, spec.servers);
  ASHL_REQUIRE(layout.has_value());
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
  std::atomic<int> joined{0};
  for (std::uint32_t s = 0; s < spec.servers; ++s) {
    threads.emplace_back([&, s] {
      auto node = fabric->node("server" + std::to_string(s));
      ASHL_REQUIRE(node.has_value());
      ps::policy_params pp = spec.pp;
      pp.workers = spec.workers;
      auto policy = ps::make_policy(spec.policy, pp);
      ASHL_REQUIRE(policy.has_value(), (policy ? "" : policy.error().message()));
      const auto r = layout->range(s);
      ps::server_params sp{.core = {.layout = *layout, .shard = s, .workers = spec.workers, .optimizer = spec.opt},
                           .compression = spec.compression};
      spec.configure_server(sp);
      auto srv = ps::server<tr::inproc>::create(
          sp, std::move(*policy), std::move(*node),
          std::span<const float>(initial).subspan(r.begin, r.size()));
      ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
      spec.server_created(*srv, s);
      ++servers_up;
      srv->run(stop);
      spec.server_stopped(*srv, s);
      res.server_params[s].assign(srv->parameters().begin(), srv->parameters().end());
      res.servers[s] = srv->telemetry();
    });
  }
  while (servers_up.load() < static_cast<int>(spec.servers)) std::this_thread::sleep_for(1ms);

  for (std::uint32_t k = 0; k < spec.workers; ++k) {
    threads.emplace_back([&, k] {
      auto node = fabric->node();
      ASHL_REQUIRE(node.has_value());
      std::vector<std::string> addrs;
      for (std::uint32_t s = 0; s < spec.servers; ++s) addrs.push_back("server" + std::to_string(s));
      std::vector<float> w(spec.elements), g(spec.elements);
      ps::worker_params wp{.rank = k, .servers = addrs, .batch = 16, .timeout = 20s,
                           .progress_thread = spec.progress_thread};
      spec.configure_worker(wp);
      auto wk = ps::worker<tr::inproc>::create(std::move(wp), std::move(*node), w);
      if (!wk) {
        res.worker_errors[k] = wk.error().message();
        return;
      }
      // Every worker joins before any commits (bounded): a worker that joined
      // late would start at the others' clock, which the tests' own
      // bookkeeping (commits sent per worker) does not model.
      ++joined;
      const auto join_deadline = std::chrono::steady_clock::now() + 20s;
      while (joined.load() < static_cast<int>(spec.workers) && std::chrono::steady_clock::now() < join_deadline)
        std::this_thread::sleep_for(100us);
      res.plans[k].reserve(static_cast<std::size_t>(spec.cycles));  // no allocation of the harness's own in the loop
      res.iterations[k].reserve(static_cast<std::size_t>(spec.cycles));
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

// The BSP run a job of ashl_test_ps_node processes (--policy bsp, SGD with
// lr 0.125 from 0.5, identity codec) must equal: one server_core over the
// whole model, with the default params (store_bytes automatic), every
// worker's cycle-c gradient (grad_value) in round c. Call it from the test's
// thread (it checks with Boost.Test).
inline std::vector<float> bsp_reference(std::uint32_t workers, std::size_t elements, int cycles) {
  auto layout = ps::shard_layout::even(elements, 1);
  ps::policy_params pp;
  pp.workers = workers;
  auto core = ps::server_core<ashl::sync::any_policy>::create(
      {.layout = *layout, .workers = workers, .optimizer = {.mode = ps::optimizer_params::kind::sgd, .lr = 0.125}},
      *ps::make_policy("bsp", pp), std::vector<float>(elements, 0.5f));
  BOOST_TEST_REQUIRE(core.has_value(), core.to_status().to_string());
  ps::server_actions out(workers);
  std::vector<float> g(elements);
  for (int c = 0; c < cycles; ++c)
    for (std::uint32_t k = 0; k < workers; ++k) {
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = grad_value(k, static_cast<std::uint64_t>(c), i);
      core->commit({.worker = k, .sequence = static_cast<std::uint64_t>(c) + 1,
                    .clock = static_cast<std::uint64_t>(c) + 1, .samples = 16, .codec = ashl::codec_id::identity,
                    .element_count = elements, .payload = std::as_bytes(std::span<const float>(g))},
                   0.0, out);
      // (The message is built whether or not the check fails: index only when there is an error.)
      BOOST_TEST_REQUIRE(out.errors().empty(), (out.errors().empty() ? std::string() : out.errors()[0].text));
      out.clear();
    }
  BOOST_TEST(core->stats().commits_applied == static_cast<std::uint64_t>(workers) * cycles);
  return {core->parameters().begin(), core->parameters().end()};
}

}  // namespace ps_job
