#include <ashl/rules/policies.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/transport/inproc.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/checks.hpp"
#include "../support/counting_new.hpp"
#include "../support/forwarding_transport.hpp"
#include "../support/ps_job.hpp"

#include <array>
#include <atomic>
#include <memory>
#include <optional>
#include <thread>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

// Issue 28, item 1 (b): a dense commit in parts (wire flag `part`,
// worker_params.commit_part_bytes). A ps::server driven from this thread by
// a raw client over inproc: each part is checked as it lands; a part out of
// order, repeated, of another split or commit, past the window, or with a bad
// CRC is refused by name and its commit discarded, the parameters
// bit-identical to before; a commit whose parts all passed is applied as the
// same commit whole would be, exactly once (a re-send is a duplicate; a
// connection lost mid-commit leaves nothing behind).

namespace ps = ashl::ps;
namespace tr = ashl::transport;
namespace w = ashl::wire;
using ps_job::grad_value;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t n = 4096;
constexpr std::uint16_t parts = 4;  // 1024 elements a part

tr::inproc node(const std::shared_ptr<tr::inproc_fabric>& f, const std::string& name = "") {
  auto r = f->node(name);
  ASHL_REQUIRE(r.has_value());
  return std::move(*r);
}

struct client_handler {
  std::vector<std::byte> buf = std::vector<std::byte>(1 << 16);
  std::vector<std::string> errors;
  std::span<std::byte> receive_buffer(tr::peer_id, std::span<const std::byte>, std::size_t k) {
    return k <= buf.size() ? std::span<std::byte>(buf.data(), k) : std::span<std::byte>{};
  }
  void on_message(tr::peer_id, std::span<const std::byte> head, std::span<const std::byte> data) {
    auto m = w::decode(head, data, {});
    ASHL_REQUIRE(m.has_value());
    if (const auto* e = m->get<w::error_body>()) errors.emplace_back(e->text);
  }
  void on_sent(tr::peer_id, std::uint64_t, const ashl::status&) {}
  void on_peer(tr::peer_id, tr::peer_event, const ashl::status&) {}
};

// One server (ASP, one worker, plain SGD) on transport T and a client
// joined as its worker 0.
template <class T>
struct basic_rig {
  std::shared_ptr<tr::inproc_fabric> fabric;
  ashl::result<ps::server<T>> srv;
  tr::inproc client;
  tr::peer_id peer = tr::no_peer;
  client_handler ch;

  basic_rig(std::shared_ptr<tr::inproc_fabric> f, const std::string& name, T server_transport,
            std::uint64_t max_receive_bytes = 0, const ps::optimizer_params& opt = sgd, bool as_landed = true)
      : fabric(std::move(f)), srv(make(std::move(server_transport), max_receive_bytes, opt, as_landed)),
        client(node(fabric)) {
    ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
    connect(name);
  }
  static constexpr ps::optimizer_params sgd{.mode = ps::optimizer_params::kind::sgd, .lr = 0.125};
  static ashl::result<ps::server<T>> make(T t, std::uint64_t max_receive_bytes = 0,
                                          const ps::optimizer_params& opt = sgd, bool as_landed = true) {
    auto layout = ps::shard_layout::even(n, 1);
    ps::policy_params pp;
    pp.workers = 1;
    return ps::server<T>::create({.core = {.layout = *layout, .workers = 1, .optimizer = opt},
                                  .max_receive_bytes = max_receive_bytes,
                                  .apply_parts_as_they_land = as_landed},
                                 std::move(*ps::make_policy("asp", pp)), std::move(t));
  }
  void connect(const std::string& name) {
    peer = *client.connect(name);
    pump();
    ASHL_REQUIRE(client.is_connected(peer));
    std::array<std::byte, w::encoded_size(w::join_body::wire_bytes)> join{};
    ASHL_REQUIRE(w::encode(w::header{.rank = 0}, w::join_body{.incarnation = 7, .batch = 4}, join).has_value());
    ASHL_REQUIRE(client.send(peer, std::span<const std::byte>(join).first(w::header_bytes),
                             std::span<const std::byte>(join).subspan(w::header_bytes), 0).ok());
    pump();
  }
  void pump() {
    for (int i = 0; i < 6; ++i) {
      srv->poll();
      client.progress(ch);
    }
  }
  static w::header commit_header(std::uint64_t seq) {
    return {.kind = w::message_kind::commit, .flags = w::flag_last_shard, .element_count = n, .rank = 0,
            .sequence = seq, .clock = seq, .samples = 16};
  }
  void send(const w::header& h, std::span<const std::byte> payload, bool flip = false) {
    std::array<std::byte, w::header_bytes> head{};
    ASHL_REQUIRE(w::seal_header(h, payload, head).ok());
    std::vector<std::byte> data(payload.begin(), payload.end());
    if (flip) data[data.size() / 2] ^= std::byte{0x10};
    ASHL_REQUIRE(client.send(peer, head, data, 0).ok());  // inproc copies at send
  }
  void whole(std::uint64_t seq, const std::vector<float>& g) {
    send(commit_header(seq), std::as_bytes(std::span<const float>(g)));
    pump();
  }
  // Part j of commit seq (of `of` parts), with edits.
  void part(std::uint64_t seq, const std::vector<float>& g, std::uint16_t j, std::uint16_t of = parts,
            bool flip = false) {
    w::header h = commit_header(seq);
    h.flags |= w::flag_part;
    h.part = j;
    h.parts = of;
    const w::part_range pr = w::part_elements(n, of, j);
    send(h, std::as_bytes(std::span<const float>(g).subspan(pr.first, pr.count)), flip);
    pump();
  }
  void in_parts(std::uint64_t seq, const std::vector<float>& g) {
    for (std::uint16_t j = 0; j < parts; ++j) part(seq, g, j);
  }
  [[nodiscard]] std::vector<float> params() const { return {srv->parameters().begin(), srv->parameters().end()}; }
};

struct rig : basic_rig<tr::inproc> {
  rig(std::shared_ptr<tr::inproc_fabric> f, const std::string& name) : basic_rig(f, name, node(f, name)) {}
  rig(std::shared_ptr<tr::inproc_fabric> f, const std::string& name, const ps::optimizer_params& opt, bool as_landed)
      : basic_rig(f, name, node(f, name), 0, opt, as_landed) {}
  static ashl::result<ps::server<tr::inproc>> make(const std::shared_ptr<tr::inproc_fabric>& f, const std::string& name) {
    return basic_rig::make(node(f, name));
  }
};

std::vector<float> gradient(std::uint64_t c) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = grad_value(0, c, i);
  return g;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void commits_in_parts(std::size_t eager_bytes) {
  auto fabric = tr::inproc_fabric::create({.eager_bytes = eager_bytes, .deterministic = true});
  rig ref(fabric, "whole"), p(fabric, "parts");
  const bool rendezvous = eager_bytes < 1024 * sizeof(float);

  // A bad case: its commit is refused by name, nothing changes.
  auto refused = [&](const char* name, const std::function<void()>& send, const std::string& says,
                     ps::wire_refusal reason) {
    const auto before = p.params();
    const auto applied = p.srv->core().stats().commits_applied;
    const auto count = p.srv->telemetry().wire_refused_for(reason);
    p.ch.errors.clear();
    send();
    ASHL_TEST(same_bits(p.params(), before), name << ": the parameters changed");
    ASHL_TEST(p.srv->core().stats().commits_applied == applied, name);
    ASHL_TEST(p.srv->telemetry().wire_refused_for(reason) == count + 1, name);
    ASHL_REQUIRE(!p.ch.errors.empty(), name);
    ASHL_TEST(p.ch.errors.front().find(says) != std::string::npos, name << ": " << p.ch.errors.front());
  };
  auto agree = [&](const char* name) {
    ASHL_TEST(same_bits(p.params(), ref.params()), name << ": parts and whole differ");
    ASHL_TEST(p.srv->core().version() == ref.srv->core().version(), name);
  };

  const auto g1 = gradient(1), g2 = gradient(2), g3 = gradient(3), g4 = gradient(4);
  ref.whole(1, g1);
  p.in_parts(1, g1);
  agree("commit 1");
  ASHL_TEST(p.srv->telemetry().commits_in_parts == 1u);
  ASHL_TEST(p.srv->telemetry().commit_parts == 4u);

  refused("a bit of part 2 flipped", [&] {
    p.part(2, g2, 0);
    p.part(2, g2, 1);
    p.part(2, g2, 2, parts, true);
    p.part(2, g2, 3);  // the rest of commit 2: dropped, not answered
  }, "header.crc32c", ps::wire_refusal::malformed);
  ASHL_TEST(p.ch.errors.size() == 1u);
  ASHL_TEST(p.srv->telemetry().commit_parts_dropped == 1u);
  // The same commit again, from part 0: it passes.
  ref.whole(2, g2);
  p.in_parts(2, g2);
  agree("commit 2 after its bad part");

  refused("part 2 before part 1", [&] {
    p.part(3, g3, 0);
    p.part(3, g3, 2);
  }, "commit_part.part = 2: out of order: part 1 of 4 of commit 3 is due", ps::wire_refusal::commit_part);
  refused("part 1 twice", [&] {
    p.part(3, g3, 0);
    p.part(3, g3, 1);
    p.part(3, g3, 1);
  }, "commit_part.part = 1: repeated: parts 0..1 of commit 3 passed", ps::wire_refusal::commit_part);
  refused("part 1 of another split", [&] {
    p.part(3, g3, 0);
    p.part(3, g3, 1, 5);
  }, "commit_part.parts = 5: earlier parts of commit 3 said 4 (another split)", ps::wire_refusal::commit_part);
  refused("part 1 of another commit", [&] {
    p.part(3, g3, 0);
    p.part(4, g3, 1);
  }, "commit_part.sequence = 4: commit 3 is in progress (part 1 of 4 due)", ps::wire_refusal::commit_part);
  refused("a part with no commit in progress", [&] { p.part(5, g3, 2); },
          "commit_part.part = 2: no commit in progress", ps::wire_refusal::commit_part);
  // Part 17 of 20 after part 0: past the parts a server holds in flight.
  // Refused before it is received when it would land in the staging buffer;
  // an eager one (delivered with its header) is out of order.
  refused("a part past the window", [&] {
    p.part(3, g3, 0, 20);
    p.part(3, g3, 17, 20);
  }, rendezvous ? "commit_part.part = 17: past the window of commit 3 (part 1 due, 0 being received; a server holds 16 parts in flight"
                : "commit_part.part = 17: out of order", ps::wire_refusal::commit_part);
  ASHL_TEST(p.srv->core().stats().refused_total() == 0u);  // nothing reached server_core

  ref.whole(3, g3);
  p.in_parts(3, g3);
  agree("commit 3 after the bad parts");
  // Exactly once: the same commit again (a worker's re-send) is a duplicate.
  const auto applied = p.srv->core().stats().commits_applied;
  p.in_parts(3, g3);
  ASHL_TEST(p.srv->core().stats().commits_applied == applied);
  ASHL_TEST(p.srv->core().stats().duplicates == 1u);
  agree("commit 3 sent again");

  // The connection goes mid-commit: its parts are discarded; the worker
  // joins again on a new one and sends the commit again, applied once.
  p.part(4, g4, 0);
  p.part(4, g4, 1);
  p.client.close(p.peer);
  p.pump();
  p.connect("parts");
  p.in_parts(4, g4);
  ref.whole(4, g4);
  agree("commit 4 after a lost connection");
  ASHL_TEST(p.srv->core().stats().commits_applied == 4u);
  ASHL_TEST(p.srv->telemetry().commits_in_parts == 5u);  // 1, 2, 3, 3 again (a duplicate), 4
  // Not received: part 3 of the commit whose part 2 failed (dropped), part 17 (past the window).
  if (rendezvous) ASHL_TEST(p.srv->telemetry().transport.receives_refused == 2u, p.srv->telemetry().transport.receives_refused);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_commit_in_parts_is_checked_part_by_part_and_applied_whole_once) {
  commits_in_parts(256);                // parts received into the server's staging buffer
  commits_in_parts(std::size_t{1} << 20);  // eager parts, copied into it once checked
}

// A model-delta server (ASP) adds each part beside the parameters as it
// lands (server_params.apply_parts_as_they_land, the default): the same bits
// as a server that applies each commit whole at its last part, commit after
// commit; a bad part or a lost connection mid-commit changes nothing and the
// commit sent again applies as it lands; with the option off nothing is
// speculated.
BOOST_AUTO_TEST_CASE(a_commit_in_parts_is_added_as_its_parts_land_with_the_same_bits) {
  for (const std::size_t eager : {std::size_t{256}, std::size_t{1} << 20}) {
    BOOST_TEST_CONTEXT("eager " << eager) {
      auto fabric = tr::inproc_fabric::create({.eager_bytes = eager, .deterministic = true});
      const ps::optimizer_params deltas{};
      rig on(fabric, "on", deltas, true), off(fabric, "off", deltas, false);
      auto both = [&](const std::function<void(rig&)>& f) {
        f(on);
        f(off);
        ASHL_TEST(same_bits(on.params(), off.params()));
        ASHL_TEST(on.srv->core().version() == off.srv->core().version());
      };
      for (std::uint64_t c = 1; c <= 3; ++c) both([&](rig& r) { r.in_parts(c, gradient(c)); });
      ASHL_TEST(on.srv->telemetry().applied_as_landed == 3u);
      ASHL_TEST(on.srv->telemetry().speculations == 3u);
      // A flipped bit in part 2: refused, nothing changed; sent again, it lands.
      const auto g4 = gradient(4);
      both([&](rig& r) {
        const auto before = r.params();
        r.part(4, g4, 0);
        r.part(4, g4, 1);
        r.part(4, g4, 2, parts, true);
        r.part(4, g4, 3);
        ASHL_TEST(same_bits(r.params(), before));
        r.in_parts(4, g4);
      });
      // The connection goes after part 1: nothing changes; after the rejoin
      // the commit sent again lands.
      const auto g5 = gradient(5);
      both([&](rig& r) {
        const auto before = r.params();
        r.part(5, g5, 0);
        r.part(5, g5, 1);
        r.client.close(r.peer);
        r.pump();
        ASHL_TEST(same_bits(r.params(), before));
        r.connect(&r == &on ? "on" : "off");
        r.in_parts(5, g5);
      });
      ASHL_TEST(on.srv->core().stats().commits_applied == 5u);
      ASHL_TEST(on.srv->telemetry().applied_as_landed == 5u);
      ASHL_TEST(on.srv->telemetry().speculations_stale == 0u);
      ASHL_TEST(off.srv->telemetry().speculations == 0u);
      ASHL_TEST(off.srv->telemetry().applied_as_landed == 0u);
      ASHL_TEST(off.srv->core().stats().commits_applied == 5u);
    }
  }
}

// No allocation on the server for a commit in parts, whole or refused part
// by part, at sequences past 10^6: the text a part's refusal would carry
// (" of commit N", longer than the small-string buffer from N = 100,000 on)
// was once built for every part. The client's messages are sealed before
// the count starts, and inproc sends from a pool.
BOOST_AUTO_TEST_CASE(commits_in_parts_allocate_nothing_at_large_sequences) {
  for (const std::size_t eager : {std::size_t{256}, std::size_t{1} << 20}) {
    auto fabric = tr::inproc_fabric::create({.eager_bytes = eager, .deterministic = true});
    rig p(fabric, "parts");
    constexpr std::uint64_t first = 999'990;  // crosses 10^6 within the measured commits
    constexpr int warmup = 4, measured = 24;
    struct message {
      std::array<std::byte, w::header_bytes> head{};
      std::span<const std::byte> payload;
    };
    const std::vector<std::vector<float>> g{gradient(1), gradient(2)};
    std::vector<message> msgs;
    for (int c = 0; c < warmup + measured; ++c) {
      const std::uint64_t seq = first + static_cast<std::uint64_t>(c);
      for (std::uint16_t j = 0; j < parts; ++j) {
        w::header h = rig::commit_header(seq);
        h.flags |= w::flag_part;
        h.part = j;
        h.parts = parts;
        const w::part_range pr = w::part_elements(n, parts, j);
        message m{.payload = std::as_bytes(std::span<const float>(g[c % 2]).subspan(pr.first, pr.count))};
        ASHL_REQUIRE(w::seal_header(h, m.payload, m.head).ok());
        msgs.push_back(m);
      }
    }
    auto commit = [&](int c) {
      for (std::uint16_t j = 0; j < parts; ++j) {
        const message& m = msgs[static_cast<std::size_t>(c) * parts + j];
        ASHL_REQUIRE(p.client.send(p.peer, m.head, m.payload, 0).ok());
        p.pump();
      }
    };
    for (int c = 0; c < warmup; ++c) commit(c);
    const std::size_t before = counting_new::count();
    for (int c = warmup; c < warmup + measured; ++c) commit(c);
    // The last commit sent again (a worker's re-send after a reconnect): a
    // duplicate, counted and not applied, still without an allocation.
    const std::size_t client_side = counting_new::count();
    commit(warmup + measured - 1);  // a duplicate: the server answers nothing
    const std::size_t after = counting_new::count();
    ASHL_TEST(client_side == before, "allocations for " << measured << " commits in parts, eager " << eager << ": "
                                                        << client_side - before);
    ASHL_TEST(after == client_side, "allocations for a duplicate commit in parts: " << after - client_side);
    ASHL_TEST(p.srv->core().stats().commits_applied == std::uint64_t{warmup + measured});
    ASHL_TEST(p.srv->core().stats().duplicates == 1u);
    ASHL_TEST(p.srv->telemetry().commits_in_parts == std::uint64_t{warmup + measured + 1});
    ASHL_TEST(p.ch.errors.empty(), p.ch.errors.front());
  }
}

// Through ps::worker: BSP, two servers, commits in parts of 1 Ki elements
// with two in flight give the same parameters, bit for bit, as whole ones.
BOOST_AUTO_TEST_CASE(a_job_committing_in_parts_matches_one_committing_whole) {
  for (const std::size_t eager : {std::size_t{256}, std::size_t{1} << 20}) {
    ps_job::job_spec spec;
    spec.servers = 2;
    spec.elements = 10000;  // 5000 a shard: 5 parts
    spec.cycles = 6;
    spec.eager_bytes = eager;
    const ps_job::job_result whole = ps_job::run_job(spec);
    spec.configure_worker = [](ps::worker_params& wp) {
      wp.commit_part_bytes = 4096;
      wp.commit_window = 2;
    };
    const ps_job::job_result in_parts = ps_job::run_job(spec);
    for (const auto& e : whole.worker_errors) ASHL_REQUIRE(e.empty(), e);
    for (const auto& e : in_parts.worker_errors) ASHL_REQUIRE(e.empty(), e);
    for (std::uint32_t s = 0; s < spec.servers; ++s) {
      ASHL_TEST(same_bits(whole.server_params[s], in_parts.server_params[s]), "server " << s << " eager " << eager);
      ASHL_TEST(in_parts.servers[s].commits_in_parts == std::uint64_t{spec.workers} * spec.cycles);
      ASHL_TEST(in_parts.servers[s].commit_parts == 5u * spec.workers * spec.cycles);
      ASHL_TEST(in_parts.servers[s].wire_refused_total() == 0u);
      ASHL_TEST(whole.servers[s].commit_parts == 0u);
    }
    for (const auto& t : in_parts.workers) ASHL_TEST(t.commit_parts == 2u * 5 * spec.cycles);
  }
}

BOOST_AUTO_TEST_CASE(commit_part_bytes_and_window_out_of_range_are_refused_by_name) {
  auto fabric = tr::inproc_fabric::create({});
  std::vector<float> wv(100);
  auto a = ps::worker<tr::inproc>::create({.servers = {"s"}, .commit_part_bytes = 4095}, node(fabric), wv);
  ASHL_REQUIRE(!a.has_value());
  ASHL_TEST(a.error().message().find("worker.commit_part_bytes = 4095: must be 0 (one message) or >= 4096") !=
                std::string::npos, a.error().message());
  for (const std::uint32_t win : {0u, 17u}) {
    auto b = ps::worker<tr::inproc>::create({.servers = {"s"}, .commit_window = win}, node(fabric), wv);
    ASHL_REQUIRE(!b.has_value());
    ASHL_TEST(b.error().message().find("worker.commit_window = " + std::to_string(win) + ": must be in 1..16") !=
                  std::string::npos, b.error().message());
  }
}

namespace {

// Forwards to inproc; once armed with a part index, that part of the next
// commit in parts leaves with one payload bit flipped after it was sealed.
struct flip_part : test_support::inproc_forwarder<flip_part> {
  std::shared_ptr<std::atomic<int>> arm = std::make_shared<std::atomic<int>>(-1);
  std::vector<std::byte> copy;
  ashl::status send(tr::peer_id p, std::span<const std::byte> h, std::span<const std::byte> d, std::uint64_t c) {
    const w::peeked_part pk = w::peek_part(h);
    if (pk.valid() && pk.kind == w::message_kind::commit && static_cast<int>(pk.part) == arm->load()) {
      arm->store(-1);
      copy.assign(d.begin(), d.end());
      copy[copy.size() / 2] ^= std::byte{0x10};
      return t.send(p, h, copy, c);  // inproc copies at send
    }
    return t.send(p, h, d, c);
  }
};
static_assert(tr::transport<flip_part>);

}  // namespace

// Through ps::worker: a part damaged on the way fails the worker's wait
// naming the server's refusal, and the server's parameters stay as they were.
BOOST_AUTO_TEST_CASE(a_damaged_commit_part_fails_the_wait_and_the_parameters_stay) {
  auto fabric = tr::inproc_fabric::create({.eager_bytes = 256, .deterministic = true});
  auto srv = rig::make(fabric, "server0");
  ASHL_REQUIRE(srv.has_value());
  std::vector<float> wv(n);
  flip_part fp{{node(fabric)}};
  auto arm = fp.arm;
  std::optional<ps::worker<flip_part>> wk;
  {
    std::atomic<bool> stop{false};
    std::thread th([&] { srv->run(stop); });
    auto made = ps::worker<flip_part>::create(
        {.servers = {"server0"}, .timeout = 10s, .commit_part_bytes = 4096, .commit_window = 2}, std::move(fp), wv);
    stop = true;
    th.join();
    ASHL_REQUIRE(made.has_value(), (made ? "" : made.error().message()));
    wk.emplace(std::move(*made));
  }
  auto cycle = [&](const std::vector<float>& g) {
    while (!wk->iteration_done()) {}
    ASHL_REQUIRE(wk->commit(g).ok());
    for (int spins = 0; spins < 10000 && !wk->test(); ++spins) srv->poll();
    return wk->wait();
  };
  const auto g1 = gradient(1), g2 = gradient(2);
  ASHL_REQUIRE(cycle(g1).ok());
  const std::vector<float> before(srv->parameters().begin(), srv->parameters().end());
  const auto applied = srv->core().stats().commits_applied;
  *arm = 2;
  const ashl::status st = cycle(g2);
  ASHL_TEST(arm->load() == -1);  // part 2 was damaged
  ASHL_TEST((st.code() == ashl::errc::checksum_mismatch), st.message());
  ASHL_TEST(st.message().find("server 0 at server0 refused: header.crc32c") != std::string::npos, st.message());
  ASHL_TEST(same_bits({srv->parameters().begin(), srv->parameters().end()}, before));
  ASHL_TEST(srv->core().stats().commits_applied == applied);
  ASHL_TEST(srv->telemetry().wire_refused_for(ps::wire_refusal::malformed) == 1u);
  ASHL_TEST(srv->telemetry().commits_in_parts == 1u);  // the good cycle's
  ASHL_TEST(same_bits(wv, before));                    // the worker's too: no reply came
}

namespace {

// Forwards the server's side of inproc; once armed with a part index, that
// part's receive into the server's buffer is held in flight (inproc writes
// into a buffer of this wrapper's instead) until the test lets it end: with
// `abandon`, garbage lands late in the server's buffer and the receive is
// abandoned, as a transport does when a peer fails mid-transfer.
struct held_receive {
  int arm = -1;
  bool abandon = false;
  tr::peer_id peer = tr::no_peer;
  std::span<std::byte> region;  // the server's buffer for the held part
  std::vector<std::byte> elsewhere = std::vector<std::byte>(1 << 16);
  [[nodiscard]] bool holding() const noexcept { return !region.empty(); }
};

struct slow_part : test_support::inproc_forwarder<slow_part> {
  std::shared_ptr<held_receive> held;

  template <class H>
  struct wrapped : test_support::forwarding_handler<H> {
    slow_part* self;
    std::span<std::byte> receive_buffer(tr::peer_id p, std::span<const std::byte> head, std::size_t k) {
      const std::span<std::byte> region = this->h->receive_buffer(p, head, k);
      held_receive& hr = *self->held;
      const w::peeked_part pk = w::peek_part(head);
      if (region.empty() || !pk.valid() || pk.kind != w::message_kind::commit || static_cast<int>(pk.part) != hr.arm ||
          k > hr.elsewhere.size())
        return region;
      hr.arm = -1;
      hr.peer = p;
      hr.region = region;
      return std::span<std::byte>(hr.elsewhere).first(k);
    }
    void on_message(tr::peer_id p, std::span<const std::byte> head, std::span<const std::byte> data) {
      if (data.data() == self->held->elsewhere.data()) return;  // the held receive: not delivered yet
      this->h->on_message(p, head, data);
    }
  };

  template <tr::handler H>
  std::size_t progress(H& h) {
    held_receive& hr = *held;
    if (hr.abandon && hr.holding()) {
      std::memset(hr.region.data(), 0x7f, hr.region.size());  // the old connection's late write
      h.on_receive_abandoned(hr.peer, hr.region);  // the server handler has it: the race needs it
      hr.region = {};
      hr.abandon = false;
    }
    wrapped<H> w{{&h}, this};
    return t.progress(w);
  }
};
static_assert(tr::transport<slow_part>);

}  // namespace

// A worker whose connection went while a part of its commit was still being
// received joins again and sends the commit again. The part sent again must
// not be refused as "being received" (that failed the worker's wait), and
// the old receive's late write must not reach the commit: the rank's
// staging is retired until that receive ends, and the commit is applied
// once, bit-identical to the same commit sent whole. A second race reuses
// the retired staging.
BOOST_AUTO_TEST_CASE(a_commit_sent_again_after_a_rejoin_passes_beside_a_receive_still_in_flight) {
  auto fabric = tr::inproc_fabric::create({.eager_bytes = 256, .deterministic = true});  // parts are rendezvous
  auto held = std::make_shared<held_receive>();
  rig ref(fabric, "whole");
  basic_rig<slow_part> p(fabric, "parts", slow_part{{node(fabric, "parts")}, held});
  auto agree = [&](const char* name) {
    ASHL_TEST(same_bits(p.params(), ref.params()), name << ": parts and whole differ");
    ASHL_TEST(p.srv->core().version() == ref.srv->core().version(), name);
  };
  const auto g1 = gradient(1);
  ref.whole(1, g1);
  p.in_parts(1, g1);
  agree("commit 1");

  for (std::uint64_t seq = 2; seq <= 3; ++seq) {
    const auto g = gradient(seq);
    held->arm = 1;
    p.part(seq, g, 0);
    p.part(seq, g, 1);
    ASHL_REQUIRE(held->holding(), "commit " << seq << ": part 1's receive is not held");
    p.client.close(p.peer);
    p.pump();
    p.connect("parts");
    p.ch.errors.clear();
    p.part(seq, g, 0);
    p.part(seq, g, 1);
    p.part(seq, g, 2);
    held->abandon = true;  // the old receive ends between the parts sent again
    p.pump();
    ASHL_REQUIRE(!held->holding());
    p.part(seq, g, 3);
    ref.whole(seq, g);
    ASHL_TEST(p.ch.errors.empty(), "commit " << seq << ": " << (p.ch.errors.empty() ? "" : p.ch.errors.front()));
    agree(seq == 2 ? "commit 2, sent again beside the held receive" : "commit 3, the second race");
    ASHL_TEST(p.srv->core().stats().commits_applied == seq);
    ASHL_TEST(p.srv->telemetry().staging_retired == seq - 1);
    ASHL_TEST(p.srv->telemetry().transport.receives_refused == 0u);
  }
  ASHL_TEST(p.srv->core().stats().refused_total() == 0u);
  // Two stagings in all: the second race took the first's retired one back.
  ASHL_TEST(p.srv->telemetry().staging_bytes == 2 * n * sizeof(float));
}

// The staging of a rank's commits in parts counts in max_receive_bytes with
// the receive buffers: a budget smaller than the shard's dense size refuses
// the first part by name, before anything is allocated or received, and the
// parameters stay; a budget that holds it lets the same commit through, and
// the staging shows in telemetry. Eager parts (delivered with their header)
// are refused the same way once received.
BOOST_AUTO_TEST_CASE(the_staging_of_commits_in_parts_counts_in_max_receive_bytes) {
  for (const std::size_t eager : {std::size_t{256}, std::size_t{1} << 16}) {
    BOOST_TEST_CONTEXT((eager == 256 ? "rendezvous parts" : "eager parts")) {
      auto fabric = tr::inproc_fabric::create({.eager_bytes = eager, .deterministic = true});
      constexpr std::uint64_t staging = n * sizeof(float);
      basic_rig<tr::inproc> tight(fabric, "tight", node(fabric, "tight"), staging - 1);
      const auto g1 = gradient(1);
      const auto before = tight.params();
      tight.in_parts(1, g1);
      ASHL_TEST(same_bits(tight.params(), before));
      ASHL_TEST(tight.srv->core().stats().commits_applied == 0u);
      ASHL_TEST(tight.srv->telemetry().staging_bytes == 0u);
      ASHL_TEST(tight.srv->telemetry().wire_refused_for(ps::wire_refusal::receive_budget) == 1u);
      ASHL_TEST(tight.srv->telemetry().commit_parts_dropped == 3u);  // parts 1-3: dropped, not answered
      ASHL_REQUIRE(tight.ch.errors.size() == 1u);
      ASHL_TEST(tight.ch.errors.front().find("server.max_receive_bytes = " + std::to_string(staging - 1) +
                                             ": worker 0's commits in parts need a staging of " +
                                             std::to_string(staging) + " bytes") != std::string::npos,
                tight.ch.errors.front());

      rig ref(fabric, "whole");
      basic_rig<tr::inproc> fits(fabric, "fits", node(fabric, "fits"), staging);
      ref.whole(1, g1);
      fits.in_parts(1, g1);
      ASHL_TEST(fits.ch.errors.empty(), (fits.ch.errors.empty() ? "" : fits.ch.errors.front()));
      ASHL_TEST(same_bits(fits.params(), ref.params()));
      ASHL_TEST(fits.srv->telemetry().staging_bytes == staging);
      ASHL_TEST(fits.srv->telemetry().receive_bytes == 0u);  // every part landed in the staging
    }
  }
}
