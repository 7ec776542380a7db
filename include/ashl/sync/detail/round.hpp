// ashl/sync/detail/round.hpp — synchronous rounds shared by BSP, Local SGD and
// the semi-asynchronous barrier. Not a public interface.
//
// Each worker has a queue of buffered round commits (normally at most one: its
// pull is held until its round completes). A round completes when every live
// worker has one; it takes the front commit of each live worker and every
// commit left by evicted workers (received, so never lost), weighs them
// (mean, or by samples), and releases the held pulls of workers with nothing
// left buffered.
#pragma once

#include <ashl/config.hpp>
#include <ashl/sync/detail/workers.hpp>
#include <ashl/sync/events.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

enum class round_weighting : std::uint8_t {
  mean,     // 1/n for each of the n commits of a round
  samples,  // b_i / Σ b (commit_event::samples); mean when no sample counts are given
};

namespace detail {

class round_core {
 public:
  round_core() = default;
  round_core(std::size_t workers, round_weighting wt) : q_(workers), weighting_(wt) {}

  void add(const commit_event& c) {
    if (c.worker >= q_.size()) q_.resize(std::size_t{c.worker} + 1);
    q_[c.worker].push_back({c.sequence, c.samples});
  }
  [[nodiscard]] bool waiting(worker_id w) const noexcept { return w < q_.size() && !q_[w].empty(); }
  [[nodiscard]] std::size_t buffered() const noexcept {
    std::size_t n = 0;
    for (const auto& q : q_) n += q.size();
    return n;
  }
  [[nodiscard]] std::uint64_t rounds() const noexcept { return rounds_; }

  // Complete every round that can complete now; release what that unblocks.
  outcome settle(worker_table& t) {
    outcome o;
    while (complete(t)) take_round(t, false, o.round);
    o.released = t.release_if([&](worker_id w) { return !waiting(w); });
    return o;
  }
  // Apply everything buffered as one round and release every held pull.
  outcome drain(worker_table& t) {
    outcome o;
    if (buffered() > 0) take_round(t, true, o.round);
    o.released = t.release_all();
    return o;
  }

 private:
  struct pending {
    std::uint64_t sequence;
    std::uint64_t samples;
  };

  [[nodiscard]] bool complete(const worker_table& t) const {
    bool any_live = false;
    for (worker_id w = 0; w < t.size(); ++w) {
      if (!t.is_live(w)) continue;
      any_live = true;
      if (!waiting(w)) return false;
    }
    // With no live worker left, whatever the evicted ones sent completes a round.
    return any_live || buffered() > 0;
  }

  void take_round(worker_table& t, bool everything, std::vector<weighted_commit>& out) {
    const std::size_t first = out.size();
    std::uint64_t total_samples = 0;
    bool all_counted = true;
    std::vector<std::uint64_t> samples;
    for (worker_id w = 0; w < q_.size(); ++w) {
      auto& q = q_[w];
      const bool all = everything || !t.is_live(w);
      while (!q.empty()) {
        out.push_back({w, q.front().sequence, 0.0});
        samples.push_back(q.front().samples);
        total_samples += q.front().samples;
        all_counted = all_counted && q.front().samples > 0;
        q.pop_front();
        if (!all) break;
      }
    }
    const std::size_t n = out.size() - first;
    for (std::size_t k = 0; k < n; ++k) {
      out[first + k].weight = (weighting_ == round_weighting::samples && all_counted && total_samples > 0)
                                  ? static_cast<double>(samples[k]) / static_cast<double>(total_samples)
                                  : 1.0 / static_cast<double>(n);
    }
    t.bump_version();
    ++rounds_;
  }

  std::vector<std::deque<pending>> q_;
  round_weighting weighting_ = round_weighting::mean;
  std::uint64_t rounds_ = 0;
};

}  // namespace detail
}  // namespace sync
ASHL_NAMESPACE_END
