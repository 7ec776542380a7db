// ashl/compress/cuda/dispatch/dispatch_dense.cuh — launch logic of the dense
// device codecs (identity, fp16, bf16): argument checks, the two-call scratch
// protocol, grid sizing from the tuning table.
//
//   ASHL_TRY(detail::dispatch_dense_encode("fp16", dense_target::f16, strict, d_scratch, scratch_bytes,
//                                          x, out, used, report, stream));
//
// The dense payload size is a function of n alone, so every check on sizes is
// made on the host and returned as a status; only the strict-overflow check
// needs the data and goes to the device_report. No host synchronization, no
// allocation: capturable into a CUDA graph. docs/algorithms.md §4.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/compress/cuda/dispatch/kernels/dense.cuh>
#include <ashl/compress/cuda/dispatch/launch.cuh>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

// Dense codecs use no scratch, but the two-call protocol needs a non-null
// buffer to mean "run", so they ask for the smallest piece (as CUB asks for
// one byte when it needs none).
inline constexpr std::size_t dense_scratch_bytes = scratch_carver::alignment;

inline status check_dense_decode_args(std::string_view codec, payload_info info, std::size_t in_size,
                                      std::size_t value_bytes, std::size_t acc_size, float scale) {
  const std::string c(codec);
  if (info.type != dtype::f32 && info.type != dtype::f16 && info.type != dtype::bf16)
    return invalid_argument(c + ".info.type", to_string(info.type), "must be f32, f16 or bf16");
  if (acc_size != info.count)
    return invalid_argument(c + ".acc.size", acc_size, "must equal info.count = " + std::to_string(info.count));
  if (!std::isfinite(scale)) return invalid_argument(c + ".scale", scale, "must be finite");
  if (in_size != info.count * value_bytes)
    return malformed(c + ".payload_bytes", in_size,
                     "must be count * " + std::to_string(value_bytes) + " = " + std::to_string(info.count * value_bytes));
  return {};
}

template <class T>
status dispatch_dense_encode(std::string_view codec, dense_target target, bool strict, void* d_scratch,
                             std::size_t& scratch_bytes, device_view<const T> x, device_view<std::byte> out,
                             std::size_t& used_bytes, device_report* report, cudaStream_t stream) {
  const std::string c(codec);
  const std::size_t n = x.size();
  const std::size_t bytes = n * (target == dense_target::identity ? sizeof(T) : 2);
  used_bytes = bytes;
  auto go = scratch_protocol(codec, d_scratch, scratch_bytes, dense_scratch_bytes);
  if (!go) return go.error();
  if (!*go) return {};
  ASHL_TRY(check_output(codec, out, bytes));
  ASHL_TRY(clear_report(report, stream, codec));
  if (n == 0) return {};
  launch_env env;
  ASHL_TRY(current_launch_env(codec, env));
  auto* kernel = dense_encode_kernel<T, dense_target::identity>;
  if (target == dense_target::f16) kernel = dense_encode_kernel<T, dense_target::f16>;
  if (target == dense_target::bf16) kernel = dense_encode_kernel<T, dense_target::bf16>;
  const int ipt = env.items_per_thread();
  kernel<<<env.grid(n, ipt), env.block(), 0, stream>>>(x.data(), out.data(), n, strict, report, ipt);
  return cuda_check(cudaGetLastError(), c + ".encode_kernel");
}

// `payload_type`: the dtype of the payload's values (the input dtype for
// identity, f16 or bf16 for the casts).
inline status dispatch_dense_decode_add(std::string_view codec, dtype payload_type, void* d_scratch,
                                        std::size_t& scratch_bytes, device_view<const std::byte> in,
                                        payload_info info, device_view<float> acc, float scale,
                                        cudaStream_t stream) {
  const std::string c(codec);
  auto go = scratch_protocol(codec, d_scratch, scratch_bytes, dense_scratch_bytes);
  if (!go) return go.error();
  if (!*go) return {};
  ASHL_TRY(check_dense_decode_args(codec, info, in.size(), size_of(payload_type), acc.size(), scale));
  ASHL_TRY(check_alignment(c + ".in.data", in.data(), 4));
  const std::size_t n = info.count;
  if (n == 0) return {};
  launch_env env;
  ASHL_TRY(current_launch_env(codec, env));
  const int ipt = env.items_per_thread();
  with_value_type(payload_type, [&](auto type) {
    dense_decode_add_kernel<decltype(type)::value>
        <<<env.grid(n, ipt), env.block(), 0, stream>>>(in.data(), acc.data(), n, scale, ipt);
  });
  return cuda_check(cudaGetLastError(), c + ".decode_add_kernel");
}

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
