#include <ashl/ps/server.hpp>

#include <cstdio>

// Bad input against a real server process, while four honest workers train
// with it (BSP, real processes over UCX): a raw client that holds the token
// sends truncated, oversized, wrongly versioned, wrongly checksummed and
// out-of-range messages, and another client connects with a wrong token.
// The server answers or drops each, counts it, keeps serving the workers,
// and its parameters end bit-identical to a run without the bad clients.

#if !ASHL_HAS_UCX() || !defined(ASHL_TEST_PS_NODE) || !defined(ASHL_RUN_PATH)
int main() {
  std::puts("skipped: ps/malformed_token needs the ucx component (UCX and OpenSSL) and ashl-run");
  return 77;
}
#else

#include <ashl/transport/ucx.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/process.hpp"
#include "../support/ps_job.hpp"
#include "../support/node_files.hpp"

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace ps = ashl::ps;
namespace tr = ashl::transport;
namespace w = ashl::wire;
using namespace std::chrono_literals;

namespace {

struct client_handler {
  std::vector<std::byte> spill;
  int errors = 0;
  std::vector<std::string> texts;
  bool connected = false, failed = false;
  std::string why;
  std::span<std::byte> receive_buffer(tr::peer_id, std::span<const std::byte>, std::size_t n) {
    spill.resize(n);
    return spill;
  }
  void on_message(tr::peer_id, std::span<const std::byte> h, std::span<const std::byte> d) {
    auto m = w::decode(h, d, {});
    if (m && m->header.kind == w::message_kind::error) {
      ++errors;
      texts.emplace_back(m->get<w::error_body>()->text);
    }
  }
  void on_sent(tr::peer_id, std::uint64_t, const ashl::status&) {}
  void on_peer(tr::peer_id, tr::peer_event e, const ashl::status& s) {
    if (e == tr::peer_event::connected) connected = true;
    else {
      failed = true;
      why = s.message();
    }
  }
};

template <class Pred>
bool drive(tr::ucx& t, client_handler& h, Pred done, std::chrono::milliseconds bound) {
  const auto end = std::chrono::steady_clock::now() + bound;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    if (t.progress(h) == 0) t.wait(1ms);
  }
  return true;
}

std::vector<std::byte> encode_commit(std::size_t n, std::uint32_t rank) {
  std::vector<float> g(n, 1.0f);
  std::vector<std::byte> buf(w::encoded_size(n * 4));
  w::header h{.kind = w::message_kind::commit, .element_count = n, .rank = rank, .sequence = 1, .clock = 1, .step = 1};
  auto used = w::encode(h, std::as_bytes(std::span<const float>(g)), buf);
  BOOST_TEST_REQUIRE(used.has_value());
  return buf;
}

}  // namespace

BOOST_AUTO_TEST_CASE(malformed_messages_and_a_wrong_token_change_nothing) {
  constexpr std::size_t n = 1000;
  constexpr int cycles = 40;
  const std::string token = "correct horse battery staple";
  const std::string dir = process::temp_dir("ashl-malformed");
  // Worker 0 takes 50 ms per iteration, so the job lasts two seconds
  // while the bad clients do their work. A port found free can be taken by
  // another process before the server binds it: then another port.
  std::string addr;
  pid_t job = -1;
  for (int attempt = 0; attempt < 5 && job < 0; ++attempt) {
    const int port = process::free_port();
    BOOST_TEST_REQUIRE(port > 0);
    addr = "127.0.0.1:" + std::to_string(port);
    const pid_t p = process::start({ASHL_RUN_PATH, "-s", "1", "-w", "4", "--addr", addr, "--timeout", "120", "--", ASHL_TEST_PS_NODE, "--out", dir, "--policy", "bsp",
                                    "--elements", std::to_string(n), "--cycles", std::to_string(cycles),
                                    "--slow-rank", "0", "--slow-ms", "50"},
                                   {{"UCX_TLS", "tcp,self"}, {"UCX_NET_DEVICES", "lo"}, {"ASHL_TOKEN", token}},
                                   dir + "/log.txt");
    if (process::wait_for_text(p, dir + "/log.txt", "listening on", 30s)) {
      job = p;
    } else {
      const auto r = process::finish(p, 30s, dir + "/log.txt");
      BOOST_TEST_REQUIRE(r.log().find("port in use") != std::string::npos, r.log());
    }
  }
  BOOST_TEST_REQUIRE(job > 0);

  // A client with the wrong token is refused and told why.
  auto bad = tr::ucx::create({.token = "wrong token, long enough", .connect_timeout = 30s});
  BOOST_TEST_REQUIRE(bad.has_value());
  client_handler hb;
  auto pb = bad->connect(addr);
  BOOST_TEST_REQUIRE(pb.has_value());
  BOOST_TEST_REQUIRE(drive(*bad, hb, [&] { return hb.connected || hb.failed; }, 30s));
  BOOST_TEST(!hb.connected);
  BOOST_TEST(hb.why.find("token") != std::string::npos, hb.why);
  bad->close();

  // This process's own transports use loopback only too.
  ::setenv("UCX_NET_DEVICES", "lo", 1);
  ::setenv("UCX_TLS", "tcp,self", 1);

  // The raw client, holding the token.
  auto t = tr::ucx::create({.token = token, .connect_timeout = 30s});
  BOOST_TEST_REQUIRE(t.has_value(), (t ? "" : t.error().message()));
  client_handler h;
  auto p = t->connect(addr);
  BOOST_TEST_REQUIRE(p.has_value());
  BOOST_TEST_REQUIRE(drive(*t, h, [&] { return h.connected || h.failed; }, 30s));
  BOOST_TEST_REQUIRE(h.connected, h.why);

  int sent = 0;
  auto send = [&](std::span<const std::byte> head, std::span<const std::byte> data) {
    BOOST_TEST_REQUIRE(t->send(*p, head, data, static_cast<std::uint64_t>(sent)).ok());
    ++sent;
  };
  const auto commit = encode_commit(16, 0);
  const std::span<const std::byte> whole(commit);
  // 1. truncated: a 40-byte header.
  send(whole.first(40), {});
  // 2. truncated: the header says 64 payload bytes, 20 follow.
  send(whole.first(w::header_bytes), whole.subspan(w::header_bytes, 20));
  // 3. oversized: 4 MiB of data for a server whose bound is ~12 KB.
  std::vector<std::byte> big(std::size_t{4} << 20, std::byte{7});
  send(whole.first(w::header_bytes), big);
  // 4. wrongly versioned.
  auto v = commit;
  v[4] = std::byte{1};
  send(std::span<const std::byte>(v).first(w::header_bytes), std::span<const std::byte>(v).subspan(w::header_bytes));
  // 5. wrongly checksummed: one payload bit.
  auto c = commit;
  c[w::header_bytes + 5] ^= std::byte{0x10};
  send(std::span<const std::byte>(c).first(w::header_bytes), std::span<const std::byte>(c).subspan(w::header_bytes));
  // 6. out of range: a commit before joining, and a join as rank 99 of 4.
  send(whole.first(w::header_bytes), whole.subspan(w::header_bytes));
  std::array<std::byte, w::encoded_size(w::join_body::wire_bytes)> join{};
  BOOST_TEST_REQUIRE(w::encode(w::header{.rank = 99}, w::join_body{.incarnation = 0, .batch = 1}, join).has_value());
  send(std::span<const std::byte>(join).first(w::header_bytes), std::span<const std::byte>(join).subspan(w::header_bytes));
  // 7. a pull_request with an element count no server holds, unbound.
  std::array<std::byte, w::header_bytes> pull{};
  BOOST_TEST_REQUIRE(w::seal_header(w::header{.kind = w::message_kind::pull_request, .element_count = 5}, {}, pull).ok());
  send(pull, {});
  // Every one is answered with an error (the oversized one too: refused
  // before it is received, or by its length), and the connection stays up.
  const bool answered = drive(*t, h, [&] { return h.errors >= sent || h.failed; }, 20s);
  BOOST_TEST(answered, "errors received " << h.errors << " of " << sent);
  BOOST_TEST(!h.failed, h.why);

  t->close();

  const auto r = process::finish(job, 150s, dir + "/log.txt");
  BOOST_TEST_REQUIRE(r.exit_code == 0, r.log());

  // The parameters are those of the same job without the bad clients.
  auto layout = ps::shard_layout::even(n, 1);
  ps::policy_params pp;
  pp.workers = 4;
  auto core = ps::server_core<ashl::sync::any_policy>::create(
      {.layout = *layout, .workers = 4, .optimizer = {.mode = ps::optimizer_params::kind::sgd, .lr = 0.125}},
      *ps::make_policy("bsp", pp), std::vector<float>(n, 0.5f));
  ps::server_actions out(4);
  std::vector<float> g(n);
  for (int cy = 0; cy < cycles; ++cy)
    for (std::uint32_t k = 0; k < 4; ++k) {
      for (std::size_t i = 0; i < n; ++i) g[i] = ps_job::grad_value(k, static_cast<std::uint64_t>(cy), i);
      core->commit({.worker = k, .sequence = static_cast<std::uint64_t>(cy) + 1, .clock = static_cast<std::uint64_t>(cy) + 1,
                    .codec = ashl::codec_id::identity, .element_count = n,
                    .payload = std::as_bytes(std::span<const float>(g))},
                   0.0, out);
      out.clear();
    }
  std::ifstream f(dir + "/server0.f32", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  BOOST_TEST_REQUIRE(bytes.size() == n * sizeof(float));
  BOOST_TEST(std::memcmp(bytes.data(), core->parameters().data(), bytes.size()) == 0);

  const auto s = node_files::read_counters(dir + "/server0.txt");
  BOOST_TEST(s.at("commits_applied") == 4.0 * cycles);
  BOOST_TEST(s.at("malformed") + s.at("oversized") >= 5.0);  // 1-5
  BOOST_TEST(s.at("unbound") >= 2.0);                       // 6 (commit) and 7
  BOOST_TEST(s.at("rank") >= 1.0);                          // 6 (join as 99)
  BOOST_TEST(s.at("auth_refused") >= 1.0);
  BOOST_TEST(s.at("refused") == 0.0);  // nothing bad reached server_core
}

#endif
