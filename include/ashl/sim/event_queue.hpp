// ashl/sim/event_queue.hpp — the discrete-event queue in virtual time.
//
//   ashl::sim::event_queue q;
//   q.push(0.5, /*kind*/ 1, /*target*/ 3);
//   q.push(0.5, 2, 0);                  // same time: popped after the first (FIFO)
//   while (!q.empty()) { auto e = q.pop(); clock.advance_to(e.time); ... }
//
// A binary min-heap on (time, insertion number), so events at equal times
// come out in the order they were scheduled and a run is a deterministic
// function of its inputs. Events are small PODs (kind, target, tag); the
// driver interprets them. Cancelling is done by the driver with a version
// tag (a stale event is popped and ignored), which keeps the heap simple.
// docs/design.md "Layers / sim"; docs/sim.md "Engine".
#pragma once

#include <ashl/config.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sim {

struct event {
  double time = 0.0;
  std::uint64_t order = 0;   // insertion number: the tie-break
  std::uint32_t kind = 0;
  std::uint32_t target = 0;  // worker, server or link index
  std::uint64_t tag = 0;     // driver data (a version, a message id)
};

class event_queue {
 public:
  void reserve(std::size_t n) { heap_.reserve(n); }
  [[nodiscard]] bool empty() const noexcept { return heap_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return heap_.size(); }
  [[nodiscard]] const event& top() const noexcept { return heap_.front(); }
  [[nodiscard]] std::uint64_t pushed() const noexcept { return next_; }

  void push(double time, std::uint32_t kind, std::uint32_t target, std::uint64_t tag = 0) {
    heap_.push_back(event{time, next_++, kind, target, tag});
    sift_up(heap_.size() - 1);
  }
  event pop() {
    ASHL_ASSERT(!heap_.empty(), "event_queue::pop on an empty queue");
    event e = heap_.front();
    heap_.front() = heap_.back();
    heap_.pop_back();
    if (!heap_.empty()) sift_down(0);
    return e;
  }
  void clear() noexcept { heap_.clear(); }

 private:
  static bool before(const event& a, const event& b) noexcept {
    return a.time < b.time || (a.time == b.time && a.order < b.order);
  }
  void sift_up(std::size_t i) {
    event e = heap_[i];
    while (i > 0) {
      const std::size_t p = (i - 1) / 2;
      if (!before(e, heap_[p])) break;
      heap_[i] = heap_[p];
      i = p;
    }
    heap_[i] = e;
  }
  void sift_down(std::size_t i) {
    const std::size_t n = heap_.size();
    event e = heap_[i];
    for (;;) {
      std::size_t c = 2 * i + 1;
      if (c >= n) break;
      if (c + 1 < n && before(heap_[c + 1], heap_[c])) ++c;
      if (!before(heap_[c], e)) break;
      heap_[i] = heap_[c];
      i = c;
    }
    heap_[i] = e;
  }

  std::vector<event> heap_;
  std::uint64_t next_ = 0;
};

}  // namespace sim
ASHL_NAMESPACE_END
