// ashl/rules/bucket_cycle.hpp — the adapters' bucket cycle, pure: per bucket
// and local iteration, when its gradient is complete, who decides that the
// cycle is done (the leader), when the bucket commits, and what a skipped
// (non-finite) step does. One body for both adapters: adapt/torch.hpp
// (libtorch) and ashl/torch.py (through the native module's BucketCycle).
//
//   ashl::adapt::bucket_cycle cyc(slots_per_bucket);        // once: allocates here only
//   // gradient hook of (bucket b, slot s):
//   if (cyc.slot_ready(b, s) && commit_in_backward) bucket_done(b);
//   // bucket_done(b), also from step() for each bucket not yet taken:
//   if (cyc.taken(b)) return;
//   wait(b);  cyc.take(b, /*finite=*/all_finite(grads(b)));
//   for (;;) switch (cyc.next()) {
//     case action::none: return;
//     case action::add: builder(b).add(grads(b)); break;     // delta: counts the iteration
//     case action::count: cycle_done(b); break;              // below
//     case action::commit: build(b); return commit(b);
//     case action::commit_held: build(b, /*zero=*/builder(b).iterations() == 0); return commit(b);
//   }
//   // cycle_done(b): the workers count this iteration
//   for (;;) switch (cyc.count_next()) {
//     case count_action::lead:                              // bucket 0's worker decides for all
//       if (b != 0) wait(0);                                // its last exchange ended: its plan is this cycle's
//       plan = worker(0).current_plan(); cyc.led(worker(0).iteration_done(samples)); break;
//     case count_action::follow: cyc.followed(worker(b).iteration_done(plan, cyc.lead_done(), samples)); break;
//     case count_action::decided: return cyc.decision();
//   }
//   // step(), after the hooks:
//   if (!cyc.skipping() && any_non_finite(buckets not taken)) cyc.skip();
//   if (!cyc.begin_step()) { cyc.end_iteration(); return; }   // skipped whole
//   ... bucket_done(b) for each bucket (gradient), or local step + take(b, true) (delta) ...
//   cyc.end_step(); cyc.end_iteration();
//
// The rule (docs/torch.md, "Buckets and overlap" and "Mixed precision"):
// - A bucket's slots (its parameters, or a cut parameter's piece) are
//   readied by the gradient hooks; the bucket is full, once per backward,
//   when every slot is.
// - Each bucket is taken once per local iteration: its gradient is added
//   to its update (or, delta, the iteration counted), then its worker
//   counts the iteration. Bucket 0's worker leads: the first bucket of an
//   iteration to count asks it (after waiting for its exchange in flight,
//   so its plan is this cycle's), its iteration_done() decides for every
//   bucket, and its plan of the cycle is every follower's
//   (ps::worker_params::follower). All buckets thus run one cycle. The
//   bucket commits when the decision says the cycle is done.
// - The samples an iteration trained (the driver's count: a data ledger's
//   lease may end in a short batch, docs/elastic.md §3.6) go with the count
//   to the leader and every follower alike (ps::worker::iteration_done's
//   samples overloads; without them each counts the plan's batch), so every
//   bucket's commit says the same samples. A step skipped whole counts no
//   iteration; the Python adapter adds its batch to the next one's samples
//   (its positions are passed over, not trained again).
// - A skipped step: a bucket whose gradients hold inf or nan (or a
//   GradScaler that found some: skip()) makes the whole iteration skipped.
//   A skipped bucket's gradient is not added. If the leader already counted
//   this iteration (a bucket before it did), the skipped bucket counts it
//   too, so all workers stay in one cycle, and commits what its cycle holds
//   when it is done (zeros when it holds no iteration). If no bucket was
//   committed in the iteration, step() skips it whole: no local step, no
//   commit, not counted as an iteration (skipped() counts it).
// - A committed bucket cannot be taken back: a non-finite bucket after it
//   in the same backward does not undo it (commit_in_backward=False in the
//   Python adapter avoids that).
//
// Pure: no torch, no clock, no I/O; the driver waits, stages, builds and
// commits. Not thread-safe: both adapters call it under their training
// lock (the libtorch adapter's train_mu; the GIL in Python). Allocates
// only in the constructor (test/rules/bucket_cycle.cpp checks).
#pragma once

#include <ashl/config.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace adapt {

class bucket_cycle {
 public:
  // What the driver does next for the bucket it took (next()).
  enum class action : std::uint8_t {
    none,         // nothing more this iteration (not done yet, or a skipped step's bucket before the leader counted)
    add,          // add the bucket's gradient to its update (delta: count the iteration)
    count,        // its worker counts the iteration: run count_next() until decided
    commit,       // the cycle is done: build the update and commit it
    commit_held,  // skipped step, cycle done: commit what the cycle holds (zeros when it holds no iteration)
  };
  // The counting of the bucket taken (count_next()).
  enum class count_action : std::uint8_t {
    lead,     // ask bucket 0's worker: plan = current_plan(), then led(iteration_done()); a follower waits for bucket 0 first
    follow,   // this follower's worker counts with the leader's plan: followed(iteration_done(plan, lead_done()))
    decided,  // decision() says whether the cycle is done
  };
  struct counts {
    std::uint64_t iterations = 0;  // steps run (not skipped)
    std::uint64_t commits = 0;     // iterations in which some bucket committed
    std::uint64_t skipped = 0;     // steps skipped as non-finite
  };

  // slots[b]: the slots (hooked parameters or pieces) of bucket b.
  explicit bucket_cycle(std::span<const std::size_t> slots)
      : first_slot_(slots.size() + 1, 0), ready_count_(slots.size(), 0), taken_(slots.size(), 0),
        committed_(slots.size(), 0) {
    for (std::size_t b = 0; b < slots.size(); ++b) first_slot_[b + 1] = first_slot_[b] + slots[b];
    ready_.assign(first_slot_.back(), 0);
  }

  [[nodiscard]] std::size_t buckets() const noexcept { return taken_.size(); }
  [[nodiscard]] std::size_t slots(std::size_t b) const noexcept { return first_slot_[b + 1] - first_slot_[b]; }

  // -- the hooks --------------------------------------------------------

  // Slot `slot` of bucket b has its gradient of this backward. True when
  // that made the bucket full (its slots are then cleared for the next
  // backward); a slot readied twice counts once.
  bool slot_ready(std::size_t b, std::size_t slot) noexcept {
    ASHL_ASSERT(b < buckets() && slot < slots(b), "bucket_cycle::slot_ready: no such bucket or slot");
    std::uint8_t& r = ready_[first_slot_[b] + slot];
    if (!r) {
      r = 1;
      ++ready_count_[b];
    }
    if (ready_count_[b] < slots(b)) return false;
    clear_ready(b);
    return true;
  }

  // -- one bucket's iteration -------------------------------------------

  // Whether bucket b was taken in this iteration (its gradient is in, or
  // the skipped step passed it).
  [[nodiscard]] bool taken(std::size_t b) const noexcept { return taken_[b] != 0; }

  // Bucket b's part of this iteration is complete (gradient: its gradient
  // is accumulated; delta: the local step ran). finite false: it holds inf
  // or nan, and the iteration is skipped. Then run next() until none.
  void take(std::size_t b, bool finite) noexcept {
    ASHL_ASSERT(b < buckets() && !taken_[b], "bucket_cycle::take: no such bucket, or taken twice in one iteration");
    if (!finite) skipping_ = true;
    taken_[b] = 1;
    cur_ = b;
    if (skipping_) {
      held_ = true;
      phase_ = lead_known_ ? phase::count : phase::idle;
    } else {
      held_ = false;
      phase_ = phase::add;
    }
  }

  // What to do next for the bucket take() began.
  [[nodiscard]] action next() noexcept {
    switch (phase_) {
      case phase::idle:
        return action::none;
      case phase::add:
        phase_ = phase::count;
        return action::add;
      case phase::count:
        phase_ = phase::counting;
        return action::count;
      case phase::decided:
        phase_ = phase::idle;
        if (!decision_) return action::none;
        committed_[cur_] = 1;
        return held_ ? action::commit_held : action::commit;
      case phase::counting:
      case phase::awaiting_lead:
      case phase::awaiting_follow:
        break;
    }
    ASHL_ASSERT(false, "bucket_cycle::next: the count is not decided (run count_next() until decided)");
    return action::none;
  }

  // After action::count: the next step of the count.
  [[nodiscard]] count_action count_next() noexcept {
    switch (phase_) {
      case phase::counting:
        if (!lead_known_) {
          phase_ = phase::awaiting_lead;
          return count_action::lead;
        }
        if (cur_ == 0) {
          decide(lead_done_);
          return count_action::decided;
        }
        phase_ = phase::awaiting_follow;
        return count_action::follow;
      case phase::decided:
        return count_action::decided;
      default:
        break;
    }
    ASHL_ASSERT(false, "bucket_cycle::count_next: no count in progress (after action::count), or led/followed missing");
    return count_action::decided;
  }
  // The leader's iteration_done() of this iteration (after count_action::lead).
  void led(bool done) noexcept {
    ASHL_ASSERT(phase_ == phase::awaiting_lead, "bucket_cycle::led: not after count_action::lead");
    lead_known_ = true;
    lead_done_ = done;
    phase_ = phase::counting;
  }
  // The follower's iteration_done(plan, lead_done()) (after count_action::follow).
  void followed(bool done) noexcept {
    ASHL_ASSERT(phase_ == phase::awaiting_follow, "bucket_cycle::followed: not after count_action::follow");
    decide(done);
  }
  // Whether the leader counted this iteration, and what it decided.
  [[nodiscard]] bool lead_known() const noexcept { return lead_known_; }
  [[nodiscard]] bool lead_done() const noexcept { return lead_done_; }
  // After count_action::decided: whether the bucket's cycle is done.
  [[nodiscard]] bool decision() const noexcept { return decision_; }

  // -- the step ---------------------------------------------------------

  // This iteration is skipped (a non-finite gradient found outside take(),
  // or a GradScaler's found_inf).
  void skip() noexcept { skipping_ = true; }
  [[nodiscard]] bool skipping() const noexcept { return skipping_; }
  [[nodiscard]] bool committed(std::size_t b) const noexcept { return committed_[b] != 0; }
  [[nodiscard]] bool any_committed() const noexcept {
    return std::any_of(committed_.begin(), committed_.end(), [](std::uint8_t c) { return c != 0; });
  }

  // step() begins, after the hooks: false when the step is skipped whole
  // (skipping and nothing committed: no local step, no commit, no
  // iteration; counted as skipped), else the iteration is counted.
  bool begin_step() noexcept {
    if (skipping_ && !any_committed()) {
      ++counts_.skipped;
      return false;
    }
    ++counts_.iterations;
    return true;
  }
  // step()'s buckets are through: a skipped step that still committed
  // (some bucket before the non-finite one) counts as skipped too, and
  // the iteration counts as a commit when any bucket committed.
  void end_step() noexcept {
    if (skipping_) ++counts_.skipped;
    if (any_committed()) ++counts_.commits;
  }
  // The iteration's state goes: nothing taken, committed or ready, no
  // leader decision, not skipping (also after a failed step).
  void end_iteration() noexcept {
    std::fill(taken_.begin(), taken_.end(), std::uint8_t{0});
    std::fill(committed_.begin(), committed_.end(), std::uint8_t{0});
    for (std::size_t b = 0; b < buckets(); ++b) clear_ready(b);
    skipping_ = false;
    lead_known_ = false;
    lead_done_ = false;
    decision_ = false;
    held_ = false;
    phase_ = phase::idle;
  }

  [[nodiscard]] const counts& totals() const noexcept { return counts_; }
  // A checkpoint's counts (the Python adapter's load_state_dict).
  void restore(const counts& c) noexcept { counts_ = c; }

 private:
  enum class phase : std::uint8_t { idle, add, count, counting, awaiting_lead, awaiting_follow, decided };

  void decide(bool done) noexcept {
    decision_ = done;
    phase_ = phase::decided;
  }
  void clear_ready(std::size_t b) noexcept {
    std::fill(ready_.begin() + static_cast<std::ptrdiff_t>(first_slot_[b]),
              ready_.begin() + static_cast<std::ptrdiff_t>(first_slot_[b + 1]), std::uint8_t{0});
    ready_count_[b] = 0;
  }

  std::vector<std::size_t> first_slot_;  // bucket b's slots: [first_slot_[b], first_slot_[b + 1]) of ready_
  std::vector<std::uint8_t> ready_;
  std::vector<std::size_t> ready_count_;
  std::vector<std::uint8_t> taken_, committed_;
  counts counts_;
  bool skipping_ = false;
  bool lead_known_ = false, lead_done_ = false;
  // The bucket take() began, and where it stands.
  std::size_t cur_ = 0;
  bool held_ = false;      // skipped: commits what its cycle holds
  bool decision_ = false;  // its cycle is done
  phase phase_ = phase::idle;
};

}  // namespace adapt
ASHL_NAMESPACE_END
