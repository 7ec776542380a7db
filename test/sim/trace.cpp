#include <ashl/sim/trace.hpp>

#include <boost/test/unit_test.hpp>

#include <sstream>
#include <string>

namespace sim = ashl::sim;

// The exact text: metadata naming the process (quotes escaped) and each
// worker, then one complete event per span in microseconds of virtual time.
BOOST_AUTO_TEST_CASE(chrome_trace_has_one_complete_event_per_span) {
  sim::run_result r;
  r.workers.resize(2);
  r.trace = {{0, sim::activity::compute, 0.0, 0.01},
             {1, sim::activity::compress, 0.0125, 0.015},
             {1, sim::activity::wait, 0.015, 0.0205}};
  std::ostringstream os;
  sim::write_chrome_trace(os, r, "test \"run\"");
  BOOST_TEST(os.str() ==
             "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
             "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"test \\\"run\\\"\"}},\n"
             "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"worker 0\"}},\n"
             "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":1,\"args\":{\"name\":\"worker 1\"}},\n"
             "{\"name\":\"compute\",\"ph\":\"X\",\"pid\":0,\"tid\":0,\"ts\":0.000,\"dur\":10000.000},\n"
             "{\"name\":\"compress\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":12500.000,\"dur\":2500.000},\n"
             "{\"name\":\"wait\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":15000.000,\"dur\":5500.000}\n"
             "]}\n");
}

BOOST_AUTO_TEST_CASE(metrics_csv_has_a_header_and_one_row_per_evaluation) {
  sim::run_result r;
  r.metrics.push_back({0.0, {{ashl::metric_id::loss, 2.5}}, 0, 0});
  r.metrics.push_back({1.0, {{ashl::metric_id::loss, 1.5}, {ashl::metric_id::accuracy, 0.5}}, 10, 1000});
  r.metrics.push_back({2.0, {{static_cast<ashl::metric_id>(1030), 7.0}}, 12, 1200});
  std::ostringstream os;
  sim::write_metrics_csv(os, r);
  BOOST_TEST(os.str() ==
             "time_s,commits,bytes_sent,loss,accuracy,metric_1030\n"
             "0.000000,0,0,2.5,,\n"
             "1.000000,10,1000,1.5,0.5,\n"
             "2.000000,12,1200,,,7\n");
}
