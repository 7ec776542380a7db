// ashl/coll/inproc.hpp — the collective concept over threads of one
// process: the reference the MPI and NCCL models are checked against, and
// the model the collective drivers are tested over without MPI (the ASan
// CI preset builds without it).
//
//   ashl::coll::inproc_group g(4);                        // 4 ranks
//   std::vector<std::thread> ts;
//   for (int r = 0; r < 4; ++r) ts.emplace_back([&g, r] {
//     ashl::coll::inproc c = g.communicator(r);
//     std::vector<float> x(8, float(r));
//     ASHL_ASSERT(blocking(c, c.allreduce(cview(x), view(x), reduce_op::sum, {})).ok(), "");
//   });                                                   // x == 0+1+2+3 everywhere
//
// Each rank's k-th operation meets the other ranks' k-th in a shared slot.
// The rank that posts last runs the whole collective on every rank's
// buffers (they are all in this process), in rank order 0, 1, …, n−1, so a
// reduction's partial sums are always ((x0 + x1) + x2) + …: the
// single-process reference order. Operations are non-blocking: a rank that
// is not last returns its request at once; wait() sleeps on a condition
// variable until the last rank ran it. Ranks that disagree on the
// operation, dtype, op, counts or root all get an error naming the field.
// A slot is freed when every rank waited (or tested complete) its request:
// a request dropped unwaited keeps its slot until the group is destroyed.
// coll/concepts.hpp states the semantics.
#pragma once

#include <ashl/config.hpp>
#include <ashl/coll/concepts.hpp>
#include <ashl/coll/detail/reduce.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace coll {

class inproc;

// The shared state of one group; ranks are handles into it. Must outlive
// every communicator made from it.
class inproc_group {
 public:
  explicit inproc_group(rank_t size) : size_(size) { ASHL_ASSERT(size >= 1, "inproc_group: size must be >= 1"); }
  inproc_group(const inproc_group&) = delete;
  inproc_group& operator=(const inproc_group&) = delete;

  [[nodiscard]] rank_t size() const noexcept { return size_; }
  inline inproc communicator(rank_t rank);

 private:
  friend class inproc;
  enum class kind : std::uint8_t { allreduce, reduce_scatter, all_gather, broadcast, barrier };
  struct post {
    const void* in = nullptr;
    void* out = nullptr;
    std::size_t in_count = 0, out_count = 0;
  };
  struct slot {
    kind k = kind::barrier;
    dtype t = dtype::f32;
    reduce_op op = reduce_op::sum;
    rank_t root = 0;
    std::vector<std::size_t> counts;
    std::vector<post> posts;
    rank_t posted = 0, consumed = 0;
    bool done = false;
    status result;
  };

  static std::string_view name(kind k) {
    switch (k) {
      case kind::allreduce: return "allreduce";
      case kind::reduce_scatter: return "reduce_scatter";
      case kind::all_gather: return "all_gather";
      case kind::broadcast: return "broadcast";
      case kind::barrier: return "barrier";
    }
    return "?";
  }

  // Posts rank r's part of operation `seq`; runs it when r is the last.
  void submit(std::uint64_t seq, rank_t r, kind k, dtype t, reduce_op op, rank_t root,
              std::span<const std::size_t> counts, post p) {
    std::lock_guard lock(mu_);
    auto [it, fresh] = slots_.try_emplace(seq);
    slot& s = it->second;
    if (fresh) {
      s.k = k;
      s.t = t;
      s.op = op;
      s.root = root;
      s.counts.assign(counts.begin(), counts.end());
      s.posts.resize(static_cast<std::size_t>(size_));
    } else if (s.result.ok()) {
      const std::string what(name(k));
      if (s.k != k) s.result = invalid_argument(what + ".kind", name(k), "ranks called different operations");
      else if (s.t != t) s.result = invalid_argument(what + ".dtype", to_string(t), "ranks disagree");
      else if (s.op != op) s.result = invalid_argument(what + ".op", to_string(op), "ranks disagree");
      else if (s.root != root) s.result = invalid_argument(what + ".root", root, "ranks disagree");
      else if (!std::equal(s.counts.begin(), s.counts.end(), counts.begin(), counts.end()))
        s.result = invalid_argument(what + ".counts", counts.size(), "ranks disagree");
    }
    s.posts[static_cast<std::size_t>(r)] = p;
    if (++s.posted == size_) {
      if (s.result.ok()) run(s);
      s.done = true;
      cv_.notify_all();
    }
  }

  void run(slot& s) {
    const std::size_t es = size_of(s.t);
    const auto n = static_cast<std::size_t>(size_);
    switch (s.k) {
      case kind::allreduce: {
        const std::size_t count = s.posts[0].in_count;
        std::vector<std::byte> acc(count * es);
        if (count) std::memcpy(acc.data(), s.posts[0].in, count * es);
        for (std::size_t i = 1; i < n; ++i) detail::reduce_into(s.t, s.op, acc.data(), s.posts[i].in, count);
        for (auto& p : s.posts)
          if (count) std::memcpy(p.out, acc.data(), count * es);
        return;
      }
      case kind::reduce_scatter: {
        const auto d = displacements(s.counts);
        const std::size_t count = d.back();
        std::vector<std::byte> acc(count * es);
        if (count) std::memcpy(acc.data(), s.posts[0].in, count * es);
        for (std::size_t i = 1; i < n; ++i) detail::reduce_into(s.t, s.op, acc.data(), s.posts[i].in, count);
        for (std::size_t i = 0; i < n; ++i)
          if (s.counts[i]) std::memcpy(s.posts[i].out, acc.data() + d[i] * es, s.counts[i] * es);
        return;
      }
      case kind::all_gather: {
        const auto d = displacements(s.counts);
        // Gather into a temporary first: an in-place rank's input is a block of its own output.
        std::vector<std::byte> all(d.back() * es);
        for (std::size_t i = 0; i < n; ++i)
          if (s.counts[i]) std::memcpy(all.data() + d[i] * es, s.posts[i].in, s.counts[i] * es);
        for (auto& p : s.posts)
          if (!all.empty()) std::memcpy(p.out, all.data(), all.size());
        return;
      }
      case kind::broadcast: {
        const auto& src = s.posts[static_cast<std::size_t>(s.root)];
        for (std::size_t i = 0; i < n; ++i) {
          if (i == static_cast<std::size_t>(s.root) || s.posts[i].out_count == 0) continue;
          if (s.posts[i].out_count != src.out_count) {
            s.result = invalid_argument("broadcast.buf.size", s.posts[i].out_count, "ranks disagree");
            return;
          }
        }
        for (std::size_t i = 0; i < n; ++i)
          if (i != static_cast<std::size_t>(s.root) && src.out_count)
            std::memcpy(s.posts[i].out, src.out, src.out_count * es);
        return;
      }
      case kind::barrier: return;
    }
  }

  // Blocks until `seq` ran (or only tests, when `block` is false).
  result<bool> finish(std::uint64_t seq, bool block) {
    std::unique_lock lock(mu_);
    auto it = slots_.find(seq);
    ASHL_ASSERT(it != slots_.end(), "inproc: request of an operation never posted");
    if (block) cv_.wait(lock, [&] { return it->second.done; });
    if (!it->second.done) return false;
    status st = it->second.result;
    if (++it->second.consumed == size_) slots_.erase(it);
    if (!st.ok()) return st;
    return true;
  }

  rank_t size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, slot> slots_;
};

// One rank of an inproc_group. Use from one thread at a time.
class inproc : public host_model {
 public:
  // A request completes once; afterwards wait/test return ok/true at once.
  class request {
   public:
    request() = default;

   private:
    friend class inproc;
    request(std::uint64_t seq) : seq_(seq), pending_(true) {}  // NOLINT
    std::uint64_t seq_ = 0;
    bool pending_ = false;
    status failed_;
  };

  inproc(inproc_group& g, rank_t rank) : g_(&g), rank_(rank) {
    ASHL_ASSERT(rank >= 0 && rank < g.size(), "inproc: rank out of range");
  }

  [[nodiscard]] rank_t rank() const noexcept { return rank_; }
  [[nodiscard]] rank_t size() const noexcept { return g_->size(); }
  [[nodiscard]] host_stream default_stream() const noexcept { return {}; }
  [[nodiscard]] const coll_counters& counters() const noexcept { return counters_; }

  result<request> allreduce(in_view<> in, out_view<> out, reduce_op op, host_stream) {
    if (auto s = refuse(detail::check_allreduce(in, out)); !s.ok()) return s;
    ++counters_.allreduces;
    counters_.bytes_in += in.size_bytes();
    return start(inproc_group::kind::allreduce, in.element_dtype(), op, 0, {},
                 {in.data(), out.data(), in.size(), out.size()});
  }

  result<request> reduce_scatter(in_view<> in, out_view<> out, std::span<const std::size_t> counts, reduce_op op,
                                 host_stream) {
    if (auto s = refuse(detail::check_reduce_scatter(in, out, counts, rank_, size())); !s.ok()) return s;
    ++counters_.reduce_scatters;
    counters_.bytes_in += in.size_bytes();
    return start(inproc_group::kind::reduce_scatter, in.element_dtype(), op, 0, counts,
                 {in.data(), out.data(), in.size(), out.size()});
  }

  result<request> all_gather(in_view<> in, out_view<> out, std::span<const std::size_t> counts, host_stream) {
    if (auto s = refuse(detail::check_all_gather(in, out, counts, rank_, size())); !s.ok()) return s;
    ++counters_.all_gathers;
    counters_.bytes_in += in.size_bytes();
    return start(inproc_group::kind::all_gather, in.element_dtype(), reduce_op::sum, 0, counts,
                 {in.data(), out.data(), in.size(), out.size()});
  }

  result<request> broadcast(out_view<> buf, rank_t root, host_stream) {
    if (auto s = refuse(detail::check_root(root, size())); !s.ok()) return s;
    ++counters_.broadcasts;
    counters_.bytes_in += buf.size_bytes();
    return start(inproc_group::kind::broadcast, buf.element_dtype(), reduce_op::sum, root, {},
                 {buf.data(), buf.data(), buf.size(), buf.size()});
  }

  result<request> barrier(host_stream) {
    ++counters_.barriers;
    return start(inproc_group::kind::barrier, dtype::u8, reduce_op::sum, 0, {}, {});
  }

  status wait(request& r) { return finish(r, true).to_status(); }
  result<bool> test(request& r) { return finish(r, false); }

 private:
  status refuse(status s) {
    if (!s.ok()) ++counters_.errors;
    return s;
  }

  request start(inproc_group::kind k, dtype t, reduce_op op, rank_t root, std::span<const std::size_t> counts,
                inproc_group::post p) {
    const std::uint64_t seq = next_++;
    g_->submit(seq, rank_, k, t, op, root, counts, p);
    return request(seq);
  }

  result<bool> finish(request& r, bool block) {
    if (!r.pending_) {
      if (!r.failed_.ok()) return r.failed_;
      return true;
    }
    auto done = g_->finish(r.seq_, block);
    if (done && !*done) return false;
    r.pending_ = false;
    if (!done) {
      ++counters_.errors;
      r.failed_ = done.error();
      return done.error();
    }
    return true;
  }

  inproc_group* g_;
  rank_t rank_;
  std::uint64_t next_ = 0;
  coll_counters counters_{};
};

inproc inproc_group::communicator(rank_t rank) { return inproc(*this, rank); }

static_assert(collective<inproc>);
static_assert(host_collective<inproc>);

}  // namespace coll
ASHL_NAMESPACE_END
