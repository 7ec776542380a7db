// test/cuda/odr_encode.hpp — what test/cuda/odr.cu (nvcc) and odr_host.cpp
// (the host C++ compiler) both compute: the payload of every host codec, and
// of error feedback and DGC over two steps, for f32, f16 and bf16 inputs of a
// few sizes, with one fixed context, and what each payload adds into a
// non-zero accumulator at scale 0.75. test/compress/simd_paths_level.cpp
// computes the same at each forced host SIMD level.
//
// odr.cu and odr_host.cpp define ASHL_ODR_VERSION_NS before including this: the
// library is included with the token `v0` renamed to it, so ashl's
// versioned inline namespace (config.hpp) differs between the two files and
// no inline function of the library has the same mangled name in both. The
// linker then cannot keep one copy of, say, qsgd's encode for both callers
// (which would hide two different bodies at -O0): each file runs the code
// its own compiler built. Only std types cross between the files.
#pragma once


// Every standard and platform header the library uses, first, so the
// rename below reaches only ashl's own code.
#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <nmmintrin.h>
#endif

#if defined(v0)
#error "odr_encode.hpp renames the token v0; it must not be a macro already"
#endif
#if defined(ASHL_ODR_VERSION_NS)
#define v0 ASHL_ODR_VERSION_NS
#endif
#include <ashl/compress/block.hpp>
#include <ashl/compress/cast.hpp>
#include <ashl/compress/dgc.hpp>
#include <ashl/compress/detail/host_simd.hpp>
#include <ashl/compress/error_feedback.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/natural.hpp>
#include <ashl/compress/qsgd.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/sign.hpp>
#include <ashl/compress/terngrad.hpp>
#include <ashl/compress/threshold.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/compress/topk_sampled.hpp>

#if defined(ASHL_ODR_VERSION_NS)
#undef v0
#endif

struct odr_payload {
  std::string what;               // "qsgd f16 n=4099 step=17"
  std::vector<std::byte> bytes;   // empty with `error` set when encode failed
  std::vector<std::byte> decoded;  // the accumulator after decode_add, as bytes
  std::string error;
};

namespace {
namespace odr_detail {

namespace cc = ::ashl::compress;

// Gradient-like values over several decades, some zeros, both signs.
inline std::vector<float> odr_input(std::size_t n) {
  std::vector<float> x(n);
  std::uint64_t s = 0x9e3779b97f4a7c15ull ^ n;
  for (std::size_t i = 0; i < n; ++i) {
    s += 0x9e3779b97f4a7c15ull;
    std::uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 11) * 0x1.0p-53;  // [0, 1)
    const int decade = static_cast<int>(z & 7) - 5;              // 1e-5 .. 1e2
    x[i] = (i % 97 == 13) ? 0.0f : static_cast<float>((2.0 * u - 1.0) * std::pow(10.0, decade));
  }
  return x;
}

template <class T>
std::vector<T> as(const std::vector<float>& x) {
  std::vector<T> y;
  y.reserve(x.size());
  for (float v : x) y.push_back(::ashl::from_float<T>(v));
  return y;
}

template <class T>
const char* type_name() {
  return std::is_same_v<T, float> ? "f32" : std::is_same_v<T, ::ashl::half> ? "f16" : "bf16";
}

template <class C, class T>
void encode_one(C& c, const char* name, const std::vector<T>& x, const cc::codec_context& ctx,
                std::vector<odr_payload>& out) {
  odr_payload p;
  p.what = std::string(name) + " " + type_name<T>() + " n=" + std::to_string(x.size()) +
           " step=" + std::to_string(ctx.step);
  std::vector<std::byte> buf(c.max_encoded_bytes(x.size(), ::ashl::dtype_of<T>));
  std::vector<std::byte> scratch(c.scratch_bytes(x.size(), ::ashl::dtype_of<T>));
  cc::codec_context k = ctx;
  k.scratch = scratch;
  auto r = c.encode(::ashl::host_view<const T>(x.data(), x.size()), std::span<std::byte>(buf), k);
  if (!r) {
    p.error = r.error().message();
    out.push_back(std::move(p));
    return;
  }
  buf.resize(*r);
  // acc[i] = (i % 64) / 8 - 3: not zero, so decode_add must add, not overwrite.
  std::vector<float> acc(x.size());
  for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = static_cast<float>(i % 64) / 8.0f - 3.0f;
  // A decorator encodes x + its state in f32, so its payload says f32.
  const ::ashl::dtype payload_type = cc::stateful_codec<C> ? ::ashl::dtype::f32 : ::ashl::dtype_of<T>;
  const ::ashl::status st = c.decode_add(std::span<const std::byte>(buf), cc::payload_info{x.size(), payload_type},
                                         ::ashl::host_view<float>(acc.data(), acc.size()), 0.75f, k);
  if (!st) p.error = "decode: " + st.message();
  p.decoded.resize(acc.size() * sizeof(float));
  if (!acc.empty()) std::memcpy(p.decoded.data(), acc.data(), p.decoded.size());
  p.bytes = std::move(buf);
  out.push_back(std::move(p));
}

template <class T>
void encode_type(const std::vector<float>& xf, std::vector<odr_payload>& out) {
  const std::vector<T> x = as<T>(xf);
  cc::codec_context ctx{.seed = 0x1234567890abcdefull, .step = (std::uint64_t{3} << 32) + 17, .tensor = 5};
  auto each = [&](auto c, const char* name) { encode_one(c, name, x, ctx, out); };
  each(cc::identity{}, "identity");
  each(cc::fp16{}, "fp16");
  each(cc::bf16{}, "bf16");
  each(cc::topk{0.01}, "topk");
  each(cc::topk_sampled{0.01}, "topk_sampled");
  each(cc::randomk{cc::randomk_options{}}, "randomk");
  each(cc::threshold{cc::threshold_options{.theta = 0.5f}}, "threshold");
  each(cc::qsgd{}, "qsgd");
  each(cc::qsgd{cc::qsgd_options{.levels = 3, .bucket = 100}}, "qsgd s=3");
  each(cc::terngrad{}, "terngrad");
  each(cc::sign{}, "sign");
  each(cc::natural{}, "natural");
  each(cc::block_quant{}, "block");
  each(cc::block_quant{cc::block_quant_options{.bits = 2, .block = 96, .stochastic = true}}, "block2 stochastic");
  // Every width on both roundings; a block of 24 (a partial SIMD step per
  // block) and one larger than the 1024-element piece.
  each(cc::block_quant{cc::block_quant_options{.bits = 8, .block = 24}}, "block8 B=24");
  each(cc::block_quant{cc::block_quant_options{.bits = 8, .block = 8, .stochastic = true}}, "block8 stochastic B=8");
  each(cc::block_quant{cc::block_quant_options{.bits = 4, .block = 2048, .stochastic = true}},
       "block4 stochastic B=2048");
  each(cc::block_quant{cc::block_quant_options{.bits = 2, .block = 64}}, "block2");
  // The decorators over two steps (their state feeds the second payload).
  cc::error_feedback<cc::qsgd> ef{cc::qsgd{}};
  cc::dgc<cc::topk> dgc{cc::topk{0.01}};
  for (std::uint64_t step = 0; step < 2; ++step) {
    ctx.step = step;
    encode_one(ef, "error_feedback<qsgd>", x, ctx, out);
    encode_one(dgc, "dgc<topk>", x, ctx, out);
  }
}

inline std::vector<odr_payload> encode_all() {
  std::vector<odr_payload> out;
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{4099}, std::size_t{70001}}) {
    const std::vector<float> x = odr_input(n);
    encode_type<float>(x, out);
    encode_type<::ashl::half>(x, out);
    encode_type<::ashl::bfloat16>(x, out);
  }
  return out;
}

}  // namespace odr_detail
}  // namespace
