// CPU reference for test/cuda/qsgd.cu, compiled by the host C++ compiler
// (reference.hpp says why).
#include <ashl/compress/qsgd.hpp>

#include "reference_impl.hpp"

ASHL_TEST_REFERENCE(ashl::compress::qsgd);
