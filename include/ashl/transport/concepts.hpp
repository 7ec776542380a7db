// ashl/transport/concepts.hpp — the point-to-point transport concept that
// ps::server and ps::worker are written against (docs/design.md, "Interfaces,
// Transport"). Models: transport/inproc.hpp (threads in one process, for unit
// tests) and transport/ucx.hpp (UCX active messages between processes/hosts).
//
//   struct my_handler {                                  // satisfies transport::handler
//     std::span<std::byte> receive_buffer(peer_id, std::span<const std::byte> header, std::size_t n);
//     void on_message(peer_id, std::span<const std::byte> header, std::span<const std::byte> data);
//     void on_sent(peer_id, std::uint64_t cookie, const ashl::status&);
//     void on_peer(peer_id, peer_event, const ashl::status& why);
//   };
//   auto s = t.send(peer, header_bytes, payload, /*cookie=*/7);   // payload must live until on_sent(…, 7, …)
//   while (running) { t.progress(h); t.wait(std::chrono::milliseconds(5)); }
//
// A message is a small header (at most max_header_bytes: the 72-byte wire
// header) and a data part of any length (the wire payload), sent as one unit
// and delivered whole, in order per peer. The two parts are separate so that
// a sender can send a payload from where it lies (a gradient buffer) and a
// receiver can receive a large payload straight into its destination
// (a parameter buffer): for data above the transport's eager size the
// transport first asks the handler's receive_buffer() where the n bytes go
// (an empty span refuses the message: it is dropped and counted), then
// calls on_message with a view of that buffer. Small messages are delivered
// from the transport's own buffer, valid during on_message only.
//
// Nothing happens behind the owner's back: every handler call is made from
// progress(), on the thread that calls it. send() never blocks; its
// completion (ok, or why it failed) is reported by on_sent from a later
// progress(). on_peer reports connected (authenticated, ready), failed (the
// peer died, the link broke, or it failed authentication: `why` says which)
// and closed (an orderly close). wait() blocks until an event may be ready
// or the timeout passed, so an idle process does not spin.
//
// A handler may also define on_receive_abandoned(peer_id, std::span<std::byte>
// buffer): a buffer receive_buffer() returned whose message will not be
// delivered (its peer failed or was closed while the data was on its way),
// handed back once the transport, and the engine below it, no longer write
// into it. Without it such a buffer is simply never mentioned again.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/status.hpp>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

ASHL_NAMESPACE_BEGIN
namespace transport {

// A connected peer, as numbered by one transport (not a worker rank: ranks
// are the ps layer's, learned from the messages themselves).
using peer_id = std::uint32_t;
inline constexpr peer_id no_peer = ~peer_id{0};

// The largest header part of a message.
inline constexpr std::size_t max_header_bytes = 128;

enum class peer_event : std::uint8_t {
  connected = 0,  // authenticated and ready for messages
  failed = 1,     // died, unreachable, or refused authentication; `why` says which
  closed = 2,     // closed in order (by either side)
};

constexpr std::string_view to_string(peer_event e) noexcept {
  switch (e) {
    case peer_event::connected: return "connected";
    case peer_event::failed: return "failed";
    case peer_event::closed: return "closed";
  }
  return "?";
}

// Counters every model keeps (bytes count header and data).
struct transport_counters {
  std::uint64_t messages_sent = 0, messages_received = 0;
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  std::uint64_t sends_failed = 0;        // completed with an error
  std::uint64_t receives_refused = 0;    // receive_buffer() returned an empty span, or too small
  // Large messages not delivered because their sender failed or was closed
  // mid-transfer, whose buffers were handed back (on_receive_abandoned); and
  // now, such receives the engine has not let go of within the model's close
  // timeout (their buffers stay lent: never reused, never written by us).
  std::uint64_t receives_abandoned = 0, receives_stuck = 0;
  // Stuck receives reclaimed so far, after the model's reclaim timeout
  // (ucx_params::receive_reclaim_timeout): their buffers went to the
  // handler's on_receive_reclaimed (memory kept, never reused; the budget back).
  std::uint64_t receives_reclaimed = 0;
  std::uint64_t peers_connected = 0, peers_failed = 0, peers_closed = 0;
  std::uint64_t auth_refused = 0;        // peers that failed authentication
  std::uint64_t unauthenticated_dropped = 0;  // messages from a peer before it authenticated
  std::uint64_t peers_refused = 0;       // connections refused at once: too many not yet authenticated
  std::uint64_t peer_records_reused = 0;  // records (and ids) of peers that were done, reused for new ones

  // The one list of these counters (core/fields.hpp): the Python binding's
  // dicts are read off it, and fields_cover<>() proves none is missing.
  static constexpr auto fields() {
    return std::tuple{
        field{"messages_sent", &transport_counters::messages_sent},
        field{"messages_received", &transport_counters::messages_received},
        field{"bytes_sent", &transport_counters::bytes_sent},
        field{"bytes_received", &transport_counters::bytes_received},
        field{"sends_failed", &transport_counters::sends_failed},
        field{"receives_refused", &transport_counters::receives_refused},
        field{"receives_abandoned", &transport_counters::receives_abandoned},
        field{"receives_stuck", &transport_counters::receives_stuck},
        field{"receives_reclaimed", &transport_counters::receives_reclaimed},
        field{"peers_connected", &transport_counters::peers_connected},
        field{"peers_failed", &transport_counters::peers_failed},
        field{"peers_closed", &transport_counters::peers_closed},
        field{"auth_refused", &transport_counters::auth_refused},
        field{"unauthenticated_dropped", &transport_counters::unauthenticated_dropped},
        field{"peers_refused", &transport_counters::peers_refused},
        field{"peer_records_reused", &transport_counters::peer_records_reused}};
  }
};
static_assert(fields_cover<transport_counters>(), "transport_counters::fields() must list every counter");


// What a transport calls from progress().
template <class H>
concept handler = requires(H& h, peer_id p, std::span<const std::byte> bytes, std::size_t n, std::uint64_t cookie,
                           const status& s, peer_event e) {
  { h.receive_buffer(p, bytes, n) } -> std::same_as<std::span<std::byte>>;
  { h.on_message(p, bytes, bytes) } -> std::same_as<void>;
  { h.on_sent(p, cookie, s) } -> std::same_as<void>;
  { h.on_peer(p, e, s) } -> std::same_as<void>;
};

// A handler that accepts nothing (for progress() before a real handler exists
// and for tests): large messages are refused, the rest ignored.
struct null_handler {
  std::span<std::byte> receive_buffer(peer_id, std::span<const std::byte>, std::size_t) { return {}; }
  void on_message(peer_id, std::span<const std::byte>, std::span<const std::byte>) {}
  void on_sent(peer_id, std::uint64_t, const status&) {}
  void on_peer(peer_id, peer_event, const status&) {}
};
static_assert(handler<null_handler>);

// Opt-in tag: a model declares `using transport_concept = transport_tag;`.
struct transport_tag {};

// The transport concept. `send` returns an error at once only for a peer
// that is not connected or a header over max_header_bytes; anything later
// arrives through on_sent. `connect(address)` starts connecting to a
// listening peer (retrying until the model's connect deadline; start order
// does not matter) and returns its id at once: on_peer reports connected or
// failed (naming the address and why) from a later progress(). A model
// that listens is given its address at creation; peers that connect to it
// are reported connected once authenticated. `progress(h)` returns the number of handler calls
// it made. `peers()` lists the connected (authenticated) peers.
// `close(p)` closes one peer (it is then reported closed); `close()` all.
template <class T>
concept transport = requires { typename T::transport_concept; } &&
                    std::same_as<typename T::transport_concept, transport_tag> &&
                    requires(T& t, const T& ct, peer_id p, std::span<const std::byte> bytes, std::uint64_t cookie,
                             null_handler& h, std::chrono::microseconds d) {
                      { t.connect(std::string_view{}) } -> std::same_as<result<peer_id>>;
                      { t.send(p, bytes, bytes, cookie) } -> std::same_as<status>;
                      { t.progress(h) } -> std::same_as<std::size_t>;
                      { t.wait(d) } -> std::same_as<void>;
                      { ct.peers() } -> std::convertible_to<std::span<const peer_id>>;
                      { ct.is_connected(p) } -> std::same_as<bool>;
                      { t.close(p) } -> std::same_as<void>;
                      { t.close() } -> std::same_as<void>;
                      { ct.counters() } -> std::convertible_to<const transport_counters&>;
                    };

// Whether peer p runs on this host, for a model that can tell
// (`peer_on_this_host(p)`: transport::ucx by a loopback address;
// transport::inproc when its fabric says so); false for any other. The
// drivers drop the CRC on such a lane only when told to trust it
// (trust_local_lanes; wire flag `unchecked`, docs/wire-format.md).
template <class T>
bool peer_on_this_host(const T& t, peer_id p) noexcept {
  if constexpr (requires { { t.peer_on_this_host(p) } -> std::convertible_to<bool>; }) return t.peer_on_this_host(p);
  else return false;
}

// connect(address) on a link that the death of either end cannot stall
// for the other's other peers, for a model that can promise it
// (`connect_isolated(address)`); connect(address) for any other. What it
// guards against: a shared-memory receive FIFO that every sender on the
// host writes into in order (UCX's posix and sysv transports) stops at a
// slot that a process killed in the middle of its send had claimed and
// never filled, and every later message of every peer waits behind it for
// good. transport::ucx runs such a link over TCP even on one host
// (docs/transport.md, "Isolated links"). A shard's backup reaches its
// primary this way (ps/server_replica.hpp): each must outlive the other.
// Peer p reported failed once silent (no message, no keepalive) for
// `bound` while connected, for a model that can tell
// (`fail_when_silent(p, bound)`: transport::ucx); nothing for any other
// (its peers fail when their link ends). The ps layer asks it of the
// links whose other end must be noticed dead even when its host goes
// down with it (a backup's primary; a worker's servers of a shard with a
// backup).
template <class T>
void fail_when_silent(T& t, peer_id p, std::chrono::milliseconds bound) {
  if constexpr (requires { t.fail_when_silent(p, bound); }) t.fail_when_silent(p, bound);
}

template <class T>
result<peer_id> connect_isolated(T& t, std::string_view address) {
  if constexpr (requires { { t.connect_isolated(address) } -> std::same_as<result<peer_id>>; })
    return t.connect_isolated(address);
  else
    return t.connect(address);
}

}  // namespace transport
ASHL_NAMESPACE_END
