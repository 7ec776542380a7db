// test/support/on_ranks.hpp — runs a test body once per rank of an
// in-process collective group, one thread each (the test/coll tests).
#pragma once

#include <ashl/coll/inproc.hpp>

#include <functional>
#include <thread>
#include <vector>

namespace ashl_test {

// body(comm) on n threads, rank r on thread r; returns when all have.
inline void on_ranks(int n, const std::function<void(ashl::coll::inproc&)>& body) {
  ashl::coll::inproc_group g(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&g, r, &body] {
      ashl::coll::inproc c = g.communicator(r);
      body(c);
    });
  for (auto& t : ts) t.join();
}

}  // namespace ashl_test
