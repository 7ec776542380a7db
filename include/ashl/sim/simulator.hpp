// ashl/sim/simulator.hpp — runs workers and servers in virtual time over a
// modelled network, driving any consistency policy (sync::any_policy).
//
//   auto spec = ashl::sim::load_cluster_spec("cluster.json");
//   auto policy = ashl::sync::make_policy("ssp", params);
//   ashl::sim::simulator s(*spec, std::move(*policy));          // timing only
//   auto r = s.run({.commits_per_worker = 1000});
//   std::cout << r.end_time << " s, wait fraction " << r.wait_fraction() << '\n';
//
//   ashl::sim::hooks h;                                          // full mode
//   h.compute = [&](auto w, const auto& plan, auto iters, auto batch, auto seq) {
//     return trainer.local_steps(w, iters, batch, plan.compression_ratio, seq); };  // payload bytes
//   h.apply = [&](std::span<const ashl::sync::weighted_commit> cs) { server.add(cs); };
//   h.serve = [&](auto w) { snapshot[w] = server.W; };
//   h.deliver = [&](auto w) { trainer.load(w, snapshot[w]); };
//   h.evaluate = [&](double t) { return ashl::sim::evaluation{{{"loss", eval()}}}; };
//
// One worker's cycle: compute (H local iterations of its plan, or, with
// H = 0, iterations until the plan's commit interval is filled), compress
// (when the plan's ratio is below 1 and the spec gives a codec time), send the
// commit (payload + header, split evenly over the servers, each shard a
// transfer on that server's shared ingress link), at arrival the policy sees
// on_commit and on_pull (the pull is piggybacked on the commit), then either
// the reply (the dense model, over the servers' egress links) starts, or the
// worker waits until the policy releases its pull; at the reply's arrival the
// worker loads the model and computes again. The policy is told measurements
// (compute per iteration, compress, push, pull, commit = push + pull) and, every
// metric_interval, the metrics the evaluate hook returns. Without hooks the
// run is timing only: no math, payload = model_bytes × plan ratio.
// Scheduled changes (cluster_spec.hpp) slow workers down, kill them (their
// transfers are cancelled, the policy evicts them after failure_timeout_s) or
// start them. Policies are driven, never copied: the simulator holds no
// consistency logic of its own (DESIGN.md "The one rule"). docs/sim.md.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/clock.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sim/cluster_spec.hpp>
#include <ashl/sim/event_queue.hpp>
#include <ashl/sim/network.hpp>
#include <ashl/sim/run_result.hpp>
#include <ashl/sync/events.hpp>
#include <ashl/sync/factory.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <span>
#include <string>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sim {

struct evaluation {
  std::vector<metric_sample> metrics;
  bool stop = false;  // end the run now (e.g. a target was reached)
};

// Full-mode callbacks; any may be empty. Without compute/apply the run is
// timing only.
struct hooks {
  // Worker w runs `iterations` local steps at `batch` from its local model
  // and prepares commit `sequence`; returns the payload bytes (0: dense
  // model_bytes × plan.compression_ratio).
  std::function<std::uint64_t(sync::worker_id w, const sync::worker_plan& plan, std::uint32_t iterations,
                              std::uint32_t batch, std::uint64_t sequence)>
      compute;
  // Add these commits (each with its weight) into the server parameters; one
  // call is one optimizer step.
  std::function<void(std::span<const sync::weighted_commit>)> apply;
  std::function<void(sync::worker_id)> serve;    // a pull is answered: take the parameters now
  std::function<void(sync::worker_id)> deliver;  // the answer arrived at the worker
  std::function<evaluation(double now)> evaluate;
  // Adjust the plan a worker starts a cycle with (e.g. DLB batch sizes from a planner).
  std::function<void(sync::worker_id, sync::worker_plan&)> adjust_plan;
  // Every time the policy said plans_changed.
  std::function<void(double now)> plans_changed;
};

struct run_options {
  double until = std::numeric_limits<double>::infinity();  // virtual seconds
  std::uint64_t commits_per_worker = 0;  // a worker stops after this many commits; 0: no limit
  double metric_interval = 0.0;          // seconds between evaluations; 0: none
  bool record_trace = false;
  std::size_t trace_limit = 2'000'000;   // spans kept at most
  bool measurements = true;              // tell the policy what was measured
};

class simulator {
 public:
  simulator(cluster_spec spec, sync::any_policy policy, hooks h = {})
      : spec_(std::move(spec)), policy_(std::move(policy)), hooks_(std::move(h)) {
    ASHL_ASSERT(validate(spec_).ok(), "simulator: invalid cluster_spec (validate() it first)");
    ASHL_ASSERT(policy_.has_value(), "simulator: empty policy");
  }

  [[nodiscard]] sync::any_policy& policy() noexcept { return policy_; }
  [[nodiscard]] const sync::any_policy& policy() const noexcept { return policy_; }
  [[nodiscard]] const cluster_spec& spec() const noexcept { return spec_; }
  [[nodiscard]] double now() const noexcept { return clock_.now(); }

  run_result run(const run_options& opt) {
    opt_ = opt;
    setup();
    while (!q_.empty()) {
      const event e = q_.pop();
      if (e.time > opt_.until) {
        clock_.advance_to(opt_.until);  // the run lasted the whole budget
        break;
      }
      clock_.advance_to(e.time);
      ++r_.events;
      dispatch(e);
      if (stop_) break;
    }
    finish();
    return std::move(r_);
  }

 private:
  enum kind : std::uint32_t { k_compute_done, k_compress_done, k_link_check, k_flow_done, k_arrive, k_metric, k_change, k_evict };
  enum dir : std::uint32_t { up = 0, down = 1 };
  enum class state : std::uint8_t { absent, computing, compressing, sending, waiting, receiving, done, dead };

  struct worker {
    state st = state::absent;
    double activity_start = 0.0;
    double slowdown = 1.0;
    std::uint64_t sequence = 0;
    std::uint64_t gen[2] = {0, 0};       // message generation per direction: stale events are ignored
    std::uint32_t shards_left[2] = {0, 0};
    double msg_start[2] = {0.0, 0.0};
    std::uint64_t msg_bytes[2] = {0, 0};
    double last_push_s = 0.0;
    std::uint64_t payload = 0;           // of the commit being compressed
    std::uint64_t jitter_counter = 0;
    std::uint32_t iterations = 0;
    std::uint32_t batch = 0;
  };

  // ------------------------------------------------------------ setup/finish
  void setup() {
    const std::size_t m = spec_.workers.size(), s = spec_.servers.size();
    clock_ = virtual_clock{};
    q_.clear();
    q_.reserve(4 * m + 64);
    r_ = run_result{};
    r_.workers.assign(m, worker_stats{});
    w_.assign(m, worker{});
    plans_.assign(m, sync::worker_plan{});
    links_.clear();
    link_version_.assign(2 * s, 0);
    for (std::size_t k = 0; k < s; ++k) {
      links_.emplace_back(spec_.servers[k].bandwidth_bytes_per_s);  // ingress (up)
      links_.emplace_back(spec_.servers[k].bandwidth_bytes_per_s);  // egress (down)
    }
    stop_ = false;
    std::vector<bool> joins_later(m, false);
    for (std::size_t i = 0; i < spec_.changes.size(); ++i) {
      const auto& c = spec_.changes[i];
      if (c.kind == change_kind::join) joins_later[c.worker] = true;
      q_.push(c.at, k_change, static_cast<std::uint32_t>(i));
    }
    for (std::uint32_t w = 0; w < m; ++w)
      if (joins_later[w]) handle(policy_.on_evict({w, 0.0}));
    for (std::uint32_t w = 0; w < m; ++w) {
      if (joins_later[w]) continue;
      r_.workers[w].alive = true;
      start_compute(w);
    }
    if (opt_.metric_interval > 0.0) q_.push(0.0, k_metric, 0);
  }

  void finish() {
    const double end = std::min(opt_.until, clock_.now());
    r_.end_time = end;
    for (std::uint32_t w = 0; w < w_.size(); ++w) {
      const state st = w_[w].st;
      if (st == state::computing || st == state::compressing || st == state::sending || st == state::waiting || st == state::receiving)
        close(w, end);
    }
  }

  // ---------------------------------------------------------------- events
  void dispatch(const event& e) {
    switch (e.kind) {
      case k_compute_done: on_compute_done(e.target, e.tag); break;
      case k_compress_done: on_compress_done(e.target, e.tag); break;
      case k_link_check: on_link_check(e.target, e.tag); break;
      case k_flow_done: on_flow_done(e.target, e.tag); break;
      case k_arrive: on_arrive(e.target, e.tag); break;
      case k_metric: on_metric_tick(); break;
      case k_change: on_change(spec_.changes[e.target]); break;
      case k_evict: handle(policy_.on_evict({e.target, clock_.now()})); break;
      default: ASHL_ASSERT(false, "simulator: unknown event kind");
    }
  }

  // A jitter multiplier (mean 1) from worker w's stream.
  double draw(std::uint32_t w, const jitter_spec& j) {
    if (j.kind == jitter_kind::none || j.param == 0.0) return 1.0;
    const philox_stream s(spec_.seed, 0x5eed, w);
    const auto b = s.block(w_[w].jitter_counter++);
    const double u1 = (static_cast<double>(b[0]) + 0.5) * 0x1p-32;
    if (j.kind == jitter_kind::uniform) return 1.0 - j.param + 2.0 * j.param * u1;
    const double u2 = (static_cast<double>(b[1]) + 0.5) * 0x1p-32;
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    return std::exp(j.param * z - 0.5 * j.param * j.param);
  }

  void start_compute(std::uint32_t w) {
    auto& wk = w_[w];
    sync::worker_plan plan = policy_.plan(w);
    if (hooks_.adjust_plan) hooks_.adjust_plan(w, plan);
    const auto& ws = spec_.workers[w];
    wk.batch = plan.batch_size ? plan.batch_size : ws.batch;
    const double t_iter = ws.seconds_per_iteration * wk.slowdown * static_cast<double>(wk.batch) /
                          static_cast<double>(spec_.reference_batch);
    double dur = 0.0;
    std::uint32_t n = 0;
    if (plan.local_iterations > 0) {
      for (n = 0; n < plan.local_iterations; ++n) dur += t_iter * draw(w, ws.compute_jitter);
    } else {
      const double target = plan.commit_interval;
      do {
        dur += t_iter * draw(w, ws.compute_jitter);
        ++n;
      } while (dur < target && n < (1u << 24));
    }
    wk.iterations = n;
    begin(w, state::computing);
    q_.push(clock_.now() + dur, k_compute_done, w, wk.gen[up]);
    // Kept so compute_done uses the plan the cycle started with.
    plans_[w] = std::move(plan);
  }

  void on_compute_done(std::uint32_t w, std::uint64_t gen) {
    auto& wk = w_[w];
    if (wk.st != state::computing || gen != wk.gen[up]) return;
    const double now = clock_.now();
    auto& st = r_.workers[w];
    st.compute_s += now - wk.activity_start;
    st.iterations += wk.iterations;
    st.samples += std::uint64_t{wk.iterations} * wk.batch;
    span(w, activity::compute, wk.activity_start, now);
    if (opt_.measurements)
      measure(w, sync::measurement_kind::compute, (now - wk.activity_start) / wk.iterations, wk.batch);
    ++wk.sequence;
    const auto& plan = plans_[w];
    std::uint64_t payload = 0;
    if (hooks_.compute) payload = hooks_.compute(w, plan, wk.iterations, wk.batch, wk.sequence);
    if (payload == 0)
      payload = static_cast<std::uint64_t>(std::ceil(static_cast<double>(spec_.model_bytes) * plan.compression_ratio));
    const auto& ws = spec_.workers[w];
    if (plan.compression_ratio < 1.0 && ws.compress_seconds > 0.0) {
      wk.payload = payload;
      begin(w, state::compressing);
      q_.push(now + ws.compress_seconds * wk.slowdown * draw(w, ws.compute_jitter), k_compress_done, w, wk.gen[up]);
      return;
    }
    begin(w, state::sending);
    send(w, up, payload);
  }

  void on_compress_done(std::uint32_t w, std::uint64_t gen) {
    auto& wk = w_[w];
    if (wk.st != state::compressing || gen != wk.gen[up]) return;
    const double now = clock_.now();
    r_.workers[w].compress_s += now - wk.activity_start;
    span(w, activity::compress, wk.activity_start, now);
    if (opt_.measurements) measure(w, sync::measurement_kind::compress, now - wk.activity_start, wk.payload);
    begin(w, state::sending);
    send(w, up, wk.payload);
  }

  // Start a message (commit up, or reply down), one transfer per server.
  void send(std::uint32_t w, dir d, std::uint64_t payload) {
    auto& wk = w_[w];
    const std::size_t s = spec_.servers.size();
    ++wk.gen[d];
    wk.shards_left[d] = static_cast<std::uint32_t>(s);
    wk.msg_start[d] = clock_.now();
    const auto& ws = spec_.workers[w];
    const double cap = ws.bandwidth_bytes_per_s / static_cast<double>(s) / (wk.slowdown * draw(w, ws.comm_jitter));
    std::uint64_t total = 0;
    for (std::size_t k = 0; k < s; ++k) {
      const std::uint64_t part = payload / s + (k < payload % s ? 1 : 0) + spec_.header_bytes;
      total += part;
      const std::uint32_t li = static_cast<std::uint32_t>(2 * k + d);
      const std::uint64_t fid = flow_id(w, d, k);
      auto& link = links_[li];
      if (!std::isfinite(link.bandwidth())) {
        const double t = std::isfinite(cap) ? static_cast<double>(part) / cap : 0.0;
        q_.push(clock_.now() + t, k_flow_done, static_cast<std::uint32_t>(fid), wk.gen[d]);
      } else {
        link.add(clock_.now(), fid, static_cast<double>(part), cap);
        reschedule(li);
      }
    }
    wk.msg_bytes[d] = total;
    if (d == up) r_.workers[w].bytes_sent += total;
    else r_.workers[w].bytes_received += total;
  }

  [[nodiscard]] std::uint64_t flow_id(std::uint32_t w, dir d, std::size_t shard) const {
    return (std::uint64_t{w} * 2 + d) * spec_.servers.size() + shard;
  }

  void reschedule(std::uint32_t li) {
    auto c = links_[li].next_completion(clock_.now());
    ++link_version_[li];
    if (c) q_.push(c->time, k_link_check, li, link_version_[li]);
  }

  void on_link_check(std::uint32_t li, std::uint64_t version) {
    if (version != link_version_[li]) return;
    auto c = links_[li].next_completion(clock_.now());
    if (!c) return;
    links_[li].remove(clock_.now(), c->id);
    reschedule(li);
    flow_finished(c->id);
  }

  void on_flow_done(std::uint32_t fid, std::uint64_t gen) {
    const std::size_t s = spec_.servers.size();
    const std::uint64_t msg = fid / s;
    const auto w = static_cast<std::uint32_t>(msg / 2);
    const auto d = static_cast<dir>(msg % 2);
    if (gen != w_[w].gen[d]) return;
    flow_finished(fid);
  }

  // The bytes of one shard left the link; it arrives after the latencies.
  void flow_finished(std::uint64_t fid) {
    const std::size_t s = spec_.servers.size();
    const std::uint64_t msg = fid / s;
    const auto w = static_cast<std::uint32_t>(msg / 2);
    const auto d = static_cast<dir>(msg % 2);
    const double lat = spec_.workers[w].latency_s + spec_.servers[fid % s].latency_s;
    q_.push(clock_.now() + lat, k_arrive, static_cast<std::uint32_t>(fid), w_[w].gen[d]);
  }

  void on_arrive(std::uint32_t fid, std::uint64_t gen) {
    const std::size_t s = spec_.servers.size();
    const std::uint64_t msg = fid / s;
    const auto w = static_cast<std::uint32_t>(msg / 2);
    const auto d = static_cast<dir>(msg % 2);
    auto& wk = w_[w];
    if (gen != wk.gen[d] || wk.shards_left[d] == 0) return;
    if (--wk.shards_left[d] > 0) return;
    if (d == up) commit_arrived(w);
    else reply_arrived(w);
  }

  void commit_arrived(std::uint32_t w) {
    auto& wk = w_[w];
    const double now = clock_.now();
    auto& st = r_.workers[w];
    st.send_s += now - wk.activity_start;
    span(w, activity::send, wk.activity_start, now);
    ++st.commits;
    ++r_.commits;
    wk.last_push_s = now - wk.msg_start[up];
    if (opt_.measurements) measure(w, sync::measurement_kind::push, wk.last_push_s, wk.msg_bytes[up]);
    const sync::commit_event c{w, wk.sequence, wk.sequence, now, wk.msg_bytes[up],
                               std::uint64_t{wk.iterations} * wk.batch};
    sync::commit_decision d = policy_.on_commit(c);
    if (d.action == sync::commit_action::apply) {
      const sync::weighted_commit one{w, wk.sequence, d.weight};
      apply({&one, 1});
    }
    // The worker waits from here; a release inside the effects ends the wait.
    begin(w, state::waiting);
    handle(std::move(d.effects));
    if (opt_.commits_per_worker > 0 && st.commits >= opt_.commits_per_worker) {
      // Done: no pull. A release may have started a reply: cancel it.
      wk.st = state::done;
      ++wk.gen[down];
      wk.shards_left[down] = 0;
      cancel_flows(w, down);
      check_all_done();
      return;
    }
    if (wk.st != state::waiting) return;  // already released by the effects above
    sync::pull_decision p = policy_.on_pull({w, now});
    handle(std::move(p.effects));
    if (p.action == sync::pull_action::serve && wk.st == state::waiting) start_reply(w);
  }

  void check_all_done() {
    for (const auto& wk : w_)
      if (wk.st != state::done && wk.st != state::dead && wk.st != state::absent) return;
    stop_ = true;
  }

  void start_reply(std::uint32_t w) {
    auto& wk = w_[w];
    const double now = clock_.now();
    if (wk.st == state::waiting) {
      r_.workers[w].wait_s += now - wk.activity_start;
      span(w, activity::wait, wk.activity_start, now);
    }
    if (hooks_.serve) hooks_.serve(w);
    begin(w, state::receiving);
    send(w, down, spec_.model_bytes);
  }

  void reply_arrived(std::uint32_t w) {
    auto& wk = w_[w];
    const double now = clock_.now();
    r_.workers[w].receive_s += now - wk.activity_start;
    span(w, activity::receive, wk.activity_start, now);
    if (hooks_.deliver) hooks_.deliver(w);
    if (opt_.measurements) {
      const double pull_s = now - wk.msg_start[down];
      measure(w, sync::measurement_kind::pull, pull_s, spec_.model_bytes);
      if (wk.sequence > 0) measure(w, sync::measurement_kind::commit, wk.last_push_s + pull_s, 0);
    }
    start_compute(w);
  }

  void release(sync::worker_id w) {
    if (w >= w_.size()) return;
    // Only a worker blocked on its pull takes a reply; a release for a worker
    // that has not asked yet (its commit released itself) is answered below
    // by its own on_pull, which the policy then serves.
    if (w_[w].st == state::waiting) start_reply(w);
  }

  void apply(std::span<const sync::weighted_commit> cs) {
    ++r_.applications;
    if (hooks_.apply) hooks_.apply(cs);
  }

  void handle(sync::outcome&& o) {
    if (!o.round.empty()) apply(o.round);
    for (auto w : o.released) release(w);
    if (o.plans_changed && hooks_.plans_changed) hooks_.plans_changed(clock_.now());
  }

  void measure(std::uint32_t w, sync::measurement_kind k, double seconds, std::uint64_t amount) {
    if (!(seconds > 0.0)) return;
    handle(policy_.on_measurement({w, k, seconds, amount, clock_.now()}));
  }

  void on_metric_tick() {
    const double now = clock_.now();
    metric_row row;
    row.time = now;
    for (const auto& s : r_.workers) row.bytes_sent += s.bytes_sent;
    row.commits = r_.commits;
    if (hooks_.evaluate) {
      evaluation ev = hooks_.evaluate(now);
      for (const auto& m : ev.metrics) handle(policy_.on_metric({m.name, m.value, now}));
      row.metrics = std::move(ev.metrics);
      if (ev.stop) {
        stop_ = true;
        r_.stopped_by_hook = true;
      }
    }
    r_.metrics.push_back(std::move(row));
    // Nothing else pending: nothing can change any more, so stop ticking.
    if (!stop_ && !q_.empty()) q_.push(now + opt_.metric_interval, k_metric, 0);
  }

  void on_change(const scheduled_change& c) {
    const std::uint32_t w = c.worker;
    auto& wk = w_[w];
    const double now = clock_.now();
    switch (c.kind) {
      case change_kind::slowdown: wk.slowdown = c.factor; break;
      case change_kind::die:
        if (wk.st == state::dead || wk.st == state::absent) break;
        if (wk.st != state::done) close(w, now);
        wk.st = state::dead;
        r_.workers[w].alive = false;
        ++wk.gen[up];
        ++wk.gen[down];
        wk.shards_left[up] = wk.shards_left[down] = 0;
        cancel_flows(w, up);
        cancel_flows(w, down);
        q_.push(now + spec_.failure_timeout_s, k_evict, w);
        break;
      case change_kind::join:
        if (wk.st != state::absent && wk.st != state::dead) break;
        r_.workers[w].alive = true;
        wk.sequence = 0;
        handle(policy_.on_join({w, now}));
        begin(w, state::waiting);
        {
          sync::pull_decision p = policy_.on_pull({w, now});
          handle(std::move(p.effects));
          if (p.action == sync::pull_action::serve && wk.st == state::waiting) start_reply(w);
        }
        break;
    }
  }

  void cancel_flows(std::uint32_t w, dir d) {
    for (std::size_t k = 0; k < spec_.servers.size(); ++k) {
      const auto li = static_cast<std::uint32_t>(2 * k + d);
      if (!std::isfinite(links_[li].bandwidth())) continue;  // its event carries a stale generation
      if (links_[li].remove(clock_.now(), flow_id(w, d, k))) reschedule(li);
    }
  }

  // Accounts the activity in progress up to `t` (death, end of run).
  void close(std::uint32_t w, double t) {
    auto& wk = w_[w];
    auto& st = r_.workers[w];
    const double dt = std::max(0.0, t - wk.activity_start);
    switch (wk.st) {
      case state::computing: st.compute_s += dt; span(w, activity::compute, wk.activity_start, t); break;
      case state::compressing: st.compress_s += dt; span(w, activity::compress, wk.activity_start, t); break;
      case state::sending: st.send_s += dt; span(w, activity::send, wk.activity_start, t); break;
      case state::waiting: st.wait_s += dt; span(w, activity::wait, wk.activity_start, t); break;
      case state::receiving: st.receive_s += dt; span(w, activity::receive, wk.activity_start, t); break;
      default: break;
    }
  }

  void begin(std::uint32_t w, state s) {
    w_[w].st = s;
    w_[w].activity_start = clock_.now();
  }
  void span(std::uint32_t w, activity a, double start, double end) {
    if (opt_.record_trace && r_.trace.size() < opt_.trace_limit && end > start)
      r_.trace.push_back({w, a, start, end});
  }

  cluster_spec spec_;
  sync::any_policy policy_;
  hooks hooks_;
  run_options opt_{};
  virtual_clock clock_;
  event_queue q_;
  std::vector<shared_link> links_;
  std::vector<std::uint64_t> link_version_;
  std::vector<worker> w_;
  std::vector<sync::worker_plan> plans_;
  run_result r_;
  bool stop_ = false;
};

}  // namespace sim
ASHL_NAMESPACE_END
