// ashl/sync/detail/round.hpp — synchronous rounds shared by BSP, Local SGD and
// the semi-asynchronous barrier. Not a public interface.
//
// Each worker has a queue of buffered round commits (normally at most one: its
// pull is held until its round completes). A round completes when every
// worker live in rounds has one; it takes the front commit of each of them
// and every commit left by evicted workers (received, so never lost), weighs
// them (mean, or by samples), and releases the held pulls of workers with
// nothing left buffered.
//
// Joins take effect at a round boundary (docs/elastic.md §2.4). A round is
// in progress from the moment the one before it completed (its workers are
// computing on that result), as long as at least min_workers are live in
// rounds. A worker that joins then is *pending*: it is live in the table,
// but the round neither waits for it nor takes its commits, and its pull is
// held (the policy asks pending()); when the round completes it becomes live
// in rounds and its pull is released with the round's, so its first commit
// is computed on the round's result and belongs to the next round. While
// fewer than min_workers are live in rounds (the round waits for a join) a
// joiner is live in rounds at once, as is a rejoiner whose commit from
// before its eviction is still buffered (it is in the round already).
// An eviction takes effect at once. No round completes with fewer than
// min_workers live in rounds (with min_workers 1 and nobody live, what the
// evicted sent still completes one, as before).
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
  round_core(std::size_t workers, round_weighting wt, std::uint32_t min_workers = 1)
      : head_(workers, no_position), tail_(workers, no_position), pending_(workers, 0), weighting_(wt),
        min_workers_(min_workers < 1 ? 1 : min_workers) {
    seq_.reserve(2 * workers);
    samples_.reserve(2 * workers);
    next_.reserve(2 * workers);
  }

  // Makes ids below n known; the table grew (a new id joined).
  void grow(std::size_t n) {
    if (head_.size() >= n) return;
    head_.resize(n, no_position);
    tail_.resize(n, no_position);
    pending_.resize(n, 0);
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
      if (in_rounds(t, w)) ++ready_;
    } else {
      next_[tail_[w]] = n;
    }
    tail_[w] = n;
    ++buffered_;
  }
  // Membership changed; call after the table's join succeeded (joined) or
  // before its evict (evicted). Returns true when the joiner is live in
  // rounds at once, false when it is pending until the round in progress
  // completes. Call settle() after either: an eviction may complete a round,
  // and so may a rejoiner whose buffered commit brings it to min_workers.
  bool joined(const worker_table& t, worker_id w) {
    grow(std::size_t{w} + 1);
    if (waiting(w)) {  // what it sent before its eviction counts for it now
      ++ready_;
      return true;
    }
    // Live in rounds before this join (the table counts the joiner already):
    // enough to run the round in progress without it.
    const std::size_t before = live_in_rounds(t) - 1;
    if (before >= min_workers_) {
      pending_[w] = 1;
      ++pending_count_;
      return false;
    }
    return true;
  }
  void evicted(worker_id w) {
    if (w < pending_.size() && pending_[w] != 0) {
      pending_[w] = 0;  // never counted in ready_; what it sent joins the next round as an evicted worker's
      --pending_count_;
      return;
    }
    if (waiting(w)) --ready_;
  }

  [[nodiscard]] bool waiting(worker_id w) const noexcept { return w < head_.size() && head_[w] != no_position; }
  // Joined during the round in progress: its pull is held until it completes.
  [[nodiscard]] bool pending(worker_id w) const noexcept { return w < pending_.size() && pending_[w] != 0; }
  [[nodiscard]] std::size_t pending_count() const noexcept { return pending_count_; }
  [[nodiscard]] std::uint32_t min_workers() const noexcept { return min_workers_; }
  // The workers a round waits for: live and not pending.
  [[nodiscard]] std::size_t live_in_rounds(const worker_table& t) const noexcept {
    return t.live_count() - pending_count_;
  }
  [[nodiscard]] std::size_t buffered() const noexcept { return buffered_; }
  [[nodiscard]] std::uint64_t rounds() const noexcept { return rounds_; }

  struct settled {
    std::uint64_t rounds = 0;  // rounds completed
    bool admitted = false;     // pending joiners became live in rounds (a boundary: every share changed)
  };
  // Complete every round that can complete now, admitting the pending
  // joiners at each boundary, then release what that unblocked. Pending
  // joiners are admitted at once when fewer than min_workers are live in
  // rounds (the round waits for them, so they must count in it).
  settled settle(worker_table& t, outcome_sink& out) {
    settled s;
    if (pending_count_ > 0 && live_in_rounds(t) < min_workers_) s.admitted = admit(t);
    while (complete(t)) {
      take_round(t, false, out);
      ++s.rounds;
      if (pending_count_ > 0) s.admitted = admit(t);
    }
    if (s.rounds > 0 || s.admitted) t.release_if(out, [&](worker_id w) { return !waiting(w) && !pending(w); });
    return s;
  }
  // Apply everything buffered as one round and release every held pull.
  void drain(worker_table& t, outcome_sink& out) {
    if (pending_count_ > 0) admit(t);
    if (buffered_ > 0) take_round(t, true, out);
    t.release_if(out, [](worker_id) { return true; });
  }

  // Version 2 adds min_workers and the pending flags; version 1 loads with
  // min_workers 1 and nothing pending.
  void save(state_writer& out) const {
    out.tag("ROND", 2);
    out.put(static_cast<std::uint8_t>(weighting_));
    out.put(rounds_);
    out.put(min_workers_);
    out.put<std::uint64_t>(head_.size());
    for (worker_id w = 0; w < head_.size(); ++w) {
      out.put<std::uint8_t>(pending_[w]);
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
    std::uint32_t version = 0;
    ASHL_TRY(in.tag("ROND", 1, 2, version));
    std::uint8_t wt = 0;
    ASHL_TRY(in.get(wt, "round.weighting"));
    if (wt > 1) return malformed("round.weighting", unsigned{wt}, "must be 0 (mean) or 1 (samples)");
    r.weighting_ = static_cast<round_weighting>(wt);
    ASHL_TRY(in.get(r.rounds_, "round.rounds"));
    if (version >= 2) {
      ASHL_TRY(in.get(r.min_workers_, "round.min_workers"));
      if (r.min_workers_ < 1) return malformed("round.min_workers", r.min_workers_, "must be >= 1");
    }
    std::uint64_t ids = 0;
    ASHL_TRY(in.count(ids, version >= 2 ? 9 : 8, "round.workers"));
    r.grow(static_cast<std::size_t>(ids));
    r.grow(t.size());
    for (worker_id w = 0; w < ids; ++w) {
      if (version >= 2) {
        std::uint8_t p = 0;
        ASHL_TRY(in.get(p, "round.pending"));
        if (p > 1) return malformed("round.pending", unsigned{p}, "must be 0 or 1");
        if (p == 1 && !t.is_live(w)) return malformed("round.pending", w, "a worker that is not live is pending");
        if (p == 1) {
          r.pending_[w] = 1;
          ++r.pending_count_;
        }
      }
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
  [[nodiscard]] bool in_rounds(const worker_table& t, worker_id w) const noexcept {
    return t.is_live(w) && pending_[w] == 0;
  }
  [[nodiscard]] bool complete(const worker_table& t) const noexcept {
    const std::size_t live = live_in_rounds(t);
    // With no live worker left (and min_workers 1), whatever the evicted
    // ones sent completes a round.
    if (live < min_workers_) return live == 0 && min_workers_ == 1 && buffered_ > 0;
    return ready_ == live;
  }
  // Every pending joiner becomes live in rounds. O(ids): at a boundary only.
  bool admit(const worker_table& t) {
    for (worker_id w = 0; w < pending_.size() && pending_count_ > 0; ++w) {
      if (pending_[w] == 0) continue;
      pending_[w] = 0;
      --pending_count_;
      if (waiting(w) && t.is_live(w)) ++ready_;
    }
    return true;
  }

  // Lists the round into `out` (the samples in the weight slot first), then
  // weighs it in place.
  void take_round(worker_table& t, bool everything, outcome_sink& out) {
    const std::size_t first = out.round().size();
    std::uint64_t total_samples = 0;
    bool all_counted = true;
    for (worker_id w = 0; w < head_.size(); ++w) {
      if (pending_[w] != 0) continue;  // its commits belong to the next round
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
  std::size_t ready_ = 0;  // workers live in rounds with something buffered
  std::vector<std::uint8_t> pending_;  // per worker: joined during the round in progress
  std::size_t pending_count_ = 0;
  round_weighting weighting_ = round_weighting::mean;
  std::uint32_t min_workers_ = 1;
  std::uint64_t rounds_ = 0;
};

}  // namespace detail
}  // namespace sync
ASHL_NAMESPACE_END
