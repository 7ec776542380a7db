#include <ashl/rules/bucket_cycle.hpp>

#include "../support/counting_new.hpp"

#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

using ashl::adapt::bucket_cycle;
using action = bucket_cycle::action;
using count_action = bucket_cycle::count_action;

namespace {

// What a driver does for bucket b, as adapt/torch.hpp and ashl/torch.py do:
// take it, then every action the rule asks for, the leader's and this
// follower's iteration_done() answered by `leader` and `follower`; say(w)
// is told each ("add", "count", "lead", "follow", "commit", "held").
template <class Say>
void drive(bucket_cycle& c, std::size_t b, bool finite, bool leader, bool follower, Say say) {
  c.take(b, finite);
  for (;;) switch (c.next()) {
      case action::none:
        return;
      case action::add:
        say("add");
        break;
      case action::count:
        say("count");
        for (bool decided = false; !decided;) switch (c.count_next()) {
            case count_action::lead:
              say("lead");
              c.led(leader);
              break;
            case count_action::follow:
              say(c.lead_known() ? "follow" : "follow-before-lead");
              c.followed(follower);
              break;
            case count_action::decided:
              decided = true;
              break;
          }
        break;
      case action::commit:
        say("commit");
        break;
      case action::commit_held:
        say("held");
        break;
    }
}

// drive(), returning what the rule asked, in order ("add count lead follow commit").
std::string run(bucket_cycle& c, std::size_t b, bool finite, bool leader = false, bool follower = false) {
  std::string log;
  drive(c, b, finite, leader, follower, [&](const char* w) {
    if (!log.empty()) log += ' ';
    log += w;
  });
  return log;
}

// The counts, checked in one line.
void totals_are(const bucket_cycle& c, std::uint64_t iterations, std::uint64_t commits, std::uint64_t skipped) {
  BOOST_TEST(c.totals().iterations == iterations);
  BOOST_TEST(c.totals().commits == commits);
  BOOST_TEST(c.totals().skipped == skipped);
}

// A bucket_cycle of `n` buckets of `slots` slots each.
bucket_cycle make(std::size_t n, std::size_t slots = 2) {
  const std::vector<std::size_t> s(n, slots);
  return bucket_cycle(s);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_bucket_is_full_when_every_slot_is_ready_once_per_backward) {
  const std::vector<std::size_t> slots{3, 1};
  bucket_cycle c(slots);
  BOOST_TEST(c.buckets() == 2u);
  BOOST_TEST(c.slots(0) == 3u);
  BOOST_TEST(!c.slot_ready(0, 0));
  BOOST_TEST(!c.slot_ready(0, 0));  // a tied parameter's second use counts once
  BOOST_TEST(!c.slot_ready(0, 2));
  BOOST_TEST(c.slot_ready(0, 1));   // the last slot fills it
  BOOST_TEST(!c.slot_ready(0, 1));  // cleared: the next backward starts over
  BOOST_TEST(c.slot_ready(1, 0));   // one slot: full at once
  BOOST_TEST(c.slot_ready(1, 0));
  c.end_iteration();  // a half-full bucket is cleared with the iteration
  BOOST_TEST(!c.slot_ready(0, 0));
  BOOST_TEST(!c.slot_ready(0, 2));
  BOOST_TEST(c.slot_ready(0, 1));
}

BOOST_AUTO_TEST_CASE(the_leader_decides_once_per_iteration_and_followers_count_with_it) {
  auto c = make(3);
  BOOST_TEST(c.begin_step());
  BOOST_TEST(!c.taken(0));
  // Bucket 0 first: it asks itself; not done.
  BOOST_TEST(run(c, 0, true, false) == "add count lead");
  BOOST_TEST(c.taken(0));
  BOOST_TEST(c.lead_known());
  BOOST_TEST(!c.lead_done());
  BOOST_TEST(!c.decision());
  // A follower does not ask the leader again; it counts with its decision.
  BOOST_TEST(run(c, 2, true, true, false) == "add count follow");
  BOOST_TEST(run(c, 1, true, true, false) == "add count follow");
  BOOST_TEST(!c.any_committed());
  c.end_step();
  c.end_iteration();
  totals_are(c, 1, 0, 0);
  BOOST_TEST(!c.lead_known());  // the next iteration asks again
  BOOST_TEST(!c.taken(0));
}

BOOST_AUTO_TEST_CASE(a_follower_first_asks_the_leader_for_all_and_every_bucket_commits) {
  auto c = make(3);
  BOOST_TEST(c.begin_step());
  // A follower fills first (bucket 0 holds a parameter whose gradient
  // comes late in backward): it asks the leader, for every bucket.
  BOOST_TEST(run(c, 2, true, true, true) == "add count lead follow commit");
  BOOST_TEST(c.committed(2));
  BOOST_TEST(!c.committed(0));
  BOOST_TEST(c.decision());
  // The leader's own bucket: decided by what it said, no second ask.
  BOOST_TEST(run(c, 0, true, /*leader=*/false) == "add count commit");
  // A follower whose worker says done commits; one that says not done
  // (a plan that differs) does not, and the rule does not override it.
  BOOST_TEST(run(c, 1, true, false, false) == "add count follow");
  BOOST_TEST(c.any_committed());
  BOOST_TEST(!c.committed(1));
  c.end_step();
  c.end_iteration();
  BOOST_TEST(c.totals().commits == 1u);
  BOOST_TEST(!c.any_committed());
}

BOOST_AUTO_TEST_CASE(a_skipped_step_before_the_leader_counted_is_skipped_whole) {
  auto c = make(2);
  BOOST_TEST(run(c, 0, false, true) == "");  // nothing added, nobody counts
  BOOST_TEST(c.skipping());
  BOOST_TEST(c.taken(0));
  BOOST_TEST(run(c, 1, true, true, true) == "");  // finite, but the step is skipped: not added either
  BOOST_TEST(!c.lead_known());
  BOOST_TEST(!c.begin_step());  // no local step, no commit, no iteration
  c.end_iteration();
  totals_are(c, 0, 0, 1);
  BOOST_TEST(!c.skipping());
  // The next iteration is an ordinary one.
  BOOST_TEST(c.begin_step());
  BOOST_TEST(run(c, 0, true, true) == "add count lead commit");
}

BOOST_AUTO_TEST_CASE(a_skipped_bucket_after_the_leader_counted_commits_what_its_cycle_holds) {
  auto c = make(3);
  BOOST_TEST(run(c, 0, true, true) == "add count lead commit");
  // The last bucket holds inf: not added, but counted, so every worker
  // stays in the one cycle; its cycle is done: it commits what it holds.
  BOOST_TEST(run(c, 2, false, false, true) == "count follow held");
  BOOST_TEST(c.skipping());
  // A finite bucket after it is skipped too (the iteration is).
  BOOST_TEST(run(c, 1, true, false, true) == "count follow held");
  BOOST_TEST(c.committed(1));
  BOOST_TEST(c.committed(2));
  // Something was committed: the step runs (the workers counted it), and
  // it counts as skipped and as a commit.
  BOOST_TEST(c.begin_step());
  c.end_step();
  c.end_iteration();
  totals_are(c, 1, 1, 1);
}

BOOST_AUTO_TEST_CASE(a_skipped_bucket_whose_cycle_is_not_done_counts_and_waits) {
  auto c = make(2);
  BOOST_TEST(run(c, 0, true, false) == "add count lead");
  BOOST_TEST(run(c, 1, false, false, false) == "count follow");
  BOOST_TEST(!c.any_committed());
  BOOST_TEST(!c.begin_step());  // nothing committed: skipped whole
  c.end_iteration();
  totals_are(c, 0, 0, 1);
}

BOOST_AUTO_TEST_CASE(the_leader_bucket_skipped_after_a_follower_asked_uses_the_decision) {
  auto c = make(2);
  BOOST_TEST(run(c, 1, true, true, true) == "add count lead follow commit");
  // Bucket 0, the last to fill, is non-finite: the leader's decision was
  // taken, so it counts (with no second ask) and commits what it holds.
  BOOST_TEST(run(c, 0, false) == "count held");
}

BOOST_AUTO_TEST_CASE(skip_outside_take_skips_the_step_before_any_commit) {
  auto c = make(2);
  c.skip();  // a GradScaler found inf, or step()'s finite check
  BOOST_TEST(c.skipping());
  BOOST_TEST(!c.begin_step());
  c.end_iteration();
  BOOST_TEST(c.totals().skipped == 1u);
  // Delta: step() takes every bucket after the local step.
  BOOST_TEST(c.begin_step());
  BOOST_TEST(run(c, 0, true, true) == "add count lead commit");
  BOOST_TEST(run(c, 1, true, true, true) == "add count follow commit");
  c.end_step();
  c.end_iteration();
  totals_are(c, 1, 1, 1);
}

BOOST_AUTO_TEST_CASE(a_failed_count_is_cleared_by_the_next_take_and_the_iteration) {
  auto c = make(2);
  c.take(1, true);
  BOOST_TEST((c.next() == action::add));
  BOOST_TEST((c.next() == action::count));
  BOOST_TEST((c.count_next() == count_action::lead));
  // The driver's wait for bucket 0 failed: it never calls led(). The
  // iteration ends (Python: the next take; both: end_iteration()).
  c.end_iteration();
  BOOST_TEST(!c.taken(1));
  BOOST_TEST(!c.lead_known());
  BOOST_TEST((c.next() == action::none));
  BOOST_TEST(run(c, 1, true, true, true) == "add count lead follow commit");
}

BOOST_AUTO_TEST_CASE(counts_restore_from_a_checkpoint) {
  auto c = make(1);
  c.restore({.iterations = 7, .commits = 3, .skipped = 2});
  BOOST_TEST(c.begin_step());
  BOOST_TEST(run(c, 0, true, true) == "add count lead commit");
  c.end_step();
  c.end_iteration();
  totals_are(c, 8, 4, 2);
}

BOOST_AUTO_TEST_CASE(a_step_allocates_nothing) {
  const std::vector<std::size_t> slots{3, 2, 1, 4};
  bucket_cycle c(slots);
  const auto before = counting_new::count();
  std::size_t commits = 0, skipped_whole = 0;
  for (std::size_t it = 0; it < 1000; ++it) {
    const bool skipped_bucket = it % 7 == 3;
    for (std::size_t b = slots.size(); b-- > 0;) {
      bool full = false;
      for (std::size_t s = 0; s < slots[b]; ++s) full = c.slot_ready(b, s);
      if (!full || c.taken(b)) continue;
      const bool done = it % 3 == 2;
      drive(c, b, !(skipped_bucket && b == 1), done, done, [&](const char* w) {
        const std::string_view v = w;
        commits += v == "commit" || v == "held";
      });
    }
    if (c.begin_step())
      c.end_step();
    else
      ++skipped_whole;
    c.end_iteration();
  }
  BOOST_TEST(counting_new::count() == before);
  // The loop did run every path: commits, steps skipped whole (nothing
  // committed) and skipped steps that committed what was held.
  BOOST_TEST(commits > 0u);
  BOOST_TEST(skipped_whole > 0u);
  BOOST_TEST(c.totals().skipped > skipped_whole);
  BOOST_TEST(c.totals().iterations + skipped_whole == 1000u);
}
