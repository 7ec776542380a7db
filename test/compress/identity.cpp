#include <ashl/compress/identity.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/codec_testing.hpp"

#include <cstring>
#include <limits>

using namespace ashl;
using namespace codec_testing;

BOOST_AUTO_TEST_CASE(f32_round_trip_is_bit_exact) {
  auto x = normal_values(1001, 1);
  x[3] = std::numeric_limits<float>::denorm_min();
  x[4] = std::numeric_limits<float>::infinity();
  x[5] = -std::numeric_limits<float>::max();
  compress::identity c;
  auto p = encode_to_vector(c, std::span<const float>(x));
  BOOST_CHECK_EQUAL(p.size(), c.max_encoded_bytes(x.size(), dtype::f32));
  BOOST_CHECK_EQUAL(p.size(), 4 * x.size());
  BOOST_CHECK(std::memcmp(p.data(), x.data(), p.size()) == 0);
  std::vector<float> acc(x.size(), 0.0f);
  BOOST_REQUIRE(c.decode_add(p, {x.size(), dtype::f32}, host_view<float>(acc.data(), acc.size()), 1.0f, {}).ok());
  for (std::size_t i = 0; i < x.size(); ++i) BOOST_CHECK_EQUAL(detail::float_bits(acc[i]), detail::float_bits(x[i]));
}

BOOST_AUTO_TEST_CASE(f16_and_bf16_values_travel_as_16_bits) {
  auto xf = normal_values(37, 2);
  auto xh = to_type<half>(xf);
  auto xb = to_type<bfloat16>(xf);
  compress::identity c;
  auto ph = encode_to_vector(c, std::span<const half>(xh));
  auto pb = encode_to_vector(c, std::span<const bfloat16>(xb));
  BOOST_CHECK_EQUAL(ph.size(), 2 * xf.size());
  BOOST_CHECK_EQUAL(pb.size(), c.max_encoded_bytes(xf.size(), dtype::bf16));
  std::vector<float> acc(xf.size(), 1.0f);
  BOOST_REQUIRE(c.decode_add(ph, {xf.size(), dtype::f16}, host_view<float>(acc.data(), acc.size()), -2.0f, {}).ok());
  for (std::size_t i = 0; i < xf.size(); ++i) BOOST_CHECK_EQUAL(acc[i], 1.0f - 2.0f * xh[i].to_float());
  std::vector<float> accb(xf.size(), 0.0f);
  BOOST_REQUIRE(c.decode_add(pb, {xf.size(), dtype::bf16}, host_view<float>(accb.data(), accb.size()), 1.0f, {}).ok());
  for (std::size_t i = 0; i < xf.size(); ++i) BOOST_CHECK_EQUAL(accb[i], xb[i].to_float());
}

BOOST_AUTO_TEST_CASE(rejects_bad_payloads_and_arguments) {
  auto x = normal_values(9, 3);
  compress::identity c;
  auto p = encode_to_vector(c, std::span<const float>(x));
  check_rejects_truncation(c, p, {x.size(), dtype::f32});
  BOOST_CHECK(!decode_guarded(c, p, {x.size(), dtype::i8}).ok());
  std::vector<float> acc(8);
  auto s = c.decode_add(p, {9, dtype::f32}, host_view<float>(acc.data(), acc.size()), 1.0f, {});
  BOOST_CHECK(!s.ok());
  BOOST_CHECK_NE(s.message().find("identity.acc.size"), std::string::npos);
  std::vector<std::byte> small(10);
  BOOST_CHECK(c.encode(host_view<const float>(x.data(), x.size()), small, {}).to_status().code() ==
              errc::buffer_too_small);
}
