// ashl/compress/cuda/dispatch/common.cuh — what every device codec shares:
// CUDA errors as ashl::status, the device report, scratch carving, and the
// element bit views kernels use.
//
//   ASHL_TRY(detail::cuda_check(cudaMemsetAsync(p, 0, 8, stream), "topk.memset"));
//   detail::scratch_carver c(d_scratch);              // nullptr: size query
//   auto* hist = c.take<std::uint32_t>(2048);
//   if (d_scratch == nullptr) { scratch_bytes = c.bytes(); return {}; }
//
// The device codecs follow CUB's two-call scratch pattern: a call
// with d_scratch == nullptr only writes scratch_bytes; the same call with a
// buffer of that size runs. Nothing here synchronizes the host or allocates,
// so every entry point can be captured into a CUDA graph. Checks that need the
// data (strict overflow, a malformed payload) cannot return a status without
// a host sync; they leave their verdict in a caller-owned device_report the
// caller reads when it synchronizes anyway. Every file under dispatch/ but
// tuning/ includes this one, and its nvcc check stands for theirs.
// docs/algorithms.md §4.
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/*.cuh needs nvcc (CUDA C++); include the CPU codecs from ashl/compress/ instead"
#endif

#include <ashl/config.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda {

// What a device-side check found. `fault` is 0 when all is well; otherwise one
// of device_fault (the first fault recorded wins when several occur). `index`
// is the smallest element (encode) or pair (decode) index that failed the
// check, or ~0 when the fault is not about one element. A caller passes a
// device pointer to one of these; the entry point clears it on the stream
// first, so it reads the verdict of that call after its next synchronization.
struct device_report {
  std::uint32_t fault;
  std::uint32_t reserved;
  std::uint64_t index;
};

enum class device_fault : std::uint32_t {
  none = 0,
  overflow = 1,              // strict cast: a finite input rounded to +-inf
  payload_n = 2,             // sparse payload: n differs from info.count
  payload_count = 3,         // sparse payload: count > n, or 0 for a non-empty tensor
  payload_bytes = 4,         // sparse payload: size is not 12 + count * (4 + value bytes)
  index_out_of_range = 5,    // sparse payload: index >= n
  index_not_increasing = 6,  // sparse payload: index <= the previous one
  nonfinite_input = 7,       // quantizer encode: a bucket (index) or the tensor (~0) has a non-finite scale
  payload_field = 8,         // dense payload: a header field (bucket, levels, emin, flags) out of range
  payload_scale = 9,         // dense payload: scale of bucket `index` is not finite and >= 0
  payload_code = 10,         // dense payload: code of element `index` is not a valid code
  payload_padding = 11,      // dense payload: unused bits of the last byte are not 0
};

constexpr std::string_view to_string(device_fault f) noexcept {
  switch (f) {
    case device_fault::none: return "none";
    case device_fault::overflow: return "overflow";
    case device_fault::payload_n: return "payload_n";
    case device_fault::payload_count: return "payload_count";
    case device_fault::payload_bytes: return "payload_bytes";
    case device_fault::index_out_of_range: return "index_out_of_range";
    case device_fault::index_not_increasing: return "index_not_increasing";
    case device_fault::nonfinite_input: return "nonfinite_input";
    case device_fault::payload_field: return "payload_field";
    case device_fault::payload_scale: return "payload_scale";
    case device_fault::payload_code: return "payload_code";
    case device_fault::payload_padding: return "payload_padding";
  }
  return "?";
}

namespace detail {

// A CUDA runtime error as a status naming the call site.
inline status cuda_check(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return {};
  return make_error(errc::unavailable, what, cudaGetErrorName(e), cudaGetErrorString(e));
}

// Carves aligned pieces out of one scratch buffer; with a null base it only
// counts, so the size query and the run share one layout.
class scratch_carver {
 public:
  static constexpr std::size_t alignment = 256;  // what cudaMalloc gives and CUB expects
  explicit scratch_carver(void* base) noexcept : base_(static_cast<std::byte*>(base)) {}

  template <class T>
  T* take(std::size_t count) noexcept {
    std::byte* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += (count * sizeof(T) + alignment - 1) / alignment * alignment;
    return reinterpret_cast<T*>(p);
  }
  // A piece of `bytes` raw bytes (for CUB's own temporary storage).
  void* take_bytes(std::size_t bytes) noexcept { return take<std::byte>(bytes == 0 ? 1 : bytes); }
  [[nodiscard]] std::size_t bytes() const noexcept { return used_; }

 private:
  std::byte* base_;
  std::size_t used_ = 0;
};

// The two-call protocol in one place: a size query stores the size, a run
// checks the buffer is large enough. Returns true when the call should go on.
inline result<bool> scratch_protocol(std::string_view codec, void* d_scratch, std::size_t& scratch_bytes,
                                     std::size_t needed) {
  if (d_scratch == nullptr) {
    scratch_bytes = needed;
    return false;
  }
  if (scratch_bytes < needed)
    return make_error(errc::buffer_too_small, std::string(codec) + ".scratch_bytes", scratch_bytes,
                      "fewer than the size query's " + std::to_string(needed));
  return true;
}

inline status check_alignment(std::string_view field, const void* p, std::size_t align) {
  if (reinterpret_cast<std::uintptr_t>(p) % align != 0)
    return invalid_argument(field, reinterpret_cast<std::uintptr_t>(p),
                            "device payload buffers must be " + std::to_string(align) + "-byte aligned");
  return {};
}

// Device view of an element's bits, mirroring compress/detail/elements.hpp.
template <class T>
using device_bits_t = std::conditional_t<std::is_same_v<T, float>, std::uint32_t, std::uint16_t>;

template <class T>
__device__ __forceinline__ device_bits_t<T> bits_of(T v) noexcept {
  if constexpr (std::is_same_v<T, float>)
    return __float_as_uint(v);
  else
    return v.bits;
}

// |x| as an orderable key (sign cleared); NaN sorts above +inf, as on the CPU.
template <class T>
__device__ __forceinline__ std::uint32_t magnitude_key(T v) noexcept {
  if constexpr (std::is_same_v<T, float>)
    return __float_as_uint(v) & 0x7fffffffu;
  else
    return static_cast<std::uint32_t>(v.bits & 0x7fffu);
}

// A payload value of dtype `t` as float. Exact; the same bits as the CPU's
// load_value_le (core/dtype conversions, which the CPU codec tests tie to it).
template <dtype Type>
__device__ __forceinline__ float payload_value(const std::byte* values, std::size_t i) noexcept {
  if constexpr (Type == dtype::f32) {
    return reinterpret_cast<const float*>(values)[i];
  } else if constexpr (Type == dtype::f16) {
    return ::ashl::detail::f16_bits_to_f32(reinterpret_cast<const std::uint16_t*>(values)[i]);
  } else {
    return ::ashl::detail::bf16_bits_to_f32(reinterpret_cast<const std::uint16_t*>(values)[i]);
  }
}

// acc + scale * v with one rounding per operation, never contracted to an
// FMA: the CPU decoders round twice, and decode must agree bit for bit.
__device__ __forceinline__ float scaled_add(float acc, float scale, float v) noexcept {
  return __fadd_rn(acc, __fmul_rn(scale, v));
}

// The first fault kind recorded wins; `index` is the smallest among the
// reports of that kind only, so it always belongs to the recorded fault.
__device__ __forceinline__ void report_fault(device_report* r, device_fault f, std::uint64_t index) noexcept {
  if (r == nullptr) return;
  const std::uint32_t code = static_cast<std::uint32_t>(f);
  const std::uint32_t old = atomicCAS(&r->fault, 0u, code);
  if (old == 0u || old == code)
    atomicMin(reinterpret_cast<unsigned long long*>(&r->index), static_cast<unsigned long long>(index));
}

// Little-endian scalar loads and stores at any byte offset (randomk's header
// is 21 bytes, so its values are not aligned). The device is little-endian.
template <class U>
__device__ __forceinline__ U load_unaligned(const std::byte* p) noexcept {
  U v = 0;
  for (unsigned b = 0; b < sizeof(U); ++b) v |= static_cast<U>(static_cast<U>(static_cast<unsigned char>(p[b])) << (8 * b));
  return v;
}
template <class U>
__device__ __forceinline__ void store_unaligned(std::byte* p, U v) noexcept {
  for (unsigned b = 0; b < sizeof(U); ++b) p[b] = static_cast<std::byte>(static_cast<unsigned char>(v >> (8 * b)));
}

// An element as float, exactly (f16/bf16 widened with core/dtype's bits,
// which equal compress/detail's as_float).
template <class T>
__device__ __forceinline__ float element_float(T v) noexcept {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, half>)
    return ::ashl::detail::f16_bits_to_f32(v.bits);
  else
    return ::ashl::detail::bf16_bits_to_f32(v.bits);
}

inline status clear_report(device_report* r, cudaStream_t stream, std::string_view codec) {
  if (r == nullptr) return {};
  // fault = 0, index = ~0 (so atomicMin finds the smallest failing index).
  ASHL_TRY(cuda_check(cudaMemsetAsync(r, 0, sizeof(std::uint64_t), stream), std::string(codec) + ".report"));
  return cuda_check(cudaMemsetAsync(&r->index, 0xff, sizeof(std::uint64_t), stream), std::string(codec) + ".report");
}

// Writes up to four little-endian u32 header words at a 4-byte aligned
// payload (one thread).
static __global__ void header_words_kernel(std::byte* out, std::uint32_t w0, std::uint32_t w1,
                                                              std::uint32_t w2, std::uint32_t w3, unsigned count) {
  const std::uint32_t w[4] = {w0, w1, w2, w3};
  for (unsigned i = 0; i < count && i < 4; ++i) reinterpret_cast<std::uint32_t*>(out)[i] = w[i];
}

// The verdict a kernel pipeline leaves in scratch, copied to the caller's
// report when one is given.
inline status copy_report(device_report* d_report, const device_report* verdict, cudaStream_t stream,
                          std::string_view codec) {
  if (d_report == nullptr) return {};
  return cuda_check(cudaMemcpyAsync(d_report, verdict, sizeof(device_report), cudaMemcpyDeviceToDevice, stream),
                    std::string(codec) + ".report");
}

// What every device decoder checks on the host before it reads a payload
// (compress/detail/elements.hpp's check_decode_args), plus the alignment the
// kernels rely on.
inline status check_decode_host(std::string_view codec, dtype t, std::size_t count, std::size_t acc_size, float scale,
                                const void* in, std::size_t in_bytes, std::size_t min_bytes) {
  const std::string c(codec);
  if (t != dtype::f32 && t != dtype::f16 && t != dtype::bf16)
    return invalid_argument(c + ".info.type", to_string(t), "must be f32, f16 or bf16");
  if (acc_size != count) return invalid_argument(c + ".acc.size", acc_size, "must equal info.count = " + std::to_string(count));
  if (!std::isfinite(scale)) return invalid_argument(c + ".scale", scale, "must be finite");
  if (in_bytes < min_bytes)
    return malformed(c + ".payload_bytes", in_bytes, "shorter than the " + std::to_string(min_bytes) + "-byte header");
  return check_alignment(c + ".in.data", in, 4);
}

// f(std::integral_constant<dtype, V>{}) for a payload's value dtype V: f32,
// f16, or bf16 for anything else (the host checks refused other dtypes
// before any launch).
template <class F>
decltype(auto) with_value_type(dtype t, F&& f) {
  switch (t) {
    case dtype::f32: return f(std::integral_constant<dtype, dtype::f32>{});
    case dtype::f16: return f(std::integral_constant<dtype, dtype::f16>{});
    default: return f(std::integral_constant<dtype, dtype::bf16>{});
  }
}

// The grid-stride loop of the element-wise kernels: per step, a thread takes
// items_per_thread items a grid-width apart (so every warp access is
// coalesced), and f(i) runs once for each i < n, in that order. The kernels
// launch with grid_for's grid for the same items_per_thread.
template <class F>
__device__ __forceinline__ void for_each_strided(std::size_t n, int items_per_thread, F&& f) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t base = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; base < n;
       base += stride * items_per_thread) {
    for (int j = 0; j < items_per_thread; ++j) {
      const std::size_t i = base + static_cast<std::size_t>(j) * stride;
      if (i < n) f(i);
    }
  }
}

// Blocks for a grid-stride loop over n items: enough to fill the device
// (sm_count * blocks_per_sm), never more than the work needs.
inline unsigned grid_for(std::size_t n, int block_threads, int items_per_thread, int sm_count,
                         int blocks_per_sm) noexcept {
  const std::size_t per_block = static_cast<std::size_t>(block_threads) * items_per_thread;
  std::size_t blocks = (n + per_block - 1) / per_block;
  const std::size_t cap = static_cast<std::size_t>(sm_count) * blocks_per_sm;
  if (blocks > cap) blocks = cap;
  return static_cast<unsigned>(blocks == 0 ? 1 : blocks);
}

}  // namespace detail
}  // namespace compress::cuda
ASHL_NAMESPACE_END
