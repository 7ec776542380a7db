// test/support/counting_new.hpp — replaces the global operator new of the test
// executable that includes it (once, in its one translation unit) with one
// that counts, so a test can prove a stretch of code allocates nothing.
//
//   const auto before = counting_new::count();
//   run_events();
//   BOOST_TEST(counting_new::count() == before);
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace counting_new {
inline std::atomic<std::size_t> allocations{0};
inline std::size_t count() noexcept { return allocations.load(std::memory_order_relaxed); }
}  // namespace counting_new

void* operator new(std::size_t n) {
  counting_new::allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
