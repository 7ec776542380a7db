// ashl/compress/cuda/dispatch/dispatch_levels.cuh — launch logic of qsgd and
// terngrad on the device.
//
//   const detail::levels_params p{"qsgd", 16, bucket, levels, /*l2=*/true};
//   ASHL_TRY(detail::dispatch_levels_encode<float>(p, d_scratch, bytes, x, out, used, ctx, residual, stream, report));
//
// Encode: chunk statistics (8 threads per 1024-element chunk), one thread per
// bucket for the scale, then one thread per 8 codes (kernels/levels.cuh).
// Error feedback adds x into the residual first and subtracts the decoded
// codes in the code pass. The payload size is known on the host; a
// non-finite bucket scale (the CPU codec's out_of_range error) is recorded
// in the device report with the smallest such bucket, and then neither
// codes nor residual are written. Decode: header, scales, codes and padding
// checks on the device, in the CPU's order, then the add. ALGORITHMS.md §4.
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/*.cuh needs nvcc (CUDA C++)"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/kernels/levels.cuh>
#include <ashl/compress/cuda/dispatch/kernels/residual.cuh>
#include <ashl/compress/cuda/dispatch/tuning/tuning.cuh>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

struct levels_params {
  const char* codec;
  std::size_t header_bytes;  // 16 (qsgd: n, bucket, levels) or 12 (terngrad: n, bucket)
  std::uint32_t bucket;
  std::uint32_t levels;
  bool l2;  // qsgd: L2 norm; terngrad: max |x|
};

struct levels_scratch {
  device_report* verdict;
  float* chunk_sum;
  std::uint32_t* chunk_max;
};

inline levels_scratch carve_levels(void* d_scratch, std::size_t& bytes, std::uint64_t nchunks) {
  scratch_carver c(d_scratch);
  levels_scratch s{c.take<device_report>(1), c.take<float>(nchunks), c.take<std::uint32_t>(nchunks)};
  bytes = c.bytes();
  return s;
}

template <class T>
status dispatch_levels_encode(const levels_params& p, void* d_scratch, std::size_t& scratch_bytes,
                              device_view<const T> x, device_view<std::byte> out, std::size_t& used_bytes,
                              const codec_context& ctx, float* residual, cudaStream_t stream,
                              device_report* d_report) {
  const std::string c(p.codec);
  const std::uint64_t n = x.size();
  if (n > device_bucketed_max_elements) return out_of_range(c + ".input.size", n, "exceeds 2^48");
  const std::uint64_t B = p.bucket;
  const std::uint64_t nb = (n + B - 1) / B;
  const unsigned bits = 1u + static_cast<unsigned>(std::bit_width(p.levels));
  const std::size_t need = p.header_bytes + 4 * nb + (n * bits + 7) / 8;
  used_bytes = need;
  const std::uint64_t cpb = levels_chunks_per_bucket(n, B);
  const std::uint64_t nchunks = nb * cpb;
  std::size_t needed = 0;
  (void)carve_levels(nullptr, needed, nchunks);
  auto go = scratch_protocol(p.codec, d_scratch, scratch_bytes, needed);
  if (!go) return go.error();
  if (!*go) return {};
  if (out.size() < need)
    return make_error(errc::buffer_too_small, c + ".out.size", out.size(),
                      "bytes, fewer than max_encoded_bytes = " + std::to_string(need));
  ASHL_TRY(check_alignment(c + ".out.data", out.data(), 4));
  const levels_scratch s = carve_levels(d_scratch, needed, nchunks);
  device_properties dev;
  ASHL_TRY(cuda_check(current_device(dev), c + ".device"));
  const auto ew = tuning_for(dev.cc_major, dev.cc_minor).elementwise;
  ASHL_TRY(clear_report(s.verdict, stream, p.codec));
  if (residual != nullptr)
    ASHL_TRY(cuda_check(launch_residual_add(x.data(), residual, n, ew.block_threads, ew.items_per_thread,
                                            grid_for(n, ew.block_threads, ew.items_per_thread, dev.sm_count,
                                                     ew.blocks_per_sm),
                                            stream),
                        c + ".residual_add"));
  // Header: n, bucket (and levels) as little-endian words, by a kernel (a
  // copy from host memory would not replay from a graph).
  header_words_kernel<<<1, 1, 0, stream>>>(out.data(), static_cast<std::uint32_t>(n),
                                           static_cast<std::uint32_t>(n >> 32), p.bucket, p.levels,
                                           static_cast<unsigned>(p.header_bytes / 4));
  if (n == 0) return copy_report(d_report, s.verdict, stream, p.codec);
  auto* scales = reinterpret_cast<float*>(out.data() + p.header_bytes);
  std::byte* codes = out.data() + p.header_bytes + 4 * nb;
  const philox_stream rng(ctx.seed, ctx.step, ctx.tensor);
  const float L = static_cast<float>(p.levels);
  const int bt = ew.block_threads;
  const unsigned g_chunks = grid_for(nchunks * 8, bt, 1, dev.sm_count, ew.blocks_per_sm);
  const unsigned g_buckets = grid_for(nb, bt, 1, dev.sm_count, ew.blocks_per_sm);
  const unsigned g_codes = grid_for((n + 7) / 8, bt, 1, dev.sm_count, ew.blocks_per_sm);
  auto run = [&](const auto* src, float* res) {
    using S = std::remove_cv_t<std::remove_pointer_t<decltype(src)>>;
    if (p.l2) {
      levels_chunk_kernel<S, true><<<g_chunks, bt, 0, stream>>>(src, n, B, cpb, nchunks, s.chunk_sum, s.chunk_max);
      levels_scale_kernel<S, true><<<g_buckets, bt, 0, stream>>>(src, n, B, cpb, nb, s.chunk_sum, s.chunk_max, scales,
                                                                 s.verdict);
    } else {
      levels_chunk_kernel<S, false><<<g_chunks, bt, 0, stream>>>(src, n, B, cpb, nchunks, s.chunk_sum, s.chunk_max);
      levels_scale_kernel<S, false><<<g_buckets, bt, 0, stream>>>(src, n, B, cpb, nb, s.chunk_sum, s.chunk_max,
                                                                  scales, s.verdict);
    }
    levels_codes_kernel<S><<<g_codes, bt, 0, stream>>>(src, n, B, L, bits, scales, codes, rng, res, s.verdict);
  };
  if (residual != nullptr)
    run(static_cast<const float*>(residual), residual);
  else
    run(x.data(), nullptr);
  ASHL_TRY(cuda_check(cudaGetLastError(), c + ".encode_kernels"));
  return copy_report(d_report, s.verdict, stream, p.codec);
}

inline status dispatch_levels_decode_add(const char* codec, bool has_levels, std::uint32_t max_levels, void* d_scratch,
                                         std::size_t& scratch_bytes, device_view<const std::byte> in,
                                         payload_info info, device_view<float> acc, float scale, cudaStream_t stream,
                                         device_report* d_report) {
  const std::string c(codec);
  scratch_carver carver(d_scratch);
  device_report* verdict = carver.take<device_report>(1);
  auto go = scratch_protocol(codec, d_scratch, scratch_bytes, carver.bytes());
  if (!go) return go.error();
  if (!*go) return {};
  ASHL_TRY(check_decode_host(codec, info.type, info.count, acc.size(), scale, in.data(), in.size(),
                             has_levels ? 16 : 12));
  ASHL_TRY(clear_report(verdict, stream, codec));
  device_properties dev;
  ASHL_TRY(cuda_check(current_device(dev), c + ".device"));
  const auto ew = tuning_for(dev.cc_major, dev.cc_minor).elementwise;
  const int bt = ew.block_threads;
  const std::uint64_t n = info.count;
  levels_validate_header_kernel<<<1, 1, 0, stream>>>(in.data(), in.size(), n, has_levels, max_levels, verdict);
  if (n != 0) {
    // Grids from n: a bucket count or group count never exceeds it; every
    // kernel loops over what the (validated) header says.
    const unsigned g = grid_for((n + 7) / 8, bt, 1, dev.sm_count, ew.blocks_per_sm);
    levels_validate_scales_kernel<<<g, bt, 0, stream>>>(in.data(), has_levels, verdict);
    levels_validate_codes_kernel<<<g, bt, 0, stream>>>(in.data(), has_levels, verdict);
    levels_validate_padding_kernel<<<1, 1, 0, stream>>>(in.data(), has_levels, verdict);
    levels_add_kernel<<<g, bt, 0, stream>>>(in.data(), has_levels, acc.data(), scale, verdict);
  }
  ASHL_TRY(cuda_check(cudaGetLastError(), c + ".decode_kernels"));
  return copy_report(d_report, verdict, stream, codec);
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
