// ashl/transport/ucx/detail/link.hpp — transport::ucx's link protocol, after
// the handshake: each side sends, over the bootstrap connection, the
// session key it expects in front of data and its UCP worker address, and
// data then goes over an endpoint made from the peer's address (shared
// memory on one host), keyed.
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_UCX()

#include <ashl/transport/ucx/detail/impl.hpp>

ASHL_NAMESPACE_BEGIN
namespace transport {
namespace detail {

// A control message in order with the data: on the data endpoint, keyed.
inline void ucx_impl::send_keyed_control(ucx_peer& p, ucx_control type) {
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
// and where our worker is. The key goes only over the bootstrap
// connection whose peer just proved it holds the token (or whose listener
// proved it does).
inline status ucx_impl::send_link(ucx_peer& p) {
  std::uint64_t key = 0;
  while (key == 0 || keys_.count(key) != 0) {
    auto n = auth::make_nonce();
    if (!n) return n.error();
    std::memcpy(&key, n->data(), sizeof key);
  }
  p.own_key = key;
  keys_.emplace(key, p.id);
  std::array<std::byte, ucx_key_bytes + bootstrap::link_flags_bytes> body{};
  std::memcpy(body.data(), &key, ucx_key_bytes);
  const bool peer_errors = !params_.address_endpoints || p.isolated;
  body[ucx_key_bytes] = std::byte{peer_errors ? bootstrap::link_peer_errors : std::uint8_t{0}};
  send_frame(p, bootstrap::frame_type::link,
             {body, std::span<const std::byte>(reinterpret_cast<const std::byte*>(worker_address_), worker_address_length_)});
  p.state = ucx_peer_state::linking;
  return {};
}

// The peer's link: its key, and an endpoint to its worker address (UCX
// picks the transports: shared memory on one host when UCX_TLS allows).
inline void ucx_impl::on_link(ucx_peer& p, std::span<const std::byte> body) {
  if (p.state != ucx_peer_state::linking) return;
  std::memcpy(&p.peer_key, body.data(), ucx_key_bytes);
  // Both ends' endpoints must have the same error handling (UCX refuses an
  // asymmetric pair): PEER when either side asked for it.
  p.peer_errors = !params_.address_endpoints || p.isolated ||
                  (static_cast<unsigned>(body[ucx_key_bytes]) & bootstrap::link_peer_errors) != 0;
  const auto address = body.subspan(ucx_key_bytes + bootstrap::link_flags_bytes);
  // UCP_ERR_HANDLING_MODE_NONE: with PEER, UCX 1.13 leaves out posix and
  // sysv (they lack peer-failure support) and picks TCP even on one host.
  // A dead peer is noticed by the end of its bootstrap connection, which
  // closes this endpoint and fails its pending sends (orphan_sends).
  ucp_ep_params_t ep = ep_params();
  ep.field_mask |= UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  if (!p.peer_errors) ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
  ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
  const ucs_status_t s = ucp_ep_create(worker_, &ep, &p.data_ep);
  if (s != UCS_OK) {
    p.data_ep = nullptr;
    return fail(p, status(errc::unavailable, "peer " + p.address +
                                                 ": cannot create an endpoint to its worker address: " +
                                                 ucx_status_name(s)));
  }
  ep_peer_[p.data_ep] = p.id;
  mark_connected(p);
}

}  // namespace detail
}  // namespace transport
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_UCX()
