// ashl/transport/ucx/detail/sockaddr.hpp — socket addresses for the
// bootstrap listener and connections: "host:port" (the one parser,
// transport/address.hpp) resolved, printed back, and compared by host.
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_UCX()

#include <ashl/core/status.hpp>
#include <ashl/transport/address.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cstring>
#include <string>
#include <string_view>

ASHL_NAMESPACE_BEGIN
namespace transport {
namespace detail {

// A parsed "host:port".
struct ucx_sockaddr {
  sockaddr_storage storage{};
  socklen_t length = 0;
};

inline std::string ucx_format_sockaddr(const sockaddr_storage& sa) {
  char host[INET6_ADDRSTRLEN] = {};
  unsigned port = 0;
  if (sa.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&sa);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&sa);
  inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
  port = ntohs(a->sin_port);
  return std::string(host) + ":" + std::to_string(port);
}

inline void ucx_set_nodelay(int fd) noexcept {
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// A loopback address (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104): the peer
// runs on this host (transport::ucx::peer_on_this_host).
inline bool ucx_is_loopback(const sockaddr_storage& a) noexcept {
  if (a.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr) >> 24) == 127u;
  if (a.ss_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

// The source address of a connection without its port (the per-address cap).
inline bool ucx_same_host(const sockaddr_storage& a, const sockaddr_storage& b) noexcept {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in&>(b).sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr,
                       &reinterpret_cast<const sockaddr_in6&>(b).sin6_addr, sizeof(in6_addr)) == 0;
  }
  return true;
}

// "host:port" or "[v6]:port" → socket address; errors name `field` and the value.
inline result<ucx_sockaddr> ucx_parse_address(std::string_view field, std::string_view address) {
  // The one host:port parser (transport/address.hpp), shared with ps/launch.hpp.
  auto hp = split_host_port(address);
  if (!hp) return invalid_argument(field, address, hp.error().message());
  const std::string host = hp->host, port = std::to_string(hp->port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return make_error(errc::not_found, field, address, std::string("cannot resolve host '") + host + "': " + gai_strerror(rc));
  }
  ucx_sockaddr out;
  std::memcpy(&out.storage, found->ai_addr, found->ai_addrlen);
  out.length = static_cast<socklen_t>(found->ai_addrlen);
  freeaddrinfo(found);
  return out;
}

}  // namespace detail
}  // namespace transport
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_UCX()
