// test/support/codec_testing.hpp — helpers shared by the codec tests.
//
//   auto payload = encode_to_vector(codec, std::span<const float>(x), ctx);
//   check_rejects_truncation(codec, payload, {n, ashl::dtype::f32});
//
// Every decoder must refuse a damaged payload with an error and leave the
// accumulator untouched; these helpers check both.
#pragma once

#include <ashl/compress/concepts.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/philox.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace codec_testing {

template <class C, class T>
std::vector<std::byte> encode_to_vector(const C& c, std::span<const T> x, const ashl::compress::codec_context& ctx = {}) {
  std::vector<std::byte> out(c.max_encoded_bytes(x.size(), ashl::dtype_of<T>));
  auto used = c.encode(ashl::host_view<const T>(x.data(), x.size()), out, ctx);
  BOOST_REQUIRE_MESSAGE(used.has_value(), used.to_status().to_string());
  BOOST_REQUIRE_LE(*used, out.size());
  out.resize(*used);
  return out;
}

template <class T>
std::vector<T> to_type(const std::vector<float>& x) {
  std::vector<T> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = ashl::from_float<T>(x[i]);
  return r;
}

// Decodes into an accumulator filled with a sentinel; on failure the
// accumulator must be unchanged. Returns the status.
template <class C>
ashl::status decode_guarded(const C& c, std::span<const std::byte> payload, ashl::compress::payload_info info,
                            const ashl::compress::codec_context& ctx = {}) {
  std::vector<float> acc(info.count, 7.25f);
  ashl::status s = c.decode_add(payload, info, ashl::host_view<float>(acc.data(), acc.size()), 1.0f, ctx);
  if (!s.ok()) {
    bool untouched = true;
    for (float v : acc) untouched = untouched && v == 7.25f;
    BOOST_CHECK_MESSAGE(untouched, "accumulator modified by a failed decode: " + s.to_string());
    BOOST_CHECK(!s.message().empty());
  }
  return s;
}

// Every strict prefix and a one-byte extension must be refused.
template <class C>
void check_rejects_truncation(const C& c, const std::vector<std::byte>& payload, ashl::compress::payload_info info,
                              const ashl::compress::codec_context& ctx = {}) {
  BOOST_REQUIRE(decode_guarded(c, payload, info, ctx).ok());
  for (std::size_t len = 0; len < payload.size(); ++len) {
    auto s = decode_guarded(c, std::span<const std::byte>(payload.data(), len), info, ctx);
    BOOST_CHECK_MESSAGE(!s.ok(), "a truncation to " + std::to_string(len) + " bytes was accepted");
  }
  auto longer = payload;
  longer.push_back(std::byte{0});
  BOOST_CHECK(!decode_guarded(c, longer, info, ctx).ok());
}

inline void put_u32(std::vector<std::byte>& p, std::size_t off, std::uint32_t v) { std::memcpy(p.data() + off, &v, 4); }
inline void put_u64(std::vector<std::byte>& p, std::size_t off, std::uint64_t v) { std::memcpy(p.data() + off, &v, 8); }
inline std::uint32_t get_u32(const std::vector<std::byte>& p, std::size_t off) {
  std::uint32_t v;
  std::memcpy(&v, p.data() + off, 4);
  return v;
}

inline std::vector<float> normal_values(std::size_t n, std::uint32_t seed, float sigma = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> x(n);
  for (auto& v : x) v = d(g);
  return x;
}

// Sparse payload (u64 n, u32 count, indices, values) decoded to pairs.
struct pairs {
  std::vector<std::uint32_t> index;
  std::vector<float> value;
};
inline pairs read_pairs(const std::vector<std::byte>& p, ashl::dtype t) {
  pairs r;
  const std::uint32_t c = get_u32(p, 8);
  const std::size_t vs = ashl::size_of(t);
  for (std::uint32_t j = 0; j < c; ++j) {
    r.index.push_back(get_u32(p, 12 + 4 * j));
    const std::byte* v = p.data() + 12 + 4 * std::size_t{c} + vs * j;
    std::uint16_t h;
    float f;
    if (t == ashl::dtype::f32) {
      std::memcpy(&f, v, 4);
    } else {
      std::memcpy(&h, v, 2);
      f = t == ashl::dtype::f16 ? ashl::half{h}.to_float() : ashl::bfloat16{h}.to_float();
    }
    r.value.push_back(f);
  }
  return r;
}

// Common malformed-sparse-payload checks for topk, topk_sampled and threshold.
template <class C>
void check_sparse_rejections(const C& c, const std::vector<std::byte>& good, ashl::compress::payload_info info) {
  check_rejects_truncation(c, good, info);
  const std::uint32_t count = get_u32(good, 8);
  BOOST_REQUIRE_GE(count, 2u);
  {  // index out of range
    auto p = good;
    put_u32(p, 12 + 4 * (count - 1), static_cast<std::uint32_t>(info.count));
    BOOST_CHECK(!decode_guarded(c, p, info).ok());
  }
  {  // non-increasing (equal) indices
    auto p = good;
    put_u32(p, 16, get_u32(p, 12));
    auto s = decode_guarded(c, p, info);
    BOOST_CHECK(!s.ok());
    BOOST_CHECK_NE(s.message().find("index[1]"), std::string::npos);
  }
  {  // decreasing indices
    auto p = good;
    const std::uint32_t a = get_u32(p, 12), b = get_u32(p, 16);
    put_u32(p, 12, b);
    put_u32(p, 16, a);
    BOOST_CHECK(!decode_guarded(c, p, info).ok());
  }
  {  // count larger than n
    auto p = good;
    put_u32(p, 8, static_cast<std::uint32_t>(info.count + 1));
    auto s = decode_guarded(c, p, info);
    BOOST_CHECK(!s.ok());
    BOOST_CHECK_NE(s.message().find("count"), std::string::npos);
  }
  {  // n disagrees with the header
    auto p = good;
    put_u64(p, 0, info.count + 1);
    auto s = decode_guarded(c, p, info);
    BOOST_CHECK(!s.ok());
    BOOST_CHECK_NE(s.message().find(".n"), std::string::npos);
  }
  {  // accumulator of the wrong size
    std::vector<float> acc(info.count + 1, 1.0f);
    BOOST_CHECK(!c.decode_add(good, info, ashl::host_view<float>(acc.data(), acc.size()), 1.0f, {}).ok());
  }
  {  // non-gradient dtype
    ashl::compress::payload_info bad = info;
    bad.type = ashl::dtype::f64;
    BOOST_CHECK(!decode_guarded(c, good, bad).ok());
  }
}

// Inputs of the pinned payloads, from Philox words only (the std::
// distributions differ between standard libraries): random signs, |x| in
// [2^-10, 2^6), and 1 in 256 each of exact zeros, subnormals (~2^-140) and
// large values (~2^14, finite in f16).
inline std::vector<float> golden_input(std::size_t n, std::uint32_t tensor) {
  const ashl::philox_stream s(0x5eed5eed5eedull, 3, tensor);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t a = s.word(i, 0), b = s.word(i, 1);
    const float m = 1.0f + static_cast<float>(a >> 9) * 0x1p-23f;  // [1, 2)
    const std::uint32_t sel = b >> 24;
    const int e = sel == 1 ? -140 : sel == 2 ? 14 : static_cast<int>(b & 15u) - 10;
    const float v = sel == 0 ? 0.0f : std::ldexp(m, e);
    x[i] = ((b >> 4) & 1u) != 0 ? -v : v;
  }
  return x;
}

// FNV-1a, 64 bits, of a payload.
inline std::uint64_t fnv1a(const std::vector<std::byte>& p) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::byte b : p) h = (h ^ static_cast<std::uint64_t>(b)) * 0x100000001b3ull;
  return h;
}

}  // namespace codec_testing
