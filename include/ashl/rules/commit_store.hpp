// ashl/rules/commit_store.hpp — the commits a policy buffered for a later
// round, with their payload bytes, under a fixed byte bound.
//
//   ashl::ps::commit_store store(64 << 20);                       // bound on payload bytes held
//   if (auto s = store.put(w, seq, meta, payload); !s) refuse(s); // names the bound; nothing lost
//   if (const auto* e = store.find(w, seq)) decode(e->meta, store.payload(*e));
//   store.erase(w, seq);
//
// Keyed by (worker, sequence). Payloads live in one arena that grows to at
// most the bound (first-fit over a free list that merges neighbours; when
// the free space exists but is fragmented, live payloads slide to the front
// once), so memory held never exceeds the bound and, once the arena and the
// index have reached their working size, put/find/erase never allocate. A
// put that would pass the bound is refused with an error naming it, and
// nothing already stored is touched. Entries of a worker are found through a
// short per-worker list (a policy buffers a few commits per worker).
// docs/design.md "Server core" (the store of buffered commits); docs/ps.md.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/wire/ids.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

// What a decode of a stored payload needs besides its bytes.
struct commit_meta {
  codec_id codec = codec_id::identity;
  dtype type = dtype::f32;
  std::uint64_t element_count = 0;
  std::uint64_t step = 0;    // codec_context.step
  std::uint32_t tensor = 0;  // codec_context.tensor
  friend constexpr bool operator==(const commit_meta&, const commit_meta&) = default;

  // The saved state's fields, in their order (core/state_io.hpp).
  static constexpr auto fields() {
    return std::tuple{field{"codec", &commit_meta::codec}, field{"dtype", &commit_meta::type},
                      field{"element_count", &commit_meta::element_count}, field{"step", &commit_meta::step},
                      field{"tensor", &commit_meta::tensor}};
  }
};

class commit_store {
 public:
  struct entry {
    std::uint32_t worker = 0;
    std::uint64_t sequence = 0;
    commit_meta meta{};
    std::uint64_t offset = 0;  // into the arena
    std::uint64_t bytes = 0;
    bool live = false;
  };

  explicit commit_store(std::uint64_t bound_bytes = std::uint64_t{64} << 20) : bound_(bound_bytes) {}

  [[nodiscard]] std::uint64_t bound() const noexcept { return bound_; }
  [[nodiscard]] std::uint64_t bytes() const noexcept { return used_; }  // payload bytes held
  [[nodiscard]] std::size_t size() const noexcept { return live_; }     // commits held
  [[nodiscard]] bool empty() const noexcept { return live_ == 0; }
  // Memory the arena holds (never above bound()).
  [[nodiscard]] std::uint64_t arena_bytes() const noexcept { return arena_.size(); }

  // Whether a payload of `bytes` fits now; the error names the bound.
  [[nodiscard]] status can_hold(std::uint64_t bytes) const {
    if (bytes <= bound_ - used_) return {};
    return make_error(errc::out_of_range, "store_bytes", bound_,
                      "a payload of " + std::to_string(bytes) + " bytes would pass it (" + std::to_string(used_) +
                          " bytes of " + std::to_string(live_) + " buffered commits held)");
  }

  // Copies the payload in. Refused (nothing changes) past the bound; a key
  // already held is a programming error.
  status put(std::uint32_t worker, std::uint64_t sequence, const commit_meta& meta,
             std::span<const std::byte> payload) {
    ASHL_ASSERT(find(worker, sequence) == nullptr, "commit_store::put: key already held");
    ASHL_TRY(can_hold(payload.size()));
    const std::uint64_t at = allocate(payload.size());
    if (!payload.empty()) std::memcpy(arena_.data() + at, payload.data(), payload.size());
    std::uint32_t id;
    if (!free_ids_.empty()) {
      id = free_ids_.back();
      free_ids_.pop_back();
    } else {
      id = static_cast<std::uint32_t>(entries_.size());
      entries_.emplace_back();
    }
    entries_[id] = {worker, sequence, meta, at, payload.size(), true};
    if (worker >= by_worker_.size()) by_worker_.resize(std::size_t{worker} + 1);
    by_worker_[worker].push_back(id);
    used_ += payload.size();
    ++live_;
    return {};
  }

  [[nodiscard]] const entry* find(std::uint32_t worker, std::uint64_t sequence) const noexcept {
    if (worker >= by_worker_.size()) return nullptr;
    for (std::uint32_t id : by_worker_[worker])
      if (entries_[id].sequence == sequence) return &entries_[id];
    return nullptr;
  }
  [[nodiscard]] std::span<const std::byte> payload(const entry& e) const noexcept {
    return {arena_.data() + e.offset, static_cast<std::size_t>(e.bytes)};
  }
  // How many commits of `worker` are held.
  [[nodiscard]] std::size_t count(std::uint32_t worker) const noexcept {
    return worker < by_worker_.size() ? by_worker_[worker].size() : 0;
  }

  bool erase(std::uint32_t worker, std::uint64_t sequence) noexcept {
    if (worker >= by_worker_.size()) return false;
    auto& ids = by_worker_[worker];
    for (std::size_t k = 0; k < ids.size(); ++k) {
      const std::uint32_t id = ids[k];
      entry& e = entries_[id];
      if (e.sequence != sequence) continue;
      release(e.offset, e.bytes);
      used_ -= e.bytes;
      --live_;
      e.live = false;
      ids[k] = ids.back();
      ids.pop_back();
      free_ids_.push_back(id);  // capacity: entries_.size() ids at most, reserved as entries grow
      return true;
    }
    return false;
  }

  // Every held entry, in (worker, sequence) order: the order save() writes.
  // Allocates its own ordering (not a hot path), so const stays thread-safe.
  template <class F>
  void for_each(F&& f) const {
    std::vector<std::uint32_t> order;
    for (std::uint32_t w = 0; w < by_worker_.size(); ++w) {
      order.assign(by_worker_[w].begin(), by_worker_[w].end());
      std::sort(order.begin(), order.end(),
                [&](std::uint32_t a, std::uint32_t b) { return entries_[a].sequence < entries_[b].sequence; });
      for (std::uint32_t id : order) f(entries_[id], payload(entries_[id]));
    }
  }

  void save(state_writer& w) const {
    w.tag("PSTO", 1);
    w.put(bound_);
    w.put<std::uint64_t>(live_);
    for_each([&](const entry& e, std::span<const std::byte> p) {
      w.put(e.worker);
      w.put(e.sequence);
      put_fields(w, e.meta);
      w.put<std::uint64_t>(p.size());
      w.put_bytes(p);
    });
  }
  // Reads into a fresh store; *this changes only on success.
  status load(state_reader& r) {
    ASHL_TRY(r.tag("PSTO", 1));
    std::uint64_t bound = 0, n = 0;
    ASHL_TRY(r.get(bound, "commit_store.bound"));
    ASHL_TRY(r.count(n, 42, "commit_store.entries"));  // 42: the fixed fields of an entry
    commit_store fresh(bound);
    std::vector<std::byte> bytes;
    for (std::uint64_t i = 0; i < n; ++i) {
      std::uint32_t worker = 0;
      std::uint64_t seq = 0, size = 0;
      commit_meta m;
      ASHL_TRY(r.get(worker, "commit_store.worker"));
      ASHL_TRY(r.get(seq, "commit_store.sequence"));
      ASHL_TRY(get_fields(r, m, "commit_store"));
      if (!codec_id_table.contains(m.codec))
        return make_error(errc::malformed, "commit_store.codec", static_cast<unsigned>(m.codec), "unknown codec id");
      if (!dtype_table.contains(m.type))
        return make_error(errc::malformed, "commit_store.dtype", static_cast<unsigned>(m.type), "unknown dtype");
      ASHL_TRY(r.count(size, 1, "commit_store.payload_bytes"));
      bytes.resize(static_cast<std::size_t>(size));
      for (auto& b : bytes) {
        std::uint8_t x = 0;
        ASHL_TRY(r.get(x, "commit_store.payload"));
        b = static_cast<std::byte>(x);
      }
      if (fresh.find(worker, seq) != nullptr)
        return make_error(errc::malformed, "commit_store.sequence", seq, "held twice for one worker");
      ASHL_TRY(fresh.put(worker, seq, m, bytes));
    }
    *this = std::move(fresh);
    return {};
  }

 private:
  struct block {
    std::uint64_t offset, bytes;
  };

  // Space for `n` bytes (used_ + n <= bound_ was checked).
  std::uint64_t allocate(std::uint64_t n) {
    if (n == 0) return 0;
    for (std::size_t k = 0; k < free_.size(); ++k) {
      block& b = free_[k];
      if (b.bytes < n) continue;
      const std::uint64_t at = b.offset;
      b.offset += n;
      b.bytes -= n;
      if (b.bytes == 0) free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(k));
      return at;
    }
    if (end_ + n > bound_) compact();  // the space exists (used_ + n <= bound_) but is scattered
    ASHL_ASSERT(end_ + n <= bound_, "commit_store: compaction left too little room");
    const std::uint64_t at = end_;
    end_ += n;
    if (end_ > arena_.size()) {
      // Grow geometrically, never past the bound.
      const std::uint64_t want = std::min<std::uint64_t>(bound_, std::max<std::uint64_t>(end_, 2 * arena_.size()));
      arena_.resize(static_cast<std::size_t>(want));
    }
    return at;
  }

  // Returns [offset, offset + n) to the free list, merging neighbours; space
  // that ends at end_ shrinks end_ instead.
  void release(std::uint64_t offset, std::uint64_t n) {
    if (n == 0) return;
    auto it = std::lower_bound(free_.begin(), free_.end(), offset,
                               [](const block& b, std::uint64_t o) { return b.offset < o; });
    if (offset + n == end_) {
      end_ = offset;
      if (it != free_.begin() && std::prev(it)->offset + std::prev(it)->bytes == end_) {
        end_ = std::prev(it)->offset;
        free_.erase(std::prev(it));
      }
      return;
    }
    const bool joins_prev = it != free_.begin() && std::prev(it)->offset + std::prev(it)->bytes == offset;
    const bool joins_next = it != free_.end() && offset + n == it->offset;
    if (joins_prev && joins_next) {
      std::prev(it)->bytes += n + it->bytes;
      free_.erase(it);
    } else if (joins_prev) {
      std::prev(it)->bytes += n;
    } else if (joins_next) {
      it->offset = offset;
      it->bytes += n;
    } else {
      free_.insert(it, block{offset, n});  // grows only with the number of holes (warm-up)
    }
  }

  // Slides every live payload to the front, in offset order.
  void compact() {
    order_.clear();
    for (std::uint32_t id = 0; id < entries_.size(); ++id)
      if (entries_[id].live && entries_[id].bytes > 0) order_.push_back(id);
    std::sort(order_.begin(), order_.end(),
              [&](std::uint32_t a, std::uint32_t b) { return entries_[a].offset < entries_[b].offset; });
    std::uint64_t at = 0;
    for (std::uint32_t id : order_) {
      entry& e = entries_[id];
      if (e.offset != at) std::memmove(arena_.data() + at, arena_.data() + e.offset, e.bytes);
      e.offset = at;
      at += e.bytes;
    }
    end_ = at;
    free_.clear();
  }

  std::uint64_t bound_;
  std::uint64_t used_ = 0, end_ = 0;
  std::size_t live_ = 0;
  std::vector<std::byte> arena_;
  std::vector<block> free_;
  std::vector<entry> entries_;
  std::vector<std::uint32_t> free_ids_;
  std::vector<std::vector<std::uint32_t>> by_worker_;
  std::vector<std::uint32_t> order_;  // scratch of compact
};

}  // namespace ps
ASHL_NAMESPACE_END
