#include <ashl/ps/worker.hpp>

#include <cstdio>

// A receive from a sender that died mid-upload is reclaimed (docs/ps.md,
// receive_reclaim_timeout): UCX 1.13 cannot cancel an active-message receive and a dead
// sender never finishes it, so its buffer stayed lent for good and counted
// in max_receive_bytes; after a few such uploads every honest large commit
// was refused ("server.max_receive_bytes ...") until the server restarted.
// Now the transport hands the stuck receive to the server after
// ucx_params::receive_reclaim_timeout, the server sets its memory aside and
// its budget comes back. Real processes over UCX/TCP on 127.0.0.1: a server
// whose budget holds one 4 MiB commit, a sender (a child process that
// speaks the wire by hand) killed while its 4 MiB commit waits for it
// (UCX_RNDV_SCHEME=put_zcopy: the data moves only when the sender
// progresses), then an honest ps::worker in this process.

#if !ASHL_HAS_UCX()
int main() {
  std::puts("skipped: ps/stuck_receives needs the ucx component (UCX and OpenSSL)");
  return 77;
}
#else

#include <ashl/wire/message.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/forked_server.hpp"

#include <cstring>
#include <deque>

namespace {

using ashl_test::child;
using ashl_test::say;
using ashl_test::spawn;

const std::string token = "stuck-receives-token-0123456789";
constexpr std::size_t elements = std::size_t{1} << 20;  // 4 MiB commits
// One 4 MiB receive at a time (a second one is refused by name).
constexpr std::uint64_t budget = elements * sizeof(float) + (std::uint64_t{1} << 20);

std::atomic<bool> g_nudge{false};
extern "C" void on_nudge(int) { g_nudge = true; }

// The server: says its address, "lent" once a 4 MiB receive holds its
// budget, "reclaimed" once the transport reclaimed it; at SIGTERM its
// counters.
child start_server(std::chrono::milliseconds reclaim, std::string& address) {
  return ashl_test::start_server(
      {.token = token, .elements = elements, .workers = 2, .limit = 90s},
      {.close_timeout = 200ms, .receive_reclaim_timeout = reclaim},
      {.stop_when_all_left = false, .worker_timeout = 0ms, .max_receive_bytes = budget}, address,
      [lent = false, reclaimed = false](auto& srv, int fd) mutable {
        const ps::server_telemetry s = srv.telemetry();
        if (!lent && s.receive_bytes_lent >= elements * sizeof(float)) {
          lent = true;
          ashl_test::say(fd, "lent");
        }
        if (!reclaimed && s.receives_reclaimed > 0) {
          reclaimed = true;
          ashl_test::say(fd, "reclaimed");
        }
      },
      [](auto& srv) {
        const ps::server_telemetry s = srv.telemetry();
        std::ostringstream line;
        line << "reclaimed=" << s.receives_reclaimed << " reclaimed_bytes=" << s.reclaimed_bytes
             << " not_reclaimed=" << s.receives_not_reclaimed << " lent=" << s.receive_bytes_lent
             << " transport_reclaimed=" << s.transport.receives_reclaimed << " stuck=" << s.transport.receives_stuck
             << " abandoned=" << s.transport.receives_abandoned << " peers_failed=" << s.transport.peers_failed
             << " peers_closed=" << s.transport.peers_closed
             << " receive_budget=" << s.wire_refused_for(ps::wire_refusal::receive_budget)
             << " applied=" << s.core.commits_applied << " messages_in=" << s.messages_in
             << " commits=" << s.core.commits << " refused=" << s.core.refused_total()
             << " wire_refused=" << s.wire_refused_total() << " joins=" << s.core.joins;
        return line.str();
      });
}

// Lines still unread ("lent", "reclaimed") come before the counters.
std::map<std::string, double> stop_server(child& c) { return ashl_test::stop_and_read(c, 4); }

// A sender that joins as rank 1, puts a 4 MiB commit out and then never
// progresses (its rendezvous data waits for it), until it is killed.
struct stalled_sender {
  tr::ucx t;
  std::size_t connected = 0, plans = 0;
  std::deque<std::vector<std::byte>> keep;
  std::span<std::byte> receive_buffer(tr::peer_id, std::span<const std::byte>, std::size_t n) {
    keep.emplace_back(n);
    return keep.back();
  }
  void on_message(tr::peer_id, std::span<const std::byte> head, std::span<const std::byte> data) {
    auto m = wire::decode(head, data, wire::limits{});
    if (m && m->header.kind == wire::message_kind::plan_update) ++plans;
  }
  void on_sent(tr::peer_id, std::uint64_t, const ashl::status&) {}
  void on_peer(tr::peer_id, tr::peer_event e, const ashl::status&) {
    if (e == tr::peer_event::connected) ++connected;
  }
  template <class Pred>
  bool drive(std::chrono::milliseconds limit, Pred done) {
    const auto until = clock_type::now() + limit;
    while (!done()) {
      if (clock_type::now() >= until) return false;
      t.progress(*this);
      t.wait(5ms);
    }
    return true;
  }
};

child start_stalled_sender(const std::string& address) {
  return spawn([address](int fd) {
    std::signal(SIGUSR1, on_nudge);
    auto t = tr::ucx::create({.token = token, .retry_interval = 50ms});
    if (!t) return 2;
    stalled_sender c{std::move(*t)};
    auto p = c.t.connect(address);
    if (!p || !c.drive(15s, [&] { return c.connected > 0; })) return 3;
    c.keep.emplace_back(512);
    auto n = wire::encode(wire::header{.rank = 1}, wire::join_body{.incarnation = 1, .batch = 1}, c.keep.back());
    if (!n) return 4;
    const auto& j = c.keep.back();
    if (!c.t.send(*p, std::span(j).first(wire::header_bytes), std::span(j).subspan(wire::header_bytes, *n - wire::header_bytes), 0).ok())
      return 5;
    if (!c.drive(15s, [&] { return c.plans > 0; })) return 6;
    std::vector<std::byte> payload(elements * sizeof(float));
    const float v = 0.125f;
    for (std::size_t i = 0; i < elements; ++i) std::memcpy(payload.data() + i * sizeof v, &v, sizeof v);
    std::vector<std::byte> head(wire::header_bytes);
    wire::header h{.kind = wire::message_kind::commit, .flags = wire::flag_last_shard | wire::flag_pull,
                   .element_count = elements, .rank = 1, .sequence = 1, .clock = 1, .step = 1};
    if (!wire::seal_header(h, payload, head).ok() || !c.t.send(*p, head, payload, 0).ok()) return 7;
    c.t.progress(c);  // the rendezvous request leaves; its data waits for progress that never comes
    say(fd, "sent");
    // No progress from here on, but for one pass per SIGUSR1 (the test's
    // nudge while the server has not seen the request yet): the data waits
    // for this process, which the test kills.
    const auto until = clock_type::now() + 60s;
    while (clock_type::now() < until) {
      if (g_nudge.exchange(false)) c.t.progress(c);
      std::this_thread::sleep_for(5ms);
    }
    return 0;
  });
}

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

}  // namespace

BOOST_AUTO_TEST_CASE(a_receive_from_a_killed_sender_is_reclaimed_and_an_honest_commit_is_then_taken) {
  env_scope env;
  env.set("UCX_TLS", "tcp,self");
  env.set("UCX_RNDV_SCHEME", "put_zcopy");
  std::string address;
  child srv = start_server(1000ms, address);
  BOOST_TEST_REQUIRE((!address.empty() && address.rfind("error", 0) != 0), address);
  child sender = start_stalled_sender(address);
  BOOST_TEST_REQUIRE(sender.read_line(30s).value_or("") == "sent");
  // The server took the upload's receive: the budget is held.
  // The rendezvous request may wait in the sender's UCX for one more
  // progress pass: nudged once a second, at most 30 times.
  std::string lent;
  for (int nudge = 0; nudge < 30 && lent != "lent"; ++nudge) {
    lent = srv.read_line(1s).value_or("");
    if (lent != "lent") ::kill(sender.pid, SIGUSR1);
  }
  if (lent != "lent") {
    ::kill(srv.pid, SIGTERM);
    BOOST_FAIL("the server did not lend its budget to the upload (" << lent << "): " << srv.read_line(30s).value_or(""));
  }
  ::kill(sender.pid, SIGKILL);
  (void)sender.finish(10s);
  // The sender's connection failed; its receive is stuck, then reclaimed.
  if (const std::string reclaimed = srv.read_line(30s).value_or(""); reclaimed != "reclaimed") {
    ::kill(srv.pid, SIGTERM);
    BOOST_FAIL("the server did not reclaim the dead upload's receive (" << reclaimed
                                                                        << "): " << srv.read_line(30s).value_or(""));
  }
  {
    std::vector<float> w(elements, 0.0f);
    auto t = tr::ucx::create({.token = token, .retry_interval = 50ms});
    BOOST_TEST_REQUIRE(t.has_value());
    auto wk = ps::worker<tr::ucx>::create({.rank = 0, .servers = {address}, .timeout = 20s}, std::move(*t), w);
    BOOST_TEST_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
    while (!wk->iteration_done()) {
    }
    const std::vector<float> update(elements, 0.5f);
    BOOST_TEST_REQUIRE(wk->commit(update).ok());
    const ashl::status s = wk->wait();  // refused by max_receive_bytes while the dead upload held the budget
    BOOST_TEST(s.ok(), s.message());
    BOOST_TEST(wk->leave().ok());
  }
  const auto c = stop_server(srv);
  BOOST_TEST_REQUIRE(c.count("reclaimed") == 1u);
  BOOST_TEST(c.at("reclaimed") == 1.0);
  BOOST_TEST(c.at("transport_reclaimed") == 1.0);
  BOOST_TEST(c.at("reclaimed_bytes") >= static_cast<double>(elements * sizeof(float)));
  BOOST_TEST(c.at("not_reclaimed") == 0.0);
  BOOST_TEST(c.at("receive_budget") == 0.0);
  BOOST_TEST(c.at("applied") == 1.0);
  BOOST_TEST(c.at("lent") == 0.0);
}

#endif  // ASHL_HAS_UCX()
