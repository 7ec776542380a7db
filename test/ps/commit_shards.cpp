#include <ashl/ps/worker.hpp>

#include <cstdio>

// A commit split over two servers is all or nothing (docs/ps.md "All or nothing across shards"):
// with a NaN in one server's half, server 1 refused its half while server 0
// applied the other, so the model took half an update. The worker now
// checks every shard's part before any is sent (rules/commit_check.hpp, the
// servers' own value rule): the commit fails naming the element, neither
// server applies anything, and a fixed commit then goes to both. Two servers
// as real processes over UCX/TCP on 127.0.0.1, the worker in this process.

#if !ASHL_HAS_UCX()
int main() {
  std::puts("skipped: ps/commit_shards needs the ucx component (UCX and OpenSSL)");
  return 77;
}
#else

#include <boost/test/unit_test.hpp>

#include "../support/forked_server.hpp"

#include <cmath>
#include <limits>

namespace {

using ashl_test::child;

const std::string token = "commit-shards-token-0123456789";

// Server `shard` of 2 (ASP, model deltas at lr 1) for one worker, forked
// before this process has any UCX object: its address, then at SIGTERM its
// counters and its parameters' sum.
child start_server(std::uint32_t shard, std::size_t elements, std::string& address) {
  return ashl_test::start_server(
      {.token = token, .elements = elements, .shard = shard, .shards = 2}, {},
      {.core = {.optimizer = {.mode = ps::optimizer_params::kind::model_delta, .lr = 1.0}},
       .stop_when_all_left = false,
       .worker_timeout = 0ms},
      address, [](auto&, int) {},
      [](auto& srv) {
        const ps::server_telemetry s = srv.telemetry();
        double sum = 0;
        for (float v : srv.parameters()) sum += v;
        std::ostringstream line;
        line << "applied=" << s.core.commits_applied << " refused=" << s.core.refused_total() << " sum=" << sum;
        return line.str();
      });
}

std::map<std::string, double> stop_server(child& c) { return ashl_test::stop_and_read(c); }

}  // namespace

BOOST_AUTO_TEST_CASE(a_poisoned_part_leaves_both_shards_unchanged_and_names_the_element) {
  ::setenv("UCX_TLS", "tcp,self", 1);
  constexpr std::size_t elements = 1024;  // server 0: [0, 512), server 1: [512, 1024)
  std::string a0, a1;
  child s0 = start_server(0, elements, a0);
  child s1 = start_server(1, elements, a1);
  BOOST_TEST_REQUIRE((!a0.empty() && a0.rfind("error", 0) != 0), a0);
  BOOST_TEST_REQUIRE((!a1.empty() && a1.rfind("error", 0) != 0), a1);
  {
    std::vector<float> w(elements, 0.0f);
    auto t = tr::ucx::create({.token = token, .retry_interval = 50ms});
    BOOST_TEST_REQUIRE(t.has_value());
    auto wk = ps::worker<tr::ucx>::create({.rank = 0, .servers = {a0, a1}, .timeout = 20s}, std::move(*t), w);
    BOOST_TEST_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
    BOOST_TEST(w[0] == 0.25f);
    BOOST_TEST(w[elements - 1] == 0.25f);
    while (!wk->iteration_done()) {
    }
    // A finite first half, a NaN in server 1's half.
    std::vector<float> update(elements, 1.0f);
    update[700] = std::numeric_limits<float>::quiet_NaN();
    const ashl::status refused = wk->commit(update);
    BOOST_TEST(!refused.ok());
    BOOST_TEST(refused.message().find("commit.payload[188] = nan") != std::string::npos, refused.message());
    BOOST_TEST(refused.message().find("server 1's part (element 700 of the model)") != std::string::npos,
               refused.message());
    BOOST_TEST((refused.code() == ashl::errc::invalid_argument));
    if (refused.ok()) (void)wk->wait();  // today's behaviour: server 0 applies its half
    // The fixed update (zeros: nothing changes) goes to both servers and
    // brings back both shards: each as it was.
    std::fill(update.begin(), update.end(), 0.0f);
    const ashl::status fixed = wk->commit(update);
    BOOST_TEST(fixed.ok(), fixed.message());
    if (fixed.ok()) {
      const ashl::status waited = wk->wait();
      BOOST_TEST(waited.ok(), waited.message());
    }
    std::size_t changed = 0;
    for (float v : w) changed += v != 0.25f ? 1 : 0;
    BOOST_TEST(changed == 0u);
    BOOST_TEST(wk->leave().ok());
  }
  const auto c0 = stop_server(s0);
  const auto c1 = stop_server(s1);
  // Each server applied the fixed commit only, refused none, and holds its
  // initial values (512 x 0.25 = 128).
  BOOST_TEST(c0.at("applied") == 1.0);
  BOOST_TEST(c1.at("applied") == 1.0);
  BOOST_TEST(c0.at("refused") == 0.0);
  BOOST_TEST(c1.at("refused") == 0.0);
  BOOST_TEST(c0.at("sum") == 128.0);
  BOOST_TEST(c1.at("sum") == 128.0);
  ::unsetenv("UCX_TLS");
}

#endif  // ASHL_HAS_UCX()
