#include <ashl/transport/address.hpp>

#include <boost/test/unit_test.hpp>

#include <string>

// transport/address.hpp: the one host:port parser of the runtime contract
// (ps/launch.hpp) and the UCX transport; the reason alone in its error.

namespace tr = ashl::transport;

BOOST_AUTO_TEST_CASE(hosts_ipv6_and_ports_are_split_and_joined_back) {
  auto a = tr::split_host_port("node-3.example:5000");
  BOOST_TEST_REQUIRE(a.has_value());
  BOOST_TEST(a->host == "node-3.example");
  BOOST_TEST(a->port == 5000u);
  BOOST_TEST(!a->ipv6);
  auto b = tr::split_host_port("[fe80::1%eth0]:0");
  BOOST_TEST_REQUIRE(b.has_value());
  BOOST_TEST(b->host == "fe80::1%eth0");
  BOOST_TEST(b->port == 0u);
  BOOST_TEST(b->ipv6);
  BOOST_TEST(tr::join_host_port(*b) == "[fe80::1%eth0]:0");
  BOOST_TEST(tr::join_host_port(*a) == "node-3.example:5000");
}

BOOST_AUTO_TEST_CASE(bad_addresses_give_the_reason_alone) {
  const auto why = [](std::string_view t) {
    auto r = tr::split_host_port(t);
    return r ? std::string("ok") : r.error().message();
  };
  BOOST_TEST(why("x") == "expected host:port");
  BOOST_TEST(why(":5000") == "expected host:port");
  BOOST_TEST(why("::1:5000") == "expected host:port (an IPv6 host goes in brackets: [::1]:5000)");
  BOOST_TEST(why("[::1]5000") == "expected [ipv6]:port");
  BOOST_TEST(why("[]:1") == "expected [ipv6]:port");
  BOOST_TEST(why("h:") == "expected host:port with a port in 0..65535");
  BOOST_TEST(why("h:65536") == "expected host:port with a port in 0..65535");
  BOOST_TEST(why("h:5x") == "expected host:port with a port in 0..65535");
  BOOST_TEST(why("h:-1") == "expected host:port with a port in 0..65535");
}
