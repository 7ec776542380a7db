// ashl/sync/detail/workers.hpp — per-worker bookkeeping shared by the policies:
// membership, duplicate detection, held pulls, staleness, and the minimum
// commit count over live workers. Not a public interface.
//
// Membership rules (docs/algorithms.md §1): barriers and bounds count live workers
// only; an evicted worker's held pull is dropped, never released (there is no
// one to answer); a rejoining id starts a fresh sequence.
//
// Cost rules (docs/sim.md): no event scans every worker and
// none allocates after warm-up. The minimum clock comes from an indexed
// binary heap over the live workers (O(log M) per commit, join or eviction,
// O(1) to read); every per-worker array grows only when a new id joins.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/events.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync::detail {

inline constexpr std::uint32_t no_position = 0xffffffffu;

// A binary min-heap of worker ids whose keys live elsewhere: every operation
// takes the position table (worker → index here, or no_position) and a strict
// weak order on ids. Keys must be unique (break ties by id) so the order of
// pops is a function of the keys alone, whatever the heap's layout: a loaded
// copy rebuilt from the keys decides exactly as the saved one.
class id_heap {
 public:
  [[nodiscard]] bool empty() const noexcept { return h_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return h_.size(); }
  [[nodiscard]] worker_id top() const noexcept { return h_.front(); }
  [[nodiscard]] const std::vector<worker_id>& items() const noexcept { return h_; }
  void reserve(std::size_t n) { h_.reserve(n); }

  template <class Less>
  void push(worker_id w, std::vector<std::uint32_t>& pos, Less&& less) {
    ASHL_ASSERT(pos[w] == no_position, "id_heap::push: already in a heap");
    h_.push_back(w);
    pos[w] = static_cast<std::uint32_t>(h_.size() - 1);
    up(h_.size() - 1, pos, less);
  }
  template <class Less>
  worker_id pop(std::vector<std::uint32_t>& pos, Less&& less) {
    const worker_id w = h_.front();
    remove_at(0, pos, less);
    return w;
  }
  template <class Less>
  void remove(worker_id w, std::vector<std::uint32_t>& pos, Less&& less) {
    ASHL_ASSERT(pos[w] != no_position, "id_heap::remove: not in a heap");
    remove_at(pos[w], pos, less);
  }
  // w's key changed (either way).
  template <class Less>
  void update(worker_id w, std::vector<std::uint32_t>& pos, Less&& less) {
    const std::size_t i = pos[w];
    up(i, pos, less);
    down(pos[w], pos, less);
  }
  void clear(std::vector<std::uint32_t>& pos) noexcept {
    for (worker_id w : h_) pos[w] = no_position;
    h_.clear();
  }

 private:
  template <class Less>
  void remove_at(std::size_t i, std::vector<std::uint32_t>& pos, Less& less) {
    const worker_id gone = h_[i];
    const worker_id last = h_.back();
    h_.pop_back();
    pos[gone] = no_position;
    if (i == h_.size()) return;
    h_[i] = last;
    pos[last] = static_cast<std::uint32_t>(i);
    up(i, pos, less);
    down(pos[last], pos, less);
  }
  template <class Less>
  void up(std::size_t i, std::vector<std::uint32_t>& pos, Less& less) {
    const worker_id w = h_[i];
    while (i > 0) {
      const std::size_t parent = (i - 1) / 2;
      if (!less(w, h_[parent])) break;
      h_[i] = h_[parent];
      pos[h_[i]] = static_cast<std::uint32_t>(i);
      i = parent;
    }
    h_[i] = w;
    pos[w] = static_cast<std::uint32_t>(i);
  }
  template <class Less>
  void down(std::size_t i, std::vector<std::uint32_t>& pos, Less& less) {
    const worker_id w = h_[i];
    const std::size_t n = h_.size();
    for (;;) {
      std::size_t c = 2 * i + 1;
      if (c >= n) break;
      if (c + 1 < n && less(h_[c + 1], h_[c])) ++c;
      if (!less(h_[c], w)) break;
      h_[i] = h_[c];
      pos[h_[i]] = static_cast<std::uint32_t>(i);
      i = c;
    }
    h_[i] = w;
    pos[w] = static_cast<std::uint32_t>(i);
  }

  std::vector<worker_id> h_;
};

// ------------------------------------------------------------ save helpers

// The plan's fields in their table's order (worker_plan::fields()). A
// section of version `with_codec_options` or later holds every field; an
// older one the fields before the codec options (which load as 0).
inline void save_plan(state_writer& w, const worker_plan& p) { put_fields(w, p); }
inline status load_plan(state_reader& r, worker_plan& p, bool with_codec_options = true) {
  worker_plan n;
  if (with_codec_options) ASHL_TRY(get_fields(r, n, "worker_plan"));
  else ASHL_TRY(get_fields(r, n, "worker_plan", worker_plan::fields_before_codec()));
  const auto stage = static_cast<std::uint32_t>(n.stage);
  if (stage >= stage_id_count) return malformed("worker_plan.stage", stage, "not a stage id");
  p = n;
  return {};
}
inline status load_stage(state_reader& r, stage_id& s, std::string_view field) {
  std::uint32_t v = 0;
  ASHL_TRY(r.get(v, field));
  if (v >= stage_id_count) return malformed(field, v, "not a stage id");
  s = static_cast<stage_id>(v);
  return {};
}
inline void save_weighting(state_writer& w, const staleness_weighting& s) {
  w.put(static_cast<std::uint8_t>(s.mode));
  w.put(s.exponent);
}
inline status load_weighting(state_reader& r, staleness_weighting& s) {
  std::uint8_t mode = 0;
  staleness_weighting n;
  ASHL_TRY(r.get(mode, "staleness_weight.mode"));
  if (mode > 2) return malformed("staleness_weight.mode", unsigned{mode}, "must be 0 (none), 1 (inverse) or 2 (power)");
  n.mode = static_cast<staleness_weighting::kind>(mode);
  ASHL_TRY(r.get(n.exponent, "staleness_weight.exponent"));
  s = n;
  return {};
}

// ------------------------------------------------------------ the table

class worker_table {
 public:
  struct entry {
    bool live = false;
    bool held = false;          // a pull is waiting
    bool has_sequence = false;  // any commit accepted since joining
    std::uint64_t last_sequence = 0;
    std::uint64_t pulled_version = 0;  // server version at its last served pull
    std::uint64_t commits = 0;         // c_i: start + commits accepted since joining
    std::uint64_t start = 0;           // c_i when it joined
    double last_commit_time = 0.0;
    double prev_commit_time = 0.0;  // time of the commit before the last one
  };

 private:
  // (commits, order key, id): unique, so the minimum is well defined.
  struct order_fn {
    const worker_table* t;
    bool operator()(worker_id a, worker_id b) const noexcept {
      const auto& x = t->w_[a];
      const auto& y = t->w_[b];
      if (x.commits != y.commits) return x.commits < y.commits;
      if (t->key_[a] != t->key_[b]) return t->key_[a] < t->key_[b];
      return a < b;
    }
  };
  [[nodiscard]] order_fn order() const noexcept { return {this}; }

 public:

  worker_table() = default;
  explicit worker_table(std::size_t n) : w_(n), key_(n, 0.0), pos_(n, no_position) {
    live_.reserve(n);
    for (worker_id w = 0; w < n; ++w) {
      w_[w].live = true;
      live_.push(w, pos_, order());
    }
    live_count_ = n;
  }

  [[nodiscard]] std::size_t size() const noexcept { return w_.size(); }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return w < w_.size() && w_[w].live; }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return w < w_.size() && w_[w].held; }
  [[nodiscard]] std::size_t live_count() const noexcept { return live_count_; }
  [[nodiscard]] std::size_t held_count() const noexcept { return held_count_; }
  [[nodiscard]] const entry& operator[](worker_id w) const { return w_[w]; }

  // Makes ids below n known (not live); the only place the table grows.
  void grow(std::size_t n) {
    if (n <= w_.size()) return;
    w_.resize(n);
    key_.resize(n, 0.0);
    pos_.resize(n, no_position);
    live_.reserve(n);
  }

  // Returns false when `w` was already live (nothing changes).
  bool join(worker_id w, std::uint64_t start_commits) {
    grow(std::size_t{w} + 1);
    if (w_[w].live) return false;
    w_[w] = entry{};
    w_[w].live = true;
    w_[w].commits = start_commits;
    w_[w].start = start_commits;
    w_[w].pulled_version = version_;
    key_[w] = 0.0;
    live_.push(w, pos_, order());
    ++live_count_;
    return true;
  }
  // Returns false when `w` was not live. Its held pull is dropped (the
  // policy that orders held pulls drops its own entry too).
  bool evict(worker_id w) {
    if (!is_live(w)) return false;
    w_[w].live = false;
    unhold(w);
    live_.remove(w, pos_, order());
    --live_count_;
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
    live_.update(c.worker, pos_, order());
    return true;
  }

  // Smallest commit count over live workers (0 when none is live), O(1).
  [[nodiscard]] std::uint64_t min_live_commits() const noexcept {
    return live_.empty() ? 0 : w_[live_.top()].commits;
  }
  // The live worker of smallest (commits, order key, id); only when any is live.
  [[nodiscard]] worker_id min_live_worker() const noexcept { return live_.top(); }
  // A secondary order among live workers of equal commit count (DSSP puts the
  // predicted next commit time here); 0 unless set.
  void set_order_key(worker_id w, double k) {
    key_[w] = k;
    if (pos_[w] != no_position) live_.update(w, pos_, order());
  }
  [[nodiscard]] double order_key(worker_id w) const noexcept { return key_[w]; }

  // Server parameter versions, for staleness τ = version − pulled_version.
  [[nodiscard]] std::uint64_t version() const noexcept { return version_; }
  void bump_version(std::uint64_t n = 1) noexcept { version_ += n; }
  [[nodiscard]] std::uint64_t staleness(worker_id w) const noexcept { return version_ - w_[w].pulled_version; }
  void served(worker_id w) noexcept { w_[w].pulled_version = version_; }

  void hold(worker_id w) noexcept {
    if (!w_[w].held) ++held_count_;
    w_[w].held = true;
  }
  void unhold(worker_id w) noexcept {
    if (w_[w].held) --held_count_;
    w_[w].held = false;
  }
  // Answer w's held pull now: not held, served, named in the sink.
  void release(worker_id w, outcome_sink& out) {
    unhold(w);
    served(w);
    out.release(w);
  }
  // Release every held pull, in id order. O(ids) when anything is held: for
  // drains and completed rounds only.
  template <class Pred>
  void release_if(outcome_sink& out, Pred&& pred) {
    if (held_count_ == 0) return;
    for (worker_id w = 0; w < w_.size(); ++w)
      if (w_[w].live && w_[w].held && pred(w)) release(w, out);
  }

  void save(state_writer& out) const {
    out.tag("WTAB", 1);
    out.put<std::uint64_t>(version_);
    out.put<std::uint64_t>(w_.size());
    for (worker_id w = 0; w < w_.size(); ++w) {
      const entry& e = w_[w];
      out.put(e.live);
      out.put(e.held);
      out.put(e.has_sequence);
      out.put(e.last_sequence);
      out.put(e.pulled_version);
      out.put(e.commits);
      out.put(e.start);
      out.put(e.last_commit_time);
      out.put(e.prev_commit_time);
      out.put(key_[w]);
    }
  }
  status load(state_reader& in) {
    worker_table n;
    ASHL_TRY(in.tag("WTAB", 1));
    ASHL_TRY(in.get(n.version_, "worker_table.version"));
    std::uint64_t size = 0;
    ASHL_TRY(in.count(size, 3 + 6 * 8, "worker_table.size"));
    n.grow(static_cast<std::size_t>(size));
    for (worker_id w = 0; w < n.w_.size(); ++w) {
      entry& e = n.w_[w];
      ASHL_TRY(in.get(e.live, "worker_table.live"));
      ASHL_TRY(in.get(e.held, "worker_table.held"));
      ASHL_TRY(in.get(e.has_sequence, "worker_table.has_sequence"));
      ASHL_TRY(in.get(e.last_sequence, "worker_table.last_sequence"));
      ASHL_TRY(in.get(e.pulled_version, "worker_table.pulled_version"));
      ASHL_TRY(in.get(e.commits, "worker_table.commits"));
      ASHL_TRY(in.get(e.start, "worker_table.start"));
      ASHL_TRY(in.get(e.last_commit_time, "worker_table.last_commit_time"));
      ASHL_TRY(in.get(e.prev_commit_time, "worker_table.prev_commit_time"));
      ASHL_TRY(in.get(n.key_[w], "worker_table.order_key"));
      if (e.held && !e.live) return malformed("worker_table.held", w, "a worker that is not live holds a pull");
      if (e.commits < e.start) return malformed("worker_table.commits", e.commits, "below the worker's start");
      if (e.pulled_version > n.version_)
        return malformed("worker_table.pulled_version", e.pulled_version, "above the server version");
      if (std::isnan(n.key_[w])) return malformed("worker_table.order_key", w, "NaN");
      if (e.live) {
        n.live_.push(w, n.pos_, n.order());
        ++n.live_count_;
      }
      if (e.held) ++n.held_count_;
    }
    *this = std::move(n);
    return {};
  }

 private:
  std::vector<entry> w_;
  std::vector<double> key_;
  std::vector<std::uint32_t> pos_;  // index in live_
  id_heap live_;
  std::size_t live_count_ = 0;
  std::size_t held_count_ = 0;
  std::uint64_t version_ = 0;
};

// A pull answered now: its worker is no longer held (every policy's last
// word on a pull it does not hold).
inline pull_action serve(worker_table& t, worker_id w) {
  t.served(w);
  return pull_action::serve;
}

}  // namespace sync::detail
ASHL_NAMESPACE_END
