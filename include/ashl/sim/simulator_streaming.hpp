// ashl/sim/simulator_streaming.hpp — a worker under Streaming DiLoCo's
// fragments (server_setup::streaming, rules/streaming.hpp): compute to the
// next sync or merge, send fragment p's part, merge the replies τ steps later.
//
//   #include <ashl/sim/simulator.hpp>   // includes this
//
// Definitions of simulator's members, out of the class so that
// sim/simulator.hpp reads as the driver's outline; docs/sim.md.
#pragma once

#include <ashl/sim/simulator.hpp>

ASHL_NAMESPACE_BEGIN
namespace sim {

// A worker under server_setup::streaming: it computes from one event of
// the schedule to the next (a sync or a merge after an inner step,
// rules/streaming.hpp). A sync sends fragment p's part to every server
// (core k·P + p, the pull riding along) and the worker computes on; a
// merge waits for the fragment's replies unless they have all arrived.
// A sync and a merge after the same step touch different fragments (or,
// with τ = 0, the merge needs the sync's reply), so the commit goes first
// and overlaps the wait. Its plan is the join's (the batch); the
// worker_cycle measurements are not reported, codec time is not modelled.
template <sync::consistency_policy Policy>
inline void simulator<Policy>::stream_start(std::uint32_t w, const worker_plan& plan) {
  auto& s = sw_[w];
  s.plan = plan;
  s.codec = ps::plan_codec(plan, compression_);
  s.batch = plan.batch_size != 0 ? plan.batch_size : spec_.workers[w].batch;
  stream_compute(w);
}

// Computes up to the next step after which the schedule syncs or merges
// (at most H steps on): per-iteration times as start_compute draws them.
template <sync::consistency_policy Policy>
inline void simulator<Policy>::stream_compute(std::uint32_t w) {
  auto& s = sw_[w];
  std::uint64_t e = s.step + 1;
  while (!schedule_.sync_after(e) && !schedule_.merge_after(e)) ++e;
  s.segment_end = e;
  s.segment_iterations = static_cast<std::uint32_t>(e - s.step);
  const auto& ws = spec_.workers[w];
  const double t_iter = ws.seconds_per_iteration * w_[w].slowdown * straggle(w) * static_cast<double>(s.batch) /
                        static_cast<double>(spec_.reference_batch);
  double t = clock_.now();
  for (std::uint32_t i = 0; i < s.segment_iterations; ++i) t += t_iter * draw(w, ws.compute_jitter);
  begin(w, state::computing);
  q_.push(t, k_compute_done, w, w_[w].gen[up]);
}

template <sync::consistency_policy Policy>
inline void simulator<Policy>::stream_compute_done(std::uint32_t w) {
  auto& wk = w_[w];
  auto& s = sw_[w];
  const double now = clock_.now();
  auto& st = r_.workers[w];
  st.compute_s += now - wk.activity_start;
  st.iterations += s.segment_iterations;
  st.samples += std::uint64_t{s.segment_iterations} * s.batch;
  span(w, activity::compute, wk.activity_start, now);
  s.step = s.segment_end;
  const std::optional<std::uint32_t> p = schedule_.sync_after(s.step);
  const std::optional<std::uint32_t> q = schedule_.merge_after(s.step);
  if (hooks_.compute) {
    const std::size_t servers = spec_.servers.size(), c = cores_.size();
    const std::uint64_t seq = p ? sync_[w * fragments_ + *p].commits + 1 : 0;
    const compute_request req{w,        &s.plan,       s.codec,   s.segment_iterations, s.batch, seq,
                              &layout_, p.value_or(0), fragments_};
    for (auto& x : payloads_) x = shard_payload{};
    hooks_.compute(req, p ? std::span<shard_payload>(payloads_) : std::span<shard_payload>{});
    if (p) {
      if (payload_of_.size() < w_.size() * c) payload_of_.resize(w_.size() * c);
      check_parts_.clear();
      for (std::size_t k = 0; k < servers; ++k) {
        const std::size_t j = k * fragments_ + *p;
        payload_of_[w * c + j] = payloads_[k];
        check_parts_.push_back({.codec = payloads_[k].codec, .type = payloads_[k].type,
                                .payload = payloads_[k].bytes, .element_count = payloads_[k].element_count,
                                .model_begin = layout_.range(static_cast<std::uint32_t>(j)).begin});
      }
      if (auto ok = ps::check_commit_parts(check_parts_, {.allow_non_finite = allow_non_finite_}); !ok) {
        if (r_.error.empty()) r_.error = "worker " + std::to_string(w) + "'s commit refused: " + ok.message();
        stop_ = true;
        return;
      }
    }
  }
  if (p) stream_send(w, *p);
  if (wk.st == state::done) return;  // that was its last commit
  if (q) {
    if (!sync_[w * fragments_ + *q].replied) {
      s.blocked_on = *q;
      begin(w, state::waiting);
      return;
    }
    stream_merge(w, *q);
  }
  stream_compute(w);
}

// Fragment p's commit leaves: one part per server, on the worker's link.
template <sync::consistency_policy Policy>
inline void simulator<Policy>::stream_send(std::uint32_t w, std::uint32_t p) {
  auto& s = sw_[w];
  auto& y = sync_[w * fragments_ + p];
  const std::size_t servers = spec_.servers.size(), c = cores_.size();
  ++y.commits;
  ++s.commits_sent;
  y.samples = (s.step - y.last_step) * s.batch;
  y.last_step = s.step;
  y.flying = true;
  y.replied = false;
  y.up_left = y.down_left = static_cast<std::uint32_t>(servers);
  y.down_started = 0;
  y.up_bytes = y.down_bytes = 0;
  y.last = opt_.commits_per_worker > 0 && s.commits_sent >= opt_.commits_per_worker;
  const double cap = cap_of(w);
  const bool dense = !(s.plan.compression_ratio < 1.0f);
  // Timing only: the plan's share of the model, split over the cores as
  // the replies are.
  const std::uint64_t total =
      hooks_.compute ? 0
                     : static_cast<std::uint64_t>(std::ceil(static_cast<double>(spec_.model_bytes) *
                                                            static_cast<double>(s.plan.compression_ratio)));
  for (std::size_t k = 0; k < servers; ++k) {
    const std::size_t j = k * fragments_ + p;
    const std::uint64_t b = hooks_.compute ? payload_of_[w * c + j].bytes.size() : total / c + (j < total % c ? 1 : 0);
    const std::uint64_t parts =
        dense ? std::max<std::uint64_t>(1, wire::parts_for(b / 4, 4, spec_.commit_part_bytes, wire::max_commit_parts))
              : 1;
    const std::uint64_t part = b + parts * spec_.header_bytes;
    y.up_bytes += part;
    start_flow(w, up, j, part, cap);
  }
  r_.workers[w].bytes_sent += y.up_bytes;
  // Its last commit: it stops computing; the run ends when the commit has
  // reached every server (stream_commit_arrived).
  if (y.last) begin(w, state::done);
}

// Fragment p's part for core j reached its server: the core takes it.
template <sync::consistency_policy Policy>
inline void simulator<Policy>::stream_commit_arrived(std::uint32_t w, std::uint32_t j) {
  auto& y = sync_[w * fragments_ + j % fragments_];
  if (y.up_left == 0) return;
  const bool whole = --y.up_left == 0;
  ps::commit_in c{};
  c.worker = w;
  c.incarnation = w_[w].incarnation;
  c.sequence = y.commits;
  c.clock = commit_clock(y.commits);
  c.samples = y.samples;
  c.bytes = y.up_bytes;
  if (hooks_.compute) {
    const auto& pl = payload_of_[w * cores_.size() + j];
    c.codec = pl.codec;
    c.type = pl.type;
    c.element_count = pl.element_count;
    c.step = pl.step;
    c.tensor = pl.tensor;
    c.payload = pl.bytes;
  }
  c.pull = !y.last;
  cores_[j].commit(c, clock_.now(), act_);
  act(j);
  if (whole) {
    ++r_.workers[w].commits;
    ++r_.commits;
    if (y.last) check_all_done();
  }
}

// Core j answers w's pull riding with fragment j % P's commit.
template <sync::consistency_policy Policy>
inline void simulator<Policy>::stream_reply(std::uint32_t w, std::uint32_t j) {
  if (w >= w_.size() || w_[w].st == state::done) return;
  auto& y = sync_[w * fragments_ + j % fragments_];
  if (!y.flying || y.down_started >= spec_.servers.size()) return;
  const reply_size rs = serve(w, j);
  const std::uint64_t payload = rs.payload;
  const std::uint64_t parts =
      rs.compressed ? 1 : std::max<std::uint64_t>(1, wire::parts_for(payload / 4, 4, spec_.reply_part_bytes));
  const std::uint64_t bytes = payload + parts * spec_.header_bytes;
  y.down_bytes += bytes;
  r_.workers[w].bytes_received += bytes;
  ++y.down_started;
  start_flow(w, down, j, bytes, cap_of(w));
}

template <sync::consistency_policy Policy>
inline void simulator<Policy>::stream_reply_arrived(std::uint32_t w, std::uint32_t j) {
  const std::uint32_t p = j % fragments_;
  auto& y = sync_[w * fragments_ + p];
  if (y.down_left == 0 || w_[w].st == state::done) return;
  if (--y.down_left > 0) return;
  y.replied = true;
  auto& st = r_.workers[w];
  st.peak_sync_bytes = std::max(st.peak_sync_bytes, y.up_bytes + y.down_bytes);
  auto& s = sw_[w];
  if (s.blocked_on != static_cast<std::int64_t>(p)) return;
  const double now = clock_.now();
  st.wait_s += now - w_[w].activity_start;
  span(w, activity::wait, w_[w].activity_start, now);
  s.blocked_on = -1;
  stream_merge(w, p);
  stream_compute(w);
}

// Fragment p's replies are merged into the worker's model (the hook runs
// ps::streaming_merge); the fragment is off the wire.
template <sync::consistency_policy Policy>
inline void simulator<Policy>::stream_merge(std::uint32_t w, std::uint32_t p) {
  if (hooks_.merge) hooks_.merge(w, p);
  auto& y = sync_[w * fragments_ + p];
  y.flying = false;
  y.replied = false;
}

}  // namespace sim
ASHL_NAMESPACE_END
