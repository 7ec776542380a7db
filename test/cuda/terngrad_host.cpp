// CPU reference for test/cuda/terngrad.cu, compiled by the host C++ compiler
// (reference.hpp says why).
#include <ashl/compress/terngrad.hpp>

#include "reference_impl.hpp"

ASHL_TEST_REFERENCE(ashl::compress::terngrad);
