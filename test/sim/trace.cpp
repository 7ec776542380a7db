#include <ashl/sim/trace.hpp>

#include <boost/test/unit_test.hpp>

#include <nlohmann/json.hpp>

#include <set>
#include <sstream>
#include <string>

namespace sim = ashl::sim;

BOOST_AUTO_TEST_CASE(trace_is_valid_chrome_trace_json_with_every_activity) {
  auto spec = sim::parse_cluster_spec(R"({"model_bytes": 100000,
    "workers": [{"seconds_per_iteration": 0.01, "bandwidth_gbps": 1}, {"seconds_per_iteration": 0.03, "bandwidth_gbps": 1}]})");
  BOOST_REQUIRE(spec);
  ashl::sync::policy_params pp;
  pp.workers = 2;
  auto p = ashl::sync::make_policy("bsp", pp);
  BOOST_REQUIRE(p);
  sim::simulator s(*spec, std::move(*p));
  auto r = s.run({.commits_per_worker = 4, .record_trace = true});
  std::ostringstream os;
  sim::write_chrome_trace(os, r, "test \"run\"");
  auto j = nlohmann::json::parse(os.str(), nullptr, false);
  BOOST_REQUIRE(!j.is_discarded());
  BOOST_REQUIRE(j.contains("traceEvents"));
  std::set<std::string> names;
  std::size_t spans = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      ++spans;
      names.insert(e["name"].get<std::string>());
      BOOST_TEST(e["dur"].get<double>() > 0.0);
      BOOST_TEST(e["ts"].get<double>() >= 0.0);
    }
  }
  BOOST_TEST(spans == r.trace.size());
  BOOST_TEST(names == (std::set<std::string>{"compute", "send", "wait", "receive"}));
}

BOOST_AUTO_TEST_CASE(metrics_csv_has_a_header_and_one_row_per_evaluation) {
  sim::run_result r;
  r.metrics.push_back({0.0, {{"loss", 2.5}}, 0, 0});
  r.metrics.push_back({1.0, {{"loss", 1.5}, {"accuracy", 0.5}}, 10, 1000});
  std::ostringstream os;
  sim::write_metrics_csv(os, r);
  BOOST_TEST(os.str() == "time_s,commits,bytes_sent,loss,accuracy\n0.000000,0,0,2.5,\n1.000000,10,1000,1.5,0.5\n");
}
