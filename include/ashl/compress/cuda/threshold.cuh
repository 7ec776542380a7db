// ashl/compress/cuda/threshold.cuh — fixed-threshold sparsification, capped,
// on the device.
//
//   compress::threshold c{{.theta = 1e-3f, .max_ratio = 0.05}};
//   compress::cuda::device_output out{.bytes = d_out, .d_used = d_size};   // d_size: a device u64
//   compress::cuda::device_scratch scratch{};                               // size query first
//   ASHL_TRY(compress::cuda::encode(c, x, out, ctx, scratch, nullptr, stream));
//   // ... scratch.data = a buffer of scratch.bytes, then the same call runs;
//   // out.used is the bound max_encoded_bytes (out.size_known is false), *d_size the size
//   ASHL_TRY(compress::cuda::decode_add(c, payload, {n, dtype::f32}, acc, 1.0f, ctx, scratch2, d_report, stream));
//
// The payload of compress/threshold.hpp, byte for byte, for the same input:
// u64 n, u32 count, the indices with |x| >= theta (compared in f32; NaN
// never) in increasing order and their values in the input dtype, or, when
// more than cap = max(1, round(max_ratio n)) qualify, the exact top-cap
// (ties to the lower index, NaN above inf). Deterministic; the context and
// report are not used by the encode. The count is decided on the device
// (dispatch/dispatch_select.cuh), so the size is known on the host only as
// the bound 12 + cap (4 + sizeof(T)); the exact size is written to
// *out.d_used and is also 12 + count (4 + sizeof(T)) with the payload's
// count. Decode validates on the device (count 0 allowed) and adds nothing
// when the payload is malformed. Device views; payload buffers 4-byte
// aligned; two-call scratch pattern; asynchronous on `stream`, no host
// synchronization, graph capturable. docs/algorithms.md §4; docs/wire-format.md,
// "Codec payloads / threshold".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/threshold.cuh needs nvcc; use ashl/compress/threshold.hpp on the host"
#endif

#include <ashl/compress/cuda/dispatch/dispatch_select.cuh>  // device_impl of threshold and topk_sampled
