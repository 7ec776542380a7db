// ashl/coll/detail/reduce.hpp — elementwise reduction of one dtype, shared
// by the host models: coll/inproc.hpp (the reference) and coll/mpi.hpp (its
// user-defined MPI ops for f16 and bf16, which MPI has no type for).
//
//   coll::detail::reduce_into(dtype::f16, reduce_op::sum, acc, in, n);   // acc[i] = acc[i] + in[i]
//
// 16-bit values are added in float and each partial result is rounded back
// to the dtype (what NCCL does), so a reduction of k inputs rounds k−1 times.
// Integers wrap (two's complement), as MPI's do.
#pragma once

#include <ashl/config.hpp>
#include <ashl/coll/concepts.hpp>
#include <ashl/core/dtype.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

ASHL_NAMESPACE_BEGIN
namespace coll::detail {

template <class T>
T reduce_one(reduce_op op, T a, T b) noexcept {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    const float x = a.to_float(), y = b.to_float();
    switch (op) {
      case reduce_op::sum: return T::from_float(x + y);
      case reduce_op::max: return y > x ? b : a;
      case reduce_op::min: return y < x ? b : a;
    }
    return a;
  } else {
    switch (op) {
      case reduce_op::sum: return static_cast<T>(a + b);
      case reduce_op::max: return std::max(a, b);
      case reduce_op::min: return std::min(a, b);
    }
    return a;
  }
}

template <class T>
void reduce_typed(reduce_op op, T* acc, const T* in, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) acc[i] = reduce_one(op, acc[i], in[i]);
}

// acc[i] = acc[i] (op) in[i] for n elements of dtype t.
inline void reduce_into(dtype t, reduce_op op, void* acc, const void* in, std::size_t n) noexcept {
  switch (t) {
    case dtype::f32: reduce_typed(op, static_cast<float*>(acc), static_cast<const float*>(in), n); return;
    case dtype::f64: reduce_typed(op, static_cast<double*>(acc), static_cast<const double*>(in), n); return;
    case dtype::f16: reduce_typed(op, static_cast<half*>(acc), static_cast<const half*>(in), n); return;
    case dtype::bf16: reduce_typed(op, static_cast<bfloat16*>(acc), static_cast<const bfloat16*>(in), n); return;
    case dtype::i8:
      reduce_typed(op, static_cast<std::int8_t*>(acc), static_cast<const std::int8_t*>(in), n);
      return;
    case dtype::u8:
      reduce_typed(op, static_cast<std::uint8_t*>(acc), static_cast<const std::uint8_t*>(in), n);
      return;
  }
}

}  // namespace coll::detail
ASHL_NAMESPACE_END
