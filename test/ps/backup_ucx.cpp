#include <ashl/ps/server_replica.hpp>

#include <ashl/ps/worker.hpp>

#include <cstdio>

// A shard's primary with a backup over UCX (docs/elastic.md §4.2-4.4):
// the primary a real process (forked before this process has any UCX
// object), its backup and a ps::worker in this process, over TCP on
// 127.0.0.1. Every commit's wait() is answered (after the backup's ack), and
// the backup ends holding the primary's state (the CRC of its save() bytes).
// test/ps/backup.cpp checks the rules of the link over inproc.

#if !ASHL_HAS_UCX()
int main() {
  std::puts("skipped: ps/backup_ucx needs the ucx component (UCX and OpenSSL)");
  return 77;
}
#else

#include <boost/test/unit_test.hpp>

#include "../support/forked_server.hpp"

#include <atomic>
#include <thread>

namespace {

const std::string token = "backup-ucx-token-0123456789abcdef";
constexpr std::size_t elements = 1024;

ps::server_params primary_params() {
  ps::server_params sp{.core = {.optimizer = {.mode = ps::optimizer_params::kind::sgd, .lr = 0.125, .momentum = 0.5}},
                       .stop_when_all_left = false,
                       .worker_timeout = 0ms};
  sp.take_backup = true;
  sp.replica_timeout = 10000ms;        // no drop on a slow host: the test is about agreement
  sp.replica_state_check_seconds = 0.0;  // the CRCs are compared once, at the end
  return sp;
}

std::uint32_t state_crc(const auto& core) {
  std::vector<std::byte> bytes;
  ashl::state_writer w(bytes);
  core.save(w);
  return ashl::wire::crc32c(std::span<const std::byte>(bytes));
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_worker_commits_through_a_primary_whose_backup_ends_with_its_state) {
  ::setenv("UCX_TLS", "tcp,self", 1);
  std::string address;
  ashl_test::child primary = ashl_test::start_server(
      {.token = token, .elements = elements}, {}, primary_params(), address, [](auto&, int) {},
      [](auto& srv) {
        const ps::server_telemetry s = srv.telemetry();
        std::ostringstream line;
        line << "applied=" << s.core.commits_applied << " attached=" << (srv.backup_attached() ? 1 : 0)
             << " dropped=" << s.backups_dropped_crc + s.backups_dropped_lag << " version=" << srv.core().version()
             << " state=" << state_crc(srv.core());
        return line.str();
      });
  BOOST_TEST_REQUIRE((!address.empty() && address.rfind("error", 0) != 0), address);

  auto layout = ps::shard_layout::even(elements, 1);
  BOOST_TEST_REQUIRE(layout.has_value());
  ps::server_params bp = primary_params();
  bp.core.layout = *layout;
  bp.core.workers = 1;
  ps::policy_params pp{};
  pp.workers = 1;
  auto bt = tr::ucx::create({.token = token, .retry_interval = 50ms});
  BOOST_TEST_REQUIRE(bt.has_value());
  auto backup = ps::server_backup<tr::ucx>::create(bp, std::move(*ps::make_policy("asp", pp)), std::move(*bt), address);
  BOOST_TEST_REQUIRE(backup.has_value(), (backup ? "" : backup.error().message()));
  std::atomic<bool> stop{false}, caught_up{false}, worker_left{false};
  std::uint64_t records = 0;
  std::uint32_t backup_state = 0;
  std::uint64_t backup_version = 0;
  // The backup's thread: until it caught up, then until the worker's leave
  // reached it (its core has no live worker), bounded by the test's stop.
  std::thread th([&] {
    const auto end = std::chrono::steady_clock::now() + 60s;  // bounded, whatever happens
    while (!stop.load() && std::chrono::steady_clock::now() < end) {
      backup->run_once(std::chrono::microseconds(1000));
      if (backup->caught_up()) caught_up = true;
      if (worker_left.load() && backup->caught_up() && backup->core().live_count() == 0 &&
          backup->telemetry().records > 0)
        break;
    }
    records = backup->telemetry().records;
    backup_version = backup->core().version();
    backup_state = state_crc(backup->core());
  });
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!caught_up.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  if (!caught_up.load()) {
    stop = true;
    th.join();
    BOOST_TEST_REQUIRE(caught_up.load(), backup->last_refusal().to_string());
  }

  constexpr int commits = 20;
  {
    std::vector<float> w(elements, 0.0f), g(elements);
    auto t = tr::ucx::create({.token = token, .retry_interval = 50ms});
    BOOST_TEST_REQUIRE(t.has_value());
    auto wk = ps::worker<tr::ucx>::create({.rank = 0, .servers = {address}, .timeout = 20s}, std::move(*t), w);
    BOOST_TEST_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
    for (int c = 0; c < commits; ++c) {
      while (!wk->iteration_done()) {
      }
      for (std::size_t i = 0; i < elements; ++i) g[i] = 0.01f * static_cast<float>((c + 1) * static_cast<int>(i % 7) - 9);
      BOOST_TEST_REQUIRE(wk->commit(g).ok());
      const ashl::status waited = wk->wait();
      BOOST_TEST_REQUIRE(waited.ok(), waited.message());
    }
    BOOST_TEST(wk->leave().ok());
  }
  worker_left = true;  // the backup's thread ends once the leave reached it
  th.join();
  const auto c = ashl_test::stop_and_read(primary);
  BOOST_TEST(c.at("applied") == static_cast<double>(commits));
  BOOST_TEST(c.at("attached") == 1.0);
  BOOST_TEST(c.at("dropped") == 0.0);
  BOOST_TEST(records > static_cast<std::uint64_t>(commits));
  BOOST_TEST(c.at("version") == static_cast<double>(backup_version));
  BOOST_TEST(c.at("state") == static_cast<double>(backup_state));
  ::unsetenv("UCX_TLS");
}

#endif  // ASHL_HAS_UCX()
