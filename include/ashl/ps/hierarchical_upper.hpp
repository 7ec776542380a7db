// ashl/ps/hierarchical_upper.hpp — the upper level of coll/hierarchical.hpp
// that BytePS and HPH use: each local rank is a ps::worker of its slice, so
// the slices cross hosts through parameter servers under the servers'
// policy (BSP, SSP, ASHL, ...), over any transport (UCX between hosts).
//
//   // one server (or server group) per slice index j, holding slice j for the H hosts
//   auto up = ashl::ps::hierarchical_upper<ashl::transport::ucx>::create(
//       {.rank = host, .servers = {slice_server[j]}}, std::move(*t), slice_elements);
//   ashl::coll::hierarchical<ashl::coll::mpi, ashl::ps::hierarchical_upper<ashl::transport::ucx>&> h(local, slices, *up);
//
// Layering: a driver that composes coll/ and ps/, so it lives in ps/
// (coll/ includes nothing from ps/; coll/compressed.hpp uses rules/).
// Each exchange is one commit of the slice (the server's
// ids are host ranks, so a server sees one commit per host per round) and
// one pull into the slice's parameter buffer, which the host then
// all-gathers straight from (no copy). The plan decides when to exchange,
// as for any ps::worker: the host calls iteration_done() after each local
// iteration (hierarchical::iteration_done() forwards it) and step() when it
// returns true (every H iterations, or once the plan's commit interval has
// passed). exchange() on an incomplete cycle is refused, naming it; it once
// spun iteration_done() itself, which reported H iterations in
// no time (a compute measurement of elapsed / H) and busy-waited through an
// interval plan.
#pragma once

#include <ashl/config.hpp>
#include <ashl/coll/hierarchical.hpp>
#include <ashl/core/status.hpp>
#include <ashl/ps/worker.hpp>
#include <ashl/transport/concepts.hpp>
#include <ashl/transport/inproc.hpp>

#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

template <transport::transport T>
class hierarchical_upper {
 public:
  // Joins the servers with a parameter buffer of `elements` (the slice) and
  // pulls the current parameters into it.
  static result<hierarchical_upper> create(worker_params p, T t, std::size_t elements) {
    auto params = std::make_unique<std::vector<float>>(elements, 0.0f);
    auto w = ps::worker<T>::create(std::move(p), std::move(t), *params);
    if (!w) return w.error();
    return hierarchical_upper(std::move(params), std::move(*w));
  }

  // One local iteration of the host is done; true when the plan says to
  // exchange now (then call exchange(), through hierarchical::step()).
  bool iteration_done() { return w_.iteration_done(); }

  // Commits the slice and pulls the current parameters; the cycle must be
  // complete (iteration_done() returned true).
  status exchange(std::span<const float> slice) {
    ASHL_TRY(w_.commit(slice));
    return w_.wait();
  }
  [[nodiscard]] std::span<const float> parameters() const noexcept { return *params_; }
  ps::worker<T>& worker() noexcept { return w_; }
  status leave() { return w_.leave(); }

 private:
  hierarchical_upper(std::unique_ptr<std::vector<float>> params, ps::worker<T> w) : params_(std::move(params)), w_(std::move(w)) {}
  std::unique_ptr<std::vector<float>> params_;  // the worker holds a view: its address must not move
  ps::worker<T> w_;
};

static_assert(coll::upper_level<hierarchical_upper<transport::inproc>>);

}  // namespace ps
ASHL_NAMESPACE_END
