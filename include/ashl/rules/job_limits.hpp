// ashl/rules/job_limits.hpp — the largest job a process accepts: counts and
// durations read from a user (flags, the environment, Python arguments) are
// checked against these before anything is sized or scheduled by them, and
// refused by name past them (docs/ps.md "Bounds on counts and durations").
//
//   if (workers > ashl::ps::max_workers) return ashl::out_of_range("ASHL_NUM_WORKERS", workers, ...);
//   if (auto d = ashl::ps::checked_millis("worker.timeout", seconds); !d) return d.error();
//
// Why these numbers: a server sizes per-worker tables (exactly-once table,
// send slots, the policy's clocks) at creation, so an unbounded worker count
// from a typo (ASHL_NUM_WORKERS=100000000) aborted it with std::bad_alloc;
// 65,536 workers is far past any job ashl runs (a few hundred) and costs a
// server a few MiB of tables. A worker connects to every server and a
// single server address gives server i port + i, so servers stay well below
// the port space: 1,024. A duration is at most 10^9 s (about 31 years):
// every deadline is `now + duration` in steady_clock's signed 64-bit
// nanoseconds, which holds about 9.2 x 10^9 s, so the sum cannot wrap.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>

ASHL_NAMESPACE_BEGIN
namespace ps {

inline constexpr std::uint32_t max_workers = 65536;
inline constexpr std::uint32_t max_servers = 1024;
inline constexpr double max_duration_seconds = 1e9;

// `seconds` as milliseconds (rounded), when it is finite, >= 0 and at most
// max_duration_seconds; else an error naming `field` and the value.
inline result<std::chrono::milliseconds> checked_millis(const std::string& field, double seconds) {
  if (!(seconds >= 0.0) || !std::isfinite(seconds))
    return invalid_argument(field, seconds, "must be >= 0 seconds and finite");
  if (seconds > max_duration_seconds)
    return out_of_range(field, seconds,
                        "must be at most " + std::to_string(static_cast<std::uint64_t>(max_duration_seconds)) +
                            " seconds (ps::max_duration_seconds)");
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(seconds * 1000.0)));
}

// A duration a C++ caller gave (any std::chrono unit): an error naming
// `field` and its count when it is below 0 or past max_duration_seconds.
template <class Rep, class Period>
status check_duration(const std::string& field, std::chrono::duration<Rep, Period> d) {
  if (d.count() < 0) return invalid_argument(field, d.count(), "must be >= 0");
  if (std::chrono::duration<double>(d).count() > max_duration_seconds)
    return out_of_range(field, d.count(), "must be at most 1000000000 seconds (ps::max_duration_seconds)");
  return {};
}

}  // namespace ps
ASHL_NAMESPACE_END
