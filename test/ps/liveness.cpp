#include <ashl/ps/server.hpp>

#include <cstdio>

// Liveness during long cycles and transfers (docs/ps.md "Faults, checkpoints and rejoining"), as real
// processes over UCX on 127.0.0.1: a worker whose cycle is longer than the
// server's worker_timeout but whose progress loop keeps sending keepalives
// is not evicted (one that does not is); a worker stopped in the middle of
// a large upload is evicted, the receive buffer it held is handed back only
// once UCX let go of it (never leaked, never reused while UCX writes), and
// the worker rejoins and finishes with every commit applied once. Over
// shared memory and TCP.

#if !ASHL_HAS_UCX()
int main() {
  std::puts("skipped: ps/liveness needs the ucx component (UCX and OpenSSL)");
  return 77;
}
#else

#include <ashl/ps/worker.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/forked_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace {

using ashl_test::child;
using ashl_test::free_port;
using ashl_test::say;
using ashl_test::spawn;

const std::string token = "liveness-token-0123456789";

// ---- processes (forked before the parent has any UCX object) ------------------------

// UCX_TLS (and, for the mid-transfer tests, UCX_RNDV_SCHEME) for this
// process's children.
struct env_scope {
  std::vector<std::string> names;
  void set(const char* name, const char* value) {
    ::setenv(name, value, 1);
    names.emplace_back(name);
  }
  ~env_scope() {
    for (const auto& n : names) ::unsetenv(n.c_str());
  }
};

using ashl_test::parse_counters;

// ---- a transport that stops the sender of the first large message ---------------------

// ucx, except that when a message above `stop_above` bytes asks for a
// receive buffer, `victim` is sent SIGSTOP first: its upload stops midway.
struct stopping_ucx {
  using transport_concept = tr::transport_tag;
  tr::ucx t;
  pid_t victim = -1;
  std::size_t stop_above = 0;
  bool stopped = false;

  template <class H>
  struct shim {
    H& h;
    stopping_ucx& s;
    std::span<std::byte> receive_buffer(tr::peer_id p, std::span<const std::byte> head, std::size_t n) {
      if (!s.stopped && n > s.stop_above && s.victim > 0) {
        ::kill(s.victim, SIGSTOP);
        s.stopped = true;
      }
      return h.receive_buffer(p, head, n);
    }
    void on_message(tr::peer_id p, std::span<const std::byte> head, std::span<const std::byte> d) {
      h.on_message(p, head, d);
    }
    void on_sent(tr::peer_id p, std::uint64_t c, const ashl::status& st) { h.on_sent(p, c, st); }
    void on_peer(tr::peer_id p, tr::peer_event e, const ashl::status& why) { h.on_peer(p, e, why); }
    void on_receive_abandoned(tr::peer_id p, std::span<std::byte> b) {
      if constexpr (requires { h.on_receive_abandoned(p, b); }) h.on_receive_abandoned(p, b);
    }
  };

  ashl::result<tr::peer_id> connect(std::string_view a) { return t.connect(a); }
  ashl::status send(tr::peer_id p, std::span<const std::byte> h, std::span<const std::byte> d, std::uint64_t c) {
    return t.send(p, h, d, c);
  }
  template <class H>
  std::size_t progress(H& h) {
    shim<H> s{h, *this};
    return t.progress(s);
  }
  void wait(std::chrono::microseconds d) { t.wait(d); }
  std::span<const tr::peer_id> peers() const noexcept { return t.peers(); }
  bool is_connected(tr::peer_id p) const noexcept { return t.is_connected(p); }
  void close(tr::peer_id p) { t.close(p); }
  void close() { t.close(); }
  const tr::transport_counters& counters() const noexcept { return t.counters(); }
  std::chrono::steady_clock::time_point last_heard(tr::peer_id p) const noexcept { return t.last_heard(p); }
};
static_assert(tr::transport<stopping_ucx>);

// ---- the programs ----------------------------------------------------------------------

struct server_spec {
  std::string address;
  std::size_t elements = 64;
  std::chrono::milliseconds worker_timeout{1000};
  pid_t victim = -1;  // > 0: stopped when its first large message arrives, continued once it is evicted
  std::chrono::seconds lifetime{60};
};

// One server (BSP, one worker); ends when its worker left, or past the
// lifetime. Prints one line of counters.
int run_server(int fd, const server_spec& o) {
  auto t = tr::ucx::create({.listen = o.address, .token = token});
  if (!t) {
    say(fd, "error " + t.error().message());
    return 2;
  }
  auto layout = ps::shard_layout::even(o.elements, 1);
  ps::policy_params pp{};
  pp.workers = 1;
  auto policy = ps::make_policy("bsp", pp);
  if (!layout || !policy) return 3;
  ps::server_params sp{.core = {.layout = *layout, .shard = 0, .workers = 1,
                                .optimizer = {.mode = ps::optimizer_params::kind::sgd, .lr = 0.125}},
                       .worker_timeout = o.worker_timeout};
  stopping_ucx st{std::move(*t), o.victim, std::size_t{1} << 20};
  std::vector<float> initial(o.elements, 0.5f);
  auto srv = ps::server<stopping_ucx>::create(sp, std::move(*policy), std::move(st), initial);
  if (!srv) {
    say(fd, "error " + srv.error().message());
    return 4;
  }
  bool continued = false;
  const auto until = clock_type::now() + o.lifetime;
  while (clock_type::now() < until) {
    srv->run_once(20ms);
    const ps::server_telemetry s = srv->telemetry();
    if (o.victim > 0 && !continued && s.evicted_silent > 0) {
      ::kill(o.victim, SIGCONT);
      continued = true;
    }
    if (s.core.leaves >= 1) break;
  }
  for (int i = 0; i < 20; ++i) srv->run_once(5ms);
  const ps::server_telemetry s = srv->telemetry();
  std::ostringstream line;
  line << "evicted_silent=" << s.evicted_silent << " applied=" << s.core.commits_applied
       << " duplicates=" << s.core.duplicates << " leaves=" << s.core.leaves
       << " abandoned=" << s.transport.receives_abandoned << " stuck=" << s.transport.receives_stuck
       << " lent=" << s.receive_bytes_lent << " refused=" << s.core.refused_total() + s.wire_refused_total();
  say(fd, line.str());
  return 0;
}

struct worker_spec {
  std::string address;
  std::size_t elements = 64;
  int cycles = 3;
  std::chrono::milliseconds compute{0};  // outside any worker call, per cycle
  bool progress_thread = false;          // drives the transport (and its keepalives) during compute
  std::chrono::milliseconds keepalive{100};
  bool push = false;                     // ps::worker::push instead of commit (acknowledged, no parameters)
};

// One worker; prints one line of counters; exits 0 when every cycle went through.
int run_worker(int fd, const worker_spec& o) {
  auto t = tr::ucx::create({.token = token, .keepalive_interval = o.keepalive});
  if (!t) return 2;
  std::vector<float> w(o.elements), g(o.elements);
  auto wk = ps::worker<tr::ucx>::create({.rank = 0,
                                         .servers = {o.address},
                                         .batch = 16,
                                         .timeout = 30000ms,
                                         .progress_thread = o.progress_thread,
                                         .reconnect = 30000ms},
                                        std::move(*t), w);
  if (!wk) {
    say(fd, "error " + wk.error().message());
    return 3;
  }
  int done = 0;
  for (int c = 0; c < o.cycles; ++c) {
    while (!wk->iteration_done()) {
    }
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = w[i] - 2.0f;
    if (o.compute.count() > 0) std::this_thread::sleep_for(o.compute);
    if (auto s = o.push ? wk->push(g) : wk->commit(g); !s) {
      say(fd, "error " + s.to_string());
      break;
    }
    if (auto s = wk->wait(); !s) {
      say(fd, "error " + s.to_string());
      break;
    }
    ++done;
  }
  const ps::worker_telemetry tel = wk->telemetry();
  (void)wk->leave();
  say(fd, "cycles=" + std::to_string(done) + " reconnects=" + std::to_string(tel.reconnects) +
              " commits=" + std::to_string(tel.commits) + " pushes=" + std::to_string(tel.pushes));
  return done == o.cycles ? 0 : 1;
}

std::string read_result(child& c, const char* who) {
  for (int i = 0; i < 4; ++i) {
    auto line = c.read_line(90s);
    if (!line) break;
    if (line->rfind("error", 0) == 0) {
      BOOST_TEST_MESSAGE(who << ": " << *line);
      continue;
    }
    return *line;
  }
  return {};
}

// A worker computing `compute` per cycle against a server with a 1.5 s
// worker_timeout (keepalives every 100 ms: a margin for a loaded machine);
// returns {server counters, worker counters, worker exit}.
struct outcome {
  std::map<std::string, double> server, worker;
  int worker_exit = -1;
};

outcome long_cycles(std::chrono::milliseconds compute, bool progress_thread, int cycles) {
  const std::string address = "127.0.0.1:" + std::to_string(free_port());
  child srv = spawn([&](int fd) {
    return run_server(fd, {.address = address, .worker_timeout = 1500ms, .lifetime = 40s});
  });
  child wk = spawn([&](int fd) {
    return run_worker(fd, {.address = address, .cycles = cycles, .compute = compute,
                           .progress_thread = progress_thread});
  });
  outcome o;
  o.worker = parse_counters(read_result(wk, "worker"));
  o.worker_exit = wk.finish(30s);
  o.server = parse_counters(read_result(srv, "server"));
  srv.finish(10s);
  return o;
}

}  // namespace

// Each cycle computes 3 s, twice the server's worker_timeout (1.5 s); the
// worker's progress thread sends keepalives meanwhile (every 100 ms).
BOOST_AUTO_TEST_CASE(a_worker_that_keeps_heart_beating_through_a_long_cycle_is_not_evicted) {
  const outcome o = long_cycles(3000ms, true, 3);
  BOOST_TEST(o.worker_exit == 0);
  BOOST_TEST(o.worker.at("cycles") == 3.0);
  BOOST_TEST(o.worker.at("reconnects") == 0.0);
  BOOST_TEST_REQUIRE(o.server.count("evicted_silent") == 1u);
  BOOST_TEST(o.server.at("evicted_silent") == 0.0);
  BOOST_TEST(o.server.at("applied") == 3.0);
  BOOST_TEST(o.server.at("duplicates") == 0.0);
  BOOST_TEST(o.server.at("refused") == 0.0);
}

// The same cycle without anything driving the transport: silent, evicted.
BOOST_AUTO_TEST_CASE(a_worker_silent_through_a_long_cycle_is_evicted) {
  const outcome o = long_cycles(3000ms, false, 2);
  BOOST_TEST_REQUIRE(o.server.count("evicted_silent") == 1u);
  BOOST_TEST(o.server.at("evicted_silent") >= 1.0);
}

namespace {

// The worker uploads 16 MiB commits; the first one's sender is stopped
// (SIGSTOP) as the server hands out its receive buffer, evicted after the
// worker_timeout (no keepalives while stopped) with the receive in flight,
// and continued. UCX_RNDV_SCHEME=put_zcopy: the sender moves the data (with
// get_zcopy over cma the server would read it from the stopped process).
// With `push` the worker pushes (docs/ps.md "The worker"): the push in flight at the
// eviction is sent again after the rejoin until acknowledged, and applied
// once all the same.
void evicted_mid_upload(const char* tls, bool push) {
  env_scope env;
  env.set("UCX_TLS", tls);
  env.set("UCX_RNDV_SCHEME", "put_zcopy");
  const std::string address = "127.0.0.1:" + std::to_string(free_port());
  constexpr std::size_t elements = std::size_t{4} << 20;
  child wk = spawn([&](int fd) {
    return run_worker(fd, {.address = address, .elements = elements, .cycles = 3, .push = push});
  });
  child srv = spawn([&](int fd) {
    return run_server(fd, {.address = address, .elements = elements, .victim = wk.pid, .lifetime = 60s});
  });
  const auto worker = parse_counters(read_result(wk, "worker"));
  const int worker_exit = wk.finish(30s);
  const auto server = parse_counters(read_result(srv, "server"));
  srv.finish(10s);
  BOOST_TEST(worker_exit == 0);
  BOOST_TEST_REQUIRE(worker.count("cycles") == 1u);
  BOOST_TEST(worker.at("cycles") == 3.0);
  BOOST_TEST(worker.at("reconnects") >= 1.0);
  BOOST_TEST(worker.at("pushes") == (push ? 3.0 : 0.0));
  BOOST_TEST_REQUIRE(server.count("evicted_silent") == 1u);
  BOOST_TEST(server.at("evicted_silent") == 1.0);
  // The receive of the stopped upload was abandoned, its buffer handed back
  // (none lent at the end, none stuck) ...
  BOOST_TEST(server.at("abandoned") == 1.0);
  BOOST_TEST(server.at("stuck") == 0.0);
  BOOST_TEST(server.at("lent") == 0.0);
  // ... and the rejoined worker's three commits were each applied once.
  BOOST_TEST(server.at("applied") == 3.0);
  BOOST_TEST(server.at("duplicates") == 0.0);
  BOOST_TEST(server.at("leaves") == 1.0);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_worker_evicted_mid_upload_over_shared_memory) { evicted_mid_upload("sm,self,tcp", false); }
// Over TCP the worker pushes (ps::worker::push): the same exactly-once.
BOOST_AUTO_TEST_CASE(a_pushing_worker_evicted_mid_upload_over_tcp) { evicted_mid_upload("tcp,self", true); }

#endif
