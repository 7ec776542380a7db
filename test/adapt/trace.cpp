#include <ashl/adapt/trace.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "../support/counting_new.hpp"

// adapt/trace.hpp: the C++ adapter's Chrome trace (the format of
// python/ashl/trace.py), its fixed buffer, the file name rule, and the merge
// that ashl-run and ashl.trace.merge use.

namespace adapt = ashl::adapt;
namespace fs = std::filesystem;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    std::string t = (fs::temp_directory_path() / "ashl-trace-XXXXXX").string();
    BOOST_REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto i = text.find(what); i != std::string::npos; i = text.find(what, i + what.size())) ++n;
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_file_name_is_the_python_adapters) {
  ::unsetenv("ASHL_TRACE");
  BOOST_TEST(!adapt::trace_path_of(std::nullopt, "worker", 3).has_value());
  BOOST_TEST(*adapt::trace_path_of(std::string("/tmp/run.json"), "worker", 3) == "/tmp/run.json.worker3.json");
  ::setenv("ASHL_TRACE", "/var/tmp/t.json", 1);
  BOOST_TEST(*adapt::trace_path_of(std::nullopt, "worker", 0) == "/var/tmp/t.json.worker0.json");
  BOOST_TEST(!adapt::trace_path_of(std::string(), "worker", 0).has_value());  // "" turns it off
  ::setenv("ASHL_TRACE", "", 1);
  BOOST_TEST(!adapt::trace_path_of(std::nullopt, "worker", 0).has_value());
  ::unsetenv("ASHL_TRACE");
}

BOOST_AUTO_TEST_CASE(spans_are_written_as_complete_events_with_their_bucket_and_lane) {
  temp_dir d;
  const auto path = (d.path / "t.json.worker2.json").string();
  {
    adapt::tracer tr(path, "worker", 2, 16);
    BOOST_TEST(tr.enabled());
    tr.span("compute", adapt::trace_lane::train, 1000.0, 1500.25);
    tr.span("commit", adapt::trace_lane::comm, 1500.0, 1700.0, 1);
    tr.span("pull", adapt::trace_lane::pull, 1700.0, 1650.0, 0);  // a clock step back: duration 0
    BOOST_TEST(tr.events() == 3u);
    BOOST_TEST(tr.close().ok());
    BOOST_TEST(!tr.enabled());
    BOOST_TEST(tr.close().ok());  // once
  }
  const auto text = read(path);
  adapt::detail::trace_scanner sc{text};
  BOOST_TEST_REQUIRE(sc.trace_events().has_value());
  BOOST_TEST(count_of(text, "\"ph\": \"X\"") == 3u);
  BOOST_TEST(count_of(text, "\"ph\": \"M\"") == 4u);  // the process and its three lanes
  BOOST_TEST(text.find("\"name\": \"worker 2\"") != std::string::npos);
  BOOST_TEST(text.find("\"name\": \"compute\", \"ph\": \"X\", \"ts\": 1000.000, \"dur\": 500.250, \"pid\": 2, "
                       "\"tid\": 1, \"cat\": \"ashl\"}") != std::string::npos);
  BOOST_TEST(text.find("\"name\": \"commit\", \"ph\": \"X\", \"ts\": 1500.000, \"dur\": 200.000, \"pid\": 2, "
                       "\"tid\": 2, \"cat\": \"ashl\", \"args\": {\"bucket\": 1}}") != std::string::npos);
  BOOST_TEST(text.find("\"dur\": 0.000, \"pid\": 2, \"tid\": 3") != std::string::npos);
  BOOST_TEST(!fs::exists(path + ".tmp"));
}

BOOST_AUTO_TEST_CASE(a_full_buffer_drops_and_counts_and_a_span_never_allocates) {
  temp_dir d;
  const auto path = (d.path / "x.json.worker0.json").string();
  adapt::tracer tr(path, "worker", 0, 2);
  const auto before = counting_new::count();
  for (int i = 0; i < 5; ++i) tr.span("encode", adapt::trace_lane::train, i, i + 1.0, i);
  BOOST_TEST(counting_new::count() == before);
  BOOST_TEST(tr.events() == 2u);
  BOOST_TEST(tr.dropped() == 3u);
  BOOST_TEST(tr.close().ok());
  const auto text = read(path);
  BOOST_TEST(count_of(text, "\"ph\": \"X\"") == 2u);
  BOOST_TEST(text.find("worker 0 (trace full: 3 events dropped)") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(an_off_tracer_does_nothing) {
  adapt::tracer tr;
  tr.span("compute", adapt::trace_lane::train, 0.0, 1.0);
  BOOST_TEST(!tr.enabled());
  BOOST_TEST(tr.events() == 0u);
  BOOST_TEST(tr.close().ok());
}

BOOST_AUTO_TEST_CASE(merge_joins_every_process_file_including_pythons_and_ignores_the_rest) {
  temp_dir d;
  const auto base = (d.path / "run.json").string();
  {
    adapt::tracer a(base + ".worker0.json", "worker", 0, 8), b(base + ".worker1.json", "worker", 1, 8);
    a.span("commit", adapt::trace_lane::comm, 10.0, 20.0, 0);
    b.span("pull", adapt::trace_lane::pull, 11.0, 30.0, 2);
    b.span("wait", adapt::trace_lane::train, 12.0, 13.0, 2);
    BOOST_TEST(a.close().ok());
    BOOST_TEST(b.close().ok());
  }
  // What python/ashl/trace.py writes (json.dump), with a string holding a bracket and an escaped quote.
  std::ofstream(base + ".worker2.json")
      << R"({"traceEvents": [{"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "worker 2 \"]"}}, )"
         R"({"name": "encode", "ph": "X", "ts": 5.5, "dur": 1e2, "pid": 2, "tid": 1, "cat": "ashl", "args": {"bucket": 0}}], "displayTimeUnit": "ms"})";
  std::ofstream(base + ".worker3.json.tmp") << "half a file";  // a process still writing: not merged
  std::ofstream(d.path / "other.json") << "{}";                 // not this trace's
  auto n = adapt::merge_traces(base);
  BOOST_TEST_REQUIRE(n.has_value(), (n ? "" : n.error().message()));
  BOOST_TEST(*n == 3u);
  const auto text = read(base);
  adapt::detail::trace_scanner sc{text};
  BOOST_TEST_REQUIRE(sc.trace_events().has_value());
  BOOST_TEST(count_of(text, "\"ph\": \"X\"") == 4u);
  BOOST_TEST(count_of(text, "\"process_name\"") == 3u);
  BOOST_TEST(text.find("worker 2 \\\"]") != std::string::npos);
  // In file-name order: worker 0's events before worker 1's before worker 2's.
  BOOST_TEST(text.find("\"pid\": 0") < text.find("\"pid\": 1"));
  BOOST_TEST(text.find("\"pid\": 1") < text.find("\"pid\": 2"));
  BOOST_TEST(fs::exists(base + ".worker0.json"));  // kept

  std::ofstream(base + ".worker4.json") << R"({"traceEvents": [{"name": "x"})";  // cut short
  auto bad = adapt::merge_traces(base);
  BOOST_TEST_REQUIRE(!bad.has_value());
  BOOST_TEST(bad.error().message().find("run.json.worker4.json") != std::string::npos);
  BOOST_TEST(bad.error().message().find("not a Chrome trace") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(merge_without_files_writes_nothing) {
  temp_dir d;
  const auto base = (d.path / "none.json").string();
  auto n = adapt::merge_traces(base);
  BOOST_TEST_REQUIRE(n.has_value());
  BOOST_TEST(*n == 0u);
  BOOST_TEST(!fs::exists(base));
}
