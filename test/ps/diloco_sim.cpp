// The DiLoCo family through both drivers: the simulator and real ps::server
// processes (ashl_test_ps_node over UCX on 127.0.0.1) run the same seeded
// job (each worker's delta in cycle c is ps_node's grad_value(rank, c, i),
// multiples of 1/8) and end with the same parameters, bit for bit: the
// outer optimizer (rules/optimizer.hpp) runs in ps::server_core, which both
// drive (docs/sim.md, docs/ps.md). diloco with two workers (a round's mean
// of two such deltas is exact, so the order in which a real round's
// commits arrive cannot change a bit); async_diloco and ashl_diloco with one
// worker (per-commit outer steps in the one order there is); and
// async_diloco with 4-bit pseudo-gradients (the servers' compression_ratio
// turns the block codec on for DiLoCo's dense plans: ps::plan_with_codec_options
// in both drivers; the simulated worker encodes as ps::worker does).
#include <ashl/sim/simulator.hpp>

#include <cstdio>

#if !ASHL_HAS_UCX() || !defined(ASHL_TEST_PS_NODE)
int main() {
  std::puts("skipped: ps/diloco_sim needs the ucx component (UCX and OpenSSL)");
  return 77;
}
#else

#include <ashl/compress/identity.hpp>
#include <ashl/rules/commit_encoder.hpp>
#include <ashl/rules/policies.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/fault_job.hpp"

#include <chrono>
#include <cmath>
#include <limits>
#include <cstring>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

namespace ps = ashl::ps;
namespace sim = ashl::sim;

constexpr std::uint64_t elements = 64;

// ps_node's worker update (test/programs/ps_node.cpp).
float grad_value(std::uint32_t rank, std::uint64_t step, std::size_t i) {
  const std::uint64_t h = (rank * 2654435761u) ^ (step * 40503u) ^ (i * 2246822519u);
  return static_cast<float>(static_cast<int>((h >> 7) % 65) - 32) / 8.0f;
}

ps::policy_params params_of(std::uint32_t workers, std::int64_t outer_delay) {
  ps::policy_params pp;
  pp.workers = workers;
  pp.outer_delay = outer_delay;
  pp.profile_iterations = 3;  // ps_node --profile-iterations 3
  return pp;
}

struct codec_choice {
  std::string name = "identity";  // ps_node --codec
  float ratio = 1.0f;             // ps_node --codec-ratio (server_params.compression_ratio)
  std::string reply = "identity";  // ps_node --reply-codec (server_core_params::replies)
  // ps_node --quadratic T: the worker's delta is 0.5 (T - w), w the
  // parameters its last reply gave it, so the servers' parameters depend on
  // what the workers received (compressed replies: their views).
  float quadratic = std::numeric_limits<float>::quiet_NaN();
  float spread = 0.25f;  // ps_node --quadratic-spread: T_i = T + spread·((i mod 7) − 3)
};

float target(const codec_choice& cc, std::size_t i) {
  return cc.quadratic + cc.spread * static_cast<float>(static_cast<int>(i % 7) - 3);
}

std::vector<float> simulated(const std::string& policy, std::uint32_t workers, int cycles, std::int64_t outer_delay,
                             const codec_choice& cc) {
  const auto pp = params_of(workers, outer_delay);
  auto pol = ps::make_policy(policy, pp);
  BOOST_TEST_REQUIRE(pol.has_value());
  sim::cluster_spec spec;
  spec.model_bytes = 4 * elements;
  for (std::uint32_t w = 0; w < workers; ++w)
    spec.workers.push_back({.seconds_per_iteration = 0.01 * (w + 1), .bandwidth_bytes_per_s = 1e9});
  spec.servers = {sim::server_spec{.bandwidth_bytes_per_s = 1e9}};
  std::vector<std::vector<std::byte>> buf(workers, std::vector<std::byte>(4 * elements));
  std::vector<ps::commit_encoder> enc(workers);  // ps::worker's: error feedback on, seed 0
  const auto spec_of = ps::parse_codec_spec(cc.name, "codec");
  BOOST_TEST_REQUIRE(spec_of.has_value());
  const auto reply_of = ps::parse_codec_spec(cc.reply, "reply");
  BOOST_TEST_REQUIRE(reply_of.has_value());
  // What each worker holds: the initial parameters (its join's pull), then its replies.
  std::vector<std::vector<float>> model(workers, std::vector<float>(elements, 0.5f));
  sim::hooks h;
  h.serve = [&](ashl::sync::worker_id w, std::uint32_t, std::span<const float> p) {
    BOOST_TEST_REQUIRE(p.size() == elements);
    model[w].assign(p.begin(), p.end());
  };
  h.compute = [&](const sim::compute_request& q, std::span<sim::shard_payload> out) {
    std::vector<float> delta(elements);
    for (std::size_t i = 0; i < elements; ++i)
      delta[i] = std::isnan(cc.quadratic) ? grad_value(q.worker, q.sequence - 1, i)
                                          : 0.5f * (target(cc, i) - model[q.worker][i]);
    if (q.codec == ashl::codec_id::identity) {
      (void)ashl::compress::identity{}.encode(ashl::host_view<const float>(delta.data(), elements), buf[q.worker], {});
      out[0] = {.codec = ashl::codec_id::identity, .element_count = elements, .bytes = buf[q.worker]};
      return;
    }
    auto& e = enc[q.worker];
    BOOST_TEST_REQUIRE(e.set(q.codec, q.plan->compression_ratio, q.plan->compression_options()).ok());
    const auto bytes = e.encode(0, delta, q.sequence);
    BOOST_TEST_REQUIRE(bytes.has_value());
    out[0] = {.codec = q.codec, .element_count = elements, .step = q.sequence, .bytes = *bytes};
  };
  const std::vector<float> initial(elements, 0.5f);  // ps_node's
  auto s = sim::simulator<>::create(std::move(spec), std::move(*pol), std::move(h),
                                    {.elements = elements,
                                     .optimizer = *ps::outer_optimizer_of(policy, pp),
                                     .initial = initial,
                                     .compression = spec_of->id,
                                     .compression_options = spec_of->options,
                                     .compression_ratio = cc.ratio,
                                     .replies = {.codec = reply_of->id, .options = reply_of->options}});
  BOOST_TEST_REQUIRE(s.has_value(), (s ? std::string() : s.error().message()));
  const auto r = s->run({.commits_per_worker = static_cast<std::uint64_t>(cycles)});
  BOOST_TEST_REQUIRE(r.error.empty(), r.error);
  return s->parameters();
}

std::vector<float> real(const std::string& policy, std::uint32_t workers, int cycles, std::int64_t outer_delay,
                        const codec_choice& cc) {
  fault_job::job j(workers);
  BOOST_TEST_REQUIRE(j.ok());
  std::vector<std::string> common = {"--policy", policy, "--outer-delay", std::to_string(outer_delay),
                                           "--elements", std::to_string(elements), "--codec", cc.name,
                                           "--codec-ratio", std::to_string(cc.ratio), "--profile-iterations", "3",
                                           "--reply-codec", cc.reply};
  if (!std::isnan(cc.quadratic))
    common = fault_job::cat(common, {"--quadratic", std::to_string(cc.quadratic), "--quadratic-spread",
                                     std::to_string(cc.spread)});
  const pid_t srv = j.start_server(common);
  BOOST_TEST_REQUIRE(srv > 0);
  std::vector<pid_t> w;
  for (std::uint32_t k = 0; k < workers; ++k)
    w.push_back(j.start_worker(k, fault_job::cat(common, {"--cycles", std::to_string(cycles)})));
  for (std::uint32_t k = 0; k < workers; ++k) {
    const auto o = j.finish(w[k], 60s, "worker" + std::to_string(k) + ".log");
    BOOST_TEST_REQUIRE(o.exit_code == 0, o.log());
  }
  const auto so = j.finish(srv, 60s, "server.log");
  BOOST_TEST_REQUIRE(so.exit_code == 0, so.log());
  if (cc.reply != "identity") {  // every reply after the join's went compressed, and the worker took each
    const auto sc = j.server_counters();
    BOOST_TEST(sc.at("compressed_replies") == static_cast<double>(cycles) * workers);
    for (std::uint32_t k = 0; k < workers; ++k)
      BOOST_TEST(j.worker_counters(k).at("compressed_replies") == static_cast<double>(cycles));
  }
  return j.parameters();
}

void same(const std::string& policy, std::uint32_t workers, int cycles, std::int64_t outer_delay,
          const codec_choice& cc = {}) {
  const auto s = simulated(policy, workers, cycles, outer_delay, cc);
  const auto r = real(policy, workers, cycles, outer_delay, cc);
  BOOST_TEST_REQUIRE(s.size() == elements);
  BOOST_TEST_REQUIRE(r.size() == elements);
  BOOST_TEST(std::memcmp(s.data(), r.data(), elements * sizeof(float)) == 0,
             policy << ": simulator " << s[0] << " " << s[1] << ", server " << r[0] << " " << r[1]);
  BOOST_TEST(s != std::vector<float>(elements, 0.5f), policy << ": nothing was applied");
}

}  // namespace

BOOST_AUTO_TEST_CASE(diloco_two_workers_simulator_equals_server) { same("diloco", 2, 6, 0); }
BOOST_AUTO_TEST_CASE(async_diloco_delayed_nesterov_simulator_equals_server) { same("async_diloco", 1, 8, 3); }
BOOST_AUTO_TEST_CASE(ashl_diloco_simulator_equals_server) { same("ashl_diloco", 1, 8, 2); }
BOOST_AUTO_TEST_CASE(async_diloco_four_bit_simulator_equals_server) {
  same("async_diloco", 1, 8, 3, {.name = "block4:64", .ratio = 0.125f});
}
// 4-bit both ways: the worker's next pseudo-gradient is computed from what
// the compressed replies gave it, so the servers' parameters are equal only
// if the real worker's view equals the simulator's (server_core's) bit for
// bit. Checked to fail with the simulator's replies dense.
BOOST_AUTO_TEST_CASE(diloco_four_bit_both_ways_simulator_equals_server) {
  same("diloco", 1, 8, 0, {.name = "block4:64", .ratio = 0.125f, .reply = "block4:64", .quadratic = 2.0f});
}
BOOST_AUTO_TEST_CASE(diloco_quadratic_dense_replies_simulator_equals_server) {
  same("diloco", 1, 8, 0, {.quadratic = 2.0f});
}
BOOST_AUTO_TEST_CASE(async_diloco_four_bit_replies_simulator_equals_server) {
  same("async_diloco", 1, 8, 3, {.reply = "block4:64", .quadratic = 2.0f});
}

#endif
