// ashl/transport/ucx/params.hpp — what a transport::ucx is created with
// (transport/ucx.hpp).
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_UCX()

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

ASHL_NAMESPACE_BEGIN
namespace transport {

struct ucx_params {
  std::string listen;  // "host:port" to listen on ("[::1]:0" for IPv6; port 0 = any free port); empty = do not listen
  std::string token;   // the job's shared secret (ASHL_TOKEN)
  bool insecure = false;  // allow an empty token (no authentication)
  std::chrono::milliseconds connect_timeout{30000};  // connect(): keep retrying this long while nobody listens
  std::chrono::milliseconds retry_interval{100};     // between connection attempts
  // A connection to the listener must authenticate within this (else it is
  // closed, counted in auth_refused), and an authenticated peer must send
  // its link within this again.
  std::chrono::milliseconds auth_timeout{10000};
  std::chrono::milliseconds close_timeout{2000};     // close()/destructor wait this long for orderly closes
  // A large receive whose sender's connection is gone and that UCX has not
  // finished (UCX 1.13 cannot cancel an active-message receive, and a dead
  // sender never finishes it) is reclaimed this long after it was
  // cancelled: its buffer goes to the handler's on_receive_reclaimed, which
  // returns it to its budget without reusing the memory, and it is counted
  // (transport_counters::receives_reclaimed). Before, such receives stayed
  // lent for good and used up a server's max_receive_bytes.
  // At least close_timeout.
  std::chrono::milliseconds receive_reclaim_timeout{10000};
  bool blocking = true;  // wait() sleeps on the worker's event fd; false: wait() only polls once
  // Blocking wait() polls this long before it sleeps on the event fd: a reply
  // that comes within it costs no wake-up (4 KiB round trip over shared
  // memory: 64 us with 0, 9 us with 50; docs/perf/ps-ucx.md). 0: sleep at once.
  std::chrono::microseconds spin{50};
  // The listener binds its port with SO_REUSEADDR, so a server restarted at
  // once on its address binds it while the connections of its previous
  // life sit in TIME_WAIT.
  bool reuse_address = true;
  bool verbose = false;  // print the UCX transports of each endpoint to stderr when it connects
  // The endpoint this side makes from the peer's UCP worker address (all
  // data goes over it) has no UCX error handling, so UCX may pick shared
  // memory on one host; false: UCP_ERR_HANDLING_MODE_PEER (UCX 1.13 then
  // leaves out posix and sysv: TCP on one host), whose failure also fails
  // the peer. Either way the bootstrap connection's end reports a dead peer.
  bool address_endpoints = true;
  std::size_t max_message_bytes = std::size_t{1} << 31;  // larger incoming data is refused without allocating
  // Every connected peer is sent a keepalive (a keyed control message of 9
  // bytes, eager) at least this often from progress(), and last_heard()
  // moves on any message's arrival, the first part of a large one included,
  // so a peer that drives progress() during a long transfer or a long cycle
  // is heard from. 0: none. Keep it well below a liveness timeout built on
  // last_heard() (ps::server_params::worker_timeout).
  std::chrono::milliseconds keepalive_interval{1000};
  // Connections to the listener that have not authenticated yet (half-open
  // and idle ones included), in all and from one source address. A new
  // connection past either cap closes the oldest unauthenticated one (of
  // that address, for the second), counted in
  // transport_counters::peers_refused: a flood cannot hold every slot, and
  // an honest peer's connection lives until that many newer ones came.
  // They have no peer record and no endpoint; the listener holds at most
  // 69 bytes of each (transport/bootstrap.hpp).
  std::size_t max_pending_peers = 256;
  std::size_t max_pending_per_address = 64;
  std::size_t queue_reserve = 1024;  // messages/sends in flight before a queue grows (allocates)
};

// A region registered with register_memory(); sends from it and receives
// into it use its UCX memory handle instead of UCX's registration cache.
using memory_id = std::uint32_t;

}  // namespace transport
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_UCX()
