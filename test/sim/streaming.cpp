#include <ashl/sim/simulator.hpp>

#include <ashl/rules/policies.hpp>
#include <ashl/rules/streaming.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/streaming_trainer.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

// The simulator under server_setup::streaming (Streaming DiLoCo's fragments,
// rules/streaming.hpp, docs/sim.md "Streaming fragments").

namespace sim = ashl::sim;
namespace ss = ashl::sync;
namespace ps = ashl::ps;

using streaming_testing::dyadic;
using streaming_testing::trainer;

namespace {
constexpr double inf = std::numeric_limits<double>::infinity();

sim::worker_spec worker(double spi, double bytes_per_s = inf, double latency_s = 0.0, sim::jitter_spec jitter = {}) {
  return {.seconds_per_iteration = spi, .latency_s = latency_s, .bandwidth_bytes_per_s = bytes_per_s,
          .compute_jitter = jitter, .comm_jitter = jitter};
}

sim::cluster_spec cluster(std::vector<sim::worker_spec> ws, std::uint64_t model_bytes, std::uint32_t servers = 1,
                          std::uint64_t header_bytes = 72, double server_bytes_per_s = inf) {
  sim::cluster_spec s;
  s.model_bytes = model_bytes;
  s.header_bytes = header_bytes;
  s.workers = std::move(ws);
  s.servers.assign(servers, sim::server_spec{.latency_s = 1e-4, .bandwidth_bytes_per_s = server_bytes_per_s});
  return s;
}

ss::any_policy local_sgd(std::size_t workers, std::int64_t h) {
  ps::policy_params pp;
  pp.workers = static_cast<std::int64_t>(workers);
  pp.local_steps = h;
  auto p = ps::make_policy("local_sgd", pp);
  BOOST_REQUIRE_MESSAGE(p.has_value(), (p ? std::string() : p.error().message()));
  return std::move(*p);
}

// Values whose sums depend on their order.
float irrational(std::uint32_t w, std::uint64_t t, std::size_t i) {
  return 1e-3f * std::sin(0.7f * static_cast<float>(w + 1) + 0.31f * static_cast<float>(t) + 1.3f * static_cast<float>(i));
}

sim::run_result run(sim::cluster_spec spec, ss::any_policy pol, sim::hooks h, sim::server_setup setup,
                    const sim::run_options& o, std::vector<float>* params = nullptr) {
  auto s = sim::simulator<>::create(std::move(spec), std::move(pol), std::move(h), setup);
  BOOST_REQUIRE_MESSAGE(s.has_value(), (s ? std::string() : s.error().message()));
  auto r = s->run(o);
  BOOST_REQUIRE_MESSAGE(r.error.empty(), r.error);
  if (params) *params = s->parameters();
  return r;
}
}  // namespace

// Peak bytes per sync drop P×, the total stays (headers aside), counted in
// bytes: plain Local SGD(8) for 4 commits (32 inner steps) against P = 4
// fragments, τ = 2, for 16 fragment commits (each covers 8 steps; the 16th
// follows step 8 + 2·15 = 38, as fragment p first syncs after 8 + 2p).
BOOST_AUTO_TEST_CASE(peak_bytes_per_sync_drop_p_times) {
  const std::uint64_t model = 4'000'000, header = 72;
  std::vector<sim::worker_spec> ws{worker(0.01, 1e8, 1e-3), worker(0.02, 5e7, 1e-3), worker(0.03, 2e7, 1e-3)};
  const auto plain = run(cluster(ws, model), local_sgd(3, 8), {}, {}, {.commits_per_worker = 4});
  const auto streamed = run(cluster(ws, model), local_sgd(3, 8), {},
                            {.streaming = ps::streaming_params{.fragments = 4, .interval = 8, .delay = 2, .alpha = 0.5}},
                            {.commits_per_worker = 16});
  for (std::size_t w = 0; w < ws.size(); ++w) {
    const auto& a = plain.workers[w];
    const auto& b = streamed.workers[w];
    BOOST_TEST(a.iterations == 32u);
    BOOST_TEST(b.iterations == 38u);
    BOOST_TEST(a.bytes_sent == 4 * (model + header));
    BOOST_TEST(b.bytes_sent == 16 * (model / 4 + header));
    BOOST_TEST(a.peak_sync_bytes == 2 * (model + header));
    BOOST_TEST(b.peak_sync_bytes == 2 * (model / 4 + header));
  }
  BOOST_TEST(streamed.commits == 48u);
}

// P = 1, τ = 0, α = 0 is Local SGD(H): the same parameters bit for bit, the
// same virtual end time and bytes, on a run whose sums depend on their order
// (uneven workers, jitter, two servers, a shared server link).
BOOST_AUTO_TEST_CASE(one_fragment_is_local_sgd_bit_for_bit) {
  const std::size_t n = 37, m = 3;
  std::vector<float> w0(n);
  for (std::size_t i = 0; i < n; ++i) w0[i] = 0.01f * static_cast<float>(i) - 0.2f;
  const sim::jitter_spec jit{.kind = sim::jitter_kind::lognormal, .param = 0.2};
  std::vector<sim::worker_spec> ws{worker(0.01, 1e5, 1e-3, jit), worker(0.015, 2e5, 2e-3, jit),
                                   worker(0.03, 1e5, 1e-3, jit)};
  const auto spec = cluster(ws, 4 * n, 2, 72, 3e5);
  const sim::server_setup base{.elements = n, .initial = w0};
  sim::server_setup streamed = base;
  streamed.streaming = ps::streaming_params{.fragments = 1, .interval = 4, .delay = 0, .alpha = 0.0};

  trainer a(n, m, w0, 0.0, irrational), b(n, m, w0, 0.0, irrational);
  std::vector<float> pa, pb;
  const auto ra = run(spec, local_sgd(m, 4), a.hooks(), base, {.commits_per_worker = 6}, &pa);
  const auto rb = run(spec, local_sgd(m, 4), b.hooks(), streamed, {.commits_per_worker = 6}, &pb);
  BOOST_TEST(pa == pb, boost::test_tools::per_element());
  BOOST_TEST(ra.end_time == rb.end_time);
  BOOST_TEST(ra.commits == rb.commits);
  for (std::size_t w = 0; w < m; ++w) {
    BOOST_TEST(ra.workers[w].bytes_sent == rb.workers[w].bytes_sent);
    BOOST_TEST(ra.workers[w].iterations == rb.workers[w].iterations);
    BOOST_TEST(a.local[w] == b.local[w], boost::test_tools::per_element());
  }
  BOOST_TEST(pa[0] != w0[0]);  // the run moved the parameters
}

// H = 4, P = 2, τ = 1, α = 1/2 on two servers: the servers' parameters after
// 8 syncs per worker against the rule computed by hand in lock step
// (fragment 0 syncs after steps 4, 8, ...; fragment 1 after 6, 10, ...; each
// merged one step later), whatever the workers' speeds.
BOOST_AUTO_TEST_CASE(fragments_against_a_lock_step_reference) {
  const std::size_t n = 12, m = 2;
  const std::vector<float> w0(n, 0.5f);
  const double alpha = 0.5;
  // Layout even(12, 2 servers × 2 fragments): core k·2 + p; fragment 0 is
  // elements [0, 3) and [6, 9), fragment 1 is [3, 6) and [9, 12).
  auto in_fragment = [](std::size_t i) -> std::uint32_t { return (i % 6) < 3 ? 0u : 1u; };

  std::vector<std::vector<float>> local(m, w0), ref(m, w0);
  std::vector<float> global = w0;
  std::vector<std::vector<float>> pending(2, w0);  // the servers' answer to each fragment's last sync
  for (std::uint64_t t = 1; t <= 18; ++t) {
    for (std::uint32_t w = 0; w < m; ++w)
      for (std::size_t i = 0; i < n; ++i) local[w][i] += dyadic(w, t, i);
    // The merge of the fragment synced after step t − 1.
    if (t >= 5 && ((t - 1) % 4 == 0 || (t - 1) % 4 == 2)) {
      const std::uint32_t q = (t - 1) % 4 == 0 ? 0 : 1;
      for (std::uint32_t w = 0; w < m; ++w)
        for (std::size_t i = 0; i < n; ++i)
          if (in_fragment(i) == q) {
            local[w][i] = 0.5f * local[w][i] + 0.5f * pending[q][i];
            ref[w][i] = pending[q][i];
          }
    }
    if (t >= 4 && (t % 4 == 0 || t % 4 == 2)) {
      const std::uint32_t p = t % 4 == 0 ? 0 : 1;
      for (std::size_t i = 0; i < n; ++i)
        if (in_fragment(i) == p) {
          for (std::uint32_t w = 0; w < m; ++w) global[i] += 0.5f * (local[w][i] - ref[w][i]);
          pending[p][i] = global[i];
        }
    }
  }

  for (double slow : {1.0, 3.0}) {
    trainer tr(n, m, w0, alpha, dyadic);
    std::vector<float> params;
    const auto r = run(cluster({worker(0.01, 1e4, 1e-3), worker(0.01 * slow, 5e3, 2e-3)}, 4 * n, 2), local_sgd(m, 4),
                       tr.hooks(),
                       {.elements = n, .initial = w0,
                        .streaming = ps::streaming_params{.fragments = 2, .interval = 4, .delay = 1, .alpha = alpha}},
                       {.commits_per_worker = 8}, &params);
    BOOST_TEST(params == global, boost::test_tools::per_element());
    BOOST_TEST(r.commits == 16u);
    BOOST_TEST(r.workers[0].iterations == 18u);
  }
}

BOOST_AUTO_TEST_CASE(bad_streaming_setups_are_refused_by_name) {
  auto refused = [](sim::cluster_spec spec, sim::hooks h, sim::server_setup setup, const std::string& field) {
    const std::size_t m = sim::initial_workers(spec);
    auto s = sim::simulator<>::create(std::move(spec), local_sgd(m, 4), std::move(h), setup);
    BOOST_REQUIRE(!s.has_value());
    BOOST_TEST(s.error().message().find(field) != std::string::npos, s.error().message());
  };
  trainer tr(8, 2, std::vector<float>(8, 0.0f), 0.0, dyadic);
  const auto spec = cluster({worker(0.01), worker(0.01)}, 32, 2);
  // 8 parameters over 2 servers: at most 4 fragments.
  refused(spec, tr.hooks(), {.elements = 8, .streaming = ps::streaming_params{.fragments = 5, .interval = 8}},
          "streaming.fragments");
  refused(spec, tr.hooks(), {.elements = 8, .streaming = ps::streaming_params{.fragments = 2, .interval = 4, .delay = 4}},
          "streaming.delay");
  refused(spec, tr.hooks(),
          {.elements = 8, .streaming = ps::streaming_params{.fragments = 2, .interval = 4, .alpha = 2.0}},
          "streaming.alpha");
  refused(spec, tr.hooks(), {.elements = 8, .streaming = ps::streaming_params{.fragments = 0, .interval = 4}},
          "streaming.fragments");
  sim::hooks no_merge = tr.hooks();
  no_merge.merge = nullptr;
  refused(spec, no_merge, {.elements = 8, .streaming = ps::streaming_params{.fragments = 2, .interval = 4}},
          "hooks.merge");
  auto dying = spec;
  dying.changes.push_back({.at = 1.0, .worker = 1, .kind = sim::change_kind::die});
  refused(dying, tr.hooks(), {.elements = 8, .streaming = ps::streaming_params{.fragments = 2, .interval = 4}},
          "spec.changes.kind = \"die\"");
  // Membership changes (docs/elastic.md §2.5) too: a joiner past the
  // initial workers, a worker that leaves.
  auto joining = spec;
  joining.workers.push_back(joining.workers.back());
  joining.changes.push_back({.at = 1.0, .worker = 2, .kind = sim::change_kind::join});
  refused(joining, tr.hooks(), {.elements = 8, .streaming = ps::streaming_params{.fragments = 2, .interval = 4}},
          "spec.changes.kind = \"join\"");
  auto leaving = spec;
  leaving.changes.push_back({.at = 1.0, .worker = 1, .kind = sim::change_kind::leave});
  refused(leaving, tr.hooks(), {.elements = 8, .streaming = ps::streaming_params{.fragments = 2, .interval = 4}},
          "spec.changes.kind = \"leave\"");
}

// Streaming DiLoCo with 4-bit pseudo-gradients: Local SGD's plans are dense,
// and the server's compression_ratio makes every one commit with the block
// codec at the server's options (ps::plan_with_codec_options, the rule of
// the real server too); in timing mode a sync's bytes are the ratio's share
// of the fragment. A ratio with the identity codec is refused by name.
BOOST_AUTO_TEST_CASE(four_bit_pseudo_gradients_under_a_dense_policy) {
  const std::size_t n = 1024, m = 2;
  const std::vector<float> w0(n, 0.25f);
  trainer tr(n, m, w0, 0.5, dyadic);
  sim::hooks h = tr.hooks();
  std::vector<std::pair<ashl::codec_id, ashl::worker_plan>> seen;
  h.compute = [&seen, inner = h.compute](const sim::compute_request& q, std::span<sim::shard_payload> out) {
    seen.emplace_back(q.codec, *q.plan);
    inner(q, out);
  };
  const sim::server_setup setup{.elements = n,
                                .initial = w0,
                                .compression = ashl::codec_id::block,
                                .compression_options = {.bits = 4, .block = 64},
                                .compression_ratio = 0.125f,
                                .streaming = ps::streaming_params{.fragments = 2, .interval = 4, .delay = 1, .alpha = 0.5}};
  const auto spec = cluster({worker(0.01, 1e6, 1e-3), worker(0.02, 1e6, 1e-3)}, 4 * n);
  run(spec, local_sgd(m, 4), h, setup, {.commits_per_worker = 4});
  BOOST_TEST_REQUIRE(!seen.empty());
  for (const auto& [codec, plan] : seen) {
    BOOST_TEST((codec == ashl::codec_id::block));
    BOOST_TEST(plan.compression_ratio == 0.125f);
    BOOST_TEST(plan.codec_bits == 4u);
    BOOST_TEST(plan.codec_block == 64u);
  }

  // Timing mode: each sync carries an eighth of its fragment.
  const std::uint64_t model = 4'000'000, header = 72;
  const auto r = run(cluster({worker(0.01, 1e8, 1e-3), worker(0.02, 1e8, 1e-3)}, model), local_sgd(m, 8), {},
                     {.compression = ashl::codec_id::block,
                      .compression_options = {.bits = 4},
                      .compression_ratio = 0.125f,
                      .streaming = ps::streaming_params{.fragments = 4, .interval = 8, .delay = 2, .alpha = 0.5}},
                     {.commits_per_worker = 8});
  for (const auto& w : r.workers) BOOST_TEST(w.bytes_sent == 8 * (model / 8 / 4 + header));

  // 4-bit replies too (server_setup::replies): every fragment reply after
  // the join's (the initial parameters, not timed) is the block codec's
  // payload of a quarter of the model: 16 bytes of header, a f32 step per
  // 64 values, 4 bits a value (docs/wire-format.md "block").
  const auto both = run(cluster({worker(0.01, 1e8, 1e-3), worker(0.02, 1e8, 1e-3)}, model), local_sgd(m, 8), {},
                        {.compression = ashl::codec_id::block,
                         .compression_options = {.bits = 4},
                         .compression_ratio = 0.125f,
                         .replies = {.codec = ashl::codec_id::block, .options = {.bits = 4, .block = 64}},
                         .streaming = ps::streaming_params{.fragments = 4, .interval = 8, .delay = 2, .alpha = 0.5}},
                        {.commits_per_worker = 8});
  const std::uint64_t fragment = model / 4 / 4;  // elements
  const std::uint64_t block4 = 16 + 4 * ((fragment + 63) / 64) + fragment / 2;
  BOOST_TEST_REQUIRE(both.workers.size() == r.workers.size());
  for (std::size_t k = 0; k < r.workers.size(); ++k) {
    BOOST_TEST(both.workers[k].bytes_sent == 8 * (model / 8 / 4 + header));
    // The replies that arrived before the run stopped (the last syncs' are
    // on the wire): as many as with dense replies, each an eighth-ish.
    const std::uint64_t dense_replies = r.workers[k].bytes_received / (model / 4 + header);
    BOOST_TEST(r.workers[k].bytes_received == dense_replies * (model / 4 + header));
    BOOST_TEST(dense_replies >= 6u);
    BOOST_TEST(both.workers[k].bytes_received == dense_replies * (block4 + header));
  }

  auto s = sim::simulator<>::create(cluster({worker(0.01), worker(0.01)}, 32), local_sgd(m, 4), {},
                                    {.compression = ashl::codec_id::identity, .compression_ratio = 0.5f});
  BOOST_REQUIRE(!s.has_value());
  BOOST_TEST(s.error().message() ==
             "server.compression_ratio = 0.5: must be 1 with compression identity (nothing would compress)");
}
