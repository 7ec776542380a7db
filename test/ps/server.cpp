#include <ashl/ps/server.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/compress/identity.hpp>
#include <ashl/sim/simulator.hpp>

#include "../support/ps_job.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

// ps::server and ps::worker over the inproc transport, one thread per
// process: the whole runtime path (wire, transport, server_core, worker_cycle)
// without UCX. test/ps/ucx_job.cpp runs the same jobs as real processes.

using namespace ps_job;
namespace ps = ashl::ps;
namespace tr = ashl::transport;
using namespace std::chrono_literals;

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
  // The workers train together (none more than two cycles ahead of the
  // slowest, a bounded wait), as the test means: on a loaded machine a
  // starved thread could otherwise still be profiling when the others have
  // finished, and never meet the stages at all.
  std::array<std::atomic<int>, 4> started{};
  spec.before_commit = [&](std::uint32_t k, int c) {
    started[k] = c;
    const auto end = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < end) {
      int mn = c;
      for (auto& x : started) mn = std::min(mn, x.load());
      if (c - mn <= 2) break;
      std::this_thread::sleep_for(100us);
    }
  };
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

namespace {
tr::inproc node_of(const std::shared_ptr<tr::inproc_fabric>& f) {
  auto n = f->node();
  ASHL_REQUIRE(n.has_value());
  return std::move(*n);
}
}  // namespace

// Elastic membership in the driver (docs/elastic.md §2.2-2.3, E2a): a
// 3-worker BSP job with server_core_params::max_workers = 4. Rank 3 joins
// while round 2 is in progress: its pull is held until that round completes
// (E3: it counts from the next round) and it then commits in rounds 3..5.
// The server's parameters equal one server_core fed the same events (the
// join and the held pull between round 2's commits); a rank 4 join is
// refused by name before the core, changing nothing; the job ends by
// itself once every rank that joined (the joiner too) has left.
BOOST_AUTO_TEST_CASE(a_rank_past_the_initial_workers_joins_a_bsp_job_and_the_server_matches_one_core) {
  constexpr std::uint32_t m0 = 3, m_max = 4;
  constexpr std::size_t n = 1000;
  constexpr int rounds = 6, join_round = 2;
  const ps::optimizer_params opt{.mode = ps::optimizer_params::kind::sgd, .lr = 0.125};
  auto fabric = tr::inproc_fabric::create({.eager_bytes = 256});
  auto layout = ps::shard_layout::even(n, 1);
  const std::vector<float> initial(n, 0.5f);

  // The reference: one core of the same shape, fed the same events.
  ps::policy_params pp;
  pp.workers = m0;
  auto core = ps::server_core<ashl::sync::any_policy>::create(
      {.layout = *layout, .workers = m0, .max_workers = m_max, .optimizer = opt}, *ps::make_policy("bsp", pp),
      initial);
  BOOST_TEST_REQUIRE(core.has_value());
  ps::server_actions out(m_max);
  std::vector<float> g(n), after_join_round;
  const auto commit = [&](std::uint32_t k, int c, std::uint64_t sequence) {
    for (std::size_t i = 0; i < n; ++i) g[i] = grad_value(k, static_cast<std::uint64_t>(c), i);
    core->commit({.worker = k, .incarnation = k == m0 ? 1u : 0u, .sequence = sequence, .clock = sequence, .samples = 16,
                  .codec = ashl::codec_id::identity, .element_count = n,
                  .payload = std::as_bytes(std::span<const float>(g))},
                 0.0, out);
    BOOST_TEST_REQUIRE(out.errors().empty(), "worker " << k << " round " << c << ": " << (out.errors().empty() ? std::string() : out.errors()[0].text));
    out.clear();
  };
  for (int c = 0; c < rounds; ++c) {
    for (std::uint32_t k = 0; k < m0; ++k) {
      if (c == join_round && k == m0 - 1) {
        core->join(m0, 1, 0.0, out);
        core->pull(m0, 0.0, out);
        out.clear();
        BOOST_TEST(core->is_held(m0));  // the round in progress completes without the joiner
      }
      commit(k, c, static_cast<std::uint64_t>(c) + 1);
    }
    if (c == join_round) after_join_round.assign(core->parameters().begin(), core->parameters().end());
    if (c > join_round) commit(m0, c, static_cast<std::uint64_t>(c - join_round));
  }

  std::atomic<bool> stop{false}, up{false}, release{false}, server_done{false};
  std::atomic<std::uint64_t> version{0};
  std::atomic<bool> joiner_held{false}, only_the_joiner_live{false}, all_left_with_the_joiner_live{false};
  std::atomic<int> committed_in_join_round{0};
  std::vector<float> server_params;
  ps::server_telemetry tel{};
  ps::server_end end = ps::server_end::running;
  std::uint32_t bound_after = 0, live_after = 99;
  std::thread server([&] {
    auto node = fabric->node("server0");
    ASHL_REQUIRE(node.has_value());
    ps::policy_params pp;
    pp.workers = m0;
    auto srv = ps::server<tr::inproc>::create(
        {.core = {.layout = *layout, .workers = m0, .max_workers = m_max, .optimizer = opt}},
        std::move(*ps::make_policy("bsp", pp)), std::move(*node), initial);
    ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
    up = true;
    // Read on the server's thread between passes (no commit is applied then).
    srv->run(stop, [&] {
      version = srv->core().version();
      joiner_held = srv->core().is_held(m0);
      if (srv->core().live_count() == 1 && srv->core().is_live(m0)) {  // the initial ranks left
        all_left_with_the_joiner_live = srv->all_left();
        only_the_joiner_live = true;
      }
    });
    server_params.assign(srv->parameters().begin(), srv->parameters().end());
    tel = srv->telemetry();
    end = srv->end();
    bound_after = srv->workers_bound();
    live_after = srv->core().live_count();
    server_done = true;
  });
  while (!up) std::this_thread::sleep_for(1ms);

  // A failed check ends the test by exception: the threads are told to
  // stop and joined first (the workers' waits are bounded).
  std::vector<std::thread> workers;
  struct joiner_of_threads {
    std::atomic<bool>& stop;
    std::atomic<bool>& release;
    std::thread& server;
    std::vector<std::thread>& workers;
    ~joiner_of_threads() {
      release = true;
      for (auto& t : workers)
        if (t.joinable()) t.join();
      stop = true;
      if (server.joinable()) server.join();
    }
  } guard{stop, release, server, workers};
  const auto wait_for = [](const auto& done) {
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(100us);
    return done();
  };
  std::vector<std::string> errors(m_max + 1);
  std::vector<std::vector<float>> rank0_rounds(rounds);  // worker 0's parameters after each round
  for (std::uint32_t k = 0; k < m0; ++k) {
    workers.emplace_back([&, k] {
      std::vector<float> w(n), g(n);
      auto wk = ps::worker<tr::inproc>::create({.rank = k, .servers = {"server0"}, .batch = 16, .timeout = 20s},
                                               node_of(fabric), w);
      if (!wk) {
        errors[k] = wk.error().message();
        return;
      }
      for (int c = 0; c < rounds; ++c) {
        // Worker 2 holds round 2 open until the joiner's pull is pending.
        if (k == m0 - 1 && c == join_round && !wait_for([&] { return release.load(); })) {
          errors[k] = "never released";
          return;
        }
        while (!wk->iteration_done()) {}
        for (std::size_t i = 0; i < n; ++i) g[i] = grad_value(k, static_cast<std::uint64_t>(c), i);
        if (auto s = wk->commit(g); !s) {
          errors[k] = s.message();
          return;
        }
        if (c == join_round) ++committed_in_join_round;
        if (auto s = wk->wait(); !s) {
          errors[k] = s.message();
          return;
        }
        if (k == 0) rank0_rounds[static_cast<std::size_t>(c)] = w;
      }
      if (auto s = wk->leave(); !s) errors[k] = s.message();
    });
  }

  // The joiner, once round 2 is in progress: its create() joins and pulls,
  // and that pull is held until the round completes.
  std::vector<float> wj(n, -1.0f), wj_first;
  BOOST_TEST_REQUIRE(wait_for([&] { return version.load() == join_round && committed_in_join_round.load() == 2; }));
  workers.emplace_back([&] {
    std::vector<float> gj(n);
    auto joiner = ps::worker<tr::inproc>::create({.rank = m0, .servers = {"server0"}, .batch = 16, .timeout = 20s},
                                                 node_of(fabric), wj);
    if (!joiner) {
      errors[m0] = joiner.error().message();
      return;
    }
    wj_first = wj;  // the parameters its join's pull delivered
    for (int c = join_round + 1; c < rounds; ++c) {
      while (!joiner->iteration_done()) {}
      for (std::size_t i = 0; i < n; ++i) gj[i] = grad_value(m0, static_cast<std::uint64_t>(c), i);
      if (auto s = joiner->commit(gj); !s) {
        errors[m0] = s.message();
        return;
      }
      if (auto s = joiner->wait(); !s) {
        errors[m0] = s.message();
        return;
      }
    }
    // It leaves last: the job does not end while it is live.
    if (!wait_for([&] { return only_the_joiner_live.load(); })) errors[m0] = "the initial ranks did not leave";
    if (auto s = joiner->leave(); !s) errors[m0] = s.message();
  });
  BOOST_TEST_REQUIRE(wait_for([&] { return joiner_held.load(); }));
  BOOST_TEST(version.load() == static_cast<std::uint64_t>(join_round));  // pending: round 2 still open

  // Past the maximum: refused by name, before the core.
  {
    std::vector<float> w4(n);
    auto w = ps::worker<tr::inproc>::create({.rank = m_max, .servers = {"server0"}, .timeout = 20s}, node_of(fabric),
                                            w4);
    BOOST_TEST_REQUIRE(!w.has_value());
    BOOST_TEST(w.error().message().find("join.rank = 4: this job admits at most 4 workers (ranks 0..3; ASHL_MAX_WORKERS)") !=
                   std::string::npos,
               w.error().message());
  }
  BOOST_TEST(version.load() == static_cast<std::uint64_t>(join_round));
  release = true;
  for (auto& t : workers) t.join();
  for (const auto& e : errors) BOOST_TEST(e.empty(), e);
  BOOST_TEST_REQUIRE(wj_first.size() == n);
  BOOST_TEST(std::memcmp(wj_first.data(), after_join_round.data(), n * sizeof(float)) == 0);  // round 2's result
  BOOST_TEST(only_the_joiner_live.load());
  BOOST_TEST(!all_left_with_the_joiner_live.load());
  // all_left(): every rank that joined (the joiner too) left; no stop needed.
  const bool ended = wait_for([&] { return server_done.load(); });
  if (!ended) stop = true;
  server.join();
  BOOST_TEST(ended);
  BOOST_TEST((end == ps::server_end::all_left));
  BOOST_TEST(bound_after == 0u);
  BOOST_TEST(live_after == 0u);

  BOOST_TEST_REQUIRE(server_params.size() == n);
  BOOST_TEST(std::memcmp(server_params.data(), core->parameters().data(), n * sizeof(float)) == 0);
  BOOST_TEST(core->version() == static_cast<std::uint64_t>(rounds));
  BOOST_TEST(tel.core.steps == static_cast<std::uint64_t>(rounds));
  BOOST_TEST(tel.core.commits_applied == std::uint64_t{m0} * rounds + (rounds - join_round - 1));
  BOOST_TEST(tel.core.refused_total() == 0u);  // rank 4 never reached the core
  BOOST_TEST(tel.wire_refused[static_cast<std::size_t>(ps::wire_refusal::rank)] == 1u);
  // and the join's pull that came with it, on a connection bound to nothing
  BOOST_TEST(tel.wire_refused[static_cast<std::size_t>(ps::wire_refusal::unbound)] == 1u);
  BOOST_TEST(tel.wire_refused_total() == 2u);

  // The simulator's BSP run of the same job makes the same decisions
  // (docs/elastic.md §2.5, E5's comparison): workers 0..2 of a 3-of-4
  // job, worker 3 joining while round 2 is in progress (workers 0 and 1
  // take 10 ms an iteration, worker 2 30 ms: round 2 runs from 60 to 90 ms,
  // 0 and 1 committed it at 70 ms, the join comes at 75 ms), each worker
  // committing grad_value(rank, round) as above. The joiner's first pull
  // gets round 2's result, worker 0 sees each round's parameters, and the
  // final parameters are the inproc server's, bit for bit.
  namespace sim = ashl::sim;
  sim::cluster_spec spec;
  spec.model_bytes = 4 * n;
  spec.servers = {sim::server_spec{}};
  spec.reference_batch = 16;  // the inproc workers' batch: their commits' samples
  spec.workers = {{.seconds_per_iteration = 0.01, .batch = 16}, {.seconds_per_iteration = 0.01, .batch = 16},
                  {.seconds_per_iteration = 0.03, .batch = 16}, {.seconds_per_iteration = 0.01, .batch = 16}};
  spec.max_workers = m_max;
  spec.changes = {{.at = 0.075, .worker = m0, .kind = sim::change_kind::join}};
  std::vector<std::vector<std::byte>> buf(m_max, std::vector<std::byte>(4 * n));
  std::vector<std::vector<float>> sim_rank0;   // worker 0's pulls, the first one the initial parameters
  std::vector<float> sim_joiner_first;
  std::vector<float> sg(n);
  sim::hooks h;
  h.compute = [&](const sim::compute_request& q, std::span<sim::shard_payload> out) {
    // The round a commit belongs to: an initial worker commits round
    // sequence - 1, the joiner round join_round + sequence.
    const std::uint64_t c = q.worker < m0 ? q.sequence - 1 : join_round + q.sequence;
    for (std::size_t i = 0; i < n; ++i) sg[i] = grad_value(q.worker, c, i);
    auto used = ashl::compress::identity{}.encode(ashl::host_view<const float>(sg.data(), n), buf[q.worker], {});
    BOOST_REQUIRE(used.has_value());
    out[0] = {.codec = ashl::codec_id::identity, .element_count = n, .bytes = {buf[q.worker].data(), *used}};
  };
  h.serve = [&](ashl::sync::worker_id w, std::uint32_t, std::span<const float> p) {
    if (w == 0) sim_rank0.emplace_back(p.begin(), p.end());
    if (w == m0 && sim_joiner_first.empty()) sim_joiner_first.assign(p.begin(), p.end());
  };
  ps::policy_params spp;
  spp.workers = m0;
  auto simulated = sim::simulator<>::create(spec, std::move(*ps::make_policy("bsp", spp)), h,
                                            {.elements = n, .optimizer = opt, .initial = initial});
  BOOST_TEST_REQUIRE(simulated.has_value(), (simulated ? "" : simulated.error().message()));
  // Initial workers stop after their 6 rounds; the joiner's 4th commit
  // (round 6) is buffered and never applied, as the inproc joiner never sent it.
  const auto r = simulated->run({.until = 1.0, .commits_per_worker = rounds});
  BOOST_TEST(r.error.empty(), r.error);
  BOOST_TEST(r.joins == 1u);
  BOOST_TEST(simulated->core().version() == static_cast<std::uint64_t>(rounds));
  BOOST_TEST(simulated->core().stats().commits_applied == tel.core.commits_applied);
  BOOST_TEST_REQUIRE(sim_joiner_first.size() == n);
  BOOST_TEST(std::memcmp(sim_joiner_first.data(), wj_first.data(), n * sizeof(float)) == 0);
  // The simulated worker 0 is served after each of its commits but the
  // last (it starts from the initial parameters and stops after round 5).
  BOOST_TEST_REQUIRE(sim_rank0.size() == static_cast<std::size_t>(rounds) - 1);
  for (int c = 0; c + 1 < rounds; ++c) {
    BOOST_TEST_REQUIRE(rank0_rounds[static_cast<std::size_t>(c)].size() == n);
    BOOST_TEST(std::memcmp(sim_rank0[static_cast<std::size_t>(c)].data(),
                           rank0_rounds[static_cast<std::size_t>(c)].data(), n * sizeof(float)) == 0,
               "round " << c);
  }
  BOOST_TEST(std::memcmp(rank0_rounds[rounds - 1].data(), server_params.data(), n * sizeof(float)) == 0);
  BOOST_TEST(std::memcmp(simulated->parameters().data(), server_params.data(), n * sizeof(float)) == 0);
}

// A rank past the initial workers that joined and then fell silent is
// evicted by server_params.worker_timeout like any other; the initial rank
// that keeps committing is not.
BOOST_AUTO_TEST_CASE(a_joined_rank_past_the_initial_workers_that_falls_silent_is_evicted_by_worker_timeout) {
  constexpr std::size_t n = 100;
  auto fabric = tr::inproc_fabric::create({});
  auto layout = ps::shard_layout::even(n, 1);
  std::atomic<bool> stop{false}, up{false}, joiner_live{false}, joiner_joined{false};
  ps::server_telemetry tel{};
  std::thread server([&] {
    auto node = fabric->node("server0");
    ASHL_REQUIRE(node.has_value());
    ps::policy_params pp;
    pp.workers = 1;
    auto srv = ps::server<tr::inproc>::create(
        {.core = {.layout = *layout, .workers = 1, .max_workers = 2}, .stop_when_all_left = false,
         .worker_timeout = 1000ms},
        std::move(*ps::make_policy("asp", pp)), std::move(*node));
    ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
    up = true;
    srv->run(stop, [&] {
      joiner_live = srv->core().is_live(1);
      if (joiner_live) joiner_joined = true;
    });
    tel = srv->telemetry();
  });
  while (!up) std::this_thread::sleep_for(1ms);
  struct stopper {
    std::atomic<bool>& stop;
    std::thread& server;
    ~stopper() {
      stop = true;
      if (server.joinable()) server.join();
    }
  } guard{stop, server};
  std::vector<float> w0(n), w1(n), g(n, 0.25f);
  auto a = ps::worker<tr::inproc>::create({.rank = 0, .servers = {"server0"}, .timeout = 10s}, node_of(fabric), w0);
  auto b = ps::worker<tr::inproc>::create({.rank = 1, .servers = {"server0"}, .timeout = 10s}, node_of(fabric), w1);
  BOOST_TEST_REQUIRE(a.has_value(), (a ? "" : a.error().message()));
  BOOST_TEST_REQUIRE(b.has_value(), (b ? "" : b.error().message()));
  // Rank 0 keeps committing (bounded) until rank 1, silent, was evicted.
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  int commits = 0;
  while (std::chrono::steady_clock::now() < deadline && !(joiner_joined && !joiner_live)) {
    while (!a->iteration_done()) {}
    BOOST_TEST_REQUIRE(a->commit(g).ok());
    BOOST_TEST_REQUIRE(a->wait().ok());
    ++commits;
    std::this_thread::sleep_for(5ms);
  }
  BOOST_TEST(joiner_joined.load());
  BOOST_TEST(!joiner_live.load());
  stop = true;
  server.join();
  BOOST_TEST(tel.evicted_silent == 1u);  // rank 1 alone: rank 0 was heard all along
  BOOST_TEST(tel.core.evictions == 1u);
  BOOST_TEST(tel.core.commits_applied == static_cast<std::uint64_t>(commits));
}

// A restore of a job whose rank past the initial workers had joined: the
// state's max_workers must be the server's (named otherwise), and every
// rank the state knows, the joiner too, is evicted (its connection died with
// the old process) until it joins again.
BOOST_AUTO_TEST_CASE(a_restore_evicts_the_joined_ranks_past_the_initial_workers_and_checks_max_workers) {
  constexpr std::size_t n = 100;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ashl_test_elastic_restore_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto layout = ps::shard_layout::even(n, 1);
  const auto params = [&](std::uint32_t max_workers) {
    ps::server_params p{.core = {.layout = *layout, .workers = 1, .max_workers = max_workers}};
    p.checkpoint_dir = dir.string();
    p.stop_when_all_left = false;
    return p;
  };
  const auto asp = [] {
    ps::policy_params pp;
    pp.workers = 1;
    return std::move(*ps::make_policy("asp", pp));
  };
  std::vector<float> saved;
  ashl::status final_checkpoint;
  {
    auto fabric = tr::inproc_fabric::create({});
    std::atomic<bool> stop{false}, up{false};
    std::thread server([&] {
      auto node = fabric->node("server0");
      ASHL_REQUIRE(node.has_value());
      auto srv = ps::server<tr::inproc>::create(params(2), asp(), std::move(*node));
      ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
      up = true;
      srv->run(stop);
      saved.assign(srv->parameters().begin(), srv->parameters().end());
      final_checkpoint = srv->final_checkpoint();
    });
    while (!up) std::this_thread::sleep_for(1ms);
    struct stopper {
      std::atomic<bool>& stop;
      std::thread& server;
      ~stopper() {
        stop = true;
        if (server.joinable()) server.join();
      }
    } guard{stop, server};
    std::vector<float> w0(n), w1(n), g(n, 0.25f);
    auto a = ps::worker<tr::inproc>::create({.rank = 0, .servers = {"server0"}, .timeout = 10s}, node_of(fabric), w0);
    auto b = ps::worker<tr::inproc>::create({.rank = 1, .servers = {"server0"}, .timeout = 10s}, node_of(fabric), w1);
    BOOST_TEST_REQUIRE(a.has_value(), (a ? "" : a.error().message()));
    BOOST_TEST_REQUIRE(b.has_value(), (b ? "" : b.error().message()));
    for (auto* wk : {&*a, &*b}) {
      while (!wk->iteration_done()) {}
      BOOST_TEST_REQUIRE(wk->commit(g).ok());
      BOOST_TEST_REQUIRE(wk->wait().ok());
    }
    stop = true;
    server.join();
  }
  BOOST_TEST_REQUIRE(final_checkpoint.ok(), final_checkpoint.to_string());

  auto fabric = tr::inproc_fabric::create({});
  ps::server_params rp = params(2);
  rp.restore = true;
  {
    auto srv = ps::server<tr::inproc>::create(rp, asp(), node_of(fabric));
    BOOST_TEST_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
    BOOST_TEST(srv->restored_version() == 2u);
    BOOST_TEST(srv->core().known_workers() == 2u);
    BOOST_TEST(srv->core().is_known(1));
    BOOST_TEST(!srv->core().is_live(0));
    BOOST_TEST(!srv->core().is_live(1));  // evicted: it joins again
    BOOST_TEST(srv->core().live_count() == 0u);
    BOOST_TEST(!srv->all_left());
    BOOST_TEST(std::memcmp(srv->parameters().data(), saved.data(), n * sizeof(float)) == 0);
  }
  rp.core.max_workers = 3;
  {
    auto srv = ps::server<tr::inproc>::create(rp, asp(), node_of(fabric));
    BOOST_TEST_REQUIRE(!srv.has_value());
    // Named by the identity section (PSID version 2), before the state loads.
    BOOST_TEST(srv.error().message().find("checkpoint.max_workers = 2: this server's job admits at most 3 workers") !=
                   std::string::npos,
               srv.error().message());
  }
  std::filesystem::remove_all(dir);
}

// Wire version 6 (docs/elastic.md §2.3, check 4): a join that says a model
// size other than the job's is refused by name at the join, before the
// core, and changes nothing; one that says the job's size, or none (0),
// joins.
BOOST_AUTO_TEST_CASE(a_join_of_another_model_size_is_refused_by_join_elements) {
  namespace w = ashl::wire;
  auto fabric = tr::inproc_fabric::create({.deterministic = true});
  auto layout = ps::shard_layout::even(64, 1);
  BOOST_TEST_REQUIRE(layout.has_value());
  ps::policy_params pp;
  pp.workers = 2;
  auto snode = fabric->node("s");
  auto cnode = fabric->node();
  BOOST_TEST_REQUIRE((snode.has_value() && cnode.has_value()));
  auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = 2}},
                                            std::move(*ps::make_policy("asp", pp)), std::move(*snode));
  BOOST_TEST_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
  struct handler {
    std::array<std::byte, 1 << 12> buf{};
    std::vector<std::string> errors;
    std::size_t plans = 0;
    std::span<std::byte> receive_buffer(tr::peer_id, std::span<const std::byte>, std::size_t n) {
      return n <= buf.size() ? std::span<std::byte>(buf.data(), n) : std::span<std::byte>{};
    }
    void on_message(tr::peer_id, std::span<const std::byte> head, std::span<const std::byte> data) {
      auto m = w::decode(head, data, w::limits{});
      if (!m) return;
      if (const auto* e = m->get<w::error_body>()) errors.emplace_back(e->text);
      if (m->header.kind == w::message_kind::plan_update) ++plans;
    }
    void on_sent(tr::peer_id, std::uint64_t, const ashl::status&) {}
    void on_peer(tr::peer_id, tr::peer_event, const ashl::status&) {}
  } h;
  tr::inproc client = std::move(*cnode);
  auto c2node = fabric->node();
  BOOST_TEST_REQUIRE(c2node.has_value());
  tr::inproc client2 = std::move(*c2node);  // rank 1's own connection
  auto p = client.connect("s");
  auto p2 = client2.connect("s");
  BOOST_TEST_REQUIRE((p.has_value() && p2.has_value()));
  auto pump = [&] {
    for (int i = 0; i < 8; ++i) {
      srv->poll();
      client.progress(h);
      client2.progress(h);
    }
  };
  pump();
  std::vector<std::vector<std::byte>> keep;
  auto join = [&](tr::inproc& c, tr::peer_id to, std::uint32_t rank, std::uint64_t elements) {
    keep.emplace_back(w::encoded_size(w::join_body::wire_bytes));
    auto n = w::encode(w::header{.rank = rank, .sequence = 1},
                       w::join_body{.incarnation = 1, .batch = 4, .elements = elements, .term = 0}, keep.back());
    BOOST_TEST_REQUIRE(n.has_value());
    const std::span<const std::byte> b(keep.back());
    BOOST_TEST_REQUIRE(c.send(to, b.first(w::header_bytes), b.subspan(w::header_bytes), 0).ok());
    pump();
  };
  join(client, *p, 0, 1001);
  BOOST_TEST_REQUIRE(h.errors.size() == 1u);
  BOOST_TEST(h.errors[0] == "join.elements = 1001: this job's model has 64 elements");
  BOOST_TEST(h.plans == 0u);
  BOOST_TEST(srv->telemetry().core.joins == 0u);  // the core never saw it
  BOOST_TEST(srv->telemetry().core.refused_total() == 0u);
  BOOST_TEST(srv->telemetry().wire_refused_for(ps::wire_refusal::element_count) == 1u);
  join(client, *p, 0, 64);    // the job's size
  join(client2, *p2, 1, 0);   // not said: as before version 6
  BOOST_TEST(h.errors.size() == 1u, (h.errors.empty() ? "" : h.errors.back()));
  BOOST_TEST(h.plans == 2u);
  BOOST_TEST(srv->telemetry().core.joins == 2u);
  BOOST_TEST(srv->telemetry().wire_refused_total() == 1u);
}

// docs/elastic.md §4.1, E10: every state-changing call ps::server makes on
// its core goes through one recorded_core, so a core fed the records in
// order holds the server's state bit for bit. An SSP job of 2 shards with
// compressed commits and metrics: each shard's records, encoded and decoded
// (rules/core_events.hpp), replayed into a fresh core created with the
// server core's own params, save the same bytes as the server's core; and
// the job with the sink set ends with the same parameters as without it.
BOOST_AUTO_TEST_CASE(a_core_fed_the_servers_recorded_calls_saves_the_servers_bytes) {
  constexpr std::uint32_t servers = 2;
  job_spec spec;
  spec.policy = "ssp";
  spec.pp.staleness = 2;
  spec.servers = servers;
  spec.cycles = 12;
  spec.metric = [](std::uint32_t rank, int cycle) { return 1.0 / (1.0 + cycle + 0.1 * rank); };
  const job_result plain = run_job(spec);
  for (const auto& e : plain.worker_errors) BOOST_TEST_REQUIRE(e.empty(), e);

  struct shard_log {
    std::vector<std::vector<std::byte>> records;
    std::array<std::uint64_t, 10> kinds{};  // by core_event_kind (1..9)
    std::vector<std::byte> saved;
    std::optional<ps::server_core_params> params;
  };
  std::array<shard_log, servers> logs;
  spec.server_created = [&](ps::server<tr::inproc>& srv, std::uint32_t s) {
    srv.record_core_calls([&logs, s](const ps::core_event& e) {
      ps::encode_core_event(e, logs[s].records.emplace_back());
      ++logs[s].kinds[static_cast<std::size_t>(e.kind)];
    });
  };
  spec.server_stopped = [&](ps::server<tr::inproc>& srv, std::uint32_t s) {
    ashl::state_writer w(logs[s].saved);
    srv.core().save(w);
    logs[s].params = srv.core().params();
  };
  const job_result recorded = run_job(spec);
  for (const auto& e : recorded.worker_errors) BOOST_TEST_REQUIRE(e.empty(), e);
  BOOST_TEST((recorded.server_params == plain.server_params));

  const auto layout = ps::shard_layout::even(spec.elements, servers);
  BOOST_TEST_REQUIRE(layout.has_value());
  const std::vector<float> initial(spec.elements, 0.5f);
  for (std::uint32_t s = 0; s < servers; ++s) {
    BOOST_TEST_CONTEXT("shard " << s) {
      const shard_log& log = logs[s];
      BOOST_TEST_REQUIRE(log.params.has_value());
      for (auto k : {ps::core_event_kind::join, ps::core_event_kind::commit, ps::core_event_kind::pull,
                     ps::core_event_kind::metric, ps::core_event_kind::leave})
        BOOST_TEST(log.kinds[static_cast<std::size_t>(k)] > 0u, "records of kind " << ps::to_string(k));
      ps::policy_params pp = spec.pp;
      pp.workers = spec.workers;
      auto policy = ps::make_policy(spec.policy, pp);
      BOOST_TEST_REQUIRE(policy.has_value());
      const auto r = layout->range(s);
      auto replica = ps::server_core<>::create(*log.params, std::move(*policy),
                                               std::span<const float>(initial).subspan(r.begin, r.size()));
      BOOST_TEST_REQUIRE(replica.has_value(), (replica ? "" : replica.error().message()));
      ps::server_actions ignored(spec.workers);
      for (const auto& bytes : log.records) {
        ps::core_event e;
        const ashl::status d = ps::decode_core_event(bytes, e);
        BOOST_TEST_REQUIRE(d.ok(), d.to_string());
        ps::replay(*replica, e, ignored);
        ignored.clear();
      }
      replica->apply_pending();
      std::vector<std::byte> replayed;
      ashl::state_writer w(replayed);
      replica->save(w);
      BOOST_TEST((replayed == log.saved));
      BOOST_TEST(replica->version() > 0u);
    }
  }
}

namespace {

// The two ledger tests' job: M workers of an n-element model on one
// inproc server whose core runs a data ledger of 200 samples (20 per
// lease, seed 7), ASP; `during` runs while the server's own thread serves
// the joins.
struct ledger_rig {
  static constexpr std::uint32_t M = 2;
  static constexpr std::size_t n = 64;
  std::shared_ptr<tr::inproc_fabric> fabric = tr::inproc_fabric::create({.eager_bytes = 256, .deterministic = true});
  std::optional<ps::server<tr::inproc>> srv;
  std::vector<std::vector<float>> w = std::vector<std::vector<float>>(M, std::vector<float>(n));
  std::vector<std::vector<float>> g = std::vector<std::vector<float>>(M, std::vector<float>(n, 0.25f));
  std::vector<ps::worker<tr::inproc>> workers;

  explicit ledger_rig(double give_back_after, const std::function<void(ledger_rig&)>& during = {}) {
    auto layout = ps::shard_layout::even(n, 1);
    BOOST_TEST_REQUIRE(layout.has_value());
    ps::policy_params pp;
    pp.workers = M;
    ps::server_params sp{.core = {.layout = *layout, .workers = M}};
    sp.ledger = {.samples = 200, .shuffle_seed = 7, .lease_samples = 20, .give_back_after = give_back_after};
    auto s = ps::server<tr::inproc>::create(sp, std::move(*ps::make_policy("asp", pp)), node("server0"));
    BOOST_TEST_REQUIRE(s.has_value(), (s ? "" : s.error().message()));
    srv.emplace(std::move(*s));
    BOOST_TEST_REQUIRE(srv->core().ledger().enabled());
    std::atomic<bool> stop{false};
    std::thread th([&] { srv->run(stop); });
    for (std::uint32_t k = 0; k < M; ++k) {
      auto wk = ps::worker<tr::inproc>::create(
          {.rank = k, .servers = {"server0"}, .batch = 4, .timeout = 20s, .reconnect = 20s}, node(), w[k]);
      BOOST_TEST_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
      workers.push_back(std::move(*wk));
    }
    if (during) during(*this);
    stop = true;
    th.join();
  }
  tr::inproc node(std::string name = {}) {
    auto c = fabric->node(std::move(name));
    ASHL_REQUIRE(c.has_value());
    return std::move(*c);
  }
  void pump() {
    for (int i = 0; i < 200; ++i) {
      srv->poll();
      bool idle = true;
      for (auto& wk : workers) idle = wk.test() && idle;
      if (idle && i > 8) break;
    }
  }
  // Each worker's leases are the ledger's for it; no position is held twice.
  void same_as_the_ledger(const char* when) {
    BOOST_TEST_CONTEXT(when) {
      std::vector<int> held(200, 0);
      for (std::uint32_t k = 0; k < M; ++k) {
        const auto mine = workers[k].leases();
        const auto theirs = srv->core().ledger().leases(k);
        BOOST_TEST_REQUIRE(mine.size() == theirs.size(), "worker " << k);
        BOOST_TEST(!mine.empty(), "worker " << k);
        for (std::size_t i = 0; i < mine.size(); ++i) {
          BOOST_TEST(mine[i].number == theirs[i].number);
          BOOST_TEST(mine[i].epoch == theirs[i].epoch);
          BOOST_TEST(mine[i].begin == theirs[i].begin);
          BOOST_TEST(mine[i].end == theirs[i].end);
          if (mine[i].epoch == 0)
            for (auto q = mine[i].begin; q < mine[i].end; ++q) ++held[q];
        }
        BOOST_TEST(workers[k].ledger_samples() == 200u);
        BOOST_TEST(workers[k].ledger_shuffle_seed() == 7u);
      }
      BOOST_TEST(*std::max_element(held.begin(), held.end()) <= 1);
    }
  }
  // Every worker trains `samples` and commits; all answered.
  void cycle(std::uint64_t samples) {
    for (std::uint32_t k = 0; k < M; ++k) {
      while (!workers[k].iteration_done(samples)) {}
      BOOST_TEST_REQUIRE(workers[k].commit(g[k]).ok());
    }
    pump();
    for (auto& wk : workers) BOOST_TEST_REQUIRE(wk.wait().ok());
  }
};

}  // namespace

// docs/elastic.md §3.3, §3.6 (E8): with server_params.ledger, server 0's
// core runs the data ledger and its leases reach the workers as `lease`
// messages: after every cycle each worker holds exactly the leases the
// server's ledger says it holds (numbers, epochs, ranges from the cursor),
// the workers' leases never overlap, and the commits' samples move both
// alike. A worker whose connection drops is evicted (its leases
// suspended), reconnects, rejoins as the same incarnation and is sent its
// outstanding leases again (flag `resent`); it goes on from them. A
// worker of another model size is refused at its join by join.elements.
BOOST_AUTO_TEST_CASE(leases_reach_the_workers_and_are_resent_after_a_rejoin) {
  ledger_rig r(60.0, [](ledger_rig& rig) {
    std::vector<float> other(ledger_rig::n + 1);
    auto bad = ps::worker<tr::inproc>::create({.rank = 0, .servers = {"server0"}, .timeout = 5s}, rig.node(), other);
    BOOST_TEST_REQUIRE(!bad.has_value());
    BOOST_TEST(bad.error().message().find("join.elements = 65: this job's model has 64 elements") != std::string::npos,
               bad.error().message());
  });
  auto& srv = r.srv;
  auto& workers = r.workers;
  BOOST_TEST(srv->telemetry().wire_refused_for(ps::wire_refusal::element_count) == 1u);
  const std::uint64_t refused_at_start = srv->telemetry().wire_refused_total();  // the other size's join and pull
  r.pump();
  r.same_as_the_ledger("after the joins");
  for (std::uint64_t c = 0; c < 5; ++c) {
    r.cycle(3 + c % 2);  // samples trained, not the batch: 3 or 4
    r.same_as_the_ledger("after a cycle");
  }
  BOOST_TEST(srv->core().ledger().stats().overrun == 0u);
  const std::uint64_t sent_before = srv->telemetry().leases;
  BOOST_TEST(sent_before == srv->core().ledger().stats().leases_granted);
  BOOST_TEST(workers[0].telemetry().leases + workers[1].telemetry().leases == sent_before);

  // Worker 1's connection drops: the server evicts it (its leases wait,
  // give_back_after), it reconnects and rejoins as the same incarnation.
  const auto before = workers[1].leases();
  workers[1].transport().close();
  for (int i = 0; i < 2000 && workers[1].telemetry().leases_resent == 0; ++i) r.pump();
  BOOST_TEST_REQUIRE(workers[1].telemetry().reconnects >= 1u);
  BOOST_TEST(workers[1].telemetry().leases_resent == before.size());
  BOOST_TEST(workers[1].telemetry().leases_dropped == 0u);
  BOOST_TEST(srv->core().ledger().stats().leases_resent == before.size());
  BOOST_TEST((srv->core().ledger().state(1) == ps::ledger_worker_state::live));
  BOOST_TEST(srv->core().ledger().stats().leases_returned == 0u);  // none went back: resumed
  r.same_as_the_ledger("after the rejoin");
  const auto after = workers[1].leases();
  BOOST_TEST_REQUIRE(after.size() == before.size());
  for (std::size_t i = 0; i < after.size(); ++i) BOOST_TEST((after[i].begin == before[i].begin && after[i].end == before[i].end));
  BOOST_TEST((after[0].flags & ashl::wire::lease_flag_resent) != 0u);
  for (std::uint64_t c = 0; c < 4; ++c) {
    r.cycle(4);
    r.same_as_the_ledger("after a cycle past the rejoin");
  }
  BOOST_TEST(srv->core().ledger().stats().overrun == 0u);
  BOOST_TEST(srv->telemetry().wire_refused_total() == refused_at_start);
  for (auto& wk : workers) {
    BOOST_TEST(wk.telemetry().bad_messages == 0u);
    BOOST_TEST(wk.leave().ok());
  }
}

// A rejoin later than ledger.give_back_after (0 here: at the eviction):
// server 0 gave the worker's leases back, so it sends none again and
// grants fresh ones; the worker drops the leases it held (telemetry
// leases_dropped) and trains only what the ledger says is its own; no
// position is held twice. (Before, it kept training the given-back
// leases beside the fresh ones: the chaos test's overrun.)
BOOST_AUTO_TEST_CASE(a_worker_that_rejoins_after_its_leases_went_back_drops_them) {
  ledger_rig r(0.0);
  auto& workers = r.workers;
  r.pump();
  for (int c = 0; c < 3; ++c) r.cycle(4);
  r.same_as_the_ledger("before the drop");
  const auto before = workers[1].leases();
  BOOST_TEST_REQUIRE(!before.empty());
  workers[1].transport().close();
  for (int i = 0; i < 2000 && workers[1].telemetry().leases_dropped == 0; ++i) r.pump();
  BOOST_TEST_REQUIRE(workers[1].telemetry().reconnects >= 1u);
  BOOST_TEST(workers[1].telemetry().leases_resent == 0u);  // given back at the eviction: none to send again
  BOOST_TEST(workers[1].telemetry().leases_dropped == before.size());
  BOOST_TEST(r.srv->core().ledger().stats().leases_returned >= before.size());
  const auto after = workers[1].leases();
  BOOST_TEST_REQUIRE(!after.empty());
  for (const auto& l : after) BOOST_TEST(l.number > before.back().number);  // fresh grants only
  r.same_as_the_ledger("after the late rejoin");
  for (int c = 0; c < 4; ++c) {
    r.cycle(4);
    r.same_as_the_ledger("after a cycle past the late rejoin");
  }
  BOOST_TEST(r.srv->core().ledger().stats().overrun == 0u);
  for (auto& wk : workers) {
    BOOST_TEST(wk.telemetry().bad_messages == 0u);
    BOOST_TEST(wk.leave().ok());
  }
}
