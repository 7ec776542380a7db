// ashl/rules/server_core_vocabulary.hpp — what goes into a server_core and
// what comes out of it: its parameters (server_core_params), one decoded
// commit (commit_in, rules/commit_in.hpp), the driver's finite-values check run in its CRC pass
// (dense_value_check), the actions a driver must send after an event
// (server_actions: pull replies, plans, errors, the data ledger's leases), the reasons a message is
// refused (refusal) and the counters every event updates.
//
//   ashl::ps::server_actions out(workers);         // reused across events
//   core.commit(ashl::ps::commit_in{.worker = 2, .sequence = 7, .payload = bytes, .pull = true}, now, out);
//   for (const auto& e : out.errors()) log(e.worker, ashl::ps::to_string(e.reason), e.text);
//
// The rules that read and write them are rules/server_core.hpp's;
// docs/design.md "Server core"; docs/ps.md.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/registry.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/enum_table.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>
#include <ashl/rules/commit_in.hpp>
#include <ashl/rules/data_ledger.hpp>
#include <ashl/rules/finite.hpp>
#include <ashl/rules/optimizer.hpp>
#include <ashl/rules/reply_encoder.hpp>
#include <ashl/rules/shards.hpp>
#include <ashl/sync/events.hpp>
#include <ashl/wire/ids.hpp>
#include <ashl/wire/message.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
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
  max_workers = 13,    // a join of a rank at or past server_core_params.max_workers (docs/elastic.md §2.3)
};
inline constexpr auto refusal_table =
    make_enum_table<refusal>("unknown_worker", "not_live", "incarnation", "sequence", "element_count", "dtype", "codec",
                             "payload", "limits", "store_full", "measurement", "non_finite", "samples", "max_workers");
static_assert(refusal_table.name(refusal::max_workers) == "max_workers", "refusal_table ends where refusal does");
inline constexpr std::size_t refusal_count = refusal_table.size();

constexpr std::string_view to_string(refusal r) noexcept { return refusal_table.name(r); }

// The largest commit payload a server takes for a shard of n elements: 8
// bytes an element (sparse pairs of f32 at ratio 1, twice a dense f32
// commit) and a small header.
constexpr std::uint64_t max_commit_payload_bytes(std::uint64_t n) noexcept {
  return n > (~std::uint64_t{0} - 64) / 8 ? ~std::uint64_t{0} : 8 * n + 64;
}

// The automatic store bound (server_core_params.store_bytes = 0): one
// commit of the largest payload per worker the job may have (the server
// core passes max_workers: a rank that joins later buffers as the initial
// ones do). Every buffering policy holds at
// most one commit per worker for a round (BSP, DLB, semi-async's barrier;
// coded BSP at most two dense ones, which the 8-byte bound covers), and a
// policy that never buffers needs none: the store grows only as commits are
// buffered, so the bound costs no memory until it is used. Saturates.
constexpr std::uint64_t automatic_store_bytes(std::uint64_t shard_elements, std::uint32_t workers) noexcept {
  const std::uint64_t one = max_commit_payload_bytes(shard_elements);
  const std::uint64_t m = workers == 0 ? 1 : workers;
  return one > ~std::uint64_t{0} / m ? ~std::uint64_t{0} : one * m;
}

// When server_core::check_message computes a whole dense commit's apply
// in its check pass (server_core_params::fuse_checks; docs/ps.md "The
// check and the apply in one pass").
enum class fused_apply : std::uint8_t {
  off = 0,     // the check pass reads only; the apply is a pass of its own
  beside = 1,  // only where the apply would write beside a version replies read anyway
  always = 2,  // also where it would run in place (measured slower: docs/perf/ps-passes.md)
};

struct server_core_params {
  shard_layout layout{};          // elements() == 0: timing only (payloads ignored, nothing decoded)
  std::uint32_t shard = 0;        // the range this core holds (one server of S)
  std::uint32_t workers = 0;      // ids 0..workers-1 live from creation, incarnation 0
  // The job's maximum (docs/elastic.md §2.1): ranks 0..max_workers-1 may
  // ever join; a join of a larger rank is refused (refusal::max_workers).
  // 0: the same as workers (today's fixed set). At least workers, at most
  // ps::max_workers; create() writes the resolved value back, so params()
  // and save() hold it.
  std::uint32_t max_workers = 0;
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
  // server_core::check_message: whether the CRC check and finite scan of
  // a whole dense model-delta commit also compute its add, new = w + s·v,
  // into a spare version in the same chunked pass (published if the policy
  // applies the commit at once at the weight guessed, discarded otherwise;
  // a bad commit changes nothing). Only a driver that checks wire messages
  // through check_message uses it (ps::server); the simulator's commits
  // are never on the wire, and its results are the same bits either way.
  // Not part of save().
  fused_apply fuse_checks = fused_apply::beside;
  // How pull replies are compressed (rules/reply_encoder.hpp): identity
  // sends every reply dense; a codec sends each worker what its view of
  // the parameters lacks, with error feedback. Not part of save().
  reply_compression replies{};
  // The data ledger (rules/data_ledger.hpp, docs/elastic.md §3): samples =
  // 0 (the default) runs none, and the core behaves and saves as before it
  // had one. Only shard 0 runs it (the plan authority, §3.3): create()
  // refuses it on another shard. Part of save() (section LDGR, PSCR 4).
  ledger_params ledger{};
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
  // Send these leases of the data ledger (granted, or resent after a
  // rejoin), in this order, each to its worker with the ledger's samples and
  // shuffle_seed (server_core::params().ledger). Empty without a ledger.
  [[nodiscard]] std::span<const ledger_lease> leases() const noexcept { return leases_.leases(); }
  // Optimizer steps the events took (the parameters changed when > 0).
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  [[nodiscard]] bool empty() const noexcept {
    return replies_.empty() && plans_.empty() && n_errors_ == 0 && steps_ == 0 && leases_.empty();
  }
  void clear() noexcept {
    replies_.clear();
    plans_.clear();
    n_errors_ = 0;
    steps_ = 0;
    leases_.clear();
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
  // The ledger writes its leases here; the core first makes room for the
  // most one event can grant (a no-op once this object has it).
  ledger_sink& lease_sink(std::size_t room) {
    leases_.reserve(room);
    return leases_;
  }

 private:
  std::vector<worker_id> replies_;
  std::vector<plan_out> plans_;
  std::vector<error_out> errors_;
  std::size_t n_errors_ = 0;
  std::uint64_t steps_ = 0;
  ledger_sink leases_;
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

}  // namespace ps
ASHL_NAMESPACE_END
