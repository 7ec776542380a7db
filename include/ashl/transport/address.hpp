// ashl/transport/address.hpp — the one parser of "host:port" addresses:
// the runtime contract (ps/launch.hpp: ASHL_SERVER_ADDR,
// --server-addr, ashl-run's --addr) and the UCX transport (listen and
// connect addresses) split them the same way, and each names the field in
// its own error format around the reason given here.
//
//   auto a = ashl::transport::split_host_port("[::1]:5000");   // {host "::1", port 5000, ipv6}
//   if (!a) report(field, text, a.error().message());          // the reason alone: "expected host:port"
//   std::string s = ashl::transport::join_host_port(*a);       // "[::1]:5000"
//
// Hosts are names, IPv4 addresses or bracketed IPv6 addresses; the port is
// decimal, 0..65535 (0: any free port, where a listener allows it). No name
// is resolved here (transport/ucx.hpp resolves what it connects to).
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

ASHL_NAMESPACE_BEGIN
namespace transport {

struct host_port {
  std::string host;        // without brackets
  std::uint16_t port = 0;
  bool ipv6 = false;       // it was bracketed
};

// Splits "host:port" or "[v6]:port". On error the status's message is the
// reason alone; the caller names the field and the text.
inline result<host_port> split_host_port(std::string_view text) {
  const auto bad = [](std::string_view why) { return status(errc::invalid_argument, std::string(why)); };
  host_port out;
  std::string_view port;
  if (text.starts_with('[')) {
    const auto close = text.find(']');
    if (close == std::string_view::npos || close == 1 || close + 1 >= text.size() || text[close + 1] != ':')
      return bad("expected [ipv6]:port");
    out.host = std::string(text.substr(1, close - 1));
    out.ipv6 = true;
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0) return bad("expected host:port");
    if (text.substr(0, colon).find(':') != std::string_view::npos)
      return bad("expected host:port (an IPv6 host goes in brackets: [::1]:5000)");
    out.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  unsigned v = 0;
  const auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), v);
  if (port.empty() || ec != std::errc{} || p != port.data() + port.size() || v > 65535)
    return bad("expected host:port with a port in 0..65535");
  out.port = static_cast<std::uint16_t>(v);
  return out;
}

inline std::string join_host_port(const host_port& a) {
  return (a.ipv6 ? "[" + a.host + "]" : a.host) + ":" + std::to_string(a.port);
}

}  // namespace transport
ASHL_NAMESPACE_END
