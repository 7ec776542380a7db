// bench/support.hpp — what every benchmark reports besides its figures: the
// machine, the date, the load, and medians (these machines are shared and
// noisy: a single time means little, a median and a ratio to a baseline
// measured in the same run mean more).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

namespace bench {

// The CPU's model name from /proc/cpuinfo.
inline std::string machine() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const auto c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  return "unknown";
}

// UTC, ISO 8601.
inline std::string today() {
  const std::time_t t = std::time(nullptr);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return b;
}

// The 1/5/15-minute load averages: other work on a shared machine moves every figure.
inline std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

// The options every bench takes, on any struct with reps, quick and
// json_only: --quick (fewer reps: 5, and the bench's smaller sweep),
// --reps N, --json-only. True when argv[i] was one of them (i then past its
// value).
template <class Options>
bool common_option(Options& o, int argc, char** argv, int& i) {
  const std::string a = argv[i];
  if (a == "--quick") {
    o.quick = true;
    o.reps = 5;
  } else if (a == "--json-only") {
    o.json_only = true;
  } else if (a == "--reps" && i + 1 < argc) {
    o.reps = std::max(1, std::atoi(argv[++i]));
  } else {
    return false;
  }
  return true;
}

// The median (the mean of the middle two for an even count); NaN when empty.
inline double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Times each of fs once per rep, interleaved (f0, f1, ..., f0, f1, ...), so
// load drift on a shared machine reaches every figure alike, after one
// warm-up call of each; the median seconds of each.
template <class... F>
std::array<double, sizeof...(F)> time_interleaved(int reps, F&&... fs) {
  using clock_type = std::chrono::steady_clock;
  (fs(), ...);  // warm-up
  std::array<std::vector<double>, sizeof...(F)> t;
  for (int r = 0; r < reps; ++r) {
    std::size_t k = 0;
    auto one = [&](auto& f) {
      const auto a = clock_type::now();
      f();
      t[k++].push_back(std::chrono::duration<double>(clock_type::now() - a).count());
    };
    (one(fs), ...);
  }
  std::array<double, sizeof...(F)> m{};
  for (std::size_t k = 0; k < m.size(); ++k) m[k] = median(t[k]);
  return m;
}

}  // namespace bench
