// ashl/ps/server_vocabulary.hpp — what a ps::server is given and what it
// reports: server_params (the core's parameters plus the process's: receive
// budget, timeouts, checkpoints, apply threads, reply parts), the reasons a
// message is refused before it reaches server_core (wire_refusal), why run()
// ended (server_end) and the telemetry counters.
//
//   ashl::ps::server_params sp{.core = {.layout = *layout, .shard = rank, .workers = m}};
//   sp.checkpoint_dir = "/var/lib/job";   // server_params fields are listed in docs/ps.md
//   auto tel = srv->telemetry();          // server_telemetry
//   for (std::size_t r = 0; r < ashl::ps::wire_refusal_count; ++r) report(tel.wire_refused[r]);
//
// The server itself is ps/server.hpp; docs/ps.md "Servers and workers".
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/enum_table.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/ps/checkpoint.hpp>
#include <ashl/rules/server_core_vocabulary.hpp>
#include <ashl/transport/concepts.hpp>
#include <ashl/wire/ids.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

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
  // The ratio of the plans the policy leaves dense: 1 keeps them dense; below
  // 1 every plan commits with `compression` at this ratio
  // (ps::plan_with_codec_options): Streaming DiLoCo's 4-bit pseudo-gradients
  // are compression = block, compression_options {.bits = 4}, ratio 0.125
  // (a quantizer sends its bits whatever the ratio; top-k keeps this fraction).
  float compression_ratio = 1.0f;
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
  // over all connections; 0: (core.max_workers + 1) × the largest message this
  // shard takes (about twice the shard's dense size: every rank's staging
  // fits beside a large message).
  std::uint64_t max_receive_bytes = 0;
  // Parameter versions pinned by pull replies in flight (each version's
  // storage stays with its replies; a change is made beside it); a reply
  // that would pin one more is refused. 0: 2 × core.max_workers + 2 (a
  // worker has one reply in flight at a time; max_workers: workers unless set).
  std::uint32_t max_snapshots = 0;
  // A dense pull reply larger than this goes out in parts of about this many
  // bytes (wire flag `part`, docs/wire-format.md), each checksummed on its
  // own and sent as soon as its CRC is known, so the worker receives and
  // checks part i while the server checksums part i + 1, and UCX's
  // rendezvous handshakes of the parts overlap. The parts' CRCs are
  // computed once per version. 0: one message (the default; see
  // docs/perf/ps-ucx.md "Chunked pipelining"); otherwise >= 4096.
  std::uint64_t reply_part_bytes = 0;
  // Commits from and replies to a worker on this host (the transport's
  // peer_on_this_host: UCX over a loopback address, shared memory or
  // loopback TCP, no wire to corrupt a bit) go without their CRC-32C (wire
  // flag `unchecked`): the worker's seal and reply check, the CRC half of
  // this server's check and the new version's CRC are not computed; the
  // finite check and every other validation stay, and every lane that
  // crosses a wire keeps its CRC. Both ends must agree
  // (worker_params::trust_local_lanes): an unchecked message to an end
  // that does not trust the lane is refused by name. Default false
  // (docs/ps.md "Lanes without CRC"; docs/perf/ps-passes.md).
  bool trust_local_lanes = false;
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
  // The data ledger (docs/elastic.md §3; ps.md "The data ledger"): samples
  // = N > 0 turns it on, on server 0 only (the plan authority; the other
  // servers ignore it, so every server may be given the same params): it
  // becomes core.ledger there, the join body's batch sizes the leases, and
  // the leases go to their workers as `lease` messages. samples = 0 (the
  // default): no ledger, nothing changes.
  ledger_params ledger{};
  // Primary-backup replication (docs/elastic.md §4.2-4.4; ps/server_replica.hpp).
  // take_backup: this server is a primary that takes one backup (a
  // replica_hello is answered with a snapshot and then every record; each
  // event's replies, plans, errors and leases wait for the backup's ack of it).
  // false (the default): a replica_hello is refused as before, nothing changes.
  bool take_backup = false;
  // Record bytes sent and not yet acknowledged; past it the backup is
  // dropped (backup.lag_bytes). 0: the core's store bound (store_bytes),
  // at least min_default_backup_lag_bytes: a small shard's store bound is
  // a few records, and a backup on a loaded host falls that far behind
  // without being lost (docs/elastic.md §4.4).
  std::uint64_t max_backup_lag_bytes = 0;
  static constexpr std::uint64_t min_default_backup_lag_bytes = std::uint64_t{1} << 20;
  // A backup that leaves records unacknowledged this long is dropped
  // (backup.silent_seconds); > 0.
  std::chrono::milliseconds replica_timeout{2000};
  // Every this many seconds a record asks both sides for the CRC of the
  // version and of the whole state (save() bytes); 0: never.
  double replica_state_check_seconds = 60.0;
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
inline constexpr auto wire_refusal_table =
    make_enum_table<wire_refusal>("malformed", "oversized", "unbound", "rank", "rank_taken", "element_count",
                                  "unexpected", "receive_budget", "incarnation", "job", "stale", "commit_part");
static_assert(wire_refusal_table.name(wire_refusal::commit_part) == "commit_part",
              "wire_refusal_table ends where wire_refusal does");
inline constexpr std::size_t wire_refusal_count = wire_refusal_table.size();

constexpr std::string_view to_string(wire_refusal r) noexcept { return wire_refusal_table.name(r); }

// Why server::run() returned.
enum class server_end : std::uint8_t {
  running = 0,    // it has not returned
  stopped = 1,    // the caller's stop flag
  all_left = 2,   // every rank left explicitly
  no_worker = 3,  // no worker connected for server_params.no_worker_grace
  backup_lost = 4,  // the backup was dropped while most live workers were not connected (docs/elastic.md §4.4)
};

inline constexpr auto server_end_table = make_enum_table<server_end>("running", "stopped", "all_left", "no_worker", "backup_lost");
static_assert(server_end_table.name(server_end::backup_lost) == "backup_lost", "server_end_table ends where server_end does");

constexpr std::string_view to_string(server_end e) noexcept { return server_end_table.name(e); }

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
  // server_core_params::fuse_checks: commits applied from the check's pass
  // (their add computed beside the parameters while the CRC and the finite
  // scan read the payload); checked commits whose pass was discarded (the
  // policy did not apply them at once at the weight guessed).
  std::uint64_t fused_applies = 0, fused_wasted = 0;
  std::uint64_t worker_errors = 0;          // error messages workers sent us
  std::uint64_t snapshots = 0;              // versions pulled (each pinned by its replies, checksummed once)
  std::uint64_t applied_beside = 0;         // dense applies made beside a version replies still read
  std::uint64_t copies_for_readers = 0;     // other changes that copied such a version first
  std::uint64_t unsendable = 0;             // plans or errors the wire refused to encode (a defect; the first is printed)
  std::uint64_t leases = 0;                 // lease messages sent (server_params.ledger; resent ones too)
  ledger_stats ledger{};                    // the data ledger's counters (server 0 with server_params.ledger)
  std::uint64_t peers_failed = 0;           // connections that failed (their worker was evicted)
  std::uint64_t evicted_silent = 0;         // workers evicted by server_params.worker_timeout
  std::uint64_t replies_refused = 0;        // pull replies past server_params.max_snapshots
  std::uint64_t unchecked_in = 0;           // commits (or parts) taken without a CRC (trust_local_lanes)
  std::uint64_t unchecked_out = 0;          // pull replies (or parts) sent without one
  std::uint64_t compressed_replies = 0;     // pull replies sent compressed (server_core_params::replies)
  std::uint64_t compressed_reply_bytes = 0; // their payload bytes
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
  // Replication (server_params.take_backup): backups dropped for a CRC,
  // version or protocol disagreement; for lag (bytes, records, held
  // events) or silence past replica_timeout, or a lost link.
  std::uint64_t backups_dropped_crc = 0, backups_dropped_lag = 0;
  // Failover (docs/elastic.md §4.5): 1 on a backup promoted to primary, and
  // the seconds from its link's loss to the promotion.
  std::uint64_t failovers = 0;
  double takeover_seconds = 0.0;

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
        field{"fused_applies", &server_telemetry::fused_applies},
        field{"fused_wasted", &server_telemetry::fused_wasted},
        field{"plans", &server_telemetry::plans},
        field{"errors_sent", &server_telemetry::errors_sent},
        field{"worker_errors", &server_telemetry::worker_errors},
        field{"snapshots", &server_telemetry::snapshots},
        field{"applied_beside", &server_telemetry::applied_beside},
        field{"copies_for_readers", &server_telemetry::copies_for_readers},
        field{"unsendable", &server_telemetry::unsendable},
        field{"leases", &server_telemetry::leases},
        field{"ledger", &server_telemetry::ledger},
        field{"peers_failed", &server_telemetry::peers_failed},
        field{"evicted_silent", &server_telemetry::evicted_silent},
        field{"replies_refused", &server_telemetry::replies_refused},
        field{"unchecked_in", &server_telemetry::unchecked_in},
        field{"unchecked_out", &server_telemetry::unchecked_out},
        field{"compressed_replies", &server_telemetry::compressed_replies},
        field{"compressed_reply_bytes", &server_telemetry::compressed_reply_bytes},
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
        field{"wait_seconds", &server_telemetry::wait_seconds},
        field{"backups_dropped_crc", &server_telemetry::backups_dropped_crc},
        field{"backups_dropped_lag", &server_telemetry::backups_dropped_lag},
        field{"failovers", &server_telemetry::failovers},
        field{"takeover_seconds", &server_telemetry::takeover_seconds}};
  }
};
static_assert(fields_cover<server_telemetry>(), "server_telemetry::fields() must list every counter");

}  // namespace ps
ASHL_NAMESPACE_END
