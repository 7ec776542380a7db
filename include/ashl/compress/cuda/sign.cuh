// ashl/compress/cuda/sign.cuh — scaled sign compression (EF-signSGD) on the device.
//
//   compress::sign c{{.bucket = 512}};   // ctx is accepted for the uniform call shape, unused
//   compress::cuda::device_output out{.bytes = d_out};
//   compress::cuda::device_scratch scratch{};                               // size query first
//   ASHL_TRY(compress::cuda::encode(c, x, out, ctx, scratch, d_report, stream));
//   // ... scratch.data = a buffer of scratch.bytes, then the same call runs
//   ASHL_TRY(compress::cuda::decode_add(compress::sign{}, payload, {n, dtype::f32}, acc, 1.0f, ctx,
//                                       scratch2, d_report, stream));
//
// The payload of compress/sign.hpp, byte for byte, for the same input: u64 n,
// u32 bucket, the f32 bucket scales d = mean |x| (summed in double in the CPU's
// order, see dispatch/kernels/sign.cuh), one bit per element (x < 0).
// Deterministic: the codec_context is not used. The size is known on the host;
// a bucket whose mean is not finite (the CPU codec's out_of_range error) is
// recorded in d_report (nonfinite_input, the first such bucket). Error feedback
// (cuda::error_feedback<C>, through device_impl::encode_error_feedback) fuses
// the subtraction into the bit pass. Decode validates on the device and adds
// nothing when the payload is malformed. Device views; payload buffers 4-byte
// aligned; two-call scratch pattern; asynchronous on `stream`, no host
// synchronization, graph capturable. docs/algorithms.md §4; docs/wire-format.md,
// "Codec payloads / sign".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/sign.cuh needs nvcc; use ashl/compress/sign.hpp on the host"
#endif

#include <ashl/compress/cuda/dispatch/dispatch_sign.cuh>  // device_impl through fused_feedback_impl
