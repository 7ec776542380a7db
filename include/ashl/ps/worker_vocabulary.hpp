// ashl/ps/worker_vocabulary.hpp — what a ps::worker is given and what it
// reports: worker_params (rank, servers, batch, incarnation, timeouts,
// reconnects, the emulated link, commit parts, measurement reports), the
// plan in force for a cycle (plan_in_force, a leader's handed to its
// followers) and the telemetry counters.
//
//   ashl::ps::worker_params wp{.rank = r, .servers = {"10.0.0.1:5000"}, .batch = 64};
//   wp.reconnect = std::chrono::seconds(30);   // worker_params fields are listed in docs/ps.md
//   auto tel = wk->telemetry();                // worker_telemetry
//
// The worker itself is ps/worker.hpp; docs/ps.md "Servers and workers".
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/rules/worker_cycle.hpp>
#include <ashl/transport/concepts.hpp>
#include <ashl/wire/ids.hpp>
#include <ashl/wire/message.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
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
  // Shard s's backup's address (docs/elastic.md §4.5, §4.6), parallel to
  // `servers`; an empty entry (or no list): the shard has none. With
  // reconnect > 0, losing shard s tries its addresses in turn (the other
  // one first: primary, backup, primary, ...) until one takes the join or
  // `reconnect` passes; the join carries the `failover` flag and the term
  // this worker knows (the server's shard_state). A backup that is not
  // primary answers `unavailable`: the worker tries the other address.
  // Both addresses of such a shard are reached over isolated links
  // (transport::connect_isolated; TCP even on one host with UCX): a
  // primary killed in the middle of a reply into this worker's
  // shared-memory FIFO would otherwise stall every later message to it,
  // its backup's included (docs/transport.md, "Isolated links").
  std::vector<std::string> backups;
  // How long one address is tried (connecting, while nobody listens there)
  // before the other, when failing over, and when starting (a worker that
  // joins while its shard's primary is dead reaches the backup); > 0.
  std::chrono::milliseconds failover_attempt{1000};
  // A shard with a backup: its server is lost, as if its link had failed,
  // once nothing (not even the transport's keepalive, one a second) came
  // from it this long (transport::fail_when_silent): a primary whose host
  // went down or froze ends no connection, and the worker would wait its
  // `timeout` and fail instead of failing over. 0: never.
  std::chrono::milliseconds server_silence{5000};
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
  // With stage_replies: the staging buffer and the caller's take turns as
  // the parameters, so a pull is never copied. Every pull's replies land
  // in the one that is not the parameters now, are checked there, and once
  // every server's reply passed that buffer becomes the parameters
  // (worker::parameters() names it after create() and each wait(); the caller points its
  // model at it, as torch's `param.data = ...` does). A bad reply leaves
  // the parameters where and as they were, as with staging; a shard whose
  // server sent no parameters (a push's acknowledgement) is copied across.
  // Local steps write the parameters in place: the buffer the next pull
  // lands in is the other one. A commit's update must not lie in the
  // buffer the replies land in (refused by name). Default false
  // (docs/ps.md "The worker"; docs/perf/ps-passes.md "Pulls that flip").
  bool flip_replies = false;
  // Commits to and replies from a server on this host go without their
  // CRC-32C (server_params::trust_local_lanes, which the servers must set
  // alike; wire flag `unchecked`). Default false.
  bool trust_local_lanes = false;
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
  std::uint64_t compressed_replies = 0;  // pull replies received compressed (added into the worker's view)
  std::uint64_t unchecked_in = 0;     // replies (or parts) taken without a CRC (trust_local_lanes)
  std::uint64_t unchecked_out = 0;    // commits (or parts) sent without one
  std::uint64_t staged_replies = 0;   // pulls delivered to the caller's buffer once every reply was checked (stage_replies)
  std::uint64_t flipped_replies = 0;  // of them, pulls delivered by making the other buffer the parameters (flip_replies)
  std::uint64_t bad_messages = 0;     // messages from servers refused (checksum, size, shape): the wait failed
  std::uint64_t reply_parts = 0;      // parts of pull replies received and checked (server_params.reply_part_bytes)
  std::uint64_t commit_parts = 0;     // parts of commits sent (worker_params.commit_part_bytes)
  std::uint64_t reconnects = 0;       // connections to a server made again (worker_params.reconnect)
  std::uint64_t failover_tries = 0;   // addresses tried while failing over (worker_params.backups)
  std::uint64_t measurement_messages = 0;  // measurements messages sent (to each server; measurement_interval)
  std::uint64_t leases = 0;           // data ledger leases kept from server 0 (docs/elastic.md §3.6), resent ones too
  std::uint64_t leases_resent = 0;    // of them, outstanding leases sent again after a rejoin (flag `resent`)
  std::uint64_t leases_dropped = 0;   // leases held at a rejoin that server 0 did not send again (it gave them back)
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
        field{"compressed_replies", &worker_telemetry::compressed_replies},
        field{"unchecked_in", &worker_telemetry::unchecked_in},
        field{"unchecked_out", &worker_telemetry::unchecked_out},
        field{"staged_replies", &worker_telemetry::staged_replies},
        field{"flipped_replies", &worker_telemetry::flipped_replies},
        field{"bad_messages", &worker_telemetry::bad_messages},
        field{"reply_parts", &worker_telemetry::reply_parts},
        field{"commit_parts", &worker_telemetry::commit_parts},
        field{"reconnects", &worker_telemetry::reconnects},
        field{"failover_tries", &worker_telemetry::failover_tries},
        field{"measurement_messages", &worker_telemetry::measurement_messages},
        field{"leases", &worker_telemetry::leases},
        field{"leases_resent", &worker_telemetry::leases_resent},
        field{"leases_dropped", &worker_telemetry::leases_dropped},
        field{"wait_seconds", &worker_telemetry::wait_seconds},
        field{"compress_seconds", &worker_telemetry::compress_seconds},
        field{"link_seconds", &worker_telemetry::link_seconds},
        field{"transport", &worker_telemetry::transport}};
  }
};
static_assert(fields_cover<worker_telemetry>(), "worker_telemetry::fields() must list every counter");

}  // namespace ps
ASHL_NAMESPACE_END
