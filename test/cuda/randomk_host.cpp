// CPU reference for test/cuda/randomk.cu, compiled by the host C++ compiler
// (reference.hpp says why).
#include <ashl/compress/randomk.hpp>

#include "reference_impl.hpp"

ASHL_TEST_REFERENCE(ashl::compress::randomk);
