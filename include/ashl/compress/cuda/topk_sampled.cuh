// ashl/compress/cuda/topk_sampled.cuh — sampled-threshold top-k (DGC) on the
// device.
//
//   compress::topk_sampled c{0.001};
//   compress::codec_context ctx{.seed = s, .step = t, .tensor = id};
//   compress::cuda::device_output out{.bytes = d_out, .d_used = d_size};   // d_size: a device u64
//   compress::cuda::device_scratch scratch{};                               // size query first
//   ASHL_TRY(compress::cuda::encode(c, x, out, ctx, scratch, nullptr, stream));
//   // ... scratch.data = a buffer of scratch.bytes, then the same call runs;
//   // out.used is the bound max_encoded_bytes (out.size_known is false), *d_size the size
//   ASHL_TRY(compress::cuda::decode_add(c, payload, {n, dtype::f32}, acc, 1.0f, ctx, scratch2, d_report, stream));
//
// The payload of compress/topk_sampled.hpp, byte for byte, for the same
// input and codec_context (the CPU encoder given no scratch or at least its
// scratch_bytes()): the threshold θ is the key of rank round(16384 k / n)
// among the same 16384 sampled magnitudes (lane 2 of
// philox_stream(seed, step, tensor)), and the count follows the CPU's rule
// (every element >= θ when that count is in [lo, hi]; the ties rule; else
// the exact top-k), so it is always in [lo, hi]. The device computes it as
// an exact top-k whose k is decided on the device
// (dispatch/dispatch_select.cuh says why the sets are equal), so the size is
// known on the host only as the bound 12 + hi (4 + sizeof(T)); the exact size
// goes to *out.d_used and is 12 + count (4 + sizeof(T)) with the payload's
// count. The report is not used by the encode. Decode validates on the
// device and adds nothing when the payload is malformed. Device views;
// payload buffers 4-byte aligned; two-call scratch pattern; asynchronous on
// `stream`, no host synchronization, graph capturable. docs/algorithms.md §4
// (Lin et al., "Deep Gradient Compression"); docs/wire-format.md, "Codec
// payloads / topk_sampled".
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/topk_sampled.cuh needs nvcc; use ashl/compress/topk_sampled.hpp on the host"
#endif

#include <ashl/compress/cuda/dispatch/dispatch_select.cuh>  // device_impl of threshold and topk_sampled
