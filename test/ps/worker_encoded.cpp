#include <ashl/ps/worker.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/compress/error_feedback.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/transport/inproc.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>
#include "../support/checks.hpp"

// ps::worker::commit_encoded (the entry a device worker uses: the caller
// encodes, the worker sends): refused outside a compressing cycle and with
// the wrong number of payloads; payloads encoded by the caller with the
// plan's codec and {seed, commit_step(), shard} leave the servers with the
// same parameters, bit for bit, as commit() encoding the same gradients.

namespace ps = ashl::ps;
namespace tr = ashl::transport;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t elements = 1000;
constexpr std::uint32_t servers = 2;
constexpr int cycles = 12;

float grad(int cycle, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 37 + static_cast<std::size_t>(cycle) * 101) % 65) - 32) / 8.0f;
}

struct outcome {
  std::vector<float> w;                       // the worker's parameters at the end
  std::vector<std::vector<float>> server_w;   // each server's shard
  std::uint64_t refused = 0;
  int compressed_cycles = 0;
  std::vector<std::string> refusals;          // commit_encoded's errors where it must refuse
};

// One worker and `servers` servers over inproc under ASHL's AHL stage at
// ratio 0.05 (top-k); encoded = true: commit_encoded with the caller's
// error_feedback<topk>, else commit().
outcome run(bool encoded) {
  auto fabric = tr::inproc_fabric::create({});
  auto layout = ps::shard_layout::even(elements, servers);
  ASHL_REQUIRE(layout.has_value());
  std::vector<float> initial(elements, 0.5f);
  outcome out;
  out.server_w.resize(servers);
  std::vector<ps::server_telemetry> tel(servers);
  std::atomic<bool> stop{false};
  std::atomic<int> up{0};
  std::vector<std::thread> th;
  for (std::uint32_t s = 0; s < servers; ++s) {
    th.emplace_back([&, s] {
      auto node = fabric->node("server" + std::to_string(s));
      ps::policy_params pp;
      pp.workers = 1;
      pp.profile_iterations = 1;
      pp.h_ahl = 1;
      pp.compression_ratio = 0.05;
      pp.switch_loss = -1.0;
      auto policy = ps::make_policy("ashl", pp);
      const auto r = layout->range(s);
      auto srv = ps::server<tr::inproc>::create(
          {.core = {.layout = *layout, .shard = s, .workers = 1,
                    .optimizer = {.mode = ps::optimizer_params::kind::model_delta}}},
          std::move(*policy), std::move(*node), std::span<const float>(initial).subspan(r.begin, r.size()));
      ++up;
      srv->run(stop);
      out.server_w[s].assign(srv->parameters().begin(), srv->parameters().end());
      tel[s] = srv->telemetry();
    });
  }
  while (up.load() < static_cast<int>(servers)) std::this_thread::sleep_for(1ms);

  std::vector<float> w(elements), g(elements);
  auto node = fabric->node();
  auto wk = ps::worker<tr::inproc>::create({.servers = {"server0", "server1"}, .timeout = 20s, .seed = 5},
                                           std::move(*node), w);
  ASHL_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
  ashl::compress::error_feedback<ashl::compress::topk> ef{ashl::compress::topk{0.05}};
  std::vector<std::vector<std::byte>> enc(servers);
  std::vector<std::byte> scratch;
  // Dense cycles of zero gradients until the plan compresses. The cycle at
  // which the ASHL plan reaches the worker depends on timing (under ASan it
  // came one cycle later in one run than in the other), and a zero
  // model_delta leaves the parameters as they are, so both runs start their
  // measured cycles from the same parameters and the same plan.
  for (int c = 0; c < 200 && !wk->compresses(); ++c) {
    while (!wk->iteration_done()) {}
    std::fill(g.begin(), g.end(), 0.0f);
    if (encoded) {  // a dense cycle refuses encoded payloads
      std::vector<std::span<const std::byte>> none(servers);
      out.refusals.push_back(wk->commit_encoded(none).message());
    }
    ASHL_REQUIRE(wk->commit(g).ok());
    const auto s = wk->wait();
    ASHL_REQUIRE(s.ok(), s.message());
  }
  ASHL_REQUIRE(wk->compresses());
  for (int c = 0; c < cycles; ++c) {
    while (!wk->iteration_done()) {}
    for (std::size_t i = 0; i < elements; ++i) g[i] = grad(c, i);
    if (!wk->compresses()) {
      if (encoded) {  // a dense cycle refuses encoded payloads
        std::vector<std::span<const std::byte>> none(servers);
        out.refusals.push_back(wk->commit_encoded(none).message());
      }
      ASHL_REQUIRE(wk->commit(g).ok());
    } else if (!encoded) {
      ++out.compressed_cycles;
      ASHL_REQUIRE(wk->commit(g).ok());
    } else {
      ++out.compressed_cycles;
      ASHL_REQUIRE((wk->codec() == ashl::codec_id::topk));
      std::vector<std::span<const std::byte>> payloads;
      for (std::uint32_t s = 0; s < servers; ++s) {
        const auto r = wk->layout().range(s);
        enc[s].resize(ef.max_encoded_bytes(r.size(), ashl::dtype::f32));
        scratch.resize(ef.scratch_bytes(r.size(), ashl::dtype::f32));
        const ashl::compress::codec_context ctx{.seed = 5, .step = wk->commit_step(), .tensor = s, .scratch = scratch};
        auto used = ef.encode(ashl::host_view<const float>(g.data() + r.begin, r.size()), enc[s], ctx);
        ASHL_REQUIRE(used.has_value());
        payloads.emplace_back(enc[s].data(), *used);
      }
      std::vector<std::span<const std::byte>> one(1, payloads[0]);
      out.refusals.push_back(wk->commit_encoded(one).message());  // one payload for two servers
      ASHL_REQUIRE(wk->commit_encoded(payloads).ok());
    }
    const auto s = wk->wait();
    ASHL_REQUIRE(s.ok(), s.message());
  }
  ASHL_REQUIRE(wk->leave().ok());
  stop = true;
  for (auto& t : th) t.join();
  out.w = w;
  for (const auto& t : tel) out.refused += t.core.refused_total();
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(encoded_commits_equal_the_workers_own_encoding) {
  const outcome a = run(false);
  const outcome b = run(true);
  ASHL_TEST(a.compressed_cycles > 0);
  ASHL_TEST(b.compressed_cycles > 0);
  ASHL_TEST(a.refused == 0u);
  ASHL_TEST(b.refused == 0u);
  // The same plan sequence (one worker: plans arrive in message order), so
  // the same commits: parameters bit for bit.
  ASHL_TEST(a.compressed_cycles == b.compressed_cycles);
  ASHL_TEST((a.w == b.w));
  ASHL_TEST((a.server_w == b.server_w));
  ASHL_TEST((b.w != std::vector<float>(elements, 0.5f)));  // something was applied
  bool dense_refused = false, count_refused = false;
  for (const auto& m : b.refusals) {
    dense_refused |= m.find("does not compress") != std::string::npos;
    count_refused |= m.find("worker.commit_encoded.payloads.size = 1") != std::string::npos;
  }
  ASHL_TEST(dense_refused);
  ASHL_TEST(count_refused);
}
