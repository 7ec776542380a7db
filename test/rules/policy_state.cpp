#include <ashl/rules/policies.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>

#include "../support/ps_policy_cases.hpp"
#include "../support/saved_state.hpp"

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace as = ashl::sync;
namespace ps = ashl::ps;

namespace {
constexpr std::size_t workers = 4;
constexpr std::size_t ids = workers + 2;

using test_support::saved;
as::any_policy make(const ps_cases::policy_case& c, const ps::policy_params& p) {
  auto r = ps::make_policy(c.name, p);
  BOOST_REQUIRE_MESSAGE(r.has_value(), c.label + ": " + (r ? std::string() : r.error().message()));
  return std::move(*r);
}
// The same policy kind (same ASHL planner and re-planner) built with other
// numbers, so that a loaded copy can only act alike if the state carries
// the parameters.
ps::policy_params other_numbers(const ps_cases::policy_case& c) {
  ps::policy_params p = c.params;
  p.workers = 1;
  p.staleness = 7;
  p.local_steps = 5;
  p.sync_every_iterations = 9;
  p.period = 3.0;
  p.profile_iterations = 40;
  p.h_ahl = 3;
  p.total_batch = 500;
  p.stragglers = 0;  // coded_bsp: must be < workers
  p.min_workers = 3;
  return p;
}
void require_same(const as::any_policy& a, const as::any_policy& b, const std::string& label, int at) {
  BOOST_REQUIRE_MESSAGE((a.stage() == b.stage()), label << " event " << at);
  for (as::worker_id w = 0; w < ids; ++w) {
    BOOST_REQUIRE_MESSAGE((a.plan(w) == b.plan(w)), label << " plan of " << w << " at event " << at);
    BOOST_REQUIRE_MESSAGE(a.is_live(w) == b.is_live(w), label << " live " << w << " at event " << at);
    BOOST_REQUIRE_MESSAGE(a.is_held(w) == b.is_held(w), label << " held " << w << " at event " << at);
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_state_saved_mid_run_loads_into_a_fresh_policy_that_decides_alike) {
  for (const auto& c : ps_cases::every_policy(workers)) {
    for (int before : {40, 700}) {  // during ASHL's profiling, and after its switch
      as::any_policy a = make(c, c.params);
      ps_cases::script s(workers, 3);
      as::outcome_sink out_a(ids), out_b(ids);
      for (int i = 0; i < before; ++i) (void)policy_testing::apply(a, s.next(), out_a);
      const auto bytes = saved(a);
      as::any_policy b = make(c, other_numbers(c));
      ashl::state_reader in(bytes);
      const auto st = b.load(in);
      BOOST_REQUIRE_MESSAGE(st.ok(), c.label + ": " + st.message());
      BOOST_REQUIRE(in.at_end());
      BOOST_REQUIRE_MESSAGE((saved(b) == bytes), c.label);
      require_same(a, b, c.label, before);
      for (int i = 0; i < 1200; ++i) {
        const auto e = s.next();
        const auto fa = policy_testing::apply(a, e, out_a);
        const auto fb = policy_testing::apply(b, e, out_b);
        BOOST_REQUIRE_MESSAGE((fa == fb), c.label << " differs at event " << before + i);
        require_same(a, b, c.label, before + i);
      }
      BOOST_REQUIRE_MESSAGE((saved(a) == saved(b)), c.label);
      if (c.name == "ashl") {
        const auto sa = ps::ashl_summary_of(a), sb = ps::ashl_summary_of(b);
        BOOST_REQUIRE(sa && sb);
        BOOST_TEST(sa->replans == sb->replans, c.label);
        BOOST_TEST(sa->planner_status.message() == sb->planner_status.message(), c.label);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(truncated_or_foreign_state_is_refused_and_changes_nothing) {
  const auto cases = ps_cases::every_policy(workers);
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const auto& c = cases[k];
    as::any_policy a = make(c, c.params);
    ps_cases::script s(workers, 9);
    as::outcome_sink out(ids);
    for (int i = 0; i < 400; ++i) (void)policy_testing::apply(a, s.next(), out);
    const auto bytes = saved(a);
    as::any_policy target = make(c, other_numbers(c));
    const auto before = saved(target);
    // Truncated anywhere.
    for (std::size_t cut = 0; cut < bytes.size(); cut += 1 + bytes.size() / 97) {
      ashl::state_reader in(std::span<const std::byte>(bytes.data(), cut));
      BOOST_REQUIRE_MESSAGE(!target.load(in).ok(), c.label << " accepted " << cut << " of " << bytes.size());
      BOOST_REQUIRE_MESSAGE((saved(target) == before), c.label << " changed by a failed load");
    }
    // A damaged first tag.
    auto damaged = bytes;
    damaged[1] = std::byte{'?'};
    ashl::state_reader in(damaged);
    const auto st = target.load(in);
    BOOST_TEST(!st.ok(), c.label);
    BOOST_TEST(st.message().find("state.tag") == 0u, c.label + ": " + st.message());
    BOOST_REQUIRE((saved(target) == before));
    // Another policy's state: the next case of another kind (the DiLoCo
    // names run local_sgd, asp and ASHL's schedule, whose states they share).
    const auto kind_of = [](const std::string& label) -> std::string {
      if (label == "diloco") return "local_sgd";
      if (label == "async_diloco" || label == "async_local_sgd") return "asp";
      if (label == "ashl_diloco") return "ashl/profile+none";
      return label;
    };
    std::size_t j = (k + 1) % cases.size();
    while (kind_of(cases[j].label) == kind_of(c.label)) j = (j + 1) % cases.size();
    as::any_policy o = make(cases[j], cases[j].params);
    const auto foreign = saved(o);
    const auto& other = cases[j];
    ashl::state_reader fin(foreign);
    BOOST_TEST(!target.load(fin).ok(), c.label + " accepted " + other.label);
    BOOST_REQUIRE((saved(target) == before));
  }
}

// Pending joiners and min_workers are part of the saved state (ROND version
// 2): a round policy saved with a joiner pending mid-round loads into one
// built with other numbers and completes the round alike, releasing the
// joiner's pull at the boundary, not before.
BOOST_AUTO_TEST_CASE(a_pending_joiner_and_min_workers_are_saved_and_restored) {
  for (const char* name : {"bsp", "local_sgd", "diloco", "semi_async"}) {
    ps::policy_params p;
    p.workers = 3;
    p.min_workers = 2;
    p.sync_every_iterations = 1;
    as::any_policy a = *ps::make_policy(name, p);
    as::outcome_sink out_a(ids), out_b(ids);
    (void)a.on_commit({.worker = 0, .sequence = 1}, out_a);  // a round is in progress
    a.on_join({.worker = 3}, out_a);                        // pending
    BOOST_TEST((a.on_pull({.worker = 3}, out_a) == as::pull_action::hold), name);
    const auto bytes = saved(a);
    ps::policy_params q = p;
    q.workers = 1;
    q.min_workers = 1;
    q.sync_every_iterations = 9;
    as::any_policy b = *ps::make_policy(name, q);
    ashl::state_reader in(bytes);
    const auto st = b.load(in);
    BOOST_REQUIRE_MESSAGE(st.ok(), std::string(name) + ": " + st.message());
    BOOST_REQUIRE((saved(b) == bytes));
    require_same(a, b, name, 0);
    BOOST_TEST(b.is_held(3), name);
    out_a.clear();
    // The round completes without the joiner, and releases it.
    for (as::any_policy* x : {&a, &b}) {
      auto& out = x == &a ? out_a : out_b;
      (void)x->on_commit({.worker = 1, .sequence = 1}, out);
      BOOST_TEST(out.round().empty(), name);  // worker 2 missing
      (void)x->on_commit({.worker = 2, .sequence = 1}, out);
      BOOST_TEST(out.round().size() == 3u, name);
      BOOST_TEST((std::vector<as::worker_id>(out.released().begin(), out.released().end()) ==
                  std::vector<as::worker_id>{3}),
                 name);
      out.clear();
      // min_workers 2 came back too: evicting down to one worker holds its round.
      x->on_evict({.worker = 1}, out);
      x->on_evict({.worker = 2}, out);
      x->on_evict({.worker = 3}, out);
      (void)x->on_commit({.worker = 0, .sequence = 2}, out);
      BOOST_TEST(out.round().empty(), name);
      out.clear();
    }
    BOOST_REQUIRE((saved(a) == saved(b)));
  }
}
