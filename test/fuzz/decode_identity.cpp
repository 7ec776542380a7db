// Fuzz target: ashl::compress::identity decode_add on arbitrary bytes (layout in decode_fuzz.hpp).
#include <ashl/compress/identity.hpp>

#include "decode_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return decode_fuzz::run(ashl::compress::identity{}, data, size, decode_fuzz::payload::lossless_as_input);
}
