#include <ashl/transport/inproc.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/counting_new.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include "../support/checks.hpp"

namespace t = ashl::transport;
using namespace std::chrono_literals;

namespace {

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }
std::string text_of(std::span<const std::byte> b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

// Records every handler call as one line; receive_buffer hands out `big`
// unless refusing.
struct recorder {
  std::vector<std::string> log;
  std::vector<std::byte> big = std::vector<std::byte>(1 << 16);
  bool refuse = false;
  std::vector<std::pair<std::string, std::string>> messages;  // header, data
  std::vector<std::pair<std::uint64_t, ashl::status>> sent;
  std::vector<std::pair<t::peer_id, t::peer_event>> events;
  std::string last_why;
  const std::byte* last_data = nullptr;

  std::span<std::byte> receive_buffer(t::peer_id p, std::span<const std::byte> h, std::size_t n) {
    log.push_back("buffer " + std::to_string(p) + " " + text_of(h) + " " + std::to_string(n));
    if (refuse) return {};
    return std::span(big).first(n);
  }
  void on_message(t::peer_id p, std::span<const std::byte> h, std::span<const std::byte> d) {
    log.push_back("message " + std::to_string(p) + " " + text_of(h) + " " + std::to_string(d.size()));
    messages.emplace_back(text_of(h), text_of(d));
    last_data = d.data();
  }
  void on_sent(t::peer_id p, std::uint64_t cookie, const ashl::status& s) {
    log.push_back("sent " + std::to_string(p) + " " + std::to_string(cookie) + " " + (s.ok() ? "ok" : "error"));
    sent.emplace_back(cookie, s);
  }
  void on_peer(t::peer_id p, t::peer_event e, const ashl::status& why) {
    log.push_back("peer " + std::to_string(p) + " " + std::string(t::to_string(e)));
    events.emplace_back(p, e);
    last_why = why.message();
  }
};
static_assert(t::handler<recorder>);

// Drives nodes on this thread until nothing more happens.
template <class... N>
void settle(recorder& h, N&... nodes) {
  for (int round = 0; round < 100; ++round) {
    std::size_t calls = 0;
    ((calls += nodes.progress(h)), ...);
    if (calls == 0) return;
  }
}

struct pair_fixture {
  std::shared_ptr<t::inproc_fabric> fabric;
  t::inproc a, b;
  t::peer_id a_to_b = t::no_peer, b_to_a = t::no_peer;
  recorder ha, hb;

  explicit pair_fixture(t::inproc_params p = {.eager_bytes = 16, .deterministic = true})
      : fabric(t::inproc_fabric::create(p)), a(fabric->node("a").value()), b(fabric->node("b").value()) {
    auto p_ab = a.connect("b");
    ASHL_REQUIRE(p_ab);
    a_to_b = *p_ab;
    ASHL_TEST(!a.is_connected(a_to_b));  // reported from progress, not at once
    for (int i = 0; i < 4; ++i) {
      a.progress(ha);
      b.progress(hb);
    }
    ASHL_REQUIRE(a.is_connected(a_to_b));
    ASHL_REQUIRE(b.peers().size() == 1u);
    b_to_a = b.peers()[0];
    ha.log.clear();
    hb.log.clear();
    ha.events.clear();
    hb.events.clear();
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(connect_reports_both_sides_and_unknown_names_fail) {
  auto fabric = t::inproc_fabric::create({.deterministic = true});
  auto a = fabric->node("a");
  auto b = fabric->node("b");
  ASHL_REQUIRE((a && b));
  ASHL_TEST(!fabric->node("a"));  // a name in use
  recorder ha, hb;
  auto p = a->connect("b");
  ASHL_REQUIRE(p);
  a->progress(ha);
  ASHL_TEST(hb.events.empty());
  b->progress(hb);
  ASHL_REQUIRE(hb.events.size() == 1u);
  ASHL_TEST((hb.events[0].second == t::peer_event::connected));
  a->progress(ha);
  ASHL_REQUIRE(ha.events.size() == 1u);
  ASHL_TEST(ha.events[0].first == *p);
  ASHL_TEST((ha.events[0].second == t::peer_event::connected));
  ASHL_TEST(a->counters().peers_connected == 1u);
  ASHL_TEST(b->counters().peers_connected == 1u);
  ASHL_TEST(a->peers().size() == 1u);

  auto q = a->connect("x");
  ASHL_REQUIRE(q);
  ASHL_TEST(!a->is_connected(*q));
  a->progress(ha);
  ASHL_REQUIRE(ha.events.size() == 2u);
  ASHL_TEST((ha.events[1].second == t::peer_event::failed));
  ASHL_TEST(ha.last_why == "no inproc node named 'x'");
  ASHL_TEST(!a->send(*q, {}, {}, 1).ok());  // not connected: an error at once
  ASHL_TEST(a->peers().size() == 1u);
}

BOOST_AUTO_TEST_CASE(small_and_large_messages_single_thread) {
  pair_fixture f;
  const std::string small = "0123456789abcdef";  // 16 bytes: eager
  const std::string large(1000, 'z');            // above eager: via receive_buffer
  ASHL_TEST(f.a.send(f.a_to_b, bytes_of("h1"), bytes_of(small), 11).ok());
  ASHL_TEST(f.a.send(f.a_to_b, bytes_of("h2"), bytes_of(large), 12).ok());
  ASHL_TEST(f.a.send(f.a_to_b, bytes_of("h3"), {}, 13).ok());
  f.a.progress(f.ha);
  ASHL_TEST((f.ha.log == std::vector<std::string>{"sent 0 11 ok", "sent 0 12 ok", "sent 0 13 ok"}));
  f.b.progress(f.hb);
  ASHL_TEST((f.hb.log == std::vector<std::string>{"message 0 h1 16", "buffer 0 h2 1000", "message 0 h2 1000",
                                                   "message 0 h3 0"}));
  ASHL_REQUIRE(f.hb.messages.size() == 3u);
  ASHL_TEST(f.hb.messages[0].second == small);
  ASHL_TEST(f.hb.messages[1].second == large);
  ASHL_TEST(f.hb.messages[2].second.empty());
  ASHL_TEST(f.a.counters().messages_sent == 3u);
  ASHL_TEST(f.a.counters().bytes_sent == 6u + 16u + 1000u);
  ASHL_TEST(f.b.counters().messages_received == 3u);
  ASHL_TEST(f.b.counters().bytes_received == 6u + 16u + 1000u);

  // The large one landed in the handler's buffer.
  ASHL_TEST(f.a.send(f.a_to_b, bytes_of("h4"), bytes_of(large), 14).ok());
  f.b.progress(f.hb);
  ASHL_TEST(f.hb.last_data == f.hb.big.data());

  std::array<std::byte, 129> too_big{};
  ASHL_TEST(!f.a.send(f.a_to_b, too_big, {}, 15).ok());
}

BOOST_AUTO_TEST_CASE(refused_large_message_is_dropped_and_counted) {
  pair_fixture f;
  f.hb.refuse = true;
  const std::string large(100, 'q');
  ASHL_TEST(f.a.send(f.a_to_b, bytes_of("r"), bytes_of(large), 1).ok());
  ASHL_TEST(f.a.send(f.a_to_b, bytes_of("s"), bytes_of("tiny"), 2).ok());
  f.b.progress(f.hb);
  ASHL_TEST((f.hb.log == std::vector<std::string>{"buffer 0 r 100", "message 0 s 4"}));
  ASHL_TEST(f.b.counters().receives_refused == 1u);
  ASHL_TEST(f.b.counters().messages_received == 1u);
  f.a.progress(f.ha);
  ASHL_TEST(f.ha.sent.size() == 2u);  // the sender's completion is ok: refusal is the receiver's
}

BOOST_AUTO_TEST_CASE(close_is_seen_by_both_sides_after_earlier_messages) {
  pair_fixture f;
  ASHL_TEST(f.a.send(f.a_to_b, bytes_of("before"), {}, 1).ok());
  f.a.close(f.a_to_b);
  ASHL_TEST(!f.a.is_connected(f.a_to_b));
  ASHL_TEST(f.a.peers().empty());
  ASHL_TEST(!f.a.send(f.a_to_b, bytes_of("after"), {}, 2).ok());
  f.a.progress(f.ha);
  ASHL_TEST((f.ha.log == std::vector<std::string>{"sent 0 1 ok", "peer 0 closed"}));
  f.b.progress(f.hb);
  ASHL_TEST((f.hb.log == std::vector<std::string>{"message 0 before 0", "peer 0 closed"}));
  ASHL_TEST(f.b.peers().empty());
  ASHL_TEST(f.a.counters().peers_closed == 1u);
  ASHL_TEST(f.b.counters().peers_closed == 1u);

  // A message in flight towards a side that closed is dropped; the next send fails.
  pair_fixture g;
  ASHL_TEST(g.b.send(g.b_to_a, bytes_of("late"), {}, 1).ok());
  g.a.close(g.a_to_b);
  ASHL_TEST(g.b.send(g.b_to_a, bytes_of("later"), {}, 2).ok());  // b has not seen the close yet
  settle(g.ha, g.a);
  settle(g.hb, g.b);
  ASHL_TEST((g.ha.log == std::vector<std::string>{"peer 0 closed"}));
  ASHL_TEST((g.hb.log == std::vector<std::string>{"sent 0 1 ok", "sent 0 2 error", "peer 0 closed"}));
  ASHL_TEST(g.b.counters().sends_failed == 1u);

  // close() closes all; destroying a node closes its links.
  pair_fixture h;
  h.a.close();
  settle(h.hb, h.b);
  ASHL_TEST((h.hb.log == std::vector<std::string>{"peer 0 closed"}));
  pair_fixture k;
  { t::inproc gone = std::move(k.a); }
  settle(k.hb, k.b);
  ASHL_TEST((k.hb.log == std::vector<std::string>{"peer 0 closed"}));
}

BOOST_AUTO_TEST_CASE(close_while_connecting_closes_the_far_side_too) {
  auto fabric = t::inproc_fabric::create({.deterministic = true});
  auto a = fabric->node("a").value();
  auto b = fabric->node("b").value();
  recorder ha, hb;
  const auto p = *a.connect("b");
  a.close(p);  // before b took the request
  for (int i = 0; i < 4; ++i) {
    a.progress(ha);
    b.progress(hb);
  }
  ASHL_TEST((ha.log == std::vector<std::string>{"peer 0 closed"}));
  ASHL_TEST((hb.log == std::vector<std::string>{"peer 0 connected", "peer 0 closed"}));
  ASHL_TEST(a.peers().empty());
  ASHL_TEST(b.peers().empty());
}

BOOST_AUTO_TEST_CASE(a_killed_node_is_reported_failed_and_sends_to_it_fail) {
  pair_fixture f;
  auto c = f.fabric->node("c");
  ASHL_REQUIRE(c);
  recorder hc;
  auto c_to_b = c->connect("b");
  ASHL_REQUIRE(c_to_b);
  settle(f.hb, f.b);
  settle(hc, *c);
  ASHL_REQUIRE(c->is_connected(*c_to_b));
  f.hb.log.clear();

  ASHL_TEST(f.fabric->fail("b").ok());
  ASHL_TEST(!f.fabric->fail("b").ok());  // no live node of that name now
  ASHL_TEST(f.a.send(f.a_to_b, bytes_of("x"), {}, 7).ok());  // a has not seen it yet: fails via on_sent
  f.a.progress(f.ha);
  ASHL_TEST((f.ha.log == std::vector<std::string>{"sent 0 7 error", "peer 0 failed"}));
  ASHL_TEST(f.ha.last_why == "inproc node 'b' failed (killed)");
  ASHL_TEST(!f.a.is_connected(f.a_to_b));
  ASHL_TEST(!f.a.send(f.a_to_b, bytes_of("y"), {}, 8).ok());
  ASHL_TEST(f.a.counters().peers_failed == 1u);
  ASHL_TEST(f.a.counters().sends_failed == 1u);
  c->progress(hc);
  ASHL_TEST((hc.events.back() == std::pair{*c_to_b, t::peer_event::failed}));

  // The killed node makes no more handler calls and refuses new work.
  ASHL_TEST(f.b.progress(f.hb) == 0u);
  ASHL_TEST(f.hb.log.empty());
  ASHL_TEST(!f.b.connect("a"));
  // Its name is free again (a restarted node).
  ASHL_TEST(f.fabric->node("b").has_value());

  // kill() from the node itself, while a connect to it is under way.
  auto fabric = t::inproc_fabric::create({.deterministic = true});
  auto x = fabric->node("x");
  auto y = fabric->node("y");
  recorder hx;
  ASHL_REQUIRE(x->connect("y"));
  y->kill();
  settle(hx, *x);
  ASHL_TEST((hx.log == std::vector<std::string>{"peer 0 failed"}));
}

BOOST_AUTO_TEST_CASE(wait_returns_when_something_is_queued) {
  pair_fixture f;
  std::thread sender([&] {
    std::this_thread::sleep_for(20ms);
    ASHL_TEST(f.a.send(f.a_to_b, bytes_of("wake"), {}, 1).ok());
  });
  // Without the message this would sleep a minute; with it, it returns.
  f.b.wait(std::chrono::seconds(60));
  sender.join();
  f.b.progress(f.hb);
  ASHL_TEST((f.hb.log == std::vector<std::string>{"message 0 wake 0"}));
  f.b.wait(1ms);  // nothing queued: returns after the timeout
}

namespace {

// Three nodes on one thread: a and c both send to b and b answers; returns
// every handler call of every node, in order.
std::vector<std::string> scripted_run(bool deterministic) {
  auto fabric = t::inproc_fabric::create({.eager_bytes = 8, .deterministic = deterministic});
  auto a = fabric->node("a").value();
  auto b = fabric->node("b").value();
  auto c = fabric->node("c").value();
  recorder h;
  auto ab = *a.connect("b");
  auto cb = *c.connect("b");
  for (int i = 0; i < 3; ++i) {
    h.log.push_back("-- a");
    a.progress(h);
    h.log.push_back("-- c");
    c.progress(h);
    h.log.push_back("-- b");
    b.progress(h);
  }
  for (int i = 0; i < 40; ++i) {
    const std::string data(static_cast<std::size_t>(i % 13), static_cast<char>('a' + i % 26));
    (void)a.send(ab, bytes_of("a" + std::to_string(i)), bytes_of(data), static_cast<std::uint64_t>(i));
    (void)c.send(cb, bytes_of("c" + std::to_string(i)), bytes_of(data), static_cast<std::uint64_t>(i));
    if (i % 7 == 0) {
      for (auto p : b.peers()) (void)b.send(p, bytes_of("b" + std::to_string(i)), bytes_of(data), 100);
    }
    if (i % 5 == 0) {
      h.log.push_back("-- b");
      b.progress(h);
      h.log.push_back("-- a");
      a.progress(h);
      h.log.push_back("-- c");
      c.progress(h);
    }
  }
  c.close(cb);
  (void)fabric->fail("a");
  for (int i = 0; i < 3; ++i) {
    h.log.push_back("-- b");
    b.progress(h);
    h.log.push_back("-- c");
    c.progress(h);
  }
  return h.log;
}

}  // namespace

BOOST_AUTO_TEST_CASE(deterministic_runs_repeat_exactly) {
  const auto first = scripted_run(true);
  const auto second = scripted_run(true);
  ASHL_TEST(first.size() > 200u);
  ASHL_TEST(first == second);
  // Deterministic order is the order of the posting calls: b sees a0, c0, a1, c1, ...
  std::vector<std::string> at_b;
  for (const auto& line : first)
    if (line.starts_with("message") && (line.find(" a") != std::string::npos || line.find(" c") != std::string::npos))
      at_b.push_back(line.substr(10, 2));
  ASHL_REQUIRE(at_b.size() >= 4u);
  ASHL_TEST(at_b[0] == "a0");
  ASHL_TEST(at_b[1] == "c0");
  ASHL_TEST(at_b[2] == "a1");
  ASHL_TEST(at_b[3] == "c1");
}

BOOST_AUTO_TEST_CASE(non_deterministic_mode_keeps_per_sender_order) {
  // Same script, random interleaving across senders: each sender's messages
  // still arrive in their order, and every message arrives.
  for (int run = 0; run < 5; ++run) {
    const auto log = scripted_run(false);
    int next_a = 0, next_c = 0, total = 0;
    for (const auto& line : log) {
      if (!line.starts_with("message")) continue;
      const auto header = line.substr(10, line.find(' ', 10) - 10);
      if (header[0] == 'a') ASHL_TEST(header == "a" + std::to_string(next_a++));
      if (header[0] == 'c') ASHL_TEST(header == "c" + std::to_string(next_c++));
      ++total;
    }
    ASHL_TEST(next_a == 40);
    ASHL_TEST(next_c == 40);
    ASHL_TEST(total > 80);
  }
}

namespace {

// A message of sequence number s: header "seq" as 8 bytes, data of a length
// and pattern that depend on s (from 0 bytes to several KiB).
std::size_t size_for(std::uint64_t s) {
  switch (s % 5) {
    case 0: return 0;
    case 1: return s % 200;
    case 2: return 256 + s % 3;
    case 3: return 1000 + s % 4096;
    default: return 64;
  }
}
std::byte pattern(std::uint64_t s, std::size_t i) { return static_cast<std::byte>((s * 131 + i * 7) & 0xff); }

struct stream_handler {
  std::uint64_t expected = 0;
  std::uint64_t completed = 0;
  std::size_t errors = 0;
  std::vector<std::byte> buffer = std::vector<std::byte>(8192);
  bool connected = false;

  std::span<std::byte> receive_buffer(t::peer_id, std::span<const std::byte>, std::size_t n) {
    return std::span(buffer).first(n);
  }
  void on_message(t::peer_id, std::span<const std::byte> h, std::span<const std::byte> d) {
    std::uint64_t s = 0;
    if (h.size() != sizeof s) {
      ++errors;
      return;
    }
    std::memcpy(&s, h.data(), sizeof s);
    if (s != expected || d.size() != size_for(s)) ++errors;
    for (std::size_t i = 0; i < d.size(); ++i)
      if (d[i] != pattern(s, i)) {
        ++errors;
        break;
      }
    ++expected;
  }
  void on_sent(t::peer_id, std::uint64_t, const ashl::status& s) {
    if (!s.ok()) ++errors;
    ++completed;
  }
  void on_peer(t::peer_id, t::peer_event e, const ashl::status&) {
    if (e == t::peer_event::connected) connected = true;
  }
};

// Sends `count` messages to the node's one peer while receiving as many.
void exchange(t::inproc& node, t::peer_id peer, stream_handler& h, std::uint64_t count) {
  std::vector<std::byte> data(8192);
  std::uint64_t next = 0;
  while (h.expected < count || h.completed < count) {
    if (next < count) {
      const auto n = size_for(next);
      for (std::size_t i = 0; i < n; ++i) data[i] = pattern(next, i);
      std::array<std::byte, 8> header;
      std::memcpy(header.data(), &next, 8);
      if (!node.send(peer, header, std::span(data).first(n), next).ok()) ++h.errors;
      ++next;
    }
    if (node.progress(h) == 0 && next == count) node.wait(1ms);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(two_threads_exchange_ten_thousand_messages) {
  for (const bool deterministic : {false, true}) {
    auto fabric = t::inproc_fabric::create({.eager_bytes = 256, .deterministic = deterministic});
    auto a = fabric->node("a").value();
    auto b = fabric->node("b").value();
    constexpr std::uint64_t count = 10000;
    stream_handler ha, hb;
    std::thread tb([&] {
      while (!hb.connected) {
        b.progress(hb);
        b.wait(1ms);
      }
      exchange(b, b.peers()[0], hb, count);
    });
    const auto p = *a.connect("b");
    while (!ha.connected) {
      a.progress(ha);
      a.wait(1ms);
    }
    exchange(a, p, ha, count);
    tb.join();
    ASHL_TEST(ha.errors == 0u);
    ASHL_TEST(hb.errors == 0u);
    ASHL_TEST(ha.expected == count);
    ASHL_TEST(hb.expected == count);
    ASHL_TEST(a.counters().messages_received == count);
    ASHL_TEST(b.counters().messages_sent == count);
  }
}

BOOST_AUTO_TEST_CASE(no_allocation_per_message_after_warm_up) {
  for (const bool deterministic : {false, true}) {
    auto fabric = t::inproc_fabric::create({.eager_bytes = 256, .deterministic = deterministic});
    auto a = fabric->node("a").value();
    auto b = fabric->node("b").value();
    auto c = fabric->node("c").value();
    stream_handler ha, hb, hc;
    const auto ab = *a.connect("b");
    const auto cb = *c.connect("b");
    for (int i = 0; i < 4; ++i) {
      a.progress(ha);
      c.progress(hc);
      b.progress(hb);
    }
    ASHL_REQUIRE((a.is_connected(ab) && c.is_connected(cb)));
    std::vector<std::byte> data(8192);
    std::array<std::byte, 8> header{};
    auto round = [&](std::uint64_t s) {
      const auto n = size_for(s);
      (void)a.send(ab, header, std::span(data).first(n), s);
      (void)c.send(cb, header, std::span(data).first(size_for(s + 3)), s);
      for (auto p : b.peers()) (void)b.send(p, header, std::span(data).first(size_for(s + 1)), s);
      a.progress(ha);
      c.progress(hc);
      b.progress(hb);
    };
    for (std::uint64_t s = 0; s < 2000; ++s) round(s);  // warm-up: every size class, every queue
    const auto before = counting_new::count();
    for (std::uint64_t s = 0; s < 2000; ++s) round(s);
    ASHL_TEST(counting_new::count() == before);
  }
}

// The accepting side sees the link connected first and may send at once,
// before the connecting side has taken the accept: those messages arrive,
// in order, after the connecting side's own connected event (they were
// refused as failed sends before, and a stream lost its first messages).
BOOST_AUTO_TEST_CASE(sends_right_after_accepting_arrive_after_the_connect) {
  for (const bool deterministic : {false, true}) {
    auto fabric = t::inproc_fabric::create({.deterministic = deterministic});
    auto a = fabric->node("a").value();
    auto b = fabric->node("b").value();
    recorder ha, hb;
    const auto p = *a.connect("b");
    while (hb.events.empty()) b.progress(hb);  // b takes the request: connected on its side
    ASHL_REQUIRE((hb.events[0].second == t::peer_event::connected));
    const auto q = hb.events[0].first;
    for (int i = 0; i < 3; ++i) ASHL_TEST(b.send(q, bytes_of("m" + std::to_string(i)), {}, i).ok());
    b.progress(hb);
    ASHL_TEST(hb.sent.size() == 3u);
    for (const auto& [cookie, st] : hb.sent) ASHL_TEST(st.ok(), "send " << cookie << ": " << st.message());
    for (int k = 0; k < 100 && ha.messages.size() < 3; ++k) a.progress(ha);
    ASHL_REQUIRE(!ha.events.empty());
    ASHL_TEST((ha.events[0] == std::pair{p, t::peer_event::connected}));
    ASHL_REQUIRE(ha.messages.size() == 3u);
    for (int i = 0; i < 3; ++i) ASHL_TEST(ha.messages[std::size_t(i)].first == "m" + std::to_string(i));
    ASHL_TEST(b.counters().sends_failed == 0u);
  }
}
