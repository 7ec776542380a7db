// ashl/sim/simulator.hpp — runs workers and parameter servers in virtual time
// over a modelled network. The servers are ps::server_core (one per server,
// each with its own copy of the policy) and the workers follow
// ps::worker_cycle: the same rules the real server and worker run.
//
//   ashl::sim::cluster_spec spec = ...;                         // sim/cluster_spec.hpp
//   auto s = ashl::sim::simulator<>::create(spec, std::move(*ashl::ps::make_policy("ssp", pp)));
//   if (!s) std::cerr << s.error().message();                   // "policy.workers = 3: must be ..."
//   auto r = s->run({.commits_per_worker = 1000});               // timing only
//   std::cout << r.end_time << " s, wait fraction " << r.wait_fraction() << '\n';
//
//   ashl::sim::hooks h;                                          // full mode: real math
//   h.compute = [&](const ashl::sim::compute_request& q, std::span<ashl::sim::shard_payload> out) {
//     trainer.local_steps(q.worker, q.iterations, q.batch);      // then encode each shard's range
//     for (std::uint32_t k = 0; k < out.size(); ++k) out[k] = trainer.encode(q.worker, q.layout->range(k)); };
//   h.serve = [&](auto w, auto server, std::span<const float> p) { trainer.receive(w, server, p); };
//   h.deliver = [&](auto w) { trainer.load(w); };
//   h.evaluate = [&](double t, std::span<const float> W) { return ashl::sim::evaluation{{{ashl::metric_id::loss, loss(W)}}}; };
//   auto s = ashl::sim::simulator<>::create(spec, policy, h, {.elements = n, .optimizer = {.lr = 0.1}, .initial = W0});
//
// One worker's cycle: compute (H local iterations of its plan, or, with
// H = 0, iterations until the plan's commit interval is filled; decided by
// ps::worker_cycle), compress (when the plan's ratio is below 1 and the spec
// gives a codec time), send the commit: one shard per server (payload +
// header), each a transfer on that server's shared ingress link. At the
// arrival of shard k, server k's core takes the commit with the pull riding
// along (server_core::commit); its actions drive the network: every pull
// reply it names starts a transfer of that server's parameters on its egress
// link. The worker waits until every server has replied and computes again.
// Measurements (compute, compress, push, pull, commit) are worker_cycle's,
// sent to every server by worker_cycle's rule, as the real worker sends
// them: at the cycle's end once run_options.reports.interval has passed
// since the worker's last measurements message, or when its batch is
// nearly full, and when it is done; a measurements message is a small
// message (as a plan_update is: no link bandwidth) that reaches server k
// after the worker's and k's latencies. Metrics (the evaluate hook, every
// metric_interval) are told to every server at once. Without a compute hook the run is timing only: a layout of 0
// elements, payload = model_bytes × plan ratio. Scheduled changes
// (cluster_spec.hpp) slow workers down, kill them (their transfers are
// cancelled, every server evicts them after failure_timeout_s), let them
// leave (after their cycle in progress; the servers drop them at once) or
// start them. The servers' cores start with the initial workers (ids
// 0..M0-1, those without a join change) and admit joiners up to
// cluster_spec::max_workers; a join past it is refused by the cores and
// counted (run_result::refused_joins), docs/elastic.md §2.5.
// The simulator holds no consistency or commit logic of its own (docs/design.md
// "The one rule"). docs/sim.md.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/clock.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>
#include <ashl/rules/commit_check.hpp>
#include <ashl/rules/commit_encoder.hpp>
#include <ashl/rules/commit_in.hpp>
#include <ashl/rules/server_core.hpp>
#include <ashl/rules/shards.hpp>
#include <ashl/rules/streaming.hpp>
#include <ashl/rules/worker_cycle.hpp>
#include <ashl/sim/cluster_spec.hpp>
#include <ashl/sim/event_queue.hpp>
#include <ashl/sim/network.hpp>
#include <ashl/sim/run_result.hpp>
#include <ashl/sync/any_policy.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/events.hpp>
#include <ashl/wire/ids.hpp>
#include <ashl/wire/message.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sim {

struct evaluation {
  std::vector<metric_sample> metrics;
  bool stop = false;  // end the run now (e.g. a target was reached)
};

// What a worker's compute hook is asked to do: run `iterations` local steps
// at `batch` from its local model, then encode commit `sequence`, one
// payload per shard of `layout`.
struct compute_request {
  sync::worker_id worker = 0;
  const worker_plan* plan = nullptr;
  codec_id codec = codec_id::identity;  // the codec in force with the plan (worker_cycle::codec())
  std::uint32_t iterations = 0;
  std::uint32_t batch = 0;
  std::uint64_t sequence = 0;
  const ps::shard_layout* layout = nullptr;
  // With server_setup::streaming (fragments = P > 0): the layout has S·P
  // ranges, range k·P + p is fragment p's part on server k, and out[k] is
  // fragment `fragment`'s part for server k; out is empty when no fragment
  // syncs after these iterations (run them, encode nothing). 0: out[k] is
  // the commit's shard k, range k of the layout.
  std::uint32_t fragment = 0;
  std::uint32_t fragments = 0;
};

// One shard of a commit as the worker encoded it. The bytes belong to the
// hook and must stay valid until the same worker's next compute call (a
// worker computes again only after its commit has arrived everywhere).
struct shard_payload {
  codec_id codec = codec_id::identity;
  dtype type = dtype::f32;
  std::uint64_t element_count = 0;  // elements of the shard's range
  std::uint64_t step = 0;           // codec_context.step of the encode
  std::uint32_t tensor = 0;         // codec_context.tensor of the encode
  std::span<const std::byte> bytes{};
};

// Full-mode callbacks; any may be empty. Without compute the run is timing
// only (payload sizes from the plan's compression ratio).
struct hooks {
  // Run the local steps and fill out[k] (out.size() == servers) with the
  // commit's shard for server k. In timing-only mode (elements == 0) only the
  // byte counts are used (nothing is decoded).
  std::function<void(const compute_request&, std::span<shard_payload> out)> compute;
  // Server `server` answers worker w's pull now: its parameters (the range of
  // its shard; empty in timing-only mode). Copy what the worker will load.
  std::function<void(sync::worker_id w, std::uint32_t server, std::span<const float> parameters)> serve;
  std::function<void(sync::worker_id)> deliver;  // every server's answer has arrived
  // Streaming (server_setup::streaming) instead of deliver: fragment p's
  // answers (serve, per server) are merged now (ps::streaming_merge with
  // streaming.alpha), before the worker's next inner step. Required in full
  // mode with streaming.
  std::function<void(sync::worker_id, std::uint32_t fragment)> merge;
  // Every metric_interval: the metrics to report, given the servers'
  // parameters (all shards in order; empty in timing-only mode).
  std::function<evaluation(double now, std::span<const float> parameters)> evaluate;
  // Server 0 sent plan updates (a policy changed plans).
  std::function<void(double now)> plans_changed;
  // Every measurement a worker reports, when its measurements message is
  // sent (ps::worker_cycle's rule); the servers get it after the latencies.
  std::function<void(const measurement&)> measured;
};

// The servers' model in full mode; elements == 0 is timing only.
struct server_setup {
  std::uint64_t elements = 0;             // parameters (f32), split evenly over the servers
  ps::optimizer_params optimizer{};
  std::span<const float> initial{};       // elements values, or empty (zeros)
  std::uint64_t store_bytes = 0;  // per server: bound on buffered commit bytes; 0: automatic (ps::automatic_store_bytes)
  std::uint64_t seed = 0;                 // codec_context seed of the decodes
  // What a compressing plan commits with (ps::server_params::compression):
  // each plan reaches its worker with ps::plan_codec(plan, compression).
  codec_id compression = codec_id::topk;
  // Its options (ps::server_params::compression_options), filled into each
  // compressing plan the policy left them 0 in (ps::plan_with_codec_options).
  codec_options compression_options{};
  // The ratio of the plans the policy leaves dense (ps::server_params::compression_ratio).
  float compression_ratio = 1.0f;
  bool allow_non_finite = false;          // ps::server_core_params::allow_non_finite
  std::uint64_t max_commit_samples = std::uint64_t{1} << 30;  // ps::server_core_params::max_commit_samples
  // How pull replies are compressed (ps::server_core_params::replies,
  // rules/reply_encoder.hpp): the serve hook then gets the parameters as
  // the worker holds them (its view), and a reply's bytes are the codec's.
  ps::reply_compression replies{};
  // Streaming DiLoCo's fragments (rules/streaming.hpp): each server holds
  // P cores, one per fragment (fragment p's commits apply to its range
  // only), and a worker syncs fragment p after the inner steps the schedule
  // names, computing on while it is on the wire, merging it τ steps later.
  // Empty: a worker syncs the whole model per cycle (worker_cycle).
  std::optional<ps::streaming_params> streaming{};
  // The data ledger (ps::server_core_params::ledger, docs/elastic.md §3):
  // server 0's core runs it; the initial workers join it at time 0 with
  // their batch, joiners with theirs, and each worker trains on the leases
  // server 0 sends it, in order (run_result::ledger checks each position is
  // used once per epoch). samples = 0: none. Not with streaming.
  ps::ledger_params ledger{};
};

struct run_options {
  double until = std::numeric_limits<double>::infinity();  // virtual seconds
  std::uint64_t commits_per_worker = 0;  // a worker stops after this many commits; 0: no limit
  double metric_interval = 0.0;          // seconds between evaluations; 0: none
  bool record_trace = false;
  std::size_t trace_limit = 2'000'000;   // spans kept at most
  bool measurements = true;              // tell the servers what the workers measured
  // When a worker's measurements go to the servers: the real worker's
  // rule and default (ps::worker_params::measurement_interval,
  // measurement_batch); batch >= 8, interval >= 0 and finite.
  ps::report_rule reports{};
};

template <sync::consistency_policy Policy = sync::any_policy>
class simulator {
 public:
  using core_type = ps::server_core<Policy>;

  // Checks the spec (validate), the policy (it must know exactly the spec's
  // initial workers, initial_workers(spec), with usable initial plans) and the server setup; every error
  // names the field and the value.
  static result<simulator> create(cluster_spec spec, Policy policy, hooks h = {}, server_setup setup = {}) {
    ASHL_TRY(validate(spec));
    // The cores start with the initial set (ids 0..M0-1) and admit joiners
    // up to max_workers (docs/elastic.md §2.5).
    const std::uint32_t m0 = initial_workers(spec);
    const auto max_workers = static_cast<std::uint32_t>(max_workers_of(spec));
    ASHL_TRY(check_policy(policy, m0));
    const auto servers = static_cast<std::uint32_t>(spec.servers.size());
    if (setup.elements > 0) {
      if (spec.model_bytes != 4 * setup.elements)
        return invalid_argument("spec.model_bytes", spec.model_bytes,
                                "must be 4 x server elements (" + std::to_string(setup.elements) + " f32) in full mode");
      if (!h.compute) return invalid_argument("hooks.compute", "empty", "required in full mode (elements > 0)");
    }
    if (!setup.initial.empty() && setup.initial.size() != setup.elements)
      return invalid_argument("server.initial.size", setup.initial.size(),
                              "must be 0 or server.elements (" + std::to_string(setup.elements) + ")");
    std::uint32_t fragments = 1;
    if (setup.streaming) {
      // Every core holds at least one element: P <= the parameters per server.
      const std::uint64_t units = setup.elements > 0 ? setup.elements / servers : ~std::uint64_t{0};
      ASHL_TRY(setup.streaming->validate(units, "parameters per server"));
      if (setup.elements > 0 && !h.merge)
        return invalid_argument("hooks.merge", "empty", "required in full mode with server.streaming");
      if (setup.ledger.samples > 0)
        return invalid_argument("server.ledger.samples", setup.ledger.samples,
                                "the data ledger follows whole-model commits: not with server.streaming");
      for (const auto& c : spec.changes)
        if (c.kind != change_kind::slowdown)
          return invalid_argument("spec.changes.kind", to_string(c.kind),
                                  "server.streaming models slowdowns only (no deaths, joins or leaves yet)");
      for (std::size_t w = 0; w < spec.workers.size(); ++w)
        if (spec.workers[w].push)
          return invalid_argument("spec.workers[" + std::to_string(w) + "].push", true,
                                  "server.streaming merges the servers' replies: a pushing worker gets none");
      fragments = setup.streaming->fragments;
    }
    auto layout = ps::shard_layout::even(setup.elements, servers * fragments);
    if (!layout) return layout.error();
    simulator s;
    s.fragments_ = fragments;
    if (setup.streaming) s.schedule_ = ps::streaming_schedule(*setup.streaming);
    s.streaming_ = setup.streaming.has_value();
    s.spec_ = std::move(spec);
    s.hooks_ = std::move(h);
    s.layout_ = *layout;
    s.compression_ = setup.compression;
    s.compression_options_ = setup.compression_options;
    ASHL_TRY(ps::check_codec_options(setup.compression, setup.compression_options, "server.compression_options."));
    ASHL_TRY(ps::check_compression_ratio(setup.compression_ratio, setup.compression, "server.compression_ratio"));
    s.compression_ratio_ = setup.compression_ratio;
    s.allow_non_finite_ = setup.allow_non_finite;
    const std::uint32_t cores = servers * fragments;  // core k·P + p: server k, fragment p
    s.cores_.reserve(cores);
    for (std::uint32_t k = 0; k < cores; ++k) {
      const ps::key_range r = s.layout_.range(k);
      std::span<const float> init;
      if (!setup.initial.empty()) init = setup.initial.subspan(r.begin, r.size());
      auto c = core_type::create({.layout = s.layout_, .shard = k,
                                  .workers = m0, .max_workers = max_workers,
                                  .optimizer = setup.optimizer, .store_bytes = setup.store_bytes, .seed = setup.seed,
                                  .allow_non_finite = setup.allow_non_finite,
                                  .max_commit_samples = setup.max_commit_samples,
                                  .replies = setup.replies,
                                  .ledger = k == 0 ? setup.ledger : ps::ledger_params{}},
                                 k + 1 == cores ? std::move(policy) : Policy(policy), init);
      if (!c) return c.error();
      s.cores_.push_back(std::move(*c));
    }
    return s;
  }

  [[nodiscard]] const Policy& policy(std::uint32_t server = 0) const { return cores_[server].policy(); }
  [[nodiscard]] const core_type& core(std::uint32_t server = 0) const { return cores_[server]; }
  [[nodiscard]] const cluster_spec& spec() const noexcept { return spec_; }
  [[nodiscard]] const ps::shard_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] double now() const noexcept { return clock_.now(); }
  // τ of worker w's last reply (server 0's server_core::serve_staleness, as
  // a real worker reads it from the pull reply): readable from the deliver
  // hook for staleness compensation.
  [[nodiscard]] std::uint64_t staleness(sync::worker_id w) const noexcept {
    return w < w_.size() ? w_[w].staleness : 0;
  }
  // Compute cycles of worker w slowed by cluster_spec::stragglers so far.
  [[nodiscard]] std::uint64_t straggles(sync::worker_id w) const noexcept {
    return w < w_.size() ? w_[w].straggles : 0;
  }
  // Every server's parameters, shards in order (a copy; empty when timing only).
  [[nodiscard]] std::vector<float> parameters() const {
    std::vector<float> p;
    for (const auto& c : cores_) p.insert(p.end(), c.parameters().begin(), c.parameters().end());
    return p;
  }

  // One run per simulator (the servers' state carries the run).
  run_result run(const run_options& opt) {
    ASHL_ASSERT(!ran_, "simulator::run: a simulator runs once (create another)");
    ran_ = true;
    opt_ = opt;
    if (opt_.reports.batch < ps::report_rule::min_batch) {
      r_.error = invalid_argument("run_options.reports.batch", opt_.reports.batch, "must be >= 8").message();
      return std::move(r_);
    }
    if (!(opt_.reports.interval >= 0.0) || !std::isfinite(opt_.reports.interval)) {
      r_.error = invalid_argument("run_options.reports.interval", opt_.reports.interval, "must be >= 0 and finite")
                     .message();
      return std::move(r_);
    }
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
  simulator() = default;

  static status check_policy(const Policy& p, std::size_t m) {
    if constexpr (std::is_same_v<Policy, sync::any_policy>) {
      if (!p.has_value()) return invalid_argument("policy", "empty", "an any_policy must hold a policy");
    }
    // m: the spec's initial workers (initial_workers: those without a join
    // change; all of them when nothing joins).
    for (std::size_t w = 0; w < m; ++w)
      if (!p.is_live(static_cast<sync::worker_id>(w)))
        return invalid_argument("policy.workers", w, "must be the spec's initial workers (" + std::to_string(m) +
                                                         "): the policy does not know worker " + std::to_string(w));
    if (p.is_live(static_cast<sync::worker_id>(m)))
      return invalid_argument("policy.workers", "> " + std::to_string(m),
                              "must be the spec's initial workers (" + std::to_string(m) + "): worker " +
                                  std::to_string(m) + " would never commit (a joiner is not known before its join)");
    for (std::size_t w = 0; w < m; ++w) {
      const worker_plan pl = p.plan(static_cast<sync::worker_id>(w));
      ASHL_TRY(check_plan(pl, "policy.plan(" + std::to_string(w) + ")"));
    }
    return {};
  }

  enum kind : std::uint32_t {
    k_compute_done, k_compress_done, k_link_check, k_flow_done, k_arrive, k_metric, k_change, k_evict, k_plan,
    k_measurements, k_leave
  };
  enum dir : std::uint32_t { up = 0, down = 1 };
  // left: it sent leave (a leave change); done: it reached its commit
  // limit (still live at the servers).
  enum class state : std::uint8_t { absent, computing, compressing, sending, waiting, receiving, done, dead, left };

  struct worker {
    state st = state::absent;
    double activity_start = 0.0;
    double slowdown = 1.0;
    std::uint64_t jitter_counter = 0;
    std::uint64_t straggle_counter = 0, straggles = 0;  // cluster_spec::stragglers draws, and slowed cycles
    std::uint64_t incarnation = 0;
    std::uint64_t sequence = 0;          // of the commit in flight
    std::uint64_t gen[2] = {0, 0};       // message generation per direction: stale events are ignored
    std::uint32_t up_left = 0;           // commit shards not yet arrived
    std::uint32_t down_started = 0;      // reply shards started (servers that answered)
    std::uint64_t staleness = 0;         // τ of its last reply (server_core::serve_staleness)
    std::uint32_t down_left = 0;         // reply shards not yet arrived
    std::uint64_t up_bytes = 0, down_bytes = 0, down_payload = 0;
    bool last_commit = false;            // no pull rides with this commit (the worker is done after it)
    bool pull_only = false;              // the reply awaited is the join's pull's (not a commit's)
    bool leaving = false;                // a leave change: it leaves once its cycle in progress ends
    worker_plan plan{};                  // of the cycle in progress
  };

  // The server that holds core j (core k·P + p: server k, fragment p).
  [[nodiscard]] std::uint32_t server_of_core(std::size_t j) const noexcept {
    return static_cast<std::uint32_t>(j / fragments_);
  }

  // ------------------------------------------------------------ setup/finish
  void setup() {
    const std::size_t m = spec_.workers.size(), s = spec_.servers.size();
    clock_ = virtual_clock{};
    q_.clear();
    mail_.clear();
    free_mail_.clear();
    free_reports_.clear();
    for (std::uint32_t i = 0; i < reports_mail_.size(); ++i) free_reports_.push_back(i);
    q_.reserve(4 * m * s + 64);
    r_ = run_result{};
    r_.workers.assign(m, worker_stats{});
    r_.server_steps.assign(s, 0);
    w_.assign(m, worker{});
    cycles_.clear();
    cycles_.reserve(m);
    for (std::uint32_t w = 0; w < m; ++w) cycles_.emplace_back(w, opt_.reports);
    act_.reserve(m);
    leases_held_.assign(ledger_on() ? m : 0, {});
    uses_.clear();
    payloads_.assign(s, shard_payload{});
    check_parts_.reserve(s);
    {
      std::vector<double> bandwidths;  // per server: ingress (up), then egress (down)
      for (std::size_t k = 0; k < s; ++k)
        bandwidths.insert(bandwidths.end(), 2, spec_.servers[k].bandwidth_bytes_per_s);
      links_.reset(bandwidths);
    }
    stop_ = false;
    sw_.assign(streaming_ ? m : 0, stream_worker{});
    sync_.assign(streaming_ ? m * fragments_ : 0, stream_sync{});
    for (std::size_t i = 0; i < spec_.changes.size(); ++i)
      q_.push(spec_.changes[i].at, k_change, static_cast<std::uint32_t>(i));
    // The initial set, ids 0..M0-1 (validate()): the cores know them from
    // creation; a worker with a join change is absent until it joins.
    const std::uint32_t m0 = cores_[0].params().workers;
    running_ = 0;
    for (std::uint32_t w = 0; w < m0; ++w) {
      r_.workers[w].alive = true;
      ++running_;
      // With a ledger, its join's leases (the cores hold it live from
      // creation; the ledger learns of it, and its batch, here).
      if (ledger_on()) {
        cores_[0].join(w, 0, 0.0, act_, spec_.workers[w].batch);
        take_leases();
        act_.clear();  // the plan is the one adopted below
      }
      // The join's plan (the real worker waits for it before its first cycle).
      const worker_plan first = cores_[0].policy().plan(w);
      const worker_plan sent = ps::plan_with_codec_options(first, compression_, compression_options_, compression_ratio_);
      cycles_[w].plan_arrived(sent, ps::plan_codec(sent, compression_));
      // Its join's pull (not timed, as the join is not): the initial
      // parameters, which a server that compresses replies keeps as the
      // worker's view (server_setup::replies), as the real one does.
      for (std::uint32_t k = 0; k < cores_.size(); ++k)
        if (cores_[k].compresses_replies()) {
          if (reply_payload_.size() < cores_[k].max_reply_bytes()) reply_payload_.resize(cores_[k].max_reply_bytes());
          (void)cores_[k].serve_reply(w, reply_payload_, reply_bytes(k) / 4);
        }
      if (streaming_) {
        stream_start(w, sent);
        continue;
      }
      start_compute(w);
    }
    if (opt_.metric_interval > 0.0) q_.push(0.0, k_metric, 0);
  }

  void finish() {
    const double end = std::min(opt_.until, clock_.now());
    r_.end_time = end;
    for (std::uint32_t w = 0; w < w_.size(); ++w) {
      const state st = w_[w].st;
      if (st == state::computing || st == state::compressing || st == state::sending || st == state::waiting ||
          st == state::receiving)
        close(w, end);
    }
    r_.applications = r_.server_steps.empty() ? 0 : r_.server_steps[0];
    for (std::uint32_t k = 0; k < cores_.size(); ++k) r_.refused += cores_[k].stats().refused_total();
    if (ledger_on()) {
      r_.ledger.enabled = true;
      r_.ledger.epochs_completed = cores_[0].ledger().stats().epochs_completed;
      r_.ledger.used.clear();
      for (const auto& u : uses_)
        r_.ledger.used.push_back(static_cast<std::uint64_t>(std::count_if(u.begin(), u.end(), [](std::uint8_t x) {
          return x > 0;
        })));
    }
  }

  // ------------------------------------------------------ the data ledger
  //
  // Leases reach their worker as server 0 grants them (their message's
  // latency is not modelled: a worker never waits for one, and trains past
  // its leases only when the ledger had none to give, counted as overrun).
  [[nodiscard]] bool ledger_on() const noexcept { return cores_[0].ledger().enabled(); }
  void take_leases() {
    for (const auto& l : act_.leases()) {
      if (l.worker >= leases_held_.size()) continue;
      auto& held = leases_held_[l.worker];
      if ((l.flags & ps::lease_resent) != 0) {  // one it holds, from the ledger's cursor on
        for (auto& x : held)
          if (x.number == l.number) x = l;
        ++r_.ledger.resent;
        continue;
      }
      held.push_back(l);
      ++r_.ledger.leases;
    }
  }
  // Server 0 accepted a commit of w covering `samples`: the worker trained
  // the next `samples` positions of its leases, in order.
  void use_positions(std::uint32_t w, std::uint64_t samples) {
    auto& held = leases_held_[w];
    std::size_t done = 0;
    while (samples > 0 && done < held.size()) {
      auto& l = held[done];
      const std::uint64_t take = std::min(samples, l.end - l.begin);
      if (uses_.size() <= l.epoch) uses_.resize(l.epoch + 1);
      auto& u = uses_[l.epoch];
      if (u.empty()) u.assign(cores_[0].ledger().params().samples, 0);
      for (std::uint64_t p = l.begin; p < l.begin + take; ++p)
        if (u[p]++ > 0) ++r_.ledger.repeated;
      l.begin += take;
      samples -= take;
      if (l.begin == l.end) ++done;
    }
    held.erase(held.begin(), held.begin() + static_cast<std::ptrdiff_t>(done));
    r_.ledger.overrun += samples;
  }

  // ---------------------------------------------------------------- events
  void dispatch(const event& e);
  double draw(std::uint32_t w, const jitter_spec& j);
  double straggle(std::uint32_t w);
  void start_compute(std::uint32_t w);
  void on_compute_done(std::uint32_t w, std::uint64_t gen);
  void on_compress_done(std::uint32_t w, std::uint64_t gen);
  [[nodiscard]] std::uint64_t commit_payload_bytes(std::uint32_t w) const;
  [[nodiscard]] std::uint64_t shard_bytes(std::uint32_t w, std::uint64_t total, std::size_t k) const;
  void send_commit(std::uint32_t w);
  void send_shards(std::uint32_t w, std::uint64_t payload);
  double cap_of(std::uint32_t w);
  void start_flow(std::uint32_t w, dir d, std::size_t k, std::uint64_t bytes, double cap);
  [[nodiscard]] std::uint64_t flow_id(std::uint32_t w, dir d, std::size_t shard) const;
  // flow_id's inverse.
  struct flow_parts {
    std::uint32_t worker;
    dir d;
    std::uint32_t core;
  };
  [[nodiscard]] flow_parts flow_of(std::uint64_t fid) const noexcept;
  void schedule(const std::optional<link_set::check>& c);
  void on_link_check(std::uint32_t li, std::uint64_t version);
  void on_flow_done(std::uint32_t fid, std::uint64_t gen);
  void flow_finished(std::uint64_t fid);
  void on_arrive(std::uint32_t fid, std::uint64_t gen);
  void commit_shard_arrived(std::uint32_t w, std::uint32_t k, bool last);
  void check_all_done();
  void start_reply(std::uint32_t w, std::uint32_t k);
  // Worker w pushes and its pending reply is to a commit (not the join's pull).
  [[nodiscard]] bool acked(std::uint32_t w) const { return spec_.workers[w].push && !w_[w].pull_only; }
  [[nodiscard]] std::uint64_t reply_bytes(std::uint32_t k) const;
  // Server k answers w's pull (the serve hook runs): the reply's payload
  // bytes, and whether it goes compressed (then in one message).
  struct reply_size {
    std::uint64_t payload = 0;
    bool compressed = false;
  };
  reply_size serve(std::uint32_t w, std::uint32_t k);
  void to_receiving(std::uint32_t w);
  void reply_arrived(std::uint32_t w);

  // ------------------------------------------------------------- streaming
  void stream_start(std::uint32_t w, const worker_plan& plan);
  void stream_compute(std::uint32_t w);
  void stream_compute_done(std::uint32_t w);
  void stream_send(std::uint32_t w, std::uint32_t p);
  void stream_commit_arrived(std::uint32_t w, std::uint32_t j);
  void stream_reply(std::uint32_t w, std::uint32_t j);
  void stream_reply_arrived(std::uint32_t w, std::uint32_t j);
  void stream_merge(std::uint32_t w, std::uint32_t p);

  // Acts on server k's actions: replies, plan updates, errors, steps.
  void act(std::uint32_t k) {
    r_.server_steps[server_of_core(k)] += act_.steps();
    // A refusal means a hook built a commit the server cannot take (the
    // simulator's own messages are well formed): the worker would wait for
    // an answer that never comes, so the run stops and says why.
    if (!act_.errors().empty() && r_.error.empty()) {
      r_.error = "server " + std::to_string(k) + " refused worker " + std::to_string(act_.errors()[0].worker) +
                 "'s message: " + act_.errors()[0].text;
      stop_ = true;
    }
    for (const auto w : act_.pull_replies()) {
      if (streaming_) {
        stream_reply(w, k);
      } else {
        start_reply(w, k);
      }
    }
    if (k == 0) {
      // Server 0's plans travel to their workers as plan_updates do: sent
      // after the replies of the same event, arriving after the latencies
      // (a small message), adopted at the worker's next cycle start.
      for (const auto& pl : act_.plans()) mail_plan(pl.worker, pl.plan);
      if (!act_.plans().empty() && hooks_.plans_changed) hooks_.plans_changed(clock_.now());
      if (!act_.leases().empty()) take_leases();
    }
    act_.clear();
  }

  void mail_plan(std::uint32_t w, const worker_plan& plan) {
    if (w >= w_.size()) return;
    std::uint32_t slot;
    if (!free_mail_.empty()) {
      slot = free_mail_.back();
      free_mail_.pop_back();
    } else {
      slot = static_cast<std::uint32_t>(mail_.size());
      mail_.emplace_back();
    }
    mail_[slot] = {w, w_[w].incarnation, plan};
    q_.push(clock_.now() + spec_.workers[w].latency_s + spec_.servers[0].latency_s, k_plan, slot);
  }

  // A plan_update reached its worker: the cycle adopts it at its next start.
  // One sent to an earlier incarnation, or to a worker no longer running, is
  // dropped, as a closed connection drops it.
  void on_plan(std::uint32_t slot) {
    const plan_mail m = mail_[slot];
    free_mail_.push_back(slot);
    const auto& wk = w_[m.worker];
    if (wk.incarnation != m.incarnation || wk.st == state::dead || wk.st == state::absent || wk.st == state::left)
      return;
    const worker_plan sent = ps::plan_with_codec_options(m.plan, compression_, compression_options_, compression_ratio_);
    cycles_[m.worker].plan_arrived(sent, ps::plan_codec(sent, compression_));
  }

  // The end of worker w's cycle: its measurements join its outbox, and a
  // measurements message leaves when worker_cycle's rule says so.
  void report(std::uint32_t w) {
    auto& cy = cycles_[w];
    cy.report(cy.measurements(), clock_.now(), [&](std::span<const measurement> ms) { mail_measurements(w, ms); });
    cy.clear_measurements();
  }

  // One measurements message from w to every server (a small message:
  // server k has it after w's and k's latencies).
  void mail_measurements(std::uint32_t w, std::span<const measurement> ms) {
    ++r_.workers[w].measurement_messages;
    if (hooks_.measured)
      for (const auto& m : ms) hooks_.measured(m);
    if (!opt_.measurements || ms.empty()) return;
    std::uint32_t slot;
    if (!free_reports_.empty()) {
      slot = free_reports_.back();
      free_reports_.pop_back();
    } else {
      slot = static_cast<std::uint32_t>(reports_mail_.size());
      reports_mail_.emplace_back();
      reports_mail_.back().records.reserve(opt_.reports.batch);
    }
    auto& r = reports_mail_[slot];
    r.worker = w;
    r.incarnation = w_[w].incarnation;
    r.servers_left = static_cast<std::uint32_t>(cores_.size());
    r.records.assign(ms.begin(), ms.end());
    for (std::uint32_t k = 0; k < cores_.size(); ++k)
      q_.push(clock_.now() + spec_.workers[w].latency_s + spec_.servers[server_of_core(k)].latency_s, k_measurements,
              slot, k);
  }

  // A measurements message reached server k. One of a worker that died
  // since, or of its earlier incarnation, is dropped, as its cancelled
  // transfers are.
  void on_measurements(std::uint32_t slot, std::uint32_t k) {
    auto& r = reports_mail_[slot];
    const auto& wk = w_[r.worker];
    if (wk.incarnation == r.incarnation && wk.st != state::dead && wk.st != state::absent) {
      for (const auto& m : r.records) {
        cores_[k].measurement(m, act_);
        act(k);
      }
    }
    if (--r.servers_left == 0) free_reports_.push_back(slot);
  }

  void on_metric_tick() {
    const double now = clock_.now();
    metric_row row;
    row.time = now;
    for (const auto& s : r_.workers) row.bytes_sent += s.bytes_sent;
    row.commits = r_.commits;
    if (hooks_.evaluate) {
      if (layout_.elements() > 0) {
        eval_params_.clear();
        for (const auto& c : cores_) eval_params_.insert(eval_params_.end(), c.parameters().begin(), c.parameters().end());
      }
      evaluation ev = hooks_.evaluate(now, eval_params_);
      for (const auto& m : ev.metrics)
        for (std::uint32_t k = 0; k < cores_.size(); ++k) {
          cores_[k].metric(m.metric, m.value, now, act_);
          act(k);
        }
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
        if (wk.st == state::dead || wk.st == state::absent || wk.st == state::left) break;
        if (wk.st != state::done) {
          close(w, now);
          --running_;
        }
        wk.st = state::dead;
        r_.workers[w].alive = false;
        cycles_[w].abandon();
        cycles_[w].clear_measurements();
        cycles_[w].drop_reports();  // its unsent records die with it
        cancel_flows(w, up);
        cancel_flows(w, down);
        ++wk.gen[up];
        ++wk.gen[down];
        wk.up_left = wk.down_left = 0;
        q_.push(now + spec_.failure_timeout_s, k_evict, w);
        break;
      case change_kind::leave:
        if (wk.st == state::dead || wk.st == state::absent || wk.st == state::left) break;
        wk.leaving = true;
        // Done (its commit limit reached, still live at the servers): it
        // leaves now; else once the cycle in progress ends (reply_arrived).
        if (wk.st == state::done) depart(w);
        break;
      case change_kind::join:
        if (wk.st != state::absent && wk.st != state::dead && wk.st != state::left) break;
        if (w >= cores_[0].params().max_workers) {
          // Past the job's maximum: every core refuses the join
          // (refusal::max_workers) and changes nothing else; the worker
          // stays absent. Counted, not a hook's error: the run goes on.
          for (std::uint32_t k = 0; k < cores_.size(); ++k) {
            cores_[k].join(w, wk.incarnation + 1, now, act_);
            ASHL_ASSERT(act_.errors().size() == 1 && act_.errors()[0].reason == ps::refusal::max_workers,
                        "simulator: a join past max_workers must be refused by the core");
            act_.clear();
          }
          ++r_.refused_joins;
          break;
        }
        ++r_.joins;
        wk.leaving = false;
        r_.workers[w].alive = true;
        ++running_;
        ++wk.incarnation;
        cycles_[w].restart();
        cycles_[w].pull_sent(now);
        wk.pull_only = true;
        ++wk.gen[down];
        wk.down_started = 0;
        wk.down_left = static_cast<std::uint32_t>(cores_.size());
        wk.down_bytes = wk.down_payload = 0;
        begin(w, state::waiting);
        // The joiner registers with every server, then pulls from each
        // (with a ledger: the old incarnation's leases went back).
        if (ledger_on()) leases_held_[w].clear();
        for (std::uint32_t k = 0; k < cores_.size(); ++k) {
          cores_[k].join(w, wk.incarnation, now, act_, spec_.workers[w].batch);
          act(k);
        }
        for (std::uint32_t k = 0; k < cores_.size(); ++k) {
          cores_[k].pull(w, now, act_);
          act(k);
        }
        break;
    }
  }

  // Worker w's leave (a leave change, at the end of its cycle): what it
  // measured goes out, as before any departure of a real worker, and it
  // sends leave to every server, a small message that reaches server k
  // after w's and k's latencies: each core then drops it at once
  // (server_core::leave), with no failure timeout.
  void depart(std::uint32_t w) {
    auto& wk = w_[w];
    const double now = clock_.now();
    const bool was_running = wk.st != state::done;
    wk.st = state::left;
    wk.leaving = false;
    r_.workers[w].alive = false;
    cycles_[w].flush_reports(now, [&](std::span<const measurement> ms) { mail_measurements(w, ms); });
    ++r_.leaves;
    for (std::uint32_t k = 0; k < cores_.size(); ++k)
      q_.push(now + spec_.workers[w].latency_s + spec_.servers[server_of_core(k)].latency_s, k_leave, w, k);
    if (was_running) check_all_done();
  }

  // Worker w's leave reached core k (after its measurements, sent first).
  // One of an incarnation that joined again since is dropped, as the
  // newer join already replaced it.
  void on_leave(std::uint32_t w, std::uint32_t k) {
    if (w_[w].st != state::left) return;
    cores_[k].leave(w, clock_.now(), act_);
    act(k);
  }

  void cancel_flows(std::uint32_t w, dir d) {
    for (std::size_t k = 0; k < cores_.size(); ++k) {
      // (on an unlimited link the transfer's event carries a stale generation)
      schedule(links_.cancel(2 * server_of_core(k) + d, clock_.now(), flow_id(w, d, k)));
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
    if (opt_.record_trace && r_.trace.size() < opt_.trace_limit && end > start) r_.trace.push_back({w, a, start, end});
  }

  cluster_spec spec_;
  hooks hooks_;
  ps::shard_layout layout_;
  codec_id compression_ = codec_id::topk;  // server_setup::compression
  codec_options compression_options_{};    // server_setup::compression_options
  float compression_ratio_ = 1.0f;         // server_setup::compression_ratio
  bool allow_non_finite_ = false;          // server_setup::allow_non_finite (the workers' commit check too)
  std::vector<ps::commit_part_view> check_parts_;  // per server: a commit's parts for ps::check_commit_parts
  std::vector<core_type> cores_;
  std::vector<std::vector<ps::ledger_lease>> leases_held_;  // per worker, with a ledger: its leases, in order
  std::vector<std::vector<std::uint8_t>> uses_;             // per epoch, per position: commits that covered it
  ps::server_actions act_;
  run_options opt_{};
  virtual_clock clock_;
  event_queue q_;
  link_set links_;  // per server: ingress 2k, egress 2k + 1 (sim/network.hpp)
  std::vector<worker> w_;
  std::vector<ps::worker_cycle> cycles_;
  struct plan_mail {
    std::uint32_t worker = 0;
    std::uint64_t incarnation = 0;
    worker_plan plan{};
  };
  std::vector<plan_mail> mail_;             // plan_updates in flight (k_plan's target is the slot)
  std::vector<std::uint32_t> free_mail_;
  struct reports_mail {
    std::uint32_t worker = 0;
    std::uint64_t incarnation = 0;
    std::uint32_t servers_left = 0;        // servers it has not reached yet
    std::vector<measurement> records;      // capacity: run_options.reports.batch
  };
  std::vector<reports_mail> reports_mail_;  // measurements messages in flight (k_measurements: slot, server)
  std::vector<std::uint32_t> free_reports_;
  std::vector<shard_payload> payloads_;    // the compute hook's answer, one per server
  std::vector<shard_payload> payload_of_;  // per (worker, server): the commit in flight
  std::vector<float> eval_params_;
  std::vector<std::byte> reply_payload_;  // a compressed reply's payload (server_setup::replies), read for its size
  // Streaming (server_setup::streaming): P cores per server (core k·P + p),
  // the schedule, each worker's place in it and each (worker, fragment)'s
  // sync in flight.
  struct stream_worker {
    std::uint64_t step = 0;        // inner steps finished
    std::uint64_t segment_end = 0; // the step the compute in progress ends after
    std::uint32_t segment_iterations = 0;
    std::uint32_t batch = 0;
    std::uint64_t commits_sent = 0;
    std::int64_t blocked_on = -1;  // the fragment whose merge it waits for
    worker_plan plan{};
    codec_id codec = codec_id::identity;  // the plan's (ps::plan_codec)
  };
  struct stream_sync {
    std::uint64_t commits = 0;     // this fragment's commits so far: the sequence (1, 2, ...) its cores see
    std::uint64_t last_step = 0;   // the step of its previous sync
    std::uint64_t samples = 0;     // of the sync in flight
    std::uint32_t up_left = 0, down_left = 0, down_started = 0;
    std::uint64_t up_bytes = 0, down_bytes = 0;
    bool flying = false;           // synced, not merged yet
    bool replied = false;          // every server's reply arrived
    bool last = false;             // no pull rides along (the worker's last commit)
  };
  std::uint32_t fragments_ = 1;
  bool streaming_ = false;
  ps::streaming_schedule schedule_{};
  std::vector<stream_worker> sw_;
  std::vector<stream_sync> sync_;  // worker w, fragment p: w·P + p
  run_result r_;
  std::size_t running_ = 0;  // workers neither done, dead, left nor absent
  bool stop_ = false;
  bool ran_ = false;
};

}  // namespace sim
ASHL_NAMESPACE_END

// The members' bodies, by concern.
#include <ashl/sim/simulator_events.hpp>
#include <ashl/sim/simulator_streaming.hpp>
