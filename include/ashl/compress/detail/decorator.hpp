// ashl/compress/detail/decorator.hpp — what the host decorators
// (error_feedback, dgc) share: the inner codec, the per-tensor state, and
// the members that only forward to the inner codec.
//
//   template <codec C>
//   class error_feedback : public detail::decorator<C, 1> { ... encode ... };
//
// A decorator's payload is its inner codec's, always of f32 input (the
// decorator encodes its own f32 state, whatever the gradient's dtype), so
// max_encoded_bytes and scratch_bytes ask the inner codec about f32, and
// decode_add is the inner codec's. The state is K f32 arrays per tensor id
// (detail/tensor_state.hpp). docs/algorithms.md §4 (decorators).
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/detail/host_simd.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/detail/tensor_state.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/wire/ids.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

ASHL_DETAIL_COMPRESS_HOST_BEGIN
namespace detail {

template <codec C, std::size_t K>
class decorator {
 public:
  using codec_concept = stateful_codec_tag;
  using inner_codec = C;
  static constexpr codec_id id = C::id;  // the payload is the inner codec's

  decorator() = default;
  explicit decorator(C inner) : inner_(std::move(inner)) {}
  [[nodiscard]] const C& inner() const noexcept { return inner_; }

  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n, dtype) const noexcept {
    return inner_.max_encoded_bytes(n, dtype::f32);
  }
  [[nodiscard]] std::size_t scratch_bytes(std::size_t n, dtype) const noexcept {
    return inner_.scratch_bytes(n, dtype::f32);
  }
  status decode_add(std::span<const std::byte> in, payload_info info, host_view<float> acc, float scale,
                    const codec_context& ctx) const {
    return inner_.decode_add(in, info, acc, scale, ctx);
  }

  // Allocates (zeroed) the state of `tensor` for n elements ahead of time,
  // so its first encode does not allocate.
  void reserve(std::uint32_t tensor, std::size_t n) { state_.slot(tensor, n); }
  void reset() noexcept { state_.reset(); }

 protected:
  C inner_{};
  tensor_state<K> state_;
};

}  // namespace detail
ASHL_DETAIL_COMPRESS_HOST_END
