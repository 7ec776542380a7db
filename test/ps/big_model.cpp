#include <ashl/ps/server.hpp>

#include <cstdio>

// A ResNet-50-sized model (25,557,032 f32 parameters, 102 MB) trains with
// the defaults: BSP, 4 workers, 1 and 2 servers, real processes over UCX on
// loopback (shared memory), a few cycles. A fixed 64 MiB
// commit store once refused a one-server shard at creation and a round of 4
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

using ps_job::bsp_reference;  // the BSP run the processes must equal

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
