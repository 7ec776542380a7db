#include <ashl/sync/concepts.hpp>

#include <boost/test/unit_test.hpp>

namespace as = ashl::sync;

namespace {
struct not_a_policy {
  as::commit_decision on_commit(const as::commit_event&) { return {}; }
};
struct untagged_policy {
  as::commit_decision on_commit(const as::commit_event&) { return {}; }
  as::pull_decision on_pull(const as::pull_event&) { return {}; }
  as::outcome on_metric(const as::metric_event&) { return {}; }
  as::outcome on_join(const as::membership_event&) { return {}; }
  as::outcome on_evict(const as::membership_event&) { return {}; }
  as::outcome on_measurement(const as::measurement_event&) { return {}; }
  as::outcome drain() { return {}; }
  [[nodiscard]] as::worker_plan plan(as::worker_id) const { return {}; }
  [[nodiscard]] const char* name() const { return "x"; }
  [[nodiscard]] bool is_live(as::worker_id) const { return true; }
  [[nodiscard]] bool is_held(as::worker_id) const { return false; }
};
struct tagged_policy : untagged_policy {
  using policy_concept = as::policy_tag;
};
}  // namespace

BOOST_AUTO_TEST_CASE(concept_needs_every_member_and_the_tag) {
  BOOST_TEST(!as::consistency_policy<not_a_policy>);
  BOOST_TEST(!as::consistency_policy<untagged_policy>);
  BOOST_TEST(as::consistency_policy<tagged_policy>);
}
