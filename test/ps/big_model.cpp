#include <ashl/ps/server.hpp>

#include <cstdio>

// A ResNet-50-sized model (25,557,032 f32 parameters, 102 MB) trains with
// the defaults: BSP, 4 workers, 1 and 2 servers, real processes over UCX on
// loopback (shared memory), a few cycles. Before issue 24 the fixed 64 MiB
// commit store refused a one-server shard at creation and a round of 4
// dense commits at run time; the store is now workers x the largest commit
// by default (ps::automatic_store_bytes). The parameters must equal a
// single-process server_core run's bit for bit.

#if !ASHL_HAS_UCX() || !defined(ASHL_TEST_PS_NODE) || !defined(ASHL_RUN_PATH)
int main() {
  std::puts("skipped: ps/big_model needs the ucx component (UCX and OpenSSL) and ashl-run");
  return 77;
}
#else

#include <boost/test/unit_test.hpp>

#include "../support/node_files.hpp"
#include "../support/process.hpp"
#include "../support/ps_job.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace ps = ashl::ps;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t resnet50 = 25'557'032;
const std::vector<std::pair<std::string, std::string>> shm = {{"UCX_TLS", "sm,self,tcp"}, {"UCX_NET_DEVICES", "lo"}};

// The BSP run the processes must equal: one server_core over the whole
// model, with the default params (store_bytes automatic), every worker's
// cycle-c gradient in round c.
std::vector<float> bsp_reference(std::uint32_t workers, std::size_t elements, int cycles) {
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
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = ps_job::grad_value(k, static_cast<std::uint64_t>(c), i);
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

}  // namespace

BOOST_AUTO_TEST_CASE(resnet50_sized_bsp_with_4_workers_trains_with_the_defaults) {
  constexpr int cycles = 2;
  const auto want = bsp_reference(4, resnet50, cycles);
  for (std::uint32_t servers : {1u, 2u}) {
    const std::string what = "servers " + std::to_string(servers);
    const std::string dir = process::temp_dir("ashl-big-model");
    BOOST_TEST_REQUIRE(!dir.empty());
    const std::string shared = dir + "/counters";
    {
      std::ofstream f(shared, std::ios::binary);
      std::vector<char> zeros(64 * 8, 0);
      f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
    }
    const std::vector<std::string> argv = {
        ASHL_RUN_PATH, "-s", std::to_string(servers), "-w", "4", "--timeout", "120", "--", ASHL_TEST_PS_NODE,
        "--out", dir, "--shared", shared, "--policy", "bsp", "--elements", std::to_string(resnet50), "--cycles",
        std::to_string(cycles), "--timeout-ms", "60000", "--worker-timeout-ms", "60000"};
    const auto run = process::run(argv, shm, 150s, dir + "/log.txt");
    BOOST_TEST_REQUIRE(run.exit_code == 0, what << "\n" << run.log());
    std::vector<float> params;
    for (std::uint32_t s = 0; s < servers; ++s) {
      std::ifstream f(dir + "/server" + std::to_string(s) + ".f32", std::ios::binary);
      std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      const std::size_t n0 = params.size();
      params.resize(n0 + bytes.size() / sizeof(float));
      if (!bytes.empty()) std::memcpy(params.data() + n0, bytes.data(), bytes.size());
      const auto c = node_files::read_counters(dir + "/server" + std::to_string(s) + ".txt");
      BOOST_TEST(c.at("commits_applied") == 4.0 * cycles, what);
      BOOST_TEST(c.at("refused") + c.at("wire_refused") == 0.0, what);
      BOOST_TEST(c.at("finished") == 1.0, what);
    }
    for (std::uint32_t k = 0; k < 4; ++k) {
      const auto c = node_files::read_counters(dir + "/worker" + std::to_string(k) + ".txt");
      BOOST_TEST(c.at("commits") == cycles, what);
    }
    BOOST_TEST_REQUIRE(params.size() == resnet50, what);
    BOOST_TEST(std::memcmp(params.data(), want.data(), resnet50 * sizeof(float)) == 0, what);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);  // 100 MB of shard files per run
  }
}

#endif
