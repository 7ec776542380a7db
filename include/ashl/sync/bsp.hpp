// ashl/sync/bsp.hpp — bulk synchronous parallel, and Local SGD(H) (its
// H-local-steps form).
//
//   ashl::sync::bsp p{{.workers = 3}};
//   ashl::sync::outcome_sink out(3);                  // the driver's, reused
//   p.on_commit({.worker = 0, .sequence = 1}, out);   // buffer
//   p.on_pull({.worker = 0}, out);                    // hold until the round completes
//   p.on_commit({.worker = 1, .sequence = 1}, out);   // buffer
//   p.on_commit({.worker = 2, .sequence = 1}, out);   // buffer, and the round completes:
//   // out.round(): the 3 commits, weight 1/3 each; out.released(): {0}
//   out.clear();
//
// A round is one commit from every live worker; the server applies it once
// (mean, or weighted by b_i / Σb) and then answers the round's pulls. An
// evicted worker leaves the round count at once, so a barrier never waits for
// it, and its already-received commit still joins the round. A joiner counts
// from the next round boundary (docs/elastic.md §2.4): while a round is in
// progress its pull is held until that round completes, so its first commit
// is computed on the round's result and belongs to the next round (a slow
// joiner stalls nothing, and no round mixes versions). No round completes
// with fewer than `min_workers` live in rounds. Data shares are 1/M over the
// workers live in rounds, so an eviction or a boundary that admits joiners
// changes every plan (out.all_plans_changed()); a pending joiner's own plan
// says the share it will have. docs/algorithms.md §1 "BSP", "Local SGD(H)".
//
// Cost: O(1) per event that completes no round (completeness is counted), a
// completed round O(ids) once; no allocation after construction.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/detail/round.hpp>
#include <ashl/sync/detail/workers.hpp>
#include <ashl/sync/events.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>

ASHL_NAMESPACE_BEGIN
namespace sync {

struct bsp_params {
  std::size_t workers = 0;
  round_weighting weighting = round_weighting::mean;
  std::uint32_t local_iterations = 1;  // H: local steps per commit (Local SGD)
  std::uint32_t batch_size = 0;        // advertised in the plan; 0: the worker's own
  stage_id stage = stage_id::bsp;
  std::uint32_t min_workers = 1;  // no round completes with fewer live in rounds (>= 1)
};

class bsp {
 public:
  using policy_concept = policy_tag;

  bsp() = default;
  explicit bsp(bsp_params p)
      : table_(p.workers), rounds_(p.workers, p.weighting, p.min_workers), h_(p.local_iterations),
        batch_(p.batch_size), stage_(p.stage) {
    ASHL_ASSERT(p.min_workers >= 1, "bsp: min_workers must be >= 1");
  }

  commit_decision on_commit(const commit_event& c, outcome_sink& out) {
    if (!table_.accept(c)) return {commit_action::drop, 0.0};
    rounds_.add(table_, c);
    if (rounds_.settle(table_, out).admitted) out.all_plans_changed();
    return {commit_action::buffer, 0.0};
  }
  pull_action on_pull(const pull_event& q, outcome_sink&) {
    if (!table_.is_live(q.worker)) return pull_action::serve;
    if (rounds_.waiting(q.worker) || rounds_.pending(q.worker)) {
      table_.hold(q.worker);
      return pull_action::hold;
    }
    return detail::serve(table_, q.worker);
  }
  void on_metric(const metric_event&, outcome_sink&) {}
  void on_join(const membership_event& j, outcome_sink& out) {
    if (!table_.join(j.worker, 0)) return;
    if (rounds_.joined(table_, j.worker)) out.all_plans_changed();  // data shares 1/M
    else out.plan_changed(j.worker);  // the others' shares change at the boundary
    // A rejoiner whose commit is still buffered may bring the round to
    // min_workers and complete it.
    if (rounds_.settle(table_, out).admitted) out.all_plans_changed();
  }
  void on_evict(const membership_event& j, outcome_sink& out) {
    if (!table_.is_live(j.worker)) return;
    rounds_.evicted(j.worker);
    table_.evict(j.worker);
    rounds_.settle(table_, out);
    out.all_plans_changed();
  }
  void on_measurement(const measurement_event&, outcome_sink&) {}
  void drain(outcome_sink& out) { rounds_.drain(table_, out); }

  [[nodiscard]] worker_plan plan(worker_id w) const {
    worker_plan p;
    p.local_iterations = h_;
    p.batch_size = batch_;
    const std::size_t m = rounds_.live_in_rounds(table_) + (rounds_.pending(w) ? rounds_.pending_count() : 0);
    p.data_share = m == 0 ? 0.0f : static_cast<float>(1.0 / static_cast<double>(m));
    p.stage = stage_;
    return p;
  }
  [[nodiscard]] stage_id stage() const noexcept { return stage_; }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return table_.is_live(w); }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return table_.is_held(w); }
  [[nodiscard]] std::size_t live_count() const noexcept { return table_.live_count(); }
  // Joined during the round in progress; counts from the next round.
  [[nodiscard]] bool is_pending(worker_id w) const noexcept { return rounds_.pending(w); }
  [[nodiscard]] std::uint32_t min_workers() const noexcept { return rounds_.min_workers(); }
  [[nodiscard]] std::uint64_t rounds() const noexcept { return rounds_.rounds(); }
  [[nodiscard]] std::size_t buffered() const noexcept { return rounds_.buffered(); }
  [[nodiscard]] std::uint32_t local_iterations() const noexcept { return h_; }

 private:
  // The saved scalars before the stage (core/fields.hpp).
  static constexpr auto saved() {
    return std::tuple{field{"local_iterations", &bsp::h_}, field{"batch_size", &bsp::batch_}};
  }

 public:
  void save(state_writer& out) const {
    out.tag("BSP_", 1);
    put_fields(out, *this, saved());
    out.put(static_cast<std::uint32_t>(stage_));
    table_.save(out);
    rounds_.save(out);
  }
  status load(state_reader& in) {
    bsp n;
    ASHL_TRY(in.tag("BSP_", 1));
    ASHL_TRY(get_fields(in, n, "bsp", saved()));
    ASHL_TRY(detail::load_stage(in, n.stage_, "bsp.stage"));
    ASHL_TRY(n.table_.load(in));
    ASHL_TRY(n.rounds_.load(in, n.table_));
    *this = std::move(n);
    return {};
  }

 private:
  detail::worker_table table_;
  detail::round_core rounds_;
  std::uint32_t h_ = 1;
  std::uint32_t batch_ = 0;
  stage_id stage_ = stage_id::bsp;
};

static_assert(consistency_policy<bsp>);

}  // namespace sync
ASHL_NAMESPACE_END
