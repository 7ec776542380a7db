// ashl/ps/server.hpp — one parameter server process: the event loop that
// drives a ps::server_core over a transport (docs/design.md "Data flow of one
// commit", "Runtime contract for real runs"; docs/ps.md "Servers and workers").
//
//   auto t = ashl::transport::ucx::create({.listen = "0.0.0.0:5000", .token = token});
//   auto layout = ashl::ps::shard_layout::even(n, servers);
//   ashl::ps::server_params sp{.core = {.layout = *layout, .shard = rank, .workers = m,
//                                        .optimizer = {.mode = ashl::ps::optimizer_params::kind::sgd, .lr = 0.1}}};
//   auto srv = ashl::ps::server<ashl::transport::ucx>::create(sp, *ashl::ps::make_policy("ssp", pp), std::move(*t), init);
//   std::atomic<bool> stop{false};
//   srv->run(stop);                        // until stop, every rank left, or no worker for no_worker_grace
//   srv->telemetry();                      // counters: applied, refused by reason, bytes, pulls held, ...
//
// The server owns no rule of its own: every commit, pull, join, leave,
// metric and measurement goes to server_core, and what server_core says to
// send (pull replies, plans, errors) goes out. What the server adds is what a
// network needs: a message is decoded and validated (wire::decode, with
// limits from the shard's size, so no length field makes it allocate past
// the bound) before anything else; a connection is bound to one worker rank
// by its join and may speak only for that rank; a data part larger than the
// bound is refused before it is received; a peer that fails is evicted. A
// message that is refused is answered with an error naming the field and
// counted by reason; it never changes the parameters.
//
// Pull replies are dense f32 parameters of the shard, sent from where they
// lie: a reply pins the version it reads (server_core::pin_parameters,
// reference-counted by the sends in flight), whose CRC is computed once per
// version (by the apply that made it when a pull rode with the commit), and
// each reply's header is combined with it. A change while replies read the
// version is made beside it (double-buffered: the dense apply writes the new
// version into a spare buffer in its one pass), so no version is copied for
// its readers. Version buffers, receive buffers and send slots are pools:
// after warm-up no message allocates.
//
// Plans: every server runs a copy of the policy over its shard (holds,
// rounds), and the plans of server 0 are the ones workers follow (they
// ignore the others'), so a time-driven policy cannot give a worker two
// plans (docs/ps.md, "Plan authority").
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/compress/registry.hpp>
#include <ashl/core/clock.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/ps/checkpoint.hpp>
#include <ashl/rules/commit_encoder.hpp>
#include <ashl/rules/commit_in.hpp>
#include <ashl/rules/core_events.hpp>
#include <ashl/ps/incarnation.hpp>
#include <ashl/ps/identity.hpp>
#include <ashl/ps/server_vocabulary.hpp>
#include <ashl/rules/server_core.hpp>
#include <ashl/sync/any_policy.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/transport/concepts.hpp>
#include <ashl/wire/crc32c.hpp>
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
#include <span>
#include <string>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

namespace detail {

// A byte buffer that grows but never shrinks (pools keep their capacity).
struct pooled_buffer {
  std::vector<std::byte> bytes;
  std::size_t used = 0;
  bool busy = false;
};

// Ids of free entries of a pool, most recently freed first.
class free_list {
 public:
  [[nodiscard]] bool empty() const noexcept { return ids_.empty(); }
  std::uint32_t take() noexcept {
    const std::uint32_t i = ids_.back();
    ids_.pop_back();
    return i;
  }
  void give(std::uint32_t i) { ids_.push_back(i); }
  void reserve(std::size_t n) { ids_.reserve(n); }
  void remove(std::uint32_t i) noexcept { ids_.erase(std::remove(ids_.begin(), ids_.end(), i), ids_.end()); }

 private:
  std::vector<std::uint32_t> ids_;
};

struct replica_link;  // a primary's link to its backup (ps/server_replica.hpp)

// The largest data part a worker may send a shard: any codec's payload for
// its elements is below 8 bytes per element (sparse pairs at ratio 1) plus a
// small header. The same bound on a primary and its backup.
inline void bound_payload(server_core_params& core) {
  const std::uint64_t n = core.layout.range(core.shard).size();
  core.limits.max_payload_bytes = std::min<std::uint64_t>(
      core.limits.max_payload_bytes, 8 * n + 4096 + wire::measurements_body::bytes_for(core.limits.max_measurements));
}

}  // namespace detail

template <transport::transport Transport, sync::consistency_policy Policy = sync::any_policy>
class server {
 public:
  using core_type = server_core<Policy>;
  static constexpr std::uint32_t max_apply_batch = 64;  // server_params.apply_batch

  static result<server> create(server_params p, Policy policy, Transport t, std::span<const float> initial = {}) {
    return create_with(std::move(p), std::move(t), [&](const server_params& q) -> result<core_type> {
      return core_type::create(q.core, std::move(policy), initial);
    });
  }

  // A backup's core promoted to this shard's primary (docs/elastic.md
  // §4.5; ps::server_backup::take_over calls it): `core` holds the
  // replicated state, every rank it knows is evicted (their connections
  // went to the old primary; they rejoin with the same incarnation, as
  // after a restore), the term is `term`, the clock goes on from `now`
  // (the old primary's timeline), and the server takes a backup of its own
  // (the old primary, restarted, attaches as one). `takeover_seconds`: from
  // the link's loss to the promotion (telemetry). `record`, when set, is
  // the server's record_core_calls sink from the start, the evictions
  // included: a log of the backup's records goes on through the take-over
  // (server_backup::record_core_calls; a backup attaching later gets a
  // snapshot, so the replica link is not sent them).
  static result<server> take_over(server_params p, core_type core, Transport t, std::uint32_t term, double now,
                                  double takeover_seconds, std::function<void(const core_event&)> record = {}) {
    p.take_backup = true;
    p.restore = false;
    auto srv = create_with(std::move(p), std::move(t),
                           [&](const server_params&) -> result<core_type> { return std::move(core); });
    if (!srv) return srv.error();
    srv->record_sink_ = std::move(record);
    server_actions ignored(srv->p_.core.max_workers);
    recorded_core evicting(srv->core_, [&](const core_event& e) {
      if (srv->record_sink_) srv->record_sink_(e);
    });
    for (worker_id w = 0; w < srv->core_.known_workers(); ++w)
      if (srv->core_.is_live(w)) evicting.evict(w, now, ignored);
    srv->clock_ = steady_clock::starting_at(now);
    srv->no_worker_since_ = now;
    srv->set_term(term);
    srv->tel_.failovers = 1;
    srv->tel_.takeover_seconds = takeover_seconds;
    return srv;
  }

 private:
  template <class MakeCore>
  static result<server> create_with(server_params p, Transport t, MakeCore make_core) {
    if (!(p.progress_seconds >= 0.0))
      return invalid_argument("server.progress_seconds", p.progress_seconds, "must be >= 0");
    ASHL_TRY(check_codec_options(p.compression, p.compression_options, "server.compression_options."));
    ASHL_TRY(check_compression_ratio(p.compression_ratio, p.compression, "server.compression_ratio"));
    detail::bound_payload(p.core);
    if (!(p.checkpoint_every_seconds >= 0.0) || !std::isfinite(p.checkpoint_every_seconds))
      return invalid_argument("server.checkpoint_every_seconds", p.checkpoint_every_seconds, "must be >= 0");
    if (p.worker_timeout.count() < 0)
      return invalid_argument("server.worker_timeout_ms", p.worker_timeout.count(), "must be >= 0 (0: never)");
    ASHL_TRY(check_duration("server.worker_timeout_ms", p.worker_timeout));
    ASHL_TRY(check_duration("server.no_worker_grace_ms", p.no_worker_grace));
    ASHL_TRY(check_duration("server.max_incarnation_ahead_ms", p.max_incarnation_ahead));
    if (!(p.checkpoint_every_seconds <= max_duration_seconds))
      return out_of_range("server.checkpoint_every_seconds", p.checkpoint_every_seconds,
                          "must be at most 1000000000 seconds (ps::max_duration_seconds)");
    if (!(p.progress_seconds <= max_duration_seconds))
      return out_of_range("server.progress_seconds", p.progress_seconds,
                          "must be at most 1000000000 seconds (ps::max_duration_seconds)");
    if (p.restore && p.checkpoint_dir.empty())
      return invalid_argument("server.restore", "true", "needs server.checkpoint_dir");
    if (p.max_incarnation_ahead.count() < 0)
      return invalid_argument("server.max_incarnation_ahead_s", p.max_incarnation_ahead.count(), "must be >= 0 (0: no bound)");
    // The automatic budgets count every rank the job may have (max_workers,
    // 0 = workers; the core refuses a bad value by name below), so a joiner
    // past the initial workers finds its share (docs/elastic.md §2.2).
    const std::uint32_t ranks = std::min(std::max(p.core.max_workers, p.core.workers), ps::max_workers);
    if (p.max_receive_bytes == 0) {
      const std::uint64_t k = std::uint64_t{ranks} + 1, one = p.core.limits.max_payload_bytes;
      p.max_receive_bytes = one > ~std::uint64_t{0} / k ? ~std::uint64_t{0} : k * one;
    }
    if (p.max_snapshots == 0) p.max_snapshots = 2 * std::max<std::uint32_t>(ranks, 1) + 2;
    if (p.reply_part_bytes != 0 && p.reply_part_bytes < 4096)
      return invalid_argument("server.reply_part_bytes", p.reply_part_bytes, "must be 0 (one message) or >= 4096");
    if (p.no_worker_grace.count() <= 0)
      return invalid_argument("server.no_worker_grace_ms", p.no_worker_grace.count(), "must be > 0");
    if (p.policy.size() > max_policy_name)
      return invalid_argument("server.policy", p.policy, "longer than " + std::to_string(max_policy_name) + " bytes");
    ASHL_TRY(apply_pool::check_threads(p.apply_threads, "server.apply_threads"));
    ASHL_TRY(check_replication(p));
    if (p.apply_batch < 1 || p.apply_batch > max_apply_batch)
      return invalid_argument("server.apply_batch", p.apply_batch,
                              "must be in 1.." + std::to_string(max_apply_batch) + " (1: each commit as it arrives)");
    if (p.ledger.samples != 0) {  // docs/elastic.md §3.3: server 0's core runs it
      ASHL_TRY(check_ledger_params(p.ledger, "server.ledger."));
      if (p.core.shard == 0) p.core.ledger = p.ledger;
    }
    auto core = make_core(p);
    if (!core) return core.error();
    p.core.max_workers = core->params().max_workers;  // resolved: 0 means workers
    core->defer_dense_applies(p.apply_batch);
    std::unique_ptr<apply_pool> pool;
    if (p.apply_threads > 1) {
      auto made = apply_pool::create(p.apply_threads, "server.apply_threads");
      if (!made) return made.error();
      pool = std::move(*made);
      core->use_apply_pool(pool.get());  // the pool lives on the heap: moves of the server keep it
    }
    // A reply in parts: the core computes the parts' CRCs in the pass that
    // computes the version's (the apply's or the first pin's), no pass of
    // the server's own.
    ASHL_TRY(core->checksum_in_parts(wire::parts_for(core->parameters().size(), sizeof(float), p.reply_part_bytes)));
    // The shard's checkpoint is this server's alone from here on (refused
    // when another server holds it), before it is read for a restore.
    std::unique_ptr<checkpoint_writer> writer;
    if (!p.checkpoint_dir.empty()) {
      auto w = checkpoint_writer::open(checkpoint_file(p.checkpoint_dir, p.core.shard),
                                       "server " + std::to_string(p.core.shard),
                                       p.checkpoint_write ? p.checkpoint_write : checkpoint_writer::write_function(write_checkpoint));
      if (!w) return w.error();
      writer = std::move(*w);
    }
    std::uint64_t restored = 0;
    if (p.restore) {
      const std::string file = checkpoint_file(p.checkpoint_dir, p.core.shard);
      auto c = read_checkpoint(file);
      if (!c && c.error().code() != errc::not_found) return c.error();
      if (c) {
        if (c->meta.shard != p.core.shard || c->meta.servers != p.core.layout.servers())
          return make_error(errc::invalid_argument, "checkpoint.shard", c->meta.shard,
                            "\"" + file + "\" is server " + std::to_string(c->meta.shard) + " of " +
                                std::to_string(c->meta.servers) + ", not " + std::to_string(p.core.shard) + " of " +
                                std::to_string(p.core.layout.servers()));
        state_reader in(c->state);
        if (auto s = check_identity(in, p); !s)
          return status(s.code(), "checkpoint \"" + file + "\": " + s.message());
        if (auto s = core->load(in); !s)
          return status(s.code(), "checkpoint \"" + file + "\": " + s.message());
        // The saved initial worker count may differ from this server's: a
        // job restores with any number of workers up to its maximum
        // (docs/elastic.md §2.2), compared below and in the identity.
        if (core->params().layout.elements() != p.core.layout.elements())
          return make_error(errc::invalid_argument, "checkpoint.state.elements", core->params().layout.elements(),
                            "\"" + file + "\": the saved state disagrees with its identity section");
        if (core->params().max_workers != p.core.max_workers)
          return make_error(errc::invalid_argument, "checkpoint.state.max_workers", core->params().max_workers,
                            "\"" + file + "\": this server's job admits at most " +
                                std::to_string(p.core.max_workers) + " workers");
        // Every connection died with the old process: its workers rejoin
        // (every rank the state knows, joiners past the initial ones too).
        server_actions ignored(p.core.max_workers);
        for (worker_id w = 0; w < core->known_workers(); ++w) core->evict(w, 0.0, ignored);
        restored = std::max<std::uint64_t>(core->version(), 1);
      }
    }
    server srv(std::move(p), std::move(*core), std::move(t));
    srv.writer_ = std::move(writer);
    srv.apply_pool_ = std::move(pool);
    srv.tel_.restored_version = restored;
    srv.applied_at_checkpoint_ = srv.core_.stats().commits_applied;
    if (srv.p_.take_backup) srv.start_replication();
    return srv;
  }

 public:

  server(server&&) noexcept = default;
  server& operator=(server&&) noexcept = default;

  // One pass: the transport's progress (every message handled, replies sent).
  std::size_t poll() {
    handler h{this};
    const std::size_t n = t_.progress(h);
    end_batch(clock_.now());  // what the pass delivered is applied and answered before the pass ends
    if (replica_) replica_poll(clock_.now());
    maybe_print_progress();
    return n;
  }

  // One pass, and when it handled nothing a wait of at most max_wait for the
  // transport's next event: the body of run(), for a program that runs its
  // own loop (evaluations, checkpoints on its own schedule). Returns the
  // number of events handled.
  std::size_t run_once(std::chrono::microseconds max_wait) {
    std::size_t n = poll();
    if (n == 0) {
      const double t0 = clock_.now();
      t_.wait(max_wait);
      tel_.wait_seconds += clock_.now() - t0;
    }
    const double now = clock_.now();
    if (now >= next_housekeeping_) {
      next_housekeeping_ = now + 0.05;
      evict_silent(now);
      tick_ledger(now);
      if (checkpoint_due(now)) start_checkpoint();
    }
    return n;
  }

  // Polls and waits (at most wait_slice at a time) until `stop` is set, or
  // (stop_when_all_left) every rank has left, or no worker has been
  // connected for no_worker_grace; end() says which.
  void run(const std::atomic<bool>& stop) {
    run(stop, [] {});
  }

  // The same, calling between() on the server's thread after every pass
  // (at least every wait_slice): where a program reads the parameters
  // consistently while the server runs (ashl.Server.parameters(), an
  // evaluator's snapshots), since no commit is being applied then.
  template <class Between>
  void run(const std::atomic<bool>& stop, Between&& between) {
    end_ = server_end::running;
    while (true) {
      if (stop.load(std::memory_order_relaxed)) {
        end_ = server_end::stopped;
        break;
      }
      run_once(std::chrono::duration_cast<std::chrono::microseconds>(p_.wait_slice));
      between();
      if (replica_stopped()) {
        end_ = server_end::backup_lost;
        break;
      }
      if (!p_.stop_when_all_left) continue;
      if (all_left()) {
        end_ = server_end::all_left;
        break;
      }
      const double alone = no_worker_seconds();
      if (alone >= std::chrono::duration<double>(p_.no_worker_grace).count()) {
        end_ = server_end::no_worker;
        std::fprintf(stderr, "server %u: no worker connected for %.1f s (no_worker_grace %.1f s): ending\n",
                     p_.core.shard, alone, std::chrono::duration<double>(p_.no_worker_grace).count());
        break;
      }
    }
    poll();  // what arrived last (leave acknowledgements, errors) is handled
    // The final checkpoint: after the write in flight, on this thread, and
    // its status kept (final_checkpoint()): a program exits non-zero when
    // it failed, since the job's last state is then not on disk.
    if (!p_.checkpoint_dir.empty()) final_checkpoint_ = checkpoint();
  }

  // Writes the checkpoint now and returns when it is on disk
  // (checkpoint_dir must be set): the state of server_core, atomically
  // (docs/checkpoints.md), after the periodic write in flight if there is
  // one. A failure is counted, printed (the first) and returned; the server
  // goes on. Periodic checkpoints do not wait: run_once serialises and hands
  // them to the writer thread (start_checkpoint).
  status checkpoint();

  // The status of the checkpoint run() wrote when it ended: ok when it was
  // written, or when there is no checkpoint_dir or run() has not ended; else
  // the error, naming the file (the job's last state is not on disk).
  [[nodiscard]] const status& final_checkpoint() const noexcept { return final_checkpoint_; }

  // A metric measured by the server's own program (a loss on held-out data,
  // say), handed to server_core as a worker's metric message would be.
  void report_metric(metric_id m, double value) { report_metric(m, value, std::chrono::steady_clock::now()); }
  // The same for a metric that describes an earlier instant: the loss of
  // the parameters as they were at `measured_at`, evaluated since. It is
  // stamped with that instant, as the simulator stamps an evaluation with
  // its tick, so a policy that times its decisions by metrics (ADSP's
  // commit-rate search) does not see the evaluation's own duration. An
  // instant after now counts as now.
  void report_metric(metric_id m, double value, std::chrono::steady_clock::time_point measured_at) {
    const double now = clock_.now();
    end_batch(now);
    calls().metric(m, value, std::min(clock_.at(measured_at), now), out_);
    flush(clock_.now());
  }

  // Drains the core (buffered commits applied, held pulls released) and sends
  // what that produced: at shutdown, before a final checkpoint.
  void drain() {
    end_batch(clock_.now());
    calls().drain(out_);
    flush(clock_.now());
  }

  [[nodiscard]] const core_type& core() const noexcept { return core_; }
  // Every state-changing call this server makes on its core (join, leave,
  // evict, commit, pull, metric, measurement, drain) is handed to `sink` as
  // a record before it is made (rules/core_events.hpp; docs/elastic.md
  // §4.1): a backup fed them in order holds this core's state. Unset (the
  // default), nothing is recorded. Not records: the load and evictions of a
  // restore in create (a backup attaching later gets a snapshot), and the
  // driver's choices (apply_pending, speculate, pins, replies).
  void record_core_calls(std::function<void(const core_event&)> sink) { record_sink_ = std::move(sink); }
  // Replication (server_params.take_backup; ps/server_replica.hpp): the
  // term (1 until a backup is dropped, then one more per drop) and whether a
  // backup is attached now.
  [[nodiscard]] std::uint32_t term() const noexcept;
  [[nodiscard]] bool backup_attached() const noexcept;
  // Why the last backup was dropped, naming the field (ok: none was).
  [[nodiscard]] status last_backup_drop() const;
  // The backup was dropped while most live workers were not connected: this
  // primary stopped (docs/elastic.md §4.4); every message is refused, run() ends.
  [[nodiscard]] bool replica_stopped() const noexcept;
  [[nodiscard]] std::span<const float> parameters() const noexcept { return core_.parameters(); }
  [[nodiscard]] Transport& transport() noexcept { return t_; }
  [[nodiscard]] const server_params& params() const noexcept { return p_; }
  [[nodiscard]] std::uint32_t workers_bound() const noexcept { return bound_; }
  // The version restored from a checkpoint at creation; 0 when none was.
  [[nodiscard]] std::uint64_t restored_version() const noexcept { return tel_.restored_version; }
  [[nodiscard]] bool any_joined() const noexcept { return joined_count_ > 0; }
  // Every rank that ever joined left explicitly (its current process sent
  // leave and did not join again) and none is live; an evicted rank has not
  // left. Every initial rank (0..workers-1) must have joined, as before
  // max_workers: one that was evicted before it ever came may still start
  // late and join, so the job waits for it (or for no_worker_grace). A rank
  // past the initial workers counts once it joined (docs/elastic.md §2.2).
  [[nodiscard]] bool all_left() const noexcept {
    return left_count_ > 0 && initial_joined_ == p_.core.workers && left_count_ == joined_count_ &&
           core_.live_count() == 0;
  }
  // Seconds since a worker was last connected (since creation if none ever
  // was); 0 while one is.
  [[nodiscard]] double no_worker_seconds() const noexcept {
    return bound_ > 0 ? 0.0 : clock_.now() - no_worker_since_;
  }
  // Why the last run() returned (running while it runs or before).
  [[nodiscard]] server_end end() const noexcept { return end_; }

  [[nodiscard]] server_telemetry telemetry() const {
    server_telemetry s = tel_;
    s.core = core_.stats();
    s.ledger = core_.ledger().stats();
    s.applied_beside = core_.applied_beside();
    s.copies_for_readers = core_.copies_for_readers();
    s.batched_applies = core_.batched_passes();
    s.batched_commits = core_.batched_commits();
    s.speculations = core_.speculations();
    s.speculations_stale = core_.speculations_stale();
    s.applied_as_landed = core_.applied_as_landed();
    s.fused_applies = core_.fused_applies();
    s.fused_wasted = core_.fused_wasted();
    s.transport = t_.counters();
    s.seconds = clock_.now();
    if (writer_) {
      const checkpoint_writer_stats w = writer_->stats();
      s.checkpoints = w.written;
      s.checkpoint_failures = w.failed;
      s.checkpoint_seconds = tel_.checkpoint_loop_seconds + w.write_seconds;
      s.checkpoint_bytes = w.bytes;
    }
    s.receive_bytes = rx_capacity();
    s.receive_bytes_lent = rx_lent();
    s.staging_bytes = staging_bytes_;
    if (replica_) replica_telemetry(s);
    return s;
  }

  // "server 0/2: 12.0 s  version 1234  commits 4000 (applied 3990, ...)  refused 2+0  pulls ..."
  [[nodiscard]] std::string progress_line() const {
    const server_telemetry s = telemetry();
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "server %u/%u: %.1f s  version %llu  commits %llu (applied %llu, buffered %llu, dup %llu)  "
                  "refused %llu+%llu  pulls %llu (held now %u, released %llu)  plans %llu  in %.1f MB  out %.1f MB  "
                  "idle %.0f%%  workers %u",
                  p_.core.shard, p_.core.layout.servers(), s.seconds, static_cast<unsigned long long>(s.core.steps),
                  static_cast<unsigned long long>(s.core.commits), static_cast<unsigned long long>(s.core.commits_applied),
                  static_cast<unsigned long long>(s.core.commits_buffered),
                  static_cast<unsigned long long>(s.core.duplicates),
                  static_cast<unsigned long long>(s.core.refused_total()),
                  static_cast<unsigned long long>(s.wire_refused_total()), static_cast<unsigned long long>(s.core.pulls),
                  held_now(), static_cast<unsigned long long>(s.core.pulls_released),
                  static_cast<unsigned long long>(s.plans), s.bytes_in / 1e6, s.bytes_out / 1e6,
                  s.seconds > 0 ? 100.0 * s.wait_seconds / s.seconds : 0.0, bound_);
    return buf;
  }

 private:
  static constexpr std::uint32_t no_rank = ~std::uint32_t{0};
  static constexpr std::size_t max_policy_name = 64;

  // The job's identity in a checkpoint (ps/server_checkpoint.hpp).
  void save_identity(state_writer& w) const;
  static status check_identity(state_reader& in, const server_params& p);

  struct peer_state {
    std::uint32_t rank = no_rank;
    bool failed = false;
    // A later process (larger incarnation) took this connection's rank: what
    // it sends is refused as stale, naming both incarnations.
    std::uint32_t superseded_rank = no_rank;
    std::uint64_t incarnation = 0, superseded_by = 0;
  };

  // A rank's staging buffer for commits in parts and the slices of it that
  // receives in flight are writing into.
  struct staging_area {
    std::vector<std::byte> bytes;  // the shard's dense f32 size; allocated once
    std::array<std::size_t, wire::max_parts_in_flight> claimed{};  // byte offsets being received into
    std::uint32_t claims = 0;
    [[nodiscard]] bool holds(const std::byte* at) const noexcept {
      return !bytes.empty() && at >= bytes.data() && at < bytes.data() + bytes.size();
    }
    [[nodiscard]] bool claimed_at(std::size_t off) const noexcept {
      return std::find(claimed.begin(), claimed.begin() + claims, off) != claimed.begin() + claims;
    }
    void unclaim(std::size_t off) noexcept {
      for (std::uint32_t k = 0; k < claims; ++k) {
        if (claimed[k] != off) continue;
        claimed[k] = claimed[--claims];
        return;
      }
    }
  };

  // Per rank: a commit in parts in progress (worker_params.commit_part_bytes).
  struct commit_parts_in {
    bool active = false;        // part 0 passed; head is its header
    wire::header head{};
    std::uint32_t next = 0;     // the part due
    std::uint64_t bytes = 0;    // wire bytes of the parts that passed
    bool finite = true;         // every part's values were found finite in its CRC pass
    bool dropping = false;      // the rest of commit dropped_sequence is dropped (a part of it was refused)
    std::uint64_t dropped_sequence = 0;
    // What a part must say to be placed in staging while a commit is in
    // progress or parts are being received (peeked, then part 0's).
    std::uint64_t key_sequence = 0;
    std::uint32_t key_parts = 0;
    dtype key_type = dtype::f32;
    staging_area live;  // where this rank's parts land
    // Staging areas a rejoin took out of use while receives from the old
    // connection were still writing into them: each stays until its last
    // receive ends (delivered or abandoned), so a late write never reaches
    // the parts of the commit sent again; then one is kept as the next
    // rejoin's spare, so a repeated race allocates nothing more.
    std::vector<staging_area> retired;
  };

  // One message in flight: its header (and a small control body), the
  // version of the parameters it reads (pull replies).
  struct send_slot {
    std::array<std::byte, wire::header_bytes> head{};
    std::vector<std::byte> body;  // control body (plan, error); capacity kept
    bool pinned = false;
    std::uint64_t version = 0;
  };

  struct handler {
    server* s;
    std::span<std::byte> receive_buffer(transport::peer_id p, std::span<const std::byte> head, std::size_t n) {
      return s->on_receive_buffer(p, head, n);
    }
    void on_message(transport::peer_id p, std::span<const std::byte> head, std::span<const std::byte> data) {
      s->on_message(p, head, data);
    }
    void on_sent(transport::peer_id p, std::uint64_t cookie, const status& st) { s->on_sent(p, cookie, st); }
    void on_peer(transport::peer_id p, transport::peer_event e, const status& why) { s->on_peer(p, e, why); }
    // A receive that will not be delivered (its peer was evicted or failed
    // mid-transfer): the buffer is the pool's again once the transport let go.
    void on_receive_abandoned(transport::peer_id p, std::span<std::byte> buffer) {
      if (s->release_aside(buffer)) return;  // reclaimed before: its memory is free now
      if (!s->unclaim_part(buffer, p < s->peers_.size() ? s->peers_[p].rank : no_rank)) s->release_rx(buffer);
    }
    // A receive from a sender that is gone, that the engine holds on to
    // (ucx_params::receive_reclaim_timeout): its budget comes back.
    void on_receive_reclaimed(transport::peer_id, std::span<std::byte> buffer) { s->reclaim_rx(buffer); }
  };
  static_assert(transport::handler<handler>);

  server(server_params p, core_type core, Transport t)
      : p_(std::move(p)), core_(std::move(core)), out_(p_.core.max_workers), t_(std::move(t)) {
    // Per rank, for every rank the job may have (max_workers, resolved by
    // create): a join past the initial workers allocates nothing here. A
    // rank's entry is small until it commits in parts (its staging).
    const std::size_t ranks = p_.core.max_workers;
    rank_peer_.assign(ranks, transport::no_peer);
    cparts_.resize(ranks);
    last_heard_.assign(ranks, 0.0);
    joined_once_.assign(ranks, 0);
    left_.assign(ranks, 0);
    ack_only_.assign(ranks, 0);
    slots_.reserve(4 * ranks + 8);
    free_slots_.reserve(4 * ranks + 8);
    rx_.reserve(2 * ranks + 2);
    batch_workers_.reserve(p_.apply_batch);
    batch_rx_.reserve(p_.apply_batch);
    next_progress_ = p_.progress_seconds;
  }

  // ------------------------------ receiving (ps/server_receive.hpp)

  std::span<std::byte> on_receive_buffer(transport::peer_id p, std::span<const std::byte> head, std::size_t n);

  // --------------------------------------------------- commits in parts

  // Where part pp of a commit may land: its slice of the rank's staging
  // buffer (the shard's dense size, allocated at the rank's first commit in
  // parts), if it is a part of the commit in progress (or of the one being
  // placed), not checked yet, not being received already, within the
  // window. A header that lies about its index or commit lands its bytes in
  // a slice no checked part occupies: its CRC fails, the commit is
  // discarded, and nothing staged reaches the parameters.
  struct part_place {
    std::span<std::byte> region;
    bool past_window = false;
    bool drop = false;
    bool over_budget = false;  // the rank has no staging yet and one would pass max_receive_bytes
  };
  part_place place_part(commit_parts_in& cs, const wire::peeked_part& pp, std::size_t n);
  bool stage(staging_area& st);
  void refuse_staging(transport::peer_id p, std::uint32_t w, std::uint64_t sequence, std::string_view what);
  bool unclaim_part(std::span<const std::byte> data, std::uint32_t rank);
  bool unclaim_part_of(commit_parts_in& cs, std::span<const std::byte> data);
  void retire_staging(std::uint32_t w);
  void drop_commit(commit_parts_in& cs, std::uint64_t sequence);
  void on_commit_part(transport::peer_id p, worker_id w, const wire::header& h, std::span<const std::byte> payload,
                      bool finite, double now);
  void to_core(worker_id w, const wire::header& h, std::span<const std::byte> payload, std::uint64_t bytes,
               bool values_checked, double now, bool kept);
  commit_in commit_of(worker_id w, const wire::header& h, std::span<const std::byte> payload, std::uint64_t bytes,
                      bool values_checked, bool kept) const;
  std::span<std::byte> take_rx(transport::peer_id p, std::size_t n);

  // What pooled receive buffers hold: lent (to receives in flight, or
  // kept by the batch), and in all.
  [[nodiscard]] std::uint64_t rx_lent() const noexcept {
    std::uint64_t lent = 0;
    for (const detail::pooled_buffer& b : rx_) lent += b.busy ? b.bytes.size() : 0;
    return lent;
  }
  [[nodiscard]] std::uint64_t rx_capacity() const noexcept {
    std::uint64_t total = 0;
    for (const detail::pooled_buffer& b : rx_) total += b.bytes.size();
    return total;
  }

  void give_up_idle_rx(std::uint64_t extra, std::uint64_t limit, std::uint32_t keep = no_rx);

  // The pooled receive buffer that `data` lies in, or no_rx.
  static constexpr std::uint32_t no_rx = ~std::uint32_t{0};
  std::uint32_t rx_of(std::span<const std::byte> data) const noexcept {
    if (data.empty()) return no_rx;
    for (std::uint32_t i = 0; i < rx_.size(); ++i)
      if (rx_[i].busy && rx_[i].bytes.data() == data.data()) return i;
    return no_rx;
  }

  // ------------------------------------------------------ batched applies

  [[nodiscard]] bool in_batch(std::uint32_t w) const noexcept {
    return std::find(batch_workers_.begin(), batch_workers_.end(), w) != batch_workers_.end();
  }

  void apply_held();
  void end_batch(double now);
  void reclaim_rx(std::span<const std::byte> data);
  bool release_aside(std::span<const std::byte> data);

  void release_rx(std::span<const std::byte> data) { release_rx(rx_of(data)); }
  void release_rx(std::uint32_t i) {
    if (i == no_rx) return;
    rx_[i].busy = false;
    free_rx_.give(i);
  }

  // Each message and peer event (ps/server_messages.hpp).
  void on_message(transport::peer_id p, std::span<const std::byte> head, std::span<const std::byte> data);
  void handle(transport::peer_id p, std::span<const std::byte> head, std::span<const std::byte> data, double now,
              bool kept = false);
  void on_join(transport::peer_id p, peer_state& ps, const wire::header& h, const wire::join_body& b, double now);
  void on_sent(transport::peer_id, std::uint64_t cookie, const status&);
  void on_peer(transport::peer_id p, transport::peer_event e, const status&);
  void evict_silent(double now);
  void tick_ledger(double now);

  // The transport heard the worker's connection within `limit` seconds (a
  // keepalive from its progress loop, or a large message on its way): it is
  // alive, however long its cycle or upload takes (transport/ucx.hpp,
  // keepalive_interval). Transports without last_heard(): messages only.
  [[nodiscard]] bool heard_lately(transport::peer_id p, double limit) const {
    if constexpr (requires(const Transport& t) {
                    { t.last_heard(p) } -> std::convertible_to<std::chrono::steady_clock::time_point>;
                  }) {
      if (p == transport::no_peer) return false;
      const std::chrono::steady_clock::time_point at = t_.last_heard(p);
      if (at == std::chrono::steady_clock::time_point{}) return false;
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - at).count() <= limit;
    } else {
      (void)p;
      (void)limit;
      return false;
    }
  }

  // Checkpoints (ps/server_checkpoint.hpp).
  [[nodiscard]] bool checkpoint_due(double now) const noexcept;
  checkpoint_meta serialise_checkpoint();
  void start_checkpoint();

  void unbind(transport::peer_id p, peer_state& ps) {
    if (ps.rank == no_rank) return;
    // A commit in parts in progress goes with the connection (the worker
    // sends it again, whole or in parts, after it rejoined).
    commit_parts_in& cs = cparts_[ps.rank];
    if (cs.active) drop_commit(cs, cs.head.sequence);
    if (rank_peer_[ps.rank] == p) rank_peer_[ps.rank] = transport::no_peer;
    ps.rank = no_rank;
    if (--bound_ == 0) no_worker_since_ = clock_.now();  // no_worker_grace runs from here
  }

  peer_state& peer(transport::peer_id p) {
    if (p >= peers_.size()) peers_.resize(std::size_t{p} + 1);
    return peers_[p];
  }

  void refuse_wire(wire_refusal r) { ++tel_.wire_refused[static_cast<std::size_t>(r)]; }

  // ------------------------------------ sending (ps/server_send.hpp)

  void flush(double now);
  std::uint32_t take_slot();
  void send_parameters(worker_id w);
  void send_parameters_in_parts(transport::peer_id p, worker_id w, const typename core_type::pinned_parameters& pv,
                                std::uint32_t parts, std::uint32_t extra_flags);
  void send_ack(transport::peer_id p, worker_id w);
  // Messages to and from peer p go without their CRC (server_params::trust_local_lanes).
  [[nodiscard]] bool unchecked_lane(transport::peer_id p) const noexcept {
    return p_.trust_local_lanes && p != transport::no_peer && transport::peer_on_this_host(t_, p);
  }
  void send_plan(worker_id w, const worker_plan& policy_plan);
  void send_lease(const ledger_lease& l);
  void send_error(transport::peer_id p, errc code, std::uint64_t in_reply_to, std::string_view text);

  template <class Body>
  bool send_control(transport::peer_id p, wire::header h, const Body& body) {
    const std::uint32_t i = take_slot();
    send_slot& s = slots_[i];
    const std::size_t n = wire::encoded_size(body);
    if (s.body.size() < n) s.body.resize(n);
    auto used = wire::encode(h, body, std::span<std::byte>(s.body.data(), n), p_.core.limits);
    if (!used) {  // a body the wire refuses: a defect of the policy or server, not the peer's
      free_slots_.give(i);
      ++tel_.unsendable;
      if (tel_.unsendable == 1)
        std::fprintf(stderr, "ashl server %u: a %s could not be encoded: %s\n", p_.core.shard,
                     std::string(wire::to_string(h.kind)).c_str(), used.error().message().c_str());
      return false;
    }
    std::memcpy(s.head.data(), s.body.data(), wire::header_bytes);
    send(p, i, s.head, std::span<const std::byte>(s.body.data() + wire::header_bytes, n - wire::header_bytes));
    return true;
  }

  void send(transport::peer_id p, std::uint32_t slot, std::span<const std::byte> head, std::span<const std::byte> data);

  [[nodiscard]] std::uint32_t held_now() const noexcept {
    std::uint32_t k = 0;
    for (std::uint32_t w = 0; w < core_.known_workers(); ++w) k += core_.is_held(w) ? 1u : 0u;
    return k;
  }

  void maybe_print_progress() {
    if (p_.progress_seconds <= 0.0) return;
    const double now = clock_.now();
    if (now < next_progress_) return;
    next_progress_ = now + p_.progress_seconds;
    std::fprintf(stderr, "%s\n", progress_line().c_str());
  }

  // The one way the driver's state-changing calls reach core_ (§4.1's
  // table): made per call, so a moved server records for its own core.
  struct core_recorder {
    server* s;
    void operator()(const core_event& e) const {
      if (s->replica_) s->replica_record(e);
      if (s->record_sink_) s->record_sink_(e);
    }
  };
  recorded_core<core_type, core_recorder> calls() noexcept { return {core_, core_recorder{this}}; }

  // Replication (ps/server_replica.hpp; docs/elastic.md §4.2-4.4).
  static status check_replication(const server_params& p);
  void start_replication();
  void replica_record(const core_event& e);
  void replica_finalize(double now);
  void flush_replicated();
  void on_replica(transport::peer_id p, const wire::message_view& m, double now);
  void replica_dropped(const status& why);
  void replica_poll(double now);
  void replica_lost(transport::peer_id p, const status& why);
  void send_shard_state();
  void send_shard_state(transport::peer_id p, std::uint32_t w);
  void set_term(std::uint32_t term) noexcept;
  void send_replicate(wire::replica_event ev, std::uint32_t rank, std::uint64_t index, std::uint32_t flags,
                      std::uint64_t version_after, std::uint32_t crc_after, std::span<const std::byte> record);
  void replica_telemetry(server_telemetry& s) const;
  void refuse_stopped(transport::peer_id p);
  void send_actions(const server_actions& a);

  server_params p_;
  core_type core_;
  std::function<void(const core_event&)> record_sink_;
  std::unique_ptr<detail::replica_link> replica_;  // server_params.take_backup
  server_actions out_;
  steady_clock clock_;
  server_telemetry tel_{};
  std::vector<peer_state> peers_;
  std::vector<transport::peer_id> rank_peer_;
  std::vector<commit_parts_in> cparts_;
  std::vector<send_slot> slots_;
  detail::free_list free_slots_;
  std::vector<detail::pooled_buffer> rx_;
  // Batched applies: the workers whose commit (or its reply) waits in the
  // batch, and the receive buffers the waiting commits are read from.
  std::vector<std::uint32_t> batch_workers_;
  std::vector<std::uint32_t> batch_rx_;
  detail::free_list free_rx_;
  std::uint64_t staging_bytes_ = 0;  // the stagings of commits in parts (live and retired), within max_receive_bytes
  std::uint64_t rx_largest_ = 0;          // the largest message a receive buffer was taken for
  std::uint32_t bound_ = 0;
  std::vector<std::uint8_t> joined_once_;
  std::vector<double> last_heard_;        // per rank: its last message (server_params.worker_timeout)
  std::unique_ptr<checkpoint_writer> writer_;  // with checkpoint_dir: the shard's lock and writer thread
  std::unique_ptr<apply_pool> apply_pool_;     // apply_threads > 1: the threads core_ applies with
  bool checkpoint_waiting_ = false;       // a due checkpoint waits for the previous write (counted once)
  status final_checkpoint_;               // run()'s last checkpoint
  double last_checkpoint_ = 0.0, next_housekeeping_ = 0.0;
  std::uint64_t applied_at_checkpoint_ = 0;
  std::uint32_t joined_count_ = 0;        // ranks that ever joined this process (joined_once_)
  std::uint32_t initial_joined_ = 0;      // of them, ranks below p_.core.workers (all_left)
  std::vector<std::uint8_t> left_;        // per rank: its current process sent leave (all_left)
  std::vector<std::uint8_t> ack_only_;    // per rank: its pending pull is a push's: answer header-only
  std::uint32_t left_count_ = 0;
  double no_worker_since_ = 0.0;          // when bound_ last fell to 0 (creation: 0)
  server_end end_ = server_end::running;
  std::uint64_t plan_sequence_ = 0;
  double next_progress_ = 0.0;
  // Receive buffers reclaimed from senders that are gone (reclaim_rx):
  // declared before t_, so they outlive the engine that may still hold them.
  std::vector<std::vector<std::byte>> aside_;
  std::uint64_t aside_bytes_ = 0;
  // Last: destroyed first, so the sends and receives its close still
  // progresses never touch pinned parameter versions (in core_), bodies or receive buffers gone before it.
  Transport t_;
};

}  // namespace ps
ASHL_NAMESPACE_END

// The members' bodies by concern: each header includes this one first, so
// any of them alone gives the whole server.
#include <ashl/ps/server_checkpoint.hpp>
#include <ashl/ps/server_messages.hpp>
#include <ashl/ps/server_receive.hpp>
#include <ashl/ps/server_send.hpp>
#include <ashl/ps/server_replica.hpp>
