// ashl/ps/identity.hpp — who a process of a parameter-server job is, beyond
// its rank: the incarnation of a worker process (so a restarted process is
// never taken for the one before it) and the id of the job (so a worker
// cannot join, and a server cannot restore, another job's state).
// docs/ps.md "Faults, checkpoints and rejoining", "Job identity".
//
//   const std::uint64_t inc = ashl::ps::fresh_incarnation();   // larger than any earlier process's
//   const std::uint64_t job = ashl::ps::make_job_id("resnet50", n, /*max_workers=*/4, /*servers=*/2);
//   ashl::ps::worker_params wp{.rank = r, .servers = addrs, .incarnation = inc, .job = job};
//
// An incarnation is the wall clock's nanoseconds since 1970 with the low 16
// bits random: a process started later (a restart takes far more than the
// 65 µs those bits span) has a larger one, two processes started in the same
// instant differ, and within one process each call returns more than the
// last. It assumes the wall clock does not step back across a restart by
// more than the restart took (NTP slews; a clock set back by hand can make a
// restarted worker stale, which the server then refuses by name).
//
// A job id is FNV-1a (64 bits) over a name the user gives (ASHL_JOB, empty
// by default) and the job's shape: elements of the model, the most workers
// it may have (max_workers, ASHL_MAX_WORKERS; the worker count when not
// said, so a job that does not say it keeps the id it had before there was
// a maximum) and servers. The live count is not in it: a job that grows to
// its maximum, or restores with fewer workers, is the same job
// (docs/elastic.md §2.2).
// It is not secret and carries nothing of the token: two jobs with different
// tokens cannot reach each other's join at all (the transport's handshake
// refuses them); the id separates jobs that share a token (or run without
// one) and differ in shape or name. It is never 0 (0 means "not said").
#pragma once

#include <ashl/config.hpp>
#include <ashl/ps/incarnation.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <string_view>

#include <unistd.h>

ASHL_NAMESPACE_BEGIN
namespace ps {

namespace detail {

inline std::uint64_t incarnation_noise() noexcept {
  try {
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  } catch (...) {  // no entropy source: the pid and an address still differ between processes
    static int here = 0;
    return (static_cast<std::uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull) ^
           static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&here));
  }
}

inline std::atomic<std::uint64_t> last_incarnation{0};

struct fnv1a {
  std::uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* p, std::size_t n) noexcept {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 0x100000001b3ull;
    }
  }
  void u64(std::uint64_t v) noexcept {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));  // little-endian on every host
    bytes(b, 8);
  }
};

}  // namespace detail

// A worker incarnation: larger than any this process returned before and
// than any process started earlier returned (see the top of this file).
inline std::uint64_t fresh_incarnation() noexcept {
  const std::uint64_t t = incarnation_now();  // ps/incarnation.hpp: the servers bound joins by the same clock
  const std::uint64_t candidate = (t & ~std::uint64_t{0xffff}) | (detail::incarnation_noise() & 0xffff);
  std::uint64_t last = detail::last_incarnation.load(std::memory_order_relaxed);
  std::uint64_t next;
  do {
    next = candidate > last ? candidate : last + 1;
  } while (!detail::last_incarnation.compare_exchange_weak(last, next, std::memory_order_relaxed));
  return next == 0 ? 1 : next;
}

// The job id of a job named `name` (may be empty) of this shape; never 0.
// `max_workers` is the job's maximum (its worker count when it has none).
inline std::uint64_t make_job_id(std::string_view name, std::uint64_t elements, std::uint32_t max_workers,
                                 std::uint32_t servers) noexcept {
  detail::fnv1a f;
  f.bytes("ashl-job", 8);
  f.u64(name.size());
  f.bytes(name.data(), name.size());
  f.u64(elements);
  f.u64(max_workers);
  f.u64(servers);
  return f.h == 0 ? 1 : f.h;
}

// "0x0123456789abcdef", as job ids are printed in errors and logs.
inline std::string job_id_text(std::uint64_t id) {
  char b[19];
  std::snprintf(b, sizeof b, "0x%016llx", static_cast<unsigned long long>(id));
  return b;
}

}  // namespace ps
ASHL_NAMESPACE_END
