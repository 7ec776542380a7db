// ashl/sync/local_sgd.hpp — Local SGD(H): H local steps, commit the model
// delta, pull; synchronous across workers.
//
//   ashl::sync::local_sgd p{{.workers = 4, .local_steps = 2}};
//   ashl::sync::outcome_sink out(4);
//   p.plan(0).local_iterations;                            // 2
//   p.on_commit({.worker = 0, .sequence = 1}, out);        // buffer until every live worker's delta is in
//
// A round is one delta from each live worker, averaged (or batch-weighted):
// BSP whose commit is a model delta after H steps (same costs and membership
// rules as sync/bsp.hpp: a joiner counts from the next round, no round below
// min_workers). docs/algorithms.md §1 "Local SGD".
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/bsp.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/events.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>

ASHL_NAMESPACE_BEGIN
namespace sync {

struct local_sgd_params {
  std::size_t workers = 0;
  std::uint32_t local_steps = 2;  // H, >= 1
  round_weighting weighting = round_weighting::mean;
  std::uint32_t batch_size = 0;
  stage_id stage = stage_id::local_sgd;
  std::uint32_t min_workers = 1;  // as bsp_params::min_workers
};

class local_sgd {
 public:
  using policy_concept = policy_tag;

  local_sgd() : rounds_(bsp_params{.local_iterations = 2, .stage = stage_id::local_sgd}) {}
  explicit local_sgd(local_sgd_params p)
      : rounds_(bsp_params{p.workers, p.weighting, p.local_steps, p.batch_size, p.stage, p.min_workers}) {
    ASHL_ASSERT(p.local_steps >= 1, "local_sgd: local_steps must be >= 1");
  }

  commit_decision on_commit(const commit_event& c, outcome_sink& out) { return rounds_.on_commit(c, out); }
  pull_action on_pull(const pull_event& q, outcome_sink& out) { return rounds_.on_pull(q, out); }
  void on_metric(const metric_event& m, outcome_sink& out) { rounds_.on_metric(m, out); }
  void on_join(const membership_event& j, outcome_sink& out) { rounds_.on_join(j, out); }
  void on_evict(const membership_event& j, outcome_sink& out) { rounds_.on_evict(j, out); }
  void on_measurement(const measurement_event& x, outcome_sink& out) { rounds_.on_measurement(x, out); }
  void drain(outcome_sink& out) { rounds_.drain(out); }

  [[nodiscard]] worker_plan plan(worker_id w) const { return rounds_.plan(w); }
  [[nodiscard]] stage_id stage() const noexcept { return rounds_.stage(); }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return rounds_.is_live(w); }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return rounds_.is_held(w); }
  [[nodiscard]] std::size_t live_count() const noexcept { return rounds_.live_count(); }
  [[nodiscard]] bool is_pending(worker_id w) const noexcept { return rounds_.is_pending(w); }
  [[nodiscard]] std::uint32_t min_workers() const noexcept { return rounds_.min_workers(); }
  [[nodiscard]] std::uint64_t rounds() const noexcept { return rounds_.rounds(); }
  [[nodiscard]] std::size_t buffered() const noexcept { return rounds_.buffered(); }
  [[nodiscard]] std::uint32_t local_steps() const noexcept { return rounds_.local_iterations(); }

  void save(state_writer& out) const {
    out.tag("LSGD", 1);
    rounds_.save(out);
  }
  status load(state_reader& in) {
    bsp n;
    ASHL_TRY(in.tag("LSGD", 1));
    ASHL_TRY(n.load(in));
    if (n.local_iterations() < 1) return malformed("local_sgd.local_steps", 0, "must be >= 1");
    rounds_ = std::move(n);
    return {};
  }

 private:
  bsp rounds_;
};

static_assert(consistency_policy<local_sgd>);

}  // namespace sync
ASHL_NAMESPACE_END
