// ashl/transport/token.hpp — the one rule on a job's shared secret: at least
// min_token_bytes bytes unless the job runs insecure (no token). Checked by
// the transport (auth::check_token, for every program that creates one) and
// by the launch contract (ps::job_from, naming ASHL_TOKEN); no OpenSSL here,
// so the contract's parser builds without UCX.
#pragma once

#include <ashl/config.hpp>

#include <cstddef>

ASHL_NAMESPACE_BEGIN
namespace transport {

// 16 bytes: 128 bits when random (`openssl rand -hex 16` gives 32 characters).
inline constexpr std::size_t min_token_bytes = 16;

}  // namespace transport
ASHL_NAMESPACE_END
