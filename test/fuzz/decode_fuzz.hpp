// test/fuzz/decode_fuzz.hpp — shared body of the codec decode fuzz targets.
//
//   extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* d, std::size_t n) {
//     return decode_fuzz::run(ashl::compress::topk{}, d, n);
//   }
//
// Input layout: byte 0 selects the dtype (mod 3: f32, f16, bf16), bytes 1-2
// the element count (u16 little-endian, at most 4096), byte 3 the step; the
// rest is the payload. The accumulator is bounded (count elements) and must
// be untouched whenever the decoder refuses the payload. Seeds in
// test/fuzz/corpus/decode_<codec>/ use the same layout.
#pragma once

#include <ashl/compress/concepts.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

namespace decode_fuzz {

template <class C>
int run(const C& codec, const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  static constexpr ashl::dtype types[3] = {ashl::dtype::f32, ashl::dtype::f16, ashl::dtype::bf16};
  const ashl::dtype t = types[data[0] % 3];
  const std::size_t count = (static_cast<std::size_t>(data[1]) | (static_cast<std::size_t>(data[2]) << 8)) % 4097;
  const ashl::compress::codec_context ctx{.seed = 1, .step = data[3], .tensor = 0};
  std::vector<float> acc(count, 3.0f);
  const auto* p = reinterpret_cast<const std::byte*>(data + 4);
  const ashl::status s =
      codec.decode_add(std::span<const std::byte>(p, size - 4), {count, t}, ashl::host_view<float>(acc.data(), count), 1.0f, ctx);
  if (!s.ok()) {
    if (s.message().empty()) std::abort();
    for (float v : acc)
      if (v != 3.0f) std::abort();  // a refused payload touched the accumulator
  }
  return 0;
}

}  // namespace decode_fuzz
