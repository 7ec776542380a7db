// ashl/profile/measurement.hpp — one timing measurement as the profile layer
// sees it: which worker, what was timed, how big it was (bytes, batch or
// elements), and how long it took. ALGORITHMS.md §3 "Measurements".
//
//   ashl::profile::measurement m{.worker = 2, .kind = ashl::profile::measurement_kind::push,
//                                .amount = 4e6, .seconds = 0.012};
//   if (auto s = ashl::profile::validate(m); !s) return s;
//   // "measurement.seconds = -0.5: duration must be finite and > 0"
//
// The driver (real runtime or simulator) times things and builds these; the
// profile layer never reads a clock. sync/ has its own event type for the
// same data; an adapter maps one onto the other, so neither layer includes
// the other.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>

#include <cmath>
#include <cstdint>
#include <string_view>

ASHL_NAMESPACE_BEGIN
namespace profile {

enum class measurement_kind : std::uint8_t {
  compute,   // one local iteration; amount = batch size
  push,      // sending one commit; amount = bytes
  pull,      // receiving the parameters; amount = bytes
  compress,  // encoding one update; amount = elements
  round,     // one whole round (compute·H + push + pull); amount unused
};

constexpr std::string_view to_string(measurement_kind k) noexcept {
  switch (k) {
    case measurement_kind::compute: return "compute";
    case measurement_kind::push: return "push";
    case measurement_kind::pull: return "pull";
    case measurement_kind::compress: return "compress";
    case measurement_kind::round: return "round";
  }
  return "unknown";
}

struct measurement {
  std::uint32_t worker = 0;
  measurement_kind kind = measurement_kind::compute;
  double amount = 0.0;   // bytes, batch size or elements (see measurement_kind); 0 when unknown
  double seconds = 0.0;  // must be finite and > 0
};

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
// > 0, and its amount is finite and >= 0.
inline status validate(const measurement& m) {
  if (static_cast<std::uint8_t>(m.kind) > static_cast<std::uint8_t>(measurement_kind::round)) {
    return invalid_argument("measurement.kind", static_cast<unsigned>(m.kind), "unknown kind");
  }
  ASHL_TRY(check_duration("measurement.seconds", m.seconds));
  if (!std::isfinite(m.amount) || m.amount < 0.0) {
    return invalid_argument("measurement.amount", m.amount, "must be finite and >= 0");
  }
  return {};
}

}  // namespace profile
ASHL_NAMESPACE_END
