// ashl/ps/incarnation.hpp — what a time-based worker incarnation is now.
//
//   ashl::ps::worker_params wp{.rank = r, .incarnation = ashl::ps::incarnation_now()};
//
// A worker joins with an incarnation that must grow across restarts of its
// process (a rejoin of the same process keeps it). Microseconds since the
// Unix epoch grow across restarts without any state on disk, and are what
// ps::server_params::max_incarnation_ahead measures a join against: a
// join far ahead of incarnation_now() is refused, so nobody can take a rank
// with an incarnation (UINT64_MAX) that no restart could ever pass
// (docs/ps.md, "Limits").
#pragma once

#include <ashl/config.hpp>

#include <chrono>
#include <cstdint>

ASHL_NAMESPACE_BEGIN
namespace ps {

// Microseconds since the Unix epoch (system_clock).
inline std::uint64_t incarnation_now() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

}  // namespace ps
ASHL_NAMESPACE_END
