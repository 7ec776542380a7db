// ashl/compress/cuda/dispatch/dispatch_sign.cuh — launch logic of scaled sign
// compression on the device.
//
//   ASHL_TRY(detail::dispatch_sign_encode<float>(bucket, d_scratch, bytes, x, out, used, residual, stream, report));
//
// Encode: chunk sums of |x| in double (4 threads per 1024-element chunk), one
// thread per bucket for the scale, one ballot per 32 bits; error feedback
// adds x into the residual first and subtracts the decoded signs in the bit
// pass. A non-finite bucket mean (the CPU codec's out_of_range error) goes
// to the device report, and then neither bits nor residual are written.
// Decode: header, scales, padding on the device, then the add.
// ALGORITHMS.md §4.
#pragma once

#if !defined(__CUDACC__)
#error "ashl/compress/cuda/*.cuh needs nvcc (CUDA C++)"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/kernels/levels.cuh>
#include <ashl/compress/cuda/dispatch/kernels/residual.cuh>
#include <ashl/compress/cuda/dispatch/kernels/sign.cuh>
#include <ashl/compress/cuda/dispatch/tuning/tuning.cuh>
#include <ashl/compress/concepts.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

struct sign_scratch {
  device_report* verdict;
  double* chunk_sum;
};
inline sign_scratch carve_sign(void* d_scratch, std::size_t& bytes, std::uint64_t nchunks) {
  scratch_carver c(d_scratch);
  sign_scratch s{c.take<device_report>(1), c.take<double>(nchunks)};
  bytes = c.bytes();
  return s;
}

template <class T>
status dispatch_sign_encode(std::uint32_t bucket, void* d_scratch, std::size_t& scratch_bytes, device_view<const T> x,
                            device_view<std::byte> out, std::size_t& used_bytes, float* residual, cudaStream_t stream,
                            device_report* d_report) {
  const std::uint64_t n = x.size();
  if (n > device_bucketed_max_elements) return out_of_range("sign.input.size", n, "exceeds 2^48");
  const std::uint64_t B = bucket;
  const std::uint64_t nb = (n + B - 1) / B;
  const std::size_t need = 12 + 4 * nb + (n + 7) / 8;
  used_bytes = need;
  const std::uint64_t cpb = levels_chunks_per_bucket(n, B);
  const std::uint64_t nchunks = nb * cpb;
  std::size_t needed = 0;
  (void)carve_sign(nullptr, needed, nchunks);
  auto go = scratch_protocol("sign", d_scratch, scratch_bytes, needed);
  if (!go) return go.error();
  if (!*go) return {};
  if (out.size() < need)
    return make_error(errc::buffer_too_small, "sign.out.size", out.size(),
                      "bytes, fewer than max_encoded_bytes = " + std::to_string(need));
  ASHL_TRY(check_alignment("sign.out.data", out.data(), 4));
  const sign_scratch s = carve_sign(d_scratch, needed, nchunks);
  device_properties dev;
  ASHL_TRY(cuda_check(current_device(dev), "sign.device"));
  const auto ew = tuning_for(dev.cc_major, dev.cc_minor).elementwise;
  const int bt = ew.block_threads;
  ASHL_TRY(clear_report(s.verdict, stream, "sign"));
  if (residual != nullptr)
    ASHL_TRY(cuda_check(launch_residual_add(x.data(), residual, n, bt, ew.items_per_thread,
                                            grid_for(n, bt, ew.items_per_thread, dev.sm_count, ew.blocks_per_sm),
                                            stream),
                        "sign.residual_add"));
  header_words_kernel<<<1, 1, 0, stream>>>(out.data(), static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(n >> 32),
                                           bucket, 0, 3);
  if (n == 0) return copy_report(d_report, s.verdict, stream, "sign");
  auto* scales = reinterpret_cast<float*>(out.data() + 12);
  std::byte* bits = out.data() + 12 + 4 * nb;
  const unsigned g_chunks = grid_for(nchunks * 4, bt, 1, dev.sm_count, ew.blocks_per_sm);
  const unsigned g_buckets = grid_for(nb, bt, 1, dev.sm_count, ew.blocks_per_sm);
  const unsigned g_bits = grid_for(n, bt, 1, dev.sm_count, ew.blocks_per_sm);
  auto run = [&](const auto* src, float* res) {
    using S = std::remove_cv_t<std::remove_pointer_t<decltype(src)>>;
    sign_chunk_kernel<S><<<g_chunks, bt, 0, stream>>>(src, n, B, cpb, nchunks, s.chunk_sum);
    sign_scale_kernel<<<g_buckets, bt, 0, stream>>>(n, B, cpb, nb, s.chunk_sum, scales, s.verdict);
    sign_bits_kernel<S><<<g_bits, bt, 0, stream>>>(src, n, B, scales, bits, res, s.verdict);
  };
  if (residual != nullptr)
    run(static_cast<const float*>(residual), residual);
  else
    run(x.data(), nullptr);
  ASHL_TRY(cuda_check(cudaGetLastError(), "sign.encode_kernels"));
  return copy_report(d_report, s.verdict, stream, "sign");
}

inline status dispatch_sign_decode_add(void* d_scratch, std::size_t& scratch_bytes, device_view<const std::byte> in,
                                       payload_info info, device_view<float> acc, float scale, cudaStream_t stream,
                                       device_report* d_report) {
  scratch_carver carver(d_scratch);
  device_report* verdict = carver.take<device_report>(1);
  auto go = scratch_protocol("sign", d_scratch, scratch_bytes, carver.bytes());
  if (!go) return go.error();
  if (!*go) return {};
  ASHL_TRY(check_decode_host("sign", info.type, info.count, acc.size(), scale, in.data(), in.size(), 12));
  ASHL_TRY(clear_report(verdict, stream, "sign"));
  device_properties dev;
  ASHL_TRY(cuda_check(current_device(dev), "sign.device"));
  const auto ew = tuning_for(dev.cc_major, dev.cc_minor).elementwise;
  const int bt = ew.block_threads;
  const std::uint64_t n = info.count;
  sign_validate_header_kernel<<<1, 1, 0, stream>>>(in.data(), in.size(), n, verdict);
  if (n != 0) {
    const unsigned g = grid_for(n, bt, 1, dev.sm_count, ew.blocks_per_sm);
    levels_validate_scales_kernel<<<g, bt, 0, stream>>>(in.data(), false, verdict);
    sign_validate_padding_kernel<<<1, 1, 0, stream>>>(in.data(), verdict);
    sign_add_kernel<<<g, bt, 0, stream>>>(in.data(), acc.data(), scale, verdict);
  }
  ASHL_TRY(cuda_check(cudaGetLastError(), "sign.decode_kernels"));
  return copy_report(d_report, verdict, stream, "sign");
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
