#include <ashl/transport/auth.hpp>

#if ASHL_HAS_UCX()

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace a = ashl::transport::auth;

namespace {

std::vector<std::byte> from_hex(std::string_view hex) {
  auto nibble = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
  std::vector<std::byte> out(hex.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::byte>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  }
  return out;
}

std::vector<std::byte> repeat(std::uint8_t v, std::size_t n) { return std::vector<std::byte>(n, std::byte{v}); }

std::span<const std::byte> text(std::string_view s) { return {reinterpret_cast<const std::byte*>(s.data()), s.size()}; }

a::nonce nonce_of(std::uint8_t v) {
  a::nonce n{};
  for (std::size_t i = 0; i < n.size(); ++i) n[i] = static_cast<std::byte>(v + i);
  return n;
}

bool equal(const a::digest& d, const std::vector<std::byte>& want) {
  return std::equal(d.begin(), d.end(), want.begin(), want.end());
}

}  // namespace

// RFC 4231, HMAC-SHA-256 test cases 1–4, 6 and 7 (case 5 is truncated output).
BOOST_AUTO_TEST_CASE(hmac_sha256_matches_rfc4231) {
  struct vector_case {
    std::vector<std::byte> key, data;
    std::string_view mac;
  };
  const vector_case cases[] = {
      {repeat(0x0b, 20), std::vector<std::byte>(text("Hi There").begin(), text("Hi There").end()),
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {std::vector<std::byte>(text("Jefe").begin(), text("Jefe").end()),
       std::vector<std::byte>(text("what do ya want for nothing?").begin(), text("what do ya want for nothing?").end()),
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {repeat(0xaa, 20), repeat(0xdd, 50), "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {from_hex("0102030405060708090a0b0c0d0e0f10111213141516171819"), repeat(0xcd, 50),
       "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {repeat(0xaa, 131),
       std::vector<std::byte>(text("Test Using Larger Than Block-Size Key - Hash Key First").begin(),
                              text("Test Using Larger Than Block-Size Key - Hash Key First").end()),
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {repeat(0xaa, 131),
       std::vector<std::byte>(
           text("This is a test using a larger than block-size key and a larger than block-size data. The key needs "
                "to be hashed before being used by the HMAC algorithm.")
               .begin(),
           text("This is a test using a larger than block-size key and a larger than block-size data. The key needs "
                "to be hashed before being used by the HMAC algorithm.")
               .end()),
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (const auto& c : cases) {
    auto d = a::hmac_sha256(c.key, c.data);
    BOOST_TEST_REQUIRE(d.has_value());
    BOOST_TEST(equal(*d, from_hex(c.mac)), "RFC 4231 mismatch for " << c.mac);
    // The same bytes split into parts give the same MAC (the proofs hash label ‖ nonce ‖ nonce).
    const std::span<const std::byte> whole(c.data);
    const std::span<const std::byte> parts[] = {whole.first(whole.size() / 3), whole.subspan(whole.size() / 3)};
    auto split = a::hmac_sha256(c.key, parts);
    BOOST_TEST_REQUIRE(split.has_value());
    BOOST_TEST((*split == *d));
  }
}

BOOST_AUTO_TEST_CASE(proofs_are_the_documented_hmacs) {
  const std::string token = "job-secret";
  const a::nonce sn = nonce_of(1), cn = nonce_of(100);
  std::vector<std::byte> client_msg(text("ashl-auth-client-v1").begin(), text("ashl-auth-client-v1").end());
  client_msg.insert(client_msg.end(), sn.begin(), sn.end());
  client_msg.insert(client_msg.end(), cn.begin(), cn.end());
  std::vector<std::byte> server_msg(text("ashl-auth-server-v1").begin(), text("ashl-auth-server-v1").end());
  server_msg.insert(server_msg.end(), cn.begin(), cn.end());
  server_msg.insert(server_msg.end(), sn.begin(), sn.end());

  auto cp = a::client_proof(token, sn, cn);
  auto sp = a::server_proof(token, cn, sn);
  BOOST_TEST_REQUIRE(cp.has_value());
  BOOST_TEST_REQUIRE(sp.has_value());
  BOOST_TEST((*cp == *a::hmac_sha256(text(token), client_msg)));
  BOOST_TEST((*sp == *a::hmac_sha256(text(token), server_msg)));
  // The two directions never produce the same proof, so one cannot be replayed as the other.
  BOOST_TEST(!(*cp == *sp));
  BOOST_TEST(!a::verify(*cp, *sp));
}

BOOST_AUTO_TEST_CASE(verify_accepts_only_the_right_token_and_nonces) {
  const a::nonce sn = nonce_of(7), cn = nonce_of(42);
  const auto good = *a::client_proof("right", sn, cn);
  BOOST_TEST(a::verify(*a::client_proof("right", sn, cn), good));
  BOOST_TEST(!a::verify(*a::client_proof("wrong", sn, cn), good));
  BOOST_TEST(!a::verify(*a::client_proof("right", nonce_of(8), cn), good));
  BOOST_TEST(!a::verify(*a::client_proof("right", sn, nonce_of(43)), good));
  BOOST_TEST(!a::verify(*a::client_proof("right", cn, sn), good));  // swapped nonces
  // Any single flipped bit fails, and so does a short or long answer.
  for (std::size_t i = 0; i < good.size(); ++i) {
    auto bad = good;
    bad[i] ^= std::byte{0x01};
    BOOST_TEST(!a::verify(good, bad));
  }
  BOOST_TEST(!a::verify(good, std::span<const std::byte>(good).first(31)));
  std::vector<std::byte> longer(good.begin(), good.end());
  longer.push_back(std::byte{0});
  BOOST_TEST(!a::verify(good, longer));
}

BOOST_AUTO_TEST_CASE(nonces_are_random) {
  auto n1 = a::make_nonce();
  auto n2 = a::make_nonce();
  BOOST_TEST_REQUIRE(n1.has_value());
  BOOST_TEST_REQUIRE(n2.has_value());
  BOOST_TEST(!(*n1 == *n2));
  BOOST_TEST(!(*n1 == a::nonce{}));
}

BOOST_AUTO_TEST_CASE(empty_token_only_in_insecure_mode) {
  auto refused = a::check_token("", false);
  BOOST_TEST(!refused.ok());
  BOOST_TEST((refused.code() == ashl::errc::invalid_argument));
  BOOST_TEST(refused.message().find("token") != std::string::npos);
  BOOST_TEST(refused.message().find("insecure") != std::string::npos);
  BOOST_TEST(a::check_token("", true).ok());
  BOOST_TEST(a::check_token("sixteen-bytes-ok", false).ok());
  // Shorter than 16 bytes: refused unless insecure, naming the length only.
  auto short_token = a::check_token("secret", false);
  BOOST_TEST(!short_token.ok());
  BOOST_TEST(short_token.message().find("6 bytes") != std::string::npos, short_token.message());
  BOOST_TEST(short_token.message().find("secret") == std::string::npos, short_token.message());
  BOOST_TEST(a::check_token("secret", true).ok());
  // Insecure mode is the empty HMAC key on both sides: it agrees with itself and
  // with nothing else.
  const a::nonce sn = nonce_of(3), cn = nonce_of(9);
  const auto empty = a::client_proof("", sn, cn);
  BOOST_TEST_REQUIRE(empty.has_value());
  BOOST_TEST(a::verify(*a::client_proof("", sn, cn), *empty));
  BOOST_TEST(!a::verify(*a::client_proof("secret", sn, cn), *empty));
}

#else

#include <cstdio>

int main() {
  std::puts("skipped: transport/auth needs the ashl::ucx component (UCX and OpenSSL); built without it");
  return 77;
}

#endif
