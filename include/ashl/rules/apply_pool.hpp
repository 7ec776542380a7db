// ashl/rules/apply_pool.hpp — the threads a server applies a commit with, each
// on its own contiguous part of the shard.
//
//   auto pool = ashl::ps::apply_pool::create(4);          // result<unique_ptr<apply_pool>>; 3 helper threads
//   core.use_apply_pool(pool->get());                     // server_core splits its passes over 4 parts
//   (*pool)->run([&](unsigned part) noexcept { ... });    // parts 0..3, on whichever thread claims each
//
// The helpers are started once, by create(), and wait on an atomic (a futex
// on Linux: C++20 atomic wait, after a short spin) for the next run();
// run() hands them a function pointer and an address (no std::function, no
// allocation); the caller and the helpers that are awake claim the parts
// one by one, so a helper the scheduler is slow to wake delays nothing (the
// caller runs its part). run() returns when every part finished. One run at
// a time, from one thread (the server's). The destructor stops and joins
// the helpers. threads() == 1: no helper, run() calls part 0 inline.
//
// Pure code stays pure: server_core takes a pool only from its driver
// (ps::server creates one for server_params.apply_threads > 1); the
// simulator drives server_core without one, and the parts change only how
// fast a pass runs, never its result (docs/ps.md "Apply threads").
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

class apply_pool {
 public:
  // The most threads one pool runs (the caller included).
  static constexpr unsigned max_threads = 64;

  // `field` names the setting in the error (server.apply_threads).
  static status check_threads(std::uint64_t threads, std::string_view field = "apply_threads") {
    if (threads >= 1 && threads <= max_threads) return {};
    return invalid_argument(field, threads,
                            "must be in [1, " + std::to_string(max_threads) +
                                "] (1: the server's thread applies alone; N: it and N - 1 apply threads, each on its own "
                                "part of the shard)");
  }

  static result<std::unique_ptr<apply_pool>> create(std::uint64_t threads, std::string_view field = "apply_threads") {
    ASHL_TRY(check_threads(threads, field));
    std::unique_ptr<apply_pool> p(new apply_pool(static_cast<unsigned>(threads)));
    try {
      p->helpers_.reserve(threads - 1);
      for (unsigned k = 1; k < threads; ++k) p->helpers_.emplace_back([q = p.get()] { q->helper(); });
    } catch (const std::system_error& e) {
      return make_error(errc::unavailable, field, threads, std::string("could not start a thread: ") + e.what());
    }
    return p;
  }

  apply_pool(const apply_pool&) = delete;
  apply_pool& operator=(const apply_pool&) = delete;
  ~apply_pool() {
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (auto& t : helpers_)
      if (t.joinable()) t.join();
  }

  [[nodiscard]] unsigned threads() const noexcept { return threads_; }
  // Runs so far (tests, benches).
  [[nodiscard]] std::uint64_t runs() const noexcept { return runs_; }

  // Calls f(part) for every part in [0, threads()) and returns when all
  // returned. Parts are claimed, not assigned: this thread and every helper
  // that is awake take the next unclaimed part until none is left, so a
  // helper the scheduler has not woken yet (a loaded machine) costs nothing
  // but its share of parallelism: this thread runs the parts itself. Which
  // thread runs a part never changes what the part computes. f must not
  // throw.
  template <class F>
  void run(F& f) noexcept {
    ++runs_;
    if (threads_ == 1) {
      f(0u);
      return;
    }
    const std::uint32_t g = generation_.load(std::memory_order_relaxed) + 1;
    fn_ = [](void* c, unsigned part) noexcept { (*static_cast<F*>(c))(part); };
    ctx_ = &f;
    done_.store(0, std::memory_order_relaxed);
    claim_.store(std::uint64_t{g} << 32, std::memory_order_release);
    generation_.store(g, std::memory_order_release);
    generation_.notify_all();
    work(g);
    for (int spin = 0;; ++spin) {
      const unsigned d = done_.load(std::memory_order_acquire);
      if (d == threads_) break;
      if (spin < spin_limit) pause();
      else done_.wait(d, std::memory_order_acquire);
    }
  }
  template <class F>
  void run(F&& f) noexcept {
    F g(static_cast<F&&>(f));
    run(g);
  }

 private:
  explicit apply_pool(unsigned threads) : threads_(threads) {}

  // Spins before a futex wait: short, because the machine may have fewer
  // cores than threads (a spinning helper then steals the caller's core).
  static constexpr int spin_limit = 256;

  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }

  // Claims and runs parts of run `g` until none is left. A claim is a CAS on
  // (generation, next part): it fails once the run is over or another began,
  // and fn_/ctx_ are read only after a claim succeeded, while the run that
  // wrote them cannot have ended (its part is not done).
  void work(std::uint32_t g) noexcept {
    std::uint64_t s = claim_.load(std::memory_order_acquire);
    for (;;) {
      if (static_cast<std::uint32_t>(s >> 32) != g) return;
      const auto part = static_cast<std::uint32_t>(s);
      if (part >= threads_) return;
      if (!claim_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      fn_(ctx_, part);
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == threads_) done_.notify_one();
      s = claim_.load(std::memory_order_acquire);
    }
  }

  void helper() noexcept {
    std::uint32_t seen = 0;
    for (;;) {
      std::uint32_t g = generation_.load(std::memory_order_acquire);
      for (int spin = 0; g == seen && spin < spin_limit; ++spin) {
        pause();
        g = generation_.load(std::memory_order_acquire);
      }
      if (g == seen) {
        generation_.wait(seen, std::memory_order_acquire);
        continue;
      }
      seen = g;
      if (stop_.load(std::memory_order_acquire)) return;
      work(g);
    }
  }

  unsigned threads_ = 1;
  std::vector<std::thread> helpers_;
  void (*fn_)(void*, unsigned) noexcept = nullptr;
  void* ctx_ = nullptr;
  std::atomic<std::uint32_t> generation_{0};
  std::atomic<std::uint64_t> claim_{0};  // generation << 32 | the next part to claim
  std::atomic<unsigned> done_{0};        // parts of the current run finished
  std::atomic<bool> stop_{false};
  std::uint64_t runs_ = 0;
};

}  // namespace ps
ASHL_NAMESPACE_END
