// test/cuda/reference_impl.hpp — definitions of reference.hpp; include only
// from test/cuda/<name>_host.cpp (C++ compiler), then instantiate.
#pragma once

#if defined(__CUDACC__)
#error "reference_impl.hpp must be compiled by the host C++ compiler, not nvcc"
#endif

#include "reference.hpp"

#include <ashl/compress/dgc.hpp>
#include <ashl/compress/error_feedback.hpp>
#include <ashl/core/tensor_view.hpp>

namespace ashl_test::ref {

template <class Codec, class T>
encoded encode_as(const Codec& c, const T* x, std::size_t n, const ashl::compress::codec_context& ctx) {
  std::vector<std::byte> out(c.max_encoded_bytes(n, ashl::dtype_of<T>));
  auto used = c.encode(ashl::host_view<const T>(x, n), out, ctx);
  if (!used.has_value()) return {std::nullopt, used.to_status().message()};
  out.resize(*used);
  return {std::move(out), {}};
}

template <class Codec>
encoded encode(const Codec& c, ashl::dtype t, const void* x, std::size_t n, const ashl::compress::codec_context& ctx) {
  switch (t) {
    case ashl::dtype::f32: return encode_as(c, static_cast<const float*>(x), n, ctx);
    case ashl::dtype::f16: return encode_as(c, static_cast<const ashl::half*>(x), n, ctx);
    default: return encode_as(c, static_cast<const ashl::bfloat16*>(x), n, ctx);
  }
}

template <class Decorator, class T>
encoded ef_step(Decorator& ef, const T* x, std::size_t n,
                const ashl::compress::codec_context& ctx) {
  std::vector<std::byte> out(ef.max_encoded_bytes(n, ashl::dtype_of<T>));
  auto used = ef.encode(ashl::host_view<const T>(x, n), out, ctx);
  if (!used.has_value()) return {std::nullopt, used.to_status().message()};
  out.resize(*used);
  return {std::move(out), {}};
}

template <class Codec>
ef_run error_feedback(const Codec& c, ashl::dtype t, const std::vector<const void*>& xs, std::size_t n,
                      ashl::compress::codec_context ctx) {
  ashl::compress::error_feedback<Codec> ef{c};
  ef.reserve(ctx.tensor, n);
  ef_run r;
  const std::uint64_t first = ctx.step;
  for (std::size_t s = 0; s < xs.size(); ++s) {
    ctx.step = first + s;
    switch (t) {
      case ashl::dtype::f32: r.steps.push_back(ef_step(ef, static_cast<const float*>(xs[s]), n, ctx)); break;
      case ashl::dtype::f16: r.steps.push_back(ef_step(ef, static_cast<const ashl::half*>(xs[s]), n, ctx)); break;
      default: r.steps.push_back(ef_step(ef, static_cast<const ashl::bfloat16*>(xs[s]), n, ctx)); break;
    }
  }
  const auto e = ef.residual(ctx.tensor);
  r.residual.assign(e.begin(), e.end());
  return r;
}

template <class Codec>
dgc_run dgc(const Codec& c, float m, ashl::dtype t, const std::vector<const void*>& xs, std::size_t n,
            ashl::compress::codec_context ctx) {
  ashl::compress::dgc<Codec> d{c, {.momentum = m}};
  d.reserve(ctx.tensor, n);
  dgc_run r;
  const std::uint64_t first = ctx.step;
  for (std::size_t s = 0; s < xs.size(); ++s) {
    ctx.step = first + s;
    switch (t) {
      case ashl::dtype::f32: r.steps.push_back(ef_step(d, static_cast<const float*>(xs[s]), n, ctx)); break;
      case ashl::dtype::f16: r.steps.push_back(ef_step(d, static_cast<const ashl::half*>(xs[s]), n, ctx)); break;
      default: r.steps.push_back(ef_step(d, static_cast<const ashl::bfloat16*>(xs[s]), n, ctx)); break;
    }
  }
  const auto u = d.momentum(ctx.tensor);
  const auto v = d.velocity(ctx.tensor);
  r.momentum.assign(u.begin(), u.end());
  r.velocity.assign(v.begin(), v.end());
  return r;
}

}  // namespace ashl_test::ref

// Explicit instantiations for one codec type (dgc: ASHL_TEST_REFERENCE_DGC
// for the sparse-pair codecs).
#define ASHL_TEST_REFERENCE(Codec)                                                                              \
  template ashl_test::ref::encoded ashl_test::ref::encode<Codec>(const Codec&, ashl::dtype, const void*,       \
                                                                  std::size_t,                                  \
                                                                  const ashl::compress::codec_context&);        \
  template ashl_test::ref::ef_run ashl_test::ref::error_feedback<Codec>(                                       \
      const Codec&, ashl::dtype, const std::vector<const void*>&, std::size_t, ashl::compress::codec_context)

#define ASHL_TEST_REFERENCE_DGC(Codec)                                                                          \
  template ashl_test::ref::dgc_run ashl_test::ref::dgc<Codec>(const Codec&, float, ashl::dtype,                \
                                                              const std::vector<const void*>&, std::size_t,     \
                                                              ashl::compress::codec_context)
