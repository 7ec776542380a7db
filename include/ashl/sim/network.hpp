// ashl/sim/network.hpp — a shared link: the bandwidth of a server's link
// divided among the transfers that use it at the same time; and link_set,
// the links of a cluster with the scheduling of their completions.
//
//   ashl::sim::shared_link up{/*bytes/s*/ 1e9};
//   up.add(/*now*/ 0.0, /*id*/ 7, /*bytes*/ 1e6, /*cap*/ 2e9);   // alone: 1 GB/s
//   up.add(0.0, 8, 1e6, 2e9);                                   // now 0.5 GB/s each
//   auto next = up.next_completion(0.0);                        // {0.002 s, id 7}
//   up.remove(next->time, next->id);
//
// Processor sharing with a per-transfer cap: with n transfers active, each
// runs at min(cap_i, B / n), where cap_i is the sender's own link (ours:
// share a transfer leaves unused because of its cap is not redistributed;
// this keeps every rate a closed form and the arithmetic hand-checkable).
// An unlimited link (B = inf) runs each transfer at its cap.
//
// Cost per add, remove or next_completion: O(log n), not O(n), so a link
// with 10,000 concurrent transfers is as cheap per event as one with ten.
// Transfers with the same cap progress identically, so they form one group
// with a progress coordinate P (bytes served to each member since the group
// began); a transfer finishes when P reaches its tag (P at its start plus its
// bytes), and a group keeps its tags in a min-heap. A group is either capped
// (cap < B/n: P grows at cap, its next finish is a fixed time) or shared (P
// grows with the link's virtual time V, V' = B/n: its next finish is a fixed
// V). Two ordered sets hold each group's next finish, one in time and one in
// V, so the earliest completion is the smaller of two set heads. When n
// changes only the groups whose cap lies between the old and the new share
// change class (O(log G) each). Ids should be small integers (a vector is
// indexed by id). docs/sim.md "Network".
#pragma once

#include <ashl/config.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sim {

class shared_link {
 public:
  struct completion {
    double time;
    std::uint64_t id;
  };

  shared_link() = default;
  explicit shared_link(double bandwidth_bytes_per_s) : bandwidth_(bandwidth_bytes_per_s) {}

  [[nodiscard]] double bandwidth() const noexcept { return bandwidth_; }
  [[nodiscard]] std::size_t active() const noexcept { return active_; }
  // The rate a transfer with this cap gets now.
  [[nodiscard]] double rate(double cap) const noexcept {
    if (active_ == 0 || !std::isfinite(bandwidth_)) return cap;
    return std::min(cap, share());
  }

  void add(double now, std::uint64_t id, double bytes, double cap) {
    advance(now);
    if (id >= flows_.size()) flows_.resize(static_cast<std::size_t>(id) + 1);
    ASHL_ASSERT(!flows_[id].active, "shared_link::add: id already active");
    const double old_share = share();
    ++active_;
    const std::uint32_t g = group_of(cap);
    group& gr = groups_[g];
    const double tag = progress(gr) + std::max(bytes, 0.0);
    flows_[id] = flow{g, tag, ++serial_, true};
    const bool new_min = gr.heap.empty() || entry_before({tag, id, serial_}, gr.heap.front());
    if (new_min) unlist(g);
    gr.heap.push_back({tag, id, serial_});
    std::push_heap(gr.heap.begin(), gr.heap.end(), heap_after);
    ++gr.members;
    if (new_min) list(g);
    reclassify(old_share);
  }

  // Removes a transfer (finished or cancelled); false when it is not here.
  bool remove(double now, std::uint64_t id) {
    if (id >= flows_.size() || !flows_[id].active) return false;
    advance(now);
    const double old_share = share();
    flow& f = flows_[id];
    const std::uint32_t g = f.group;
    group& gr = groups_[g];
    f.active = false;
    --active_;
    --gr.members;
    const bool was_min = gr.heap.front().id == id && gr.heap.front().serial == f.serial;
    if (was_min) unlist(g);
    if (gr.members == 0) {
      release(g);
    } else if (was_min) {
      pop_stale(gr);
      list(g);
    }
    reclassify(old_share);
    return true;
  }

  // The earliest finishing transfer if nothing changes; ties: lowest id.
  [[nodiscard]] std::optional<completion> next_completion(double now) const {
    std::optional<completion> best;
    const double t0 = now < last_ ? last_ : now;
    if (!by_time_.empty()) {
      const auto& [t, id] = *by_time_.begin();
      best = completion{std::max(t, t0), id};
    }
    if (!by_v_.empty()) {
      const auto& [v, id] = *by_v_.begin();
      const double dv = v - v_at(t0);
      const double t = t0 + (dv > 0.0 ? dv / share() : 0.0);
      if (!best || t < best->time || (t == best->time && id < best->id)) best = completion{t, id};
    }
    return best;
  }

  // Bytes the transfer has left at `now`; 0 when it is not here.
  [[nodiscard]] double remaining(double now, std::uint64_t id) const {
    if (id >= flows_.size() || !flows_[id].active) return 0.0;
    const flow& f = flows_[id];
    const group& gr = groups_[f.group];
    const double t = now < last_ ? last_ : now;
    const double p = gr.capped ? gr.p_ref + gr.cap * (t - gr.ref) : gr.p_ref + (v_at(t) - gr.ref);
    return std::max(0.0, f.tag - p);
  }

 private:
  struct entry {
    double tag;
    std::uint64_t id;
    std::uint64_t serial;
  };
  // min-heap on (tag, id) through std::push_heap's max-heap with "after".
  static bool entry_before(const entry& a, const entry& b) noexcept {
    return a.tag < b.tag || (a.tag == b.tag && a.id < b.id);
  }
  static bool heap_after(const entry& a, const entry& b) noexcept { return entry_before(b, a); }

  struct group {
    double cap = 0.0;
    bool capped = false;  // P grows at cap (true) or with V (false)
    double ref = 0.0;     // capped: the time of p_ref; shared: the V of p_ref
    double p_ref = 0.0;   // P at ref
    std::uint32_t members = 0;
    std::vector<entry> heap;   // may hold entries of removed transfers (skipped lazily)
    bool listed = false;
    std::pair<double, std::uint64_t> key{};  // its entry in by_time_ or by_v_
  };
  struct flow {
    std::uint32_t group = 0;
    double tag = 0.0;
    std::uint64_t serial = 0;
    bool active = false;
  };

  [[nodiscard]] double share() const noexcept {
    return active_ == 0 ? std::numeric_limits<double>::infinity() : bandwidth_ / static_cast<double>(active_);
  }
  [[nodiscard]] double v_at(double t) const noexcept {
    return active_ == 0 || !std::isfinite(bandwidth_) ? v_ : v_ + share() * (t - last_);
  }
  // Brings V to `now` (the share is constant since last_).
  void advance(double now) {
    if (now > last_) {
      v_ = v_at(now);
      last_ = now;
    }
  }
  [[nodiscard]] double progress(const group& gr) const noexcept {
    return gr.capped ? gr.p_ref + gr.cap * (last_ - gr.ref) : gr.p_ref + (v_ - gr.ref);
  }

  std::uint32_t group_of(double cap) {
    const auto it = by_cap_.find(cap);
    if (it != by_cap_.end()) return it->second;
    std::uint32_t g;
    if (!free_.empty()) {
      g = free_.back();
      free_.pop_back();
    } else {
      g = static_cast<std::uint32_t>(groups_.size());
      groups_.emplace_back();
    }
    group& gr = groups_[g];
    gr.cap = cap;
    gr.members = 0;
    gr.heap.clear();
    gr.listed = false;
    gr.p_ref = 0.0;
    gr.capped = cap < share();
    gr.ref = gr.capped ? last_ : v_;
    by_cap_.emplace(cap, g);
    return g;
  }
  void release(std::uint32_t g) {
    group& gr = groups_[g];
    gr.heap.clear();
    by_cap_.erase(gr.cap);
    free_.push_back(g);
  }
  void pop_stale(group& gr) {
    while (!gr.heap.empty()) {
      const entry& e = gr.heap.front();
      const flow& f = flows_[e.id];
      if (f.active && f.serial == e.serial) return;
      std::pop_heap(gr.heap.begin(), gr.heap.end(), heap_after);
      gr.heap.pop_back();
    }
  }
  // Lists a group's earliest transfer in the set of its class.
  void list(std::uint32_t g) {
    group& gr = groups_[g];
    if (gr.members == 0) return;
    const entry& e = gr.heap.front();
    if (gr.capped) {
      gr.key = {gr.ref + (e.tag - gr.p_ref) / gr.cap, e.id};
      by_time_.insert(gr.key);
    } else {
      gr.key = {gr.ref + (e.tag - gr.p_ref), e.id};
      by_v_.insert(gr.key);
    }
    gr.listed = true;
  }
  void unlist(std::uint32_t g) {
    group& gr = groups_[g];
    if (!gr.listed) return;
    if (gr.capped) by_time_.erase(gr.key);
    else by_v_.erase(gr.key);
    gr.listed = false;
  }
  // After n changed: the groups whose cap lies between the old and the new
  // share switch class (capped iff cap < share).
  void reclassify(double old_share) {
    const double s = share();
    if (s == old_share || !std::isfinite(bandwidth_)) return;
    const double lo = std::min(s, old_share), hi = std::max(s, old_share);
    for (auto it = by_cap_.lower_bound(lo); it != by_cap_.end() && it->first < hi; ++it) {
      const std::uint32_t g = it->second;
      group& gr = groups_[g];
      const bool capped = gr.cap < s;
      if (capped == gr.capped) continue;
      const double p = progress(gr);
      unlist(g);
      gr.capped = capped;
      gr.p_ref = p;
      gr.ref = capped ? last_ : v_;
      list(g);
    }
  }

  double bandwidth_ = std::numeric_limits<double>::infinity();
  std::size_t active_ = 0;
  double last_ = 0.0;  // time up to which v_ is current
  double v_ = 0.0;     // virtual time: bytes served to each shared transfer since the start
  std::uint64_t serial_ = 0;
  std::vector<flow> flows_;
  std::vector<group> groups_;
  std::vector<std::uint32_t> free_;
  std::map<double, std::uint32_t> by_cap_;
  std::set<std::pair<double, std::uint64_t>> by_time_;  // capped groups: (finish time, id)
  std::set<std::pair<double, std::uint64_t>> by_v_;     // shared groups: (finish V, id)
};

// The links of a simulated cluster and the scheduling of their completions:
// one pending check per link at its earliest completion, re-armed only when
// that completion changes, so a link with thousands of transfers does not
// flood the event queue. The driver (sim/simulator.hpp) pushes each check
// it is given as an event and hands it back when it fires; stale checks
// (an older version) are ignored here.
//
//   ashl::sim::link_set links;
//   links.reset({1e9, 1e9});                             // two links, bytes/s
//   if (auto c = links.add(0, now, /*id*/ 7, 1e6, cap)) queue.push(c->time, kind, c->link, c->version);
//   auto r = links.fire(link, version, now);             // when that event comes
//   if (r.next) queue.push(...);  if (r.finished) transfer_done(*r.finished);
//
// An unlimited link (bandwidth inf) schedules nothing: each transfer takes
// bytes / cap on its own (unlimited(link) tells the driver so).
class link_set {
 public:
  struct check {
    std::uint32_t link = 0;
    std::uint64_t version = 0;
    double time = 0.0;
  };
  struct fired {
    std::optional<std::uint64_t> finished;  // the transfer that completed, if the check was current
    std::optional<check> next;              // the link's next check to schedule
  };

  void reset(const std::vector<double>& bandwidths) {
    links_.clear();
    for (double b : bandwidths) links_.emplace_back(b);
    pending_.assign(bandwidths.size(), pending{});
  }
  [[nodiscard]] std::size_t size() const noexcept { return links_.size(); }
  [[nodiscard]] bool unlimited(std::uint32_t link) const { return !std::isfinite(links_[link].bandwidth()); }
  [[nodiscard]] const shared_link& operator[](std::uint32_t link) const { return links_[link]; }

  // A transfer starts; the link's next check when its earliest completion moved.
  std::optional<check> add(std::uint32_t link, double now, std::uint64_t id, double bytes, double cap) {
    links_[link].add(now, id, bytes, cap);
    return rearm(link, now);
  }
  // A transfer is cancelled; the next check when it was on the link and the
  // earliest completion moved.
  std::optional<check> cancel(std::uint32_t link, double now, std::uint64_t id) {
    if (unlimited(link) || !links_[link].remove(now, id)) return std::nullopt;
    return rearm(link, now);
  }
  // A scheduled check fired: the transfer it completes (if still current) and
  // the link's next check.
  fired fire(std::uint32_t link, std::uint64_t version, double now) {
    fired r;
    pending& p = pending_[link];
    if (version != p.version) return r;
    p.armed = false;
    auto c = links_[link].next_completion(now);
    if (!c) return r;
    links_[link].remove(now, c->id);
    r.finished = c->id;
    r.next = rearm(link, now);
    return r;
  }

 private:
  struct pending {
    double time = 0.0;
    std::uint64_t id = 0;
    std::uint64_t version = 0;
    bool armed = false;
  };

  std::optional<check> rearm(std::uint32_t link, double now) {
    auto c = links_[link].next_completion(now);
    pending& p = pending_[link];
    if (c && p.armed && p.time == c->time && p.id == c->id) return std::nullopt;
    ++p.version;
    p.armed = c.has_value();
    if (!c) return std::nullopt;
    p.time = c->time;
    p.id = c->id;
    return check{link, p.version, c->time};
  }

  std::vector<shared_link> links_;
  std::vector<pending> pending_;
};

}  // namespace sim
ASHL_NAMESPACE_END
