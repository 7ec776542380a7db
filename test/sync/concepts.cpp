#include <ashl/sync/concepts.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/sync/asp.hpp>
#include <ashl/sync/bsp.hpp>
#include <ashl/sync/dssp.hpp>
#include <ashl/sync/local_sgd.hpp>
#include <ashl/sync/semi_async.hpp>
#include <ashl/sync/ssp.hpp>

namespace as = ashl::sync;

namespace {
struct not_a_policy {
  as::commit_decision on_commit(const as::commit_event&, as::outcome_sink&) { return {}; }
};
struct untagged_policy {
  as::commit_decision on_commit(const as::commit_event&, as::outcome_sink&) { return {}; }
  as::pull_action on_pull(const as::pull_event&, as::outcome_sink&) { return {}; }
  void on_metric(const as::metric_event&, as::outcome_sink&) {}
  void on_join(const as::membership_event&, as::outcome_sink&) {}
  void on_evict(const as::membership_event&, as::outcome_sink&) {}
  void on_measurement(const as::measurement_event&, as::outcome_sink&) {}
  void drain(as::outcome_sink&) {}
  [[nodiscard]] as::worker_plan plan(as::worker_id) const { return {}; }
  [[nodiscard]] as::stage_id stage() const { return as::stage_id::none; }
  [[nodiscard]] bool is_live(as::worker_id) const { return true; }
  [[nodiscard]] bool is_held(as::worker_id) const { return false; }
  void save(ashl::state_writer&) const {}
  ashl::status load(ashl::state_reader&) { return {}; }
};
struct tagged_policy : untagged_policy {
  using policy_concept = as::policy_tag;
};
// The old interface: events without a sink.
struct sinkless_policy : tagged_policy {
  as::commit_decision on_commit(const as::commit_event&) { return {}; }
};
struct no_save : tagged_policy {
  void save(ashl::state_writer&) = delete;
};
struct names_instead_of_stage {
  using policy_concept = as::policy_tag;
  as::commit_decision on_commit(const as::commit_event&, as::outcome_sink&) { return {}; }
  as::pull_action on_pull(const as::pull_event&, as::outcome_sink&) { return {}; }
  void on_metric(const as::metric_event&, as::outcome_sink&) {}
  void on_join(const as::membership_event&, as::outcome_sink&) {}
  void on_evict(const as::membership_event&, as::outcome_sink&) {}
  void on_measurement(const as::measurement_event&, as::outcome_sink&) {}
  void drain(as::outcome_sink&) {}
  [[nodiscard]] as::worker_plan plan(as::worker_id) const { return {}; }
  [[nodiscard]] const char* name() const { return "x"; }
  [[nodiscard]] bool is_live(as::worker_id) const { return true; }
  [[nodiscard]] bool is_held(as::worker_id) const { return false; }
  void save(ashl::state_writer&) const {}
  ashl::status load(ashl::state_reader&) { return {}; }
};
}  // namespace

BOOST_AUTO_TEST_CASE(concept_needs_every_member_and_the_tag) {
  BOOST_TEST(!as::consistency_policy<not_a_policy>);
  BOOST_TEST(!as::consistency_policy<untagged_policy>);
  BOOST_TEST(as::consistency_policy<tagged_policy>);
  BOOST_TEST(!as::consistency_policy<sinkless_policy>);
  BOOST_TEST(!as::consistency_policy<no_save>);
  BOOST_TEST(!as::consistency_policy<names_instead_of_stage>);
}

BOOST_AUTO_TEST_CASE(every_core_policy_is_a_model) {
  BOOST_TEST(as::consistency_policy<as::asp>);
  BOOST_TEST(as::consistency_policy<as::ssp>);
  BOOST_TEST(as::consistency_policy<as::dssp>);
  BOOST_TEST(as::consistency_policy<as::bsp>);
  BOOST_TEST(as::consistency_policy<as::local_sgd>);
  BOOST_TEST(as::consistency_policy<as::semi_async>);
}
