// ashl/coll/mpi.hpp — the collective concept over MPI, for host memory
// (ISSUE 14 item 2; docs/design.md "coll/"). Needs the ashl::mpi component
// (Debian OpenMPI 4.1, which itself runs over UCX, TCP or shared memory as
// its pml/btl are chosen at mpirun time).
//
//   ashl::coll::mpi_session session(&argc, &argv);           // MPI_Init_thread, finalized at scope end
//   auto c = ashl::coll::mpi::dup(MPI_COMM_WORLD);            // result<mpi>: own communicator
//   if (!c) return fail(c.error());
//   auto r = c->allreduce(cview(g), view(g), reduce_op::sum, {});   // MPI_Iallreduce, in place
//   ASHL_TRY(c->wait(*r));
//
// Each operation is one non-blocking MPI-3 call (MPI_Iallreduce,
// MPI_Ireduce_scatter, MPI_Iallgatherv, MPI_Ibcast, MPI_Ibarrier); the
// request owns the int count/displacement arrays MPI reads until completion.
// MPI has no 16-bit float types: f16 and bf16 travel as a 2-byte contiguous
// type with user-defined commutative ops (coll/detail/reduce.hpp: float
// adds, each partial rounded to the dtype). The communicator is duplicated
// and its error handler set to MPI_ERRORS_RETURN, so MPI failures come back
// as status values naming the call, never an abort. Counts above INT_MAX
// elements are refused (MPI's int counts). The model owns its communicator,
// types and ops: destroy it before MPI_Finalize (mpi_session's scope).
// Without the component (ASHL_HAS_MPI() is 0) the header is empty, as
// transport/ucx.hpp is without UCX.
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_MPI()
#include <ashl/coll/concepts.hpp>
#include <ashl/coll/detail/reduce.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>

// ashl uses MPI's C interface only; skip the deprecated C++ bindings (and their warnings).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace coll {

namespace detail {

inline status mpi_error(std::string_view call, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return make_error(errc::io_error, std::string("mpi.") + std::string(call), code, std::string_view(text, len));
}

template <class T, reduce_op Op>
void mpi_user_op(void* in, void* inout, int* len, MPI_Datatype*) {
  // MPI's contract: inout = in (op) inout.
  auto* a = static_cast<T*>(inout);
  const auto* b = static_cast<const T*>(in);
  for (int i = 0; i < *len; ++i) a[i] = reduce_one(Op, b[i], a[i]);
}

}  // namespace detail

// MPI_Init_thread (MPI_THREAD_FUNNELED) unless MPI is initialized already;
// MPI_Finalize at destruction when this object initialized it.
class mpi_session {
 public:
  mpi_session(int* argc, char*** argv) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
      owner_ = true;
    }
  }
  mpi_session(const mpi_session&) = delete;
  mpi_session& operator=(const mpi_session&) = delete;
  ~mpi_session() {
    if (!owner_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

 private:
  bool owner_ = false;
};

class mpi : public host_model {
 public:
  class request {
   public:
    request() = default;
    request(request&& o) noexcept
        : req_(std::exchange(o.req_, MPI_REQUEST_NULL)), counts_(std::move(o.counts_)),
          displs_(std::move(o.displs_)), pending_(std::exchange(o.pending_, false)), failed_(std::move(o.failed_)) {}
    request& operator=(request&& o) noexcept {
      req_ = std::exchange(o.req_, MPI_REQUEST_NULL);
      counts_ = std::move(o.counts_);  // the heap arrays MPI reads move with the vectors
      displs_ = std::move(o.displs_);
      pending_ = std::exchange(o.pending_, false);
      failed_ = std::move(o.failed_);
      return *this;
    }
    request(const request&) = delete;
    request& operator=(const request&) = delete;

   private:
    friend class mpi;
    MPI_Request req_ = MPI_REQUEST_NULL;
    std::vector<int> counts_, displs_;
    bool pending_ = false;
    status failed_;
  };

  // Duplicates `comm` (so ashl's traffic never matches the caller's) and owns the copy.
  static result<mpi> dup(MPI_Comm comm) {
    MPI_Comm c = MPI_COMM_NULL;
    if (int e = MPI_Comm_dup(comm, &c); e != MPI_SUCCESS) return detail::mpi_error("Comm_dup", e);
    return mpi(c);
  }
  // Splits `comm` by `color` (ranks ordered by `key`) and owns the part:
  // the local group of the hierarchical path (coll/hierarchical.hpp).
  static result<mpi> split(MPI_Comm comm, int color, int key) {
    MPI_Comm c = MPI_COMM_NULL;
    if (int e = MPI_Comm_split(comm, color, key, &c); e != MPI_SUCCESS) return detail::mpi_error("Comm_split", e);
    return mpi(c);
  }

  mpi(mpi&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), rank_(o.rank_), size_(o.size_),
        half_type_(std::exchange(o.half_type_, MPI_DATATYPE_NULL)), counters_(o.counters_) {
    for (int i = 0; i < 6; ++i) ops_[i] = std::exchange(o.ops_[i], MPI_OP_NULL);
  }
  mpi& operator=(mpi&&) = delete;
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  ~mpi() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& op : ops_)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
    if (half_type_ != MPI_DATATYPE_NULL) MPI_Type_free(&half_type_);
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  [[nodiscard]] rank_t rank() const noexcept { return rank_; }
  [[nodiscard]] rank_t size() const noexcept { return size_; }
  [[nodiscard]] host_stream default_stream() const noexcept { return {}; }
  [[nodiscard]] const coll_counters& counters() const noexcept { return counters_; }
  [[nodiscard]] MPI_Comm native() const noexcept { return comm_; }

  result<request> allreduce(in_view<> in, out_view<> out, reduce_op op, host_stream) {
    ASHL_TRY(refuse(detail::check_allreduce(in, out)));
    ASHL_TRY(refuse(check_count("allreduce.in.size", in.size())));
    ++counters_.allreduces;
    counters_.bytes_in += in.size_bytes();
    request r;
    const void* src = in.data() == out.data() ? MPI_IN_PLACE : in.data();
    ASHL_TRY(started(r, "Iallreduce",
                     MPI_Iallreduce(src, out.data(), static_cast<int>(in.size()), type(in.element_dtype()),
                                    mpi_op(in.element_dtype(), op), comm_, &r.req_)));
    return r;
  }

  result<request> reduce_scatter(in_view<> in, out_view<> out, std::span<const std::size_t> counts, reduce_op op,
                                 host_stream) {
    ASHL_TRY(refuse(detail::check_reduce_scatter(in, out, counts, rank_, size_)));
    ASHL_TRY(refuse(check_count("reduce_scatter.in.size", in.size())));
    ++counters_.reduce_scatters;
    counters_.bytes_in += in.size_bytes();
    request r;
    r.counts_.assign(counts.begin(), counts.end());
    ASHL_TRY(started(r, "Ireduce_scatter",
                     MPI_Ireduce_scatter(in.data(), out.data(), r.counts_.data(), type(in.element_dtype()),
                                         mpi_op(in.element_dtype(), op), comm_, &r.req_)));
    return r;
  }

  result<request> all_gather(in_view<> in, out_view<> out, std::span<const std::size_t> counts, host_stream) {
    ASHL_TRY(refuse(detail::check_all_gather(in, out, counts, rank_, size_)));
    ASHL_TRY(refuse(check_count("all_gather.out.size", out.size())));
    ++counters_.all_gathers;
    counters_.bytes_in += in.size_bytes();
    request r;
    const auto d = displacements(counts);
    r.counts_.assign(counts.begin(), counts.end());
    r.displs_.assign(d.begin(), d.end() - 1);
    const std::size_t es = size_of(in.element_dtype());
    const bool in_place = in.data() == static_cast<const std::byte*>(out.data()) + d[static_cast<std::size_t>(rank_)] * es;
    const MPI_Datatype t = type(in.element_dtype());
    ASHL_TRY(started(r, "Iallgatherv",
                     MPI_Iallgatherv(in_place ? MPI_IN_PLACE : in.data(), static_cast<int>(in.size()), t, out.data(),
                                     r.counts_.data(), r.displs_.data(), t, comm_, &r.req_)));
    return r;
  }

  result<request> broadcast(out_view<> buf, rank_t root, host_stream) {
    ASHL_TRY(refuse(detail::check_root(root, size_)));
    ASHL_TRY(refuse(check_count("broadcast.buf.size", buf.size())));
    ++counters_.broadcasts;
    counters_.bytes_in += buf.size_bytes();
    request r;
    ASHL_TRY(started(r, "Ibcast",
                     MPI_Ibcast(buf.data(), static_cast<int>(buf.size()), type(buf.element_dtype()), root, comm_,
                                &r.req_)));
    return r;
  }

  result<request> barrier(host_stream) {
    ++counters_.barriers;
    request r;
    ASHL_TRY(started(r, "Ibarrier", MPI_Ibarrier(comm_, &r.req_)));
    return r;
  }

  // Blocking forms (coll::allreduce_now / all_gather_now use them): MPI_Allreduce
  // and MPI_Allgatherv, whose Open MPI algorithms (coll/tuned) beat the
  // non-blocking ones (coll/libnbc) on large buffers; docs/perf/coll.md.
  status allreduce_now(in_view<> in, out_view<> out, reduce_op op) {
    ASHL_TRY(refuse(detail::check_allreduce(in, out)));
    ASHL_TRY(refuse(check_count("allreduce.in.size", in.size())));
    ++counters_.allreduces;
    counters_.bytes_in += in.size_bytes();
    const void* src = in.data() == out.data() ? MPI_IN_PLACE : in.data();
    return finished("Allreduce", MPI_Allreduce(src, out.data(), static_cast<int>(in.size()), type(in.element_dtype()),
                                               mpi_op(in.element_dtype(), op), comm_));
  }

  status all_gather_now(in_view<> in, out_view<> out, std::span<const std::size_t> counts) {
    ASHL_TRY(refuse(detail::check_all_gather(in, out, counts, rank_, size_)));
    ASHL_TRY(refuse(check_count("all_gather.out.size", out.size())));
    ++counters_.all_gathers;
    counters_.bytes_in += in.size_bytes();
    const auto d = displacements(counts);
    scratch_counts_.assign(counts.begin(), counts.end());
    scratch_displs_.assign(d.begin(), d.end() - 1);
    const std::size_t es = size_of(in.element_dtype());
    const bool in_place = in.data() == static_cast<const std::byte*>(out.data()) + d[static_cast<std::size_t>(rank_)] * es;
    const MPI_Datatype t = type(in.element_dtype());
    return finished("Allgatherv", MPI_Allgatherv(in_place ? MPI_IN_PLACE : in.data(), static_cast<int>(in.size()), t,
                                                 out.data(), scratch_counts_.data(), scratch_displs_.data(), t, comm_));
  }

  status wait(request& r) {
    if (!r.pending_) return r.failed_;
    r.pending_ = false;
    if (int e = MPI_Wait(&r.req_, MPI_STATUS_IGNORE); e != MPI_SUCCESS) {
      ++counters_.errors;
      r.failed_ = detail::mpi_error("Wait", e);
    }
    return r.failed_;
  }

  result<bool> test(request& r) {
    if (!r.pending_) {
      if (!r.failed_.ok()) return r.failed_;
      return true;
    }
    int flag = 0;
    if (int e = MPI_Test(&r.req_, &flag, MPI_STATUS_IGNORE); e != MPI_SUCCESS) {
      ++counters_.errors;
      r.pending_ = false;
      r.failed_ = detail::mpi_error("Test", e);
      return r.failed_;
    }
    if (flag) r.pending_ = false;
    return flag != 0;
  }

 private:
  explicit mpi(MPI_Comm c) : comm_(c) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Type_contiguous(2, MPI_BYTE, &half_type_);
    MPI_Type_commit(&half_type_);
    MPI_Op_create(&detail::mpi_user_op<half, reduce_op::sum>, 1, &ops_[0]);
    MPI_Op_create(&detail::mpi_user_op<half, reduce_op::max>, 1, &ops_[1]);
    MPI_Op_create(&detail::mpi_user_op<half, reduce_op::min>, 1, &ops_[2]);
    MPI_Op_create(&detail::mpi_user_op<bfloat16, reduce_op::sum>, 1, &ops_[3]);
    MPI_Op_create(&detail::mpi_user_op<bfloat16, reduce_op::max>, 1, &ops_[4]);
    MPI_Op_create(&detail::mpi_user_op<bfloat16, reduce_op::min>, 1, &ops_[5]);
  }

  status refuse(status s) {
    if (!s.ok()) ++counters_.errors;
    return s;
  }
  static status check_count(std::string_view field, std::size_t n) {
    if (n > static_cast<std::size_t>(INT_MAX)) return out_of_range(field, n, "MPI counts are int: at most INT_MAX");
    return {};
  }
  status finished(std::string_view call, int e) {
    if (e == MPI_SUCCESS) return {};
    ++counters_.errors;
    return detail::mpi_error(call, e);
  }
  status started(request& r, std::string_view call, int e) {
    if (e != MPI_SUCCESS) {
      ++counters_.errors;
      return detail::mpi_error(call, e);
    }
    r.pending_ = true;
    return {};
  }

  MPI_Datatype type(dtype t) const noexcept {
    switch (t) {
      case dtype::f32: return MPI_FLOAT;
      case dtype::f64: return MPI_DOUBLE;
      case dtype::i8: return MPI_INT8_T;
      case dtype::u8: return MPI_UINT8_T;
      case dtype::f16:
      case dtype::bf16: return half_type_;
    }
    return MPI_BYTE;
  }
  MPI_Op mpi_op(dtype t, reduce_op op) const noexcept {
    const int k = static_cast<int>(op);
    if (t == dtype::f16) return ops_[k];
    if (t == dtype::bf16) return ops_[3 + k];
    switch (op) {
      case reduce_op::sum: return MPI_SUM;
      case reduce_op::max: return MPI_MAX;
      case reduce_op::min: return MPI_MIN;
    }
    return MPI_SUM;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  MPI_Datatype half_type_ = MPI_DATATYPE_NULL;
  MPI_Op ops_[6] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  coll_counters counters_{};
  std::vector<int> scratch_counts_, scratch_displs_;  // of the blocking all-gather
};

static_assert(collective<mpi>);
static_assert(host_collective<mpi>);

}  // namespace coll
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_MPI()
