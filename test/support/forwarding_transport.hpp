// test/support/forwarding_transport.hpp — a test transport that forwards to
// inproc, written once: a wrapper derives from inproc_forwarder<Self>, hides
// the members it changes (send, connect) and, to see what is received,
// defines `template <class H> struct wrapped : forwarding_handler<H>` with its
// own on_message (and a `Self* self` after the base).
//
//   struct spy : inproc_forwarder<spy> {
//     std::vector<const std::byte*>* sent_from;
//     ashl::status send(tr::peer_id p, std::span<const std::byte> h, std::span<const std::byte> d, std::uint64_t c);
//   };
//   spy s{{node}, &sent_from};
#pragma once

#include <ashl/transport/inproc.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace test_support {

namespace tr = ashl::transport;

// Every handler call to the wrapped handler h, unchanged.
template <class H>
struct forwarding_handler {
  H* h;
  std::span<std::byte> receive_buffer(tr::peer_id p, std::span<const std::byte> head, std::size_t n) {
    return h->receive_buffer(p, head, n);
  }
  void on_message(tr::peer_id p, std::span<const std::byte> head, std::span<const std::byte> data) {
    h->on_message(p, head, data);
  }
  void on_sent(tr::peer_id p, std::uint64_t c, const ashl::status& st) { h->on_sent(p, c, st); }
  void on_peer(tr::peer_id p, tr::peer_event e, const ashl::status& why) { h->on_peer(p, e, why); }
};

template <class Self>
struct inproc_forwarder {
  using transport_concept = tr::transport_tag;
  tr::inproc t;
  ashl::result<tr::peer_id> connect(std::string_view a) { return t.connect(a); }
  ashl::status send(tr::peer_id p, std::span<const std::byte> h, std::span<const std::byte> d, std::uint64_t c) {
    return t.send(p, h, d, c);
  }
  template <tr::handler H>
  std::size_t progress(H& h) {
    if constexpr (requires { typename Self::template wrapped<H>; }) {
      typename Self::template wrapped<H> w{{&h}, static_cast<Self*>(this)};
      return t.progress(w);
    } else {
      return t.progress(h);
    }
  }
  void wait(std::chrono::microseconds d) { t.wait(d); }
  std::span<const tr::peer_id> peers() const { return t.peers(); }
  bool is_connected(tr::peer_id p) const { return t.is_connected(p); }
  void close(tr::peer_id p) { t.close(p); }
  void close() { t.close(); }
  const tr::transport_counters& counters() const { return t.counters(); }
};

}  // namespace test_support
