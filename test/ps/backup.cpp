#include <ashl/ps/server_replica.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/core/state_io.hpp>
#include <ashl/rules/core_events.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/transport/inproc.hpp>

#include "../support/counting_new.hpp"
#include "../support/forwarding_transport.hpp"
#include "../support/ps_job.hpp"
#include "../support/saved_state.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

// A shard's primary (ps::server with take_backup) and its backup
// (ps::server_backup) over the inproc transport, driven by hand from one
// thread, with workers made of raw wire messages: docs/elastic.md §4.2-4.4
// (the link, held actions, agreement, drops) end to end through the driver.
// test/rules/replication.cpp checks the rule alone.

namespace ps = ashl::ps;
namespace tr = ashl::transport;
namespace w = ashl::wire;
using ps_job::grad_value;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t n = 512;
constexpr std::uint32_t workers = 2;

tr::inproc node(const std::shared_ptr<tr::inproc_fabric>& f, const std::string& name = "") {
  auto r = f->node(name);
  BOOST_REQUIRE(r.has_value());
  return std::move(*r);
}

// What a worker connection received.
struct client_handler {
  std::vector<std::byte> buf = std::vector<std::byte>(1 << 16);
  std::uint64_t replies = 0, plans = 0, leases = 0;
  std::vector<std::uint32_t> terms;  // shard_state terms, in order
  std::vector<std::string> errors;
  std::span<std::byte> receive_buffer(tr::peer_id, std::span<const std::byte>, std::size_t k) {
    return k <= buf.size() ? std::span<std::byte>(buf.data(), k) : std::span<std::byte>{};
  }
  void on_message(tr::peer_id, std::span<const std::byte> head, std::span<const std::byte> data) {
    auto m = w::decode(head, data, {});
    BOOST_REQUIRE(m.has_value());
    if (m->header.kind == w::message_kind::pull_reply) ++replies;
    if (m->header.kind == w::message_kind::plan_update) ++plans;
    if (m->header.kind == w::message_kind::lease) ++leases;
    if (const auto* s = m->get<w::shard_state_body>()) terms.push_back(s->term);
    if (const auto* e = m->get<w::error_body>()) errors.emplace_back(e->text);
  }
  void on_sent(tr::peer_id, std::uint64_t, const ashl::status&) {}
  void on_peer(tr::peer_id, tr::peer_event, const ashl::status&) {}
};

struct client {
  tr::inproc t;
  tr::peer_id peer = tr::no_peer;
  client_handler h;
  std::uint32_t rank = 0;
  std::uint64_t sequence = 0;
  std::vector<float> g = std::vector<float>(n);
  std::vector<std::byte> msg = std::vector<std::byte>(w::header_bytes + 4 * n + 4096);

  template <class Body>
  void control(w::header hd, const Body& b) {
    hd.rank = rank;
    auto used = w::encode(hd, b, msg);
    BOOST_REQUIRE(used.has_value());
    BOOST_REQUIRE(t.send(peer, std::span<const std::byte>(msg).first(w::header_bytes),
                         std::span<const std::byte>(msg).subspan(w::header_bytes, *used - w::header_bytes), 0)
                      .ok());
  }
  void join(std::uint64_t incarnation) { control({}, w::join_body{.incarnation = incarnation, .batch = 4}); }
  // A worker that lost its primary asks a backup (docs/elastic.md §4.5).
  void failover_join(std::uint64_t incarnation, std::uint32_t term) {
    control({}, w::join_body{.incarnation = incarnation, .batch = 4, .flags = w::join_flag_failover, .term = term});
  }
  // A connection to another server (the shard's backup), up.
  template <class Pump>
  void reconnect(const std::string& to, Pump pump) {
    peer = *t.connect(to);
    for (int i = 0; i < 100 && !t.is_connected(peer); ++i) {
      t.progress(h);
      pump();
    }
    BOOST_REQUIRE(t.is_connected(peer));
  }
  void metric(double v) { control({}, w::metric_body{.value = v}); }
  void leave() { control({}, w::leave_body{}); }
  // A dense commit, its pull riding with it (or a push: acknowledged header-only).
  void commit(bool pull) {
    ++sequence;
    for (std::size_t i = 0; i < n; ++i) g[i] = grad_value(rank, sequence, i);
    const auto payload = std::as_bytes(std::span<const float>(g));
    const w::header hd{.kind = w::message_kind::commit,
                       .flags = w::flag_last_shard | (pull ? w::flag_pull : 0u),
                       .element_count = n,
                       .rank = rank,
                       .sequence = sequence,
                       .clock = sequence,
                       .samples = 16};
    std::array<std::byte, w::header_bytes> head{};
    BOOST_REQUIRE(w::seal_header(hd, payload, head).ok());
    BOOST_REQUIRE(t.send(peer, head, payload, 0).ok());
  }
  void pull() {
    const w::header hd{.kind = w::message_kind::pull_request, .element_count = n, .rank = rank, .sequence = sequence};
    std::array<std::byte, w::header_bytes> head{};
    BOOST_REQUIRE(w::seal_header(hd, std::span<const std::byte>{}, head).ok());
    BOOST_REQUIRE(t.send(peer, head, {}, 0).ok());
  }
};

struct options {
  std::string policy = "asp";
  double state_check = 0.0;
  std::chrono::milliseconds replica_timeout{2000};
  std::uint64_t ledger_samples = 0;  // > 0: a data ledger on the shard (docs/elastic.md §3)
};

ps::server_params params_of(const options& o) {
  auto layout = ps::shard_layout::even(n, 1);
  BOOST_REQUIRE(layout.has_value());
  ps::server_params sp{.core = {.layout = *layout, .workers = workers,
                                .optimizer = {.mode = ps::optimizer_params::kind::sgd, .lr = 0.125, .momentum = 0.5}}};
  sp.take_backup = true;
  sp.replica_timeout = o.replica_timeout;
  sp.replica_state_check_seconds = o.state_check;
  sp.worker_timeout = 0ms;
  sp.ledger.samples = o.ledger_samples;
  return sp;
}

ashl::sync::any_policy policy_of(const options& o) {
  ps::policy_params pp;
  pp.workers = workers;
  pp.staleness = 2;
  auto p = ps::make_policy(o.policy, pp);
  BOOST_REQUIRE(p.has_value());
  return std::move(*p);
}

std::vector<float> initial() {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 0.25f + 0.001f * static_cast<float>(i);
  return v;
}

// A primary "p0" (over transport T, on the fabric), its backup "b0" and
// `workers` clients joined to the primary.
template <class T>
struct rig_of {
  options o;
  std::shared_ptr<tr::inproc_fabric> fabric;
  std::optional<ps::server<T>> primary;
  std::optional<ps::server_backup<tr::inproc>> backup;
  std::vector<std::unique_ptr<client>> clients;
  bool backup_runs = true;  // false: a stalled backup (never polled)

  rig_of(options opt, std::shared_ptr<tr::inproc_fabric> f, T t) : o(std::move(opt)), fabric(std::move(f)) {
    auto s = ps::server<T>::create(params_of(o), policy_of(o), std::move(t), initial());
    BOOST_REQUIRE_MESSAGE(s.has_value(), (s ? "" : s.error().message()));
    primary.emplace(std::move(*s));
    for (std::uint32_t k = 0; k < workers; ++k) {
      auto c = std::make_unique<client>(client{.t = node(fabric), .rank = k});
      c->peer = *c->t.connect("p0");
      clients.push_back(std::move(c));
    }
    pump();
    for (auto& c : clients) c->join(7);
    pump();
  }
  // `before`: called with the backup before it connects (hooks to set).
  void attach(const std::function<void(ps::server_backup<tr::inproc>&)>& before = {}) {
    auto b = ps::server_backup<tr::inproc>::create(params_of(o), policy_of(o), node(fabric, "b0"), "p0", initial());
    BOOST_REQUIRE_MESSAGE(b.has_value(), (b ? "" : b.error().message()));
    backup.emplace(std::move(*b));
    if (before) before(*backup);
    for (int i = 0; i < 20 && !primary->backup_attached(); ++i) pump();
    pump();
    BOOST_REQUIRE(primary->backup_attached());
    BOOST_REQUIRE(backup->caught_up());
  }
  void pump(int rounds = 4) {
    for (int i = 0; i < rounds; ++i) {
      primary->poll();
      if (backup && backup_runs) backup->poll();
      for (auto& c : clients) c->t.progress(c->h);
    }
  }
  client& c(std::uint32_t k) { return *clients[k]; }
  std::uint64_t replies() const {
    std::uint64_t r = 0;
    for (const auto& c : clients) r += c->h.replies;
    return r;
  }
};

std::shared_ptr<tr::inproc_fabric> deterministic_fabric() { return tr::inproc_fabric::create({.deterministic = true}); }

struct rig : rig_of<tr::inproc> {
  explicit rig(options opt = {}, std::shared_ptr<tr::inproc_fabric> f = deterministic_fabric())
      : rig_of(std::move(opt), f, node(f, "p0")) {}
};

// inproc whose is_connected() says no for every peer once `cut` is set: the
// primary's view of links that are down but not yet reported failed (a
// host cut off, before the transport's keepalive notices).
struct cut_links : test_support::inproc_forwarder<cut_links> {
  const bool* cut = nullptr;
  bool is_connected(tr::peer_id p) const { return !*cut && t.is_connected(p); }
};

using test_support::saved;

}  // namespace

BOOST_AUTO_TEST_CASE(a_workers_reply_never_arrives_before_the_backup_acked_the_commit) {
  rig r;
  r.attach();
  const std::uint64_t replies0 = r.c(0).h.replies;
  const std::uint64_t acks0 = r.backup->telemetry().acks;
  r.backup_runs = false;  // stalled: it holds the record and says nothing
  r.c(0).commit(true);
  r.pump(30);
  BOOST_TEST(r.c(0).h.replies == replies0);  // held: the backup has not acknowledged the commit
  BOOST_TEST(r.primary->core().stats().commits_applied == 1u);  // applied on the primary all the same
  BOOST_TEST(r.backup->telemetry().acks == acks0);
  BOOST_TEST(r.primary->backup_attached());
  r.backup_runs = true;
  r.pump(4);
  BOOST_TEST(r.backup->telemetry().acks > acks0);
  BOOST_TEST(r.c(0).h.replies == replies0 + 1);  // released by the ack
  BOOST_TEST(r.backup->core().version() == r.primary->core().version());
  BOOST_TEST(r.c(0).h.errors.empty());
}

BOOST_AUTO_TEST_CASE(the_backups_state_equals_the_primarys_after_hundreds_of_mixed_events) {
  for (const char* label : {"asp", "ssp", "bsp", "asp+ledger"}) {
    BOOST_TEST_CONTEXT("policy " << label) {
      const std::string name = label;
      const bool ledger = name.ends_with("+ledger");
      const std::string policy = ledger ? name.substr(0, name.find('+')) : name;
      options o;
      o.policy = policy;
      o.ledger_samples = ledger ? 1000 : 0;  // leases granted, given back at leaves, records all
      o.state_check = 1e-9;  // every record asks both sides for both CRCs
      rig r(o);
      std::uint64_t rng = 12345;
      auto next = [&rng] {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<std::uint32_t>(rng >> 33);
      };
      std::uint64_t incarnation = 7;
      auto event = [&](int i) {
        client& c = r.c(static_cast<std::uint32_t>(i) % workers);  // in turn: BSP's rounds fill
        switch (next() % 8) {
          case 0: c.metric(1.0 / (1.0 + i)); break;
          case 1: c.pull(); break;
          case 2:
            if (policy == "asp") {  // a rejoin (a restarted process): the round policies would wait on it
              c.leave();
              r.pump(2);
              c.join(++incarnation);
              break;
            }
            [[fallthrough]];
          case 3: c.commit(false); break;
          default: c.commit(true); break;
        }
        r.pump(3);
      };
      for (int i = 0; i < 100; ++i) event(i);  // before the backup: it catches up from a snapshot
      r.attach();
      for (int i = 100; i < 400; ++i) event(i);
      r.pump(10);
      BOOST_TEST(r.primary->backup_attached());
      const auto t = r.primary->telemetry();
      BOOST_TEST(t.backups_dropped_crc == 0u);
      BOOST_TEST(t.backups_dropped_lag == 0u);
      BOOST_TEST(r.backup->telemetry().refused == 0u, r.backup->last_refusal().to_string());
      BOOST_TEST(r.backup->telemetry().snapshots == 1u);
      BOOST_TEST(r.backup->telemetry().records >= 300u);  // one event or more each (a rejoin is two)
      // BSP refuses a commit ahead of its round (a record all the same).
      BOOST_TEST(t.core.commits_applied > (policy == "bsp" ? 20u : 100u));
      if (ledger) BOOST_TEST(r.c(0).h.leases + r.c(1).h.leases > 2u);
      BOOST_TEST((saved(r.backup->core()) == saved(r.primary->core())));
      BOOST_TEST(r.primary->term() == 1u);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_backup_fed_a_flipped_bit_is_dropped_naming_backup_crc_and_the_version) {
  options o;
  o.state_check = 1e-9;
  rig r(o);
  r.attach();
  for (int i = 0; i < 5; ++i) {
    r.c(0).commit(true);
    r.pump();
  }
  BOOST_TEST_REQUIRE(r.primary->backup_attached());
  // One bit of the next commit's payload flips on its way into the backup's
  // core (its record re-sealed, so only the values differ).
  bool flipped = false;
  r.backup->inspect_records([&flipped](std::uint64_t, std::vector<std::byte>& bytes) {
    ps::core_event e;
    BOOST_REQUIRE(ps::decode_core_event(bytes, e).ok());
    if (flipped || e.kind != ps::core_event_kind::commit) return;
    std::vector<std::byte> payload(e.commit.payload.begin(), e.commit.payload.end());
    payload[4 * 7 + 2] ^= std::byte{0x40};  // a high mantissa bit of value 7
    e.commit.payload = payload;
    ps::encode_core_event(e, bytes);
    flipped = true;
  });
  const std::uint64_t replies0 = r.c(0).h.replies;
  r.c(0).commit(true);
  r.pump(6);
  BOOST_TEST_REQUIRE(flipped);
  BOOST_TEST(!r.primary->backup_attached());
  const auto t = r.primary->telemetry();
  BOOST_TEST(t.backups_dropped_crc == 1u);
  BOOST_TEST(t.backups_dropped_lag == 0u);
  const std::string m = r.primary->last_backup_drop().message();
  BOOST_TEST(m.rfind("backup.crc = 0x", 0) == 0u, m);
  BOOST_TEST(m.find("at version " + std::to_string(r.backup->core().version())) != std::string::npos, m);
  BOOST_TEST(m.find("backup dropped; shard 0 runs without one") != std::string::npos, m);
  // The workers were told the new term, and go on without the backup.
  BOOST_TEST(r.primary->term() == 2u);
  BOOST_TEST_REQUIRE(!r.c(0).h.terms.empty());
  BOOST_TEST(r.c(0).h.terms.back() == 2u);
  BOOST_TEST(r.c(0).h.replies == replies0 + 1);
  r.backup_runs = false;
  r.c(1).commit(true);
  r.pump();
  BOOST_TEST(r.c(1).h.replies >= 1u);
  BOOST_TEST(r.primary->core().stats().commits_applied == 7u);
}

BOOST_AUTO_TEST_CASE(a_backup_that_stops_acking_is_dropped_after_replica_timeout_and_the_workers_go_on) {
  options o;
  o.replica_timeout = 300ms;  // past any pause of a loaded host between a record and its ack
  rig r(o);
  r.attach();
  r.c(0).commit(true);
  r.pump();
  const std::uint64_t replies0 = r.c(0).h.replies;
  BOOST_TEST(replies0 >= 1u);
  r.backup_runs = false;
  const auto silent_from = std::chrono::steady_clock::now();
  r.c(0).commit(true);
  r.c(1).commit(true);
  // Bounded: the drop comes after replica_timeout (a test deadline far past it).
  for (int i = 0; i < 2000 && r.primary->backup_attached(); ++i) {
    r.pump(1);
    std::this_thread::sleep_for(1ms);
  }
  const auto waited = std::chrono::steady_clock::now() - silent_from;
  BOOST_TEST_REQUIRE(!r.primary->backup_attached());
  BOOST_TEST(waited >= o.replica_timeout);
  r.pump();
  BOOST_TEST(r.primary->telemetry().backups_dropped_lag == 1u);
  const std::string m = r.primary->last_backup_drop().message();
  BOOST_TEST(m.rfind("backup.silent_seconds = ", 0) == 0u, m);
  BOOST_TEST(r.c(0).h.replies == replies0 + 1);  // the held replies went once it was dropped
  BOOST_TEST(r.c(1).h.replies >= 1u);
  BOOST_TEST(r.primary->term() == 2u);
  // And the shard runs on, replies at once.
  r.c(0).commit(true);
  r.pump();
  BOOST_TEST(r.c(0).h.replies == replies0 + 2);
}

BOOST_AUTO_TEST_CASE(hellos_of_another_shard_or_job_and_joins_on_the_backup_are_refused_by_name) {
  rig r;
  r.attach();
  // A second backup, of shard 1 of a 2-server job: refused by name, the first stays.
  options o;
  auto sp = params_of(o);
  sp.core.layout = *ps::shard_layout::even(n, 2);
  sp.core.shard = 1;
  auto other = ps::server_backup<tr::inproc>::create(sp, policy_of(o), node(r.fabric, "b1"), "p0");
  BOOST_REQUIRE(other.has_value());
  for (int i = 0; i < 6; ++i) {
    r.pump(1);
    other->poll();
  }
  BOOST_TEST(other->telemetry().primary_errors == 1u);
  BOOST_TEST(other->last_refusal().message() == "replica_hello.servers = 2: this job has 1 servers");
  BOOST_TEST(!other->caught_up());
  BOOST_TEST(r.primary->backup_attached());
  // Another model's, and a second one of this shard.
  auto refused = [&](ps::server_params p, const std::string& name) {
    auto b = ps::server_backup<tr::inproc>::create(p, policy_of(o), node(r.fabric, name), "p0");
    BOOST_REQUIRE(b.has_value());
    for (int i = 0; i < 6; ++i) {
      r.pump(1);
      b->poll();
    }
    BOOST_TEST(b->telemetry().primary_errors == 1u);
    BOOST_TEST(!b->caught_up());
    return b->last_refusal().message();
  };
  sp = params_of(o);
  sp.core.layout = *ps::shard_layout::even(n + 1, 1);
  BOOST_TEST(refused(sp, "b2") == "replica_hello.elements = 513: shard 0 holds 512 elements");
  BOOST_TEST(refused(params_of(o), "b3") == "replica_hello.shard = 0: shard 0 has a backup already (term 1)");
  BOOST_TEST(r.primary->backup_attached());
  BOOST_TEST(r.primary->telemetry().wire_refused_for(ps::wire_refusal::job) == 3u);
  // A worker that joins the backup is told whose backup it is.
  client c{.t = node(r.fabric), .rank = 0};
  c.peer = *c.t.connect("b0");
  for (int i = 0; i < 4; ++i) {
    r.pump(1);
    c.t.progress(c.h);
  }
  c.join(9);
  for (int i = 0; i < 4; ++i) {
    r.pump(1);
    c.t.progress(c.h);
  }
  BOOST_TEST_REQUIRE(c.h.errors.size() == 1u);
  BOOST_TEST(c.h.errors[0] == "join: server 0 (backup) is shard 0's backup (term 1); its primary is p0", c.h.errors[0]);
  BOOST_TEST(r.backup->telemetry().joins_refused == 1u);
}

BOOST_AUTO_TEST_CASE(replication_params_are_refused_by_name) {
  options o;
  auto sp = params_of(o);
  sp.replica_timeout = 0ms;
  auto fabric = tr::inproc_fabric::create({});
  auto a = ps::server<tr::inproc>::create(sp, policy_of(o), node(fabric, "x"));
  BOOST_TEST_REQUIRE(!a.has_value());
  BOOST_TEST(a.error().message() == "server.replica_timeout_ms = 0: must be > 0");
  sp = params_of(o);
  sp.replica_state_check_seconds = -1;
  auto b = ps::server<tr::inproc>::create(sp, policy_of(o), node(fabric, "y"));
  BOOST_TEST_REQUIRE(!b.has_value());
  BOOST_TEST(b.error().message().rfind("server.replica_state_check_seconds = -1", 0) == 0u, b.error().message());
  sp = params_of(o);
  sp.apply_batch = 4;
  auto c = ps::server<tr::inproc>::create(sp, policy_of(o), node(fabric, "z"));
  BOOST_TEST_REQUIRE(!c.has_value());
  BOOST_TEST(c.error().message().rfind("server.apply_batch = 4: must be 1 with server.take_backup", 0) == 0u);
}

BOOST_AUTO_TEST_CASE(no_allocation_per_record_in_steady_state) {
  options o;
  rig r(o);
  r.attach();
  for (int i = 0; i < 40; ++i) {  // warm: pools, slots, record buffers at their sizes
    r.c(i % 2).commit(true);
    r.c((i + 1) % 2).metric(0.5);
    r.pump();
  }
  const std::uint64_t records = r.backup->telemetry().records;
  const std::uint64_t replies = r.replies();
  const std::size_t before = counting_new::count();
  for (int i = 0; i < 40; ++i) {
    r.c(i % 2).commit(true);
    r.c((i + 1) % 2).metric(0.5);
    r.pump();
  }
  const std::size_t allocations = counting_new::count() - before;
  BOOST_TEST(allocations == 0u);
  BOOST_TEST(r.backup->telemetry().records >= records + 80);
  BOOST_TEST(r.replies() == replies + 40);
  BOOST_TEST(r.primary->backup_attached());
}

// ps::worker processes (threads) through primaries that each have a backup
// (ps_job's inproc job, two shards): every wait() is answered (after the
// backup's ack), the parameters are those of the same job without backups
// (BSP: bit for bit), and each backup saves its primary's bytes at the end.
BOOST_AUTO_TEST_CASE(a_job_of_workers_through_primaries_with_backups_ends_as_without_them) {
  constexpr std::uint32_t servers = 2;
  for (const char* policy : {"bsp", "ssp"}) {
    BOOST_TEST_CONTEXT("policy " << policy) {
      ps_job::job_spec spec;
      spec.policy = policy;
      spec.pp.staleness = 2;
      spec.servers = servers;
      spec.cycles = 12;
      const ps_job::job_result plain = ps_job::run_job(spec);
      for (const auto& e : plain.worker_errors) BOOST_TEST_REQUIRE(e.empty(), e);

      struct side {
        std::optional<ps::server_backup<tr::inproc>> b;
        std::thread th;
        std::atomic<bool> stop{false};
        bool attached = false, still_attached = false;
        std::vector<std::byte> primary, backup;
        std::uint64_t records = 0;
      };
      std::array<side, servers> sides;
      spec.configure_server = [](ps::server_params& sp) {
        sp.take_backup = true;
        sp.replica_state_check_seconds = 1e-9;  // both CRCs at every record
      };
      spec.server_created = [&](ps::server<tr::inproc>& srv, std::uint32_t s) {
        auto n = srv.transport().fabric().node("backup" + std::to_string(s));
        ps::policy_params pp = spec.pp;
        pp.workers = spec.workers;
        auto b = ps::server_backup<tr::inproc>::create(srv.params(), std::move(*ps::make_policy(spec.policy, pp)),
                                                       std::move(*n), "server" + std::to_string(s));
        if (!b) return;
        side& sd = sides[s];
        sd.b.emplace(std::move(*b));
        for (int i = 0; i < 100 && !(srv.backup_attached() && sd.b->caught_up()); ++i) {
          srv.poll();
          sd.b->poll();
        }
        sd.attached = srv.backup_attached() && sd.b->caught_up();
        sd.th = std::thread([&sd] {
          while (!sd.stop.load()) sd.b->run_once(std::chrono::microseconds(1000));
        });
      };
      spec.server_stopped = [&](ps::server<tr::inproc>& srv, std::uint32_t s) {
        side& sd = sides[s];
        if (!sd.b) return;
        sd.stop = true;
        sd.th.join();
        for (int i = 0; i < 20; ++i) {  // what is still on its way
          srv.poll();
          sd.b->poll();
        }
        sd.still_attached = srv.backup_attached();
        sd.records = sd.b->telemetry().records;
        sd.primary = saved(srv.core());
        sd.backup = saved(sd.b->core());
      };
      const ps_job::job_result r = ps_job::run_job(spec);
      for (const auto& e : r.worker_errors) BOOST_TEST_REQUIRE(e.empty(), e);
      if (std::string(policy) == "bsp") BOOST_TEST((r.server_params == plain.server_params));
      for (std::uint32_t s = 0; s < servers; ++s) {
        BOOST_TEST_CONTEXT("shard " << s) {
          BOOST_TEST(sides[s].attached);
          BOOST_TEST(sides[s].still_attached);
          BOOST_TEST(sides[s].records > 2u * spec.cycles);
          BOOST_TEST(!sides[s].primary.empty());
          BOOST_TEST((sides[s].backup == sides[s].primary));
          BOOST_TEST(r.servers[s].backups_dropped_crc + r.servers[s].backups_dropped_lag == 0u);
          BOOST_TEST(r.servers[s].core.commits_applied == std::uint64_t{spec.workers} * spec.cycles);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_primary_that_lost_the_backup_and_the_majority_stops_naming_it) {
  bool cut = false;
  auto f = deterministic_fabric();
  rig_of<cut_links> r({}, f, cut_links{{node(f, "p0")}, &cut});
  r.attach();
  r.backup_runs = false;  // stalled: the reply below is held
  const std::uint64_t replies0 = r.c(0).h.replies;
  r.c(0).commit(true);
  r.pump();
  BOOST_TEST(r.c(0).h.replies == replies0);
  // The workers' links go down unnoticed, then the backup dies: the primary
  // cannot tell whether the backup took over with the workers.
  cut = true;
  BOOST_TEST_REQUIRE(f->fail("b0").ok());
  r.pump();
  BOOST_TEST_REQUIRE(r.primary->replica_stopped());
  BOOST_TEST(r.primary->telemetry().backups_dropped_lag == 1u);
  BOOST_TEST(r.primary->last_backup_drop().message().rfind("backup.link = \"lost\"", 0) == 0u,
             r.primary->last_backup_drop().message());
  BOOST_TEST(r.primary->term() == 1u);  // no new era: it goes on at no term
  BOOST_TEST(r.c(0).h.replies == replies0);  // the held reply never goes: the backup may not have the commit
  BOOST_TEST(r.c(0).h.terms.back() == 1u);
  // Anything a worker says is refused by name, and run() ends at once.
  r.c(1).metric(0.5);
  r.pump();
  BOOST_TEST_REQUIRE(r.c(1).h.errors.size() == 1u);
  BOOST_TEST(r.c(1).h.errors[0] ==
                 "server.backup: lost, and with it the majority of the workers (0 of 2 connected): this primary "
                 "stops; the backup may have taken over",
             r.c(1).h.errors[0]);
  std::atomic<bool> stop{false};
  r.primary->run(stop);
  BOOST_TEST((r.primary->end() == ps::server_end::backup_lost));
}

// docs/elastic.md §4.5 through the drivers (inproc, one thread): the
// primary killed, the workers' failover joins are votes, a minority does
// not promote, the majority does; the promoted server takes the workers'
// rejoins and their commit in flight once (a duplicate if the backup had
// it), and the old primary, restarted, attaches to it as its backup.
BOOST_AUTO_TEST_CASE(a_backup_promotes_on_a_majority_of_failover_joins_and_the_old_primary_attaches_to_it) {
  rig r;
  r.attach();
  for (int k = 0; k < 5; ++k) {
    r.c(0).commit(true);
    r.c(1).commit(true);
    r.pump();
  }
  BOOST_TEST_REQUIRE(r.replies() == 10u);
  r.c(0).commit(true);  // in flight when the primary dies: the backup has it, no reply came
  r.backup_runs = true;
  r.primary->poll();
  r.backup->poll();     // the record reaches the backup; its ack does not reach the primary
  BOOST_TEST(r.fabric->fail("p0").ok());
  const std::uint64_t applied = r.backup->core().stats().commits_applied;
  BOOST_TEST(applied == 11u);
  auto pump_backup = [&](int rounds = 4) {
    for (int i = 0; i < rounds; ++i) {
      r.backup->poll();
      for (auto& c : r.clients) c->t.progress(c->h);
    }
  };
  pump_backup();
  BOOST_TEST_REQUIRE(!r.backup->connected());
  // Term 0 is no vote; worker 0 with the backup's term is one vote of 2 live: no promotion.
  auto poll_backup = [&] { r.backup->poll(); };
  r.c(0).reconnect("b0", poll_backup);
  r.c(1).reconnect("b0", poll_backup);
  r.c(1).failover_join(7, 0);
  r.c(0).failover_join(7, 1);
  pump_backup();
  BOOST_TEST(!r.backup->promoted());
  BOOST_TEST(r.backup->telemetry().votes == 1u);
  BOOST_TEST_REQUIRE(r.c(0).h.errors.size() == 1u);
  BOOST_TEST(r.c(0).h.errors[0] == "join: server 0 (backup) is shard 0's backup (term 1); its primary is p0");
  // Worker 1 with the term: a majority (2 of 2), the link down: promoted.
  r.c(1).failover_join(7, 1);
  pump_backup();
  BOOST_TEST_REQUIRE(r.backup->promoted());
  auto promoted = std::move(*r.backup).take_over();
  BOOST_TEST_REQUIRE(promoted.has_value(), (promoted ? "" : promoted.error().message()));
  ps::server<tr::inproc>& srv = *promoted;
  BOOST_TEST(srv.term() == 2u);
  BOOST_TEST(srv.telemetry().failovers == 1u);
  BOOST_TEST(srv.core().live_count() == 0u);  // every worker evicted: they rejoin
  auto pump_new = [&](int rounds = 4) {
    for (int i = 0; i < rounds; ++i) {
      srv.poll();
      for (auto& c : r.clients) c->t.progress(c->h);
    }
  };
  // They rejoin (the same incarnation) and send their commit in flight again.
  for (auto& c : r.clients) {
    c->h.terms.clear();
    c->reconnect("b0", [&] { srv.poll(); });
    c->join(7);
  }
  pump_new();
  for (auto& c : r.clients) {
    BOOST_TEST_REQUIRE(c->h.terms.size() == 1u);
    BOOST_TEST(c->h.terms[0] == 2u);  // the new term, with the join
  }
  const std::uint64_t replies0 = r.c(0).h.replies;
  r.c(0).sequence -= 1;
  r.c(0).commit(true);  // the one in flight: the backup had it, a duplicate
  pump_new();
  BOOST_TEST(r.c(0).h.replies == replies0 + 1);
  BOOST_TEST(srv.core().stats().commits_applied == applied);
  BOOST_TEST(srv.core().stats().duplicates == 1u);
  r.c(1).commit(true);  // a new one: applied
  pump_new();
  BOOST_TEST(srv.core().stats().commits_applied == applied + 1);
  // The old primary, restarted, asks its peer's address first: the
  // promoted server is a primary there, so it attaches to it as its backup
  // (hello, snapshot) and keeps up.
  std::atomic<bool> asked{false};
  std::thread serving([&] {
    while (!asked.load()) srv.poll();
  });
  auto answer = ps::server_backup<tr::inproc>::ask_peer(params_of(r.o), policy_of(r.o), node(r.fabric, "p0-again"),
                                                        "b0", initial(), 5s);
  asked = true;
  serving.join();
  BOOST_TEST_REQUIRE(answer.has_value());
  BOOST_TEST_REQUIRE(answer->backup.has_value());
  BOOST_TEST(!answer->transport.has_value());
  ps::server_backup<tr::inproc>& old = *answer->backup;
  for (int i = 0; i < 20 && !srv.backup_attached(); ++i) {
    pump_new(1);
    old.poll();
  }
  BOOST_TEST_REQUIRE(old.caught_up());
  BOOST_TEST_REQUIRE(srv.backup_attached());
  BOOST_TEST(old.term() == 2u);
  r.c(0).commit(true);
  for (int i = 0; i < 6; ++i) {
    pump_new(1);
    old.poll();
  }
  BOOST_TEST(srv.core().stats().commits_applied == applied + 2);
  BOOST_TEST((saved(old.core()) == saved(srv.core())));
}

// The chaos test's log (docs/elastic.md §5): the backup's snapshot, the
// records it applied, then the promoted server's own calls, its take-over
// evictions first, replay into a fresh core as the promoted server's state.
BOOST_AUTO_TEST_CASE(a_promoted_backups_log_from_its_snapshot_replays_into_the_new_primarys_state) {
  using core_type = ps::server_backup<tr::inproc>::core_type;
  rig r;
  std::vector<std::byte> at_snapshot;
  std::vector<std::vector<std::byte>> log;
  const auto record = [&](const ps::core_event& e) {
    log.emplace_back();
    ps::encode_core_event(e, log.back());
  };
  r.attach([&](ps::server_backup<tr::inproc>& b) {
    b.record_core_calls(
        [&](const core_type& c) {
          at_snapshot = saved(c);
          log.clear();
        },
        record);
  });
  BOOST_TEST_REQUIRE(!at_snapshot.empty());  // the workers had joined: the snapshot holds them
  for (int k = 0; k < 3; ++k) {
    r.c(0).commit(true);
    r.c(1).commit(true);
    r.pump();
  }
  r.c(0).commit(true);  // in flight when the primary dies
  r.primary->poll();
  r.backup->poll();
  (void)r.fabric->fail("p0");
  BOOST_TEST(log.size() == r.backup->telemetry().records);  // every record applied, none else
  BOOST_TEST(log.size() == 7u);
  for (int i = 0; i < 4; ++i) r.backup->poll();
  for (auto& c : r.clients) c->reconnect("b0", [&] { r.backup->poll(); });
  r.c(0).failover_join(7, 1);
  r.c(1).failover_join(7, 1);
  for (int i = 0; i < 4; ++i) {
    r.backup->poll();
    for (auto& c : r.clients) c->t.progress(c->h);
  }
  BOOST_TEST_REQUIRE(r.backup->promoted());
  auto promoted = std::move(*r.backup).take_over();
  BOOST_TEST_REQUIRE(promoted.has_value(), (promoted ? "" : promoted.error().message()));
  ps::server<tr::inproc>& srv = *promoted;
  BOOST_TEST_REQUIRE(log.size() == 9u);  // the take-over's evictions, one per live worker
  for (std::size_t k = 7; k < 9; ++k) {
    ps::core_event e;
    BOOST_TEST_REQUIRE(ps::decode_core_event(log[k], e).ok());
    BOOST_TEST((e.kind == ps::core_event_kind::evict));
    BOOST_TEST(e.worker == k - 7);
  }
  for (auto& c : r.clients) {
    c->reconnect("b0", [&] { srv.poll(); });
    c->join(7);
  }
  r.c(0).sequence -= 1;
  r.c(0).commit(true);  // the one in flight again: a duplicate
  r.c(1).commit(true);  // a new one
  for (int i = 0; i < 6; ++i) {
    srv.poll();
    for (auto& c : r.clients) c->t.progress(c->h);
  }
  BOOST_TEST(srv.core().stats().duplicates == 1u);
  BOOST_TEST(log.size() == 13u);  // two joins, two commits
  // The replay: a fresh core loaded from the snapshot, every record in order.
  auto core = core_type::create(params_of(r.o).core, policy_of(r.o), initial());
  BOOST_TEST_REQUIRE(core.has_value());
  ashl::state_reader in(at_snapshot);
  BOOST_TEST_REQUIRE(core->load(in).ok());
  ps::server_actions actions(workers);
  for (const auto& bytes : log) {
    ps::core_event e;
    BOOST_TEST_REQUIRE(ps::decode_core_event(bytes, e).ok());
    ps::replay(*core, e, actions);
    actions.clear();
  }
  core->apply_pending();
  BOOST_TEST(core->stats().commits_applied == srv.core().stats().commits_applied);
  BOOST_TEST((saved(*core) == saved(srv.core())));
}

BOOST_AUTO_TEST_CASE(a_backup_told_of_a_higher_term_is_stale_and_never_promotes) {
  rig r;
  r.attach();
  r.c(0).commit(true);
  r.pump();
  BOOST_TEST(r.fabric->fail("p0").ok());
  for (int i = 0; i < 4; ++i) r.backup->poll();
  for (auto& c : r.clients) c->reconnect("b0", [&] { r.backup->poll(); });
  r.c(0).failover_join(7, 2);  // the primary went on at term 2 without this backup
  r.c(1).failover_join(7, 1);
  for (int i = 0; i < 4; ++i) {
    r.backup->poll();
    for (auto& c : r.clients) c->t.progress(c->h);
  }
  r.c(0).failover_join(7, 1);  // a majority with the backup's term, after the stale one
  for (int i = 0; i < 4; ++i) {
    r.backup->poll();
    for (auto& c : r.clients) c->t.progress(c->h);
  }
  BOOST_TEST(r.backup->stale());
  BOOST_TEST(!r.backup->promoted());
  BOOST_TEST(r.backup->telemetry().stale_joins == 1u);
  BOOST_TEST(r.c(0).h.errors.size() == 2u);  // each join answered `unavailable`
}

BOOST_AUTO_TEST_CASE(a_starting_primary_whose_peer_is_an_unpromoted_backup_stays_primary) {
  rig r;
  r.attach();
  std::atomic<bool> asked{false};
  std::thread serving([&] {
    while (!asked.load()) r.backup->poll();
  });
  auto answer = ps::server_backup<tr::inproc>::ask_peer(params_of(r.o), policy_of(r.o), node(r.fabric, "p1"), "b0",
                                                        initial(), 5s);
  asked = true;
  serving.join();
  BOOST_TEST_REQUIRE(answer.has_value());
  BOOST_TEST(!answer->backup.has_value());  // refused: a backup is no primary
  BOOST_TEST_REQUIRE(answer->transport.has_value());
  auto s = ps::server<tr::inproc>::create(params_of(r.o), policy_of(r.o), std::move(*answer->transport), initial());
  BOOST_TEST(s.has_value());
  // Nobody at the peer's address within the bound: primary as well.
  auto alone = ps::server_backup<tr::inproc>::ask_peer(params_of(r.o), policy_of(r.o), node(r.fabric, "p2"),
                                                       "nobody", initial(), 200ms);
  BOOST_TEST_REQUIRE(alone.has_value());
  BOOST_TEST(alone->transport.has_value());
}
