// CPU reference for test/cuda/topk_sampled.cu, compiled by the host C++ compiler
// (reference.hpp says why).
#include <ashl/compress/topk_sampled.hpp>

#include "reference_impl.hpp"

ASHL_TEST_REFERENCE(ashl::compress::topk_sampled);
