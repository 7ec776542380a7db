// ashl/sim/network.hpp — a shared link: the bandwidth of a server's link
// divided among the transfers that use it at the same time.
//
//   ashl::sim::shared_link up{/*bytes/s*/ 1e9};
//   up.add(/*now*/ 0.0, /*id*/ 7, /*bytes*/ 1e6, /*cap*/ 2e9);   // alone: 1 GB/s
//   up.add(0.0, 8, 1e6, 2e9);                                   // now 0.5 GB/s each
//   auto next = up.next_completion(0.0);                        // {0.002 s, id 7}
//   up.remove(next->time, next->id);
//
// Processor sharing with a per-transfer cap: with n transfers active, each
// runs at min(cap_i, B / n), where cap_i is the sender's own link (ours:
// share a transfer leaves unused because of its cap is not redistributed;
// this keeps every rate a closed form and the arithmetic hand-checkable).
// Bytes are drained lazily: progress is brought up to date only when the set
// of transfers changes, and the driver keeps one pending event per link (the
// earliest completion). An unlimited link (B = inf) runs each transfer at its
// cap. docs/sim.md "Network".
#pragma once

#include <ashl/config.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sim {

class shared_link {
 public:
  struct completion {
    double time;
    std::uint64_t id;
  };

  shared_link() = default;
  explicit shared_link(double bandwidth_bytes_per_s) : bandwidth_(bandwidth_bytes_per_s) {}

  [[nodiscard]] double bandwidth() const noexcept { return bandwidth_; }
  [[nodiscard]] std::size_t active() const noexcept { return flows_.size(); }
  // The rate a transfer with this cap gets now.
  [[nodiscard]] double rate(double cap) const noexcept {
    if (flows_.empty() || !std::isfinite(bandwidth_)) return cap;
    return std::min(cap, bandwidth_ / static_cast<double>(flows_.size()));
  }

  void add(double now, std::uint64_t id, double bytes, double cap) {
    advance(now);
    flows_.push_back({id, std::max(bytes, 0.0), cap});
  }
  // Removes a transfer (finished or cancelled); false when it is not here.
  bool remove(double now, std::uint64_t id) {
    advance(now);
    for (std::size_t i = 0; i < flows_.size(); ++i) {
      if (flows_[i].id == id) {
        flows_[i] = flows_.back();
        flows_.pop_back();
        return true;
      }
    }
    return false;
  }
  // The earliest finishing transfer if nothing changes; ties: lowest id.
  [[nodiscard]] std::optional<completion> next_completion(double now) const {
    std::optional<completion> best;
    for (const auto& f : flows_) {
      const double r = rate(f.cap);
      const double t = (now < last_ ? last_ : now) + (f.remaining <= 0.0 ? 0.0 : f.remaining / r);
      if (!best || t < best->time || (t == best->time && f.id < best->id)) best = completion{t, f.id};
    }
    return best;
  }
  [[nodiscard]] double remaining(std::uint64_t id) const {
    for (const auto& f : flows_)
      if (f.id == id) return f.remaining;
    return 0.0;
  }

 private:
  struct flow {
    std::uint64_t id;
    double remaining;
    double cap;
  };
  void advance(double now) {
    if (now > last_) {
      const double dt = now - last_;
      for (auto& f : flows_) f.remaining = std::max(0.0, f.remaining - rate(f.cap) * dt);
      last_ = now;
    }
  }

  double bandwidth_ = std::numeric_limits<double>::infinity();
  std::vector<flow> flows_;
  double last_ = 0.0;
};

}  // namespace sim
ASHL_NAMESPACE_END
