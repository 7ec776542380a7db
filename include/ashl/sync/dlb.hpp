// ashl/sync/dlb.hpp — DLB: BSP rounds whose per-worker batch sizes follow
// measured throughput, so every worker finishes its share of a round at
// about the same time.
//
//   ashl::sync::dlb p{{.workers = 3, .total_batch = 192, .min_batch = 8}};
//   ashl::sync::outcome_sink out(3);
//   p.on_measurement({.worker = 0, .kind = ashl::measurement_kind::compute, .seconds = 0.1, .amount = 64}, out);
//   ...                                    // rounds complete as in bsp
//   p.plan(0).batch_size;                  // b_0 = round(B·v_0 / Σv) after the next re-plan
//
// docs/algorithms.md §3 "DLB": from compute measurements (amount = the batch the
// iteration ran; 0 means the batch of the worker's plan) the speed
// v_i = samples / second is smoothed by an EWMA with a half-life counted in
// measurements; every `replan_every` completed rounds each live worker gets
// b_i = max(min_batch, round(B·v_i / Σ_j v_j)) (a worker not measured yet
// counts at the mean measured speed), a data share b_i / B, and its update
// is weighted by its samples (the round's samples weighting: b_i / Σb when
// the driver reports commit_event::samples). Only workers whose b_i changed
// are marked.
//
// The batches are apportioned so that Σ b_i = B exactly (a constant global
// batch, docs/elastic.md §2.4): a worker whose share falls below min_batch
// takes min_batch and the others split what remains in proportion to their
// speeds: the integer parts, completed by largest remainder (ties to the
// lower id), as docs/algorithms.md §3 and profile::plan_dlb_batches state
// it. Only when the live
// workers' min_batch alone exceed B does every worker take min_batch (and
// Σ b_i = M·min_batch > B). B is `total_batch` whatever the worker count:
// more workers split the same global batch (ps::make_policy's default B is
// 64 per *initial* worker, and stays so when workers join or leave).
//
// Membership: a joiner (a new id, or an evicted one back) starts at the even
// share round(B / M) and is measured anew; a join or an eviction makes the
// next round boundary a re-plan of every live worker whatever replan_every
// says, with a worker not yet measured at the mean measured speed (which is
// the even share when nobody is measured), so Σ b_i = B again from the round
// after the change. Between the change and that boundary the joiner's even
// share comes on top of the others' batches, and an evicted worker's batch
// is missing from the sum.
//
// Cost: a measurement is O(1); a re-plan O(ids + M log M) (the sort by
// remainder), once per completed round at most (a completed BSP round costs
// O(M) anyway); no allocation after construction except when a new id joins. The round logic is bsp's, held
// by value.
//
// Straggler re-planning (EP4DDL-like, docs/algorithms.md §3 "Straggler
// detection"): basic_dlb<Monitor> hands every compute measurement to a
// straggler monitor (the concept below; ps::straggler_monitor wraps
// profile::straggler_detector, since sync/ does not include profile/). The
// monitor's prediction of worker i is the speed its batch in force was
// planned from (set at every re-plan, and at i's first measurement): a flag
// means i runs slower than its own capability, not slower than the others.
// A flag sets v_i to the window's measured speed and re-plans every batch at
// once, instead of waiting for replan_every rounds; it is recorded
// (last_straggler(): worker, measured and predicted seconds per sample, windows) and
// counted (straggler_replans()). The monitor flags a worker at most once
// per window. `dlb` (no monitor) is the plain policy, byte for byte.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/bsp.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/events.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <optional>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <tuple>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

// What a straggler monitor reports: `worker`'s median seconds per sample
// over its last window against the prediction, after `windows` windows over
// the line.
struct straggler_flag {
  worker_id worker = 0;
  double seconds_per_sample = 0.0;
  double predicted_per_sample = 0.0;
  std::uint32_t windows = 0;
  friend bool operator==(const straggler_flag&, const straggler_flag&) = default;
  // In this order in a saved state (core/fields.hpp's put_fields).
  static constexpr auto fields() {
    return std::tuple{field{"worker", &straggler_flag::worker},
                      field{"seconds_per_sample", &straggler_flag::seconds_per_sample},
                      field{"predicted_per_sample", &straggler_flag::predicted_per_sample},
                      field{"windows", &straggler_flag::windows}};
  }
};

// A straggler monitor for basic_dlb: told each worker's predicted seconds
// per sample (predict), fed each compute sample (seconds, batch), returns a
// flag when the worker is over its line. A plain value with save/load.
template <class M>
concept dlb_straggler_monitor =
    std::copy_constructible<M> &&
    requires(M& m, const M& cm, worker_id w, double x, state_writer& sw, state_reader& sr) {
      { M::enabled } -> std::convertible_to<bool>;
      { m.predict(w, x) } -> std::same_as<void>;
      { m.observe(w, x, x) } -> std::same_as<std::optional<straggler_flag>>;
      { cm.save(sw) } -> std::same_as<void>;
      { m.load(sr) } -> std::same_as<status>;
    };

// No straggler re-planning: DLB as docs/algorithms.md §3 states it.
struct no_straggler_monitor {
  static constexpr bool enabled = false;
  void predict(worker_id, double) {}
  std::optional<straggler_flag> observe(worker_id, double, double) { return std::nullopt; }
  void save(state_writer&) const {}
  status load(state_reader&) { return {}; }
};
static_assert(dlb_straggler_monitor<no_straggler_monitor>);

struct dlb_params {
  std::size_t workers = 0;
  std::uint32_t total_batch = 64;     // B: samples of one round over all workers
  std::uint32_t min_batch = 1;        // no worker's batch goes below this
  double half_life = 8.0;             // EWMA half-life of v_i, in compute measurements of one worker
  std::uint32_t replan_every = 1;     // completed rounds between re-plans
  std::uint32_t local_iterations = 1; // H per commit (1: plain BSP)
  friend bool operator==(const dlb_params&, const dlb_params&) = default;
  // In this order in a saved state (core/fields.hpp's put_fields).
  static constexpr auto fields() {
    return std::tuple{field{"workers", &dlb_params::workers},
                      field{"total_batch", &dlb_params::total_batch},
                      field{"min_batch", &dlb_params::min_batch},
                      field{"half_life", &dlb_params::half_life},
                      field{"replan_every", &dlb_params::replan_every},
                      field{"local_iterations", &dlb_params::local_iterations}};
  }
};

template <dlb_straggler_monitor Monitor = no_straggler_monitor>
class basic_dlb {
 public:
  using policy_concept = policy_tag;
  using monitor_type = Monitor;

  basic_dlb() = default;
  explicit basic_dlb(dlb_params p, Monitor monitor = {})
      : p_(p),
        monitor_(std::move(monitor)),
        bsp_(bsp_params{.workers = p.workers, .weighting = round_weighting::samples,
                        .local_iterations = p.local_iterations, .stage = stage_id::dlb}),
        speed_(p.workers, 0.0),
        batch_(p.workers, even_batch(p.workers)),
        basis_(p.workers, 0.0),
        raised_(p.workers, 0),
        order_(p.workers, 0) {
    ASHL_ASSERT(p.total_batch >= 1, "dlb: total_batch must be >= 1");
  }

  commit_decision on_commit(const commit_event& c, outcome_sink& out) {
    const std::uint64_t before = bsp_.rounds();
    const commit_decision d = bsp_.on_commit(c, out);
    after_rounds(before, out);
    return d;
  }
  pull_action on_pull(const pull_event& q, outcome_sink& out) { return bsp_.on_pull(q, out); }
  void on_metric(const metric_event& m, outcome_sink& out) { bsp_.on_metric(m, out); }
  void on_join(const membership_event& j, outcome_sink& out) {
    const bool fresh = !bsp_.is_live(j.worker);
    const std::uint64_t before = bsp_.rounds();
    bsp_.on_join(j, out);  // a rejoiner's buffered commit can complete a round (sync/detail/round.hpp)
    after_rounds(before, out);
    if (!fresh) return;
    replan_at_boundary();
    if (j.worker >= speed_.size()) {
      speed_.resize(std::size_t{j.worker} + 1, 0.0);
      batch_.resize(std::size_t{j.worker} + 1, 0);
      basis_.resize(std::size_t{j.worker} + 1, 0.0);
      raised_.resize(std::size_t{j.worker} + 1, 0);
      order_.resize(std::size_t{j.worker} + 1, 0);
    }
    speed_[j.worker] = 0.0;  // a new incarnation is measured anew
    basis_[j.worker] = 0.0;
    batch_[j.worker] = even_batch(bsp_.live_count());
    out.plan_changed(j.worker);
  }
  void on_evict(const membership_event& j, outcome_sink& out) {
    if (bsp_.is_live(j.worker)) replan_at_boundary();  // the round this eviction completes, if it does, re-plans
    const std::uint64_t before = bsp_.rounds();
    bsp_.on_evict(j, out);
    after_rounds(before, out);
  }
  void on_measurement(const measurement_event& x, outcome_sink& out) {
    bsp_.on_measurement(x, out);
    if (x.kind != measurement_kind::compute || !bsp_.is_live(x.worker)) return;
    if (!(x.seconds > 0.0) || !std::isfinite(x.seconds) || !(x.amount >= 0.0) || !std::isfinite(x.amount)) return;
    const double samples = x.amount > 0.0 ? x.amount : static_cast<double>(batch_[x.worker]);
    const double v = samples / x.seconds;
    if (!(v > 0.0) || !std::isfinite(v)) return;
    double& s = speed_[x.worker];
    s = s > 0.0 ? s + alpha() * (v - s) : v;
    if constexpr (Monitor::enabled) watch(x.worker, x.seconds, samples, out);
  }
  void drain(outcome_sink& out) { bsp_.drain(out); }

  [[nodiscard]] worker_plan plan(worker_id w) const {
    worker_plan p = bsp_.plan(w);
    const std::uint32_t b = w < batch_.size() ? batch_[w] : even_batch(bsp_.live_count());
    p.batch_size = b;
    p.data_share = static_cast<float>(static_cast<double>(b) / static_cast<double>(p_.total_batch));
    return p;
  }
  [[nodiscard]] stage_id stage() const noexcept { return stage_id::dlb; }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return bsp_.is_live(w); }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return bsp_.is_held(w); }

  [[nodiscard]] const dlb_params& params() const noexcept { return p_; }
  [[nodiscard]] std::uint64_t rounds() const noexcept { return bsp_.rounds(); }
  // The smoothed speed v_i in samples per second; 0 before a measurement.
  [[nodiscard]] double speed(worker_id w) const noexcept { return w < speed_.size() ? speed_[w] : 0.0; }
  // Every re-plan: every replan_every rounds, and at each straggler flag.
  [[nodiscard]] std::uint64_t replans() const noexcept { return replans_; }
  // Re-plans a straggler flag caused, and the latest flag (worker 0 and
  // zeros before the first).
  [[nodiscard]] std::uint64_t straggler_replans() const noexcept { return straggler_replans_; }
  [[nodiscard]] const straggler_flag& last_straggler() const noexcept { return last_; }
  [[nodiscard]] const Monitor& monitor() const noexcept { return monitor_; }

  void save(state_writer& w) const {
    w.tag(Monitor::enabled ? "DLBS" : "DLB_", 1);
    put_fields(w, p_);
    bsp_.save(w);
    w.put_vector(speed_);
    w.put_vector(batch_);
    w.put(since_);
    w.put(replans_);
    if constexpr (Monitor::enabled) {
      w.put_vector(basis_);
      w.put(straggler_replans_);
      put_fields(w, last_);
      monitor_.save(w);
    }
  }
  status load(state_reader& r) {
    basic_dlb n;
    ASHL_TRY(r.tag(Monitor::enabled ? "DLBS" : "DLB_", 1));
    ASHL_TRY(get_fields(r, n.p_, "dlb"));
    if (n.p_.total_batch == 0) return malformed("dlb.total_batch", 0, "must be >= 1");
    ASHL_TRY(n.bsp_.load(r));
    ASHL_TRY(r.get_vector(n.speed_, "dlb.speed"));
    ASHL_TRY(r.get_vector(n.batch_, "dlb.batch"));
    if (n.batch_.size() != n.speed_.size()) return malformed("dlb.batch", n.batch_.size(), "must match dlb.speed");
    ASHL_TRY(r.get(n.since_, "dlb.rounds_since_replan"));
    ASHL_TRY(r.get(n.replans_, "dlb.replans"));
    n.basis_.assign(n.speed_.size(), 0.0);
    n.raised_.assign(n.speed_.size(), 0);
    n.order_.assign(n.speed_.size(), 0);
    if constexpr (Monitor::enabled) {
      ASHL_TRY(r.get_vector(n.basis_, "dlb.basis"));
      if (n.basis_.size() != n.speed_.size()) return malformed("dlb.basis", n.basis_.size(), "must match dlb.speed");
      ASHL_TRY(r.get(n.straggler_replans_, "dlb.straggler_replans"));
      if (n.straggler_replans_ > n.replans_) return malformed("dlb.straggler_replans", n.straggler_replans_, "above replans");
      ASHL_TRY(get_fields(r, n.last_, "dlb.last"));
      ASHL_TRY(n.monitor_.load(r));
    }
    *this = std::move(n);
    return {};
  }

 private:
  [[nodiscard]] double alpha() const noexcept {
    return p_.half_life > 0.0 ? 1.0 - std::exp2(-1.0 / p_.half_life) : 1.0;
  }
  [[nodiscard]] std::uint32_t even_batch(std::size_t live) const noexcept {
    const double b = live == 0 ? static_cast<double>(p_.total_batch)
                               : std::round(static_cast<double>(p_.total_batch) / static_cast<double>(live));
    return std::max(p_.min_batch, static_cast<std::uint32_t>(b));
  }
  // The next completed round re-plans whatever replan_every says. Kept in
  // since_ (rounds since the last re-plan), so a saved state carries it with
  // no field of its own.
  void replan_at_boundary() noexcept {
    since_ = std::max<std::uint64_t>(since_, std::max<std::uint32_t>(1, p_.replan_every) - 1);
  }
  void after_rounds(std::uint64_t before, outcome_sink& out) {
    const std::uint64_t done = bsp_.rounds() - before;
    if (done == 0) return;
    since_ += done;
    if (since_ < std::max<std::uint32_t>(1, p_.replan_every)) return;
    since_ = 0;
    replan(out);
  }
  // A compute sample for the monitor; its flag re-plans at once.
  void watch(worker_id w, double seconds, double samples, outcome_sink& out) {
    if (!(basis_[w] > 0.0)) {  // the first measurement is the worker's capability
      basis_[w] = 1.0 / speed_[w];
      monitor_.predict(w, basis_[w]);
    }
    const std::optional<straggler_flag> f = monitor_.observe(w, seconds, samples);
    if (!f) return;
    if (f->seconds_per_sample > 0.0 && std::isfinite(f->seconds_per_sample)) speed_[w] = 1.0 / f->seconds_per_sample;
    last_ = *f;
    ++straggler_replans_;
    since_ = 0;
    replan(out);
  }
  // b_i ≈ B·v_i / Σv over the live workers, at least min_batch, Σ b_i = B
  // (see the header's comment). O(ids) per pass, a pass more for each
  // round of workers newly raised to min_batch (one in practice), and a
  // sort of the others by remainder: O(M log M) once per re-plan.
  void replan(outcome_sink& out) {
    double sum = 0.0;
    std::size_t known = 0, live = 0;
    for (worker_id w = 0; w < speed_.size(); ++w) {
      if (!bsp_.is_live(w)) continue;
      ++live;
      if (speed_[w] > 0.0) {
        sum += speed_[w];
        ++known;
      }
    }
    if (live == 0) return;
    // Nobody measured: every live worker at the same speed (the even split).
    const double mean = known == 0 ? 1.0 : sum / static_cast<double>(known);
    const auto speed_of = [&](worker_id w) { return speed_[w] > 0.0 ? speed_[w] : mean; };
    // Workers whose share falls below min_batch take it; the rest split what
    // remains. raised_ marks them (sized with speed_: no allocation here).
    std::fill(raised_.begin(), raised_.end(), std::uint8_t{0});
    double rest = static_cast<double>(p_.total_batch);
    double rest_speed = (known == 0 ? 0.0 : sum) + static_cast<double>(live - known) * mean;
    for (bool more = true; more && rest_speed > 0.0;) {
      more = false;
      for (worker_id w = 0; w < speed_.size(); ++w) {
        if (!bsp_.is_live(w) || raised_[w] != 0) continue;
        if (rest * speed_of(w) / rest_speed >= static_cast<double>(p_.min_batch)) continue;
        raised_[w] = 1;
        rest -= static_cast<double>(p_.min_batch);
        rest_speed -= speed_of(w);
        more = true;
      }
    }
    // The others: the integer parts of their quotas, completed by largest
    // remainder (ties to the lower id), as profile::plan_dlb_batches does.
    const auto quota = [&](worker_id w) { return rest * speed_of(w) / rest_speed; };
    std::size_t n = 0;
    double floors = 0.0;
    for (worker_id w = 0; w < speed_.size(); ++w) {
      if (!bsp_.is_live(w) || raised_[w] != 0 || !(rest_speed > 0.0)) continue;
      order_[n++] = w;
      floors += std::floor(quota(w));
    }
    const auto remainder = [&](worker_id w) { return quota(w) - std::floor(quota(w)); };
    std::sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(n), [&](worker_id a, worker_id b) {
      const double ra = remainder(a), rb = remainder(b);
      return ra > rb || (ra == rb && a < b);
    });
    const double left = std::round(rest - floors);
    const std::size_t bonus = left > 0.0 ? std::min(n, static_cast<std::size_t>(left)) : 0;
    for (std::size_t k = 0; k < bonus; ++k) raised_[order_[k]] = 2;  // 2: one more than its integer part
    for (worker_id w = 0; w < speed_.size(); ++w) {
      if (!bsp_.is_live(w)) continue;
      std::uint32_t next = p_.min_batch;
      if (raised_[w] != 1 && rest_speed > 0.0)
        next = std::max(p_.min_batch, static_cast<std::uint32_t>(std::floor(quota(w))) + (raised_[w] == 2 ? 1u : 0u));
      if (next != batch_[w]) {
        batch_[w] = next;
        out.plan_changed(w);
      }
      // The speed this batch was planned from is w's prediction from now on.
      if constexpr (Monitor::enabled) {
        if (speed_[w] > 0.0 && 1.0 / speed_[w] != basis_[w]) {
          basis_[w] = 1.0 / speed_[w];
          monitor_.predict(w, basis_[w]);
        }
      }
    }
    ++replans_;
  }

  dlb_params p_;
  Monitor monitor_{};
  bsp bsp_;
  std::vector<double> speed_;         // v_i, EWMA; 0: not measured since joining
  std::vector<std::uint32_t> batch_;  // b_i in force
  std::uint64_t since_ = 0;           // completed rounds since the last re-plan
  std::uint64_t replans_ = 0;
  std::vector<double> basis_;         // seconds per sample the batch in force was planned from; 0: none yet
  std::vector<std::uint8_t> raised_;  // replan's scratch: 1 where b_i was raised to min_batch, 2 a remainder's +1 (not saved)
  std::vector<worker_id> order_;      // replan's scratch: the others by remainder (not saved)
  std::uint64_t straggler_replans_ = 0;
  straggler_flag last_{};
};

using dlb = basic_dlb<>;
static_assert(consistency_policy<dlb>);

}  // namespace sync
ASHL_NAMESPACE_END
