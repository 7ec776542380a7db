// ashl/sync/detail/workers.hpp — per-worker bookkeeping shared by the policies:
// membership, duplicate detection, held pulls, staleness. Not a public
// interface. Membership rules (ALGORITHMS.md §1): barriers and bounds count
// live workers only; an evicted worker's held pull is dropped, never released
// (there is no one to answer); a rejoining id starts a fresh sequence.
#pragma once

#include <ashl/config.hpp>
#include <ashl/sync/events.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync::detail {

class worker_table {
 public:
  struct entry {
    bool live = false;
    bool held = false;          // a pull is waiting
    bool has_sequence = false;  // any commit accepted since joining
    std::uint64_t last_sequence = 0;
    std::uint64_t pulled_version = 0;  // server version at its last served pull
    std::uint64_t commits = 0;         // accepted commits since joining (plus join offset)
    double last_commit_time = 0.0;
    double prev_commit_time = 0.0;  // time of the commit before the last one
  };

  worker_table() = default;
  explicit worker_table(std::size_t n) : w_(n) {
    for (auto& e : w_) e.live = true;
  }

  [[nodiscard]] std::size_t size() const noexcept { return w_.size(); }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return w < w_.size() && w_[w].live; }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return w < w_.size() && w_[w].held; }
  [[nodiscard]] std::size_t live_count() const noexcept {
    std::size_t n = 0;
    for (const auto& e : w_) n += e.live ? 1 : 0;
    return n;
  }
  entry& operator[](worker_id w) { return w_[w]; }
  const entry& operator[](worker_id w) const { return w_[w]; }

  // Returns false when `w` was already live (nothing changes).
  bool join(worker_id w, std::uint64_t start_commits) {
    if (w >= w_.size()) w_.resize(std::size_t{w} + 1);
    if (w_[w].live) return false;
    w_[w] = entry{};
    w_[w].live = true;
    w_[w].commits = start_commits;
    w_[w].pulled_version = version_;
    return true;
  }
  // Returns false when `w` was not live. Its held pull is dropped.
  bool evict(worker_id w) {
    if (!is_live(w)) return false;
    w_[w].live = false;
    w_[w].held = false;
    return true;
  }

  // Accept a commit: live sender and a sequence not seen yet. Counts it.
  bool accept(const commit_event& c) {
    if (!is_live(c.worker)) return false;
    auto& e = w_[c.worker];
    if (e.has_sequence && c.sequence <= e.last_sequence) return false;
    e.has_sequence = true;
    e.last_sequence = c.sequence;
    e.commits += 1;
    e.prev_commit_time = e.last_commit_time;
    e.last_commit_time = c.time;
    return true;
  }

  // Server parameter versions, for staleness τ = version − pulled_version.
  [[nodiscard]] std::uint64_t version() const noexcept { return version_; }
  void bump_version(std::uint64_t n = 1) noexcept { version_ += n; }
  [[nodiscard]] std::uint64_t staleness(worker_id w) const noexcept {
    return version_ - w_[w].pulled_version;
  }
  void served(worker_id w) noexcept { w_[w].pulled_version = version_; }

  void hold(worker_id w) noexcept { w_[w].held = true; }

  // Release (and mark served) every held pull whose worker satisfies pred.
  template <class Pred>
  std::vector<worker_id> release_if(Pred&& pred) {
    std::vector<worker_id> out;
    for (worker_id w = 0; w < w_.size(); ++w) {
      if (w_[w].live && w_[w].held && pred(w)) {
        w_[w].held = false;
        served(w);
        out.push_back(w);
      }
    }
    return out;
  }
  std::vector<worker_id> release_all() {
    return release_if([](worker_id) { return true; });
  }

  // Smallest commit count over live workers (0 when none is live).
  [[nodiscard]] std::uint64_t min_live_commits() const noexcept {
    bool any = false;
    std::uint64_t m = 0;
    for (const auto& e : w_) {
      if (!e.live) continue;
      if (!any || e.commits < m) m = e.commits;
      any = true;
    }
    return m;
  }

 private:
  std::vector<entry> w_;
  std::uint64_t version_ = 0;
};

}  // namespace sync::detail
ASHL_NAMESPACE_END
