// ashl/sim/simulator_events.hpp — what the simulator does at each event:
// compute done, compression done, a link's rate change, a flow's end, a
// message's arrival (commits to the server cores, replies to the workers).
//
//   #include <ashl/sim/simulator.hpp>   // includes this
//
// Definitions of simulator's members, out of the class so that
// sim/simulator.hpp reads as the driver's outline; docs/sim.md.
#pragma once

#include <ashl/sim/simulator.hpp>

ASHL_NAMESPACE_BEGIN
namespace sim {

template <sync::consistency_policy Policy>
inline void simulator<Policy>::dispatch(const event& e) {
  switch (e.kind) {
    case k_compute_done: on_compute_done(e.target, e.tag); break;
    case k_compress_done: on_compress_done(e.target, e.tag); break;
    case k_link_check: on_link_check(e.target, e.tag); break;
    case k_flow_done: on_flow_done(e.target, e.tag); break;
    case k_arrive: on_arrive(e.target, e.tag); break;
    case k_metric: on_metric_tick(); break;
    case k_change: on_change(spec_.changes[e.target]); break;
    case k_plan: on_plan(e.target); break;
    case k_measurements: on_measurements(e.target, static_cast<std::uint32_t>(e.tag)); break;
    case k_leave: on_leave(e.target, static_cast<std::uint32_t>(e.tag)); break;
    case k_evict:
      for (std::uint32_t k = 0; k < cores_.size(); ++k) {
        cores_[k].evict(e.target, clock_.now(), act_);
        act(k);
      }
      break;
    default: ASHL_ASSERT(false, "simulator: unknown event kind");
  }
}

// A jitter multiplier (mean 1) from worker w's stream.
template <sync::consistency_policy Policy>
inline double simulator<Policy>::draw(std::uint32_t w, const jitter_spec& j) {
  if (j.kind == jitter_kind::none || j.param == 0.0) return 1.0;
  const philox_stream s(spec_.seed, 0x5eed, w);
  const auto b = s.block(w_[w].jitter_counter++);
  const double u1 = (static_cast<double>(b[0]) + 0.5) * 0x1p-32;
  if (j.kind == jitter_kind::uniform) return 1.0 - j.param + 2.0 * j.param * u1;
  const double u2 = (static_cast<double>(b[1]) + 0.5) * 0x1p-32;
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  return std::exp(j.param * z - 0.5 * j.param * j.param);
}

// cluster_spec::stragglers: this cycle's slowdown (factor with probability
// p), from the worker's straggler stream (not its jitter stream).
template <sync::consistency_policy Policy>
inline double simulator<Policy>::straggle(std::uint32_t w) {
  const auto& st = spec_.stragglers;
  if (st.probability <= 0.0) return 1.0;
  const philox_stream s(spec_.seed, 0x57a6, w);
  const auto b = s.block(w_[w].straggle_counter++);
  const double u = (static_cast<double>(b[0]) + 0.5) * 0x1p-32;
  if (u >= st.probability) return 1.0;
  ++w_[w].straggles;
  return st.factor;
}

// The worker starts a cycle with the newest plan that reached it (server
// 0's plan_updates, delivered by on_plan as the wire delivers them) and
// computes; worker_cycle says when the cycle's compute is complete.
template <sync::consistency_policy Policy>
inline void simulator<Policy>::start_compute(std::uint32_t w) {
  auto& wk = w_[w];
  // Plans come only from the policy (DLB's batches too): no hook may
  // change them, or the simulator would run a rule the server does not.
  const auto& ws = spec_.workers[w];
  auto& cy = cycles_[w];
  const double now = clock_.now();
  cy.start(ws.batch, now);
  const worker_plan& plan = cy.plan();
  const double t_iter = ws.seconds_per_iteration * wk.slowdown * straggle(w) * static_cast<double>(cy.batch()) /
                        static_cast<double>(spec_.reference_batch);
  double t = now;
  do {
    t += t_iter * draw(w, ws.compute_jitter);
  } while (!cy.iteration_done(t));
  wk.plan = plan;
  begin(w, state::computing);
  q_.push(t, k_compute_done, w, wk.gen[up]);
}

template <sync::consistency_policy Policy>
inline void simulator<Policy>::on_compute_done(std::uint32_t w, std::uint64_t gen) {
  auto& wk = w_[w];
  if (wk.st != state::computing || gen != wk.gen[up]) return;
  if (streaming_) {
    stream_compute_done(w);
    return;
  }
  const double now = clock_.now();
  auto& cy = cycles_[w];
  auto& st = r_.workers[w];
  st.compute_s += now - wk.activity_start;
  st.iterations += cy.iterations();
  st.samples += cy.samples();
  span(w, activity::compute, wk.activity_start, now);
  wk.sequence = cy.sequence() + 1;  // commit_sent will number it so
  const std::size_t s = cores_.size();
  if (hooks_.compute) {
    const compute_request q{w, &wk.plan, cy.codec(), cy.iterations(), cy.batch(), wk.sequence, &layout_};
    for (auto& p : payloads_) p = shard_payload{};
    hooks_.compute(q, payloads_);
    if (payload_of_.size() < w_.size() * s) payload_of_.resize(w_.size() * s);
    for (std::size_t k = 0; k < s; ++k) payload_of_[w * s + k] = payloads_[k];
    // The worker's check of the whole commit before any part goes
    // (rules/commit_check.hpp, as ps::worker runs it): a bad value in one
    // server's part refuses it on none, and the run stops saying why.
    check_parts_.clear();
    for (std::size_t k = 0; k < s; ++k) {
      const ps::key_range r = layout_.range(static_cast<std::uint32_t>(k));
      check_parts_.push_back({.codec = payloads_[k].codec, .type = payloads_[k].type, .payload = payloads_[k].bytes,
                              .element_count = payloads_[k].element_count, .model_begin = r.begin});
    }
    if (auto ok = ps::check_commit_parts(check_parts_, {.allow_non_finite = allow_non_finite_}); !ok) {
      if (r_.error.empty()) r_.error = "worker " + std::to_string(w) + "'s commit refused: " + ok.message();
      stop_ = true;
      return;
    }
  }
  const auto& ws = spec_.workers[w];
  if (cy.compresses() && ws.compress_seconds > 0.0) {
    begin(w, state::compressing);
    q_.push(now + ws.compress_seconds * wk.slowdown * draw(w, ws.compute_jitter), k_compress_done, w, wk.gen[up]);
    return;
  }
  send_commit(w);
}

template <sync::consistency_policy Policy>
inline void simulator<Policy>::on_compress_done(std::uint32_t w, std::uint64_t gen) {
  auto& wk = w_[w];
  if (wk.st != state::compressing || gen != wk.gen[up]) return;
  const double now = clock_.now();
  r_.workers[w].compress_s += now - wk.activity_start;
  span(w, activity::compress, wk.activity_start, now);
  cycles_[w].compressed(now, static_cast<double>(commit_payload_bytes(w)));
  send_commit(w);
}

// Payload bytes of the commit (all shards, without headers).
template <sync::consistency_policy Policy>
inline std::uint64_t simulator<Policy>::commit_payload_bytes(std::uint32_t w) const {
  if (!hooks_.compute)
    return static_cast<std::uint64_t>(
        std::ceil(static_cast<double>(spec_.model_bytes) * static_cast<double>(w_[w].plan.compression_ratio)));
  std::uint64_t b = 0;
  for (std::size_t k = 0; k < cores_.size(); ++k) b += payload_of_[w * cores_.size() + k].bytes.size();
  return b;
}

template <sync::consistency_policy Policy>
inline std::uint64_t simulator<Policy>::shard_bytes(std::uint32_t w, std::uint64_t total, std::size_t k) const {
  const std::size_t s = cores_.size();
  if (hooks_.compute) return payload_of_[w * s + k].bytes.size();
  return total / s + (k < total % s ? 1 : 0);
}

template <sync::consistency_policy Policy>
inline void simulator<Policy>::send_commit(std::uint32_t w) {
  auto& wk = w_[w];
  begin(w, state::sending);
  const std::uint64_t seq = cycles_[w].commit_sent(clock_.now());
  ASHL_ASSERT(seq == wk.sequence, "simulator: commit sequence out of step with worker_cycle");
  (void)seq;
  ++wk.gen[down];  // replies to this commit carry the new generation
  wk.down_started = 0;
  wk.down_left = static_cast<std::uint32_t>(cores_.size());
  wk.down_bytes = wk.down_payload = 0;
  wk.last_commit = opt_.commits_per_worker > 0 && r_.workers[w].commits + 1 >= opt_.commits_per_worker;
  wk.pull_only = false;
  send_shards(w, commit_payload_bytes(w));
}

// Starts the commit's transfers, one shard per server (replies start per
// server, in start_reply).
template <sync::consistency_policy Policy>
inline void simulator<Policy>::send_shards(std::uint32_t w, std::uint64_t payload) {
  auto& wk = w_[w];
  const std::size_t s = cores_.size();
  ++wk.gen[up];
  wk.up_left = static_cast<std::uint32_t>(s);
  const double cap = cap_of(w);
  // A dense commit in parts (ps::worker_params::commit_part_bytes)
  // carries a header per part; a compressed one goes whole.
  const bool dense = !(w_[w].plan.compression_ratio < 1.0f);
  std::uint64_t total = 0;
  for (std::size_t k = 0; k < s; ++k) {
    const std::uint64_t b = shard_bytes(w, payload, k);
    const std::uint64_t parts =
        dense ? std::max<std::uint64_t>(1, wire::parts_for(b / 4, 4, spec_.commit_part_bytes, wire::max_commit_parts)) : 1;
    const std::uint64_t part = b + parts * spec_.header_bytes;
    total += part;
    start_flow(w, up, k, part, cap);
  }
  wk.up_bytes = total;
  r_.workers[w].bytes_sent += total;
}

// The worker's own link, per shard, this message (slowdown and comm jitter).
template <sync::consistency_policy Policy>
inline double simulator<Policy>::cap_of(std::uint32_t w) {
  const auto& ws = spec_.workers[w];
  return ws.bandwidth_bytes_per_s / static_cast<double>(spec_.servers.size()) /
         (w_[w].slowdown * draw(w, ws.comm_jitter));
}

template <sync::consistency_policy Policy>
inline void simulator<Policy>::start_flow(std::uint32_t w, dir d, std::size_t k, std::uint64_t bytes, double cap) {
  const std::uint32_t li = 2 * server_of_core(k) + d;
  const std::uint64_t fid = flow_id(w, d, k);
  if (links_.unlimited(li)) {
    const double t = std::isfinite(cap) ? static_cast<double>(bytes) / cap : 0.0;
    q_.push(clock_.now() + t, k_flow_done, static_cast<std::uint32_t>(fid), w_[w].gen[d]);
  } else {
    schedule(links_.add(li, clock_.now(), fid, static_cast<double>(bytes), cap));
  }
}

template <sync::consistency_policy Policy>
inline std::uint64_t simulator<Policy>::flow_id(std::uint32_t w, dir d, std::size_t shard) const {
  return (std::uint64_t{w} * 2 + d) * cores_.size() + shard;
}

template <sync::consistency_policy Policy>
inline auto simulator<Policy>::flow_of(std::uint64_t fid) const noexcept -> flow_parts {
  const std::size_t s = cores_.size();
  const std::uint64_t msg = fid / s;
  return {static_cast<std::uint32_t>(msg / 2), static_cast<dir>(msg % 2), static_cast<std::uint32_t>(fid % s)};
}

// A link's next completion check (sim/network.hpp link_set) as an event.
template <sync::consistency_policy Policy>
inline void simulator<Policy>::schedule(const std::optional<link_set::check>& c) {
  if (c) q_.push(c->time, k_link_check, c->link, c->version);
}

template <sync::consistency_policy Policy>
inline void simulator<Policy>::on_link_check(std::uint32_t li, std::uint64_t version) {
  const auto r = links_.fire(li, version, clock_.now());
  schedule(r.next);
  if (r.finished) flow_finished(*r.finished);
}

template <sync::consistency_policy Policy>
inline void simulator<Policy>::on_flow_done(std::uint32_t fid, std::uint64_t gen) {
  const auto f = flow_of(fid);
  if (gen != w_[f.worker].gen[f.d]) return;
  flow_finished(fid);
}

// The bytes of one shard left the link; it arrives after the latencies.
template <sync::consistency_policy Policy>
inline void simulator<Policy>::flow_finished(std::uint64_t fid) {
  const auto [w, d, k] = flow_of(fid);
  const double lat = spec_.workers[w].latency_s + spec_.servers[server_of_core(k)].latency_s;
  q_.push(clock_.now() + lat, k_arrive, static_cast<std::uint32_t>(fid), w_[w].gen[d]);
}

template <sync::consistency_policy Policy>
inline void simulator<Policy>::on_arrive(std::uint32_t fid, std::uint64_t gen) {
  const auto [w, d, k] = flow_of(fid);
  auto& wk = w_[w];
  if (gen != wk.gen[d]) return;
  if (streaming_) {
    if (d == up) {
      stream_commit_arrived(w, k);
    } else {
      stream_reply_arrived(w, k);
    }
    return;
  }
  if (d == up) {
    if (wk.up_left == 0) return;
    commit_shard_arrived(w, k, --wk.up_left == 0);
  } else {
    if (wk.down_left == 0) return;
    if (--wk.down_left == 0) reply_arrived(w);
  }
}

// Shard k of w's commit reached server k: the core takes it (and the pull
// riding along); its actions start the replies.
template <sync::consistency_policy Policy>
inline void simulator<Policy>::commit_shard_arrived(std::uint32_t w, std::uint32_t k, bool last) {
  auto& wk = w_[w];
  const double now = clock_.now();
  if (last) {
    auto& st = r_.workers[w];
    st.send_s += now - wk.activity_start;
    span(w, activity::send, wk.activity_start, now);
    ++st.commits;
    ++r_.commits;
    cycles_[w].commit_arrived(now, static_cast<double>(wk.up_bytes));
    // The worker waits from here (a reply that already started shortens it).
    if (wk.last_commit) {
      // Its last cycle: what it measured goes out now, and what its
      // outbox holds, as a real worker's does before it leaves.
      wk.st = state::done;
      report(w);
      cycles_[w].flush_reports(now, [&](std::span<const measurement> ms) { mail_measurements(w, ms); });
    } else {
      begin(w, state::waiting);
    }
  }
  const std::size_t s = cores_.size();
  // The header a real worker sends with this shard (ps/worker_send.hpp),
  // and the commit a real server builds from it (rules/commit_in.hpp):
  // the samples its cycle covered (worker_cycle::commit_samples; server_core
  // bounds them), the pull riding along unless this is its last commit, a
  // push's pull answered with a header.
  wire::header h{.kind = wire::message_kind::commit,
                 .flags = ps::commit_flags(!wk.last_commit, spec_.workers[w].push),
                 .sequence = wk.sequence,
                 .clock = cycles_[w].clock(),
                 .samples = cycles_[w].commit_samples()};
  std::span<const std::byte> payload{};
  if (hooks_.compute) {
    const auto& p = payload_of_[w * s + k];
    h.codec = p.codec;
    h.type = p.type;
    h.element_count = p.element_count;
    h.step = p.step;
    h.tensor = p.tensor;
    payload = p.bytes;
  }
  const ps::commit_in c = ps::commit_in_of(h, w, wk.incarnation, payload, wk.up_bytes);
  const std::uint64_t accepted = cores_[k].stats().commits;
  cores_[k].commit(c, now, act_);
  if (k == 0 && ledger_on() && cores_[0].stats().commits > accepted) use_positions(w, c.samples);
  act(k);
  if (last && wk.st == state::done) {
    wk.down_left = 0;
    check_all_done();
    if (wk.leaving) depart(w);  // a leave change during its last cycle
  } else if (last && wk.st == state::waiting && wk.down_started == s) {
    // Every server answered before (or as) the last shard arrived.
    to_receiving(w);
  }
}

// A worker reached its commit limit; the run stops when none is running
// (a count, so no event scans the workers).
template <sync::consistency_policy Policy>
inline void simulator<Policy>::check_all_done() {
  if (--running_ == 0) stop_ = true;
}

// Server k answers w's pull: its parameters travel on k's egress link.
template <sync::consistency_policy Policy>
inline void simulator<Policy>::start_reply(std::uint32_t w, std::uint32_t k) {
  if (w >= w_.size()) return;
  auto& wk = w_[w];
  if (wk.st == state::dead || wk.st == state::done || wk.st == state::absent || wk.st == state::left) return;
  if (wk.down_started >= cores_.size()) return;
  const std::uint64_t tau = cores_[k].serve_staleness(w);
  if (k == 0) wk.staleness = tau;  // server 0's, as a real worker reads it
  // A pushing worker's pull after a commit is answered with a header only
  // (ps::server's acknowledgement); its join's pull with the parameters.
  const bool ack = acked(w);
  const reply_size rs = ack ? reply_size{} : serve(w, k);
  const std::uint64_t payload = rs.payload;
  // A dense reply in parts (ps::server_params::reply_part_bytes) carries a header per part.
  const std::uint64_t parts =
      rs.compressed ? 1 : std::max<std::uint64_t>(1, wire::parts_for(payload / 4, 4, spec_.reply_part_bytes));
  const std::uint64_t bytes = payload + parts * spec_.header_bytes;
  wk.down_bytes += bytes;
  wk.down_payload += payload;
  r_.workers[w].bytes_received += bytes;
  ++wk.down_started;
  start_flow(w, down, k, bytes, cap_of(w));
  if (wk.down_started == cores_.size() && wk.st == state::waiting) to_receiving(w);
}

template <sync::consistency_policy Policy>
inline std::uint64_t simulator<Policy>::reply_bytes(std::uint32_t k) const {
  if (layout_.elements() > 0) return 4 * layout_.range(k).size();
  const std::size_t s = cores_.size();
  return spec_.model_bytes / s + (k < spec_.model_bytes % s ? 1 : 0);
}

// What server k sends w: its parameters, or with compressed replies
// (server_setup::replies) what w's view lacks (server_core::serve_reply,
// the real server's rule); the serve hook gets what w will hold.
template <sync::consistency_policy Policy>
inline auto simulator<Policy>::serve(std::uint32_t w, std::uint32_t k) -> reply_size {
  core_type& core = cores_[k];
  if (!core.compresses_replies()) {
    if (hooks_.serve) hooks_.serve(w, k, core.parameters());
    return {reply_bytes(k), false};
  }
  if (reply_payload_.size() < core.max_reply_bytes()) reply_payload_.resize(core.max_reply_bytes());
  const auto r = core.serve_reply(w, reply_payload_, reply_bytes(k) / 4);
  if (hooks_.serve) hooks_.serve(w, k, r.view);
  return {r.compressed ? r.bytes : reply_bytes(k), r.compressed};
}

// The last server answered: the wait ends, the reply is on its way.
template <sync::consistency_policy Policy>
inline void simulator<Policy>::to_receiving(std::uint32_t w) {
  auto& wk = w_[w];
  const double now = clock_.now();
  r_.workers[w].wait_s += now - wk.activity_start;
  span(w, activity::wait, wk.activity_start, now);
  begin(w, state::receiving);
  // An acknowledgement is no transfer to time: a push's commit measurement
  // runs to its arrival, as the real worker's does.
  if (!acked(w)) cycles_[w].reply_started(now);
}

template <sync::consistency_policy Policy>
inline void simulator<Policy>::reply_arrived(std::uint32_t w) {
  auto& wk = w_[w];
  if (wk.st != state::receiving) return;
  const double now = clock_.now();
  r_.workers[w].receive_s += now - wk.activity_start;
  span(w, activity::receive, wk.activity_start, now);
  r_.workers[w].peak_sync_bytes = std::max(r_.workers[w].peak_sync_bytes, wk.up_bytes + wk.down_bytes);
  if (acked(w)) {
    cycles_[w].ack_arrived(now);  // commit = push + the wait; no pull
  } else {
    if (hooks_.deliver) hooks_.deliver(w);
    // Pull amount: the parameters' bytes (headers not counted, as the first simulator did).
    cycles_[w].reply_arrived(now, static_cast<double>(wk.down_payload));
  }
  report(w);
  if (wk.leaving) {
    depart(w);  // a leave change: its cycle is over, it leaves instead of computing again
    return;
  }
  start_compute(w);
}

}  // namespace sim
ASHL_NAMESPACE_END
