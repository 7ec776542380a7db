// test/support/torch_server.hpp — the in-process parameter server the
// adapter tests (test/adapt/torch*.cpp) train against: one ps::server for one
// worker over an inproc fabric, identity compression, run on its own thread
// until destroyed; the fabric's worker node; a substring check for the
// messages the tests read.
#pragma once

#include <ashl/rules/policies.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/transport/inproc.hpp>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include "checks.hpp"

namespace torch_testing {

// A server of `policy` (for one worker) at `name` over `fabric`, starting
// from `initial`, stepping with `opt`, until destroyed.
struct server_thread {
  std::atomic<bool> stop{false};
  std::thread th;
  server_thread(const std::shared_ptr<ashl::transport::inproc_fabric>& fabric, std::vector<float> initial,
                const std::string& policy, ashl::ps::policy_params pp, ashl::ps::optimizer_params opt,
                const std::string& name = "server0") {
    namespace ps = ashl::ps;
    using server = ps::server<ashl::transport::inproc>;
    auto node = fabric->node(name);
    ASHL_REQUIRE(node.has_value());
    auto layout = ps::shard_layout::even(initial.size(), 1);
    pp.workers = 1;
    auto pol = ps::make_policy(policy, pp);
    ASHL_REQUIRE(pol.has_value());
    auto srv = server::create(
        {.core = {.layout = *layout, .workers = 1, .optimizer = opt}, .compression = ashl::codec_id::identity},
        std::move(*pol), std::move(*node), initial);
    ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
    th = std::thread([this, s = std::make_shared<server>(std::move(*srv))] { s->run(stop); });
  }
  ~server_thread() {
    stop = true;
    th.join();
  }
};

// A worker's node of `f`.
inline ashl::transport::inproc node_of(const std::shared_ptr<ashl::transport::inproc_fabric>& f) {
  auto n = f->node();
  ASHL_REQUIRE(n.has_value());
  return std::move(*n);
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace torch_testing
