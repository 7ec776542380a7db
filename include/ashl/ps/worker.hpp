// ashl/ps/worker.hpp — a training process's side of the parameter server:
// commits the caller's gradient (or model delta) buffer, shard by shard, and
// pulls the parameters back into the caller's buffer, following the plans the
// servers send (docs/design.md "Data flow of one commit"; docs/ps.md "Servers and
// workers"). Small, like ps-lite's worker: commit, wait, and the plan.
//
//   std::vector<float> w(n), g(n);                     // the framework's flat buffers
//   auto t = ashl::transport::ucx::create({.token = token});
//   auto wk = ashl::ps::worker<ashl::transport::ucx>::create(
//       {.rank = r, .servers = {"10.0.0.1:5000"}, .batch = 64}, std::move(*t), w);   // joins, pulls w
//   while (training) {
//     do { compute_gradient(w, g, wk->batch()); local_step(w, g); } while (!wk->iteration_done());
//     if (auto s = wk->commit(g); !s) return fail(s);  // sends at once; g must stay as is until wait()
//     overlap_something_else();                          // data loading, the next batch, ...
//     if (auto s = wk->wait(); !s) return fail(s);     // commit sent, parameters written into w
//   }
//   wk->leave();
//
// The buffers are views: a commit is sent from the caller's gradient buffer
// when the plan does not compress (identity f32, zero copy: the header is
// sealed over the payload where it lies). A pull reply is received into a
// buffer the worker owns (one model's worth, allocated at create()), its
// checksum and shape checked, and only once every server's reply of the
// pull passed is it copied into the caller's parameter buffer: a bad reply
// (CRC, size, shape) fails the wait and leaves the caller's parameters as
// they were (worker_params::stage_replies; false receives rendezvous data
// straight into the caller's buffer, checked after it landed). The check
// reads the staged reply and the copy follows it, two passes: a copy that
// checksums as it goes could only find a bad reply once it had overwritten
// the caller's values, and one that swapped them into the staging (to put
// them back) costs as much as the two passes (docs/perf/ps-passes.md,
// "Fused on the worker"). worker_params::flip_replies removes the copy
// instead: the staging and the caller's buffer take turns as the
// parameters (the pull lands in, and is checked in, the one that is not
// them, which then becomes them; parameters() says which), so the
// contract holds with one pass fewer ("Pulls that flip" there). A
// commit's CRC-32C, by contrast, is computed in
// its value check's pass (rules/commit_check.hpp). With a
// compressing plan each shard is encoded with the plan's codec and error
// feedback (one residual per shard) into a buffer the worker owns.
//
// The rules between two pulls are ps::worker_cycle's (H local iterations
// or a commit interval, batch, when to compress, the measurements to
// report), so a worker here behaves as the simulator's does. The plan that
// counts is server 0's (ps/server.hpp, "Plans"); a new plan takes effect at
// the next cycle. header.clock of a commit is its sequence (the commit
// clock), header.step the worker's iteration count (the codec's Philox
// step), header.samples the cycle's samples (worker_cycle::samples()).
//
// A follower (worker_params::follower) runs another worker's cycles: its
// plan and cycle end are the leader's (iteration_done(leader_plan, done))
// and it reports the leader's measurements, so several tensors of one
// process follow one plan authority (docs/ps.md "Plan authority").
//
// Threads: the caller drives the transport inside wait() and progress(); no
// thread of the worker's own runs unless worker_params.progress_thread is set,
// then one thread drives progress and every public call takes the same lock.
// Every wait is bounded by worker_params.timeout and ends with a status that
// says why (a server failed, refused, or did not answer in time).
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/compress/error_feedback.hpp>
#include <ashl/compress/registry.hpp>
#include <ashl/core/clock.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/ps/identity.hpp>
#include <ashl/ps/worker_vocabulary.hpp>
#include <ashl/rules/job_limits.hpp>
#include <ashl/rules/shards.hpp>
#include <ashl/rules/commit_check.hpp>
#include <ashl/rules/commit_encoder.hpp>
#include <ashl/rules/commit_in.hpp>
#include <ashl/rules/data_ledger.hpp>
#include <ashl/rules/reply_encoder.hpp>
#include <ashl/rules/worker_cycle.hpp>
#include <ashl/transport/concepts.hpp>
#include <ashl/wire/ids.hpp>
#include <ashl/wire/message.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

template <transport::transport Transport>
class worker {
 public:
  static result<worker> create(worker_params p, Transport t, std::span<float> parameters) {
    if (p.servers.empty()) return invalid_argument("worker.servers", 0, "needs at least one server address");
    if (parameters.empty()) return invalid_argument("worker.parameters.size", 0, "needs at least one element");
    if (p.batch == 0) return invalid_argument("worker.batch", 0, "must be >= 1");
    if (p.servers.size() > max_servers)
      return out_of_range("worker.servers", p.servers.size(),
                          "must be at most " + std::to_string(max_servers) + " addresses (ps::max_servers)");
    if (p.timeout.count() <= 0) return invalid_argument("worker.timeout_ms", p.timeout.count(), "must be > 0");
    if (p.reconnect.count() < 0) return invalid_argument("worker.reconnect_ms", p.reconnect.count(), "must be >= 0");
    if (!p.backups.empty() && p.backups.size() != p.servers.size())
      return invalid_argument("worker.backups", p.backups.size(),
                              "must list one address per server (" + std::to_string(p.servers.size()) +
                                  "; an empty one for a shard without a backup) or none");
    if (p.failover_attempt.count() <= 0)
      return invalid_argument("worker.failover_attempt_ms", p.failover_attempt.count(), "must be > 0");
    ASHL_TRY(check_duration("worker.failover_attempt_ms", p.failover_attempt));
    if (p.server_silence.count() < 0)
      return invalid_argument("worker.server_silence_ms", p.server_silence.count(), "must be >= 0 (0: never)");
    ASHL_TRY(check_duration("worker.server_silence_ms", p.server_silence));
    // Deadlines are now + these in steady_clock's nanoseconds: bounded so the sum cannot wrap.
    ASHL_TRY(check_duration("worker.timeout_ms", p.timeout));
    ASHL_TRY(check_duration("worker.reconnect_ms", p.reconnect));
    if (!(p.progress_seconds >= 0.0) || !(p.progress_seconds <= max_duration_seconds))
      return invalid_argument("worker.progress_seconds", p.progress_seconds,
                              "must be in 0..1000000000 seconds (ps::max_duration_seconds)");
    if (p.measurement_interval.count() > static_cast<std::int64_t>(max_duration_seconds * 1e6))
      return out_of_range("worker.measurement_interval_us", p.measurement_interval.count(),
                          "must be at most 10^15 us (ps::max_duration_seconds)");
    if (!(p.link_bytes_per_second >= 0.0) || !std::isfinite(p.link_bytes_per_second))
      return invalid_argument("worker.link_bytes_per_second", p.link_bytes_per_second, "must be >= 0 and finite");
    if (p.measurement_interval.count() < 0)
      return invalid_argument("worker.measurement_interval_us", p.measurement_interval.count(), "must be >= 0");
    if (p.measurement_batch < 8 || p.measurement_batch > wire::limits{}.max_measurements)
      return invalid_argument("worker.measurement_batch", p.measurement_batch,
                              "must be in 8.." + std::to_string(wire::limits{}.max_measurements));
    if (p.commit_part_bytes != 0 && p.commit_part_bytes < 4096)
      return invalid_argument("worker.commit_part_bytes", p.commit_part_bytes, "must be 0 (one message) or >= 4096");
    if (p.commit_window < 1 || p.commit_window > wire::max_parts_in_flight)
      return invalid_argument("worker.commit_window", p.commit_window,
                              "must be in 1.." + std::to_string(wire::max_parts_in_flight) +
                                  " (the parts of a commit a server holds in flight)");
    if (p.flip_replies && !p.stage_replies)
      return invalid_argument("worker.flip_replies", "true",
                              "needs stage_replies (the replies land in the buffer that is not the parameters)");
    auto layout = shard_layout::even(parameters.size(), static_cast<std::uint32_t>(p.servers.size()));
    if (!layout) return layout.error();
    if (p.incarnation == 0) p.incarnation = fresh_incarnation();
    worker wk(std::move(p), std::move(t), parameters, *layout);
    ASHL_TRY(wk.state_->start());
    return wk;
  }

  worker(worker&&) noexcept = default;
  worker& operator=(worker&&) noexcept = default;
  ~worker() {
    if (state_) state_->stop_thread();
  }

  // The plan in force for this cycle, its batch, and the codec it commits with.
  [[nodiscard]] worker_plan plan() const { return locked([](const state& s) { return s.cycle.plan(); }); }
  [[nodiscard]] std::uint32_t batch() const { return locked([](const state& s) { return s.cycle.batch(); }); }
  [[nodiscard]] codec_id codec() const { return locked([](const state& s) { return s.encoder.codec(); }); }
  [[nodiscard]] const shard_layout& layout() const noexcept { return state_->layout; }
  [[nodiscard]] std::uint32_t rank() const noexcept { return state_->p.rank; }
  // The incarnation it joined as (worker_params::incarnation, or the fresh one).
  [[nodiscard]] std::uint64_t incarnation() const noexcept { return state_->p.incarnation; }
  // τ of the parameters the last wait() delivered: the versions other
  // workers' commits added between this worker's previous reply and this
  // one (server 0's, from the pull reply's header): staleness compensation
  // predicts W - τ·η·v with it (rules/compensation.hpp).
  [[nodiscard]] std::uint64_t staleness() const { return locked([](const state& s) { return s.staleness; }); }
  // Server 0's version of the parameters (or acknowledgement) the last
  // wait() delivered (pull_reply.clock; 0 before the first): under a round
  // policy every worker a round released holds the same one.
  [[nodiscard]] std::uint64_t parameters_version() const {
    return locked([](const state& s) { return s.version; });
  }

  // Where the parameters are: the caller's buffer, or with
  // worker_params::flip_replies whichever of it and the worker's own the
  // last pull made them (it changes only inside wait(), after a pull whose
  // every reply passed its checks). Valid while the worker lives.
  [[nodiscard]] std::span<float> parameters() const {
    return locked([](const state& s) { return s.params; });
  }

  // One local iteration is done; true when the plan's iterations (or commit
  // interval) are complete: commit now.
  bool iteration_done() {
    std::lock_guard g(state_->mu);
    if (state_->cycle.state() != worker_cycle::phase::computing) return true;  // done already: commit
    return state_->cycle.iteration_done(state_->clock.now());
  }
  // The same for an iteration that trained `samples` samples (the batch
  // by default; a lease's last batch may be short): the commit's samples
  // are those trained (docs/elastic.md §3.6).
  bool iteration_done(std::uint64_t samples) {
    std::lock_guard g(state_->mu);
    if (state_->cycle.state() != worker_cycle::phase::computing) return true;
    return state_->cycle.iteration_done(state_->clock.now(), samples);
  }

  // The plan and codec of this cycle (worker_params::follower: what the
  // followers of this worker are handed).
  [[nodiscard]] plan_in_force current_plan() const {
    return locked([](const state& s) { return plan_in_force{s.cycle.plan(), s.cycle.codec()}; });
  }

  // A follower's iteration_done() (worker_params::follower): one local
  // iteration of the cycle whose plan the leader adopted (`leader`, its
  // current_plan() taken in this cycle before its commit) and which the
  // leader said was complete or not (`leader_done`, its iteration_done() for
  // the same iteration). The leader's plan replaces this worker's before
  // the cycle's first iteration. True: commit now.
  bool iteration_done(const plan_in_force& leader, bool leader_done) {
    return iteration_done(leader, leader_done, ~std::uint64_t{0});
  }
  // The same for an iteration that trained `samples` samples (~0: the batch).
  bool iteration_done(const plan_in_force& leader, bool leader_done, std::uint64_t samples) {
    std::lock_guard g(state_->mu);
    state& s = *state_;
    if (s.cycle.state() != worker_cycle::phase::computing) return true;  // done already: commit
    if (s.cycle.iterations() == 0 && s.cycle.follow(leader.plan, leader.codec, s.p.batch)) {
      ++s.tel.plan_changes;
      if (auto ok = check_plan_codec(leader.plan, leader.codec); !ok) s.fail(ok);
      else (void)s.encoder.set(leader.codec, leader.plan.compression_ratio, leader.plan.compression_options());
    }
    if (samples == ~std::uint64_t{0}) return s.cycle.iteration_done(s.clock.now(), leader_done);
    return s.cycle.iteration_done(s.clock.now(), leader_done, samples);
  }

  // The data ledger's leases server 0 sent this worker (docs/elastic.md
  // §3.6) that its commits have not covered yet, in grant order: each
  // commit moves through them by its samples as the ledger does, and a
  // lease sent again after a rejoin (flag `resent`) replaces the one of
  // its number. `number` counts the worker's leases from 1; a consumer
  // that reads ahead of the commits (a sampler) takes each number once.
  // After a rejoin of server 0 the leases it does not send again (it gave
  // them back: the rejoin came after ledger.give_back_after) are dropped
  // at its first reply or fresh lease (telemetry leases_dropped).
  // Empty without a ledger.
  [[nodiscard]] std::vector<ledger_lease> leases() const {
    return locked([](const state& s) {
      std::vector<ledger_lease> out = s.leases;
      for (ledger_lease& l : out) l.flags &= ~state::lease_unconfirmed;
      return out;
    });
  }
  // The ledger's N and permutation seed, from its leases (0 before the first).
  [[nodiscard]] std::uint64_t ledger_samples() const { return locked([](const state& s) { return s.ledger_n; }); }
  [[nodiscard]] std::uint64_t ledger_shuffle_seed() const {
    return locked([](const state& s) { return s.ledger_seed; });
  }

  // What the end of the last cycle reported to the servers (compute, push,
  // pull, commit of ps::worker_cycle): a leader's, for its followers.
  [[nodiscard]] std::vector<ashl::measurement> reported_measurements() const {
    return locked([](const state& s) { return s.reported; });
  }

  // Measurements to every server as this worker's (a follower reports its
  // leader's; their worker must be this rank).
  status report_measurements(std::span<const ashl::measurement> ms) {
    std::lock_guard g(state_->mu);
    if (!state_->failed.ok()) return state_->failed;
    for (const auto& m : ms)
      if (m.worker != state_->p.rank)
        return invalid_argument("worker.report_measurements.worker", m.worker,
                                "must be this worker's rank " + std::to_string(state_->p.rank));
    // They join this worker's batch (worker_params.measurement_interval).
    state_->queue_measurements(ms, state_->clock.now());
    return state_->failed;
  }

  // Sends `update` (gradient or model delta, all the model's elements) to
  // the servers, shard by shard, and asks for the parameters back; returns
  // at once. `update` must stay unchanged until wait() returns.
  status commit(std::span<const float> update) {
    std::lock_guard g(state_->mu);
    return state_->commit(update, false);
  }

  // commit() without the parameters back (a push): for
  // a worker that does not need the servers' parameters every cycle. Each
  // server answers with a header-only acknowledgement (a pull_reply of 0
  // elements: the commit with flags pull | ack_requested,
  // docs/wire-format.md) when its policy releases the worker, as it would
  // release a pull (a BSP barrier holds it), so wait() returns once every
  // server has taken the commit; the parameter buffer is left as it is.
  // Exactly once as commit(): after a reconnect the commit goes again until
  // acknowledged, and the server's table drops the duplicate. pull()
  // between cycles fetches the parameters when wanted.
  status push(std::span<const float> update) {
    std::lock_guard g(state_->mu);
    return state_->commit(update, true);
  }

  // Whether this cycle's commit is compressed (the plan's ratio is below 1
  // and its codec is not identity); known once iteration_done() said true.
  // A caller that encodes itself (ps/device_worker.cuh) asks this, encodes
  // with codec() at plan().compression_ratio and context {seed,
  // commit_step(), shard}, and hands the payloads to commit_encoded().
  [[nodiscard]] bool compresses() const {
    return locked([](const state& s) { return s.cycle.compresses() && s.encoder.compresses(); });
  }
  // header.step of the next commit (the codec's Philox step): the
  // iterations before this cycle and this cycle's.
  [[nodiscard]] std::uint64_t commit_step() const {
    return locked([](const state& s) { return s.iterations_total + s.cycle.iterations(); });
  }

  // commit() with payloads the caller encoded: payloads[s] is shard s's
  // payload of codec() (layout().range(s) elements, f32 input), with the
  // pull. Only for a cycle that compresses(); the payloads must stay
  // unchanged until wait() returns (a reconnect sends them again).
  status commit_encoded(std::span<const std::span<const std::byte>> payloads) {
    std::lock_guard g(state_->mu);
    return state_->commit_encoded(payloads);
  }

  // Asks every server for its parameters without committing (after a
  // rejoin, or to read the model); wait() completes it. Outside a cycle's
  // compute only: before the first iteration_done() of a cycle.
  status pull() {
    std::lock_guard g(state_->mu);
    return state_->pull_only();
  }

  // Drives the transport until the last commit was sent and the parameters
  // arrived in the caller's buffer (then the next cycle starts with the
  // newest plan), or a server failed, refused, or the timeout passed.
  status wait() { return state_->wait(); }

  // wait() in slices, for a caller that acts between them (the Python
  // binding checks for Ctrl-C): drives the transport for about `slice` at
  // most and returns nothing while the commit (or pull) is still pending,
  // else what wait() returns. worker_params.timeout counts from the call
  // with first = true; a wait abandoned between slices leaves the worker as
  // it was (the commit in flight), and a later wait() or wait_for(.., true)
  // takes it up with a whole timeout.
  std::optional<status> wait_for(std::chrono::microseconds slice, bool first) {
    return state_->wait_for(slice, first);
  }

  // One progress pass without blocking; true when nothing is pending.
  bool test() {
    std::lock_guard g(state_->mu);
    state_->poll();
    return !state_->pending();
  }

  // A named scalar to every server (loss, accuracy: ADSP and ASHL read it).
  status report_metric(metric_id m, double value) {
    std::lock_guard g(state_->mu);
    return state_->send_metric(m, value);
  }

  // Leaves every server (a commit in flight is waited for first).
  status leave() { return state_->leave(); }

  [[nodiscard]] worker_telemetry telemetry() const {
    return locked([](const state& s) {
      worker_telemetry t = s.tel;
      t.transport = s.t.counters();
      return t;
    });
  }
  [[nodiscard]] Transport& transport() noexcept { return state_->t; }
  // "worker 3: 12.0 s  commits 120  pulls 120  out 4.1 MB  in 4.1 MB  waiting 35%  plan H=4 ..."
  [[nodiscard]] std::string progress_line() const {
    return locked([](const state& s) { return s.progress_line(); });
  }

 private:
  struct slot {
    std::array<std::byte, wire::header_bytes> head{};
    std::vector<std::byte> body;
    std::int32_t commit_shard = -1;  // a commit's send: its completion counts
    std::int32_t commit_part = -1;   // a commit part's index (worker_params.commit_part_bytes), and
    std::uint32_t part_gen = 0;      // the send of the shard's commit it belongs to (commit_parts_out::gen)
  };

  struct handler;

  // Lives on the heap so the transport's callbacks and the progress thread
  // keep a stable address when the worker moves.
  struct state {
    worker_params p;
    std::span<float> params;  // the parameters: the caller's buffer, or (flip_replies) the staging after a flip
    std::span<float> caller;  // the caller's buffer (create()'s)
    shard_layout layout;
    std::vector<transport::peer_id> peer;  // per server
    std::vector<std::uint8_t> connected, replied;  // replied: 0 not yet, 1 a push's acknowledgement, 2 parameters
    std::vector<std::span<const std::byte>> enc;  // per shard: the encoded payload of the commit in flight
    std::vector<std::span<const float>> dense;    // per shard: the dense update in flight (maybe with e folded in)
    std::vector<std::byte> spill;            // a data part that is not a pull reply into params
    // stage_replies: the replies of the pull in flight, checked before they
    // are copied into params (the model's size; not zeroed: every element is
    // written by a reply before it is read).
    std::unique_ptr<float[]> staged;
    // Per shard: the reply in parts being received (wire flag `part`): the
    // next part expected, how many, and the version they are of.
    struct reply_parts_state {
      std::uint32_t next = 0, parts = 0;
      std::uint64_t clock = 0;
      bool view = false;  // the parts carry wire flag `view`
    };
    std::vector<reply_parts_state> parts_in;
    // A server that compresses its replies (rules/reply_encoder.hpp): the
    // parameters as this worker holds them from its replies (the model's
    // size, allocated at the first reply flagged `view`), and per shard
    // whether it holds one and of which version (a compressed reply names
    // the version it applies to). A lost connection drops them.
    std::vector<float> views;
    std::vector<std::uint8_t> has_view;
    std::vector<std::uint64_t> view_version;
    // Per shard: the commit in flight sent in parts (commit_part_bytes):
    // how many, sent so far, completed; gen tells this send's completions
    // from a lost connection's (a reconnect sends the commit again).
    struct commit_parts_out {
      std::uint32_t parts = 0, sent = 0, done = 0, gen = 0;
    };
    std::vector<commit_parts_out> parts_out;
    std::vector<slot> slots;
    std::vector<std::uint32_t> free_slots;
    std::vector<ashl::measurement> reported;  // the last cycle's (reported_measurements)
    std::vector<commit_part_view> check_parts;  // per shard: what check_commit_parts reads (reserved once)
    // Per shard: the CRC-32C of the commit in flight's payload, computed in
    // check_commit_parts' pass where it is sent whole and as checked (the
    // caller's buffer, or commit_encoded's payloads); crc_known 0: the seal
    // reads the payload itself (compressed, residual owed, in parts).
    std::vector<std::uint32_t> commit_crc;
    std::vector<std::uint8_t> crc_known;
    commit_encoder encoder;  // the plan's codec, error feedback (rules/commit_encoder.hpp, shared with the simulator)
    worker_cycle cycle;
    steady_clock clock;
    worker_telemetry tel{};
    status failed{};                // sticky: a server failed or refused
    std::uint32_t sends_pending = 0, replies_pending = 0;
    std::uint32_t arrived_count = 0;         // shards of the commit in flight sent (completed ok)
    std::uint64_t commit_bytes = 0, reply_bytes = 0;
    // The commit (or pull) in flight, to send again after a reconnect.
    std::span<const float> last_update;
    std::vector<std::span<const std::byte>> last_payloads;  // commit_encoded's, per shard
    std::uint64_t last_seq = 0;
    std::uint64_t last_clock = 0;  // worker_cycle::clock() of the commit in flight
    std::uint32_t last_samples = 0;  // header.samples of the commit in flight
    bool last_compressed = false, last_was_commit = false, last_external = false;
    bool last_ack_only = false;  // the commit in flight is a push: acknowledged, no parameters back
    std::vector<std::uint8_t> arrived;       // per shard: its commit send completed ok
    std::vector<std::uint8_t> lost;          // per server: reconnecting (worker_params.reconnect)
    std::vector<double> lost_until;          // per server: the reconnect's deadline
    // Per shard, failing over (worker_params::backups): the address tried
    // now (0 the server's, 1 its backup's), until when, whether a join was
    // taken since the loss (0: failing over), and the term this worker knows.
    std::vector<std::uint8_t> address, failing_over;
    std::vector<double> attempt_until;
    std::vector<std::uint32_t> term;
    std::vector<transport::peer_id> closing;  // to close after the pass (fail_over)
    bool leaving = false;
    // The data ledger's leases from server 0 (leases()): capacity for the
    // most a worker holds (data_ledger::lease_capacity at ps::max_ledger_ahead),
    // reserved once; the ledger's N and seed; the highest number taken.
    std::vector<ledger_lease> leases;
    std::uint64_t ledger_n = 0, ledger_seed = 0, lease_number = 0;
    // This worker's own mark (never on the wire, masked in leases()): a
    // lease held when it rejoined server 0 that server 0 has not sent
    // again yet. Server 0 answers a rejoin's join with the outstanding
    // leases (flag `resent`) before anything else to this worker, so its
    // first reply or fresh lease after it means the marked ones were given
    // back: they are dropped (drop_unconfirmed_leases).
    static constexpr std::uint32_t lease_unconfirmed = 1u << 31;
    static_assert((lease_unconfirmed & wire::lease_flags_known) == 0);
    bool leases_unconfirmed = false;
    static constexpr std::size_t max_leases = 2 * (std::size_t{max_ledger_ahead} + 1) + 2;
    std::uint64_t staleness = 0;             // τ of the last reply from server 0
    std::uint64_t version = 0;               // its version (pull_reply.clock)
    std::uint64_t iterations_total = 0;  // header.step of commits
    bool committing = false;
    mutable std::mutex mu;
    std::thread progress;
    std::atomic<bool> stop{false};
    // Last: destroyed first. Its destructor still drives the engine (the
    // closes' flush), which goes on writing a reply in transfer into the
    // receive buffer it was given (staged, spill) and reading the sends in
    // flight (slots, enc): those must outlive it. Declared before them, a
    // worker dropped while a server's large reply was arriving had the
    // reply written into its freed staging buffer
    // (test/ps/worker_drop.cpp). The server keeps the same order (t_).
    Transport t;

    state(worker_params wp, Transport tr, std::span<float> w, shard_layout l)
        : p(std::move(wp)),
          params(w),
          caller(w),
          layout(l),
          encoder({.error_feedback = p.error_feedback, .seed = p.seed}),
          cycle(p.rank, report_rule{.interval = std::chrono::duration<double>(p.measurement_interval).count(),
                                    .batch = p.measurement_batch}),
          t(std::move(tr)) {
      const std::size_t S = p.servers.size();
      peer.assign(S, transport::no_peer);
      connected.assign(S, 0);
      replied.assign(S, 0);
      parts_in.assign(S, {});
      has_view.assign(S, 0);
      view_version.assign(S, 0);
      parts_out.assign(S, {});
      arrived.assign(S, 0);
      lost.assign(S, 0);
      lost_until.assign(S, 0.0);
      address.assign(S, 0);
      failing_over.assign(S, 0);
      attempt_until.assign(S, 0.0);
      term.assign(S, 0);
      enc.resize(S);
      dense.resize(S);
      slots.reserve(4 * S + 8);
      free_slots.reserve(4 * S + 8);
      reported.reserve(8);
      leases.reserve(max_leases);
      check_parts.reserve(S);
      commit_crc.assign(S, 0);
      crc_known.assign(S, 0);
      if (p.stage_replies) staged = std::make_unique_for_overwrite<float[]>(params.size());
    }

    // Where shard s's pull reply goes: the worker's staging buffer, or the
    // caller's parameters (stage_replies false).
    [[nodiscard]] std::span<float> reply_target(const key_range& r) const noexcept {
      if (staged) return landing().subspan(r.begin, r.size());
      return params.subspan(r.begin, r.size());
    }
    // The whole buffer replies land in with staging: the worker's own, or
    // (flip_replies) whichever of it and the caller's is not the parameters.
    [[nodiscard]] std::span<float> landing() const noexcept {
      const std::span<float> own(staged.get(), params.size());
      return p.flip_replies && params.data() == own.data() ? caller : own;
    }
    // Where the pull's last reply goes once checked: straight into the
    // parameters (staging, not flipping: one copy instead of two), else
    // where the others landed.
    [[nodiscard]] bool last_reply_direct() const noexcept {
      return staged && !p.flip_replies && replies_pending == 1 && failed.ok();
    }

    // Every server's reply of the pull passed its checks: the parameters
    // change here, all shards at once, never after a bad reply. Shard
    // `direct` (an eager reply, the pull's last) was copied into them
    // already; a push's acknowledgements (replied 1) carry none.
    void deliver_replies(std::uint32_t direct) {
      if (!staged || !failed.ok()) return;
      if (p.flip_replies) {
        // The landing buffer becomes the parameters; a shard no server
        // sent parameters for (a push's acknowledgement) keeps its values.
        const std::span<float> next = landing();
        bool any = false;
        for (std::uint32_t s = 0; s < servers(); ++s) any = any || replied[s] == 2;
        if (!any) return;
        for (std::uint32_t s = 0; s < servers(); ++s) {
          if (replied[s] == 2) continue;
          const key_range r = layout.range(s);
          std::memcpy(next.data() + r.begin, params.data() + r.begin, r.size() * sizeof(float));
        }
        params = next;
        ++tel.staged_replies;
        ++tel.flipped_replies;
        return;
      }
      for (std::uint32_t s = 0; s < servers(); ++s) {
        if (s == direct || replied[s] != 2) continue;
        const key_range r = layout.range(s);
        std::memcpy(params.data() + r.begin, staged.get() + r.begin, r.size() * sizeof(float));
      }
      ++tel.staged_replies;
    }

    // Messages to and from server s go without their CRC (worker_params::trust_local_lanes).
    [[nodiscard]] bool unchecked_lane(std::uint32_t s) const noexcept {
      return p.trust_local_lanes && peer[s] != transport::no_peer && transport::peer_on_this_host(t, peer[s]);
    }

    [[nodiscard]] bool pending() const noexcept { return sends_pending != 0 || replies_pending != 0; }
    [[nodiscard]] std::uint32_t servers() const noexcept { return static_cast<std::uint32_t>(peer.size()); }

    std::string server_name(std::uint32_t s) const {
      return "server " + std::to_string(s) + " at " + address_of(s);
    }

    // -------------------------------------------------------------- start

    status start() {
      for (std::uint32_t s = 0; s < servers(); ++s) {
        auto id = connect_to(s);
        if (!id) return id.error();
        peer[s] = *id;
        attempt_until[s] = clock.now() + seconds(p.failover_attempt);
      }
      const double deadline = clock.now() + seconds(p.timeout);
      ASHL_TRY(drive_until(
          [&] {
            try_other_addresses(clock.now());
            return all_connected();
          },
          deadline, "connecting to the servers"));
      for (std::uint32_t s = 0; s < servers(); ++s) {
        wire::header h{.kind = wire::message_kind::join, .rank = p.rank};
        ASHL_TRY(send_control(s, h, join_body(s)));
      }
      // The initial parameters, and the plan server 0 sends on join.
      cycle.pull_sent(clock.now());
      ASHL_TRY(send_pulls(0));
      ASHL_TRY(drive_until([&] { return !pending() && cycle.has_plan(); }, deadline, "joining (plan and parameters)"));
      finish_cycle();
      if (p.progress_thread) {
        progress = std::thread([this] { run_thread(); });
      }
      return {};
    }

    // The join: its model size too (docs/elastic.md §2.3: a server of
    // another model size refuses it by join.elements).
    // Failing over, it carries the flag and the term this worker knows
    // (docs/elastic.md §4.5: the backup counts it as a vote).
    [[nodiscard]] wire::join_body join_body(std::uint32_t s) const noexcept {
      return {.incarnation = p.incarnation, .batch = p.batch, .job = p.job, .elements = params.size(),
              .flags = failing_over[s] ? wire::join_flag_failover : 0u, .term = term[s]};
    }
    [[nodiscard]] bool has_backup(std::uint32_t s) const noexcept {
      return s < p.backups.size() && !p.backups[s].empty();
    }
    // Starting: a shard with a backup whose address did not connect within
    // failover_attempt is tried at its other one (its primary may be dead
    // and its backup promoted; a worker that joins a running job must not
    // wait out UCX's connect_timeout at a dead address). Which one takes
    // the join is the servers' answer, as when failing over; so only with
    // worker_params::reconnect > 0, whose bound covers an `unavailable`
    // from an unpromoted backup (a primary slower to start than
    // failover_attempt is then reached on the next turn).
    void try_other_addresses(double now) {
      for (std::uint32_t s = 0; s < servers(); ++s) {
        if (!has_backup(s) || !may_reconnect() || connected[s] || now < attempt_until[s]) continue;
        if (peer[s] != transport::no_peer) closing.push_back(peer[s]);
        peer[s] = transport::no_peer;
        const std::string before = address_of(s);
        address[s] ^= 1;
        attempt_until[s] = now + seconds(p.failover_attempt);
        ++tel.failover_tries;
        std::fprintf(stderr, "worker %u: server %u at %s did not connect within %.1f s (failover_attempt); trying %s\n",
                     p.rank, s, before.c_str(), seconds(p.failover_attempt), address_of(s).c_str());
        auto id = connect_to(s);
        if (!id) {
          fail(make_error(id.error().code(), "worker.connect", server_name(s), id.error().message()));
          return;
        }
        peer[s] = *id;
      }
    }
    // Shard s's current address; with a backup (worker_params::backups),
    // isolated and failed when silent for server_silence.
    result<transport::peer_id> connect_to(std::uint32_t s) {
      if (!has_backup(s)) return t.connect(address_of(s));
      auto id = transport::connect_isolated(t, address_of(s));
      if (id && p.server_silence.count() > 0) transport::fail_when_silent(t, *id, p.server_silence);
      return id;
    }
    [[nodiscard]] const std::string& address_of(std::uint32_t s) const noexcept {
      return address[s] != 0 ? p.backups[s] : p.servers[s];
    }

    // Leases (ps/worker_receive.hpp).
    void on_lease(std::uint32_t s, const wire::header& h, const wire::lease_body& b);
    void consume_leases(std::uint64_t samples) noexcept;
    void drop_unconfirmed_leases();

    [[nodiscard]] bool all_connected() const noexcept {
      return std::all_of(connected.begin(), connected.end(), [](std::uint8_t c) { return c != 0; });
    }

    static double seconds(std::chrono::milliseconds d) { return std::chrono::duration<double>(d).count(); }

    // Progress until done() or failure or the deadline.
    template <class Done>
    status drive_until(Done done, double deadline, const char* what) {
      const bool threaded = progress.joinable();
      std::uint64_t reconnects = tel.reconnects;
      bool reconnecting = false;
      while (true) {
        {
          std::lock_guard g(mu);
          if (!threaded) poll();
          if (!failed.ok()) return failed;
          if (done()) return {};
          reconnecting = any_lost();
          if (reconnecting) check_reconnects(clock.now());
          if (tel.reconnects != reconnects) {  // a server came back: a whole timeout for its answer
            reconnects = tel.reconnects;
            deadline = std::max(deadline, clock.now() + seconds(p.timeout));
          }
        }
        const double now = clock.now();
        if (now >= deadline && !reconnecting)
          return make_error(errc::timed_out, "worker.timeout_ms", p.timeout.count(),
                            std::string("passed while ") + what + " (worker " + std::to_string(p.rank) + ")");
        if (threaded) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        } else {
          const double left = std::min(deadline - now, 0.001);
          t.wait(std::chrono::microseconds(static_cast<std::int64_t>(left * 1e6) + 1));
        }
        tel.wait_seconds += clock.now() - now;
      }
    }

    std::size_t poll() {
      handler h{this};
      const std::size_t n = t.progress(h);
      // Connections given up while failing over, closed outside the
      // transport's pass (as the server closes a dropped backup's).
      for (const transport::peer_id old : closing) t.close(old);
      closing.clear();
      return n;
    }

    void run_thread() {
      while (!stop.load(std::memory_order_relaxed)) {
        std::size_t n;
        {
          std::lock_guard g(mu);
          n = poll();
        }
        if (n == 0) t.wait(std::chrono::microseconds(200));
      }
    }

    void stop_thread() {
      stop.store(true);
      if (progress.joinable()) progress.join();
    }

    // ------------------------------------ commit (ps/worker_send.hpp)

    status commit(std::span<const float> update, bool ack_only);
    status commit_encoded(std::span<const std::span<const std::byte>> payloads);

    // Shard s's payload of the commit in flight.
    [[nodiscard]] std::span<const std::byte> commit_payload(std::uint32_t s) const {
      if (last_external) return last_payloads[s];
      if (last_compressed) return enc[s];
      return std::as_bytes(dense[s]);
    }

    status send_commit(double now);

    // The parts shard s's commit goes in (worker_params.commit_part_bytes):
    // a dense one above the size; 0: whole.
    [[nodiscard]] std::uint32_t commit_parts(std::uint32_t s) const noexcept {
      return last_compressed || last_external ? 0 : dense_parts(s);
    }
    [[nodiscard]] std::uint32_t dense_parts(std::uint32_t s) const noexcept {
      const std::uint32_t n = wire::parts_for(layout.range(s).size(), sizeof(float), p.commit_part_bytes,
                                              wire::max_commit_parts);
      return n >= 2 ? n : 0;
    }
    [[nodiscard]] std::uint64_t commit_wire_bytes(std::uint32_t s) const noexcept {
      return std::uint64_t{wire::header_bytes} * std::max<std::uint32_t>(1, commit_parts(s)) + commit_payload(s).size();
    }

    status send_commit_shard(std::uint32_t s);
    [[nodiscard]] wire::header commit_header(std::uint32_t s) const;
    status send_commit_part(std::uint32_t s, std::uint32_t j);
    status send_pulls(std::uint64_t seq);
    status send_pull(std::uint32_t s);
    status pull_only();

    // --------------------------------------------------------------- wait

    status wait() {
      const double deadline = clock.now() + seconds(p.timeout);
      ASHL_TRY(drive_until([&] { return !pending(); }, deadline, "waiting for the commit and the parameters"));
      return wait_done();
    }

    double wait_deadline = 0.0;  // wait_for()'s: worker_params.timeout from its first slice

    std::optional<status> wait_for(std::chrono::microseconds slice, bool first);
    status wait_done();

    std::string progress_line() const {
      char buf[400];
      std::snprintf(buf, sizeof buf,
                    "worker %u: %.1f s  commits %llu  pulls %llu  out %.1f MB  in %.1f MB  waiting %.0f%%  "
                    "plan H=%u batch=%u ratio=%.3g stage %s (%llu changes)",
                    p.rank, clock.now(), static_cast<unsigned long long>(tel.commits),
                    static_cast<unsigned long long>(tel.pulls), tel.bytes_out / 1e6, tel.bytes_in / 1e6,
                    clock.now() > 0 ? 100.0 * tel.wait_seconds / clock.now() : 0.0, cycle.plan().local_iterations,
                    cycle.batch(), static_cast<double>(cycle.plan().compression_ratio),
                    std::string(to_string(cycle.plan().stage)).c_str(),
                    static_cast<unsigned long long>(tel.plan_changes));
      return buf;
    }

    void finish_cycle();

    // The measurements join the cycle's outbox; a message goes out when
    // worker_cycle's rule says (worker_params.measurement_interval,
    // measurement_batch; the simulator's rule too). Capacity is reserved:
    // nothing allocates.
    void queue_measurements(std::span<const ashl::measurement> ms, double now) {
      cycle.report(ms, now, [&](std::span<const ashl::measurement> out) { (void)send_measurements(out); });
    }

    status send_measurements(std::span<const ashl::measurement> ms);
    status send_metric(metric_id m, double value);
    status leave();

    template <class Body>
    status send_control(std::uint32_t s, wire::header h, const Body& body) {
      const std::uint32_t i = take_slot();
      const std::size_t n = wire::encoded_size(body);
      if (slots[i].body.size() < n) slots[i].body.resize(n);
      auto used = wire::encode(h, body, std::span<std::byte>(slots[i].body.data(), n));
      if (!used) {
        free_slots.push_back(i);
        return used.error();
      }
      std::memcpy(slots[i].head.data(), slots[i].body.data(), wire::header_bytes);
      return send(s, i, slots[i].head, std::span<const std::byte>(slots[i].body).subspan(wire::header_bytes, n - wire::header_bytes));
    }

    std::uint32_t take_slot();
    status send(std::uint32_t s, std::uint32_t i, std::span<const std::byte> head, std::span<const std::byte> data);

    void fail(status s) {
      // swap, not operator= (whose status& result nvcc warns is discarded)
      if (failed.ok()) std::swap(failed, s);
    }

    // The emulated link (worker_params.link_bytes_per_second): `bytes` take
    // bytes / rate seconds. A sleep, not a spin: ten emulated workers share
    // a few cores.
    void hold_for_link(link_direction d, std::uint64_t bytes) {
      if (bytes == 0) return;
      if (p.link_hold) {
        const steady_clock link;  // a stopwatch over the emulated link
        p.link_hold(d, bytes);
        tel.link_seconds += link.now();
        return;
      }
      if (p.link_bytes_per_second <= 0.0) return;
      const double s = static_cast<double>(bytes) / p.link_bytes_per_second;
      std::this_thread::sleep_for(std::chrono::duration<double>(s));
      tel.link_seconds += s;
    }

    // ---------------------------------- receiving (ps/worker_receive.hpp)

    std::uint32_t server_of_peer(transport::peer_id pid) const noexcept {
      for (std::uint32_t s = 0; s < servers(); ++s)
        if (peer[s] == pid) return s;
      return ~std::uint32_t{0};
    }

    std::span<std::byte> receive_buffer(transport::peer_id pid, std::span<const std::byte> head, std::size_t n);
    void on_message(transport::peer_id pid, std::span<const std::byte> head, std::span<const std::byte> data);
    void on_reply_part(std::uint32_t s, const key_range& r, const wire::message_view& m, std::size_t bytes);
    void on_compressed_reply(std::uint32_t s, const key_range& r, const wire::message_view& m, std::size_t bytes);
    // A reply from server s refused: counted, and the pull fails naming the field and value.
    void refuse_reply(std::uint32_t s, std::string_view field, std::uint64_t value, const std::string& why) {
      ++tel.bad_messages;
      fail(make_error(errc::malformed, field, value, "from " + server_name(s) + ": " + why));
    }
    // A reply (or part) of shard s's f32 elements; anything else is refused.
    bool reply_fits(std::uint32_t s, const key_range& r, const wire::header& h) {
      if (h.type == dtype::f32 && h.element_count == r.size() && h.tensor == s) return true;
      refuse_reply(s, "pull_reply.element_count", h.element_count,
                   "expected " + std::to_string(r.size()) + " f32 elements of shard " + std::to_string(s));
      return false;
    }
    // Shard s's dense reply of version `clock` (at `values`) becomes its view.
    void keep_view(std::uint32_t s, const key_range& r, std::span<const float> values, std::uint64_t clock) {
      if (views.size() != params.size()) views.resize(params.size());
      std::memcpy(views.data() + r.begin, values.data(), r.size() * sizeof(float));
      has_view[s] = 1;
      view_version[s] = clock;
    }
    void on_sent(transport::peer_id pid, std::uint64_t cookie, const status& st);
    void on_peer(transport::peer_id pid, transport::peer_event e, const status& why);

    // The first reply of the cycle began arriving: the pull is timed from
    // here (worker_cycle::reply_started), as the simulator times it from the
    // server's start of the reply, so a pull the server held (a barrier, a
    // staleness bound) is not measured as transfer. A reply that overtakes
    // the commit's send completion leaves the pull timed from that.
    void note_reply_started() {
      if (cycle.state() == worker_cycle::phase::waiting) cycle.reply_started(clock.now());
    }

    // ------------------------------- reconnecting (ps/worker_receive.hpp)

    [[nodiscard]] bool may_reconnect() const noexcept { return p.reconnect.count() > 0 && !leaving && failed.ok(); }
    [[nodiscard]] bool any_lost() const noexcept {
      for (std::size_t s = 0; s < lost.size(); ++s)
        if (lost[s] != 0 || failing_over[s] != 0) return true;
      return false;
    }

    void lose(std::uint32_t s, const status& why);
    void fail_over(std::uint32_t s, const status& why);
    void rejoin(std::uint32_t s);
    void check_reconnects(double now);

    double next_progress_ = 0.0;
  };

  struct handler {
    state* s;
    std::span<std::byte> receive_buffer(transport::peer_id p, std::span<const std::byte> h, std::size_t n) {
      return s->receive_buffer(p, h, n);
    }
    void on_message(transport::peer_id p, std::span<const std::byte> h, std::span<const std::byte> d) {
      s->on_message(p, h, d);
    }
    void on_sent(transport::peer_id p, std::uint64_t c, const status& st) { s->on_sent(p, c, st); }
    void on_peer(transport::peer_id p, transport::peer_event e, const status& why) { s->on_peer(p, e, why); }
  };
  static_assert(transport::handler<handler>);

  worker(worker_params p, Transport t, std::span<float> params, shard_layout l)
      : state_(std::make_unique<state>(std::move(p), std::move(t), params, l)) {}

  template <class F>
  auto locked(F f) const {
    std::lock_guard g(state_->mu);
    return f(*state_);
  }

  std::unique_ptr<state> state_;
};

}  // namespace ps
ASHL_NAMESPACE_END

// The state's bodies by concern: each header includes this one first, so
// either alone gives the whole worker.
#include <ashl/ps/worker_receive.hpp>
#include <ashl/ps/worker_send.hpp>
