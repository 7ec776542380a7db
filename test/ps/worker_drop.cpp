#include <ashl/ps/worker.hpp>

#include <cstdio>

// A worker dropped while a server's large pull reply is still arriving:
// the transport's destructor still drives UCX (the
// closes' flush), and UCX goes on writing the reply into the receive buffer
// it was given, the worker's staging buffer. The worker's transport must be
// destroyed before that buffer; with the transport declared before the
// buffers, the reply was written into freed memory ("corrupted double-linked
// list"; the debug-asan preset reports a heap-use-after-free here). Two
// servers as real processes over UCX/TCP on 127.0.0.1, the worker in this
// process.

#if !ASHL_HAS_UCX()
int main() {
  std::puts("skipped: ps/worker_drop needs the ucx component (UCX and OpenSSL)");
  return 77;
}
#else

#include <boost/test/unit_test.hpp>

#include "../support/forked_server.hpp"

namespace {

using ashl_test::child;

const std::string token = "worker-drop-token-0123456789";

// Server `shard` of `shards` for one worker (ASP), in a child forked before
// this process has any UCX object: prints its address, serves until
// SIGTERM (at most 120 s), then prints "ok".
child start_server(std::uint32_t shard, std::uint32_t shards, std::size_t elements, std::string& address) {
  return ashl_test::start_server({.token = token, .elements = elements, .shard = shard, .shards = shards,
                                  .limit = 120s},
                                 {}, {.stop_when_all_left = false, .worker_timeout = 0ms}, address,
                                 [](auto&, int) {}, [](auto&) { return std::string("ok"); });
}

// transport::ucx, counting the large receive buffers its handler hands out
// (the reply of a shard is one): the test drops the worker once one is in
// transfer.
struct watched_ucx {
  using transport_concept = tr::transport_tag;
  tr::ucx t;
  std::size_t large_from = 0;
  std::size_t* large = nullptr;

  template <class H>
  struct watching {
    H* h;
    watched_ucx* self;
    std::span<std::byte> receive_buffer(tr::peer_id p, std::span<const std::byte> head, std::size_t n) {
      std::span<std::byte> b = h->receive_buffer(p, head, n);
      if (n >= self->large_from && !b.empty()) ++*self->large;
      return b;
    }
    void on_message(tr::peer_id p, std::span<const std::byte> head, std::span<const std::byte> data) {
      h->on_message(p, head, data);
    }
    void on_sent(tr::peer_id p, std::uint64_t c, const ashl::status& st) { h->on_sent(p, c, st); }
    void on_peer(tr::peer_id p, tr::peer_event e, const ashl::status& why) { h->on_peer(p, e, why); }
  };

  ashl::result<tr::peer_id> connect(std::string_view a) { return t.connect(a); }
  ashl::status send(tr::peer_id p, std::span<const std::byte> h, std::span<const std::byte> d, std::uint64_t c) {
    return t.send(p, h, d, c);
  }
  template <tr::handler H>
  std::size_t progress(H& h) {
    watching<H> w{&h, this};
    return t.progress(w);
  }
  void wait(std::chrono::microseconds d) { t.wait(d); }
  std::span<const tr::peer_id> peers() const { return t.peers(); }
  bool is_connected(tr::peer_id p) const { return t.is_connected(p); }
  void close(tr::peer_id p) { t.close(p); }
  void close() { t.close(); }
  const tr::transport_counters& counters() const { return t.counters(); }
};
static_assert(tr::transport<watched_ucx>);

}  // namespace

// Two shards of 16 MiB each; the worker asks for the parameters, drives its
// transport until a shard's reply is being received into its staging
// buffer, and is dropped then. Its transport's close goes on receiving
// that reply: it must land in memory that is still the worker's.
BOOST_AUTO_TEST_CASE(a_worker_dropped_while_a_reply_arrives_frees_its_buffers_after_its_transport) {
  // TCP only: a 16 MiB reply takes many progress calls (with shared memory
  // it is one copy), so the drop falls inside it.
  ::setenv("UCX_TLS", "tcp,self", 1);
  constexpr std::size_t elements = std::size_t{8} << 20;
  std::string a0, a1;
  child s0 = start_server(0, 2, elements, a0);
  child s1 = start_server(1, 2, elements, a1);
  BOOST_TEST_REQUIRE(!a0.empty());
  BOOST_TEST_REQUIRE(!a1.empty());
  BOOST_TEST_REQUIRE(a0.rfind("error", 0) != 0, a0);
  BOOST_TEST_REQUIRE(a1.rfind("error", 0) != 0, a1);

  std::vector<float> w(elements, 0.0f);
  std::size_t large = 0;
  bool dropped_mid_reply = false;
  // A reply that completes within one slice leaves nothing to drop into:
  // the pull is asked again (a bounded number of times).
  for (int attempt = 0; attempt < 20 && !dropped_mid_reply; ++attempt) {
    auto t = tr::ucx::create({.token = token, .retry_interval = 50ms});
    BOOST_TEST_REQUIRE(t.has_value());
    std::optional<ps::worker<watched_ucx>> wk;
    {
      auto made = ps::worker<watched_ucx>::create({.rank = 0, .servers = {a0, a1}, .timeout = 60s},
                                                  watched_ucx{std::move(*t), elements, &large}, w);
      BOOST_TEST_REQUIRE(made.has_value(), (made ? "" : made.error().message()));
      wk.emplace(std::move(*made));
    }
    BOOST_TEST(w[0] == 0.25f);  // the join's parameters arrived whole
    for (int pull = 0; pull < 10 && !dropped_mid_reply; ++pull) {
      large = 0;
      wk->transport().large_from = elements / 4 * sizeof(float);  // half a shard
      BOOST_TEST_REQUIRE(wk->pull().ok());
      const auto until = clock_type::now() + 30s;
      bool first = true;
      std::optional<ashl::status> done;
      while (!done && large == 0 && clock_type::now() < until) {
        done = wk->wait_for(50us, first);
        first = false;
      }
      if (done) {
        BOOST_TEST_REQUIRE(done->ok(), done->message());
        continue;
      }
      BOOST_TEST_REQUIRE(large > 0);  // not past the bound
      dropped_mid_reply = true;
      wk.reset();  // the reply is in transfer into the worker's staging buffer
    }
  }
  BOOST_TEST(dropped_mid_reply);
  // The servers took the dropped connections in their stride.
  ::kill(s0.pid, SIGTERM);
  ::kill(s1.pid, SIGTERM);
  BOOST_TEST(s0.read_line(30s).value_or("") == "ok");
  BOOST_TEST(s1.read_line(30s).value_or("") == "ok");
  BOOST_TEST(s0.finish(10s) == 0);
  BOOST_TEST(s1.finish(10s) == 0);
  ::unsetenv("UCX_TLS");
}

#endif  // ASHL_HAS_UCX()
