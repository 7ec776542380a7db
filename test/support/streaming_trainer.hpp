// test/support/streaming_trainer.hpp — a worker's model for the Streaming
// DiLoCo tests (test/sim/streaming.cpp, test/ps/streaming_worker.cpp): each
// inner step adds g(w, step, i); a sync sends local − reference over the
// fragment's parts; serve keeps the servers' values; merge (or, without
// fragments, deliver) applies them. dyadic() steps keep every sum, mean and
// α = 1/2 mix exact in f32, so the servers' order of adding does not matter.
#pragma once

#include <ashl/rules/shards.hpp>
#include <ashl/rules/streaming.hpp>
#include <ashl/sim/simulator.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace streaming_testing {
namespace sim = ashl::sim;
namespace ss = ashl::sync;
namespace ps = ashl::ps;

inline float dyadic(std::uint32_t w, std::uint64_t t, std::size_t i) {
  return static_cast<float>(w + 1) / 8.0f + static_cast<float>(i) / 64.0f + static_cast<float>(t % 3) / 32.0f;
}

// A worker's model in full mode: each inner step adds g(w, step, i); a sync
// sends local − reference over the fragment's parts; serve keeps the
// servers' values; merge (or, without streaming, deliver) applies them.
struct trainer {
  std::size_t n = 0;
  double alpha = 0.0;
  std::vector<std::vector<float>> local, ref, served, delta;
  std::vector<std::uint64_t> steps;
  const ps::shard_layout* layout = nullptr;
  std::uint32_t fragments = 1;
  float (*g)(std::uint32_t, std::uint64_t, std::size_t) = nullptr;

  trainer(std::size_t n_, std::size_t workers, const std::vector<float>& w0, double a,
          float (*grad)(std::uint32_t, std::uint64_t, std::size_t))
      : n(n_), alpha(a), local(workers, w0), ref(workers, w0), served(workers, w0),
        delta(workers, std::vector<float>(n_, 0.0f)), steps(workers, 0), g(grad) {}

  sim::hooks hooks() {
    sim::hooks h;
    h.compute = [this](const sim::compute_request& q, std::span<sim::shard_payload> out) {
      layout = q.layout;
      fragments = q.fragments == 0 ? 1 : q.fragments;
      auto& x = local[q.worker];
      for (std::uint32_t it = 0; it < q.iterations; ++it) {
        ++steps[q.worker];
        for (std::size_t i = 0; i < n; ++i) x[i] += g(q.worker, steps[q.worker], i);
      }
      for (std::uint32_t k = 0; k < out.size(); ++k) {
        const std::uint32_t j = q.fragments == 0 ? k : k * q.fragments + q.fragment;
        const ps::key_range r = q.layout->range(j);
        for (std::uint64_t i = r.begin; i < r.end; ++i) delta[q.worker][i] = x[i] - ref[q.worker][i];
        out[k] = {.codec = ashl::codec_id::identity, .element_count = r.size(), .step = q.sequence, .tensor = j,
                  .bytes = std::as_bytes(std::span<const float>(delta[q.worker]).subspan(r.begin, r.size()))};
      }
    };
    h.serve = [this](ss::worker_id w, std::uint32_t core, std::span<const float> p) {
      const ps::key_range r = layout->range(core);
      std::copy(p.begin(), p.end(), served[w].begin() + static_cast<std::ptrdiff_t>(r.begin));
    };
    h.deliver = [this](ss::worker_id w) {
      local[w] = served[w];
      ref[w] = served[w];
    };
    h.merge = [this](ss::worker_id w, std::uint32_t p) {
      for (std::uint32_t k = 0; k < layout->servers() / fragments; ++k) {
        const ps::key_range r = layout->range(k * fragments + p);
        ps::streaming_merge(std::span(local[w]).subspan(r.begin, r.size()),
                            std::span<const float>(served[w]).subspan(r.begin, r.size()),
                            std::span(ref[w]).subspan(r.begin, r.size()), alpha);
      }
    };
    return h;
  }
};

}  // namespace streaming_testing
