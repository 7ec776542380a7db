// ashl/sync/bsp.hpp — bulk synchronous parallel, and Local SGD(H) (its
// H-local-steps form).
//
//   ashl::sync::bsp p{{.workers = 3}};
//   p.on_commit({.worker = 0, .sequence = 1});        // buffer
//   p.on_pull({.worker = 0});                         // hold until the round completes
//   p.on_commit({.worker = 1, .sequence = 1});        // buffer
//   auto d = p.on_commit({.worker = 2, .sequence = 1});
//   // d.effects.round: the 3 commits, weight 1/3 each; d.effects.released: {0}
//
// A round is one commit from every live worker; the server applies it once
// (mean, or weighted by b_i / Σb) and then answers the round's pulls. An
// evicted worker leaves the round count at once, so a barrier never waits for
// it, and its already-received commit still joins the round. ALGORITHMS.md §1
// "BSP", "Local SGD(H)".
#pragma once

#include <ashl/config.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/detail/round.hpp>
#include <ashl/sync/detail/workers.hpp>
#include <ashl/sync/events.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

ASHL_NAMESPACE_BEGIN
namespace sync {

struct bsp_params {
  std::size_t workers = 0;
  round_weighting weighting = round_weighting::mean;
  std::uint32_t local_iterations = 1;  // H: local steps per commit (Local SGD)
  std::uint32_t batch_size = 0;        // advertised in the plan; 0: the worker's own
  std::string stage = "bsp";
};

class bsp {
 public:
  using policy_concept = policy_tag;

  bsp() = default;
  explicit bsp(bsp_params p)
      : table_(p.workers), rounds_(p.workers, p.weighting), h_(p.local_iterations), batch_(p.batch_size),
        stage_(std::move(p.stage)) {}

  commit_decision on_commit(const commit_event& c) {
    if (!table_.accept(c)) return {commit_action::drop, 0.0, {}};
    rounds_.add(c);
    return {commit_action::buffer, 0.0, rounds_.settle(table_)};
  }
  pull_decision on_pull(const pull_event& q) {
    if (!table_.is_live(q.worker)) return {pull_action::serve, {}};
    if (rounds_.waiting(q.worker)) {
      table_.hold(q.worker);
      return {pull_action::hold, {}};
    }
    table_.served(q.worker);
    return {pull_action::serve, {}};
  }
  outcome on_metric(const metric_event&) { return {}; }
  // A joiner counts from the next round on: it has nothing buffered, so the
  // round in progress now also waits for its first commit.
  outcome on_join(const membership_event& j) {
    outcome o;
    o.plans_changed = table_.join(j.worker, 0);  // data shares 1/M changed
    return o;
  }
  outcome on_evict(const membership_event& j) {
    if (!table_.evict(j.worker)) return {};
    outcome o = rounds_.settle(table_);
    o.plans_changed = true;
    return o;
  }
  outcome on_measurement(const measurement_event&) { return {}; }
  outcome drain() { return rounds_.drain(table_); }

  [[nodiscard]] worker_plan plan(worker_id) const {
    worker_plan p;
    p.local_iterations = h_;
    p.batch_size = batch_;
    const std::size_t m = table_.live_count();
    p.data_share = m == 0 ? 0.0 : 1.0 / static_cast<double>(m);
    p.stage = stage_;
    return p;
  }
  [[nodiscard]] std::string_view name() const noexcept { return stage_; }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return table_.is_live(w); }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return table_.is_held(w); }
  [[nodiscard]] std::uint64_t rounds() const noexcept { return rounds_.rounds(); }
  [[nodiscard]] std::size_t buffered() const noexcept { return rounds_.buffered(); }

 private:
  detail::worker_table table_;
  detail::round_core rounds_;
  std::uint32_t h_ = 1;
  std::uint32_t batch_ = 0;
  std::string stage_ = "bsp";
};

static_assert(consistency_policy<bsp>);

}  // namespace sync
ASHL_NAMESPACE_END
