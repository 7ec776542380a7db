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
// straight into the caller's buffer, checked after it landed). With a
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
#include <ashl/rules/job_limits.hpp>
#include <ashl/rules/shards.hpp>
#include <ashl/rules/commit_check.hpp>
#include <ashl/rules/commit_encoder.hpp>
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

// The direction of an emulated transfer (worker_params::link_hold).
enum class link_direction : std::uint8_t { up, down };

struct worker_params {
  std::uint32_t rank = 0;
  std::vector<std::string> servers;  // server s's address (transport::connect), s = 0 .. S-1
  std::uint32_t batch = 1;           // the batch it runs when the plan says 0 (its own)
  // Larger after a restart: the server takes a join of a larger
  // incarnation as a new process of this rank (fresh sequences) and refuses
  // a smaller one by name. 0: a fresh one at create() (fresh_incarnation(),
  // from the wall clock), so every process start has a larger one; set it
  // only to reproduce a run.
  std::uint64_t incarnation = 0;
  // The job this worker belongs to (make_job_id): a server of another job
  // refuses the join naming both ids. 0: not said (any server takes it).
  std::uint64_t job = 0;
  std::chrono::milliseconds timeout{30000};  // the bound of every wait
  std::uint64_t seed = 0;            // codec seed (the servers' server_core_params.seed)
  bool progress_thread = false;      // a thread of the worker's own drives the transport
  double progress_seconds = 0.0;     // > 0: one progress line to stderr every so often (from wait())
  // A compressing plan's codec keeps each shard's residual (error feedback)
  // unless this is false; then the codec encodes the update alone.
  bool error_feedback = true;
  // > 0: emulates a link of this many bytes per second (heterogeneity on one
  // machine, the reference experiment's padding): commit() holds the commit
  // for commit_bytes / rate before it sends it, and wait() holds the
  // parameters for reply_bytes / rate after they arrived, so the transfer
  // occupies the time a slower link would, before the server sees the commit
  // and before the caller sees the reply, and the push and pull
  // measurements include it.
  double link_bytes_per_second = 0.0;
  // When set, the emulated link is this function instead of the rate: it is
  // called where the rate's sleep would be, with the direction (a commit:
  // link_direction::up, before it is sent; a pull reply: down, after it
  // arrived) and the bytes (headers and payloads), and holds the calling
  // thread for as long as they take. A harness that emulates every method's
  // links with one model (a server's link shared by all its workers, say)
  // gives it here (examples/cnn/link.py). Its wall time is counted in
  // telemetry's link_seconds. It runs under the worker's lock, as the
  // rate's sleep does: it must not call this worker, and a lock it takes
  // must not be held by a thread that calls this worker (the Python
  // binding releases the GIL around every call for that reason).
  std::function<void(link_direction, std::uint64_t)> link_hold;
  // > 0: a server whose connection fails or closes (it died, or evicted this
  // worker) is connected to again for up to this long: the worker rejoins
  // (same incarnation, keeping its sequence), sends the commit in flight
  // again (the server's exactly-once table drops it if it was applied) and
  // takes the parameters the server has (a restarted server: those of its
  // checkpoint). 0: the worker fails at once with the server's error.
  std::chrono::milliseconds reconnect{0};
  // This worker's cycles are another worker's, its leader's (one cycle for
  // several workers of one process: the torch adapter's buckets, each a
  // parameter-server tensor of its own, docs/torch.md "Buckets and
  // overlap"). It takes the join's plan from its server 0, then counts every
  // plan_update in plans_ignored: the caller hands it the leader's plan and
  // cycle end (iteration_done(leader_plan, leader_done)) and the leader's
  // measurements (report_measurements), which it reports to its servers
  // instead of its own, so that its servers' policy copies see the events
  // the leader's see (docs/ps.md, "Plan authority").
  bool follower = false;
  // The measurements of its cycles (compute, push, pull, ...: worker_cycle)
  // go to every server in one message at a cycle's end once this long has
  // passed since the last one went, or once the batch is nearly full
  // (measurement_batch), and before leave(): a cycle shorter than the
  // interval adds its records to a later message instead of sending its own
  // (a 4 KiB round trip paid one measurements message per cycle before).
  // Cycles longer than the interval (training steps) send theirs at every
  // cycle's end. The rule is worker_cycle's (ps::report_rule), and the
  // simulator's workers follow it too, with the same default
  // (docs/ps.md "worker_cycle", docs/perf/ps-ucx.md).
  std::chrono::microseconds measurement_interval{
      static_cast<std::int64_t>(report_rule{}.interval * 1e6 + 0.5)};
  // Records in one measurements message at most (>= 8: a cycle records up to
  // five); at most the servers' wire limits.max_measurements.
  std::uint32_t measurement_batch = report_rule{}.batch;
  // A pull reply is received into the worker's own buffer (the model's size,
  // allocated once at create()) and copied into the caller's parameters only
  // when every server's reply of that pull was checked (CRC-32C, size,
  // shape): a bad reply fails the wait and the caller's parameters stay
  // exactly as they were. The cost is the model's memory once more and one
  // copy per pull (docs/perf/ps-ucx.md, "Verified replies"); a small
  // (eager) reply that completes the pull is copied from the transport's
  // buffer into the caller's once checked, as without staging. false: the
  // zero-copy path, where rendezvous data lands in the caller's buffer before
  // its checksum is known, so a bad reply leaves bad values there (the wait
  // still fails) and a multi-server pull that fails may leave some shards new.
  bool stage_replies = true;
  // A dense (identity) commit to a server larger than this goes out in parts
  // of about this many bytes (wire flag `part`, docs/wire-format.md; at most
  // wire::max_commit_parts, the parts grow beyond that), each checksummed
  // on its own, with commit_window parts in flight: the server checks part
  // i (CRC, values) while part i + 1 is in transfer, and applies the commit
  // once every part passed. Compressed commits go whole. 0: one message
  // (the default; docs/perf/ps-ucx.md "Commits in parts"); otherwise >= 4096.
  std::uint64_t commit_part_bytes = 0;
  // Parts of one commit in flight to a server at most (sent, not yet
  // completed): 1 .. wire::max_parts_in_flight (what a server holds).
  std::uint32_t commit_window = 4;
  // The servers' allow_non_finite (server_core_params): a commit is checked
  // whole before any shard's part is sent (rules/commit_check.hpp), so a NaN
  // or infinite value in one server's part refuses the commit on every
  // server alike, none applies a part. Set it as the
  // servers' is set; false (their default) refuses such values here.
  bool allow_non_finite = false;
};

// The plan and codec in force for a worker's cycle (a leader's, handed to
// its followers).
struct plan_in_force {
  worker_plan plan{};
  codec_id codec = codec_id::identity;
};

struct worker_telemetry {
  std::uint64_t commits = 0, pulls = 0;
  std::uint64_t pushes = 0;           // of the commits, pushes (acknowledged, no parameters back)
  std::uint64_t bytes_out = 0, bytes_in = 0;  // header + data
  std::uint64_t plans = 0;            // plan_updates from server 0
  std::uint64_t plan_changes = 0;     // of them, plans that differed from the one in force
  std::uint64_t plans_ignored = 0;    // plan_updates from servers other than 0
  std::uint64_t errors = 0;           // error messages from servers
  std::uint64_t copied_replies = 0;   // pull replies delivered eagerly (copied once from the transport's buffer)
  std::uint64_t staged_replies = 0;   // pulls delivered to the caller's buffer once every reply was checked (stage_replies)
  std::uint64_t bad_messages = 0;     // messages from servers refused (checksum, size, shape): the wait failed
  std::uint64_t reply_parts = 0;      // parts of pull replies received and checked (server_params.reply_part_bytes)
  std::uint64_t commit_parts = 0;     // parts of commits sent (worker_params.commit_part_bytes)
  std::uint64_t reconnects = 0;       // connections to a server made again (worker_params.reconnect)
  std::uint64_t measurement_messages = 0;  // measurements messages sent (to each server; measurement_interval)
  double wait_seconds = 0.0;          // inside wait()
  double compress_seconds = 0.0;
  double link_seconds = 0.0;          // held by the emulated link (worker_params.link_bytes_per_second)
  transport::transport_counters transport{};

  // The one list of these counters (core/fields.hpp): the Python binding's
  // dicts are read off it, and fields_cover<>() proves none is missing.
  static constexpr auto fields() {
    return std::tuple{
        field{"commits", &worker_telemetry::commits},
        field{"pulls", &worker_telemetry::pulls},
        field{"pushes", &worker_telemetry::pushes},
        field{"bytes_out", &worker_telemetry::bytes_out},
        field{"bytes_in", &worker_telemetry::bytes_in},
        field{"plans", &worker_telemetry::plans},
        field{"plan_changes", &worker_telemetry::plan_changes},
        field{"plans_ignored", &worker_telemetry::plans_ignored},
        field{"errors", &worker_telemetry::errors},
        field{"copied_replies", &worker_telemetry::copied_replies},
        field{"staged_replies", &worker_telemetry::staged_replies},
        field{"bad_messages", &worker_telemetry::bad_messages},
        field{"reply_parts", &worker_telemetry::reply_parts},
        field{"commit_parts", &worker_telemetry::commit_parts},
        field{"reconnects", &worker_telemetry::reconnects},
        field{"measurement_messages", &worker_telemetry::measurement_messages},
        field{"wait_seconds", &worker_telemetry::wait_seconds},
        field{"compress_seconds", &worker_telemetry::compress_seconds},
        field{"link_seconds", &worker_telemetry::link_seconds},
        field{"transport", &worker_telemetry::transport}};
  }
};
static_assert(fields_cover<worker_telemetry>(), "worker_telemetry::fields() must list every counter");



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

  // One local iteration is done; true when the plan's iterations (or commit
  // interval) are complete: commit now.
  bool iteration_done() {
    std::lock_guard g(state_->mu);
    if (state_->cycle.state() != worker_cycle::phase::computing) return true;  // done already: commit
    return state_->cycle.iteration_done(state_->clock.now());
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
    std::lock_guard g(state_->mu);
    state& s = *state_;
    if (s.cycle.state() != worker_cycle::phase::computing) return true;  // done already: commit
    if (s.cycle.iterations() == 0 && s.cycle.follow(leader.plan, leader.codec, s.p.batch)) {
      ++s.tel.plan_changes;
      if (auto ok = check_plan_codec(leader.plan, leader.codec); !ok) s.fail(ok);
      else (void)s.encoder.set(leader.codec, leader.plan.compression_ratio, leader.plan.compression_options());
    }
    return s.cycle.iteration_done(s.clock.now(), leader_done);
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
    std::span<float> params;
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
    };
    std::vector<reply_parts_state> parts_in;
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
    bool leaving = false;
    std::uint64_t staleness = 0;             // τ of the last reply from server 0
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
      parts_out.assign(S, {});
      arrived.assign(S, 0);
      lost.assign(S, 0);
      lost_until.assign(S, 0.0);
      enc.resize(S);
      dense.resize(S);
      slots.reserve(4 * S + 8);
      free_slots.reserve(4 * S + 8);
      reported.reserve(8);
      check_parts.reserve(S);
      if (p.stage_replies) staged = std::make_unique_for_overwrite<float[]>(params.size());
    }

    // Where shard s's pull reply goes: the worker's staging buffer, or the
    // caller's parameters (stage_replies false).
    [[nodiscard]] std::span<float> reply_target(const key_range& r) const noexcept {
      if (staged) return {staged.get() + r.begin, r.size()};
      return params.subspan(r.begin, r.size());
    }

    // Every server's reply of the pull passed its checks: the parameters
    // change here, all shards at once, never after a bad reply. Shard
    // `direct` (an eager reply, the pull's last) was copied into them
    // already; a push's acknowledgements (replied 1) carry none.
    void deliver_replies(std::uint32_t direct) {
      if (!staged || !failed.ok()) return;
      for (std::uint32_t s = 0; s < servers(); ++s) {
        if (s == direct || replied[s] != 2) continue;
        const key_range r = layout.range(s);
        std::memcpy(params.data() + r.begin, staged.get() + r.begin, r.size() * sizeof(float));
      }
      ++tel.staged_replies;
    }

    [[nodiscard]] bool pending() const noexcept { return sends_pending != 0 || replies_pending != 0; }
    [[nodiscard]] std::uint32_t servers() const noexcept { return static_cast<std::uint32_t>(peer.size()); }

    std::string server_name(std::uint32_t s) const {
      return "server " + std::to_string(s) + " at " + p.servers[s];
    }

    // -------------------------------------------------------------- start

    status start() {
      for (std::uint32_t s = 0; s < servers(); ++s) {
        auto id = t.connect(p.servers[s]);
        if (!id) return id.error();
        peer[s] = *id;
      }
      const double deadline = clock.now() + seconds(p.timeout);
      ASHL_TRY(drive_until([&] { return all_connected(); }, deadline, "connecting to the servers"));
      for (std::uint32_t s = 0; s < servers(); ++s) {
        wire::header h{.kind = wire::message_kind::join, .rank = p.rank};
        ASHL_TRY(send_control(s, h, wire::join_body{.incarnation = p.incarnation, .batch = p.batch, .job = p.job}));
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
      return t.progress(h);
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

    // ------------------------------------------------------------- commit

    status commit(std::span<const float> update, bool ack_only) {
      if (!failed.ok()) return failed;
      if (update.size() != params.size())
        return invalid_argument("worker.commit.update.size", update.size(),
                                "must be the model's " + std::to_string(params.size()) + " elements");
      if (committing) return invalid_argument("worker.commit", "pending", "the last commit is not complete: wait() first");
      if (cycle.state() != worker_cycle::phase::compressing && cycle.state() != worker_cycle::phase::sending)
        return invalid_argument("worker.commit.iterations", cycle.iterations(),
                                "the plan's cycle is not complete: call iteration_done() until it returns true");
      // Every shard's part, before any is encoded or sent: refused whole,
      // nothing changed (the cycle stays complete: commit a fixed update).
      check_parts.clear();
      for (std::uint32_t s = 0; s < servers(); ++s) {
        const key_range r = layout.range(s);
        check_parts.push_back({.payload = std::as_bytes(update.subspan(r.begin, r.size())),
                               .element_count = r.size(),
                               .model_begin = r.begin});
      }
      ASHL_TRY(check_commit_parts(check_parts, {.allow_non_finite = p.allow_non_finite}));
      double now = clock.now();
      iterations_total += cycle.iterations();
      const bool compressing = cycle.compresses() && encoder.compresses();
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

    status commit_encoded(std::span<const std::span<const std::byte>> payloads) {
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
      check_parts.clear();
      for (std::uint32_t s = 0; s < servers(); ++s) {
        const key_range r = layout.range(s);
        check_parts.push_back(
            {.codec = encoder.codec(), .payload = payloads[s], .element_count = r.size(), .model_begin = r.begin});
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

    // Shard s's payload of the commit in flight.
    [[nodiscard]] std::span<const std::byte> commit_payload(std::uint32_t s) const {
      if (last_external) return last_payloads[s];
      if (last_compressed) return enc[s];
      return std::as_bytes(dense[s]);
    }

    // The commit whose payloads commit_payload() gives, with its pull.
    status send_commit(double now) {
      if (p.link_bytes_per_second > 0.0 || p.link_hold) {
        std::uint64_t b = 0;
        for (std::uint32_t s = 0; s < servers(); ++s) b += commit_wire_bytes(s);
        hold_for_link(link_direction::up, b);
      }
      // The samples and clock this commit carries, from the cycle (the rule
      // the simulator's workers follow).
      last_samples = cycle.commit_samples();
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

    // The parts shard s's commit goes in (worker_params.commit_part_bytes):
    // a dense one above the size; 0: whole.
    [[nodiscard]] std::uint32_t commit_parts(std::uint32_t s) const noexcept {
      if (last_compressed || last_external) return 0;
      const std::uint32_t n = wire::parts_for(layout.range(s).size(), sizeof(float), p.commit_part_bytes,
                                              wire::max_commit_parts);
      return n >= 2 ? n : 0;
    }
    [[nodiscard]] std::uint64_t commit_wire_bytes(std::uint32_t s) const noexcept {
      return std::uint64_t{wire::header_bytes} * std::max<std::uint32_t>(1, commit_parts(s)) + commit_payload(s).size();
    }

    // Shard s of the commit in flight (again, after a reconnect), with the
    // pull: whole, or in parts with worker_params.commit_window in flight
    // (the rest go from on_sent as parts complete).
    status send_commit_shard(std::uint32_t s) {
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
      ASHL_TRY(wire::seal_header(h, payload, slots[i].head));
      ++sends_pending;
      return send(s, i, slots[i].head, payload);
    }

    // The header of shard s's commit in flight.
    [[nodiscard]] wire::header commit_header(std::uint32_t s) const {
      return {.kind = wire::message_kind::commit,
              .codec = last_compressed ? encoder.codec() : codec_id::identity,
              .type = dtype::f32,
              // The pull rides with it; a push asks for an acknowledgement instead of the parameters.
              .flags = wire::flag_last_shard | wire::flag_pull | (last_ack_only ? wire::flag_ack_requested : 0u),
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
    status send_commit_part(std::uint32_t s, std::uint32_t j) {
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
      ++sends_pending;
      ++tel.commit_parts;
      return send(s, i, slots[i].head, payload);
    }

    status send_pulls(std::uint64_t seq) {
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

    status send_pull(std::uint32_t s) {
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

    status pull_only() {
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

    // --------------------------------------------------------------- wait

    status wait() {
      const double deadline = clock.now() + seconds(p.timeout);
      ASHL_TRY(drive_until([&] { return !pending(); }, deadline, "waiting for the commit and the parameters"));
      return wait_done();
    }

    double wait_deadline = 0.0;  // wait_for()'s: worker_params.timeout from its first slice

    std::optional<status> wait_for(std::chrono::microseconds slice, bool first) {
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
    status wait_done() {
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

    // The parameters arrived: measurements out, the next cycle starts.
    void finish_cycle() {
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

    // The measurements join the cycle's outbox; a message goes out when
    // worker_cycle's rule says (worker_params.measurement_interval,
    // measurement_batch; the simulator's rule too). Capacity is reserved:
    // nothing allocates.
    void queue_measurements(std::span<const ashl::measurement> ms, double now) {
      cycle.report(ms, now, [&](std::span<const ashl::measurement> out) { (void)send_measurements(out); });
    }

    status send_measurements(std::span<const ashl::measurement> ms) {
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

    status send_metric(metric_id m, double value) {
      if (!failed.ok()) return failed;
      for (std::uint32_t s = 0; s < servers(); ++s)
        ASHL_TRY(send_control(s, wire::header{.rank = p.rank}, wire::metric_body{.name = m, .value = value}));
      return {};
    }

    status leave() {
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

    std::uint32_t take_slot() {
      if (!free_slots.empty()) {
        const std::uint32_t i = free_slots.back();
        free_slots.pop_back();
        return i;
      }
      slots.emplace_back();
      return static_cast<std::uint32_t>(slots.size() - 1);
    }

    status send(std::uint32_t s, std::uint32_t i, std::span<const std::byte> head, std::span<const std::byte> data) {
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

    // ---------------------------------------------------------- receiving

    std::uint32_t server_of_peer(transport::peer_id pid) const noexcept {
      for (std::uint32_t s = 0; s < servers(); ++s)
        if (peer[s] == pid) return s;
      return ~std::uint32_t{0};
    }

    std::span<std::byte> receive_buffer(transport::peer_id pid, std::span<const std::byte> head, std::size_t n) {
      const std::uint32_t s = server_of_peer(pid);
      const auto kind = wire::peek_kind(head);
      if (s == ~std::uint32_t{0} || !kind) return {};
      const key_range r = layout.range(s);
      if (kind == wire::message_kind::pull_reply && n == r.size() * sizeof(float) && replies_pending != 0 && !replied[s]) {
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

    void on_message(transport::peer_id pid, std::span<const std::byte> head, std::span<const std::byte> data) {
      const std::uint32_t s = server_of_peer(pid);
      if (s == ~std::uint32_t{0}) return;
      tel.bytes_in += head.size() + data.size();
      const key_range r = layout.range(s);
      wire::limits lim;
      lim.max_elements = std::max<std::uint64_t>(r.size(), 1);
      auto m = wire::decode(head, data, lim);
      if (!m) {
        ++tel.bad_messages;
        fail(make_error(m.error().code(), "worker.message", server_name(s), m.error().message()));
        return;
      }
      const wire::header& h = m->header;
      switch (h.kind) {
        case wire::message_kind::pull_reply: {
          if (replied[s] || replies_pending == 0) return;  // not asked for: ignore
          if (last_ack_only && h.element_count == 0 && data.empty() && h.tensor == s) {
            // The acknowledgement of a push: the commit was taken and the
            // policy released this worker; no parameters.
            replied[s] = 1;
            if (--replies_pending == 0) deliver_replies(~std::uint32_t{0});  // a server that sent parameters
            reply_bytes += head.size();
            if (s == 0) staleness = h.step;
            return;
          }
          note_reply_started();
          if ((h.flags & wire::flag_part) != 0) {
            on_reply_part(s, r, *m, head.size() + data.size());
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
            if (staged && replies_pending == 1 && failed.ok()) {
              dst = std::as_writable_bytes(params.subspan(r.begin, r.size()));
              direct = s;
            }
            std::memcpy(dst.data(), m->payload.data(), dst.size());
            ++tel.copied_replies;
          }
          replied[s] = 2;  // parameters (staged, or in params already)
          if (--replies_pending == 0) deliver_replies(direct);
          reply_bytes += head.size() + data.size();
          if (s == 0) staleness = h.step;  // τ (docs/wire-format.md, pull_reply)
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
          fail(status(e->code, server_name(s) + " refused: " + std::string(e->text)));
          return;
        }
        case wire::message_kind::leave: {
          fail(make_error(errc::unavailable, "worker.rank", p.rank, "evicted by " + server_name(s)));
          return;
        }
        default:
          return;
      }
    }

    // One part of server s's reply, checked by decode (its own CRC, its
    // size for its index): it must be the next one of the same split and
    // version; the shard counts as replied when its last part passed.
    void on_reply_part(std::uint32_t s, const key_range& r, const wire::message_view& m, std::size_t bytes) {
      if (!failed.ok()) return;  // the pull failed (an earlier part, most likely): the rest of it is moot
      const wire::header& h = m.header;
      reply_parts_state& ps = parts_in[s];
      auto refuse = [&](std::string_view field, std::uint64_t value, const std::string& why) {
        ++tel.bad_messages;
        fail(make_error(errc::malformed, field, value, "from " + server_name(s) + ": " + why));
      };
      if (h.type != dtype::f32 || h.element_count != r.size() || h.tensor != s)
        return refuse("pull_reply.element_count", h.element_count,
                      "expected " + std::to_string(r.size()) + " f32 elements of shard " + std::to_string(s));
      if (ps.parts != 0 && h.parts != ps.parts)
        return refuse("pull_reply.parts", h.parts, "earlier parts of this reply said " + std::to_string(ps.parts));
      if (h.part != ps.next)
        return refuse("pull_reply.part", h.part,
                      "expected part " + std::to_string(ps.next) + " of " + std::to_string(h.parts) +
                          " (a part out of order or repeated)");
      if (ps.parts != 0 && h.clock != ps.clock)
        return refuse("pull_reply.clock", h.clock, "earlier parts of this reply are of version " + std::to_string(ps.clock));
      const wire::part_range pr = wire::part_elements(r.size(), h.parts, h.part);  // valid: decode checked it
      auto dst = std::as_writable_bytes(reply_target(r).subspan(pr.first, pr.count));
      if (m.payload.data() != dst.data()) std::memmove(dst.data(), m.payload.data(), dst.size());  // eager: from the transport's buffer
      ps.parts = h.parts;
      ps.clock = h.clock;
      ++ps.next;
      ++tel.reply_parts;
      reply_bytes += bytes;
      if (ps.next < ps.parts) return;
      replied[s] = 2;
      if (s == 0) staleness = h.step;
      if (--replies_pending == 0) deliver_replies(~std::uint32_t{0});
    }

    void on_sent(transport::peer_id pid, std::uint64_t cookie, const status& st) {
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

    void on_peer(transport::peer_id pid, transport::peer_event e, const status& why) {
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

    // The first reply of the cycle began arriving: the pull is timed from
    // here (worker_cycle::reply_started), as the simulator times it from the
    // server's start of the reply, so a pull the server held (a barrier, a
    // staleness bound) is not measured as transfer. A reply that overtakes
    // the commit's send completion leaves the pull timed from that.
    void note_reply_started() {
      if (cycle.state() == worker_cycle::phase::waiting) cycle.reply_started(clock.now());
    }

    // ------------------------------------------------------- reconnecting

    [[nodiscard]] bool may_reconnect() const noexcept { return p.reconnect.count() > 0 && !leaving && failed.ok(); }
    [[nodiscard]] bool any_lost() const noexcept {
      return std::any_of(lost.begin(), lost.end(), [](std::uint8_t l) { return l != 0; });
    }

    // Server s is gone: connect again (the transport retries until its
    // connect deadline; a failed attempt comes back here) until lost_until.
    void lose(std::uint32_t s, const status& why) {
      const double now = clock.now();
      if (!lost[s]) {
        lost[s] = 1;
        lost_until[s] = now + seconds(p.reconnect);
        std::fprintf(stderr, "worker %u: %s; reconnecting for up to %.1f s\n", p.rank, why.message().c_str(),
                     seconds(p.reconnect));
      }
      if (now >= lost_until[s]) {
        fail(make_error(errc::timed_out, "worker.reconnect_ms", p.reconnect.count(),
                        "passed and " + server_name(s) + " is not back (" + why.message() + ")"));
        return;
      }
      connected[s] = 0;
      auto id = t.connect(p.servers[s]);
      if (!id) {
        fail(make_error(id.error().code(), "worker.reconnect", server_name(s), id.error().message()));
        return;
      }
      peer[s] = *id;
    }

    // Server s is back: join again (the same incarnation keeps the
    // sequence), then what was in flight to it: the commit with its pull, or
    // the pull.
    void rejoin(std::uint32_t s) {
      lost[s] = 0;
      ++tel.reconnects;
      std::fprintf(stderr, "worker %u: reconnected to %s\n", p.rank, server_name(s).c_str());
      wire::header h{.kind = wire::message_kind::join, .rank = p.rank};
      if (auto st = send_control(s, h, wire::join_body{.incarnation = p.incarnation, .batch = p.batch, .job = p.job}); !st) return;
      if (!committing || replied[s]) return;
      parts_in[s] = {};  // the server answers the re-sent request whole: parts of the lost connection's reply do not count
      if (last_was_commit) (void)send_commit_shard(s);
      else (void)send_pull(s);
    }

    // A reconnect that outlived its bound fails the worker.
    void check_reconnects(double now) {
      for (std::uint32_t s = 0; s < servers(); ++s)
        if (lost[s] && now >= lost_until[s])
          fail(make_error(errc::timed_out, "worker.reconnect_ms", p.reconnect.count(),
                          "passed and " + server_name(s) + " is not back"));
    }

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
