// ashl/compress/cuda/levels.cuh — the device_impl of both level quantizers,
// qsgd and terngrad: one path through dispatch/dispatch_levels.cuh, as the
// CPU codecs share compress/detail/bucketed.hpp. Include cuda/qsgd.cuh or
// cuda/terngrad.cuh, which document each codec; this header is what they
// share.
//
//   compress::cuda::encode(compress::qsgd{}, x, out, ctx, scratch, d_report, stream);
//
// Encode, error feedback (a refused input leaves x + e in the residual) and
// decode, with fused_feedback_impl (cuda/concepts.cuh). ALGORITHMS.md §4.
#pragma once

#include <ashl/compress/cuda/concepts.cuh>
#include <ashl/compress/cuda/dispatch/dispatch_levels.cuh>
#include <ashl/compress/qsgd.hpp>
#include <ashl/compress/terngrad.hpp>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda {

template <>
struct device_impl<compress::qsgd>
    : detail::fused_feedback_impl<compress::qsgd, detail::levels_ops<compress::qsgd, true>> {};
template <>
struct device_impl<compress::terngrad>
    : detail::fused_feedback_impl<compress::terngrad, detail::levels_ops<compress::terngrad, false>> {};

static_assert(device_codec<compress::qsgd>);
static_assert(device_codec<compress::terngrad>);

}  // namespace compress::cuda
ASHL_NAMESPACE_END
