// ashl/sync/detail/async.hpp — the common part of the asynchronous policies
// (ASP, SSP, DSSP, ADSP, semi-async, ASHL's AHL/SHL stages): the worker
// table, per-worker weights and plans, staleness-aware weighting and the
// stage id. Not a public interface.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/detail/workers.hpp>
#include <ashl/sync/events.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync::detail {

struct async_config {
  double scale = 1.0;                // weight of a commit from a worker without its own
  std::vector<double> weights{};     // per-worker weight η_i (e.g. ASHL's D_i)
  std::vector<worker_plan> plans{};  // per-worker plan; missing entries get the default
  staleness_weighting staleness_weight{};
};

class async_core {
 public:
  async_core() = default;
  async_core(std::size_t workers, async_config cfg, stage_id stage)
      : table_(workers), cfg_(std::move(cfg)), stage_(stage) {}

  worker_table& table() noexcept { return table_; }
  [[nodiscard]] const worker_table& table() const noexcept { return table_; }
  [[nodiscard]] stage_id stage() const noexcept { return stage_; }
  [[nodiscard]] const async_config& config() const noexcept { return cfg_; }

  [[nodiscard]] double base_weight(worker_id w) const {
    return w < cfg_.weights.size() ? cfg_.weights[w] : cfg_.scale;
  }
  // Weight of an accepted commit of w applied now; advances the version.
  double apply(worker_id w) {
    const double wt = base_weight(w) * cfg_.staleness_weight(table_.staleness(w));
    table_.bump_version();
    return wt;
  }
  // The weight for every commit from a worker without its own (ADSP: 1/M).
  void set_scale(double s) noexcept { cfg_.scale = s; }
  [[nodiscard]] double scale() const noexcept { return cfg_.scale; }

  // The worker's plan: its own or the default, the stage filled in, and the
  // data share from its weight when the plan gives none.
  [[nodiscard]] worker_plan plan(worker_id w) const {
    worker_plan p = w < cfg_.plans.size() ? cfg_.plans[w] : worker_plan{};
    if (p.stage == stage_id::none) p.stage = stage_;
    if (p.data_share == 0.0f && w < cfg_.weights.size()) p.data_share = static_cast<float>(cfg_.weights[w]);
    return p;
  }
  // Not events: these may grow the per-worker arrays.
  void set_plan(worker_id w, const worker_plan& p) {
    if (w >= cfg_.plans.size()) cfg_.plans.resize(std::size_t{w} + 1);
    cfg_.plans[w] = p;
  }
  // Workers below the weights' size that had none get the scale.
  void set_weight(worker_id w, double weight) {
    if (w >= cfg_.weights.size()) cfg_.weights.resize(std::size_t{w} + 1, cfg_.scale);
    cfg_.weights[w] = weight;
  }

  void save(state_writer& out) const {
    out.tag("ASYN", 2);  // 2: plans with their codec options
    out.put(static_cast<std::uint32_t>(stage_));
    out.put(cfg_.scale);
    out.put_vector(cfg_.weights);
    out.put<std::uint64_t>(cfg_.plans.size());
    for (const auto& p : cfg_.plans) save_plan(out, p);
    save_weighting(out, cfg_.staleness_weight);
    table_.save(out);
  }
  status load(state_reader& in) {
    async_core n;
    std::uint32_t version = 0;
    ASHL_TRY(in.tag("ASYN", 1, 2, version));
    ASHL_TRY(load_stage(in, n.stage_, "async.stage"));
    ASHL_TRY(in.get(n.cfg_.scale, "async.scale"));
    ASHL_TRY(in.get_vector(n.cfg_.weights, "async.weights"));
    std::uint64_t plans = 0;
    ASHL_TRY(in.count(plans, version >= 2 ? 32 : 24, "async.plans"));
    n.cfg_.plans.resize(static_cast<std::size_t>(plans));
    for (auto& p : n.cfg_.plans) ASHL_TRY(load_plan(in, p, version >= 2));
    ASHL_TRY(load_weighting(in, n.cfg_.staleness_weight));
    ASHL_TRY(n.table_.load(in));
    *this = std::move(n);
    return {};
  }

 private:
  worker_table table_;
  async_config cfg_;
  stage_id stage_ = stage_id::none;
};

// What every policy built on async_core answers the same way (asp, ssp,
// dssp, semi_async): its plan, stage and the workers' state, one body,
// inherited. clock, min_clock and set_plan are protected: a policy that
// offers them says so with a using-declaration (semi_async has no clock,
// dssp no set_plan). Not virtual: a policy is a concrete type.
class async_policy {
 public:
  [[nodiscard]] worker_plan plan(worker_id w) const { return core_.plan(w); }
  [[nodiscard]] stage_id stage() const noexcept { return core_.stage(); }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return core_.table().is_live(w); }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return core_.table().is_held(w); }
  [[nodiscard]] std::size_t live_count() const noexcept { return core_.table().live_count(); }
  [[nodiscard]] std::uint64_t staleness(worker_id w) const noexcept { return core_.table().staleness(w); }

 protected:
  async_policy() = default;
  async_policy(std::size_t workers, async_config cfg, stage_id stage) : core_(workers, std::move(cfg), stage) {}

  // c_i: commits accepted from w (since it joined, from 0).
  [[nodiscard]] std::uint64_t clock(worker_id w) const { return core_.table()[w].commits; }
  // The smallest c_i over the live workers.
  [[nodiscard]] std::uint64_t min_clock() const noexcept { return core_.table().min_live_commits(); }
  // A new weight and plan for w from its next commit and cycle on (ASHL+
  // re-planning); counters are kept. Not an event: it may grow the per-worker
  // arrays, and the caller tells the driver the plan changed.
  void set_plan(worker_id w, double weight, const worker_plan& p) {
    core_.set_weight(w, weight);
    core_.set_plan(w, p);
  }

  // A pull answered now: its worker is no longer held.
  pull_action serve(worker_id w) { return detail::serve(core_.table(), w); }

  async_core core_;
};

}  // namespace sync::detail
ASHL_NAMESPACE_END
