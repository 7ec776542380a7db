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
// their working size) no valid event allocates. docs/algorithms.md §1–§2;
// docs/design.md "Server core"; docs/ps.md.
//
// Deviations from the first sketch of the server core (docs/ps.md):
// - server_core_params.workers: ids 0..workers-1 are live from creation
//   (incarnation 0), as the policy was constructed; others join().
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

using sync::worker_id;

// Why a message was refused; counters are kept per reason.
enum class refusal : std::uint8_t {
  unknown_worker = 0,  // never joined this server
  not_live = 1,        // left or was evicted: join again
  incarnation = 2,     // a commit or join of another incarnation than the worker's current one
  sequence = 3,        // sequence 0 (sequences start at 1)
  element_count = 4,   // not the element count of this server's shard
  dtype = 5,           // not f32, f16 or bf16
  codec = 6,           // a codec id this build cannot decode
  payload = 7,         // the codec refused the payload (malformed)
  limits = 8,          // over wire::limits
  store_full = 9,      // the commit store could not take it (store_bytes)
  measurement = 10,    // a measurement with a bad kind, time or amount
  non_finite = 11,     // a NaN or infinite value in the update (server_core_params.allow_non_finite)
  samples = 12,        // commit.samples above server_core_params.max_commit_samples
};
inline constexpr auto refusal_table =
    make_enum_table<refusal>("unknown_worker", "not_live", "incarnation", "sequence", "element_count", "dtype", "codec",
                             "payload", "limits", "store_full", "measurement", "non_finite", "samples");
static_assert(refusal_table.name(refusal::samples) == "samples", "refusal_table ends where refusal does");
inline constexpr std::size_t refusal_count = refusal_table.size();

constexpr std::string_view to_string(refusal r) noexcept { return refusal_table.name(r); }

// The largest commit payload a server takes for a shard of n elements: 8
// bytes an element (sparse pairs of f32 at ratio 1, twice a dense f32
// commit) and a small header.
constexpr std::uint64_t max_commit_payload_bytes(std::uint64_t n) noexcept {
  return n > (~std::uint64_t{0} - 64) / 8 ? ~std::uint64_t{0} : 8 * n + 64;
}

// The automatic store bound (server_core_params.store_bytes = 0): one
// commit of the largest payload per worker. Every buffering policy holds at
// most one commit per worker for a round (BSP, DLB, semi-async's barrier;
// coded BSP at most two dense ones, which the 8-byte bound covers), and a
// policy that never buffers needs none: the store grows only as commits are
// buffered, so the bound costs no memory until it is used. Saturates.
constexpr std::uint64_t automatic_store_bytes(std::uint64_t shard_elements, std::uint32_t workers) noexcept {
  const std::uint64_t one = max_commit_payload_bytes(shard_elements);
  const std::uint64_t m = workers == 0 ? 1 : workers;
  return one > ~std::uint64_t{0} / m ? ~std::uint64_t{0} : one * m;
}

struct server_core_params {
  shard_layout layout{};          // elements() == 0: timing only (payloads ignored, nothing decoded)
  std::uint32_t shard = 0;        // the range this core holds (one server of S)
  std::uint32_t workers = 0;      // ids 0..workers-1 live from creation, incarnation 0
  optimizer_params optimizer{};
  // Bound on buffered commit payload bytes; 0: automatic_store_bytes(shard
  // elements, workers). An explicit value must hold one dense f32 commit.
  std::uint64_t store_bytes = 0;
  wire::limits limits{};
  std::uint64_t seed = 0;         // codec_context seed for decode
  // A commit with a NaN or infinite value is refused (refusal::non_finite,
  // the parameters unchanged) unless this is set.
  bool allow_non_finite = false;
  // The most samples one commit may say it covers (iterations x batch); a
  // commit above it is refused (refusal::samples). 0 says "not counted"
  // (a samples-weighted round then weighs by the mean).
  std::uint64_t max_commit_samples = std::uint64_t{1} << 30;
};

// One commit shard, as decoded from a wire commit message.
struct commit_in {
  worker_id worker = 0;
  std::uint64_t incarnation = 0;
  std::uint64_t sequence = 0;  // the worker's, 1, 2, ... per incarnation
  std::uint64_t clock = 0;
  std::uint64_t samples = 0;
  std::uint64_t bytes = 0;     // bytes on the wire (for the policy)
  codec_id codec = codec_id::identity;
  dtype type = dtype::f32;
  std::uint64_t element_count = 0;
  std::uint64_t step = 0;      // codec_context.step
  std::uint32_t tensor = 0;    // codec_context.tensor
  std::span<const std::byte> payload{};  // not kept: copied into the store if buffered
  bool pull = false;                     // a pull rides with the commit
  // That pull is a push's (ps::worker::push): the driver answers it with an
  // acknowledgement, not the parameters, so a dense apply skips the new
  // version's CRC (computed when a reply first pins the version).
  bool ack_only = false;
  // The driver ran a dense_value_check over this payload (in its CRC pass:
  // wire::decode's visitor) and it found every value finite: validate()
  // skips its own pass over the values. False: validate() checks (and names
  // the first non-finite element).
  bool values_checked = false;
  // The driver keeps the payload's bytes where they are, unchanged, until
  // it calls server_core::apply_pending() (ps::server: a receive buffer or
  // a commit's staging it holds for a batch). With defer_dense_applies(k),
  // an applied dense model-delta commit may then wait for that call and be
  // added in one pass with the others waiting. False:
  // the payload is read before commit() returns.
  bool payload_kept = false;
};

// server_core's check that a dense payload's values are finite, run by a
// driver over the payload's chunks as its CRC check reads them (one pass
// instead of two; wire::decode's visitor). all_finite() is true only when
// the payload is dense for its header (codec, dtype, elements, size), every
// byte was seen in order and no value is NaN or infinite; anything else
// leaves the check to validate(), which names the element.
class dense_value_check {
 public:
  dense_value_check() = default;
  dense_value_check(codec_id codec, dtype type, std::uint64_t elements, std::size_t payload_bytes) noexcept {
    if (type != dtype::f32 && type != dtype::f16 && type != dtype::bf16) return;
    if (static_cast<int>(codec) >= codec_id_count) return;
    const std::size_t dense = compress::dense_payload_bytes(codec, {static_cast<std::size_t>(elements), type});
    if (dense == 0 || dense != payload_bytes) return;
    bits_ = detail::bits_of(dense_values_type(codec, type));
    if (bits_.bytes * elements != payload_bytes) return;
    expected_ = payload_bytes;
    active_ = true;
  }
  void operator()(std::span<const std::byte> chunk) noexcept {
    if (!active_ || !finite_) return;
    if (chunk.size() % bits_.bytes != 0 || seen_ + chunk.size() > expected_) {
      finite_ = false;
      return;
    }
    const std::size_t k = chunk.size() / bits_.bytes;
    if (detail::first_non_finite(chunk.data(), k, bits_.bytes, bits_.mask) != k) finite_ = false;
    seen_ += chunk.size();
  }
  [[nodiscard]] bool all_finite() const noexcept { return active_ && finite_ && seen_ == expected_; }

 private:
  detail::float_bits bits_{};
  std::size_t expected_ = 0, seen_ = 0;
  bool active_ = false, finite_ = true;
};

struct plan_out {
  worker_id worker = 0;
  worker_plan plan{};
  friend bool operator==(const plan_out&, const plan_out&) = default;
};

struct error_out {
  worker_id worker = 0;
  errc code = errc::internal;
  std::uint64_t in_reply_to = 0;  // the refused message's sequence (0 for kinds without one)
  refusal reason = refusal::unknown_worker;
  std::string text;               // "<field> = <value>: <why>"
};

// What the driver must send after an event. Caller-owned and reused:
// clear() keeps every buffer's capacity (error texts too).
class server_actions {
 public:
  server_actions() = default;
  explicit server_actions(std::size_t workers) { reserve(workers); }
  void reserve(std::size_t workers) {
    replies_.reserve(workers);
    plans_.reserve(workers);
  }

  // Send the parameters to these workers, in this order.
  [[nodiscard]] std::span<const worker_id> pull_replies() const noexcept { return replies_; }
  // Send these plan_updates.
  [[nodiscard]] std::span<const plan_out> plans() const noexcept { return plans_; }
  // Send these errors.
  [[nodiscard]] std::span<const error_out> errors() const noexcept { return {errors_.data(), n_errors_}; }
  // Optimizer steps the events took (the parameters changed when > 0).
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  [[nodiscard]] bool empty() const noexcept {
    return replies_.empty() && plans_.empty() && n_errors_ == 0 && steps_ == 0;
  }
  void clear() noexcept {
    replies_.clear();
    plans_.clear();
    n_errors_ = 0;
    steps_ = 0;
  }

  // ---- written by server_core
  void reply(worker_id w) { replies_.push_back(w); }
  void plan(worker_id w, const worker_plan& p) { plans_.push_back({w, p}); }
  void step() noexcept { ++steps_; }
  void error(worker_id w, std::uint64_t in_reply_to, refusal why, const status& s) {
    if (n_errors_ == errors_.size()) errors_.emplace_back();
    error_out& e = errors_[n_errors_++];
    e.worker = w;
    e.code = s.code();
    e.in_reply_to = in_reply_to;
    e.reason = why;
    e.text.assign(s.message());
  }

 private:
  std::vector<worker_id> replies_;
  std::vector<plan_out> plans_;
  std::vector<error_out> errors_;
  std::size_t n_errors_ = 0;
  std::uint64_t steps_ = 0;
};

struct counters {
  std::uint64_t commits = 0;           // accepted (validated, told to the policy)
  std::uint64_t commits_applied = 0;   // added into the parameters (at once or in a round)
  std::uint64_t commits_buffered = 0;  // kept for a round
  std::uint64_t commits_dropped = 0;   // the policy said drop
  std::uint64_t duplicates = 0;        // seen before: dropped, the policy not told
  std::uint64_t bytes_in = 0;          // commit_in.bytes of accepted commits
  std::uint64_t pulls = 0;             // pull requests taken to the policy
  std::uint64_t pulls_served = 0;      // answered at once
  std::uint64_t pulls_held = 0;
  std::uint64_t pulls_released = 0;
  std::uint64_t pulls_dropped = 0;     // held by a worker that left or was evicted
  std::uint64_t plans_sent = 0;
  std::uint64_t steps = 0;             // optimizer steps (the version)
  std::uint64_t joins = 0, leaves = 0, evictions = 0;
  std::uint64_t round_missing = 0;     // a round named a commit the store did not hold (a policy error)
  std::array<std::uint64_t, refusal_count> refused{};

  [[nodiscard]] std::uint64_t refused_total() const noexcept {
    std::uint64_t t = 0;
    for (auto r : refused) t += r;
    return t;
  }
  [[nodiscard]] std::uint64_t refused_for(refusal r) const noexcept { return refused[static_cast<std::size_t>(r)]; }
  friend bool operator==(const counters&, const counters&) = default;

  // The one list of these counters (core/fields.hpp): the Python binding's
  // dicts are read off it, and fields_cover<>() proves none is missing.
  static constexpr auto fields() {
    return std::tuple{
        field{"commits", &counters::commits},
        field{"commits_applied", &counters::commits_applied},
        field{"commits_buffered", &counters::commits_buffered},
        field{"commits_dropped", &counters::commits_dropped},
        field{"duplicates", &counters::duplicates},
        field{"bytes_in", &counters::bytes_in},
        field{"pulls", &counters::pulls},
        field{"pulls_served", &counters::pulls_served},
        field{"pulls_held", &counters::pulls_held},
        field{"pulls_released", &counters::pulls_released},
        field{"pulls_dropped", &counters::pulls_dropped},
        field{"plans_sent", &counters::plans_sent},
        field{"steps", &counters::steps},
        field{"joins", &counters::joins},
        field{"leaves", &counters::leaves},
        field{"evictions", &counters::evictions},
        field{"round_missing", &counters::round_missing},
        field{"refused_by_reason", &counters::refused}};
  }
};
static_assert(fields_cover<counters>(), "counters::fields() must list every counter");


template <sync::consistency_policy Policy = sync::any_policy>
class server_core {
 public:
  static result<server_core> create(server_core_params p, Policy policy, std::span<const float> initial = {}) {
    if (p.workers > max_workers)  // per-worker tables are sized below (rules/job_limits.hpp)
      return out_of_range("server_core.workers", p.workers,
                          "must be at most " + std::to_string(max_workers) + " (ps::max_workers)");
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
    if (p.store_bytes == 0) p.store_bytes = automatic_store_bytes(n, p.workers);
    if (p.store_bytes < 4 * n)
      return invalid_argument("server_core.store_bytes", p.store_bytes,
                              "holds less than one dense f32 commit of the shard (4 x " + std::to_string(n) +
                                  " = " + std::to_string(4 * n) + " bytes; 0 = automatic, " +
                                  std::to_string(automatic_store_bytes(n, p.workers)) + " here)");
    for (worker_id w = 0; w < p.workers; ++w)
      if (!policy.is_live(w))
        return invalid_argument("server_core.workers", p.workers,
                                "the policy does not hold worker " + std::to_string(w) + " live");
    auto opt = optimizer::create(p.optimizer, static_cast<std::size_t>(n));
    if (!opt) return opt.error();
    server_core c(std::move(p), std::move(policy), std::move(*opt));
    if (initial.empty()) c.w_.assign(static_cast<std::size_t>(n), 0.0f);
    else c.w_.assign(initial.begin(), initial.end());
    c.acc_.assign(static_cast<std::size_t>(n), 0.0f);
    c.range_crc_.assign(1, 0u);
    c.table_.resize(c.p_.workers);
    c.served_at_.assign(c.p_.workers, no_version);
    for (auto& e : c.table_) e.known = e.live = true;
    return c;
  }

  // ---------------------------------------------------------------- events

  // w (re)joins as `incarnation`: the plan is sent. A larger incarnation
  // than the one held starts a fresh sequence (a restart; a live older
  // incarnation is evicted first); the same one is a duplicate join when w is
  // live (the plan is sent again) or a rejoin keeping its sequence when not;
  // a smaller one is refused.
  void join(worker_id w, std::uint64_t incarnation, double now, server_actions& out) {
    if (w >= table_.size()) table_.resize(std::size_t{w} + 1);
    worker_entry& e = table_[w];
    if (e.known && incarnation < e.incarnation) {
      refuse(out, w, 0, refusal::incarnation,
             make_error(errc::invalid_argument, "join.incarnation", incarnation,
                        "stale: worker " + std::to_string(w) + " is at incarnation " + std::to_string(e.incarnation) +
                            " (a later process of this rank joined; this one must not commit)"));
      return;
    }
    if (e.known && e.live && incarnation == e.incarnation) {
      send_plan(w, out);
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
      return;
    }
    if (e.known && e.live) {  // a restart the server had not noticed
      policy_.on_evict({w, now}, sink_);
      drop_pull(w);
      e.live = false;
      ++stats_.evictions;
    }
    if (!e.known || incarnation > e.incarnation) e.last_sequence = 0;
    e.known = e.live = true;
    e.incarnation = incarnation;
    ++stats_.joins;
    policy_.on_join({w, now}, sink_);
    finish(out, {}, w);
  }

  // w says it leaves: its held pull is dropped; the policy evicts it.
  void leave(worker_id w, double now, server_actions& out) {
    if (!check_live(w, 0, "leave.worker", out)) return;
    ++stats_.leaves;
    remove(w, now, out);
  }

  // The driver decided w is gone (timeout, failure): held pulls of w are
  // dropped, the policy recomputes its bounds (releasing others' pulls);
  // w's buffered commits stay and apply as the policy says. A worker not
  // live is ignored.
  void evict(worker_id w, double now, server_actions& out) {
    if (w >= table_.size() || !table_[w].live) return;
    ++stats_.evictions;
    remove(w, now, out);
  }

  void commit(const commit_in& c, double now, server_actions& out) {
    const worker_id w = c.worker;
    // Its speculation (speculate) ends with it, whatever commit() decides.
    const bool speculated = claim_speculation(c);
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
              if (!(speculated && take_speculation(d.weight)) && (!c.payload_kept || !defer_dense(c, d.weight)))
                apply_dense(c, d.weight, c.pull && !c.ack_only);
              table_[w].last_weight = static_cast<float>(d.weight);
            } else {
              make_writable();
              decode_or_die(c.codec, c.type, c.step, c.tensor, c.payload, w_, d.weight);
            }
          } else if (in_acc_) {
            make_writable();
            step_parts(static_cast<float>(d.weight), c.pull && !c.ack_only);  // acc_ holds the commit at scale 1
          } else {
            // 0 + w·v in the accumulator, then a step at scale 1: the same
            // bits as decoding at scale 1 and stepping at w.
            decode_or_die(c.codec, c.type, c.step, c.tensor, c.payload, acc_, d.weight);
            make_writable();
            step_parts(1.0f, c.pull && !c.ack_only);
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
    current_ = pending ? &c : nullptr;
    current_sequence_ = seq;
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
  void apply_pending() {
    if (pending_n_ == 0) return;
    const std::size_t k = pending_n_;
    pending_n_ = 0;
    add_dense(std::span<const dense_add>(pending_.data(), k), pending_crc_);
    pending_crc_ = false;
    if (k >= 2) {
      ++batched_passes_;
      batched_commits_ += k;
    }
  }
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
  bool speculate(const commit_in& c, std::size_t from, std::size_t to) {
    const std::size_t n = w_.size();
    if (n == 0 || !opt_.adds_deltas() || c.worker >= table_.size() || c.element_count != n ||
        compress::dense_payload_bytes(c.codec, {n, c.type}) != c.payload.size())
      return false;
    const worker_entry& e = table_[c.worker];
    if (!e.live || c.incarnation != e.incarnation || c.sequence <= e.last_sequence) return false;  // commit() refuses it
    if (!e.applied_at_once) return false;  // its last commit waited for a round: so will this one, likely
    speculation& sp = spec_;
    if (from == 0) {
      if (sp.live(w_changes_) && sp.worker != c.worker) return false;  // another rank's, still good
      sp.start(c, e.last_weight, w_changes_);
      sp.values.resize(n);
      sp.crcs.assign(std::max<std::uint32_t>(checksum_parts_, 1), 0u);
      ++speculations_;
    } else if (!sp.owns(c) || sp.dead) {
      return false;
    }
    if (from != sp.landed || to < from || pending_n_ > 0 || sp.base != w_changes_) {
      sp.dead = true;  // out of order, or the parameters changed under it (or a deferred commit waits)
      ++speculations_stale_;
      return false;
    }
    sp.landed = std::min(to, n);
    speculate_to(grid_floor(sp.landed));
    return true;
  }

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
  status checksum_in_parts(std::uint32_t k) {
    const std::size_t n = w_.size();
    if (k >= 2) {
      const std::size_t per = k > n ? 0 : (n + k - 1) / k;
      if (per == 0 || (n + per - 1) / per != k)
        return invalid_argument("server_core.checksum_parts", k,
                                "leaves an empty range of the " + std::to_string(n) + " parameters");
    }
    checksum_parts_ = k < 2 ? 1 : k;
    range_crc_.assign(checksum_parts_, 0u);
    w_crc_valid_ = false;
    ++w_changes_;  // a speculation's CRCs were cut at the old ranges
    return {};
  }
  [[nodiscard]] std::uint32_t checksum_parts() const noexcept { return checksum_parts_ < 2 ? 0 : checksum_parts_; }

  pinned_parameters pin_parameters() {
    apply_pending();
    if (!w_crc_valid_) {
      const float* src = w_.data();
      const std::size_t n = w_.size();
      const unsigned k = for_parts(n, [&](unsigned part, std::size_t lo, std::size_t hi) noexcept {
        crc_cursor c = crc_open(part, lo, n);
        crc_feed(c, src, lo, hi);
        crc_close(c, hi);
      });
      finish_crcs(k);
      ++checksum_passes_;
    }
    const std::uint64_t v = version();
    const bool first = !w_pinned_before_ || w_pin_version_ != v;
    if (w_readers_ == 0) w_pin_version_ = v;
    ASHL_ASSERT(w_pin_version_ == v, "server_core: the pinned parameters changed in place");
    w_pinned_before_ = true;
    ++w_readers_;
    const std::span<const std::uint32_t> ranges = checksum_parts_ >= 2 ? std::span<const std::uint32_t>(range_crc_)
                                                                        : std::span<const std::uint32_t>{};
    return {w_, v, w_crc_, first, ranges};
  }

  void unpin_parameters(std::uint64_t version) {
    if (w_readers_ > 0 && w_pin_version_ == version) {
      --w_readers_;
      return;
    }
    for (version_buffer& b : held_)
      if (b.readers > 0 && b.version == version) {
        --b.readers;
        return;
      }
    ASHL_ASSERT(false, "server_core: unpin of a version not pinned");
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
  [[nodiscard]] key_range range() const noexcept { return p_.layout.range(p_.shard); }
  // No payload is read: the layout has 0 elements (the simulator's timing
  // runs), or this server's range is empty (more servers than elements).
  [[nodiscard]] bool timing_only() const noexcept { return w_.empty(); }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return w < table_.size() && table_[w].live; }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return w < table_.size() && table_[w].held; }
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
  void save(state_writer& out) const {
    // The body is written in place after a length placeholder (the layout of
    // put_string: u64 length, bytes), then the length is patched and the CRC
    // appended: no second buffer, no copy (a 64 MB shard saves at memory speed).
    // Version 2: the refusal counters are preceded by their count (version
    // 1 had 11 reasons; load() reads both).
    ASHL_ASSERT(pending_n_ == 0, "server_core: save() with commits waiting (call apply_pending())");
    out.tag("PSCR", 2);
    const std::size_t length_at = out.size();
    out.put<std::uint64_t>(0);
    const std::size_t body_at = out.size();
    state_writer& w = out;
    p_.layout.save(w);
    put_fields(w, p_, saved_params());
    opt_.save(w);
    w.put_vector(w_);
    w.put<std::uint64_t>(table_.size());
    for (const auto& e : table_) put_fields(w, e, worker_entry::saved());
    store_.save(w);
    save_counters(w, stats_);
    policy_.save(w);
    out.patch<std::uint64_t>(length_at, out.size() - body_at);
    out.put(wire::crc32c(out.written(body_at)));
  }

  // Reads into fresh values and assigns only when everything was read: a
  // truncated or corrupt state is refused and leaves the core unchanged.
  status load(state_reader& in) {
    ASHL_ASSERT(pending_n_ == 0, "server_core: load() with commits waiting (call apply_pending())");
    std::uint32_t version = 0;
    ASHL_TRY(in.tag("PSCR", 1, 2, version));
    std::span<const std::byte> bytes;
    ASHL_TRY(in.get_bytes(bytes, "server_core.state"));
    std::uint32_t crc = 0;
    ASHL_TRY(in.get(crc, "server_core.crc"));
    if (wire::crc32c(bytes) != crc)
      return make_error(errc::checksum_mismatch, "server_core.crc", crc, "does not match the saved state");
    state_reader r(bytes);
    server_core_params p;
    ASHL_TRY(p.layout.load(r));
    ASHL_TRY(get_fields(r, p, "server_core", saved_params()));
    if (p.shard >= p.layout.servers())
      return make_error(errc::malformed, "server_core.shard", p.shard, "not a server of the saved layout");
    const std::uint64_t n = p.layout.range(p.shard).size();
    optimizer opt;
    ASHL_TRY(opt.load(r));
    p.optimizer = opt.params();
    std::vector<float> w;
    ASHL_TRY(r.get_vector(w, "server_core.parameters"));
    if (w.size() != n || opt.size() != n)
      return make_error(errc::malformed, "server_core.parameters.size", w.size(),
                        "the saved shard holds " + std::to_string(n) + " elements");
    std::uint64_t m = 0;
    ASHL_TRY(r.count(m, 27, "server_core.workers_known"));
    std::vector<worker_entry> table(static_cast<std::size_t>(m));
    for (auto& e : table) ASHL_TRY(get_fields(r, e, "server_core.worker", worker_entry::saved()));
    // The larger of the saved bound and this server's: a restart given a
    // larger store_bytes (the saved one was too small) keeps it.
    p.store_bytes = std::max(p.store_bytes, p_.store_bytes);
    commit_store store(p.store_bytes);
    ASHL_TRY(store.load(r));
    counters st;
    ASHL_TRY(load_counters(r, st, version));
    Policy pol = policy_;
    ASHL_TRY(pol.load(r));
    ASHL_TRY(r.expect_end("server_core.state"));
    // Not part of the state: this server's own choices stay.
    p.allow_non_finite = p_.allow_non_finite;
    p.max_commit_samples = p_.max_commit_samples;
    p_ = std::move(p);
    opt_ = std::move(opt);
    make_writable();  // a version replies still read keeps its storage
    w_ = std::move(w);
    w_crc_valid_ = false;
    if (checksum_parts_ >= 2 && !checksum_in_parts(checksum_parts_).ok()) (void)checksum_in_parts(0);  // another size
    acc_.assign(w_.size(), 0.0f);
    table_ = std::move(table);
    store_ = std::move(store);
    stats_ = st;
    policy_ = std::move(pol);
    sink_.clear();
    sink_.reserve(table_.size());
    return {};
  }

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

  // Every check before the policy may see the commit. On success in_acc_
  // says whether acc_ now holds the commit decoded at scale 1 (sgd, a codec
  // whose check is its decode).
  bool validate(const commit_in& c, server_actions& out) {
    const std::uint64_t n = w_.size();
    if (c.payload.size() > p_.limits.max_payload_bytes) {
      refuse(out, c.worker, c.sequence, refusal::limits,
             make_error(errc::out_of_range, "commit.payload_bytes", c.payload.size(),
                        "exceeds limits.max_payload_bytes = " + std::to_string(p_.limits.max_payload_bytes)));
      return false;
    }
    if (c.element_count != n) {
      refuse(out, c.worker, c.sequence, refusal::element_count,
             make_error(errc::invalid_argument, "commit.element_count", c.element_count,
                        "this server's shard " + std::to_string(p_.shard) + " holds " + std::to_string(n)));
      return false;
    }
    if (c.type != dtype::f32 && c.type != dtype::f16 && c.type != dtype::bf16) {
      refuse(out, c.worker, c.sequence, refusal::dtype,
             make_error(errc::invalid_argument, "commit.dtype", to_string(c.type), "must be f32, f16 or bf16"));
      return false;
    }
    if (static_cast<int>(c.codec) >= codec_id_count) {
      refuse(out, c.worker, c.sequence, refusal::codec,
             make_error(errc::unsupported, "commit.codec", static_cast<unsigned>(c.codec), "unknown codec id"));
      return false;
    }
    if (status s = store_.can_hold(c.payload.size()); !s) {
      refuse(out, c.worker, c.sequence, refusal::store_full,
             status(s.code(), s.message() + "; give the server a larger store_bytes (0 = automatic: " +
                                  std::to_string(automatic_store_bytes(n, p_.workers)) + " for " +
                                  std::to_string(p_.workers) + " workers)"));
      return false;
    }
    const compress::payload_info info{static_cast<std::size_t>(n), c.type};
    const compress::codec_context ctx{p_.seed, c.step, c.tensor, {}};
    in_acc_ = false;
    // The payload is checked here without touching the parameters: a dense
    // cast's only rule is its size; sparse pairs (a published layout,
    // docs/wire-format.md "Sparse pairs") are checked by reading their header
    // and indices, the rules of decode_add_pairs (a payload of 0 pairs goes
    // to the decode check, which knows whether its codec allows none). Such
    // a commit is decoded once, after the policy's decision.
    //
    // Values: unless allow_non_finite, a NaN or infinite value is refused
    // before the policy sees the commit, so the parameters (and every later
    // checkpoint) stay finite. A dense cast or sparse pairs are checked on
    // their values as they lie in the payload (one branch-free pass that
    // reads the bytes the decode reads next); any other codec on what its
    // check-decode wrote into the accumulator (a finite payload can decode
    // to an infinity: a huge QSGD norm).
    const bool check_values = !p_.allow_non_finite;
    const std::size_t dense = compress::dense_payload_bytes(c.codec, info);
    if (dense != 0) {
      if (c.payload.size() != dense)
        return refuse_payload(c, make_error(errc::malformed, "commit.payload_bytes", c.payload.size(),
                                            std::string(to_string(c.codec)) + " of " + std::to_string(n) + " " +
                                                std::string(to_string(c.type)) + " is " + std::to_string(dense) +
                                                " bytes"),
                              out);
      if (!check_values || c.values_checked) return true;  // checked by the driver in its CRC pass
      return finite_values(c, c.payload.data(), static_cast<std::size_t>(n), dense_values_type(c.codec, c.type),
                           nullptr, out);
    }
    if (compress::sparse_pairs(c.codec) && compress::sparse_pairs_well_formed(c.payload, info)) {
      if (!check_values) return true;
      // 12-byte header (n, count), count u32 indices, count values.
      const std::size_t count = ::ashl::compress::detail::load_le32(c.payload.data() + 8);
      return finite_values(c, c.payload.data() + 12 + 4 * count, count, c.type, c.payload.data() + 12, out);
    }
    if (!opt_.adds_deltas() || check_values) {
      // Any other codec, sgd: the decode into the (zero) accumulator at
      // scale 1 is the check and the decode (the step scales it); a codec
      // that refuses may have written part of it, so it is zeroed again.
      // Model deltas with the value check: the same decode, checked, then
      // zeroed (the accumulator is scratch there).
      status s = compress::decode_add(c.codec, c.payload, info, host_view<float>(acc_.data(), acc_.size()), 1.0f, ctx);
      if (!s) {
        clear_acc();
        return refuse_payload(c, s, out);
      }
      if (check_values &&
          !finite_values(c, reinterpret_cast<const std::byte*>(acc_.data()), acc_.size(), dtype::f32, nullptr, out)) {
        clear_acc();
        return false;
      }
      if (opt_.adds_deltas()) {
        clear_acc();
        return true;
      }
      in_acc_ = true;
      return true;
    }
    // Any other codec, model deltas, non-finite values allowed: one decode
    // at scale 0 into the scratch buffer (never read), then the real one
    // into the parameters.
    status s = compress::decode_add(c.codec, c.payload, info, host_view<float>(acc_.data(), acc_.size()), 0.0f, ctx);
    if (!s) return refuse_payload(c, s, out);
    return true;
  }

  // Whether the n values of `type` at p are finite; refuses the commit
  // otherwise, naming the worker and the element (the pair's index when
  // `indices` gives the sparse pairs' u32 indices; the decoded element when
  // the values are the accumulator's).
  bool finite_values(const commit_in& c, const std::byte* p, std::size_t n, dtype type, const std::byte* indices,
                     server_actions& out) {
    const detail::float_bits b = detail::bits_of(type);
    std::size_t i = n;
    const unsigned k = for_parts(n, [&](unsigned part, std::size_t lo, std::size_t hi) noexcept {
      const std::size_t j = detail::first_non_finite(p + lo * b.bytes, hi - lo, b.bytes, b.mask);
      part_first_[part] = j == hi - lo ? n : lo + j;
    });
    for (unsigned q = 0; q < k && i == n; ++q) i = part_first_[q];
    if (i == n) return true;
    const bool decoded = p == reinterpret_cast<const std::byte*>(acc_.data());
    const std::uint64_t element =
        indices != nullptr ? ::ashl::compress::detail::load_le32(indices + 4 * i) : std::uint64_t{i};
    const std::string field = std::string(decoded ? "commit.decoded[" : "commit.payload[") + std::to_string(element) +
                              "]";
    refuse(out, c.worker, c.sequence, refusal::non_finite,
           make_error(errc::invalid_argument, field, detail::non_finite_value(p, i, b.bytes, b.mask),
                      "worker " + std::to_string(c.worker) + " sent a non-finite value (element " +
                          std::to_string(element) + " of server " + std::to_string(p_.shard) + "'s shard, " +
                          std::to_string(range().begin + element) + " of the model; commit " +
                          std::to_string(c.sequence) +
                          "); refused, the parameters unchanged (server allow_non_finite accepts it)"));
    return false;
  }

  bool refuse_payload(const commit_in& c, const status& s, server_actions& out) {
    refuse(out, c.worker, c.sequence, s.code() == errc::unsupported ? refusal::codec : refusal::payload, s);
    return false;
  }

  struct version_buffer {
    std::vector<float> values;
    std::uint64_t version = no_version;
    std::uint32_t readers = 0;
  };

  // Chunks of the dense apply: three of crc32c's 64 KiB streams (its fastest
  // path), and small enough to stay in a core's L2 cache between the add
  // and the CRC that reads it.
  static constexpr std::size_t apply_chunk_bytes = std::size_t{192} << 10;

  // A spare buffer no reply reads (pooled).
  version_buffer& spare() {
    for (version_buffer& b : held_)
      if (b.readers == 0) return b;
    held_.emplace_back();
    return held_.back();
  }

  // Before w_ changes in place: a version replies read moves to a spare
  // buffer's place (its storage stays with them) and w_ continues as a copy.
  void make_writable() {
    apply_pending();  // what waits came first
    w_crc_valid_ = false;
    ++w_changes_;
    if (w_readers_ == 0) return;
    version_buffer& b = spare();
    b.values.resize(w_.size());
    float* dst = b.values.data();
    const float* src = w_.data();
    for_parts(w_.size(), [&](unsigned, std::size_t lo, std::size_t hi) noexcept {
      if (hi > lo) std::memcpy(dst + lo, src + lo, (hi - lo) * sizeof(float));
    });
    retire_pinned(b);
    ++copies_for_readers_;
  }

  // w_'s storage (pinned) goes to b, b's (the new version) becomes w_.
  void retire_pinned(version_buffer& b) {
    std::swap(b.values, w_);
    b.version = w_pin_version_;
    b.readers = w_readers_;
    w_readers_ = 0;
  }

  // A dense model-delta commit's add, as apply_pending() keeps it.
  struct dense_add {
    std::span<const std::byte> payload;
    codec_id codec = codec_id::identity;
    dtype type = dtype::f32;
    std::uint64_t step = 0;
    std::uint32_t tensor = 0;
    float weight = 1.0f;
  };

  // c waits for apply_pending() (false: no slot free, or batching is off).
  bool defer_dense(const commit_in& c, double weight) {
    if (pending_n_ >= pending_.size()) return false;
    pending_[pending_n_++] = {c.payload, c.codec, c.type, c.step, c.tensor, static_cast<float>(weight)};
    ++w_changes_;
    pending_crc_ = pending_crc_ || (c.pull && !c.ack_only);
    w_crc_valid_ = false;
    return true;
  }

  // A dense model-delta commit (identity, fp16, bf16: element-wise) in one
  // pass of cache-sized chunks: w += s·v in place, or, while replies read w,
  // new = w + s·v into a spare buffer that then becomes w; with want_crc
  // the new version's CRC from the chunk just written. The same additions in
  // the same order as one decode_add of the whole payload (chunks are a
  // multiple of every SIMD width, so only the last chunk has a tail).
  // What waits (apply_pending) is added first.
  void apply_dense(const commit_in& c, double weight, bool want_crc) {
    apply_pending();
    const dense_add one{c.payload, c.codec, c.type, c.step, c.tensor, static_cast<float>(weight)};
    add_dense(std::span<const dense_add>(&one, 1), want_crc);
  }

  // The adds of several commits in one pass: each chunk gets every add, in
  // order, before the next chunk (the same decode_add per chunk as one
  // apply_dense per commit: the same bits).
  void add_dense(std::span<const dense_add> adds, bool want_crc) {
    const std::size_t n = w_.size();
    ++w_changes_;
    for ([[maybe_unused]] const dense_add& a : adds)
      ASHL_ASSERT(a.payload.size() % n == 0, "server_core: a dense payload of a fractional element size");
    const bool beside = w_readers_ > 0;
    version_buffer* b = beside ? &spare() : nullptr;
    if (b != nullptr) b->values.resize(n);
    float* dst = b != nullptr ? b->values.data() : w_.data();
    const float* src = w_.data();
    const std::size_t chunk = apply_chunk_bytes / sizeof(float);
    // One part per apply thread (one part without a pool); each part's
    // chunks start at its first element, a whole number of 64-byte lines.
    // The CRC is cut at the driver's checksum ranges (checksum_in_parts),
    // the add is not: its chunks stay whole multiples of every SIMD width.
    const unsigned parts = for_parts(n, [&](unsigned part, std::size_t lo, std::size_t hi) noexcept {
      crc_cursor crc = crc_open(part, lo, n);
      for (std::size_t at = lo; at < hi; at += chunk) {
        const std::size_t k = std::min(chunk, hi - at);
        if (beside) std::memcpy(dst + at, src + at, k * sizeof(float));
        for (const dense_add& a : adds) {
          const std::size_t per = a.payload.size() / n;
          const status s = compress::decode_add(a.codec, a.payload.subspan(at * per, k * per), {k, a.type},
                                                host_view<float>(dst + at, k), a.weight,
                                                compress::codec_context{p_.seed, a.step, a.tensor, {}});
          ASHL_ASSERT(s.ok(), "server_core: a validated payload failed to decode");
          (void)s;
        }
        if (want_crc) crc_feed(crc, dst, at, at + k);
      }
      if (want_crc) crc_close(crc, hi);
    });
    if (beside) publish_beside(*b);
    end_pass(want_crc, parts);
  }

  // A pass wrote the new version into b (beside the version replies read,
  // which b's storage takes): b's values become w_.
  void publish_beside(version_buffer& b) {
    retire_pinned(b);
    ++applied_beside_;
  }

  // The end of a pass that wrote a new version: with crc its CRC from the
  // `parts` pool parts' ranges the pass fed; without, the first pin reads it.
  void end_pass(bool crc, unsigned parts) noexcept {
    if (crc) {
      finish_crcs(parts);
      ++checksums_in_apply_;
    } else {
      w_crc_ = 0;
      w_crc_valid_ = false;
    }
  }

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
      crcs_wanted = c.pull && !c.ack_only;
      base = changes;
      landed = 0;
      done = 0;
      dead = false;
    }
  };

  // The largest bound of add_dense's chunks at or below x (n for x >= n):
  // each pool part's first element plus whole chunks, so the speculation's
  // decode_adds cover the same elements as one apply_dense's.
  [[nodiscard]] std::size_t grid_floor(std::size_t x) const noexcept {
    const std::size_t n = w_.size();
    if (x >= n) return n;
    const std::size_t block = part_block(n, parts_for(n));
    const std::size_t lo = x / block * block;
    const std::size_t chunk = apply_chunk_bytes / sizeof(float);
    return lo + (x - lo) / chunk * chunk;
  }

  // The speculation's add over [spec_.done, to) (to: a grid bound), chunk by
  // chunk on add_dense's grid, and, when a pull rides with the commit, its
  // checksum ranges' CRCs (each range's CRC continued from where the last
  // call left it).
  void speculate_to(std::size_t to) {
    speculation& sp = spec_;
    const std::size_t n = w_.size();
    const std::size_t block = part_block(n, parts_for(n));
    const std::size_t chunk = apply_chunk_bytes / sizeof(float);
    const std::size_t per_range = range_elements(n);
    const std::size_t per = sp.payload.size() / n;
    const compress::codec_context ctx{p_.seed, sp.step, sp.tensor, {}};
    float* dst = sp.values.data();
    while (sp.done < to) {
      const std::size_t at = sp.done;
      const std::size_t k = std::min({chunk, to - at, std::min(n, at / block * block + block) - at});
      std::memcpy(dst + at, w_.data() + at, k * sizeof(float));
      const status s = compress::decode_add(sp.codec, sp.payload.subspan(at * per, k * per), {k, sp.type},
                                            host_view<float>(dst + at, k), sp.weight, ctx);
      ASHL_ASSERT(s.ok(), "server_core: a checked part failed to decode");
      (void)s;
      for (std::size_t from = at; sp.crcs_wanted && from < at + k;) {
        const std::size_t j = from / per_range;
        const std::size_t b = std::min(at + k, (j + 1) * per_range);
        std::uint32_t& crc = sp.crcs[j];
        crc = wire::crc32c(std::as_bytes(std::span<const float>(dst + from, b - from)), from == j * per_range ? 0u : crc);
        from = b;
      }
      sp.done = at + k;
    }
  }

  // True when c is the commit of the live speculation, which ends here (the
  // buffer is free for the next commit's part 0, whatever commit() decides).
  bool claim_speculation(const commit_in& c) noexcept {
    if (spec_.dead || !spec_.owns(c)) return false;
    spec_.dead = true;
    return true;
  }

  // commit()'s apply of the claimed speculation's commit at `weight`: what
  // is left of the pass, then the swap (beside a pinned version when
  // replies read w_). False (nothing changed) when the parameters changed
  // under it or the policy weighs the commit otherwise.
  bool take_speculation(double weight) {
    speculation& sp = spec_;
    if (sp.base != w_changes_ || pending_n_ > 0 || sp.weight != static_cast<float>(weight) ||
        sp.crcs.size() != std::max<std::size_t>(checksum_parts_, 1)) {
      ++speculations_stale_;
      return false;
    }
    speculate_to(w_.size());
    ++w_changes_;
    if (w_readers_ > 0) {
      version_buffer& b = spare();
      std::swap(b.values, sp.values);  // b: the new version; sp.values: b's storage, for the next one
      publish_beside(b);
    } else {
      std::swap(w_, sp.values);
    }
    if (sp.crcs_wanted) {  // the ranges' CRCs came with the adds (a push's are not computed)
      if (range_crc_.size() != sp.crcs.size()) range_crc_.assign(sp.crcs.size(), 0u);
      std::copy(sp.crcs.begin(), sp.crcs.end(), range_crc_.begin());
    }
    end_pass(sp.crcs_wanted, 1);
    ++applied_as_landed_;
    return true;
  }

  // Adds weight x a validated payload into `into` (w_ or acc_): by parts
  // when a pool is in use and the codec is element-wise (a dense cast: each
  // part decodes its slice of the payload) or sparse pairs (each part adds
  // the pairs whose index falls in it); else one decode_add.
  void decode_or_die(codec_id id, dtype t, std::uint64_t step, std::uint32_t tensor, std::span<const std::byte> payload,
                     std::vector<float>& into, double weight) {
    const compress::codec_context ctx{p_.seed, step, tensor, {}};
    const std::size_t n = into.size();
    float* const base = into.data();
    const float scale = static_cast<float>(weight);
    if (parts_for(n) > 1) {
      const std::size_t dense = compress::dense_payload_bytes(id, {n, t});
      if (dense != 0 && dense == payload.size()) {
        const std::size_t per = payload.size() / n;
        for_parts(n, [&](unsigned, std::size_t lo, std::size_t hi) noexcept {
          if (hi == lo) return;
          const status s = compress::decode_add(id, payload.subspan(lo * per, (hi - lo) * per), {hi - lo, t},
                                                host_view<float>(base + lo, hi - lo), scale, ctx);
          ASHL_ASSERT(s.ok(), "server_core: a validated payload failed to decode");
          (void)s;
        });
        return;
      }
      if (compress::sparse_pairs(id)) {
        for_parts(n, [&](unsigned, std::size_t lo, std::size_t hi) noexcept {
          compress::add_pairs_in_range(payload, t, base, scale, lo, hi);
        });
        return;
      }
    }
    const status s = compress::decode_add(id, payload, {n, t}, host_view<float>(base, n), scale, ctx);
    ASHL_ASSERT(s.ok(), "server_core: a validated payload failed to decode");
    (void)s;
  }

  // The optimizer's step over acc_, by parts; with want_crc the new
  // version's CRC (and its checksum ranges') in the same pass, chunk by
  // chunk as apply_dense does (chunks of whole SIMD widths: the same bits).
  void step_parts(float scale, bool want_crc = false) {
    opt_.begin_step();  // one step, however many parts (Delayed Nesterov counts steps)
    const std::size_t n = w_.size();
    const std::size_t chunk = apply_chunk_bytes / sizeof(float);
    const unsigned parts = for_parts(n, [&](unsigned part, std::size_t lo, std::size_t hi) noexcept {
      if (!want_crc) {
        if (hi > lo) opt_.step(w_, acc_, scale, lo, hi);
        return;
      }
      crc_cursor crc = crc_open(part, lo, n);
      for (std::size_t at = lo; at < hi; at += chunk) {
        const std::size_t k = std::min(chunk, hi - at);
        opt_.step(w_, acc_, scale, at, at + k);
        crc_feed(crc, w_.data(), at, at + k);
      }
      crc_close(crc, hi);
    });
    end_pass(want_crc, parts);
  }

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

  [[nodiscard]] crc_cursor crc_open(unsigned part, std::size_t lo, std::size_t n) noexcept {
    const std::size_t per = range_elements(n);
    head_len_[part] = 0;
    return {part, lo, std::min(n, (lo / per + 1) * per), per, n, 0};
  }

  // Appends elements [from, to) of `data` (consecutive calls, in order).
  void crc_feed(crc_cursor& c, const float* data, std::size_t from, std::size_t to) noexcept {
    while (from < to) {
      const std::size_t b = std::min(to, c.end);
      c.crc = wire::crc32c(std::as_bytes(std::span<const float>(data + from, b - from)), c.crc);
      from = b;
      if (b == c.end) crc_close(c, b);
    }
  }

  // Ends the open segment at `at` (the pool part's end, or a range's).
  void crc_close(crc_cursor& c, std::size_t at) noexcept {
    if (at > c.seg) {
      const std::size_t j = c.seg / c.per;
      if (c.seg == j * c.per) {
        range_crc_[j] = c.crc;
      } else {
        head_crc_[c.part] = c.crc;
        head_len_[c.part] = at - c.seg;
        head_range_[c.part] = static_cast<std::uint32_t>(j);
      }
    }
    c.seg = at;
    c.end = std::min(c.n, at + c.per);
    c.crc = 0;
  }

  // Elements per checksum range: ceil(n / k) (n without ranges).
  [[nodiscard]] std::size_t range_elements(std::size_t n) const noexcept {
    const std::size_t k = checksum_parts_;
    return n == 0 ? 1 : (n + k - 1) / k;
  }

  // After a pass of `parts` pool parts: the heads appended to their ranges,
  // the version's CRC = the ranges' combined in order.
  void finish_crcs(unsigned parts) noexcept {
    if (range_crc_.empty()) range_crc_.assign(1, 0u);  // a core never given checksum_in_parts
    for (unsigned q = 1; q < parts; ++q)
      if (head_len_[q] > 0) {
        std::uint32_t& r = range_crc_[head_range_[q]];
        r = wire::crc32c_combine(r, head_crc_[q], head_len_[q] * sizeof(float));
      }
    const std::size_t n = w_.size();
    const std::size_t per = range_elements(n);
    std::uint32_t crc = n == 0 ? 0u : range_crc_[0];
    if (checksum_parts_ >= 2) {
      const wire::crc32c_combiner after_range(per * sizeof(float));
      const std::uint32_t last = checksum_parts_ - 1;
      for (std::uint32_t j = 1; j < last; ++j) crc = after_range(crc, range_crc_[j]);
      crc = wire::crc32c_combine(crc, range_crc_[last], (n - std::size_t{last} * per) * sizeof(float));
    }
    w_crc_ = crc;
    w_crc_valid_ = true;
  }

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
    drop_pull(w);
    policy_.on_evict({w, now}, sink_);
    finish(out);
  }

  void send_plan(worker_id w, server_actions& out) {
    out.plan(w, policy_.plan(w));
    ++stats_.plans_sent;
  }

  struct progress {
    std::size_t round = 0, released = 0;
  };

  // Acts on what the sink holds beyond `from`, in the one order: the round
  // (one step), then released pulls.
  progress settle(server_actions& out, progress from) {
    const auto round = sink_.round();
    if (round.size() > from.round) {
      const bool math = !timing_only();
      for (std::size_t k = from.round; k < round.size(); ++k) {
        const sync::weighted_commit& rc = round[k];
        ASHL_ASSERT(std::isfinite(rc.weight), "server_core: the policy gave a non-finite round weight");
        std::vector<float>& into = opt_.adds_deltas() ? w_ : acc_;
        if (math && opt_.adds_deltas()) make_writable();
        if (current_ != nullptr && rc.worker == current_->worker && rc.sequence == current_sequence_) {
          if (math) decode_or_die(current_->codec, current_->type, current_->step, current_->tensor, current_->payload,
                                  into, rc.weight);
          current_ = nullptr;  // consumed without being stored
        } else if (math) {
          const commit_store::entry* e = store_.find(rc.worker, rc.sequence);
          if (e == nullptr) {
            ++stats_.round_missing;
            continue;
          }
          decode_or_die(e->meta.codec, e->meta.type, e->meta.step, e->meta.tensor, store_.payload(*e), into,
                        rc.weight);
          store_.erase(rc.worker, rc.sequence);
        }
        ++stats_.commits_applied;
      }
      if (math && !opt_.adds_deltas()) {
        make_writable();
        step_parts(1.0f, sink_.released().size() > from.released);  // the round releases pulls: they read it
      }
      take_step(out);
    }
    const auto rel = sink_.released();
    for (std::size_t k = from.released; k < rel.size(); ++k) {
      const worker_id r = rel[k];
      if (r >= table_.size() || !table_[r].held) continue;  // nothing asked: nothing to answer
      table_[r].held = false;
      ++stats_.pulls_released;
      out.reply(r);
    }
    return {round.size(), rel.size()};
  }

  // Settles the event's outcomes; then the pull of `puller` (riding with a
  // commit, or alone); then the plans that changed (and the joiner's).
  void finish(server_actions& out, progress from = {}, worker_id joiner = no_worker, worker_id puller = no_worker,
              double now = 0.0) {
    from = settle(out, from);
    if (puller != no_worker && table_[puller].live) {
      if (table_[puller].held) {
        // Asked again while held: it stays held and is answered once, on release.
      } else {
        ++stats_.pulls;
        const sync::pull_action a = policy_.on_pull({puller, now}, sink_);
        if (a == sync::pull_action::serve) {
          from = settle(out, from);
          ++stats_.pulls_served;
          out.reply(puller);
        } else {
          table_[puller].held = true;
          ++stats_.pulls_held;
          from = settle(out, from);
        }
      }
    }
    if (sink_.every_plan_changed()) {
      for (worker_id w = 0; w < table_.size(); ++w)
        if (table_[w].live) send_plan(w, out);
    } else {
      for (worker_id w : sink_.plans_changed())
        if (w < table_.size() && table_[w].live) send_plan(w, out);
      if (joiner != no_worker && !sink_.plan_changed_for(joiner)) send_plan(joiner, out);
    }
    sink_.clear();
  }

  static void save_counters(state_writer& w, const counters& c) {
    put_fields(w, c, scalar_counter_fields());
    w.put<std::uint64_t>(c.refused.size());
    for (std::uint64_t v : c.refused) w.put(v);
  }
  static status load_counters(state_reader& r, counters& c, std::uint32_t version) {
    ASHL_TRY(get_fields(r, c, "server_core.counters", scalar_counter_fields()));
    std::uint64_t reasons = 11;  // version 1: the reasons up to refusal::measurement
    if (version >= 2) {
      ASHL_TRY(r.get(reasons, "server_core.counters.refused.count"));
      if (reasons > refusal_count)
        return make_error(errc::malformed, "server_core.counters.refused.count", reasons,
                          "this build knows " + std::to_string(refusal_count) + " refusal reasons");
    }
    for (std::uint64_t k = 0; k < reasons; ++k) ASHL_TRY(r.get(c.refused[k], "server_core.counters.refused"));
    return {};
  }

  server_core_params p_;
  Policy policy_;
  optimizer opt_;
  std::vector<float> w_;    // this shard's parameters
  std::vector<float> acc_;  // sgd: the aggregate one step applies; model deltas: scratch of decode checks
  std::vector<worker_entry> table_;
  static constexpr std::uint64_t no_version = ~std::uint64_t{0};
  std::vector<std::uint64_t> served_at_;  // per worker: the version of its last reply (serve_staleness)
  commit_store store_;
  sync::outcome_sink sink_;
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
};

}  // namespace ps
ASHL_NAMESPACE_END
