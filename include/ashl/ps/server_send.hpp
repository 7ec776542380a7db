// ashl/ps/server_send.hpp — ps::server's reply path: what server_core's
// actions say to send (pull replies from the pinned version, in parts when
// server_params.reply_part_bytes asks, acknowledgements of pushes, plans,
// the data ledger's leases, errors), over pooled send slots; a slot's version is unpinned when its send
// completes.
//
//   #include <ashl/ps/server.hpp>   // includes this; every event ends with flush()
//
// Definitions of server's members, out of the class so that ps/server.hpp
// reads as the driver's outline; docs/ps.md "Servers and workers".
#pragma once

#include <ashl/ps/server.hpp>

ASHL_NAMESPACE_BEGIN
namespace ps {

// Sends what the core's last event asked for (with a backup, once the
// backup acknowledged that event: ps/server_replica.hpp).
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::flush(double now) {
  (void)now;
  if (replica_) {
    flush_replicated();
    return;
  }
  send_actions(out_);
  out_.clear();
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::send_actions(const server_actions& a) {
  // Leases first: a worker holds the lease its commit asked for once its
  // pull completes (the sampler's next batch), not one message later.
  for (const ledger_lease& l : a.leases()) send_lease(l);
  for (worker_id w : a.pull_replies()) send_parameters(w);
  for (const plan_out& pl : a.plans()) send_plan(pl.worker, pl.plan);
  for (const error_out& e : a.errors())
    if (e.worker < rank_peer_.size() && rank_peer_[e.worker] != transport::no_peer)
      send_error(rank_peer_[e.worker], e.code, e.in_reply_to, e.text);
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline std::uint32_t server<Transport, Policy>::take_slot() {
  if (!free_slots_.empty()) return free_slots_.take();
  slots_.emplace_back();
  return static_cast<std::uint32_t>(slots_.size() - 1);
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::send_parameters(worker_id w) {
  const transport::peer_id p = rank_peer_[w];
  if (p == transport::no_peer) return;
  if (ack_only_[w]) {
    ack_only_[w] = 0;
    send_ack(p, w);
    return;
  }
  // Compressed replies (server_core_params::replies): what w's view lacks,
  // encoded into the slot's own buffer (its capacity kept: no allocation
  // once the slots are warm); or, for a worker without a view, the
  // parameters dense below, flagged as its new view.
  std::uint32_t extra_flags = 0;  // what the dense reply adds: flags `view`, `unchecked`
  if (core_.compresses_replies()) {
    const std::uint32_t i = take_slot();
    send_slot& s = slots_[i];
    if (s.body.size() < core_.max_reply_bytes()) s.body.resize(core_.max_reply_bytes());
    const auto r = core_.serve_reply(w, s.body);
    if (r.compressed) {
      const auto payload = std::span<const std::byte>(s.body).first(r.bytes);
      wire::header h{.kind = wire::message_kind::pull_reply,
                     .codec = p_.core.replies.codec,
                     .type = dtype::f32,
                     .flags = wire::flag_last_shard,
                     .element_count = core_.parameters().size(),
                     .tensor = p_.core.shard,
                     .rank = w,
                     .sequence = r.base,  // the view it applies to (docs/wire-format.md, pull_reply)
                     .clock = core_.version(),
                     .step = core_.serve_staleness(w)};
      const status st = wire::seal_header(h, payload, s.head, p_.core.limits);
      ASHL_ASSERT(st.ok(), "server: a compressed pull reply the wire refuses");
      (void)st;
      s.pinned = false;
      send(p, i, s.head, payload);
      ++tel_.pull_replies;
      ++tel_.compressed_replies;
      tel_.compressed_reply_bytes += r.bytes;
      return;
    }
    free_slots_.give(i);
    extra_flags = wire::flag_view;
  }
  // server_params.max_snapshots bounds the versions replies in flight pin.
  if (!core_.current_pinned() && core_.pinned_versions() >= p_.max_snapshots) {
    ++tel_.replies_refused;
    send_error(p, errc::unavailable, 0,
               "server.max_snapshots = " + std::to_string(p_.max_snapshots) +
                   ": that many parameter versions are pinned by pull replies still in flight (pulls faster than "
                   "replies are received); this pull is not answered");
    return;
  }
  // A trusted lane on this host: no CRC, and none computed for the version.
  const bool unchecked = unchecked_lane(p);
  if (unchecked) extra_flags |= wire::flag_unchecked;
  const auto pv = core_.pin_parameters(!unchecked);
  if (pv.first) ++tel_.snapshots;
  if (const std::uint32_t parts = wire::parts_for(pv.values.size(), sizeof(float), p_.reply_part_bytes); parts >= 2) {
    send_parameters_in_parts(p, w, pv, parts, extra_flags);
    return;
  }
  if (unchecked) ++tel_.unchecked_out;
  const std::uint32_t i = take_slot();
  send_slot& s = slots_[i];
  const auto payload = std::as_bytes(pv.values);
  wire::header h{.kind = wire::message_kind::pull_reply,
                 .codec = codec_id::identity,
                 .type = dtype::f32,
                 .flags = wire::flag_last_shard | extra_flags,
                 .element_count = pv.values.size(),
                 .tensor = p_.core.shard,
                 .rank = w,
                 .sequence = pv.version,
                 .clock = pv.version,
                 .step = core_.serve_staleness(w)};  // τ (docs/wire-format.md)
  const status st = wire::seal_header(h, payload.size(), pv.crc, s.head, p_.core.limits);
  ASHL_ASSERT(st.ok(), "server: a pull reply the wire refuses");
  (void)st;
  s.pinned = true;
  s.version = pv.version;
  send(p, i, s.head, payload);
  ++tel_.pull_replies;
}

// A reply in parts (server_params.reply_part_bytes): the parts' CRCs
// come with the pinned version (server_core::checksum_in_parts, set at
// creation: the same split as wire::part_elements), computed in the pass
// that computed the version's CRC; a core without them (a restored state
// of another size) has its parts checksummed here, one pass, counted in
// part_crc_passes. Each part's send pins the version (the first part's
// pin is pv's).
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::send_parameters_in_parts(transport::peer_id p, worker_id w,
                                                                const typename core_type::pinned_parameters& pv,
                                                                std::uint32_t parts, std::uint32_t extra_flags) {
  const bool unchecked = (extra_flags & wire::flag_unchecked) != 0;
  const bool own_pass = !unchecked && pv.range_crcs.size() != parts;
  if (own_pass) ++tel_.part_crc_passes;
  const std::uint64_t step = core_.serve_staleness(w);
  for (std::uint32_t j = 0; j < parts; ++j) {
    const wire::part_range pr = wire::part_elements(pv.values.size(), parts, j);
    const auto payload = std::as_bytes(pv.values.subspan(pr.first, pr.count));
    const std::uint32_t crc = unchecked ? 0u : own_pass ? wire::crc32c(payload) : pv.range_crcs[j];
    if (j > 0) (void)core_.pin_parameters();  // the same version: nothing applies between the parts
    const std::uint32_t i = take_slot();
    send_slot& s = slots_[i];
    wire::header h{.kind = wire::message_kind::pull_reply,
                   .codec = codec_id::identity,
                   .type = dtype::f32,
                   .flags = wire::flag_last_shard | wire::flag_part | extra_flags,
                   .element_count = pv.values.size(),
                   .tensor = p_.core.shard,
                   .rank = w,
                   .sequence = pv.version,
                   .clock = pv.version,
                   .step = step,
                   .part = static_cast<std::uint16_t>(j),
                   .parts = static_cast<std::uint16_t>(parts)};
    const status st = wire::seal_header(h, payload.size(), crc, s.head, p_.core.limits);
    ASHL_ASSERT(st.ok(), "server: a pull reply part the wire refuses");
    (void)st;
    s.pinned = true;
    s.version = pv.version;
    send(p, i, s.head, payload);
    ++tel_.reply_parts;
    if (unchecked) ++tel_.unchecked_out;
  }
  ++tel_.pull_replies;
}

// The acknowledgement of a push: a pull_reply of no elements and no
// payload (docs/wire-format.md), with the version and τ a reply carries.
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::send_ack(transport::peer_id p, worker_id w) {
  const std::uint32_t i = take_slot();
  send_slot& s = slots_[i];
  wire::header h{.kind = wire::message_kind::pull_reply,
                 .codec = codec_id::identity,
                 .type = dtype::f32,
                 .flags = wire::flag_last_shard,
                 .element_count = 0,
                 .tensor = p_.core.shard,
                 .rank = w,
                 .sequence = core_.version(),
                 .clock = core_.version(),
                 .step = core_.serve_staleness(w)};
  const status st = wire::seal_header(h, {}, s.head, p_.core.limits);
  ASHL_ASSERT(st.ok(), "server: an acknowledgement the wire refuses");
  (void)st;
  send(p, i, s.head, {});
  ++tel_.pull_replies;
  ++tel_.acks;
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::send_plan(worker_id w, const worker_plan& policy_plan) {
  const worker_plan plan = plan_with_codec_options(policy_plan, p_.compression, p_.compression_options, p_.compression_ratio);
  const transport::peer_id p = rank_peer_[w];
  if (p == transport::no_peer) return;
  wire::header h{.kind = wire::message_kind::plan_update,
                 .codec = plan_codec(plan, p_.compression),
                 .type = dtype::f32,
                 .rank = w,
                 .sequence = ++plan_sequence_,
                 .clock = core_.version()};
  if (!send_control(p, h, plan)) return;
  ++tel_.plans;
}

// A lease of the data ledger (docs/elastic.md §3.4): header.sequence is
// its number for the worker, the body adds the ledger's samples and
// shuffle_seed. A worker not connected now gets its outstanding leases
// again (flag `resent`) when it rejoins.
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::send_lease(const ledger_lease& l) {
  const transport::peer_id p = l.worker < rank_peer_.size() ? rank_peer_[l.worker] : transport::no_peer;
  if (p == transport::no_peer) return;
  const ledger_params& lp = core_.ledger().params();
  wire::header h{.kind = wire::message_kind::lease, .rank = l.worker, .sequence = l.number, .clock = core_.version()};
  if (send_control(p, h, wire::lease_body{.epoch = l.epoch, .begin = l.begin, .end = l.end, .samples = lp.samples,
                                          .shuffle_seed = lp.shuffle_seed, .flags = l.flags}))
    ++tel_.leases;
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::send_error(transport::peer_id p, errc code, std::uint64_t in_reply_to,
                                                  std::string_view text) {
  if (code == errc::ok) code = errc::internal;
  const std::size_t cap = p_.core.limits.max_error_text;
  wire::error_body b{.code = code, .in_reply_to = in_reply_to, .text = text.substr(0, cap)};
  wire::header h{.kind = wire::message_kind::error, .rank = p < peers_.size() && peers_[p].rank != no_rank ? peers_[p].rank : 0};
  if (send_control(p, h, b)) ++tel_.errors_sent;
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::send(transport::peer_id p, std::uint32_t slot, std::span<const std::byte> head,
                                            std::span<const std::byte> data) {
  const status st = t_.send(p, head, data, slot);
  if (!st.ok()) {  // not connected any more: the slot is free again
    send_slot& s = slots_[slot];
    if (s.pinned) {
      core_.unpin_parameters(s.version);
      s.pinned = false;
    }
    free_slots_.give(slot);
    return;
  }
  ++tel_.messages_out;
  tel_.bytes_out += head.size() + data.size();
}

}  // namespace ps
ASHL_NAMESPACE_END
