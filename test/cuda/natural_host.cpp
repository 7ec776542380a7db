// CPU reference for test/cuda/natural.cu, compiled by the host C++ compiler
// (reference.hpp says why).
#include <ashl/compress/natural.hpp>

#include "reference_impl.hpp"

ASHL_TEST_REFERENCE(ashl::compress::natural);
