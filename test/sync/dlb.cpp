#include <ashl/sync/dlb.hpp>

#include <boost/test/unit_test.hpp>

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
  BOOST_TEST(p.plan(0).batch_size == 98u);
  BOOST_TEST(p.plan(1).batch_size == 10u);  // round(100·2/97) = 2, raised to min_batch
  // A joiner starts at B / M and is measured anew; an eviction completes the round without it.
  p.on_join({.worker = 2}, fresh());
  BOOST_TEST(p.plan(2).batch_size == 33u);
  BOOST_TEST(sink.plan_changed_for(2));
  (void)p.on_commit({.worker = 0, .sequence = 2, .samples = 98}, fresh());
  (void)p.on_commit({.worker = 1, .sequence = 2, .samples = 10}, fresh());
  BOOST_TEST(p.rounds() == 1u);
  p.on_evict({.worker = 2}, fresh());
  BOOST_TEST(p.rounds() == 2u);
  BOOST_TEST(sink.round().size() == 2u);
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
