// test/cuda/reference.hpp — the CPU codecs as the host C++ compiler builds
// them, for the GPU tests to compare with.
//
//   auto cpu = ashl_test::ref::encode(compress::qsgd{}, dtype::f32, x.data(), n, ctx);   // optional payload
//
// Why not call the CPU codec in the .cu file itself: compress/detail takes
// scalar paths when __CUDACC__ is defined (also in nvcc's host pass), and
// qsgd's f32 sum of squares then adds in another order than the gcc/clang
// build every CPU user runs. The definitions (reference_impl.hpp) are
// compiled in test/cuda/<name>_host.cpp by the C++ compiler; this header only
// declares them, so it is safe in both kinds of translation unit.
#pragma once

#include <ashl/compress/concepts.hpp>
#include <ashl/core/dtype.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace ashl_test::ref {

struct encoded {
  std::optional<std::vector<std::byte>> payload;  // nullopt: the CPU codec refused
  std::string error;                              // its message then
};

// The CPU codec's payload for n elements of type t at x.
template <class Codec>
encoded encode(const Codec& c, ashl::dtype t, const void* x, std::size_t n, const ashl::compress::codec_context& ctx);

// error_feedback<Codec> over several steps (ctx.step = first_step + s for
// input s); every payload (nullopt where refused) and the residual after.
struct ef_run {
  std::vector<encoded> steps;
  std::vector<float> residual;
};
template <class Codec>
ef_run error_feedback(const Codec& c, ashl::dtype t, const std::vector<const void*>& xs, std::size_t n,
                      ashl::compress::codec_context ctx);

// dgc<Codec> with momentum m over several steps, as error_feedback above;
// the payloads, then u (momentum) and v (velocity) after.
struct dgc_run {
  std::vector<encoded> steps;
  std::vector<float> momentum, velocity;
};
template <class Codec>
dgc_run dgc(const Codec& c, float m, ashl::dtype t, const std::vector<const void*>& xs, std::size_t n,
            ashl::compress::codec_context ctx);

}  // namespace ashl_test::ref
