// ashl/core/clock.hpp — the clock concept drivers take.
//
//   ashl::steady_clock real;           // wall time for the real runtime
//   ashl::virtual_clock sim;           // advanced by the simulator
//   sim.advance_to(2.5);
//   double t = sim.now();              // seconds
//
// Nothing below a driver reads time itself (DESIGN.md, "The one rule").
#pragma once

#include <ashl/config.hpp>

#include <chrono>
#include <concepts>

ASHL_NAMESPACE_BEGIN

template <class C>
concept clock = requires(const C& c) {
  { c.now() } -> std::convertible_to<double>;  // seconds since an arbitrary epoch
};

class steady_clock {
 public:
  steady_clock() noexcept : start_(std::chrono::steady_clock::now()) {}
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

static_assert(clock<steady_clock>);
static_assert(clock<virtual_clock>);

ASHL_NAMESPACE_END
