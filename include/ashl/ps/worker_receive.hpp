// ashl/ps/worker_receive.hpp — ps::worker's receive path: the wait for a
// cycle's replies (bounded by worker_params.timeout), receive buffers,
// pull replies (whole or in parts) checked before they reach the caller's
// buffer, plans, errors and acknowledgements from the servers, send
// completions, and losing and rejoining a server (worker_params.reconnect).
//
//   #include <ashl/ps/worker.hpp>   // includes this; the transport's handler calls state::on_message
//
// Definitions of worker::state's members, out of the class so that
// ps/worker.hpp reads as the driver's outline; docs/ps.md "Servers and
// workers".
#pragma once

#include <ashl/ps/worker.hpp>

ASHL_NAMESPACE_BEGIN
namespace ps {

template <transport::transport Transport>
inline std::optional<status> worker<Transport>::state::wait_for(std::chrono::microseconds slice, bool first) {
  const double now = clock.now();
  std::uint64_t reconnects = 0;
  {
    std::lock_guard g(mu);
    if (first) wait_deadline = now + seconds(p.timeout);
    reconnects = tel.reconnects;
  }
  const double until = std::min(wait_deadline, now + std::chrono::duration<double>(slice).count());
  status st = drive_until([&] { return !pending(); }, until, "waiting for the commit and the parameters");
  if (!st.ok()) {
    std::lock_guard g(mu);
    if (tel.reconnects != reconnects)  // a server came back: a whole timeout for its answer, as wait()'s
      wait_deadline = std::max(wait_deadline, clock.now() + seconds(p.timeout));
    if (st.code() == errc::timed_out && failed.ok() && clock.now() < wait_deadline) return std::nullopt;
    return st;
  }
  return wait_done();
}

// The commit was sent and the parameters arrived: the cycle ends.
template <transport::transport Transport>
inline status worker<Transport>::state::wait_done() {
  std::lock_guard g(mu);
  if (committing) {
    hold_for_link(link_direction::down, reply_bytes);
    finish_cycle();
  }
  if (p.progress_seconds > 0.0 && clock.now() >= next_progress_) {
    next_progress_ = clock.now() + p.progress_seconds;
    std::fprintf(stderr, "%s\n", progress_line().c_str());
  }
  return failed;
}

// The parameters arrived: measurements out, the next cycle starts.
template <transport::transport Transport>
inline void worker<Transport>::state::finish_cycle() {
  const double now = clock.now();
  // A push whose servers all acknowledged (headers only) measured no
  // pull; one a server answered with its parameters (a server that
  // ignores ack_requested) ends as a commit's cycle.
  if (last_was_commit && last_ack_only && reply_bytes == std::uint64_t{servers()} * wire::header_bytes)
    cycle.ack_arrived(now);
  else
    cycle.reply_arrived(now, static_cast<double>(reply_bytes));
  committing = false;
  reported.assign(cycle.measurements().begin(), cycle.measurements().end());
  // A follower reports its leader's instead (report_measurements).
  if (!p.follower) queue_measurements(cycle.measurements(), now);
  cycle.clear_measurements();
  // The newest plan server 0 sent is adopted here, at the cycle's start
  // (worker_cycle's rule, the simulator's too).
  if (cycle.start(p.batch, now)) {
    ++tel.plan_changes;
    // check_plan_codec held when the plan_update arrived: this cannot fail.
    (void)encoder.set(cycle.codec(), cycle.plan().compression_ratio, cycle.plan().compression_options());
  }
}

template <transport::transport Transport>
inline std::span<std::byte> worker<Transport>::state::receive_buffer(transport::peer_id pid,
                                                                     std::span<const std::byte> head, std::size_t n) {
  const std::uint32_t s = server_of_peer(pid);
  const auto kind = wire::peek_kind(head);
  if (s == ~std::uint32_t{0} || !kind) return {};
  const key_range r = layout.range(s);
  if (kind == wire::message_kind::pull_reply && n == r.size() * sizeof(float) && replies_pending != 0 && !replied[s] &&
      wire::peek_codec(head) == codec_id::identity) {
    note_reply_started();  // the data follows: it is the transfer
    return std::as_writable_bytes(reply_target(r));
  }
  // A part of a reply (wire flag `part`) goes where its header says,
  // read before any check: a header that lies lands the part elsewhere
  // in the staging buffer, its CRC fails in on_message, and so does the
  // pull (nothing staged reaches the parameters).
  if (kind == wire::message_kind::pull_reply && replies_pending != 0 && !replied[s]) {
    const wire::peeked_part pp = wire::peek_part(head);
    if (pp.valid() && pp.element_count == r.size()) {
      const wire::part_range pr = wire::part_elements(r.size(), pp.parts, pp.part);
      if (pr.count != 0 && n == pr.count * sizeof(float)) {
        note_reply_started();
        return std::as_writable_bytes(reply_target(r).subspan(pr.first, pr.count));
      }
    }
  }
  // Anything else (an error text, a reply of the wrong size) goes to a
  // buffer of the worker's, bounded by the largest reply it can expect.
  if (n > 8 * r.size() + 65536) return {};
  if (spill.size() < n) spill.resize(n);
  return {spill.data(), n};
}

template <transport::transport Transport>
inline void worker<Transport>::state::on_message(transport::peer_id pid, std::span<const std::byte> head,
                                                 std::span<const std::byte> data) {
  const std::uint32_t s = server_of_peer(pid);
  if (s == ~std::uint32_t{0}) return;
  tel.bytes_in += head.size() + data.size();
  const key_range r = layout.range(s);
  wire::limits lim;
  lim.max_elements = std::max<std::uint64_t>(r.size(), 1);
  lim.unchecked_allowed = unchecked_lane(s);  // a trusted lane on this host: no CRC (flag `unchecked`)
  auto m = wire::decode(head, data, lim);
  if (!m) {
    ++tel.bad_messages;
    fail(make_error(m.error().code(), "worker.message", server_name(s), m.error().message()));
    return;
  }
  const wire::header& h = m->header;
  if ((h.flags & wire::flag_unchecked) != 0) ++tel.unchecked_in;
  if (failing_over[s] && h.kind != wire::message_kind::error) failing_over[s] = 0;  // a join was taken
  switch (h.kind) {
    case wire::message_kind::pull_reply: {
      if (s == 0) drop_unconfirmed_leases();  // the rejoin's leases were all sent before it
      if (replied[s] || replies_pending == 0) return;  // not asked for: ignore
      if (last_ack_only && h.element_count == 0 && data.empty() && h.tensor == s) {
        // The acknowledgement of a push: the commit was taken and the
        // policy released this worker; no parameters.
        replied[s] = 1;
        if (--replies_pending == 0) deliver_replies(~std::uint32_t{0});  // a server that sent parameters
        reply_bytes += head.size();
        if (s == 0) { staleness = h.step; version = h.clock; }
        return;
      }
      note_reply_started();
      if ((h.flags & wire::flag_part) != 0) {
        on_reply_part(s, r, *m, head.size() + data.size());
        return;
      }
      if (h.codec != codec_id::identity) {
        on_compressed_reply(s, r, *m, head.size() + data.size());
        return;
      }
      if (h.codec != codec_id::identity || h.type != dtype::f32 || h.element_count != r.size() ||
          h.tensor != s) {
        ++tel.bad_messages;
        fail(make_error(errc::malformed, "pull_reply.element_count", h.element_count,
                        "from " + server_name(s) + ": expected " + std::to_string(r.size()) +
                            " f32 identity elements of shard " + std::to_string(s)));
        return;
      }
      auto dst = std::as_writable_bytes(reply_target(r));
      std::uint32_t direct = ~std::uint32_t{0};
      if (m->payload.data() != dst.data()) {
        // An eager reply, checked already: the pull's last one goes
        // straight into the parameters (one copy, as without staging).
        if (last_reply_direct()) {
          dst = std::as_writable_bytes(params.subspan(r.begin, r.size()));
          direct = s;
        }
        std::memcpy(dst.data(), m->payload.data(), dst.size());
        ++tel.copied_replies;
      }
      if ((h.flags & wire::flag_view) != 0)
        keep_view(s, r, {reinterpret_cast<const float*>(dst.data()), r.size()}, h.clock);
      replied[s] = 2;  // parameters (staged, or in params already)
      if (--replies_pending == 0) deliver_replies(direct);
      reply_bytes += head.size() + data.size();
      if (s == 0) { staleness = h.step; version = h.clock; }  // τ and the version (docs/wire-format.md, pull_reply)
      return;
    }
    case wire::message_kind::plan_update: {
      if (s != 0 || (p.follower && cycle.has_plan())) {  // a follower takes its join's plan only
        ++tel.plans_ignored;
        return;
      }
      ++tel.plans;
      const worker_plan& plan = *m->template get<worker_plan>();
      if (auto ok = check_plan_codec(plan, h.codec); !ok) {
        fail(status(ok.code(), server_name(s) + " sent a plan this worker cannot run: " + ok.message()));
        return;
      }
      cycle.plan_arrived(plan, h.codec);
      return;
    }
    case wire::message_kind::error: {
      ++tel.errors;
      const auto* e = m->template get<wire::error_body>();
      // A backup that is not primary (docs/elastic.md §4.5): the other
      // address, never a failure, until worker_params::reconnect passes.
      if (e->code == errc::unavailable && has_backup(s) && may_reconnect()) {
        fail_over(s, status(e->code, server_name(s) + " refused: " + std::string(e->text)));
        return;
      }
      fail(status(e->code, server_name(s) + " refused: " + std::string(e->text)));
      return;
    }
    case wire::message_kind::shard_state:
      term[s] = m->template get<wire::shard_state_body>()->term;
      return;
    case wire::message_kind::leave: {
      fail(make_error(errc::unavailable, "worker.rank", p.rank, "evicted by " + server_name(s)));
      return;
    }
    case wire::message_kind::lease:
      on_lease(s, h, *m->template get<wire::lease_body>());
      return;
    default:
      return;
  }
}

// A lease of the data ledger (docs/elastic.md §3.4, §3.6), checked by
// decode (begin < end <= samples, flags known) and here against this
// worker: server 0 only, this rank, the same N and seed as the leases
// before, a new number (or, flag `resent`, one it holds or a later one),
// within what a worker holds. A refused lease fails the worker, named,
// as a bad reply does: its positions would be trained by no one.
template <transport::transport Transport>
inline void worker<Transport>::state::on_lease(std::uint32_t s, const wire::header& h, const wire::lease_body& b) {
  auto refuse = [&](std::string_view field, std::uint64_t value, const std::string& why) {
    ++tel.bad_messages;
    fail(make_error(errc::invalid_argument, field, value, "from " + server_name(s) + ": " + why));
  };
  if (s != 0) return refuse("lease.server", s, "only server 0 runs the data ledger (docs/elastic.md §3.3)");
  if (h.rank != p.rank) return refuse("lease.rank", h.rank, "this worker is rank " + std::to_string(p.rank));
  if (ledger_n != 0 && b.samples != ledger_n)
    return refuse("lease.samples", b.samples, "earlier leases of this job said " + std::to_string(ledger_n));
  if (ledger_n != 0 && b.shuffle_seed != ledger_seed)
    return refuse("lease.shuffle_seed", b.shuffle_seed,
                  "earlier leases of this job said " + std::to_string(ledger_seed));
  if (h.sequence == 0) return refuse("lease.sequence", 0, "lease numbers count from 1");
  const bool resent = (b.flags & wire::lease_flag_resent) != 0;
  const ledger_lease l{.worker = p.rank, .flags = b.flags, .number = h.sequence, .epoch = b.epoch,
                       .begin = b.begin, .end = b.end};
  ledger_n = b.samples;
  ledger_seed = b.shuffle_seed;
  if (resent) {
    ++tel.leases;
    ++tel.leases_resent;
    for (ledger_lease& x : leases)
      if (x.number == l.number) {  // its begin is the server's cursor: behind this one's by a commit in flight at most
        x.flags = l.flags;
        x.begin = std::max(x.begin, l.begin);
        return;
      }
    // Not held: covered by this worker's commits already (a commit the
    // server had not taken), unless it is one this worker never had.
    if (l.number <= lease_number) return;
  } else if (h.sequence <= lease_number) {
    return refuse("lease.sequence", h.sequence,
                  "lease " + std::to_string(lease_number) + " came already (numbers grow per worker)");
  }
  if (!resent) drop_unconfirmed_leases();  // a fresh grant follows the rejoin's resends
  if (leases.size() >= max_leases)
    return refuse("lease.sequence", h.sequence,
                  "this worker holds " + std::to_string(leases.size()) + " leases already, the most a ledger grants " +
                      "(ps::max_ledger_ahead)");
  if (!resent) ++tel.leases;
  lease_number = std::max(lease_number, l.number);
  leases.push_back(l);
}

// Leases marked at a rejoin of server 0 that it did not send again: it
// gave them back (the rejoin came after ledger.give_back_after, and other
// workers may train them now), so this worker no longer trains them.
template <transport::transport Transport>
inline void worker<Transport>::state::drop_unconfirmed_leases() {
  if (!leases_unconfirmed) return;
  leases_unconfirmed = false;
  const auto dropped = std::erase_if(leases, [](const ledger_lease& l) { return (l.flags & lease_unconfirmed) != 0; });
  if (dropped == 0) return;
  tel.leases_dropped += dropped;
  std::fprintf(stderr,
               "worker %u: %zu lease(s) dropped: server 0 gave them back before this worker rejoined "
               "(ledger.give_back_after)\n",
               p.rank, static_cast<std::size_t>(dropped));
}

// A commit covering `samples` samples was sent: they are the next
// positions of the leases held, in order (the ledger moves its cursor
// the same way when it accepts the commit); a finished lease goes.
template <transport::transport Transport>
inline void worker<Transport>::state::consume_leases(std::uint64_t samples) noexcept {
  std::size_t done = 0;
  while (samples > 0 && done < leases.size()) {
    ledger_lease& l = leases[done];
    const std::uint64_t k = std::min(samples, l.size());
    l.begin += k;
    samples -= k;
    if (l.begin == l.end) ++done;
  }
  leases.erase(leases.begin(), leases.begin() + static_cast<std::ptrdiff_t>(done));
}

// One part of server s's reply, checked by decode (its own CRC, its
// size for its index): it must be the next one of the same split and
// version; the shard counts as replied when its last part passed.
template <transport::transport Transport>
inline void worker<Transport>::state::on_reply_part(std::uint32_t s, const key_range& r, const wire::message_view& m,
                                                    std::size_t bytes) {
  if (!failed.ok()) return;  // the pull failed (an earlier part, most likely): the rest of it is moot
  const wire::header& h = m.header;
  reply_parts_state& ps = parts_in[s];
  auto refuse = [&](std::string_view field, std::uint64_t value, const std::string& why) {
    refuse_reply(s, field, value, why);
  };
  if (!reply_fits(s, r, h)) return;
  if (ps.parts != 0 && h.parts != ps.parts)
    return refuse("pull_reply.parts", h.parts, "earlier parts of this reply said " + std::to_string(ps.parts));
  if (h.part != ps.next)
    return refuse("pull_reply.part", h.part,
                  "expected part " + std::to_string(ps.next) + " of " + std::to_string(h.parts) +
                      " (a part out of order or repeated)");
  if (ps.parts != 0 && h.clock != ps.clock)
    return refuse("pull_reply.clock", h.clock, "earlier parts of this reply are of version " + std::to_string(ps.clock));
  if (ps.parts != 0 && ((h.flags & wire::flag_view) != 0) != ps.view)
    return refuse("pull_reply.flags", h.flags, "earlier parts of this reply differ in the flag `view`");
  const wire::part_range pr = wire::part_elements(r.size(), h.parts, h.part);  // valid: decode checked it
  auto dst = std::as_writable_bytes(reply_target(r).subspan(pr.first, pr.count));
  if (m.payload.data() != dst.data()) std::memmove(dst.data(), m.payload.data(), dst.size());  // eager: from the transport's buffer
  ps.parts = h.parts;
  ps.clock = h.clock;
  ps.view = (h.flags & wire::flag_view) != 0;
  ++ps.next;
  ++tel.reply_parts;
  reply_bytes += bytes;
  if (ps.next < ps.parts) return;
  if (ps.view) keep_view(s, r, reply_target(r), h.clock);
  replied[s] = 2;
  if (s == 0) { staleness = h.step; version = h.clock; }
  if (--replies_pending == 0) deliver_replies(~std::uint32_t{0});
}

// Server s's compressed reply (rules/reply_encoder.hpp): what this
// worker's view of shard s lacks, added into the view (the server made
// the same addition into its copy), which then becomes the shard's reply.
// It must apply to the view held (header.sequence names its version); a
// payload the decoder refuses drops the view and fails the pull, and the
// parameters are not touched.
template <transport::transport Transport>
inline void worker<Transport>::state::on_compressed_reply(std::uint32_t s, const key_range& r,
                                                          const wire::message_view& m, std::size_t bytes) {
  const wire::header& h = m.header;
  auto refuse = [&](std::string_view field, std::uint64_t value, const std::string& why) {
    refuse_reply(s, field, value, why);
  };
  if (!reply_fits(s, r, h)) return;
  if (!has_view[s] || view_version[s] != h.sequence)
    return refuse("pull_reply.sequence", h.sequence,
                  "a compressed reply against version " + std::to_string(h.sequence) + ", but this worker holds " +
                      (has_view[s] ? "version " + std::to_string(view_version[s])
                                   : std::string("no view of the shard (no dense reply flagged `view` came first)")));
  const std::span<float> view(views.data() + r.begin, r.size());
  if (auto st = reply_encoder::apply_compressed_reply(h.codec, m.payload, view, p.seed, h.clock, s | reply_stream_bit);
      !st) {
    has_view[s] = 0;
    return refuse("pull_reply.payload", m.payload.size(), "a " + std::string(to_string(h.codec)) +
                                                              " payload the decoder refused: " + st.message());
  }
  view_version[s] = h.clock;
  // The pull's last reply goes straight into the parameters (as an eager
  // dense one does); the others wait in the staging for the pull's end.
  std::span<float> dst = reply_target(r);
  std::uint32_t direct = ~std::uint32_t{0};
  if (last_reply_direct()) {
    dst = params.subspan(r.begin, r.size());
    direct = s;
  }
  std::memcpy(dst.data(), view.data(), r.size() * sizeof(float));
  ++tel.compressed_replies;
  replied[s] = 2;
  reply_bytes += bytes;
  if (s == 0) { staleness = h.step; version = h.clock; }
  if (--replies_pending == 0) deliver_replies(direct);
}

template <transport::transport Transport>
inline void worker<Transport>::state::on_sent(transport::peer_id pid, std::uint64_t cookie, const status& st) {
  const auto i = static_cast<std::uint32_t>(cookie);
  if (i >= slots.size()) return;
  bool i_freed = false;
  if (slots[i].commit_shard >= 0) {
    const auto shard = static_cast<std::uint32_t>(slots[i].commit_shard);
    const std::int32_t part = slots[i].commit_part;
    slots[i].commit_shard = -1;
    slots[i].commit_part = -1;
    if (sends_pending > 0) --sends_pending;
    bool whole = st.ok();
    if (part >= 0 && shard < servers()) {
      // A part: the next one goes out (the window slides); the shard's
      // commit is sent when its last part completed. A lost
      // connection's parts (another gen) count for nothing.
      commit_parts_out& po = parts_out[shard];
      whole = false;
      if (st.ok() && slots[i].part_gen == po.gen) {
        ++po.done;
        whole = po.done == po.parts;
        if (po.sent < po.parts && failed.ok() && !lost[shard]) {
          free_slots.push_back(i);  // reused by the next part
          i_freed = true;
          (void)send_commit_part(shard, po.sent++);
        }
      }
    }
    if (whole && shard < servers() && !arrived[shard]) {
      arrived[shard] = 1;
      if (++arrived_count == servers()) cycle.commit_arrived(clock.now(), static_cast<double>(commit_bytes));
    }
  }
  if (!i_freed) free_slots.push_back(i);
  if (!st.ok()) {
    if (may_reconnect()) return;  // the server's failure comes through on_peer; sent again after
    const std::uint32_t s = server_of_peer(pid);
    fail(make_error(st.code(), "worker.send", s < servers() ? server_name(s) : "a server", st.message()));
  }
}

template <transport::transport Transport>
inline void worker<Transport>::state::on_peer(transport::peer_id pid, transport::peer_event e, const status& why) {
  const std::uint32_t s = server_of_peer(pid);
  if (s == ~std::uint32_t{0}) return;
  if (e == transport::peer_event::connected) {
    connected[s] = 1;
    if (lost[s]) rejoin(s);
    return;
  }
  connected[s] = 0;
  const status st(errc::unavailable,
                  server_name(s) + (e == transport::peer_event::failed ? " failed: " : " closed: ") + why.message());
  if (may_reconnect()) {
    lose(s, st);
    return;
  }
  fail(st);
}

// Server s is gone: connect again (the transport retries until its
// connect deadline; a failed attempt comes back here) until lost_until.
// A shard with a backup (worker_params::backups): its other address, each
// tried for failover_attempt at most (check_reconnects), the bound counted
// from the first loss until a join is taken.
template <transport::transport Transport>
inline void worker<Transport>::state::lose(std::uint32_t s, const status& why) {
  const double now = clock.now();
  has_view[s] = 0;  // the server forgets this worker's view when it joins again
  if (!lost[s] && !failing_over[s]) {
    lost_until[s] = now + seconds(p.reconnect);
    std::fprintf(stderr, "worker %u: %s; reconnecting for up to %.1f s%s\n", p.rank, why.message().c_str(),
                 seconds(p.reconnect), has_backup(s) ? " (its address and its backup's in turn)" : "");
  }
  lost[s] = 1;
  if (has_backup(s)) {
    failing_over[s] = 1;
    address[s] ^= 1;
    attempt_until[s] = now + seconds(p.failover_attempt);
    ++tel.failover_tries;
  }
  if (now >= lost_until[s]) {
    fail(make_error(errc::timed_out, "worker.reconnect_ms", p.reconnect.count(),
                    "passed and " + server_name(s) + " is not back (" + why.message() + ")"));
    return;
  }
  connected[s] = 0;
  auto id = connect_to(s);
  if (!id) {
    fail(make_error(id.error().code(), "worker.reconnect", server_name(s), id.error().message()));
    return;
  }
  peer[s] = *id;
}

// Server s is back: join again (the same incarnation keeps the
// sequence), then what was in flight to it: the commit with its pull, or
// the pull.
template <transport::transport Transport>
inline void worker<Transport>::state::rejoin(std::uint32_t s) {
  lost[s] = 0;
  ++tel.reconnects;
  if (s == 0 && !leases.empty()) {  // held until server 0 sends them again (drop_unconfirmed_leases)
    for (ledger_lease& l : leases) l.flags |= lease_unconfirmed;
    leases_unconfirmed = true;
  }
  std::fprintf(stderr, "worker %u: reconnected to %s\n", p.rank, server_name(s).c_str());
  wire::header h{.kind = wire::message_kind::join, .rank = p.rank};
  if (auto st = send_control(s, h, join_body(s)); !st) return;
  // In flight: a commit or pull (committing), or create()'s first pull.
  if (replied[s] || (!committing && replies_pending == 0)) return;
  parts_in[s] = {};  // the server answers the re-sent request whole: parts of the lost connection's reply do not count
  if (last_was_commit) (void)send_commit_shard(s);
  else (void)send_pull(s);
}

// Shard s's server answered `unavailable` (a backup not promoted), or an
// address took longer than failover_attempt to connect: the connection is
// closed and the other address tried.
template <transport::transport Transport>
inline void worker<Transport>::state::fail_over(std::uint32_t s, const status& why) {
  const transport::peer_id old = peer[s];
  peer[s] = transport::no_peer;  // what the old connection still says is not this shard's
  connected[s] = 0;
  if (old != transport::no_peer) closing.push_back(old);
  lose(s, why);
}

// A reconnect that outlived its bound fails the worker; failing over, an
// address that did not connect within failover_attempt gives way to the other.
template <transport::transport Transport>
inline void worker<Transport>::state::check_reconnects(double now) {
  for (std::uint32_t s = 0; s < servers(); ++s) {
    if ((lost[s] || failing_over[s]) && now >= lost_until[s]) {
      fail(make_error(errc::timed_out, "worker.reconnect_ms", p.reconnect.count(),
                      "passed and " + server_name(s) + " is not back"));
      return;
    }
    if (lost[s] && failing_over[s] && !connected[s] && now >= attempt_until[s])
      fail_over(s, make_error(errc::timed_out, "worker.failover_attempt_ms", p.failover_attempt.count(),
                              "passed connecting to " + server_name(s)));
  }
}

}  // namespace ps
ASHL_NAMESPACE_END
