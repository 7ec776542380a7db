// ashl/ps/server_messages.hpp — what ps::server does with each message and
// peer event: decode and validate (wire::decode), bind a connection to its
// rank by the join, hand commits, pulls, leaves, metrics and measurements to
// server_core, and evict a peer that failed or fell silent.
//
//   #include <ashl/ps/server.hpp>   // includes this; the transport's handler calls on_message
//
// Definitions of server's members, out of the class so that ps/server.hpp
// reads as the driver's outline; docs/ps.md "Servers and workers",
// docs/design.md "Runtime contract for real runs".
#pragma once

#include <ashl/ps/server.hpp>

ASHL_NAMESPACE_BEGIN
namespace ps {

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::on_message(transport::peer_id p, std::span<const std::byte> head,
                                                  std::span<const std::byte> data) {
  const double now = clock_.now();
  ++tel_.messages_in;
  tel_.bytes_in += head.size() + data.size();
  // The pooled receive buffer the message lies in, or (no_rx) a commit
  // part received into its staging, whose slice is free to place again.
  const std::uint32_t rx = rx_of(data);
  const std::uint32_t from = p < peers_.size() ? peers_[p].rank : no_rank;
  if (rx == no_rx) unclaim_part(data, from);
  // Batched applies (server_params.apply_batch): a commit from a worker
  // not yet in the batch may join it; anything else is handled after the
  // batch was applied and answered, in the order it came.
  // (The header is not checked yet: a message that only says it is a
  // commit is refused by handle(), which ends the batch.)
  const bool commit = wire::peek_kind(head) == wire::message_kind::commit;
  if (!batch_workers_.empty() && (!commit || from == no_rank || in_batch(from))) end_batch(now);
  // A commit part lies in (or is copied into) its rank's staging, which
  // holds it: its receive buffer never waits with the batch. A part that
  // does not end its commit has no reply to wait for: it joins no batch
  // (so the worker's next part does not end the batch early).
  const bool part = commit && wire::peek_part(head).valid();
  const bool kept = p_.apply_batch > 1 && commit && !part && from != no_rank && rx != no_rx;
  const std::size_t waiting = core_.pending_applies();
  const std::uint64_t errors = tel_.errors_sent;
  const std::uint64_t ended_in_parts = tel_.commits_in_parts;
  handle(p, head, data, now, kept);
  const bool commit_ended = commit && (!part || tel_.commits_in_parts != ended_in_parts);
  if (core_.pending_applies() > waiting) {  // the commit waits in the batch (its receive buffer with it, if kept)
    batch_workers_.push_back(from);
    if (kept) {
      batch_rx_.push_back(rx);
    } else {
      release_rx(rx);
    }
  } else if (core_.pending_applies() == 0 && batch_workers_.empty()) {
    release_rx(rx);
  } else {
    if (commit_ended && from != no_rank && !in_batch(from)) batch_workers_.push_back(from);  // its reply waits too
    release_rx(rx);
  }
  if (batch_workers_.empty()) {
    flush(now);
  } else if (batch_workers_.size() >= p_.apply_batch || tel_.errors_sent != errors || !out_.plans().empty() ||
             !out_.errors().empty()) {
    end_batch(now);  // full, or something other than replies to send: in the order it came
  }
  // By commits: checked per message, so a checkpoint is never more than
  // checkpoint_every_commits behind (by seconds: in run_once).
  if (p_.checkpoint_every_commits > 0 && !p_.checkpoint_dir.empty() &&
      core_.stats().commits_applied - applied_at_checkpoint_ >= p_.checkpoint_every_commits) {
    end_batch(now);  // the checkpoint holds what was applied, and what was answered is in it
    start_checkpoint();
  }
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::handle(transport::peer_id p, std::span<const std::byte> head,
                                              std::span<const std::byte> data, double now, bool kept) {
  // server_core checks the message where it lies (check_message): the
  // CRC and, for a dense commit, its values (finite) chunk by chunk in one
  // pass, so validate() skips its own; where the apply would write beside
  // a version replies read, the add into a spare version in that pass too
  // (server_core_params::fuse_checks). Parameters still change only after
  // the whole message is verified and the policy decided.
  dense_value_check values;
  wire::limits lim = p_.core.limits;
  lim.unchecked_allowed = unchecked_lane(p);  // a trusted lane on this host: no CRC (flag `unchecked`)
  if (replica_stopped()) {  // ps/server_replica.hpp: this primary lost its backup and its majority
    refuse_stopped(p);
    return;
  }
  const std::uint32_t rank = peer(p).rank;
  auto m = core_.check_message(head, data, lim, rank, rank != no_rank && unchecked_lane(p), values);
  if (!m) {
    refuse_wire(wire_refusal::malformed);
    send_error(p, m.error().code(), 0, m.error().message());
    // A commit part that fails (its CRC, most likely) fails its commit:
    // what was staged is discarded, the rest of its parts dropped.
    if (const wire::peeked_part pp = wire::peek_part(head);
        pp.valid() && pp.kind == wire::message_kind::commit && peer(p).rank != no_rank) {
      commit_parts_in& cs = cparts_[peer(p).rank];
      drop_commit(cs, cs.active ? cs.head.sequence : pp.sequence);
    }
    return;
  }
  const wire::header& h = m->header;
  if ((h.flags & wire::flag_unchecked) != 0) ++tel_.unchecked_in;
  peer_state& ps = peer(p);
  if (h.kind == wire::message_kind::join) {
    on_join(p, ps, h, *m->template get<wire::join_body>(), now);
    return;
  }
  if (replica_ && (h.kind == wire::message_kind::replica_hello || h.kind == wire::message_kind::replica_ack)) {
    on_replica(p, *m, now);  // ps/server_replica.hpp
    return;
  }
  if (ps.rank == no_rank && ps.superseded_rank != no_rank) {
    refuse_wire(wire_refusal::stale);
    send_error(p, errc::invalid_argument, h.sequence,
               "join.incarnation = " + std::to_string(ps.incarnation) + ": stale: worker " +
                   std::to_string(ps.superseded_rank) + " joined again as incarnation " +
                   std::to_string(ps.superseded_by) + " from another connection (a later process of this rank)");
    return;
  }
  if (ps.rank == no_rank) {
    refuse_wire(wire_refusal::unbound);
    send_error(p, errc::invalid_argument, h.sequence,
               std::string("message.kind = ") + std::string(wire::to_string(h.kind)) +
                   ": this connection has not joined (send join first)");
    return;
  }
  if (h.rank != ps.rank) {
    refuse_wire(wire_refusal::rank);
    send_error(p, errc::invalid_argument, h.sequence,
               "header.rank = " + std::to_string(h.rank) + ": this connection joined as worker " +
                   std::to_string(ps.rank));
    return;
  }
  const std::uint32_t w = ps.rank;
  last_heard_[w] = now;
  switch (h.kind) {
    case wire::message_kind::commit: {
      if ((h.flags & wire::flag_part) != 0) {
        on_commit_part(p, w, h, m->payload, values.all_finite(), now);
        return;
      }
      to_core(w, h, m->payload, wire::header_bytes + data.size(), values.all_finite(), now, kept);
      return;
    }
    case wire::message_kind::pull_request:
      if (h.element_count != core_.range().size()) {
        refuse_wire(wire_refusal::element_count);
        send_error(p, errc::invalid_argument, h.sequence,
                   "pull_request.element_count = " + std::to_string(h.element_count) + ": server " +
                       std::to_string(p_.core.shard) + " holds " + std::to_string(core_.range().size()) +
                       " elements of the model's " + std::to_string(p_.core.layout.elements()) +
                       " (the worker's model differs from the server's)");
        return;
      }
      ack_only_[w] = 0;
      calls().pull(w, now, out_);
      return;
    case wire::message_kind::metric: {
      const auto* b = m->template get<wire::metric_body>();
      calls().metric(b->name, b->value, now, out_);
      return;
    }
    case wire::message_kind::measurements: {
      const auto* b = m->template get<wire::measurements_body>();
      for (ashl::measurement x : *b) calls().measurement(x, out_);
      return;
    }
    case wire::message_kind::leave:
      calls().leave(w, now, out_);
      unbind(p, ps);
      if (!left_[w]) {
        left_[w] = 1;
        ++left_count_;
      }
      return;
    case wire::message_kind::error:
      ++tel_.worker_errors;
      return;
    default:
      refuse_wire(wire_refusal::unexpected);
      send_error(p, errc::invalid_argument, h.sequence,
                 std::string("message.kind = ") + std::string(wire::to_string(h.kind)) +
                     ": a server does not take this kind");
      return;
  }
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::on_join(transport::peer_id p, peer_state& ps, const wire::header& h,
                                               const wire::join_body& b, double now) {
  const std::uint32_t w = h.rank;
  if (p_.job != 0 && b.job != 0 && b.job != p_.job) {
    refuse_wire(wire_refusal::job);
    send_error(p, errc::invalid_argument, h.sequence,
               "join.job = " + job_id_text(b.job) + ": this server (" + std::to_string(p_.core.shard) +
                   ") runs job " + job_id_text(p_.job) + ", a model of " +
                   std::to_string(p_.core.layout.elements()) + " elements, at most " +
                   std::to_string(p_.core.max_workers) + " workers, " + std::to_string(p_.core.layout.servers()) +
                   " servers (another job's server at this address, or the worker's model size, maximum of "
                   "workers (ASHL_MAX_WORKERS, else ASHL_NUM_WORKERS), server count or ASHL_JOB differ: the "
                   "job id derives from them)");
    return;
  }
  // The model's shape (docs/elastic.md §2.3, check 4; join body of wire
  // version 6): a worker that says its model size is refused at its join
  // when it differs, not at its first pull or commit. 0: not said.
  if (b.elements != 0 && b.elements != p_.core.layout.elements()) {
    refuse_wire(wire_refusal::element_count);
    send_error(p, errc::invalid_argument, h.sequence,
               "join.elements = " + std::to_string(b.elements) + ": this job's model has " +
                   std::to_string(p_.core.layout.elements()) + " elements");
    return;
  }
  // Ranks past the initial workers join up to the job's maximum
  // (docs/elastic.md §2.3, check 5); refused here, before the core.
  if (w >= p_.core.max_workers) {
    refuse_wire(wire_refusal::rank);
    send_error(p, errc::out_of_range, h.sequence,
               "join.rank = " + std::to_string(w) + ": this job admits at most " +
                   std::to_string(p_.core.max_workers) + " workers" +
                   (p_.core.max_workers == 0 ? std::string{" (ASHL_MAX_WORKERS)"}
                                             : " (ranks 0.." + std::to_string(p_.core.max_workers - 1) +
                                                   "; ASHL_MAX_WORKERS)"));
    return;
  }
  if (p_.max_incarnation_ahead.count() > 0) {
    const std::uint64_t ahead = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(p_.max_incarnation_ahead).count());
    const std::uint64_t now_inc = incarnation_now();
    if (b.incarnation > now_inc && b.incarnation - now_inc > ahead) {
      refuse_wire(wire_refusal::incarnation);
      send_error(p, errc::out_of_range, h.sequence,
                 "join.incarnation = " + std::to_string(b.incarnation) + ": more than server.max_incarnation_ahead = " +
                     std::to_string(p_.max_incarnation_ahead.count()) +
                     " s ahead of a time-based incarnation now (" + std::to_string(now_inc) +
                     " ns since the Unix epoch)");
      return;
    }
  }
  if (ps.rank != no_rank && ps.rank != w) {
    refuse_wire(wire_refusal::rank);
    send_error(p, errc::invalid_argument, h.sequence,
               "join.rank = " + std::to_string(w) + ": this connection joined as worker " + std::to_string(ps.rank));
    return;
  }
  // A smaller incarnation than the rank's is a process older than one
  // that joined: server_core refuses it (counted, named) and the refusal
  // goes back on this connection, which is bound to nothing.
  if (b.incarnation < core_.incarnation(w)) {
    calls().join(w, b.incarnation, now, out_, b.batch);
    for (const error_out& e : out_.errors()) send_error(p, e.code, h.sequence, e.text);
    out_.clear();
    return;
  }
  const transport::peer_id holder = rank_peer_[w];
  if (holder != transport::no_peer && holder != p) {
    if (t_.is_connected(holder) && !peer(holder).failed && b.incarnation <= core_.incarnation(w)) {
      refuse_wire(wire_refusal::rank_taken);
      send_error(p, errc::invalid_argument, h.sequence,
                 "join.rank = " + std::to_string(w) + ": worker " + std::to_string(w) +
                     " is connected already as incarnation " + std::to_string(core_.incarnation(w)) +
                     " (a restarted worker joins with a larger incarnation)");
      return;
    }
    peer_state& old = peer(holder);
    const bool superseded = b.incarnation > core_.incarnation(w);
    if (superseded) {  // a later process takes the rank
      old.superseded_rank = w;
      old.superseded_by = b.incarnation;
    }
    unbind(holder, old);  // the old connection no longer speaks for w
    if (superseded && t_.is_connected(holder) && !old.failed) {
      // Told now, not at its next message: it may be waiting for a pull
      // reply that will not come.
      refuse_wire(wire_refusal::stale);
      send_error(holder, errc::invalid_argument, 0,
                 "join.incarnation = " + std::to_string(old.incarnation) + ": stale: worker " + std::to_string(w) +
                     " joined again as incarnation " + std::to_string(b.incarnation) +
                     " from another connection (a later process of this rank)");
    }
  }
  const std::uint64_t joins_before = core_.stats().joins;
  calls().join(w, b.incarnation, now, out_, b.batch);  // the batch sizes its leases (docs/elastic.md §3.3)
  const bool refused = core_.stats().joins == joins_before && !core_.is_live(w);
  if (refused) return;
  if (ps.rank == no_rank) {
    ps.rank = w;
    ++bound_;
  }
  ps.incarnation = b.incarnation;
  ps.superseded_rank = no_rank;
  // A (re)join starts the rank's commits in parts afresh; receives in
  // flight into its staging keep their slices until they end, in a
  // staging the rank no longer uses.
  retire_staging(w);
  core_.forget_speculation(w);
  cparts_[w].active = false;
  cparts_[w].dropping = false;
  rank_peer_[w] = p;
  last_heard_[w] = now;
  if (!joined_once_[w]) {
    joined_once_[w] = 1;
    ++joined_count_;
    if (w < p_.core.workers) ++initial_joined_;
  }
  if (left_[w]) {  // it joins again: the job waits for its leave
    left_[w] = 0;
    --left_count_;
  }
  // The term, so that a failover join can carry it (docs/elastic.md §4.5).
  if (replica_) send_shard_state(p, w);
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::on_sent(transport::peer_id, std::uint64_t cookie, const status&) {
  const auto i = static_cast<std::uint32_t>(cookie);
  ASHL_ASSERT(i < slots_.size(), "server: a send completion for an unknown slot");
  send_slot& s = slots_[i];
  if (s.pinned) {
    core_.unpin_parameters(s.version);
    s.pinned = false;
  }
  free_slots_.give(i);
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::on_peer(transport::peer_id p, transport::peer_event e, const status& why) {
  if (e == transport::peer_event::connected) {
    peer(p) = peer_state{};  // a transport may reuse the id of a peer that is gone
    return;
  }
  end_batch(clock_.now());  // what came before the connection went is applied and answered first
  if (replica_) replica_lost(p, why);
  peer_state& ps = peer(p);
  ps.failed = true;
  if (e == transport::peer_event::failed) ++tel_.peers_failed;
  if (ps.rank != no_rank) {
    const std::uint32_t w = ps.rank;
    unbind(p, ps);
    calls().evict(w, clock_.now(), out_);
    flush(clock_.now());
  }
}

// server_params.worker_timeout: a live worker silent that long, whose
// pull the server does not hold, is evicted and its connection closed. A
// worker the policy counts from creation that never joined is silent
// since the server started.
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::evict_silent(double now) {
  if (p_.worker_timeout.count() == 0) return;
  const double limit = std::chrono::duration<double>(p_.worker_timeout).count();
  for (std::uint32_t w = 0; w < core_.known_workers(); ++w) {
    if (!core_.is_live(w) || core_.is_held(w) || now - last_heard_[w] <= limit) continue;
    if (heard_lately(rank_peer_[w], limit)) continue;
    ++tel_.evicted_silent;
    std::fprintf(stderr, "server %u: worker %u evicted: %s for %.1f s (worker_timeout %.1f s)\n", p_.core.shard, w,
                 joined_once_[w] ? "silent" : "never joined", now - last_heard_[w], limit);
    const transport::peer_id holder = rank_peer_[w];
    if (holder != transport::no_peer) {
      unbind(holder, peer(holder));
      peer(holder).failed = true;
    }
    calls().evict(w, now, out_);
    flush(now);
    if (holder != transport::no_peer) t_.close(holder);
  }
}

// The data ledger's clock (docs/elastic.md §3.3): the leases of a worker
// evicted ledger.give_back_after ago go back (and out, to whoever is short
// of leases). Called from run_once's housekeeping (every 50 ms at most),
// only while a worker's leases wait suspended, through calls() as every
// state-changing core call is (a record for a backup).
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::tick_ledger(double now) {
  const data_ledger& l = core_.ledger();
  if (!l.enabled()) return;
  bool waiting = false;
  for (worker_id w = 0; w < l.known_workers() && !waiting; ++w)
    waiting = l.state(w) == ledger_worker_state::suspended;
  if (!waiting) return;
  end_batch(now);
  calls().tick(now, out_);
  flush(now);
}

}  // namespace ps
ASHL_NAMESPACE_END
