// Fuzz target: a ps::server (BSP over 2 workers, 64 elements) fed arbitrary
// messages by a connected client, over the inproc transport on one thread.
// The input is a sequence of messages: u8 header length (clamped to 128),
// u16 data length, then those bytes. A prefix byte chooses whether the
// client joins first (as worker 1), so both the unbound and the bound paths
// of the server are reached. Whatever comes, the server must not crash, and
// it answers; a message it refuses never changes the parameters (checked:
// the parameters only change when the server counts an optimizer step).
#include <ashl/rules/policies.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/transport/inproc.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

namespace ps = ashl::ps;
namespace tr = ashl::transport;
namespace w = ashl::wire;

namespace {

struct client_handler {
  std::array<std::byte, 1 << 16> buf{};
  std::span<std::byte> receive_buffer(tr::peer_id, std::span<const std::byte>, std::size_t n) {
    return n <= buf.size() ? std::span<std::byte>(buf.data(), n) : std::span<std::byte>{};
  }
  void on_message(tr::peer_id, std::span<const std::byte>, std::span<const std::byte>) {}
  void on_sent(tr::peer_id, std::uint64_t, const ashl::status&) {}
  void on_peer(tr::peer_id, tr::peer_event, const ashl::status&) {}
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  auto fabric = tr::inproc_fabric::create({.eager_bytes = 64, .deterministic = true});
  auto snode = fabric->node("s");
  auto cnode = fabric->node();
  auto layout = ps::shard_layout::even(64, 1);
  ps::policy_params pp;
  pp.workers = 2;
  auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = 2}},
                                            std::move(*ps::make_policy("bsp", pp)), std::move(*snode));
  if (!srv) std::abort();
  tr::inproc client = std::move(*cnode);
  client_handler ch;
  auto p = client.connect("s");
  for (int i = 0; i < 4; ++i) {
    srv->poll();
    client.progress(ch);
  }
  if (!client.is_connected(*p)) std::abort();

  if (data[0] & 1) {  // join as worker 1
    std::array<std::byte, w::encoded_size(w::join_body::wire_bytes)> join{};
    if (!w::encode(w::header{.rank = 1}, w::join_body{.incarnation = 0, .batch = 4}, join)) std::abort();
    (void)client.send(*p, std::span<const std::byte>(join).first(w::header_bytes),
                      std::span<const std::byte>(join).subspan(w::header_bytes), 0);
    srv->poll();
    client.progress(ch);
  }
  std::vector<float> before(srv->parameters().begin(), srv->parameters().end());
  std::size_t i = 1;
  std::uint64_t cookie = 1;
  while (i + 3 <= size) {
    const std::size_t hl = std::min<std::size_t>(data[i], tr::max_header_bytes);
    const std::size_t dl = static_cast<std::size_t>(data[i + 1]) | (static_cast<std::size_t>(data[i + 2]) << 8);
    i += 3;
    const std::size_t h = std::min(hl, size - i);
    const std::size_t d = std::min(dl, size - i - h);
    const auto* bytes = reinterpret_cast<const std::byte*>(data + i);
    (void)client.send(*p, {bytes, h}, {bytes + h, d}, cookie++);
    i += h + d;
    srv->poll();
    client.progress(ch);
    // A refused message changes nothing: the parameters move only with a step.
    const auto now = srv->parameters();
    if (srv->core().version() == 0 && std::memcmp(now.data(), before.data(), before.size() * sizeof(float)) != 0)
      std::abort();
  }
  srv->poll();
  return 0;
}
