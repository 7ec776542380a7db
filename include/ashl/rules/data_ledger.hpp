// ashl/rules/data_ledger.hpp — which positions of an epoch's sample order
// each worker trains, so that every sample is used once per epoch while
// workers join, leave, die and rejoin: the ledger server 0 keeps, pure.
//
//   auto ledger = ashl::ps::data_ledger::create({.samples = 60000, .shuffle_seed = 7, .lease_samples = 512});
//   ashl::ps::ledger_sink out;                                   // caller-owned, reused
//   (void)ledger->join(w, incarnation, batch * h, now, out);      // its first leases
//   (void)ledger->commit(w, commit_samples, batch * h, now, out); // moves its cursor; more leases when short
//   ledger->evict(w, now, out);                                   // suspended; given back after give_back_after
//   ledger->tick(now, out);                                       // the driver's clock, between events
//   for (const auto& l : out.leases()) send_lease(l.worker, l);   // [l.begin, l.end) of epoch l.epoch
//   out.clear();
//
// The ledger never sees samples, only positions 0..N-1 of epoch e's order
// (a permutation every worker computes alike from shuffle_seed + e). It
// hands out leases, ranges [begin, end) of one epoch's positions, to one
// (worker, incarnation), on demand: a worker is granted another lease
// whenever its unused leased positions fall below `ahead` leases, so a fast
// worker takes more and no lease is ever split or taken from a live worker.
// A commit of k samples moves the worker's cursor k positions through its
// leases in grant order: those positions are used. What a worker leaves
// unused goes back to its epoch's pool (merged ranges, granted lowest
// first) when it leaves, restarts (a join of a larger incarnation), or was
// evicted `give_back_after` seconds ago without rejoining as the same
// incarnation (which resumes its leases, sent again). At most two epochs are
// open: e, and e+1 once e's pool is empty; e completes when all its N
// positions are used. check() proves the accounting after any event: per
// open epoch, used + outstanding + returned + [next, N) partition 0..N-1.
//
// No clock (every event carries the driver's time in seconds), no I/O; the
// state saves to bytes (section LDGR). After warm-up no event allocates:
// per-worker arrays and the capacities they need grow at the join of a new
// id, and a worker holds at most lease_capacity() leases. Choices the plan
// left open: lease_samples = 0 derives each worker's lease from the
// `cycle_samples` its join and commits pass (the plan's batch x H; 4 of
// them), since the rule alone holds no plan; events the core would refuse
// (a stale incarnation, a commit or leave of a worker not live) are refused
// here too, by name, changing nothing. docs/elastic.md §3.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/rules/job_limits.hpp>
#include <ashl/sync/events.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

using sync::worker_id;

// Far past any data set (2^48 samples), and small enough that no sum of
// positions, lease sizes and `ahead` multiples can wrap a u64.
inline constexpr std::uint64_t max_ledger_samples = std::uint64_t{1} << 48;
// Leases held ahead: a few cycles' worth is all a worker needs to never wait.
inline constexpr std::uint32_t max_ledger_ahead = 64;

// server_core_params::ledger (docs/elastic.md §3.2). samples == 0: no ledger.
struct ledger_params {
  std::uint64_t samples = 0;       // N, the data set's size
  std::uint64_t shuffle_seed = 0;  // sent with every lease: the workers' permutation seed
  // Positions per lease; 0: 4 x the worker's cycle_samples (its plan's
  // batch x H, passed by its join and commits) at the grant.
  std::uint64_t lease_samples = 0;
  // Leases a worker holds beyond the one it is using: a grant whenever its
  // unused positions fall below ahead x its lease size (0: only when it has
  // none left).
  std::uint32_t ahead = 1;
  // Seconds an evicted worker's leases wait for a rejoin of the same
  // incarnation (keep it above the workers' `reconnect`); 0: back at once.
  double give_back_after = 30.0;
  std::uint64_t epochs = 0;  // 0: unbounded; else no lease of epoch >= epochs (the job's end)
  friend constexpr bool operator==(const ledger_params&, const ledger_params&) = default;

  static constexpr auto fields() {
    return std::tuple{field{"samples", &ledger_params::samples},
                      field{"shuffle_seed", &ledger_params::shuffle_seed},
                      field{"lease_samples", &ledger_params::lease_samples},
                      field{"ahead", &ledger_params::ahead},
                      field{"give_back_after", &ledger_params::give_back_after},
                      field{"epochs", &ledger_params::epochs}};
  }
};

// Errors name `prefix` + the field ("ledger.ahead = 65: ...").
inline status check_ledger_params(const ledger_params& p, std::string_view prefix = "ledger.") {
  const std::string f(prefix);
  if (p.samples > max_ledger_samples)
    return out_of_range(f + "samples", p.samples,
                        "must be at most " + std::to_string(max_ledger_samples) + " (ps::max_ledger_samples)");
  if (p.lease_samples > p.samples)
    return invalid_argument(f + "lease_samples", p.lease_samples,
                            "must be at most " + f + "samples = " + std::to_string(p.samples) +
                                " (0: 4 x the worker's batch x H)");
  if (p.ahead > max_ledger_ahead)
    return out_of_range(f + "ahead", p.ahead,
                        "must be at most " + std::to_string(max_ledger_ahead) + " (ps::max_ledger_ahead)");
  if (!(p.give_back_after >= 0.0) || !std::isfinite(p.give_back_after) || p.give_back_after > max_duration_seconds)
    return invalid_argument(f + "give_back_after", p.give_back_after,
                            "must be finite seconds in [0, 1000000000] (ps::max_duration_seconds)");
  return {};
}

// Bits of ledger_lease::flags (the wire's lease flags, docs/elastic.md §3.4).
inline constexpr std::uint32_t lease_epoch_end = 1;  // its grant emptied its epoch's pool
inline constexpr std::uint32_t lease_resent = 2;     // an outstanding lease sent again at a rejoin; begin = the cursor
inline constexpr std::uint32_t lease_flags_known = lease_epoch_end | lease_resent;

// One lease, as the driver sends it to `worker` (with the params' samples
// and shuffle_seed). `number` counts the worker's leases from 1, across its
// incarnations; a resent lease keeps its number.
struct ledger_lease {
  worker_id worker = 0;
  std::uint32_t flags = 0;
  std::uint64_t number = 0;
  std::uint64_t epoch = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  [[nodiscard]] constexpr std::uint64_t size() const noexcept { return end - begin; }
  friend constexpr bool operator==(const ledger_lease&, const ledger_lease&) = default;
};

// The leases an event granted or resent, in order; caller-owned so its
// storage is reused (clear() keeps the capacity).
class ledger_sink {
 public:
  [[nodiscard]] std::span<const ledger_lease> leases() const noexcept { return leases_; }
  [[nodiscard]] bool empty() const noexcept { return leases_.empty(); }
  void clear() noexcept { leases_.clear(); }
  void reserve(std::size_t n) { leases_.reserve(n); }

 private:
  friend class data_ledger;
  std::vector<ledger_lease> leases_;
};

enum class ledger_worker_state : std::uint8_t {
  absent,     // never joined
  live,       // holds leases and commits
  suspended,  // evicted: its leases wait for a rejoin of the same incarnation
  gone,       // left, or its leases went back: holds nothing
};
inline constexpr std::uint8_t ledger_worker_state_count = 4;

struct ledger_stats {
  std::uint64_t leases_granted = 0;
  std::uint64_t leases_resent = 0;
  std::uint64_t leases_returned = 0;     // leases given back with positions unused (leave, restart, expiry)
  std::uint64_t positions_returned = 0;  // the unused positions they held
  std::uint64_t overrun = 0;             // samples committed past a worker's leases (trained without one)
  std::uint64_t epochs_completed = 0;
  std::uint64_t expiries = 0;            // suspended workers whose leases went back after give_back_after
  friend constexpr bool operator==(const ledger_stats&, const ledger_stats&) = default;

  static constexpr auto fields() {
    return std::tuple{field{"leases_granted", &ledger_stats::leases_granted},
                      field{"leases_resent", &ledger_stats::leases_resent},
                      field{"leases_returned", &ledger_stats::leases_returned},
                      field{"positions_returned", &ledger_stats::positions_returned},
                      field{"overrun", &ledger_stats::overrun},
                      field{"epochs_completed", &ledger_stats::epochs_completed},
                      field{"expiries", &ledger_stats::expiries}};
  }
};

class data_ledger {
 public:
  // No ledger: enabled() is false and every event does nothing.
  data_ledger() = default;

  static result<data_ledger> create(const ledger_params& p) {
    ASHL_TRY(check_ledger_params(p));
    data_ledger l;
    l.p_ = p;
    if (l.enabled()) l.open(l.slots_[0], 0);
    return l;
  }

  [[nodiscard]] bool enabled() const noexcept { return p_.samples > 0; }
  [[nodiscard]] const ledger_params& params() const noexcept { return p_; }
  [[nodiscard]] const ledger_stats& stats() const noexcept { return stats_; }

  // The oldest epoch not complete (= epochs completed); finished(): every
  // epoch up to params().epochs is complete, no lease is granted any more.
  [[nodiscard]] std::uint64_t epoch() const noexcept { return stats_.epochs_completed; }
  [[nodiscard]] bool finished() const noexcept { return enabled() && !slots_[0].open; }
  // Positions used of epoch e: N once complete, 0 before it opened.
  [[nodiscard]] std::uint64_t used(std::uint64_t e) const noexcept {
    if (e < stats_.epochs_completed) return p_.samples;
    for (const slot& s : slots_)
      if (s.open && s.epoch == e) return s.used;
    return 0;
  }
  // Epoch e's first position never leased since its pool last reached it
  // (positions from here to N are in the pool); N once all were leased.
  [[nodiscard]] std::uint64_t next(std::uint64_t e) const noexcept {
    for (const slot& s : slots_)
      if (s.open && s.epoch == e) return s.next;
    return e < stats_.epochs_completed ? p_.samples : 0;
  }

  [[nodiscard]] ledger_worker_state state(worker_id w) const noexcept {
    return w < workers_.size() ? workers_[w].state : ledger_worker_state::absent;
  }
  // Its outstanding leases in grant order; the first begins at its cursor.
  [[nodiscard]] std::span<const ledger_lease> leases(worker_id w) const noexcept {
    if (w >= workers_.size()) return {};
    return workers_[w].leases;
  }
  // The incarnation it last joined as (0 before its first join).
  [[nodiscard]] std::uint64_t incarnation(worker_id w) const noexcept {
    return w < workers_.size() ? workers_[w].incarnation : 0;
  }
  // Its leased positions not used yet.
  [[nodiscard]] std::uint64_t unused(worker_id w) const noexcept { return w < workers_.size() ? workers_[w].unused : 0; }
  // Positions its next lease will have (before clipping to what the pool holds).
  [[nodiscard]] std::uint64_t lease_size(worker_id w) const noexcept {
    return lease_size_for(w < workers_.size() ? workers_[w].cycle : 0);
  }
  // The most leases a worker holds at once (its array's fixed capacity).
  [[nodiscard]] std::size_t lease_capacity() const noexcept { return 2 * (std::size_t{p_.ahead} + 1) + 2; }
  [[nodiscard]] std::size_t known_workers() const noexcept { return workers_.size(); }

  // ---------------------------------------------------------------- events

  // w joins as `incarnation`, training `cycle_samples` per commit (its
  // plan's batch x H). The same incarnation resumes w's outstanding leases,
  // sending them again (after an eviction, or a duplicate join of a live
  // worker that reconnected); a larger one is a restart: the old process's
  // leases go back at once. Then w is granted what it lacks. A smaller
  // incarnation is refused, changing nothing.
  status join(worker_id w, std::uint64_t incarnation, std::uint64_t cycle_samples, double now, ledger_sink& out) {
    if (!enabled()) return {};
    if (w >= max_workers)
      return out_of_range("join.worker", w, "must be below " + std::to_string(max_workers) + " (ps::max_workers)");
    if (w < workers_.size() && workers_[w].state != ledger_worker_state::absent &&
        incarnation < workers_[w].incarnation)
      return invalid_argument("join.incarnation", incarnation,
                              "stale: worker " + std::to_string(w) + " is at incarnation " +
                                  std::to_string(workers_[w].incarnation) + " in the ledger");
    if (w >= workers_.size()) grow(w, out);
    // Expiry first (w's own leases may be up), feeding the others only once
    // w is what it now is: never a lease to an incarnation being replaced.
    bool supply = expire(now);
    worker_rec& r = workers_[w];
    r.cycle = cycle_samples;
    if ((r.state == ledger_worker_state::live || r.state == ledger_worker_state::suspended) &&
        incarnation == r.incarnation) {
      if (r.state == ledger_worker_state::suspended) --suspended_;
      r.state = ledger_worker_state::live;
      for (const ledger_lease& l : r.leases) {
        ledger_lease again = l;
        again.flags |= lease_resent;
        out.leases_.push_back(again);
        ++stats_.leases_resent;
      }
    } else {
      if (r.state == ledger_worker_state::suspended) --suspended_;
      supply = give_back(r) || supply;
      r.state = ledger_worker_state::live;
      r.incarnation = incarnation;
    }
    top_up(w, out);
    if (supply) feed_hungry(out);
    return {};
  }

  // An accepted commit of w covering `samples`: that many positions of its
  // leases, in order, are used (past what it holds: clamped, counted as
  // overrun). Then w is granted what it lacks. A worker not live is refused.
  status commit(worker_id w, std::uint64_t samples, std::uint64_t cycle_samples, double now, ledger_sink& out) {
    if (!enabled()) return {};
    if (state(w) != ledger_worker_state::live) return not_live("commit.worker", w);
    bool supply = expire(now);
    worker_rec& r = workers_[w];
    r.cycle = cycle_samples;
    std::uint64_t k = samples;
    std::size_t done = 0;  // leases finished
    while (k > 0 && done < r.leases.size()) {
      ledger_lease& l = r.leases[done];
      const std::uint64_t take = std::min(k, l.size());
      l.begin += take;
      slot_of(l.epoch).used += take;
      r.unused -= take;
      k -= take;
      if (l.begin == l.end) ++done;
    }
    if (done > 0) r.leases.erase(r.leases.begin(), r.leases.begin() + static_cast<std::ptrdiff_t>(done));
    stats_.overrun += k;
    supply = settle() || supply;
    top_up(w, out);
    if (supply) feed_hungry(out);
    return {};
  }

  // w says it leaves: its unused positions go back at once.
  status leave(worker_id w, double now, ledger_sink& out) {
    if (!enabled()) return {};
    if (state(w) != ledger_worker_state::live) return not_live("leave.worker", w);
    const bool supply = expire(now);
    worker_rec& r = workers_[w];
    r.state = ledger_worker_state::gone;
    if (give_back(r) || supply) feed_hungry(out);
    return {};
  }

  // The driver decided w is gone: its leases wait give_back_after seconds
  // for w to rejoin as the same incarnation (an eviction of a live worker
  // whose commit in flight would otherwise cover positions handed to
  // another). A worker not live is ignored.
  void evict(worker_id w, double now, ledger_sink& out) {
    if (!enabled() || state(w) != ledger_worker_state::live) return;
    bool supply = expire(now);
    worker_rec& r = workers_[w];
    if (p_.give_back_after <= 0.0) {
      r.state = ledger_worker_state::gone;
      supply = give_back(r) || supply;
    } else {
      r.state = ledger_worker_state::suspended;
      r.since = now;
      if (suspended_++ == 0 || now + p_.give_back_after < deadline_) deadline_ = now + p_.give_back_after;
    }
    if (supply) feed_hungry(out);
  }

  // The driver's time between events: suspended leases whose time is up go back.
  void tick(double now, ledger_sink& out) {
    if (enabled() && expire(now)) feed_hungry(out);
  }

  // The accounting holds (a test's check after every event; allocates):
  // every lease lies in an open epoch and [0, N); per open epoch, the
  // outstanding leases, the returned ranges and [next, N) are disjoint and
  // cover N − used positions, so the used ones are exactly the rest.
  [[nodiscard]] status check() const {
    if (!enabled()) return {};
    struct span_of {
      std::uint64_t begin, end;
    };
    std::uint32_t suspended = 0;
    for (worker_id w = 0; w < workers_.size(); ++w) {
      const worker_rec& r = workers_[w];
      if (r.state == ledger_worker_state::suspended) ++suspended;
      std::uint64_t sum = 0;
      for (const ledger_lease& l : r.leases) {
        if (!(l.begin < l.end && l.end <= p_.samples) || l.worker != w || find_slot(l.epoch) == nullptr)
          return broken("lease", w, "[" + std::to_string(l.begin) + ", " + std::to_string(l.end) + ") of epoch " +
                                        std::to_string(l.epoch) + " is not a range of an open epoch");
        sum += l.size();
      }
      if (sum != r.unused) return broken("unused", w, "differs from its leases' " + std::to_string(sum) + " positions");
      if (!r.leases.empty() && r.state != ledger_worker_state::live && r.state != ledger_worker_state::suspended)
        return broken("state", w, "holds leases but is neither live nor suspended");
      if (r.leases.size() > lease_capacity()) return broken("leases", w, "more than lease_capacity()");
    }
    if (suspended != suspended_) return broken("suspended", suspended_, "differs from the workers' states");
    if (slots_[1].open && (!slots_[0].open || slots_[1].epoch != slots_[0].epoch + 1))
      return broken("epoch", slots_[1].epoch, "open without the epoch before it");
    std::vector<span_of> spans;
    for (const slot& s : slots_) {
      if (!s.open) continue;
      spans.clear();
      if (s.next > p_.samples) return broken("next", s.next, "past samples");
      if (s.next < p_.samples) spans.push_back({s.next, p_.samples});
      for (std::size_t i = 0; i < s.returned.size(); ++i) {
        const range& g = s.returned[i];
        if (!(g.begin < g.end && g.end <= s.next) || (i > 0 && s.returned[i - 1].end >= g.begin))
          return broken("returned", g.begin, "not sorted, merged ranges below next in epoch " + std::to_string(s.epoch));
        spans.push_back({g.begin, g.end});
      }
      for (const worker_rec& r : workers_)
        for (const ledger_lease& l : r.leases)
          if (l.epoch == s.epoch) spans.push_back({l.begin, l.end});
      std::sort(spans.begin(), spans.end(), [](const span_of& a, const span_of& b) { return a.begin < b.begin; });
      std::uint64_t held = 0;
      for (std::size_t i = 0; i < spans.size(); ++i) {
        if (i > 0 && spans[i - 1].end > spans[i].begin)
          return broken("overlap", spans[i].begin, "held twice in epoch " + std::to_string(s.epoch));
        held += spans[i].end - spans[i].begin;
      }
      if (held + s.used != p_.samples)
        return broken("used", s.used,
                      "plus the " + std::to_string(held) + " positions not used is not samples in epoch " +
                          std::to_string(s.epoch));
    }
    return {};
  }

  // ---------------------------------------------------------------- state

  void save(state_writer& w) const {
    w.tag("LDGR", 1);
    put_fields(w, p_);
    for (const slot& s : slots_) {
      w.put(s.open);
      w.put(s.epoch);
      w.put(s.next);
      w.put(s.used);
      w.put<std::uint64_t>(s.returned.size());
      for (const range& g : s.returned) {
        w.put(g.begin);
        w.put(g.end);
      }
    }
    w.put<std::uint64_t>(workers_.size());
    for (const worker_rec& r : workers_) {
      w.put(static_cast<std::uint8_t>(r.state));
      w.put(r.incarnation);
      w.put(r.since);
      w.put(r.cycle);
      w.put(r.numbered);
      w.put<std::uint64_t>(r.leases.size());
      for (const ledger_lease& l : r.leases) {
        w.put(l.flags);
        w.put(l.number);
        w.put(l.epoch);
        w.put(l.begin);
        w.put(l.end);
      }
    }
    put_fields(w, stats_);
  }

  // Reads into a fresh ledger, checked field by field and then as a whole
  // (check()); *this changes only on success.
  status load(state_reader& in) {
    ASHL_TRY(in.tag("LDGR", 1));
    data_ledger f;
    ASHL_TRY(get_fields(in, f.p_, "data_ledger.params"));
    ASHL_TRY(check_ledger_params(f.p_, "data_ledger.params."));
    const std::uint64_t n = f.p_.samples;
    for (slot& s : f.slots_) {
      ASHL_TRY(in.get(s.open, "data_ledger.epoch.open"));
      ASHL_TRY(in.get(s.epoch, "data_ledger.epoch.epoch"));
      ASHL_TRY(in.get(s.next, "data_ledger.epoch.next"));
      ASHL_TRY(in.get(s.used, "data_ledger.epoch.used"));
      if (s.next > n) return malformed("data_ledger.epoch.next", s.next, "past samples = " + std::to_string(n));
      if (s.used > n) return malformed("data_ledger.epoch.used", s.used, "past samples = " + std::to_string(n));
      if (s.open && (n == 0 || (f.p_.epochs != 0 && s.epoch >= f.p_.epochs)))
        return malformed("data_ledger.epoch.epoch", s.epoch, "open past params.epochs (or without samples)");
      std::uint64_t m = 0;
      ASHL_TRY(in.count(m, 16, "data_ledger.epoch.returned"));
      if (!s.open && m != 0) return malformed("data_ledger.epoch.returned", m, "ranges in an epoch not open");
      s.returned.resize(static_cast<std::size_t>(m));
      for (range& g : s.returned) {
        ASHL_TRY(in.get(g.begin, "data_ledger.epoch.returned.begin"));
        ASHL_TRY(in.get(g.end, "data_ledger.epoch.returned.end"));
      }
    }
    std::uint64_t known = 0;
    ASHL_TRY(in.count(known, 41, "data_ledger.workers"));
    if (known > max_workers)
      return malformed("data_ledger.workers", known, "more than ps::max_workers = " + std::to_string(max_workers));
    f.workers_.resize(static_cast<std::size_t>(known));
    for (worker_id w = 0; w < f.workers_.size(); ++w) {
      worker_rec& r = f.workers_[w];
      std::uint8_t st = 0;
      ASHL_TRY(in.get(st, "data_ledger.worker.state"));
      if (st >= ledger_worker_state_count) return malformed("data_ledger.worker.state", st, "unknown worker state");
      r.state = static_cast<ledger_worker_state>(st);
      ASHL_TRY(in.get(r.incarnation, "data_ledger.worker.incarnation"));
      ASHL_TRY(in.get(r.since, "data_ledger.worker.since"));
      if (!std::isfinite(r.since)) return malformed("data_ledger.worker.since", r.since, "must be finite");
      ASHL_TRY(in.get(r.cycle, "data_ledger.worker.cycle"));
      ASHL_TRY(in.get(r.numbered, "data_ledger.worker.numbered"));
      std::uint64_t m = 0;
      ASHL_TRY(in.count(m, 36, "data_ledger.worker.leases"));
      if (m > f.lease_capacity())
        return malformed("data_ledger.worker.leases", m,
                         "more than lease_capacity() = " + std::to_string(f.lease_capacity()));
      r.leases.reserve(f.lease_capacity());
      r.leases.resize(static_cast<std::size_t>(m));
      for (ledger_lease& l : r.leases) {
        l.worker = w;
        ASHL_TRY(in.get(l.flags, "data_ledger.lease.flags"));
        ASHL_TRY(in.get(l.number, "data_ledger.lease.number"));
        ASHL_TRY(in.get(l.epoch, "data_ledger.lease.epoch"));
        ASHL_TRY(in.get(l.begin, "data_ledger.lease.begin"));
        ASHL_TRY(in.get(l.end, "data_ledger.lease.end"));
        if ((l.flags & ~lease_flags_known) != 0) return malformed("data_ledger.lease.flags", l.flags, "unknown bits");
        if (l.number == 0 || l.number > r.numbered)
          return malformed("data_ledger.lease.number", l.number,
                           "not one of worker " + std::to_string(w) + "'s " + std::to_string(r.numbered) + " leases");
        if (!(l.begin < l.end && l.end <= n))
          return malformed("data_ledger.lease.end", l.end,
                           "not the end of a range of samples = " + std::to_string(n) + " from begin = " +
                               std::to_string(l.begin));
        r.unused += l.size();
      }
      if (r.state == ledger_worker_state::suspended) {
        const double due = r.since + f.p_.give_back_after;
        if (f.suspended_++ == 0 || due < f.deadline_) f.deadline_ = due;
      }
    }
    ASHL_TRY(get_fields(in, f.stats_, "data_ledger.stats"));
    // An epoch is open exactly while the job has epochs left (else no lease would ever be granted again).
    const bool done = f.p_.epochs != 0 && f.stats_.epochs_completed >= f.p_.epochs;
    if (n > 0 && f.slots_[0].open == done)
      return malformed("data_ledger.epoch.open", f.slots_[0].open,
                       done ? "an epoch open past params.epochs" : "no epoch open with epochs left");
    if (f.slots_[0].open && f.slots_[0].epoch != f.stats_.epochs_completed)
      return malformed("data_ledger.stats.epochs_completed", f.stats_.epochs_completed,
                       "is not the open epoch " + std::to_string(f.slots_[0].epoch));
    ASHL_TRY(f.check());  // named "data_ledger.check.<what>"
    f.reserve_for(f.workers_.size());
    *this = std::move(f);
    return {};
  }

 private:
  struct range {
    std::uint64_t begin = 0, end = 0;
  };
  // One open epoch: its pool is `returned` and [next, N).
  struct slot {
    bool open = false;
    std::uint64_t epoch = 0;
    std::uint64_t next = 0;
    std::uint64_t used = 0;
    std::vector<range> returned;  // sorted, merged, below next
  };
  struct worker_rec {
    ledger_worker_state state = ledger_worker_state::absent;
    std::uint64_t incarnation = 0;
    double since = 0.0;        // suspended since
    std::uint64_t cycle = 0;   // samples per commit, as its last event said
    std::uint64_t numbered = 0;  // leases numbered so far
    std::uint64_t unused = 0;
    std::vector<ledger_lease> leases;  // capacity lease_capacity() from its first join
  };

  static status not_live(std::string_view field, worker_id w) {
    return invalid_argument(field, w, "not live in the ledger (never joined, left, or evicted)");
  }
  template <class T>
  static status broken(std::string_view what, const T& value, std::string_view why) {
    return make_error(errc::malformed, "data_ledger.check." + std::string(what), value, why);
  }

  // lease_samples, or 4 x cycle (0 counts as 1), at most N.
  [[nodiscard]] std::uint64_t lease_size_for(std::uint64_t cycle) const noexcept {
    if (p_.lease_samples > 0) return p_.lease_samples;
    const std::uint64_t c = std::max<std::uint64_t>(cycle, 1);
    return c >= (p_.samples + 3) / 4 ? p_.samples : 4 * c;
  }

  void open(slot& s, std::uint64_t e) {
    s.open = true;
    s.epoch = e;
    s.next = 0;
    s.used = 0;
    s.returned.clear();
  }
  [[nodiscard]] bool has_pool(const slot& s) const noexcept {
    return s.open && (!s.returned.empty() || s.next < p_.samples);
  }
  [[nodiscard]] const slot* find_slot(std::uint64_t e) const noexcept {
    for (const slot& s : slots_)
      if (s.open && s.epoch == e) return &s;
    return nullptr;
  }
  slot& slot_of(std::uint64_t e) noexcept {
    slot& s = slots_[0].open && slots_[0].epoch == e ? slots_[0] : slots_[1];
    ASHL_ASSERT(s.open && s.epoch == e, "data_ledger: a lease of an epoch not open");
    return s;
  }

  // Per-worker storage grows here, at the first join of a new id (not per
  // event): its lease array, and room for what its leases could return and
  // the sink could be handed in one event.
  void grow(worker_id w, ledger_sink& out) {
    workers_.resize(std::size_t{w} + 1);
    for (worker_rec& r : workers_) r.leases.reserve(lease_capacity());
    reserve_for(workers_.size());
    out.reserve(2 * lease_capacity() * workers_.size());
  }
  void reserve_for(std::size_t known) {
    for (slot& s : slots_) s.returned.reserve(lease_capacity() * known + 1);
  }

  // The next lease of up to `size` positions: the oldest open epoch with a
  // pool, its lowest returned range first; e+1 opens once e's pool is empty.
  bool take(std::uint64_t size, ledger_lease& l) {
    if (!slots_[0].open) return false;
    slot* s = &slots_[0];
    if (!has_pool(*s)) {
      if (!slots_[1].open) {
        if (p_.epochs != 0 && slots_[0].epoch + 1 >= p_.epochs) return false;
        open(slots_[1], slots_[0].epoch + 1);
      }
      s = &slots_[1];
      if (!has_pool(*s)) return false;  // two open epochs: e+2 waits for e to complete
    }
    l.epoch = s->epoch;
    if (!s->returned.empty()) {
      range& g = s->returned.front();
      l.begin = g.begin;
      l.end = g.end - g.begin > size ? g.begin + size : g.end;
      g.begin = l.end;
      if (g.begin == g.end) s->returned.erase(s->returned.begin());
    } else {
      l.begin = s->next;
      l.end = p_.samples - s->next > size ? s->next + size : p_.samples;
      s->next = l.end;
    }
    l.flags = has_pool(*s) ? 0 : lease_epoch_end;
    return true;
  }

  // Grants w leases while its unused positions are below `ahead` leases
  // (or it has none), up to lease_capacity() leases held.
  void top_up(worker_id w, ledger_sink& out) {
    worker_rec& r = workers_[w];
    if (r.state != ledger_worker_state::live) return;
    const std::uint64_t size = lease_size_for(r.cycle);
    const std::uint64_t want = std::uint64_t{p_.ahead} * size;
    while ((r.unused < want || r.unused == 0) && r.leases.size() < lease_capacity()) {
      ledger_lease l;
      if (!take(size, l)) return;
      l.worker = w;
      l.number = ++r.numbered;
      r.leases.push_back(l);
      r.unused += l.size();
      out.leases_.push_back(l);
      ++stats_.leases_granted;
    }
  }
  // After positions went back or an epoch opened: every live worker short
  // of leases is topped up, in id order.
  void feed_hungry(ledger_sink& out) {
    for (worker_id w = 0; w < workers_.size(); ++w) top_up(w, out);
  }

  // Completes every open epoch whose positions are all used; the next
  // opens. Whether anything completed (new supply).
  bool settle() {
    bool any = false;
    while (slots_[0].open && slots_[0].used == p_.samples) {
      any = true;
      const std::uint64_t e = slots_[0].epoch;
      ++stats_.epochs_completed;
      std::swap(slots_[0], slots_[1]);
      slots_[1].open = false;
      slots_[1].returned.clear();
      if (!slots_[0].open && (p_.epochs == 0 || e + 1 < p_.epochs)) open(slots_[0], e + 1);
    }
    return any;
  }

  // [b, e) of epoch `s` goes back to its pool: a range ending at next moves
  // next down, others merge into the sorted list.
  void put_back(slot& s, std::uint64_t b, std::uint64_t e) {
    if (e == s.next) {
      s.next = b;
      if (!s.returned.empty() && s.returned.back().end == s.next) {
        s.next = s.returned.back().begin;
        s.returned.pop_back();
      }
      return;
    }
    auto it = std::lower_bound(s.returned.begin(), s.returned.end(), b,
                               [](const range& g, std::uint64_t x) { return g.begin < x; });
    const bool joins_prev = it != s.returned.begin() && std::prev(it)->end == b;
    const bool joins_next = it != s.returned.end() && it->begin == e;
    if (joins_prev && joins_next) {
      std::prev(it)->end = it->end;
      s.returned.erase(it);
    } else if (joins_prev) {
      std::prev(it)->end = e;
    } else if (joins_next) {
      it->begin = b;
    } else {
      s.returned.insert(it, range{b, e});  // within the capacity reserved at joins, but for pathological churn
    }
  }
  // Every unused position of r goes back; whether there was any.
  bool give_back(worker_rec& r) {
    if (r.leases.empty()) return false;
    // Latest first: a worker's leases usually end at its epoch's next, which
    // then moves down over all of them.
    for (auto it = r.leases.rbegin(); it != r.leases.rend(); ++it) {
      put_back(slot_of(it->epoch), it->begin, it->end);
      ++stats_.leases_returned;
      stats_.positions_returned += it->size();
    }
    r.leases.clear();
    r.unused = 0;
    return true;
  }

  // Suspended workers whose give_back_after is up at `now` give back;
  // whether any position went back (the caller feeds the hungry).
  bool expire(double now) {
    if (suspended_ == 0 || now < deadline_) return false;
    bool supply = false;
    double earliest = std::numeric_limits<double>::infinity();
    for (worker_rec& r : workers_) {
      if (r.state != ledger_worker_state::suspended) continue;
      if (now >= r.since + p_.give_back_after) {
        r.state = ledger_worker_state::gone;
        --suspended_;
        ++stats_.expiries;
        supply = give_back(r) || supply;
      } else {
        earliest = std::min(earliest, r.since + p_.give_back_after);
      }
    }
    deadline_ = earliest;
    return supply;
  }

  ledger_params p_{};
  ledger_stats stats_{};
  std::array<slot, 2> slots_{};  // [0]: the oldest incomplete epoch; [1]: the next, once open
  std::vector<worker_rec> workers_;
  std::uint32_t suspended_ = 0;
  double deadline_ = 0.0;  // the earliest suspended worker's give-back time
};

}  // namespace ps
ASHL_NAMESPACE_END
