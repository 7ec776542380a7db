// ashl/sync/local_sgd.hpp — Local SGD(H): H local steps, commit the model
// delta, pull; synchronous across workers.
//
//   ashl::sync::local_sgd p{{.workers = 4, .local_steps = 2}};
//   p.plan(0).local_iterations;                       // 2
//
// A round is one delta from each live worker, averaged (or batch-weighted):
// BSP whose commit is a model delta after H steps. ALGORITHMS.md §1
// "Local SGD(H)".
#pragma once

#include <ashl/config.hpp>
#include <ashl/sync/bsp.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/events.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

ASHL_NAMESPACE_BEGIN
namespace sync {

struct local_sgd_params {
  std::size_t workers = 0;
  std::uint32_t local_steps = 2;  // H, >= 1
  round_weighting weighting = round_weighting::mean;
  std::uint32_t batch_size = 0;
  std::string stage = "local_sgd";
};

class local_sgd {
 public:
  using policy_concept = policy_tag;

  local_sgd() = default;
  explicit local_sgd(local_sgd_params p)
      : rounds_(bsp_params{p.workers, p.weighting, p.local_steps, p.batch_size, std::move(p.stage)}) {
    ASHL_ASSERT(p.local_steps >= 1, "local_sgd: local_steps must be >= 1");
  }

  commit_decision on_commit(const commit_event& c) { return rounds_.on_commit(c); }
  pull_decision on_pull(const pull_event& q) { return rounds_.on_pull(q); }
  outcome on_metric(const metric_event& m) { return rounds_.on_metric(m); }
  outcome on_join(const membership_event& j) { return rounds_.on_join(j); }
  outcome on_evict(const membership_event& j) { return rounds_.on_evict(j); }
  outcome on_measurement(const measurement_event& x) { return rounds_.on_measurement(x); }
  outcome drain() { return rounds_.drain(); }

  [[nodiscard]] worker_plan plan(worker_id w) const { return rounds_.plan(w); }
  [[nodiscard]] std::string_view name() const noexcept { return rounds_.name(); }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return rounds_.is_live(w); }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return rounds_.is_held(w); }
  [[nodiscard]] std::uint64_t rounds() const noexcept { return rounds_.rounds(); }

 private:
  bsp rounds_;
};

static_assert(consistency_policy<local_sgd>);

}  // namespace sync
ASHL_NAMESPACE_END
