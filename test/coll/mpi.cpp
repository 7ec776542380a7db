#include <ashl/coll/mpi.hpp>
#include <boost/test/unit_test.hpp>

// The MPI model and the collective paths over it, in real processes:
// every case named launch_* starts this same executable under mpiexec
// (--oversubscribe, loopback only, bounded) with --run_test=rank_*, and the
// rank_* cases do the work inside the MPI job (they do nothing when not
// started by mpiexec). Values are checked exactly against a single-process
// reference (dyadic inputs, so the order of MPI's partial sums cannot
// matter; codec payloads are re-encoded locally for every rank).

#include "../support/process.hpp"

#include <ashl/coll/compressed.hpp>
#include <ashl/coll/driver.hpp>
#include <ashl/ps/hierarchical_upper.hpp>
#include <ashl/coll/shards.hpp>
#include <ashl/compress/error_feedback.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/sync/bsp.hpp>
#include <ashl/sync/dlb.hpp>
#include <ashl/sync/local_sgd.hpp>
#include <ashl/sync/semi_async.hpp>
#include <ashl/transport/ucx.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>
#include "../support/checks.hpp"

using namespace ashl;
using namespace ashl::coll;
using namespace std::chrono_literals;

namespace {

bool in_mpi_job() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

std::string self_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, std::size_t(n)) : std::string();
}

using env_list = std::vector<std::pair<std::string, std::string>>;

// mpiexec's part of the command line for a transport: "tcp", "shm" (pml ob1
// with those btls) or "ucx" (pml ucx over TCP loopback).
std::vector<std::string> mpiexec_args(const std::string& fabric) {
  std::vector<std::string> a = {ASHL_MPIEXEC, "--oversubscribe", "--bind-to", "none", "--mca", "pml", "ob1",
                                "--mca", "oob_tcp_if_include", "lo"};
  if (fabric == "ucx") {  // MPI over UCX (TCP on loopback); Open MPI selects pml ucx only with these two
    a[6] = "ucx";
    a.insert(a.end(), {"--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices", "any", "--mca", "osc", "^ucx",
                       "-x", "UCX_NET_DEVICES=lo", "-x", "UCX_TLS=tcp,self"});
  } else if (fabric == "tcp") {
    a.insert(a.end(), {"--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"});
  } else {
    a.insert(a.end(), {"--mca", "btl", "self,vader"});
  }
  return a;
}

env_list root_env() { return {{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}}; }

std::string log_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ashl_coll_mpi_" + name + "_" + std::to_string(::getpid()) + ".log"))
      .string();
}

void launch(int ranks, const std::string& fabric, const std::string& rank_case) {
  auto argv = mpiexec_args(fabric);
  argv.insert(argv.end(), {"-n", std::to_string(ranks), self_path(), "--run_test=" + rank_case});
  const auto log = log_file(rank_case + "_" + fabric);
  auto r = process::run(argv, root_env(), 60s, log);
  ASHL_TEST(r.exit_code == 0, r.log());
  std::filesystem::remove(log);
}

// Rank r's input, element i: small integers and quarters (exact sums).
float input(int r, std::size_t i) { return float(int((i * 7 + std::size_t(r) * 13) % 17) - 8) + 0.25f * float(r); }

}  // namespace

// ---------------------------------------------------------------- launchers

BOOST_AUTO_TEST_CASE(launch_collectives_over_tcp) {
  if (in_mpi_job()) return;
  launch(4, "tcp", "rank_collectives");
}

BOOST_AUTO_TEST_CASE(launch_collectives_over_shared_memory) {
  if (in_mpi_job()) return;
  launch(4, "shm", "rank_collectives");
}

BOOST_AUTO_TEST_CASE(launch_collectives_over_ucx) {
  if (in_mpi_job()) return;
  launch(4, "ucx", "rank_collectives");
}

BOOST_AUTO_TEST_CASE(launch_drivers_and_compressed_over_tcp) {
  if (in_mpi_job()) return;
  launch(4, "tcp", "rank_drivers");
}

// 2 "hosts" x 2 local ranks, one BSP parameter server per slice (in this
// process) over UCX loopback; each MPI rank is told its local rank and
// size as a launcher would (ASHL_LOCAL_RANK, ASHL_LOCAL_SIZE).
BOOST_AUTO_TEST_CASE(launch_hierarchical_two_hosts_two_local_ranks_and_servers) {
  if (in_mpi_job()) return;
  const std::string addr[2] = {"127.0.0.1:" + std::to_string(process::free_port()),
                               "127.0.0.1:" + std::to_string(process::free_port())};
  // mpiexec first (fork before any thread of ours runs); workers retry the connection until the servers listen.
  auto argv = mpiexec_args("shm");
  for (int w = 0; w < 4; ++w) {
    if (w) argv.push_back(":");
    argv.insert(argv.end(), {"-n", "1", "-x", "ASHL_LOCAL_RANK=" + std::to_string(w % 2), "-x", "ASHL_LOCAL_SIZE=2",
                             "-x", "ASHL_COLL_SLICE_SERVERS=" + addr[0] + "," + addr[1], "-x", "UCX_NET_DEVICES=lo",
                             "-x", "UCX_TLS=sm,self,tcp", self_path(), "--run_test=rank_hierarchical"});
  }
  const auto log = log_file("hierarchical");
  const pid_t job = process::start(argv, root_env(), log);
  ASHL_REQUIRE(job > 0);

  ::setenv("UCX_NET_DEVICES", "lo", 1);
  ::setenv("UCX_TLS", "sm,self,tcp", 1);
  constexpr std::size_t n = 9;
  const auto slices = even_slices(n, 2);
  std::atomic<bool> stop{false};
  std::vector<std::thread> servers;
  std::atomic<int> failed{0};
  for (int j = 0; j < 2; ++j)
    servers.emplace_back([&, j] {
      auto t = transport::ucx::create({.listen = addr[j], .token = "coll-test-token-0123"});
      if (!t) { ++failed; return; }
      auto layout = ps::shard_layout::even(slices[std::size_t(j)], 1);
      ps::policy_params pp;
      pp.workers = 2;
      std::vector<float> initial(slices[std::size_t(j)], 2.f);
      auto srv = ps::server<transport::ucx>::create({.core = {.layout = *layout, .workers = 2}},
                                                    std::move(*ps::make_policy("bsp", pp)), std::move(*t), initial);
      if (!srv) { ++failed; return; }
      srv->run(stop);
    });
  auto r = process::finish(job, 60s, log);
  stop = true;
  for (auto& t : servers) t.join();
  ASHL_TEST(failed.load() == 0);
  ASHL_TEST(r.exit_code == 0, r.log());
  std::filesystem::remove(log);
}

// ------------------------------------------------------------ in the job

BOOST_AUTO_TEST_CASE(rank_collectives) {
  if (!in_mpi_job()) return;
  int argc = 0;
  char** argv = nullptr;
  mpi_session session(&argc, &argv);
  {
    auto made = mpi::dup(MPI_COMM_WORLD);
    ASHL_REQUIRE(made.has_value());
    mpi& c = *made;
    const int m = c.size(), me = c.rank();
    ASHL_REQUIRE(m == 4);
    constexpr std::size_t n = 1000;

    // allreduce: f32 sum out of place, max in place, non-blocking with test()
    std::vector<float> x(n), y(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = input(me, i);
    auto req = c.allreduce(cview(x), view(y), reduce_op::sum, {});
    ASHL_REQUIRE(req.has_value());
    while (true) {
      auto t = c.test(*req);
      ASHL_REQUIRE(t.has_value());
      if (*t) break;
    }
    for (std::size_t i = 0; i < n; ++i) ASHL_TEST(y[i] == input(0, i) + input(1, i) + input(2, i) + input(3, i));
    ASHL_TEST(blocking(c, c.allreduce(cview(x), view(x), reduce_op::max, {})).ok());
    for (std::size_t i = 0; i < n; ++i)
      ASHL_TEST(x[i] == std::max({input(0, i), input(1, i), input(2, i), input(3, i)}));

    // f64, i8, u8, f16, bf16
    std::vector<double> d = {double(me), -0.5 * me};
    ASHL_TEST(blocking(c, c.allreduce(cview(d), view(d), reduce_op::sum, {})).ok());
    ASHL_TEST(d == (std::vector<double>{6.0, -3.0}));
    std::vector<std::int8_t> i8 = {std::int8_t(me - 2), std::int8_t(me)};
    ASHL_TEST(blocking(c, c.allreduce(cview(i8), view(i8), reduce_op::min, {})).ok());
    ASHL_TEST(i8 == (std::vector<std::int8_t>{-2, 0}));
    std::vector<std::uint8_t> u8 = {std::uint8_t(me * 10)};
    ASHL_TEST(blocking(c, c.allreduce(cview(u8), view(u8), reduce_op::sum, {})).ok());
    ASHL_TEST(u8[0] == 60);
    std::vector<half> h = {half::from_float(0.5f * float(me)), half::from_float(me == 3 ? 2048.f : 0.f)};
    ASHL_TEST(blocking(c, c.allreduce(cview(h), view(h), reduce_op::sum, {})).ok());
    ASHL_TEST(h[0].to_float() == 3.f);
    ASHL_TEST(h[1].to_float() == 2048.f);
    std::vector<bfloat16> b = {bfloat16::from_float(float(me) * 4.f)};
    ASHL_TEST(blocking(c, c.allreduce(cview(b), view(b), reduce_op::max, {})).ok());
    ASHL_TEST(b[0].to_float() == 12.f);

    // uneven reduce-scatter and all-gather, blocks of 0 and 1 included
    const std::vector<std::size_t> counts = {0, 1, 6, 3};
    const auto disp = displacements(counts);
    std::vector<float> all(10), mine(counts[std::size_t(me)]);
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = input(me, i);
    ASHL_TEST(blocking(c, c.reduce_scatter(cview(all), view(mine), counts, reduce_op::sum, {})).ok());
    for (std::size_t j = 0; j < mine.size(); ++j) {
      const std::size_t i = disp[std::size_t(me)] + j;
      ASHL_TEST(mine[j] == input(0, i) + input(1, i) + input(2, i) + input(3, i));
    }
    std::vector<float> gathered(10, -1.f);
    ASHL_TEST(blocking(c, c.all_gather(cview(mine), view(gathered), counts, {})).ok());
    for (std::size_t i = 0; i < 10; ++i) ASHL_TEST(gathered[i] == input(0, i) + input(1, i) + input(2, i) + input(3, i));
    // in place
    std::vector<float> own(10, -1.f);
    for (std::size_t j = 0; j < counts[std::size_t(me)]; ++j) own[disp[std::size_t(me)] + j] = float(me);
    ASHL_TEST(blocking(c, c.all_gather(in_view<>(own.data() + disp[std::size_t(me)], counts[std::size_t(me)], dtype::f32),
                                        view(own), counts, {}))
                   .ok());
    ASHL_TEST(own == (std::vector<float>{1, 2, 2, 2, 2, 2, 2, 3, 3, 3}));

    // broadcast and barrier
    std::vector<double> bc(5, double(me));
    ASHL_TEST(blocking(c, c.broadcast(view(bc), 2, {})).ok());
    ASHL_TEST(bc == std::vector<double>(5, 2.0));
    ASHL_TEST(blocking(c, c.barrier({})).ok());

    // HAP: uneven allreduce with counts from profile capabilities (one rank of weight 0 → block 0)
    std::vector<profile::worker_capability> caps(4);
    for (int r = 0; r < 4; ++r) caps[std::size_t(r)].push = caps[std::size_t(r)].pull = {0.0, 1e9 * r};
    caps[0].push.beta = caps[0].pull.beta = 1e-300;  // practically nothing
    auto sc = shard_counts(1001, caps, shard_basis::bandwidth);
    ASHL_REQUIRE(sc.has_value());
    ASHL_TEST((*sc)[0] == 0u);
    uneven_allreduce<mpi> ar(*sc);
    std::vector<float> v(1001);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = input(me, i);
    ASHL_TEST(ar.run(c, view(v)).ok());
    for (std::size_t i = 0; i < v.size(); ++i) ASHL_TEST(v[i] == input(0, i) + input(1, i) + input(2, i) + input(3, i));

    // errors are values, MPI is not asked
    auto bad = c.reduce_scatter(cview(all), view(mine), std::vector<std::size_t>{1, 2}, reduce_op::sum, {});
    ASHL_TEST(!bad.has_value());
    ASHL_TEST(c.counters().errors == 1u);
    ASHL_TEST(c.counters().allreduces == 7u);
  }
}

BOOST_AUTO_TEST_CASE(rank_drivers) {
  if (!in_mpi_job()) return;
  int argc = 0;
  char** argv = nullptr;
  mpi_session session(&argc, &argv);
  {
    auto made = mpi::dup(MPI_COMM_WORLD);
    ASHL_REQUIRE(made.has_value());
    mpi& c = *made;
    const int me = c.rank();
    constexpr std::size_t n = 4096;

    // BSP, 16-bit dense
    {
      auto d = sync_driver<mpi, sync::bsp, dense_exchange>::create(c, sync::bsp{{.workers = 4}}, dense_exchange{dtype::f16});
      ASHL_REQUIRE(d.has_value());
      std::vector<float> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = input(me, i);
      ASHL_REQUIRE(*d->reduce_gradients(g, {.samples = 16}));
      for (std::size_t i = 0; i < n; ++i)
        ASHL_TEST(g[i] == (input(0, i) + input(1, i) + input(2, i) + input(3, i)) / 4.f);
    }
    // DLB: weights by samples (1/8 1/8 1/4 1/2) and batches from speeds
    {
      auto d = sync_driver<mpi, sync::dlb>::create(c, sync::dlb{{.workers = 4, .total_batch = 64}});
      ASHL_REQUIRE(d.has_value());
      const double samples[4] = {8, 8, 16, 32};
      std::vector<float> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = input(me, i);
      ASHL_REQUIRE(*d->reduce_gradients(g, {.samples = samples[me], .compute_seconds = 0.25}));
      for (std::size_t i = 0; i < n; ++i)
        ASHL_TEST(g[i] == input(0, i) / 8 + input(1, i) / 8 + input(2, i) / 4 + input(3, i) / 2);
      ASHL_TEST(d->plan().batch_size == std::uint32_t(samples[me]));
    }
    // Local SGD(2) and semi-async(K = 3): models averaged on the policy's steps
    {
      auto d = sync_driver<mpi, sync::local_sgd>::create(c, sync::local_sgd{{.workers = 4, .local_steps = 2}});
      ASHL_REQUIRE(d.has_value());
      std::vector<float> w(8, float(me)), g(8);
      for (int step = 1; step <= 4; ++step) {
        ASHL_REQUIRE(!*d->reduce_gradients(g, {}));
        ASHL_TEST(*d->sync_models(w) == (step % 2 == 0));
      }
      ASHL_TEST(w == std::vector<float>(8, 1.5f));
      auto s = sync_driver<mpi, sync::semi_async>::create(c, sync::semi_async{{.workers = 4, .sync_every_iterations = 3}});
      ASHL_REQUIRE(s.has_value());
      int synced = 0;
      for (int step = 1; step <= 6; ++step) {
        ASHL_REQUIRE(s->reduce_gradients(g, {.time = double(step)}).has_value());
        synced += *s->sync_models(w) ? 1 : 0;
      }
      ASHL_TEST(synced == 2);
    }
    // top-k 1 % with error feedback: the payload all-gather, against every rank's payload re-encoded here
    {
      using ef = compress::error_feedback<compress::topk>;
      payload_exchange<ef> ex(ef(compress::topk(0.01)));
      std::vector<float> ref(n, 0.f);
      for (int r = 0; r < 4; ++r) {
        ef local(compress::topk(0.01));
        std::vector<float> xr(n);
        for (std::size_t i = 0; i < n; ++i) xr[i] = input(r, i) * float(1 + i % 3);
        std::vector<std::byte> buf(local.max_encoded_bytes(n, dtype::f32)), scratch(local.scratch_bytes(n, dtype::f32));
        compress::codec_context ctx{.step = 1, .scratch = scratch};
        auto used = local.encode(host_view<const float>(xr.data(), n), buf, ctx);
        ASHL_REQUIRE(used.has_value());
        ASHL_REQUIRE(local.decode_add({buf.data(), *used}, {n, dtype::f32}, host_view<float>(ref.data(), n), 0.25f, ctx).ok());
      }
      std::vector<float> x(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = input(me, i) * float(1 + i % 3);
      const std::vector<double> quarter(4, 0.25);
      ASHL_REQUIRE(ex(c, host_view<float>(x.data(), n), quarter, 1).ok());
      ASHL_TEST(x == ref);
      // the model-chosen path, decided on rank 0 for all
      auto_exchange<compress::topk> au(dtype::bf16, payload_exchange<compress::topk>(compress::topk(0.01)));
      ASHL_REQUIRE(au.decide(c, {.elements = n, .ranks = 4, .link = {1e-5, 1e8}, .payload_bytes = 0.08 * n, .codec = {1e-9}}).ok());
      ASHL_TEST(au.compressing());
    }
  }
}

BOOST_AUTO_TEST_CASE(rank_hierarchical) {
  if (!in_mpi_job()) return;
  int argc = 0;
  char** argv = nullptr;
  mpi_session session(&argc, &argv);
  {
    auto g = local_group_from_env();
    ASHL_REQUIRE(g.has_value());
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    const int host = world_rank / g->size;
    auto local = mpi::split(MPI_COMM_WORLD, host, g->rank);
    ASHL_REQUIRE(local.has_value());
    ASHL_TEST(local->rank() == g->rank);
    ASHL_TEST(local->size() == g->size);

    const std::string servers = std::getenv("ASHL_COLL_SLICE_SERVERS");
    const std::string mine = g->rank == 0 ? servers.substr(0, servers.find(',')) : servers.substr(servers.find(',') + 1);
    constexpr std::size_t n = 9;
    const auto slices = even_slices(n, 2);
    auto t = transport::ucx::create({.token = "coll-test-token-0123"});
    ASHL_REQUIRE(t.has_value());
    auto up = ps::hierarchical_upper<transport::ucx>::create({.rank = std::uint32_t(host), .servers = {mine}, .timeout = 20s},
                                               std::move(*t), slices[std::size_t(g->rank)]);
    ASHL_REQUIRE(up.has_value(), (up ? std::string() : up.error().message()));
    hierarchical<mpi, ps::hierarchical_upper<transport::ucx>&> h(*local, slices, *up);
    std::vector<float> u(n), w(n);
    for (int round = 1; round <= 2; ++round) {
      for (std::size_t i = 0; i < n; ++i) u[i] = float(host * 8 + g->rank * 2) + float(i % 5);
      ASHL_REQUIRE(h.iteration_done());  // BSP: H = 1
      ASHL_REQUIRE(h.step(u, w).ok());
      // servers start at 2 and add the mean over hosts of each host's mean
      for (std::size_t i = 0; i < n; ++i) ASHL_TEST(w[i] == 2.f + float(round) * (5.f + float(i % 5)));
    }
    ASHL_TEST(up->leave().ok());
  }
}
