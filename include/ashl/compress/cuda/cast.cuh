// ashl/compress/cuda/cast.cuh — the fp16 and bf16 cast codecs on the device.
//
//   compress::fp16 c{{.strict = true}};
//   std::size_t scratch = 0, used = 0;
//   compress::cuda::encode(c, nullptr, scratch, x, out, used, stream);       // size query
//   ASHL_TRY(compress::cuda::encode(c, d_scratch, scratch, x, out, used, stream, d_report));
//   // ... later, after a synchronization the caller makes anyway:
//   // d_report->fault == device_fault::overflow: d_report->index is the first bad element
//
// Same payload as compress/cast.hpp, byte for byte: n u16 patterns, rounded
// to nearest even with core/dtype's bits; a 16-bit input of the codec's own
// type is copied bit for bit. Strict mode cannot return the CPU codec's
// status without synchronizing the host; instead it records the smallest
// index whose finite value rounded to +-inf in `d_report` (device memory;
// required in strict mode) and still writes the whole payload, so a caller
// that checks the report discards it exactly where the CPU codec would have
// refused. Two-call scratch pattern, asynchronous on `stream`, capturable
// into a CUDA graph. ALGORITHMS.md §4; docs/wire-format.md, "Codec payloads".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/cast.cuh needs nvcc; use ashl/compress/cast.hpp on the host"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/cast.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/dispatch_dense.cuh>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cuda_runtime.h>

#include <cstddef>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda {

namespace detail {
inline status check_strict_report(const char* codec, bool strict, const device_report* report) {
  if (strict && report == nullptr)
    return invalid_argument(std::string(codec) + ".report", "nullptr",
                            "strict mode needs a device_report to record an overflow in");
  return {};
}
}  // namespace detail

// Writes exactly 2 n bytes (used_bytes, known on the host).
template <gradient_element T>
status encode(const compress::fp16& c, void* d_scratch, std::size_t& scratch_bytes, device_view<const T> x,
              device_view<std::byte> out, std::size_t& used_bytes, cudaStream_t stream,
              device_report* d_report = nullptr) {
  if (d_scratch != nullptr) ASHL_TRY(detail::check_strict_report("fp16", c.options().strict, d_report));
  return detail::dispatch_dense_encode<T>("fp16", detail::dense_target::f16, c.options().strict, d_scratch,
                                          scratch_bytes, x, out, used_bytes, d_report, stream);
}

template <gradient_element T>
status encode(const compress::bf16& c, void* d_scratch, std::size_t& scratch_bytes, device_view<const T> x,
              device_view<std::byte> out, std::size_t& used_bytes, cudaStream_t stream,
              device_report* d_report = nullptr) {
  if (d_scratch != nullptr) ASHL_TRY(detail::check_strict_report("bf16", c.options().strict, d_report));
  return detail::dispatch_dense_encode<T>("bf16", detail::dense_target::bf16, c.options().strict, d_scratch,
                                          scratch_bytes, x, out, used_bytes, d_report, stream);
}

// acc[i] += scale * value[i]; info.type is the sender's input dtype (it does
// not change the payload, which is always 2 n bytes).
inline status decode_add(const compress::fp16&, void* d_scratch, std::size_t& scratch_bytes,
                         device_view<const std::byte> in, payload_info info, device_view<float> acc, float scale,
                         cudaStream_t stream) {
  return detail::dispatch_dense_decode_add("fp16", dtype::f16, d_scratch, scratch_bytes, in, info, acc, scale,
                                           stream);
}

inline status decode_add(const compress::bf16&, void* d_scratch, std::size_t& scratch_bytes,
                         device_view<const std::byte> in, payload_info info, device_view<float> acc, float scale,
                         cudaStream_t stream) {
  return detail::dispatch_dense_decode_add("bf16", dtype::bf16, d_scratch, scratch_bytes, in, info, acc, scale,
                                           stream);
}

}  // namespace compress::cuda
ASHL_NAMESPACE_END
