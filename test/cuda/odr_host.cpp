// The host-compiler half of test/cuda/odr.cu: the same payloads, built by
// g++/clang++ instead of nvcc's host pass, with the library in its own
// version namespace (odr_encode.hpp says why).
#define ASHL_ODR_VERSION_NS v0_odr_host
#include "odr_encode.hpp"

std::vector<odr_payload> odr_payloads_host() { return odr_detail::encode_all(); }
const char* odr_simd_name_host() { return ashl::compress::detail::host_simd_name; }
