// ashl/sync/detail/async.hpp — the common part of the asynchronous policies
// (ASP, SSP, DSSP, ADSP, ASHL's AHL/SHL stages): per-worker weights and plans
// and staleness-aware weighting. Not a public interface.
#pragma once

#include <ashl/config.hpp>
#include <ashl/sync/detail/workers.hpp>
#include <ashl/sync/events.hpp>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync::detail {

struct async_config {
  double scale = 1.0;                  // weight of a commit from a worker without its own
  std::vector<double> weights{};       // per-worker weight η_i (e.g. ASHL's D_i)
  std::vector<worker_plan> plans{};    // per-worker plan; missing entries get the default
  staleness_weighting staleness_weight{};
};

class async_core {
 public:
  async_core() = default;
  async_core(std::size_t workers, async_config cfg, std::string stage)
      : table_(workers), cfg_(std::move(cfg)), stage_(std::move(stage)) {}

  worker_table& table() noexcept { return table_; }
  [[nodiscard]] const worker_table& table() const noexcept { return table_; }
  [[nodiscard]] const std::string& stage() const noexcept { return stage_; }

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

  [[nodiscard]] worker_plan plan(worker_id w) const {
    worker_plan p = w < cfg_.plans.size() ? cfg_.plans[w] : worker_plan{};
    if (p.stage.empty()) p.stage = stage_;
    if (p.data_share == 0.0 && w < cfg_.weights.size()) p.data_share = cfg_.weights[w];
    return p;
  }
  void set_plan(worker_id w, worker_plan p) {
    if (w >= cfg_.plans.size()) cfg_.plans.resize(std::size_t{w} + 1);
    cfg_.plans[w] = std::move(p);
  }
  // Workers below the weights' size that had none get the scale.
  void set_weight(worker_id w, double weight) {
    if (w >= cfg_.weights.size()) cfg_.weights.resize(std::size_t{w} + 1, cfg_.scale);
    cfg_.weights[w] = weight;
  }

 private:
  worker_table table_;
  async_config cfg_;
  std::string stage_;
};

}  // namespace sync::detail
ASHL_NAMESPACE_END
