// Fuzz target: ashl::compress::block_quant decode_add on arbitrary bytes (layout in decode_fuzz.hpp).
#include <ashl/compress/block.hpp>

#include "decode_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return decode_fuzz::run(ashl::compress::block_quant{}, data, size);
}
