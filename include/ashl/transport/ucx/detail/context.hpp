// ashl/transport/ucx/detail/context.hpp — transport::ucx's UCP context and
// worker: creation (the bootstrap listener, the active-message handlers,
// the wakeup fd), teardown, wait() (UCX's fd and the bootstrap sockets in
// one poll), registered memory, and describing an endpoint.
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_UCX()

#include <ashl/transport/ucx/detail/impl.hpp>

#include <cstring>
#include <algorithm>
#include <poll.h>

ASHL_NAMESPACE_BEGIN
namespace transport {
namespace detail {

inline ucx_impl::~ucx_impl() {
  close_all(true);
  abandon_closes();
  for (ucx_item* it : queue_) release(*it);
  queue_.clear();
  for (auto& slot : pending_) drop_pending(slot);
  for (auto& l : lingering_) ::close(l.fd);  // their last frames were written (close_all)
  lingering_.clear();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (reserve_fd_ >= 0) ::close(reserve_fd_);
  flush_log(true);
  if (worker_address_ != nullptr) ucp_worker_release_address(worker_, worker_address_);
  for (auto& r : regions_) {
    if (r.memh != nullptr) ucp_mem_unmap(context_, r.memh);
  }
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

inline status ucx_impl::init() {
  ASHL_TRY(auth::check_token(params_.token, params_.insecure));
  // Every start of an unauthenticated process says so, where its operator
  // looks: insecure is for tests on a trusted machine.
  if (params_.token.empty())
    std::fputs("ashl: warning: running without authentication (--insecure / ASHL_INSECURE): any process that "
               "reaches the port can join\n",
               stderr);
  if (params_.retry_interval.count() <= 0) return invalid_argument("retry_interval", params_.retry_interval.count(), "must be > 0 ms");
  if (params_.max_pending_peers == 0) return invalid_argument("max_pending_peers", 0, "must be >= 1");
  if (params_.max_pending_per_address == 0) return invalid_argument("max_pending_per_address", 0, "must be >= 1");
  ucx_sockaddr listen_at;
  if (!params_.listen.empty()) {
    auto a = ucx_parse_address("listen", params_.listen);
    if (!a) return a.error();
    listen_at = *a;
  }
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
  // Every peer is sent this in its link (the data endpoint is made from it).
  s = ucp_worker_get_address(worker_, &worker_address_, &worker_address_length_);
  if (s != UCS_OK) return ucx_error("ucp_worker_get_address", s);
  if (worker_address_length_ == 0 || worker_address_length_ > ucx_max_control_data) {
    return ucx_error("ucp_worker_get_address", UCS_ERR_EXCEEDS_LIMIT);
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
  pollfds_.reserve(64);
  poll_owners_.reserve(64);
  for (std::size_t i = 0; i < n; ++i) {
    items_.push_back(std::make_unique<ucx_item>());
    free_items_.push_back(items_.back().get());
    slots_.push_back(std::make_unique<ucx_send_slot>());
    slots_.back()->owner = this;
    free_slots_.push_back(slots_.back().get());
  }
  // ashl's own listener (listener.hpp), never UCX's sockaddr connection
  // manager: nothing a peer sends before it authenticated reaches UCX.
  if (!params_.listen.empty()) ASHL_TRY(open_listener(listen_at));
  return {};
}

inline void ucx_impl::wait(std::chrono::microseconds timeout) {
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
      if (ucp_worker_progress(worker_) != 0 && has_ready_work()) {
        progressed_in_wait_ = true;
        return;
      }
    } while (ucx_clock::now() < until);
  }
  if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return;
  auto limit = timeout;
  const auto now = ucx_clock::now();
  if (auto next = next_timer(); next != ucx_clock::time_point::max()) {
    limit = std::min(limit, std::chrono::duration_cast<std::chrono::microseconds>(std::max(next - now, ucx_clock::duration::zero())));
  }
  // UCX's fd and the bootstrap sockets (the listener, connections being
  // set up, connected peers' goodbyes and deaths) in one poll.
  collect_fds(true);
  const auto ms = (limit.count() + 999) / 1000;
  if (::poll(pollfds_.data(), pollfds_.size(), static_cast<int>(std::min<std::int64_t>(ms, 1 << 30))) > 0) {
    for (std::size_t i = 0; i < pollfds_.size(); ++i) {
      if (pollfds_[i].revents != 0 && poll_owners_[i].kind != 0) sockets_ready_ = true;
    }
  }
}

// The lanes of the endpoint that carries the peer's data.
inline std::string ucx_impl::describe(peer_id id) const {
  const ucx_peer* p = find(id);
  if (p == nullptr) return {};
  if (p->data_ep != nullptr) return print_endpoint(p->data_ep);
  return p->transports;
}

inline result<memory_id> ucx_impl::register_memory(std::span<std::byte> region) {
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

inline void ucx_impl::deregister_memory(memory_id id) {
  if (id >= regions_.size() || regions_[id].memh == nullptr) return;
  ucp_mem_unmap(context_, regions_[id].memh);
  regions_[id] = ucx_region{};
}

inline const ucx_region* ucx_impl::region_of(const void* p, std::size_t n) const noexcept {
  const auto* b = static_cast<const std::byte*>(p);
  for (const auto& r : regions_) {
    if (r.memh != nullptr && b >= r.base && b + n <= r.base + r.size) return &r;
  }
  return nullptr;
}

inline std::string ucx_impl::print_endpoint(ucp_ep_h ep) {
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
inline std::string ucx_impl::summarize(const std::string& info) {
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

}  // namespace detail
}  // namespace transport
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_UCX()
