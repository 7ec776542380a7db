// ashl/compress/cuda/dispatch/launch.cuh — the launch skeleton every device
// encode and decode-add shares.
//
//   return encode_skeleton("sign", d_scratch, scratch_bytes, out, payload_bytes, d_report, stream,
//       [&](scratch_carver& c) { return c.take<double>(nchunks); },              // the codec's scratch pieces
//       [&](double* chunk_sum, device_report* verdict, const launch_env& env) {  // its kernels
//         sign_chunk_kernel<T><<<env.grid(nchunks * 4), env.block(), 0, stream>>>(...);
//         return status{};
//       });
//
// What the dispatch_*.cuh files repeated, in one place and one order: the
// scratch layout is carved once for the size query and once for the run
// (a device_report verdict first, then the codec's pieces), CUB's two-call
// protocol, the output buffer's size and 4-byte alignment (encode) or the
// host-checkable decode arguments (decode), the device's tuning, the verdict
// cleared on the stream, the codec's kernels, the launch error, and the
// verdict copied to the caller's report. A codec file keeps only its
// kernels and the sizes they need. docs/algorithms.md §4.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/tuning/tuning.cuh>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <string_view>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

// The device a launch runs on and its tuning, with the grid arithmetic.
struct launch_env {
  device_properties dev;
  codec_tuning tune;

  [[nodiscard]] int block() const noexcept { return tune.elementwise.block_threads; }
  [[nodiscard]] int items_per_thread() const noexcept { return tune.elementwise.items_per_thread; }
  // Blocks for `items` grid-stride items of `per_thread` each.
  [[nodiscard]] unsigned grid(std::size_t items, int per_thread = 1) const noexcept {
    return grid_for(items, tune.elementwise.block_threads, per_thread, dev.sm_count, tune.elementwise.blocks_per_sm);
  }
};

inline status current_launch_env(std::string_view codec, launch_env& env) {
  ASHL_TRY(cuda_check(current_device(env.dev), std::string(codec) + ".device"));
  env.tune = tuning_for(env.dev.cc_major, env.dev.cc_minor);
  return {};
}

// The encode's output buffer: room for `payload_bytes`, 4-byte aligned.
inline status check_output(std::string_view codec, device_view<std::byte> out, std::size_t payload_bytes) {
  const std::string c(codec);
  if (out.size() < payload_bytes)
    return make_error(errc::buffer_too_small, c + ".out.size", out.size(),
                      "bytes, fewer than max_encoded_bytes = " + std::to_string(payload_bytes));
  return check_alignment(c + ".out.data", out.data(), 4);
}

// carve(scratch_carver&) -> Pieces; enqueue(Pieces, device_report* verdict,
// const launch_env&) -> status. `payload_bytes` is the size the encode
// writes (known on the host).
template <class Carve, class Enqueue>
status encode_skeleton(std::string_view codec, void* d_scratch, std::size_t& scratch_bytes,
                       device_view<std::byte> out, std::size_t payload_bytes, device_report* d_report,
                       cudaStream_t stream, Carve&& carve, Enqueue&& enqueue) {
  const std::string c(codec);
  {
    scratch_carver query(nullptr);
    (void)query.take<device_report>(1);
    (void)carve(query);
    auto go = scratch_protocol(codec, d_scratch, scratch_bytes, query.bytes());
    if (!go) return go.error();
    if (!*go) return {};
  }
  ASHL_TRY(check_output(codec, out, payload_bytes));
  scratch_carver run(d_scratch);
  device_report* const verdict = run.take<device_report>(1);
  auto pieces = carve(run);
  launch_env env;
  ASHL_TRY(current_launch_env(codec, env));
  ASHL_TRY(clear_report(verdict, stream, codec));
  ASHL_TRY(enqueue(pieces, verdict, env));
  ASHL_TRY(cuda_check(cudaGetLastError(), c + ".encode_kernels"));
  return copy_report(d_report, verdict, stream, codec);
}

// enqueue(device_report* verdict, const launch_env&) -> status. The decoder's
// kernels validate the payload into the verdict and add nothing when it
// records a fault; `header_bytes` is the least a payload can be.
template <class Enqueue>
status decode_skeleton(std::string_view codec, void* d_scratch, std::size_t& scratch_bytes,
                       device_view<const std::byte> in, payload_info info, device_view<float> acc, float scale,
                       std::size_t header_bytes, device_report* d_report, cudaStream_t stream, Enqueue&& enqueue) {
  scratch_carver carver(d_scratch);
  device_report* const verdict = carver.take<device_report>(1);
  auto go = scratch_protocol(codec, d_scratch, scratch_bytes, carver.bytes());
  if (!go) return go.error();
  if (!*go) return {};
  ASHL_TRY(check_decode_host(codec, info.type, info.count, acc.size(), scale, in.data(), in.size(), header_bytes));
  ASHL_TRY(clear_report(verdict, stream, codec));
  launch_env env;
  ASHL_TRY(current_launch_env(codec, env));
  ASHL_TRY(enqueue(verdict, env));
  ASHL_TRY(cuda_check(cudaGetLastError(), std::string(codec) + ".decode_kernels"));
  return copy_report(d_report, verdict, stream, codec);
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
