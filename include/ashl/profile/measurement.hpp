// ashl/profile/measurement.hpp — one timing measurement as the profile layer
// reads it: which worker, what was timed, how long it took, how big it was
// (bytes or batch) and when. docs/algorithms.md §3 "Measurements".
//
//   ashl::profile::measurement m{.worker = 2, .kind = ashl::profile::measurement_kind::push,
//                                .seconds = 0.012, .amount = 4e6};
//   if (auto s = ashl::profile::validate(m); !s) return s;
//   // "measurement.seconds = -0.5: duration must be finite and > 0"
//
// The type is ashl::measurement and the enum ashl::measurement_kind
// (core/plan.hpp): the one measurement vocabulary of sync/, profile/ and the
// wire's measurements records, so a driver's measurement reaches a planner
// without translation. The driver (real runtime or simulator) times things
// and builds these; the profile layer never reads a clock.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

ASHL_NAMESPACE_BEGIN
namespace profile {

using measurement_kind = ashl::measurement_kind;
using measurement = ashl::measurement;
using ashl::to_string;

// ok when `seconds` is a usable duration: finite and > 0. A zero or negative
// duration is a broken timer, not a very fast worker, so it is refused
// rather than planned around.
inline status check_duration(std::string_view field, double seconds) {
  if (!std::isfinite(seconds) || seconds <= 0.0) {
    return invalid_argument(field, seconds, "duration must be finite and > 0");
  }
  return {};
}

// A measurement is usable when its kind is known, its duration is finite and
// > 0, its amount is finite and >= 0, and its time is finite (the same rules
// the wire applies to a measurements record). Errors name `<what>.<field>`.
inline status validate(const measurement& m, std::string_view what = "measurement") {
  const auto field = [&](std::string_view f) { return std::string(what) + "." + std::string(f); };
  if (static_cast<std::uint8_t>(m.kind) >= measurement_kind_count) {
    return invalid_argument(field("kind"), static_cast<unsigned>(m.kind), "unknown kind");
  }
  if (!std::isfinite(m.seconds) || m.seconds <= 0.0) return check_duration(field("seconds"), m.seconds);
  if (!std::isfinite(m.amount) || m.amount < 0.0) {
    return invalid_argument(field("amount"), m.amount, "must be finite and >= 0");
  }
  if (!std::isfinite(m.time)) return invalid_argument(field("time"), m.time, "must be finite");
  return {};
}

}  // namespace profile
ASHL_NAMESPACE_END
