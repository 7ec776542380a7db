#include <ashl/sync/factory.hpp>

#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

namespace as = ashl::sync;

namespace {
std::string error_of(std::string_view name, const as::policy_params& p) {
  auto r = as::make_policy(name, p);
  return r ? std::string("ok") : r.error().message();
}
as::policy_params with_workers(std::int64_t m) {
  as::policy_params p;
  p.workers = m;
  return p;
}
}  // namespace

BOOST_AUTO_TEST_CASE(every_name_builds_and_drives) {
  for (std::string_view n : {"bsp", "asp", "ssp", "local_sgd", "dssp", "semi_async", "adsp", "ashl"}) {
    auto p = with_workers(2);
    p.sync_every_iterations = 4;
    auto r = as::make_policy(n, p);
    BOOST_TEST_REQUIRE(r.has_value(), n);
    as::any_policy a = std::move(*r);
    auto d = a.on_commit({.worker = 0, .sequence = 1});
    BOOST_TEST((d.action != as::commit_action::drop), n);
    BOOST_TEST((a.on_commit({.worker = 0, .sequence = 1}).action == as::commit_action::drop), n);
    (void)a.on_pull({.worker = 0});
    (void)a.on_evict({.worker = 1});
    BOOST_TEST(!a.is_held(0), n);  // nothing waits for the evicted worker
    BOOST_TEST(!a.plan(0).stage.empty(), n);
  }
}

BOOST_AUTO_TEST_CASE(type_erased_copy_is_independent) {
  auto r = as::make_policy("ssp", [] { auto p = with_workers(2); p.staleness = 0; return p; }());
  BOOST_REQUIRE(r.has_value());
  as::any_policy a = *r;
  (void)a.on_commit({.worker = 0, .sequence = 1});
  as::any_policy b = a;
  BOOST_TEST((b.on_pull({.worker = 0}).action == as::pull_action::hold));
  BOOST_TEST(!a.is_held(0));
  BOOST_TEST(b.target<as::ssp>() != nullptr);
  BOOST_TEST(b.target<as::asp>() == nullptr);
  BOOST_TEST(b.name() == "ssp");
}

BOOST_AUTO_TEST_CASE(rejects_unknown_names_and_impossible_parameters) {
  BOOST_TEST(error_of("gossip", with_workers(2)).find("sync.policy = \"gossip\": unknown policy") == 0u);
  BOOST_TEST(error_of("asp", with_workers(0)) == "asp.workers = 0: must be >= 1");
  auto p = with_workers(2);
  p.staleness = -1;
  BOOST_TEST(error_of("ssp", p) == "ssp.staleness = -1: must be >= 0");
  p = with_workers(2);
  p.local_steps = 0;
  BOOST_TEST(error_of("local_sgd", p) == "local_sgd.local_steps = 0: must be >= 1");
  p = with_workers(2);
  p.h_ahl = 0;
  BOOST_TEST(error_of("ashl", p) == "ashl.h_ahl = 0: must be >= 1");
  p = with_workers(2);
  p.compression_ratio = 0.0;
  BOOST_TEST(error_of("ashl", p) == "ashl.compression_ratio = 0: must be in (0, 1]");
  p.compression_ratio = 1.5;
  BOOST_TEST(error_of("ashl", p) == "ashl.compression_ratio = 1.5: must be in (0, 1]");
  p = with_workers(2);
  p.s_min = 4;
  p.s_max = 2;
  BOOST_TEST(error_of("dssp", p) == "dssp.s_max = 2: must be >= dssp.s_min");
  p = with_workers(2);
  BOOST_TEST(error_of("semi_async", p) == "semi_async.sync_every_iterations = 0: set it or semi_async.sync_every_seconds");
  p = with_workers(2);
  p.period = 0.0;
  BOOST_TEST(error_of("adsp", p) == "adsp.period = 0: must be finite and > 0");
  p = with_workers(2);
  p.weighting = "median";
  BOOST_TEST(error_of("bsp", p) == "bsp.weighting = \"median\": must be mean or samples");
  p = with_workers(2);
  p.staleness_weight = "custom";
  BOOST_TEST(error_of("asp", p) == "asp.staleness_weight = \"custom\": needs staleness_fn");
  p.staleness_fn = [](std::uint64_t t) { return 1.0 / (1.0 + 2.0 * static_cast<double>(t)); };
  BOOST_TEST(error_of("asp", p) == "ok");
}
