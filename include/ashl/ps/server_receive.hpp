// ashl/ps/server_receive.hpp — ps::server's receive path: the pooled
// receive buffers under server_params.max_receive_bytes (a message over the
// bound is refused before it is received), commits that arrive in parts
// (staged, checked part by part, handed to server_core whole), the header to
// commit_in translation, and the batch of dense applies that keeps receive
// buffers until server_core::apply_pending().
//
//   #include <ashl/ps/server.hpp>   // includes this; the transport calls on_receive_buffer
//
// Definitions of server's members, out of the class so that ps/server.hpp
// reads as the driver's outline; docs/ps.md "Servers and workers".
#pragma once

#include <ashl/ps/server.hpp>

ASHL_NAMESPACE_BEGIN
namespace ps {

template <transport::transport Transport, sync::consistency_policy Policy>
inline std::span<std::byte> server<Transport, Policy>::on_receive_buffer(
    transport::peer_id p, std::span<const std::byte> head, std::size_t n) {
  if (n > p_.core.limits.max_payload_bytes || head.size() != wire::header_bytes) {
    refuse_wire(wire_refusal::oversized);
    send_error(p, errc::out_of_range, 0,
               "message.data_bytes = " + std::to_string(n) + ": exceeds this server's bound of " +
                   std::to_string(p_.core.limits.max_payload_bytes) + " bytes (not received)");
    return {};
  }
  if (peer(p).rank == no_rank) {  // a join is small: nothing large before it
    refuse_wire(wire_refusal::unbound);
    send_error(p, errc::invalid_argument, 0,
               "message.data_bytes = " + std::to_string(n) + ": this connection has not joined (not received)");
    return {};
  }
  // A part of a commit in parts lands in its rank's staging buffer at
  // the offset its (unchecked) header names, when it may (place_part);
  // anything else, to be refused by name once decoded, in a pooled buffer.
  if (const wire::peeked_part pp = wire::peek_part(head); pp.valid() && pp.kind == wire::message_kind::commit) {
    // The rank's last commit may wait in the batch, read from this
    // staging: applied before anything lands there (a worker sends its
    // next commit only after the reply, which waits for the batch, so
    // only a client that does not wait gets here).
    if (in_batch(peer(p).rank)) apply_held();
    commit_parts_in& cs = cparts_[peer(p).rank];
    const part_place at = place_part(cs, pp, n);
    if (!at.region.empty()) return at.region;
    if (at.drop) {  // the rest of a commit a refused part discarded: not received, not answered again
      ++tel_.commit_parts_dropped;
      return {};
    }
    if (at.over_budget) {
      refuse_staging(p, peer(p).rank, pp.sequence, "not received");
      drop_commit(cs, pp.sequence);
      return {};
    }
    if (at.past_window) {
      refuse_wire(wire_refusal::commit_part);
      send_error(p, errc::out_of_range, pp.sequence,
                 "commit_part.part = " + std::to_string(pp.part) + ": past the window of commit " +
                     std::to_string(pp.sequence) + " (part " + std::to_string(cs.next) + " due, " +
                     std::to_string(cs.live.claims) + " being received; a server holds " +
                     std::to_string(wire::max_parts_in_flight) +
                     " parts in flight, wire::max_parts_in_flight; not received)");
      drop_commit(cs, pp.sequence);
      return {};
    }
  }
  return take_rx(p, n);
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline auto server<Transport, Policy>::place_part(commit_parts_in& cs, const wire::peeked_part& pp,
                                                  std::size_t n) -> part_place {
  const std::uint64_t elements = core_.range().size();
  if (pp.element_count != elements || !(pp.type == dtype::f32 || pp.type == dtype::f16 || pp.type == dtype::bf16))
    return {};
  const std::size_t elem = size_of(pp.type);
  const wire::part_range pr = wire::part_elements(pp.element_count, pp.parts, pp.part);
  if (pr.count == 0 || pp.parts > wire::max_commit_parts || n != pr.count * elem) return {};
  if (!cs.active && cs.dropping && pp.sequence == cs.dropped_sequence && pp.part != 0) return {.drop = true};
  staging_area& st = cs.live;
  if (cs.active || st.claims > 0) {
    if (pp.sequence != cs.key_sequence || pp.parts != cs.key_parts || pp.type != cs.key_type) return {};
    if (cs.active && pp.part < cs.next) return {};  // checked already: a repeat, refused once decoded
  }
  const std::size_t off = pr.first * elem;
  if (st.claimed_at(off)) return {};  // being received: a repeat
  if (st.claims == wire::max_parts_in_flight || pp.part >= cs.next + wire::max_parts_in_flight)
    return {.past_window = true};
  if (!stage(st)) return {.over_budget = true};
  if (!cs.active && st.claims == 0) {
    cs.key_sequence = pp.sequence;
    cs.key_parts = pp.parts;
    cs.key_type = pp.type;
  }
  st.claimed[st.claims++] = off;
  return {.region = std::span<std::byte>(st.bytes).subspan(off, n)};
}

// A staging of the shard's dense f32 size, allocated once per rank (and
// once more per rejoin that raced a receive; retire_staging). Counted in
// server_params.max_receive_bytes with the receive buffers: false, and
// nothing allocated, where it would pass that beside the receives in
// flight and the other stagings.
template <transport::transport Transport, sync::consistency_policy Policy>
inline bool server<Transport, Policy>::stage(staging_area& st) {
  const std::uint64_t need = core_.range().size() * sizeof(float);
  if (st.bytes.size() >= need) return true;
  const std::uint64_t others = staging_bytes_ - st.bytes.size();
  if (rx_lent() + others + need > p_.max_receive_bytes) return false;
  give_up_idle_rx(others + need, p_.max_receive_bytes);
  staging_bytes_ += need - st.bytes.size();
  st.bytes.resize(need);
  return true;
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::refuse_staging(transport::peer_id p, std::uint32_t w, std::uint64_t sequence,
                                                      std::string_view what) {
  refuse_wire(wire_refusal::receive_budget);
  send_error(p, errc::unavailable, sequence,
             "server.max_receive_bytes = " + std::to_string(p_.max_receive_bytes) + ": worker " + std::to_string(w) +
                 "'s commits in parts need a staging of " + std::to_string(core_.range().size() * sizeof(float)) +
                 " bytes beside " + std::to_string(rx_lent()) + " held by receives in flight and " +
                 std::to_string(staging_bytes_) + " by other stagings (" + std::string(what) +
                 "; raise max_receive_bytes, or commit whole: worker.commit_part_bytes = 0)");
}

// A receive into a staging buffer was delivered or abandoned: its slice
// may be placed again. False when `data` lies in no staging buffer.
// `rank`: the sender's, if known, whose stagings are looked at first.
template <transport::transport Transport, sync::consistency_policy Policy>
inline bool server<Transport, Policy>::unclaim_part(std::span<const std::byte> data, std::uint32_t rank) {
  if (data.empty() || staging_bytes_ == 0) return false;  // no staging buffer exists
  if (rank < cparts_.size() && unclaim_part_of(cparts_[rank], data)) return true;
  for (std::size_t r = 0; r < cparts_.size(); ++r)
    if (r != rank && unclaim_part_of(cparts_[r], data)) return true;
  return false;
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline bool server<Transport, Policy>::unclaim_part_of(commit_parts_in& cs, std::span<const std::byte> data) {
  if (cs.live.holds(data.data())) {
    cs.live.unclaim(static_cast<std::size_t>(data.data() - cs.live.bytes.data()));
    return true;
  }
  for (std::size_t i = 0; i < cs.retired.size(); ++i) {
    staging_area& old = cs.retired[i];
    if (!old.holds(data.data())) continue;
    old.unclaim(static_cast<std::size_t>(data.data() - old.bytes.data()));
    if (old.claims == 0) {  // its last late receive ended: one is kept as a spare, the others freed
      const bool spare_kept = std::any_of(cs.retired.begin(), cs.retired.end(),
                                          [&](const staging_area& a) { return &a != &old && a.claims == 0; });
      if (spare_kept) {
        staging_bytes_ -= old.bytes.size();
        cs.retired.erase(cs.retired.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    return true;
  }
  return false;
}

// A (re)join of rank w: while receives from its old connection are still
// writing into its staging, that staging is retired (it stays until they
// end) and the rank's parts land in a spare or a new one from now on. So
// a part sent again is never refused as "being received", and a late
// write of the old connection can not touch a part that passed its CRC.
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::retire_staging(std::uint32_t w) {
  commit_parts_in& cs = cparts_[w];
  if (cs.live.claims == 0) return;
  if (in_batch(w)) apply_held();  // the rank's last commit may be read from there
  ++tel_.staging_retired;
  const auto spare = std::find_if(cs.retired.begin(), cs.retired.end(), [](const staging_area& a) { return a.claims == 0; });
  if (spare != cs.retired.end()) {
    std::swap(*spare, cs.live);
  } else {
    cs.retired.push_back(std::move(cs.live));
    cs.live = staging_area{};
  }
}

// The commit in progress is discarded (a part refused, the connection
// gone): the rest of commit `sequence`'s parts are dropped, counted, not
// answered again, until its part 0 comes again.
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::drop_commit(commit_parts_in& cs, std::uint64_t sequence) {
  core_.forget_speculation(static_cast<worker_id>(&cs - cparts_.data()));
  cs.active = false;
  cs.next = 0;
  cs.dropping = true;
  cs.dropped_sequence = sequence;
}

// A part of a commit in parts, decoded (its CRC and size for its index
// passed): it must be the next of the commit in progress, or part 0 of a
// new one; the commit goes to server_core whole once its last part passed
// (its exactly-once check, policy and apply unchanged).
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::on_commit_part(transport::peer_id p, worker_id w, const wire::header& h,
                                                      std::span<const std::byte> payload, bool finite, double now) {
  commit_parts_in& cs = cparts_[w];
  auto refuse = [&](std::string_view field, std::uint64_t value, const std::string& why) {
    refuse_wire(wire_refusal::commit_part);
    send_error(p, errc::invalid_argument, h.sequence, std::string(field) + " = " + std::to_string(value) + ": " + why);
    drop_commit(cs, cs.active ? cs.head.sequence : h.sequence);
  };
  // Built only for a refusal's text: once a sequence has 6 digits this
  // string no longer fits the small-string buffer, and every part would
  // allocate.
  auto of = [&] { return " of commit " + std::to_string(cs.head.sequence); };
  if (!cs.active) {
    if (cs.dropping && h.sequence == cs.dropped_sequence && h.part != 0) {  // part 0: sent again, afresh
      ++tel_.commit_parts_dropped;
      return;
    }
    if (h.part != 0)
      return refuse("commit_part.part", h.part,
                    "no commit in progress (commit " + std::to_string(h.sequence) + " in " +
                        std::to_string(h.parts) + " parts starts with part 0)");
    if (h.element_count != core_.range().size())
      return refuse("commit_part.element_count", h.element_count,
                    "server " + std::to_string(p_.core.shard) + " holds " + std::to_string(core_.range().size()) +
                        " elements (a commit in parts is dense)");
    if (!stage(cs.live)) {  // once per rank (eager parts come here first)
      refuse_staging(p, w, h.sequence, "not applied");
      drop_commit(cs, h.sequence);
      return;
    }
    cs.active = true;
    cs.dropping = false;
    cs.head = h;
    cs.next = 0;
    cs.bytes = 0;
    cs.finite = true;
    cs.key_sequence = h.sequence;
    cs.key_parts = h.parts;
    cs.key_type = h.type;
  } else {
    if (h.sequence != cs.head.sequence)
      return refuse("commit_part.sequence", h.sequence,
                    "commit " + std::to_string(cs.head.sequence) + " is in progress (part " + std::to_string(cs.next) +
                        " of " + std::to_string(cs.head.parts) + " due): a part of another commit");
    if (h.parts != cs.head.parts)
      return refuse("commit_part.parts", h.parts,
                    "earlier parts" + of() + " said " + std::to_string(cs.head.parts) + " (another split)");
    if (h.part < cs.next)
      return refuse("commit_part.part", h.part,
                    "repeated: parts 0.." + std::to_string(cs.next - 1) + of() + " passed");
    if (h.part > cs.next)
      return refuse("commit_part.part", h.part,
                    "out of order: part " + std::to_string(cs.next) + " of " + std::to_string(cs.head.parts) + of() +
                        " is due");
    if (h.clock != cs.head.clock || h.step != cs.head.step || h.samples != cs.head.samples ||
        h.flags != cs.head.flags || h.tensor != cs.head.tensor || h.type != cs.head.type ||
        h.element_count != cs.head.element_count)
      return refuse("commit_part.clock", h.clock,
                    "part " + std::to_string(h.part) + of() +
                        " differs from its part 0 in clock, step, samples, flags, tensor, dtype or element_count");
  }
  const std::size_t elem = size_of(h.type);
  const wire::part_range pr = wire::part_elements(h.element_count, h.parts, h.part);  // valid: decode checked it
  const std::span<std::byte> dst = std::span<std::byte>(cs.live.bytes).subspan(pr.first * elem, pr.count * elem);
  if (payload.data() != dst.data()) {  // eager, or received beside the staging: copied once, checked already
    if (cs.live.claimed_at(pr.first * elem))
      return refuse("commit_part.part", h.part, "repeated: another message of this part" + of() + " is being received");
    std::memcpy(dst.data(), payload.data(), dst.size());
  }
  cs.finite = cs.finite && finite;
  cs.bytes += wire::header_bytes + payload.size();
  ++cs.next;
  ++tel_.commit_parts;
  const std::span<const std::byte> staged = std::span<const std::byte>(cs.live.bytes).first(cs.head.element_count * elem);
  if (cs.next < cs.head.parts) {
    // Its add begins beside the parameters while the next parts land.
    if (p_.apply_parts_as_they_land && cs.finite)
      (void)core_.speculate(commit_of(w, cs.head, staged, cs.bytes, cs.finite, true), pr.first, pr.first + pr.count);
    return;
  }
  // Every part passed: the commit as if it had come whole.
  cs.active = false;
  ++tel_.commits_in_parts;
  // The staging holds it until this rank's next commit, which waits for
  // the batch to end: it may wait in the batch.
  to_core(w, cs.head, staged, cs.bytes, cs.finite, now, p_.apply_batch > 1);
}

// A commit (whole, or its parts' staging once all passed) to server_core.
// The samples a commit covers travel in its header (the worker's
// worker_cycle counted them); server_core bounds them.
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::to_core(worker_id w, const wire::header& h, std::span<const std::byte> payload,
                                               std::uint64_t bytes, bool values_checked, double now, bool kept) {
  const commit_in c = commit_of(w, h, payload, bytes, values_checked, kept);
  // A push (rules/commit_in.hpp, pull_acknowledged): its pull is answered
  // with a header-only acknowledgement when the policy releases it, not
  // with the parameters.
  if (c.pull) ack_only_[w] = c.ack_only ? 1 : 0;
  calls().commit(c, now, out_);
}

// The commit server_core gets from header h and its payload
// (rules/commit_in.hpp), with what this server knows of the payload.
template <transport::transport Transport, sync::consistency_policy Policy>
inline commit_in server<Transport, Policy>::commit_of(worker_id w, const wire::header& h,
                                                      std::span<const std::byte> payload, std::uint64_t bytes,
                                                      bool values_checked, bool kept) const {
  commit_in c = commit_in_of(h, w, core_.incarnation(w), payload, bytes);
  c.values_checked = values_checked;
  c.payload_kept = kept;
  c.reply_unchecked = w < rank_peer_.size() && unchecked_lane(rank_peer_[w]);  // its reply needs no CRC
  return c;
}

// A pooled receive buffer of n bytes within server_params.max_receive_bytes
// over all connections: the free buffer that fits best; idle capacity is
// given up before a message is refused.
template <transport::transport Transport, sync::consistency_policy Policy>
inline std::span<std::byte> server<Transport, Policy>::take_rx(transport::peer_id p, std::size_t n) {
  // Past the budget with the batch's buffers: they go back first, its commits applied.
  if (!batch_rx_.empty() && rx_lent() + staging_bytes_ + n > p_.max_receive_bytes) apply_held();
  std::uint64_t lent = 0;
  std::uint32_t pick = ~std::uint32_t{0};
  for (std::uint32_t i = 0; i < rx_.size(); ++i) {
    const std::size_t c = rx_[i].bytes.size();
    if (rx_[i].busy) {
      lent += c;
    } else if (pick == ~std::uint32_t{0} || (c >= n && (rx_[pick].bytes.size() < n || c < rx_[pick].bytes.size())) ||
               (c < n && rx_[pick].bytes.size() < n && c > rx_[pick].bytes.size())) {
      pick = i;
    }
  }
  // What the stagings of commits in parts leave of the budget.
  const std::uint64_t budget = p_.max_receive_bytes - std::min(staging_bytes_, p_.max_receive_bytes);
  if (lent + n > budget) {
    refuse_wire(wire_refusal::receive_budget);
    send_error(p, errc::unavailable, 0,
               "server.max_receive_bytes = " + std::to_string(p_.max_receive_bytes) + ": receives in flight hold " +
                   std::to_string(lent) + " bytes" +
                   (staging_bytes_ > 0 ? " and stagings of commits in parts " + std::to_string(staging_bytes_) : "") +
                   "; a message of " + std::to_string(n) + " bytes would pass it (not received)");
    return {};
  }
  // A buffer that must grow grows to the largest message taken so far
  // (within the budget), so messages of varying sizes (measurements
  // batches, commits) do not keep trading a buffer for a larger one: after
  // warm-up no receive allocates.
  rx_largest_ = std::max<std::uint64_t>(rx_largest_, n);
  const std::uint64_t want = lent + rx_largest_ <= budget ? rx_largest_ : n;
  const std::uint64_t grow = pick != ~std::uint32_t{0} && rx_[pick].bytes.size() >= n
                                 ? 0
                                 : want - (pick != ~std::uint32_t{0} ? rx_[pick].bytes.size() : 0);
  give_up_idle_rx(grow, budget, pick);
  if (pick == ~std::uint32_t{0}) {
    pick = static_cast<std::uint32_t>(rx_.size());
    rx_.emplace_back();
  } else {
    free_rx_.remove(pick);
  }
  detail::pooled_buffer& b = rx_[pick];
  if (b.bytes.size() < n || lent + b.bytes.size() > budget) {
    // want (n, or the largest message so far): the budget counts capacity.
    std::vector<std::byte> fresh(b.bytes.size() < n ? want : n);
    b.bytes.swap(fresh);
  }
  b.busy = true;
  b.used = n;
  return {b.bytes.data(), n};
}

// Idle pooled capacity is given up, buffer by buffer (all but `keep`),
// until the pool's capacity and `extra` more bytes fit `limit`.
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::give_up_idle_rx(std::uint64_t extra, std::uint64_t limit, std::uint32_t keep) {
  std::uint64_t total = rx_capacity();
  for (std::uint32_t i = 0; total + extra > limit && i < rx_.size(); ++i) {
    if (rx_[i].busy || i == keep || rx_[i].bytes.empty()) continue;
    total -= rx_[i].bytes.size();
    std::vector<std::byte>().swap(rx_[i].bytes);
  }
}

// The commits waiting in the batch are added (one pass) and their receive
// buffers go back to the pool; their replies still wait for end_batch.
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::apply_held() {
  core_.apply_pending();
  for (const std::uint32_t i : batch_rx_) {
    rx_[i].busy = false;
    free_rx_.give(i);
  }
  batch_rx_.clear();
}

// The batch ends: applied, then its replies sent, in the order they came.
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::end_batch(double now) {
  if (batch_workers_.empty() && core_.pending_applies() == 0) return;
  apply_held();
  batch_workers_.clear();
  flush(now);
}

// The pooled receive buffer that `data` lies in, if any, goes back.
// A receive buffer the engine still holds for a sender that is gone
// (six stalled 16 MiB uploads left every honest
// commit refused by max_receive_bytes until a restart): its memory is
// set aside (moved, so the engine's pointer stays valid; never reused,
// never freed while the engine may write into it) and its pool entry and
// budget are free again. At most max_receive_bytes aside: past that the
// receive stays lent, as before. A staging's slice (a commit in parts)
// stays claimed: its rank's staging is retired at its next join.
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::reclaim_rx(std::span<const std::byte> data) {
  const std::uint32_t i = rx_of(data);
  if (i == no_rx || aside_bytes_ + rx_[i].bytes.size() > p_.max_receive_bytes) {
    ++tel_.receives_not_reclaimed;
    return;
  }
  aside_bytes_ += rx_[i].bytes.size();
  aside_.push_back(std::move(rx_[i].bytes));
  rx_[i].bytes = {};
  rx_[i].used = 0;
  release_rx(i);
  ++tel_.receives_reclaimed;
  tel_.reclaimed_bytes = aside_bytes_;
}

// The engine let go of a buffer set aside: freed. False: not one of them.
template <transport::transport Transport, sync::consistency_policy Policy>
inline bool server<Transport, Policy>::release_aside(std::span<const std::byte> data) {
  if (data.empty() || aside_.empty()) return false;
  for (std::size_t k = 0; k < aside_.size(); ++k) {
    if (aside_[k].data() != data.data()) continue;
    aside_bytes_ -= aside_[k].size();
    aside_.erase(aside_.begin() + static_cast<std::ptrdiff_t>(k));
    tel_.reclaimed_bytes = aside_bytes_;
    return true;
  }
  return false;
}

}  // namespace ps
ASHL_NAMESPACE_END
