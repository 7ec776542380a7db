// ashl/rules/worker_cycle.hpp — a worker's rules between two pulls, pure: how
// many local iterations at which batch, whether to compress, the commit's
// sequence, and what to report as measurements. The driver owns time (it
// passes `now`) and does the work.
//
//   ashl::ps::worker_cycle cyc(w);
//   cyc.plan_arrived(plan, codec);                   // the join's plan; later, each plan_update
//   cyc.start(/*own_batch=*/64, now);                // adopts the newest plan that has arrived
//   while (!cyc.iteration_done(now = train_one_step(cyc.batch()))) {}   // or (now, samples trained)
//   if (cyc.compresses()) { encode(plan.compression_ratio); cyc.compressed(now, payload_bytes); }
//   auto seq = cyc.commit_sent(now);                  // 1, 2, ...; cyc.clock(), cyc.samples() with it
//   cyc.commit_arrived(now, bytes);                   // push measured
//   cyc.reply_started(now);                           // optional: the reply left the server
//   cyc.reply_arrived(now, bytes);                    // pull and commit (push + pull) measured
//   cyc.report(cyc.measurements(), now, send);       // the sending rule: send(records) when due
//   cyc.clear_measurements();
//   ...
//   cyc.flush_reports(now, send);                     // before leaving
//
// The plan in force is the cycle's: plans arrive as events (plan_arrived:
// the join's plan, then server 0's plan_updates, in the order the wire
// delivers them, after the measurements that caused them) and the newest
// one is adopted at the next start(), never in the middle of a cycle. Both
// drivers follow this one rule: the real worker calls plan_arrived when a
// plan_update is delivered, the simulator when server 0's plan reaches the
// worker over its modelled link.
//
// A cycle runs H = plan.local_iterations iterations, or with H = 0
// iterations until plan.commit_interval() has passed since start (at least
// one; ADSP). Batch = plan.batch_size, or the worker's own when 0. It
// compresses when the plan's ratio is below 1. Measurements (core/plan.hpp):
// compute = the cycle's compute time per iteration with amount = batch (one
// per cycle), compress with amount = payload bytes, push and pull with
// amount = bytes, commit = push + pull of the same commit (ADSP's O_i);
// a measurement of no positive duration is not reported. These are the
// rules the simulator's workers held inline (sim/simulator.hpp
// once). docs/algorithms.md §1 "ADSP", §2 "Phase 0"; docs/ps.md.
//
// Sending them: one rule for both drivers. At a cycle's end the
// driver queues the cycle's records (report(); a follower queues its
// leader's instead) into the outbox, and a measurements message carrying
// the outbox goes to every server when the rule says it is due: once
// report_rule.interval has passed since the last one went, or once the
// outbox is nearly full (fewer than 8 free records of report_rule.batch:
// a cycle records up to five), and whatever waits before the worker leaves
// (flush_reports()). A cycle shorter than the interval adds its records to
// a later message. The outbox's capacity is reserved once: nothing
// allocates. ps::worker sends over its transport, the simulator over its
// modelled network (a small message, after the link latencies).
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/wire/ids.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

// When a worker's measurements go to its servers (worker_cycle::report):
// ps::worker_params::measurement_interval / measurement_batch, and the
// simulator's run_options, default to these.
struct report_rule {
  // Seconds between two measurements messages at least (0: at every
  // cycle's end).
  double interval = 0.001;
  // Records in one message at most (>= min_batch; at most the servers'
  // wire limits.max_measurements).
  std::uint32_t batch = 64;
  // A cycle records up to five; the outbox goes out when fewer than this
  // many records are free.
  static constexpr std::uint32_t min_batch = 8;
  friend bool operator==(const report_rule&, const report_rule&) = default;
};

class worker_cycle {
 public:
  enum class phase : std::uint8_t { idle, computing, compressing, sending, waiting, receiving };

  // The most iterations an interval-driven cycle runs (a guard against a
  // zero-duration iteration).
  static constexpr std::uint32_t max_interval_iterations = 1u << 24;

  worker_cycle() : worker_cycle(0) {}
  explicit worker_cycle(std::uint32_t worker, report_rule rule = {}) : worker_(worker) {
    log_.reserve(8);
    set_report_rule(rule);
  }

  // A plan (and the codec its commits use) arrived from the servers; it is
  // adopted at the next start(). A newer arrival replaces one not yet adopted.
  void plan_arrived(const worker_plan& plan, codec_id codec = codec_id::identity) noexcept {
    next_plan_ = plan;
    next_codec_ = codec;
    has_next_ = true;
  }
  // Whether a plan has arrived (the first start() needs one).
  [[nodiscard]] bool has_plan() const noexcept { return has_next_ || adopted_ > 0; }

  // Begins a cycle with the newest plan that has arrived; true when that
  // plan (or its codec) differs from the one of the previous cycle.
  bool start(std::uint32_t own_batch, double now) {
    ASHL_ASSERT(phase_ == phase::idle, "worker_cycle::start: the previous cycle has not ended");
    ASHL_ASSERT(has_plan(), "worker_cycle::start: no plan has arrived");
    bool changed = false;
    if (has_next_) {
      changed = adopted_ == 0 || !(next_plan_ == plan_) || next_codec_ != codec_;
      plan_ = next_plan_;
      codec_ = next_codec_;
      has_next_ = false;
      ++adopted_;
      if (changed) ++plan_changes_;
    }
    batch_ = plan_.batch_size != 0 ? plan_.batch_size : own_batch;
    iterations_ = 0;
    samples_ = 0;
    started_ = now;
    has_commit_ = false;
    phase_ = phase::computing;
    return changed;
  }

  // One local iteration finished at `now`; true when the cycle's compute is
  // complete (then the compute measurement is recorded).
  // The iteration trained the cycle's batch().
  bool iteration_done(double now) { return iteration_done(now, std::uint64_t{batch_}); }
  // The same for an iteration that trained `samples` samples (a data
  // ledger's lease may end in a short batch, docs/elastic.md §3.6): the
  // commit's samples() are the samples actually trained. Any integer type
  // (a bool is the follower's overload below).
  template <std::integral N>
    requires(!std::same_as<N, bool>)
  bool iteration_done(double now, N samples) {
    ASHL_ASSERT(phase_ == phase::computing, "worker_cycle::iteration_done: not computing");
    ASHL_ASSERT(samples >= 0, "worker_cycle::iteration_done: a negative sample count");
    ++iterations_;
    samples_ += static_cast<std::uint64_t>(samples);
    if (!cycle_complete(plan_, iterations_, now - started_, max_interval_iterations)) return false;
    end_compute(now);
    return true;
  }

  // A follower's cycle: one whose plan and end are another cycle's, its
  // leader's (ps::worker_params::follower; the torch adapter's buckets after
  // the first run the first bucket's cycle, docs/torch.md). Before the
  // cycle's first iteration the plan in force is replaced by the plan the
  // leader adopted at the start of the same cycle, so the rule "adopted at a
  // cycle start, never inside one" holds for both; true when that changed
  // the plan or codec.
  bool follow(const worker_plan& plan, codec_id codec, std::uint32_t own_batch) {
    ASHL_ASSERT(phase_ == phase::computing && iterations_ == 0,
                "worker_cycle::follow: only before the cycle's first iteration");
    const bool changed = !(plan == plan_) || codec != codec_;
    plan_ = plan;
    codec_ = codec;
    if (changed) ++plan_changes_;
    batch_ = plan_.batch_size != 0 ? plan_.batch_size : own_batch;
    return changed;
  }
  // One local iteration of a follower's cycle finished at `now`; the cycle's
  // compute is complete when the leader's is (`complete`, what the leader's
  // iteration_done said for the same iteration).
  bool iteration_done(double now, bool complete) { return iteration_done(now, complete, std::uint64_t{batch_}); }
  // The same for an iteration that trained `samples` samples.
  bool iteration_done(double now, bool complete, std::uint64_t samples) {
    ASHL_ASSERT(phase_ == phase::computing, "worker_cycle::iteration_done: not computing");
    ++iterations_;
    samples_ += samples;
    if (!complete) return false;
    end_compute(now);
    return true;
  }

  [[nodiscard]] std::uint32_t iterations() const noexcept { return iterations_; }
  [[nodiscard]] std::uint32_t batch() const noexcept { return batch_; }
  [[nodiscard]] const worker_plan& plan() const noexcept { return plan_; }
  [[nodiscard]] codec_id codec() const noexcept { return codec_; }
  // Plans adopted at a start (the first one included), and of them those that
  // changed the plan or codec in force.
  [[nodiscard]] std::uint64_t plans_adopted() const noexcept { return adopted_; }
  [[nodiscard]] std::uint64_t plan_changes() const noexcept { return plan_changes_; }
  [[nodiscard]] bool compresses() const noexcept { return plan_.compression_ratio < 1.0f; }
  [[nodiscard]] phase state() const noexcept { return phase_; }
  // Samples this cycle covered: its iterations' samples (each the batch,
  // or what iteration_done(now, samples) said): what its commit carries
  // (wire::header::samples; the simulator's commit_in.samples), bounded by
  // the server (server_core_params::max_commit_samples).
  [[nodiscard]] std::uint64_t samples() const noexcept { return samples_; }
  // samples() as the commit carries them: 32 bits, saturated (a count past
  // them reaches the server as UINT32_MAX, to be refused by its bound).
  [[nodiscard]] std::uint32_t commit_samples() const noexcept {
    return static_cast<std::uint32_t>(std::min<std::uint64_t>(samples(), 0xffffffffu));
  }

  // Compression finished at `now`, producing `payload_bytes`.
  void compressed(double now, double payload_bytes) {
    ASHL_ASSERT(phase_ == phase::compressing, "worker_cycle::compressed: not compressing");
    record(measurement_kind::compress, now - compute_end_, payload_bytes, now);
    phase_ = phase::sending;
  }

  // The commit leaves now; returns its sequence (1, 2, ... per incarnation).
  std::uint64_t commit_sent(double now) {
    ASHL_ASSERT(phase_ == phase::sending || phase_ == phase::compressing, "worker_cycle::commit_sent: no compute done");
    push_start_ = now;
    has_commit_ = true;
    phase_ = phase::sending;
    return ++sequence_;
  }

  // The commit arrived at the server(s): push measured.
  void commit_arrived(double now, double bytes) {
    ASHL_ASSERT(phase_ == phase::sending, "worker_cycle::commit_arrived: no commit sent");
    push_s_ = now - push_start_;
    record(measurement_kind::push, push_s_, bytes, now);
    pull_start_ = now;
    phase_ = phase::waiting;
  }

  // A pull without a commit (after joining): the pull is timed from here.
  void pull_sent(double now) {
    ASHL_ASSERT(phase_ == phase::idle, "worker_cycle::pull_sent: a cycle is running");
    has_commit_ = false;
    pull_start_ = now;
    phase_ = phase::waiting;
  }

  // The server started the reply (the pull is timed from here, not from the
  // commit's arrival, so a held pull's wait is not counted as transfer).
  void reply_started(double now) {
    ASHL_ASSERT(phase_ == phase::waiting, "worker_cycle::reply_started: not waiting for a reply");
    pull_start_ = now;
    phase_ = phase::receiving;
  }

  // The parameters arrived: pull (and, after a commit, commit = push + pull)
  // measured; the cycle ends.
  void reply_arrived(double now, double bytes) {
    ASHL_ASSERT(phase_ == phase::waiting || phase_ == phase::receiving, "worker_cycle::reply_arrived: no pull pending");
    const double pull_s = now - pull_start_;
    record(measurement_kind::pull, pull_s, bytes, now);
    if (has_commit_) record(measurement_kind::commit, push_s_ + pull_s, 0.0, now);
    has_commit_ = false;
    phase_ = phase::idle;
  }

  // The servers acknowledged the commit without sending parameters (a
  // push: ps::worker::push): commit = push + the wait for the
  // acknowledgement is measured, no pull (nothing was pulled); the cycle
  // ends.
  void ack_arrived(double now) {
    ASHL_ASSERT((phase_ == phase::waiting || phase_ == phase::receiving) && has_commit_,
                "worker_cycle::ack_arrived: no commit awaits an acknowledgement");
    record(measurement_kind::commit, push_s_ + (now - pull_start_), 0.0, now);
    has_commit_ = false;
    phase_ = phase::idle;
  }

  // A new incarnation (the worker restarted as a new process): sequences
  // start again at 1, and no plan is in force until the join's arrives;
  // the old process's unsent records are gone with it.
  void restart() noexcept {
    drop_reports();
    sequence_ = 0;
    has_next_ = false;
    adopted_ = 0;
    plan_ = {};
    codec_ = codec_id::identity;
    has_commit_ = false;
    phase_ = phase::idle;
  }
  // The worker stops mid-cycle (it was evicted, or the run ended).
  void abandon() noexcept { phase_ = phase::idle; }

  [[nodiscard]] std::uint64_t sequence() const noexcept { return sequence_; }
  // The logical clock of the last commit sent (core/plan.hpp commit_clock):
  // what its header.clock / commit_in.clock carries.
  [[nodiscard]] std::uint64_t clock() const noexcept { return commit_clock(sequence_); }
  [[nodiscard]] std::uint32_t worker() const noexcept { return worker_; }

  // The records of the cycle in progress (or just ended).
  [[nodiscard]] std::span<const ashl::measurement> measurements() const noexcept { return log_; }
  void clear_measurements() noexcept { log_.clear(); }

  // ------------------------------------------------ sending measurements

  // The rule; the outbox's capacity is reserved here (batch records).
  void set_report_rule(report_rule rule) {
    ASHL_ASSERT(rule.batch >= report_rule::min_batch && rule.interval >= 0.0,
                "worker_cycle::set_report_rule: batch >= 8 and interval >= 0 (the drivers check their parameters)");
    rule_ = rule;
    outbox_.reserve(rule.batch);
  }
  [[nodiscard]] const report_rule& rule() const noexcept { return rule_; }

  // Records queued and not sent yet.
  [[nodiscard]] std::span<const ashl::measurement> unsent() const noexcept { return outbox_; }
  // Takes as many of `ms` as the outbox has room for; returns how many.
  std::size_t queue_reports(std::span<const ashl::measurement> ms) {
    const std::size_t n = std::min<std::size_t>(ms.size(), rule_.batch - outbox_.size());
    outbox_.insert(outbox_.end(), ms.begin(), ms.begin() + static_cast<std::ptrdiff_t>(n));
    return n;
  }
  // Whether the outbox is due to go at `now`: records wait, and the interval
  // has passed since the last message or fewer than min_batch records are
  // free.
  [[nodiscard]] bool reports_due(double now) const noexcept {
    if (outbox_.empty()) return false;
    return outbox_.size() + report_rule::min_batch > rule_.batch || now - sent_at_ >= rule_.interval;
  }
  // The driver sent unsent() in one message at `now`.
  void reports_sent(double now) noexcept {
    outbox_.clear();
    sent_at_ = now;
    ++messages_;
  }
  // The records waiting are dropped (the worker died; a new incarnation).
  void drop_reports() noexcept {
    outbox_.clear();
    sent_at_ = -std::numeric_limits<double>::infinity();
  }
  // Measurements messages sent (reports_sent calls).
  [[nodiscard]] std::uint64_t report_messages() const noexcept { return messages_; }

  // The rule in one call, at a cycle's end: queues `ms` (the cycle's
  // measurements(), or a leader's) and calls send(unsent()) for every
  // message due now: a full outbox before the rest is queued, then the
  // outbox if reports_due(now). `send` is the driver's I/O.
  template <class Send>
  void report(std::span<const ashl::measurement> ms, double now, Send&& send) {
    for (;;) {
      ms = ms.subspan(queue_reports(ms));
      if (ms.empty()) break;
      send(unsent());
      reports_sent(now);
    }
    if (reports_due(now)) {
      send(unsent());
      reports_sent(now);
    }
  }
  // Whatever waits goes now (before the worker leaves).
  template <class Send>
  void flush_reports(double now, Send&& send) {
    if (outbox_.empty()) return;
    send(unsent());
    reports_sent(now);
  }

 private:
  void end_compute(double now) {
    compute_end_ = now;
    record(measurement_kind::compute, (now - started_) / iterations_, batch_, now);
    phase_ = compresses() ? phase::compressing : phase::sending;
  }

  void record(measurement_kind k, double seconds, double amount, double now) {
    if (!(seconds > 0.0)) return;
    log_.push_back({worker_, k, seconds, amount, now});
  }

  std::uint32_t worker_ = 0;
  worker_plan plan_{}, next_plan_{};
  codec_id codec_ = codec_id::identity, next_codec_ = codec_id::identity;
  bool has_next_ = false;
  std::uint64_t adopted_ = 0, plan_changes_ = 0;
  std::uint32_t batch_ = 0;
  std::uint32_t iterations_ = 0;
  std::uint64_t samples_ = 0;  // this cycle's, summed per iteration (saturating is the commit's, commit_samples)
  double started_ = 0.0, compute_end_ = 0.0, push_start_ = 0.0, pull_start_ = 0.0, push_s_ = 0.0;
  std::uint64_t sequence_ = 0;
  bool has_commit_ = false;
  phase phase_ = phase::idle;
  std::vector<ashl::measurement> log_;
  report_rule rule_{};
  std::vector<ashl::measurement> outbox_;
  double sent_at_ = -std::numeric_limits<double>::infinity();
  std::uint64_t messages_ = 0;
};

}  // namespace ps
ASHL_NAMESPACE_END
