// ashl/rules/shards.hpp — how the parameters are split over S servers.
//
//   auto layout = ashl::ps::shard_layout::even(1'000'003, 4);   // result<shard_layout>
//   ashl::ps::key_range r = layout->range(1);                   // [250'001, 500'002)
//   std::uint32_t s = layout->server_of(600'000);               // 2
//
// S contiguous ranges over n elements whose sizes differ by at most one (the
// first n mod S servers hold one more), so every server does the same work
// and a worker splits a commit into shards without a table. A layout of 0
// elements is the simulator's timing-only model: every range is empty.
// docs/design.md "Layers" (ps/: sharding); docs/ps.md.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>

#include <cstdint>
#include <string>

ASHL_NAMESPACE_BEGIN
namespace ps {

// [begin, end) in elements.
struct key_range {
  std::uint64_t begin = 0, end = 0;
  [[nodiscard]] constexpr std::uint64_t size() const noexcept { return end - begin; }
  [[nodiscard]] constexpr bool empty() const noexcept { return end == begin; }
  friend constexpr bool operator==(const key_range&, const key_range&) = default;
};

class shard_layout {
 public:
  // 0 elements over one server: the timing-only layout.
  shard_layout() = default;

  static result<shard_layout> even(std::uint64_t elements, std::uint32_t servers) {
    if (servers == 0) return invalid_argument("shard_layout.servers", servers, "must be >= 1");
    shard_layout l;
    l.elements_ = elements;
    l.servers_ = servers;
    return l;
  }

  [[nodiscard]] std::uint64_t elements() const noexcept { return elements_; }
  [[nodiscard]] std::uint32_t servers() const noexcept { return servers_; }
  [[nodiscard]] bool timing_only() const noexcept { return elements_ == 0; }

  [[nodiscard]] key_range range(std::uint32_t s) const noexcept {
    ASHL_ASSERT(s < servers_, "shard_layout::range: server index out of range");
    const std::uint64_t q = elements_ / servers_, r = elements_ % servers_;
    const std::uint64_t begin = s * q + (s < r ? s : r);
    return {begin, begin + q + (s < r ? 1 : 0)};
  }
  // The server holding element e (< elements()).
  [[nodiscard]] std::uint32_t server_of(std::uint64_t e) const noexcept {
    ASHL_ASSERT(e < elements_, "shard_layout::server_of: element out of range");
    const std::uint64_t q = elements_ / servers_, r = elements_ % servers_;
    const std::uint64_t big = r * (q + 1);  // elements held by the first r servers
    if (e < big) return static_cast<std::uint32_t>(e / (q + 1));
    return static_cast<std::uint32_t>(r + (e - big) / q);
  }

  void save(state_writer& w) const {
    w.tag("SHRD", 1);
    w.put(elements_);
    w.put(servers_);
  }
  status load(state_reader& r) {
    ASHL_TRY(r.tag("SHRD", 1));
    std::uint64_t n = 0;
    std::uint32_t s = 0;
    ASHL_TRY(r.get(n, "shard_layout.elements"));
    ASHL_TRY(r.get(s, "shard_layout.servers"));
    auto l = even(n, s);
    if (!l) return l.error();
    *this = *l;
    return {};
  }

  friend bool operator==(const shard_layout&, const shard_layout&) = default;

 private:
  std::uint64_t elements_ = 0;
  std::uint32_t servers_ = 1;
};

}  // namespace ps
ASHL_NAMESPACE_END
