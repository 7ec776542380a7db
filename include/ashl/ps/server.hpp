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
#include <ashl/ps/incarnation.hpp>
#include <ashl/ps/identity.hpp>
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
#include <span>
#include <string>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

struct server_params {
  server_core_params core{};
  // What a worker whose plan compresses (ratio < 1) commits with; the codec
  // goes to the worker in the plan_update header.
  codec_id compression = codec_id::topk;
  // Its options (core/plan.hpp; 0: the codec's default), sent in each
  // compressing plan whose policy left them 0 (ps::plan_with_codec_options):
  // {.bits = 4, .block = 128} with codec_id::block is "block4:128".
  codec_options compression_options{};
  // > 0: print one progress line to stderr every progress_seconds.
  double progress_seconds = 0.0;
  // The longest single wait() of run(); bounds how late a stop is noticed.
  std::chrono::milliseconds wait_slice{50};
  // run() returns by itself (docs/ps.md "When a server ends"): once every
  // rank of the job has left explicitly (a leave message of its current
  // process), or once no worker has been connected for no_worker_grace (from
  // creation, or from the moment the last one went: left, failed or was
  // evicted). An evicted rank may rejoin within the grace and the server goes
  // on. false: only `stop` ends run().
  bool stop_when_all_left = true;
  // A worker the server has heard nothing from for this long while it does
  // not hold the worker's pull (a hung or stopped process whose connection
  // stays up) is evicted and its connection closed; 0: never. Keep it below
  // the workers' own worker_params.timeout, so a barrier that waits for a
  // silent worker is released (by the eviction) before the others give up.
  std::chrono::milliseconds worker_timeout{20000};
  // stop_when_all_left: run() ends once no worker has been connected this
  // long (> 0). Longer than worker_timeout, so a lone worker evicted for
  // silence (a pause, a long step) can reconnect and the job goes on.
  std::chrono::milliseconds no_worker_grace{60000};
  // Checkpoints (docs/checkpoints.md): with a directory, the state of
  // server_core (parameters, optimizer, clocks, exactly-once table, buffered
  // commits, policy, planner, plans) is written to
  // checkpoint_file(checkpoint_dir, shard) every checkpoint_every_seconds
  // and/or every checkpoint_every_commits applied commits (0: not by that
  // measure), and once more when run() ends.
  std::string checkpoint_dir;
  double checkpoint_every_seconds = 0.0;
  std::uint64_t checkpoint_every_commits = 0;
  // What writes a checkpoint's file, on the server's writer thread (the
  // periodic ones) or its own (the final one): empty is write_checkpoint.
  // Another store, or a test's stalled disk (test/ps/checkpoint_writer.cpp).
  checkpoint_writer::write_function checkpoint_write;
  // create() restores the checkpoint in checkpoint_dir when there is one (a
  // corrupt, truncated or foreign one is an error, never half-loaded); every
  // worker it held is evicted, to rejoin (ps::worker_params::reconnect).
  // A checkpoint of another job (job id, elements, workers, policy or codec
  // differ from this server's) is refused naming the field and both values.
  bool restore = false;
  // Global limits (docs/ps.md, "Limits"): what all connections together may
  // make the server hold. Each refusal is counted and answered with an error
  // naming the limit and its value.
  // Bytes of receive buffers (large messages land there) and of the
  // stagings of commits in parts (one shard-sized per rank that sends them)
  // over all connections; 0: (workers + 1) × the largest message this
  // shard takes (about twice the shard's dense size: every rank's staging
  // fits beside a large message).
  std::uint64_t max_receive_bytes = 0;
  // Parameter versions pinned by pull replies in flight (each version's
  // storage stays with its replies; a change is made beside it); a reply
  // that would pin one more is refused. 0: 2 × workers + 2 (a worker has one
  // reply in flight at a time).
  std::uint32_t max_snapshots = 0;
  // A dense pull reply larger than this goes out in parts of about this many
  // bytes (wire flag `part`, docs/wire-format.md), each checksummed on its
  // own and sent as soon as its CRC is known, so the worker receives and
  // checks part i while the server checksums part i + 1, and UCX's
  // rendezvous handshakes of the parts overlap. The parts' CRCs are
  // computed once per version. 0: one message (the default; see
  // docs/perf/ps-ucx.md "Chunked pipelining"); otherwise >= 4096.
  std::uint64_t reply_part_bytes = 0;
  // A join whose incarnation is ahead of incarnation_now() (ps/incarnation.hpp:
  // nanoseconds since the Unix epoch, a time-based incarnation now) by more than
  // this is refused, so a rank cannot be taken with an incarnation no
  // restart could ever pass (UINT64_MAX); 0 s: no bound.
  std::chrono::seconds max_incarnation_ahead{86400};
  // The job (ps/identity.hpp, make_job_id): written into checkpoints and
  // checked against each worker's join; a join of another job (both ids
  // non-zero and different) is refused naming both. 0: not checked.
  std::uint64_t job = 0;
  // The consistency policy's name (make_policy's), written into checkpoints
  // so a restore under another policy is refused by name.
  std::string policy;
  // Threads that apply a commit (docs/ps.md "Apply threads"): 1,
  // the server's thread alone; N in [2, 64], it and N - 1 threads started at
  // create(), each applying its own contiguous part of the shard (the dense
  // add, a sparse payload's pairs in its part, the optimizer step, the
  // reply's copy and CRC). The parameters are bit-identical for any N; a
  // shard below 32 Ki elements is applied by one thread anyway.
  std::uint32_t apply_threads = 1;
  // Commits applied in one pass (docs/ps.md "Batched applies"): dense
  // model-delta commits that one pass of the transport's
  // progress delivered into receive buffers (or a commit in parts' staging)
  // wait, up to this many and one per worker, and are then added in a
  // single pass over the parameters, each cache-sized chunk taking every
  // commit's add in arrival order: the parameters are bit-identical to
  // applying each as it came, with one read and write of the shard instead
  // of one per commit. The policy still decides each commit as it comes;
  // the replies and acknowledgements of the batch leave once it is applied,
  // at the end of the pass (or earlier: before any other message, a second
  // commit from a worker in the batch, a plan or error to send, or a full
  // batch). 1: every commit is applied as it arrives (the default);
  // 2..64: at most this many wait.
  std::uint32_t apply_batch = 1;
  // Applies as parts land (docs/ps.md "Commits in parts"): while
  // a commit in parts (worker_params.commit_part_bytes) arrives,
  // each part that passed its checks is added beside the parameters into a
  // buffer of the shard's size (server_core::speculate), so when the last
  // part passed, what is left of the apply is that part's add and a swap.
  // The parameters change only then, exactly as if the commit had been
  // applied whole (the same bits); a commit whose later part is bad or never
  // comes changes nothing. Something else changing the parameters meanwhile
  // (another worker's commit) stops it, and the commit is applied whole as
  // before. false (the default: no gain measured on a 2-vCPU host, where
  // the server's thread receives the parts too): stage the parts and apply
  // the commit whole at its last part (no buffer).
  bool apply_parts_as_they_land = false;
};

// Messages refused before they reached server_core.
enum class wire_refusal : std::uint8_t {
  malformed = 0,      // wire::decode refused it (truncated, bad magic/version/CRC/field)
  oversized = 1,      // a data part above the bound: refused before it was received
  unbound = 2,        // a message other than join from a connection that has not joined
  rank = 3,           // header.rank is not the rank this connection joined as, or is out of range
  rank_taken = 4,     // a join for a rank another live connection holds
  element_count = 5,  // a pull_request for another shard size (the worker's model differs)
  unexpected = 6,     // a kind a server does not take (pull_reply, plan_update)
  receive_budget = 7, // a large message, or a rank's first staging, past server_params.max_receive_bytes: refused before it was received
  incarnation = 8,    // a join past server_params.max_incarnation_ahead
  job = 9,            // a join of another job (join.job differs from server_params.job)
  stale = 10,         // a message from a connection whose rank a later process (larger incarnation) took
  commit_part = 11,   // a part of a commit in parts out of order, repeated, of another split or commit, or past the window
};
inline constexpr std::size_t wire_refusal_count = 12;

constexpr std::string_view to_string(wire_refusal r) noexcept {
  switch (r) {
    case wire_refusal::malformed: return "malformed";
    case wire_refusal::oversized: return "oversized";
    case wire_refusal::unbound: return "unbound";
    case wire_refusal::rank: return "rank";
    case wire_refusal::rank_taken: return "rank_taken";
    case wire_refusal::element_count: return "element_count";
    case wire_refusal::unexpected: return "unexpected";
    case wire_refusal::receive_budget: return "receive_budget";
    case wire_refusal::incarnation: return "incarnation";
    case wire_refusal::job: return "job";
    case wire_refusal::stale: return "stale";
    case wire_refusal::commit_part: return "commit_part";
  }
  return "?";
}

// Why server::run() returned.
enum class server_end : std::uint8_t {
  running = 0,    // it has not returned
  stopped = 1,    // the caller's stop flag
  all_left = 2,   // every rank left explicitly
  no_worker = 3,  // no worker connected for server_params.no_worker_grace
};

constexpr std::string_view to_string(server_end e) noexcept {
  switch (e) {
    case server_end::running: return "running";
    case server_end::stopped: return "stopped";
    case server_end::all_left: return "all_left";
    case server_end::no_worker: return "no_worker";
  }
  return "?";
}

// Everything a server counts; readable from the program at any time.
struct server_telemetry {
  counters core{};                          // server_core: applied, refused by reason, pulls, plans, ...
  transport::transport_counters transport{};
  std::array<std::uint64_t, wire_refusal_count> wire_refused{};
  std::uint64_t messages_in = 0, messages_out = 0;
  std::uint64_t bytes_in = 0, bytes_out = 0;  // header + data, this server's messages
  std::uint64_t pull_replies = 0, plans = 0, errors_sent = 0;
  std::uint64_t acks = 0;                   // of the pull replies, header-only acknowledgements of pushes
  std::uint64_t reply_parts = 0;            // messages of pull replies sent in parts (server_params.reply_part_bytes)
  // Replies in parts whose parts the server checksummed in a pass of its
  // own: 0 while server_core gives the parts' CRCs with the version.
  std::uint64_t part_crc_passes = 0;
  std::uint64_t commit_parts = 0;           // parts of commits in parts that passed (worker_params.commit_part_bytes)
  std::uint64_t commits_in_parts = 0;       // commits whose parts all passed, handed to server_core whole
  std::uint64_t commit_parts_dropped = 0;   // parts of a commit a refused part (or a lost connection) discarded
  std::uint64_t staging_retired = 0;        // rejoins that retired a staging old receives still wrote into
  std::uint64_t batched_applies = 0;        // passes that added several waiting commits (server_params.apply_batch)
  std::uint64_t batched_commits = 0;        // the commits those passes added
  // server_params.apply_parts_as_they_land: commits in parts whose adds
  // began beside the parameters as their parts landed; of those, the ones
  // something else overtook (applied whole after all); commits applied from
  // them (the last part's add and a swap).
  std::uint64_t speculations = 0, speculations_stale = 0, applied_as_landed = 0;
  std::uint64_t worker_errors = 0;          // error messages workers sent us
  std::uint64_t snapshots = 0;              // versions pulled (each pinned by its replies, checksummed once)
  std::uint64_t applied_beside = 0;         // dense applies made beside a version replies still read
  std::uint64_t copies_for_readers = 0;     // other changes that copied such a version first
  std::uint64_t unsendable = 0;             // plans or errors the wire refused to encode (a defect; the first is printed)
  std::uint64_t peers_failed = 0;           // connections that failed (their worker was evicted)
  std::uint64_t evicted_silent = 0;         // workers evicted by server_params.worker_timeout
  std::uint64_t replies_refused = 0;        // pull replies past server_params.max_snapshots
  std::uint64_t receive_bytes = 0;          // receive buffers now (all connections; max_receive_bytes)
  std::uint64_t receive_bytes_lent = 0;     // of those, lent to receives in flight
  std::uint64_t staging_bytes = 0;          // stagings of commits in parts; with receive_bytes, within max_receive_bytes
  // Receives whose sender's connection was gone and that the transport
  // reclaimed (ucx_params::receive_reclaim_timeout): their buffers left the
  // budget (counted no more in receive_bytes_lent) and are kept aside,
  // never reused (the engine may hold them), at most max_receive_bytes.
  std::uint64_t receives_reclaimed = 0;     // so far
  std::uint64_t reclaimed_bytes = 0;        // kept aside now (freed when the engine lets go, or with the server)
  std::uint64_t receives_not_reclaimed = 0; // stuck ones left lent: past the aside bound, or a staging's slice
  std::uint64_t checkpoints = 0, checkpoint_failures = 0;
  double checkpoint_seconds = 0.0;          // all of it: serialising (loop) + writing (writer thread: write, fsync, rename)
  double checkpoint_loop_seconds = 0.0;     // of that, the event loop's part (serialising, handing over)
  std::uint64_t checkpoint_bytes = 0;       // the last one's state
  std::uint64_t checkpoints_deferred = 0;   // due while the previous write still ran (written once it ended)
  std::uint64_t restored_version = 0;       // the version restored at creation (0: none)
  double seconds = 0.0;                     // since creation
  double wait_seconds = 0.0;                // in transport.wait (idle)

  [[nodiscard]] std::uint64_t wire_refused_total() const noexcept {
    std::uint64_t t = 0;
    for (auto r : wire_refused) t += r;
    return t;
  }
  [[nodiscard]] std::uint64_t wire_refused_for(wire_refusal r) const noexcept {
    return wire_refused[static_cast<std::size_t>(r)];
  }

  // The one list of these counters (core/fields.hpp): the Python binding's
  // dicts are read off it, and fields_cover<>() proves none is missing.
  static constexpr auto fields() {
    return std::tuple{
        field{"core", &server_telemetry::core},
        field{"transport", &server_telemetry::transport},
        field{"wire_refused_by_reason", &server_telemetry::wire_refused},
        field{"messages_in", &server_telemetry::messages_in},
        field{"messages_out", &server_telemetry::messages_out},
        field{"bytes_in", &server_telemetry::bytes_in},
        field{"bytes_out", &server_telemetry::bytes_out},
        field{"pull_replies", &server_telemetry::pull_replies},
        field{"acks", &server_telemetry::acks},
        field{"reply_parts", &server_telemetry::reply_parts},
        field{"part_crc_passes", &server_telemetry::part_crc_passes},
        field{"commit_parts", &server_telemetry::commit_parts},
        field{"commits_in_parts", &server_telemetry::commits_in_parts},
        field{"commit_parts_dropped", &server_telemetry::commit_parts_dropped},
        field{"staging_retired", &server_telemetry::staging_retired},
        field{"batched_applies", &server_telemetry::batched_applies},
        field{"batched_commits", &server_telemetry::batched_commits},
        field{"speculations", &server_telemetry::speculations},
        field{"speculations_stale", &server_telemetry::speculations_stale},
        field{"applied_as_landed", &server_telemetry::applied_as_landed},
        field{"plans", &server_telemetry::plans},
        field{"errors_sent", &server_telemetry::errors_sent},
        field{"worker_errors", &server_telemetry::worker_errors},
        field{"snapshots", &server_telemetry::snapshots},
        field{"applied_beside", &server_telemetry::applied_beside},
        field{"copies_for_readers", &server_telemetry::copies_for_readers},
        field{"unsendable", &server_telemetry::unsendable},
        field{"peers_failed", &server_telemetry::peers_failed},
        field{"evicted_silent", &server_telemetry::evicted_silent},
        field{"replies_refused", &server_telemetry::replies_refused},
        field{"receive_bytes", &server_telemetry::receive_bytes},
        field{"receive_bytes_lent", &server_telemetry::receive_bytes_lent},
        field{"staging_bytes", &server_telemetry::staging_bytes},
        field{"receives_reclaimed", &server_telemetry::receives_reclaimed},
        field{"reclaimed_bytes", &server_telemetry::reclaimed_bytes},
        field{"receives_not_reclaimed", &server_telemetry::receives_not_reclaimed},
        field{"checkpoints", &server_telemetry::checkpoints},
        field{"checkpoint_failures", &server_telemetry::checkpoint_failures},
        field{"checkpoint_seconds", &server_telemetry::checkpoint_seconds},
        field{"checkpoint_loop_seconds", &server_telemetry::checkpoint_loop_seconds},
        field{"checkpoint_bytes", &server_telemetry::checkpoint_bytes},
        field{"checkpoints_deferred", &server_telemetry::checkpoints_deferred},
        field{"restored_version", &server_telemetry::restored_version},
        field{"seconds", &server_telemetry::seconds},
        field{"wait_seconds", &server_telemetry::wait_seconds}};
  }
};
static_assert(fields_cover<server_telemetry>(), "server_telemetry::fields() must list every counter");


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

}  // namespace detail

template <transport::transport Transport, sync::consistency_policy Policy = sync::any_policy>
class server {
 public:
  using core_type = server_core<Policy>;
  static constexpr std::uint32_t max_apply_batch = 64;  // server_params.apply_batch

  static result<server> create(server_params p, Policy policy, Transport t, std::span<const float> initial = {}) {
    if (!(p.progress_seconds >= 0.0))
      return invalid_argument("server.progress_seconds", p.progress_seconds, "must be >= 0");
    ASHL_TRY(check_codec_options(p.compression, p.compression_options, "server.compression_options."));
    // The largest data part a worker may send this shard: any codec's
    // payload for its elements is below 8 bytes per element (sparse pairs at
    // ratio 1) plus a small header.
    const std::uint64_t n = p.core.layout.range(p.core.shard).size();
    p.core.limits.max_payload_bytes =
        std::min<std::uint64_t>(p.core.limits.max_payload_bytes, 8 * n + 4096 + wire::measurements_body::bytes_for(
                                                                                  p.core.limits.max_measurements));
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
    if (p.max_receive_bytes == 0) {
      const std::uint64_t k = std::uint64_t{p.core.workers} + 1, one = p.core.limits.max_payload_bytes;
      p.max_receive_bytes = one > ~std::uint64_t{0} / k ? ~std::uint64_t{0} : k * one;
    }
    if (p.max_snapshots == 0) p.max_snapshots = 2 * std::max<std::uint32_t>(p.core.workers, 1) + 2;
    if (p.reply_part_bytes != 0 && p.reply_part_bytes < 4096)
      return invalid_argument("server.reply_part_bytes", p.reply_part_bytes, "must be 0 (one message) or >= 4096");
    if (p.no_worker_grace.count() <= 0)
      return invalid_argument("server.no_worker_grace_ms", p.no_worker_grace.count(), "must be > 0");
    if (p.policy.size() > max_policy_name)
      return invalid_argument("server.policy", p.policy, "longer than " + std::to_string(max_policy_name) + " bytes");
    ASHL_TRY(apply_pool::check_threads(p.apply_threads, "server.apply_threads"));
    if (p.apply_batch < 1 || p.apply_batch > max_apply_batch)
      return invalid_argument("server.apply_batch", p.apply_batch,
                              "must be in 1.." + std::to_string(max_apply_batch) + " (1: each commit as it arrives)");
    auto core = core_type::create(p.core, std::move(policy), initial);
    if (!core) return core.error();
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
        if (core->params().workers != p.core.workers || core->params().layout.elements() != p.core.layout.elements())
          return make_error(errc::invalid_argument, "checkpoint.state.workers", core->params().workers,
                            "\"" + file + "\": the saved state disagrees with its identity section");
        // Every connection died with the old process: its workers rejoin.
        server_actions ignored(p.core.workers);
        for (worker_id w = 0; w < p.core.workers; ++w) core->evict(w, 0.0, ignored);
        restored = std::max<std::uint64_t>(core->version(), 1);
      }
    }
    server srv(std::move(p), std::move(*core), std::move(t));
    srv.writer_ = std::move(writer);
    srv.apply_pool_ = std::move(pool);
    srv.tel_.restored_version = restored;
    srv.applied_at_checkpoint_ = srv.core_.stats().commits_applied;
    return srv;
  }

  server(server&&) noexcept = default;
  server& operator=(server&&) noexcept = default;

  // One pass: the transport's progress (every message handled, replies sent).
  std::size_t poll() {
    handler h{this};
    const std::size_t n = t_.progress(h);
    end_batch(clock_.now());  // what the pass delivered is applied and answered before the pass ends
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
  status checkpoint() {
    if (p_.checkpoint_dir.empty())
      return invalid_argument("server.checkpoint_dir", "", "is empty: no checkpoints");
    const checkpoint_meta meta = serialise_checkpoint();
    return writer_->write_now(meta);
  }

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
    core_.metric(m, value, std::min(clock_.at(measured_at), now), out_);
    flush(clock_.now());
  }

  // Drains the core (buffered commits applied, held pulls released) and sends
  // what that produced: at shutdown, before a final checkpoint.
  void drain() {
    end_batch(clock_.now());
    core_.drain(out_);
    flush(clock_.now());
  }

  [[nodiscard]] const core_type& core() const noexcept { return core_; }
  [[nodiscard]] std::span<const float> parameters() const noexcept { return core_.parameters(); }
  [[nodiscard]] Transport& transport() noexcept { return t_; }
  [[nodiscard]] const server_params& params() const noexcept { return p_; }
  [[nodiscard]] std::uint32_t workers_bound() const noexcept { return bound_; }
  // The version restored from a checkpoint at creation; 0 when none was.
  [[nodiscard]] std::uint64_t restored_version() const noexcept { return tel_.restored_version; }
  [[nodiscard]] bool any_joined() const noexcept { return joined_count_ > 0; }
  // Every rank of the job left explicitly (its current process sent leave
  // and did not join again); an evicted rank has not left.
  [[nodiscard]] bool all_left() const noexcept { return left_count_ == p_.core.workers; }
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
    s.applied_beside = core_.applied_beside();
    s.copies_for_readers = core_.copies_for_readers();
    s.batched_applies = core_.batched_passes();
    s.batched_commits = core_.batched_commits();
    s.speculations = core_.speculations();
    s.speculations_stale = core_.speculations_stale();
    s.applied_as_landed = core_.applied_as_landed();
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

  // The job a checkpoint belongs to, before server_core's state (section
  // "PSID", docs/checkpoints.md "The state"): a restore checks it first, so
  // another job's checkpoint is refused by name before anything is loaded.
  void save_identity(state_writer& w) const {
    w.tag("PSID", 1);
    w.put(p_.job);
    w.put(p_.core.layout.elements());
    w.put(p_.core.workers);
    w.put(static_cast<std::uint8_t>(p_.compression));
    w.put_string(p_.policy);
  }

  static status check_identity(state_reader& in, const server_params& p) {
    if (auto s = in.tag("PSID", 1); !s)
      return status(s.code(), s.message() + " (not a checkpoint of this build's servers: no job identity)");
    std::uint64_t job = 0, elements = 0;
    std::uint32_t workers = 0;
    std::uint8_t codec = 0;
    std::string policy;
    ASHL_TRY(in.get(job, "checkpoint.job"));
    ASHL_TRY(in.get(elements, "checkpoint.elements"));
    ASHL_TRY(in.get(workers, "checkpoint.workers"));
    ASHL_TRY(in.get(codec, "checkpoint.codec"));
    ASHL_TRY(in.get_string(policy, "checkpoint.policy"));
    const std::string other = " (a checkpoint of another job is never restored)";
    if (elements != p.core.layout.elements())
      return make_error(errc::invalid_argument, "checkpoint.elements", elements,
                        "this server's model has " + std::to_string(p.core.layout.elements()) + " elements" + other);
    if (workers != p.core.workers)
      return make_error(errc::invalid_argument, "checkpoint.workers", workers,
                        "this server's job has " + std::to_string(p.core.workers) + " workers" + other);
    if (policy != p.policy)
      return make_error(errc::invalid_argument, "checkpoint.policy", policy,
                        "this server runs \"" + p.policy + "\"" + other);
    if (codec != static_cast<std::uint8_t>(p.compression)) {
      const std::string saved = codec < codec_id_count ? std::string(to_string(static_cast<codec_id>(codec)))
                                                       : std::to_string(codec);
      return make_error(errc::invalid_argument, "checkpoint.codec", saved,
                        "this server compresses with " + std::string(to_string(p.compression)) + other);
    }
    // Last: the job id derives from the shape checked above, so what is
    // left to differ here is the job's name (or the number of servers).
    if (job != p.job)
      return make_error(errc::invalid_argument, "checkpoint.job", job_id_text(job),
                        "this server's job is " + job_id_text(p.job) + other);
    return {};
  }

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
      : p_(std::move(p)), core_(std::move(core)), out_(p_.core.workers), t_(std::move(t)) {
    rank_peer_.assign(p_.core.workers, transport::no_peer);
    cparts_.resize(p_.core.workers);
    last_heard_.assign(p_.core.workers, 0.0);
    joined_once_.assign(p_.core.workers, 0);
    left_.assign(p_.core.workers, 0);
    ack_only_.assign(p_.core.workers, 0);
    slots_.reserve(4 * std::size_t{p_.core.workers} + 8);
    free_slots_.reserve(4 * std::size_t{p_.core.workers} + 8);
    rx_.reserve(2 * std::size_t{p_.core.workers} + 2);
    batch_workers_.reserve(p_.apply_batch);
    batch_rx_.reserve(p_.apply_batch);
    next_progress_ = p_.progress_seconds;
  }

  // ------------------------------------------------------------- receiving

  std::span<std::byte> on_receive_buffer(transport::peer_id p, std::span<const std::byte> head, std::size_t n) {
    if (n > p_.core.limits.max_payload_bytes || head.size() != wire::header_bytes) {
      refuse_wire(wire_refusal::oversized);
      send_error(p, errc::out_of_range, 0,
                 "message.data_bytes = " + std::to_string(n) + ": exceeds this server's bound of " +
                     std::to_string(p_.core.limits.max_payload_bytes) + " bytes (not received)");
      return {};
    }
    if (peer(p).rank == no_rank) {  // a join is small: nothing large before it
      refuse_wire(wire_refusal::unbound);
      send_error(p, errc::invalid_argument, 0,
                 "message.data_bytes = " + std::to_string(n) + ": this connection has not joined (not received)");
      return {};
    }
    // A part of a commit in parts lands in its rank's staging buffer at
    // the offset its (unchecked) header names, when it may (place_part);
    // anything else, to be refused by name once decoded, in a pooled buffer.
    if (const wire::peeked_part pp = wire::peek_part(head); pp.valid() && pp.kind == wire::message_kind::commit) {
      // The rank's last commit may wait in the batch, read from this
      // staging: applied before anything lands there (a worker sends its
      // next commit only after the reply, which waits for the batch, so
      // only a client that does not wait gets here).
      if (in_batch(peer(p).rank)) apply_held();
      commit_parts_in& cs = cparts_[peer(p).rank];
      const part_place at = place_part(cs, pp, n);
      if (!at.region.empty()) return at.region;
      if (at.drop) {  // the rest of a commit a refused part discarded: not received, not answered again
        ++tel_.commit_parts_dropped;
        return {};
      }
      if (at.over_budget) {
        refuse_staging(p, peer(p).rank, pp.sequence, "not received");
        drop_commit(cs, pp.sequence);
        return {};
      }
      if (at.past_window) {
        refuse_wire(wire_refusal::commit_part);
        send_error(p, errc::out_of_range, pp.sequence,
                   "commit_part.part = " + std::to_string(pp.part) + ": past the window of commit " +
                       std::to_string(pp.sequence) + " (part " + std::to_string(cs.next) + " due, " +
                       std::to_string(cs.live.claims) + " being received; a server holds " +
                       std::to_string(wire::max_parts_in_flight) +
                       " parts in flight, wire::max_parts_in_flight; not received)");
        drop_commit(cs, pp.sequence);
        return {};
      }
    }
    return take_rx(p, n);
  }

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
  part_place place_part(commit_parts_in& cs, const wire::peeked_part& pp, std::size_t n) {
    const std::uint64_t elements = core_.range().size();
    if (pp.element_count != elements || !(pp.type == dtype::f32 || pp.type == dtype::f16 || pp.type == dtype::bf16))
      return {};
    const std::size_t elem = size_of(pp.type);
    const wire::part_range pr = wire::part_elements(pp.element_count, pp.parts, pp.part);
    if (pr.count == 0 || pp.parts > wire::max_commit_parts || n != pr.count * elem) return {};
    if (!cs.active && cs.dropping && pp.sequence == cs.dropped_sequence && pp.part != 0) return {.drop = true};
    staging_area& st = cs.live;
    if (cs.active || st.claims > 0) {
      if (pp.sequence != cs.key_sequence || pp.parts != cs.key_parts || pp.type != cs.key_type) return {};
      if (cs.active && pp.part < cs.next) return {};  // checked already: a repeat, refused once decoded
    }
    const std::size_t off = pr.first * elem;
    if (st.claimed_at(off)) return {};  // being received: a repeat
    if (st.claims == wire::max_parts_in_flight || pp.part >= cs.next + wire::max_parts_in_flight)
      return {.past_window = true};
    if (!stage(st)) return {.over_budget = true};
    if (!cs.active && st.claims == 0) {
      cs.key_sequence = pp.sequence;
      cs.key_parts = pp.parts;
      cs.key_type = pp.type;
    }
    st.claimed[st.claims++] = off;
    return {.region = std::span<std::byte>(st.bytes).subspan(off, n)};
  }

  // A staging of the shard's dense f32 size, allocated once per rank (and
  // once more per rejoin that raced a receive; retire_staging). Counted in
  // server_params.max_receive_bytes with the receive buffers: false, and
  // nothing allocated, where it would pass that beside the receives in
  // flight and the other stagings.
  bool stage(staging_area& st) {
    const std::uint64_t need = core_.range().size() * sizeof(float);
    if (st.bytes.size() >= need) return true;
    const std::uint64_t others = staging_bytes_ - st.bytes.size();
    if (rx_lent() + others + need > p_.max_receive_bytes) return false;
    give_up_idle_rx(others + need, p_.max_receive_bytes);
    staging_bytes_ += need - st.bytes.size();
    st.bytes.resize(need);
    return true;
  }

  void refuse_staging(transport::peer_id p, std::uint32_t w, std::uint64_t sequence, std::string_view what) {
    refuse_wire(wire_refusal::receive_budget);
    send_error(p, errc::unavailable, sequence,
               "server.max_receive_bytes = " + std::to_string(p_.max_receive_bytes) + ": worker " + std::to_string(w) +
                   "'s commits in parts need a staging of " + std::to_string(core_.range().size() * sizeof(float)) +
                   " bytes beside " + std::to_string(rx_lent()) + " held by receives in flight and " +
                   std::to_string(staging_bytes_) + " by other stagings (" + std::string(what) +
                   "; raise max_receive_bytes, or commit whole: worker.commit_part_bytes = 0)");
  }

  // A receive into a staging buffer was delivered or abandoned: its slice
  // may be placed again. False when `data` lies in no staging buffer.
  // `rank`: the sender's, if known, whose stagings are looked at first.
  bool unclaim_part(std::span<const std::byte> data, std::uint32_t rank) {
    if (data.empty() || staging_bytes_ == 0) return false;  // no staging buffer exists
    if (rank < cparts_.size() && unclaim_part_of(cparts_[rank], data)) return true;
    for (std::size_t r = 0; r < cparts_.size(); ++r)
      if (r != rank && unclaim_part_of(cparts_[r], data)) return true;
    return false;
  }

  bool unclaim_part_of(commit_parts_in& cs, std::span<const std::byte> data) {
    if (cs.live.holds(data.data())) {
      cs.live.unclaim(static_cast<std::size_t>(data.data() - cs.live.bytes.data()));
      return true;
    }
    for (std::size_t i = 0; i < cs.retired.size(); ++i) {
      staging_area& old = cs.retired[i];
      if (!old.holds(data.data())) continue;
      old.unclaim(static_cast<std::size_t>(data.data() - old.bytes.data()));
      if (old.claims == 0) {  // its last late receive ended: one is kept as a spare, the others freed
        const bool spare_kept = std::any_of(cs.retired.begin(), cs.retired.end(),
                                            [&](const staging_area& a) { return &a != &old && a.claims == 0; });
        if (spare_kept) {
          staging_bytes_ -= old.bytes.size();
          cs.retired.erase(cs.retired.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
      return true;
    }
    return false;
  }

  // A (re)join of rank w: while receives from its old connection are still
  // writing into its staging, that staging is retired (it stays until they
  // end) and the rank's parts land in a spare or a new one from now on. So
  // a part sent again is never refused as "being received", and a late
  // write of the old connection can not touch a part that passed its CRC.
  void retire_staging(std::uint32_t w) {
    commit_parts_in& cs = cparts_[w];
    if (cs.live.claims == 0) return;
    if (in_batch(w)) apply_held();  // the rank's last commit may be read from there
    ++tel_.staging_retired;
    const auto spare = std::find_if(cs.retired.begin(), cs.retired.end(), [](const staging_area& a) { return a.claims == 0; });
    if (spare != cs.retired.end()) {
      std::swap(*spare, cs.live);
    } else {
      cs.retired.push_back(std::move(cs.live));
      cs.live = staging_area{};
    }
  }

  // The commit in progress is discarded (a part refused, the connection
  // gone): the rest of commit `sequence`'s parts are dropped, counted, not
  // answered again, until its part 0 comes again.
  void drop_commit(commit_parts_in& cs, std::uint64_t sequence) {
    core_.forget_speculation(static_cast<worker_id>(&cs - cparts_.data()));
    cs.active = false;
    cs.next = 0;
    cs.dropping = true;
    cs.dropped_sequence = sequence;
  }

  // A part of a commit in parts, decoded (its CRC and size for its index
  // passed): it must be the next of the commit in progress, or part 0 of a
  // new one; the commit goes to server_core whole once its last part passed
  // (its exactly-once check, policy and apply unchanged).
  void on_commit_part(transport::peer_id p, worker_id w, const wire::header& h, std::span<const std::byte> payload,
                      bool finite, double now) {
    commit_parts_in& cs = cparts_[w];
    auto refuse = [&](std::string_view field, std::uint64_t value, const std::string& why) {
      refuse_wire(wire_refusal::commit_part);
      send_error(p, errc::invalid_argument, h.sequence, std::string(field) + " = " + std::to_string(value) + ": " + why);
      drop_commit(cs, cs.active ? cs.head.sequence : h.sequence);
    };
    // Built only for a refusal's text: once a sequence has 6 digits this
    // string no longer fits the small-string buffer, and every part would
    // allocate.
    auto of = [&] { return " of commit " + std::to_string(cs.head.sequence); };
    if (!cs.active) {
      if (cs.dropping && h.sequence == cs.dropped_sequence && h.part != 0) {  // part 0: sent again, afresh
        ++tel_.commit_parts_dropped;
        return;
      }
      if (h.part != 0)
        return refuse("commit_part.part", h.part,
                      "no commit in progress (commit " + std::to_string(h.sequence) + " in " +
                          std::to_string(h.parts) + " parts starts with part 0)");
      if (h.element_count != core_.range().size())
        return refuse("commit_part.element_count", h.element_count,
                      "server " + std::to_string(p_.core.shard) + " holds " + std::to_string(core_.range().size()) +
                          " elements (a commit in parts is dense)");
      if (!stage(cs.live)) {  // once per rank (eager parts come here first)
        refuse_staging(p, w, h.sequence, "not applied");
        drop_commit(cs, h.sequence);
        return;
      }
      cs.active = true;
      cs.dropping = false;
      cs.head = h;
      cs.next = 0;
      cs.bytes = 0;
      cs.finite = true;
      cs.key_sequence = h.sequence;
      cs.key_parts = h.parts;
      cs.key_type = h.type;
    } else {
      if (h.sequence != cs.head.sequence)
        return refuse("commit_part.sequence", h.sequence,
                      "commit " + std::to_string(cs.head.sequence) + " is in progress (part " + std::to_string(cs.next) +
                          " of " + std::to_string(cs.head.parts) + " due): a part of another commit");
      if (h.parts != cs.head.parts)
        return refuse("commit_part.parts", h.parts,
                      "earlier parts" + of() + " said " + std::to_string(cs.head.parts) + " (another split)");
      if (h.part < cs.next)
        return refuse("commit_part.part", h.part,
                      "repeated: parts 0.." + std::to_string(cs.next - 1) + of() + " passed");
      if (h.part > cs.next)
        return refuse("commit_part.part", h.part,
                      "out of order: part " + std::to_string(cs.next) + " of " + std::to_string(cs.head.parts) + of() +
                          " is due");
      if (h.clock != cs.head.clock || h.step != cs.head.step || h.samples != cs.head.samples ||
          h.flags != cs.head.flags || h.tensor != cs.head.tensor || h.type != cs.head.type ||
          h.element_count != cs.head.element_count)
        return refuse("commit_part.clock", h.clock,
                      "part " + std::to_string(h.part) + of() +
                          " differs from its part 0 in clock, step, samples, flags, tensor, dtype or element_count");
    }
    const std::size_t elem = size_of(h.type);
    const wire::part_range pr = wire::part_elements(h.element_count, h.parts, h.part);  // valid: decode checked it
    const std::span<std::byte> dst = std::span<std::byte>(cs.live.bytes).subspan(pr.first * elem, pr.count * elem);
    if (payload.data() != dst.data()) {  // eager, or received beside the staging: copied once, checked already
      if (cs.live.claimed_at(pr.first * elem))
        return refuse("commit_part.part", h.part, "repeated: another message of this part" + of() + " is being received");
      std::memcpy(dst.data(), payload.data(), dst.size());
    }
    cs.finite = cs.finite && finite;
    cs.bytes += wire::header_bytes + payload.size();
    ++cs.next;
    ++tel_.commit_parts;
    const std::span<const std::byte> staged = std::span<const std::byte>(cs.live.bytes).first(cs.head.element_count * elem);
    if (cs.next < cs.head.parts) {
      // Its add begins beside the parameters while the next parts land.
      if (p_.apply_parts_as_they_land && cs.finite)
        (void)core_.speculate(commit_of(w, cs.head, staged, cs.bytes, cs.finite, true), pr.first, pr.first + pr.count);
      return;
    }
    // Every part passed: the commit as if it had come whole.
    cs.active = false;
    ++tel_.commits_in_parts;
    // The staging holds it until this rank's next commit, which waits for
    // the batch to end: it may wait in the batch.
    to_core(w, cs.head, staged, cs.bytes, cs.finite, now, p_.apply_batch > 1);
  }

  // A commit (whole, or its parts' staging once all passed) to server_core.
  // The samples a commit covers travel in its header (the worker's
  // worker_cycle counted them); server_core bounds them.
  void to_core(worker_id w, const wire::header& h, std::span<const std::byte> payload, std::uint64_t bytes,
               bool values_checked, double now, bool kept) {
    const commit_in c = commit_of(w, h, payload, bytes, values_checked, kept);
    // A push (flags pull | ack_requested, ps::worker::push): its pull is
    // answered with a header-only acknowledgement when the policy releases
    // it, not with the parameters.
    if (c.pull) ack_only_[w] = c.ack_only ? 1 : 0;
    core_.commit(c, now, out_);
  }

  // The commit server_core gets from header h and its payload.
  commit_in commit_of(worker_id w, const wire::header& h, std::span<const std::byte> payload, std::uint64_t bytes,
                      bool values_checked, bool kept) const {
    return commit_in{.worker = w,
                     .incarnation = core_.incarnation(w),
                     .sequence = h.sequence,
                     .clock = h.clock,
                     .samples = h.samples,
                     .bytes = bytes,
                     .codec = h.codec,
                     .type = h.type,
                     .element_count = h.element_count,
                     .step = h.step,
                     .tensor = h.tensor,
                     .payload = payload,
                     .pull = (h.flags & wire::flag_pull) != 0,
                     .ack_only = (h.flags & (wire::flag_pull | wire::flag_ack_requested)) ==
                                 (wire::flag_pull | wire::flag_ack_requested),
                     .values_checked = values_checked,
                     .payload_kept = kept};
  }

  // A pooled receive buffer of n bytes within server_params.max_receive_bytes
  // over all connections: the free buffer that fits best; idle capacity is
  // given up before a message is refused.
  std::span<std::byte> take_rx(transport::peer_id p, std::size_t n) {
    // Past the budget with the batch's buffers: they go back first, its commits applied.
    if (!batch_rx_.empty() && rx_lent() + staging_bytes_ + n > p_.max_receive_bytes) apply_held();
    std::uint64_t lent = 0;
    std::uint32_t pick = ~std::uint32_t{0};
    for (std::uint32_t i = 0; i < rx_.size(); ++i) {
      const std::size_t c = rx_[i].bytes.size();
      if (rx_[i].busy) {
        lent += c;
      } else if (pick == ~std::uint32_t{0} || (c >= n && (rx_[pick].bytes.size() < n || c < rx_[pick].bytes.size())) ||
                 (c < n && rx_[pick].bytes.size() < n && c > rx_[pick].bytes.size())) {
        pick = i;
      }
    }
    // What the stagings of commits in parts leave of the budget.
    const std::uint64_t budget = p_.max_receive_bytes - std::min(staging_bytes_, p_.max_receive_bytes);
    if (lent + n > budget) {
      refuse_wire(wire_refusal::receive_budget);
      send_error(p, errc::unavailable, 0,
                 "server.max_receive_bytes = " + std::to_string(p_.max_receive_bytes) + ": receives in flight hold " +
                     std::to_string(lent) + " bytes" +
                     (staging_bytes_ > 0 ? " and stagings of commits in parts " + std::to_string(staging_bytes_) : "") +
                     "; a message of " + std::to_string(n) + " bytes would pass it (not received)");
      return {};
    }
    // A buffer that must grow grows to the largest message taken so far
    // (within the budget), so messages of varying sizes (measurements
    // batches, commits) do not keep trading a buffer for a larger one: after
    // warm-up no receive allocates.
    rx_largest_ = std::max<std::uint64_t>(rx_largest_, n);
    const std::uint64_t want = lent + rx_largest_ <= budget ? rx_largest_ : n;
    const std::uint64_t grow = pick != ~std::uint32_t{0} && rx_[pick].bytes.size() >= n
                                   ? 0
                                   : want - (pick != ~std::uint32_t{0} ? rx_[pick].bytes.size() : 0);
    give_up_idle_rx(grow, budget, pick);
    if (pick == ~std::uint32_t{0}) {
      pick = static_cast<std::uint32_t>(rx_.size());
      rx_.emplace_back();
    } else {
      free_rx_.remove(pick);
    }
    detail::pooled_buffer& b = rx_[pick];
    if (b.bytes.size() < n || lent + b.bytes.size() > budget) {
      // want (n, or the largest message so far): the budget counts capacity.
      std::vector<std::byte> fresh(b.bytes.size() < n ? want : n);
      b.bytes.swap(fresh);
    }
    b.busy = true;
    b.used = n;
    return {b.bytes.data(), n};
  }

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

  // Idle pooled capacity is given up, buffer by buffer (all but `keep`),
  // until the pool's capacity and `extra` more bytes fit `limit`.
  void give_up_idle_rx(std::uint64_t extra, std::uint64_t limit, std::uint32_t keep = no_rx) {
    std::uint64_t total = rx_capacity();
    for (std::uint32_t i = 0; total + extra > limit && i < rx_.size(); ++i) {
      if (rx_[i].busy || i == keep || rx_[i].bytes.empty()) continue;
      total -= rx_[i].bytes.size();
      std::vector<std::byte>().swap(rx_[i].bytes);
    }
  }

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

  // The commits waiting in the batch are added (one pass) and their receive
  // buffers go back to the pool; their replies still wait for end_batch.
  void apply_held() {
    core_.apply_pending();
    for (const std::uint32_t i : batch_rx_) {
      rx_[i].busy = false;
      free_rx_.give(i);
    }
    batch_rx_.clear();
  }

  // The batch ends: applied, then its replies sent, in the order they came.
  void end_batch(double now) {
    if (batch_workers_.empty() && core_.pending_applies() == 0) return;
    apply_held();
    batch_workers_.clear();
    flush(now);
  }

  // The pooled receive buffer that `data` lies in, if any, goes back.
  // A receive buffer the engine still holds for a sender that is gone
  // (six stalled 16 MiB uploads left every honest
  // commit refused by max_receive_bytes until a restart): its memory is
  // set aside (moved, so the engine's pointer stays valid; never reused,
  // never freed while the engine may write into it) and its pool entry and
  // budget are free again. At most max_receive_bytes aside: past that the
  // receive stays lent, as before. A staging's slice (a commit in parts)
  // stays claimed: its rank's staging is retired at its next join.
  void reclaim_rx(std::span<const std::byte> data) {
    const std::uint32_t i = rx_of(data);
    if (i == no_rx || aside_bytes_ + rx_[i].bytes.size() > p_.max_receive_bytes) {
      ++tel_.receives_not_reclaimed;
      return;
    }
    aside_bytes_ += rx_[i].bytes.size();
    aside_.push_back(std::move(rx_[i].bytes));
    rx_[i].bytes = {};
    rx_[i].used = 0;
    release_rx(i);
    ++tel_.receives_reclaimed;
    tel_.reclaimed_bytes = aside_bytes_;
  }
  // The engine let go of a buffer set aside: freed. False: not one of them.
  bool release_aside(std::span<const std::byte> data) {
    if (data.empty() || aside_.empty()) return false;
    for (std::size_t k = 0; k < aside_.size(); ++k) {
      if (aside_[k].data() != data.data()) continue;
      aside_bytes_ -= aside_[k].size();
      aside_.erase(aside_.begin() + static_cast<std::ptrdiff_t>(k));
      tel_.reclaimed_bytes = aside_bytes_;
      return true;
    }
    return false;
  }

  void release_rx(std::span<const std::byte> data) { release_rx(rx_of(data)); }
  void release_rx(std::uint32_t i) {
    if (i == no_rx) return;
    rx_[i].busy = false;
    free_rx_.give(i);
  }

  void on_message(transport::peer_id p, std::span<const std::byte> head, std::span<const std::byte> data) {
    const double now = clock_.now();
    ++tel_.messages_in;
    tel_.bytes_in += head.size() + data.size();
    // The pooled receive buffer the message lies in, or (no_rx) a commit
    // part received into its staging, whose slice is free to place again.
    const std::uint32_t rx = rx_of(data);
    const std::uint32_t from = p < peers_.size() ? peers_[p].rank : no_rank;
    if (rx == no_rx) unclaim_part(data, from);
    // Batched applies (server_params.apply_batch): a commit from a worker
    // not yet in the batch may join it; anything else is handled after the
    // batch was applied and answered, in the order it came.
    // (The header is not checked yet: a message that only says it is a
    // commit is refused by handle(), which ends the batch.)
    const bool commit = wire::peek_kind(head) == wire::message_kind::commit;
    if (!batch_workers_.empty() && (!commit || from == no_rank || in_batch(from))) end_batch(now);
    // A commit part lies in (or is copied into) its rank's staging, which
    // holds it: its receive buffer never waits with the batch. A part that
    // does not end its commit has no reply to wait for: it joins no batch
    // (so the worker's next part does not end the batch early).
    const bool part = commit && wire::peek_part(head).valid();
    const bool kept = p_.apply_batch > 1 && commit && !part && from != no_rank && rx != no_rx;
    const std::size_t waiting = core_.pending_applies();
    const std::uint64_t errors = tel_.errors_sent;
    const std::uint64_t ended_in_parts = tel_.commits_in_parts;
    handle(p, head, data, now, kept);
    const bool commit_ended = commit && (!part || tel_.commits_in_parts != ended_in_parts);
    if (core_.pending_applies() > waiting) {  // the commit waits in the batch (its receive buffer with it, if kept)
      batch_workers_.push_back(from);
      if (kept) {
        batch_rx_.push_back(rx);
      } else {
        release_rx(rx);
      }
    } else if (core_.pending_applies() == 0 && batch_workers_.empty()) {
      release_rx(rx);
    } else {
      if (commit_ended && from != no_rank && !in_batch(from)) batch_workers_.push_back(from);  // its reply waits too
      release_rx(rx);
    }
    if (batch_workers_.empty()) {
      flush(now);
    } else if (batch_workers_.size() >= p_.apply_batch || tel_.errors_sent != errors || !out_.plans().empty() ||
               !out_.errors().empty()) {
      end_batch(now);  // full, or something other than replies to send: in the order it came
    }
    // By commits: checked per message, so a checkpoint is never more than
    // checkpoint_every_commits behind (by seconds: in run_once).
    if (p_.checkpoint_every_commits > 0 && !p_.checkpoint_dir.empty() &&
        core_.stats().commits_applied - applied_at_checkpoint_ >= p_.checkpoint_every_commits) {
      end_batch(now);  // the checkpoint holds what was applied, and what was answered is in it
      start_checkpoint();
    }
  }

  void handle(transport::peer_id p, std::span<const std::byte> head, std::span<const std::byte> data, double now,
              bool kept = false) {
    // A dense commit's values are checked (finite) chunk by chunk as the
    // CRC check reads them: one pass over the payload for both, and
    // server_core skips its own. Parameters still change
    // only after the whole message is verified and the policy decided.
    dense_value_check values;
    bool started = false;
    auto m = wire::decode(head, data, p_.core.limits,
                          [&](const wire::header& raw, std::span<const std::byte> chunk) noexcept {
                            if (!started) {
                              started = true;
                              if (raw.kind != wire::message_kind::commit || p_.core.allow_non_finite) return;
                              // A commit part: its own elements (the split its header names).
                              const std::uint64_t n = (raw.flags & wire::flag_part) != 0
                                                          ? wire::part_elements(raw.element_count, raw.parts, raw.part).count
                                                          : raw.element_count;
                              values = dense_value_check(raw.codec, raw.type, n, data.size());
                            }
                            values(chunk);
                          });
    if (!m) {
      refuse_wire(wire_refusal::malformed);
      send_error(p, m.error().code(), 0, m.error().message());
      // A commit part that fails (its CRC, most likely) fails its commit:
      // what was staged is discarded, the rest of its parts dropped.
      if (const wire::peeked_part pp = wire::peek_part(head);
          pp.valid() && pp.kind == wire::message_kind::commit && peer(p).rank != no_rank) {
        commit_parts_in& cs = cparts_[peer(p).rank];
        drop_commit(cs, cs.active ? cs.head.sequence : pp.sequence);
      }
      return;
    }
    const wire::header& h = m->header;
    peer_state& ps = peer(p);
    if (h.kind == wire::message_kind::join) {
      on_join(p, ps, h, *m->template get<wire::join_body>(), now);
      return;
    }
    if (ps.rank == no_rank && ps.superseded_rank != no_rank) {
      refuse_wire(wire_refusal::stale);
      send_error(p, errc::invalid_argument, h.sequence,
                 "join.incarnation = " + std::to_string(ps.incarnation) + ": stale: worker " +
                     std::to_string(ps.superseded_rank) + " joined again as incarnation " +
                     std::to_string(ps.superseded_by) + " from another connection (a later process of this rank)");
      return;
    }
    if (ps.rank == no_rank) {
      refuse_wire(wire_refusal::unbound);
      send_error(p, errc::invalid_argument, h.sequence,
                 std::string("message.kind = ") + std::string(wire::to_string(h.kind)) +
                     ": this connection has not joined (send join first)");
      return;
    }
    if (h.rank != ps.rank) {
      refuse_wire(wire_refusal::rank);
      send_error(p, errc::invalid_argument, h.sequence,
                 "header.rank = " + std::to_string(h.rank) + ": this connection joined as worker " +
                     std::to_string(ps.rank));
      return;
    }
    const std::uint32_t w = ps.rank;
    last_heard_[w] = now;
    switch (h.kind) {
      case wire::message_kind::commit: {
        if ((h.flags & wire::flag_part) != 0) {
          on_commit_part(p, w, h, m->payload, values.all_finite(), now);
          return;
        }
        to_core(w, h, m->payload, wire::header_bytes + data.size(), values.all_finite(), now, kept);
        return;
      }
      case wire::message_kind::pull_request:
        if (h.element_count != core_.range().size()) {
          refuse_wire(wire_refusal::element_count);
          send_error(p, errc::invalid_argument, h.sequence,
                     "pull_request.element_count = " + std::to_string(h.element_count) + ": server " +
                         std::to_string(p_.core.shard) + " holds " + std::to_string(core_.range().size()) +
                         " elements of the model's " + std::to_string(p_.core.layout.elements()) +
                         " (the worker's model differs from the server's)");
          return;
        }
        ack_only_[w] = 0;
        core_.pull(w, now, out_);
        return;
      case wire::message_kind::metric: {
        const auto* b = m->template get<wire::metric_body>();
        core_.metric(b->name, b->value, now, out_);
        return;
      }
      case wire::message_kind::measurements: {
        const auto* b = m->template get<wire::measurements_body>();
        for (ashl::measurement x : *b) core_.measurement(x, out_);
        return;
      }
      case wire::message_kind::leave:
        core_.leave(w, now, out_);
        unbind(p, ps);
        if (!left_[w]) {
          left_[w] = 1;
          ++left_count_;
        }
        return;
      case wire::message_kind::error:
        ++tel_.worker_errors;
        return;
      default:
        refuse_wire(wire_refusal::unexpected);
        send_error(p, errc::invalid_argument, h.sequence,
                   std::string("message.kind = ") + std::string(wire::to_string(h.kind)) +
                       ": a server does not take this kind");
        return;
    }
  }

  void on_join(transport::peer_id p, peer_state& ps, const wire::header& h, const wire::join_body& b, double now) {
    const std::uint32_t w = h.rank;
    if (p_.job != 0 && b.job != 0 && b.job != p_.job) {
      refuse_wire(wire_refusal::job);
      send_error(p, errc::invalid_argument, h.sequence,
                 "join.job = " + job_id_text(b.job) + ": this server (" + std::to_string(p_.core.shard) +
                     ") runs job " + job_id_text(p_.job) + ", a model of " +
                     std::to_string(p_.core.layout.elements()) + " elements, " + std::to_string(p_.core.workers) +
                     " workers, " + std::to_string(p_.core.layout.servers()) +
                     " servers (another job's server at this address, or the worker's model size, worker or "
                     "server count or ASHL_JOB differ: the job id derives from them)");
      return;
    }
    if (w >= p_.core.workers) {
      refuse_wire(wire_refusal::rank);
      send_error(p, errc::out_of_range, h.sequence,
                 "join.rank = " + std::to_string(w) + ": this job has " + std::to_string(p_.core.workers) +
                     " workers (ranks 0.." + std::to_string(p_.core.workers - 1) + ")");
      return;
    }
    if (p_.max_incarnation_ahead.count() > 0) {
      const std::uint64_t ahead = static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(p_.max_incarnation_ahead).count());
      const std::uint64_t now_inc = incarnation_now();
      if (b.incarnation > now_inc && b.incarnation - now_inc > ahead) {
        refuse_wire(wire_refusal::incarnation);
        send_error(p, errc::out_of_range, h.sequence,
                   "join.incarnation = " + std::to_string(b.incarnation) + ": more than server.max_incarnation_ahead = " +
                       std::to_string(p_.max_incarnation_ahead.count()) +
                       " s ahead of a time-based incarnation now (" + std::to_string(now_inc) +
                       " ns since the Unix epoch)");
        return;
      }
    }
    if (ps.rank != no_rank && ps.rank != w) {
      refuse_wire(wire_refusal::rank);
      send_error(p, errc::invalid_argument, h.sequence,
                 "join.rank = " + std::to_string(w) + ": this connection joined as worker " + std::to_string(ps.rank));
      return;
    }
    // A smaller incarnation than the rank's is a process older than one
    // that joined: server_core refuses it (counted, named) and the refusal
    // goes back on this connection, which is bound to nothing.
    if (b.incarnation < core_.incarnation(w)) {
      core_.join(w, b.incarnation, now, out_);
      for (const error_out& e : out_.errors()) send_error(p, e.code, h.sequence, e.text);
      out_.clear();
      return;
    }
    const transport::peer_id holder = rank_peer_[w];
    if (holder != transport::no_peer && holder != p) {
      if (t_.is_connected(holder) && !peer(holder).failed && b.incarnation <= core_.incarnation(w)) {
        refuse_wire(wire_refusal::rank_taken);
        send_error(p, errc::invalid_argument, h.sequence,
                   "join.rank = " + std::to_string(w) + ": worker " + std::to_string(w) +
                       " is connected already as incarnation " + std::to_string(core_.incarnation(w)) +
                       " (a restarted worker joins with a larger incarnation)");
        return;
      }
      peer_state& old = peer(holder);
      const bool superseded = b.incarnation > core_.incarnation(w);
      if (superseded) {  // a later process takes the rank
        old.superseded_rank = w;
        old.superseded_by = b.incarnation;
      }
      unbind(holder, old);  // the old connection no longer speaks for w
      if (superseded && t_.is_connected(holder) && !old.failed) {
        // Told now, not at its next message: it may be waiting for a pull
        // reply that will not come.
        refuse_wire(wire_refusal::stale);
        send_error(holder, errc::invalid_argument, 0,
                   "join.incarnation = " + std::to_string(old.incarnation) + ": stale: worker " + std::to_string(w) +
                       " joined again as incarnation " + std::to_string(b.incarnation) +
                       " from another connection (a later process of this rank)");
      }
    }
    const std::uint64_t joins_before = core_.stats().joins;
    core_.join(w, b.incarnation, now, out_);
    const bool refused = core_.stats().joins == joins_before && !core_.is_live(w);
    if (refused) return;
    if (ps.rank == no_rank) {
      ps.rank = w;
      ++bound_;
    }
    ps.incarnation = b.incarnation;
    ps.superseded_rank = no_rank;
    // A (re)join starts the rank's commits in parts afresh; receives in
    // flight into its staging keep their slices until they end, in a
    // staging the rank no longer uses.
    retire_staging(w);
    core_.forget_speculation(w);
    cparts_[w].active = false;
    cparts_[w].dropping = false;
    rank_peer_[w] = p;
    last_heard_[w] = now;
    if (!joined_once_[w]) {
      joined_once_[w] = 1;
      ++joined_count_;
    }
    if (left_[w]) {  // it joins again: the job waits for its leave
      left_[w] = 0;
      --left_count_;
    }
  }

  void on_sent(transport::peer_id, std::uint64_t cookie, const status&) {
    const auto i = static_cast<std::uint32_t>(cookie);
    ASHL_ASSERT(i < slots_.size(), "server: a send completion for an unknown slot");
    send_slot& s = slots_[i];
    if (s.pinned) {
      core_.unpin_parameters(s.version);
      s.pinned = false;
    }
    free_slots_.give(i);
  }

  void on_peer(transport::peer_id p, transport::peer_event e, const status&) {
    if (e == transport::peer_event::connected) {
      peer(p) = peer_state{};  // a transport may reuse the id of a peer that is gone
      return;
    }
    end_batch(clock_.now());  // what came before the connection went is applied and answered first
    peer_state& ps = peer(p);
    ps.failed = true;
    if (e == transport::peer_event::failed) ++tel_.peers_failed;
    if (ps.rank != no_rank) {
      const std::uint32_t w = ps.rank;
      unbind(p, ps);
      core_.evict(w, clock_.now(), out_);
      flush(clock_.now());
    }
  }

  // server_params.worker_timeout: a live worker silent that long, whose
  // pull the server does not hold, is evicted and its connection closed. A
  // worker the policy counts from creation that never joined is silent
  // since the server started.
  void evict_silent(double now) {
    if (p_.worker_timeout.count() == 0) return;
    const double limit = std::chrono::duration<double>(p_.worker_timeout).count();
    for (std::uint32_t w = 0; w < p_.core.workers; ++w) {
      if (!core_.is_live(w) || core_.is_held(w) || now - last_heard_[w] <= limit) continue;
      if (heard_lately(rank_peer_[w], limit)) continue;
      ++tel_.evicted_silent;
      std::fprintf(stderr, "server %u: worker %u evicted: %s for %.1f s (worker_timeout %.1f s)\n", p_.core.shard, w,
                   joined_once_[w] ? "silent" : "never joined", now - last_heard_[w], limit);
      const transport::peer_id holder = rank_peer_[w];
      if (holder != transport::no_peer) {
        unbind(holder, peer(holder));
        peer(holder).failed = true;
      }
      core_.evict(w, now, out_);
      flush(now);
      if (holder != transport::no_peer) t_.close(holder);
    }
  }

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

  [[nodiscard]] bool checkpoint_due(double now) const noexcept {
    if (p_.checkpoint_dir.empty()) return false;
    if (p_.checkpoint_every_seconds > 0.0 && now - last_checkpoint_ >= p_.checkpoint_every_seconds) return true;
    return p_.checkpoint_every_commits > 0 &&
           core_.stats().commits_applied - applied_at_checkpoint_ >= p_.checkpoint_every_commits;
  }

  // The state into the writer's buffer (the loop's half of the double
  // buffer, capacity kept; the writer thread may be writing the other half).
  // The next periodic checkpoint is due from here.
  checkpoint_meta serialise_checkpoint() {
    end_batch(clock_.now());  // the state holds every commit answered
    const double t0 = clock_.now();
    std::vector<std::byte>& b = writer_->buffer();
    b.clear();
    state_writer w(b);
    save_identity(w);
    core_.save(w);
    const counters& c = core_.stats();
    last_checkpoint_ = t0;
    applied_at_checkpoint_ = c.commits_applied;
    tel_.checkpoint_loop_seconds += clock_.now() - t0;
    return {.shard = p_.core.shard,
            .servers = p_.core.layout.servers(),
            .version = core_.version(),
            .commits_applied = c.commits_applied,
            .unix_seconds = system_clock{}.now()};
  }

  // A periodic checkpoint, off the event loop: serialised here, written by
  // the writer thread. While the previous write still runs (a slow disk)
  // nothing is queued: the checkpoint stays due (counted once) and is
  // started at the first housekeeping pass after that write ended.
  void start_checkpoint() {
    if (writer_->busy()) {
      if (!checkpoint_waiting_) ++tel_.checkpoints_deferred;
      checkpoint_waiting_ = true;
      return;
    }
    checkpoint_waiting_ = false;
    const checkpoint_meta meta = serialise_checkpoint();
    const double t = clock_.now();
    (void)writer_->submit(meta);  // cannot be refused: not busy, and only this thread submits
    tel_.checkpoint_loop_seconds += clock_.now() - t;
  }

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

  // --------------------------------------------------------------- sending

  // Sends what the core's last event asked for.
  void flush(double now) {
    (void)now;
    for (worker_id w : out_.pull_replies()) send_parameters(w);
    for (const plan_out& pl : out_.plans()) send_plan(pl.worker, pl.plan);
    for (const error_out& e : out_.errors())
      if (e.worker < rank_peer_.size() && rank_peer_[e.worker] != transport::no_peer)
        send_error(rank_peer_[e.worker], e.code, e.in_reply_to, e.text);
    out_.clear();
  }

  std::uint32_t take_slot() {
    if (!free_slots_.empty()) return free_slots_.take();
    slots_.emplace_back();
    return static_cast<std::uint32_t>(slots_.size() - 1);
  }

  void send_parameters(worker_id w) {
    const transport::peer_id p = rank_peer_[w];
    if (p == transport::no_peer) return;
    if (ack_only_[w]) {
      ack_only_[w] = 0;
      send_ack(p, w);
      return;
    }
    // server_params.max_snapshots bounds the versions replies in flight pin.
    if (!core_.current_pinned() && core_.pinned_versions() >= p_.max_snapshots) {
      ++tel_.replies_refused;
      send_error(p, errc::unavailable, 0,
                 "server.max_snapshots = " + std::to_string(p_.max_snapshots) +
                     ": that many parameter versions are pinned by pull replies still in flight (pulls faster than "
                     "replies are received); this pull is not answered");
      return;
    }
    const auto pv = core_.pin_parameters();
    if (pv.first) ++tel_.snapshots;
    if (const std::uint32_t parts = wire::parts_for(pv.values.size(), sizeof(float), p_.reply_part_bytes); parts >= 2) {
      send_parameters_in_parts(p, w, pv, parts);
      return;
    }
    const std::uint32_t i = take_slot();
    send_slot& s = slots_[i];
    const auto payload = std::as_bytes(pv.values);
    wire::header h{.kind = wire::message_kind::pull_reply,
                   .codec = codec_id::identity,
                   .type = dtype::f32,
                   .flags = wire::flag_last_shard,
                   .element_count = pv.values.size(),
                   .tensor = p_.core.shard,
                   .rank = w,
                   .sequence = pv.version,
                   .clock = pv.version,
                   .step = core_.serve_staleness(w)};  // τ (docs/wire-format.md)
    const status st = wire::seal_header(h, payload.size(), pv.crc, s.head, p_.core.limits);
    ASHL_ASSERT(st.ok(), "server: a pull reply the wire refuses");
    (void)st;
    s.pinned = true;
    s.version = pv.version;
    send(p, i, s.head, payload);
    ++tel_.pull_replies;
  }

  // A reply in parts (server_params.reply_part_bytes): the parts' CRCs
  // come with the pinned version (server_core::checksum_in_parts, set at
  // creation: the same split as wire::part_elements), computed in the pass
  // that computed the version's CRC; a core without them (a restored state
  // of another size) has its parts checksummed here, one pass, counted in
  // part_crc_passes. Each part's send pins the version (the first part's
  // pin is pv's).
  void send_parameters_in_parts(transport::peer_id p, worker_id w, const typename core_type::pinned_parameters& pv,
                                std::uint32_t parts) {
    const bool own_pass = pv.range_crcs.size() != parts;
    if (own_pass) ++tel_.part_crc_passes;
    const std::uint64_t step = core_.serve_staleness(w);
    for (std::uint32_t j = 0; j < parts; ++j) {
      const wire::part_range pr = wire::part_elements(pv.values.size(), parts, j);
      const auto payload = std::as_bytes(pv.values.subspan(pr.first, pr.count));
      const std::uint32_t crc = own_pass ? wire::crc32c(payload) : pv.range_crcs[j];
      if (j > 0) (void)core_.pin_parameters();  // the same version: nothing applies between the parts
      const std::uint32_t i = take_slot();
      send_slot& s = slots_[i];
      wire::header h{.kind = wire::message_kind::pull_reply,
                     .codec = codec_id::identity,
                     .type = dtype::f32,
                     .flags = wire::flag_last_shard | wire::flag_part,
                     .element_count = pv.values.size(),
                     .tensor = p_.core.shard,
                     .rank = w,
                     .sequence = pv.version,
                     .clock = pv.version,
                     .step = step,
                     .part = static_cast<std::uint16_t>(j),
                     .parts = static_cast<std::uint16_t>(parts)};
      const status st = wire::seal_header(h, payload.size(), crc, s.head, p_.core.limits);
      ASHL_ASSERT(st.ok(), "server: a pull reply part the wire refuses");
      (void)st;
      s.pinned = true;
      s.version = pv.version;
      send(p, i, s.head, payload);
      ++tel_.reply_parts;
    }
    ++tel_.pull_replies;
  }

  // The acknowledgement of a push: a pull_reply of no elements and no
  // payload (docs/wire-format.md), with the version and τ a reply carries.
  void send_ack(transport::peer_id p, worker_id w) {
    const std::uint32_t i = take_slot();
    send_slot& s = slots_[i];
    wire::header h{.kind = wire::message_kind::pull_reply,
                   .codec = codec_id::identity,
                   .type = dtype::f32,
                   .flags = wire::flag_last_shard,
                   .element_count = 0,
                   .tensor = p_.core.shard,
                   .rank = w,
                   .sequence = core_.version(),
                   .clock = core_.version(),
                   .step = core_.serve_staleness(w)};
    const status st = wire::seal_header(h, {}, s.head, p_.core.limits);
    ASHL_ASSERT(st.ok(), "server: an acknowledgement the wire refuses");
    (void)st;
    send(p, i, s.head, {});
    ++tel_.pull_replies;
    ++tel_.acks;
  }

  void send_plan(worker_id w, const worker_plan& policy_plan) {
    const worker_plan plan = plan_with_codec_options(policy_plan, p_.compression, p_.compression_options);
    const transport::peer_id p = rank_peer_[w];
    if (p == transport::no_peer) return;
    wire::header h{.kind = wire::message_kind::plan_update,
                   .codec = plan_codec(plan, p_.compression),
                   .type = dtype::f32,
                   .rank = w,
                   .sequence = ++plan_sequence_,
                   .clock = core_.version()};
    if (!send_control(p, h, plan)) return;
    ++tel_.plans;
  }

  void send_error(transport::peer_id p, errc code, std::uint64_t in_reply_to, std::string_view text) {
    if (code == errc::ok) code = errc::internal;
    const std::size_t cap = p_.core.limits.max_error_text;
    wire::error_body b{.code = code, .in_reply_to = in_reply_to, .text = text.substr(0, cap)};
    wire::header h{.kind = wire::message_kind::error, .rank = p < peers_.size() && peers_[p].rank != no_rank ? peers_[p].rank : 0};
    if (send_control(p, h, b)) ++tel_.errors_sent;
  }

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

  void send(transport::peer_id p, std::uint32_t slot, std::span<const std::byte> head, std::span<const std::byte> data) {
    const status st = t_.send(p, head, data, slot);
    if (!st.ok()) {  // not connected any more: the slot is free again
      send_slot& s = slots_[slot];
      if (s.pinned) {
        core_.unpin_parameters(s.version);
        s.pinned = false;
      }
      free_slots_.give(slot);
      return;
    }
    ++tel_.messages_out;
    tel_.bytes_out += head.size() + data.size();
  }

  [[nodiscard]] std::uint32_t held_now() const noexcept {
    std::uint32_t k = 0;
    for (std::uint32_t w = 0; w < p_.core.workers; ++w) k += core_.is_held(w) ? 1u : 0u;
    return k;
  }

  void maybe_print_progress() {
    if (p_.progress_seconds <= 0.0) return;
    const double now = clock_.now();
    if (now < next_progress_) return;
    next_progress_ = now + p_.progress_seconds;
    std::fprintf(stderr, "%s\n", progress_line().c_str());
  }

  server_params p_;
  core_type core_;
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
  std::uint32_t joined_count_ = 0;
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
