// ashl/transport/ucx.hpp — the transport model over UCX active messages
// between processes and hosts (DESIGN.md, "Interfaces, Transport" and
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
// A listener (ucp_listener_create) accepts sockaddr connections; connect()
// creates a sockaddr endpoint and retries every retry_interval while nobody
// listens, until connect_timeout, so start order does not matter. Every
// endpoint has an error handler (UCP_ERR_HANDLING_MODE_PEER): a dead peer is
// reported failed from progress(), and its pending sends complete with an
// error. A peer is reported connected only after the HMAC-SHA256 handshake
// of transport/auth.hpp, carried on its own active-message id.
//
// Data endpoints: UCX 1.13 gives sockaddr endpoints TCP lanes only, whatever
// UCX_TLS says. So after the handshake both sides send each other, over the
// authenticated sockaddr endpoint, a session key (8 random bytes the receiver
// chose) and their UCP worker address, and each creates a second endpoint
// from the other's address (UCP_EP_PARAM_FIELD_REMOTE_ADDRESS), over which
// UCX may choose shared memory on one host. All data to a peer goes over
// that endpoint (order per peer holds). It has no error handling: with
// UCP_ERR_HANDLING_MODE_PEER UCX 1.13 leaves out posix and sysv. The
// sockaddr endpoint (PEER mode) stays open to detect a dead peer; then the
// peer's sends still in flight are completed with an error by ashl. A peer
// is reported connected once its data endpoint exists. An address endpoint does not tell the receiver who sent
// a message, so every data message carries the receiver's key in front of
// its header; an unknown key is dropped and counted as unauthenticated.
// ucx_params::address_endpoints = false keeps data on the sockaddr endpoint.
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
#include <ashl/transport/address.hpp>
#include <ashl/transport/auth.hpp>
#include <ashl/transport/concepts.hpp>

#include <ucp/api/ucp.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace transport {

struct ucx_params {
  std::string listen;  // "host:port" to listen on ("[::1]:0" for IPv6; port 0 = any free port); empty = do not listen
  std::string token;   // the job's shared secret (ASHL_TOKEN)
  bool insecure = false;  // allow an empty token (no authentication)
  std::chrono::milliseconds connect_timeout{30000};  // connect(): keep retrying this long while nobody listens
  std::chrono::milliseconds retry_interval{100};     // between connection attempts
  std::chrono::milliseconds auth_timeout{10000};     // the handshake must finish within this
  std::chrono::milliseconds close_timeout{2000};     // close()/destructor wait this long for orderly closes
  bool blocking = true;  // wait() sleeps on the worker's event fd; false: wait() only polls once
  // Blocking wait() polls this long before it sleeps on the event fd: a reply
  // that comes within it costs no wake-up (4 KiB round trip over shared
  // memory: 64 us with 0, 9 us with 50; docs/perf/ps-ucx.md). 0: sleep at once.
  std::chrono::microseconds spin{50};
  // The listener binds its port with SO_REUSEADDR (UCX's TCP_CM_REUSEADDR),
  // so a server restarted at once on its address binds it while the
  // connections of its previous life sit in TIME_WAIT. An explicit
  // UCX_TCP_CM_REUSEADDR in the environment wins.
  bool reuse_address = true;
  bool verbose = false;  // print the UCX transports of each endpoint to stderr when it connects
  // After the handshake, send data over an endpoint made from the peer's UCP
  // worker address (UCX may pick shared memory on one host); false: over the
  // sockaddr endpoint (TCP only with UCX 1.13).
  bool address_endpoints = true;
  std::size_t max_message_bytes = std::size_t{1} << 31;  // larger incoming data is refused without allocating
  // Every connected peer is sent a keepalive (a keyed control message of 9
  // bytes, eager) at least this often from progress(), and last_heard()
  // moves on any message's arrival, the first part of a large one included,
  // so a peer that drives progress() during a long transfer or a long cycle
  // is heard from. 0: none. Keep it well below a liveness timeout built on
  // last_heard() (ps::server_params::worker_timeout).
  std::chrono::milliseconds keepalive_interval{1000};
  // Peers that connected to the listener and have not finished
  // authentication yet; a connection beyond it is refused at once and
  // counted (transport_counters::peers_refused). Records of peers that are
  // done are reused, so a stream of failed connections does not grow memory.
  std::size_t max_pending_peers = 256;
  std::size_t queue_reserve = 1024;  // messages/sends in flight before a queue grows (allocates)
};

// A region registered with register_memory(); sends from it and receives
// into it use its UCX memory handle instead of UCX's registration cache.
using memory_id = std::uint32_t;

namespace detail {

using ucx_clock = std::chrono::steady_clock;

// A parsed "host:port".
struct ucx_sockaddr {
  sockaddr_storage storage{};
  socklen_t length = 0;
};

inline std::string ucx_format_sockaddr(const sockaddr_storage& sa) {
  char host[INET6_ADDRSTRLEN] = {};
  unsigned port = 0;
  if (sa.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&sa);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&sa);
  inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
  port = ntohs(a->sin_port);
  return std::string(host) + ":" + std::to_string(port);
}

// "host:port" or "[v6]:port" → socket address; errors name `field` and the value.
inline result<ucx_sockaddr> ucx_parse_address(std::string_view field, std::string_view address) {
  // The one host:port parser (transport/address.hpp), shared with ps/launch.hpp.
  auto hp = split_host_port(address);
  if (!hp) return invalid_argument(field, address, hp.error().message());
  const std::string host = hp->host, port = std::to_string(hp->port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return make_error(errc::not_found, field, address, std::string("cannot resolve host '") + host + "': " + gai_strerror(rc));
  }
  ucx_sockaddr out;
  std::memcpy(&out.storage, found->ai_addr, found->ai_addrlen);
  out.length = static_cast<socklen_t>(found->ai_addrlen);
  freeaddrinfo(found);
  return out;
}

inline std::string ucx_seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

// Active-message ids: the handshake and control channel (sockaddr
// endpoint; the sender is its reply endpoint), data, and control messages
// that must stay in order with data (both carry the receiver's session key
// in front of the header, and may come over a worker-address endpoint).
inline constexpr unsigned ucx_am_control = 0xa5;
inline constexpr unsigned ucx_am_data = 0xa6;
inline constexpr unsigned ucx_am_keyed_control = 0xa7;

// The session key in front of every data message's header.
inline constexpr std::size_t ucx_key_bytes = 8;
// The largest data part of a control message (a worker address).
inline constexpr std::size_t ucx_max_control_data = 16384;

// Control messages (the AM header; no data part).
enum class ucx_control : std::uint8_t {
  challenge = 1,  // listener → client: server nonce
  answer = 2,     // client → listener: client nonce ‖ client proof
  accept = 3,     // listener → client: server proof
  refuse = 4,     // listener → client: the client's proof was wrong
  goodbye = 5,    // either side: an orderly close follows (sockaddr endpoint: body = 1 when a
                  // keyed goodbye follows the data on the data endpoint)
  link = 6,       // either side, once the other is authenticated: body = the key it expects in
                  // front of data; data part = its worker address (empty: send over sockaddr)
  keepalive = 7,  // either side, keyed, every keepalive_interval: moves last_heard(); never queued
};

// linking: authenticated, waiting for the peer's key and worker address.
enum class ucx_peer_state : std::uint8_t { connecting, handshake, linking, connected, done };

struct ucx_peer {
  peer_id id = no_peer;
  bool client = false;  // we connected to it (else it connected to our listener)
  ucx_peer_state state = ucx_peer_state::connecting;
  ucp_ep_h ep = nullptr;       // the sockaddr endpoint: handshake, control, failure detection
  ucp_ep_h data_ep = nullptr;  // made from the peer's worker address; null: data goes over `ep`
  std::uint64_t own_key = 0;   // the key the peer puts in front of its data to us
  std::uint64_t peer_key = 0;  // the key we put in front of our data to it
  bool draining = false;       // its sockaddr goodbye came; waiting for the keyed one behind its data
  std::string address;  // what we connected to, or where the peer connected from
  ucx_sockaddr target;  // client side: the listener's address
  ucx_clock::time_point start{}, deadline{}, retry_at{};
  ucx_clock::time_point heard{};           // the last message from it arrived (last_heard())
  ucx_clock::time_point done_at{};         // done since (its record is reused close_timeout later)
  ucx_clock::time_point next_keepalive{};  // connected: the next keepalive goes out then
  bool retry_pending = false;
  bool challenged = false;  // client side: the listener answered (so errors are no longer "nobody listens")
  bool goodbye = false;     // the peer said it closes in order
  unsigned attempts = 0;
  ucs_status_t last_error = UCS_OK;
  auth::nonce own_nonce{}, peer_nonce{};
  std::string transports;  // ucp_ep_print_info of the endpoint that carries data, once connected
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
  ucp_ep_h ep = nullptr;  // control and ep_error: the endpoint; keyed messages: null
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

class ucx_impl {
 public:
  explicit ucx_impl(ucx_params p) : params_(std::move(p)) {}
  ucx_impl(const ucx_impl&) = delete;
  ucx_impl& operator=(const ucx_impl&) = delete;

  ~ucx_impl() {
    close_all(true);
    abandon_closes();
    for (ucx_item* it : queue_) release(*it);
    queue_.clear();
    if (listener_ != nullptr) ucp_listener_destroy(listener_);
    if (worker_address_ != nullptr) ucp_worker_release_address(worker_, worker_address_);
    for (auto& r : regions_) {
      if (r.memh != nullptr) ucp_mem_unmap(context_, r.memh);
    }
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }

  status init() {
    ASHL_TRY(auth::check_token(params_.token, params_.insecure));
    if (params_.retry_interval.count() <= 0) return invalid_argument("retry_interval", params_.retry_interval.count(), "must be > 0 ms");
    ucx_sockaddr listen_at;
    if (!params_.listen.empty()) {
      auto a = ucx_parse_address("listen", params_.listen);
      if (!a) return a.error();
      listen_at = *a;
    }
    // UCX reads its connection managers' settings from the environment when
    // the worker opens them, and ucp_config_modify does not reach them: the
    // variable is set (not overwritten) for this process.
    if (params_.reuse_address && !params_.listen.empty()) ::setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) return ucx_error("ucp_config_read", s);
    ucp_params_t cp{};
    cp.field_mask = UCP_PARAM_FIELD_FEATURES;
    cp.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    s = ucp_init(&cp, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) return ucx_error("ucp_init", s);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    s = ucp_worker_create(context_, &wp, &worker_);
    if (s != UCS_OK) return ucx_error("ucp_worker_create", s);
    if (params_.blocking) {
      s = ucp_worker_get_efd(worker_, &efd_);
      if (s != UCS_OK) return ucx_error("ucp_worker_get_efd", s);
    }
    if (params_.address_endpoints) {
      s = ucp_worker_get_address(worker_, &worker_address_, &worker_address_length_);
      if (s != UCS_OK) return ucx_error("ucp_worker_get_address", s);
      if (worker_address_length_ > ucx_max_control_data) {
        return ucx_error("ucp_worker_get_address", UCS_ERR_EXCEEDS_LIMIT);
      }
    }
    for (unsigned id : {ucx_am_control, ucx_am_data, ucx_am_keyed_control}) {
      ucp_am_handler_param_t hp{};
      hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG;
      hp.id = id;
      // Persistent data: eager payloads stay in UCX's descriptor until the
      // handler has seen them, instead of being copied out in the callback.
      hp.flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA;
      hp.cb = id == ucx_am_control ? &on_am_control : id == ucx_am_data ? &on_am_data : &on_am_keyed_control;
      hp.arg = this;
      s = ucp_worker_set_am_recv_handler(worker_, &hp);
      if (s != UCS_OK) return ucx_error("ucp_worker_set_am_recv_handler", s);
    }
    const std::size_t n = std::max<std::size_t>(params_.queue_reserve, 16);
    queue_.reserve(n);
    free_items_.reserve(n);
    completions_.reserve(n);
    completions_work_.reserve(n);
    free_slots_.reserve(n);
    blocked_.reserve(64);
    held_.reserve(64);
    notes_.reserve(64);
    notes_work_.reserve(64);
    conn_requests_.reserve(64);
    for (std::size_t i = 0; i < n; ++i) {
      items_.push_back(std::make_unique<ucx_item>());
      free_items_.push_back(items_.back().get());
      slots_.push_back(std::make_unique<ucx_send_slot>());
      slots_.back()->owner = this;
      free_slots_.push_back(slots_.back().get());
    }
    if (!params_.listen.empty()) {
      ucp_listener_params_t lp{};
      lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
      lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&listen_at.storage);
      lp.sockaddr.addrlen = listen_at.length;
      lp.conn_handler.cb = &on_conn_request;
      lp.conn_handler.arg = this;
      s = ucp_listener_create(worker_, &lp, &listener_);
      if (s == UCS_ERR_BUSY) return make_error(errc::unavailable, "listen", params_.listen, "port in use");
      if (s != UCS_OK) {
        return make_error(errc::unavailable, "listen", params_.listen,
                          std::string("cannot listen there: ") + ucx_status_name(s));
      }
      ucp_listener_attr_t la{};
      la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
      s = ucp_listener_query(listener_, &la);
      if (s != UCS_OK) return ucx_error("ucp_listener_query", s);
      listen_address_ = ucx_format_sockaddr(la.sockaddr);
    }
    return {};
  }

  // ---- the public operations -------------------------------------------------

  result<peer_id> connect(std::string_view address) {
    auto a = ucx_parse_address("connect address", address);
    if (!a) return a.error();
    auto& p = new_peer(true);
    p.address = std::string(address);
    p.target = *a;
    p.start = ucx_clock::now();
    p.deadline = p.start + params_.connect_timeout;
    attempt(p);
    return p.id;
  }

  status send(peer_id id, std::span<const std::byte> header, std::span<const std::byte> data, std::uint64_t cookie) {
    if (header.size() > max_header_bytes) {
      return out_of_range("header size", header.size(), "must be at most transport::max_header_bytes (128)");
    }
    ucx_peer* p = find(id);
    if (p == nullptr || p->state != ucx_peer_state::connected) {
      return make_error(errc::unavailable, "peer", id, "not connected");
    }
    ucx_send_slot* slot = take_slot();
    slot->peer = id;
    slot->cookie = cookie;
    slot->bytes = header.size() + data.size();
    slot->status = UCS_OK;
    std::memcpy(slot->header.data(), &p->peer_key, ucx_key_bytes);
    if (!header.empty()) std::memcpy(slot->header.data() + ucx_key_bytes, header.data(), header.size());
    ucp_request_param_t rp{};
    // No UCP_AM_SEND_FLAG_REPLY: the receiver knows the sender by the key.
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = &on_send_done;
    rp.user_data = slot;
    if (const ucx_region* r = region_of(data.data(), data.size())) {
      rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      rp.memh = r->memh;
    }
    ucs_status_ptr_t req = ucp_am_send_nbx(data_endpoint(*p), ucx_am_data, slot->header.data(),
                                           ucx_key_bytes + header.size(), data.data(), data.size(), &rp);
    if (req == nullptr) {
      completions_.push_back(slot);
    } else if (UCS_PTR_IS_ERR(req)) {
      slot->status = UCS_PTR_STATUS(req);
      completions_.push_back(slot);
    } else {
      slot->in_flight = true;
    }
    return {};
  }

  void wait(std::chrono::microseconds timeout) {
    if (!params_.blocking) {
      ucp_worker_progress(worker_);
      return;
    }
    if (has_ready_work()) return;
    if (params_.spin.count() > 0 && timeout.count() > 0) {
      // UCX callbacks only record (on_am, on_send_done, ...); the handler
      // still runs from progress() alone.
      const auto until = ucx_clock::now() + std::min(params_.spin, timeout);
      do {
        if (ucp_worker_progress(worker_) != 0 && has_ready_work()) return;
      } while (ucx_clock::now() < until);
    }
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return;
    auto limit = timeout;
    const auto now = ucx_clock::now();
    if (auto next = next_timer(); next != ucx_clock::time_point::max()) {
      limit = std::min(limit, std::chrono::duration_cast<std::chrono::microseconds>(std::max(next - now, ucx_clock::duration::zero())));
    }
    pollfd pfd{efd_, POLLIN, 0};
    const auto ms = (limit.count() + 999) / 1000;
    ::poll(&pfd, 1, static_cast<int>(std::min<std::int64_t>(ms, 1 << 30)));
  }

  std::span<const peer_id> peers() const noexcept { return connected_; }

  bool is_connected(peer_id id) const noexcept {
    const ucx_peer* p = find(id);
    return p != nullptr && p->state == ucx_peer_state::connected;
  }

  ucx_clock::time_point last_heard(peer_id id) const noexcept {
    const ucx_peer* p = find(id);
    return p != nullptr && p->state == ucx_peer_state::connected ? p->heard : ucx_clock::time_point{};
  }

  void close(peer_id id) {
    ucx_peer* p = find(id);
    if (p == nullptr || p->state == ucx_peer_state::done) return;
    if (p->state == ucx_peer_state::connected) {
      // A keyed goodbye behind the data on the data endpoint tells the peer
      // all data has arrived; the one on the sockaddr endpoint comes first
      // and tells it that the disconnect that follows is no failure.
      const bool keyed = p->data_ep != nullptr;
      if (keyed) send_keyed_control(*p, ucx_control::goodbye);
      const std::array<std::byte, 1> body{std::byte{keyed ? std::uint8_t{1} : std::uint8_t{0}}};
      send_control(*p, ucx_control::goodbye, body);
    }
    finish(*p, true);
    note(id, peer_event::closed, status{});
    ++counters_.peers_closed;
  }

  // Closes every peer; outside progress() waits (bounded) for the closes to
  // flush, so a goodbye sent just before reaches the peer.
  void close_all(bool wait_for_flush) {
    for (auto& p : peers_) {
      if (p && p->state != ucx_peer_state::done) close(p->id);
    }
    if (wait_for_flush && !in_progress_) {
      const auto until = ucx_clock::now() + params_.close_timeout;
      while (!closing_.empty() && ucx_clock::now() < until) {
        ucp_worker_progress(worker_);
        reap_closes();
      }
    }
  }

  // Past the bounded wait: UCX frees what is still closing when it completes
  // (or when the worker is destroyed).
  void abandon_closes() {
    for (void* r : closing_) ucp_request_free(r);
    closing_.clear();
  }

  const transport_counters& counters() const noexcept { return counters_; }
  const std::string& listen_address() const noexcept { return listen_address_; }
  std::size_t peer_records() const noexcept { return peers_.size(); }

  // The lanes of the endpoint that carries the peer's data.
  std::string describe(peer_id id) const {
    const ucx_peer* p = find(id);
    if (p == nullptr) return {};
    if (p->data_ep != nullptr) return print_endpoint(p->data_ep);
    return p->ep != nullptr && p->state != ucx_peer_state::done ? print_endpoint(p->ep) : p->transports;
  }

  result<memory_id> register_memory(std::span<std::byte> region) {
    if (region.empty()) return invalid_argument("register_memory size", 0, "must be > 0");
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = region.data();
    mp.length = region.size();
    ucp_mem_h memh = nullptr;
    const ucs_status_t s = ucp_mem_map(context_, &mp, &memh);
    if (s != UCS_OK) return ucx_error("ucp_mem_map", s);
    regions_.push_back({region.data(), region.size(), memh});
    return static_cast<memory_id>(regions_.size() - 1);
  }

  void deregister_memory(memory_id id) {
    if (id >= regions_.size() || regions_[id].memh == nullptr) return;
    ucp_mem_unmap(context_, regions_[id].memh);
    regions_[id] = ucx_region{};
  }

  // ---- progress ---------------------------------------------------------------

  template <class H>
  std::size_t progress(H& h) {
    in_progress_ = true;
    std::size_t calls = 0;
    for (int i = 0; i < 64 && ucp_worker_progress(worker_) != 0; ++i) {
    }
    accept_connections();
    run_timers();
    reap_closes();
    calls += deliver_notes(h);
    calls += deliver_items(h);
    calls += deliver_completions(h);
    calls += deliver_notes(h);
    in_progress_ = false;
    return calls;
  }

 private:
  // ---- UCX callbacks: record only; the handler runs from progress() -----------

  static void on_conn_request(ucp_conn_request_h request, void* arg) {
    static_cast<ucx_impl*>(arg)->conn_requests_.push_back(request);
  }

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t s) {
    auto* self = static_cast<ucx_impl*>(arg);
    auto it = self->ep_peer_.find(ep);
    if (it == self->ep_peer_.end()) return;
    ucx_item* item = self->take_item();
    item->kind = ucx_item_kind::ep_error;
    item->peer = it->second;
    item->ep = ep;
    item->status = s;
    self->queue_.push_back(item);
  }

  static void on_send_done(void* request, ucs_status_t s, void* user_data) {
    auto* slot = static_cast<ucx_send_slot*>(user_data);
    ucp_request_free(request);
    slot->in_flight = false;
    if (slot->orphaned) {
      // Its error was (or is about to be) reported; the slot is free once both happened.
      if (slot->reported) slot->owner->free_slots_.push_back(slot);
      return;
    }
    slot->status = s;
    slot->owner->completions_.push_back(slot);
  }

  static void on_recv_done(void* request, ucs_status_t s, std::size_t, void* user_data) {
    auto* item = static_cast<ucx_item*>(user_data);
    item->status = s;
    item->recv = s == UCS_OK ? ucx_recv_state::received : ucx_recv_state::failed;
    item->request = nullptr;
    ucp_request_free(request);
  }

  static ucs_status_t on_am_control(void* arg, const void* header, std::size_t header_length, void* data,
                                    std::size_t length, const ucp_am_recv_param_t* param) {
    return static_cast<ucx_impl*>(arg)->on_am(ucx_item_kind::control, header, header_length, data, length, param);
  }
  static ucs_status_t on_am_data(void* arg, const void* header, std::size_t header_length, void* data,
                                 std::size_t length, const ucp_am_recv_param_t* param) {
    return static_cast<ucx_impl*>(arg)->on_am_keyed(ucx_item_kind::data, header, header_length, data, length, param);
  }
  static ucs_status_t on_am_keyed_control(void* arg, const void* header, std::size_t header_length, void* data,
                                          std::size_t length, const ucp_am_recv_param_t* param) {
    return static_cast<ucx_impl*>(arg)->on_am_keyed(ucx_item_kind::control, header, header_length, data, length, param);
  }

  // Nothing is allocated for a message that is dropped: a rendezvous sender
  // is told the data was refused, eager bytes are dropped where they lie.
  static ucs_status_t drop(const ucp_am_recv_param_t* param) noexcept {
    return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 ? UCS_ERR_MESSAGE_TRUNCATED : UCS_OK;
  }

  // The handshake channel: the sender is the sockaddr endpoint it came from.
  ucs_status_t on_am(ucx_item_kind kind, const void* header, std::size_t header_length, void* data, std::size_t length,
                     const ucp_am_recv_param_t* param) {
    peer_id from = no_peer;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0) {
      auto it = ep_peer_.find(param->reply_ep);
      if (it != ep_peer_.end()) from = it->second;
    }
    if (from == no_peer) {
      ++counters_.unauthenticated_dropped;
      return drop(param);
    }
    find(from)->heard = ucx_clock::now();
    return queue_am(kind, from, param->reply_ep, header, header_length, data, length, param);
  }

  // Data and keyed control: the sender is whoever holds the key in front of
  // the header, which only an authenticated peer was told.
  ucs_status_t on_am_keyed(ucx_item_kind kind, const void* header, std::size_t header_length, void* data,
                           std::size_t length, const ucp_am_recv_param_t* param) {
    peer_id from = no_peer;
    if (header_length >= ucx_key_bytes) {
      std::uint64_t key = 0;
      std::memcpy(&key, header, ucx_key_bytes);
      auto it = keys_.find(key);
      if (it != keys_.end()) from = it->second;
    }
    if (from == no_peer) {
      ++counters_.unauthenticated_dropped;
      return drop(param);
    }
    ucx_peer& p = *find(from);
    if (p.state == ucx_peer_state::done) return drop(param);  // a closed link's last messages
    // Heard now, however long the message takes to arrive whole (or waits
    // behind an earlier one of its peer).
    p.heard = ucx_clock::now();
    if (kind == ucx_item_kind::control && header_length == ucx_key_bytes + 1 &&
        static_cast<const std::byte*>(header)[ucx_key_bytes] == static_cast<std::byte>(ucx_control::keepalive)) {
      return drop(param);  // its arrival was all it had to say
    }
    return queue_am(kind, from, nullptr, static_cast<const std::byte*>(header) + ucx_key_bytes,
                    header_length - ucx_key_bytes, data, length, param);
  }

  ucs_status_t queue_am(ucx_item_kind kind, peer_id from, ucp_ep_h ep, const void* header, std::size_t header_length,
                        void* data, std::size_t length, const ucp_am_recv_param_t* param) {
    const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    const bool persistent = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0;
    const bool too_big = header_length > max_header_bytes || length > params_.max_message_bytes ||
                         (kind == ucx_item_kind::control && (rndv || length > ucx_max_control_data));
    if (too_big) {
      ++counters_.receives_refused;
      return drop(param);
    }
    ucx_item* item = take_item();
    item->kind = kind;
    item->peer = from;
    item->ep = ep;
    item->header_size = header_length;
    if (header_length != 0) std::memcpy(item->header.data(), header, header_length);
    item->length = length;
    item->rndv = rndv;
    item->data = data;
    item->held = rndv || (persistent && length != 0);
    if (!item->held) item->data = nullptr;
    queue_.push_back(item);
    if (!item->held && length != 0) {
      // UCX did not let us keep the bytes (it always should with
      // UCP_AM_FLAG_PERSISTENT_DATA); drop rather than copy.
      item->kind = ucx_item_kind::data;
      item->recv = ucx_recv_state::failed;
    }
    return item->held ? UCS_INPROGRESS : UCS_OK;
  }

  // ---- pools -----------------------------------------------------------------

  ucx_item* take_item() {
    if (free_items_.empty()) {
      items_.push_back(std::make_unique<ucx_item>());
      free_items_.push_back(items_.back().get());
    }
    ucx_item* it = free_items_.back();
    free_items_.pop_back();
    *it = ucx_item{};
    return it;
  }

  void give_back(ucx_item* it) { free_items_.push_back(it); }

  ucx_send_slot* take_slot() {
    if (free_slots_.empty()) {
      slots_.push_back(std::make_unique<ucx_send_slot>());
      slots_.back()->owner = this;
      free_slots_.push_back(slots_.back().get());
    }
    ucx_send_slot* s = free_slots_.back();
    free_slots_.pop_back();
    s->in_flight = s->orphaned = s->reported = false;
    return s;
  }

  void release(ucx_item& it) {
    if (it.held && it.recv == ucx_recv_state::queued && it.data != nullptr) ucp_am_data_release(worker_, it.data);
    it.held = false;
  }

  const ucx_region* region_of(const void* p, std::size_t n) const noexcept {
    const auto* b = static_cast<const std::byte*>(p);
    for (const auto& r : regions_) {
      if (r.memh != nullptr && b >= r.base && b + n <= r.base + r.size) return &r;
    }
    return nullptr;
  }

  // ---- peers -----------------------------------------------------------------

  // A record of a peer that is done is reused (its id with it) once nothing
  // refers to it any more and close_timeout has passed (its last messages
  // drained), so connections that come and go do not grow memory.
  ucx_peer& new_peer(bool client) {
    ucx_peer* p = nullptr;
    const auto now = ucx_clock::now();
    for (auto& pp : peers_) {
      if (pp->state == ucx_peer_state::done && now >= pp->done_at + params_.close_timeout && unreferenced(pp->id)) {
        p = pp.get();
        break;
      }
    }
    if (p == nullptr) {
      peers_.push_back(std::make_unique<ucx_peer>());
      p = peers_.back().get();
      p->id = static_cast<peer_id>(peers_.size() - 1);
    } else {
      if (p->own_key != 0) keys_.erase(p->own_key);
      const peer_id id = p->id;
      *p = ucx_peer{};
      p->id = id;
      ++counters_.peer_records_reused;
    }
    p->client = client;
    return *p;
  }

  bool unreferenced(peer_id id) const noexcept {
    for (const ucx_item* it : queue_) if (it->peer == id) return false;
    for (const auto& slot : slots_) if ((slot->in_flight || slot->orphaned) && !slot->reported && slot->peer == id) return false;
    for (const ucx_send_slot* slot : completions_) if (slot->peer == id) return false;
    for (const auto& n : notes_) if (n.peer == id) return false;
    return true;
  }

  // Peers that connected to our listener and are not authenticated and
  // linked yet (ucx_params::max_pending_peers).
  std::size_t pending_peers() const noexcept {
    std::size_t n = 0;
    for (const auto& pp : peers_)
      n += !pp->client && (pp->state == ucx_peer_state::handshake || pp->state == ucx_peer_state::linking) ? 1 : 0;
    return n;
  }

  ucx_peer* find(peer_id id) noexcept { return id < peers_.size() ? peers_[id].get() : nullptr; }
  const ucx_peer* find(peer_id id) const noexcept { return id < peers_.size() ? peers_[id].get() : nullptr; }

  void note(peer_id id, peer_event e, status why) { notes_.push_back({id, e, std::move(why)}); }

  ucp_ep_params_t ep_params() {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &on_ep_error;
    ep.err_handler.arg = this;
    return ep;
  }

  void attempt(ucx_peer& p) {
    ++p.attempts;
    p.retry_pending = false;
    ucp_ep_params_t ep = ep_params();
    ep.field_mask |= UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_FLAGS;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&p.target.storage);
    ep.sockaddr.addrlen = p.target.length;
    const ucs_status_t s = ucp_ep_create(worker_, &ep, &p.ep);
    if (s != UCS_OK) {
      p.ep = nullptr;
      p.last_error = s;
      schedule_retry(p);
      return;
    }
    ep_peer_[p.ep] = p.id;
  }

  void schedule_retry(ucx_peer& p) {
    const auto now = ucx_clock::now();
    if (now + params_.retry_interval >= p.deadline) {
      give_up_connecting(p);
      return;
    }
    p.retry_pending = true;
    p.retry_at = now + params_.retry_interval;
  }

  void give_up_connecting(ucx_peer& p) {
    std::string why = "no server at " + p.address + " after " + ucx_seconds(params_.connect_timeout) + " (" +
                      std::to_string(p.attempts) + (p.attempts == 1 ? " attempt" : " attempts") + "): " +
                      (p.last_error == UCS_OK ? "no answer" : ucx_status_name(p.last_error));
    fail(p, status(errc::unavailable, std::move(why)));
  }

  // Ends a peer's endpoint. `flush`: an orderly close (pending sends and a
  // goodbye are delivered first); otherwise forced (pending sends complete
  // with an error).
  void finish(ucx_peer& p, bool flush) {
    if (p.state == ucx_peer_state::connected) {
      connected_.erase(std::remove(connected_.begin(), connected_.end(), p.id), connected_.end());
    }
    p.state = ucx_peer_state::done;
    p.done_at = ucx_clock::now();
    p.retry_pending = false;
    if (!flush) orphan_sends(p.id);
    cancel_receives(p.id);
    drop_endpoint(p, flush);
  }

  void drop_endpoint(ucx_peer& p, bool flush) {
    // UCX refuses to force-close an endpoint without error handling (the
    // data endpoint): it is flushed, which is local for shared memory.
    close_endpoint(p.data_ep, true);
    close_endpoint(p.ep, flush);
  }

  // Sends still in flight to a peer that failed or closed: UCX cancels those
  // on a force-closed sockaddr endpoint, but not those on a data endpoint
  // (no error handling), whose rendezvous would wait for the peer forever.
  // Each is reported failed now; its slot is reused once UCX lets go of it.
  void orphan_sends(peer_id id) {
    for (auto& owned : slots_) {
      ucx_send_slot* slot = owned.get();
      if (slot->in_flight && !slot->orphaned && slot->peer == id) {
        slot->orphaned = true;
        slot->status = UCS_ERR_CANCELED;
        completions_.push_back(slot);
      }
    }
  }

  void close_endpoint(ucp_ep_h& ep, bool flush) {
    if (ep == nullptr) return;
    ep_peer_.erase(ep);
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = flush ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &rp);
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) closing_.push_back(req);
    ep = nullptr;
  }

  ucp_ep_h data_endpoint(const ucx_peer& p) const noexcept { return p.data_ep != nullptr ? p.data_ep : p.ep; }

  void fail(ucx_peer& p, status why) {
    finish(p, false);
    ++counters_.peers_failed;
    note(p.id, peer_event::failed, std::move(why));
  }

  void reap_closes() {
    for (std::size_t i = 0; i < closing_.size();) {
      if (ucp_request_check_status(closing_[i]) != UCS_INPROGRESS) {
        ucp_request_free(closing_[i]);
        closing_[i] = closing_.back();
        closing_.pop_back();
      } else {
        ++i;
      }
    }
  }

  // A control message on the sockaddr endpoint; `data` (a worker address)
  // must outlive the send.
  void send_control(ucx_peer& p, ucx_control type, std::span<const std::byte> body,
                    std::span<const std::byte> data = {}) {
    if (p.ep == nullptr) return;
    ucx_send_slot* slot = take_slot();
    slot->peer = no_peer;  // internal: no on_sent
    slot->cookie = 0;
    slot->bytes = 0;
    slot->status = UCS_OK;
    slot->header[0] = static_cast<std::byte>(type);
    if (!body.empty()) std::memcpy(slot->header.data() + 1, body.data(), body.size());
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    rp.cb.send = &on_send_done;
    rp.user_data = slot;
    rp.flags = UCP_AM_SEND_FLAG_REPLY;
    ucs_status_ptr_t req = ucp_am_send_nbx(p.ep, ucx_am_control, slot->header.data(), 1 + body.size(), data.data(),
                                           data.size(), &rp);
    if (req == nullptr || UCS_PTR_IS_ERR(req)) {
      if (UCS_PTR_IS_ERR(req)) slot->status = UCS_PTR_STATUS(req);
      completions_.push_back(slot);
    }
  }

  // A control message in order with the data: on the data endpoint, keyed.
  void send_keyed_control(ucx_peer& p, ucx_control type) {
    const ucp_ep_h ep = data_endpoint(p);
    if (ep == nullptr) return;
    ucx_send_slot* slot = take_slot();
    slot->peer = no_peer;  // internal: no on_sent
    slot->cookie = 0;
    slot->bytes = 0;
    slot->status = UCS_OK;
    std::memcpy(slot->header.data(), &p.peer_key, ucx_key_bytes);
    slot->header[ucx_key_bytes] = static_cast<std::byte>(type);
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = &on_send_done;
    rp.user_data = slot;
    ucs_status_ptr_t req =
        ucp_am_send_nbx(ep, ucx_am_keyed_control, slot->header.data(), ucx_key_bytes + 1, nullptr, 0, &rp);
    if (req == nullptr || UCS_PTR_IS_ERR(req)) {
      if (UCS_PTR_IS_ERR(req)) slot->status = UCS_PTR_STATUS(req);
      completions_.push_back(slot);
    }
  }

  // Authenticated: tell the peer the key it must put in front of its data
  // and where our worker is. The key goes only over the sockaddr endpoint
  // whose peer just proved it holds the token.
  status send_link(ucx_peer& p) {
    std::uint64_t key = 0;
    while (key == 0 || keys_.count(key) != 0) {
      auto n = auth::make_nonce();
      if (!n) return n.error();
      std::memcpy(&key, n->data(), sizeof key);
    }
    p.own_key = key;
    keys_.emplace(key, p.id);
    std::array<std::byte, ucx_key_bytes> body{};
    std::memcpy(body.data(), &key, ucx_key_bytes);
    send_control(p, ucx_control::link, body,
                 std::span<const std::byte>(reinterpret_cast<const std::byte*>(worker_address_), worker_address_length_));
    p.state = ucx_peer_state::linking;
    return {};
  }

  // The peer's link: its key, and an endpoint to its worker address (UCX
  // picks the transports: shared memory on one host when UCX_TLS allows).
  void on_link(ucx_peer& p, const ucx_item& it, std::span<const std::byte> body) {
    if (p.state != ucx_peer_state::linking || it.ep == nullptr || body.size() != ucx_key_bytes) return;
    std::memcpy(&p.peer_key, body.data(), ucx_key_bytes);
    if (params_.address_endpoints && it.length != 0 && it.data != nullptr) {
      // UCP_ERR_HANDLING_MODE_NONE: with PEER, UCX 1.13 leaves out posix and
      // sysv (they lack peer-failure support) and picks TCP even on one host.
      // A dead peer is detected by the sockaddr endpoint (PEER mode), whose
      // failure force-closes this one, cancelling its pending sends.
      ucp_ep_params_t ep = ep_params();
      ep.field_mask |= UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
      ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      ep.address = static_cast<const ucp_address_t*>(it.data);
      const ucs_status_t s = ucp_ep_create(worker_, &ep, &p.data_ep);
      if (s != UCS_OK) {
        p.data_ep = nullptr;
        return fail(p, status(errc::unavailable, "peer " + p.address +
                                                     ": cannot create an endpoint to its worker address: " +
                                                     ucx_status_name(s)));
      }
      ep_peer_[p.data_ep] = p.id;
    }
    mark_connected(p);
  }

  void accept_connections() {
    for (std::size_t i = 0; i < conn_requests_.size(); ++i) {
      ucp_conn_request_h request = conn_requests_[i];
      if (pending_peers() >= params_.max_pending_peers) {
        // Refused before a record or an endpoint exists for it.
        ++counters_.peers_refused;
        if (counters_.peers_refused == 1)
          std::fprintf(stderr, "ashl ucx: a connection refused: ucx_params.max_pending_peers = %zu peers are "
                               "authenticating already (counted in peers_refused)\n", params_.max_pending_peers);
        ucp_listener_reject(listener_, request);
        continue;
      }
      auto& p = new_peer(false);
      ucp_conn_request_attr_t ca{};
      ca.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
      p.address = ucp_conn_request_query(request, &ca) == UCS_OK ? ucx_format_sockaddr(ca.client_address) : "?";
      p.start = ucx_clock::now();
      p.deadline = p.start + params_.auth_timeout;
      p.state = ucx_peer_state::handshake;
      ucp_ep_params_t ep = ep_params();
      ep.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
      ep.conn_request = request;
      const ucs_status_t s = ucp_ep_create(worker_, &ep, &p.ep);
      if (s != UCS_OK) {
        p.ep = nullptr;
        fail(p, status(errc::unavailable, "peer " + p.address + ": cannot accept its connection: " + ucx_status_name(s)));
        continue;
      }
      ep_peer_[p.ep] = p.id;
      auto n = auth::make_nonce();
      if (!n) {
        fail(p, n.error());
        continue;
      }
      p.own_nonce = *n;
      send_control(p, ucx_control::challenge, p.own_nonce);
    }
    conn_requests_.clear();
  }

  void run_timers() {
    const auto now = ucx_clock::now();
    for (auto& pp : peers_) {
      ucx_peer& p = *pp;
      if (p.state == ucx_peer_state::connecting) {
        if (p.retry_pending && now >= p.retry_at) {
          attempt(p);
        } else if (now >= p.deadline) {
          give_up_connecting(p);
        }
      } else if (p.state == ucx_peer_state::connected && !p.draining && params_.keepalive_interval.count() > 0 &&
                 now >= p.next_keepalive) {
        p.next_keepalive = now + params_.keepalive_interval;
        send_keyed_control(p, ucx_control::keepalive);
      } else if (p.state == ucx_peer_state::connected && p.draining && now >= p.deadline) {
        // Its keyed goodbye never came (it died after its sockaddr goodbye).
        close_by_peer(p);
      } else if (p.state == ucx_peer_state::linking && now >= p.deadline) {
        fail(p, status(errc::timed_out, "peer " + p.address + ": no data endpoint within " +
                                            ucx_seconds(params_.auth_timeout) + " of authentication"));
      } else if (p.state == ucx_peer_state::handshake && now >= p.deadline) {
        if (!p.client) ++counters_.auth_refused;
        fail(p, status(errc::timed_out, "peer " + p.address + ": authentication did not finish within " +
                                            ucx_seconds(params_.auth_timeout)));
      }
    }
  }

  ucx_clock::time_point next_timer() const {
    auto next = ucx_clock::time_point::max();
    for (const auto& pp : peers_) {
      const ucx_peer& p = *pp;
      if (p.state == ucx_peer_state::connected && p.draining) next = std::min(next, p.deadline);
      if (p.state == ucx_peer_state::connected && !p.draining && params_.keepalive_interval.count() > 0)
        next = std::min(next, p.next_keepalive);
      if (p.state == ucx_peer_state::connecting || p.state == ucx_peer_state::handshake ||
          p.state == ucx_peer_state::linking) {
        next = std::min(next, p.deadline);
        if (p.retry_pending) next = std::min(next, p.retry_at);
        // The connection manager's events do not always wake the worker's fd:
        // look again at least every retry interval while a peer is being set up.
        next = std::min(next, ucx_clock::now() + params_.retry_interval);
      }
    }
    if (!closing_.empty()) next = std::min(next, ucx_clock::now() + std::chrono::milliseconds(10));
    return next;
  }

  // Something progress() would hand to the handler now. A message queued
  // behind a rendezvous receive of the same peer is not: waiting for that
  // receive must sleep, not spin.
  bool has_ready_work() {
    if (!completions_.empty() || !notes_.empty() || !conn_requests_.empty()) return true;
    blocked_.clear();
    for (const ucx_item* it : queue_) {
      if (blocked(it->peer)) continue;
      if (it->ep == nullptr && it->kind != ucx_item_kind::ep_error && held_back(it->peer)) continue;
      if (it->recv != ucx_recv_state::receiving) return true;
      blocked_.push_back(it->peer);
    }
    return false;
  }

  // A keyed message from a peer whose own link (over the sockaddr endpoint)
  // has not been handled yet waits for it: endpoints are not ordered.
  bool held_back(peer_id id) const noexcept {
    const ucx_peer* p = find(id);
    return p != nullptr && p->state == ucx_peer_state::linking;
  }

  // ---- handshake -----------------------------------------------------------------

  void on_control(ucx_peer& p, const ucx_item& it) {
    if (it.header_size == 0) return;
    const auto type = static_cast<ucx_control>(it.header[0]);
    const std::span<const std::byte> body(it.header.data() + 1, it.header_size - 1);
    switch (type) {
      case ucx_control::challenge: {
        if (!p.client || p.state != ucx_peer_state::connecting || body.size() != auth::nonce_size) return;
        p.challenged = true;
        p.state = ucx_peer_state::handshake;
        p.deadline = ucx_clock::now() + params_.auth_timeout;
        std::memcpy(p.peer_nonce.data(), body.data(), auth::nonce_size);
        auto n = auth::make_nonce();
        if (!n) return fail(p, n.error());
        p.own_nonce = *n;
        auto proof = auth::client_proof(params_.token, p.peer_nonce, p.own_nonce);
        if (!proof) return fail(p, proof.error());
        std::array<std::byte, auth::nonce_size + auth::digest_size> answer{};
        std::memcpy(answer.data(), p.own_nonce.data(), auth::nonce_size);
        std::memcpy(answer.data() + auth::nonce_size, proof->data(), auth::digest_size);
        send_control(p, ucx_control::answer, answer);
        return;
      }
      case ucx_control::answer: {
        if (p.client || p.state != ucx_peer_state::handshake) return;
        bool ok = body.size() == auth::nonce_size + auth::digest_size;
        if (ok) {
          std::memcpy(p.peer_nonce.data(), body.data(), auth::nonce_size);
          auto expected = auth::client_proof(params_.token, p.own_nonce, p.peer_nonce);
          ok = expected && auth::verify(*expected, body.subspan(auth::nonce_size));
        }
        if (!ok) {
          ++counters_.auth_refused;
          send_control(p, ucx_control::refuse, {});
          // An orderly close, so the refusal reaches the client before the disconnect.
          finish(p, true);
          ++counters_.peers_failed;
          note(p.id, peer_event::failed,
               status(errc::invalid_argument,
                      "peer " + p.address + " refused: token mismatch (its ASHL_TOKEN differs from this server's)"));
          return;
        }
        auto proof = auth::server_proof(params_.token, p.peer_nonce, p.own_nonce);
        if (!proof) return fail(p, proof.error());
        send_control(p, ucx_control::accept, *proof);
        p.deadline = ucx_clock::now() + params_.auth_timeout;
        if (status s = send_link(p); !s.ok()) return fail(p, std::move(s));
        return;
      }
      case ucx_control::accept: {
        if (!p.client || p.state != ucx_peer_state::handshake) return;
        auto expected = auth::server_proof(params_.token, p.own_nonce, p.peer_nonce);
        if (!expected || !auth::verify(*expected, body)) {
          return fail(p, status(errc::invalid_argument, "the server at " + p.address +
                                                            " did not prove it holds the token (ASHL_TOKEN differs, "
                                                            "or it is not an ashl server)"));
        }
        p.deadline = ucx_clock::now() + params_.auth_timeout;
        if (status s = send_link(p); !s.ok()) return fail(p, std::move(s));
        return;
      }
      case ucx_control::link: {
        on_link(p, it, body);
        return;
      }
      case ucx_control::keepalive:
        return;  // handled on arrival (on_am_keyed)
      case ucx_control::refuse: {
        if (!p.client) return;
        return fail(p, status(errc::invalid_argument, "token mismatch: the server at " + p.address +
                                                          " refused authentication (ASHL_TOKEN differs)"));
      }
      case ucx_control::goodbye: {
        if (it.ep == nullptr) {
          // Keyed, behind all its data: everything it sent has arrived.
          if (p.state == ucx_peer_state::connected) close_by_peer(p);
          return;
        }
        p.goodbye = true;
        if (p.state == ucx_peer_state::connected) {
          if (body.size() == 1 && body[0] == std::byte{1}) {
            // Its data may still be on the way over the data endpoint.
            p.draining = true;
            p.deadline = ucx_clock::now() + params_.close_timeout;
          } else {
            close_by_peer(p);
          }
        }
        return;
      }
    }
  }

  void close_by_peer(ucx_peer& p) {
    finish(p, false);
    ++counters_.peers_closed;
    note(p.id, peer_event::closed, status{});
  }

  void mark_connected(ucx_peer& p) {
    p.state = ucx_peer_state::connected;
    p.heard = ucx_clock::now();
    p.next_keepalive = p.heard + params_.keepalive_interval;
    connected_.push_back(p.id);
    ++counters_.peers_connected;
    p.transports = print_endpoint(data_endpoint(p));
    if (params_.verbose) {
      // The lanes that carry its data, and which endpoint that is.
      std::fprintf(stderr, "ashl ucx: peer %u %s connected over %s (%s endpoint)\n", p.id, p.address.c_str(),
                   summarize(p.transports).c_str(), p.data_ep != nullptr ? "worker-address" : "sockaddr");
    }
    note(p.id, peer_event::connected, status{});
  }

  static std::string print_endpoint(ucp_ep_h ep) {
    char* text = nullptr;
    std::size_t size = 0;
    FILE* f = open_memstream(&text, &size);
    if (f == nullptr) return {};
    ucp_ep_print_info(ep, f);
    std::fclose(f);
    std::string out(text, size);
    std::free(text);
    return out;
  }

  // The distinct "transport/device" names of the lanes in ucp_ep_print_info's text.
  static std::string summarize(const std::string& info) {
    std::vector<std::string> names;
    std::size_t pos = 0;
    while ((pos = info.find("lane[", pos)) != std::string::npos) {
      const auto colon = info.find(':', pos);
      const auto eol = info.find('\n', pos);
      if (colon == std::string::npos || colon > eol) break;
      auto start = info.find_first_not_of(' ', colon + 1);
      auto sep = info.find(':', start);  // "<rsc index>:<tl>/<dev>"
      if (sep != std::string::npos && sep < eol) start = sep + 1;
      const auto end = info.find_first_of(" \t\n", start);
      std::string name = info.substr(start, end - start);
      if (const auto dot = name.rfind('.'); dot != std::string::npos && name.find('/') < dot) name.resize(dot);
      // "cm" lanes (the connection manager) carry no messages.
      if (name.find('/') != std::string::npos && std::find(names.begin(), names.end(), name) == names.end()) {
        names.push_back(name);
      }
      pos = eol == std::string::npos ? info.size() : eol;
    }
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
    return out.empty() ? "(unknown)" : out;
  }

  // ---- delivery ----------------------------------------------------------------

  template <class H>
  std::size_t deliver_notes(H& h) {
    std::size_t calls = 0;
    while (!notes_.empty()) {
      notes_work_.swap(notes_);
      for (auto& n : notes_work_) {
        h.on_peer(n.peer, n.event, n.why);
        ++calls;
      }
      notes_work_.clear();
    }
    return calls;
  }

  template <class H>
  std::size_t deliver_completions(H& h) {
    std::size_t calls = 0;
    while (!completions_.empty()) {
      completions_work_.swap(completions_);
      for (ucx_send_slot* slot : completions_work_) {
        if (slot->peer != no_peer) {
          if (slot->status == UCS_OK) {
            ++counters_.messages_sent;
            counters_.bytes_sent += slot->bytes;
            h.on_sent(slot->peer, slot->cookie, status{});
          } else {
            ++counters_.sends_failed;
            h.on_sent(slot->peer, slot->cookie,
                      status(errc::unavailable, "send to peer " + std::to_string(slot->peer) +
                                                    " failed: " + ucx_status_name(slot->status)));
          }
          ++calls;
        }
        if (slot->in_flight) {
          slot->reported = true;  // orphaned: free once UCX's callback came
        } else {
          free_slots_.push_back(slot);
        }
      }
      completions_work_.clear();
    }
    return calls;
  }

  bool blocked(peer_id p) const noexcept { return std::find(blocked_.begin(), blocked_.end(), p) != blocked_.end(); }
  bool is_held(peer_id p) const noexcept { return std::find(held_.begin(), held_.end(), p) != held_.end(); }

  template <class H>
  std::size_t deliver_items(H& h) {
    std::size_t calls = 0;
    blocked_.clear();
    held_.clear();
    // Items are appended only by UCX callbacks, i.e. inside
    // ucp_worker_progress, which nothing below calls; index-based anyway.
    for (std::size_t i = 0; i < queue_.size(); ++i) {
      ucx_item& it = *queue_[i];
      if (blocked(it.peer)) continue;
      ucx_peer* p = find(it.peer);
      if (it.kind == ucx_item_kind::ep_error) {
        it.done = true;
        if (p != nullptr && it.ep != nullptr && (p->ep == it.ep || p->data_ep == it.ep)) {
          on_endpoint_error(*p, it.ep, it.status);
        }
        calls += deliver_notes(h);
        continue;
      }
      const bool keyed = it.ep == nullptr;
      if (p == nullptr || (!keyed && p->ep != it.ep) || p->state == ucx_peer_state::done) {
        if (it.recv == ucx_recv_state::receiving) {
          // UCX still owns the item and the buffer: kept until its callback
          // (its peer's later messages are dropped meanwhile, not held).
          // UCX 1.13 cannot cancel an active-message receive: the callback
          // comes when the sender goes on, and never when it died; such a
          // receive is counted stuck after close_timeout, and its buffer is
          // never handed back (nor written by anyone).
          if (!it.cancelled) {
            it.cancelled = true;
            it.cancelled_at = ucx_clock::now();
            if (it.request != nullptr) ucp_request_cancel(worker_, it.request);
          } else if (!it.stuck && ucx_clock::now() - it.cancelled_at >= params_.close_timeout) {
            it.stuck = true;
            ++counters_.receives_stuck;
          }
          continue;
        }
        if (it.rndv && it.recv != ucx_recv_state::queued) calls += abandon(h, it);
        release(it);  // from an endpoint that is gone: nobody to deliver to
        it.done = true;
        continue;
      }
      if (keyed && (p->state == ucx_peer_state::linking || is_held(it.peer))) {
        // Came over its data endpoint before its link: kept, in order, for
        // the next progress().
        if (!is_held(it.peer)) held_.push_back(it.peer);
        continue;
      }
      if (it.kind == ucx_item_kind::control) {
        on_control(*p, it);
        release(it);
        it.done = true;
        calls += deliver_notes(h);
        continue;
      }
      if (p->state != ucx_peer_state::connected) {
        ++counters_.unauthenticated_dropped;
        release(it);
        it.done = true;
        continue;
      }
      const std::span<const std::byte> header(it.header.data(), it.header_size);
      if (it.rndv && it.recv == ucx_recv_state::queued) {
        std::span<std::byte> dst = h.receive_buffer(it.peer, header, it.length);
        ++calls;
        if (dst.size() < it.length || (dst.data() == nullptr && it.length != 0)) {
          ++counters_.receives_refused;
          release(it);
          it.done = true;
          continue;
        }
        it.destination = dst.first(it.length);
        start_receive(it);
      }
      if (it.recv == ucx_recv_state::receiving) {
        blocked_.push_back(it.peer);
        continue;
      }
      if (it.recv == ucx_recv_state::failed) {
        calls += abandon(h, it);
        it.done = true;  // the peer died mid-transfer; its failure follows
        continue;
      }
      std::span<const std::byte> data;
      if (it.rndv) {
        data = it.destination;
      } else if (it.data != nullptr) {
        data = {static_cast<const std::byte*>(it.data), it.length};
      }
      ++counters_.messages_received;
      counters_.bytes_received += it.header_size + it.length;
      h.on_message(it.peer, header, data);
      ++calls;
      release(it);
      it.done = true;
    }
    std::size_t kept = 0;
    for (std::size_t i = 0; i < queue_.size(); ++i) {
      if (queue_[i]->done) {
        give_back(queue_[i]);
      } else {
        queue_[kept++] = queue_[i];
      }
    }
    queue_.resize(kept);
    return calls;
  }

  void start_receive(ucx_item& it) {
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv_am = &on_recv_done;
    rp.user_data = &it;
    if (const ucx_region* r = region_of(it.destination.data(), it.destination.size())) {
      rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      rp.memh = r->memh;
    }
    it.held = false;  // UCX owns the descriptor from here, even on failure
    it.recv = ucx_recv_state::receiving;
    ucs_status_ptr_t req = ucp_am_recv_data_nbx(worker_, it.data, it.destination.data(), it.length, &rp);
    if (req == nullptr) {
      it.recv = ucx_recv_state::received;
    } else if (UCS_PTR_IS_ERR(req)) {
      it.status = UCS_PTR_STATUS(req);
      it.recv = ucx_recv_state::failed;
    } else if (it.recv == ucx_recv_state::receiving) {
      it.request = req;  // (a callback that already ran freed it)
    }
  }

  // The receives in flight from a peer that is done: UCX is asked to cancel
  // them. Each item (and the handler's buffer) stays UCX's until the
  // callback comes; deliver_items() then hands the buffer back.
  void cancel_receives(peer_id id) {
    for (ucx_item* it : queue_) {
      if (it->peer != id || it->recv != ucx_recv_state::receiving || it->cancelled) continue;
      it->cancelled = true;
      it->cancelled_at = ucx_clock::now();
      if (it->request != nullptr) ucp_request_cancel(worker_, it->request);
    }
  }

  // A buffer from receive_buffer() that will not be delivered, handed back
  // once UCX no longer writes into it.
  template <class H>
  std::size_t abandon(H& h, ucx_item& it) {
    ++counters_.receives_abandoned;
    if (it.stuck) --counters_.receives_stuck;  // its callback came after all
    if (it.destination.empty()) return 0;
    const std::span<std::byte> buffer = it.destination;
    it.destination = {};
    if constexpr (requires { h.on_receive_abandoned(it.peer, buffer); }) {
      h.on_receive_abandoned(it.peer, buffer);
      return 1;
    } else {
      return 0;
    }
  }

  void on_endpoint_error(ucx_peer& p, ucp_ep_h ep, ucs_status_t s) {
    if (p.state == ucx_peer_state::done) return;
    if (p.client && p.state == ucx_peer_state::connecting && !p.challenged) {
      // Nobody listens (yet): try again until the connect deadline.
      p.last_error = s;
      drop_endpoint(p, false);
      schedule_retry(p);
      return;
    }
    if (p.goodbye) {
      if (p.draining && ep == p.ep) {
        // The disconnect after its sockaddr goodbye; its data endpoint
        // still brings the rest of its data and the keyed goodbye.
        close_endpoint(p.ep, false);
        return;
      }
      close_by_peer(p);
      return;
    }
    const bool was_connected = p.state == ucx_peer_state::connected;
    std::string why = "peer " + std::to_string(p.id) + " (" + p.address + ") " +
                      (was_connected                               ? "failed: "
                       : p.state == ucx_peer_state::linking ? "failed before its data endpoint was ready: "
                                                            : "failed before authentication: ") +
                      ucx_status_name(s);
    fail(p, status(errc::unavailable, std::move(why)));
  }

  ucx_params params_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int efd_ = -1;
  bool in_progress_ = false;
  std::string listen_address_;
  transport_counters counters_;

  std::vector<std::unique_ptr<ucx_peer>> peers_;  // by peer_id; a done one is reused (new_peer)
  std::vector<peer_id> connected_;
  std::unordered_map<ucp_ep_h, peer_id> ep_peer_;
  std::unordered_map<std::uint64_t, peer_id> keys_;  // own_key → peer; kept after a peer is done, until its record is reused
  ucp_address_t* worker_address_ = nullptr;         // sent in each link; null without address endpoints
  std::size_t worker_address_length_ = 0;

  std::vector<std::unique_ptr<ucx_item>> items_;
  std::vector<ucx_item*> free_items_, queue_;
  std::vector<std::unique_ptr<ucx_send_slot>> slots_;
  std::vector<ucx_send_slot*> free_slots_, completions_, completions_work_;
  std::vector<peer_id> blocked_, held_;
  std::vector<ucx_peer_note> notes_, notes_work_;
  std::vector<ucp_conn_request_h> conn_requests_;
  std::vector<void*> closing_;
  std::vector<ucx_region> regions_;
};

}  // namespace detail

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
