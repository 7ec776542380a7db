// ashl/ps/worker_send.hpp — ps::worker's send path: a commit (encoded by the
// plan's codec with error feedback, or sent from the caller's buffer where
// it lies), shard by shard and in parts when worker_params.commit_part_bytes
// asks, the pulls riding with it or alone, measurements, metrics and leave,
// over pooled send slots.
//
//   #include <ashl/ps/worker.hpp>   // includes this; worker::commit() calls state::commit()
//
// Definitions of worker::state's members, out of the class so that
// ps/worker.hpp reads as the driver's outline; docs/ps.md "Servers and
// workers".
#pragma once

#include <ashl/ps/worker.hpp>

ASHL_NAMESPACE_BEGIN
namespace ps {

template <transport::transport Transport>
inline status worker<Transport>::state::commit(std::span<const float> update, bool ack_only) {
  if (!failed.ok()) return failed;
  if (update.size() != params.size())
    return invalid_argument("worker.commit.update.size", update.size(),
                            "must be the model's " + std::to_string(params.size()) + " elements");
  if (committing) return invalid_argument("worker.commit", "pending", "the last commit is not complete: wait() first");
  if (p.flip_replies) {
    // The pull's replies land in the buffer that is not the parameters: an
    // update there would be overwritten while it is sent (a push's too: a
    // server may answer it with its parameters).
    const std::span<const float> l = landing();
    if (update.data() < l.data() + l.size() && l.data() < update.data() + update.size())
      return invalid_argument("worker.commit.update", "in the landing buffer",
                              "with flip_replies the update must not lie in the buffer the pull lands in (the one "
                              "that is not parameters() now)");
  }
  if (cycle.state() != worker_cycle::phase::compressing && cycle.state() != worker_cycle::phase::sending)
    return invalid_argument("worker.commit.iterations", cycle.iterations(),
                            "the plan's cycle is not complete: call iteration_done() until it returns true");
  // Every shard's part, before any is encoded or sent: refused whole,
  // nothing changed (the cycle stays complete: commit a fixed update).
  // A shard sent whole from the caller's buffer (dense, no residual owed,
  // not in parts) has its CRC-32C computed in the check's pass: its seal
  // does not read the payload again (docs/perf/ps-passes.md, "Fused on
  // the worker").
  const bool compressing = cycle.compresses() && encoder.compresses();
  const bool as_checked = !compressing && !encoder.owes();
  check_parts.clear();
  for (std::uint32_t s = 0; s < servers(); ++s) {
    const key_range r = layout.range(s);
    crc_known[s] = as_checked && dense_parts(s) == 0 && !unchecked_lane(s);
    check_parts.push_back({.payload = std::as_bytes(update.subspan(r.begin, r.size())),
                           .element_count = r.size(),
                           .model_begin = r.begin,
                           .crc = crc_known[s] ? &commit_crc[s] : nullptr});
  }
  ASHL_TRY(check_commit_parts(check_parts, {.allow_non_finite = p.allow_non_finite}));
  double now = clock.now();
  iterations_total += cycle.iterations();
  std::uint64_t bytes = 0;
  if (compressing) {
    for (std::uint32_t s = 0; s < servers(); ++s) {
      const key_range r = layout.range(s);
      auto payload = encoder.encode(s, update.subspan(r.begin, r.size()), iterations_total);
      if (!payload) return payload.error();
      enc[s] = *payload;
      bytes += enc[s].size();
    }
    const double t1 = clock.now();
    tel.compress_seconds += t1 - now;
    now = t1;
    cycle.compressed(now, static_cast<double>(bytes));
  } else {
    // Dense: the caller's buffer itself, unless compressed commits left a
    // residual, which this commit pays off (commit_encoder::dense).
    for (std::uint32_t s = 0; s < servers(); ++s) {
      const key_range r = layout.range(s);
      dense[s] = encoder.dense(s, update.subspan(r.begin, r.size()));
    }
    if (cycle.state() == worker_cycle::phase::compressing)
      cycle.compressed(now, static_cast<double>(update.size_bytes()));
  }
  last_update = update;
  last_compressed = compressing;
  last_external = false;
  last_ack_only = ack_only;
  return send_commit(now);
}

template <transport::transport Transport>
inline status worker<Transport>::state::commit_encoded(std::span<const std::span<const std::byte>> payloads) {
  if (!failed.ok()) return failed;
  if (payloads.size() != servers())
    return invalid_argument("worker.commit_encoded.payloads.size", payloads.size(),
                            "must be one payload per server (" + std::to_string(servers()) + ")");
  if (committing) return invalid_argument("worker.commit", "pending", "the last commit is not complete: wait() first");
  if (cycle.state() != worker_cycle::phase::compressing || !encoder.compresses())
    return invalid_argument("worker.commit_encoded", "dense cycle",
                            "this cycle does not compress (compresses() is false): commit() the update");
  std::uint64_t bytes = 0;
  for (const auto& b : payloads) {
    if (b.empty()) return invalid_argument("worker.commit_encoded.payload.size", 0, "a payload is never empty");
    bytes += b.size();
  }
  // Sent as they are, whole: each payload's CRC-32C in the check's pass.
  check_parts.clear();
  for (std::uint32_t s = 0; s < servers(); ++s) {
    const key_range r = layout.range(s);
    crc_known[s] = unchecked_lane(s) ? 0 : 1;
    check_parts.push_back({.codec = encoder.codec(),
                           .payload = payloads[s],
                           .element_count = r.size(),
                           .model_begin = r.begin,
                           .crc = crc_known[s] ? &commit_crc[s] : nullptr});
  }
  ASHL_TRY(check_commit_parts(check_parts, {.allow_non_finite = p.allow_non_finite}));
  const double now = clock.now();
  iterations_total += cycle.iterations();
  cycle.compressed(now, static_cast<double>(bytes));
  last_payloads.assign(payloads.begin(), payloads.end());
  last_update = {};
  last_compressed = true;
  last_external = true;
  last_ack_only = false;
  return send_commit(now);
}

// The commit whose payloads commit_payload() gives, with its pull.
template <transport::transport Transport>
inline status worker<Transport>::state::send_commit(double now) {
  if (p.link_bytes_per_second > 0.0 || p.link_hold) {
    std::uint64_t b = 0;
    for (std::uint32_t s = 0; s < servers(); ++s) b += commit_wire_bytes(s);
    hold_for_link(link_direction::up, b);
  }
  // The samples and clock this commit carries, from the cycle (the rule
  // the simulator's workers follow).
  last_samples = cycle.commit_samples();
  consume_leases(last_samples);
  last_seq = cycle.commit_sent(now);
  last_clock = cycle.clock();
  last_was_commit = true;
  commit_bytes = 0;
  arrived_count = 0;
  std::fill(arrived.begin(), arrived.end(), std::uint8_t{0});
  for (std::uint32_t s = 0; s < servers(); ++s) {
    commit_bytes += commit_wire_bytes(s);
    ASHL_TRY(send_commit_shard(s));
  }
  ++tel.commits;
  if (last_ack_only) ++tel.pushes;
  else ++tel.pulls;
  committing = true;
  std::fill(replied.begin(), replied.end(), std::uint8_t{0});
  std::fill(parts_in.begin(), parts_in.end(), reply_parts_state{});
  replies_pending = servers();
  reply_bytes = 0;
  return {};
}

// Shard s of the commit in flight (again, after a reconnect), with the
// pull: whole, or in parts with worker_params.commit_window in flight
// (the rest go from on_sent as parts complete).
template <transport::transport Transport>
inline status worker<Transport>::state::send_commit_shard(std::uint32_t s) {
  if (lost[s]) return {};  // sent when the server is back
  if (const std::uint32_t n = commit_parts(s); n >= 2) {
    commit_parts_out& po = parts_out[s];
    po = {n, 0, 0, po.gen + 1};
    while (po.sent < std::min(n, p.commit_window) && failed.ok() && !lost[s]) ASHL_TRY(send_commit_part(s, po.sent++));
    return failed;
  }
  const std::span<const std::byte> payload = commit_payload(s);
  const wire::header h = commit_header(s);
  const std::uint32_t i = take_slot();
  slots[i].commit_shard = static_cast<std::int32_t>(s);
  // The payload's CRC from the value check's pass where it has one (the
  // caller must keep the buffer as it was until wait(): a reconnect seals
  // it again from the same CRC).
  if (crc_known[s]) ASHL_TRY(wire::seal_header(h, payload.size(), commit_crc[s], slots[i].head));
  else ASHL_TRY(wire::seal_header(h, payload, slots[i].head));  // no CRC read with the flag `unchecked`
  if ((h.flags & wire::flag_unchecked) != 0) ++tel.unchecked_out;
  ++sends_pending;
  return send(s, i, slots[i].head, payload);
}

// The header of shard s's commit in flight.
template <transport::transport Transport>
inline wire::header worker<Transport>::state::commit_header(std::uint32_t s) const {
  return {.kind = wire::message_kind::commit,
          .codec = last_compressed ? encoder.codec() : codec_id::identity,
          .type = dtype::f32,
          // The pull rides with it; a push asks for an acknowledgement instead of the parameters.
          .flags = wire::flag_last_shard | commit_flags(true, last_ack_only) |
                   (unchecked_lane(s) ? wire::flag_unchecked : 0u),
          .element_count = layout.range(s).size(),
          .tensor = s,
          .rank = p.rank,
          .sequence = last_seq,
          .clock = last_clock,
          .step = iterations_total,
          .samples = last_samples};
}

// Part j of shard s's commit in flight: the same header as the whole
// (sequence, clock, samples, flags) with the part's index and the count,
// its own CRC over its header and its slice of the caller's buffer.
template <transport::transport Transport>
inline status worker<Transport>::state::send_commit_part(std::uint32_t s, std::uint32_t j) {
  const commit_parts_out& po = parts_out[s];
  const wire::part_range pr = wire::part_elements(layout.range(s).size(), po.parts, j);
  const std::span<const std::byte> payload = commit_payload(s).subspan(pr.first * sizeof(float), pr.count * sizeof(float));
  wire::header h = commit_header(s);
  h.flags |= wire::flag_part;
  h.part = static_cast<std::uint16_t>(j);
  h.parts = static_cast<std::uint16_t>(po.parts);
  const std::uint32_t i = take_slot();
  slots[i].commit_shard = static_cast<std::int32_t>(s);
  slots[i].commit_part = static_cast<std::int32_t>(j);
  slots[i].part_gen = po.gen;
  ASHL_TRY(wire::seal_header(h, payload, slots[i].head));
  if ((h.flags & wire::flag_unchecked) != 0) ++tel.unchecked_out;
  ++sends_pending;
  ++tel.commit_parts;
  return send(s, i, slots[i].head, payload);
}

template <transport::transport Transport>
inline status worker<Transport>::state::send_pulls(std::uint64_t seq) {
  last_was_commit = false;
  last_ack_only = false;
  last_seq = seq;
  for (std::uint32_t s = 0; s < servers(); ++s) {
    replied[s] = 0;
    parts_in[s] = {};
    ++replies_pending;
    ASHL_TRY(send_pull(s));
  }
  ++tel.pulls;
  reply_bytes = 0;
  return {};
}

template <transport::transport Transport>
inline status worker<Transport>::state::send_pull(std::uint32_t s) {
  if (lost[s]) return {};  // sent when the server is back
  wire::header h{.kind = wire::message_kind::pull_request,
                 .type = dtype::f32,
                 .element_count = layout.range(s).size(),
                 .tensor = s,
                 .rank = p.rank,
                 .sequence = last_seq};
  const std::uint32_t i = take_slot();
  ASHL_TRY(wire::seal_header(h, {}, slots[i].head));
  return send(s, i, slots[i].head, {});
}

template <transport::transport Transport>
inline status worker<Transport>::state::pull_only() {
  if (!failed.ok()) return failed;
  if (committing) return invalid_argument("worker.pull", "pending", "a commit or pull is in flight: wait() first");
  if (cycle.state() != worker_cycle::phase::computing || cycle.iterations() != 0)
    return invalid_argument("worker.pull.iterations", cycle.iterations(),
                            "a pull without commit goes between cycles, before iterating");
  cycle.abandon();
  cycle.pull_sent(clock.now());
  committing = true;
  return send_pulls(0);
}

template <transport::transport Transport>
inline status worker<Transport>::state::send_measurements(std::span<const ashl::measurement> ms) {
  if (ms.empty()) return {};
  // Every slot body that carries measurements is sized for a full batch
  // at once, so a larger batch later never grows it (no allocation).
  const std::size_t full = wire::encoded_size(wire::measurements_body::bytes_for(p.measurement_batch));
  const std::size_t n = wire::encoded_size(wire::measurements_body::bytes_for(ms.size()));
  status out{};
  for (std::uint32_t s = 0; s < servers() && out.ok(); ++s) {
    const std::uint32_t i = take_slot();
    if (slots[i].body.size() < full) slots[i].body.resize(full);
    auto used = wire::encode(wire::header{.rank = p.rank}, ms, std::span<std::byte>(slots[i].body.data(), n));
    if (!used) {
      free_slots.push_back(i);
      out = used.error();
      break;
    }
    std::memcpy(slots[i].head.data(), slots[i].body.data(), wire::header_bytes);
    out = send(s, i, slots[i].head, std::span<const std::byte>(slots[i].body).subspan(wire::header_bytes, n - wire::header_bytes));
  }
  ++tel.measurement_messages;
  return out;
}

template <transport::transport Transport>
inline status worker<Transport>::state::send_metric(metric_id m, double value) {
  if (!failed.ok()) return failed;
  for (std::uint32_t s = 0; s < servers(); ++s)
    ASHL_TRY(send_control(s, wire::header{.rank = p.rank}, wire::metric_body{.name = m, .value = value}));
  return {};
}

template <transport::transport Transport>
inline status worker<Transport>::state::leave() {
  if (committing) (void)wait();
  stop_thread();
  std::lock_guard g(mu);
  if (!failed.ok()) return failed;
  // What the outbox still holds, before the leave.
  cycle.flush_reports(clock.now(), [&](std::span<const ashl::measurement> out) { (void)send_measurements(out); });
  leaving = true;  // connections closing now are not reconnected
  for (std::uint32_t s = 0; s < servers(); ++s)
    ASHL_TRY(send_control(s, wire::header{.rank = p.rank},
                          wire::leave_body{.reason = wire::leave_reason::left, .subject = p.rank}));
  // The leave messages go out before the connections close.
  const double deadline = clock.now() + seconds(p.timeout);
  while (free_slots.size() < slots.size() && failed.ok() && clock.now() < deadline) {
    if (poll() == 0) t.wait(std::chrono::microseconds(500));
  }
  t.close();
  return {};
}

template <transport::transport Transport>
inline std::uint32_t worker<Transport>::state::take_slot() {
  if (!free_slots.empty()) {
    const std::uint32_t i = free_slots.back();
    free_slots.pop_back();
    return i;
  }
  slots.emplace_back();
  return static_cast<std::uint32_t>(slots.size() - 1);
}

template <transport::transport Transport>
inline status worker<Transport>::state::send(std::uint32_t s, std::uint32_t i, std::span<const std::byte> head,
                                             std::span<const std::byte> data) {
  if (lost[s]) {  // reconnecting: what matters is sent again after (rejoin)
    if (slots[i].commit_shard >= 0) --sends_pending;
    slots[i].commit_shard = -1;
    slots[i].commit_part = -1;
    free_slots.push_back(i);
    return failed;
  }
  const status st = t.send(peer[s], head, data, i);
  if (!st.ok()) {
    if (slots[i].commit_shard >= 0) --sends_pending;
    slots[i].commit_shard = -1;
    slots[i].commit_part = -1;
    free_slots.push_back(i);
    if (may_reconnect()) {  // sent again once the server is back
      lose(s, st);
      return failed;
    }
    fail(make_error(st.code(), "worker.send", server_name(s), st.message()));
    return failed;
  }
  tel.bytes_out += head.size() + data.size();
  return {};
}

}  // namespace ps
ASHL_NAMESPACE_END
