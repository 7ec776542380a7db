// ashl/rules/replication.hpp — one backup link of a shard, as a pure rule
// (docs/elastic.md §4.2-4.4): the primary's side (records appended with
// their index, bytes in flight bounded, acks, the worker-visible actions of
// each record held until the backup acknowledged it, CRC agreement, lag and
// silence drops) and the backup's side (records applied in index order with
// their recorded `now`, a gap or a repeat refused, acks produced). No I/O, no
// clock: every call takes the driver's `now`; the driver moves the record
// bytes (rules/core_events.hpp) and the acks (wire replica_ack) itself.
//
//   ashl::ps::replication_primary link({.workers = m});         // reserves every ring here
//   const std::uint64_t at = link.attach(now);                   // a backup: snapshot = core's save() at `at`
//   ...  // per event: recorded_core's callback encoded the record into `bytes`; the call ran into `out`
//   link.append(bytes.size(), core.version(), crc_or_0, now);    // record last_index(), sent to the backup
//   link.submit(link.last_index(), out, send);                   // sent now, or held until acked
//   ...  // on a replica_ack:
//   if (auto s = link.ack(a, now); !s) report(s);                // a drop names backup.crc, backup.lag_bytes...
//   link.release(send);                                          // the held actions the ack covers, in order
//   link.poll(now);                                              // a silent backup dropped after replica_timeout
//
//   ashl::ps::replication_backup<core_t> backup(core, workers);  // on the backup
//   backup.start_from(snapshot_bytes, at);                       // catch-up: the snapshot, then records after it
//   if (auto s = backup.receive(index, record); !s) ...          // a gap, a repeat, a corrupt record: refused by name
//   send(backup.ack());
//
// The rule of docs/elastic.md §4.3: the actions of record i (pull replies,
// acks, plans, errors) reach a worker only once the backup acknowledged
// record i, so a worker never holds an acknowledgement of a commit that the
// backup lacks. With no backup attached and nothing held, submit() sends at
// once (an unreplicated shard: today's behaviour, nothing copied). After a
// drop every held action is released in order and the link passes through
// until a new attach (a dropped backup is never trusted again without a new
// snapshot). What the driver does on a drop (raise its term, tell the
// workers, the majority rule of §4.4) is the driver's, not this rule's.
//
// No allocation per record in steady state: the record ring and the held
// actions' slots (each a server_actions reserved for `workers`) are made at
// construction; holding swaps the caller's actions with a free slot's (no
// copy). An error's text is built when the core refuses a call, as the core
// itself does.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/rules/core_events.hpp>
#include <ashl/rules/server_core_vocabulary.hpp>
#include <ashl/wire/bodies.hpp>
#include <ashl/wire/crc32c.hpp>

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <span>
#include <string>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

struct replication_params {
  // Record bytes sent and not yet acknowledged as received; past it the
  // backup is dropped (docs/elastic.md §4.4).
  std::uint64_t max_backup_lag_bytes = std::uint64_t{1} << 30;
  // Seconds a backup may leave records unacknowledged (§4.4: default 2 s).
  double replica_timeout = 2.0;
  // Records kept for agreement (until the backup's ack says it applied
  // them) and events whose actions wait for an ack: both rings are made
  // here; a backup that falls further behind is dropped as lagging.
  std::uint32_t max_records_in_flight = 65536;
  std::uint32_t max_held_events = 1024;
  // Each held slot's server_actions is reserved for this many workers.
  std::uint32_t workers = 0;
  // For the messages only.
  std::uint32_t shard = 0;

  [[nodiscard]] status validate() const {
    if (max_backup_lag_bytes == 0)
      return invalid_argument("replication.max_backup_lag_bytes", max_backup_lag_bytes, "must be at least 1");
    if (!(replica_timeout > 0.0))
      return invalid_argument("replication.replica_timeout", replica_timeout, "must be > 0 seconds");
    if (max_records_in_flight == 0)
      return invalid_argument("replication.max_records_in_flight", max_records_in_flight, "must be at least 1");
    if (max_held_events == 0)
      return invalid_argument("replication.max_held_events", max_held_events, "must be at least 1");
    return {};
  }
};

// Why the primary dropped its backup (counted per reason).
enum class backup_drop : std::uint8_t { lag = 0, crc = 1, timeout = 2, protocol = 3 };
inline constexpr std::size_t backup_drop_count = 4;

namespace detail {
// A CRC as 0x%08x, unquoted in a status message.
struct replication_crc {
  std::uint32_t v;
  [[nodiscard]] std::string str() const {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s = "0x00000000";
    for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(2 + i)] = digits[(v >> (28 - 4 * i)) & 0xfu];
    return s;
  }
  friend std::ostream& operator<<(std::ostream& os, replication_crc c) { return os << c.str(); }
};
}  // namespace detail

// The primary's side of one backup link.
class replication_primary {
 public:
  explicit replication_primary(const replication_params& p) : p_(p) {
    ASHL_ASSERT(p_.validate().ok(), "replication_params: validate() them first");
    records_.resize(p_.max_records_in_flight);
    held_.resize(p_.max_held_events);
    for (held_event& h : held_) h.actions.reserve(p_.workers);
  }

  // A backup attaches: it gets a snapshot (the core's save() bytes) taken
  // now, at the returned index (the last record so far), then every record
  // after it. Its silence is timed from `now`.
  std::uint64_t attach(double now) {
    ASHL_ASSERT(!attached_, "replication_primary: one backup per link");
    attached_ = true;
    snapshot_index_ = received_ = applied_ = last_;
    front_ = last_ + 1;
    in_flight_bytes_ = 0;
    snapshot_acked_ = false;
    waiting_since_ = now;
    return last_;
  }

  // Record last_index() + 1, of `bytes` bytes, made by an event after which
  // the primary's version is `version_after`; `crc_after` the CRC-32C of
  // that version's parameters (0: not computed), `state_crc` of its save()
  // bytes (0: not computed). Without a backup only the index advances. A
  // status that is not ok: the backup was dropped (lag) by this record.
  status append(std::size_t bytes, std::uint64_t version_after, std::uint32_t crc_after, double now,
                std::uint32_t state_crc = 0) {
    ++last_;
    if (!attached_) return {};
    if (last_ - front_ + 1 > records_.size())
      return drop(backup_drop::lag,
                  out_of_range("backup.records_in_flight", last_ - applied_,
                               "past replication.max_records_in_flight = " + std::to_string(p_.max_records_in_flight) +
                                   dropped()));
    record_meta& r = slot(last_);
    r = record_meta{bytes, version_after, crc_after, state_crc};
    if (!outstanding()) waiting_since_ = now;
    in_flight_bytes_ += bytes;
    if (in_flight_bytes_ > p_.max_backup_lag_bytes)
      return drop(backup_drop::lag,
                  out_of_range("backup.lag_bytes", in_flight_bytes_,
                               "past replication.max_backup_lag_bytes = " + std::to_string(p_.max_backup_lag_bytes) +
                                   dropped()));
    return {};
  }

  // The worker-visible actions of record `index` (the last appended): sent
  // now through send(index, actions) when no backup is attached and nothing
  // is held (or the backup already acknowledged `index`), else held (the
  // caller's `actions` swapped with a free slot's, cleared; actions sent at
  // once are left to the caller to clear). Empty actions
  // are never held. If the held ring is full the backup is dropped (lag),
  // everything held is sent in order, then these actions.
  template <class Send>
  void submit(std::uint64_t index, server_actions& actions, Send&& send) {
    ASHL_ASSERT(index == last_, "replication_primary::submit: the actions of the last record appended");
    if (!attached_) release(send);  // a drop left actions held: they go first, in order
    if (actions.empty()) return;
    if (n_held_ == 0 && (!attached_ || index <= received_)) {
      send(index, static_cast<const server_actions&>(actions));
      return;
    }
    if (n_held_ == held_.size()) {
      if (attached_)
        (void)drop(backup_drop::lag,
                   out_of_range("backup.held_events", n_held_,
                                "past replication.max_held_events = " + std::to_string(p_.max_held_events) +
                                    dropped()));
      release(send);
      send(index, static_cast<const server_actions&>(actions));
      return;
    }
    held_event& h = held_[(held_head_ + n_held_) % held_.size()];
    h.index = index;
    using std::swap;
    swap(h.actions, actions);  // no copy: the caller gets the slot's empty, reserved buffers
    actions.clear();
    ++n_held_;
  }

  // Sends the held actions the backup has acknowledged (all of them once no
  // backup is attached), in index order; returns how many.
  template <class Send>
  std::size_t release(Send&& send) {
    std::size_t k = 0;
    while (n_held_ > 0) {
      held_event& h = held_[held_head_];
      if (attached_ && h.index > received_) break;
      send(h.index, static_cast<const server_actions&>(h.actions));
      h.actions.clear();
      held_head_ = (held_head_ + 1) % held_.size();
      --n_held_;
      ++k;
    }
    return k;
  }

  // A replica_ack from the backup. Checks it (indices in order and within
  // what was sent; the backup's version, CRC and state CRC at `applied`
  // equal the primary's at that record where both are known): a status that
  // is not ok names what disagreed, and the backup is dropped.
  status ack(const wire::replica_ack_body& a, double now) {
    if (!attached_) return {};
    if (a.received > last_)
      return drop(backup_drop::protocol, out_of_range("backup.received", a.received,
                                                      "the primary's last record is " + std::to_string(last_) + dropped()));
    if (a.received < received_)
      return drop(backup_drop::protocol,
                  out_of_range("backup.received", a.received,
                               "went back from " + std::to_string(received_) + dropped()));
    if (a.applied > a.received || a.applied < applied_)
      return drop(backup_drop::protocol,
                  out_of_range("backup.applied", a.applied,
                               "must lie in [" + std::to_string(applied_) + ", received = " +
                                   std::to_string(a.received) + "]" + dropped()));
    if (a.applied >= front_) {
      const record_meta& r = slot(a.applied);
      if (a.version != r.version_after)
        return drop(backup_drop::crc, out_of_range("backup.version", a.version,
                                                   "at record " + std::to_string(a.applied) +
                                                       ": the primary's is " + std::to_string(r.version_after) + dropped()));
      if (a.crc != 0 && r.crc_after != 0 && a.crc != r.crc_after)
        return drop(backup_drop::crc,
                    make_error(errc::checksum_mismatch, "backup.crc", detail::replication_crc{a.crc},
                               "at version " + std::to_string(a.version) + ": the primary's is " +
                                   detail::replication_crc{r.crc_after}.str() + dropped()));
      if (a.state_crc != 0 && r.state_crc != 0 && a.state_crc != r.state_crc)
        return drop(backup_drop::crc,
                    make_error(errc::checksum_mismatch, "backup.state_crc", detail::replication_crc{a.state_crc},
                               "at record " + std::to_string(a.applied) + ", version " + std::to_string(a.version) +
                                   ": the primary's is " + detail::replication_crc{r.state_crc}.str() + dropped()));
    }
    if (a.received > received_ || !snapshot_acked_) waiting_since_ = now;  // progress: the silence restarts
    snapshot_acked_ = true;
    for (std::uint64_t i = received_ + 1; i <= a.received; ++i) in_flight_bytes_ -= slot(i).bytes;
    received_ = a.received;
    applied_ = a.applied;
    if (applied_ >= front_) front_ = applied_ + 1;  // agreement checked up to there: the entries are free
    return {};
  }

  // Drops a backup that has left records (or its snapshot) unacknowledged
  // for more than replica_timeout.
  status poll(double now) {
    if (!attached_ || !outstanding() || now - waiting_since_ <= p_.replica_timeout) return {};
    return drop(backup_drop::timeout,
                make_error(errc::timed_out, "backup.silent_seconds", now - waiting_since_,
                           "past replication.replica_timeout = " + std::to_string(p_.replica_timeout) +
                               " s with records unacknowledged (backup dropped; shard " + std::to_string(p_.shard) +
                               " runs without one)"));
  }

  // The driver lost the backup's link (its connection failed or closed):
  // dropped at once, counted as silence (a dead backup acks nothing).
  status lose(status why) {
    if (!attached_) return {};
    return drop(backup_drop::timeout, std::move(why));
  }

  [[nodiscard]] bool attached() const noexcept { return attached_; }
  [[nodiscard]] std::uint64_t last_index() const noexcept { return last_; }
  [[nodiscard]] std::uint64_t snapshot_index() const noexcept { return snapshot_index_; }
  [[nodiscard]] std::uint64_t received() const noexcept { return received_; }
  [[nodiscard]] std::uint64_t applied() const noexcept { return applied_; }
  [[nodiscard]] std::uint64_t bytes_in_flight() const noexcept { return in_flight_bytes_; }
  [[nodiscard]] std::size_t held_events() const noexcept { return n_held_; }
  [[nodiscard]] std::uint64_t drops(backup_drop why) const noexcept { return drops_[static_cast<std::size_t>(why)]; }
  // The last drop's reason (ok: never dropped).
  [[nodiscard]] const status& last_drop() const noexcept { return last_drop_; }
  [[nodiscard]] const replication_params& params() const noexcept { return p_; }

 private:
  struct record_meta {
    std::uint64_t bytes = 0, version_after = 0;
    std::uint32_t crc_after = 0, state_crc = 0;
  };
  struct held_event {
    std::uint64_t index = 0;
    server_actions actions;
  };

  // Built only when a drop is reported (an ack allocates nothing).
  [[nodiscard]] std::string dropped() const {
    return " (backup dropped; shard " + std::to_string(p_.shard) + " runs without one)";
  }

  record_meta& slot(std::uint64_t index) noexcept { return records_[index % records_.size()]; }
  [[nodiscard]] bool outstanding() const noexcept { return last_ > received_ || !snapshot_acked_; }

  status drop(backup_drop why, status s) {
    attached_ = false;
    in_flight_bytes_ = 0;
    ++drops_[static_cast<std::size_t>(why)];
    last_drop_ = s;
    return s;
  }

  replication_params p_;
  std::vector<record_meta> records_;  // records (front_ .. last_], by index modulo the size
  std::vector<held_event> held_;      // a ring: n_held_ from held_head_
  std::size_t held_head_ = 0, n_held_ = 0;
  bool attached_ = false, snapshot_acked_ = false;
  std::uint64_t last_ = 0, snapshot_index_ = 0, received_ = 0, applied_ = 0, front_ = 1;
  std::uint64_t in_flight_bytes_ = 0;
  double waiting_since_ = 0.0;
  std::uint64_t drops_[backup_drop_count] = {};
  status last_drop_;
};

// The primary's snapshot for a backup attaching (docs/elastic.md §4.2):
// the core's save() bytes into `out` (its capacity reused).
template <class Core>
void save_snapshot(Core& core, std::vector<std::byte>& out) {
  core.apply_pending();
  out.clear();
  state_writer w(out);
  core.save(w);
}

// The backup's side: applies the primary's records to its own core in
// index order, with the recorded `now`, and discards the core's actions
// (nobody to send them to; docs/elastic.md §4.2).
template <class Core>
class replication_backup {
 public:
  replication_backup(Core& core, std::size_t workers) : core_(&core), scratch_(workers) {}

  // Catch-up: the primary's snapshot taken at record `index`; records after
  // it follow. A corrupt or foreign snapshot is refused by the core's load
  // and changes nothing.
  status start_from(std::span<const std::byte> snapshot, std::uint64_t index) {
    state_reader in(snapshot);
    ASHL_TRY(core_->load(in));
    received_ = index;
    return {};
  }

  // Record `index` (header.sequence of its replicate message): refused
  // unless it is the next one, or when its bytes are corrupt
  // (decode_core_event names the field); nothing is applied then. want_crc:
  // the record asks for the version's CRC (the ack carries it), want_state:
  // for the CRC of the whole save() bytes.
  status receive(std::uint64_t index, std::span<const std::byte> record, bool want_crc = false,
                 bool want_state = false) {
    if (index != received_ + 1)
      return out_of_range("replicate.index", index,
                          "the backup expects record " + std::to_string(received_ + 1) +
                              (index <= received_ ? " (a repeated record)" : " (a gap: records arrive in index order)"));
    core_event e;
    ASHL_TRY(decode_core_event(record, e));
    replay(*core_, e, scratch_);
    scratch_.clear();
    received_ = index;
    last_now_ = e.now;
    crc_ = 0;
    state_crc_ = 0;
    if (want_crc) {
      const auto pinned = core_->pin_parameters(true);
      crc_ = pinned.crc;
      core_->unpin_parameters(pinned.version);
    }
    if (want_state) {
      save_snapshot(*core_, state_);
      state_crc_ = wire::crc32c(std::span<const std::byte>(state_));
    }
    return {};
  }

  // The ack of everything received so far (applied on receipt here: this
  // rule applies as it receives; a driver that acknowledges receipt before
  // applying sends `applied` behind `received`, docs/elastic.md §4.3).
  [[nodiscard]] wire::replica_ack_body ack() const noexcept {
    return {.received = received_, .applied = received_, .version = core_->version(), .crc = crc_,
            .state_crc = state_crc_};
  }
  [[nodiscard]] std::uint64_t last_index() const noexcept { return received_; }
  // The primary's `now` of the last record applied (0 before one): a
  // promoted backup's clock goes on from it (docs/elastic.md §4.1, "Time").
  [[nodiscard]] double last_now() const noexcept { return last_now_; }
  [[nodiscard]] Core& core() noexcept { return *core_; }

 private:
  Core* core_;
  server_actions scratch_;
  std::vector<std::byte> state_;
  std::uint64_t received_ = 0;
  double last_now_ = 0.0;
  std::uint32_t crc_ = 0, state_crc_ = 0;
};

// The backup's promotion rule (docs/elastic.md §4.5), pure: the driver
// hands it each worker's `failover` join (its rank and the term it knows),
// the link's state and the live set of the backup's replicated core, and
// asks whether to promote. A join carrying this backup's own term is a
// vote, remembered for `replica_timeout` seconds; a higher term says a
// primary went on without this backup: it is stale for good and never
// promotes; term 0 (a process that knows no term) and lower terms are no
// vote. Promotion needs the link to the primary down and votes from a
// majority of the ranks live in the replicated state (distinct ranks); with
// no live rank it never promotes by itself (nothing vouches that the
// primary did not go on alone). No allocation after construction.
//
//   ashl::ps::failover_votes votes(max_workers, replica_timeout);
//   switch (votes.join(rank, join.term, backup_term, now)) { ... }   // vote, stale, no_vote
//   if (votes.promote(core, link_down, now)) { ... }                  // term + 1, workers evicted, joins taken
enum class failover_vote : std::uint8_t { vote, stale, no_vote };

class failover_votes {
 public:
  failover_votes(std::uint32_t max_workers, double replica_timeout)
      : at_(max_workers, never), timeout_(replica_timeout) {}

  // A failover join of worker `w` that knows `term`; this backup is at `own`.
  failover_vote join(std::uint32_t w, std::uint32_t term, std::uint32_t own, double now) noexcept {
    if (term > own) {
      stale_ = true;
      stale_worker_ = w;
      stale_term_ = term;
      return failover_vote::stale;
    }
    if (term == 0 || term < own || w >= at_.size()) return failover_vote::no_vote;
    at_[w] = now;
    return failover_vote::vote;
  }

  // Votes of live ranks of `core` within replica_timeout of `now`.
  template <class Core>
  [[nodiscard]] std::uint32_t votes(const Core& core, double now) const noexcept {
    std::uint32_t n = 0;
    for (std::uint32_t w = 0; w < core.known_workers() && w < at_.size(); ++w)
      if (core.is_live(w) && at_[w] != never && now - at_[w] <= timeout_) ++n;
    return n;
  }
  // Whether to promote now: the link down, not stale, and a majority of the
  // core's live ranks voted.
  template <class Core>
  [[nodiscard]] bool promote(const Core& core, bool link_down, double now) const noexcept {
    const std::uint32_t live = core.live_count();
    return link_down && !stale_ && live > 0 && 2 * std::uint64_t{votes(core, now)} > live;
  }
  [[nodiscard]] bool stale() const noexcept { return stale_; }
  // The first stale join: its worker and term (for the one message).
  [[nodiscard]] std::uint32_t stale_worker() const noexcept { return stale_worker_; }
  [[nodiscard]] std::uint32_t stale_term() const noexcept { return stale_term_; }

 private:
  static constexpr double never = -1e300;
  std::vector<double> at_;  // per rank: when its last vote came
  double timeout_;
  bool stale_ = false;
  std::uint32_t stale_worker_ = 0, stale_term_ = 0;
};

}  // namespace ps
ASHL_NAMESPACE_END
