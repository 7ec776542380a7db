// ashl/compress/cuda/cast.cuh — the fp16 and bf16 cast codecs on the device.
//
//   compress::fp16 c{{.strict = true}};
//   compress::cuda::device_output out{.bytes = d_out};
//   compress::cuda::device_scratch scratch{};                               // size query first
//   ASHL_TRY(compress::cuda::encode(c, x, out, ctx, scratch, d_report, stream));
//   // ... scratch.data = a buffer of scratch.bytes, then the same call runs
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
// into a CUDA graph. docs/algorithms.md §4; docs/wire-format.md, "Codec payloads".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/cast.cuh needs nvcc; use ashl/compress/cast.hpp on the host"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/cast.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/concepts.cuh>
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

// fp16 and bf16 differ only in their target format and name.
template <class C, dense_target Target, dtype PayloadType>
struct cast_impl {
  static constexpr const char* name = Target == dense_target::f16 ? "fp16" : "bf16";

  // Writes exactly 2 n bytes; the context is not used.
  template <gradient_element T>
  static status encode(const C& c, device_view<const T> x, device_output& out, const codec_context&,
                       device_scratch& scratch, device_report* report, cudaStream_t stream) {
    if (scratch.data != nullptr) ASHL_TRY(check_strict_report(name, c.options().strict, report));
    return run_known_size(name, out, scratch, stream, [&](void* s, std::size_t& b, std::size_t& used) {
      return dispatch_dense_encode<T>(name, Target, c.options().strict, s, b, x, out.bytes, used, report, stream);
    });
  }

  // acc[i] += scale * value[i]; info.type is the sender's input dtype (it
  // does not change the payload, always 2 n bytes). Every byte pattern is a
  // payload, so there is nothing to report.
  static status decode_add(const C&, device_view<const std::byte> in, payload_info info, device_view<float> acc,
                           float scale, const codec_context&, device_scratch& scratch, device_report*,
                           cudaStream_t stream) {
    return dispatch_dense_decode_add(name, PayloadType, scratch.data, scratch.bytes, in, info, acc, scale, stream);
  }
};
}  // namespace detail

template <>
struct device_impl<compress::fp16> : detail::cast_impl<compress::fp16, detail::dense_target::f16, dtype::f16> {};
template <>
struct device_impl<compress::bf16> : detail::cast_impl<compress::bf16, detail::dense_target::bf16, dtype::bf16> {};

static_assert(device_codec<compress::fp16>);
static_assert(device_codec<compress::bf16>);

}  // namespace compress::cuda
ASHL_NAMESPACE_END
