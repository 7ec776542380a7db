// Fuzz target: ashl::compress::topk decode_add on arbitrary bytes (layout in decode_fuzz.hpp).
#include <ashl/compress/topk.hpp>

#include "decode_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return decode_fuzz::run(ashl::compress::topk{}, data, size, decode_fuzz::payload::sparse_pairs);
}
