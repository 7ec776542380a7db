#include <ashl/rules/policies.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/ps_policy_cases.hpp"

#include <cstddef>
#include <string>
#include <variant>

// Counts every allocation of this program (the rule of docs/design.md "Interfaces", server core: no allocation
// per event after warm-up).
#include "../support/counting_new.hpp"

namespace as = ashl::sync;
namespace ps = ashl::ps;

namespace {
constexpr std::size_t workers = 6;
constexpr std::size_t ids = workers + 2;

// What a driver does per event, without allocating: hand it to the policy,
// keep held workers from committing, read the plans it says changed, clear
// the reused sink.
struct driver {
  as::any_policy& p;
  as::outcome_sink& out;
  ps_cases::script& s;
  std::uint64_t checksum = 0;

  void operator()(const as::commit_event& c) { checksum += static_cast<std::uint64_t>(p.on_commit(c, out).action); }
  void operator()(const as::pull_event& q) {
    const auto a = p.on_pull(q, out);
    if (a == as::pull_action::hold) s.block(q.worker);
    checksum += static_cast<std::uint64_t>(a);
  }
  void operator()(const as::metric_event& m) { p.on_metric(m, out); }
  void operator()(const policy_testing::join_event& j) {
    p.on_join(j, out);
    s.unblock(j.worker);
  }
  void operator()(const policy_testing::evict_event& j) {
    p.on_evict(j, out);
    s.unblock(j.worker);
  }
  void operator()(const as::measurement_event& x) { p.on_measurement(x, out); }

  void run(const policy_testing::any_event& e) {
    std::visit(*this, e);
    for (as::worker_id w : out.released()) s.unblock(w);
    checksum += out.round().size() + out.released().size();
    if (out.every_plan_changed()) {
      for (as::worker_id w = 0; w < ids; ++w) checksum += p.plan(w).local_iterations;
    } else {
      for (as::worker_id w : out.plans_changed()) checksum += p.plan(w).local_iterations;
    }
    out.clear();
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(no_policy_allocates_per_event_after_warm_up) {
  for (const auto& c : ps_cases::every_policy(workers)) {
    auto r = ps::make_policy(c.name, c.params);
    BOOST_REQUIRE_MESSAGE(r.has_value(), c.label);
    as::any_policy p = std::move(*r);
    as::outcome_sink out(ids);
    ps_cases::script s(workers, 17);
    driver d{p, out, s};
    // Warm-up: joins and evictions, ASHL's profiling, its switch and the
    // re-plans after the drift at t = 350 s (2500 events reach t ≈ 1300 s).
    for (int i = 0; i < 2500; ++i) d.run(s.next());
    if (c.name == "ashl") {
      const auto sum = ps::ashl_summary_of(p);
      BOOST_REQUIRE(sum.has_value());
      BOOST_TEST((sum->stage == ashl::stage_id::shl), c.label + " did not reach SHL in the warm-up");
    }
    s.set_membership(false);
    // A membership change after ASHL's plan opens a re-profiling window
    // (docs/elastic.md §2.4), a warm-up like profiling: run until it closes.
    for (int i = 0; i < 3000; ++i) {
      const auto sum = ps::ashl_summary_of(p);
      if (!sum || !sum->reprofiling) break;
      d.run(s.next());
    }
    if (const auto sum = ps::ashl_summary_of(p)) {
      BOOST_TEST(!sum->reprofiling, c.label + ": the re-profiling window did not close");
      BOOST_TEST(sum->membership_replans > 0u, c.label + ": no membership re-plan in the warm-up");
    }
    const std::size_t before = counting_new::count();
    for (int i = 0; i < 3000; ++i) d.run(s.next());
    const std::size_t n = counting_new::count() - before;
    BOOST_TEST(n == 0u, c.label << ": " << n << " allocations in 3000 events after warm-up");
    BOOST_TEST(d.checksum > 0u);
  }
}

BOOST_AUTO_TEST_CASE(the_counter_counts) {
  const std::size_t before = counting_new::count();
  auto* v = new std::string(100, 'x');
  BOOST_TEST(counting_new::count() > before);
  delete v;
}
