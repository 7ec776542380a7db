// ashl/transport/auth.hpp — the pure pieces of the peer authentication that
// every transport model runs before it reports a peer connected: an
// HMAC-SHA256 challenge–response over the job's shared token (ASHL_TOKEN).
//
//   namespace a = ashl::transport::auth;
//   ASHL_TRY(a::check_token(params.token, params.insecure));          // empty token only with insecure
//   auto sn = a::make_nonce();                                         // listener: challenge
//   auto cn = a::make_nonce();                                         // connecting side
//   auto cp = a::client_proof(token, *sn, *cn);                        // sent with cn
//   bool ok = a::verify(*a::client_proof(token, *sn, *cn), received);  // listener, constant time
//   auto sp = a::server_proof(token, *cn, *sn);                        // listener proves itself
//
// Protocol (docs/transport.md, "Authentication"; docs/design.md,
// "Runtime contract for real runs"): the listener sends a 32-byte nonce; the
// connecting side answers with its own nonce and
// HMAC-SHA256(token, "ashl-auth-client-v1" ‖ server_nonce ‖ client_nonce);
// the listener verifies it and answers with
// HMAC-SHA256(token, "ashl-auth-server-v1" ‖ client_nonce ‖ server_nonce).
// Distinct labels and the swapped nonce order make a proof of one direction
// useless in the other, so a listener cannot be used as an oracle that signs
// a client's answer. An empty token (an empty HMAC key) is the documented
// insecure mode: it authenticates nothing and is refused unless the caller
// opts in with insecure = true.
//
// OpenSSL libcrypto (HMAC, RAND_bytes, CRYPTO_memcmp); compiles to nothing
// without the ashl::ucx component.
#pragma once

#include <ashl/config.hpp>
#include <ashl/transport/token.hpp>

#if ASHL_HAS_UCX()

#include <ashl/core/status.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

ASHL_NAMESPACE_BEGIN
namespace transport::auth {

inline constexpr std::size_t nonce_size = 32;
inline constexpr std::size_t digest_size = 32;  // SHA-256

using nonce = std::array<std::byte, nonce_size>;
using digest = std::array<std::byte, digest_size>;

inline constexpr std::string_view client_label = "ashl-auth-client-v1";
inline constexpr std::string_view server_label = "ashl-auth-server-v1";

// An empty token is allowed only in the explicit insecure mode, and a token
// must have at least min_token_bytes bytes (transport/token.hpp) unless
// insecure. The error gives the length, never the token.
inline status check_token(std::string_view token, bool insecure) {
  if (token.empty() && !insecure) {
    return invalid_argument("token", token,
                            "empty; set ASHL_TOKEN to the job's shared secret (or pass insecure = true / --insecure "
                            "to run without authentication)");
  }
  if (!insecure && token.size() < min_token_bytes) {
    return status(errc::invalid_argument,
                  "token: " + std::to_string(token.size()) + " bytes, a token must have at least " +
                      std::to_string(min_token_bytes) +
                      " (e.g. openssl rand -hex 16), or pass insecure = true / --insecure to run without authentication");
  }
  return {};
}

// 32 bytes from OpenSSL's CSPRNG; a failing RNG is an error, never a
// predictable nonce.
inline result<nonce> make_nonce() {
  nonce n{};
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1) {
    return status(errc::internal, "auth: RAND_bytes failed (the OpenSSL random generator is not seeded)");
  }
  return n;
}

// HMAC-SHA256(key, parts[0] ‖ parts[1] ‖ …).
inline result<digest> hmac_sha256(std::span<const std::byte> key, std::span<const std::span<const std::byte>> parts) {
  // A null key pointer with length 0 is the empty key; OpenSSL wants a
  // non-null pointer either way.
  static constexpr unsigned char empty_key = 0;
  const void* k = key.empty() ? static_cast<const void*>(&empty_key) : static_cast<const void*>(key.data());
  digest out{};
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (mac == nullptr) return status(errc::internal, "auth: OpenSSL has no HMAC implementation");
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  bool ok = ctx != nullptr;
  if (ok) {
    char sha256[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", sha256, 0), OSSL_PARAM_construct_end()};
    ok = EVP_MAC_init(ctx, static_cast<const unsigned char*>(k), key.size(), params) == 1;
  }
  for (std::size_t i = 0; ok && i < parts.size(); ++i) {
    if (parts[i].empty()) continue;
    ok = EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(parts[i].data()), parts[i].size()) == 1;
  }
  std::size_t len = 0;
  if (ok) ok = EVP_MAC_final(ctx, reinterpret_cast<unsigned char*>(out.data()), &len, out.size()) == 1;
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  if (!ok || len != out.size()) return status(errc::internal, "auth: HMAC-SHA256 failed in OpenSSL");
  return out;
}

inline result<digest> hmac_sha256(std::span<const std::byte> key, std::span<const std::byte> message) {
  const std::span<const std::byte> parts[] = {message};
  return hmac_sha256(key, parts);
}

namespace detail {
inline std::span<const std::byte> bytes_of(std::string_view s) noexcept {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
inline result<digest> proof(std::string_view token, std::string_view label, const nonce& first, const nonce& second) {
  const std::span<const std::byte> parts[] = {bytes_of(label), first, second};
  return hmac_sha256(bytes_of(token), parts);
}
}  // namespace detail

// What the connecting side sends: HMAC(token, "ashl-auth-client-v1" ‖ server_nonce ‖ client_nonce).
inline result<digest> client_proof(std::string_view token, const nonce& server_nonce, const nonce& client_nonce) {
  return detail::proof(token, client_label, server_nonce, client_nonce);
}

// What the listener answers: HMAC(token, "ashl-auth-server-v1" ‖ client_nonce ‖ server_nonce).
inline result<digest> server_proof(std::string_view token, const nonce& client_nonce, const nonce& server_nonce) {
  return detail::proof(token, server_label, client_nonce, server_nonce);
}

// Constant-time comparison of an expected digest with received bytes (of any
// length: a short or long answer is simply wrong, and the length is public).
inline bool verify(const digest& expected, std::span<const std::byte> received) noexcept {
  if (received.size() != expected.size()) return false;
  return CRYPTO_memcmp(expected.data(), received.data(), expected.size()) == 0;
}

}  // namespace transport::auth
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_UCX()
