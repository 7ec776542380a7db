#include <ashl/coll/nccl.hpp>

#include <boost/test/unit_test.hpp>

#include <cctype>
#include <cstddef>
#include <string>

// The NCCL unique id as a value a launcher or control channel carries: its
// 256-digit hex form round-trips every byte, and malformed text is refused
// with the field, the value and why. (The communicator itself runs on a
// device: test/cuda/coll_nccl.cu.)

namespace coll = ashl::coll;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

BOOST_AUTO_TEST_CASE(hex_round_trips_every_byte) {
  coll::nccl_unique_id id;
  for (std::size_t i = 0; i < coll::nccl_unique_id::bytes; ++i) id.data[i] = static_cast<std::byte>((i * 73 + 11) & 0xff);
  id.data[0] = std::byte{0x00};
  id.data[1] = std::byte{0xff};
  const std::string hex = coll::nccl_id_to_hex(id);
  BOOST_TEST(hex.size() == 256u);
  BOOST_TEST(hex.substr(0, 4) == "00ff");
  BOOST_TEST(hex.find_first_not_of("0123456789abcdef") == std::string::npos);
  auto back = coll::nccl_id_from_hex(hex);
  BOOST_TEST_REQUIRE(back.has_value());
  BOOST_TEST((*back == id));
  std::string upper = hex;
  for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  auto up = coll::nccl_id_from_hex(upper);
  BOOST_TEST_REQUIRE(up.has_value());
  BOOST_TEST((*up == id));
}

BOOST_AUTO_TEST_CASE(malformed_hex_is_refused_with_the_field_named) {
  auto short_id = coll::nccl_id_from_hex(std::string(255, 'a'));
  BOOST_TEST_REQUIRE(!short_id.has_value());
  BOOST_TEST((short_id.error().code() == ashl::errc::invalid_argument));
  BOOST_TEST(contains(short_id.error().message(), "nccl_id.hex.size = 255"), short_id.error().message());
  std::string bad(256, '0');
  bad[7] = 'g';
  auto digit = coll::nccl_id_from_hex(bad);
  BOOST_TEST_REQUIRE(!digit.has_value());
  BOOST_TEST(contains(digit.error().message(), "position 7"), digit.error().message());
  BOOST_TEST(!coll::nccl_id_from_hex("").has_value());
}
