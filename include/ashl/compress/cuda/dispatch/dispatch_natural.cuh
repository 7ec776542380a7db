// ashl/compress/cuda/dispatch/dispatch_natural.cuh — launch logic of natural
// compression on the device.
//
//   ASHL_TRY(detail::dispatch_natural_encode<float>(d_scratch, bytes, x, out, used, ctx, residual, stream, d_report));
//
// Two passes: max |x| (one atomicMax per warp into scratch), then header and
// codes, one Philox block per four elements. Error feedback: a residual add
// pass first, and the subtraction inside the code pass. The payload size,
// 12 + n, is known on the host; a non-finite input is recorded in the device
// report (the CPU codec's "natural.input.max_abs" error). ALGORITHMS.md §4.
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/*.cuh needs nvcc (CUDA C++)"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/kernels/natural.cuh>
#include <ashl/compress/cuda/dispatch/kernels/residual.cuh>
#include <ashl/compress/cuda/dispatch/tuning/tuning.cuh>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

struct natural_scratch {
  device_report* verdict;
  std::uint32_t* max_key;
};
inline natural_scratch carve_natural(void* d_scratch, std::size_t& bytes) {
  scratch_carver c(d_scratch);
  natural_scratch s{c.take<device_report>(1), c.take<std::uint32_t>(1)};
  bytes = c.bytes();
  return s;
}

// `residual` non-null: error feedback; x is added into it first and the
// codes are made from it (as f32).
template <class T>
status dispatch_natural_encode(void* d_scratch, std::size_t& scratch_bytes, device_view<const T> x,
                               device_view<std::byte> out, std::size_t& used_bytes, const codec_context& ctx,
                               float* residual, cudaStream_t stream, device_report* d_report) {
  const std::size_t n = x.size();
  const std::size_t need = device_natural_header_bytes + n;
  used_bytes = need;
  std::size_t needed = 0;
  (void)carve_natural(nullptr, needed);
  auto go = scratch_protocol("natural", d_scratch, scratch_bytes, needed);
  if (!go) return go.error();
  if (!*go) return {};
  if (out.size() < need)
    return make_error(errc::buffer_too_small, "natural.out.size", out.size(),
                      "bytes, fewer than max_encoded_bytes = " + std::to_string(need));
  ASHL_TRY(check_alignment("natural.out.data", out.data(), 4));
  const natural_scratch s = carve_natural(d_scratch, needed);
  device_properties dev;
  ASHL_TRY(cuda_check(current_device(dev), "natural.device"));
  const auto ew = tuning_for(dev.cc_major, dev.cc_minor).elementwise;
  const unsigned grid = grid_for(n, ew.block_threads, ew.items_per_thread, dev.sm_count, ew.blocks_per_sm);
  ASHL_TRY(clear_report(s.verdict, stream, "natural"));
  ASHL_TRY(cuda_check(cudaMemsetAsync(s.max_key, 0, sizeof(std::uint32_t), stream), "natural.memset"));
  const float* xf = nullptr;
  if (residual != nullptr) {
    ASHL_TRY(cuda_check(launch_residual_add(x.data(), residual, n, ew.block_threads, ew.items_per_thread, grid, stream),
                        "natural.residual_add"));
    xf = residual;
  }
  const philox_stream rng(ctx.seed, ctx.step, ctx.tensor);
  const unsigned cgrid = grid_for((n + 3) / 4, ew.block_threads, 1, dev.sm_count, ew.blocks_per_sm);
  if (xf != nullptr) {
    if (n != 0)
      max_key_kernel<float><<<grid, ew.block_threads, 0, stream>>>(xf, n, s.max_key, ew.items_per_thread);
    natural_codes_kernel<float><<<cgrid, ew.block_threads, 0, stream>>>(xf, n, s.max_key, out.data(), rng, residual,
                                                                       s.verdict);
  } else {
    if (n != 0)
      max_key_kernel<T><<<grid, ew.block_threads, 0, stream>>>(x.data(), n, s.max_key, ew.items_per_thread);
    natural_codes_kernel<T><<<cgrid, ew.block_threads, 0, stream>>>(x.data(), n, s.max_key, out.data(), rng, nullptr,
                                                                   s.verdict);
  }
  ASHL_TRY(cuda_check(cudaGetLastError(), "natural.encode_kernels"));
  return copy_report(d_report, s.verdict, stream, "natural");
}

inline status dispatch_natural_decode_add(void* d_scratch, std::size_t& scratch_bytes, device_view<const std::byte> in,
                                          payload_info info, device_view<float> acc, float scale, cudaStream_t stream,
                                          device_report* d_report) {
  scratch_carver carver(d_scratch);
  device_report* verdict = carver.take<device_report>(1);
  auto go = scratch_protocol("natural", d_scratch, scratch_bytes, carver.bytes());
  if (!go) return go.error();
  if (!*go) return {};
  ASHL_TRY(check_decode_host("natural", info.type, info.count, acc.size(), scale, in.data(), in.size(),
                             device_natural_header_bytes));
  ASHL_TRY(clear_report(verdict, stream, "natural"));
  device_properties dev;
  ASHL_TRY(cuda_check(current_device(dev), "natural.device"));
  const auto ew = tuning_for(dev.cc_major, dev.cc_minor).elementwise;
  natural_validate_header_kernel<<<1, 1, 0, stream>>>(in.data(), in.size(), info.count, verdict);
  const std::size_t n = info.count;
  if (n != 0) {
    const unsigned grid = grid_for(n, ew.block_threads, ew.items_per_thread, dev.sm_count, ew.blocks_per_sm);
    natural_validate_codes_kernel<<<grid, ew.block_threads, 0, stream>>>(in.data(), n, verdict);
    natural_add_kernel<<<grid, ew.block_threads, 0, stream>>>(in.data(), acc.data(), n, scale, verdict);
  }
  ASHL_TRY(cuda_check(cudaGetLastError(), "natural.decode_kernels"));
  return copy_report(d_report, verdict, stream, "natural");
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
