// ashl/sync/concepts.hpp — the consistency-policy concept.
//
//   template <ashl::sync::consistency_policy P>
//   void serve(P& p, const ashl::sync::commit_event& c) {
//     auto d = p.on_commit(c);            // apply / buffer / drop, plus effects
//     ...
//   }
//
// A policy is a pure state machine (DESIGN.md "The one rule"): events in
// (commit, pull, metric, join, evict, measurement), decisions out (commit
// decision, pull decision, outcome: a round of buffered commits to apply,
// held pulls now released, plans changed) and the current worker_plan per
// worker. It never reads a clock or does I/O: time arrives in the events.
// Types in sync/events.hpp; ALGORITHMS.md §1–§2.
#pragma once

#include <ashl/config.hpp>
#include <ashl/sync/events.hpp>

#include <concepts>
#include <string_view>

ASHL_NAMESPACE_BEGIN
namespace sync {

// Opt-in tag: `using policy_concept = ashl::sync::policy_tag;`
struct policy_tag {};

template <class P>
concept consistency_policy =
    std::copy_constructible<P> &&
    requires(P& p, const P& cp, const commit_event& c, const pull_event& q, const metric_event& m,
             const membership_event& j, const measurement_event& x, worker_id w) {
      requires std::same_as<typename P::policy_concept, policy_tag>;
      { p.on_commit(c) } -> std::same_as<commit_decision>;
      { p.on_pull(q) } -> std::same_as<pull_decision>;
      { p.on_metric(m) } -> std::same_as<outcome>;
      { p.on_join(j) } -> std::same_as<outcome>;
      { p.on_evict(j) } -> std::same_as<outcome>;
      { p.on_measurement(x) } -> std::same_as<outcome>;
      // Apply everything buffered (as a round) and release every held pull:
      // used by a staged schedule at its switch and by a driver at shutdown.
      { p.drain() } -> std::same_as<outcome>;
      { cp.plan(w) } -> std::same_as<worker_plan>;
      { cp.name() } -> std::convertible_to<std::string_view>;
      { cp.is_live(w) } -> std::same_as<bool>;
      { cp.is_held(w) } -> std::same_as<bool>;
    };

}  // namespace sync
ASHL_NAMESPACE_END
