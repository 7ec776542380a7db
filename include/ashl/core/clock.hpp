// ashl/core/clock.hpp — the clock concept drivers take.
//
//   ashl::steady_clock real;           // wall time for the real runtime
//   ashl::virtual_clock sim;           // advanced by the simulator
//   sim.advance_to(2.5);
//   double t = sim.now();              // seconds
//   const ashl::steady_clock since;    // a stopwatch: since.now() is the seconds since
//   std::uint64_t ns = ashl::system_clock::nanoseconds_since_epoch();   // wall time, for ids and traces
//
// Nothing below a driver reads time itself (docs/design.md, "The one
// rule"): what must measure or stamp time (a checkpoint writer's timing, a
// process's incarnation, a trace) does it through this header, so the one
// place that touches std::chrono is here and a driver can swap the clock.
#pragma once

#include <ashl/config.hpp>

#include <chrono>
#include <concepts>
#include <cstdint>

ASHL_NAMESPACE_BEGIN

template <class C>
concept clock = requires(const C& c) {
  { c.now() } -> std::convertible_to<double>;  // seconds since an arbitrary epoch
};

class steady_clock {
 public:
  steady_clock() noexcept : start_(std::chrono::steady_clock::now()) {}
  // A clock that reads `seconds` now: another clock's timeline continued
  // (a promoted backup goes on from its primary's, docs/elastic.md §4.1).
  static steady_clock starting_at(double seconds) noexcept {
    steady_clock c;
    c.start_ -= std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
    return c;
  }
  [[nodiscard]] double now() const noexcept { return at(std::chrono::steady_clock::now()); }
  // The seconds of instant t on this clock (an earlier instant: a smaller
  // number, negative before the clock started).
  [[nodiscard]] double at(std::chrono::steady_clock::time_point t) const noexcept {
    return std::chrono::duration<double>(t - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

class virtual_clock {
 public:
  [[nodiscard]] double now() const noexcept { return now_; }
  // Time never runs backwards; an earlier t is ignored.
  void advance_to(double t) noexcept {
    if (t > now_) now_ = t;
  }

 private:
  double now_ = 0.0;
};

// Wall time: seconds since the Unix epoch. Not monotonic (the system may
// set it back): for stamps that must mean the same across processes and
// restarts (incarnation numbers, trace events), never for intervals.
class system_clock {
 public:
  [[nodiscard]] double now() const noexcept {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  // Nanoseconds since the Unix epoch; 0 for a clock set before it.
  [[nodiscard]] static std::uint64_t nanoseconds_since_epoch() noexcept {
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    return ns > 0 ? static_cast<std::uint64_t>(ns) : 0;
  }
};

static_assert(clock<steady_clock>);
static_assert(clock<system_clock>);
static_assert(clock<virtual_clock>);

ASHL_NAMESPACE_END
