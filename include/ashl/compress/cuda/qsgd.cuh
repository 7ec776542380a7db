// ashl/compress/cuda/qsgd.cuh — QSGD on the device.
//
//   compress::qsgd c{{.levels = 15, .bucket = 512}};
//   compress::codec_context ctx{.seed = s, .step = t, .tensor = id};
//   compress::cuda::device_output out{.bytes = d_out};
//   compress::cuda::device_scratch scratch{};                               // size query first
//   ASHL_TRY(compress::cuda::encode(c, x, out, ctx, scratch, d_report, stream));
//   // ... scratch.data = a buffer of scratch.bytes, then the same call runs
//   ASHL_TRY(compress::cuda::decode_add(compress::qsgd{}, payload, {n, dtype::f32}, acc, 1.0f, ctx,
//                                       scratch2, d_report, stream));
//
// The payload of compress/qsgd.hpp, byte for byte, for the same input and
// codec_context: u64 n, u32 bucket, u32 levels, the f32 bucket norms (the CPU's
// f32 sum of squares in its order, see dispatch/kernels/levels.cuh), the packed
// codes drawn with word i % 4 of Philox block i / 4. The size is known on the
// host. Error feedback (cuda::error_feedback<C>, through
// device_impl::encode_error_feedback): e <- (x + e) - C(x + e), the subtraction
// fused into the code pass; the residual keeps x + e when the input is refused.
// Decode validates on the device and adds nothing when the payload is
// malformed. Device views; payload buffers 4-byte aligned; two-call scratch
// pattern; asynchronous on `stream`, no host synchronization, graph capturable.
// docs/algorithms.md §4; docs/wire-format.md, "Codec payloads / qsgd".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/qsgd.cuh needs nvcc; use ashl/compress/qsgd.hpp on the host"
#endif

#include <ashl/compress/cuda/dispatch/dispatch_levels.cuh>  // qsgd and terngrad share one device path
