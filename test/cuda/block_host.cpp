// CPU reference for test/cuda/block.cu, compiled by the host C++ compiler
// (reference.hpp says why).
#include <ashl/compress/block.hpp>

#include "reference_impl.hpp"

ASHL_TEST_REFERENCE(ashl::compress::block_quant);
