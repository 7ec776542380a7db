// Fuzz target: ashl::compress::fp16 decode_add on arbitrary bytes (layout in decode_fuzz.hpp).
#include <ashl/compress/cast.hpp>

#include "decode_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return decode_fuzz::run(ashl::compress::fp16{}, data, size, decode_fuzz::payload::lossless_from_f32);
}
