// ashl/transport/ucx/detail/listener.hpp — transport::ucx's bootstrap
// listener and sockets (docs/transport.md, "The bootstrap listener";
// docs/design.md, "Runtime contract for real runs"): a plain non-blocking TCP
// listener of ashl's own, in place of UCX's sockaddr connection manager,
// which UCX 1.13 aborts in on malformed bytes. Before a peer has
// proved it holds the token, the only code that sees its bytes is
// bootstrap::reader (at most 69 of them); UCX sees nothing of it.
//
// Bounds: at most max_pending_peers unauthenticated connections, and
// max_pending_per_address from one address; a new one past a cap closes
// the oldest (so a flood cannot hold every slot); each is closed at its
// deadline (auth_timeout). When accept() fails for want of descriptors,
// the oldest unauthenticated connection is closed to make room (as at a
// cap); when none is held, a descriptor kept in reserve accepts and closes
// the oldest waiting connection (else the listen socket stays readable and
// the loop spins); without one, accepting pauses for 100 ms. Repeated events are counted
// and printed at most once every 10 s. Everything runs from progress() and
// wait() (poll() on the listen socket and the bootstrap sockets beside
// UCX's event fd): no thread.
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_UCX()

#include <ashl/transport/ucx/detail/impl.hpp>

ASHL_NAMESPACE_BEGIN
namespace transport {
namespace detail {

inline constexpr auto ucx_log_interval = std::chrono::seconds(10);
inline constexpr auto ucx_accept_pause = std::chrono::milliseconds(100);
// Sockets are looked at at least this often from progress() when nothing
// is being set up (a new connection, a peer's goodbye or its death); wait()
// polls them with UCX's fd, so a blocking wait never misses one.
inline constexpr auto ucx_socket_check = std::chrono::milliseconds(1);
inline constexpr int ucx_accepts_per_progress = 64;

inline status ucx_impl::open_listener(const ucx_sockaddr& at) {
  const int fd = ::socket(at.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(errc::unavailable, "listen", params_.listen, std::string("socket: ") + std::strerror(errno));
  listen_fd_ = fd;
  const int one = 1;
  if (params_.reuse_address) (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&at.storage), at.length) != 0) {
    if (errno == EADDRINUSE) return make_error(errc::unavailable, "listen", params_.listen, "port in use");
    return make_error(errc::unavailable, "listen", params_.listen, std::string("cannot listen there: ") + std::strerror(errno));
  }
  if (::listen(fd, SOMAXCONN) != 0) {
    return make_error(errc::unavailable, "listen", params_.listen, std::string("listen: ") + std::strerror(errno));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    return make_error(errc::unavailable, "listen", params_.listen, std::string("getsockname: ") + std::strerror(errno));
  }
  listen_address_ = ucx_format_sockaddr(bound);
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  pending_.resize(params_.max_pending_peers);
  lingering_.reserve(params_.max_pending_peers);
  return {};
}

// Something on a socket is under way: progress() looks at the sockets on
// every call, not only every ucx_socket_check.
inline bool ucx_impl::sockets_busy() const noexcept {
  if (!lingering_.empty() || pending_in_use_ != 0) return true;
  for (const auto& pp : peers_) {
    const ucx_peer& p = *pp;
    if (p.sock.fd < 0) continue;
    if (p.state != ucx_peer_state::connected || p.sock.wants_write()) return true;
  }
  return false;
}

inline void ucx_impl::collect_fds(bool with_efd) {
  pollfds_.clear();
  poll_owners_.clear();
  auto add = [&](int fd, short events, std::uint8_t kind, std::size_t index) {
    pollfds_.push_back(pollfd{fd, events, 0});
    poll_owners_.push_back(poll_owner{kind, static_cast<std::uint32_t>(index)});
  };
  if (with_efd && efd_ >= 0) add(efd_, POLLIN, 0, 0);
  if (listen_fd_ >= 0 && ucx_clock::now() >= accept_paused_until_) add(listen_fd_, POLLIN, 1, 0);
  for (std::size_t i = 0; i < pending_.size() && pending_in_use_ != 0; ++i)
    if (pending_[i].fd >= 0) add(pending_[i].fd, POLLIN, 2, i);
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    const ucx_socket& s = peers_[i]->sock;
    if (s.fd >= 0) add(s.fd, static_cast<short>(s.wants_write() ? POLLIN | POLLOUT : POLLIN), 3, i);
  }
  for (std::size_t i = 0; i < lingering_.size(); ++i) {
    const ucx_lingering& l = lingering_[i];
    add(l.fd, static_cast<short>(l.out_sent < l.out.size() ? POLLIN | POLLOUT : POLLIN), 4, i);
  }
}

inline void ucx_impl::service_sockets() {
  const auto now = ucx_clock::now();
  if (!std::exchange(sockets_ready_, false) && now < next_socket_check_ && !sockets_busy()) return;
  next_socket_check_ = now + ucx_socket_check;
  collect_fds(false);
  if (pollfds_.empty()) return;
  if (::poll(pollfds_.data(), pollfds_.size(), 0) <= 0) return;
  bool accept_ready = false;
  // Lingering sockets first (by index, from the back): servicing one may
  // remove it, and servicing the others below may add some.
  for (std::size_t i = pollfds_.size(); i-- > 0;) {
    const pollfd& pf = pollfds_[i];
    if (pf.revents == 0 || poll_owners_[i].kind != 4) continue;
    const std::uint32_t k = poll_owners_[i].index;
    if (k < lingering_.size() && lingering_[k].fd == pf.fd) service_lingering(lingering_[k], pf.revents);
  }
  for (std::size_t i = 0; i < pollfds_.size(); ++i) {
    const pollfd& pf = pollfds_[i];
    if (pf.revents == 0) continue;
    const poll_owner o = poll_owners_[i];
    if (o.kind == 1) {
      accept_ready = true;
    } else if (o.kind == 2) {
      if (o.index < pending_.size() && pending_[o.index].fd == pf.fd) read_pending(pending_[o.index]);
    } else if (o.kind == 3) {
      if (o.index >= peers_.size()) continue;
      ucx_peer& p = *peers_[o.index];
      if (p.sock.fd != pf.fd) continue;
      if (p.sock.connecting) {
        int err = 0;
        socklen_t len = sizeof err;
        if (::getsockopt(p.sock.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        if (err == EINPROGRESS || err == EALREADY) continue;
        if (err != 0) {
          socket_ended(p, std::strerror(err));
          continue;
        }
        p.sock.connecting = false;
      }
      if ((pf.revents & POLLOUT) != 0 && !flush_socket(p.sock.fd, p.sock.out, p.sock.out_sent)) {
        socket_ended(p, std::string("cannot write to it: ") + std::strerror(errno));
        continue;
      }
      if ((pf.revents & (POLLIN | POLLHUP | POLLERR)) != 0) read_peer(p);
    }
  }
  if (accept_ready) accept_connections();
}

inline void ucx_impl::accept_connections() {
  const auto now = ucx_clock::now();
  if (listen_fd_ < 0 || now < accept_paused_until_) return;
  for (int i = 0; i < ucx_accepts_per_progress; ++i) {
    sockaddr_storage from{};
    socklen_t len = sizeof from;
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      admit(fd, from);
      continue;
    }
    const int e = errno;
    if (e == EAGAIN || e == EWOULDBLOCK) return;
    if (e == EINTR || e == ECONNABORTED || e == EPROTO) continue;
    log_event(ucx_log_limiter::accept_failed, e);
    if (e == EMFILE || e == ENFILE) {
      // Out of descriptors while unauthenticated connections hold some:
      // the oldest of them goes, as at a cap, and its descriptor takes the
      // new connection (else the slots held would keep every newcomer out
      // until their deadlines).
      ucx_pending* oldest = nullptr;
      for (auto& s : pending_)
        if (s.fd >= 0 && (oldest == nullptr || s.serial < oldest->serial)) oldest = &s;
      if (oldest != nullptr) {
        ++counters_.peers_refused;
        drop_pending(*oldest);
        continue;
      }
    }
    if ((e == EMFILE || e == ENFILE) && reserve_fd_ >= 0) {
      // Out of descriptors: the one in reserve accepts the oldest waiting
      // connection and closes it, so it leaves the backlog (which would
      // keep the listen socket readable: a busy loop) and its peer learns.
      ::close(reserve_fd_);
      reserve_fd_ = -1;
      const int victim = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (victim >= 0) {
        ::close(victim);
        ++counters_.peers_refused;
      }
      reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (victim >= 0 && reserve_fd_ >= 0) continue;
    }
    // No reserve, or another error: stop accepting briefly rather than spin.
    accept_paused_until_ = now + ucx_accept_pause;
    return;
  }
}

// A new connection: a slot (closing the oldest unauthenticated one of its
// address, or of all, past a cap), a nonce, and the challenge.
inline void ucx_impl::admit(int fd, const sockaddr_storage& from) {
  std::size_t total = 0, same = 0;
  ucx_pending* oldest = nullptr;
  ucx_pending* oldest_same = nullptr;
  ucx_pending* free_slot = nullptr;
  for (auto& s : pending_) {
    if (s.fd < 0) {
      if (free_slot == nullptr) free_slot = &s;
      continue;
    }
    ++total;
    if (oldest == nullptr || s.serial < oldest->serial) oldest = &s;
    if (ucx_same_host(s.from, from)) {
      ++same;
      if (oldest_same == nullptr || s.serial < oldest_same->serial) oldest_same = &s;
    }
  }
  ucx_pending* evict = same >= params_.max_pending_per_address ? oldest_same
                       : total >= params_.max_pending_peers    ? oldest
                                                               : nullptr;
  if (evict != nullptr) {
    ++counters_.peers_refused;
    log_event(ucx_log_limiter::capped);
    drop_pending(*evict);
    free_slot = evict;
  }
  if (free_slot == nullptr) {  // (cannot happen: the caps are at least 1)
    ::close(fd);
    ++counters_.peers_refused;
    return;
  }
  auto n = auth::make_nonce();
  if (!n) {
    ::close(fd);
    return;
  }
  ucx_set_nodelay(fd);
  std::array<std::byte, bootstrap::header_bytes + bootstrap::challenge_body> challenge{};
  bootstrap::put_header(challenge.data(), bootstrap::frame_type::challenge, bootstrap::challenge_body);
  std::memcpy(challenge.data() + bootstrap::header_bytes, bootstrap::magic.data(), bootstrap::magic.size());
  std::memcpy(challenge.data() + bootstrap::header_bytes + bootstrap::magic.size(), n->data(), n->size());
  // A new socket's send buffer takes 45 bytes whole; anything else is a dead peer.
  if (::send(fd, challenge.data(), challenge.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
      static_cast<ssize_t>(challenge.size())) {
    ::close(fd);
    return;
  }
  ucx_pending& s = *free_slot;
  s.fd = fd;
  ++pending_in_use_;
  s.in.reset(bootstrap::role::listener);
  s.nonce = *n;
  s.since = ucx_clock::now();
  s.deadline = s.since + params_.auth_timeout;
  s.from = from;
  s.serial = ++accepted_;
}

inline void ucx_impl::drop_pending(ucx_pending& slot) {
  if (slot.fd < 0) return;
  ::close(slot.fd);
  slot.fd = -1;
  --pending_in_use_;
}

// Bounded reads of a connection that has not authenticated: the reader
// offers room for one answer frame at most.
inline void ucx_impl::read_pending(ucx_pending& slot) {
  while (slot.fd >= 0) {
    const auto room = slot.in.space();
    if (room.empty()) return;
    const ssize_t n = ::recv(slot.fd, room.data(), room.size(), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      drop_pending(slot);  // it went away before authenticating
      return;
    }
    if (n < 0) return;
    slot.in.commit(static_cast<std::size_t>(n));
    bootstrap::frame f;
    const auto o = slot.in.next(f);
    if (o == bootstrap::outcome::more) continue;
    if (o == bootstrap::outcome::bad) {
      ++counters_.auth_refused;
      log_event(ucx_log_limiter::malformed);
      drop_pending(slot);
      return;
    }
    // The answer: its client nonce and proof.
    auth::nonce client_nonce{};
    std::memcpy(client_nonce.data(), f.body.data(), auth::nonce_size);
    auto expected = auth::client_proof(params_.token, slot.nonce, client_nonce);
    if (!expected || !auth::verify(*expected, f.body.subspan(auth::nonce_size))) {
      ++counters_.auth_refused;
      log_event(ucx_log_limiter::wrong_proof);
      std::vector<std::byte> refuse;
      if (lingering_.size() < params_.max_pending_peers) {
        bootstrap::append_frame(refuse, bootstrap::frame_type::refuse, {});
        linger(slot.fd, std::move(refuse), 0);
        slot.fd = -1;
        --pending_in_use_;
      } else {
        drop_pending(slot);
      }
      return;
    }
    authenticated(slot, f.body);
    return;
  }
}

// The peer proved it holds the token: it gets a record, the listener's
// proof and our link, and is linking until its own link comes.
inline void ucx_impl::authenticated(ucx_pending& slot, std::span<const std::byte> answer) {
  auto& p = new_peer(false);
  p.address = ucx_format_sockaddr(slot.from);
  p.on_this_host = ucx_is_loopback(slot.from);
  p.start = slot.since;
  p.own_nonce = slot.nonce;
  std::memcpy(p.peer_nonce.data(), answer.data(), auth::nonce_size);
  p.sock.fd = slot.fd;
  slot.fd = -1;
  --pending_in_use_;
  std::swap(p.sock.in, slot.in);  // at the link stage now; the slot gets a reader back
  p.state = ucx_peer_state::handshake;
  auto proof = auth::server_proof(params_.token, p.peer_nonce, p.own_nonce);
  if (!proof) return fail(p, proof.error());
  send_frame(p, bootstrap::frame_type::accept, {*proof});
  p.deadline = ucx_clock::now() + params_.auth_timeout;
  if (status s = send_link(p); !s.ok()) return fail(p, std::move(s));
}

inline void ucx_impl::read_peer(ucx_peer& p) {
  while (p.sock.fd >= 0 && p.state != ucx_peer_state::done) {
    const auto room = p.sock.in.space();
    if (room.empty()) {
      // Closing (after a goodbye): anything more is dropped unread.
      const ssize_t n = ::recv(p.sock.fd, scratch_.data(), scratch_.size(), MSG_DONTWAIT);
      if (n == 0) return socket_ended(p, "its connection closed");
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        return socket_ended(p, std::strerror(errno));
      }
      continue;
    }
    const ssize_t n = ::recv(p.sock.fd, room.data(), room.size(), MSG_DONTWAIT);
    if (n == 0) return socket_ended(p, "its connection closed");
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      return socket_ended(p, std::strerror(errno));
    }
    p.sock.in.commit(static_cast<std::size_t>(n));
    bootstrap::frame f;
    bootstrap::outcome o;
    while ((o = p.sock.in.next(f)) == bootstrap::outcome::frame) {
      on_frame(p, f);
      if (p.state == ucx_peer_state::done || p.sock.fd < 0) return;
    }
    if (o == bootstrap::outcome::bad) {
      return fail(p, status(errc::invalid_argument, "peer " + p.address + ": bootstrap connection: " + p.sock.in.why()));
    }
  }
}

// The bootstrap connection ended (read 0 or an error).
inline void ucx_impl::socket_ended(ucx_peer& p, std::string why) {
  if (p.state == ucx_peer_state::done) return;
  if (p.client && (p.state == ucx_peer_state::connecting || p.state == ucx_peer_state::handshake)) {
    // Not authenticated yet: nobody listens (yet), or the listener closed
    // us (a cap, a restart). Try again until the connect deadline.
    p.last_error = p.challenged ? "the listener closed the connection before authentication (" + why + ")" : why;
    close_socket(p.sock, false);
    p.state = ucx_peer_state::connecting;
    p.challenged = false;
    schedule_retry(p);
    return;
  }
  if (p.goodbye) {
    close_socket(p.sock, false);
    // Draining: its data endpoint still brings the rest of its data and
    // the keyed goodbye (run_timers ends the wait at the deadline).
    if (!(p.state == ucx_peer_state::connected && p.draining)) close_by_peer(p);
    return;
  }
  const bool was_connected = p.state == ucx_peer_state::connected;
  fail(p, status(errc::unavailable, "peer " + std::to_string(p.id) + " (" + p.address + ") " +
                                        (was_connected ? "failed: " : "failed before its data endpoint was ready: ") +
                                        why));
}

// Writes what it can; false on an error (the peer is gone).
inline bool ucx_impl::flush_socket(int fd, std::vector<std::byte>& out, std::size_t& sent) {
  while (sent < out.size()) {
    const ssize_t n = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    sent += static_cast<std::size_t>(n);
  }
  out.clear();
  sent = 0;
  return true;
}

inline void ucx_impl::send_frame(ucx_peer& p, bootstrap::frame_type type,
                                 std::initializer_list<std::span<const std::byte>> parts) {
  if (p.sock.fd < 0) return;
  bootstrap::append_frame(p.sock.out, type, parts);
  if (!p.sock.connecting) (void)flush_socket(p.sock.fd, p.sock.out, p.sock.out_sent);  // errors show on the next read
}

// `keep`: an orderly end (our last frames are flushed first, and the
// peer reads them rather than a reset); else closed at once.
inline void ucx_impl::close_socket(ucx_socket& s, bool keep) {
  if (s.fd < 0) return;
  if (keep && lingering_.size() < std::max<std::size_t>(params_.max_pending_peers, peers_.size())) {
    linger(s.fd, std::move(s.out), s.out_sent);
  } else {
    ::close(s.fd);
  }
  s.fd = -1;
  s.out.clear();
  s.out_sent = 0;
  s.connecting = false;
}

inline void ucx_impl::linger(int fd, std::vector<std::byte> out, std::size_t sent) {
  ucx_lingering l;
  l.fd = fd;
  l.out = std::move(out);
  l.out_sent = sent;
  l.deadline = ucx_clock::now() + params_.close_timeout;
  lingering_.push_back(std::move(l));
  service_lingering(lingering_.back(), POLLOUT);
}

// Flush, shut our side, drop what comes, close at the peer's end or the deadline.
inline void ucx_impl::service_lingering(ucx_lingering& l, short revents) {
  bool done = false;
  if (!flush_socket(l.fd, l.out, l.out_sent)) done = true;
  if (!done && l.out.empty() && !l.shut) {
    (void)::shutdown(l.fd, SHUT_WR);
    l.shut = true;
  }
  if (!done && (revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
    while (true) {
      const ssize_t n = ::recv(l.fd, scratch_.data(), scratch_.size(), MSG_DONTWAIT);
      if (n > 0) continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) done = true;
      break;
    }
  }
  if (!done && ucx_clock::now() < l.deadline) return;
  ::close(l.fd);
  const std::size_t i = static_cast<std::size_t>(&l - lingering_.data());
  if (i + 1 != lingering_.size()) lingering_[i] = std::move(lingering_.back());
  lingering_.pop_back();
}

inline void ucx_impl::log_event(ucx_log_limiter::kind k, int err) {
  ++log_.counts[k];
  if (err != 0) log_.last_errno = err;
  flush_log(false);
}

// At most one line per ucx_log_interval, with the counts since the last one.
inline void ucx_impl::flush_log(bool force) {
  if (!log_.pending()) return;
  const auto now = ucx_clock::now();
  if (!force && now < log_.next_print) return;
  std::string line = "ashl ucx listener " + listen_address_ + ": ";
  auto add = [&](ucx_log_limiter::kind k, const std::string& what) {
    if (log_.counts[k] == 0) return;
    if (line.back() != ' ') line += ", ";
    line += std::to_string(log_.counts[k]) + " " + what;
  };
  add(ucx_log_limiter::capped, "unauthenticated connections closed past max_pending_peers = " +
                                   std::to_string(params_.max_pending_peers) + " / max_pending_per_address = " +
                                   std::to_string(params_.max_pending_per_address));
  add(ucx_log_limiter::malformed, "connections closed for malformed bootstrap bytes");
  add(ucx_log_limiter::wrong_proof, "refused for a wrong token");
  add(ucx_log_limiter::timed_out, "did not authenticate within " + ucx_seconds(params_.auth_timeout));
  add(ucx_log_limiter::accept_failed,
      std::string("accept() failures (last: ") + std::strerror(log_.last_errno) + ")");
  line += " (counted in peers_refused / auth_refused; at most one such line per " +
          std::to_string(std::chrono::duration_cast<std::chrono::seconds>(ucx_log_interval).count()) + " s)\n";
  std::fputs(line.c_str(), stderr);
  log_.counts = {};
  log_.next_print = now + ucx_log_interval;
}

}  // namespace detail
}  // namespace transport
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_UCX()
