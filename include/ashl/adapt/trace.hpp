// ashl/adapt/trace.hpp — a Chrome trace of one process (chrome://tracing,
// Perfetto), like Horovod's timeline: where a training step's time goes, per
// bucket. The C++ torch adapter (adapt/torch.hpp) writes it; the Python
// adapter (python/ashl/trace.py) writes the same events in the same format,
// and ashl-run (or ashl.run) merges every process's file into one.
//
//   auto path = ashl::adapt::trace_path_of(std::nullopt, "worker", rank);   // ASHL_TRACE=<p>: "<p>.worker<rank>.json"
//   ashl::adapt::tracer tr(path, "worker", rank);
//   const double t0 = tr.now();  ...  tr.span("commit", trace_lane::comm, t0, tr.now(), bucket);
//   tr.close();                                                              // writes the file
//   ashl::adapt::merge_traces("/tmp/run.json");                              // "<p>.*.json" -> <p>
//
// Events are complete events ("ph": "X") with microseconds since the Unix
// epoch, so the files of one host line up; each has "args.bucket" where it
// concerns one bucket. Lanes (Chrome's threads): "train" (compute, encode,
// wait), "comm" (commit), "pull" (pull). The tracer keeps its events in a
// buffer sized once at construction (span() never allocates; events past
// it are dropped, counted, and said in the file's process name), behind a
// mutex: spans come from the training thread, autograd's threads and the
// adapter's communication threads.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/clock.hpp>
#include <ashl/core/status.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace adapt {

enum class trace_lane : std::uint8_t { train = 1, comm = 2, pull = 3 };

// This process's trace file for a job-wide trace path: `trace`, else
// ASHL_TRACE; nullopt (no trace) when neither is set or the value is empty.
// "<trace>.<role><rank>.json", the name ashl.trace uses.
[[nodiscard]] inline std::optional<std::string> trace_path_of(const std::optional<std::string>& trace,
                                                              std::string_view role, std::uint32_t rank) {
  std::string base;
  if (trace) {
    base = *trace;
  } else if (const char* env = std::getenv("ASHL_TRACE")) {
    base = env;
  }
  if (base.empty()) return std::nullopt;
  return base + "." + std::string(role) + std::to_string(rank) + ".json";
}

class tracer {
 public:
  // The default capacity: 2^18 events (about 8 MiB), some thousands of
  // steps of a model with a few buckets.
  static constexpr std::size_t default_capacity = std::size_t{1} << 18;

  tracer() = default;  // off: span() and close() do nothing
  // `path` nullopt: off. Worker ranks are Chrome's process ids (the merged
  // file has a row per worker, in rank order); other roles 100000 + rank.
  tracer(std::optional<std::string> path, std::string_view role, std::uint32_t rank,
         std::size_t capacity = default_capacity)
      : path_(std::move(path)),
        name_(std::string(role) + " " + std::to_string(rank)),
        pid_(role == "worker" ? rank : 100000u + rank) {
    if (path_) events_.reserve(capacity);
  }
  tracer(const tracer&) = delete;
  tracer& operator=(const tracer&) = delete;
  ~tracer() { (void)close(); }

  [[nodiscard]] bool enabled() const noexcept { return path_.has_value(); }
  [[nodiscard]] const std::optional<std::string>& path() const noexcept { return path_; }

  // Microseconds since the Unix epoch (Python's time.time() * 1e6).
  [[nodiscard]] static double now() noexcept {
    return static_cast<double>(system_clock::nanoseconds_since_epoch()) * 1e-3;
  }

  // One complete event; `name` must outlive the tracer (a literal). A
  // negative bucket: none. Never allocates: past the capacity it counts.
  void span(const char* name, trace_lane lane, double start_us, double end_us, long bucket = -1) noexcept {
    if (!path_) return;
    std::lock_guard g(mu_);
    if (events_.size() == events_.capacity()) {
      ++dropped_;
      return;
    }
    events_.push_back(event{name, start_us, std::max(0.0, end_us - start_us), lane, bucket});
  }

  [[nodiscard]] std::size_t events() const {
    std::lock_guard g(mu_);
    return events_.size();
  }
  [[nodiscard]] std::uint64_t dropped() const {
    std::lock_guard g(mu_);
    return dropped_;
  }

  // Writes the file (a temporary, then renamed over the path) once; later
  // calls do nothing. An error names the file.
  status close() {
    std::lock_guard g(mu_);
    if (!path_) return {};
    const std::string path = std::move(*path_);
    path_.reset();
    std::string out;
    out.reserve(256 + events_.size() * 112);
    out += "{\"traceEvents\": [";
    char buf[256];
    const std::string process =
        dropped_ == 0 ? name_ : name_ + " (trace full: " + std::to_string(dropped_) + " events dropped)";
    out += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(pid_) +
           ", \"args\": {\"name\": \"" + process + "\"}}";
    for (const auto& [lane, lane_name] : lanes) {
      std::snprintf(buf, sizeof buf,
                    ", {\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %u, \"tid\": %u, \"args\": {\"name\": \"%s\"}}",
                    pid_, static_cast<unsigned>(lane), lane_name);
      out += buf;
    }
    for (const auto& e : events_) {
      int n = std::snprintf(buf, sizeof buf,
                            ", {\"name\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %u, \"tid\": %u, "
                            "\"cat\": \"ashl\"",
                            e.name, e.ts, e.dur, pid_, static_cast<unsigned>(e.lane));
      out.append(buf, static_cast<std::size_t>(std::clamp(n, 0, static_cast<int>(sizeof buf) - 1)));
      if (e.bucket >= 0) {
        n = std::snprintf(buf, sizeof buf, ", \"args\": {\"bucket\": %ld}", e.bucket);
        out.append(buf, static_cast<std::size_t>(std::clamp(n, 0, static_cast<int>(sizeof buf) - 1)));
      }
      out += '}';
    }
    out += "], \"displayTimeUnit\": \"ms\"}\n";
    events_.clear();
    return write_replacing(path, out);
  }

  // Writes `text` to `path` through a temporary renamed over it.
  static status write_replacing(const std::string& path, std::string_view text) {
    const std::string tmp = path + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      if (!f)
        return make_error(errc::io_error, "trace", tmp, "cannot create the trace file (does its directory exist?)");
      f.write(text.data(), static_cast<std::streamsize>(text.size()));
      if (!f.flush())
        return make_error(errc::io_error, "trace", tmp, "writing the trace file failed");
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) return make_error(errc::io_error, "trace", path, "renaming the trace file failed: " + ec.message());
    return {};
  }

 private:
  struct event {
    const char* name;
    double ts, dur;
    trace_lane lane;
    long bucket;
  };
  static constexpr std::pair<trace_lane, const char*> lanes[] = {
      {trace_lane::train, "train"}, {trace_lane::comm, "comm"}, {trace_lane::pull, "pull"}};

  std::optional<std::string> path_;
  std::string name_;
  unsigned pid_ = 0;
  mutable std::mutex mu_;
  std::vector<event> events_;
  std::uint64_t dropped_ = 0;
};

namespace detail {

// The raw text of the top-level object's "traceEvents" array's elements
// (between its brackets) in a trace file's JSON; nullopt when the text is
// not an object with such an array. A small scanner, not a JSON library:
// it skips strings (with escapes), nested objects and arrays, and scalars.
struct trace_scanner {
  std::string_view s;
  std::size_t i = 0;

  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
  }
  bool string(std::string_view* out = nullptr) {
    if (i >= s.size() || s[i] != '"') return false;
    const std::size_t begin = ++i;
    for (; i < s.size(); ++i) {
      if (s[i] == '\\') {
        ++i;
      } else if (s[i] == '"') {
        if (out) *out = s.substr(begin, i - begin);
        ++i;
        return true;
      }
    }
    return false;
  }
  bool value(int depth = 0) {
    if (depth > 256) return false;
    ws();
    if (i >= s.size()) return false;
    if (s[i] == '"') return string();
    if (s[i] == '{' || s[i] == '[') {
      const char close = s[i] == '{' ? '}' : ']';
      ++i;
      ws();
      if (i < s.size() && s[i] == close) {
        ++i;
        return true;
      }
      for (;;) {
        if (close == '}') {
          ws();
          if (!string()) return false;
          ws();
          if (i >= s.size() || s[i] != ':') return false;
          ++i;
        }
        if (!value(depth + 1)) return false;
        ws();
        if (i >= s.size()) return false;
        if (s[i] == ',') {
          ++i;
          continue;
        }
        if (s[i] != close) return false;
        ++i;
        return true;
      }
    }
    const std::size_t begin = i;  // a number, true, false, null
    while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\n' &&
           s[i] != '\r' && s[i] != '\t')
      ++i;
    return i > begin;
  }
  std::optional<std::string_view> trace_events() {
    ws();
    if (i >= s.size() || s[i] != '{') return std::nullopt;
    ++i;
    std::optional<std::string_view> found;
    for (;;) {
      ws();
      std::string_view key;
      if (!string(&key)) return std::nullopt;
      ws();
      if (i >= s.size() || s[i] != ':') return std::nullopt;
      ++i;
      ws();
      const std::size_t begin = i;
      if (!value()) return std::nullopt;
      if (key == "traceEvents") {
        const std::string_view arr = s.substr(begin, i - begin);
        if (arr.size() < 2 || arr.front() != '[') return std::nullopt;
        found = arr.substr(1, arr.size() - 2);
      }
      ws();
      if (i < s.size() && s[i] == ',') {
        ++i;
        continue;
      }
      if (i < s.size() && s[i] == '}') return found;
      return std::nullopt;
    }
  }
};

}  // namespace detail

// Merges every process's "<path>.*.json" (the files trace_path_of names;
// not "*.tmp") into `path`, one "traceEvents" array in file-name order;
// returns the number of files merged (0: none, `path` not written). The
// per-process files are kept. A file that is not a trace is named.
[[nodiscard]] inline result<std::size_t> merge_traces(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string prefix = p.filename().string() + ".";
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > prefix.size() + 5 && name.starts_with(prefix) && name.ends_with(".json"))
      files.push_back(it->path());
  }
  if (ec) return make_error(errc::io_error, "trace", dir.string(), "cannot list the trace directory: " + ec.message());
  if (files.empty()) return std::size_t{0};
  std::sort(files.begin(), files.end());
  std::string out = "{\"traceEvents\": [";
  bool first = true;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return make_error(errc::io_error, "trace", f.string(), "cannot read the trace file");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    detail::trace_scanner sc{text};
    const auto events = sc.trace_events();
    if (!events)
      return make_error(errc::malformed, "trace", f.string(), "not a Chrome trace (an object with \"traceEvents\": [...])");
    std::string_view body = *events;
    while (!body.empty() && (body.front() == ' ' || body.front() == '\n' || body.front() == '\t')) body.remove_prefix(1);
    if (body.empty()) continue;
    if (!first) out += ", ";
    out += body;
    first = false;
  }
  out += "], \"displayTimeUnit\": \"ms\"}\n";
  ASHL_TRY(tracer::write_replacing(path, out));
  return files.size();
}

}  // namespace adapt
ASHL_NAMESPACE_END
