#include <ashl/sync/events.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/counting_new.hpp"

#include <cmath>
#include <cstddef>
#include <vector>

namespace as = ashl::sync;

BOOST_AUTO_TEST_CASE(staleness_weighting_modes) {
  BOOST_TEST(as::staleness_weighting::none()(7) == 1.0);
  BOOST_TEST(as::staleness_weighting::inverse()(0) == 1.0);
  BOOST_TEST(as::staleness_weighting::inverse()(3) == 0.25);
  const auto f = as::staleness_weighting::power(2.0);
  BOOST_TEST(f(0) == 1.0);
  BOOST_TEST(f(3) == 1.0 / 16.0);
  BOOST_TEST(std::abs(as::staleness_weighting::power(0.5)(3) - 0.5) < 1e-15);
  // A value: copies compare equal, modes differ.
  BOOST_TEST((f == as::staleness_weighting::power(2.0)));
  BOOST_TEST(!(f == as::staleness_weighting::power(1.0)));
  BOOST_TEST(!(as::staleness_weighting::none() == as::staleness_weighting::inverse()));
}

BOOST_AUTO_TEST_CASE(sink_orders_and_dedups_plan_changes) {
  as::outcome_sink out(4);
  BOOST_TEST(out.empty());
  out.apply(0, 1, 0.5);
  out.apply(1, 4, 0.5);
  out.release(2);
  out.release(0);
  out.plan_changed(3);
  out.plan_changed(1);
  out.plan_changed(3);  // once only
  out.plan_changed(1);
  BOOST_TEST(!out.empty());
  BOOST_TEST(out.round().size() == 2u);
  BOOST_TEST((out.round()[1] == as::weighted_commit{1, 4, 0.5}));
  BOOST_TEST((std::vector<as::worker_id>(out.released().begin(), out.released().end()) ==
              std::vector<as::worker_id>{2, 0}));
  BOOST_TEST((std::vector<as::worker_id>(out.plans_changed().begin(), out.plans_changed().end()) ==
              std::vector<as::worker_id>{3, 1}));
  BOOST_TEST(out.plan_changed_for(3));
  BOOST_TEST(!out.plan_changed_for(0));
  BOOST_TEST(!out.plan_changed_for(99));
  BOOST_TEST(out.any_plan_changed());
  BOOST_TEST(!out.every_plan_changed());
  // An id beyond the reservation still works (the sink grows).
  out.plan_changed(9);
  BOOST_TEST(out.plan_changed_for(9));
  out.all_plans_changed();
  BOOST_TEST(out.every_plan_changed());
  BOOST_TEST(out.plan_changed_for(0));
  out.clear();
  BOOST_TEST(out.empty());
  BOOST_TEST(!out.plan_changed_for(3));
  BOOST_TEST(!out.plan_changed_for(9));
  // After clear the same ids are marked afresh.
  out.plan_changed(3);
  BOOST_TEST(out.plans_changed().size() == 1u);
}

BOOST_AUTO_TEST_CASE(round_from_lets_a_policy_weigh_what_it_listed) {
  as::outcome_sink out(3);
  out.apply(7, 1, 1.0);
  const std::size_t first = out.round().size();
  out.apply(0, 2, 96.0);
  out.apply(1, 2, 32.0);
  for (auto& c : out.round_from(first)) c.weight /= 128.0;
  BOOST_TEST(out.round()[0].weight == 1.0);
  BOOST_TEST(out.round()[1].weight == 0.75);
  BOOST_TEST(out.round()[2].weight == 0.25);
}

BOOST_AUTO_TEST_CASE(a_reserved_sink_never_allocates_and_clear_keeps_capacity) {
  constexpr std::size_t workers = 64;
  as::outcome_sink out(workers);
  auto fill = [&] {
    for (as::worker_id w = 0; w < workers; ++w) {
      out.apply(w, w, 1.0);
      out.apply(w, w + 1, 1.0);
      out.release(w);
      out.plan_changed(w);
      out.plan_changed(w);
    }
    out.all_plans_changed();
  };
  const std::size_t before = counting_new::count();
  for (int round = 0; round < 100; ++round) {
    fill();
    out.clear();
  }
  const std::size_t after = counting_new::count();
  BOOST_TEST(after == before);
  // The counter does count: a vector that grows allocates.
  std::vector<int> grows;
  grows.push_back(1);
  BOOST_TEST(counting_new::count() > after);
}
