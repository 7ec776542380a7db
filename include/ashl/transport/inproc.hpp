// ashl/transport/inproc.hpp — an in-process model of transport::transport for
// unit tests of the parameter server and worker: nodes in one process (one
// thread each, or all on one thread) exchange messages through a shared
// fabric of thread-safe mailboxes (docs/transport.md, "inproc"; the concept
// is transport/concepts.hpp).
//
//   auto fabric = ashl::transport::inproc_fabric::create({.eager_bytes = 256, .deterministic = true});
//   auto server = fabric->node("server0");            // result<inproc>; listens on "server0"
//   auto worker = fabric->node();                     // connects only
//   auto p = worker->connect("server0");              // result<peer_id>, at once
//   while (!worker->is_connected(*p)) { server->progress(h); worker->progress(h); }
//   worker->send(*p, header, payload, /*cookie=*/1);   // on_sent(p, 1, ok) from a later progress()
//   fabric->fail("server0");                          // the worker sees on_peer(p, failed, why)
//
// Semantics (those of the concept, made exact here):
// - send() copies header and data into a fabric buffer at once, so the
//   caller may reuse its payload as soon as send() returns; on_sent reports
//   the completion from the sender's next progress() — at once, not after the
//   receiver took the message (this model has no rendezvous back-pressure).
//   A send to a peer that is already gone (its node killed or destroyed, or
//   the link closed by the other side before this side saw it) completes with
//   an error (errc::unavailable) and is counted in sends_failed.
// - A message whose data part is above eager_bytes asks the receiver's
//   receive_buffer(peer, header, n) first; a span shorter than n (empty =
//   refuse) drops the message and counts it in receives_refused; otherwise the
//   data is copied into that span and on_message gets a view of its first n
//   bytes. Smaller data is delivered from the fabric's buffer, valid during
//   on_message only.
// - connect(name) returns a peer id at once; connected (both sides) or failed
//   ("no inproc node named 'x'") comes from progress(). Nodes created with an
//   empty name cannot be connected to. There is no authentication: the fabric
//   is one process, trusted (auth_refused and unauthenticated_dropped stay 0).
// - close(p): this side reports on_peer(p, closed) from its next progress();
//   the other side reports closed after it received every message sent
//   before the close. Messages in flight towards a side that closed are
//   dropped. After on_peer(p, closed|failed) no handler call names p again.
// - kill() / fabric->fail(name) simulate a crash: the node stops calling its
//   handlers and every node linked to it (or connecting to it) reports
//   on_peer(p, failed, "inproc node 'x' failed (killed)"). Destroying a node
//   closes its links in order first.
// - Order. Each node has one FIFO mailbox; everything another node posts to
//   it (messages, connects, closes, failure notices) keeps the order of the
//   posting calls, so per-link order always holds. With deterministic = true
//   progress() delivers the mailbox in exactly that order: when all nodes are
//   driven from one thread (or their calls are otherwise serialised), the
//   sequence of handler calls is a function of the sequence of calls alone,
//   and running a test twice gives the same sequence. With deterministic =
//   false progress() interleaves different senders' messages in a random
//   order (per-sender order kept), as a real network may: code must not rely
//   on cross-peer order. In both modes one progress() delivers only what was
//   queued when it started (events caused by its own handler calls wait for
//   the next one), local completions and events first.
// - Threads: each node is driven by one thread (all its calls); different
//   nodes may run on different threads; fabric->node() and fabric->fail() may
//   be called from any thread. wait(d) sleeps on the node's condition
//   variable until something is queued for it or d passed.
// - No allocation per message in steady state: buffers come from size-class
//   free lists of the fabric and are reused; queues are intrusive lists or
//   vectors that keep their capacity. Errors (their messages) may allocate.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>
#include <ashl/transport/concepts.hpp>

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace transport {

struct inproc_params {
  std::size_t eager_bytes = 256;  // data parts above this go through receive_buffer()
  bool deterministic = false;     // mailbox order (true) or senders interleaved at random (false)
  // Every peer reports peer_on_this_host() (tests of the lanes that drop
  // their CRC, trust_local_lanes); false: none does.
  bool same_host = false;
};

class inproc;

namespace detail {

enum class inproc_kind : std::uint8_t { message, connect_request, connect_accept, close, node_gone };
enum class inproc_slot_state : std::uint8_t { connecting, connected, closed, failed };

struct inproc_node;

// One posted item; reused through the fabric's free lists.
struct inproc_entry {
  inproc_entry* next = nullptr;
  inproc_kind kind = inproc_kind::message;
  bool killed = false;             // node_gone: killed (true) or destroyed (false)
  unsigned size_class = 0;
  inproc_node* from = nullptr;     // the posting node
  peer_id to_peer = no_peer;       // the receiver's id for the sender
  peer_id from_peer = no_peer;     // the sender's id for the receiver
  std::size_t header_bytes = 0, data_bytes = 0;
  std::byte* buf = nullptr;        // header then data
  std::size_t capacity = 0;
};

struct inproc_slot {
  inproc_node* remote = nullptr;
  peer_id remote_peer = no_peer;   // the remote's id for this node; unknown while connecting
  inproc_slot_state state = inproc_slot_state::connecting;
};

struct inproc_node {
  std::string name;
  std::uint32_t index = 0;
  std::mutex mu;                   // guards the mailbox, alive, and writes to slots
  std::condition_variable cv;
  inproc_entry* head = nullptr;
  inproc_entry* tail = nullptr;
  bool alive = true;
  std::atomic<bool> killed{false};
  bool registered = true;          // guarded by the fabric's registry mutex
  std::vector<inproc_slot> slots;  // indexed by peer_id; the owner writes under mu, senders read under mu
};

}  // namespace detail

// The shared medium: the registry of nodes and the buffer pool. Create it
// with create(); every node keeps it alive.
class inproc_fabric : public std::enable_shared_from_this<inproc_fabric> {
  struct private_tag {};

 public:
  inproc_fabric(private_tag, inproc_params p) : params_(p) {}
  inproc_fabric(const inproc_fabric&) = delete;
  inproc_fabric& operator=(const inproc_fabric&) = delete;

  ~inproc_fabric() {
    for (auto& n : nodes_) release_list(std::exchange(n->head, nullptr));
    for (auto* head : free_)
      while (head) {
        auto* next = head->next;
        delete[] head->buf;
        delete head;
        head = next;
      }
  }

  static std::shared_ptr<inproc_fabric> create(inproc_params p = {}) {
    return std::make_shared<inproc_fabric>(private_tag{}, p);
  }

  [[nodiscard]] const inproc_params& params() const noexcept { return params_; }

  // A new node. A non-empty name is its address for connect(); a name in use
  // by a live node is an error.
  inline result<inproc> node(std::string_view name = {});

  // Simulates a crash of the live node named `name` (see inproc::kill()).
  status fail(std::string_view name) {
    detail::inproc_node* n = nullptr;
    {
      std::lock_guard lk(registry_mu_);
      n = find_locked(name);
    }
    if (!n) return make_error(errc::not_found, "inproc node", name, "no live inproc node of that name");
    gone(n, true);
    return {};
  }

 private:
  friend class inproc;
  static constexpr unsigned min_class = 6;  // 64 bytes
  static constexpr unsigned classes = 64;

  detail::inproc_node* find_locked(std::string_view name) {
    if (name.empty()) return nullptr;
    for (auto& n : nodes_)
      if (n->registered && n->name == name) return n.get();
    return nullptr;
  }

  detail::inproc_entry* acquire(std::size_t bytes) {
    const unsigned c = bytes == 0 ? 0 : std::max<unsigned>(min_class, std::bit_width(bytes - 1));
    ASHL_ASSERT(c < classes, "inproc message too large");
    {
      std::lock_guard lk(pool_mu_);
      if (auto* e = free_[c]) {
        free_[c] = e->next;
        e->next = nullptr;
        return e;
      }
    }
    auto* e = new detail::inproc_entry;
    e->size_class = c;
    if (c != 0) {
      e->capacity = std::size_t{1} << c;
      e->buf = new std::byte[e->capacity];
    }
    return e;
  }

  void release(detail::inproc_entry* e) {
    std::lock_guard lk(pool_mu_);
    e->next = free_[e->size_class];
    free_[e->size_class] = e;
  }

  void release_list(detail::inproc_entry* e) {
    while (e) {
      auto* next = e->next;
      release(e);
      e = next;
    }
  }

  // Appends to `to`'s mailbox; false (and `e` released) when `to` is gone.
  bool post(detail::inproc_node* to, detail::inproc_entry* e) {
    {
      std::lock_guard lk(to->mu);
      if (to->alive) {
        append_locked(to, e);
        e = nullptr;
      }
    }
    if (e) {
      release(e);
      return false;
    }
    to->cv.notify_one();
    return true;
  }

  static void append_locked(detail::inproc_node* to, detail::inproc_entry* e) {
    e->next = nullptr;
    if (to->tail) to->tail->next = e;
    else to->head = e;
    to->tail = e;
  }

  // The node stops: its mailbox is emptied, its name released, and every
  // other live node is told (it fails the links it still has to `n`).
  void gone(detail::inproc_node* n, bool killed) {
    detail::inproc_entry* dropped = nullptr;
    {
      std::lock_guard lk(n->mu);
      if (!n->alive) return;
      n->alive = false;
      if (killed) n->killed.store(true);
      dropped = std::exchange(n->head, nullptr);
      n->tail = nullptr;
    }
    n->cv.notify_all();
    release_list(dropped);
    std::vector<detail::inproc_node*> others;
    {
      std::lock_guard lk(registry_mu_);
      n->registered = false;
      for (auto& o : nodes_)
        if (o.get() != n && o->registered) others.push_back(o.get());
    }
    for (auto* o : others) {
      auto* e = acquire(0);
      e->kind = detail::inproc_kind::node_gone;
      e->killed = killed;
      e->from = n;
      post(o, e);
    }
  }

  inproc_params params_;
  std::mutex registry_mu_;
  std::vector<std::unique_ptr<detail::inproc_node>> nodes_;  // never shrinks: nodes are referenced by address
  std::mutex pool_mu_;
  std::array<detail::inproc_entry*, classes> free_{};
};

// One node of an inproc_fabric. Move-only; destroying it closes its links.
class inproc {
 public:
  using transport_concept = transport_tag;

  inproc(inproc&& o) noexcept { *this = std::move(o); }
  inproc& operator=(inproc&& o) noexcept {
    if (this != &o) {
      shutdown();
      fabric_ = std::move(o.fabric_);
      node_ = std::exchange(o.node_, nullptr);
      local_ = std::move(o.local_);
      work_ = std::move(o.work_);
      connected_ = std::move(o.connected_);
      buckets_ = std::move(o.buckets_);
      nonempty_ = std::move(o.nonempty_);
      rng_ = o.rng_;
      counters_ = o.counters_;
    }
    return *this;
  }
  inproc(const inproc&) = delete;
  inproc& operator=(const inproc&) = delete;
  ~inproc() { shutdown(); }

  [[nodiscard]] std::string_view name() const noexcept { return node_->name; }
  [[nodiscard]] inproc_fabric& fabric() const noexcept { return *fabric_; }

  result<peer_id> connect(std::string_view address) {
    if (killed()) return dead_error();
    detail::inproc_node* remote = nullptr;
    {
      std::lock_guard lk(fabric_->registry_mu_);
      remote = fabric_->find_locked(address);
    }
    const auto p = static_cast<peer_id>(node_->slots.size());
    {
      std::lock_guard lk(node_->mu);
      node_->slots.push_back({remote, no_peer, detail::inproc_slot_state::connecting});
    }
    if (remote) {
      auto* e = fabric_->acquire(0);
      e->kind = detail::inproc_kind::connect_request;
      e->from = node_;
      e->from_peer = p;
      if (fabric_->post(remote, e)) return p;
    }
    set_state(p, detail::inproc_slot_state::failed);
    local_.push_back({local_kind::peer, p, 0, peer_event::failed,
                      status(errc::not_found, "no inproc node named '" + std::string(address) + "'")});
    return p;
  }

  status send(peer_id p, std::span<const std::byte> header, std::span<const std::byte> data, std::uint64_t cookie) {
    if (header.size() > max_header_bytes)
      return out_of_range("inproc send: header bytes", header.size(), "must be <= 128 (max_header_bytes)");
    if (killed()) return dead_error();
    if (!is_connected(p))
      return make_error(errc::unavailable, "inproc send: peer", p, "is not connected");
    const auto& slot = node_->slots[p];
    auto* e = fabric_->acquire(header.size() + data.size());
    e->kind = detail::inproc_kind::message;
    e->from = node_;
    e->to_peer = slot.remote_peer;
    e->header_bytes = header.size();
    e->data_bytes = data.size();
    if (!header.empty()) std::memcpy(e->buf, header.data(), header.size());
    if (!data.empty()) std::memcpy(e->buf + header.size(), data.data(), data.size());
    bool posted = false;
    detail::inproc_node* to = slot.remote;
    {
      std::lock_guard lk(to->mu);
      // The far side may not have taken our connect_accept yet (its slot is
      // still connecting): the message queues behind the accept in its
      // mailbox and arrives once the link is connected there. Refusing it
      // would fail sends made right after on_peer(connected) (a race the
      // two-thread stream test hit under load).
      const auto far = to->slots[slot.remote_peer].state;
      if (to->alive &&
          (far == detail::inproc_slot_state::connected || far == detail::inproc_slot_state::connecting)) {
        inproc_fabric::append_locked(to, e);
        posted = true;
      }
    }
    if (posted) {
      to->cv.notify_one();
      ++counters_.messages_sent;
      counters_.bytes_sent += header.size() + data.size();
      local_.push_back({local_kind::sent, p, cookie, peer_event::connected, status{}});
    } else {
      fabric_->release(e);
      ++counters_.sends_failed;
      local_.push_back({local_kind::sent, p, cookie, peer_event::connected,
                        status(errc::unavailable, "inproc node '" + to->name + "' is gone or closed the link")});
    }
    return {};
  }

  template <handler H>
  std::size_t progress(H& h) {
    if (killed()) return 0;
    std::size_t calls = 0;
    work_.swap(local_);
    for (auto& ev : work_) {
      if (ev.kind == local_kind::sent) {
        h.on_sent(ev.peer, ev.cookie, ev.why);
      } else {
        count_peer_event(ev.event);
        h.on_peer(ev.peer, ev.event, ev.why);
      }
      ++calls;
    }
    work_.clear();

    detail::inproc_entry* list = nullptr;
    {
      std::lock_guard lk(node_->mu);
      list = std::exchange(node_->head, nullptr);
      node_->tail = nullptr;
    }
    if (fabric_->params_.deterministic) {
      while (list) {
        auto* next = list->next;
        calls += deliver(list, h);
        list = next;
      }
      return calls;
    }
    // Interleave senders at random, each sender's items in order.
    while (list) {
      auto* next = list->next;
      const auto src = list->from->index;
      if (src >= buckets_.size()) buckets_.resize(src + 1);
      auto& b = buckets_[src];
      list->next = nullptr;
      if (b.tail) b.tail->next = list;
      else {
        b.head = list;
        nonempty_.push_back(src);
      }
      b.tail = list;
      list = next;
    }
    while (!nonempty_.empty()) {
      const auto i = std::uniform_int_distribution<std::size_t>(0, nonempty_.size() - 1)(rng_);
      auto& b = buckets_[nonempty_[i]];
      auto* e = b.head;
      b.head = e->next;
      if (!b.head) {
        b.tail = nullptr;
        nonempty_[i] = nonempty_.back();
        nonempty_.pop_back();
      }
      calls += deliver(e, h);
    }
    return calls;
  }

  void wait(std::chrono::microseconds d) {
    if (!local_.empty()) return;
    std::unique_lock lk(node_->mu);
    node_->cv.wait_for(lk, d, [&] { return node_->head != nullptr || !node_->alive; });
  }

  [[nodiscard]] std::span<const peer_id> peers() const noexcept { return connected_; }

  [[nodiscard]] bool is_connected(peer_id p) const noexcept {
    return p < node_->slots.size() && node_->slots[p].state == detail::inproc_slot_state::connected;
  }
  [[nodiscard]] bool peer_on_this_host(peer_id p) const noexcept { return fabric_->params_.same_host && is_connected(p); }

  void close(peer_id p) {
    if (p >= node_->slots.size() || killed()) return;
    auto& slot = node_->slots[p];
    const auto s = slot.state;
    if (s != detail::inproc_slot_state::connected && s != detail::inproc_slot_state::connecting) return;
    // A connecting link learns the remote's id only from the accept; the
    // close notice is sent then (see deliver()).
    if (s == detail::inproc_slot_state::connected) post_close(slot);
    set_state(p, detail::inproc_slot_state::closed);
    erase_connected(p);
    local_.push_back({local_kind::peer, p, 0, peer_event::closed, status{}});
  }

  void close() {
    for (peer_id p = 0; p < node_->slots.size(); ++p) close(p);
  }

  [[nodiscard]] const transport_counters& counters() const noexcept { return counters_; }

  // Simulates a crash of this node (as fabric().fail(name()) does): its links
  // fail at the other side, it makes no more handler calls, and its sends
  // and connects return errors.
  void kill() { fabric_->gone(node_, true); }

 private:
  friend class inproc_fabric;
  enum class local_kind : std::uint8_t { sent, peer };
  struct local_event {
    local_kind kind;
    peer_id peer;
    std::uint64_t cookie;
    peer_event event;
    status why;
  };
  struct bucket {
    detail::inproc_entry* head = nullptr;
    detail::inproc_entry* tail = nullptr;
  };

  inproc(std::shared_ptr<inproc_fabric> f, detail::inproc_node* n)
      : fabric_(std::move(f)), node_(n), rng_(std::random_device{}()) {}

  [[nodiscard]] bool killed() const noexcept { return node_->killed.load(std::memory_order_relaxed); }
  [[nodiscard]] status dead_error() const {
    return status(errc::unavailable, "inproc node '" + node_->name + "' was killed");
  }

  void shutdown() {
    if (!node_) return;
    if (!killed()) close();
    fabric_->gone(node_, false);
    node_ = nullptr;
  }

  void set_state(peer_id p, detail::inproc_slot_state s) {
    std::lock_guard lk(node_->mu);
    node_->slots[p].state = s;
  }

  void erase_connected(peer_id p) {
    for (std::size_t i = 0; i < connected_.size(); ++i)
      if (connected_[i] == p) {
        connected_.erase(connected_.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
  }

  void post_close(const detail::inproc_slot& slot) {
    auto* e = fabric_->acquire(0);
    e->kind = detail::inproc_kind::close;
    e->from = node_;
    e->to_peer = slot.remote_peer;
    fabric_->post(slot.remote, e);
  }

  void count_peer_event(peer_event e) {
    switch (e) {
      case peer_event::connected: ++counters_.peers_connected; break;
      case peer_event::failed: ++counters_.peers_failed; break;
      case peer_event::closed: ++counters_.peers_closed; break;
    }
  }

  template <class H>
  std::size_t report_peer(H& h, peer_id p, peer_event e, const status& why) {
    count_peer_event(e);
    h.on_peer(p, e, why);
    return 1;
  }

  // One mailbox item: its handler calls (returned) and its buffer back to the pool.
  template <class H>
  std::size_t deliver(detail::inproc_entry* e, H& h) {
    using detail::inproc_kind;
    using detail::inproc_slot_state;
    std::size_t calls = 0;
    switch (e->kind) {
      case inproc_kind::message: {
        const peer_id p = e->to_peer;
        if (p >= node_->slots.size() || node_->slots[p].state != inproc_slot_state::connected) break;
        const std::span<const std::byte> header(e->buf, e->header_bytes);
        const std::size_t n = e->data_bytes;
        if (n > fabric_->params_.eager_bytes) {
          std::span<std::byte> dst = h.receive_buffer(p, header, n);
          ++calls;
          if (dst.size() < n) {
            ++counters_.receives_refused;
            break;
          }
          std::memcpy(dst.data(), e->buf + e->header_bytes, n);
          ++counters_.messages_received;
          counters_.bytes_received += e->header_bytes + n;
          h.on_message(p, header, std::span<const std::byte>(dst.data(), n));
        } else {
          ++counters_.messages_received;
          counters_.bytes_received += e->header_bytes + n;
          h.on_message(p, header, std::span<const std::byte>(e->buf + e->header_bytes, n));
        }
        ++calls;
        break;
      }
      case inproc_kind::connect_request: {
        const auto p = static_cast<peer_id>(node_->slots.size());
        {
          std::lock_guard lk(node_->mu);
          node_->slots.push_back({e->from, e->from_peer, inproc_slot_state::connected});
        }
        auto* a = fabric_->acquire(0);
        a->kind = inproc_kind::connect_accept;
        a->from = node_;
        a->to_peer = e->from_peer;
        a->from_peer = p;
        if (!fabric_->post(e->from, a)) {
          set_state(p, inproc_slot_state::failed);  // the requester died meanwhile: nothing to report
          break;
        }
        connected_.push_back(p);
        calls += report_peer(h, p, peer_event::connected, status{});
        break;
      }
      case inproc_kind::connect_accept: {
        const peer_id p = e->to_peer;
        auto& slot = node_->slots[p];
        if (slot.state == inproc_slot_state::connecting) {
          {
            std::lock_guard lk(node_->mu);
            slot.remote_peer = e->from_peer;
            slot.state = inproc_slot_state::connected;
          }
          connected_.push_back(p);
          calls += report_peer(h, p, peer_event::connected, status{});
        } else if (slot.state == inproc_slot_state::closed) {
          slot.remote_peer = e->from_peer;  // closed while connecting: close the far side now
          post_close(slot);
        }
        break;
      }
      case inproc_kind::close: {
        const peer_id p = e->to_peer;
        if (p < node_->slots.size() && node_->slots[p].state == inproc_slot_state::connected) {
          set_state(p, inproc_slot_state::closed);
          erase_connected(p);
          calls += report_peer(h, p, peer_event::closed, status{});
        }
        break;
      }
      case inproc_kind::node_gone: {
        for (peer_id p = 0; p < node_->slots.size(); ++p) {
          const auto& slot = node_->slots[p];
          if (slot.remote != e->from) continue;
          if (slot.state != inproc_slot_state::connected && slot.state != inproc_slot_state::connecting) continue;
          set_state(p, inproc_slot_state::failed);
          erase_connected(p);
          calls += report_peer(h, p, peer_event::failed,
                               status(errc::unavailable, "inproc node '" + e->from->name + "' failed (" +
                                                             (e->killed ? "killed" : "destroyed") + ")"));
        }
        break;
      }
    }
    fabric_->release(e);
    return calls;
  }

  std::shared_ptr<inproc_fabric> fabric_;
  detail::inproc_node* node_ = nullptr;
  std::vector<local_event> local_, work_;
  std::vector<peer_id> connected_;
  std::vector<bucket> buckets_;
  std::vector<std::uint32_t> nonempty_;
  std::minstd_rand rng_;
  transport_counters counters_;
};

inline result<inproc> inproc_fabric::node(std::string_view name) {
  detail::inproc_node* n = nullptr;
  {
    std::lock_guard lk(registry_mu_);
    if (find_locked(name))
      return make_error(errc::invalid_argument, "inproc node name", name, "is in use by a live node");
    auto owned = std::make_unique<detail::inproc_node>();
    owned->name = std::string(name);
    owned->index = static_cast<std::uint32_t>(nodes_.size());
    n = owned.get();
    nodes_.push_back(std::move(owned));
  }
  return inproc(shared_from_this(), n);
}

static_assert(transport<inproc>);

}  // namespace transport
ASHL_NAMESPACE_END
