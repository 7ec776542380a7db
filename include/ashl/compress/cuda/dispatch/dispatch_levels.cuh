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
// checks on the device, in the CPU's order, then the add. docs/algorithms.md §4.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cuda/concepts.cuh>
#include <ashl/compress/qsgd.hpp>
#include <ashl/compress/terngrad.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/launch.cuh>
#include <ashl/compress/cuda/dispatch/kernels/levels.cuh>
#include <ashl/compress/cuda/dispatch/kernels/residual.cuh>
#include <ashl/compress/cuda/dispatch/tuning/tuning.cuh>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/status.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/core/tensor_view.hpp>

#include <bit>
#include <concepts>
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

template <class T>
status dispatch_levels_encode(const levels_params& p, void* d_scratch, std::size_t& scratch_bytes,
                              device_view<const T> x, device_view<std::byte> out, std::size_t& used_bytes,
                              const codec_context& ctx, float* residual, cudaStream_t stream,
                              device_report* d_report) {
  const std::string c(p.codec);
  const std::uint64_t n = x.size();
  if (n > layout::bucketed_max_elements) return out_of_range(c + ".input.size", n, "exceeds 2^48");
  const std::uint64_t B = p.bucket;
  const std::uint64_t nb = layout::bucket_count(n, B);
  const unsigned bits = layout::qsgd_code_bits(p.levels);
  used_bytes = layout::bucketed_payload_bytes(p.header_bytes, n, B, bits);
  const std::uint64_t cpb = levels_chunks_per_bucket(n, B);
  const std::uint64_t nchunks = nb * cpb;
  struct pieces {
    float* chunk_sum;
    std::uint32_t* chunk_max;
  };
  return encode_skeleton(
      p.codec, d_scratch, scratch_bytes, out, used_bytes, d_report, stream,
      [&](scratch_carver& sc) { return pieces{sc.take<float>(nchunks), sc.take<std::uint32_t>(nchunks)}; },
      [&](const pieces& s, device_report* verdict, const launch_env& env) -> status {
        const int bt = env.block();
        if (residual != nullptr)
          ASHL_TRY(cuda_check(launch_residual_add(x.data(), residual, n, bt, env.items_per_thread(),
                                                  env.grid(n, env.items_per_thread()), stream),
                              c + ".residual_add"));
        // Header: n, bucket (and levels) as little-endian words, by a kernel
        // (a copy from host memory would not replay from a graph).
        header_words_kernel<<<1, 1, 0, stream>>>(out.data(), static_cast<std::uint32_t>(n),
                                                 static_cast<std::uint32_t>(n >> 32), p.bucket, p.levels,
                                                 static_cast<unsigned>(p.header_bytes / 4));
        if (n == 0) return {};
        auto* scales = reinterpret_cast<float*>(out.data() + p.header_bytes);
        std::byte* codes = out.data() + layout::bucketed_codes_offset(p.header_bytes, n, B);
        const philox_stream rng(ctx.seed, ctx.step, ctx.tensor);
        const float L = static_cast<float>(p.levels);
        const unsigned g_chunks = env.grid(nchunks * 8);
        const unsigned g_buckets = env.grid(nb);
        const unsigned g_codes = env.grid((n + 7) / 8);
        auto run = [&](const auto* src, float* res) {
          using S = std::remove_cv_t<std::remove_pointer_t<decltype(src)>>;
          if (p.l2) {
            levels_chunk_kernel<S, true><<<g_chunks, bt, 0, stream>>>(src, n, B, cpb, nchunks, s.chunk_sum,
                                                                      s.chunk_max);
            levels_scale_kernel<S, true><<<g_buckets, bt, 0, stream>>>(src, n, B, cpb, nb, s.chunk_sum, s.chunk_max,
                                                                       scales, verdict);
          } else {
            levels_chunk_kernel<S, false><<<g_chunks, bt, 0, stream>>>(src, n, B, cpb, nchunks, s.chunk_sum,
                                                                       s.chunk_max);
            levels_scale_kernel<S, false><<<g_buckets, bt, 0, stream>>>(src, n, B, cpb, nb, s.chunk_sum, s.chunk_max,
                                                                        scales, verdict);
          }
          levels_codes_kernel<S><<<g_codes, bt, 0, stream>>>(src, n, B, L, bits, scales, codes, rng, res, verdict);
        };
        if (residual != nullptr)
          run(static_cast<const float*>(residual), residual);
        else
          run(x.data(), nullptr);
        return {};
      });
}

inline status dispatch_levels_decode_add(const char* codec, bool has_levels, std::uint32_t max_levels, void* d_scratch,
                                         std::size_t& scratch_bytes, device_view<const std::byte> in,
                                         payload_info info, device_view<float> acc, float scale, cudaStream_t stream,
                                         device_report* d_report) {
  const std::size_t header = has_levels ? layout::qsgd::header_bytes : layout::terngrad::header_bytes;
  return decode_skeleton(
      codec, d_scratch, scratch_bytes, in, info, acc, scale, header, d_report, stream,
      [&](device_report* verdict, const launch_env& env) -> status {
        const int bt = env.block();
        const std::uint64_t n = info.count;
        levels_validate_header_kernel<<<1, 1, 0, stream>>>(in.data(), in.size(), n, has_levels, max_levels, verdict);
        if (n != 0) {
          // Grids from n: a bucket count or group count never exceeds it;
          // every kernel loops over what the (validated) header says.
          const unsigned g = env.grid((n + 7) / 8);
          levels_validate_scales_kernel<<<g, bt, 0, stream>>>(in.data(), has_levels, verdict);
          levels_validate_codes_kernel<<<g, bt, 0, stream>>>(in.data(), has_levels, verdict);
          levels_validate_padding_kernel<<<1, 1, 0, stream>>>(in.data(), has_levels, verdict);
          levels_add_kernel<<<g, bt, 0, stream>>>(in.data(), has_levels, acc.data(), scale, verdict);
        }
        return {};
      });
}

// The fused kernels (cuda/concepts.cuh) of both quantizers: qsgd (L2 norms,
// the levels of its options, a levels header field) and terngrad (max |x|,
// one level).
template <class Codec>
concept levels_quantizer = std::same_as<Codec, compress::qsgd> || std::same_as<Codec, compress::terngrad>;

template <levels_quantizer Codec, class T>
status fused_encode(fused_tag, const Codec& c, void* d_scratch, std::size_t& scratch_bytes, device_view<const T> x,
                    device_view<std::byte> out, std::size_t& used_bytes, const codec_context& ctx, float* residual,
                    cudaStream_t stream, device_report* d_report) {
  constexpr bool l2 = std::same_as<Codec, compress::qsgd>;
  std::uint32_t levels = 1;
  if constexpr (l2) levels = c.options().levels;
  const levels_params p{l2 ? "qsgd" : "terngrad", l2 ? layout::qsgd::header_bytes : layout::terngrad::header_bytes,
                        c.options().bucket, levels, l2};
  return dispatch_levels_encode<T>(p, d_scratch, scratch_bytes, x, out, used_bytes, ctx, residual, stream, d_report);
}

template <levels_quantizer Codec>
status fused_decode_add(fused_tag, const Codec&, void* d_scratch, std::size_t& scratch_bytes,
                        device_view<const std::byte> in, payload_info info, device_view<float> acc, float scale,
                        cudaStream_t stream, device_report* d_report) {
  constexpr bool l2 = std::same_as<Codec, compress::qsgd>;
  return dispatch_levels_decode_add(l2 ? "qsgd" : "terngrad", l2, l2 ? layout::qsgd::max_levels : 1, d_scratch,
                                    scratch_bytes, in, info, acc, scale, stream, d_report);
}

static_assert(device_codec<compress::qsgd>);  // through fused_feedback_impl (cuda/concepts.cuh)
static_assert(device_codec<compress::terngrad>);

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
