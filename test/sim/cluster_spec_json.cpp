#include <ashl/sim/cluster_spec_json.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <string>

using ashl::sim::parse_cluster_spec;

namespace {
std::string error_of(const char* json) {
  auto r = parse_cluster_spec(json);
  return r ? std::string("ok") : r.error().message();
}
}  // namespace

BOOST_AUTO_TEST_CASE(parses_workers_servers_jitter_and_changes) {
  auto r = parse_cluster_spec(R"({
    "reference": {"seconds_per_iteration": 0.01, "batch": 64},
    "model_bytes": 1000, "failure_timeout_s": 0.5, "seed": 7,
    "servers": [{"bandwidth_gbps": 8, "latency_us": 5}],
    "workers": [{"count": 2, "compute_multiplier": 3, "bandwidth_gbps": 0.8, "latency_us": 100,
                 "jitter": {"kind": "lognormal", "sigma": 0.2}},
                {"seconds_per_iteration": 0.05, "batch": 32, "jitter": {"kind": "uniform", "a": 0.1}}],
    "changes": [{"at": 1.5, "worker": 2, "kind": "slowdown", "factor": 2},
                {"at": 3, "worker": 0, "kind": "die"}, {"at": 4, "worker": 2, "kind": "join"}]
  })");
  BOOST_REQUIRE_MESSAGE(r.has_value(), (r ? std::string() : r.error().message()));
  BOOST_TEST(r->workers.size() == 3u);
  BOOST_TEST(r->workers[0].seconds_per_iteration == 0.03, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(r->workers[0].bandwidth_bytes_per_s == 1e8, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(r->workers[0].latency_s == 1e-4, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(r->workers[0].compute_jitter.param == 0.2);
  BOOST_TEST(r->workers[2].batch == 32u);
  BOOST_TEST(r->workers[2].seconds_per_iteration == 0.05);
  BOOST_TEST(r->servers[0].bandwidth_bytes_per_s == 1e9, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(r->changes.size() == 3u);
  BOOST_TEST((r->changes[1].kind == ashl::sim::change_kind::die));
  BOOST_TEST(r->model_bytes == 1000u);
  BOOST_TEST(r->seed == 7u);
}

// Membership (docs/elastic.md §2.5): "max_workers" and a "leave" change
// read into the spec's fields; absent, max_workers is 0 (the number of
// workers); bad values are named.
BOOST_AUTO_TEST_CASE(max_workers_and_leave_are_read) {
  auto r = parse_cluster_spec(R"({
    "workers": [{"count": 4}], "max_workers": 6,
    "changes": [{"at": 1, "worker": 3, "kind": "join"}, {"at": 2, "worker": 1, "kind": "leave"}]
  })");
  BOOST_REQUIRE_MESSAGE(r.has_value(), (r ? std::string() : r.error().message()));
  BOOST_TEST(r->max_workers == 6u);
  BOOST_TEST(ashl::sim::max_workers_of(*r) == 6u);
  BOOST_TEST(ashl::sim::initial_workers(*r) == 3u);
  BOOST_REQUIRE(r->changes.size() == 2u);
  BOOST_TEST((r->changes[0].kind == ashl::sim::change_kind::join));
  BOOST_TEST((r->changes[1].kind == ashl::sim::change_kind::leave));
  BOOST_TEST(r->changes[1].worker == 1u);
  BOOST_TEST(std::string(ashl::sim::to_string(r->changes[1].kind)) == "leave");
  auto d = parse_cluster_spec(R"({"workers": [{"count": 2}]})");
  BOOST_REQUIRE(d.has_value());
  BOOST_TEST(d->max_workers == 0u);
  BOOST_TEST(ashl::sim::max_workers_of(*d) == 2u);
  BOOST_TEST(error_of(R"({"workers": [{"count": 3}], "max_workers": 2})") ==
             "max_workers = 2: must be at least the initial workers (3: those without a join change)");
  BOOST_TEST(error_of(R"({"workers": [{}], "max_workers": 65537})") ==
             "max_workers = 65537: must be at most 65536 (ps::max_workers)");
  BOOST_TEST(error_of(R"({"workers": [{}], "max_workers": -1})") == "max_workers = -1: must be >= 0");
  BOOST_TEST(error_of(R"({"workers": [{}], "max_workers": "many"})") == "max_workers = \"many\": must be an integer");
  BOOST_TEST(error_of(R"({"workers": [{}], "changes": [{"at": 1, "worker": 0, "kind": "quit"}]})") ==
             "changes[0].kind = \"quit\": must be slowdown, die, join or leave");
}

BOOST_AUTO_TEST_CASE(invalid_fields_are_reported_by_path_and_value) {
  BOOST_TEST(error_of(R"({"workers": [{}, {}, {}, {"bandwidth_gbps": -1}]})") ==
             "workers[3].bandwidth_gbps = -1: must be > 0");
  BOOST_TEST(error_of(R"({"workers": [{"count": 3}, {"compute_multiplier": 0}]})") ==
             "workers[1].compute_multiplier = 0: must be > 0");
  BOOST_TEST(error_of(R"({"workers": [{"latency_us": -3}]})") == "workers[0].latency_us = -3: must be >= 0");
  BOOST_TEST(error_of(R"({"workers": [{"jitter": {"kind": "uniform", "a": 1.5}}]})") ==
             "workers[0].jitter.a = 1.5: must be in [0, 1)");
  BOOST_TEST(error_of(R"({"workers": [{"jitter": {"kind": "gauss"}}]})") ==
             "workers[0].jitter.kind = \"gauss\": must be none, uniform or lognormal");
  BOOST_TEST(error_of(R"({"workers": [{"count": 0}]})") == "workers[0].count = 0: must be >= 1");
  BOOST_TEST(error_of(R"({"workers": [{"batch": "big"}]})") == "workers[0].batch = \"big\": must be an integer");
  BOOST_TEST(error_of(R"({"servers": [{"bandwidth_gbps": 0}], "workers": [{}]})") ==
             "servers[0].bandwidth_gbps = 0: must be > 0");
  BOOST_TEST(error_of(R"({"workers": [{}], "changes": [{"at": 1, "worker": 5, "kind": "die"}]})") ==
             "changes[0].worker = 5: must name a worker (< workers.size)");
  BOOST_TEST(error_of(R"({"workers": [{}], "changes": [{"at": 1, "worker": 0, "kind": "slowdown", "factor": -2}]})") ==
             "changes[0].factor = -2: must be > 0");
  BOOST_TEST(error_of(R"({"workers": [{}], "changes": [{"at": -1, "worker": 0, "kind": "die"}]})") ==
             "changes[0].at = -1: must be finite and >= 0");
  BOOST_TEST(error_of(R"({"workers": []})") == "workers.size = 0: must be >= 1");
  BOOST_TEST(error_of(R"({"reference": {"seconds_per_iteration": -0.5}, "workers": [{}]})") ==
             "reference.seconds_per_iteration = -0.5: must be > 0");
  BOOST_TEST(error_of(R"({"reference": {"compress_seconds": -1}, "workers": [{}]})") ==
             "reference.compress_seconds = -1: must be finite and >= 0");
  BOOST_TEST(error_of(R"({"workers": [{}, {"compress_seconds": -0.25}]})") ==
             "workers[1].compress_seconds = -0.25: must be finite and >= 0");
  BOOST_TEST(error_of(R"({"workers": [{"compress_seconds": "slow"}]})") ==
             "workers[0].compress_seconds = \"slow\": must be a number");
  BOOST_TEST(error_of(R"({"workers": [{}, {"push": 1}]})") == "workers[1].push = 1: must be true or false");
  BOOST_TEST(error_of("{not json") == "cluster_spec = \"json\": does not parse as JSON");
  BOOST_TEST(error_of("[1, 2]") == "cluster_spec = \"array\": must be a JSON object");
}

BOOST_AUTO_TEST_CASE(load_reports_a_missing_file_by_path) {
  auto missing = ashl::sim::load_cluster_spec("/nonexistent/cluster.json");
  BOOST_REQUIRE(!missing);
  BOOST_TEST((missing.error().code() == ashl::errc::not_found));
  BOOST_TEST(missing.error().message() == "cluster_spec.path = \"/nonexistent/cluster.json\": cannot open");
}

// The JSON units (Gbit/s, µs, multipliers of the reference) become the
// spec's (bytes/s, s, seconds per iteration); compression time scales like
// compute unless a worker gives its own.
BOOST_AUTO_TEST_CASE(units_and_defaults_are_converted) {
  auto r = parse_cluster_spec(R"({"reference": {"seconds_per_iteration": 0.02, "compress_seconds": 0.004},
    "workers": [{"compute_multiplier": 2}, {"seconds_per_iteration": 0.01, "compress_seconds": 0.001}]})");
  BOOST_REQUIRE_MESSAGE(r.has_value(), (r ? std::string() : r.error().message()));
  BOOST_TEST(r->servers.size() == 1u);
  BOOST_TEST(std::isinf(r->servers[0].bandwidth_bytes_per_s));
  BOOST_TEST(std::isinf(r->workers[0].bandwidth_bytes_per_s));
  BOOST_TEST(r->workers[0].seconds_per_iteration == 0.04, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(r->workers[0].compress_seconds == 0.008, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(r->workers[1].compress_seconds == 0.001);
  BOOST_TEST(r->workers[0].batch == 64u);
  BOOST_TEST(r->header_bytes == 72u);
  BOOST_TEST(r->reply_part_bytes == 0u);
  auto parts = parse_cluster_spec(R"({"reply_part_bytes": 65536, "workers": [{}]})");
  BOOST_REQUIRE_MESSAGE(parts.has_value(), (parts ? std::string() : parts.error().message()));
  BOOST_TEST(parts->reply_part_bytes == 65536u);
  BOOST_TEST(r->commit_part_bytes == 0u);
  auto cparts = parse_cluster_spec(R"({"commit_part_bytes": 1048576, "workers": [{}]})");
  BOOST_REQUIRE_MESSAGE(cparts.has_value(), (cparts ? std::string() : cparts.error().message()));
  BOOST_TEST(cparts->commit_part_bytes == 1048576u);
  BOOST_TEST(!r->workers[0].push);
  auto p = parse_cluster_spec(R"({"workers": [{"count": 2, "push": true}, {}]})");
  BOOST_REQUIRE_MESSAGE(p.has_value(), (p ? std::string() : p.error().message()));
  BOOST_TEST((p->workers[0].push && p->workers[1].push && !p->workers[2].push));
}
