#include <ashl/ps/streaming_worker.hpp>

#include <ashl/ps/server.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/sim/simulator.hpp>
#include <ashl/transport/inproc.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/checks.hpp"
#include "../support/counting_new.hpp"
#include "../support/streaming_trainer.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

// ps::streaming_worker over inproc: fragment servers (ps::server, Local SGD
// with model deltas) and worker threads give the same parameters, bit for
// bit, as the simulator's fragment cores on the same seeded job; nothing
// allocates per step in steady state.

namespace ps = ashl::ps;
namespace sim = ashl::sim;
namespace tr = ashl::transport;
using namespace std::chrono_literals;
using streaming_testing::dyadic;

namespace {
// Local SGD(H) (plain averaging), or a DiLoCo-family name with its outer
// optimizer (outer_optimizer_of): per fragment, each fragment's servers
// (and the simulator's fragment cores) keep their own outer state.
struct fragment_policy {
  std::string name = "local_sgd";
  double outer_lr = 0.7, outer_momentum = 0.9;

  ps::policy_params params(std::uint32_t workers, std::int64_t h) const {
    ps::policy_params pp;
    pp.workers = workers;
    pp.local_steps = h;
    pp.outer_lr = outer_lr;
    pp.outer_momentum = outer_momentum;
    return pp;
  }
  ashl::sync::any_policy policy(std::uint32_t workers, std::int64_t h) const {
    auto p = ps::make_policy(name, params(workers, h));
    ASHL_REQUIRE(p.has_value(), (p ? "" : p.error().message()));
    return std::move(*p);
  }
  ps::optimizer_params optimizer(std::uint32_t workers, std::int64_t h) const {
    auto o = ps::outer_optimizer_of(name, params(workers, h));
    ASHL_REQUIRE(o.has_value(), (o ? "" : o.error().message()));
    return *o;
  }
};

struct real_run {
  std::vector<float> server_params;                 // fragments in order
  std::vector<std::vector<float>> worker_models;    // after finish()
  std::vector<std::uint64_t> syncs;
  std::vector<std::string> errors;
};

// M workers, one server per fragment, `steps` inner steps each.
real_run run_real(const ps::streaming_params& sp, std::uint32_t m, std::size_t n, const std::vector<float>& w0,
                  std::uint64_t steps, const fragment_policy& fp = {}) {
  auto fabric = tr::inproc_fabric::create({});
  real_run res;
  res.worker_models.assign(m, {});
  res.syncs.assign(m, 0);
  res.errors.assign(m, {});
  std::vector<std::vector<float>> finals(sp.fragments);
  std::atomic<bool> stop{false};
  std::atomic<std::uint32_t> up{0};
  std::vector<std::thread> servers, workers;
  for (std::uint32_t p = 0; p < sp.fragments; ++p) {
    servers.emplace_back([&, p] {
      auto node = fabric->node("fragment" + std::to_string(p));
      ASHL_REQUIRE(node.has_value());
      const ps::key_range r = ps::fragment_range(n, sp.fragments, p);
      auto layout = ps::shard_layout::even(r.size(), 1);
      auto srv = ps::server<tr::inproc>::create(
          {.core = {.layout = *layout, .workers = m, .optimizer = fp.optimizer(m, sp.interval)}}, fp.policy(m, sp.interval),
                                                std::move(*node),
                                                std::span<const float>(w0).subspan(r.begin, r.size()));
      ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
      ++up;
      srv->run(stop);
      finals[p].assign(srv->parameters().begin(), srv->parameters().end());
    });
  }
  while (up.load() < sp.fragments) std::this_thread::sleep_for(1ms);
  for (std::uint32_t k = 0; k < m; ++k) {
    workers.emplace_back([&, k] {
      std::vector<ps::worker_params> wp;
      std::vector<tr::inproc> nodes;
      nodes.reserve(sp.fragments);  // inproc moves may throw: no reallocation
      for (std::uint32_t p = 0; p < sp.fragments; ++p) {
        wp.push_back({.rank = k, .servers = {"fragment" + std::to_string(p)}, .batch = 1, .timeout = 20s});
        auto node = fabric->node();
        ASHL_REQUIRE(node.has_value());
        nodes.push_back(std::move(*node));
      }
      std::vector<float> model(n, -1.0f);  // the join's pulls overwrite it
      auto sw = ps::streaming_worker<tr::inproc>::create(sp, std::move(wp), std::move(nodes), model);
      if (!sw) {
        res.errors[k] = sw.error().message();
        return;
      }
      for (std::uint64_t t = 1; t <= steps; ++t) {
        for (std::size_t i = 0; i < n; ++i) model[i] += dyadic(k, t, i);
        if (auto s = sw->step(); !s) {
          res.errors[k] = s.message();
          return;
        }
      }
      res.syncs[k] = sw->syncs();
      if (auto s = sw->leave(); !s) res.errors[k] = s.message();
      res.worker_models[k] = model;
    });
  }
  for (auto& t : workers) t.join();
  bool failed = false;
  for (const auto& e : res.errors) failed |= !e.empty();
  if (failed) stop = true;
  for (auto& t : servers) t.join();
  for (const auto& f : finals) res.server_params.insert(res.server_params.end(), f.begin(), f.end());
  return res;
}
// The same job in the simulator: its fragment cores, `commits` fragment
// syncs per worker.
std::vector<float> run_sim(const ps::streaming_params& sp, std::uint32_t m, std::size_t n, const std::vector<float>& w0,
                           std::uint64_t commits, const fragment_policy& fp = {}) {
  streaming_testing::trainer tr(n, m, w0, sp.alpha, dyadic);
  sim::cluster_spec spec;
  spec.model_bytes = 4 * n;
  spec.workers.assign(m, sim::worker_spec{.seconds_per_iteration = 0.01, .latency_s = 1e-3, .bandwidth_bytes_per_s = 1e4});
  spec.workers[1].seconds_per_iteration = 0.025;
  spec.servers.assign(1, sim::server_spec{});
  auto s = sim::simulator<>::create(spec, fp.policy(m, sp.interval), tr.hooks(),
                                    {.elements = n, .optimizer = fp.optimizer(m, sp.interval), .initial = w0,
                                     .streaming = sp});
  ASHL_REQUIRE(s.has_value(), (s ? "" : s.error().message()));
  const auto r = s->run({.commits_per_worker = commits});
  ASHL_REQUIRE(r.error.empty(), r.error);
  return s->parameters();
}
}  // namespace

// H = 4, P = 2, τ = 1, α = 1/2; 2 workers, 18 inner steps (8 fragment
// syncs each): the real fragment servers end where the simulator's fragment
// cores end, bit for bit.
BOOST_AUTO_TEST_CASE(real_fragment_servers_equal_the_simulator) {
  const std::size_t n = 12;
  const std::uint32_t m = 2;
  const ps::streaming_params sp{.fragments = 2, .interval = 4, .delay = 1, .alpha = 0.5};
  std::vector<float> w0(n);
  for (std::size_t i = 0; i < n; ++i) w0[i] = 0.25f * static_cast<float>(i % 5);

  const real_run real = run_real(sp, m, n, w0, 18);
  for (std::uint32_t k = 0; k < m; ++k) ASHL_REQUIRE(real.errors[k].empty(), "worker " << k << ": " << real.errors[k]);
  for (std::uint32_t k = 0; k < m; ++k) ASHL_TEST(real.syncs[k] == 8u);

  const std::vector<float> simulated = run_sim(sp, m, n, w0, 8);
  ASHL_REQUIRE(real.server_params.size() == n);
  for (std::size_t i = 0; i < n; ++i) ASHL_TEST(real.server_params[i] == simulated[i], "element " << i);
  // The run moved every element, and the workers' merged models differ from
  // the servers' by α's mix of what each computed since.
  for (std::size_t i = 0; i < n; ++i) ASHL_TEST(simulated[i] != w0[i], "element " << i);
}

BOOST_AUTO_TEST_CASE(bad_parameters_are_refused_by_name) {
  std::vector<float> model(3, 0.0f);
  auto fails = [&](const ps::streaming_params& sp, std::size_t workers, std::size_t transports, const std::string& field,
                   const std::vector<std::uint64_t>& first = {}) {
    auto fabric = tr::inproc_fabric::create({});
    std::vector<ps::worker_params> wp(workers, ps::worker_params{.servers = {"nowhere"}});
    std::vector<tr::inproc> nodes;
    nodes.reserve(transports);
    for (std::size_t i = 0; i < transports; ++i) {
      auto node = fabric->node();
      ASHL_REQUIRE(node.has_value());
      nodes.push_back(std::move(*node));
    }
    auto sw = ps::streaming_worker<tr::inproc>::create(sp, std::move(wp), std::move(nodes), model, first);
    ASHL_REQUIRE(!sw.has_value());
    ASHL_TEST(sw.error().message().find(field) != std::string::npos, sw.error().message());
  };
  fails({.fragments = 4, .interval = 8}, 4, 4, "streaming.fragments");  // 4 fragments of 3 parameters
  fails({.fragments = 0, .interval = 8}, 0, 0, "streaming.fragments");
  fails({.fragments = 2, .interval = 8, .delay = 9}, 2, 2, "streaming.delay");
  fails({.fragments = 2, .interval = 8, .alpha = -1.0}, 2, 2, "streaming.alpha");
  fails({.fragments = 2, .interval = 8}, 1, 2, "streaming_worker.fragments");
  fails({.fragments = 2, .interval = 8}, 2, 1, "streaming_worker.transports");
  // The caller's split (the adapters' whole layers): contiguous, from 0, each fragment non-empty.
  fails({.fragments = 2, .interval = 8}, 2, 2, "streaming_worker.first.size = 1", {0});
  fails({.fragments = 2, .interval = 8}, 2, 2, "streaming_worker.first[0] = 1: must be 0", {1, 2});
  fails({.fragments = 3, .interval = 8}, 3, 3, "streaming_worker.first[1] = 2: must be < streaming_worker.first[2] (2)",
        {0, 2, 2});
  fails({.fragments = 2, .interval = 8}, 2, 2, "streaming_worker.first[1] = 3: must be < the model's elements (3)",
        {0, 3});
}

// Streaming DiLoCo proper: each fragment's servers run DiLoCo's outer
// Nesterov (outer lr 0.7, momentum 0.9) on that fragment's pseudo-gradients,
// in the real servers as in the simulator's fragment cores, bit for bit; at
// outer lr 1 without momentum it is the plain-averaging run, bit for bit.
BOOST_AUTO_TEST_CASE(streaming_diloco_outer_nesterov_per_fragment) {
  const std::size_t n = 12;
  const std::uint32_t m = 2;
  const ps::streaming_params sp{.fragments = 2, .interval = 4, .delay = 1, .alpha = 0.5};
  std::vector<float> w0(n);
  for (std::size_t i = 0; i < n; ++i) w0[i] = 0.25f * static_cast<float>(i % 5);
  const fragment_policy diloco{.name = "diloco"};
  const real_run real = run_real(sp, m, n, w0, 18, diloco);
  for (std::uint32_t k = 0; k < m; ++k) ASHL_REQUIRE(real.errors[k].empty(), "worker " << k << ": " << real.errors[k]);
  const std::vector<float> simulated = run_sim(sp, m, n, w0, 8, diloco);
  const std::vector<float> averaged = run_sim(sp, m, n, w0, 8);
  ASHL_REQUIRE(real.server_params.size() == n);
  std::size_t moved = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ASHL_TEST(real.server_params[i] == simulated[i], "element " << i);
    moved += simulated[i] != averaged[i] ? 1 : 0;
  }
  ASHL_TEST(moved == n);  // the outer optimizer is in force on every element
  const std::vector<float> plain = run_sim(sp, m, n, w0, 8, {.name = "diloco", .outer_lr = 1.0, .outer_momentum = 0.0});
  for (std::size_t i = 0; i < n; ++i) ASHL_TEST(plain[i] == averaged[i], "element " << i);
}

// Steady state allocates nothing anywhere in the process: two workers and
// two fragment servers driven from this thread over a deterministic
// fabric (ps::worker's no-allocation test, test/ps/worker.cpp), τ = 2 so
// that every reply has landed by its merge.
BOOST_AUTO_TEST_CASE(nothing_allocates_per_step_in_steady_state) {
  constexpr std::uint32_t m = 2;
  const std::size_t n = 1000;
  const ps::streaming_params sp{.fragments = 2, .interval = 4, .delay = 2, .alpha = 0.5};
  auto fabric = tr::inproc_fabric::create({.eager_bytes = 256, .deterministic = true});
  std::vector<ps::server<tr::inproc>> servers;
  for (std::uint32_t p = 0; p < sp.fragments; ++p) {
    auto node = fabric->node("fragment" + std::to_string(p));
    ASHL_REQUIRE(node.has_value());
    auto layout = ps::shard_layout::even(ps::fragment_range(n, sp.fragments, p).size(), 1);
    auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = m}},
                                              fragment_policy{}.policy(m, sp.interval), std::move(*node));
    ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
    servers.push_back(std::move(*srv));
  }
  std::vector<std::vector<float>> model(m, std::vector<float>(n, 0.0f));
  std::vector<ps::streaming_worker<tr::inproc>> workers;
  {
    std::atomic<bool> stop{false};
    std::vector<std::thread> th;
    for (auto& srv : servers) th.emplace_back([&] { srv.run(stop); });
    for (std::uint32_t k = 0; k < m; ++k) {
      std::vector<ps::worker_params> wp;
      std::vector<tr::inproc> nodes;
      nodes.reserve(sp.fragments);
      for (std::uint32_t p = 0; p < sp.fragments; ++p) {
        wp.push_back({.rank = k, .servers = {"fragment" + std::to_string(p)}, .timeout = 20s});
        auto node = fabric->node();
        ASHL_REQUIRE(node.has_value());
        nodes.push_back(std::move(*node));
      }
      auto sw = ps::streaming_worker<tr::inproc>::create(sp, std::move(wp), std::move(nodes), model[k]);
      ASHL_REQUIRE(sw.has_value(), (sw ? "" : sw.error().message()));
      workers.push_back(std::move(*sw));
    }
    stop = true;
    for (auto& t : th) t.join();
  }
  std::uint64_t t = 0;
  auto steps = [&](int count) {
    for (int c = 0; c < count; ++c) {
      ++t;
      for (std::uint32_t k = 0; k < m; ++k) {
        for (std::size_t i = 0; i < n; ++i) model[k][i] += dyadic(k, t, i);
        if (!workers[k].step().ok()) return false;
      }
      for (int spins = 0; spins < 64; ++spins)
        for (auto& srv : servers) srv.poll();
    }
    return true;
  };
  ASHL_REQUIRE(steps(12));  // warm-up: every fragment synced and merged twice
  const std::size_t before = counting_new::count();
  const bool ok = steps(40);
  const std::size_t after = counting_new::count();
  ASHL_REQUIRE(ok);
  ASHL_TEST(after == before, "allocations in steady state: " << after - before);
  for (const auto& w : workers) ASHL_TEST(w.syncs() == (52u - 4u) / 2u + 1u);  // syncs after steps 4, 6, ..., 52
}
