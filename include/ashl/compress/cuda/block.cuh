// ashl/compress/cuda/block.cuh — block-scaled 8/4/2-bit integers on the device.
//
//   compress::block_quant c{{.bits = 4, .block = 128}};
//   compress::cuda::device_output out{.bytes = d_out};
//   compress::cuda::device_scratch scratch{};                               // size query first
//   ASHL_TRY(compress::cuda::encode(c, x, out, ctx, scratch, d_report, stream));
//   // ... scratch.data = a buffer of scratch.bytes, then the same call runs
//   ASHL_TRY(compress::cuda::decode_add(compress::block_quant{}, payload, {n, dtype::f32}, acc, 1.0f, ctx,
//                                       scratch2, d_report, stream));
//
// The payload of compress/block.hpp, byte for byte, for the same input and
// context: u64 n, u32 B, u8 bits, u8 rounding, u16 0, the f32 steps
// absmax_b / (2^(bits-1) - 1), the codes (nearest even, or stochastic from
// philox_stream(ctx.seed, ctx.step, ctx.tensor)). The size is known on the
// host; a non-finite block is recorded in d_report (nonfinite_input, the
// first such block). Error feedback (cuda::error_feedback<C>, through
// device_impl::encode_error_feedback) fuses the subtraction into the code
// pass. Decode validates on the device and adds nothing when the payload is
// malformed. Device views; payload buffers 4-byte aligned; two-call scratch
// pattern; asynchronous on `stream`, no host synchronization, graph
// capturable. docs/codecs.md "block"; docs/wire-format.md, "Codec payloads / block".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/block.cuh needs nvcc; use ashl/compress/block.hpp on the host"
#endif

#include <ashl/compress/cuda/dispatch/dispatch_block.cuh>  // device_impl through fused_feedback_impl
