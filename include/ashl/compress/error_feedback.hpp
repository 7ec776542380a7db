// ashl/compress/error_feedback.hpp — error-feedback decorator (a stateful codec).
//
//   ashl::compress::error_feedback<ashl::compress::sign> ef{ashl::compress::sign{}};
//   ef.reserve(id, n);                                   // optional: no allocation on the hot path
//   std::vector<std::byte> buf(ef.max_encoded_bytes(n, ashl::dtype::f32));
//   auto used = ef.encode(ashl::host_view<const float>(g.data(), n), buf, ctx);   // non-const
//   // the server: ashl::compress::sign{}.decode_add(payload, {n, ashl::dtype::f32}, acc, 1, ctx)
//
// Seide et al. (1-bit SGD), Karimireddy et al. (EF-signSGD): keep the
// compression error and add it to the next step, e <- (x + e) - C(x + e).
// One f32 residual per tensor id (ctx.tensor). encode forms x + e in the
// residual buffer, encodes it with the inner codec as an f32 vector, then
// decodes its own payload into the residual with scale -1, leaving exactly
// e = (x + e) - C(x + e) as the inner decoder computes C. The payload is the
// inner codec's, always of f32 input (the message header's dtype must be
// f32 whatever the gradient's dtype), so
// max_encoded_bytes(n, t) = inner.max_encoded_bytes(n, f32) and
// scratch_bytes(n, t) = inner.scratch_bytes(n, f32). On an encode error
// nothing was sent, so the residual keeps x + e (all of it is still owed).
// A tensor's first encode (or a size change) allocates its residual unless
// reserve() was called. Not thread-safe across tensors. docs/algorithms.md §4
// (decorators); docs/design.md "Codec".
#pragma once

#include <ashl/compress/detail/codec.hpp>
#include <ashl/compress/detail/decorator.hpp>
#include <ashl/compress/identity.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

ASHL_DETAIL_COMPRESS_HOST_BEGIN

// One error-feedback step on a caller-owned residual, the body of the
// decorator below and of every host driver that keeps its own residuals
// (ps::commit_encoder): e <- e + x; out <- C(e); e <- e - C(e), C as the
// inner decoder computes it. Returns the payload's bytes. On an encode error
// nothing was sent and e keeps e + x (all of it still owed). No allocation:
// e (n = x.size() elements) and out are the caller's.
template <codec C, gradient_element T>
result<std::size_t> error_feedback_step(const C& inner, host_view<const T> x, host_view<float> e,
                                        std::span<std::byte> out, const codec_context& ctx) {
  const std::size_t n = x.size();
  ASHL_ASSERT(e.size() == n, "error_feedback_step: the residual must have x's size");
  float* r = e.data();
  detail::add_widened(r, x.data(), n);  // 16-bit x widened a block at a time
  auto used = inner.encode(host_view<const float>(r, n), out, ctx);
  if (!used.has_value()) return used;
  ASHL_TRY(inner.decode_add(std::span<const std::byte>(out.data(), *used), {n, dtype::f32}, e, -1.0f, ctx));
  return used;
}

template <codec C>
class error_feedback : public detail::decorator<C, 1> {
  using base = detail::decorator<C, 1>;
  using base::inner_;

 public:
  error_feedback() = default;
  explicit error_feedback(C inner) : base(std::move(inner)) {}
  using base::inner;
  // The inner codec may be replaced between encodes (a new ratio from a
  // re-plan); the residuals are kept: what is owed does not depend on it.
  C& inner() noexcept { return inner_; }

  // The current residual of `tensor` (empty if it was never encoded).
  [[nodiscard]] std::span<const float> residual(std::uint32_t tensor) const noexcept {
    return this->state_.view(tensor, 0);
  }

  template <gradient_element T>
  result<std::size_t> encode(host_view<const T> xv, std::span<std::byte> out, const codec_context& ctx) {
    const std::size_t n = xv.size();
    std::vector<float>& e = this->state_.slot(ctx.tensor, n)[0];  // a new shape starts with no debt
    return error_feedback_step(inner_, xv, host_view<float>(e.data(), n), out, ctx);
  }
};

static_assert(stateful_codec<error_feedback<identity>>);

ASHL_DETAIL_COMPRESS_HOST_END
