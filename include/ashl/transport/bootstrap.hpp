// ashl/transport/bootstrap.hpp — the bytes of transport::ucx's bootstrap
// connection, as a pure, bounded frame reader: the plain TCP connection over
// which a peer proves it holds the job's token (transport/auth.hpp) before
// the two sides exchange UCX worker addresses (docs/transport.md,
// "The bootstrap listener"; docs/design.md, "Runtime contract for real runs").
//
//   namespace b = ashl::transport::bootstrap;
//   b::reader in(b::role::listener);             // the listener sent its challenge
//   auto room = in.space();                       // read(fd, room) → n bytes
//   in.commit(n);
//   b::frame f;
//   while (in.next(f) == b::outcome::frame) { /* f.type, f.body: checked against the stage */ }
//   if (in.failed()) close(fd);                   // in.why() names the bad field and value
//
// A frame is one type byte, a little-endian u32 body length, and the body.
// Each side expects one frame type (or two) at each stage, each with a fixed
// or bounded body size; the header is checked as soon as its 5 bytes are in,
// so a wrong type or length is refused before its body is read, and
// space() never offers more room than the frame the stage allows. Before a
// connecting peer has authenticated, a listener therefore holds at most
// header_bytes + answer_body bytes of it (69), whatever it sends.
//
//   listener → connector  challenge  magic "ashl-bs1" ‖ server nonce            (40)
//   connector → listener  answer     client nonce ‖ client proof                (64)
//   listener → connector  accept     server proof                               (32)
//                     or  refuse     (empty): the proof was wrong; then the listener closes
//   both ways, once the listener accepted:
//                         link       session key ‖ flags ‖ UCP worker address   (8 + 1 + 1..16384)
//                                    flags bit 0: this side wants UCX peer error handling on the
//                                    data endpoints (both sides must agree; either may ask)
//   both ways, connected: goodbye    1 byte: 1 = a keyed goodbye follows the data (orderly close)
//
// The reader never computes a proof: the driver (transport/ucx/detail/
// handshake.hpp) verifies and answers; a wrong proof ends the connection.
// No allocation after the buffer has grown to the largest frame the stage
// admits; no exception; nothing here reads a clock or touches a socket.
#pragma once

#include <ashl/config.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <span>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace transport::bootstrap {

enum class frame_type : std::uint8_t { challenge = 1, answer = 2, accept = 3, refuse = 4, link = 5, goodbye = 6 };

inline constexpr std::size_t header_bytes = 5;  // type, u32 body length (little endian)
inline constexpr std::array<std::byte, 8> magic = {std::byte{'a'}, std::byte{'s'}, std::byte{'h'}, std::byte{'l'},
                                                   std::byte{'-'}, std::byte{'b'}, std::byte{'s'}, std::byte{'1'}};
inline constexpr std::size_t nonce_bytes = 32;   // auth::nonce_size
inline constexpr std::size_t digest_bytes = 32;  // auth::digest_size
inline constexpr std::size_t key_bytes = 8;      // the session key in front of every data message
inline constexpr std::size_t max_address_bytes = 16384;  // a UCP worker address (ucx_max_control_data)

inline constexpr std::size_t challenge_body = magic.size() + nonce_bytes;
inline constexpr std::size_t answer_body = nonce_bytes + digest_bytes;
inline constexpr std::size_t accept_body = digest_bytes;
inline constexpr std::size_t goodbye_body = 1;
inline constexpr std::size_t link_flags_bytes = 1;
inline constexpr std::uint8_t link_peer_errors = 1;  // link flags: error handling PEER on the data endpoints
inline constexpr std::size_t max_link_body = key_bytes + link_flags_bytes + max_address_bytes;
inline constexpr std::size_t max_frame_bytes = header_bytes + max_link_body;
// What a listener buffers of a peer that has not authenticated, at most.
inline constexpr std::size_t max_unauthenticated_bytes = header_bytes + answer_body;

enum class role : std::uint8_t {
  listener,   // accepted the connection and sent the challenge
  connector,  // connected, waits for the challenge
};

// What the reader expects next.
enum class stage : std::uint8_t {
  challenge,  // connector: the listener's challenge
  answer,     // listener: the connector's answer
  verdict,    // connector: accept or refuse
  link,       // both: the peer's session key and worker address
  open,       // both: connected; only a goodbye may come
  closing,    // both: after refuse or goodbye nothing more may come
  failed,     // a frame broke the rules: the connection must be closed
};

inline const char* name(frame_type t) noexcept {
  switch (t) {
    case frame_type::challenge: return "challenge";
    case frame_type::answer: return "answer";
    case frame_type::accept: return "accept";
    case frame_type::refuse: return "refuse";
    case frame_type::link: return "link";
    case frame_type::goodbye: return "goodbye";
  }
  return "?";
}

inline const char* name(stage s) noexcept {
  switch (s) {
    case stage::challenge: return "a challenge";
    case stage::answer: return "an answer";
    case stage::verdict: return "an accept or refuse";
    case stage::link: return "a link";
    case stage::open: return "a goodbye";
    case stage::closing: return "nothing (after its refuse or goodbye)";
    case stage::failed: return "nothing (failed)";
  }
  return "?";
}

// The largest body of any frame the stage admits.
constexpr std::size_t max_body(stage s) noexcept {
  switch (s) {
    case stage::challenge: return challenge_body;
    case stage::answer: return answer_body;
    case stage::verdict: return accept_body;
    case stage::link: return max_link_body;
    case stage::open: return goodbye_body;
    case stage::closing:
    case stage::failed: return 0;
  }
  return 0;
}

struct frame {
  frame_type type = frame_type::goodbye;
  std::span<const std::byte> body;  // valid until the next call of next(), space() or reset()
};

enum class outcome : std::uint8_t { more, frame, bad };

// A frame's 5 header bytes.
inline void put_header(std::byte* out, frame_type type, std::uint32_t n) noexcept {
  out[0] = static_cast<std::byte>(type);
  for (int i = 0; i < 4; ++i) out[1 + i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
}

// Writes one frame (header and the concatenated parts) to the end of `out`.
inline void append_frame(std::vector<std::byte>& out, frame_type type,
                         std::initializer_list<std::span<const std::byte>> parts) {
  std::uint32_t n = 0;
  for (auto p : parts) n += static_cast<std::uint32_t>(p.size());
  const std::size_t at = out.size();
  out.resize(at + header_bytes + n);
  put_header(out.data() + at, type, n);
  std::size_t pos = at + header_bytes;
  for (auto p : parts) {
    if (!p.empty()) std::memcpy(out.data() + pos, p.data(), p.size());
    pos += p.size();
  }
}

class reader {
 public:
  reader() { reset(role::connector); }
  explicit reader(role r) { reset(r); }

  // A new connection (the buffer's capacity is kept for reuse).
  void reset(role r) noexcept {
    role_ = r;
    stage_ = r == role::listener ? stage::answer : stage::challenge;
    begin_ = end_ = 0;
    consumed_ = 0;
    why_[0] = '\0';
  }

  // Where the next read may write: never more than what completes the
  // largest frame the stage admits. Empty once failed or closing.
  std::span<std::byte> space() {
    compact();
    const std::size_t limit = header_bytes + max_body(stage_);
    if (stage_ == stage::failed || stage_ == stage::closing) return {};
    const std::size_t have = end_ - begin_;
    if (have >= limit) return {};  // a whole frame is in: next() first
    if (buffer_.size() < limit) buffer_.resize(limit);
    return {buffer_.data() + end_, limit - have};
  }

  void commit(std::size_t n) noexcept { end_ += std::min(n, buffer_.size() - end_); }

  // The next whole frame, checked against the stage (which then moves on);
  // `more` while it is incomplete; `bad` once a frame broke the rules (the
  // reader stays failed, why() names the field and value).
  outcome next(frame& out) {
    compact();
    if (stage_ == stage::failed) return outcome::bad;
    const std::size_t have = end_ - begin_;
    if (have == 0) return outcome::more;
    if (stage_ == stage::closing) return fail("bytes after the peer's last frame (%zu)", have);
    const std::byte* h = buffer_.data() + begin_;
    const auto raw_type = static_cast<unsigned>(h[0]);
    const auto type = static_cast<frame_type>(h[0]);
    if (!admits(type)) return fail("frame type %u where %s was expected", raw_type, name(stage_));
    if (have < header_bytes) return outcome::more;
    std::uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= static_cast<std::uint32_t>(h[1 + i]) << (8 * i);
    if (!size_ok(type, n)) return fail("%s body of %u bytes (wrong size)", name(type), static_cast<unsigned>(n));
    if (have < header_bytes + n) return outcome::more;
    const std::span<const std::byte> body(h + header_bytes, n);
    if (type == frame_type::challenge && !std::equal(magic.begin(), magic.end(), body.begin())) {
      return fail("challenge magic %s (not an ashl bootstrap listener)", "differs");
    }
    if (type == frame_type::link && (static_cast<unsigned>(body[key_bytes]) & ~unsigned{link_peer_errors}) != 0) {
      return fail("link flags %u (unknown bits)", static_cast<unsigned>(body[key_bytes]));
    }
    if (type == frame_type::goodbye && body[0] != std::byte{0} && body[0] != std::byte{1}) {
      return fail("goodbye byte %u (must be 0 or 1)", static_cast<unsigned>(body[0]));
    }
    consumed_ = header_bytes + n;
    stage_ = after(type);
    out = frame{type, body};
    return outcome::frame;
  }

  stage where() const noexcept { return stage_; }
  role side() const noexcept { return role_; }
  bool failed() const noexcept { return stage_ == stage::failed; }
  const char* why() const noexcept { return why_; }
  // Bytes held (a frame being read, or whole frames not taken yet).
  std::size_t buffered() const noexcept { return end_ - begin_ - std::min(consumed_, end_ - begin_); }

 private:
  void compact() noexcept {
    begin_ += consumed_;
    consumed_ = 0;
    if (begin_ == end_) {
      begin_ = end_ = 0;
    } else if (begin_ != 0) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
  }

  bool admits(frame_type t) const noexcept {
    switch (stage_) {
      case stage::challenge: return role_ == role::connector && t == frame_type::challenge;
      case stage::answer: return role_ == role::listener && t == frame_type::answer;
      case stage::verdict: return role_ == role::connector && (t == frame_type::accept || t == frame_type::refuse);
      case stage::link: return t == frame_type::link;
      case stage::open: return t == frame_type::goodbye;
      default: return false;
    }
  }

  static bool size_ok(frame_type t, std::uint32_t n) noexcept {
    switch (t) {
      case frame_type::challenge: return n == challenge_body;
      case frame_type::answer: return n == answer_body;
      case frame_type::accept: return n == accept_body;
      case frame_type::refuse: return n == 0;
      case frame_type::link: return n > key_bytes + link_flags_bytes && n <= max_link_body;
      case frame_type::goodbye: return n == goodbye_body;
    }
    return false;
  }

  static stage after(frame_type t) noexcept {
    switch (t) {
      case frame_type::challenge: return stage::verdict;
      case frame_type::answer: return stage::link;
      case frame_type::accept: return stage::link;
      case frame_type::link: return stage::open;
      case frame_type::refuse:
      case frame_type::goodbye: return stage::closing;
    }
    return stage::failed;
  }

  template <class... A>
  outcome fail(const char* format, A... a) noexcept {
    stage_ = stage::failed;
    std::snprintf(why_, sizeof why_, format, a...);
    return outcome::bad;
  }

  role role_ = role::connector;
  stage stage_ = stage::challenge;
  std::vector<std::byte> buffer_;
  std::size_t begin_ = 0, end_ = 0, consumed_ = 0;
  char why_[96] = {};
};

}  // namespace transport::bootstrap
ASHL_NAMESPACE_END
