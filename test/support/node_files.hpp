// test/support/node_files.hpp — reading what ashl_test_ps_node writes to
// --out (test/programs/ps_node.cpp): server<r>.txt and worker<k>.txt
// ("key value" lines; a worker's "cycle c stage H iterations ratio" lines)
// and server<r>.f32 (the shard's parameters, raw little-endian f32). And the
// LeakSanitizer suppressions of a test that loads UCX (its libraries keep
// allocations until exit): include this in one translation unit per test.
#pragma once

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace node_files {

// The "key value" lines; with `cycles`, each "cycle" line's values after
// the cycle index, in order.
inline std::map<std::string, double> read_counters(const std::string& path,
                                                   std::vector<std::vector<double>>* cycles = nullptr) {
  std::map<std::string, double> m;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::string key;
    is >> key;
    if (key == "cycle") {
      std::vector<double> v;
      double x;
      is >> x;  // the cycle index
      while (is >> x) v.push_back(x);
      if (cycles) cycles->push_back(v);
      continue;
    }
    double v = 0;
    if (is >> v) m[key] = v;
  }
  return m;
}

inline std::vector<float> read_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

}  // namespace node_files

extern "C" const char* __lsan_default_suppressions() {
  return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\nleak:libuct_\n";
}
