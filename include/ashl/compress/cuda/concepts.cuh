// ashl/compress/cuda/concepts.cuh — the device-codec concept: one call shape
// for every codec on the GPU.
//
//   compress::qsgd c{{.levels = 15}};                    // any host codec with a compress/cuda header
//   compress::codec_context ctx{.seed = s, .step = t, .tensor = id};
//   compress::cuda::device_output out{.bytes = {d_buf, c.max_encoded_bytes(n, dtype::f32)}};
//   compress::cuda::device_scratch scratch{};             // data == nullptr: size query
//   ASHL_TRY(compress::cuda::encode(c, x, out, ctx, scratch, d_report, stream));
//   cudaMallocAsync(&scratch.data, scratch.bytes, stream);
//   ASHL_TRY(compress::cuda::encode(c, x, out, ctx, scratch, d_report, stream));   // out.used bytes
//   ASHL_TRY(compress::cuda::decode_add(c, payload, {n, dtype::f32}, acc, 1.0f, ctx, scratch2, d_report, stream));
//
// Every device codec is called with the same arguments, in this order:
//   encode(codec, view, output, context, scratch, report, stream)
//   decode_add(codec, payload, info, acc, scale, context, scratch, report, stream)
// where a codec that needs no context or report ignores them. A codec opts
// in by specializing device_impl<C> (CUTLASS-style: the primary template has
// no members, so `device_codec<C>` is false and the entry points fail with a
// static_assert that names the header to include). The codec value is the
// host codec (compress::qsgd, ...) for stateless codecs and the device
// decorator (cuda::error_feedback<C>, cuda::dgc<C>) for stateful ones, whose
// encode takes it by non-const reference.
//
// Scratch follows CUB's two-call pattern: with scratch.data == nullptr the
// call only writes scratch.bytes (and out.used); the same call with a buffer
// of at least that size runs. Nothing synchronizes the host or allocates, so
// every call can be captured into a CUDA graph. Verdicts that need the data
// (a malformed payload, a non-finite input, a strict cast overflow) go to
// the caller's device_report (device memory, may be null where the codec
// says so), read after the caller's next synchronization.
//
// The payload size: `out.used` is set on the host. For most codecs it is the
// exact size (`out.size_known`); for threshold and topk_sampled it depends on
// the data, `out.used` is then the upper bound max_encoded_bytes and
// `size_known` is false: the exact size is 12 + count (4 + value bytes) with
// the payload's u32 count, and the encoder writes it to `*out.d_used` (a
// device u64) when the caller gives one. Every codec writes *d_used when it
// is given, so a caller that sends sizes from the device needs no cases.
// docs/design.md "Codec"; docs/algorithms.md §4; docs/wire-format.md "Codec payloads".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/concepts.cuh needs nvcc; use ashl/compress/concepts.hpp on the host"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/wire/ids.hpp>

#include <cuda_runtime.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda {

// Caller scratch (device memory). data == nullptr: the call is a size query
// and writes the bytes it needs; otherwise `bytes` is the buffer's size.
struct device_scratch {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// Where an encode writes its payload.
struct device_output {
  device_view<std::byte> bytes{};    // at least max_encoded_bytes(n, dtype); 4-byte aligned
  std::size_t used = 0;              // set by encode (size query too): the size, or its bound
  bool size_known = true;            // set by encode: false when `used` is only the bound
  std::uint64_t* d_used = nullptr;   // optional device u64: the exact size, written on the stream
};

// Specialized by each device codec header:
//   template <> struct device_impl<compress::qsgd> {
//     template <gradient_element T>
//     static status encode(const compress::qsgd&, device_view<const T>, device_output&, const codec_context&,
//                          device_scratch&, device_report*, cudaStream_t);
//     static status decode_add(const compress::qsgd&, device_view<const std::byte>, payload_info,
//                              device_view<float>, float, const codec_context&, device_scratch&,
//                              device_report*, cudaStream_t);
//   };
template <class C>
struct device_impl {};

template <class C>
concept device_codec =
    requires(C& c, const C& cc, std::size_t n, dtype t, device_view<const float> f32, device_view<const half> f16,
             device_view<const bfloat16> bf16, device_output& out, device_view<const std::byte> in,
             payload_info info, device_view<float> acc, float scale, const codec_context& ctx,
             device_scratch& scratch, device_report* report, cudaStream_t stream) {
      { C::id } -> std::convertible_to<codec_id>;
      { cc.max_encoded_bytes(n, t) } -> std::same_as<std::size_t>;
      { device_impl<C>::encode(c, f32, out, ctx, scratch, report, stream) } -> std::same_as<status>;
      { device_impl<C>::encode(c, f16, out, ctx, scratch, report, stream) } -> std::same_as<status>;
      { device_impl<C>::encode(c, bf16, out, ctx, scratch, report, stream) } -> std::same_as<status>;
      { device_impl<C>::decode_add(cc, in, info, acc, scale, ctx, scratch, report, stream) } -> std::same_as<status>;
    };

// The entry points. C is deduced without const, so a stateful decorator
// passed as an lvalue reaches its non-const encode.
template <class C, gradient_element T>
status encode(C& c, device_view<const T> x, device_output& out, const codec_context& ctx, device_scratch& scratch,
              device_report* report, cudaStream_t stream) {
  using codec_type = std::remove_const_t<C>;
  static_assert(device_codec<codec_type>,
                "no device implementation for this codec: include its ashl/compress/cuda/<codec>.cuh");
  return device_impl<codec_type>::encode(c, x, out, ctx, scratch, report, stream);
}

template <class C>
status decode_add(const C& c, device_view<const std::byte> in, payload_info info, device_view<float> acc,
                  float scale, const codec_context& ctx, device_scratch& scratch, device_report* report,
                  cudaStream_t stream) {
  static_assert(device_codec<C>,
                "no device implementation for this codec: include its ashl/compress/cuda/<codec>.cuh");
  return device_impl<C>::decode_add(c, in, info, acc, scale, ctx, scratch, report, stream);
}

namespace detail {

static __global__ void store_used_kernel(std::uint64_t* d_used, std::uint64_t bytes) { *d_used = bytes; }

// The adapter of a codec whose size is known on the host: `run(d_scratch,
// scratch_bytes, used_bytes)` is its dispatch call (size query or run);
// afterwards the output records the size and, on a run, *d_used gets it.
template <class Run>
status run_known_size(std::string_view codec, device_output& out, device_scratch& scratch, cudaStream_t stream,
                      Run&& run) {
  std::size_t used = 0;
  const bool query = scratch.data == nullptr;
  status s = run(scratch.data, scratch.bytes, used);
  out.used = used;
  out.size_known = true;
  if (!s.ok() || query || out.d_used == nullptr) return s;
  store_used_kernel<<<1, 1, 0, stream>>>(out.d_used, used);
  return cuda_check(cudaGetLastError(), std::string(codec) + ".d_used");
}

// The codecs whose size is known on the host and whose error feedback is
// fused into their code pass (natural, qsgd, sign, terngrad) give their
// kernels as two overloads, found by argument-dependent lookup through
// fused_tag, in their dispatch header:
//   template <class T>
//   status fused_encode(fused_tag, const compress::sign&, void* d_scratch, std::size_t& scratch_bytes,
//                       device_view<const T> x, device_view<std::byte> out, std::size_t& used_bytes,
//                       const codec_context&, float* residual, cudaStream_t, device_report*);
//   status fused_decode_add(fused_tag, const compress::sign&, void* d_scratch, std::size_t& scratch_bytes,
//                           device_view<const std::byte> in, payload_info, device_view<float> acc, float scale,
//                           cudaStream_t, device_report*);
// (residual: nullptr, or error feedback), and device_impl<C> is then
// fused_feedback_impl<C> below.
struct fused_tag {};

template <class C>
concept fused_codec = requires(const C& c, void* p, std::size_t& bytes, device_view<const std::byte> in,
                               payload_info info, device_view<float> acc, float scale, cudaStream_t stream,
                               device_report* report) {
  { fused_decode_add(fused_tag{}, c, p, bytes, in, info, acc, scale, stream, report) } -> std::same_as<status>;
};

// The device_impl of a fused codec: encode_error_feedback, which
// cuda::error_feedback<C> calls, makes e <- (x + e) - C(x + e) and a payload
// of f32 input (C(x + e)). A codec with a validate() is validated first, as
// its CPU encode does.
template <class Codec>
struct fused_feedback_impl {
  template <gradient_element T>
  static status encode(const Codec& c, device_view<const T> x, device_output& out, const codec_context& ctx,
                       device_scratch& scratch, device_report* report, cudaStream_t stream) {
    ASHL_TRY(validate(c));
    return run(c, x, nullptr, out, ctx, scratch, report, stream);
  }

  template <gradient_element T>
  static status encode_error_feedback(const Codec& c, device_view<const T> x, device_view<float> residual,
                                      device_output& out, const codec_context& ctx, device_scratch& scratch,
                                      device_report* report, cudaStream_t stream) {
    ASHL_TRY(validate(c));
    if (scratch.data != nullptr && residual.size() != x.size())
      return invalid_argument(std::string(name) + ".residual.size", residual.size(),
                              "must equal the input size " + std::to_string(x.size()));
    return run(c, x, residual.data(), out, ctx, scratch, report, stream);
  }

  static status decode_add(const Codec& c, device_view<const std::byte> in, payload_info info, device_view<float> acc,
                           float scale, const codec_context&, device_scratch& scratch, device_report* report,
                           cudaStream_t stream) {
    return fused_decode_add(fused_tag{}, c, scratch.data, scratch.bytes, in, info, acc, scale, stream, report);
  }

 private:
  static constexpr std::string_view name = to_string(Codec::id);

  static status validate(const Codec& c) {
    if constexpr (requires { c.validate(); })
      return c.validate();
    else
      return {};
  }

  template <class T>
  static status run(const Codec& c, device_view<const T> x, float* residual, device_output& out,
                    const codec_context& ctx, device_scratch& scratch, device_report* report, cudaStream_t stream) {
    return run_known_size(name, out, scratch, stream, [&](void* s, std::size_t& b, std::size_t& used) {
      return fused_encode(fused_tag{}, c, s, b, x, out.bytes, used, ctx, residual, stream, report);
    });
  }
};

}  // namespace detail

// Every fused codec (a fused_decode_add overload is visible) is a device codec.
template <class C>
  requires detail::fused_codec<C>
struct device_impl<C> : detail::fused_feedback_impl<C> {};

}  // namespace compress::cuda
ASHL_NAMESPACE_END
