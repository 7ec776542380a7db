// ashl/ps/streaming_worker.hpp — Streaming DiLoCo's worker process driver:
// the model cut into P fragments (rules/streaming.hpp: fragment_range), one
// ps::worker per fragment talking to that fragment's servers, each
// synchronised on the schedule of rules/streaming.hpp, its exchange
// overlapped with the next inner steps and merged τ steps later.
//
//   std::vector<ashl::ps::worker_params> wp(P);       // wp[p].servers: fragment p's servers
//   std::vector<ashl::transport::ucx> tp = ...;       // one transport per fragment
//   auto sw = ashl::ps::streaming_worker<ashl::transport::ucx>::create(
//       {.fragments = P, .interval = 100, .delay = 5, .alpha = 0.5}, std::move(wp), std::move(tp), model);
//   for (...) {
//     inner_step(model);                               // the caller's own optimizer
//     if (auto s = sw->step(); !s) return fail(s);     // syncs, merges: the schedule's
//   }
//   sw->finish();                                      // merges what is still on the wire
//   sw->leave();
//
// The fragments are fragment_range(n, P, p) (the even split of the
// elements), or the caller's contiguous split given as each fragment's
// first element (create()'s `first`): the adapters cut whole layers
// (layer_fragments; adapt/torch_streaming.hpp).
//
// Fragment p's servers are an ordinary job over its range
// (ps::server with any policy; Local SGD(H) with model_delta for plain
// averaging), so its commits apply to its range only, with its own rounds
// and optimizer state: the simulator's fragment cores
// (sim::server_setup::streaming, docs/sim.md "Streaming fragments") run
// the even split. Each fragment's ps::worker is a follower
// (worker_params::follower) whose cycle ends when the schedule syncs that
// fragment: its commit is the delta local − reference of the fragment
// (the reference: the servers' value it last merged), its pull lands in a
// buffer of the driver's (never in the model while the worker computes),
// and step() waits for it only at the merge (ps::streaming_merge). In
// between, step() drives the transport of the fragments in flight (test()).
// The cycles' measurements are not reported (followers report none of their
// own). Nothing allocates per step. docs/algorithms.md "Streaming
// fragments"; docs/ps.md "Streaming fragments".
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>
#include <ashl/ps/worker.hpp>
#include <ashl/rules/streaming.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

template <class Transport>
class streaming_worker {
 public:
  // Joins every fragment's servers (fragments[p], transports[p]) and pulls
  // their values into `model` (the references start there too). Refuses bad
  // streaming parameters by name (streaming_params::validate against the
  // model's elements).
  static result<streaming_worker> create(const streaming_params& sp, std::vector<worker_params> fragments,
                                         std::vector<Transport> transports, std::span<float> model) {
    return create(sp, std::move(fragments), std::move(transports), model, {});
  }

  // The same over the caller's split: fragment p holds the model's elements
  // [first[p], first[p + 1]) (the last up to the model's end); first[0] is
  // 0 and the elements increase, each fragment holding at least one (each
  // refused by name, streaming_worker.first[p]). Empty: the even split
  // (fragment_range).
  static result<streaming_worker> create(const streaming_params& sp, std::vector<worker_params> fragments,
                                         std::vector<Transport> transports, std::span<float> model,
                                         std::span<const std::uint64_t> first) {
    ASHL_TRY(sp.validate(model.size(), "parameters"));
    if (fragments.size() != sp.fragments)
      return invalid_argument("streaming_worker.fragments", fragments.size(),
                              "must hold one worker_params per fragment (streaming.fragments = " +
                                  std::to_string(sp.fragments) + ")");
    if (transports.size() != sp.fragments)
      return invalid_argument("streaming_worker.transports", transports.size(),
                              "must hold one transport per fragment (streaming.fragments = " +
                                  std::to_string(sp.fragments) + ")");
    const std::size_t n = model.size();
    std::vector<key_range> ranges(sp.fragments);
    if (first.empty()) {
      for (std::uint32_t p = 0; p < sp.fragments; ++p) ranges[p] = fragment_range(n, sp.fragments, p);
    } else {
      if (first.size() != sp.fragments)
        return invalid_argument("streaming_worker.first.size", first.size(),
                                "must hold one first element per fragment (streaming.fragments = " +
                                    std::to_string(sp.fragments) + ")");
      for (std::uint32_t p = 0; p < sp.fragments; ++p) {
        const std::uint64_t end = p + 1 < sp.fragments ? first[p + 1] : n;
        const std::string field = "streaming_worker.first[" + std::to_string(p) + "]";
        if (p == 0 && first[0] != 0) return invalid_argument(field, first[0], "must be 0 (fragment 0 starts the model)");
        if (first[p] >= end)
          return invalid_argument(field, first[p],
                                  p + 1 < sp.fragments
                                      ? "must be < streaming_worker.first[" + std::to_string(p + 1) + "] (" +
                                            std::to_string(end) + "): a fragment holds at least one element"
                                      : "must be < the model's elements (" + std::to_string(n) + ")");
        ranges[p] = {first[p], end};
      }
    }
    streaming_worker s;
    s.sp_ = sp;
    s.schedule_ = streaming_schedule(sp);
    s.model_ = model;
    s.ranges_ = std::move(ranges);
    s.served_.assign(n, 0.0f);
    s.reference_.assign(n, 0.0f);
    s.delta_.assign(n, 0.0f);
    s.flying_.assign(sp.fragments, 0);
    s.workers_.reserve(sp.fragments);
    for (std::uint32_t p = 0; p < sp.fragments; ++p) {
      worker_params wp = std::move(fragments[p]);
      wp.follower = true;  // its cycle ends when the schedule says
      auto w = worker<Transport>::create(std::move(wp), std::move(transports[p]), s.part(s.served_, p));
      if (!w) return status(w.error().code(), "fragment " + std::to_string(p) + ": " + w.error().message());
      s.workers_.push_back(std::move(*w));
    }
    // The join's pulls: the servers' values are the model and the references.
    for (std::size_t i = 0; i < n; ++i) model[i] = s.reference_[i] = s.served_[i];
    return s;
  }

  // One inner step of the caller's is done on the model: fragment p's
  // commit leaves when the schedule syncs it (delta = local − reference),
  // fragment q's answer is awaited and merged when the schedule merges it
  // (the sync first: with τ = 0 the merge awaits that very reply).
  status step() {
    ++t_;
    const auto p = schedule_.sync_after(t_);
    const auto q = schedule_.merge_after(t_);
    for (std::uint32_t f = 0; f < sp_.fragments; ++f) {
      if (flying_[f] != 0) {
        (void)workers_[f].test();  // drives its exchange; the cycle restarts after its wait()
        continue;
      }
      (void)workers_[f].iteration_done(workers_[f].current_plan(), p && *p == f);
    }
    if (p) {
      const auto local = part(model_, *p), ref = part(reference_, *p), d = part(delta_, *p);
      for (std::size_t i = 0; i < d.size(); ++i) d[i] = local[i] - ref[i];
      ASHL_TRY(with_fragment(*p, workers_[*p].commit(d)));
      flying_[*p] = 1;
      ++syncs_;
    }
    if (q) ASHL_TRY(merge(*q));
    return {};
  }

  // Waits for every fragment still on the wire and merges it (before the
  // caller reads the model for good or leaves).
  status finish() {
    for (std::uint32_t f = 0; f < sp_.fragments; ++f)
      if (flying_[f] != 0) ASHL_TRY(merge(f));
    return {};
  }

  // finish(), then every fragment's worker leaves its servers.
  status leave() {
    ASHL_TRY(finish());
    for (std::uint32_t f = 0; f < sp_.fragments; ++f) ASHL_TRY(with_fragment(f, workers_[f].leave()));
    return {};
  }

  [[nodiscard]] const streaming_params& params() const noexcept { return sp_; }
  // Inner steps done, and fragment commits sent.
  [[nodiscard]] std::uint64_t steps() const noexcept { return t_; }
  [[nodiscard]] std::uint64_t syncs() const noexcept { return syncs_; }
  // Fragment p's worker (its telemetry, plan) and its elements in the model.
  [[nodiscard]] const worker<Transport>& fragment(std::uint32_t p) const { return workers_[p]; }
  [[nodiscard]] key_range range(std::uint32_t p) const noexcept { return ranges_[p]; }

 private:
  streaming_worker() = default;

  std::span<float> part(std::span<float> all, std::uint32_t p) const noexcept {
    const key_range r = range(p);
    return all.subspan(static_cast<std::size_t>(r.begin), static_cast<std::size_t>(r.size()));
  }
  std::span<float> part(std::vector<float>& all, std::uint32_t p) const noexcept {
    return part(std::span<float>(all), p);
  }

  status merge(std::uint32_t f) {
    ASHL_TRY(with_fragment(f, workers_[f].wait()));
    streaming_merge(part(model_, f), part(served_, f), part(reference_, f), sp_.alpha);
    flying_[f] = 0;
    return {};
  }

  static status with_fragment(std::uint32_t f, status s) {
    if (s.ok()) return s;
    return status(s.code(), "fragment " + std::to_string(f) + ": " + s.message());
  }

  streaming_params sp_{};
  streaming_schedule schedule_{};
  std::span<float> model_{};
  std::vector<key_range> ranges_;                  // fragment p's elements of the model
  std::vector<float> served_, reference_, delta_;  // whole-model buffers, fragment p at range(p)
  std::vector<std::uint8_t> flying_;               // per fragment: committed, not merged yet
  std::vector<worker<Transport>> workers_;
  std::uint64_t t_ = 0, syncs_ = 0;
};

}  // namespace ps
ASHL_NAMESPACE_END
