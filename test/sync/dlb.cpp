#include <ashl/sync/dlb.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/rules/planners.hpp>  // ps::straggler_monitor: profile's detector as dlb's monitor

#include "../support/policy_testing.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

namespace as = ashl::sync;
using ashl::measurement_kind;
using ashl::stage_id;

namespace {
as::outcome_sink sink;  // reused by every event, as a driver does
as::outcome_sink& fresh() {
  sink.clear();
  return sink;
}
std::vector<as::worker_id> changed() { return {sink.plans_changed().begin(), sink.plans_changed().end()}; }

// One BSP round: a commit from each of `ids`, each covering `b` samples of its plan.
void round(as::dlb& p, const std::vector<as::worker_id>& ids, std::uint64_t seq) {
  for (auto w : ids)
    (void)p.on_commit({.worker = w, .sequence = seq, .samples = p.plan(w).batch_size}, fresh());
}
}  // namespace

BOOST_AUTO_TEST_CASE(batches_follow_measured_throughput) {
  as::dlb p{{.workers = 3, .total_batch = 120, .min_batch = 8, .half_life = 1e-9}};
  BOOST_TEST((p.stage() == stage_id::dlb));
  BOOST_TEST((p.plan(0).stage == stage_id::dlb));
  BOOST_TEST(p.plan(0).batch_size == 40u);  // B / M before anything is measured
  BOOST_TEST(p.plan(0).data_share == static_cast<float>(40.0 / 120.0));
  // Speeds 400, 200, 100 samples/s: b = 120·(4, 2, 1)/7 = 68.6, 34.3, 17.1.
  p.on_measurement({.worker = 0, .kind = measurement_kind::compute, .seconds = 0.1, .amount = 40}, fresh());
  p.on_measurement({.worker = 1, .kind = measurement_kind::compute, .seconds = 0.2, .amount = 40}, fresh());
  p.on_measurement({.worker = 2, .kind = measurement_kind::compute, .seconds = 0.4, .amount = 0}, fresh());  // its plan's 40
  BOOST_TEST(!sink.any_plan_changed());  // plans change at a round's end, not per measurement
  BOOST_TEST(p.speed(2) == 100.0);
  BOOST_TEST(p.plan(0).batch_size == 40u);
  round(p, {0, 1}, 1);
  BOOST_TEST(p.rounds() == 0u);
  (void)p.on_commit({.worker = 2, .sequence = 1, .samples = 40}, fresh());
  BOOST_TEST(p.rounds() == 1u);
  // The completed round is weighted by samples (all 40 here), and every batch moved.
  BOOST_TEST(sink.round().size() == 3u);
  BOOST_TEST(sink.round()[0].weight == 1.0 / 3.0);
  BOOST_TEST((changed() == std::vector<as::worker_id>{0, 1, 2}));
  BOOST_TEST(p.plan(0).batch_size == 69u);
  BOOST_TEST(p.plan(1).batch_size == 34u);
  BOOST_TEST(p.plan(2).batch_size == 17u);
  BOOST_TEST(p.plan(0).data_share == static_cast<float>(69.0 / 120.0));
  // The next round's commits carry those batches: weights b_i / Σb.
  (void)p.on_commit({.worker = 0, .sequence = 2, .samples = 69}, fresh());
  (void)p.on_commit({.worker = 1, .sequence = 2, .samples = 34}, fresh());
  (void)p.on_commit({.worker = 2, .sequence = 2, .samples = 17}, fresh());
  BOOST_TEST_REQUIRE(sink.round().size() == 3u);
  BOOST_TEST(sink.round()[0].weight == 69.0 / 120.0);
  BOOST_TEST(changed().empty());  // same speeds: no batch moved, no plan marked
}

BOOST_AUTO_TEST_CASE(min_batch_ewma_and_membership) {
  as::dlb p{{.workers = 2, .total_batch = 100, .min_batch = 10, .half_life = 1.0}};
  p.on_measurement({.worker = 0, .kind = measurement_kind::compute, .seconds = 1.0, .amount = 95}, fresh());
  p.on_measurement({.worker = 1, .kind = measurement_kind::compute, .seconds = 1.0, .amount = 1}, fresh());
  // Half-life 1: the second sample moves the mean half way.
  p.on_measurement({.worker = 1, .kind = measurement_kind::compute, .seconds = 1.0, .amount = 3}, fresh());
  BOOST_TEST(p.speed(1) == 2.0);
  // Non-finite or non-positive durations are ignored.
  p.on_measurement({.worker = 1, .kind = measurement_kind::compute, .seconds = 0.0, .amount = 3}, fresh());
  p.on_measurement({.worker = 1, .kind = measurement_kind::compute, .seconds = std::nan(""), .amount = 3}, fresh());
  BOOST_TEST(p.speed(1) == 2.0);
  round(p, {0, 1}, 1);
  // 100·2/97 = 2 is raised to min_batch; worker 0 takes the rest, so Σ b_i = B.
  BOOST_TEST(p.plan(0).batch_size == 90u);
  BOOST_TEST(p.plan(1).batch_size == 10u);
  // A joiner starts at B / M and is measured anew. It is pending until the
  // round in progress completes (docs/elastic.md §2.4), so that round does
  // not wait for it; the next one does, and an eviction completes it without it.
  p.on_join({.worker = 2}, fresh());
  BOOST_TEST(p.plan(2).batch_size == 33u);
  BOOST_TEST(sink.plan_changed_for(2));
  (void)p.on_commit({.worker = 0, .sequence = 2, .samples = 90}, fresh());
  (void)p.on_commit({.worker = 1, .sequence = 2, .samples = 10}, fresh());
  BOOST_TEST(p.rounds() == 2u);
  BOOST_TEST(sink.round().size() == 2u);
  (void)p.on_commit({.worker = 0, .sequence = 3, .samples = 98}, fresh());
  (void)p.on_commit({.worker = 1, .sequence = 3, .samples = 10}, fresh());
  BOOST_TEST(p.rounds() == 2u);
  p.on_evict({.worker = 2}, fresh());
  BOOST_TEST(p.rounds() == 3u);
  BOOST_TEST(sink.round().size() == 2u);
}

namespace {
std::uint32_t total_of(const as::dlb& p, const std::vector<as::worker_id>& ids) {
  std::uint32_t sum = 0;
  for (auto w : ids) sum += p.plan(w).batch_size;
  return sum;
}
}  // namespace

// Σ b_i = B exactly, not B up to the roundings: three equal speeds split 100
// as 34 + 33 + 33 (each share rounded alone gives 99).
BOOST_AUTO_TEST_CASE(the_batches_add_up_to_the_total_batch) {
  as::dlb p{{.workers = 3, .total_batch = 100, .half_life = 1e-9}};
  for (as::worker_id w = 0; w < 3; ++w)
    p.on_measurement({.worker = w, .kind = measurement_kind::compute, .seconds = 1.0, .amount = 10}, fresh());
  round(p, {0, 1, 2}, 1);
  BOOST_TEST(p.replans() == 1u);
  BOOST_TEST(total_of(p, {0, 1, 2}) == 100u);
  for (as::worker_id w = 0; w < 3; ++w) BOOST_TEST((p.plan(w).batch_size == 33u || p.plan(w).batch_size == 34u));
  // Nobody measured: the even split, still adding up to B.
  as::dlb q{{.workers = 3, .total_batch = 100}};
  round(q, {0, 1, 2}, 1);
  BOOST_TEST(total_of(q, {0, 1, 2}) == 100u);
  // Largest remainder, ties to the lower id (docs/algorithms.md §3): quotas
  // 31·(52, 52, 51)/155 = 10.4, 10.4, 10.2 give 11, 10, 10.
  as::dlb r{{.workers = 3, .total_batch = 31, .half_life = 1e-9}};
  const double speeds[] = {52.0, 52.0, 51.0};
  for (as::worker_id w = 0; w < 3; ++w)
    r.on_measurement({.worker = w, .kind = measurement_kind::compute, .seconds = 1.0, .amount = speeds[w]}, fresh());
  round(r, {0, 1, 2}, 1);
  BOOST_TEST(r.plan(0).batch_size == 11u);
  BOOST_TEST(r.plan(1).batch_size == 10u);
  BOOST_TEST(r.plan(2).batch_size == 10u);
}

// docs/elastic.md §2.4: a join or an eviction re-plans every live worker at
// the next round boundary, whatever replan_every says, so the global batch
// stays B (the configured total, not 64 per worker) for the new set; the
// joiner, not measured yet, counts at the mean measured speed: its even share.
BOOST_AUTO_TEST_CASE(a_join_and_an_eviction_replan_the_batches_so_they_add_up_to_the_total_batch) {
  as::dlb p{{.workers = 3, .total_batch = 100, .half_life = 1e-9, .replan_every = 1000}};
  const double speeds[] = {30.0, 20.0, 10.0};
  for (as::worker_id w = 0; w < 3; ++w)
    p.on_measurement({.worker = w, .kind = measurement_kind::compute, .seconds = 1.0, .amount = speeds[w]}, fresh());
  round(p, {0, 1, 2}, 1);
  BOOST_TEST(p.replans() == 0u);  // replan_every 1000: no scheduled re-plan in this test
  // Rank 3, beyond the initial set, joins between rounds.
  p.on_join({.worker = 3}, fresh());
  BOOST_TEST(p.plan(3).batch_size == 25u);  // the even share B / 4 until the boundary
  round(p, {0, 1, 2, 3}, 2);
  BOOST_TEST(p.replans() == 1u);
  BOOST_TEST(total_of(p, {0, 1, 2, 3}) == 100u);
  // 100·(30, 20, 10, 20)/80 = 37.5, 25, 12.5, 25, rounded cumulatively.
  BOOST_TEST(p.plan(0).batch_size == 38u);
  BOOST_TEST(p.plan(1).batch_size == 25u);
  BOOST_TEST(p.plan(2).batch_size == 12u);
  BOOST_TEST(p.plan(3).batch_size == 25u);
  float shares = 0.0f;
  for (as::worker_id w = 0; w < 4; ++w) shares += p.plan(w).data_share;
  BOOST_TEST(std::abs(shares - 1.0f) < 1e-6f);
  // The joiner is measured like anyone; then worker 0 is evicted between rounds.
  p.on_measurement({.worker = 3, .kind = measurement_kind::compute, .seconds = 1.0, .amount = 40}, fresh());
  p.on_evict({.worker = 0}, fresh());
  round(p, {1, 2, 3}, 3);
  BOOST_TEST(p.replans() == 2u);
  BOOST_TEST(total_of(p, {1, 2, 3}) == 100u);
  // 100·(20, 10, 40)/70 = 28.6, 14.3, 57.1.
  BOOST_TEST(p.plan(1).batch_size == 29u);
  BOOST_TEST(p.plan(2).batch_size == 14u);
  BOOST_TEST(p.plan(3).batch_size == 57u);
  // An eviction that completes the round in progress re-plans at that boundary.
  (void)p.on_commit({.worker = 1, .sequence = 4, .samples = 29}, fresh());
  (void)p.on_commit({.worker = 3, .sequence = 4, .samples = 57}, fresh());
  p.on_evict({.worker = 2}, fresh());
  BOOST_TEST(p.rounds() == 4u);
  BOOST_TEST(p.replans() == 3u);
  BOOST_TEST(total_of(p, {1, 3}) == 100u);
  // A saved state carries the pending re-plan: a join, save, load, then the boundary.
  p.on_join({.worker = 5}, fresh());
  std::vector<std::byte> bytes;
  ashl::state_writer sw(bytes);
  p.save(sw);
  as::dlb q{{.workers = 1}};
  ashl::state_reader sr(bytes);
  BOOST_TEST_REQUIRE(q.load(sr).ok());
  round(q, {1, 3, 5}, 5);
  BOOST_TEST(q.replans() == 4u);
  BOOST_TEST(total_of(q, {1, 3, 5}) == 100u);
}

BOOST_AUTO_TEST_CASE(replan_every_spaces_the_replans) {
  as::dlb p{{.workers = 2, .total_batch = 90, .replan_every = 2}};
  p.on_measurement({.worker = 0, .kind = measurement_kind::compute, .seconds = 1.0, .amount = 20}, fresh());
  p.on_measurement({.worker = 1, .kind = measurement_kind::compute, .seconds = 1.0, .amount = 10}, fresh());
  round(p, {0, 1}, 1);
  BOOST_TEST(p.replans() == 0u);
  BOOST_TEST(p.plan(0).batch_size == 45u);
  round(p, {0, 1}, 2);
  BOOST_TEST(p.replans() == 1u);
  BOOST_TEST(p.plan(0).batch_size == 60u);
}

BOOST_AUTO_TEST_CASE(save_load_round_trip_and_truncation) {
  policy_testing::check_round_trip(as::dlb{{.workers = 4, .total_batch = 256, .min_batch = 4, .half_life = 2.0}}, 4,
                                   7);
  as::dlb p{{.workers = 3, .total_batch = 99}};
  p.on_measurement({.worker = 0, .kind = measurement_kind::compute, .seconds = 1.0, .amount = 20}, fresh());
  round(p, {0, 1, 2}, 1);
  policy_testing::check_load_rejects_truncation(p);
}

namespace {
using straggler_dlb = as::basic_dlb<ashl::ps::straggler_monitor>;
straggler_dlb make_straggler_dlb() {
  // No scheduled re-plan within the test: only flags re-plan.
  return straggler_dlb({.workers = 3, .total_batch = 120, .min_batch = 8, .half_life = 1e-9, .replan_every = 1000},
                       ashl::ps::straggler_monitor({.workers = 3, .window = 4, .threshold = 0.5, .consecutive = 2}));
}
void measure(straggler_dlb& p, as::worker_id w, double seconds, double batch) {
  p.on_measurement({.worker = w, .kind = measurement_kind::compute, .seconds = seconds, .amount = batch}, fresh());
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_straggler_flag_replans_the_batches_at_once) {
  straggler_dlb p = make_straggler_dlb();
  // 400, 400 and 100 samples/s: worker 2 is 4x slower by design, at its own speed.
  for (int n = 0; n < 20; ++n) {
    measure(p, 0, 0.1, 40);
    measure(p, 1, 0.1, 40);
    measure(p, 2, 0.4, 40);
    BOOST_TEST(!sink.any_plan_changed());
  }
  BOOST_TEST(p.replans() == 0u);
  BOOST_TEST(p.straggler_replans() == 0u);
  // Worker 0 becomes 2x slower than its own capability: two windows of four
  // samples, then one re-plan, at once, from the window's throughput (200/s).
  int replans_seen = 0;
  for (int n = 0; n < 8; ++n) {
    measure(p, 0, 0.2, 40);
    if (sink.any_plan_changed()) {
      ++replans_seen;
      BOOST_TEST(n == 7);
      BOOST_TEST((changed() == std::vector<as::worker_id>{0, 1, 2}));
    }
  }
  BOOST_TEST(replans_seen == 1);
  BOOST_TEST(p.replans() == 1u);
  BOOST_TEST(p.straggler_replans() == 1u);
  BOOST_TEST(p.rounds() == 0u);  // no round had to complete
  // b = 120 · (200, 400, 100) / 700.
  BOOST_TEST(p.plan(0).batch_size == 34u);
  BOOST_TEST(p.plan(1).batch_size == 69u);
  BOOST_TEST(p.plan(2).batch_size == 17u);
  // The report names the worker and why: 0.005 s per sample against 0.0025 predicted.
  BOOST_TEST(p.last_straggler().worker == 0u);
  BOOST_TEST(p.last_straggler().seconds_per_sample == 0.005, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(p.last_straggler().predicted_per_sample == 0.0025, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(p.last_straggler().windows == 2u);
  // At its new speed, at its new batch, it is not flagged again: no re-plan storm.
  for (int n = 0; n < 40; ++n) {
    measure(p, 0, 0.17, 34);
    measure(p, 1, 0.1725, 69);
    measure(p, 2, 0.17, 17);
  }
  BOOST_TEST(p.straggler_replans() == 1u);
}

BOOST_AUTO_TEST_CASE(a_worker_that_stays_slow_is_replanned_at_most_once_per_window) {
  straggler_dlb p = make_straggler_dlb();
  measure(p, 0, 0.1, 40);
  // 3x, then 9x its first capability, sample after sample: each flag needs
  // two fresh windows (8 samples) over the line of the prediction in force.
  for (int n = 0; n < 8; ++n) measure(p, 0, 0.3, 40);
  BOOST_TEST(p.straggler_replans() == 1u);
  std::uint64_t flags = 0;
  for (int n = 0; n < 32; ++n) {
    measure(p, 0, 0.9, 40);
    flags += sink.any_plan_changed() ? 1 : 0;
  }
  BOOST_TEST(p.straggler_replans() <= 1u + 32u / 4u);
  BOOST_TEST(p.straggler_replans() == 2u);  // the re-plan made 0.9 s the prediction
  BOOST_TEST(flags <= 1u);  // only 0 is measured: a re-plan changes at most its batch
}

BOOST_AUTO_TEST_CASE(plain_dlb_waits_for_replan_every) {
  as::dlb p{{.workers = 3, .total_batch = 120, .min_batch = 8, .half_life = 1e-9, .replan_every = 1000}};
  for (int n = 0; n < 20; ++n)
    p.on_measurement({.worker = 0, .kind = measurement_kind::compute, .seconds = 0.2, .amount = 40}, fresh());
  BOOST_TEST(p.replans() == 0u);
  BOOST_TEST(p.straggler_replans() == 0u);
}

BOOST_AUTO_TEST_CASE(straggler_dlb_save_load_round_trip) {
  policy_testing::check_round_trip(make_straggler_dlb(), 3, 11);
  straggler_dlb p = make_straggler_dlb();
  measure(p, 0, 0.1, 40);
  for (int n = 0; n < 9; ++n) measure(p, 0, 0.3, 40);
  policy_testing::check_load_rejects_truncation(p);
  // A plain dlb's bytes are not a straggler dlb's.
  const auto bytes = policy_testing::saved(as::dlb{{.workers = 3}});
  ashl::state_reader in(bytes);
  BOOST_TEST(!p.load(in).ok());
}
