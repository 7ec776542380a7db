// test/support/core_event_script.hpp — the seeded random calls of a
// server_core that the replication tests drive (test/rules/core_events.cpp,
// test/rules/replication.cpp): the policy case's core (make_side), the
// events a driver would make (joins, rejoins, restarts, stale joins,
// commits dense and compressed, duplicates and refused ones, pulls, ticks
// with the ledger, metrics, measurements, evictions, leaves, drains), and
// the call of one event through a recorded_core (call). One body, so both
// tests replay the same sequences.
#pragma once

#include <boost/test/unit_test.hpp>

#include "ps_policy_cases.hpp"
#include "saved_state.hpp"

#include <ashl/compress/cast.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/rules/apply_pool.hpp>
#include <ashl/rules/core_events.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/rules/server_core.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <vector>

namespace core_script {


namespace ps = ashl::ps;
namespace as = ashl::sync;
using ashl::codec_id;
using core_t = ps::server_core<>;

constexpr std::uint32_t workers = 4;  // ids 4 and 5 join later (ps_cases' ids)
constexpr std::uint64_t seed = 5;

inline float value(std::uint32_t w, std::uint64_t seq, std::size_t i) {
  const std::uint64_t h = (i * 2654435761u) ^ (seq * 40503u) ^ (std::uint64_t{w} * 977u);
  return static_cast<float>(static_cast<int>(h % 2001) - 1000) * 1e-4f;
}

// The core's saved bytes once its pending applies are done.
inline std::vector<std::byte> saved(core_t& c) {
  c.apply_pending();
  return test_support::saved(c);
}

// A core of n elements in one shard under SSP with ps_cases' parameters.
inline core_t make_ssp_core(std::size_t n) {
  auto policy = ps::make_policy("ssp", ps_cases::base_params("ssp", workers));
  BOOST_REQUIRE(policy.has_value());
  auto c = core_t::create({.layout = *ps::shard_layout::even(n, 1), .workers = workers}, std::move(*policy));
  BOOST_REQUIRE(c.has_value());
  return std::move(*c);
}

// A core and the threads it applies with (kept beside it).
struct side {
  std::unique_ptr<ps::apply_pool> pool;
  std::optional<core_t> core;
};

// The case's policy on a core of n elements; the DiLoCo family with its
// outer optimizer, the others with model deltas or (odd `variant`) momentum
// SGD, so both apply paths are replayed.
// `nudged`: one value off, a core that does not hold the others' state.
inline side make_side(const ps_cases::policy_case& c, std::size_t variant, std::size_t n, unsigned threads,
                      std::uint32_t batch, const ps::ledger_params& ledger = {}, bool nudged = false) {
  side s;
  auto policy = ps::make_policy(c.name, c.params);
  BOOST_REQUIRE_MESSAGE(policy.has_value(), c.label);
  const ps::optimizer_params otherwise =
      variant % 2 == 0 ? ps::optimizer_params{}
                       : ps::optimizer_params{.mode = ps::optimizer_params::kind::sgd, .lr = 0.1, .momentum = 0.5};
  auto opt = ps::outer_optimizer_of(c.name, c.params, otherwise);
  BOOST_REQUIRE_MESSAGE(opt.has_value(), c.label);
  std::vector<float> initial(n);
  for (std::size_t i = 0; i < n; ++i) initial[i] = value(9, 0, i);
  if (nudged) initial[n / 2] += 1e-3f;
  auto made = core_t::create(
      {.layout = *ps::shard_layout::even(n, 1), .workers = workers, .optimizer = *opt, .seed = seed, .ledger = ledger},
      std::move(*policy), initial);
  BOOST_REQUIRE_MESSAGE(made.has_value(), c.label + ": " + made.to_status().to_string());
  s.core.emplace(std::move(*made));
  if (threads > 1) {
    auto pool = ps::apply_pool::create(threads);
    BOOST_REQUIRE(pool.has_value());
    s.pool = std::move(*pool);
    s.core->use_apply_pool(s.pool.get());
  }
  s.core->defer_dense_applies(batch);
  return s;
}

// The events, as a driver would make the calls: ids [0, workers + 2), ids
// >= workers outside until they join. Each commit is followed by its
// worker's compute, push and pull timings (ASHL profiles, DLB measures).
// The loss falls as in ps_cases::script (ASHL switches near t = 283 s) and
// rises in [400, 440) (ADSP's re-search).
class events {
 public:
  // `kept`: the primary of batched applies keeps each payload until
  // apply_pending() (4 slots, apply_pending() before the first is reused)
  // and says a finite dense payload's values were checked, as ps::server does.
  // `ledger`: joins say a batch and some pulls are ticks instead (the same
  // random draws otherwise, so the other runs' events stay as they were).
  events(std::size_t n, std::uint32_t rng_seed, bool kept, bool ledger = false)
      : n_(n), kept_(kept), ledger_(ledger), rng_(rng_seed), seq_(workers + 2, 0), inc_(workers + 2, 0), values_(n) {
    for (auto& r : ring_) r.resize(8 * n + 64);
  }

  // Whether the next commit reuses the first slot (the kept payloads must
  // have been applied: call apply_pending() first).
  [[nodiscard]] bool reuses_ring() const noexcept { return commits_ % ring_.size() == 0; }
  // The last event was a finite dense f32 commit of the right size (one
  // the primary may apply as its parts land).
  [[nodiscard]] bool speculable() const noexcept { return speculable_; }
  // The last commit as the driver hands it to the core (its record clears
  // payload_kept and values_checked).
  [[nodiscard]] const ps::commit_in& last_commit() const noexcept { return last_; }

  ps::core_event next() {
    speculable_ = false;
    time_ += 0.06 * static_cast<double>(1 + rng_() % 20);
    if (queued_ > 0) return timing(queued_w_, kinds_[3 - queued_--]);
    const auto w = static_cast<as::worker_id>(rng_() % (workers + 2));
    const unsigned r = rng_() % 100;
    if (r < 42) return commit(w);
    if (r < 64) return ledger_ && r >= 58 ? ps::core_event::of_tick(time_) : ps::core_event::of_pull(w, time_);
    if (r < 74) {
      ps::core_event e = timing(w, ashl::measurement_kind::commit);
      if (rng_() % 15 == 0) e.measurement.seconds = 0.0;  // refused: seconds must be > 0
      if (rng_() % 40 == 0) e.measurement.kind = static_cast<ashl::measurement_kind>(17);  // refused: no such kind
      return e;
    }
    if (r < 89) {
      const double rise = time_ >= 400.0 && time_ < 440.0 ? 1.6 : 1.0;
      const unsigned m = rng_() % 20;
      if (m == 0) return ps::core_event::of_metric(ashl::metric_id::accuracy, 0.001 * time_, time_);
      if (m == 1) return ps::core_event::of_metric(static_cast<ashl::metric_id>(1500), 3.0, time_);
      return ps::core_event::of_metric(ashl::metric_id::loss, rise * 2.0 / (1.0 + 0.02 * time_), time_);
    }
    if (r < 94) {
      const unsigned j = rng_() % 6;
      const std::uint32_t batch = ledger_ ? 4 + 4 * w : 0;
      if (j == 0 && inc_[w] > 0) return ps::core_event::of_join(w, inc_[w] - 1, time_, batch);  // stale: refused
      if (j <= 2) {  // a restart: a new process, sequences from 1
        ++inc_[w];
        seq_[w] = 0;
      }
      return ps::core_event::of_join(w, inc_[w], time_, batch);  // else a rejoin (or a duplicate join)
    }
    if (r < 97) return ps::core_event::of_evict(w, time_);
    if (r < 99) return ps::core_event::of_leave(w, time_);
    return ps::core_event::of_drain();
  }

 private:
  ps::core_event commit(as::worker_id w) {
    std::uint64_t s = ++seq_[w];
    if (rng_() % 12 == 0 && s > 1) s -= 1 + rng_() % s;  // a duplicate (or, at 0, refused)
    const unsigned pick = rng_() % 10;
    const codec_id codec = pick < 6    ? codec_id::identity
                           : pick == 6 ? codec_id::fp16
                           : pick == 7 ? codec_id::bf16
                           : pick == 8 ? codec_id::topk
                                       : codec_id::randomk;
    for (std::size_t i = 0; i < n_; ++i) values_[i] = value(w, s, i);
    bool finite = true;
    if (pick < 8 && rng_() % 30 == 0) {  // a dense payload with a NaN: refused (the parameters stay finite)
      values_[rng_() % n_] = std::numeric_limits<float>::quiet_NaN();
      finite = false;
    }
    std::vector<std::byte>& buf = ring_[commits_++ % ring_.size()];
    const ashl::compress::codec_context ctx{.seed = seed, .step = s, .tensor = 0};
    const auto view = ashl::host_view<const float>(values_.data(), n_);
    auto run = [&](const auto& c) { return c.encode(view, buf, ctx).value(); };
    const std::size_t used = codec == codec_id::identity ? run(ashl::compress::identity{})
                             : codec == codec_id::fp16   ? run(ashl::compress::fp16{})
                             : codec == codec_id::bf16   ? run(ashl::compress::bf16{})
                             : codec == codec_id::topk   ? run(ashl::compress::topk{0.05})
                                                         : run(ashl::compress::randomk({.count = 64}));
    ps::commit_in c{.worker = w,
                    .incarnation = inc_[w],
                    .sequence = s,
                    .clock = s,
                    .samples = 16 + (rng_() % 4) * 16,
                    .bytes = used + 72,
                    .codec = codec,
                    .element_count = n_,
                    .step = s,
                    .payload = std::span<const std::byte>(buf.data(), used)};
    if (rng_() % 40 == 0) c.incarnation += 7;       // refused: another incarnation
    if (rng_() % 50 == 0) c.element_count = n_ + 1;  // refused: another size
    if (rng_() % 100 == 0) c.samples = (std::uint64_t{1} << 30) + 1;  // refused: above max_commit_samples
    c.pull = rng_() % 2 == 0;
    c.ack_only = c.pull && rng_() % 4 == 0;
    c.reply_unchecked = c.pull && !c.ack_only && rng_() % 8 == 0;
    if (kept_) {
      c.payload_kept = true;
      c.values_checked = finite && codec == codec_id::identity;
    }
    speculable_ = finite && codec == codec_id::identity && c.element_count == n_;
    last_ = c;
    queued_ = 3;
    queued_w_ = w;
    return ps::core_event::of_commit(c, time_);
  }

  ps::core_event timing(as::worker_id w, ashl::measurement_kind kind) {
    const double noise = 1.0 + 0.04 * (static_cast<double>(rng_() % 201) / 100.0 - 1.0);
    double s = 0.005 * (1 + w % 2), amount = 4096.0;
    if (kind == ashl::measurement_kind::compute) {
      s = 0.01 * (1 + w % 3) * (w == 1 && time_ >= 350.0 ? 3.0 : 1.0);
      amount = 32.0;
    }
    if (kind == ashl::measurement_kind::commit) s *= 2.0;
    return ps::core_event::of_measurement({.worker = w, .kind = kind, .seconds = s * noise, .amount = amount,
                                           .time = time_});
  }

  static constexpr ashl::measurement_kind kinds_[3] = {
      ashl::measurement_kind::compute, ashl::measurement_kind::push, ashl::measurement_kind::pull};
  std::size_t n_;
  bool kept_, ledger_;
  std::mt19937 rng_;
  std::vector<std::uint64_t> seq_, inc_;
  std::vector<float> values_;
  std::array<std::vector<std::byte>, 4> ring_;
  std::size_t commits_ = 0;
  bool speculable_ = false;
  ps::commit_in last_{};
  int queued_ = 0;
  as::worker_id queued_w_ = 0;
  double time_ = 0.0;
};

// A driver's call through the wrapper (the commit as the event has it, with
// the driver's facts the record clears).
template <class Recorded>
inline void call(Recorded& rc, const ps::core_event& e, const ps::commit_in& c, ps::server_actions& out) {
  switch (e.kind) {
    case ps::core_event_kind::join: rc.join(e.worker, e.incarnation, e.now, out, e.batch); return;
    case ps::core_event_kind::leave: rc.leave(e.worker, e.now, out); return;
    case ps::core_event_kind::evict: rc.evict(e.worker, e.now, out); return;
    case ps::core_event_kind::commit: rc.commit(c, e.now, out); return;
    case ps::core_event_kind::pull: rc.pull(e.worker, e.now, out); return;
    case ps::core_event_kind::metric: rc.metric(e.metric, e.value, e.now, out); return;
    case ps::core_event_kind::measurement: rc.measurement(e.measurement, out); return;
    case ps::core_event_kind::drain: rc.drain(out); return;
    case ps::core_event_kind::tick: rc.tick(e.now, out); return;
  }
}

}  // namespace core_script
