// CPU reference for test/cuda/threshold.cu, compiled by the host C++ compiler
// (reference.hpp says why).
#include <ashl/compress/threshold.hpp>

#include "reference_impl.hpp"

ASHL_TEST_REFERENCE(ashl::compress::threshold);
