// One definition per function, whatever the compiler (docs/codecs.md "Adding a codec"): this
// file (nvcc's host pass) and odr_host.cpp (the host C++ compiler) encode the
// same inputs with every host codec and the two decorators; the payload
// bytes and what decode_add adds must be equal, and both files must have
// compiled the same host SIMD level (compress/detail/host_simd.hpp). Host
// code only, so it runs without a GPU: no ASHL_TEST_CUDA_MAIN skip here.
#define ASHL_ODR_VERSION_NS v0_odr_nvcc
#include "odr_encode.hpp"

#include <boost/test/unit_test.hpp>

#include <cstring>

std::vector<odr_payload> odr_payloads_host();
const char* odr_simd_name_host();

namespace {
std::vector<odr_payload> odr_payloads_nvcc() { return odr_detail::encode_all(); }
}  // namespace

BOOST_AUTO_TEST_CASE(same_host_simd_level) {
  BOOST_TEST_MESSAGE("host SIMD level: nvcc " << ashl::compress::detail::host_simd_name << ", host compiler "
                                              << odr_simd_name_host());
  BOOST_TEST(std::strcmp(ashl::compress::detail::host_simd_name, odr_simd_name_host()) == 0);
}

BOOST_AUTO_TEST_CASE(same_payloads_from_nvcc_and_host_compiler) {
  const std::vector<odr_payload> a = odr_payloads_nvcc();
  const std::vector<odr_payload> b = odr_payloads_host();
  BOOST_TEST_REQUIRE(a.size() == b.size());
  BOOST_TEST(a.size() > 100u);
  std::size_t encoded = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    BOOST_TEST_CONTEXT(a[i].what) {
      BOOST_TEST(a[i].what == b[i].what);
      BOOST_TEST(a[i].error == b[i].error);
      BOOST_TEST(a[i].bytes.size() == b[i].bytes.size());
      if (a[i].bytes.size() == b[i].bytes.size())
        BOOST_TEST(std::memcmp(a[i].bytes.data(), b[i].bytes.data(), a[i].bytes.size()) == 0,
                   a[i].what << ": payload bytes differ");
      BOOST_TEST(a[i].decoded == b[i].decoded, a[i].what << ": decode_add results differ");
      encoded += a[i].error.empty() ? 1 : 0;
    }
  }
  // Every case encodes (the inputs are finite and in range for every codec).
  BOOST_TEST(encoded == a.size());
}
