// ashl/wire/message.hpp — the versioned, self-describing message format.
//
//   namespace w = ashl::wire;
//   w::header h{.kind = w::message_kind::commit, .codec = ashl::codec_id::topk,
//               .type = ashl::dtype::f32, .element_count = n, .tensor = 3, .rank = 1,
//               .sequence = seq, .clock = c, .step = t};
//   std::vector<std::byte> buf(w::encoded_size(payload.size()));   // size query first
//   auto used = w::encode(h, payload, buf);                          // result<size_t>
//   // zero-copy: a codec writes into w::payload_area(buf), then w::seal(h, bytes, buf)
//   auto m = w::decode({buf.data(), *used}, w::limits{});            // result<message_view>
//   if (!m) return m.error();                                        // names field and value
//   m->payload;                                                      // view into buf
//   if (auto* p = m->get<ashl::worker_plan>()) ...                   // typed control body
//   if (auto* r = m->get<w::measurements_body>())                    // a view: no allocation
//     for (ashl::measurement x : *r) planner.observe(x);             // worker = header.rank
//   if (auto* r = m->get<w::replicate_body>())                       // version 6 (docs/elastic.md §4.2)
//     ashl::ps::decode_core_event(r->record, event);                 // the record, a view into buf
//
// A message is a fixed 72-byte header followed by a payload. decode checks
// every header field, the lengths against the buffer and the limits, and the
// CRC-32C, before the caller may use anything; it never copies or allocates
// (the payload and an error text are views into the input). encode applies the
// same rules, so no build emits a message another build of the same version
// rejects. The plan_update body is ashl::worker_plan and a measurement record
// is an ashl::measurement (core/plan.hpp): what a policy decides and a driver
// measures goes on the wire as is. docs/wire-format.md describes the layout
// byte by byte; docs/design.md, "Data flow of one commit".
#pragma once

#include <ashl/wire/header.hpp>
#include <ashl/wire/bodies.hpp>

#include <ashl/config.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/enum_table.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>
#include <ashl/wire/crc32c.hpp>
#include <ashl/wire/ids.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <ostream>
#include <sstream>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <variant>

ASHL_NAMESPACE_BEGIN
namespace wire {

// A decoded message: views into the decoded buffer, valid while it lives.
struct message_view {
  wire::header header;
  std::span<const std::byte> payload;  // the codec payload, or the raw control body
  control_body body;                   // the parsed control body (monostate for data kinds)

  template <class Body>
  [[nodiscard]] const Body* get() const noexcept {
    return std::get_if<Body>(&body);
  }
};

namespace detail {

inline bool valid_kind(std::uint8_t k) noexcept { return k >= message_kind_first && k <= message_kind_last; }

inline bool is_data_dtype(message_kind k, dtype t) noexcept {
  if (k == message_kind::commit || k == message_kind::plan_update)
    return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16;
  return is_floating(t);  // pull_request, pull_reply
}

// Rules on the header that hold whether encoding or decoding.
inline status check_header(const header& h, std::uint64_t payload_bytes, const limits& lim) {
  const auto k = static_cast<std::uint8_t>(h.kind);
  if (!valid_kind(k))
    return make_error(errc::unsupported, "header.kind", k, "not a message kind of version " + std::to_string(version));
  if (static_cast<std::uint8_t>(h.codec) >= codec_id_count)
    return make_error(errc::unsupported, "header.codec", static_cast<std::uint8_t>(h.codec), "unknown codec id");
  if (static_cast<std::uint8_t>(h.type) >= dtype_count)
    return make_error(errc::unsupported, "header.dtype", static_cast<std::uint8_t>(h.type), "unknown dtype");
  if ((h.flags & ~flags_known) != 0)
    return make_error(errc::unsupported, "header.flags", hex32{h.flags}, "unknown flag bits set");
  if (payload_bytes > lim.max_payload_bytes)
    return make_error(errc::out_of_range, "header.payload_bytes", payload_bytes,
                      "exceeds limits.max_payload_bytes = " + std::to_string(lim.max_payload_bytes));
  if (h.element_count > lim.max_elements)
    return make_error(errc::out_of_range, "header.element_count", h.element_count,
                      "exceeds limits.max_elements = " + std::to_string(lim.max_elements));
  const std::string kind_name(to_string(h.kind));
  if ((h.flags & flag_last_shard) != 0 && h.kind != message_kind::commit && h.kind != message_kind::pull_reply)
    return make_error(errc::malformed, "header.flags", hex32{h.flags}, "last_shard is only for commit and pull_reply");
  if ((h.flags & flag_pull) != 0 && h.kind != message_kind::commit)
    return make_error(errc::malformed, "header.flags", hex32{h.flags}, "pull is only for commit");
  if ((h.flags & flag_view) != 0 && (h.kind != message_kind::pull_reply || h.codec != codec_id::identity))
    return make_error(errc::malformed, "header.flags", hex32{h.flags}, "view is only for a dense pull_reply");
  if ((h.flags & flag_unchecked) != 0 && h.kind != message_kind::commit && h.kind != message_kind::pull_reply)
    return make_error(errc::malformed, "header.flags", hex32{h.flags}, "unchecked is only for commit and pull_reply");
  if (h.samples != 0 && h.kind != message_kind::commit)
    return make_error(errc::malformed, "header.samples", h.samples, "only a commit covers samples (must be 0)");
  if ((h.flags & flag_part) == 0) {
    if (h.part != 0 || h.parts != 0)
      return make_error(errc::malformed, "header.parts", h.parts, "part and parts are 0 without the part flag");
  } else {
    if (h.kind != message_kind::pull_reply && h.kind != message_kind::commit)
      return make_error(errc::malformed, "header.flags", hex32{h.flags}, "part is only for pull_reply and commit");
    if (h.codec != codec_id::identity)
      return make_error(errc::malformed, "header.codec", to_string(h.codec),
                        "a " + kind_name + " in parts is dense (identity)");
    if (h.parts < 2 || h.parts > h.element_count)
      return make_error(errc::malformed, "header.parts", h.parts,
                        "must be >= 2 and <= element_count = " + std::to_string(h.element_count));
    if (h.kind == message_kind::commit && h.parts > max_commit_parts)
      return make_error(errc::malformed, "header.parts", h.parts,
                        "a commit comes in at most " + std::to_string(max_commit_parts) + " parts");
    if (h.part >= h.parts)
      return make_error(errc::malformed, "header.part", h.part, "must be < parts = " + std::to_string(h.parts));
    const part_range pr = part_elements(h.element_count, h.parts, h.part);
    if (pr.count == 0)
      return make_error(errc::malformed, "header.parts", h.parts,
                        "leaves an empty part of " + std::to_string(h.element_count) + " elements");
    if (payload_bytes != pr.count * size_of(h.type))
      return make_error(errc::malformed, "header.payload_bytes", payload_bytes,
                        "part " + std::to_string(h.part) + " of " + std::to_string(h.parts) + " holds " +
                            std::to_string(pr.count) + " elements");
  }
  if (!is_control(h.kind) || h.kind == message_kind::plan_update) {
    if (!is_data_dtype(h.kind, h.type))
      return make_error(errc::malformed, "header.dtype", to_string(h.type),
                        "not an element type a " + kind_name + " carries");
  }
  if (is_control(h.kind)) {
    if (h.element_count != 0)
      return make_error(errc::malformed, "header.element_count", h.element_count, "must be 0 for a " + kind_name);
    if (h.kind != message_kind::plan_update) {
      if (h.codec != codec_id::identity)
        return make_error(errc::malformed, "header.codec", to_string(h.codec), "must be identity for a " + kind_name);
      if (h.type != dtype::f32)
        return make_error(errc::malformed, "header.dtype", to_string(h.type), "must be f32 for a " + kind_name);
    }
  }
  if (h.kind == message_kind::commit && h.element_count == 0)
    return make_error(errc::malformed, "header.element_count", 0, "a commit carries at least one element");
  if (h.kind == message_kind::pull_request && payload_bytes != 0)
    return make_error(errc::malformed, "header.payload_bytes", payload_bytes, "a pull_request has no payload");
  return {};
}

inline void put_header(byte_writer& w, const header& h, std::uint64_t payload_bytes) {
  w.put(magic);
  w.put(version);
  w.put(static_cast<std::uint16_t>(header_bytes));
  w.put(h.kind);
  w.put(h.codec);
  w.put(h.type);
  w.put(std::uint8_t{0});  // reserved
  if ((h.flags & flag_part) != 0 && h.kind == message_kind::commit)
    w.put(static_cast<std::uint32_t>(h.flags | std::uint32_t{h.part} << commit_part_shift |
                                     std::uint32_t{h.parts} << (commit_part_shift + 8)));
  else
    w.put(h.flags);
  w.put(h.element_count);
  w.put(h.tensor);
  w.put(h.rank);
  w.put(h.sequence);
  w.put(h.clock);
  w.put(h.step);
  w.put(payload_bytes);
  if ((h.flags & flag_part) != 0 && h.kind != message_kind::commit)
    w.put(static_cast<std::uint32_t>(h.part | (std::uint32_t{h.parts} << 16)));
  else
    w.put(h.samples);
}
}  // namespace detail

// Bytes a message with a payload (or control body) of this size takes.
constexpr std::size_t encoded_size(std::size_t payload_bytes) noexcept { return header_bytes + payload_bytes; }

namespace detail {
// A control message of n body bytes: the buffer's size checked, the header
// and the CRC's placeholder written; the caller writes the body after.
inline result<byte_writer> begin_control(const header& h, std::size_t n, std::span<std::byte> out) {
  if (out.size() < encoded_size(n))
    return make_error(errc::buffer_too_small, "wire.out.size", out.size(),
                      "bytes, fewer than the " + std::to_string(encoded_size(n)) + " the message needs");
  byte_writer w(out.first(encoded_size(n)));
  put_header(w, h, n);
  w.put(std::uint32_t{0});
  return w;
}
// Its CRC over the header and the body, in its place; the message's size.
inline std::size_t end_control(std::span<std::byte> out, std::size_t n) {
  std::uint32_t crc = crc32c(out.first(crc_offset));
  crc = crc32c(out.subspan(header_bytes, n), crc);
  byte_writer c(out.subspan(crc_offset, 4));
  c.put(crc);
  return encoded_size(n);
}
}  // namespace detail
template <class Body>
  requires(!std::is_integral_v<Body>)
std::size_t encoded_size(const Body& body) noexcept {
  return header_bytes + detail::body_bytes(body);
}

// Where a sender writes the payload in place before seal().
inline std::span<std::byte> payload_area(std::span<std::byte> out) noexcept {
  return out.size() <= header_bytes ? std::span<std::byte>{} : out.subspan(header_bytes);
}

// Writes the header in front of `payload_bytes` bytes already in
// payload_area(out) and checksums both. For data kinds (commit,
// pull_request, pull_reply); control kinds go through encode(header, body, out).
inline result<std::size_t> seal(const header& h, std::size_t payload_bytes, std::span<std::byte> out,
                                const limits& lim = {}) {
  if (is_control(h.kind) && detail::valid_kind(static_cast<std::uint8_t>(h.kind)))
    return make_error(errc::invalid_argument, "header.kind", to_string(h.kind),
                      "control messages are encoded from their typed body");
  ASHL_TRY(detail::check_header(h, payload_bytes, lim));
  if (out.size() < header_bytes || out.size() - header_bytes < payload_bytes)
    return make_error(errc::buffer_too_small, "wire.out.size", out.size(),
                      "bytes, fewer than the " + std::to_string(encoded_size(payload_bytes)) + " the message needs");
  byte_writer w(out.first(header_bytes));
  detail::put_header(w, h, payload_bytes);
  std::uint32_t crc = 0;  // flag `unchecked`: no CRC
  if ((h.flags & flag_unchecked) == 0) crc = crc32c(out.subspan(header_bytes, payload_bytes), crc32c(out.first(crc_offset)));
  w.put(crc);
  ASHL_ASSERT(w.ok() && w.position() == header_bytes, "wire header layout");
  return encoded_size(payload_bytes);
}

// Copies `payload` behind a header (memmove: payload may already lie in
// payload_area(out)).
inline result<std::size_t> encode(const header& h, std::span<const std::byte> payload, std::span<std::byte> out,
                                  const limits& lim = {}) {
  if (out.size() >= header_bytes && out.size() - header_bytes >= payload.size() && !payload.empty())
    std::memmove(out.data() + header_bytes, payload.data(), payload.size());
  return seal(h, payload.size(), out, lim);
}

// Encodes a control message; h.kind is taken from the body type.
template <class Body>
  requires(!std::is_same_v<Body, std::span<const std::byte>> && requires { body_traits<Body>::kind; })
result<std::size_t> encode(header h, const Body& body, std::span<std::byte> out, const limits& lim = {}) {
  h.kind = body_traits<Body>::kind;
  const std::size_t n = detail::body_bytes(body);
  if constexpr (std::is_same_v<Body, error_body>) {
    if (body.text.size() > std::numeric_limits<std::uint32_t>::max())
      return make_error(errc::out_of_range, "error.text_bytes", body.text.size(), "does not fit 32 bits");
  }
  ASHL_TRY(detail::check_header(h, n, lim));
  if constexpr (std::is_same_v<Body, measurements_body>) {
    if (body.worker != h.rank)
      return make_error(errc::invalid_argument, "measurements.worker", body.worker,
                        "must equal header.rank = " + std::to_string(h.rank));
  }
  ASHL_TRY(detail::check_body(body, lim));
  auto w = detail::begin_control(h, n, out);
  if (!w) return w.error();
  detail::put_body(*w, body);
  ASHL_ASSERT(w->ok() && w->position() == encoded_size(n), "wire control body layout");
  return detail::end_control(out, n);
}

// Encodes the measurements of one worker (each m.worker must be h.rank) as a
// measurements message; the records are validated as decode validates them.
inline result<std::size_t> encode(header h, std::span<const measurement> ms, std::span<std::byte> out,
                                  const limits& lim = {}) {
  h.kind = message_kind::measurements;
  const std::size_t n = measurements_body::bytes_for(ms.size());
  ASHL_TRY(detail::check_header(h, n, lim));
  ASHL_TRY(detail::check_count(ms.size(), lim));
  for (std::size_t i = 0; i < ms.size(); ++i) {
    if (ms[i].worker != h.rank)
      return make_error(errc::invalid_argument, detail::record_field(i, "worker"), ms[i].worker,
                        "must equal header.rank = " + std::to_string(h.rank));
    ASHL_TRY(detail::check_record(i, ms[i]));
  }
  auto w = detail::begin_control(h, n, out);
  if (!w) return w.error();
  w->put(static_cast<std::uint32_t>(ms.size()));
  for (const auto& m : ms) detail::put_record(*w, m);
  ASHL_ASSERT(w->ok() && w->position() == encoded_size(n), "wire measurements body layout");
  return detail::end_control(out, n);
}

// Writes only the 72-byte header for a data message (commit, pull_request,
// pull_reply) whose payload lies elsewhere, checksumming header and payload:
// a transport then sends the header and the payload from where it lies (a
// gradient or parameter buffer) without assembling them in one buffer.
inline status seal_header(const header& h, std::span<const std::byte> payload, std::span<std::byte> out,
                          const limits& lim = {}) {
  if (is_control(h.kind) && detail::valid_kind(static_cast<std::uint8_t>(h.kind)))
    return make_error(errc::invalid_argument, "header.kind", to_string(h.kind),
                      "control messages are encoded from their typed body");
  ASHL_TRY(detail::check_header(h, payload.size(), lim));
  if (out.size() < header_bytes)
    return make_error(errc::buffer_too_small, "wire.header_out.size", out.size(), "bytes, fewer than the 72-byte header");
  byte_writer w(out.first(header_bytes));
  detail::put_header(w, h, payload.size());
  w.put((h.flags & flag_unchecked) != 0 ? 0u : crc32c(payload, crc32c(out.first(crc_offset))));
  ASHL_ASSERT(w.ok() && w.position() == header_bytes, "wire header layout");
  return {};
}

// The same for a payload whose CRC-32C (crc32c(payload)) is known: a
// server sending one parameter snapshot to many workers checksums it once
// and each 72-byte header in O(log n) (crc32c_combine).
inline status seal_header(const header& h, std::size_t payload_bytes, std::uint32_t payload_crc,
                          std::span<std::byte> out, const limits& lim = {}) {
  if (is_control(h.kind) && detail::valid_kind(static_cast<std::uint8_t>(h.kind)))
    return make_error(errc::invalid_argument, "header.kind", to_string(h.kind),
                      "control messages are encoded from their typed body");
  ASHL_TRY(detail::check_header(h, payload_bytes, lim));
  if (out.size() < header_bytes)
    return make_error(errc::buffer_too_small, "wire.header_out.size", out.size(), "bytes, fewer than the 72-byte header");
  byte_writer w(out.first(header_bytes));
  detail::put_header(w, h, payload_bytes);
  w.put((h.flags & flag_unchecked) != 0 ? 0u : crc32c_combine(crc32c(out.first(crc_offset)), payload_crc, payload_bytes));
  ASHL_ASSERT(w.ok() && w.position() == header_bytes, "wire header layout");
  return {};
}

// Offset of the kind byte in the header (after magic u32, version u16 and
// header_bytes u16; docs/wire-format.md).
inline constexpr std::size_t kind_offset = 8;

// The kind a header says it is, read before anything is checked: what a
// receiver needs to choose a buffer (ps::worker's reply staging) or a batch
// (ps::server's commits) while the payload is still arriving. Worth nothing
// until decode accepted the message (the value may be no message_kind at
// all); nullopt when `head` is not a whole header. The one place that knows
// where the kind sits in an undecoded header.
constexpr std::optional<message_kind> peek_kind(std::span<const std::byte> head) noexcept {
  if (head.size() != header_bytes) return std::nullopt;
  return static_cast<message_kind>(std::to_integer<std::uint8_t>(head[kind_offset]));
}

// The codec a data message's header names, read before anything is
// checked (ps::worker: a compressed reply is not received into the
// parameters). Worth nothing until decode accepted the message.
constexpr std::optional<codec_id> peek_codec(std::span<const std::byte> head) noexcept {
  if (head.size() != header_bytes) return std::nullopt;
  return static_cast<codec_id>(std::to_integer<std::uint8_t>(head[kind_offset + 1]));
}

// The part a data message's header says it is, read before anything is
// checked: where a receiver places the part's bytes (ps::worker's staging
// buffer for a reply, ps::server's for a commit). Worth nothing until
// decode accepted the message; {} when the header is not a part of a
// pull_reply or commit of this version.
struct peeked_part {
  message_kind kind = message_kind::pull_reply;
  dtype type = dtype::f32;
  std::uint64_t element_count = 0;
  std::uint64_t sequence = 0;
  std::uint32_t part = 0, parts = 0;
  [[nodiscard]] bool valid() const noexcept { return parts != 0; }
};
inline peeked_part peek_part(std::span<const std::byte> head) noexcept {
  if (head.size() != header_bytes) return {};
  byte_reader r(head);
  std::uint32_t m = 0, flags = 0, pp = 0;
  std::uint16_t v = 0;
  std::uint64_t n = 0;
  (void)r.get(m, "");
  (void)r.get(v, "");
  const message_kind kind = *peek_kind(head);
  if (m != magic || v != version || (kind != message_kind::pull_reply && kind != message_kind::commit)) return {};
  byte_reader f(head.subspan(12));
  (void)f.get(flags, "");
  (void)f.get(n, "");
  if ((flags & flag_part) == 0) return {};
  std::uint64_t seq = 0;
  byte_reader sq(head.subspan(32));
  (void)sq.get(seq, "");
  const auto type = static_cast<dtype>(std::to_integer<std::uint8_t>(head[10]));
  if (kind == message_kind::commit)
    return {kind, type, n, seq, (flags >> commit_part_shift) & 0xffu, flags >> (commit_part_shift + 8)};
  byte_reader q(head.subspan(64));
  (void)q.get(pp, "");
  return {kind, type, n, seq, pp & 0xffffu, pp >> 16};
}

// Re-encodes a decoded message (the fuzz target's round trip).
inline result<std::size_t> encode(const message_view& m, std::span<std::byte> out, const limits& lim = {}) {
  return std::visit(
      [&](const auto& b) -> result<std::size_t> {
        if constexpr (std::is_same_v<std::decay_t<decltype(b)>, std::monostate>)
          return encode(m.header, m.payload, out, lim);
        else
          return encode(m.header, b, out, lim);
      },
      m.body);
}

// decode's CRC pass over the payload goes in chunks of this size; a
// visitor (decode's last argument) sees each chunk right after the CRC read
// it, while it is in the cache (crc32c_chunked).
inline constexpr std::size_t decode_chunk_bytes = crc32c_chunk_bytes;

// Validates a message that arrived in two parts, the 72-byte header and the
// payload (a transport that received the payload straight into its
// destination), and returns views into them.
//
// With `visit`: visit(h, chunk) is called on each chunk of the payload in
// order (decode_chunk_bytes, the last one shorter) as the CRC check reads
// it, so a receiver's own read-only check of the payload (ps::server_core's
// value check) costs no pass of its own. h is the header as read, not yet
// validated, and what the visitor learns is worth nothing unless decode
// succeeds; a visitor must not write anywhere the message could reach.
template <class Visit>
inline result<message_view> decode(std::span<const std::byte> head, std::span<const std::byte> payload,
                                   const limits& lim, Visit&& visit) {
  if (head.size() != header_bytes)
    return make_error(errc::malformed, "message.header_size", head.size(), "bytes, not the 72-byte header");
  byte_reader r(head);
  std::uint32_t got_magic = 0, crc = 0, flags = 0;
  std::uint16_t got_version = 0, got_header_bytes = 0;
  std::uint8_t kind = 0, codec = 0, type = 0, reserved8 = 0;
  std::uint64_t payload_bytes = 0;
  header h;
  // The reads cannot fail: the size was checked above.
  (void)r.get(got_magic, "header.magic");
  if (got_magic != magic)
    return make_error(errc::malformed, "header.magic", detail::hex32{got_magic}, "not an ashl message (want 0x4c485341)");
  (void)r.get(got_version, "header.version");
  if (got_version != version)
    return make_error(errc::unsupported, "header.version", got_version,
                      "this build reads version " + std::to_string(version));
  (void)r.get(got_header_bytes, "header.header_bytes");
  if (got_header_bytes != header_bytes)
    return make_error(errc::malformed, "header.header_bytes", got_header_bytes, "headers are 72 bytes");
  (void)r.get(kind, "header.kind");
  (void)r.get(codec, "header.codec");
  (void)r.get(type, "header.dtype");
  (void)r.get(reserved8, "header.reserved0");
  (void)r.get(flags, "header.flags");
  (void)r.get(h.element_count, "header.element_count");
  (void)r.get(h.tensor, "header.tensor");
  (void)r.get(h.rank, "header.rank");
  (void)r.get(h.sequence, "header.sequence");
  (void)r.get(h.clock, "header.clock");
  (void)r.get(h.step, "header.step");
  (void)r.get(payload_bytes, "header.payload_bytes");
  (void)r.get(h.samples, "header.samples");
  (void)r.get(crc, "header.crc32c");
  if (payload_bytes > lim.max_payload_bytes)
    return make_error(errc::out_of_range, "header.payload_bytes", payload_bytes,
                      "exceeds limits.max_payload_bytes = " + std::to_string(lim.max_payload_bytes));
  if (payload_bytes != payload.size())
    return make_error(errc::malformed, "header.payload_bytes", payload_bytes,
                      "disagrees with the " + std::to_string(payload.size()) + " bytes that follow the header");
  h.kind = static_cast<message_kind>(kind);
  h.codec = static_cast<codec_id>(codec);
  h.type = static_cast<dtype>(type);
  h.flags = flags;
  if ((flags & flag_part) != 0 && h.kind == message_kind::commit) {  // flags bits 16..31: part | parts << 8
    h.part = static_cast<std::uint16_t>((flags >> commit_part_shift) & 0xffu);
    h.parts = static_cast<std::uint16_t>(flags >> (commit_part_shift + 8));
    h.flags = flags & ((1u << commit_part_shift) - 1);
  } else if ((flags & flag_part) != 0) {  // offset 64: part | parts << 16
    h.part = static_cast<std::uint16_t>(h.samples & 0xffffu);
    h.parts = static_cast<std::uint16_t>(h.samples >> 16);
    h.samples = 0;
  }
  if ((flags & flag_unchecked) != 0) {
    // No CRC (docs/wire-format.md, flag `unchecked`): taken only where the
    // receiver allows it for this sender; the visitor still sees every chunk.
    if (!lim.unchecked_allowed)
      return make_error(errc::malformed, "header.flags", detail::hex32{flags},
                        "unchecked (no CRC) is taken only from a peer on this host that the receiver trusts "
                        "(trust_local_lanes on both ends)");
    if (crc != 0)
      return make_error(errc::malformed, "header.crc32c", detail::hex32{crc}, "must be 0 with the flag unchecked");
    for (std::size_t at = 0; at < payload.size(); at += decode_chunk_bytes)
      visit(static_cast<const header&>(h), payload.subspan(at, std::min(decode_chunk_bytes, payload.size() - at)));
  } else {
    const std::uint32_t want_crc =
        crc32c_chunked(payload, crc32c(head.first(crc_offset)),
                       [&](std::span<const std::byte> chunk) { visit(static_cast<const header&>(h), chunk); });
    if (crc != want_crc)
      return make_error(errc::checksum_mismatch, "header.crc32c", detail::hex32{crc},
                        "computed " + detail::hex32{want_crc}.str() + " over header and payload");
  }
  if (reserved8 != 0) return make_error(errc::malformed, "header.reserved0", reserved8, "must be 0");
  ASHL_TRY(detail::check_header(h, payload_bytes, lim));
  message_view m{h, payload, {}};
  if (is_control(h.kind)) {
    auto body = detail::read_body(h, m.payload, lim);
    if (!body) return body.error();
    m.body = *body;
  }
  return m;
}

inline result<message_view> decode(std::span<const std::byte> head, std::span<const std::byte> payload,
                                   const limits& lim) {
  return decode(head, payload, lim, [](const header&, std::span<const std::byte>) noexcept {});
}

// Validates every field of `in` and returns views into it. The buffer must
// hold exactly one message.
inline result<message_view> decode(std::span<const std::byte> in, const limits& lim) {
  if (in.size() < header_bytes)
    return make_error(errc::malformed, "message.size", in.size(), "bytes, fewer than the 72-byte header");
  return decode(in.first(header_bytes), in.subspan(header_bytes), lim);
}

}  // namespace wire
ASHL_NAMESPACE_END
