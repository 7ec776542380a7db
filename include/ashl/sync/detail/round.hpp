// ashl/sync/detail/round.hpp — synchronous rounds shared by BSP, Local SGD and
// the semi-asynchronous barrier. Not a public interface.
//
// Each worker has a queue of buffered round commits (normally at most one: its
// pull is held until its round completes). A round completes when every live
// worker has one; it takes the front commit of each live worker and every
// commit left by evicted workers (received, so never lost), weighs them
// (mean, or by samples), and releases the held pulls of workers with nothing
// left buffered.
//
// Cost: completeness is a counter (live workers with something buffered)
// kept on every add, take, join and eviction, so an event that completes no
// round is O(1); a completed round costs O(ids) once, since it names up to M
// commits. The queues are intrusive lists in one node pool that grows only
// past its high-water mark (reserved for two commits per worker), never per
// event in steady state.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/detail/workers.hpp>
#include <ashl/sync/events.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
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
  round_core(std::size_t workers, round_weighting wt)
      : head_(workers, no_position), tail_(workers, no_position), weighting_(wt) {
    seq_.reserve(2 * workers);
    samples_.reserve(2 * workers);
    next_.reserve(2 * workers);
  }

  // Makes ids below n known; the table grew (a new id joined).
  void grow(std::size_t n) {
    if (head_.size() >= n) return;
    head_.resize(n, no_position);
    tail_.resize(n, no_position);
    seq_.reserve(2 * n);
    samples_.reserve(2 * n);
    next_.reserve(2 * n);
  }

  // An accepted commit of a live worker joins its queue.
  void add(const worker_table& t, const commit_event& c) {
    grow(t.size());
    const worker_id w = c.worker;
    std::uint32_t n = free_;
    if (n != no_position) {
      free_ = next_[n];
      seq_[n] = c.sequence;
      samples_[n] = c.samples;
      next_[n] = no_position;
    } else {
      n = static_cast<std::uint32_t>(seq_.size());
      seq_.push_back(c.sequence);
      samples_.push_back(c.samples);
      next_.push_back(no_position);
    }
    if (head_[w] == no_position) {
      head_[w] = n;
      if (t.is_live(w)) ++ready_;
    } else {
      next_[tail_[w]] = n;
    }
    tail_[w] = n;
    ++buffered_;
  }
  // Membership changed; call after the table's join / evict succeeded.
  void joined(worker_id w) {
    grow(std::size_t{w} + 1);
    if (waiting(w)) ++ready_;  // what it sent before its eviction counts for it now
  }
  void evicted(worker_id w) {
    if (waiting(w)) --ready_;
  }

  [[nodiscard]] bool waiting(worker_id w) const noexcept { return w < head_.size() && head_[w] != no_position; }
  [[nodiscard]] std::size_t buffered() const noexcept { return buffered_; }
  [[nodiscard]] std::uint64_t rounds() const noexcept { return rounds_; }

  // Complete every round that can complete now, then release what that
  // unblocked. Returns the number of rounds completed.
  std::uint64_t settle(worker_table& t, outcome_sink& out) {
    std::uint64_t n = 0;
    while (complete(t)) {
      take_round(t, false, out);
      ++n;
    }
    if (n > 0) t.release_if(out, [&](worker_id w) { return !waiting(w); });
    return n;
  }
  // Apply everything buffered as one round and release every held pull.
  void drain(worker_table& t, outcome_sink& out) {
    if (buffered_ > 0) take_round(t, true, out);
    t.release_if(out, [](worker_id) { return true; });
  }

  void save(state_writer& out) const {
    out.tag("ROND", 1);
    out.put(static_cast<std::uint8_t>(weighting_));
    out.put(rounds_);
    out.put<std::uint64_t>(head_.size());
    for (worker_id w = 0; w < head_.size(); ++w) {
      std::uint64_t k = 0;
      for (auto n = head_[w]; n != no_position; n = next_[n]) ++k;
      out.put(k);
      for (auto n = head_[w]; n != no_position; n = next_[n]) {
        out.put(seq_[n]);
        out.put(samples_[n]);
      }
    }
  }
  // Reads the queues saved by save(); `t` is the (already loaded) table.
  status load(state_reader& in, const worker_table& t) {
    round_core r;
    ASHL_TRY(in.tag("ROND", 1));
    std::uint8_t wt = 0;
    ASHL_TRY(in.get(wt, "round.weighting"));
    if (wt > 1) return malformed("round.weighting", unsigned{wt}, "must be 0 (mean) or 1 (samples)");
    r.weighting_ = static_cast<round_weighting>(wt);
    ASHL_TRY(in.get(r.rounds_, "round.rounds"));
    std::uint64_t ids = 0;
    ASHL_TRY(in.count(ids, 8, "round.workers"));
    r.grow(static_cast<std::size_t>(ids));
    r.grow(t.size());
    for (worker_id w = 0; w < ids; ++w) {
      std::uint64_t k = 0;
      ASHL_TRY(in.count(k, 16, "round.queue"));
      for (std::uint64_t i = 0; i < k; ++i) {
        commit_event c{.worker = w};
        ASHL_TRY(in.get(c.sequence, "round.sequence"));
        ASHL_TRY(in.get(c.samples, "round.samples"));
        r.add(t, c);
      }
    }
    *this = std::move(r);
    return {};
  }

 private:
  [[nodiscard]] bool complete(const worker_table& t) const noexcept {
    // With no live worker left, whatever the evicted ones sent completes a round.
    return t.live_count() > 0 ? ready_ == t.live_count() : buffered_ > 0;
  }

  // Lists the round into `out` (the samples in the weight slot first), then
  // weighs it in place.
  void take_round(worker_table& t, bool everything, outcome_sink& out) {
    const std::size_t first = out.round().size();
    std::uint64_t total_samples = 0;
    bool all_counted = true;
    for (worker_id w = 0; w < head_.size(); ++w) {
      const bool live = t.is_live(w);
      const bool all = everything || !live;
      while (head_[w] != no_position) {
        const std::uint32_t n = head_[w];
        out.apply(w, seq_[n], static_cast<double>(samples_[n]));
        // Saturating: a driver bounds each commit's samples (server_core's
        // max_commit_samples), so only a misconfigured bound reaches the top.
        total_samples = samples_[n] > ~std::uint64_t{0} - total_samples ? ~std::uint64_t{0} : total_samples + samples_[n];
        all_counted = all_counted && samples_[n] > 0;
        head_[w] = next_[n];
        next_[n] = free_;
        free_ = n;
        --buffered_;
        if (head_[w] == no_position) {
          tail_[w] = no_position;
          if (live) --ready_;
        }
        if (!all) break;
      }
    }
    auto round = out.round_from(first);
    const bool by_samples = weighting_ == round_weighting::samples && all_counted && total_samples > 0;
    for (auto& c : round)
      c.weight = by_samples ? c.weight / static_cast<double>(total_samples) : 1.0 / static_cast<double>(round.size());
    t.bump_version();
    ++rounds_;
  }

  // Node pool: commit (sequence, samples) and the next node of its queue.
  std::vector<std::uint64_t> seq_;
  std::vector<std::uint64_t> samples_;
  std::vector<std::uint32_t> next_;
  std::uint32_t free_ = no_position;
  std::vector<std::uint32_t> head_;  // per worker: first node, or no_position
  std::vector<std::uint32_t> tail_;
  std::size_t buffered_ = 0;
  std::size_t ready_ = 0;  // live workers with something buffered
  round_weighting weighting_ = round_weighting::mean;
  std::uint64_t rounds_ = 0;
};

}  // namespace detail
}  // namespace sync
ASHL_NAMESPACE_END
