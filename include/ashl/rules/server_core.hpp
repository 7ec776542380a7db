// ashl/rules/server_core.hpp — the rules of one parameter server, pure: decoded
// messages and the driver's time in, what the driver must send out into a
// caller-owned server_actions. No clock, no I/O, no threads of its own (a
// driver may lend it an apply_pool: the same passes, split over threads,
// bit-identical; and a split of the parameters into ranges whose CRCs its
// passes compute too: checksum_in_parts); the simulator and the real server
// drive the same object.
//
//   auto layout = ashl::ps::shard_layout::even(n, 1);
//   auto core = ashl::ps::server_core<ashl::sync::ssp>::create(
//       {.layout = *layout, .workers = 4, .optimizer = {.mode = ashl::ps::optimizer_params::kind::sgd, .lr = 0.1}},
//       ashl::sync::ssp{{.workers = 4, .staleness = 3}}, initial);        // result<server_core<ssp>>
//   ashl::ps::server_actions out(4);                                      // reused across events
//   core->commit({.worker = 2, .incarnation = 0, .sequence = 7, .codec = ashl::codec_id::topk,
//                 .element_count = n, .payload = bytes, .pull = true}, now, out);
//   for (auto w : out.pull_replies()) send_parameters(w, core->parameters());
//   for (const auto& p : out.plans()) send_plan(p.worker, p.plan);
//   for (const auto& e : out.errors()) send_error(e.worker, e.code, e.in_reply_to, e.text);
//   out.clear();
//
// One event, one order (docs/design.md "Data flow of one commit"): validate (a
// refused message changes nothing but the refusal counters) → the policy's
// decision → apply the commit → apply the round the policy named (one
// optimizer step each) → the pulls it released → the pull riding with the
// commit → the plans that changed. Exactly once per (worker, incarnation,
// sequence): a sequence at or below the last accepted one of the worker's
// current incarnation is a duplicate, counted and dropped before the policy
// sees it; a commit of another incarnation is refused. Buffered commits
// live in a commit_store under params.store_bytes (0: automatic_store_bytes,
// workers x the largest commit of the shard); a commit the store could not
// take is refused before the policy is asked. So is a commit with a NaN or
// infinite value (unless params.allow_non_finite; the parameters and every
// later checkpoint stay finite) and one saying it covers more samples than
// params.max_commit_samples (the samples come from the worker's
// worker_cycle, in the commit). Every payload is decoded
// by its own codec id (compress/registry.hpp) into the one dense buffer of
// the shard (sgd) or straight into the parameters (model deltas). A layout
// of 0 elements is timing only: no payload is read, policy decisions only.
// After warm-up (every worker joined once, the store's arena and index at
// their working size) no valid event allocates; the per-rank vectors are
// reserved for max_workers, so a join of a later rank does not either
// (the policy's own tables aside). docs/algorithms.md §1–§2;
// docs/design.md "Server core"; docs/ps.md.
//
// Deviations from the first sketch of the server core (docs/ps.md):
// - server_core_params.workers: ids 0..workers-1 are live from creation
//   (incarnation 0), as the policy was constructed; others join(), up to
//   server_core_params.max_workers (the job's maximum, 0 = workers; a
//   larger rank is refused, refusal::max_workers: docs/elastic.md §2).
// - The policy sees a sequence the core assigns (1, 2, ... per worker id,
//   never reset, so a rejoin with a new incarnation cannot collide with its
//   old incarnation's commits still buffered); errors and the exactly-once
//   table use the worker's own sequence.
// - leave() tells the policy on_evict (the concept has no leave event); it
//   differs from evict() in its counter and in refusing a worker not live.
// - drain() added (the policy's drain: shutdown, tests).
// - error_out carries the message text and a `refusal` reason.
// - Model deltas decode straight into the parameters, commit after commit
//   in the policy's order (no accumulator pass; sgd uses the accumulator).
// - worker_cycle: built with its worker id; compressed(now, payload_bytes);
//   reply_started, pull_sent, restart, abandon, samples, state added.
// - The data ledger (server_core_params::ledger, rules/data_ledger.hpp;
//   shard 0 only): fed by the events the core accepts, after the policy
//   (joins, accepted commits' samples, leaves, evictions, and tick(now) for
//   its give_back_after); its leases go out in server_actions::leases();
//   saved as section LDGR (PSCR version 4, written only with a ledger).
//   join() takes the join body's batch for its lease size.
//   docs/elastic.md §3.3.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/registry.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/enum_table.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/rules/job_limits.hpp>
#include <ashl/rules/apply_pool.hpp>
#include <ashl/rules/commit_store.hpp>
#include <ashl/rules/finite.hpp>
#include <ashl/rules/optimizer.hpp>
#include <ashl/rules/server_core_vocabulary.hpp>
#include <ashl/rules/shards.hpp>
#include <ashl/sync/any_policy.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/events.hpp>
#include <ashl/wire/crc32c.hpp>
#include <ashl/wire/ids.hpp>
#include <ashl/wire/message.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

template <sync::consistency_policy Policy = sync::any_policy>
class server_core {
 public:
  static result<server_core> create(server_core_params p, Policy policy, std::span<const float> initial = {}) {
    if (p.workers > ps::max_workers)  // per-worker tables are sized below (rules/job_limits.hpp)
      return out_of_range("server_core.workers", p.workers,
                          "must be at most " + std::to_string(ps::max_workers) + " (ps::max_workers)");
    if (p.max_workers > ps::max_workers)
      return out_of_range("server_core.max_workers", p.max_workers,
                          "must be at most " + std::to_string(ps::max_workers) + " (ps::max_workers)");
    if (p.max_workers != 0 && p.max_workers < p.workers)
      return invalid_argument("server_core.max_workers", p.max_workers,
                              "must be 0 (the same as workers) or at least server_core.workers = " +
                                  std::to_string(p.workers));
    if (p.max_workers == 0) p.max_workers = p.workers;
    if (p.shard >= p.layout.servers())
      return invalid_argument("server_core.shard", p.shard,
                              "must be < layout.servers() = " + std::to_string(p.layout.servers()));
    const std::uint64_t n = p.layout.range(p.shard).size();
    if (!initial.empty() && initial.size() != n)
      return invalid_argument("server_core.initial.size", initial.size(),
                              "must be 0 or the shard's " + std::to_string(n) + " elements");
    // The store must take a commit before the policy is asked (a decision
    // cannot be undone), so it holds at least one dense f32 commit: a policy
    // that never buffers then never sees a valid dense commit refused.
    if (p.store_bytes == 0) p.store_bytes = automatic_store_bytes(n, p.max_workers);
    if (p.store_bytes < 4 * n)
      return invalid_argument("server_core.store_bytes", p.store_bytes,
                              "holds less than one dense f32 commit of the shard (4 x " + std::to_string(n) +
                                  " = " + std::to_string(4 * n) + " bytes; 0 = automatic, " +
                                  std::to_string(automatic_store_bytes(n, p.max_workers)) + " here)");
    for (worker_id w = 0; w < p.workers; ++w)
      if (!policy.is_live(w))
        return invalid_argument("server_core.workers", p.workers,
                                "the policy does not hold worker " + std::to_string(w) + " live");
    ASHL_TRY(check_ledger_params(p.ledger, "server_core.ledger."));
    auto ledger = data_ledger::create(p.ledger);
    if (!ledger) return ledger.error();
    if (ledger->enabled() && p.shard != 0)
      return invalid_argument("server_core.ledger.samples", p.ledger.samples,
                              "the data ledger runs on shard 0 only (the plan authority, docs/elastic.md §3.3); "
                              "this core is shard " + std::to_string(p.shard));
    auto opt = optimizer::create(p.optimizer, static_cast<std::size_t>(n));
    if (!opt) return opt.error();
    reply_encoder replies;
    ASHL_TRY(replies.configure(p.replies, static_cast<std::size_t>(n), p.max_workers, p.seed, p.shard));
    server_core c(std::move(p), std::move(policy), std::move(*opt));
    c.replies_ = std::move(replies);
    c.ledger_ = std::move(*ledger);
    if (initial.empty()) c.w_.assign(static_cast<std::size_t>(n), 0.0f);
    else c.w_.assign(initial.begin(), initial.end());
    c.acc_.assign(static_cast<std::size_t>(n), 0.0f);
    c.range_crc_.assign(1, 0u);
    c.table_.resize(c.p_.workers);
    c.served_at_.assign(c.p_.workers, no_version);
    for (auto& e : c.table_) e.known = e.live = true;
    c.live_n_ = c.p_.workers;
    c.reserve_ranks();
    return c;
  }

  // ---------------------------------------------------------------- events

  // w (re)joins as `incarnation`: the plan is sent. A larger incarnation
  // than the one held starts a fresh sequence (a restart; a live older
  // incarnation is evicted first); the same one is a duplicate join when w is
  // live (the plan is sent again) or a rejoin keeping its sequence when not;
  // a smaller one is refused.
  //
  // A rank at or past params().max_workers is refused (refusal::max_workers)
  // before anything else: nothing but that refusal counter changes (the
  // table does not grow, the policy is not told, no view is forgotten).
  // Below it, a rank the table does not cover yet (a joiner beyond the
  // initial workers: docs/elastic.md §2.3) extends it within the capacity
  // reserved for max_workers at creation: no allocation of the core's own.
  //
  // With a data ledger (params().ledger), every join the core accepts is the
  // ledger's join too, after the policy's: the worker's leases (resent
  // when it rejoins as the same incarnation) go to out.leases(). `batch` is
  // the join's (its wire body's): with ledger.lease_samples = 0 a lease is 4
  // cycles of the worker's plan batch x H, this batch where the plan names
  // none (0: a cycle of 1 sample until its first commit says more).
  void join(worker_id w, std::uint64_t incarnation, double now, server_actions& out, std::uint32_t batch = 0) {
    if (w >= p_.max_workers) {
      refuse(out, w, 0, refusal::max_workers,
             make_error(errc::out_of_range, "join.rank", w,
                        "this job admits at most " + std::to_string(p_.max_workers) + " workers" +
                            (p_.max_workers == 0 ? std::string{}
                                                 : " (ranks 0.." + std::to_string(p_.max_workers - 1) + ")")));
      return;
    }
    if (w >= table_.size()) table_.resize(std::size_t{w} + 1);
    worker_entry& e = table_[w];
    // Any join (a reconnect too): the worker holds no view of the
    // parameters (rules/reply_encoder.hpp); its next reply is dense.
    replies_.forget(w);
    if (e.known && incarnation < e.incarnation) {
      refuse(out, w, 0, refusal::incarnation,
             make_error(errc::invalid_argument, "join.incarnation", incarnation,
                        "stale: worker " + std::to_string(w) + " is at incarnation " + std::to_string(e.incarnation) +
                            " (a later process of this rank joined; this one must not commit)"));
      return;
    }
    if (e.known && e.live && incarnation == e.incarnation) {
      send_plan(w, out);
      ledger_join(w, incarnation, batch, now, out);
      return;
    }
    if (e.known && e.live && untouched_since_creation(e)) {
      // The first join of a worker the policy holds live from creation
      // (incarnation 0, nothing committed or held): it takes the worker's
      // incarnation. Not a restart: the policy is not told an eviction (a
      // barrier would close without it) nor a join (it counts w already).
      e.incarnation = incarnation;
      ++stats_.joins;
      send_plan(w, out);
      ledger_join(w, incarnation, batch, now, out);
      return;
    }
    if (e.known && e.live) {  // a restart the server had not noticed
      policy_.on_evict({w, now}, sink_);
      drop_pull(w);
      e.live = false;
      --live_n_;
      ++stats_.evictions;
    }
    if (!e.known || incarnation > e.incarnation) e.last_sequence = 0;
    e.known = e.live = true;
    ++live_n_;
    e.incarnation = incarnation;
    ++stats_.joins;
    policy_.on_join({w, now}, sink_);
    finish(out, {}, w);
    ledger_join(w, incarnation, batch, now, out);
  }

  // w says it leaves: its held pull is dropped; the policy evicts it. The
  // ledger's unused positions of w go back at once (and to whoever is short).
  void leave(worker_id w, double now, server_actions& out) {
    if (!check_live(w, 0, "leave.worker", out)) return;
    ++stats_.leaves;
    remove(w, now, out);
    if (ledger_.enabled()) (void)ledger_.leave(w, now, lease_sink(out));  // live in the ledger unless it never joined
  }

  // The driver decided w is gone (timeout, failure): held pulls of w are
  // dropped, the policy recomputes its bounds (releasing others' pulls);
  // w's buffered commits stay and apply as the policy says. A worker not
  // live is ignored. The ledger suspends w's leases: they go back
  // ledger.give_back_after seconds later (tick) unless w rejoins as the same
  // incarnation.
  void evict(worker_id w, double now, server_actions& out) {
    if (w >= table_.size() || !table_[w].live) return;
    ++stats_.evictions;
    remove(w, now, out);
    if (ledger_.enabled()) ledger_.evict(w, now, lease_sink(out));
  }

  // The driver's time between events, for the data ledger alone: leases of
  // workers evicted ledger.give_back_after ago go back (and out as leases to
  // the workers short of them). Every other event checks that time too.
  // Nothing else of the core depends on time passing; without a ledger this
  // changes nothing.
  void tick(double now, server_actions& out) {
    if (ledger_.enabled()) ledger_.tick(now, lease_sink(out));
  }

  void commit(const commit_in& c, double now, server_actions& out) {
    const worker_id w = c.worker;
    // Its speculation (speculate) ends with it, whatever commit() decides.
    const bool speculated = claim_speculation(c);
    // So does the apply check_message computed in its check pass.
    const bool fused = claim_fused(c);
    if (!check_live(w, c.sequence, "commit.worker", out)) return;
    worker_entry& e = table_[w];
    if (c.incarnation != e.incarnation) {
      refuse(out, w, c.sequence, refusal::incarnation,
             make_error(errc::invalid_argument, "commit.incarnation", c.incarnation,
                        "worker " + std::to_string(w) + " joined as incarnation " + std::to_string(e.incarnation)));
      return;
    }
    if (c.sequence == 0) {
      refuse(out, w, 0, refusal::sequence, invalid_argument("commit.sequence", 0, "sequences start at 1"));
      return;
    }
    if (c.sequence <= e.last_sequence) {
      ++stats_.duplicates;
      if (c.pull) pull(w, now, out);
      return;
    }
    if (c.samples > p_.max_commit_samples) {
      refuse(out, w, c.sequence, refusal::samples,
             make_error(errc::out_of_range, "commit.samples", c.samples,
                        "worker " + std::to_string(w) + " says its commit covers more samples than max_commit_samples = " +
                            std::to_string(p_.max_commit_samples)));
      return;
    }
    const bool math = !timing_only();
    in_acc_ = false;
    if (math && !validate(c, out)) return;

    e.last_sequence = c.sequence;
    const std::uint64_t seq = ++e.policy_sequence;
    ++stats_.commits;
    stats_.bytes_in += c.bytes;
    const sync::commit_decision d = policy_.on_commit({w, seq, c.clock, now, c.bytes, c.samples}, sink_);
    e.applied_at_once = d.action == sync::commit_action::apply;
    bool pending = false;  // buffered and not yet stored
    bool fused_taken = false;
    switch (d.action) {
      case sync::commit_action::apply:
        ASHL_ASSERT(std::isfinite(d.weight), "server_core: the policy gave a non-finite weight");
        if (math) {
          if (opt_.adds_deltas()) {
            if (compress::dense_payload_bytes(c.codec, {w_.size(), c.type}) != 0) {
              // One pass: the add, beside a pinned version when replies
              // read it, and the new version's CRC when a pull rides along;
              // or, with the payload kept, later in one pass with the other
              // commits waiting (apply_pending()).
              if (fused && take_fused(d.weight)) {
                fused_taken = true;
              } else if (!(speculated && take_speculation(d.weight)) &&
                         (!c.payload_kept || !defer_dense(c, d.weight))) {
                apply_dense(c, d.weight, wants_reply_crc(c));
              }
              table_[w].last_weight = static_cast<float>(d.weight);
            } else {
              make_writable();
              decode_or_die(c.codec, c.type, c.step, c.tensor, c.payload, w_, d.weight);
            }
          } else if (in_acc_) {
            make_writable();
            step_parts(static_cast<float>(d.weight), wants_reply_crc(c));  // acc_ holds the commit at scale 1
          } else {
            // 0 + w·v in the accumulator, then a step at scale 1: the same
            // bits as decoding at scale 1 and stepping at w.
            decode_or_die(c.codec, c.type, c.step, c.tensor, c.payload, acc_, d.weight);
            make_writable();
            step_parts(1.0f, wants_reply_crc(c));
          }
        }
        ++stats_.commits_applied;
        take_step(out);
        break;
      case sync::commit_action::buffer:
        if (in_acc_) clear_acc();
        pending = true;
        break;
      case sync::commit_action::drop:
        if (in_acc_) clear_acc();
        ++stats_.commits_dropped;
        break;
    }
    if (fused && !fused_taken) ++fused_wasted_;  // checked and valid, but not applied as computed
    current_ = pending ? &c : nullptr;
    current_sequence_ = seq;
    // Accepted (whatever the policy decided, a drop too: docs/elastic.md
    // §3.2): its samples are used positions of w's leases.
    if (ledger_.enabled()) ledger_commit(w, c.samples, now, out);
    finish(out, {}, no_worker, c.pull ? w : no_worker, now);
    if (current_ != nullptr) {  // still buffered: keep it (room was checked before the policy saw it)
      if (math) {
        const status s = store_.put(w, seq, {c.codec, c.type, c.element_count, c.step, c.tensor}, c.payload);
        ASHL_ASSERT(s.ok(), "server_core: store refused a commit it had room for");
        (void)s;
      }
      ++stats_.commits_buffered;
      current_ = nullptr;
    }
  }

  void pull(worker_id w, double now, server_actions& out) {
    if (!check_live(w, 0, "pull.worker", out)) return;
    finish(out, {}, no_worker, w, now);
  }

  void metric(metric_id m, double value, double now, server_actions& out) {
    policy_.on_metric({m, value, now}, sink_);
    finish(out);
  }

  void measurement(const ashl::measurement& m, server_actions& out) {
    if (!check_known(m.worker, out)) return;
    if (static_cast<std::uint8_t>(m.kind) >= measurement_kind_count) {
      refuse(out, m.worker, 0, refusal::measurement,
             invalid_argument("measurement.kind", static_cast<unsigned>(m.kind), "unknown measurement kind"));
      return;
    }
    if (!(std::isfinite(m.seconds) && m.seconds > 0.0)) {
      refuse(out, m.worker, 0, refusal::measurement,
             invalid_argument("measurement.seconds", m.seconds, "must be finite and > 0"));
      return;
    }
    if (!(std::isfinite(m.amount) && m.amount >= 0.0) || !std::isfinite(m.time)) {
      refuse(out, m.worker, 0, refusal::measurement,
             invalid_argument(std::isfinite(m.time) ? "measurement.amount" : "measurement.time",
                              std::isfinite(m.time) ? m.amount : m.time, "must be finite (amount >= 0)"));
      return;
    }
    policy_.on_measurement(m, sink_);
    finish(out);
  }

  // Everything buffered is applied (one round) and every held pull released:
  // at shutdown, or before a checkpoint that must hold no buffered commit.
  void drain(server_actions& out) {
    policy_.drain(sink_);
    finish(out);
  }

  // ------------------------------------------------------------ apply threads
  //
  // The driver's threads (rules/apply_pool.hpp; server_params.apply_threads):
  // with a pool of N, every pass over the shard that is element-wise runs as
  // N parts, part p on elements [p·B, (p+1)·B) with B a whole number of
  // 64-byte lines: the dense add (with its copy beside a pinned version and
  // the new version's CRC, the parts' CRCs combined in order), a sparse-pair
  // payload's add (each part finds its pairs by binary search over the
  // sorted indices), the optimizer's step, the copy of a pinned version,
  // the CRC of a pin, and the finite check of a payload's values. Each
  // element sees the same operations in the same order, so the parameters,
  // CRCs and refusals are bit-identical to no pool (test/ps/apply_threads.cpp);
  // no rule changes, only how fast a pass runs. Other codecs' decodes run on
  // the calling thread. A shard below 2 × min_part_elements runs on the
  // calling thread (a run's wake-up would cost more than it saves). The pool
  // is not owned (the driver keeps it alive while the core uses it) and is
  // not part of save(); nullptr: no pool.
  static constexpr std::size_t min_part_elements = std::size_t{1} << 14;
  void use_apply_pool(apply_pool* pool) noexcept { pool_ = pool; }

  // ------------------------------------------------------ batched applies
  //
  // Fan-in: commits that arrive together are added in one
  // pass over the parameters instead of one pass each. With k >= 2, an
  // applied dense model-delta commit whose payload the driver keeps
  // (commit_in.payload_kept) waits, up to k of them; apply_pending() adds
  // them, in arrival order, chunk by chunk: each cache-sized chunk of the
  // parameters gets every waiting commit's add before the next chunk is
  // read, with the same decode_add over the same chunk bounds as one
  // apply_dense per commit, so the parameters and their CRC are
  // bit-identical to applying each as it came (test/ps/apply_batch.cpp).
  // Nothing else waits: the policy decides each commit as it comes, the
  // counters and version move then, and every use of the parameters (a
  // pin, any other change, a round, a step) applies what waits first.
  // parameters() and save() require nothing waiting: a driver calls
  // apply_pending() before it lets go of the payloads, and before anything
  // outside its progress round reads the core. Like the apply pool, the
  // driver's choice: not part of save(); the simulator sets none (it moves
  // no bytes), so no rule differs between the drivers. Allocates its k
  // slots here. k of 0 or 1: every commit is applied as it comes.
  void defer_dense_applies(std::uint32_t k) {
    ASHL_ASSERT(pending_n_ == 0, "server_core: defer_dense_applies with commits waiting");
    pending_.assign(k < 2 ? 0 : k, dense_add{});
  }
  [[nodiscard]] std::uint32_t dense_applies_deferred() const noexcept {
    return static_cast<std::uint32_t>(pending_.size());
  }
  // Commits waiting for apply_pending().
  [[nodiscard]] std::size_t pending_applies() const noexcept { return pending_n_; }
  // Adds every waiting commit in one pass (nothing when none waits).
  void apply_pending();
  // Passes of apply_pending() that added two or more commits, and the
  // commits they added (the driver's counters; not part of save()).
  [[nodiscard]] std::uint64_t batched_passes() const noexcept { return batched_passes_; }
  [[nodiscard]] std::uint64_t batched_commits() const noexcept { return batched_commits_; }
  [[nodiscard]] const apply_pool* apply_pool_in_use() const noexcept { return pool_; }

  // ------------------------------------------------ applies as parts land
  //
  // Pipelining: a commit in parts (ps::server, worker
  // commit_part_bytes) lands part by part in its rank's staging, and each
  // part is checked as it lands. speculate() adds what landed since the last
  // call *beside* the parameters, new = w + s·v into a buffer of its own,
  // while the later parts are still in flight; when the last part passed and
  // commit() applies the commit with the weight s that was guessed and the
  // parameters unchanged since the first speculated part, the commit's apply
  // is what is left of that pass (the last part's chunks) and a swap: the
  // buffer becomes the parameters (or, while replies read them, the pinned
  // version moves to a spare buffer). The parameters themselves are never
  // written before commit() says apply, so a commit whose later part is bad
  // or never comes changes nothing, the exactly-once check and the policy
  // run at the commit's end as before, and the bits (values and their CRC)
  // are those of one apply_dense of the whole payload: the same decode_add
  // over the same chunk bounds (test/rules/apply_as_landed.cpp). Anything else
  // that changes the parameters first (another commit, a deferred one, a
  // round, a load) makes the speculation stale: it stops, and commit()
  // applies as before. The weight guessed is the rank's last applied weight
  // (1 before its first); a policy that weighs this commit otherwise makes
  // commit() apply as before too, and a rank whose last commit the policy
  // did not apply when it came (a round buffered it) is not speculated. One
  // speculation at a time: a rank's first part takes the buffer when no
  // other rank's speculation is live. Like the apply pool, the driver's
  // choice (ps::server: server_params.apply_parts_as_they_land): not part
  // of save(); the simulator moves no bytes and sets none. Allocates the
  // shard-sized buffer (and its checksum ranges' CRCs) at the first
  // speculation, then reuses it.
  //
  // `c` is the commit as commit() will get it (its payload: the whole
  // staging); elements [from, to) of it landed and passed their checks (a
  // part). A part at 0 starts the commit's speculation afresh (a commit
  // sent again into the same staging may carry other bytes); any other
  // must continue where the last one ended, else the speculation stops.
  // False when nothing was added (not a dense model delta, stale, out of
  // order, another rank's speculation is live, a commit commit() refuses).
  bool speculate(const commit_in& c, std::size_t from, std::size_t to);

  // The rank's speculation ends (its commit in progress was discarded): the
  // buffer is free for another rank's next part.
  void forget_speculation(worker_id w) noexcept {
    if (spec_.worker != w) return;
    spec_.dead = true;
    spec_.worker = no_worker;
  }

  // Speculations started; those the parameters (or a weight) changed under;
  // commits whose apply they made (the driver's counters; not part of save()).
  [[nodiscard]] std::uint64_t speculations() const noexcept { return speculations_; }
  [[nodiscard]] std::uint64_t speculations_stale() const noexcept { return speculations_stale_; }
  [[nodiscard]] std::uint64_t applied_as_landed() const noexcept { return applied_as_landed_; }

  // ------------------------------------------ the check and the apply in one pass
  //
  // A driver that receives commits as wire messages (ps::server) hands
  // check_message() each message as it lies in its receive buffer,
  // unchecked: it runs wire::decode (the CRC-32C, chunk by chunk, with the
  // header's checks) and, for a dense payload, the finite check of its
  // values in the same pass (dense_value_check: `values`, which the driver
  // gives commit() as commit_in.values_checked). With params().fuse_checks
  // (fused_apply) it also computes, in that same pass, the apply of a whole
  // dense model-delta commit as commit() would make it: new = w + s·v
  // chunk by chunk into a spare version while the chunk is in cache (and
  // the new version's CRC when a checksummed reply rides with it), s the
  // rank's last applied weight, the same decode_add over the same chunk
  // bounds as apply_dense (the same bits). The parameters are not touched.
  // Then:
  //   - the message fails its CRC or any check, or a value is not finite:
  //     the spare is discarded (commit() refuses a non-finite one, naming
  //     its element, as without fusion); nothing else changed, no counter;
  //   - commit() applies this commit (the same worker, incarnation,
  //     sequence, payload bytes) at once, at the weight guessed, to the
  //     parameters the pass read: the spare is published (the pinned
  //     version keeps its storage), no further pass;
  //   - anything else (the policy buffers or drops it, weighs it otherwise,
  //     something changed the parameters first, a batch defers it): the
  //     spare is discarded and commit() applies as without fusion
  //     (fused_wasted() counts these).
  // fused_apply::beside arms it only where the apply would write beside a
  // version replies read anyway (fan-in: another worker's reply in flight):
  // there the fused pass replaces a read pass, and where the apply is in
  // place it would turn it into a beside write (docs/perf/ps-passes.md).
  // A rank whose last commit waited for a round is not fused (like
  // speculate()), nor is anything while the driver batches dense applies
  // (defer_dense_applies: the batch's pass serves them). `from`: the rank
  // the connection joined as (or anything when none: nothing is fused);
  // `reply_unchecked`: a reply riding with it goes without a CRC (the pass
  // computes none). Allocates the shard-sized spare at the first fused
  // pass, then cycles it with the version buffers.
  result<wire::message_view> check_message(std::span<const std::byte> head, std::span<const std::byte> payload,
                                           const wire::limits& lim, worker_id from, bool reply_unchecked,
                                           dense_value_check& values);
  // Commits applied from check_message's pass; passes whose commit was
  // valid but applied otherwise (the driver's counters; not part of save()).
  [[nodiscard]] std::uint64_t fused_applies() const noexcept { return fused_applies_; }
  [[nodiscard]] std::uint64_t fused_wasted() const noexcept { return fused_wasted_; }

  // ------------------------------------------------------------ inspection

  [[nodiscard]] std::span<const float> parameters() const noexcept {
    ASHL_ASSERT(pending_n_ == 0, "server_core: parameters() read with commits waiting (call apply_pending())");
    return w_;
  }

  // ------------------------------------------------- versions replies read
  //
  // A driver sends pull replies from the parameters where they lie, without
  // a copy per version: pin_parameters() pins the current version
  // and gives its bytes and their CRC-32C (computed once per version: by the
  // apply that made it when a pull rode with the commit, else at the first
  // pin, one read pass); unpin_parameters(version) when the send completed.
  // While a version is pinned nothing writes its storage: the next change
  // is made beside it (a dense model-delta commit adds into a spare buffer
  // in the same pass: new = old + s·v; any other change copies the version
  // first), and the pinned storage stays with the replies until the last is
  // unpinned. Spare buffers are pooled: after warm-up nothing allocates.
  struct pinned_parameters {
    std::span<const float> values;
    std::uint64_t version = 0;
    std::uint32_t crc = 0;  // crc32c of the values' bytes
    bool first = false;     // the first pin of this version
    // With checksum_in_parts(k), k >= 2: the CRC of each of the k ranges'
    // bytes (range j: elements [j·per, min(n, (j + 1)·per)), per = ceil(n / k)),
    // from the same pass as `crc`; empty otherwise. Valid until the next change.
    std::span<const std::uint32_t> range_crcs;
  };

  // The driver's split of the parameters into ranges it checksums on their
  // own (ps::server: the parts of a pull reply, server_params.reply_part_bytes):
  // k ranges of per = ceil(n / k) elements, the last one shorter. From then
  // on every pass that computes the version's CRC (the dense add's, the sgd
  // step's, the first pin's) computes each range's CRC in the same pass,
  // cutting its CRC (not its arithmetic) at the ranges' bounds, and the
  // version's CRC is the ranges' combined (wire::crc32c_combine): the same
  // value as before. k of 0 or 1: no ranges. A k that leaves an empty range
  // (k > n, or ceil(n / ceil(n / k)) != k) is refused naming the field.
  // Allocates its k CRCs here, not in the passes. Like the apply pool, the
  // driver's choice: not part of save(), and the simulator sets none.
  status checksum_in_parts(std::uint32_t k);
  [[nodiscard]] std::uint32_t checksum_parts() const noexcept { return checksum_parts_ < 2 ? 0 : checksum_parts_; }

  // with_crc false: a reply that goes without a CRC (wire flag
  // `unchecked`): no CRC pass here when the version has none yet (crc and
  // range_crcs are then not to be read).
  pinned_parameters pin_parameters(bool with_crc = true);
  void unpin_parameters(std::uint64_t version);

  // ------------------------------------------------- compressed replies
  //
  // With server_core_params::replies set (rules/reply_encoder.hpp), a
  // driver asks serve_reply(w, out) before it sends w the parameters: a
  // compressed reply's payload is then in `out` (at least
  // max_reply_bytes()), else the parameters go dense as pinned, marked as
  // the worker's view (wire flag `view`). Timing mode (no parameters):
  // sizes only, of timing_elements.
  [[nodiscard]] bool compresses_replies() const noexcept { return replies_.compresses(); }
  [[nodiscard]] std::size_t max_reply_bytes() const { return replies_.max_encoded_bytes(); }
  [[nodiscard]] const reply_encoder& replies() const noexcept { return replies_; }
  reply_encoder::served serve_reply(worker_id w, std::span<std::byte> out, std::size_t timing_elements = 0) {
    apply_pending();
    return replies_.serve(w, w_, version(), out, timing_elements);
  }

  // Versions pinned now (the current one included when pinned).
  [[nodiscard]] std::uint32_t pinned_versions() const noexcept {
    std::uint32_t k = w_readers_ > 0 ? 1u : 0u;
    for (const version_buffer& b : held_) k += b.readers > 0 ? 1u : 0u;
    return k;
  }
  [[nodiscard]] bool current_pinned() const noexcept { return w_readers_ > 0; }
  // Changes made beside a pinned version: by the dense apply in its pass,
  // and by a copy first (every other change).
  [[nodiscard]] std::uint64_t applied_beside() const noexcept { return applied_beside_; }
  [[nodiscard]] std::uint64_t copies_for_readers() const noexcept { return copies_for_readers_; }
  // Versions whose CRC (and checksum ranges' CRCs) took a read pass of
  // their own (the first pin; the driver's counters, not part of save()),
  // and those whose CRCs the apply computed in its pass (a dense add or an
  // sgd step with a pull riding, or a round that releases pulls).
  [[nodiscard]] std::uint64_t checksum_passes() const noexcept { return checksum_passes_; }
  [[nodiscard]] std::uint64_t checksums_in_apply() const noexcept { return checksums_in_apply_; }
  // Spare buffers held (pinned or free) besides the parameters.
  [[nodiscard]] std::size_t version_buffers() const noexcept { return held_.size(); }
  [[nodiscard]] std::uint64_t version() const noexcept { return stats_.steps; }
  [[nodiscard]] const Policy& policy() const noexcept { return policy_; }
  [[nodiscard]] const counters& stats() const noexcept { return stats_; }
  [[nodiscard]] const server_core_params& params() const noexcept { return p_; }
  [[nodiscard]] const optimizer& optimizer_state() const noexcept { return opt_; }
  [[nodiscard]] const commit_store& store() const noexcept { return store_; }
  // The data ledger (enabled() false without params().ledger.samples).
  [[nodiscard]] const data_ledger& ledger() const noexcept { return ledger_; }
  [[nodiscard]] key_range range() const noexcept { return p_.layout.range(p_.shard); }
  // No payload is read: the layout has 0 elements (the simulator's timing
  // runs), or this server's range is empty (more servers than elements).
  [[nodiscard]] bool timing_only() const noexcept { return w_.empty(); }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return w < table_.size() && table_[w].live; }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return w < table_.size() && table_[w].held; }
  // Membership (docs/elastic.md §2.2): the ranks the table covers, one past
  // the largest that was ever live (workers at creation, grown by each
  // admitted join; a rank below it may never have joined: is_known), and
  // how many are live now. A driver loops over 0..known_workers()-1, not
  // over params().workers, since ranks up to params().max_workers join.
  [[nodiscard]] std::uint32_t known_workers() const noexcept { return static_cast<std::uint32_t>(table_.size()); }
  [[nodiscard]] bool is_known(worker_id w) const noexcept { return w < table_.size() && table_[w].known; }
  [[nodiscard]] std::uint32_t live_count() const noexcept { return live_n_; }
  // The worker's incarnation and the last sequence accepted from it.
  [[nodiscard]] std::uint64_t incarnation(worker_id w) const noexcept {
    return w < table_.size() ? table_[w].incarnation : 0;
  }
  [[nodiscard]] std::uint64_t last_sequence(worker_id w) const noexcept {
    return w < table_.size() ? table_[w].last_sequence : 0;
  }

  // A driver sends w the parameters now (one call per reply; both drivers
  // call it, so both report the same τ): the staleness of what w computed
  // from its previous reply, τ = the versions applied since that reply, less
  // the one w's own commit made; 0 at w's first reply. The worker can predict
  // the parameters its next update will meet (SpecTrain: W - τ·η·v;
  // rules/compensation.hpp). Bookkeeping only: no decision depends on it, and
  // it is not part of save() (a restored server starts every τ at 0).
  std::uint64_t serve_staleness(worker_id w) {
    if (w >= served_at_.size()) served_at_.resize(std::size_t{w} + 1, no_version);
    const std::uint64_t v = stats_.steps, last = served_at_[w];
    served_at_[w] = v;
    return last == no_version || v <= last + 1 ? 0 : v - last - 1;
  }

  // ------------------------------------------------------------ save/load

  // The whole state: parameters of the core, the shard's values, optimizer
  // state, buffered commits, the exactly-once table, the policy, counters;
  // one CRC-32C over it all, so a corrupt state is refused.
  void save(state_writer& out) const;

  // Reads into fresh values and assigns only when everything was read: a
  // truncated or corrupt state is refused and leaves the core unchanged.
  status load(state_reader& in);

 private:
  static constexpr worker_id no_worker = 0xffffffffu;

  struct worker_entry {
    bool known = false;
    bool live = false;
    bool held = false;                  // a pull of it waits for a release
    std::uint64_t incarnation = 0;
    std::uint64_t last_sequence = 0;    // the worker's, in this incarnation (exactly once)
    std::uint64_t policy_sequence = 0;  // what the policy was told, never reset
    float last_weight = 1.0f;           // of its last dense apply: speculate()'s guess (not saved)
    bool applied_at_once = true;        // the policy applied its last commit when it came (not saved)
    // The saved fields, in their order (27 bytes an entry).
    static constexpr auto saved() {
      return std::tuple{field{"known", &worker_entry::known}, field{"live", &worker_entry::live},
                        field{"held", &worker_entry::held}, field{"incarnation", &worker_entry::incarnation},
                        field{"last_sequence", &worker_entry::last_sequence},
                        field{"policy_sequence", &worker_entry::policy_sequence}};
    }
  };

  // The parameters a state carries, in their order after the layout (the
  // optimizer's are its own section; allow_non_finite and
  // max_commit_samples stay the running server's).
  static constexpr auto saved_params() {
    return std::tuple{field{"shard", &server_core_params::shard}, field{"workers", &server_core_params::workers},
                      field{"max_workers", &server_core_params::max_workers},
                      field{"store_bytes", &server_core_params::store_bytes},
                      field{"limits", &server_core_params::limits}, field{"seed", &server_core_params::seed}};
  }
  // PSCR versions 1 and 2: no max_workers (load() takes workers, or the
  // table's size when ranks past it had joined).
  static constexpr auto saved_params_v2() {
    return std::tuple{field{"shard", &server_core_params::shard}, field{"workers", &server_core_params::workers},
                      field{"store_bytes", &server_core_params::store_bytes},
                      field{"limits", &server_core_params::limits}, field{"seed", &server_core_params::seed}};
  }
  // counters::fields() but the last entry (the refusals, saved after their count).
  static constexpr auto scalar_counter_fields() {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple{std::get<I>(counters::fields())...};
    }(std::make_index_sequence<field_count<counters> - 1>{});
  }

  server_core(server_core_params p, Policy policy, optimizer opt)
      : p_(std::move(p)), policy_(std::move(policy)), opt_(std::move(opt)), store_(p_.store_bytes), sink_(p_.workers) {}

  // The per-rank vectors' capacity for every rank the job admits
  // (max_workers): a later join grows them without allocating. A few dozen
  // bytes a rank; the policy's own tables grow at its on_join.
  void reserve_ranks() {
    table_.reserve(p_.max_workers);
    served_at_.reserve(p_.max_workers);
    sink_.reserve(p_.max_workers);
  }

  // A worker id held live from creation that no join, commit or pull has
  // touched yet.
  static bool untouched_since_creation(const worker_entry& e) noexcept {
    return e.incarnation == 0 && e.last_sequence == 0 && e.policy_sequence == 0 && !e.held;
  }

  void refuse(server_actions& out, worker_id w, std::uint64_t seq, refusal why, const status& s) {
    ++stats_.refused[static_cast<std::size_t>(why)];
    out.error(w, seq, why, s);
  }

  bool check_live(worker_id w, std::uint64_t seq, std::string_view field, server_actions& out) {
    if (w >= table_.size() || !table_[w].known) {
      refuse(out, w, seq, refusal::unknown_worker,
             make_error(errc::not_found, field, w, "not a worker of this server (join first)"));
      return false;
    }
    if (!table_[w].live) {
      refuse(out, w, seq, refusal::not_live, make_error(errc::unavailable, field, w, "left or was evicted: join again"));
      return false;
    }
    return true;
  }
  bool check_known(worker_id w, server_actions& out) {
    if (w < table_.size() && table_[w].known) return true;
    refuse(out, w, 0, refusal::unknown_worker,
           make_error(errc::not_found, "measurement.worker", w, "not a worker of this server"));
    return false;
  }

  // The checks before the policy sees a commit (rules/server_core_checks.hpp).
  bool validate(const commit_in& c, server_actions& out);
  bool finite_values(const commit_in& c, const std::byte* p, std::size_t n, dtype type, const std::byte* indices,
                     server_actions& out);
  bool refuse_payload(const commit_in& c, const status& s, server_actions& out);

  struct version_buffer {
    std::vector<float> values;
    std::uint64_t version = no_version;
    std::uint32_t readers = 0;
  };

  // Chunks of the dense apply: three of crc32c's 64 KiB streams (its fastest
  // path), and small enough to stay in a core's L2 cache between the add
  // and the CRC that reads it.
  static constexpr std::size_t apply_chunk_bytes = std::size_t{192} << 10;

  // The apply passes (rules/server_core_apply.hpp).
  version_buffer& spare();
  void make_writable();
  void retire_pinned(version_buffer& b);

  // A dense model-delta commit's add, as apply_pending() keeps it.
  struct dense_add {
    std::span<const std::byte> payload;
    codec_id codec = codec_id::identity;
    dtype type = dtype::f32;
    std::uint64_t step = 0;
    std::uint32_t tensor = 0;
    float weight = 1.0f;
  };

  bool defer_dense(const commit_in& c, double weight);
  void apply_dense(const commit_in& c, double weight, bool want_crc);
  void add_dense(std::span<const dense_add> adds, bool want_crc);
  void publish_beside(version_buffer& b);
  void end_pass(bool crc, unsigned parts) noexcept;

  // A commit's add beside the parameters while its parts land (speculate()).
  struct speculation {
    std::vector<float> values;         // new = w + weight·v over [0, done)
    std::vector<std::uint32_t> crcs;   // per checksum range: the CRC of its elements below done
    worker_id worker = no_worker;
    std::uint64_t incarnation = 0, sequence = 0, step = 0;
    std::uint32_t tensor = 0;
    codec_id codec = codec_id::identity;
    dtype type = dtype::f32;
    std::span<const std::byte> payload{};
    float weight = 1.0f;
    bool crcs_wanted = false;          // a pull rides with the commit: the new version's CRCs as it lands
    std::uint64_t base = 0;            // w_changes_ when it started
    std::size_t landed = 0;            // elements [0, landed) landed (speculate's calls)
    std::size_t done = 0;              // of those, added (a chunk bound)
    bool dead = true;

    [[nodiscard]] bool owns(const commit_in& c) const noexcept {
      return worker == c.worker && incarnation == c.incarnation && sequence == c.sequence && codec == c.codec &&
             type == c.type && step == c.step && tensor == c.tensor && payload.data() == c.payload.data() &&
             payload.size() == c.payload.size();
    }
    [[nodiscard]] bool live(std::uint64_t changes) const noexcept { return !dead && base == changes; }
    void start(const commit_in& c, float w, std::uint64_t changes) noexcept {
      worker = c.worker;
      incarnation = c.incarnation;
      sequence = c.sequence;
      step = c.step;
      tensor = c.tensor;
      codec = c.codec;
      type = c.type;
      payload = c.payload;
      weight = w;
      crcs_wanted = wants_reply_crc(c);
      base = changes;
      landed = 0;
      done = 0;
      dead = false;
    }
  };

  [[nodiscard]] std::size_t grid_floor(std::size_t x) const noexcept;
  void speculate_to(speculation& sp, std::size_t to);
  bool claim_speculation(const commit_in& c) noexcept;
  bool take_speculation(double weight);
  bool publish_speculation(speculation& sp, double weight);
  // The check and the apply in one pass (rules/server_core_fused.hpp).
  bool fuse_start(const wire::header& raw, worker_id from, std::span<const std::byte> payload, bool reply_unchecked);
  bool claim_fused(const commit_in& c) noexcept;
  bool take_fused(double weight);
  void decode_or_die(codec_id id, dtype t, std::uint64_t step, std::uint32_t tensor, std::span<const std::byte> payload,
                     std::vector<float>& into, double weight);
  void step_parts(float scale, bool want_crc = false);

  // Parts a pass over n elements runs as: the pool's threads, or 1 (no pool,
  // or n too small to be worth a run).
  [[nodiscard]] unsigned parts_for(std::size_t n) const noexcept {
    if (pool_ == nullptr || pool_->threads() < 2 || n < 2 * min_part_elements) return 1;
    return pool_->threads();
  }

  // Elements per pool part when a pass over n elements runs as k parts
  // (whole 64-byte lines of floats; the last part is shorter).
  [[nodiscard]] static std::size_t part_block(std::size_t n, unsigned k) noexcept {
    constexpr std::size_t line = 64 / sizeof(float);
    return k <= 1 ? n : ((n + k - 1) / k + line - 1) / line * line;
  }

  // Calls f(part, lo, hi) for each part of [0, n) (every part, empty ones
  // too, so per-part results are all written), on the pool's threads when
  // there is more than one part; returns the number of parts. Part bounds
  // are whole 64-byte lines of floats, so no two parts write one line.
  template <class F>
  unsigned for_parts(std::size_t n, F&& f) {
    const unsigned k = parts_for(n);
    if (k == 1) {
      f(0u, std::size_t{0}, n);
      return 1;
    }
    const std::size_t block = part_block(n, k);
    auto job = [&](unsigned part) noexcept {
      const std::size_t lo = std::min(n, std::size_t{part} * block), hi = std::min(n, lo + block);
      f(part, lo, hi);
    };
    pool_->run(job);
    return k;
  }

  // ------------------------------------------- CRCs by range, in one pass
  //
  // A pass over the version computes CRCs of segments: the pieces of the
  // shard cut at both the pool's part bounds and the driver's checksum
  // ranges' (checksum_in_parts; one range of n elements without). Within a
  // pool part a segment starts at the part's first element or at a range's
  // first element: the latter's CRC goes straight to range_crc_[j]; the
  // former (the head of pool part p, starting inside range j) goes to
  // head_crc_[p], and finish_crcs appends the heads to their ranges in
  // order. Each pool part writes only its own head and the ranges that start
  // in it, so parts never share a CRC slot.
  struct crc_cursor {
    unsigned part = 0;       // the pool part
    std::size_t seg = 0;     // first element of the open segment
    std::size_t end = 0;     // end of the range the open segment lies in
    std::size_t per = 0;     // elements per range
    std::size_t n = 0;
    std::uint32_t crc = 0;
  };

  // CRCs by range (rules/server_core_checksums.hpp).
  [[nodiscard]] crc_cursor crc_open(unsigned part, std::size_t lo, std::size_t n) noexcept;
  void crc_feed(crc_cursor& c, const float* data, std::size_t from, std::size_t to) noexcept;
  void crc_close(crc_cursor& c, std::size_t at) noexcept;
  [[nodiscard]] std::size_t range_elements(std::size_t n) const noexcept;
  void finish_crcs(unsigned parts) noexcept;

  void clear_acc() noexcept {
    if (!acc_.empty()) std::memset(acc_.data(), 0, acc_.size() * sizeof(float));
  }

  void take_step(server_actions& out) {
    ++stats_.steps;
    out.step();
  }

  void drop_pull(worker_id w) {
    if (!table_[w].held) return;
    table_[w].held = false;
    ++stats_.pulls_dropped;
  }

  void remove(worker_id w, double now, server_actions& out) {
    table_[w].live = false;
    --live_n_;
    replies_.forget(w);
    drop_pull(w);
    policy_.on_evict({w, now}, sink_);
    finish(out);
  }

  void send_plan(worker_id w, server_actions& out) {
    out.plan(w, policy_.plan(w));
    ++stats_.plans_sent;
  }

  // ---------------------------------------------------------- the ledger
  //
  // The ledger sees only what the core accepted, after the policy (so it
  // never refuses a join: its incarnations trail the core's). A worker the
  // core holds live from creation enters the ledger at its first join; its
  // commits before that are not the ledger's (a real worker joins first).

  // Room in out for the most leases one event grants (the ledger reserves
  // more itself when a new id joins): nothing allocates once out has it.
  ledger_sink& lease_sink(server_actions& out) const {
    return out.lease_sink(2 * ledger_.lease_capacity() * std::max<std::size_t>(ledger_.known_workers(), 1));
  }
  // Samples per commit of w (lease_samples = 0: a lease is 4 of them): its
  // plan's batch x H, else `fallback` (the join's batch x H, a commit's
  // samples).
  std::uint64_t cycle_samples(worker_id w, std::uint64_t batch, std::uint64_t fallback) const {
    if (ledger_.params().lease_samples != 0) return 0;  // unused
    const worker_plan pl = policy_.plan(w);
    const std::uint64_t h = pl.local_iterations;
    if (pl.batch_size > 0 && h > 0) return std::uint64_t{pl.batch_size} * h;
    return batch > 0 ? batch * std::max<std::uint64_t>(h, 1) : fallback;
  }
  void ledger_join(worker_id w, std::uint64_t incarnation, std::uint32_t batch, double now, server_actions& out) {
    if (!ledger_.enabled()) return;
    const status s = ledger_.join(w, incarnation, cycle_samples(w, batch, 0), now, lease_sink(out));
    ASHL_ASSERT(s.ok(), "server_core: the ledger refused a join the core accepted");
    (void)s;
  }
  void ledger_commit(worker_id w, std::uint64_t samples, double now, server_actions& out) {
    // Refused (changing nothing) only for a worker that never joined the ledger.
    (void)ledger_.commit(w, samples, cycle_samples(w, 0, samples), now, lease_sink(out));
  }

  struct progress {
    std::size_t round = 0, released = 0;
  };

  // The one order of an event's outcomes (rules/server_core_apply.hpp).
  progress settle(server_actions& out, progress from);
  void finish(server_actions& out, progress from = {}, worker_id joiner = no_worker, worker_id puller = no_worker,
              double now = 0.0);

  // The counters' part of the state (rules/server_core_state.hpp).
  static void save_counters(state_writer& w, const counters& c);
  static status load_counters(state_reader& r, counters& c, std::uint32_t version);

  server_core_params p_;
  Policy policy_;
  optimizer opt_;
  std::vector<float> w_;    // this shard's parameters
  reply_encoder replies_;   // per worker: its view of w_ (compressed replies)
  std::vector<float> acc_;  // sgd: the aggregate one step applies; model deltas: scratch of decode checks
  std::vector<worker_entry> table_;
  std::uint32_t live_n_ = 0;  // entries of table_ live (live_count())
  static constexpr std::uint64_t no_version = ~std::uint64_t{0};
  std::vector<std::uint64_t> served_at_;  // per worker: the version of its last reply (serve_staleness)
  commit_store store_;
  sync::outcome_sink sink_;
  data_ledger ledger_;  // docs/elastic.md §3; disabled without params().ledger.samples
  counters stats_{};
  bool in_acc_ = false;                 // this event's commit was decoded into acc_ by its check
  const commit_in* current_ = nullptr;  // the commit of this event, while buffered and not stored
  std::uint64_t current_sequence_ = 0;
  // Versions replies read (pin_parameters): w_'s pins, and older versions'
  // storage kept in held_ until their last reply completes.
  std::uint32_t w_readers_ = 0;
  std::uint64_t w_pin_version_ = no_version;
  bool w_pinned_before_ = false;
  std::uint32_t w_crc_ = 0;
  bool w_crc_valid_ = false;  // w_crc_ is the CRC of w_ as it is
  std::vector<version_buffer> held_;
  std::uint64_t applied_beside_ = 0, copies_for_readers_ = 0;
  std::uint64_t checksum_passes_ = 0, checksums_in_apply_ = 0;
  // Apply threads (use_apply_pool): not owned; per-part results of a pass.
  apply_pool* pool_ = nullptr;
  // CRCs by range (checksum_in_parts): each range's CRC of the current
  // version (valid with w_crc_), and per pool part its head segment.
  std::uint32_t checksum_parts_ = 1;
  std::vector<std::uint32_t> range_crc_;
  std::array<std::uint32_t, apply_pool::max_threads> head_crc_{};
  std::array<std::size_t, apply_pool::max_threads> head_len_{};
  std::array<std::uint32_t, apply_pool::max_threads> head_range_{};
  std::array<std::size_t, apply_pool::max_threads> part_first_{};
  // Batched applies (defer_dense_applies): the slots, how many wait, and
  // whether a pull riding with one wants the new version's CRC.
  std::vector<dense_add> pending_;
  std::size_t pending_n_ = 0;
  bool pending_crc_ = false;
  std::uint64_t batched_passes_ = 0, batched_commits_ = 0;
  // Applies as parts land (speculate): the buffer and its commit; every
  // change to the parameters (in place, beside, deferred, loaded) counts.
  speculation spec_;
  std::uint64_t w_changes_ = 0;
  std::uint64_t speculations_ = 0, speculations_stale_ = 0, applied_as_landed_ = 0;
  // The check and the apply in one pass (check_message): its spare version.
  speculation fused_;
  std::uint64_t fused_applies_ = 0, fused_wasted_ = 0;
};

}  // namespace ps
ASHL_NAMESPACE_END

// The members' bodies that are not the events: each header includes this one
// first, so any of them alone gives the whole server_core.
#include <ashl/rules/server_core_apply.hpp>
#include <ashl/rules/server_core_checks.hpp>
#include <ashl/rules/server_core_checksums.hpp>
#include <ashl/rules/server_core_fused.hpp>
#include <ashl/rules/server_core_state.hpp>
