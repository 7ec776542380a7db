// test/fuzz/decode_fuzz.hpp — shared body of the codec decode fuzz targets.
//
//   extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* d, std::size_t n) {
//     return decode_fuzz::run(ashl::compress::topk{}, d, n, decode_fuzz::payload::sparse_pairs);
//   }
//
// Input layout: byte 0 selects the dtype (mod 3: f32, f16, bf16) and the
// scale (byte 0 / 3, mod 8, from `scales`), bytes 1-2 the element count (u16
// little-endian, at most 4096), byte 3 the step; the rest is the payload.
// Seeds in test/fuzz/corpus/decode_<codec>/ use the same layout; ctest
// replays them through this same function (test/fuzz/replay/main.cpp).
//
// A refused payload must leave the accumulator untouched and name its field.
// An accepted one must satisfy, at the input's scale and at -0.75 (so a
// corpus of scale-1 seeds still exercises another scale):
//   - decoding is deterministic (two decodes into zeros, same bits);
//   - decode into c equals c + decode into zeros, element by element (one
//     add per element: no overwrite, no double add);
//   - sparse-pair payloads change only the elements they index;
//   - lossless payloads (identity, fp16, bf16) re-encode to the same bytes
//     (a NaN element may come back with another NaN's bits).
#pragma once

#include <ashl/compress/concepts.hpp>
#include <ashl/core/dtype.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

namespace decode_fuzz {

// What the payload is, for the invariants that depend on it.
enum class payload {
  opaque,        // no layout-specific check
  sparse_pairs,  // u64 n, u32 count, count u32 indices, values
  lossless_as_input,  // dense values of the payload's dtype (identity)
  lossless_from_f32,  // dense 16-bit values that an f32 input re-encodes to (fp16, bf16)
};

inline constexpr float scales[8] = {1.0f, -1.0f, 0.5f, -3.0f, 1e-3f, 1048576.0f, 0.0f, -0.375f};

inline bool same(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

template <class C>
std::vector<std::byte> reencode(const C& codec, const std::vector<float>& z, ashl::dtype t, payload kind,
                                const ashl::compress::codec_context& ctx) {
  auto go = [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> x(z.size());
    for (std::size_t i = 0; i < z.size(); ++i) x[i] = ashl::from_float<T>(z[i]);
    std::vector<std::byte> out(codec.max_encoded_bytes(z.size(), ashl::dtype_of<T>));
    auto used = codec.encode(ashl::host_view<const T>(x.data(), x.size()), out, ctx);
    if (!used) std::abort();  // a value the codec decoded must encode again
    out.resize(*used);
    return out;
  };
  if (kind == payload::lossless_from_f32 || t == ashl::dtype::f32) return go(float{});
  if (t == ashl::dtype::f16) return go(ashl::half{});
  return go(ashl::bfloat16{});
}

template <class C>
void check_accepted(const C& codec, std::span<const std::byte> p, ashl::compress::payload_info info, float scale,
                    const std::vector<float>& c, payload kind, const ashl::compress::codec_context& ctx) {
  const std::size_t count = info.count;
  auto decode = [&](std::vector<float> acc, float s) {
    if (!codec.decode_add(p, info, ashl::host_view<float>(acc.data(), count), s, ctx).ok())
      std::abort();  // accepted once, refused now
    return acc;
  };
  const std::vector<float> zero(count, 0.0f);
  const std::vector<float> z = decode(zero, scale);
  if (!same_bits(z, decode(zero, scale))) std::abort();  // not deterministic
  const std::vector<float> r = decode(c, scale);
  for (std::size_t i = 0; i < count; ++i)
    if (!same(r[i], c[i] + z[i])) std::abort();  // not one add of scale * value per element
  if (kind == payload::sparse_pairs) {
    std::vector<bool> named(count, false);
    std::uint32_t m = 0;
    std::memcpy(&m, p.data() + 8, 4);
    for (std::uint32_t j = 0; j < m; ++j) {
      std::uint32_t i = 0;
      std::memcpy(&i, p.data() + 12 + 4 * std::size_t{j}, 4);
      named[i] = true;
    }
    for (std::size_t i = 0; i < count; ++i)
      if (!named[i] && !same_bits({r[i]}, {c[i]})) std::abort();  // changed an element it does not index
  }
  if ((kind == payload::lossless_as_input || kind == payload::lossless_from_f32) && scale == 1.0f) {
    // Into -0: -0 + v is v for every non-NaN v (+0 would turn -0 into +0).
    const std::vector<float> v = decode(std::vector<float>(count, -0.0f), 1.0f);
    const std::vector<std::byte> again = reencode(codec, v, info.type, kind, ctx);
    if (again.size() != p.size()) std::abort();
    const std::size_t w = count == 0 ? 1 : p.size() / count;
    for (std::size_t i = 0; i < count; ++i)
      if (std::memcmp(again.data() + w * i, p.data() + w * i, w) != 0 && !std::isnan(v[i])) std::abort();
  }
}

template <class C>
int run(const C& codec, const std::uint8_t* data, std::size_t size, payload kind = payload::opaque) {
  if (size < 4) return 0;
  static constexpr ashl::dtype types[3] = {ashl::dtype::f32, ashl::dtype::f16, ashl::dtype::bf16};
  const ashl::dtype t = types[data[0] % 3];
  const float scale = scales[(data[0] / 3) % 8];
  const std::size_t count = (static_cast<std::size_t>(data[1]) | (static_cast<std::size_t>(data[2]) << 8)) % 4097;
  const ashl::compress::codec_context ctx{.seed = 1, .step = data[3], .tensor = 0};
  // A non-zero accumulator with varied values (exact in f32).
  std::vector<float> c(count);
  for (std::size_t i = 0; i < count; ++i) c[i] = 3.0f - 0.25f * static_cast<float>(i % 13);
  std::vector<float> acc = c;
  const std::span<const std::byte> p(reinterpret_cast<const std::byte*>(data + 4), size - 4);
  const ashl::status s = codec.decode_add(p, {count, t}, ashl::host_view<float>(acc.data(), count), scale, ctx);
  if (!s.ok()) {
    if (s.message().empty()) std::abort();
    if (!same_bits(acc, c)) std::abort();  // a refused payload touched the accumulator
    return 0;
  }
  check_accepted(codec, p, {count, t}, scale, c, kind, ctx);
  if (scale != -0.75f) check_accepted(codec, p, {count, t}, -0.75f, c, kind, ctx);
  return 0;
}

}  // namespace decode_fuzz
