// ashl/sync/concepts.hpp — the consistency-policy concept.
//
//   template <ashl::sync::consistency_policy P>
//   void serve(P& p, const ashl::sync::commit_event& c, ashl::sync::outcome_sink& out) {
//     auto d = p.on_commit(c, out);       // apply / buffer / drop; effects into `out`
//     ...
//   }
//
// A policy is a pure state machine (docs/design.md "The one rule"): events in
// (commit, pull, metric, join, evict, measurement), decisions out (the commit
// decision, the pull action, and into a caller-owned outcome_sink: a round of
// buffered commits to apply, held pulls now released, the workers whose plans
// changed) and the current worker_plan per worker. It never reads a clock or
// does I/O: time arrives in the events. It holds plain values only (no
// std::function, no shared_ptr), so a copy is independent of the original,
// and its whole state saves to bytes and loads back (checkpoints): a loaded
// copy makes the same decisions as the one saved. After warm-up no event
// allocates. Types in sync/events.hpp; docs/algorithms.md §1–§2.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/events.hpp>

#include <concepts>

ASHL_NAMESPACE_BEGIN
namespace sync {

// Opt-in tag: `using policy_concept = ashl::sync::policy_tag;`
struct policy_tag {};

template <class P>
concept consistency_policy =
    std::copy_constructible<P> &&
    requires(P& p, const P& cp, const commit_event& c, const pull_event& q, const metric_event& m,
             const membership_event& j, const measurement_event& x, worker_id w, outcome_sink& out,
             state_writer& sw, state_reader& sr) {
      requires std::same_as<typename P::policy_concept, policy_tag>;
      { p.on_commit(c, out) } -> std::same_as<commit_decision>;
      { p.on_pull(q, out) } -> std::same_as<pull_action>;
      { p.on_metric(m, out) } -> std::same_as<void>;
      { p.on_join(j, out) } -> std::same_as<void>;
      { p.on_evict(j, out) } -> std::same_as<void>;
      { p.on_measurement(x, out) } -> std::same_as<void>;
      // Apply everything buffered (as a round) and release every held pull:
      // used by a staged schedule at its switch and by a driver at shutdown.
      { p.drain(out) } -> std::same_as<void>;
      { cp.plan(w) } -> std::same_as<worker_plan>;
      { cp.stage() } -> std::same_as<stage_id>;
      { cp.is_live(w) } -> std::same_as<bool>;
      { cp.is_held(w) } -> std::same_as<bool>;
      { cp.save(sw) } -> std::same_as<void>;
      { p.load(sr) } -> std::same_as<status>;
    };

}  // namespace sync
ASHL_NAMESPACE_END
