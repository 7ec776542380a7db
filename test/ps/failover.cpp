#include <ashl/ps/server_replica.hpp>

#include <ashl/ps/worker.hpp>

#include <cstdio>

// A shard's primary dies and its backup takes over (docs/elastic.md §4.5),
// in real processes over UCX on 127.0.0.1 (TCP, and shared memory): the primary and its backup
// are forked children (before this process has any UCX object), three
// ps::workers run in this process with the backup's address
// (worker_params::backups). The primary is SIGKILLed mid-training; the
// workers fail over (their failover joins are the backup's votes), the
// backup promotes itself, the workers rejoin it with their commit in
// flight, and every worker reaches its target. Every acknowledged commit
// is in the promoted backup's state: its core applied exactly the commits
// the workers were answered for (none lost, none twice). The take-over
// time is printed. Then a worker starts with the dead primary's address
// first and joins the promoted backup. test/ps/backup.cpp checks the votes, a minority, a stale
// term and the old primary attaching as backup over inproc.

#if !ASHL_HAS_UCX()
int main() {
  std::puts("skipped: ps/failover needs the ucx component (UCX and OpenSSL)");
  return 77;
}
#else

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/forked_server.hpp"

#include <atomic>
#include <thread>

namespace {

const std::string token = "failover-token-0123456789abcdef";
constexpr std::size_t elements = 1024;
constexpr std::uint32_t workers = 3;
constexpr int commits = 40;       // per worker: the target
constexpr int kill_after = 45;    // acknowledged commits, all workers together, before the SIGKILL

// `replica_timeout`: 5 s, or 1.5 s where the primary is stopped (its
// link then fails only when silent for twice that, fail_when_silent).
ps::server_params replica_params(std::chrono::milliseconds replica_timeout = 5000ms) {
  ps::server_params sp{.core = {.optimizer = {.mode = ps::optimizer_params::kind::sgd, .lr = 0.0078125}},
                       .stop_when_all_left = false,
                       .worker_timeout = 0ms};
  sp.take_backup = true;
  sp.replica_timeout = replica_timeout;
  sp.replica_state_check_seconds = 0.0;
  return sp;
}

// The backup: says its address, replays the primary's records until the
// promotion rule says so, then serves as the shard's primary until SIGTERM
// (or the bound), and says its counters.
ashl_test::child start_backup(const std::string& primary, std::string& address, std::chrono::milliseconds replica_timeout) {
  ashl_test::child c = ashl_test::spawn([&](int fd) {
    ashl_test::stop_on_term();
    auto t = tr::ucx::create({.listen = "127.0.0.1:0", .token = token, .retry_interval = 20ms});
    if (!t) {
      ashl_test::say(fd, "error " + t.error().message());
      return 2;
    }
    const std::string listen = t->listen_address();
    auto layout = ps::shard_layout::even(elements, 1);
    ps::policy_params pp{};
    pp.workers = workers;
    ps::server_params sp = replica_params(replica_timeout);
    sp.core.layout = *layout;
    sp.core.workers = workers;
    std::vector<float> initial(elements, 0.25f);
    auto b = ps::server_backup<tr::ucx>::create(sp, std::move(*ps::make_policy("asp", pp)), std::move(*t), primary,
                                                initial);
    if (!b) {
      ashl_test::say(fd, "error " + b.error().message());
      return 3;
    }
    ashl_test::say(fd, listen);
    const auto until = clock_type::now() + 60s;
    while (!ashl_test::term_requested() && clock_type::now() < until && !b->promoted())
      b->run_once(std::chrono::microseconds(1000));
    if (!b->promoted()) {
      ashl_test::say(fd, "promoted=0 records=" + std::to_string(b->telemetry().records));
      return 0;
    }
    const std::uint64_t votes = b->telemetry().votes;
    auto srv = std::move(*b).take_over();
    if (!srv) {
      ashl_test::say(fd, "error " + srv.error().message());
      return 4;
    }
    while (!ashl_test::term_requested() && clock_type::now() < until) srv->run_once(std::chrono::microseconds(1000));
    const ps::server_telemetry s = srv->telemetry();
    std::ostringstream line;
    line << "promoted=1 term=" << srv->term() << " failovers=" << s.failovers
         << " takeover_ms=" << 1e3 * s.takeover_seconds << " votes=" << votes << " applied=" << s.core.commits_applied
         << " duplicates=" << s.core.duplicates << " parameter=" << srv->parameters()[0];
    ashl_test::say(fd, line.str());
    return 0;
  });
  address = c.read_line(30s).value_or("");
  return c;
}

}  // namespace

// Over TCP, and over shared memory (data on sm, connections on TCP), as
// ps/kill does; and over TCP with the primary SIGSTOPped instead (" stop":
// a frozen process, or its host gone, ends no connection: the workers
// notice its silence after worker_params::server_silence, the backup after
// twice replica_timeout, transport::fail_when_silent).
BOOST_DATA_TEST_CASE(the_primary_killed_mid_training_its_backup_takes_over_with_every_acknowledged_commit,
                     boost::unit_test::data::make(std::vector<std::string>{"tcp,self", "sm,self,tcp", "tcp,self stop"}),
                     spec) {
  const bool stop = spec.ends_with(" stop");
  const std::string tls = spec.substr(0, spec.find(' '));
  const std::chrono::milliseconds replica_timeout = stop ? 1500ms : 5000ms;
  ::setenv("UCX_TLS", tls.c_str(), 1);
  std::string primary_address;
  ashl_test::child primary = ashl_test::start_server(
      {.token = token, .elements = elements, .workers = workers}, {.retry_interval = 20ms}, replica_params(replica_timeout),
      primary_address, [](auto&, int) {}, [](auto& srv) { return "applied=" + std::to_string(srv.telemetry().core.commits_applied); });
  BOOST_TEST_REQUIRE((!primary_address.empty() && primary_address.rfind("error", 0) != 0), primary_address);
  std::string backup_address;
  ashl_test::child backup = start_backup(primary_address, backup_address, replica_timeout);
  BOOST_TEST_REQUIRE((!backup_address.empty() && backup_address.rfind("error", 0) != 0), backup_address);

  std::atomic<int> acknowledged{0}, joined{0};
  std::atomic<bool> killed{false};
  std::array<std::string, workers> errors;
  std::array<int, workers> done{};
  std::array<std::uint64_t, workers> tries{};
  std::array<float, workers> last{};
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < workers; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> w(elements, 0.0f), g(elements, 1.0f);
      auto t = tr::ucx::create({.token = token, .retry_interval = 20ms});
      if (!t) {
        errors[r] = t.error().message();
        return;
      }
      ps::worker_params wp{.rank = r, .servers = {primary_address}, .timeout = 20s};
      wp.backups = {backup_address};
      wp.reconnect = 20s;
      wp.failover_attempt = 300ms;
      wp.server_silence = 1500ms;
      auto wk = ps::worker<tr::ucx>::create(wp, std::move(*t), w);
      if (!wk) {
        errors[r] = wk.error().message();
        return;
      }
      // Nobody commits until every worker joined: the backup's state has
      // all three live, so a failover needs two votes.
      ++joined;
      while (joined.load() < static_cast<int>(workers)) std::this_thread::sleep_for(1ms);
      for (int c = 0; c < commits; ++c) {
        while (!wk->iteration_done()) {
        }
        if (auto s = wk->commit(g); !s) {
          errors[r] = s.message();
          return;
        }
        if (auto s = wk->wait(); !s) {
          errors[r] = "commit " + std::to_string(c) + ": " + s.message();
          return;
        }
        ++done[r];
        ++acknowledged;
        // Each worker keeps commits for after the kill (the others commit
        // on: theirs are in flight when it comes).
        while (!killed.load() && done[r] >= commits - 8) std::this_thread::sleep_for(1ms);
      }
      last[r] = wk->parameters()[0];
      tries[r] = wk->telemetry().failover_tries;
      (void)wk->leave();
    });
  }
  const auto deadline = clock_type::now() + 30s;
  while (acknowledged.load() < kill_after && clock_type::now() < deadline) std::this_thread::sleep_for(1ms);
  const int before_kill = acknowledged.load();
  ::kill(primary.pid, stop ? SIGSTOP : SIGKILL);
  if (!stop) primary.finish(10s);
  killed = true;
  for (auto& th : threads) th.join();
  // A worker that starts now, its primary's address first (dead: nobody
  // listens there), reaches the promoted backup after one
  // failover_attempt and gets the parameters every commit made.
  std::string late_error;
  std::uint64_t late_tries = 0;
  float late_parameter = 0.0f;
  {
    std::vector<float> w(elements, 0.0f);
    auto t = tr::ucx::create({.token = token, .retry_interval = 20ms});
    BOOST_TEST_REQUIRE(t.has_value());
    ps::worker_params wp{.rank = 0, .servers = {primary_address}, .timeout = 20s};
    wp.backups = {backup_address};
    wp.reconnect = 20s;
    wp.failover_attempt = 300ms;
    auto wk = ps::worker<tr::ucx>::create(wp, std::move(*t), w);
    if (wk) {
      late_tries = wk->telemetry().failover_tries;
      late_parameter = wk->parameters()[0];
      (void)wk->leave();
    } else {
      late_error = wk.error().message();
    }
  }
  if (stop) {
    ::kill(primary.pid, SIGKILL);
    primary.finish(10s);
  }
  const auto c = ashl_test::stop_and_read(backup);
  BOOST_TEST(late_error.empty(), late_error);
  BOOST_TEST(late_tries >= 1u);
  BOOST_TEST(late_parameter == 0.25f - 0.0078125f * workers * commits);
  for (std::uint32_t r = 0; r < workers; ++r) BOOST_TEST(errors[r].empty(), "worker " << r << ": " << errors[r]);
  BOOST_TEST(before_kill >= kill_after);
  for (std::uint32_t r = 0; r < workers; ++r) {
    BOOST_TEST(done[r] == commits);  // the target, through the take-over
    BOOST_TEST(tries[r] >= 1u);      // each failed over
  }
  BOOST_TEST_REQUIRE(c.count("promoted") == 1u);
  BOOST_TEST_REQUIRE(c.at("promoted") == 1.0);
  BOOST_TEST(c.at("term") == 2.0);
  BOOST_TEST(c.at("failovers") == 1.0);
  BOOST_TEST(c.at("votes") >= 2.0);  // a majority of the 3 live workers
  // Every acknowledged commit in the promoted state, none twice: the core
  // applied exactly the commits the workers were answered for.
  BOOST_TEST(c.at("applied") == static_cast<double>(workers * commits));
  // The same gradient (1) every commit, plain SGD: the parameters moved by
  // exactly that many steps of lr (exact in f32: multiples of 2^-7).
  BOOST_TEST(c.at("parameter") == 0.25 - 0.0078125 * workers * commits);
  std::printf("ps/failover (UCX_TLS %s%s): the backup took over %.1f ms after losing the primary (%g votes, %g duplicates dropped); "
              "%d commits were acknowledged before the kill\n",
              tls.c_str(), stop ? ", primary SIGSTOPped" : "", c.at("takeover_ms"), c.at("votes"), c.at("duplicates"), before_kill);
  ::unsetenv("UCX_TLS");
}

#endif  // ASHL_HAS_UCX()
