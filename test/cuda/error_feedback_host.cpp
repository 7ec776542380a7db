// CPU references for test/cuda/error_feedback.cu (error_feedback<C> and
// dgc<C> on the host), compiled by the host C++ compiler (reference.hpp says
// why).
#include <ashl/compress/cast.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/threshold.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/compress/topk_sampled.hpp>

#include "reference_impl.hpp"

ASHL_TEST_REFERENCE(ashl::compress::topk);
ASHL_TEST_REFERENCE(ashl::compress::threshold);
ASHL_TEST_REFERENCE(ashl::compress::topk_sampled);
ASHL_TEST_REFERENCE(ashl::compress::identity);
ASHL_TEST_REFERENCE(ashl::compress::fp16);
ASHL_TEST_REFERENCE(ashl::compress::bf16);
ASHL_TEST_REFERENCE_DGC(ashl::compress::topk);
ASHL_TEST_REFERENCE_DGC(ashl::compress::threshold);
ASHL_TEST_REFERENCE_DGC(ashl::compress::topk_sampled);
