// ashl/transport/ucx/detail/impl.hpp — the one class behind transport::ucx,
// declared here and defined by its parts, each in its own file:
//   context.hpp    the UCP context and worker, waiting, registered memory
//   handshake.hpp  connecting, the authenticated handshake, timers, closes
//   link.hpp       the link protocol: session keys and data endpoints
//   delivery.hpp   sends, active-message arrival, and delivery in progress()
//   listener.hpp   the bootstrap listener and sockets: accepting under caps,
//                  reading bounded bytes, deadlines, rate-limited logs
// (transport/ucx.hpp includes them all; docs/transport.md, "UCX").
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_UCX()

#include <ashl/core/status.hpp>
#include <ashl/transport/auth.hpp>
#include <ashl/transport/concepts.hpp>
#include <ashl/transport/ucx/detail/records.hpp>
#include <ashl/transport/ucx/detail/sockaddr.hpp>
#include <ashl/transport/ucx/params.hpp>

#include <ucp/api/ucp.h>

#include <arpa/inet.h>
#include <cerrno>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace transport {
namespace detail {

class ucx_impl {
 public:
  explicit ucx_impl(ucx_params p) : params_(std::move(p)) {}
  ucx_impl(const ucx_impl&) = delete;
  ucx_impl& operator=(const ucx_impl&) = delete;

  ~ucx_impl();

  status init();

  // ---- the public operations -------------------------------------------------

  result<peer_id> connect(std::string_view address, bool isolated = false);
  void fail_when_silent(peer_id id, std::chrono::milliseconds bound) {
    if (ucx_peer* p = find(id); p != nullptr && p->state != ucx_peer_state::done) p->silence_bound = bound;
  }
  static bool silent_too_long(const ucx_peer& p, ucx_clock::time_point now) noexcept {
    return p.state == ucx_peer_state::connected && !p.draining && p.silence_bound.count() > 0 &&
           now - p.heard > p.silence_bound;
  }

  status send(peer_id id, std::span<const std::byte> header, std::span<const std::byte> data, std::uint64_t cookie);

  void wait(std::chrono::microseconds timeout);

  std::span<const peer_id> peers() const noexcept { return connected_; }

  // The lanes named in ucp_ep_print_info's text (ucx::lanes_of).
  static std::string summarize(const std::string& info);

  bool is_connected(peer_id id) const noexcept {
    const ucx_peer* p = find(id);
    return p != nullptr && p->state == ucx_peer_state::connected;
  }

  bool peer_on_this_host(peer_id id) const noexcept {
    const ucx_peer* p = find(id);
    return p != nullptr && p->on_this_host;
  }

  ucx_clock::time_point last_heard(peer_id id) const noexcept {
    const ucx_peer* p = find(id);
    return p != nullptr && p->state == ucx_peer_state::connected ? p->heard : ucx_clock::time_point{};
  }

  void close(peer_id id);

  // Closes every peer; outside progress() waits (bounded) for the closes to
  // flush, so a goodbye sent just before reaches the peer.
  void close_all(bool wait_for_flush);

  // Past the bounded wait: UCX frees what is still closing when it completes
  // (or when the worker is destroyed).
  void abandon_closes();

  const transport_counters& counters() const noexcept { return counters_; }
  const std::string& listen_address() const noexcept { return listen_address_; }
  std::size_t peer_records() const noexcept { return peers_.size(); }

  // The lanes of the endpoint that carries the peer's data.
  std::string describe(peer_id id) const;

  result<memory_id> register_memory(std::span<std::byte> region);

  void deregister_memory(memory_id id);

  // ---- progress ---------------------------------------------------------------

  template <class H>
  std::size_t progress(H& h);

 private:
  // ---- UCX callbacks: record only; the handler runs from progress() -----------

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t s);

  static void on_send_done(void* request, ucs_status_t s, void* user_data);

  static void on_recv_done(void* request, ucs_status_t s, std::size_t, void* user_data);

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

  static ucs_status_t drop(const ucp_am_recv_param_t* param) noexcept;

  ucs_status_t on_am(ucx_item_kind kind, const void* header, std::size_t header_length, void* data, std::size_t length,
                     const ucp_am_recv_param_t* param);

  ucs_status_t on_am_keyed(ucx_item_kind kind, const void* header, std::size_t header_length, void* data,
                           std::size_t length, const ucp_am_recv_param_t* param);

  ucs_status_t queue_am(ucx_item_kind kind, peer_id from, ucp_ep_h ep, const void* header, std::size_t header_length,
                        void* data, std::size_t length, const ucp_am_recv_param_t* param);

  // ---- pools -----------------------------------------------------------------

  ucx_item* take_item();

  void give_back(ucx_item* it) { free_items_.push_back(it); }

  ucx_send_slot* take_slot();

  void release(ucx_item& it);

  const ucx_region* region_of(const void* p, std::size_t n) const noexcept;

  // ---- peers -----------------------------------------------------------------

  ucx_peer& new_peer(bool client);

  bool unreferenced(peer_id id) const noexcept;

  ucx_peer* find(peer_id id) noexcept { return id < peers_.size() ? peers_[id].get() : nullptr; }
  const ucx_peer* find(peer_id id) const noexcept { return id < peers_.size() ? peers_[id].get() : nullptr; }

  void note(peer_id id, peer_event e, status why) { notes_.push_back({id, e, std::move(why)}); }

  ucp_ep_params_t ep_params();

  void attempt(ucx_peer& p);

  void schedule_retry(ucx_peer& p);

  void give_up_connecting(ucx_peer& p);

  void finish(ucx_peer& p, bool flush);

  void drop_endpoint(ucx_peer& p, bool flush);

  void orphan_sends(peer_id id);

  void close_endpoint(ucp_ep_h& ep, bool flush);

  ucp_ep_h data_endpoint(const ucx_peer& p) const noexcept { return p.data_ep; }

  void fail(ucx_peer& p, status why);

  void reap_closes();

  void send_keyed_control(ucx_peer& p, ucx_control type);

  status send_link(ucx_peer& p);

  void on_link(ucx_peer& p, std::span<const std::byte> body);

  // ---- the bootstrap listener and sockets (listener.hpp) -------------------------

  status open_listener(const ucx_sockaddr& at);

  bool sockets_busy() const noexcept;

  void collect_fds(bool with_efd);

  void service_sockets();

  void accept_connections();

  void admit(int fd, const sockaddr_storage& from);

  void read_pending(ucx_pending& slot);

  void drop_pending(ucx_pending& slot);

  void authenticated(ucx_pending& slot, std::span<const std::byte> answer);

  void read_peer(ucx_peer& p);

  void on_frame(ucx_peer& p, const bootstrap::frame& f);

  void socket_ended(ucx_peer& p, std::string why);

  bool flush_socket(int fd, std::vector<std::byte>& out, std::size_t& sent);

  void close_socket(ucx_socket& s, bool keep);

  void linger(int fd, std::vector<std::byte> out, std::size_t sent);

  void service_lingering(ucx_lingering& l, short revents);

  void log_event(ucx_log_limiter::kind k, int err = 0);

  void flush_log(bool force);

  void run_timers();

  ucx_clock::time_point next_timer() const;

  bool has_ready_work();

  bool held_back(peer_id id) const noexcept;

  // ---- handshake -----------------------------------------------------------------

  void on_control(ucx_peer& p, const ucx_item& it);

  void send_frame(ucx_peer& p, bootstrap::frame_type type, std::initializer_list<std::span<const std::byte>> parts);

  void close_by_peer(ucx_peer& p);

  void mark_connected(ucx_peer& p);

  static std::string print_endpoint(ucp_ep_h ep);


  // ---- delivery ----------------------------------------------------------------

  template <class H>
  std::size_t deliver_notes(H& h);

  template <class H>
  std::size_t deliver_completions(H& h);

  bool blocked(peer_id p) const noexcept { return std::find(blocked_.begin(), blocked_.end(), p) != blocked_.end(); }
  bool is_held(peer_id p) const noexcept { return std::find(held_.begin(), held_.end(), p) != held_.end(); }

  template <class H>
  std::size_t deliver_items(H& h);

  void start_receive(ucx_item& it);

  void cancel_receives(peer_id id);

  template <class H>
  std::size_t abandon(H& h, ucx_item& it);

  void on_endpoint_error(ucx_peer& p, ucp_ep_h ep, ucs_status_t s);

  ucx_params params_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  // The bootstrap listener (listener.hpp): its socket, a descriptor kept in
  // reserve for EMFILE, the connections not authenticated yet (fixed slots),
  // sockets closing, and what wait() and progress() poll.
  int listen_fd_ = -1;
  int reserve_fd_ = -1;
  std::vector<ucx_pending> pending_;
  std::size_t pending_in_use_ = 0;  // slots of pending_ holding a connection (hot-path checks skip the scan)
  std::uint64_t accepted_ = 0;  // accept serials
  std::vector<ucx_lingering> lingering_;
  std::vector<pollfd> pollfds_;
  struct poll_owner {
    std::uint8_t kind;  // 0 efd, 1 listener, 2 pending, 3 peer, 4 lingering
    std::uint32_t index;
  };
  std::vector<poll_owner> poll_owners_;
  bool sockets_ready_ = false;  // wait()'s poll saw a socket ready: progress() services them
  ucx_clock::time_point next_socket_check_{}, accept_paused_until_{};
  ucx_log_limiter log_;
  std::array<std::byte, 512> scratch_{};  // bytes read only to be dropped
  bool in_progress_ = false;
  // wait() returned on work its own ucp_worker_progress just recorded: the
  // next progress() delivers it without progressing UCX first (a call that
  // would find nothing new and, with a tcp interface open, costs a system call).
  bool progressed_in_wait_ = false;
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
  std::vector<void*> closing_;
  std::vector<ucx_region> regions_;
};

}  // namespace detail
}  // namespace transport
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_UCX()
