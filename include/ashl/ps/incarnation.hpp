// ashl/ps/incarnation.hpp — what a time-based worker incarnation is now.
//
//   const std::uint64_t now = ashl::ps::incarnation_now();   // the clock of ps::fresh_incarnation()
//
// A worker joins with an incarnation that must grow across restarts of its
// process (a rejoin of the same process keeps it). Nanoseconds since the
// Unix epoch grow across restarts without any state on disk; a worker's
// default incarnation is ps::fresh_incarnation() (ps/identity.hpp: this
// clock with the low 16 bits random), and this clock is what
// ps::server_params::max_incarnation_ahead measures a join against: a
// join far ahead of incarnation_now() is refused, so nobody can take a rank
// with an incarnation (UINT64_MAX) that no restart could ever pass
// (docs/ps.md, "Limits").
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/clock.hpp>

#include <cstdint>

ASHL_NAMESPACE_BEGIN
namespace ps {

// Nanoseconds since the Unix epoch (system_clock): the unit of every
// time-based incarnation.
inline std::uint64_t incarnation_now() noexcept { return system_clock::nanoseconds_since_epoch(); }

}  // namespace ps
ASHL_NAMESPACE_END
