#include <ashl/ps/server.hpp>

#include <cstdio>

// Global limits of a server (docs/ps.md "Limits"), driven past by a
// misbehaving client that holds the token, as real processes over UCX on
// 127.0.0.1: receive buffers over all connections (max_receive_bytes),
// snapshots pinned by pulls whose replies are never taken (max_snapshots),
// and a join with an incarnation no restart could pass
// (max_incarnation_ahead). Each is refused, counted, and answered with an
// error naming the limit and its value; the server's memory stays within
// the limit and it goes on serving.

#if !ASHL_HAS_UCX()
int main() {
  std::puts("skipped: ps/limits needs the ucx component (UCX and OpenSSL)");
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
using ashl_test::free_port;

const std::string token = "limits-token-0123456789";

struct server_spec {
  std::uint32_t workers = 1;
  std::size_t elements = 1024;
  std::uint64_t max_receive_bytes = 0;
  std::uint32_t max_snapshots = 0;
};

// A server (ASP) in a child forked before this process has any UCX object:
// prints its address, serves until SIGTERM (at most 60 s), prints counters.
child start_server(const server_spec& o, std::string& address) {
  std::uint64_t most_receive_bytes = 0;  // the child's, after the fork
  std::size_t most_snapshots = 0;
  return ashl_test::start_server(
      {.token = token, .elements = o.elements, .workers = o.workers, .initial = 0.5f, .address_wait = 20s}, {},
      {.core = {.optimizer = {.mode = ps::optimizer_params::kind::sgd, .lr = 0.125}},
       .stop_when_all_left = false,
       .worker_timeout = 0ms,
       .max_receive_bytes = o.max_receive_bytes,
       .max_snapshots = o.max_snapshots},
      address,
      [&](auto& srv, int) {
        const ps::server_telemetry s = srv.telemetry();
        most_receive_bytes = std::max(most_receive_bytes, s.receive_bytes);
        most_snapshots = std::max<std::size_t>(most_snapshots, s.snapshots);
      },
      [&](auto& srv) {
        const ps::server_telemetry s = srv.telemetry();
        std::ostringstream line;
        line << "receive_budget=" << s.wire_refused_for(ps::wire_refusal::receive_budget)
             << " incarnation=" << s.wire_refused_for(ps::wire_refusal::incarnation)
             << " unbound=" << s.wire_refused_for(ps::wire_refusal::unbound) << " replies_refused=" << s.replies_refused
             << " snapshots=" << s.snapshots << " most_receive_bytes=" << most_receive_bytes
             << " applied=" << s.core.commits_applied << " joins=" << s.core.joins << " pull_replies=" << s.pull_replies;
        return line.str();
      });
}

std::map<std::string, double> stop_server(child& c) { return ashl_test::stop_and_read(c); }

// ---- a client that speaks the wire by hand ---------------------------------------------

struct client {
  tr::ucx t;
  std::vector<std::string> errors;  // texts of the error messages the server sent
  std::size_t plans = 0, replies = 0, connected = 0;
  std::deque<std::vector<std::byte>> keep;  // headers, payloads, reply buffers: live until the transport closes

  std::span<std::byte> receive_buffer(tr::peer_id, std::span<const std::byte>, std::size_t n) {
    keep.emplace_back(n);  // one per receive: several may be in flight
    return keep.back();
  }
  void on_message(tr::peer_id, std::span<const std::byte> head, std::span<const std::byte> data) {
    auto m = wire::decode(head, data, wire::limits{});
    if (!m) return;
    if (const auto* e = m->get<wire::error_body>()) errors.emplace_back(e->text);
    if (m->header.kind == wire::message_kind::plan_update) ++plans;
    if (m->header.kind == wire::message_kind::pull_reply) ++replies;
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

  std::optional<tr::peer_id> connect(const std::string& address) {
    auto p = t.connect(address);
    if (!p) return std::nullopt;
    const std::size_t before = connected;
    if (!drive(15s, [&] { return connected > before; })) return std::nullopt;
    return *p;
  }

  template <class Body>
  void send_control(tr::peer_id p, wire::header h, const Body& body) {
    keep.emplace_back(512);
    auto n = wire::encode(h, body, keep.back());
    BOOST_TEST_REQUIRE(n.has_value());
    keep.back().resize(*n);
    const auto& b = keep.back();
    BOOST_TEST_REQUIRE(t.send(p, std::span(b).first(wire::header_bytes), std::span(b).subspan(wire::header_bytes), 0).ok());
  }

  void join(tr::peer_id p, std::uint32_t rank, std::uint64_t incarnation) {
    send_control(p, {.rank = rank}, wire::join_body{.incarnation = incarnation, .batch = 1});
  }

  // A dense commit of `elements` f32 (every value 1/8), with a pull.
  void commit(tr::peer_id p, std::uint32_t rank, std::uint64_t sequence, std::size_t elements) {
    keep.emplace_back(elements * sizeof(float));
    const float v = 0.125f;
    for (std::size_t i = 0; i < elements; ++i) std::memcpy(keep.back().data() + i * sizeof(float), &v, sizeof v);
    const auto& payload = keep.back();
    keep.emplace_back(wire::header_bytes);
    wire::header h{.kind = wire::message_kind::commit,
                   .flags = wire::flag_last_shard | wire::flag_pull,
                   .element_count = elements,
                   .rank = rank,
                   .sequence = sequence,
                   .clock = sequence,
                   .step = sequence};
    BOOST_TEST_REQUIRE(wire::seal_header(h, payload, keep.back()).ok());
    BOOST_TEST_REQUIRE(t.send(p, keep.back(), payload, 0).ok());
  }

  std::size_t errors_with(const std::string& what) const {
    std::size_t n = 0;
    for (const auto& e : errors) n += e.find(what) != std::string::npos ? 1 : 0;
    return n;
  }
};

client make_client() {
  auto t = tr::ucx::create({.token = token, .retry_interval = 50ms});
  BOOST_TEST_REQUIRE(t.has_value());
  return client{std::move(*t)};
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

// Four connections join four ranks and each starts a 4 MiB commit, then the
// client stops progressing (UCX_RNDV_SCHEME=put_zcopy: the data waits for
// it), so four receives would be in flight at once. The budget holds two:
// two are refused before they are received, the other two are applied once
// the client goes on; the receive buffers never pass the budget.
BOOST_AUTO_TEST_CASE(receive_buffers_over_all_connections_stay_within_max_receive_bytes) {
  env_scope env;
  env.set("UCX_RNDV_SCHEME", "put_zcopy");
  constexpr std::size_t elements = std::size_t{1} << 20;
  const std::uint64_t budget = 2 * elements * sizeof(float) + 4096;
  std::string address;
  child srv = start_server({.workers = 4, .elements = elements, .max_receive_bytes = budget}, address);
  BOOST_TEST_REQUIRE(!address.empty());
  BOOST_TEST_REQUIRE(address.rfind("error", 0) != 0, address);
  {
    client c = make_client();
    std::vector<tr::peer_id> peers;
    for (std::uint32_t r = 0; r < 4; ++r) {
      auto p = c.connect(address);
      BOOST_TEST_REQUIRE(p.has_value());
      peers.push_back(*p);
      c.join(*p, r, 1);
    }
    BOOST_TEST_REQUIRE(c.drive(10s, [&] { return c.plans >= 4; }));
    // Each send puts its rendezvous request out at once; not progressing,
    // the client moves none of the data: all four wait for a buffer.
    for (std::uint32_t r = 0; r < 4; ++r) c.commit(peers[r], r, 1, elements);
    std::this_thread::sleep_for(1500ms);
    BOOST_TEST(c.drive(20s, [&] { return c.replies + c.errors.size() >= 4; }));
    BOOST_TEST(c.replies == 2u);
    BOOST_TEST(c.errors_with("server.max_receive_bytes = " + std::to_string(budget)) == 2u,
               (c.errors.empty() ? std::string("no errors") : c.errors[0]));
    c.t.close();
  }
  const auto s = stop_server(srv);
  BOOST_TEST_REQUIRE(s.count("receive_budget") == 1u);
  BOOST_TEST(s.at("receive_budget") == 2.0);
  BOOST_TEST(s.at("applied") == 2.0);
  BOOST_TEST(s.at("most_receive_bytes") <= static_cast<double>(budget));
}

// One rank commits twelve times with a pull each and never takes a reply
// (it does not progress): every version's snapshot stays pinned by a reply
// in flight. Three snapshots are allowed; the other nine replies are
// refused with an error naming the limit, and no more snapshots are taken.
BOOST_AUTO_TEST_CASE(snapshots_pinned_by_pulls_stay_within_max_snapshots) {
  constexpr std::size_t elements = std::size_t{64} << 10;  // 256 KiB replies: rendezvous
  std::string address;
  child srv = start_server({.workers = 1, .elements = elements, .max_snapshots = 3}, address);
  BOOST_TEST_REQUIRE(!address.empty());
  {
    client c = make_client();
    auto p = c.connect(address);
    BOOST_TEST_REQUIRE(p.has_value());
    c.join(*p, 0, 1);
    BOOST_TEST_REQUIRE(c.drive(10s, [&] { return c.plans >= 1; }));
    for (std::uint64_t k = 1; k <= 12; ++k) c.commit(*p, 0, k, elements);
    std::this_thread::sleep_for(1500ms);  // the server applies and replies; nobody takes the replies
    BOOST_TEST(c.drive(20s, [&] { return c.replies + c.errors.size() >= 12; }));
    BOOST_TEST(c.replies == 3u);
    BOOST_TEST(c.errors_with("server.max_snapshots = 3") == 9u,
               (c.errors.empty() ? std::string("no errors") : c.errors[0]));
    c.t.close();
  }
  const auto s = stop_server(srv);
  BOOST_TEST_REQUIRE(s.count("replies_refused") == 1u);
  BOOST_TEST(s.at("applied") == 12.0);
  BOOST_TEST(s.at("replies_refused") == 9.0);
  BOOST_TEST(s.at("snapshots") == 3.0);
}

// A join with incarnation UINT64_MAX would hold its rank for ever (only a
// larger incarnation takes a rank over); one far ahead of a time-based
// incarnation is refused, naming the bound. A join before that is fine,
// and large data from a connection that has not joined is not received.
BOOST_AUTO_TEST_CASE(an_incarnation_far_ahead_of_time_is_refused) {
  std::string address;
  child srv = start_server({.workers = 1, .elements = std::size_t{1} << 16}, address);
  BOOST_TEST_REQUIRE(!address.empty());
  {
    client c = make_client();
    auto p = c.connect(address);
    BOOST_TEST_REQUIRE(p.has_value());
    c.commit(*p, 0, 1, std::size_t{1} << 16);  // before any join: not received
    BOOST_TEST_REQUIRE(c.drive(10s, [&] { return c.errors.size() >= 1; }));
    BOOST_TEST(c.errors_with("this connection has not joined") == 1u, c.errors[0]);
    c.join(*p, 0, ~std::uint64_t{0});
    BOOST_TEST_REQUIRE(c.drive(10s, [&] { return c.errors.size() >= 2; }));
    BOOST_TEST(c.errors_with("join.incarnation = 18446744073709551615: more than server.max_incarnation_ahead = 86400 s") == 1u,
               c.errors[1]);
    BOOST_TEST(c.plans == 0u);
    c.join(*p, 0, ps::incarnation_now());  // a time-based incarnation now
    BOOST_TEST(c.drive(10s, [&] { return c.plans >= 1; }));
    c.t.close();
  }
  const auto s = stop_server(srv);
  BOOST_TEST_REQUIRE(s.count("incarnation") == 1u);
  BOOST_TEST(s.at("incarnation") == 1.0);
  BOOST_TEST(s.at("unbound") == 1.0);
  BOOST_TEST(s.at("joins") == 1.0);
}

#endif
