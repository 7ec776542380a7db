// ashl/compress/cuda/terngrad.cuh — TernGrad on the device.
//
//   compress::terngrad c{{.bucket = 512}};
//   compress::codec_context ctx{.seed = s, .step = t, .tensor = id};
//   compress::cuda::device_output out{.bytes = d_out};
//   compress::cuda::device_scratch scratch{};                               // size query first
//   ASHL_TRY(compress::cuda::encode(c, x, out, ctx, scratch, d_report, stream));
//   // ... scratch.data = a buffer of scratch.bytes, then the same call runs
//   ASHL_TRY(compress::cuda::decode_add(compress::terngrad{}, payload, {n, dtype::f32}, acc, 1.0f, ctx,
//                                       scratch2, d_report, stream));
//
// The payload of compress/terngrad.hpp, byte for byte, for the same input and
// codec_context: u64 n, u32 bucket, the f32 bucket scales max |x|, 2-bit codes
// (level 0 or 1, and a sign) drawn with word i % 4 of Philox block i / 4. The
// size is known on the host; an inf/NaN bucket (the CPU codec's out_of_range
// error) is recorded in d_report (nonfinite_input, the first such bucket).
// Error feedback (cuda::error_feedback<C>, through
// device_impl::encode_error_feedback) fuses the subtraction into the code pass.
// Decode validates on the device and adds nothing when the payload is
// malformed. Device views; payload buffers 4-byte aligned; two-call scratch
// pattern; asynchronous on `stream`, no host synchronization, graph capturable.
// docs/algorithms.md §4; docs/wire-format.md, "Codec payloads / terngrad".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/terngrad.cuh needs nvcc; use ashl/compress/terngrad.hpp on the host"
#endif

#include <ashl/compress/cuda/dispatch/dispatch_levels.cuh>  // qsgd and terngrad share one device path
