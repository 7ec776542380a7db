// ashl/coll/concepts.hpp — the collective concept (docs/design.md, "Layers,
// coll/"): allreduce, reduce-scatter and all-gather with uneven counts,
// broadcast and barrier among the ranks of one group, every operation
// non-blocking with a completion. Models: coll/inproc.hpp (threads in one
// process: the reference and the driver tests), coll/mpi.hpp (host memory,
// OpenMPI), coll/nccl.hpp (device memory, NCCL).
//
//   ashl::coll::mpi c = ...;                               // or inproc, nccl
//   std::vector<float> g(n);
//   auto r = c.allreduce(ashl::coll::cview(g), ashl::coll::view(g),   // in place
//                        ashl::coll::reduce_op::sum, c.default_stream());
//   if (!r) return r.error();
//   ... overlap other work ...
//   ASHL_TRY(c.wait(*r));                                  // or poll c.test(*r)
//
//   std::vector<std::size_t> counts = {0, 1, 5};           // uneven; zeros allowed
//   auto rs = c.reduce_scatter(cview(all), view(mine), counts, reduce_op::sum, s);
//   auto ag = c.all_gather(cview(mine), view(all), counts, s);
//
// Semantics every model keeps:
// - Buffers are raw views (pointer, count, dtype) in the model's memory
//   space (`C::space`: host_space for inproc/mpi, device_space for nccl).
//   They must stay valid and untouched until the operation completes.
// - An operation returns its request at once, or an error value for an
//   argument that cannot work (counts that do not add up, dtype mismatch,
//   a count over the engine's limit); nothing is started then.
// - `wait(r)` blocks the calling thread until the results are in the output
//   buffers (for a device model: until the stream work completed); `test(r)`
//   says whether that already happened, without blocking. A request waited
//   or tested complete is done; waiting on it again returns ok at once.
// - Stream order: every operation takes the model's `stream_type`. Host
//   models use `host_stream` (an empty tag). A device model enqueues the
//   operation on the given stream, so later work on that stream sees the
//   results without any host wait (what a training step should do); wait and
//   test are for the host.
// - Every rank calls the same operations in the same order with the same
//   counts, dtype and op (as in MPI and NCCL): the k-th operation of one
//   rank meets the k-th of every other. Wait on requests in the order they
//   were started when in doubt (a model may complete them in any order).
// - In place: allreduce allows in.data() == out.data(); all_gather allows
//   in.data() == the rank's own block inside out. Other overlaps are errors.
// - Reductions sum (or max/min) elementwise; f16 and bf16 are reduced as
//   16-bit values (each partial sum rounded to the dtype, as NCCL does).
//   The order of the partial sums is the model's, so results are exact only
//   where the sums are exact (integers, dyadic fractions): tests use those.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/memory_space.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace coll {

// A rank in one collective group, 0..size()-1.
using rank_t = int;

enum class reduce_op : std::uint8_t { sum = 0, max = 1, min = 2 };

constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::max: return "max";
    case reduce_op::min: return "min";
  }
  return "?";
}

// The stream of host models: operations are ordered by the calling thread.
struct host_stream {};

// Views the collectives take.
template <memory_space Space = host_space>
using in_view = raw_view<Space, true>;
template <memory_space Space = host_space>
using out_view = raw_view<Space, false>;

// Host container shorthands: view(v) for an output, cview(v) for an input.
template <class Container>
auto view(Container& c) noexcept {
  using T = std::remove_cv_t<std::remove_reference_t<decltype(*c.data())>>;
  return out_view<host_space>(static_cast<void*>(c.data()), c.size(), dtype_of<T>);
}
template <class Container>
auto cview(const Container& c) noexcept {
  using T = std::remove_cv_t<std::remove_reference_t<decltype(*c.data())>>;
  return in_view<host_space>(static_cast<const void*>(c.data()), c.size(), dtype_of<T>);
}

// Opt-in tag: a model declares `using collective_concept = collective_tag;`.
struct collective_tag {};
// The three declarations of a host model (buffers in host memory, no
// stream), inherited: `class mpi : public host_model { ... }`.
struct host_model {
  using collective_concept = collective_tag;
  using space = host_space;
  using stream_type = host_stream;
};

// Counters every model keeps (bytes are the local input bytes of each call).
struct coll_counters {
  std::uint64_t allreduces = 0, reduce_scatters = 0, all_gathers = 0, broadcasts = 0, barriers = 0;
  std::uint64_t bytes_in = 0;
  std::uint64_t errors = 0;  // operations refused or completed with an error
};

// The collective concept.
//   C::space        where buffers live (host_space, device_space)
//   C::stream_type  host_stream, or the device stream type
//   C::request      move-only completion handle
//   rank(), size(), default_stream()
//   allreduce(in, out, op, stream)                  in.size() == out.size()
//   reduce_scatter(in, out, counts, op, stream)     counts.size() == size(),
//                                                   in.size() == Σ counts, out.size() == counts[rank()]
//   all_gather(in, out, counts, stream)             in.size() == counts[rank()], out.size() == Σ counts;
//                                                   rank j's block sits at Σ_{i<j} counts[i]
//   broadcast(buf, root, stream)                    root's buf into every rank's buf
//   barrier(stream)
//   wait(request&) -> status, test(request&) -> result<bool>
template <class C>
concept collective =
    requires { typename C::collective_concept; } && std::same_as<typename C::collective_concept, collective_tag> &&
    memory_space<typename C::space> && std::movable<typename C::request> &&
    requires(C& c, const C& cc, in_view<typename C::space> in, out_view<typename C::space> out,
             std::span<const std::size_t> counts, reduce_op op, rank_t root, typename C::stream_type s,
             typename C::request& r) {
      { cc.rank() } -> std::same_as<rank_t>;
      { cc.size() } -> std::same_as<rank_t>;
      { cc.default_stream() } -> std::same_as<typename C::stream_type>;
      { c.allreduce(in, out, op, s) } -> std::same_as<result<typename C::request>>;
      { c.reduce_scatter(in, out, counts, op, s) } -> std::same_as<result<typename C::request>>;
      { c.all_gather(in, out, counts, s) } -> std::same_as<result<typename C::request>>;
      { c.broadcast(out, root, s) } -> std::same_as<result<typename C::request>>;
      { c.barrier(s) } -> std::same_as<result<typename C::request>>;
      { c.wait(r) } -> std::same_as<status>;
      { c.test(r) } -> std::same_as<result<bool>>;
      { cc.counters() } -> std::convertible_to<const coll_counters&>;
    };

// A collective over host memory (the drivers in coll/ that encode, decode
// and scale on the CPU need this).
template <class C>
concept host_collective = collective<C> && host_accessible_space<typename C::space>;

// Block offsets of uneven counts: displs[j] = Σ_{i<j} counts[i]; one more
// entry at the end holds the total.
// The second form fills `d` (no allocation once it has the capacity).
inline void displacements(std::span<const std::size_t> counts, std::vector<std::size_t>& d) {
  d.assign(counts.size() + 1, 0);
  for (std::size_t i = 0; i < counts.size(); ++i) d[i + 1] = d[i] + counts[i];
}
inline std::vector<std::size_t> displacements(std::span<const std::size_t> counts) {
  std::vector<std::size_t> d;
  displacements(counts, d);
  return d;
}

// The argument checks every model makes, with errors that name the field.
namespace detail {

template <memory_space S>
status check_allreduce(in_view<S> in, out_view<S> out) {
  if (in.size() != out.size()) return invalid_argument("allreduce.out.size", out.size(), "must equal in.size()");
  if (in.element_dtype() != out.element_dtype())
    return invalid_argument("allreduce.out.dtype", to_string(out.element_dtype()), "must equal in.dtype");
  return {};
}

template <memory_space S>
status check_reduce_scatter(in_view<S> in, out_view<S> out, std::span<const std::size_t> counts, rank_t rank,
                            rank_t size) {
  if (counts.size() != static_cast<std::size_t>(size))
    return invalid_argument("reduce_scatter.counts.size", counts.size(), "must equal the group size");
  std::size_t total = 0;
  for (auto n : counts) total += n;
  if (in.size() != total) return invalid_argument("reduce_scatter.in.size", in.size(), "must equal the sum of counts");
  if (out.size() != counts[static_cast<std::size_t>(rank)])
    return invalid_argument("reduce_scatter.out.size", out.size(), "must equal counts[rank]");
  if (in.element_dtype() != out.element_dtype())
    return invalid_argument("reduce_scatter.out.dtype", to_string(out.element_dtype()), "must equal in.dtype");
  return {};
}

template <memory_space S>
status check_all_gather(in_view<S> in, out_view<S> out, std::span<const std::size_t> counts, rank_t rank,
                        rank_t size) {
  if (counts.size() != static_cast<std::size_t>(size))
    return invalid_argument("all_gather.counts.size", counts.size(), "must equal the group size");
  std::size_t total = 0;
  for (auto n : counts) total += n;
  if (out.size() != total) return invalid_argument("all_gather.out.size", out.size(), "must equal the sum of counts");
  if (in.size() != counts[static_cast<std::size_t>(rank)])
    return invalid_argument("all_gather.in.size", in.size(), "must equal counts[rank]");
  if (in.element_dtype() != out.element_dtype())
    return invalid_argument("all_gather.out.dtype", to_string(out.element_dtype()), "must equal in.dtype");
  return {};
}

inline status check_root(rank_t root, rank_t size) {
  if (root < 0 || root >= size) return out_of_range("broadcast.root", root, "must be in [0, size)");
  return {};
}

}  // namespace detail

// Start and wait: the blocking form of any operation.
//   ASHL_TRY(coll::blocking(c, c.barrier(c.default_stream())));
template <collective C>
status blocking(C& c, result<typename C::request> r) {
  if (!r) return r.error();
  return c.wait(*r);
}

// Start-and-wait forms of allreduce and all-gather. A model may offer a
// blocking call of its engine (`allreduce_now`, `all_gather_now`: same
// arguments without the stream, returning status) when that is faster than
// starting and waiting: Open MPI's blocking collectives come from coll/tuned
// and its non-blocking ones from coll/libnbc, with other algorithms
// (docs/perf/coll.md). The drivers use these; models without them start and wait.
template <collective C>
status allreduce_now(C& c, in_view<typename C::space> in, out_view<typename C::space> out, reduce_op op) {
  if constexpr (requires { { c.allreduce_now(in, out, op) } -> std::same_as<status>; })
    return c.allreduce_now(in, out, op);
  else
    return blocking(c, c.allreduce(in, out, op, c.default_stream()));
}
template <collective C>
status all_gather_now(C& c, in_view<typename C::space> in, out_view<typename C::space> out,
                      std::span<const std::size_t> counts) {
  if constexpr (requires { { c.all_gather_now(in, out, counts) } -> std::same_as<status>; })
    return c.all_gather_now(in, out, counts);
  else
    return blocking(c, c.all_gather(in, out, counts, c.default_stream()));
}

}  // namespace coll
ASHL_NAMESPACE_END
