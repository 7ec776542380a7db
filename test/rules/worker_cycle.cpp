#include <ashl/rules/worker_cycle.hpp>

#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace ps = ashl::ps;
using ashl::measurement;
using ashl::measurement_kind;
using ashl::worker_plan;

namespace {
// A plan arrives, then the cycle starts with it.
void start_with(ps::worker_cycle& c, const worker_plan& p, std::uint32_t own_batch, double now) {
  c.plan_arrived(p);
  c.start(own_batch, now);
}
}  // namespace

BOOST_AUTO_TEST_CASE(h_iterations_then_commit_and_pull_with_measurements) {
  ps::worker_cycle c(3);
  start_with(c, worker_plan{.local_iterations = 4, .batch_size = 0}, 32, 10.0);
  BOOST_TEST(c.batch() == 32u);  // the plan keeps the worker's own
  BOOST_TEST(!c.compresses());
  BOOST_TEST(!c.iteration_done(10.5));
  BOOST_TEST(!c.iteration_done(11.0));
  BOOST_TEST(!c.iteration_done(11.5));
  BOOST_TEST(c.iteration_done(12.0));
  BOOST_TEST(c.iterations() == 4u);
  BOOST_TEST(c.samples() == 128u);
  BOOST_TEST(c.commit_samples() == 128u);
  BOOST_TEST(c.commit_sent(12.0) == 1u);
  BOOST_TEST(c.clock() == 1u);  // the clock the commit carries (core/plan.hpp commit_clock)
  c.commit_arrived(12.25, 4096);
  c.reply_started(13.0);  // the pull was held 0.75 s
  c.reply_arrived(13.5, 8192);
  const std::vector<measurement> expect{
      {3, measurement_kind::compute, 0.5, 32, 12.0},
      {3, measurement_kind::push, 0.25, 4096, 12.25},
      {3, measurement_kind::pull, 0.5, 8192, 13.5},
      {3, measurement_kind::commit, 0.75, 0, 13.5},
  };
  const auto got = c.measurements();
  BOOST_TEST((std::vector<measurement>(got.begin(), got.end()) == expect));
  c.clear_measurements();
  BOOST_TEST(c.measurements().empty());
  BOOST_TEST((c.state() == ps::worker_cycle::phase::idle));
}

BOOST_AUTO_TEST_CASE(interval_driven_cycle_runs_until_the_interval_is_filled) {
  ps::worker_cycle c(0);
  const worker_plan p{.local_iterations = 0, .commit_interval_us = 1'000'000, .batch_size = 16};
  start_with(c, p, 64, 0.0);
  BOOST_TEST(c.batch() == 16u);  // the plan's batch wins
  BOOST_TEST(!c.iteration_done(0.3));
  BOOST_TEST(!c.iteration_done(0.6));
  BOOST_TEST(!c.iteration_done(0.9));
  BOOST_TEST(c.iteration_done(1.2));
  BOOST_TEST(c.iterations() == 4u);
  BOOST_REQUIRE(c.measurements().size() == 1u);
  BOOST_TEST(c.measurements()[0].seconds == 1.2 / 4);
  BOOST_TEST(c.measurements()[0].amount == 16.0);
  // One iteration longer than the interval is still one iteration.
  ps::worker_cycle d(1);
  c.commit_sent(1.2);
  start_with(d, p, 8, 5.0);
  BOOST_TEST(d.iteration_done(7.0));
  BOOST_TEST(d.iterations() == 1u);
}

BOOST_AUTO_TEST_CASE(compression_when_the_ratio_is_below_one) {
  ps::worker_cycle c(2);
  start_with(c, worker_plan{.local_iterations = 1, .compression_ratio = 0.1f}, 8, 0.0);
  BOOST_TEST(c.compresses());
  BOOST_TEST(c.iteration_done(1.0));
  BOOST_TEST((c.state() == ps::worker_cycle::phase::compressing));
  c.compressed(1.25, 400);
  BOOST_REQUIRE(c.measurements().size() == 2u);
  BOOST_TEST((c.measurements()[1] == measurement{2, measurement_kind::compress, 0.25, 400, 1.25}));
  BOOST_TEST(c.commit_sent(1.25) == 1u);
  c.commit_arrived(1.5, 472);
  c.reply_arrived(2.0, 4000);  // no reply_started: timed from the arrival
  BOOST_REQUIRE(c.measurements().size() == 5u);
  BOOST_TEST(c.measurements()[3].seconds == 0.5);
  BOOST_TEST(c.measurements()[4].seconds == 0.75);
  ps::worker_cycle full(2);
  start_with(full, worker_plan{.local_iterations = 1, .compression_ratio = 1.0f}, 8, 0.0);
  BOOST_TEST(!full.compresses());
}

BOOST_AUTO_TEST_CASE(sequences_count_commits_and_restart_with_a_new_incarnation) {
  ps::worker_cycle c(0);
  for (std::uint64_t k = 1; k <= 5; ++k) {
    start_with(c, worker_plan{}, 4, static_cast<double>(k));
    BOOST_TEST(c.iteration_done(k + 0.5));
    BOOST_TEST(c.commit_sent(k + 0.5) == k);
    c.commit_arrived(k + 0.6, 10);
    c.reply_arrived(k + 0.7, 10);
  }
  BOOST_TEST(c.sequence() == 5u);
  c.restart();
  c.pull_sent(10.0);  // the first pull after joining: no commit measurement
  c.clear_measurements();
  c.reply_arrived(10.5, 100);
  BOOST_REQUIRE(c.measurements().size() == 1u);
  BOOST_TEST((c.measurements()[0].kind == measurement_kind::pull));
  start_with(c, worker_plan{}, 4, 11.0);
  BOOST_TEST(c.iteration_done(11.5));
  BOOST_TEST(c.commit_sent(11.5) == 1u);
}

BOOST_AUTO_TEST_CASE(zero_durations_are_not_reported) {
  ps::worker_cycle c(0);
  start_with(c, worker_plan{}, 4, 1.0);
  BOOST_TEST(c.iteration_done(1.0));
  c.commit_sent(1.0);
  c.commit_arrived(1.0, 10);
  c.reply_arrived(1.0, 10);
  BOOST_TEST(c.measurements().empty());
}

BOOST_AUTO_TEST_CASE(plans_arrive_as_events_and_are_adopted_at_the_next_start_only) {
  using ashl::codec_id;
  ps::worker_cycle c(1);
  BOOST_TEST(!c.has_plan());
  c.plan_arrived(worker_plan{.local_iterations = 2, .batch_size = 8});
  BOOST_TEST(c.has_plan());
  BOOST_TEST(c.start(4, 0.0));  // the first plan is a change
  BOOST_TEST(c.plan().local_iterations == 2u);
  // Two plans arrive during the cycle: neither is used before the cycle ends,
  // and the newer one replaces the older.
  c.plan_arrived(worker_plan{.local_iterations = 5, .batch_size = 8});
  BOOST_TEST(!c.iteration_done(0.1));
  c.plan_arrived(worker_plan{.local_iterations = 3, .batch_size = 8, .compression_ratio = 0.25f}, codec_id::topk);
  BOOST_TEST(c.plan().local_iterations == 2u);
  BOOST_TEST(c.iteration_done(0.2));  // H = 2, the plan in force
  BOOST_TEST((c.codec() == codec_id::identity));
  c.commit_sent(0.3);
  c.commit_arrived(0.4, 10);
  c.reply_arrived(0.5, 10);
  BOOST_TEST(c.start(4, 0.5));  // adopted now
  BOOST_TEST(c.plan().local_iterations == 3u);
  BOOST_TEST((c.codec() == codec_id::topk));
  BOOST_TEST(c.compresses());
  BOOST_TEST(c.plans_adopted() == 2u);
  BOOST_TEST(c.plan_changes() == 2u);
  c.abandon();
  // The same plan again is adopted but is no change; no arrival keeps the plan.
  c.plan_arrived(worker_plan{.local_iterations = 3, .batch_size = 8, .compression_ratio = 0.25f}, codec_id::topk);
  BOOST_TEST(!c.start(4, 1.0));
  c.abandon();
  BOOST_TEST(!c.start(4, 2.0));
  BOOST_TEST(c.plans_adopted() == 3u);
  BOOST_TEST(c.plan_changes() == 2u);
  // A new incarnation has no plan until its join's plan arrives.
  c.restart();
  BOOST_TEST(!c.has_plan());
  c.plan_arrived(worker_plan{.local_iterations = 1});
  BOOST_TEST(c.start(4, 3.0));
  BOOST_TEST(c.plan().local_iterations == 1u);
}

BOOST_AUTO_TEST_CASE(a_commit_carries_saturated_samples_and_its_clock) {
  // 2^20 iterations of a 2^13 batch: 2^33 samples, past the wire's 32 bits.
  ps::worker_cycle c(0);
  start_with(c, worker_plan{.local_iterations = 1u << 20, .batch_size = 1u << 13}, 1, 0.0);
  for (std::uint32_t i = 1; i < (1u << 20); ++i) BOOST_REQUIRE(!c.iteration_done(double(i)));
  BOOST_REQUIRE(c.iteration_done(double(1u << 20)));
  BOOST_TEST(c.samples() == std::uint64_t{1} << 33);
  BOOST_TEST(c.commit_samples() == 0xffffffffu);  // saturated, for the server's bound to refuse
  for (std::uint64_t k = 1; k <= 3; ++k) {
    if (k > 1) {
      c.start(1, 0.0);
      while (!c.iteration_done(1.0)) {
      }
    }
    BOOST_TEST(c.commit_sent(1.0) == k);
    BOOST_TEST(c.clock() == k);
    c.commit_arrived(1.5, 8);
    c.reply_arrived(2.0, 8);
  }
  c.restart();  // a new incarnation: sequence and clock start again
  BOOST_TEST(c.clock() == 0u);
}

// A follower's cycle (ps::worker_params::follower, the torch adapter's
// buckets after the first): the leader's plan replaces its own before the
// first iteration, and it ends when the leader says, whatever its own plan
// would have said.
BOOST_AUTO_TEST_CASE(a_follower_runs_its_leaders_plan_and_ends_with_its_leader) {
  ps::worker_cycle c(2);
  start_with(c, worker_plan{.local_iterations = 1}, 32, 1.0);
  const worker_plan lead{.local_iterations = 0, .commit_interval_us = 1'000'000'000, .batch_size = 16,
                         .compression_ratio = 0.5f};
  BOOST_TEST(c.follow(lead, ashl::codec_id::topk, 32));
  BOOST_TEST((c.plan() == lead));
  BOOST_TEST((c.codec() == ashl::codec_id::topk));
  BOOST_TEST(c.batch() == 16u);
  BOOST_TEST(c.compresses());
  BOOST_TEST(c.plan_changes() == 2u);
  BOOST_TEST(!c.iteration_done(1.5, false));  // H = 1 of its own plan would have ended here
  BOOST_TEST(!c.iteration_done(2.0, false));
  BOOST_TEST(c.iteration_done(2.5, true));    // the leader's interval is not over by its clock: the leader's word
  BOOST_TEST(c.iterations() == 3u);
  BOOST_TEST(c.samples() == 48u);
  BOOST_TEST((c.state() == ps::worker_cycle::phase::compressing));
  BOOST_TEST(c.measurements().size() == 1u);
  BOOST_TEST(c.measurements()[0].seconds == 0.5);  // (2.5 - 1.0) / 3 per iteration
  c.compressed(2.6, 100);
  c.commit_sent(2.6);
  c.commit_arrived(2.7, 100);
  c.reply_arrived(2.8, 100);
  c.start(32, 2.8);
  BOOST_TEST(!c.follow(lead, ashl::codec_id::topk, 32));  // the same plan: no change
  BOOST_TEST(c.plan_changes() == 2u);
}

// docs/elastic.md §3.6: a data ledger's lease may end in a short batch, so a
// commit's samples are the samples its iterations trained
// (iteration_done(now, samples)), not iterations × batch; the one-argument
// overload keeps counting the batch, and the two mix within a cycle. The
// count starts again with each cycle; a follower counts the same way.
BOOST_AUTO_TEST_CASE(a_commit_carries_the_samples_its_iterations_trained) {
  ps::worker_cycle c(1);
  start_with(c, worker_plan{.local_iterations = 3}, 32, 0.0);
  BOOST_TEST(!c.iteration_done(0.1, std::uint64_t{32}));
  BOOST_TEST(!c.iteration_done(0.2));  // the batch: 32
  BOOST_TEST(c.iteration_done(0.3, 5u));  // the lease's last, short batch
  BOOST_TEST(c.iterations() == 3u);
  BOOST_TEST(c.samples() == 69u);  // not 3 × 32
  BOOST_TEST(c.commit_samples() == 69u);
  c.commit_sent(0.3);
  c.commit_arrived(0.4, 10);
  c.reply_arrived(0.5, 10);
  c.start(32, 0.5);
  BOOST_TEST(c.samples() == 0u);
  BOOST_TEST(!c.iteration_done(0.6, 0));  // an iteration on no sample (an empty batch) counts none
  BOOST_TEST(!c.iteration_done(0.7, 7));
  BOOST_TEST(c.iteration_done(0.8));
  BOOST_TEST(c.samples() == 39u);
  c.commit_sent(0.8);
  c.commit_arrived(0.9, 10);
  c.reply_arrived(1.0, 10);
  // A follower: the leader's word ends the cycle, its samples are its own count.
  c.start(32, 1.0);
  BOOST_TEST(!c.iteration_done(1.1, false, 20));
  BOOST_TEST(c.iteration_done(1.2, true, 3));
  BOOST_TEST(c.samples() == 23u);
  BOOST_TEST(c.iterations() == 2u);
}

// ------------------------------------------------ sending measurements

namespace {
// One cycle of 1 ms compute, 1 ms each way, ending at `t0` + 3 ms: four
// records (compute, push, pull, commit).
double one_cycle(ps::worker_cycle& c, double t0) {
  c.start(8, t0);
  BOOST_REQUIRE(c.iteration_done(t0 + 0.001));
  c.commit_sent(t0 + 0.001);
  c.commit_arrived(t0 + 0.002, 100);
  c.reply_arrived(t0 + 0.003, 100);
  return t0 + 0.003;
}
}  // namespace

// Interval 0 (a message at every cycle's end): each cycle's records go out in
// one message at its end, none before.
BOOST_AUTO_TEST_CASE(with_interval_zero_each_cycle_sends_its_records_at_its_end) {
  ps::worker_cycle c(1, ps::report_rule{.interval = 0.0, .batch = 64});
  c.plan_arrived(worker_plan{.local_iterations = 1});
  std::vector<std::vector<measurement>> sent;
  const auto send = [&](std::span<const measurement> ms) { sent.emplace_back(ms.begin(), ms.end()); };
  double t = 0.0;
  for (int i = 0; i < 3; ++i) {
    t = one_cycle(c, t);
    BOOST_TEST(sent.size() == static_cast<std::size_t>(i));  // nothing sent inside the cycle
    c.report(c.measurements(), t, send);
    c.clear_measurements();
    BOOST_REQUIRE(sent.size() == static_cast<std::size_t>(i) + 1);
    BOOST_TEST(sent.back().size() == 4u);
    BOOST_TEST((sent.back()[0].kind == measurement_kind::compute));
    BOOST_TEST((sent.back()[3].kind == measurement_kind::commit));
    BOOST_TEST(c.unsent().empty());
  }
  BOOST_TEST(c.report_messages() == 3u);
}

// Interval 10 ms, 3 ms cycles: the first cycle's end sends (nothing went
// before); the next cycles add to the outbox until 10 ms have passed since
// that message; leaving sends the rest.
BOOST_AUTO_TEST_CASE(cycles_shorter_than_the_interval_share_a_message) {
  ps::worker_cycle c(2, ps::report_rule{.interval = 0.010, .batch = 64});
  c.plan_arrived(worker_plan{.local_iterations = 1});
  std::vector<std::pair<double, std::size_t>> sent;  // (when, records)
  double t = 0.0;
  const auto send = [&](std::span<const measurement> ms) { sent.emplace_back(t, ms.size()); };
  for (int i = 0; i < 5; ++i) {
    t = one_cycle(c, t);
    c.report(c.measurements(), t, send);
    c.clear_measurements();
  }
  // Ends at 3, 6, 9, 12, 15 ms: sent at 3 ms (4 records), then at 15 ms,
  // the first end 10 ms or more after 3 ms, with the 16 of four cycles.
  BOOST_REQUIRE(sent.size() == 2u);
  BOOST_TEST(sent[0].first == 0.003, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(sent[0].second == 4u);
  BOOST_TEST(sent[1].first == 0.015, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(sent[1].second == 16u);
  t = one_cycle(c, t);
  c.report(c.measurements(), t, send);
  c.clear_measurements();
  BOOST_TEST(sent.size() == 2u);  // 18 ms: 3 ms after the last message
  BOOST_TEST(c.unsent().size() == 4u);
  BOOST_TEST(!c.reports_due(t));
  BOOST_TEST(c.reports_due(0.026));  // the interval has passed
  c.flush_reports(t, send);           // before leaving: whatever waits
  BOOST_REQUIRE(sent.size() == 3u);
  BOOST_TEST(sent[2].second == 4u);
  BOOST_TEST(c.unsent().empty());
  c.flush_reports(t, send);  // nothing waits: no message
  BOOST_TEST(sent.size() == 3u);
}

// A batch of 8: the outbox goes when fewer than 8 records are free (here at
// once), and a report larger than the room left sends a full outbox first.
BOOST_AUTO_TEST_CASE(a_nearly_full_batch_goes_before_the_interval) {
  ps::worker_cycle c(0, ps::report_rule{.interval = 1e9, .batch = 12});
  std::vector<std::size_t> sent;
  const auto send = [&](std::span<const measurement> ms) { sent.push_back(ms.size()); };
  std::vector<measurement> four(4, measurement{0, measurement_kind::compute, 0.1, 1, 0.0});
  c.report(four, 0.0, send);  // the first message: none went before
  BOOST_TEST((sent == std::vector<std::size_t>{4}));
  c.report(four, 0.1, send);  // 4 of 12: 8 free, not due
  BOOST_TEST(sent.size() == 1u);
  c.report(four, 0.2, send);  // 8 of 12: 4 free, fewer than 8: due
  BOOST_TEST((sent == std::vector<std::size_t>{4, 8}));
  std::vector<measurement> many(30, measurement{0, measurement_kind::push, 0.1, 1, 0.0});
  c.report(many, 0.3, send);  // 12 + 12 sent as they fill, the last 6 leave 6 free: due
  BOOST_TEST((sent == std::vector<std::size_t>{4, 8, 12, 12, 6}));
  BOOST_TEST(c.report_messages() == 5u);
}

// A new incarnation (or a death) drops what waits, and its first cycle's
// end sends at once.
BOOST_AUTO_TEST_CASE(a_restart_drops_unsent_records) {
  ps::worker_cycle c(0, ps::report_rule{.interval = 1.0, .batch = 64});
  c.plan_arrived(worker_plan{.local_iterations = 1});
  std::size_t messages = 0;
  const auto send = [&](std::span<const measurement>) { ++messages; };
  double t = one_cycle(c, 0.0);
  c.report(c.measurements(), t, send);
  c.clear_measurements();
  t = one_cycle(c, t);
  c.report(c.measurements(), t, send);
  c.clear_measurements();
  BOOST_TEST(messages == 1u);
  BOOST_TEST(c.unsent().size() == 4u);
  c.restart();
  BOOST_TEST(c.unsent().empty());
  c.plan_arrived(worker_plan{.local_iterations = 1});
  t = one_cycle(c, t);
  c.report(c.measurements(), t, send);
  BOOST_TEST(messages == 2u);
}

// A push (ps::worker::push): the servers acknowledge the commit without
// parameters; the cycle measures commit = push + the wait for the
// acknowledgement, and no pull.
BOOST_AUTO_TEST_CASE(an_acknowledged_push_measures_the_commit_and_no_pull) {
  ps::worker_cycle c(4);
  c.plan_arrived(worker_plan{.local_iterations = 1});
  c.start(8, 0.0);
  BOOST_REQUIRE(c.iteration_done(1.0));
  c.commit_sent(1.0);
  c.commit_arrived(1.25, 4096);
  c.ack_arrived(2.0);  // held 0.75 s (a BSP barrier)
  const std::vector<measurement> expect{
      {4, measurement_kind::compute, 1.0, 8, 1.0},
      {4, measurement_kind::push, 0.25, 4096, 1.25},
      {4, measurement_kind::commit, 1.0, 0, 2.0},
  };
  const auto got = c.measurements();
  BOOST_TEST((std::vector<measurement>(got.begin(), got.end()) == expect));
  BOOST_TEST((c.state() == ps::worker_cycle::phase::idle));
}
