// ashl/compress/cuda/dispatch/dispatch_block.cuh — launch logic of the
// block-scaled integer codec on the device.
//
//   ASHL_TRY(detail::fused_encode(detail::fused_tag{}, compress::block_quant{{.bits = 4}}, d_scratch, bytes, x, out,
//                                 used, ctx, residual, stream, d_report));
//
// Encode: the header (one thread), one warp per block for its absmax, step
// and multiplier (scratch: one f32 per block), then one thread per code
// byte; error feedback adds x into the residual first and subtracts each
// decoded value in the code pass. A non-finite block (the CPU codec's
// block.input.block[b] error) goes to the device report, and then neither
// codes nor residual are written. Decode: header, then steps, codes and
// padding, then the add; nothing is added when a check fails.
// docs/codecs.md "block"; docs/algorithms.md §6.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/block.hpp>
#include <ashl/compress/cuda/concepts.cuh>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/kernels/block.cuh>
#include <ashl/compress/cuda/dispatch/kernels/residual.cuh>
#include <ashl/compress/cuda/dispatch/launch.cuh>
#include <ashl/compress/cuda/dispatch/tuning/tuning.cuh>
#include <ashl/compress/layout.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

template <class T>
status fused_encode(fused_tag, const compress::block_quant& codec, void* d_scratch, std::size_t& scratch_bytes,
                    device_view<const T> x, device_view<std::byte> out, std::size_t& used_bytes,
                    const codec_context& ctx, float* residual, cudaStream_t stream, device_report* d_report) {
  const compress::block_quant_options o = codec.options();
  ASHL_TRY(compress::block_quant::validate(o));
  const std::uint64_t n = x.size();
  if (n > layout::bucketed_max_elements) return out_of_range("block.input.size", n, "exceeds 2^48");
  const std::uint64_t B = o.block;
  const std::uint64_t nb = layout::bucket_count(n, B);
  used_bytes = static_cast<std::size_t>(layout::block_payload_bytes(n, B, o.bits));
  const auto m = layout::block_max_code(o.bits);
  return encode_skeleton(
      "block", d_scratch, scratch_bytes, out, used_bytes, d_report, stream,
      [&](scratch_carver& c) { return c.take<float>(nb == 0 ? 1 : nb); },
      [&](float* mult, device_report* verdict, const launch_env& env) -> status {
        const int bt = env.block();
        if (residual != nullptr)
          ASHL_TRY(cuda_check(launch_residual_add(x.data(), residual, n, bt, env.items_per_thread(),
                                                  env.grid(n, env.items_per_thread()), stream),
                              "block.residual_add"));
        const std::uint32_t w3 = o.bits | (o.stochastic ? std::uint32_t{layout::block::rounding_stochastic} << 8 : 0u);
        header_words_kernel<<<1, 1, 0, stream>>>(out.data(), static_cast<std::uint32_t>(n),
                                                 static_cast<std::uint32_t>(n >> 32), o.block, w3, 4);
        if (n == 0) return {};
        std::byte* steps = out.data() + layout::block::header_bytes;
        std::byte* codes = out.data() + layout::block_codes_offset(n, B);
        const unsigned g_steps = env.grid(nb * 32);
        const unsigned g_codes = env.grid(layout::packed_bytes(n, o.bits));
        const philox_stream rng(ctx.seed, ctx.step, ctx.tensor);
        auto run = [&](const auto* src, float* res) {
          using S = std::remove_cv_t<std::remove_pointer_t<decltype(src)>>;
          block_steps_kernel<S><<<g_steps, bt, 0, stream>>>(src, n, B, static_cast<float>(m), steps, mult, verdict);
          block_codes_kernel<S><<<g_codes, bt, 0, stream>>>(src, n, B, o.bits, m, mult, steps, codes, o.stochastic, rng,
                                                            res, verdict);
        };
        if (residual != nullptr)
          run(static_cast<const float*>(residual), residual);
        else
          run(x.data(), nullptr);
        return {};
      });
}

inline status fused_decode_add(fused_tag, const compress::block_quant&, void* d_scratch, std::size_t& scratch_bytes,
                               device_view<const std::byte> in, payload_info info, device_view<float> acc,
                               float scale, cudaStream_t stream, device_report* d_report) {
  return decode_skeleton("block", d_scratch, scratch_bytes, in, info, acc, scale, layout::block::header_bytes,
                         d_report, stream, [&](device_report* verdict, const launch_env& env) -> status {
                           const std::uint64_t n = info.count;
                           const int bt = env.block();
                           block_validate_header_kernel<<<1, 1, 0, stream>>>(in.data(), in.size(), n, verdict);
                           if (n != 0) {
                             // Bytes and steps are at most n; one grid covers both loops.
                             const unsigned g = env.grid(n);
                             block_validate_body_kernel<<<g, bt, 0, stream>>>(in.data(), n, verdict);
                             block_add_kernel<<<g, bt, 0, stream>>>(in.data(), acc.data(), n, scale, verdict);
                           }
                           return {};
                         });
}

static_assert(device_codec<compress::block_quant>);  // through fused_feedback_impl (cuda/concepts.cuh)

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
