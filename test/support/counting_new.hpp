// test/support/counting_new.hpp — replaces the global operator new of the test
// executable that includes it (once, in its one translation unit) with one
// that counts, so a test can prove a stretch of code allocates nothing.
//
//   const auto before = counting_new::count();
//   run_events();
//   BOOST_TEST(counting_new::count() == before);
//
// Every replaceable form is defined (single and array, nothrow), so no
// allocation goes around the count. GCC's -Wmismatched-new-delete reports a
// false positive when an inlined library delete reaches std::free here; it is
// silenced for the executables that include this header.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace counting_new {
inline std::atomic<std::size_t> allocations{0};
inline std::size_t count() noexcept { return allocations.load(std::memory_order_relaxed); }
inline void* allocate(std::size_t n) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
}  // namespace counting_new

void* operator new(std::size_t n) {
  if (void* p = counting_new::allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = counting_new::allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counting_new::allocate(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counting_new::allocate(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
