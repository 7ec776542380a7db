#include <ashl/sync/asp.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/counting_new.hpp"
#include "../support/policy_testing.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace as = ashl::sync;

BOOST_AUTO_TEST_CASE(applies_everything_at_once_and_serves_every_pull) {
  as::asp p{{.workers = 2}};
  as::outcome_sink out(2);
  for (std::uint64_t s = 1; s <= 5; ++s) {
    auto d = p.on_commit({.worker = 0, .sequence = s}, out);
    BOOST_TEST((d.action == as::commit_action::apply));
    BOOST_TEST(d.weight == 1.0);
    BOOST_TEST(out.empty());
  }
  BOOST_TEST((p.on_pull({.worker = 1}, out) == as::pull_action::serve));
  BOOST_TEST(out.empty());
  BOOST_TEST((p.plan(0).stage == as::stage_id::asp));
  BOOST_TEST((p.stage() == as::stage_id::asp));
  BOOST_TEST(p.clock(0) == 5u);
}

BOOST_AUTO_TEST_CASE(duplicates_and_unknown_workers_are_dropped) {
  as::asp p{{.workers = 2}};
  as::outcome_sink out(2);
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 3}, out).action == as::commit_action::apply));
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 3}, out).action == as::commit_action::drop));
  BOOST_TEST((p.on_commit({.worker = 0, .sequence = 2}, out).action == as::commit_action::drop));
  BOOST_TEST((p.on_commit({.worker = 5, .sequence = 1}, out).action == as::commit_action::drop));
  p.on_evict({.worker = 1}, out);
  BOOST_TEST((p.on_commit({.worker = 1, .sequence = 1}, out).action == as::commit_action::drop));
  BOOST_TEST(p.live_count() == 1u);
  p.on_join({.worker = 5}, out);
  BOOST_TEST((p.on_commit({.worker = 5, .sequence = 1}, out).action == as::commit_action::apply));
  BOOST_TEST(p.live_count() == 2u);
  // A rejoining id starts a fresh sequence.
  p.on_join({.worker = 1}, out);
  BOOST_TEST((p.on_commit({.worker = 1, .sequence = 1}, out).action == as::commit_action::apply));
}

BOOST_AUTO_TEST_CASE(staleness_aware_weighting_counts_updates_since_last_pull) {
  as::asp p{{.workers = 2, .scale = 0.5, .staleness_weight = as::staleness_weighting::inverse()}};
  as::outcome_sink out(2);
  // Worker 1 pulls, then worker 0 commits 3 times: worker 1's next commit is 3 stale.
  (void)p.on_pull({.worker = 1}, out);
  for (std::uint64_t s = 1; s <= 3; ++s) (void)p.on_commit({.worker = 0, .sequence = s}, out);
  BOOST_TEST(p.staleness(1) == 3u);
  auto d = p.on_commit({.worker = 1, .sequence = 1}, out);
  BOOST_TEST(d.weight == 0.5 * 0.25);
  (void)p.on_pull({.worker = 1}, out);
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 2}, out).weight == 0.5);
}

BOOST_AUTO_TEST_CASE(power_staleness_weighting_and_per_worker_weights) {
  as::asp p{{.workers = 2, .weights = {0.25, 0.75}, .staleness_weight = as::staleness_weighting::power(2.0)}};
  as::outcome_sink out(2);
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 1}, out).weight == 0.75);
  BOOST_TEST(p.on_commit({.worker = 0, .sequence = 1}, out).weight == 0.25 * 0.25);  // τ = 1: 2^-2
  BOOST_TEST(p.plan(1).data_share == 0.75f);
}

BOOST_AUTO_TEST_CASE(set_plan_changes_weight_and_plan) {
  as::asp p{{.workers = 2}};
  as::outcome_sink out(2);
  p.set_plan(1, 0.4, {.local_iterations = 6, .stage = as::stage_id::ahl, .data_share = 0.4f, .compression_ratio = 0.1f});
  BOOST_TEST(p.plan(1).local_iterations == 6u);
  BOOST_TEST((p.plan(1).stage == as::stage_id::ahl));
  BOOST_TEST(p.plan(1).compression_ratio == 0.1f);
  BOOST_TEST((p.plan(0).stage == as::stage_id::asp));
  BOOST_TEST(p.on_commit({.worker = 1, .sequence = 1}, out).weight == 0.4);
  BOOST_TEST(p.on_commit({.worker = 0, .sequence = 1}, out).weight == 1.0);
  // A plan without a stage gets the policy's.
  p.set_plan(0, 1.0, {.local_iterations = 3});
  BOOST_TEST((p.plan(0).stage == as::stage_id::asp));
}

BOOST_AUTO_TEST_CASE(save_load_round_trip_makes_the_same_decisions) {
  for (std::uint32_t seed = 1; seed <= 6; ++seed) {
    as::asp p{{.workers = 3 + seed % 4,
               .scale = 0.5,
               .weights = {0.2, 0.3},
               .plans = {{.local_iterations = 4, .data_share = 0.2f}},
               .staleness_weight = seed % 2 ? as::staleness_weighting::inverse() : as::staleness_weighting::power(0.5),
               .stage = as::stage_id::ahl}};
    policy_testing::check_round_trip(p, 3 + seed % 4, seed);
  }
  as::asp p{{.workers = 3}};
  as::outcome_sink out(3);
  (void)p.on_commit({.worker = 0, .sequence = 1}, out);
  policy_testing::check_load_rejects_truncation(p);
}

BOOST_AUTO_TEST_CASE(load_refuses_another_policy_and_bad_values) {
  as::asp p{{.workers = 2}};
  std::vector<std::byte> bytes;
  ashl::state_writer w(bytes);
  w.tag("SSP_", 1);
  ashl::state_reader r(bytes);
  BOOST_TEST(!p.load(r).ok());
  // A bad staleness-weighting mode is refused with its field named.
  as::asp q{{.workers = 1}};
  auto good = policy_testing::saved(q);
  // Layout: ASP_ tag(8) ASYN tag(8) stage(4) scale(8) weights(8) plans(8) mode(1)...
  good[8 + 8 + 4 + 8 + 8 + 8] = std::byte{7};
  ashl::state_reader r2(good);
  const auto st = p.load(r2);
  BOOST_TEST(!st.ok());
  BOOST_TEST(st.message().find("staleness_weight.mode") != std::string::npos);
  BOOST_TEST(p.is_live(1));  // unchanged
}

BOOST_AUTO_TEST_CASE(steady_state_events_allocate_nothing) {
  for (std::uint32_t seed = 1; seed <= 3; ++seed) {
    as::asp p{{.workers = 16, .staleness_weight = as::staleness_weighting::power(0.5)}};
    BOOST_TEST(policy_testing::steady_state_allocations(p, 16, seed, counting_new::count) == 0u);
  }
}

// Plans keep their codec options through save/load (section ASYN version 2),
// and a version-1 section (plans of 24 bytes, before the options) still loads.
BOOST_AUTO_TEST_CASE(plans_with_codec_options_survive_save_and_load) {
  as::asp p{{.workers = 2, .plans = {{.local_iterations = 4, .compression_ratio = 0.25f, .codec_bits = 2, .codec_block = 32}}}};
  const auto bytes = policy_testing::saved(p);
  as::asp q{{.workers = 2}};
  ashl::state_reader r(bytes);
  BOOST_TEST_REQUIRE(q.load(r).ok());
  BOOST_TEST(q.plan(0).codec_bits == 2u);
  BOOST_TEST(q.plan(0).codec_block == 32u);
  BOOST_TEST((q.plan(0) == p.plan(0)));

  // The same state as a version-1 build wrote it: ASYN version 1 and the
  // plan's 8 option bytes absent. Layout: ASP_ tag(8) ASYN tag(8) stage(4)
  // scale(8) weights(8) plans(8) plan(32 in version 2).
  as::asp old{{.workers = 2, .plans = {{.local_iterations = 4, .compression_ratio = 0.25f}}}};
  auto v1 = policy_testing::saved(old);
  const std::uint32_t one = 1;
  std::memcpy(v1.data() + 12, &one, 4);
  const std::size_t plan_at = 8 + 8 + 4 + 8 + 8 + 8;
  v1.erase(v1.begin() + static_cast<std::ptrdiff_t>(plan_at + 24), v1.begin() + static_cast<std::ptrdiff_t>(plan_at + 32));
  as::asp r1{{.workers = 2}};
  ashl::state_reader rr(v1);
  const auto st = r1.load(rr);
  BOOST_TEST_REQUIRE(st.ok(), st.to_string());
  BOOST_TEST((r1.plan(0) == old.plan(0)));
  BOOST_TEST(!r1.plan(0).has_codec_options());
}

// Async DiLoCo's 1/M follows the live workers (docs/elastic.md §2.4); the
// flag survives save/load (ASP_ version 2), a plain asp keeps version 1's bytes.
BOOST_AUTO_TEST_CASE(scale_over_live_follows_joins_and_evictions) {
  as::asp p{{.workers = 4, .scale = 0.25, .scale_over_live = true}};
  as::outcome_sink out(5);
  BOOST_TEST(p.on_commit({.worker = 0, .sequence = 1}, out).weight == 0.25);
  p.on_evict({.worker = 1}, out);
  BOOST_TEST(p.on_commit({.worker = 0, .sequence = 2}, out).weight == 1.0 / 3);
  p.on_join({.worker = 1}, out);
  p.on_join({.worker = 4}, out);
  BOOST_TEST(p.scale() == 0.2);
  auto bytes = policy_testing::saved(p);
  ashl::state_reader in(bytes);
  as::asp q;
  BOOST_TEST(q.load(in).ok());
  q.on_evict({.worker = 4}, out);
  BOOST_TEST(q.scale() == 0.25);
  // Without the flag the scale stays and the section is version 1.
  as::asp fixed{{.workers = 4, .scale = 0.25}};
  fixed.on_evict({.worker = 1}, out);
  BOOST_TEST(fixed.scale() == 0.25);
  auto old = policy_testing::saved(fixed);
  BOOST_TEST(static_cast<unsigned>(old[4]) == 1u);  // "ASP_" then the version's first byte
  // A version 1 state loads into a policy built with the flag and keeps it
  // (an async DiLoCo checkpoint from before the flag).
  as::asp over_live{{.workers = 1, .scale_over_live = true}};
  ashl::state_reader in1(old);
  BOOST_TEST(over_live.load(in1).ok());
  BOOST_TEST(over_live.scale() == 0.25);  // the saved scale, until membership changes
  over_live.on_evict({.worker = 2}, out);
  BOOST_TEST(over_live.scale() == 0.5);  // 2 live of the loaded 4 (1 was evicted before the save)
}
