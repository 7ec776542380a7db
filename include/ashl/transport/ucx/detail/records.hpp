// ashl/transport/ucx/detail/records.hpp — the records transport::ucx keeps:
// active-message ids and control messages, peers and their bootstrap
// sockets, connections the listener has not authenticated yet, received
// items, send slots, registered regions, and UCX's status names.
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_UCX()

#include <ashl/core/status.hpp>
#include <ashl/transport/auth.hpp>
#include <ashl/transport/bootstrap.hpp>
#include <ashl/transport/concepts.hpp>
#include <ashl/transport/ucx/detail/sockaddr.hpp>

#include <ucp/api/ucp.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace transport {
namespace detail {

using ucx_clock = std::chrono::steady_clock;

inline std::string ucx_seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

// Active-message ids: data, and control messages that must stay in order
// with data (both carry the receiver's session key in front of the header
// and come over a worker-address endpoint). ucx_am_control is what the
// sockaddr endpoints of ashl used before the bootstrap listener: nothing is sent on it
// now, and whatever arrives on it is dropped and counted.
inline constexpr unsigned ucx_am_control = 0xa5;
inline constexpr unsigned ucx_am_data = 0xa6;
inline constexpr unsigned ucx_am_keyed_control = 0xa7;

// The session key in front of every data message's header.
inline constexpr std::size_t ucx_key_bytes = bootstrap::key_bytes;
// The largest worker address a peer may send in its link.
inline constexpr std::size_t ucx_max_control_data = bootstrap::max_address_bytes;

// Keyed control messages (the AM header after the key; no data part).
enum class ucx_control : std::uint8_t {
  goodbye = 5,    // either side, behind all its data: an orderly close
  keepalive = 7,  // either side, every keepalive_interval: moves last_heard(); never queued
};

// connecting: the TCP connection to the listener and its challenge;
// handshake: answered (connector) and waiting for the verdict;
// linking: authenticated, waiting for the peer's key and worker address.
enum class ucx_peer_state : std::uint8_t { connecting, handshake, linking, connected, done };

// The bootstrap connection of a peer (docs/transport.md, "The bootstrap
// listener"): the socket, what was read of it, and what waits to be
// written. It stays open while the peer is connected: its end (without a
// goodbye) is how a peer's death is noticed.
struct ucx_socket {
  int fd = -1;
  bootstrap::reader in;
  std::vector<std::byte> out;  // frames not written yet (a link may not fit the socket buffer at once)
  std::size_t out_sent = 0;
  bool connecting = false;  // connector: the non-blocking connect() has not completed
  bool wants_write() const noexcept { return connecting || out_sent < out.size(); }
};

struct ucx_peer {
  peer_id id = no_peer;
  bool client = false;  // we connected to it (else it connected to our listener)
  ucx_peer_state state = ucx_peer_state::connecting;
  ucx_socket sock;             // the bootstrap connection: handshake, link, goodbye, failure detection
  ucp_ep_h data_ep = nullptr;  // made from the peer's worker address: all data and keyed control
  std::uint64_t own_key = 0;   // the key the peer puts in front of its data to us
  std::uint64_t peer_key = 0;  // the key we put in front of our data to it
  bool draining = false;       // its socket goodbye came; waiting for the keyed one behind its data
  bool peer_errors = false;    // the data endpoint has UCX error handling PEER (either side asked)
  bool isolated = false;       // this side asked for PEER on this link (connect_isolated)
  std::chrono::milliseconds silence_bound{0};  // > 0: failed when nothing arrived this long (fail_when_silent)
  std::string address;  // what we connected to, or where the peer connected from
  ucx_sockaddr target;  // client side: the listener's address
  bool on_this_host = false;  // that address is a loopback one (peer_on_this_host)
  ucx_clock::time_point start{}, deadline{}, retry_at{};
  ucx_clock::time_point connect_deadline{};  // client side: connect_timeout after connect()
  ucx_clock::time_point heard{};           // the last message from it arrived (last_heard())
  ucx_clock::time_point done_at{};         // done since (its record is reused close_timeout later)
  ucx_clock::time_point next_keepalive{};  // connected: the next keepalive goes out then
  bool retry_pending = false;
  bool challenged = false;  // client side: the listener sent its challenge on this attempt
  bool goodbye = false;     // the peer said it closes in order
  unsigned attempts = 0;
  std::string last_error;  // client side: why the last attempt ended
  auth::nonce own_nonce{}, peer_nonce{};
  std::string transports;  // ucp_ep_print_info of the endpoint that carries data, once connected
};

// A connection accepted by the listener that has not authenticated: no
// peer record, no endpoint, nothing the handler sees. At most
// max_pending_peers of them (max_pending_per_address from one address),
// each closed at its deadline (auth_timeout after it was accepted).
struct ucx_pending {
  int fd = -1;  // -1: a free slot
  bootstrap::reader in{bootstrap::role::listener};
  auth::nonce nonce{};
  ucx_clock::time_point since{}, deadline{};
  sockaddr_storage from{};
  std::uint64_t serial = 0;  // accept order: the lowest is the oldest
};

// A socket closed by us after a goodbye or refuse: its last frames are
// flushed, then its write side shut, and it is closed once the peer closes
// too (or at its deadline), so the peer reads our last frame rather than
// a reset.
struct ucx_lingering {
  int fd = -1;
  std::vector<std::byte> out;
  std::size_t out_sent = 0;
  bool shut = false;
  ucx_clock::time_point deadline{};
};

// Repeated listener events, counted and printed at most once per interval
// (a count per interval, never a line per event).
struct ucx_log_limiter {
  enum kind : std::uint8_t { capped, malformed, wrong_proof, timed_out, accept_failed, count_ };
  std::array<std::uint64_t, count_> counts{};
  int last_errno = 0;
  ucx_clock::time_point next_print{};
  bool pending() const noexcept {
    for (auto c : counts) if (c != 0) return true;
    return false;
  }
};

enum class ucx_item_kind : std::uint8_t { data, control, ep_error };
enum class ucx_recv_state : std::uint8_t { queued, receiving, received, failed };

// One received active message (or endpoint error), queued until progress()
// hands it to the handler. Pooled: its address is stable while a rendezvous
// receive into the caller's buffer is in flight.
struct ucx_item {
  ucx_item_kind kind = ucx_item_kind::data;
  ucx_recv_state recv = ucx_recv_state::queued;
  bool rndv = false;
  bool held = false;  // `data` is a UCX descriptor to release with ucp_am_data_release
  bool done = false;
  peer_id peer = no_peer;
  ucp_ep_h ep = nullptr;  // ep_error: the endpoint; keyed messages: null
  ucs_status_t status = UCS_OK;
  std::size_t header_size = 0;
  std::array<std::byte, max_header_bytes> header{};
  void* data = nullptr;  // eager: the bytes; rendezvous: the descriptor
  std::size_t length = 0;
  std::span<std::byte> destination;  // rendezvous: the handler's buffer
  // Receiving: UCX's request, until its callback runs (on_recv_done). The
  // item and `destination` belong to UCX until then, whatever happens to
  // the peer: a peer that is done has its receive cancelled, and the item
  // is recycled (the buffer handed back) only once the callback came.
  void* request = nullptr;
  bool cancelled = false;
  bool stuck = false;  // cancelled, and no callback within close_timeout
  bool reclaimed = false;  // stuck past receive_reclaim_timeout: its buffer handed to on_receive_reclaimed
  ucx_clock::time_point cancelled_at{};
};

// One send in flight: the header copy (after the session key) UCX 1.13
// needs until completion.
struct ucx_send_slot {
  peer_id peer = no_peer;
  std::uint64_t cookie = 0;
  std::size_t bytes = 0;
  ucs_status_t status = UCS_OK;
  bool in_flight = false;  // UCX holds the request: its callback is still to come
  bool orphaned = false;   // completed with an error by ashl (its endpoint cannot cancel it)
  bool reported = false;   // orphaned and already handed to the handler
  std::array<std::byte, ucx_key_bytes + max_header_bytes> header{};
  class ucx_impl* owner = nullptr;
};

struct ucx_peer_note {
  peer_id peer;
  peer_event event;
  status why;
};

struct ucx_region {
  std::byte* base = nullptr;
  std::size_t size = 0;
  ucp_mem_h memh = nullptr;
};

// UCX's status names. ucx_status_name() lives in libucs, which the
// ucx::ucp CMake target does not link; the words are UCX's own.
inline const char* ucx_status_name(ucs_status_t s) noexcept {
  switch (s) {
    case UCS_OK: return "Success";
    case UCS_INPROGRESS: return "Operation in progress";
    case UCS_ERR_NO_MESSAGE: return "No pending message";
    case UCS_ERR_NO_RESOURCE: return "No resources are available to initiate the operation";
    case UCS_ERR_IO_ERROR: return "Input/output error";
    case UCS_ERR_NO_MEMORY: return "Out of memory";
    case UCS_ERR_INVALID_PARAM: return "Invalid parameter";
    case UCS_ERR_UNREACHABLE: return "Destination is unreachable";
    case UCS_ERR_INVALID_ADDR: return "Address not valid";
    case UCS_ERR_NOT_IMPLEMENTED: return "Function not implemented";
    case UCS_ERR_MESSAGE_TRUNCATED: return "Message truncated";
    case UCS_ERR_NO_PROGRESS: return "No progress";
    case UCS_ERR_BUFFER_TOO_SMALL: return "Provided buffer is too small";
    case UCS_ERR_NO_ELEM: return "No such element";
    case UCS_ERR_SOME_CONNECTS_FAILED: return "Failed to connect some of the requested endpoints";
    case UCS_ERR_NO_DEVICE: return "No such device";
    case UCS_ERR_BUSY: return "Device is busy";
    case UCS_ERR_CANCELED: return "Request canceled";
    case UCS_ERR_SHMEM_SEGMENT: return "Shared memory error";
    case UCS_ERR_ALREADY_EXISTS: return "Element already exists";
    case UCS_ERR_OUT_OF_RANGE: return "Index out of range";
    case UCS_ERR_TIMED_OUT: return "Operation timed out";
    case UCS_ERR_EXCEEDS_LIMIT: return "User-defined limit was reached";
    case UCS_ERR_UNSUPPORTED: return "Unsupported operation";
    case UCS_ERR_REJECTED: return "Operation rejected by remote peer";
    case UCS_ERR_NOT_CONNECTED: return "Endpoint is not connected";
    case UCS_ERR_CONNECTION_RESET: return "Connection reset by remote peer";
    case UCS_ERR_ENDPOINT_TIMEOUT: return "Endpoint timeout";
    default: break;
  }
  if (UCS_IS_LINK_ERROR(s)) return "Link failure";
  if (UCS_IS_ENDPOINT_ERROR(s)) return "Endpoint failure";
  return "Unknown error";
}

inline status ucx_error(std::string_view what, ucs_status_t s) {
  return status(errc::internal, std::string(what) + ": " + ucx_status_name(s));
}

}  // namespace detail
}  // namespace transport
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_UCX()
