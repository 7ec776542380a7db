// ashl/ps/server_replica.hpp — primary–backup replication of a shard over
// ashl's transport (docs/elastic.md §4.2-4.4): the primary's side of
// ps::server (server_params::take_backup) and the backup process,
// ps::server_backup. The rule itself (record indices, held actions, acks,
// agreement, lag and silence) is rules/replication.hpp; this file moves its
// bytes.
//
//   // the primary: ps::server as always, with take_backup
//   sp.take_backup = true;                     // replica_timeout, max_backup_lag_bytes, replica_state_check_seconds
//   auto primary = ashl::ps::server<T>::create(sp, policy, std::move(t0), init);
//   // the backup: the same server_params and policy, its own transport, the primary's address
//   auto backup = ashl::ps::server_backup<T>::create(sp, policy2, std::move(t1), "host:5000", init);
//   while (running) { primary->poll(); backup->poll(); }    // each in its own process in a real job
//
// The link: the backup connects to the primary (as a worker does, over the
// same transport and its authentication) and sends replica_hello (job,
// shard, servers, elements, its term); the primary refuses another job's or
// shard's hello by name (`replica_hello.shard = 1: this is shard 0`), else
// attaches it: a snapshot (server_core::save() bytes) in `replicate` pieces
// at the index of the last record, then every record (rules/core_events.hpp's
// bytes, one `replicate` message or several pieces each, with version_after
// and, when a state check is due, crc_after and the state-CRC flag). The
// backup applies each record on receipt and answers replica_ack. Each
// event's worker-visible actions (replies, acks, plans, errors) go out once
// the backup acknowledged that event's record (§4.3); without a backup
// attached they go at once, as on a server without take_backup.
//
// Differences from §4.2-4.4's text, as built (E10b): a record is encoded
// once (its commit payload copied into the record) and copied into a send
// slot (not sent from the receive buffer); the backup acknowledges after
// applying (applied == received), not before; pull replies read the
// version current when they are released (never older than the event's);
// the primary applies every commit as it arrives (apply_batch 1), so each
// record's version_after is the version after its own event; the snapshot's
// pieces go through the server's send slots, which keep their capacity.
//
// On a drop (CRC, version or protocol disagreement; lag; silence past
// replica_timeout; the link lost) the primary prints the reason once,
// counts it (telemetry backups_dropped_crc / backups_dropped_lag) and closes
// the backup's connection. While a majority of its live workers is
// connected it raises its term, sends shard_state (the new term, no backup)
// to every connected worker, releases every held action in order and runs
// on without a backup (a dropped backup attaches again only with a new
// hello and snapshot); otherwise it stops (§4.4): the held actions never
// go, every message is refused naming why, run() ends with
// server_end::backup_lost.
#pragma once

#include <ashl/ps/server.hpp>
#include <ashl/rules/replication.hpp>

#include <optional>

ASHL_NAMESPACE_BEGIN
namespace ps {

// A backup's hello, checked against this primary (job, servers, shard,
// the shard's elements, term): each refusal names the field.
inline status check_replica_hello(const wire::replica_hello_body& b, std::uint64_t job, std::uint32_t shard,
                                  std::uint32_t servers, std::uint64_t elements, std::uint32_t term) {
  if (job != 0 && b.job != job)
    return invalid_argument("replica_hello.job", job_id_text(b.job), "this primary runs job " + job_id_text(job));
  if (b.servers != servers)
    return invalid_argument("replica_hello.servers", b.servers, "this job has " + std::to_string(servers) + " servers");
  if (b.shard != shard) return invalid_argument("replica_hello.shard", b.shard, "this is shard " + std::to_string(shard));
  if (b.elements != elements)
    return invalid_argument("replica_hello.elements", b.elements,
                            "shard " + std::to_string(shard) + " holds " + std::to_string(elements) + " elements");
  if (b.term > term)
    return invalid_argument("replica_hello.term", b.term,
                            "this primary is at term " + std::to_string(term) +
                                " (a primary of a later term went on without this one)");
  return {};
}

namespace detail {

// The primary's link to its backup (one per server with take_backup).
struct replica_link {
  explicit replica_link(const replication_params& rp) : link(rp) {}
  replication_primary link;
  transport::peer_id peer = transport::no_peer;     // the backup's connection
  transport::peer_id closing = transport::no_peer;  // a dropped backup's, closed after the pass
  std::uint32_t term = 1;
  // The last recorded call, sent once it was made (its version known).
  std::vector<std::byte> record;
  bool pending = false;
  wire::replica_event event = wire::replica_event::tick;
  std::uint32_t rank = 0;
  std::vector<std::byte> state;  // snapshots and state checks (capacity kept)
  double next_state_check = 0.0;
  std::uint64_t piece_bytes = 0;
  // Dropped while most live workers were not connected (§4.4): stopped.
  bool stopped = false;
  std::string stop_text;
};

// The largest record piece of one replicate message for a shard whose
// messages are at most `max_payload` bytes.
inline std::uint64_t replicate_piece_bytes(std::uint64_t max_payload) noexcept {
  return std::min<std::uint64_t>(max_payload - wire::replicate_body::fixed_bytes, std::uint64_t{1} << 20);
}

}  // namespace detail

// --------------------------------------------------------- the primary

template <transport::transport Transport, sync::consistency_policy Policy>
inline status server<Transport, Policy>::check_replication(const server_params& p) {
  if (p.replica_timeout.count() <= 0)
    return invalid_argument("server.replica_timeout_ms", p.replica_timeout.count(), "must be > 0");
  ASHL_TRY(check_duration("server.replica_timeout_ms", p.replica_timeout));
  if (!(p.replica_state_check_seconds >= 0.0) || !(p.replica_state_check_seconds <= max_duration_seconds))
    return invalid_argument("server.replica_state_check_seconds", p.replica_state_check_seconds,
                            "must be in [0, 1000000000] seconds (0: never)");
  if (p.take_backup && p.apply_batch != 1)
    return invalid_argument("server.apply_batch", p.apply_batch,
                            "must be 1 with server.take_backup (each record carries the version after its own event)");
  return {};
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::start_replication() {
  const replication_params rp{
      .max_backup_lag_bytes = p_.max_backup_lag_bytes != 0
                                  ? p_.max_backup_lag_bytes
                                  : std::max(core_.params().store_bytes, server_params::min_default_backup_lag_bytes),
      .replica_timeout = std::chrono::duration<double>(p_.replica_timeout).count(),
      .workers = p_.core.max_workers,
      .shard = p_.core.shard};
  ASHL_ASSERT(rp.validate().ok(), "server: replication params");
  replica_ = std::make_unique<detail::replica_link>(rp);
  replica_->piece_bytes = detail::replicate_piece_bytes(p_.core.limits.max_payload_bytes);
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline std::uint32_t server<Transport, Policy>::term() const noexcept {
  return replica_ ? replica_->term : 1u;
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline bool server<Transport, Policy>::backup_attached() const noexcept {
  return replica_ && replica_->link.attached();
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline bool server<Transport, Policy>::replica_stopped() const noexcept {
  return replica_ && replica_->stopped;
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::refuse_stopped(transport::peer_id p) {
  send_error(p, errc::unavailable, 0, replica_->stop_text);
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline status server<Transport, Policy>::last_backup_drop() const {
  return replica_ ? replica_->link.last_drop() : status{};
}

// A call is about to be made: the previous one is complete (sent with its
// version), this one's bytes wait for it to be made.
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::replica_record(const core_event& e) {
  detail::replica_link& r = *replica_;
  replica_finalize(clock_.now());
  encode_core_event(e, r.record);
  r.pending = true;
  r.event = static_cast<wire::replica_event>(e.kind);
  r.rank = e.worker;
}

// The last recorded call was made: its record is numbered (and, with a
// backup attached, sent) with the version after it, and when a state check
// is due the CRCs of that version and of the whole state.
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::replica_finalize(double now) {
  detail::replica_link& r = *replica_;
  if (!r.pending) return;
  r.pending = false;
  if (core_.pending_applies() > 0) core_.apply_pending();
  const std::uint64_t version = core_.version();
  std::uint32_t crc = 0, state_crc = 0, flags = 0;
  if (r.link.attached() && p_.replica_state_check_seconds > 0.0 && now >= r.next_state_check) {
    r.next_state_check = now + p_.replica_state_check_seconds;
    const auto pinned = core_.pin_parameters(true);
    crc = pinned.crc;
    core_.unpin_parameters(pinned.version);
    save_snapshot(core_, r.state);
    state_crc = wire::crc32c(std::span<const std::byte>(r.state));
    flags |= wire::replicate_flag_state_crc;
  }
  const bool attached = r.link.attached();
  if (const status s = r.link.append(r.record.size(), version, crc, now, state_crc); !s) {
    replica_dropped(s);
    return;
  }
  if (attached) send_replicate(r.event, r.rank, r.link.last_index(), flags, version, crc, r.record);
}

// flush() with a backup: the actions of the events so far wait for the
// backup's ack of the last record (acks are cumulative, so the earlier
// events' records are acknowledged with it).
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::flush_replicated() {
  detail::replica_link& r = *replica_;
  if (r.stopped) {  // stopped: what was held, and anything since, never goes
    out_.clear();
    return;
  }
  replica_finalize(clock_.now());
  const bool attached = r.link.attached();
  r.link.submit(r.link.last_index(), out_, [this](std::uint64_t, const server_actions& a) { send_actions(a); });
  out_.clear();
  if (attached && !r.link.attached()) replica_dropped(r.link.last_drop());  // the held ring was full
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::send_replicate(wire::replica_event ev, std::uint32_t rank, std::uint64_t index,
                                                      std::uint32_t flags, std::uint64_t version_after,
                                                      std::uint32_t crc_after, std::span<const std::byte> record) {
  detail::replica_link& r = *replica_;
  const std::uint64_t total = record.size();
  for (std::uint64_t off = 0; off < total;) {
    const std::uint64_t n = std::min(r.piece_bytes, total - off);
    const wire::replicate_body b{.event = ev,
                                 .flags = flags,
                                 .version_after = version_after,
                                 .offset = off,
                                 .total = total,
                                 .crc_after = crc_after,
                                 .record = record.subspan(off, n)};
    if (!send_control(r.peer, wire::header{.rank = rank, .sequence = index, .clock = r.term}, b)) return;
    off += n;
  }
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::on_replica(transport::peer_id p, const wire::message_view& m, double now) {
  detail::replica_link& r = *replica_;
  const wire::header& h = m.header;
  if (h.kind == wire::message_kind::replica_hello) {
    const auto* b = m.template get<wire::replica_hello_body>();
    status s = check_replica_hello(*b, p_.job, p_.core.shard, p_.core.layout.servers(), core_.range().size(), r.term);
    if (s.ok() && (r.link.attached() || r.closing != transport::no_peer))
      s = make_error(errc::unavailable, "replica_hello.shard", b->shard,
                     "shard " + std::to_string(p_.core.shard) + " has a backup already (term " +
                         std::to_string(r.term) + ")");
    if (!s) {
      refuse_wire(wire_refusal::job);
      send_error(p, s.code(), h.sequence, s.message());
      return;
    }
    replica_finalize(now);  // the call before the hello is in the snapshot
    r.peer = p;
    const std::uint64_t at = r.link.attach(now);
    save_snapshot(core_, r.state);
    send_replicate(wire::replica_event::snapshot, 0, at, 0, core_.version(), 0, r.state);
    r.next_state_check = now + p_.replica_state_check_seconds;
    std::fprintf(stderr, "server %u: a backup attached at record %llu (term %u, %zu snapshot bytes)\n", p_.core.shard,
                 static_cast<unsigned long long>(at), r.term, r.state.size());
    send_shard_state();
    return;
  }
  // replica_ack
  if (p != r.peer || !r.link.attached()) {
    refuse_wire(wire_refusal::unexpected);
    send_error(p, errc::invalid_argument, h.sequence,
               "replica_ack: this connection is not shard " + std::to_string(p_.core.shard) + "'s backup");
    return;
  }
  if (const status s = r.link.ack(*m.template get<wire::replica_ack_body>(), now); !s) {
    replica_dropped(s);
    return;
  }
  r.link.release([this](std::uint64_t, const server_actions& a) { send_actions(a); });
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::replica_poll(double now) {
  detail::replica_link& r = *replica_;
  if (r.closing != transport::no_peer) {  // not from inside the transport's progress
    const transport::peer_id p = r.closing;
    r.closing = transport::no_peer;
    t_.close(p);
  }
  if (const status s = r.link.poll(now); !s) replica_dropped(s);
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::replica_lost(transport::peer_id p, const status& why) {
  detail::replica_link& r = *replica_;
  if (p == r.closing) r.closing = transport::no_peer;
  if (p != r.peer) return;
  r.peer = transport::no_peer;
  if (const status s = r.link.lose(make_error(errc::unavailable, "backup.link", "lost",
                                              why.message() + " (backup dropped; shard " +
                                                  std::to_string(p_.core.shard) + " runs without one)"));
      !s)
    replica_dropped(s);
}

// The backup is gone (the link already detached it). With a majority of
// the live workers connected, the term goes up, the workers are told
// (before the held actions, on their ordered channels), then the held
// actions go. Without one this primary stops, the held actions unsent: the
// backup may have taken over with the workers this primary cannot reach,
// and what it acknowledged must be what the backup holds (§4.4, §4.5).
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::replica_dropped(const status& why) {
  detail::replica_link& r = *replica_;
  std::fprintf(stderr, "server %u: %s\n", p_.core.shard, why.message().c_str());
  if (r.peer != transport::no_peer) {
    r.closing = r.peer;
    r.peer = transport::no_peer;
  }
  std::uint32_t connected = 0;
  for (std::uint32_t w = 0; w < core_.known_workers(); ++w) {
    const transport::peer_id p = rank_peer_[w];
    if (core_.is_live(w) && p != transport::no_peer && t_.is_connected(p) && !peer(p).failed) ++connected;
  }
  const std::uint32_t live = core_.live_count();
  if (live > 0 && 2 * std::uint64_t{connected} <= live) {
    r.stopped = true;
    r.stop_text = "server.backup: lost, and with it the majority of the workers (" + std::to_string(connected) +
                  " of " + std::to_string(live) + " connected): this primary stops; the backup may have taken over";
    std::fprintf(stderr, "server %u: %s\n", p_.core.shard, r.stop_text.c_str());
    return;
  }
  ++r.term;
  send_shard_state();
  r.link.release([this](std::uint64_t, const server_actions& a) { send_actions(a); });
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::send_shard_state() {
  for (std::uint32_t w = 0; w < rank_peer_.size(); ++w)
    if (rank_peer_[w] != transport::no_peer) send_shard_state(rank_peer_[w], w);
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::send_shard_state(transport::peer_id p, std::uint32_t w) {
  const detail::replica_link& r = *replica_;
  const wire::shard_state_body b{.term = r.term, .flags = r.link.attached() ? wire::shard_state_flag_backup : 0u};
  (void)send_control(p, wire::header{.rank = w, .clock = r.term}, b);
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::set_term(std::uint32_t term) noexcept {
  replica_->term = term;
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::replica_telemetry(server_telemetry& s) const {
  const replication_primary& l = replica_->link;
  s.backups_dropped_crc = l.drops(backup_drop::crc) + l.drops(backup_drop::protocol);
  s.backups_dropped_lag = l.drops(backup_drop::lag) + l.drops(backup_drop::timeout);
}

// ---------------------------------------------------------- the backup

// What a backup counted.
struct backup_telemetry {
  std::uint64_t records = 0;         // records applied
  std::uint64_t snapshots = 0;       // snapshots loaded
  std::uint64_t acks = 0;            // replica_acks sent
  std::uint64_t refused = 0;         // replicate messages or records refused (named in last_refusal())
  std::uint64_t joins_refused = 0;   // messages of workers (joins) refused: this is a backup
  std::uint64_t primary_errors = 0;  // errors the primary sent (a refused hello)
  std::uint64_t votes = 0;           // failover joins counted as votes (docs/elastic.md §4.5)
  std::uint64_t stale_joins = 0;     // failover joins of a higher term: this backup is stale
};

// A shard's backup process: its own core, fed the primary's records in
// order (replication_backup), acknowledging each on receipt; it refuses
// every worker's message (`join: server 0 (backup) is shard 0's backup
// (term 2); its primary is host:5000`, code unavailable: a worker failing
// over tries its other address). A join with the `failover` flag is a vote
// (failover_votes, rules/replication.hpp): once its link to the primary is
// down and a majority of the workers live in its state voted with its
// term, promoted() is true and the driver calls take_over(), which gives
// the shard's new primary, a ps::server at term + 1 (docs/elastic.md §4.5):
//
//   while (!backup->promoted()) backup->run_once(1ms);
//   auto primary = std::move(*backup).take_over();   // result<ps::server<T, Policy>>
//   primary->run(stop);
template <transport::transport Transport, sync::consistency_policy Policy = sync::any_policy>
class server_backup {
 public:
  using core_type = server_core<Policy>;

  // `p` as the primary's (its core's layout, shard, workers, optimizer,
  // limits; job); `primary` the primary's address, connected to at once
  // (the hello goes when the link is up).
  static result<server_backup> create(server_params p, Policy policy, Transport t, std::string primary,
                                      std::span<const float> initial = {}) {
    detail::bound_payload(p.core);
    auto core = core_type::create(p.core, std::move(policy), initial);
    if (!core) return core.error();
    p.core.max_workers = core->params().max_workers;
    // Isolated (transport::connect_isolated): a primary killed in the
    // middle of a record over shared memory would otherwise stall this
    // backup's receive FIFO, and with it every worker's failover join; a
    // backup killed in an ack, the primary's.
    auto peer = transport::connect_isolated(t, primary);
    if (!peer) return peer.error();
    // A primary whose host went down ends no connection: silent for twice
    // replica_timeout (keepalives come every second), its link counts as
    // failed (transport::fail_when_silent).
    transport::fail_when_silent(t, *peer, 2 * p.replica_timeout);
    server_backup b(std::move(p), std::make_unique<core_type>(std::move(*core)), std::move(t), std::move(primary));
    b.primary_ = *peer;
    return b;
  }

  server_backup(server_backup&&) noexcept = default;
  server_backup& operator=(server_backup&&) noexcept = default;

  // A primary that starts (or restarts) where its shard has a backup asks
  // the peer's address first (docs/elastic.md §4.5, "The old primary,
  // restarted"): a primary there (the backup promoted while this one was
  // down, at a higher term) takes its hello and sends its snapshot, and
  // this process is that primary's backup from then on (`backup`, caught
  // up). An unpromoted backup there refuses the hello (unavailable), and
  // nobody there within `bound` means this process is the primary:
  // `transport` is handed back for ps::server::create.
  struct peer_answer {
    std::optional<server_backup> backup;
    std::optional<Transport> transport;
  };
  static result<peer_answer> ask_peer(server_params p, Policy policy, Transport t, std::string peer,
                                      std::span<const float> initial, std::chrono::milliseconds bound) {
    auto b = create(std::move(p), std::move(policy), std::move(t), std::move(peer), initial);
    if (!b) return b.error();
    const auto until = std::chrono::steady_clock::now() + bound;
    while (!b->caught_up() && b->tel_.primary_errors == 0 && std::chrono::steady_clock::now() < until &&
           !(b->link_lost_ && !b->connected_))
      b->run_once(std::chrono::microseconds(1000));
    peer_answer a;
    if (b->caught_up()) {
      std::fprintf(stderr, "server %u: a primary at %s (term %u) took this server as its backup\n",
                   b->p_.core.shard, b->primary_address_.c_str(), b->term_);
      a.backup.emplace(std::move(*b));
      return a;
    }
    if (b->primary_ != transport::no_peer) b->t_.close(b->primary_);
    a.transport.emplace(std::move(b->t_));
    return a;
  }

  // One pass of the transport: records applied and acknowledged, workers
  // refused. Returns the handler calls made.
  std::size_t poll() {
    handler h{this};
    const std::size_t k = t_.progress(h);
    if (ack_due_) send_ack();
    const double now = clock_.now();
    if (hello_again_at_ > 0.0 && now >= hello_again_at_ && connected_ && !started_) {
      hello_again_at_ = 0.0;
      send_hello();
    }
    maybe_promote(now);
    return k;
  }
  std::size_t run_once(std::chrono::microseconds max_wait) {
    const std::size_t k = poll();
    if (k == 0) t_.wait(max_wait);
    return k;
  }

  [[nodiscard]] const core_type& core() const noexcept { return *core_; }
  // The last record held (the snapshot's index after a catch-up).
  [[nodiscard]] std::uint64_t last_index() const noexcept { return rb_.last_index(); }
  [[nodiscard]] bool caught_up() const noexcept { return started_; }
  [[nodiscard]] bool connected() const noexcept { return connected_; }
  [[nodiscard]] std::uint32_t term() const noexcept { return term_; }
  [[nodiscard]] const backup_telemetry& telemetry() const noexcept { return tel_; }
  // The promotion rule said yes (docs/elastic.md §4.5): take_over() now.
  [[nodiscard]] bool promoted() const noexcept { return promoted_; }
  // A failover join of a higher term came: this backup never promotes.
  [[nodiscard]] bool stale() const noexcept { return votes_.stale(); }
  // This backup's core, promoted: a ps::server at term + 1 on this
  // backup's transport (its listener: the workers' backup address), every
  // live worker evicted, joins taken (server::take_over). Only once
  // promoted().
  result<server<Transport, Policy>> take_over() && {
    ASHL_ASSERT(promoted_, "server_backup::take_over before promoted()");
    const double now = clock_.now();
    const double primary_now = rb_.last_now() + (now - last_record_at_);
    return server<Transport, Policy>::take_over(p_, std::move(*core_), std::move(t_), term_ + 1, primary_now,
                                                promoted_at_ - lost_at_, std::move(record_sink_));
  }
  // A log of this shard's core that goes on through a take-over (the chaos
  // test's replay, docs/elastic.md §5): `snapshot` with the core as each
  // snapshot left it (a catch-up; what follows replays from there), then
  // `sink` with each record this backup applied, decoded, in order; once
  // promoted, take_over() makes `sink` the new primary's record_core_calls
  // from its evictions on. Unset (the default), nothing is decoded twice.
  void record_core_calls(std::function<void(const core_type&)> snapshot, std::function<void(const core_event&)> sink) {
    snapshot_sink_ = std::move(snapshot);
    record_sink_ = std::move(sink);
  }
  // The last refusal (of a record, or the primary's of this backup's hello).
  [[nodiscard]] const status& last_refusal() const noexcept { return last_refusal_; }
  [[nodiscard]] Transport& transport() noexcept { return t_; }
  [[nodiscard]] const server_params& params() const noexcept { return p_; }
  // Tests and fault injection (the chaos test): each whole record (index,
  // bytes) before it is applied, to read or change.
  void inspect_records(std::function<void(std::uint64_t, std::vector<std::byte>&)> f) { inspect_ = std::move(f); }

 private:
  struct handler {
    server_backup* s;
    std::span<std::byte> receive_buffer(transport::peer_id, std::span<const std::byte>, std::size_t n) {
      return s->take_rx(n);
    }
    void on_message(transport::peer_id p, std::span<const std::byte> head, std::span<const std::byte> data) {
      s->on_message(p, head, data);
      s->give_rx(data);
    }
    void on_sent(transport::peer_id, std::uint64_t cookie, const status&) {
      if (cookie < s->tx_.size()) s->tx_[cookie].busy = false;
    }
    void on_peer(transport::peer_id p, transport::peer_event e, const status& why) { s->on_peer(p, e, why); }
    void on_receive_abandoned(transport::peer_id, std::span<std::byte> buffer) { s->give_rx(buffer); }
  };
  static_assert(transport::handler<handler>);

  server_backup(server_params p, std::unique_ptr<core_type> core, Transport t, std::string primary)
      : p_(std::move(p)),
        core_(std::move(core)),
        rb_(*core_, p_.core.max_workers),
        votes_(p_.core.max_workers, std::chrono::duration<double>(p_.replica_timeout).count()),
        primary_address_(std::move(primary)),
        t_(std::move(t)) {
    tx_.resize(16);
    rx_.resize(4);
    max_record_ = std::max<std::uint64_t>(p_.max_receive_bytes, 4 * (std::uint64_t{p_.core.max_workers} + 4) *
                                                                    p_.core.limits.max_payload_bytes);
  }

  std::span<std::byte> take_rx(std::size_t n) {
    if (n > p_.core.limits.max_payload_bytes + wire::header_bytes) return {};
    for (detail::pooled_buffer& b : rx_) {
      if (b.busy) continue;
      if (b.bytes.size() < n) b.bytes.resize(n);
      b.busy = true;
      return {b.bytes.data(), n};
    }
    return {};  // more receives in flight than buffers: refused, counted by the transport
  }
  void give_rx(std::span<const std::byte> data) {
    if (data.empty()) return;
    for (detail::pooled_buffer& b : rx_)
      if (b.busy && b.bytes.data() == data.data()) b.busy = false;
  }

  void on_peer(transport::peer_id p, transport::peer_event e, const status& why) {
    if (p != primary_) return;
    connected_ = e == transport::peer_event::connected;
    if (connected_) {
      send_hello();
    } else {
      if (!link_lost_) lost_at_ = clock_.now();
      link_lost_ = true;
      last_refusal_ = make_error(errc::unavailable, "backup.primary", primary_address_, "link " +
                                                                                  std::string(transport::to_string(e)) +
                                                                                  ": " + why.message());
    }
  }

  void on_message(transport::peer_id p, std::span<const std::byte> head, std::span<const std::byte> data) {
    auto m = wire::decode(head, data, p_.core.limits);
    if (!m) {
      refuse(m.error());
      if (p != primary_) send_error(p, m.error().code(), 0, m.error().message());
      return;
    }
    const wire::header& h = m->header;
    if (p != primary_) {  // a worker (or anyone else): this server is a backup
      if (const auto* j = m->template get<wire::join_body>(); j && (j->flags & wire::join_flag_failover) != 0)
        on_failover_join(h, *j);
      ++tel_.joins_refused;
      send_error(p, errc::unavailable, h.sequence,
                 std::string(wire::to_string(h.kind)) + ": server " + std::to_string(p_.core.shard) +
                     " (backup) is shard " + std::to_string(p_.core.shard) + "'s backup (term " +
                     std::to_string(term_) + "); its primary is " + primary_address_);
      return;
    }
    if (const auto* r = m->template get<wire::replicate_body>()) {
      on_replicate(h, *r);
      return;
    }
    if (const auto* e = m->template get<wire::error_body>()) {
      ++tel_.primary_errors;
      last_refusal_ = status(e->code, std::string(e->text));
      if (tel_.primary_errors == 1)
        std::fprintf(stderr, "server %u (backup): the primary refused it: %s\n", p_.core.shard,
                     last_refusal_.message().c_str());
      // Not a primary yet (it asks its own peer first as it starts, §4.5),
      // or a backup attached already: the hello goes again in a while.
      if (e->code == errc::unavailable && !started_) hello_again_at_ = clock_.now() + hello_retry_seconds;
      return;
    }
    // shard_state and anything else from the primary: nothing to do here.
  }

  void on_replicate(const wire::header& h, const wire::replicate_body& b) {
    if (h.clock < term_) {
      refuse(out_of_range("replicate.term", h.clock, "this backup knows term " + std::to_string(term_)));
      return;
    }
    term_ = static_cast<std::uint32_t>(h.clock);
    if (b.offset == 0) {
      if (b.total > max_record_) {
        refuse(out_of_range("replicate.total", b.total, "past this backup's bound of " + std::to_string(max_record_)));
        return;
      }
      index_ = h.sequence;
      event_ = b.event;
      total_ = b.total;
      filled_ = 0;
      if (record_.size() < total_) record_.resize(total_);
    } else if (h.sequence != index_ || b.event != event_ || b.total != total_ || b.offset != filled_) {
      refuse(out_of_range("replicate.offset", b.offset,
                          "the backup expects offset " + std::to_string(filled_) + " of record " +
                              std::to_string(index_) + " (" + std::to_string(total_) + " bytes)"));
      return;
    }
    std::memcpy(record_.data() + filled_, b.record.data(), b.record.size());
    filled_ += b.record.size();
    if (filled_ < total_) return;
    std::span<const std::byte> rec(record_.data(), total_);
    if (inspect_) {
      inspected_.assign(rec.begin(), rec.end());
      inspect_(index_, inspected_);
      rec = inspected_;
    }
    status s;
    if (event_ == wire::replica_event::snapshot) {
      s = rb_.start_from(rec, index_);
      if (s) {
        started_ = true;
        ++tel_.snapshots;
        if (snapshot_sink_) snapshot_sink_(*core_);
      }
    } else if (!started_) {
      s = out_of_range("replicate.index", index_, "a record before the snapshot");
    } else {
      s = rb_.receive(index_, rec, b.crc_after != 0, (b.flags & wire::replicate_flag_state_crc) != 0);
      if (s) {
        ++tel_.records;
        last_record_at_ = clock_.now();
        if (record_sink_) {
          core_event e;
          if (decode_core_event(rec, e)) record_sink_(e);  // applied, so it decodes
        }
      }
    }
    if (!s) {  // not acknowledged: the primary drops this backup after its replica_timeout
      refuse(s);
      return;
    }
    ack_due_ = true;
    send_ack();
  }

  // A worker lost the primary and asks this backup (docs/elastic.md §4.5):
  // a vote when it carries this backup's term; a higher term makes this
  // backup stale (said once); the promotion rule is asked at once.
  void on_failover_join(const wire::header& h, const wire::join_body& j) {
    if (!started_ || (p_.job != 0 && j.job != 0 && j.job != p_.job)) return;
    const double now = clock_.now();
    switch (votes_.join(h.rank, j.term, term_, now)) {
      case failover_vote::vote:
        ++tel_.votes;
        break;
      case failover_vote::stale:
        if (++tel_.stale_joins == 1)
          std::fprintf(stderr, "server %u (backup): stale: worker %u knows term %u, this backup term %u; not promoting\n",
                       p_.core.shard, h.rank, j.term, term_);
        break;
      case failover_vote::no_vote:
        break;
    }
    maybe_promote(now);
  }

  void maybe_promote(double now) {
    if (promoted_ || !started_ || !votes_.promote(*core_, link_lost_ && !connected_, now)) return;
    promoted_ = true;
    promoted_at_ = now;
    std::fprintf(stderr, "server %u (backup): primary lost; promoted at term %u after %.0f ms (%u of %u workers)\n",
                 p_.core.shard, term_ + 1, 1e3 * (now - lost_at_), votes_.votes(*core_, now), core_->live_count());
  }

  void refuse(const status& s) {
    ++tel_.refused;
    if (tel_.refused == 1)
      std::fprintf(stderr, "server %u (backup): refused: %s\n", p_.core.shard, s.message().c_str());
    last_refusal_ = s;
  }

  // A free send slot, or none (tx_.size() then): acks are cumulative, so a
  // later one covers one not sent.
  std::size_t free_tx() const noexcept {
    for (std::size_t i = 0; i < tx_.size(); ++i)
      if (!tx_[i].busy) return i;
    return tx_.size();
  }

  template <class Body>
  bool send_body(transport::peer_id p, wire::header h, const Body& body) {
    const std::size_t i = free_tx();
    if (i == tx_.size()) return false;
    detail::pooled_buffer& s = tx_[i];
    const std::size_t n = wire::encoded_size(body);
    if (s.bytes.size() < n) s.bytes.resize(n);
    auto used = wire::encode(h, body, std::span<std::byte>(s.bytes.data(), n), p_.core.limits);
    if (!used) return false;
    const std::span<const std::byte> all(s.bytes.data(), *used);
    if (!t_.send(p, all.first(wire::header_bytes), all.subspan(wire::header_bytes), i).ok()) return false;
    s.busy = true;
    return true;
  }

  void send_ack() {
    if (!connected_ || !started_) return;
    const wire::replica_ack_body a = rb_.ack();
    if (!send_body(primary_, wire::header{.sequence = a.received, .clock = term_}, a)) return;
    ack_due_ = false;
    ++tel_.acks;
  }

  void send_hello() {
    const wire::replica_hello_body b{.job = p_.job,
                                     .shard = p_.core.shard,
                                     .servers = p_.core.layout.servers(),
                                     .elements = core_->range().size(),  // the shard's (docs/wire-format.md)
                                     .term = term_,
                                     .have = rb_.last_index(),
                                     .version = core_->version(),
                                     .crc = 0};
    (void)send_body(primary_, wire::header{}, b);
  }

  void send_error(transport::peer_id p, errc code, std::uint64_t in_reply_to, std::string_view text) {
    const wire::error_body b{.code = code, .in_reply_to = in_reply_to, .text = text.substr(0, p_.core.limits.max_error_text)};
    (void)send_body(p, wire::header{}, b);
  }

  server_params p_;
  std::unique_ptr<core_type> core_;  // on the heap: rb_ points at it across moves
  replication_backup<core_type> rb_;
  failover_votes votes_;
  steady_clock clock_;
  bool link_lost_ = false, promoted_ = false;
  double lost_at_ = 0.0, promoted_at_ = 0.0, last_record_at_ = 0.0;
  static constexpr double hello_retry_seconds = 0.2;
  double hello_again_at_ = 0.0;  // > 0: a refused hello goes again then
  std::string primary_address_;
  transport::peer_id primary_ = transport::no_peer;
  bool connected_ = false, started_ = false, ack_due_ = false;
  std::uint32_t term_ = 0;
  // The record being assembled from its pieces.
  std::vector<std::byte> record_, inspected_;
  std::uint64_t index_ = 0, total_ = 0, filled_ = 0, max_record_ = 0;
  wire::replica_event event_ = wire::replica_event::tick;
  std::function<void(std::uint64_t, std::vector<std::byte>&)> inspect_;
  std::function<void(const core_type&)> snapshot_sink_;
  std::function<void(const core_event&)> record_sink_;
  std::vector<detail::pooled_buffer> rx_, tx_;
  backup_telemetry tel_{};
  status last_refusal_;
  Transport t_;  // last: closed first
};

}  // namespace ps
ASHL_NAMESPACE_END
