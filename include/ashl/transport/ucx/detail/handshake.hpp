// ashl/transport/ucx/detail/handshake.hpp — transport::ucx's connections:
// connect() and its retries, the HMAC handshake of transport/auth.hpp over
// the bootstrap connection (frames of transport/bootstrap.hpp; the
// listener's side of it is in listener.hpp), timers (retries, deadlines,
// keepalives), endpoint errors, and orderly and failed closes.
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_UCX()

#include <ashl/transport/ucx/detail/impl.hpp>

ASHL_NAMESPACE_BEGIN
namespace transport {
namespace detail {

inline result<peer_id> ucx_impl::connect(std::string_view address, bool isolated) {
  auto a = ucx_parse_address("connect address", address);
  if (!a) return a.error();
  auto& p = new_peer(true);
  p.isolated = isolated;
  p.address = std::string(address);
  p.target = *a;
  p.on_this_host = ucx_is_loopback(a->storage);
  p.start = ucx_clock::now();
  p.connect_deadline = p.deadline = p.start + params_.connect_timeout;
  attempt(p);
  return p.id;
}

inline void ucx_impl::close(peer_id id) {
  ucx_peer* p = find(id);
  if (p == nullptr || p->state == ucx_peer_state::done) return;
  if (p->state == ucx_peer_state::connected) {
    // A keyed goodbye behind the data on the data endpoint tells the peer
    // all data has arrived; the one on the bootstrap connection comes
    // first and tells it that the end of that connection is no failure.
    const bool keyed = p->data_ep != nullptr;
    if (keyed) send_keyed_control(*p, ucx_control::goodbye);
    const std::array<std::byte, 1> body{std::byte{keyed ? std::uint8_t{1} : std::uint8_t{0}}};
    send_frame(*p, bootstrap::frame_type::goodbye, {body});
  }
  finish(*p, true);
  note(id, peer_event::closed, status{});
  ++counters_.peers_closed;
}

// Closes every peer; outside progress() waits (bounded) for the closes to
// flush, so a goodbye sent just before reaches the peer.
inline void ucx_impl::close_all(bool wait_for_flush) {
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
  // The goodbyes are written (or as much as the sockets take now).
  for (std::size_t i = lingering_.size(); i-- > 0;) service_lingering(lingering_[i], 0);
}

// Past the bounded wait: UCX frees what is still closing when it completes
// (or when the worker is destroyed).
inline void ucx_impl::abandon_closes() {
  for (void* r : closing_) ucp_request_free(r);
  closing_.clear();
}

inline void ucx_impl::on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t s) {
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

// A record of a peer that is done is reused (its id with it) once nothing
// refers to it any more and close_timeout has passed (its last messages
// drained), so connections that come and go do not grow memory.
inline ucx_peer& ucx_impl::new_peer(bool client) {
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

inline bool ucx_impl::unreferenced(peer_id id) const noexcept {
  for (const ucx_item* it : queue_) if (it->peer == id) return false;
  for (const auto& slot : slots_) if ((slot->in_flight || slot->orphaned) && !slot->reported && slot->peer == id) return false;
  for (const ucx_send_slot* slot : completions_) if (slot->peer == id) return false;
  for (const auto& n : notes_) if (n.peer == id) return false;
  return true;
}

inline ucp_ep_params_t ucx_impl::ep_params() {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &on_ep_error;
  ep.err_handler.arg = this;
  return ep;
}

// One TCP connection to the listener (non-blocking: its result comes from
// poll()); the listener's challenge follows on it.
inline void ucx_impl::attempt(ucx_peer& p) {
  ++p.attempts;
  p.retry_pending = false;
  p.challenged = false;
  p.sock.in.reset(bootstrap::role::connector);
  p.sock.out.clear();
  p.sock.out_sent = 0;
  const int fd = ::socket(p.target.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    p.last_error = std::string("socket: ") + std::strerror(errno);
    schedule_retry(p);
    return;
  }
  ucx_set_nodelay(fd);
  p.sock.fd = fd;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&p.target.storage), p.target.length) == 0) return;
  if (errno == EINPROGRESS) {
    p.sock.connecting = true;
    return;
  }
  p.last_error = std::strerror(errno);
  close_socket(p.sock, false);
  schedule_retry(p);
}

inline void ucx_impl::schedule_retry(ucx_peer& p) {
  const auto now = ucx_clock::now();
  p.deadline = p.connect_deadline;
  if (now + params_.retry_interval >= p.deadline) {
    give_up_connecting(p);
    return;
  }
  p.retry_pending = true;
  p.retry_at = now + params_.retry_interval;
}

inline void ucx_impl::give_up_connecting(ucx_peer& p) {
  std::string why = "no server at " + p.address + " after " + ucx_seconds(params_.connect_timeout) + " (" +
                    std::to_string(p.attempts) + (p.attempts == 1 ? " attempt" : " attempts") + "): " +
                    (p.last_error.empty() ? "no answer" : p.last_error);
  fail(p, status(errc::unavailable, std::move(why)));
}

// Ends a peer's endpoint. `flush`: an orderly close (pending sends and a
// goodbye are delivered first); otherwise forced (pending sends complete
// with an error).
inline void ucx_impl::finish(ucx_peer& p, bool flush) {
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

inline void ucx_impl::drop_endpoint(ucx_peer& p, bool flush) {
  // UCX refuses to force-close an endpoint without error handling (the
  // data endpoint with address_endpoints): it is flushed, which is local
  // for shared memory.
  close_endpoint(p.data_ep, flush || !p.peer_errors);
  close_socket(p.sock, flush);
}

inline void ucx_impl::close_endpoint(ucp_ep_h& ep, bool flush) {
  if (ep == nullptr) return;
  ep_peer_.erase(ep);
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = flush ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &rp);
  if (req != nullptr && !UCS_PTR_IS_ERR(req)) closing_.push_back(req);
  ep = nullptr;
}

inline void ucx_impl::fail(ucx_peer& p, status why) {
  finish(p, false);
  ++counters_.peers_failed;
  note(p.id, peer_event::failed, std::move(why));
}

inline void ucx_impl::reap_closes() {
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

inline void ucx_impl::run_timers() {
  const auto now = ucx_clock::now();
  for (auto& pp : peers_) {
    ucx_peer& p = *pp;
    if (silent_too_long(p, now)) {
      fail(p, status(errc::unavailable, "peer " + std::to_string(p.id) + " (" + p.address + ") failed: nothing from it, " +
                                            "not even a keepalive, for " + ucx_seconds(p.silence_bound) +
                                            " (fail_when_silent): the process stopped driving its transport, its " +
                                            "host is down, or the network between is cut"));
      continue;
    }
    if (p.state == ucx_peer_state::connecting) {
      if (p.retry_pending && now >= p.retry_at) {
        attempt(p);
      } else if (now >= p.connect_deadline) {
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
      fail(p, status(errc::timed_out, "peer " + p.address + ": authentication did not finish within " +
                                          ucx_seconds(params_.auth_timeout)));
    }
  }
  // Connections that did not authenticate in time.
  for (std::size_t i = 0; i < pending_.size() && pending_in_use_ != 0; ++i) {
    ucx_pending& slot = pending_[i];
    if (slot.fd >= 0 && now >= slot.deadline) {
      ++counters_.auth_refused;
      log_event(ucx_log_limiter::timed_out);
      drop_pending(slot);
    }
  }
  for (std::size_t i = lingering_.size(); i-- > 0;) {
    if (now >= lingering_[i].deadline) service_lingering(lingering_[i], 0);
  }
  flush_log(false);
}

inline ucx_clock::time_point ucx_impl::next_timer() const {
  auto next = ucx_clock::time_point::max();
  for (const auto& pp : peers_) {
    const ucx_peer& p = *pp;
    if (p.state == ucx_peer_state::connected && p.draining) next = std::min(next, p.deadline);
    if (p.state == ucx_peer_state::connected && !p.draining && params_.keepalive_interval.count() > 0)
      next = std::min(next, p.next_keepalive);
    if (p.state == ucx_peer_state::connected && !p.draining && p.silence_bound.count() > 0)
      next = std::min(next, p.heard + p.silence_bound + std::chrono::milliseconds(1));
    if (p.state == ucx_peer_state::connecting || p.state == ucx_peer_state::handshake ||
        p.state == ucx_peer_state::linking) {
      next = std::min(next, p.state == ucx_peer_state::connecting ? p.connect_deadline : p.deadline);
      if (p.retry_pending) next = std::min(next, p.retry_at);
    }
  }
  if (pending_in_use_ != 0)
    for (const auto& slot : pending_) if (slot.fd >= 0) next = std::min(next, slot.deadline);
  for (const auto& l : lingering_) next = std::min(next, l.deadline);
  if (listen_fd_ >= 0 && accept_paused_until_ > ucx_clock::now()) next = std::min(next, accept_paused_until_);
  if (log_.pending()) next = std::min(next, log_.next_print);
  if (!closing_.empty()) next = std::min(next, ucx_clock::now() + std::chrono::milliseconds(10));
  return next;
}

// A keyed control message, in order with the peer's data.
inline void ucx_impl::on_control(ucx_peer& p, const ucx_item& it) {
  if (it.header_size != 1) return;
  switch (static_cast<ucx_control>(it.header[0])) {
    case ucx_control::keepalive:
      return;  // handled on arrival (on_am_keyed)
    case ucx_control::goodbye:
      // Behind all its data: everything it sent has arrived.
      if (p.state == ucx_peer_state::connected) close_by_peer(p);
      return;
  }
}

// A frame of the bootstrap connection, already checked against the stage
// by bootstrap::reader (type, size, magic).
inline void ucx_impl::on_frame(ucx_peer& p, const bootstrap::frame& f) {
  using bootstrap::frame_type;
  switch (f.type) {
    case frame_type::challenge: {
      if (!p.client || p.state != ucx_peer_state::connecting) return;
      p.challenged = true;
      p.state = ucx_peer_state::handshake;
      p.deadline = ucx_clock::now() + params_.auth_timeout;
      std::memcpy(p.peer_nonce.data(), f.body.data() + bootstrap::magic.size(), auth::nonce_size);
      auto n = auth::make_nonce();
      if (!n) return fail(p, n.error());
      p.own_nonce = *n;
      auto proof = auth::client_proof(params_.token, p.peer_nonce, p.own_nonce);
      if (!proof) return fail(p, proof.error());
      send_frame(p, frame_type::answer, {p.own_nonce, *proof});
      return;
    }
    case frame_type::answer:
      return;  // the listener's side reads answers before a record exists (listener.hpp)
    case frame_type::accept: {
      if (!p.client || p.state != ucx_peer_state::handshake) return;
      auto expected = auth::server_proof(params_.token, p.own_nonce, p.peer_nonce);
      if (!expected || !auth::verify(*expected, f.body)) {
        return fail(p, status(errc::invalid_argument, "the server at " + p.address +
                                                          " did not prove it holds the token (ASHL_TOKEN differs, "
                                                          "or it is not an ashl server)"));
      }
      p.deadline = ucx_clock::now() + params_.auth_timeout;
      if (status s = send_link(p); !s.ok()) return fail(p, std::move(s));
      return;
    }
    case frame_type::refuse:
      return fail(p, status(errc::invalid_argument, "token mismatch: the server at " + p.address +
                                                        " refused authentication (ASHL_TOKEN differs)"));
    case frame_type::link:
      return on_link(p, f.body);
    case frame_type::goodbye:
      p.goodbye = true;
      if (p.state == ucx_peer_state::connected) {
        if (f.body[0] == std::byte{1}) {
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

inline void ucx_impl::close_by_peer(ucx_peer& p) {
  finish(p, false);
  ++counters_.peers_closed;
  note(p.id, peer_event::closed, status{});
}

inline void ucx_impl::mark_connected(ucx_peer& p) {
  p.state = ucx_peer_state::connected;
  p.heard = ucx_clock::now();
  p.next_keepalive = p.heard + params_.keepalive_interval;
  connected_.push_back(p.id);
  ++counters_.peers_connected;
  p.transports = print_endpoint(data_endpoint(p));
  if (params_.verbose) {
    // The lanes that carry its data, and which endpoint that is.
    std::fprintf(stderr, "ashl ucx: peer %u %s connected over %s (worker-address endpoint, error handling %s)\n",
                 p.id, p.address.c_str(), summarize(p.transports).c_str(), p.peer_errors ? "peer" : "none");
  }
  note(p.id, peer_event::connected, status{});
}

// The data endpoint failed (only with address_endpoints = false: error
// handling PEER).
inline void ucx_impl::on_endpoint_error(ucx_peer& p, ucp_ep_h, ucs_status_t s) {
  if (p.state == ucx_peer_state::done) return;
  if (p.goodbye) return close_by_peer(p);
  const bool was_connected = p.state == ucx_peer_state::connected;
  fail(p, status(errc::unavailable, "peer " + std::to_string(p.id) + " (" + p.address + ") " +
                                        (was_connected ? "failed: " : "failed before its data endpoint was ready: ") +
                                        ucx_status_name(s)));
}

}  // namespace detail
}  // namespace transport
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_UCX()
