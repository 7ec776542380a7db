// Fuzz target: ashl::compress::threshold decode_add on arbitrary bytes (layout in decode_fuzz.hpp).
#include <ashl/compress/threshold.hpp>

#include "decode_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return decode_fuzz::run(ashl::compress::threshold{}, data, size, decode_fuzz::payload::sparse_pairs);
}
