#include <ashl/sim/cluster_spec.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <string>

namespace sim = ashl::sim;

namespace {
sim::cluster_spec two_workers() {
  sim::cluster_spec s;
  s.workers.assign(2, sim::worker_spec{.seconds_per_iteration = 0.01});
  return s;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_spec_built_in_code_validates) {
  auto s = two_workers();
  BOOST_TEST(sim::validate(s).ok());
  s.servers = {{.latency_s = 5e-6, .bandwidth_bytes_per_s = sim::gbps_to_bytes_per_s(10)}, {}};
  s.changes = {{.at = 1.0, .worker = 1, .kind = sim::change_kind::slowdown, .factor = 2.0}};
  BOOST_TEST(sim::validate(s).ok());
  BOOST_TEST(sim::gbps_to_bytes_per_s(8) == 1e9);
}

// Every field is checked; the message names it in the JSON spelling (a
// bandwidth in Gbit/s, a latency in µs) with the bad value.
BOOST_AUTO_TEST_CASE(invalid_fields_are_named_with_their_value) {
  const auto error_of = [](auto edit) {
    auto s = two_workers();
    edit(s);
    return sim::validate(s).message();
  };
  BOOST_TEST(error_of([](auto& s) { s.workers[1].seconds_per_iteration = 0.0; }) ==
             "workers[1].seconds_per_iteration = 0: must be > 0");
  BOOST_TEST(error_of([](auto& s) { s.workers[0].seconds_per_iteration = std::numeric_limits<double>::infinity(); }) ==
             "workers[0].seconds_per_iteration = inf: must be finite");
  BOOST_TEST(error_of([](auto& s) { s.workers[1].bandwidth_bytes_per_s = -1.25e8; }) ==
             "workers[1].bandwidth_gbps = -1: must be > 0");
  BOOST_TEST(error_of([](auto& s) { s.workers[0].latency_s = -3e-6; }) == "workers[0].latency_us = -3: must be finite and >= 0");
  BOOST_TEST(error_of([](auto& s) { s.workers[0].batch = 0; }) == "workers[0].batch = 0: must be >= 1");
  BOOST_TEST(error_of([](auto& s) { s.workers[1].compress_seconds = -0.25; }) ==
             "workers[1].compress_seconds = -0.25: must be finite and >= 0");
  BOOST_TEST(error_of([](auto& s) { s.workers[0].compute_jitter = {sim::jitter_kind::uniform, 1.5}; }) ==
             "workers[0].jitter.a = 1.5: must be in [0, 1)");
  BOOST_TEST(error_of([](auto& s) { s.workers[0].comm_jitter = {sim::jitter_kind::lognormal, 4.0}; }) ==
             "workers[0].comm_jitter.sigma = 4: must be in [0, 3]");
  BOOST_TEST(error_of([](auto& s) { s.servers[0].bandwidth_bytes_per_s = 0.0; }) ==
             "servers[0].bandwidth_gbps = 0: must be > 0");
  BOOST_TEST(error_of([](auto& s) { s.servers.clear(); }) == "servers.size = 0: must be >= 1");
  BOOST_TEST(error_of([](auto& s) { s.workers.clear(); }) == "workers.size = 0: must be >= 1");
  BOOST_TEST(error_of([](auto& s) { s.reference_batch = 0; }) == "reference.batch = 0: must be >= 1");
  BOOST_TEST(error_of([](auto& s) { s.reference_seconds_per_iteration = -0.5; }) ==
             "reference.seconds_per_iteration = -0.5: must be > 0");
  BOOST_TEST(error_of([](auto& s) { s.failure_timeout_s = std::nan(""); }) ==
             "failure_timeout_s = nan: must be finite and >= 0");
  BOOST_TEST(error_of([](auto& s) { s.changes = {{.at = 1, .worker = 5, .kind = sim::change_kind::die}}; }) ==
             "changes[0].worker = 5: must name a worker (< workers.size)");
  BOOST_TEST(error_of([](auto& s) { s.changes = {{.at = 1, .worker = 0, .factor = -2}}; }) ==
             "changes[0].factor = -2: must be > 0");
  BOOST_TEST(error_of([](auto& s) { s.changes = {{.at = -1, .worker = 0, .kind = sim::change_kind::die}}; }) ==
             "changes[0].at = -1: must be finite and >= 0");
}

// Membership (docs/elastic.md §2.5): the initial set is the workers without
// a join change and must be ids 0..M0-1; max_workers (0: workers.size) is at
// least M0 and at most ps::max_workers; a join past max_workers is allowed
// here (the servers' cores refuse it, a test of that refusal); leave names a
// worker as the other kinds do.
BOOST_AUTO_TEST_CASE(membership_is_validated_by_name) {
  using sim::change_kind;
  auto s = two_workers();
  s.workers.resize(4, s.workers[0]);
  BOOST_TEST(sim::initial_workers(s) == 4u);
  BOOST_TEST(sim::max_workers_of(s) == 4u);
  s.changes = {{.at = 1, .worker = 3, .kind = change_kind::join}, {.at = 2, .worker = 2, .kind = change_kind::join},
               {.at = 3, .worker = 0, .kind = change_kind::leave}};
  BOOST_TEST(sim::validate(s).ok());
  BOOST_TEST(sim::initial_workers(s) == 2u);
  s.max_workers = 3;  // worker 3's join will be refused by the cores, not here
  BOOST_TEST(sim::validate(s).ok());
  BOOST_TEST(sim::max_workers_of(s) == 3u);
  s.max_workers = 1;
  BOOST_TEST(sim::validate(s).message() ==
             "max_workers = 1: must be at least the initial workers (2: those without a join change)");
  s.max_workers = ashl::ps::max_workers + 1;
  BOOST_TEST(sim::validate(s).message() == "max_workers = 65537: must be at most 65536 (ps::max_workers)");
  s.max_workers = 0;
  s.changes = {{.at = 1, .worker = 1, .kind = change_kind::join}};  // initial set {0, 2, 3}: not 0..2
  BOOST_TEST(sim::validate(s).message() ==
             "changes[0].worker = 1: joins, but the initial workers (those without a join change, 3 here) must be "
             "ids 0..2 and the joiners after them");
  s.changes = {{.at = 1, .worker = 0, .kind = change_kind::join}, {.at = 1, .worker = 1, .kind = change_kind::join},
               {.at = 1, .worker = 2, .kind = change_kind::join}, {.at = 1, .worker = 3, .kind = change_kind::join}};
  BOOST_TEST(sim::validate(s).message() ==
             "changes = \"every worker joins\": at least one worker (worker 0) must start the job without a join change");
  s.changes = {{.at = 1, .worker = 4, .kind = change_kind::leave}};
  BOOST_TEST(sim::validate(s).message() == "changes[0].worker = 4: must name a worker (< workers.size)");
  BOOST_TEST(std::string(sim::to_string(change_kind::leave)) == "leave");
  BOOST_TEST(std::string(sim::to_string(change_kind::die)) == "die");
}
