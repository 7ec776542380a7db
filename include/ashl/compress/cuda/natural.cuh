// ashl/compress/cuda/natural.cuh — natural compression on the device.
//
//   compress::natural c;
//   compress::codec_context ctx{.seed = s, .step = t, .tensor = id};
//   compress::cuda::device_output out{.bytes = d_out};
//   compress::cuda::device_scratch scratch{};                               // size query first
//   ASHL_TRY(compress::cuda::encode(c, x, out, ctx, scratch, d_report, stream));
//   // ... scratch.data = a buffer of scratch.bytes, then the same call runs
//   ASHL_TRY(compress::cuda::decode_add(compress::natural{}, payload, {n, dtype::f32}, acc, 1.0f, ctx,
//                                       scratch2, d_report, stream));
//
// The payload of compress/natural.hpp, byte for byte, for the same input and
// codec_context: u64 n, i32 emin, n code bytes, the codes drawn with word i % 4
// of Philox block i / 4 of philox_stream(seed, step, tensor). The size, 12 + n,
// is known on the host. Error feedback (cuda::error_feedback<C>, through
// device_impl::encode_error_feedback): e <- (x + e) - C(x + e) with the
// subtraction fused into the code pass; on a non-finite input the residual
// keeps x + e, as on the CPU. Decode validates on the device and adds nothing
// when the payload is malformed. Device views; payload buffers 4-byte aligned;
// two-call scratch pattern; asynchronous on `stream`, no host synchronization,
// graph capturable. docs/algorithms.md §4; docs/wire-format.md, "Codec payloads /
// natural".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/natural.cuh needs nvcc; use ashl/compress/natural.hpp on the host"
#endif

#include <ashl/compress/cuda/dispatch/dispatch_natural.cuh>  // device_impl through fused_feedback_impl
