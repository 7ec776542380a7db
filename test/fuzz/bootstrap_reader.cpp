// Fuzz target: transport::bootstrap::reader (the frames of transport::ucx's
// own listener, docs/transport.md "The bootstrap listener") on arbitrary
// bytes, cut into arbitrary reads, must never crash, read out of bounds,
// buffer more than its stage admits, hand out a frame its stage does not
// admit, or stall (room to read none and no verdict).
// Input: one byte (bit 0: the side, listener or connector; the rest seeds
// the read sizes), then the peer's bytes. The driver is simulated: a proof
// whose first byte is even counts as right (so the fuzzer reaches the link
// and goodbye stages), an odd one ends the connection as the real driver
// does. Seed corpus: test/fuzz/corpus/bootstrap_reader/ (an honest
// connector's bytes to a listener, and a listener's to a connector).
#include <ashl/transport/bootstrap.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {
namespace b = ashl::transport::bootstrap;

bool admitted(b::stage s, b::role r, b::frame_type t) {
  switch (s) {
    case b::stage::challenge: return r == b::role::connector && t == b::frame_type::challenge;
    case b::stage::answer: return r == b::role::listener && t == b::frame_type::answer;
    case b::stage::verdict: return r == b::role::connector && (t == b::frame_type::accept || t == b::frame_type::refuse);
    case b::stage::link: return t == b::frame_type::link;
    case b::stage::open: return t == b::frame_type::goodbye;
    default: return false;
  }
}

b::reader& shared_reader() {
  static b::reader r;  // reused across inputs, as the listener reuses its slots
  return r;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const b::role side = (data[0] & 1) != 0 ? b::role::listener : b::role::connector;
  std::uint32_t seed = data[0] >> 1;
  b::reader& in = shared_reader();
  in.reset(side);
  const auto* bytes = reinterpret_cast<const std::byte*>(data + 1);
  std::size_t left = size - 1;
  bool authenticated = false;
  while (true) {
    // One read of 1..64 bytes at most, of what the reader offers.
    seed = seed * 1664525u + 1013904223u;
    const std::size_t want = 1 + (seed >> 26);
    auto room = in.space();
    if (room.size() + in.buffered() > b::header_bytes + b::max_body(in.where())) std::abort();
    if (side == b::role::listener && !authenticated &&
        room.size() + in.buffered() > b::max_unauthenticated_bytes)
      std::abort();  // an unauthenticated peer makes the listener hold at most 69 bytes
    const std::size_t n = std::min({want, room.size(), left});
    if (n != 0) std::memcpy(room.data(), bytes, n);
    in.commit(n);
    bytes += n;
    left -= n;
    bool stop = false;
    while (true) {
      const b::stage before = in.where();
      b::frame f;
      const b::outcome o = in.next(f);
      if (o == b::outcome::more) break;
      if (o == b::outcome::bad) {
        if (!in.failed() || in.why()[0] == '\0' || !in.space().empty()) std::abort();
        if (in.next(f) != b::outcome::bad) std::abort();  // stays failed
        stop = true;
        break;
      }
      if (!admitted(before, side, f.type) || f.body.size() > b::max_body(before)) std::abort();
      volatile std::byte sink{};
      for (std::byte x : f.body) sink = sink ^ x;  // every byte of the body is readable
      if (f.type == b::frame_type::answer) {
        if ((static_cast<unsigned>(f.body[b::nonce_bytes]) & 1) != 0) { stop = true; break; }  // refused
        authenticated = true;
      }
      if (f.type == b::frame_type::accept && (static_cast<unsigned>(f.body[0]) & 1) != 0) { stop = true; break; }
      if (f.type == b::frame_type::refuse) { stop = true; break; }
    }
    if (stop) break;
    if (left == 0) break;
    if (in.space().empty() && in.where() != b::stage::closing) std::abort();  // stalled
    if (in.where() == b::stage::closing) {
      // Bytes after the last frame are refused as soon as they are seen.
      b::frame f;
      if (in.next(f) != b::outcome::more) std::abort();
      break;
    }
  }
  return 0;
}
