// CPU reference for test/cuda/sign.cu, compiled by the host C++ compiler
// (reference.hpp says why).
#include <ashl/compress/sign.hpp>

#include "reference_impl.hpp"

ASHL_TEST_REFERENCE(ashl::compress::sign);
