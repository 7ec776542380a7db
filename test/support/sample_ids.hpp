// test/support/sample_ids.hpp — the data set of the chaos test
// (test/ps/chaos.cpp; docs/elastic.md §5): position p of epoch e of a data
// ledger of n samples is sample id (a·p + b) mod n, a permutation of
// 0..n-1 per epoch (a coprime to n), drawn from the ledger's shuffle seed as
// ashl.torch's sampler draws π_e. ashl_test_ps_node --dataset trains these
// ids and writes them; the test maps the server's used positions the same way.
#pragma once

#include <cstdint>
#include <numeric>

namespace sample_ids {

inline std::uint64_t mix(std::uint64_t x) noexcept {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// n at most 2^32 (the products stay in 64 bits).
inline std::uint64_t of(std::uint64_t seed, std::uint64_t epoch, std::uint64_t p, std::uint64_t n) noexcept {
  if (n <= 1) return 0;
  std::uint64_t a = mix(seed ^ (epoch * 0x100000001b3ull)) % n;
  while (std::gcd(a, n) != 1) a = (a + 1) % n;
  const std::uint64_t b = mix(seed + epoch + 1) % n;
  return (a * (p % n) + b) % n;
}

}  // namespace sample_ids
