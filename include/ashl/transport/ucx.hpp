// ashl/transport/ucx.hpp — the transport model over UCX active messages
// between processes and hosts (docs/design.md, "Interfaces, Transport" and
// "Runtime contract for real runs"; docs/transport.md, "UCX").
//
//   namespace t = ashl::transport;
//   auto server = t::ucx::create({.listen = "127.0.0.1:0", .token = token});   // port 0: any free port
//   std::string where = server->listen_address();                              // "127.0.0.1:40123"
//   auto client = t::ucx::create({.token = token});
//   auto p = client->connect(where);                       // at once; connected/failed arrive via on_peer
//   while (!h.connected) { client->progress(h); client->wait(std::chrono::milliseconds(10)); }
//   client->send(*p, header, payload, /*cookie=*/1);       // payload lives until on_sent(…, 1, …)
//
// One UCP context (active messages + wakeup) and one single-threaded worker.
// Peers connect to a small TCP listener of ashl's own (detail/listener.hpp;
// docs/transport.md, "The bootstrap listener"), never to a UCX connection
// manager: UCX 1.13.1's sockaddr listener aborts the process on malformed
// bytes. Over that bootstrap connection the peer proves it holds
// the token (the HMAC-SHA256 challenge-response of transport/auth.hpp, in
// the bounded frames of transport/bootstrap.hpp), and only then do both
// sides send each other a session key (8 random bytes the receiver chose)
// and their UCP worker address; each creates an endpoint from the other's
// address (UCP_EP_PARAM_FIELD_REMOTE_ADDRESS), over which UCX may choose
// shared memory on one host, and the peer is reported connected. All data
// to a peer goes over that endpoint (order per peer holds). It has no error
// handling (with UCP_ERR_HANDLING_MODE_PEER UCX 1.13 leaves out posix and
// sysv); ucx_params::address_endpoints = false asks for PEER on both ends.
// The bootstrap connection stays open: its end without a goodbye reports
// the peer failed, and the peer's sends still in flight are completed with
// an error by ashl. connect() retries every retry_interval while nobody
// listens (or the listener closed it before authentication), until
// connect_timeout, so start order does not matter. Unauthenticated
// connections are capped (max_pending_peers, max_pending_per_address; a
// new one closes the oldest), closed at auth_timeout, have no peer record,
// and are never seen by the handler. An address endpoint does not tell the
// receiver who sent a message, so every data message carries the
// receiver's key in front of its header; an unknown key is dropped and
// counted as unauthenticated. The listen socket and the bootstrap sockets
// are polled from progress() and wait() beside UCX's event fd: no thread.
//
// A message is one active message: the header part (after the key) is the
// AM header, the
// data part is sent from where the caller's span lies. UCX chooses eager or
// rendezvous by its own thresholds. Eager data is kept in UCX's descriptor
// (no copy) until the handler has seen it; rendezvous data is received with
// ucp_am_recv_data_nbx straight into the span the handler's
// receive_buffer() returns. Handler calls happen only in progress(), never
// inside a UCX callback, and in arrival order per peer (a large message
// still being received holds back that peer's later messages, not other
// peers'). Queues and send slots are pooled: steady state does not allocate
// through operator new.
//
// UCX 1.13 has no UCP_AM_SEND_FLAG_COPY_HEADER, so each send copies its
// header into a pooled slot that lives until the send completes.
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_UCX()

#include <ashl/core/status.hpp>
#include <ashl/transport/concepts.hpp>
#include <ashl/transport/ucx/detail/context.hpp>
#include <ashl/transport/ucx/detail/delivery.hpp>
#include <ashl/transport/ucx/detail/handshake.hpp>
#include <ashl/transport/ucx/detail/impl.hpp>
#include <ashl/transport/ucx/detail/link.hpp>
#include <ashl/transport/ucx/detail/listener.hpp>
#include <ashl/transport/ucx/params.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

ASHL_NAMESPACE_BEGIN
namespace transport {

// The UCX model of transport::transport. Movable; not copyable. Single-threaded:
// every call from the thread that drives progress().
class ucx {
 public:
  using transport_concept = transport_tag;

  // Errors: empty token without insecure (names `token`), a malformed or
  // unresolvable listen address, a port in use, UCX initialisation failures.
  static result<ucx> create(ucx_params params) {
    auto impl = std::make_unique<detail::ucx_impl>(std::move(params));
    if (status s = impl->init(); !s.ok()) return s;
    return ucx(std::move(impl));
  }

  ucx(ucx&&) noexcept = default;
  ucx& operator=(ucx&&) noexcept = default;
  ~ucx() = default;

  result<peer_id> connect(std::string_view address) { return impl_->connect(address); }
  // connect(), on a link isolated from this process's other links and the
  // peer's (transport::connect_isolated): both data endpoints get UCX
  // error handling PEER, which UCX 1.13 never puts on its shared-memory
  // FIFOs (posix, sysv), so the link runs over TCP even on one host.
  result<peer_id> connect_isolated(std::string_view address) { return impl_->connect(address, true); }
  // Peer p (connecting or connected) is reported failed once nothing
  // arrived from it for `bound` while connected: no message and no
  // keepalive (a transport::ucx sends one every keepalive_interval from
  // progress(), so a peer that drives its transport is never silent that
  // long when bound is well above its keepalive_interval). A process that
  // stopped (frozen, stopped by a signal), a host that went down or a cut
  // network end no bootstrap connection, so nothing else reports them.
  // 0 (the default): never. transport::fail_when_silent(t, p, bound) for
  // generic code.
  void fail_when_silent(peer_id p, std::chrono::milliseconds bound) { impl_->fail_when_silent(p, bound); }
  status send(peer_id p, std::span<const std::byte> header, std::span<const std::byte> data, std::uint64_t cookie) {
    return impl_->send(p, header, data, cookie);
  }
  template <handler H>
  std::size_t progress(H& h) {
    return impl_->progress(h);
  }
  void wait(std::chrono::microseconds timeout) { impl_->wait(timeout); }
  std::span<const peer_id> peers() const noexcept { return impl_->peers(); }
  bool is_connected(peer_id p) const noexcept { return impl_->is_connected(p); }
  // Whether peer p runs on this host: its address (the one connected to,
  // or the one it connected from) is a loopback address. A peer reached
  // over a routable address of this very host counts as remote.
  bool peer_on_this_host(peer_id p) const noexcept { return impl_->peer_on_this_host(p); }
  // When a message of a connected peer last arrived (a keepalive, or the
  // first part of a large message, counts); a time_point{} when p is not
  // connected. Read on steady_clock.
  std::chrono::steady_clock::time_point last_heard(peer_id p) const noexcept { return impl_->last_heard(p); }
  void close(peer_id p) { impl_->close(p); }
  void close() { impl_->close_all(true); }
  const transport_counters& counters() const noexcept { return impl_->counters(); }

  // Peer records held (connected, being set up, or done and not reused yet):
  // bounded by the live ones plus those done within close_timeout.
  std::size_t peer_records() const noexcept { return impl_->peer_records(); }

  // The bound "host:port" of the listener ("" when not listening): the real
  // port when created with port 0.
  const std::string& listen_address() const noexcept { return impl_->listen_address(); }
  // The UCX lanes of a connected peer's endpoint (ucp_ep_print_info), for a
  // benchmark to record which transports carried its figures.
  std::string describe(peer_id p) const { return impl_->describe(p); }
  // The distinct "transport/device" names of the lanes that carry messages
  // in describe()'s text ("sysv/memory, cma/memory"), or "(unknown)".
  static std::string lanes_of(const std::string& description) { return detail::ucx_impl::summarize(description); }

  // Registers a region once (ucp_mem_map); later sends from it and receives
  // into it pass its handle to UCX. Deregister before the memory goes away.
  result<memory_id> register_memory(std::span<std::byte> region) { return impl_->register_memory(region); }
  void deregister_memory(memory_id id) { impl_->deregister_memory(id); }

 private:
  explicit ucx(std::unique_ptr<detail::ucx_impl> impl) : impl_(std::move(impl)) {}
  std::unique_ptr<detail::ucx_impl> impl_;
};

static_assert(transport<ucx>);

}  // namespace transport
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_UCX()
