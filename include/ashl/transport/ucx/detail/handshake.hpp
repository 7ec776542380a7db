// ashl/transport/ucx/detail/handshake.hpp — transport::ucx's connections:
// connect() and its retries, accepting on the listener, the HMAC handshake
// of transport/auth.hpp on the control channel, timers (retries, deadlines,
// keepalives), endpoint errors, and orderly and failed closes.
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_UCX()

#include <ashl/transport/ucx/detail/impl.hpp>

ASHL_NAMESPACE_BEGIN
namespace transport {
namespace detail {

inline result<peer_id> ucx_impl::connect(std::string_view address) {
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

inline void ucx_impl::close(peer_id id) {
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

// Peers that connected to our listener and are not authenticated and
// linked yet (ucx_params::max_pending_peers).
inline std::size_t ucx_impl::pending_peers() const noexcept {
  std::size_t n = 0;
  for (const auto& pp : peers_)
    n += !pp->client && (pp->state == ucx_peer_state::handshake || pp->state == ucx_peer_state::linking) ? 1 : 0;
  return n;
}

inline ucp_ep_params_t ucx_impl::ep_params() {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &on_ep_error;
  ep.err_handler.arg = this;
  return ep;
}

inline void ucx_impl::attempt(ucx_peer& p) {
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

inline void ucx_impl::schedule_retry(ucx_peer& p) {
  const auto now = ucx_clock::now();
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
                    (p.last_error == UCS_OK ? "no answer" : ucx_status_name(p.last_error));
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
  // data endpoint): it is flushed, which is local for shared memory.
  close_endpoint(p.data_ep, true);
  close_endpoint(p.ep, flush);
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

// A control message on the sockaddr endpoint; `data` (a worker address)
// must outlive the send.
inline void ucx_impl::send_control(ucx_peer& p, ucx_control type, std::span<const std::byte> body,
                                   std::span<const std::byte> data) {
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

inline void ucx_impl::accept_connections() {
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

inline void ucx_impl::run_timers() {
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

inline ucx_clock::time_point ucx_impl::next_timer() const {
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

inline void ucx_impl::on_control(ucx_peer& p, const ucx_item& it) {
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
    std::fprintf(stderr, "ashl ucx: peer %u %s connected over %s (%s endpoint)\n", p.id, p.address.c_str(),
                 summarize(p.transports).c_str(), p.data_ep != nullptr ? "worker-address" : "sockaddr");
  }
  note(p.id, peer_event::connected, status{});
}

inline void ucx_impl::on_endpoint_error(ucx_peer& p, ucp_ep_h ep, ucs_status_t s) {
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

}  // namespace detail
}  // namespace transport
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_UCX()
