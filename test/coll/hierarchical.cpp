#include <ashl/coll/hierarchical.hpp>
#include <boost/test/unit_test.hpp>

#include <ashl/ps/hierarchical_upper.hpp>
#include <ashl/coll/inproc.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/transport/inproc.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include "../support/checks.hpp"

// Hierarchical aggregation in one process: 2 "hosts" x 2 local ranks, local
// collectives over inproc, slices across hosts through parameter servers
// over the inproc transport (the MPI + UCX version is test/coll/mpi.cpp).

using namespace ashl;
using namespace ashl::coll;
using namespace std::chrono_literals;
namespace tr = ashl::transport;

BOOST_AUTO_TEST_CASE(local_group_from_the_environment_values) {
  auto g = local_group_from_env("1", "2");
  ASHL_REQUIRE(g.has_value());
  ASHL_TEST(g->rank == 1);
  ASHL_TEST(g->size == 2);
  auto missing = local_group_from_env(nullptr, "2");
  ASHL_REQUIRE(!missing);
  ASHL_TEST(missing.error().message().find("ASHL_LOCAL_RANK") != std::string::npos);
  auto bad = local_group_from_env("2", "2");
  ASHL_REQUIRE(!bad);
  ASHL_TEST(bad.error().message().find("ASHL_LOCAL_RANK = 2") != std::string::npos, bad.error().message());
  ASHL_TEST(!local_group_from_env("x", "2"));
}

BOOST_AUTO_TEST_CASE(groups_from_a_bandwidth_matrix) {
  // ranks 0,1 and 2,3 share fast links (NVLink-like), across them slow ones
  const double f = 100e9, s = 10e9;
  const std::vector<double> bw = {0, f, s, s,  //
                                  f, 0, s, s,  //
                                  s, s, 0, f,  //
                                  s, s, f, 0};
  ASHL_TEST(*groups_from_bandwidth(bw, 4, 0.5) == (std::vector<int>{0, 0, 1, 1}));
  ASHL_TEST(*groups_from_bandwidth(bw, 4, 0.1) == (std::vector<int>{0, 0, 0, 0}));
  // one slow direction keeps two ranks apart
  auto one_way = bw;
  one_way[1 * 4 + 0] = s;
  ASHL_TEST(*groups_from_bandwidth(one_way, 4, 0.5) == (std::vector<int>{0, 1, 2, 2}));
  ASHL_TEST(!groups_from_bandwidth(bw, 3, 0.5));
  ASHL_TEST(!groups_from_bandwidth(bw, 4, 0.0));
}

BOOST_AUTO_TEST_CASE(even_slices_add_up) {
  ASHL_TEST(even_slices(7, 3) == (std::vector<std::size_t>{3, 2, 2}));
  ASHL_TEST(even_slices(1, 2) == (std::vector<std::size_t>{1, 0}));
}

namespace {
// The simplest upper level: an allreduce of the slices across hosts (the
// ranks with the same local rank), params = initial + Σ host slices / hosts.
struct allreduce_upper {
  inproc* across;
  std::vector<float> params;
  status exchange(std::span<const float> slice) {
    std::vector<float> sum(slice.begin(), slice.end());
    ASHL_TRY(blocking(*across, across->allreduce(cview(sum), view(sum), reduce_op::sum, {})));
    for (std::size_t i = 0; i < sum.size(); ++i) params[i] += sum[i] / float(across->size());
    return {};
  }
  std::span<const float> parameters() const { return params; }
};
static_assert(upper_level<allreduce_upper>);

float update_of(int host, int local, std::size_t i) { return float(host * 8 + local * 2) + float(i % 5); }
}  // namespace

BOOST_AUTO_TEST_CASE(two_hosts_two_local_ranks_with_a_collective_upper_level) {
  constexpr std::size_t n = 11;  // slices 6 and 5
  inproc_group host0(2), host1(2), across0(2), across1(2);
  inproc_group* hosts[2] = {&host0, &host1};
  inproc_group* across[2] = {&across0, &across1};
  std::vector<std::thread> ts;
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 2; ++l)
      ts.emplace_back([&, h, l] {
        inproc local = hosts[h]->communicator(l);
        inproc x = across[l]->communicator(h);
        const auto slices = even_slices(n, 2);
        hierarchical<inproc, allreduce_upper> hi(local, slices, allreduce_upper{&x, std::vector<float>(slices[std::size_t(l)], 1.f)});
        std::vector<float> u(n), w(n, -9.f);
        for (std::size_t i = 0; i < n; ++i) u[i] = update_of(h, l, i);
        ASHL_REQUIRE(hi.step(u, w).ok());
        for (std::size_t i = 0; i < n; ++i) {
          // mean over the 4 ranks of update_of: hosts 0/8, locals 0/2
          const float mean = 5.f + float(i % 5);
          ASHL_TEST(w[i] == 1.f + mean);
        }
      });
  for (auto& t : ts) t.join();
}

BOOST_AUTO_TEST_CASE(two_hosts_two_local_ranks_through_parameter_servers) {
  constexpr std::size_t n = 9;  // slices 5 and 4: one BSP server per slice, the hosts are its workers
  const auto slices = even_slices(n, 2);
  auto fabric = tr::inproc_fabric::create({});
  std::atomic<bool> stop{false};
  std::atomic<int> up{0};
  std::vector<std::thread> servers;
  for (int j = 0; j < 2; ++j)
    servers.emplace_back([&, j] {
      auto node = fabric->node("slice" + std::to_string(j));
      auto layout = ps::shard_layout::even(slices[std::size_t(j)], 1);
      ps::policy_params pp;
      pp.workers = 2;
      std::vector<float> initial(slices[std::size_t(j)], 2.f);
      auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = 2}},
                                                std::move(*ps::make_policy("bsp", pp)), std::move(*node), initial);
      ASHL_REQUIRE(srv.has_value());
      ++up;
      srv->run(stop);
    });
  while (up < 2) std::this_thread::sleep_for(1ms);

  inproc_group host0(2), host1(2);
  inproc_group* hosts[2] = {&host0, &host1};
  std::vector<std::thread> ts;
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 2; ++l)
      ts.emplace_back([&, h, l] {
        inproc local = hosts[h]->communicator(l);
        auto node = fabric->node();
        ASHL_REQUIRE(node.has_value());
        auto upper = ps::hierarchical_upper<tr::inproc>::create(
            {.rank = std::uint32_t(h), .servers = {"slice" + std::to_string(l)}, .timeout = 10s}, std::move(*node),
            slices[std::size_t(l)]);
        ASHL_REQUIRE(upper.has_value());
        for (float p : upper->parameters()) ASHL_TEST(p == 2.f);  // pulled at join
        hierarchical<inproc, ps::hierarchical_upper<tr::inproc>&> hi(local, slices, *upper);
        std::vector<float> u(n), w(n);
        for (int round = 1; round <= 2; ++round) {
          for (std::size_t i = 0; i < n; ++i) u[i] = update_of(h, l, i);
          ASHL_REQUIRE(hi.iteration_done());  // BSP: H = 1, every iteration exchanges
          ASHL_REQUIRE(hi.step(u, w).ok());
          // model deltas, BSP mean over the 2 hosts of the host means
          for (std::size_t i = 0; i < n; ++i) ASHL_TEST(w[i] == 2.f + float(round) * (5.f + float(i % 5)));
        }
        ASHL_TEST(upper->leave().ok());
      });
  for (auto& t : ts) t.join();
  stop = true;
  for (auto& t : servers) t.join();
}

// Issue 25: the servers' plan decides when a host exchanges. Local SGD with
// H = 3: iteration_done() says so on every third iteration; an exchange
// before that is refused with the cycle named (ps::hierarchical_upper no longer spins
// iteration_done() itself, which reported H iterations in no time).
BOOST_AUTO_TEST_CASE(the_servers_plan_decides_when_a_host_exchanges) {
  constexpr std::size_t n = 6;
  const auto slices = even_slices(n, 1);
  auto fabric = tr::inproc_fabric::create({});
  std::atomic<bool> stop{false}, up{false};
  std::thread server([&] {
    auto node = fabric->node("slice0");
    auto layout = ps::shard_layout::even(n, 1);
    ps::policy_params pp;
    pp.workers = 1;
    pp.local_steps = 3;
    auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = 1}},
                                              std::move(*ps::make_policy("local_sgd", pp)), std::move(*node));
    ASHL_REQUIRE(srv.has_value());
    up = true;
    srv->run(stop);
  });
  while (!up) std::this_thread::sleep_for(1ms);
  {
    inproc_group host(1);
    inproc local = host.communicator(0);
    auto node = fabric->node();
    ASHL_REQUIRE(node.has_value());
    auto upper = ps::hierarchical_upper<tr::inproc>::create({.rank = 0, .servers = {"slice0"}, .timeout = 10s}, std::move(*node), n);
    ASHL_REQUIRE(upper.has_value());
    hierarchical<inproc, ps::hierarchical_upper<tr::inproc>&> hi(local, slices, *upper);
    std::vector<float> u(n, 1.0f), w(n);
    const auto early = hi.step(u, w);
    ASHL_TEST(!early.ok());
    ASHL_TEST(early.message().find("the plan's cycle is not complete") != std::string::npos, early.message());
    std::vector<bool> says;
    for (int it = 0; it < 6; ++it) {
      const bool now = hi.iteration_done();
      says.push_back(now);
      if (now) ASHL_REQUIRE(hi.step(u, w).ok());
    }
    ASHL_TEST((says == std::vector<bool>{false, false, true, false, false, true}));
    ASHL_TEST(upper->worker().telemetry().commits == 2u);
    ASHL_TEST(upper->leave().ok());
  }
  stop = true;
  server.join();
}
