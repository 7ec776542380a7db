// ashl/compress/cuda/dispatch/dispatch_sign.cuh — launch logic of scaled sign
// compression on the device.
//
//   ASHL_TRY(detail::fused_encode(detail::fused_tag{}, compress::sign{}, d_scratch, bytes, x, out, used, ctx,
//                                 residual, stream, report));
//
// Encode: chunk sums of |x| in double (4 threads per 1024-element chunk), one
// thread per bucket for the scale, one ballot per 32 bits; error feedback
// adds x into the residual first and subtracts the decoded signs in the bit
// pass. A non-finite bucket mean (the CPU codec's out_of_range error) goes
// to the device report, and then neither bits nor residual are written.
// Decode: header, scales, padding on the device, then the add.
// docs/algorithms.md §4.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/launch.cuh>
#include <ashl/compress/cuda/dispatch/kernels/levels.cuh>
#include <ashl/compress/cuda/dispatch/kernels/residual.cuh>
#include <ashl/compress/cuda/dispatch/kernels/sign.cuh>
#include <ashl/compress/cuda/dispatch/tuning/tuning.cuh>
#include <ashl/compress/cuda/concepts.cuh>
#include <ashl/compress/sign.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

template <class T>
status fused_encode(fused_tag, const compress::sign& codec, void* d_scratch, std::size_t& scratch_bytes,
                    device_view<const T> x, device_view<std::byte> out, std::size_t& used_bytes, const codec_context&,
                    float* residual, cudaStream_t stream, device_report* d_report) {
  const std::uint32_t bucket = codec.options().bucket;
  const std::uint64_t n = x.size();
  if (n > layout::bucketed_max_elements) return out_of_range("sign.input.size", n, "exceeds 2^48");
  const std::uint64_t B = bucket;
  const std::uint64_t nb = layout::bucket_count(n, B);
  used_bytes = layout::sign_payload_bytes(n, B);
  const std::uint64_t cpb = levels_chunks_per_bucket(n, B);
  const std::uint64_t nchunks = nb * cpb;
  return encode_skeleton(
      "sign", d_scratch, scratch_bytes, out, used_bytes, d_report, stream,
      [&](scratch_carver& c) { return c.take<double>(nchunks); },
      [&](double* chunk_sum, device_report* verdict, const launch_env& env) -> status {
        const int bt = env.block();
        if (residual != nullptr)
          ASHL_TRY(cuda_check(launch_residual_add(x.data(), residual, n, bt, env.items_per_thread(),
                                                  env.grid(n, env.items_per_thread()), stream),
                              "sign.residual_add"));
        header_words_kernel<<<1, 1, 0, stream>>>(out.data(), static_cast<std::uint32_t>(n),
                                                 static_cast<std::uint32_t>(n >> 32), bucket, 0, 3);
        if (n == 0) return {};
        auto* scales = reinterpret_cast<float*>(out.data() + layout::sign::header_bytes);
        std::byte* bits = out.data() + layout::bucketed_codes_offset(layout::sign::header_bytes, n, B);
        const unsigned g_chunks = env.grid(nchunks * 4);
        const unsigned g_buckets = env.grid(nb);
        const unsigned g_bits = env.grid(n);
        auto run = [&](const auto* src, float* res) {
          using S = std::remove_cv_t<std::remove_pointer_t<decltype(src)>>;
          sign_chunk_kernel<S><<<g_chunks, bt, 0, stream>>>(src, n, B, cpb, nchunks, chunk_sum);
          sign_scale_kernel<<<g_buckets, bt, 0, stream>>>(n, B, cpb, nb, chunk_sum, scales, verdict);
          sign_bits_kernel<S><<<g_bits, bt, 0, stream>>>(src, n, B, scales, bits, res, verdict);
        };
        if (residual != nullptr)
          run(static_cast<const float*>(residual), residual);
        else
          run(x.data(), nullptr);
        return {};
      });
}

inline status fused_decode_add(fused_tag, const compress::sign&, void* d_scratch, std::size_t& scratch_bytes,
                               device_view<const std::byte> in, payload_info info, device_view<float> acc,
                               float scale, cudaStream_t stream, device_report* d_report) {
  return decode_skeleton("sign", d_scratch, scratch_bytes, in, info, acc, scale, layout::sign::header_bytes, d_report,
                         stream, [&](device_report* verdict, const launch_env& env) -> status {
                           const std::uint64_t n = info.count;
                           const int bt = env.block();
                           sign_validate_header_kernel<<<1, 1, 0, stream>>>(in.data(), in.size(), n, verdict);
                           if (n != 0) {
                             const unsigned g = env.grid(n);
                             levels_validate_scales_kernel<<<g, bt, 0, stream>>>(in.data(), false, verdict);
                             sign_validate_padding_kernel<<<1, 1, 0, stream>>>(in.data(), verdict);
                             sign_add_kernel<<<g, bt, 0, stream>>>(in.data(), acc.data(), scale, verdict);
                           }
                           return {};
                         });
}

static_assert(device_codec<compress::sign>);  // through fused_feedback_impl (cuda/concepts.cuh)

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
