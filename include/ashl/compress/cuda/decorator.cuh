// ashl/compress/cuda/decorator.cuh — what the device decorators share, as
// compress/detail/decorator.hpp is for the host ones: the inner codec, the
// per-tensor state (dispatch/state.cuh), the sizes of the inner codec's f32
// payload, reserve/reset, and decode as the inner codec decodes.
//
//   template <device_codec C>
//   class error_feedback : public detail::device_decorator<error_feedback<C>, C, 1> { ... };
//   struct device_impl<error_feedback<C>> : detail::decorator_decode<error_feedback<C>> { ... encode ... };
//
// Derived names itself (`static constexpr const char* name`) for the
// errors of its state. docs/algorithms.md §4 (decorators).
#pragma once

#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/concepts.cuh>
#include <ashl/compress/cuda/dispatch/state.cuh>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

template <class Derived, class C, std::size_t K>
class device_decorator {
 public:
  using inner_codec = C;
  static constexpr codec_id id = C::id;  // the payload is the inner codec's

  device_decorator() = default;
  explicit device_decorator(C inner) : inner_(std::move(inner)) {}
  [[nodiscard]] const C& inner() const noexcept { return inner_; }

  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n, dtype) const noexcept {
    return inner_.max_encoded_bytes(n, dtype::f32);
  }

  // Allocates (zeroed, on `stream`) the state of `tensor` for n elements.
  status reserve(std::uint32_t tensor, std::size_t n, cudaStream_t stream) {
    std::array<float*, K> a{};
    return state_.slot(tensor, n, stream, Derived::name, a);
  }
  status reset(cudaStream_t stream) { return state_.zero(stream, Derived::name); }

 protected:
  C inner_{};
  tensor_state_map<K> state_;
};

// decode_add of a decorator: the inner codec's.
template <class D>
struct decorator_decode {
  static status decode_add(const D& d, device_view<const std::byte> in, payload_info info, device_view<float> acc,
                           float scale, const codec_context& ctx, device_scratch& scratch, device_report* report,
                           cudaStream_t stream) {
    return device_impl<typename D::inner_codec>::decode_add(d.inner(), in, info, acc, scale, ctx, scratch, report,
                                                            stream);
  }
};

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
