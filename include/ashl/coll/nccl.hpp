// ashl/coll/nccl.hpp — the collective concept (coll/concepts.hpp) over NCCL,
// for device memory, stream-ordered (docs/design.md, "Layers";
// docs/gpu-workers.md, "NCCL").
//
//   // The unique id comes from one rank and reaches the others through MPI
//   // or the job's launcher (never a shared file):
//   auto c = ashl::coll::nccl::create_mpi(MPI_COMM_WORLD, /*device=*/local_rank);
//   // or: rank 0: id = *ashl::coll::nccl_new_unique_id(); hand nccl_id_to_hex(id) to the others
//   //     every rank: c = ashl::coll::nccl::create(id, rank, size, device);
//   ashl::coll::in_view<ashl::device_space> in(d_grad, n, ashl::dtype::f32);
//   ashl::coll::out_view<ashl::device_space> out(d_grad, n, ashl::dtype::f32);
//   auto r = c->allreduce(in, out, ashl::coll::reduce_op::sum, stream);   // enqueued on `stream`
//   next_kernel<<<g, b, 0, stream>>>(d_grad);                          // sees the sum: stream order
//   ASHL_TRY(c->wait(*r));                                              // host waits only if it must
//
// Equal counts use ncclReduceScatter / ncclAllGather; uneven counts (zeros
// included) are one NCCL group of ncclReduce (reduce-scatter) or
// ncclBroadcast (all-gather) calls, one per rank that owns a non-empty
// block. barrier is a one-element allreduce on the stream: it completes on
// the stream when every rank reached it. A request is a CUDA event recorded
// after the operation: wait() synchronizes that event only (never the
// device), test() queries it; both also report NCCL's asynchronous error.
// Events come from a pool of the communicator's (a request gives its event
// back when done or destroyed), so steady state creates none; the
// communicator must outlive its requests, and one thread uses it at a time
// (as NCCL requires of a communicator).
//
// Without NCCL (ASHL_HAS_NCCL() == 0) only the unique-id value type and its
// hex form are here, so launchers and the parameter server's side can carry
// an id without linking NCCL. With MPI (ASHL_HAS_MPI()) the id is broadcast
// from a root with MPI_Bcast.
#pragma once

#include <ashl/config.hpp>
#include <ashl/coll/concepts.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/memory_space.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#if ASHL_HAS_NCCL()
#include <cuda_runtime.h>
#include <nccl.h>
#endif
#if ASHL_HAS_MPI()
#include <mpi.h>
#endif

ASHL_NAMESPACE_BEGIN
namespace coll {

// ncclUniqueId's 128 bytes (NCCL_UNIQUE_ID_BYTES), as a value type that
// needs no NCCL header.
struct nccl_unique_id {
  static constexpr std::size_t bytes = 128;
  std::array<std::byte, bytes> data{};
  friend bool operator==(const nccl_unique_id&, const nccl_unique_id&) = default;
};

// 256 lowercase hex digits: the form an environment variable or a launcher
// command line carries.
inline std::string nccl_id_to_hex(const nccl_unique_id& id) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(2 * nccl_unique_id::bytes, '0');
  for (std::size_t i = 0; i < nccl_unique_id::bytes; ++i) {
    const auto b = std::to_integer<unsigned>(id.data[i]);
    s[2 * i] = digits[b >> 4];
    s[2 * i + 1] = digits[b & 0xfu];
  }
  return s;
}

inline result<nccl_unique_id> nccl_id_from_hex(std::string_view s) {
  if (s.size() != 2 * nccl_unique_id::bytes)
    return invalid_argument("nccl_id.hex.size", s.size(), "must be 256 hex digits (128 bytes)");
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  nccl_unique_id id;
  for (std::size_t i = 0; i < nccl_unique_id::bytes; ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return invalid_argument("nccl_id.hex", "position " + std::to_string(hi < 0 ? 2 * i : 2 * i + 1),
                              "not a hex digit");
    id.data[i] = static_cast<std::byte>(hi * 16 + lo);
  }
  return id;
}

#if ASHL_HAS_MPI()
// Root's id into every rank's `id` (MPI_Bcast of the 128 bytes).
inline status broadcast_nccl_id(nccl_unique_id& id, int root, MPI_Comm comm) {
  const int rc = MPI_Bcast(id.data.data(), static_cast<int>(nccl_unique_id::bytes), MPI_BYTE, root, comm);
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return make_error(errc::unavailable, "nccl_id.MPI_Bcast", rc, std::string(text, static_cast<std::size_t>(len)));
  }
  return {};
}
#endif

#if ASHL_HAS_NCCL()

namespace detail {

// Completion events, reused: created on first need, destroyed with the pool.
struct nccl_event_pool {
  std::vector<cudaEvent_t> free;
  nccl_event_pool() = default;
  nccl_event_pool(const nccl_event_pool&) = delete;
  nccl_event_pool& operator=(const nccl_event_pool&) = delete;
  ~nccl_event_pool() {
    for (cudaEvent_t e : free) (void)cudaEventDestroy(e);
  }
};

inline status nccl_error(const char* call, ncclResult_t r) {
  return make_error(errc::unavailable, std::string("nccl.") + call, static_cast<int>(r), ncclGetErrorString(r));
}
inline status nccl_cuda_error(const char* call, cudaError_t e) {
  return make_error(errc::unavailable, std::string("nccl.") + call, static_cast<int>(e), cudaGetErrorString(e));
}

inline result<ncclDataType_t> nccl_type(dtype t, const char* field) {
  switch (t) {
    case dtype::f32: return ncclFloat32;
    case dtype::f16: return ncclFloat16;
    case dtype::bf16: return ncclBfloat16;
    case dtype::f64: return ncclFloat64;
    case dtype::i8: return ncclInt8;
    case dtype::u8: return ncclUint8;
  }
  return invalid_argument(field, static_cast<int>(t), "not a dtype NCCL reduces");
}

inline ncclRedOp_t nccl_op(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
    case reduce_op::sum: break;
  }
  return ncclSum;
}

// Byte ranges [a, a + an) and [b, b + bn) share a byte.
inline bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) noexcept {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return an != 0 && bn != 0 && x < y + bn && y < x + an;
}

}  // namespace detail

inline result<nccl_unique_id> nccl_new_unique_id() {
  ncclUniqueId raw;
  if (const ncclResult_t r = ncclGetUniqueId(&raw); r != ncclSuccess) return detail::nccl_error("ncclGetUniqueId", r);
  static_assert(sizeof(raw) == nccl_unique_id::bytes);
  nccl_unique_id id;
  std::memcpy(id.data.data(), &raw, sizeof raw);
  return id;
}

class nccl {
 public:
  using collective_concept = collective_tag;
  using space = device_space;
  using stream_type = cudaStream_t;

  // The completion of one operation: a CUDA event recorded on its stream.
  class request {
   public:
    request() = default;
    request(request&& o) noexcept : event_(std::exchange(o.event_, nullptr)), comm_(o.comm_), pool_(o.pool_) {}
    request& operator=(request&& o) noexcept {
      if (this != &o) {
        release();
        event_ = std::exchange(o.event_, nullptr);
        comm_ = o.comm_;
        pool_ = o.pool_;
      }
      return *this;
    }
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() { release(); }
    // The event, for cudaStreamWaitEvent on another stream (null once done).
    [[nodiscard]] cudaEvent_t event() const noexcept { return event_; }

   private:
    friend class nccl;
    request(cudaEvent_t e, ncclComm_t c, detail::nccl_event_pool* p) noexcept : event_(e), comm_(c), pool_(p) {}
    // Back to the pool (re-recording it later is stream-ordered; nobody
    // waits on a released request's event).
    void release() noexcept {
      if (event_ == nullptr) return;
      pool_->free.push_back(event_);
      event_ = nullptr;
    }
    cudaEvent_t event_ = nullptr;
    ncclComm_t comm_ = nullptr;
    detail::nccl_event_pool* pool_ = nullptr;
  };

  // Joins the group `id` names as `rank` of `size`, on CUDA device `device`
  // (made current on the calling thread). Every rank calls it with the
  // same id and size.
  static result<nccl> create(const nccl_unique_id& id, rank_t rank, rank_t size, int device) {
    if (size < 1) return invalid_argument("nccl.size", size, "must be >= 1");
    if (rank < 0 || rank >= size) return out_of_range("nccl.rank", rank, "must be in [0, size)");
    if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
      return detail::nccl_cuda_error("cudaSetDevice", e);
    ncclUniqueId raw;
    std::memcpy(&raw, id.data.data(), sizeof raw);
    nccl c;
    c.rank_ = rank;
    c.size_ = size;
    c.device_ = device;
    if (const ncclResult_t r = ncclCommInitRank(&c.comm_, size, raw, rank); r != ncclSuccess) {
      c.comm_ = nullptr;  // not a communicator to destroy
      return detail::nccl_error("ncclCommInitRank", r);
    }
    if (const cudaError_t e = cudaMalloc(&c.barrier_word_, sizeof(float)); e != cudaSuccess)
      return detail::nccl_cuda_error("cudaMalloc(barrier)", e);
    if (const cudaError_t e = cudaMemset(c.barrier_word_, 0, sizeof(float)); e != cudaSuccess)
      return detail::nccl_cuda_error("cudaMemset(barrier)", e);
    return c;
  }

  // A group of one (the tests, and a single-GPU worker).
  static result<nccl> create_single(int device) {
    if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
      return detail::nccl_cuda_error("cudaSetDevice", e);
    auto id = nccl_new_unique_id();
    if (!id) return id.error();
    return create(*id, 0, 1, device);
  }

#if ASHL_HAS_MPI()
  // Every rank of `comm` joins one NCCL group with the same ranks; rank 0
  // makes the id and MPI broadcasts it.
  static result<nccl> create_mpi(MPI_Comm comm, int device) {
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    nccl_unique_id id;
    status made;
    if (rank == 0) {
      if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
        made = detail::nccl_cuda_error("cudaSetDevice", e);
      } else if (auto fresh = nccl_new_unique_id(); fresh) {
        id = *fresh;
      } else {
        made = fresh.error();
      }
    }
    // Broadcast even on failure (an all-zero id), so no rank hangs in MPI;
    // NCCL then refuses the zero id on every rank.
    ASHL_TRY(broadcast_nccl_id(id, 0, comm));
    if (!made.ok()) return made;
    return create(id, rank, size, device);
  }
#endif

  nccl() = default;
  nccl(nccl&& o) noexcept { *this = std::move(o); }
  nccl& operator=(nccl&& o) noexcept {
    if (this != &o) {
      destroy();
      comm_ = std::exchange(o.comm_, nullptr);
      barrier_word_ = std::exchange(o.barrier_word_, nullptr);
      events_ = std::move(o.events_);
      rank_ = o.rank_;
      size_ = o.size_;
      device_ = o.device_;
      counters_ = o.counters_;
    }
    return *this;
  }
  nccl(const nccl&) = delete;
  nccl& operator=(const nccl&) = delete;
  ~nccl() { destroy(); }

  [[nodiscard]] rank_t rank() const noexcept { return rank_; }
  [[nodiscard]] rank_t size() const noexcept { return size_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  // The legacy default stream; pass the training step's stream instead.
  [[nodiscard]] stream_type default_stream() const noexcept { return nullptr; }
  [[nodiscard]] const coll_counters& counters() const noexcept { return counters_; }
  [[nodiscard]] ncclComm_t native_handle() const noexcept { return comm_; }

  result<request> allreduce(in_view<space> in, out_view<space> out, reduce_op op, stream_type s) {
    ASHL_TRY(counted(detail::check_allreduce(in, out)));
    if (in.data() != out.data() && detail::overlaps(in.data(), in.size_bytes(), out.data(), out.size_bytes()))
      return counted(invalid_argument("allreduce.out", "overlap", "in and out must be the same buffer or disjoint"));
    auto t = detail::nccl_type(in.element_dtype(), "allreduce.in.dtype");
    if (!t) return counted(t.error());
    ++counters_.allreduces;
    counters_.bytes_in += in.size_bytes();
    if (in.size() != 0)
      ASHL_TRY(counted(call("ncclAllReduce",
                            ncclAllReduce(in.data(), out.data(), in.size(), *t, detail::nccl_op(op), comm_, s))));
    return completion(s);
  }

  result<request> reduce_scatter(in_view<space> in, out_view<space> out, std::span<const std::size_t> counts,
                                 reduce_op op, stream_type s) {
    ASHL_TRY(counted(detail::check_reduce_scatter(in, out, counts, rank_, size_)));
    if (detail::overlaps(in.data(), in.size_bytes(), out.data(), out.size_bytes()))
      return counted(invalid_argument("reduce_scatter.out", "overlap", "in and out must be disjoint"));
    auto t = detail::nccl_type(in.element_dtype(), "reduce_scatter.in.dtype");
    if (!t) return counted(t.error());
    ++counters_.reduce_scatters;
    counters_.bytes_in += in.size_bytes();
    const std::size_t es = size_of(in.element_dtype());
    if (equal(counts)) {
      if (counts[0] != 0)
        ASHL_TRY(counted(call("ncclReduceScatter", ncclReduceScatter(in.data(), out.data(), counts[0], *t,
                                                                      detail::nccl_op(op), comm_, s))));
      return completion(s);
    }
    const auto displs = displacements(counts);
    ASHL_TRY(counted(call("ncclGroupStart", ncclGroupStart())));
    status st;
    for (rank_t r = 0; r < size_ && st.ok(); ++r) {
      const auto ur = static_cast<std::size_t>(r);
      if (counts[ur] == 0) continue;
      const auto* src = static_cast<const std::byte*>(in.data()) + displs[ur] * es;
      (void)(st = call("ncclReduce", ncclReduce(src, r == rank_ ? out.data() : nullptr, counts[ur], *t,
                                                 detail::nccl_op(op), r, comm_, s)));
    }
    const status end = call("ncclGroupEnd", ncclGroupEnd());
    ASHL_TRY(counted(st));
    ASHL_TRY(counted(end));
    return completion(s);
  }

  result<request> all_gather(in_view<space> in, out_view<space> out, std::span<const std::size_t> counts,
                             stream_type s) {
    ASHL_TRY(counted(detail::check_all_gather(in, out, counts, rank_, size_)));
    const auto displs = displacements(counts);
    const std::size_t es = size_of(in.element_dtype());
    auto* own = static_cast<std::byte*>(out.data()) + displs[static_cast<std::size_t>(rank_)] * es;
    if (in.data() != own && detail::overlaps(in.data(), in.size_bytes(), out.data(), out.size_bytes()))
      return counted(invalid_argument("all_gather.in", "overlap",
                                      "in must be the rank's own block of out or disjoint from out"));
    auto t = detail::nccl_type(in.element_dtype(), "all_gather.in.dtype");
    if (!t) return counted(t.error());
    ++counters_.all_gathers;
    counters_.bytes_in += in.size_bytes();
    if (equal(counts)) {
      if (counts[0] != 0)
        ASHL_TRY(counted(call("ncclAllGather", ncclAllGather(in.data(), out.data(), counts[0], *t, comm_, s))));
      return completion(s);
    }
    ASHL_TRY(counted(call("ncclGroupStart", ncclGroupStart())));
    status st;
    for (rank_t r = 0; r < size_ && st.ok(); ++r) {
      const auto ur = static_cast<std::size_t>(r);
      if (counts[ur] == 0) continue;
      auto* dst = static_cast<std::byte*>(out.data()) + displs[ur] * es;
      (void)(st = call("ncclBroadcast", ncclBroadcast(r == rank_ ? in.data() : dst, dst, counts[ur], *t, r, comm_, s)));
    }
    const status end = call("ncclGroupEnd", ncclGroupEnd());
    ASHL_TRY(counted(st));
    ASHL_TRY(counted(end));
    return completion(s);
  }

  result<request> broadcast(out_view<space> buf, rank_t root, stream_type s) {
    ASHL_TRY(counted(detail::check_root(root, size_)));
    auto t = detail::nccl_type(buf.element_dtype(), "broadcast.buf.dtype");
    if (!t) return counted(t.error());
    ++counters_.broadcasts;
    counters_.bytes_in += buf.size_bytes();
    if (buf.size() != 0)
      ASHL_TRY(counted(call("ncclBroadcast", ncclBroadcast(buf.data(), buf.data(), buf.size(), *t, root, comm_, s))));
    return completion(s);
  }

  result<request> barrier(stream_type s) {
    ++counters_.barriers;
    ASHL_TRY(counted(call("ncclAllReduce(barrier)",
                          ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclSum, comm_, s))));
    return completion(s);
  }

  status wait(request& r) {
    if (r.event_ == nullptr) return {};
    if (const cudaError_t e = cudaEventSynchronize(r.event_); e != cudaSuccess)
      return counted(detail::nccl_cuda_error("cudaEventSynchronize", e));
    r.release();
    return async_error(r.comm_);
  }

  result<bool> test(request& r) {
    if (r.event_ == nullptr) return true;
    const cudaError_t e = cudaEventQuery(r.event_);
    if (e == cudaErrorNotReady) {
      ASHL_TRY(async_error(r.comm_));
      return false;
    }
    if (e != cudaSuccess) return counted(detail::nccl_cuda_error("cudaEventQuery", e));
    r.release();
    ASHL_TRY(async_error(r.comm_));
    return true;
  }

 private:
  static bool equal(std::span<const std::size_t> counts) noexcept {
    for (auto c : counts)
      if (c != counts[0]) return false;
    return true;
  }

  static status call(const char* what, ncclResult_t r) {
    return r == ncclSuccess ? status{} : detail::nccl_error(what, r);
  }

  status counted(status s) {
    if (!s.ok()) ++counters_.errors;
    return s;
  }

  status async_error(ncclComm_t c) {
    ncclResult_t a = ncclSuccess;
    if (c == nullptr) return {};
    if (const ncclResult_t r = ncclCommGetAsyncError(c, &a); r != ncclSuccess)
      return counted(detail::nccl_error("ncclCommGetAsyncError", r));
    return a == ncclSuccess ? status{} : counted(detail::nccl_error("async", a));
  }

  // The operation's completion: an event recorded after it on `s`.
  result<request> completion(stream_type s) {
    cudaEvent_t e = nullptr;
    if (!events_->free.empty()) {
      e = events_->free.back();
      events_->free.pop_back();
    } else if (const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); err != cudaSuccess) {
      return counted(detail::nccl_cuda_error("cudaEventCreate", err));
    }
    if (const cudaError_t err = cudaEventRecord(e, s); err != cudaSuccess) {
      events_->free.push_back(e);
      return counted(detail::nccl_cuda_error("cudaEventRecord", err));
    }
    return request(e, comm_, events_.get());
  }

  void destroy() noexcept {
    if (barrier_word_ != nullptr) (void)cudaFree(barrier_word_);
    barrier_word_ = nullptr;
    if (comm_ != nullptr) (void)ncclCommDestroy(comm_);
    comm_ = nullptr;
  }

  ncclComm_t comm_ = nullptr;
  void* barrier_word_ = nullptr;
  std::unique_ptr<detail::nccl_event_pool> events_ = std::make_unique<detail::nccl_event_pool>();
  rank_t rank_ = 0, size_ = 1;
  int device_ = 0;
  coll_counters counters_{};
};

static_assert(collective<nccl>);

#endif  // ASHL_HAS_NCCL()

}  // namespace coll
ASHL_NAMESPACE_END
