// ashl/ps/server_checkpoint.hpp — ps::server's checkpoints: the job's
// identity saved with the state and checked on restore, when a checkpoint is
// due, and the handing of server_core's saved state to the checkpoint writer
// thread (ps/checkpoint.hpp).
//
//   #include <ashl/ps/server.hpp>   // includes this
//   if (auto s = srv->checkpoint(); !s) report(s);
//
// Definitions of server's members, out of the class so that ps/server.hpp
// reads as the driver's outline; docs/ps.md "Servers and workers".
#pragma once

#include <ashl/ps/server.hpp>

ASHL_NAMESPACE_BEGIN
namespace ps {

template <transport::transport Transport, sync::consistency_policy Policy>
inline status server<Transport, Policy>::checkpoint() {
  if (p_.checkpoint_dir.empty())
    return invalid_argument("server.checkpoint_dir", "", "is empty: no checkpoints");
  const checkpoint_meta meta = serialise_checkpoint();
  return writer_->write_now(meta);
}

// The job a checkpoint belongs to, before server_core's state (section
// "PSID", docs/checkpoints.md "The state"): a restore checks it first, so
// another job's checkpoint is refused by name before anything is loaded.
// Version 2 holds the job's maximum of workers where version 1 held its
// worker count: the job's shape, never how many are live, so a checkpoint
// restores into a job started with any number of workers up to the
// maximum (docs/elastic.md §2.2).
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::save_identity(state_writer& w) const {
  w.tag("PSID", 2);
  w.put(p_.job);
  w.put(p_.core.layout.elements());
  w.put(p_.core.max_workers);  // resolved by create: never 0
  w.put(static_cast<std::uint8_t>(p_.compression));
  w.put_string(p_.policy);
}

template <transport::transport Transport, sync::consistency_policy Policy>
inline status server<Transport, Policy>::check_identity(state_reader& in, const server_params& p) {
  std::uint32_t version = 0;
  if (auto s = in.tag("PSID", 1, 2, version); !s)
    return status(s.code(), s.message() + " (not a checkpoint of this build's servers: no job identity)");
  std::uint64_t job = 0, elements = 0;
  std::uint32_t max_workers = 0;
  std::uint8_t codec = 0;
  std::string policy;
  // Version 1 (before max_workers) held the worker count, which was then
  // the job's maximum too.
  const char* const max_field = version == 1 ? "checkpoint.workers" : "checkpoint.max_workers";
  ASHL_TRY(in.get(job, "checkpoint.job"));
  ASHL_TRY(in.get(elements, "checkpoint.elements"));
  ASHL_TRY(in.get(max_workers, max_field));
  ASHL_TRY(in.get(codec, "checkpoint.codec"));
  ASHL_TRY(in.get_string(policy, "checkpoint.policy"));
  const std::string other = " (a checkpoint of another job is never restored)";
  if (elements != p.core.layout.elements())
    return make_error(errc::invalid_argument, "checkpoint.elements", elements,
                      "this server's model has " + std::to_string(p.core.layout.elements()) + " elements" + other);
  // p.core.max_workers is resolved (0 = workers) before a restore reads this.
  if (max_workers != p.core.max_workers)
    return make_error(errc::invalid_argument, max_field, max_workers,
                      "this server's job admits at most " + std::to_string(p.core.max_workers) +
                          " workers (ASHL_MAX_WORKERS, or ASHL_NUM_WORKERS when that is not set)" + other);
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

template <transport::transport Transport, sync::consistency_policy Policy>
inline bool server<Transport, Policy>::checkpoint_due(double now) const noexcept {
  if (p_.checkpoint_dir.empty()) return false;
  if (p_.checkpoint_every_seconds > 0.0 && now - last_checkpoint_ >= p_.checkpoint_every_seconds) return true;
  return p_.checkpoint_every_commits > 0 &&
         core_.stats().commits_applied - applied_at_checkpoint_ >= p_.checkpoint_every_commits;
}

// The state into the writer's buffer (the loop's half of the double
// buffer, capacity kept; the writer thread may be writing the other half).
// The next periodic checkpoint is due from here.
template <transport::transport Transport, sync::consistency_policy Policy>
inline checkpoint_meta server<Transport, Policy>::serialise_checkpoint() {
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
template <transport::transport Transport, sync::consistency_policy Policy>
inline void server<Transport, Policy>::start_checkpoint() {
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

}  // namespace ps
ASHL_NAMESPACE_END
