// ashl/transport/ucx/detail/delivery.hpp — transport::ucx's data path: sends
// and their completions, active messages as they arrive (recorded by the
// UCX callbacks, never handled there), rendezvous receives into the
// handler's buffer, and delivery to the handler in progress(), in arrival
// order per peer.
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_UCX()

#include <ashl/transport/ucx/detail/impl.hpp>

#include <utility>

ASHL_NAMESPACE_BEGIN
namespace transport {
namespace detail {

inline status ucx_impl::send(peer_id id, std::span<const std::byte> header, std::span<const std::byte> data,
                             std::uint64_t cookie) {
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

template <class H>
inline std::size_t ucx_impl::progress(H& h) {
  in_progress_ = true;
  std::size_t calls = 0;
  if (!std::exchange(progressed_in_wait_, false)) {
    for (int i = 0; i < 64 && ucp_worker_progress(worker_) != 0; ++i) {
    }
  }
  service_sockets();
  run_timers();
  reap_closes();
  calls += deliver_notes(h);
  calls += deliver_items(h);
  calls += deliver_completions(h);
  calls += deliver_notes(h);
  in_progress_ = false;
  return calls;
}

inline void ucx_impl::on_send_done(void* request, ucs_status_t s, void* user_data) {
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

inline void ucx_impl::on_recv_done(void* request, ucs_status_t s, std::size_t, void* user_data) {
  auto* item = static_cast<ucx_item*>(user_data);
  item->status = s;
  item->recv = s == UCS_OK ? ucx_recv_state::received : ucx_recv_state::failed;
  item->request = nullptr;
  ucp_request_free(request);
}

// Nothing is allocated for a message that is dropped: a rendezvous sender
// is told the data was refused, eager bytes are dropped where they lie.
inline ucs_status_t ucx_impl::drop(const ucp_am_recv_param_t* param) noexcept {
  return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 ? UCS_ERR_MESSAGE_TRUNCATED : UCS_OK;
}

// The unkeyed control id: nothing is sent on it since the handshake moved
// to the bootstrap connection; whatever comes is dropped and counted.
inline ucs_status_t ucx_impl::on_am(ucx_item_kind, const void*, std::size_t, void*, std::size_t,
                                    const ucp_am_recv_param_t* param) {
  ++counters_.unauthenticated_dropped;
  return drop(param);
}

// Data and keyed control: the sender is whoever holds the key in front of
// the header, which only an authenticated peer was told.
inline ucs_status_t ucx_impl::on_am_keyed(ucx_item_kind kind, const void* header, std::size_t header_length, void* data,
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

inline ucs_status_t ucx_impl::queue_am(ucx_item_kind kind, peer_id from, ucp_ep_h ep, const void* header,
                                       std::size_t header_length, void* data, std::size_t length,
                                       const ucp_am_recv_param_t* param) {
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

inline ucx_item* ucx_impl::take_item() {
  if (free_items_.empty()) {
    items_.push_back(std::make_unique<ucx_item>());
    free_items_.push_back(items_.back().get());
  }
  ucx_item* it = free_items_.back();
  free_items_.pop_back();
  *it = ucx_item{};
  return it;
}

inline ucx_send_slot* ucx_impl::take_slot() {
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

inline void ucx_impl::release(ucx_item& it) {
  if (it.held && it.recv == ucx_recv_state::queued && it.data != nullptr) ucp_am_data_release(worker_, it.data);
  it.held = false;
}

// Sends still in flight to a peer that failed or closed: UCX does not
// cancel those on a data endpoint without error handling, whose
// rendezvous would wait for the peer forever.
// Each is reported failed now; its slot is reused once UCX lets go of it.
inline void ucx_impl::orphan_sends(peer_id id) {
  for (auto& owned : slots_) {
    ucx_send_slot* slot = owned.get();
    if (slot->in_flight && !slot->orphaned && slot->peer == id) {
      slot->orphaned = true;
      slot->status = UCS_ERR_CANCELED;
      completions_.push_back(slot);
    }
  }
}

// Something progress() would hand to the handler now. A message queued
// behind a rendezvous receive of the same peer is not: waiting for that
// receive must sleep, not spin.
inline bool ucx_impl::has_ready_work() {
  if (!completions_.empty() || !notes_.empty() || sockets_ready_) return true;
  blocked_.clear();
  for (const ucx_item* it : queue_) {
    if (it->kind == ucx_item_kind::ep_error) return true;  // never held behind a receive (deliver_items)
    if (blocked(it->peer)) continue;
    if (it->ep == nullptr && it->kind != ucx_item_kind::ep_error && held_back(it->peer)) continue;
    if (it->recv != ucx_recv_state::receiving) return true;
    blocked_.push_back(it->peer);
  }
  return false;
}

// A keyed message from a peer whose own link (over the bootstrap connection)
// has not been handled yet waits for it: endpoints are not ordered.
inline bool ucx_impl::held_back(peer_id id) const noexcept {
  const ucx_peer* p = find(id);
  return p != nullptr && p->state == ucx_peer_state::linking;
}

template <class H>
inline std::size_t ucx_impl::deliver_notes(H& h) {
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
inline std::size_t ucx_impl::deliver_completions(H& h) {
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

template <class H>
inline std::size_t ucx_impl::deliver_items(H& h) {
  std::size_t calls = 0;
  blocked_.clear();
  held_.clear();
  // Items are appended only by UCX callbacks, i.e. inside
  // ucp_worker_progress, which nothing below calls; index-based anyway.
  for (std::size_t i = 0; i < queue_.size(); ++i) {
    ucx_item& it = *queue_[i];
    // An endpoint's failure is not a message in order: it is handled even
    // behind a receive of its peer still in transfer. Held back there, a
    // sender that died mid-upload was never failed (its receive never
    // ends), so the receive was never cancelled, let alone reclaimed.
    if (blocked(it.peer) && it.kind != ucx_item_kind::ep_error) continue;
    ucx_peer* p = find(it.peer);
    if (it.kind == ucx_item_kind::ep_error) {
      it.done = true;
      if (p != nullptr && it.ep != nullptr && p->data_ep == it.ep) {
        on_endpoint_error(*p, it.ep, it.status);
      }
      calls += deliver_notes(h);
      continue;
    }
    const bool keyed = it.ep == nullptr;
    if (p == nullptr || !keyed || p->state == ucx_peer_state::done) {
      if (it.recv == ucx_recv_state::receiving) {
        // UCX still owns the item and the buffer: kept until its callback
        // (its peer's later messages are dropped meanwhile, not held).
        // UCX 1.13 cannot cancel an active-message receive: the callback
        // comes when the sender goes on, and never when it died; such a
        // receive is counted stuck after close_timeout, and reclaimed after
        // receive_reclaim_timeout: the handler's on_receive_reclaimed gets
        // its buffer to return to its budget, keeping the memory (UCX still
        // holds the request, so the item is never reused either) until the
        // callback comes (on_receive_abandoned) or the transport is gone.
        const auto now = ucx_clock::now();
        if (!it.cancelled) {
          it.cancelled = true;
          it.cancelled_at = now;
          if (it.request != nullptr) ucp_request_cancel(worker_, it.request);
        } else if (!it.stuck && now - it.cancelled_at >= params_.close_timeout) {
          it.stuck = true;
          ++counters_.receives_stuck;
        }
        if (it.stuck && !it.reclaimed && !it.destination.empty() &&
            now - it.cancelled_at >= std::max(params_.receive_reclaim_timeout, params_.close_timeout)) {
          it.reclaimed = true;
          if constexpr (requires { h.on_receive_reclaimed(it.peer, it.destination); }) {
            ++counters_.receives_reclaimed;
            h.on_receive_reclaimed(it.peer, it.destination);
            ++calls;
          }
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

inline void ucx_impl::start_receive(ucx_item& it) {
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
inline void ucx_impl::cancel_receives(peer_id id) {
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
inline std::size_t ucx_impl::abandon(H& h, ucx_item& it) {
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

}  // namespace detail
}  // namespace transport
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_UCX()
