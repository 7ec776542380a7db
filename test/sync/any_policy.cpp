#include <ashl/sync/any_policy.hpp>

#include <ashl/sync/adsp.hpp>
#include <ashl/sync/asp.hpp>
#include <ashl/sync/ssp.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/saved_state.hpp"

#include <cstddef>
#include <vector>

namespace as = ashl::sync;
using ashl::stage_id;

namespace {
as::outcome_sink sink;  // reused by every event, as a driver does
as::outcome_sink& fresh() {
  sink.clear();
  return sink;
}
using test_support::saved;
}  // namespace

BOOST_AUTO_TEST_CASE(forwards_every_event) {
  as::any_policy a = as::ssp{{.workers = 2, .staleness = 0}};
  BOOST_TEST(a.has_value());
  BOOST_TEST((a.stage() == stage_id::ssp));
  BOOST_TEST((a.plan(0).stage == stage_id::ssp));
  auto d = a.on_commit({.worker = 0, .sequence = 1}, fresh());
  BOOST_TEST((d.action == as::commit_action::apply));
  BOOST_TEST((a.on_commit({.worker = 0, .sequence = 1}, fresh()).action == as::commit_action::drop));
  BOOST_TEST((a.on_pull({.worker = 0}, fresh()) == as::pull_action::hold));
  BOOST_TEST(a.is_held(0));
  a.on_evict({.worker = 1}, fresh());
  BOOST_TEST(!a.is_live(1));
  BOOST_TEST(!a.is_held(0));  // nothing waits for the evicted worker
  BOOST_TEST((std::vector<as::worker_id>(sink.released().begin(), sink.released().end()) == std::vector<as::worker_id>{0}));
  a.on_join({.worker = 3}, fresh());
  BOOST_TEST(a.is_live(3));
  a.on_metric({.value = 1.0}, fresh());
  a.on_measurement({.worker = 0, .seconds = 0.1}, fresh());
  a.drain(fresh());
}

BOOST_AUTO_TEST_CASE(type_erased_copy_is_independent) {
  as::any_policy a = as::ssp{{.workers = 2, .staleness = 0}};
  (void)a.on_commit({.worker = 0, .sequence = 1}, fresh());
  as::any_policy b = a;
  BOOST_TEST((b.on_pull({.worker = 0}, fresh()) == as::pull_action::hold));
  BOOST_TEST(!a.is_held(0));
  BOOST_TEST(b.target<as::ssp>() != nullptr);
  BOOST_TEST(b.target<as::asp>() == nullptr);
  BOOST_TEST(b.target<as::ssp>()->bound() == 0u);
  const as::any_policy& cb = b;
  BOOST_TEST(cb.target<as::ssp>() != nullptr);
  a = b;  // copy-assign: a now holds its own copy of b's state
  BOOST_TEST(a.is_held(0));
  (void)b.on_commit({.worker = 1, .sequence = 1}, fresh());
  BOOST_TEST(!b.is_held(0));
  BOOST_TEST(a.is_held(0));
  as::any_policy empty;
  BOOST_TEST(!empty.has_value());
  BOOST_TEST(empty.target<as::ssp>() == nullptr);
}

BOOST_AUTO_TEST_CASE(save_and_load_forward_to_the_policy) {
  as::any_policy a = as::adsp{{.workers = 3, .period = 9.0}};
  a.on_measurement({.worker = 1, .kind = ashl::measurement_kind::commit, .seconds = 2.0}, fresh());
  (void)a.on_commit({.worker = 0, .sequence = 4}, fresh());
  const auto bytes = saved(a);
  as::any_policy b = as::adsp{{.workers = 1}};
  ashl::state_reader r(bytes);
  BOOST_TEST_REQUIRE(b.load(r).ok());
  BOOST_TEST((saved(b) == bytes));
  BOOST_TEST((b.plan(1) == a.plan(1)));
  BOOST_TEST((b.on_commit({.worker = 0, .sequence = 4}, fresh()).action == as::commit_action::drop));
  // Bytes of another policy type are refused by its tag, and nothing changes.
  as::any_policy c = as::asp{{.workers = 3}};
  const auto before = saved(c);
  ashl::state_reader r2(bytes);
  const auto st = c.load(r2);
  BOOST_TEST(!st.ok());
  BOOST_TEST(st.message().find("state.tag") == 0u);
  BOOST_TEST((saved(c) == before));
}
