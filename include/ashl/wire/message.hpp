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

// "ASHL" in the first four bytes.
inline constexpr std::uint32_t magic = 0x4C485341u;
// Version 2: the plan_update body is ashl::worker_plan (batch 0 keeps the
// worker's own, local_iterations 0 commits by interval, stage is a stage_id)
// and the measurements kind exists. Version 3: the join body carries the
// job id (20 bytes), and a commit's header carries the samples its update
// covers (the u32 at offset 64, reserved before; 0 in every other kind), so
// the server no longer rebuilds them from header.step. An older peer is
// refused by version. Version 4: a pull_reply may come in parts (flag
// `part`; the u32 at offset 64 then holds the part's index and the count of
// parts, see part_elements), each part checksummed on its own. Version 5:
// a dense commit may come in parts too (flag `part`; its offset 64 keeps
// the samples, so the part's index and the count of parts sit in the
// flags word's upper half, see commit_part_shift).
inline constexpr std::uint16_t version = 5;
inline constexpr std::size_t header_bytes = 72;
// The CRC field sits at the end of the header and covers everything before it
// plus the payload.
inline constexpr std::size_t crc_offset = 68;

// Wire values: never renumber, only append.
enum class message_kind : std::uint8_t {
  commit = 1,        // worker -> server: one encoded update of a tensor (shard)
  pull_request = 2,  // worker -> server: send me tensor `tensor`
  pull_reply = 3,    // server -> worker: parameters, dense (identity) or compressed
  join = 4,          // worker -> server: I am (re)joining
  leave = 5,         // either way: a worker leaves or is evicted
  plan_update = 6,   // server -> worker: the worker's new plan
  metric = 7,        // worker -> server: a named scalar (loss, accuracy, ...)
  error = 8,         // either way: the message with sequence `in_reply_to` was refused
  measurements = 9,  // worker -> server: timing measurements of worker `rank`
};
inline constexpr auto message_kind_table =
    make_enum_table_from<message_kind>(1, "?", "commit", "pull_request", "pull_reply", "join", "leave", "plan_update",
                                       "metric", "error", "measurements");
static_assert(message_kind_table.name(message_kind::measurements) == "measurements",
              "message_kind_table ends where message_kind does");
inline constexpr std::uint8_t message_kind_first = message_kind_table.first;
inline constexpr std::uint8_t message_kind_last = message_kind_table.first + message_kind_table.size() - 1;

constexpr std::string_view to_string(message_kind k) noexcept { return message_kind_table.name(k); }

constexpr bool is_control(message_kind k) noexcept { return static_cast<std::uint8_t>(k) >= 4; }

// Header flag bits. Bits not named here must be zero.
inline constexpr std::uint32_t flag_last_shard = 1u << 0;     // commit, pull_reply: final shard of the tensor
inline constexpr std::uint32_t flag_ack_requested = 1u << 1;  // any kind: the sender wants an acknowledgement
inline constexpr std::uint32_t flag_pull = 1u << 2;           // commit: a pull rides with it (no pull_request follows)
inline constexpr std::uint32_t flag_part = 1u << 3;           // pull_reply (v4), commit (v5): one part of a message sent in parts
inline constexpr std::uint32_t flags_known = flag_last_shard | flag_ack_requested | flag_pull | flag_part;
// A commit part (flag_part on a commit) carries its index in flags bits
// 16..23 and the count of parts in bits 24..31 (header.part, header.parts;
// at most max_commit_parts), because its u32 at offset 64 is the commit's
// samples. In every other message those bits are 0.
inline constexpr unsigned commit_part_shift = 16;
inline constexpr std::uint32_t max_commit_parts = 0xffu;
// Parts of one commit a receiver holds in flight at most (received into
// its staging, not yet checked); a sender's window is at most this
// (ps::worker_params.commit_window), a part beyond it is refused.
inline constexpr std::uint32_t max_parts_in_flight = 16;

// A message in parts (flag_part): part `part` of `parts` (2 <= parts <=
// max_parts, part < parts) carries elements [first, first + count) of the
// element_count the header names, with first = part * per and per =
// ceil(element_count / parts); every part holds at least one element
// (parts = ceil(element_count / per)). A pull_reply's offset 64 holds
// part | parts << 16; a commit's flags word holds them (commit_part_shift).
inline constexpr std::uint32_t max_parts = 0xffffu;
struct part_range {
  std::uint64_t first = 0, count = 0;
};
// The elements of part `part`, or count 0 when (element_count, parts, part)
// is not a valid split.
constexpr part_range part_elements(std::uint64_t element_count, std::uint32_t parts, std::uint32_t part) noexcept {
  if (parts < 2 || parts > max_parts || part >= parts || element_count < parts) return {};
  const std::uint64_t per = (element_count + parts - 1) / parts;
  if ((element_count + per - 1) / per != parts) return {};
  const std::uint64_t first = std::uint64_t{part} * per;
  return {first, std::min(per, element_count - first)};
}
// The number of parts a payload of element_count elements of elem_bytes
// bytes is sent in for a part size of about part_bytes (0: one message):
// 0 or 1 means not in parts. At most `most` parts (max_commit_parts for a
// commit): the parts grow instead.
constexpr std::uint32_t parts_for(std::uint64_t element_count, std::size_t elem_bytes, std::uint64_t part_bytes,
                                  std::uint32_t most = max_parts) noexcept {
  if (part_bytes == 0 || elem_bytes == 0 || element_count < 2) return 0;
  const std::uint64_t per_wanted = std::max<std::uint64_t>(1, part_bytes / elem_bytes);
  std::uint64_t parts = (element_count + per_wanted - 1) / per_wanted;
  if (parts < 2) return 0;
  parts = std::min<std::uint64_t>(parts, std::min(most, max_parts));
  if (parts < 2) return 0;
  const std::uint64_t per = (element_count + parts - 1) / parts;
  return static_cast<std::uint32_t>((element_count + per - 1) / per);
}

// What a receiver accepts. A server sets these from its tensors' sizes.
struct limits {
  std::uint64_t max_elements = std::uint64_t{1} << 32;
  std::uint64_t max_payload_bytes = std::uint64_t{1} << 30;
  std::uint32_t max_error_text = 4096;
  std::uint32_t max_measurements = 1024;  // records in one measurements message
  // In this order in a saved server state (core/state_io.hpp).
  static constexpr auto fields() {
    return std::tuple{field{"max_elements", &limits::max_elements},
                      field{"max_payload_bytes", &limits::max_payload_bytes},
                      field{"max_error_text", &limits::max_error_text},
                      field{"max_measurements", &limits::max_measurements}};
  }
};

// Header fields a sender chooses; magic, version, lengths and CRC are derived.
struct header {
  message_kind kind = message_kind::commit;
  codec_id codec = codec_id::identity;
  dtype type = dtype::f32;
  std::uint32_t flags = 0;
  std::uint64_t element_count = 0;
  std::uint32_t tensor = 0;  // tensor (shard) id
  std::uint32_t rank = 0;    // worker rank the message is from or about
  std::uint64_t sequence = 0;
  std::uint64_t clock = 0;   // sender's logical clock (worker iteration / server version)
  std::uint64_t step = 0;    // training step; with seed and tensor it selects the Philox stream
  std::uint32_t samples = 0; // commit: the samples its update covers (iterations x batch); 0 in other kinds
  std::uint16_t part = 0;     // flag_part: this part's index, and
  std::uint16_t parts = 0;    // the number of parts (0 and 0 without the flag; offset 64 as samples is)
  friend constexpr bool operator==(const header&, const header&) = default;
};

// ---- control bodies (the payload of kinds join .. measurements) ------------

// The kind and fixed size of a control body type. A body type names them as
// members; ashl::worker_plan (core/plan.hpp, shared with sync/ and profile/)
// gets them here. error_body and measurements_body have a size that depends
// on their content (they name fixed_bytes, the part before it): their traits
// have no wire_bytes.
namespace detail {
template <class Body>
struct body_size {};
template <class Body>
  requires requires {
    { Body::wire_bytes } -> std::convertible_to<std::size_t>;
  }
struct body_size<Body> {
  static constexpr std::size_t wire_bytes = Body::wire_bytes;
};
}  // namespace detail
template <class Body>
struct body_traits {};
template <class Body>
  requires requires {
    { Body::kind } -> std::convertible_to<message_kind>;
  }
struct body_traits<Body> : detail::body_size<Body> {
  static constexpr message_kind kind = Body::kind;
};

struct join_body {
  static constexpr message_kind kind = message_kind::join;
  static constexpr std::size_t wire_bytes = 20;
  std::uint64_t incarnation = 0;  // larger after a restart, so a rejoin is not mistaken for a duplicate
  std::uint32_t batch = 0;        // local batch size it starts with; >= 1
  std::uint64_t job = 0;          // the job id the worker belongs to (ps::make_job_id); 0: not said
  // The wire's field order (core/fields.hpp).
  static constexpr auto fields() {
    return std::tuple{field{"incarnation", &join_body::incarnation}, field{"batch", &join_body::batch},
                      field{"job", &join_body::job}};
  }
  friend constexpr bool operator==(const join_body&, const join_body&) = default;
};

enum class leave_reason : std::uint32_t { left = 0, evicted_timeout = 1, evicted_failure = 2, evicted_policy = 3 };
inline constexpr auto leave_reason_table =
    make_enum_table<leave_reason>("left", "evicted_timeout", "evicted_failure", "evicted_policy");
static_assert(leave_reason_table.name(leave_reason::evicted_policy) == "evicted_policy",
              "leave_reason_table ends where leave_reason does");
inline constexpr std::uint32_t leave_reason_count = leave_reason_table.size();

constexpr std::string_view to_string(leave_reason r) noexcept { return leave_reason_table.name(r); }

struct leave_body {
  static constexpr message_kind kind = message_kind::leave;
  static constexpr std::size_t wire_bytes = 8;
  leave_reason reason = leave_reason::left;
  std::uint32_t subject = 0;  // rank of the worker that leaves
  static constexpr auto fields() {
    return std::tuple{field{"reason", &leave_body::reason}, field{"subject", &leave_body::subject}};
  }
  friend constexpr bool operator==(const leave_body&, const leave_body&) = default;
};

// The plan_update body is the worker's plan itself, in field order: 24
// bytes (the fields before the codec options) when both codec options are
// 0, so every version-5 peer reads it as before, and 32 bytes (with
// codec_bits and codec_block) when one is set; a decoder takes both sizes.
// The header's codec and dtype fields of a plan_update say what the worker
// commits with from now on.
using plan_update_body = ashl::worker_plan;
template <>
struct body_traits<ashl::worker_plan> {
  static constexpr message_kind kind = message_kind::plan_update;
  static constexpr std::size_t wire_bytes = 32;        // with the codec options
  static constexpr std::size_t wire_bytes_before_codec = 24;
};

struct metric_body {
  static constexpr message_kind kind = message_kind::metric;
  static constexpr std::size_t wire_bytes = 12;
  metric_id name = metric_id::loss;  // an ashl::metric_id, or a value >= metric_id_application
  double value = 0;                  // finite
  static constexpr auto fields() {
    return std::tuple{field{"name", &metric_body::name}, field{"value", &metric_body::value}};
  }
  friend constexpr bool operator==(const metric_body&, const metric_body&) = default;
};

struct error_body {
  static constexpr message_kind kind = message_kind::error;
  static constexpr std::size_t fixed_bytes = 16;
  errc code = errc::internal;   // never errc::ok
  std::uint64_t in_reply_to = 0;  // sequence of the refused message
  std::string_view text;          // a view into the message (decode) or the caller's string (encode)
  friend constexpr bool operator==(const error_body&, const error_body&) = default;
};

// Timing measurements of the worker named by the header's rank: a u32 count,
// then `count` records of 25 bytes (kind u8, seconds f64, amount f64, time
// f64). Decoding checks every record and keeps a view of them: nothing is
// allocated, whatever the count says (which limits.max_measurements bounds).
// Encode from values with encode(header, std::span<const ashl::measurement>, out).
struct measurements_body {
  static constexpr message_kind kind = message_kind::measurements;
  static constexpr std::size_t fixed_bytes = 4;
  static constexpr std::size_t record_bytes = 25;
  std::span<const std::byte> records;  // count * record_bytes bytes, already validated
  std::uint32_t worker = 0;            // the header's rank (not repeated in the body)

  static constexpr std::size_t bytes_for(std::size_t count) noexcept { return fixed_bytes + count * record_bytes; }
  [[nodiscard]] std::size_t size() const noexcept { return records.size() / record_bytes; }
  [[nodiscard]] bool empty() const noexcept { return records.empty(); }
  // Record i as a measurement. Precondition: i < size().
  [[nodiscard]] measurement operator[](std::size_t i) const noexcept {
    ASHL_ASSERT(i < size(), "measurements_body: record index out of range");
    return parse(records.subspan(i * record_bytes, record_bytes), worker);
  }

  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = measurement;
    using difference_type = std::ptrdiff_t;
    using reference = measurement;
    iterator() = default;
    iterator(const measurements_body* b, std::size_t i) noexcept : b_(b), i_(i) {}
    measurement operator*() const noexcept { return (*b_)[i_]; }
    iterator& operator++() noexcept {
      ++i_;
      return *this;
    }
    iterator operator++(int) noexcept {
      iterator t = *this;
      ++i_;
      return t;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept { return a.i_ == b.i_; }

   private:
    const measurements_body* b_ = nullptr;
    std::size_t i_ = 0;
  };
  [[nodiscard]] iterator begin() const noexcept { return {this, 0}; }
  [[nodiscard]] iterator end() const noexcept { return {this, size()}; }

  // One 25-byte record (no validation; decode validated it).
  static measurement parse(std::span<const std::byte> rec, std::uint32_t worker) noexcept {
    measurement m;
    m.worker = worker;
    std::uint8_t k = 0;
    std::memcpy(&k, rec.data(), 1);
    m.kind = static_cast<measurement_kind>(k);
    byte_reader r(rec.subspan(1));
    (void)r.get(m.seconds, "");
    (void)r.get(m.amount, "");
    (void)r.get(m.time, "");
    return m;
  }

  friend bool operator==(const measurements_body& a, const measurements_body& b) noexcept {
    return a.worker == b.worker && a.records.size() == b.records.size() &&
           (a.records.empty() || std::memcmp(a.records.data(), b.records.data(), a.records.size()) == 0);
  }
};

using control_body =
    std::variant<std::monostate, join_body, leave_body, plan_update_body, metric_body, error_body, measurements_body>;

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

// Prints as 0x%08x, unquoted, in error messages.
struct hex32 {
  std::uint32_t v;
  friend std::ostream& operator<<(std::ostream& os, hex32 h) {
    static constexpr char digits[] = "0123456789abcdef";
    char s[11] = {'0', 'x'};
    for (int i = 0; i < 8; ++i) s[2 + i] = digits[(h.v >> (28 - 4 * i)) & 0xfu];
    return os.write(s, 10);
  }
  std::string str() const {
    std::ostringstream os;
    os << *this;
    return os.str();
  }
};

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

inline status check_body(const join_body& b, const limits&) {
  if (b.batch == 0) return make_error(errc::invalid_argument, "join.batch", 0, "must be >= 1");
  return {};
}
inline status check_body(const leave_body& b, const limits&) {
  if (static_cast<std::uint32_t>(b.reason) >= leave_reason_count)
    return make_error(errc::malformed, "leave.reason", static_cast<std::uint32_t>(b.reason), "unknown reason");
  return {};
}
// The plan's own rules (core/plan.hpp, shared with the simulator).
inline status check_body(const plan_update_body& b, const limits&) { return check_plan(b, "plan_update"); }
inline status check_body(const metric_body& b, const limits&) {
  const auto name = static_cast<std::uint32_t>(b.name);
  if (name >= metric_id_count && name < metric_id_application)
    return make_error(errc::unsupported, "metric.name", name, "reserved metric id");
  if (!std::isfinite(b.value)) return make_error(errc::invalid_argument, "metric.value", b.value, "must be finite");
  return {};
}
inline status check_body(const error_body& b, const limits& lim) {
  const auto c = static_cast<std::uint32_t>(b.code);
  if (c == 0 || c > static_cast<std::uint32_t>(errc::internal))
    return make_error(errc::malformed, "error.code", c, "not an error code");
  if (b.text.size() > lim.max_error_text)
    return make_error(errc::out_of_range, "error.text_bytes", b.text.size(),
                      "exceeds limits.max_error_text = " + std::to_string(lim.max_error_text));
  return {};
}

inline std::string record_field(std::size_t i, const char* field) {
  return "measurements[" + std::to_string(i) + "]." + field;
}
// One record's rules (docs/wire-format.md "measurements"), for encode and decode.
inline status check_record(std::size_t i, const measurement& m) {
  const auto k = static_cast<std::uint8_t>(m.kind);
  if (k >= measurement_kind_count)
    return make_error(errc::unsupported, record_field(i, "kind"), k, "unknown measurement kind");
  if (!std::isfinite(m.seconds) || m.seconds <= 0.0)
    return make_error(errc::invalid_argument, record_field(i, "seconds"), m.seconds, "must be finite and > 0");
  if (!std::isfinite(m.amount) || m.amount < 0.0)
    return make_error(errc::invalid_argument, record_field(i, "amount"), m.amount, "must be finite and >= 0");
  if (!std::isfinite(m.time)) return make_error(errc::invalid_argument, record_field(i, "time"), m.time, "must be finite");
  return {};
}
inline status check_count(std::size_t count, const limits& lim) {
  if (count == 0) return make_error(errc::malformed, "measurements.count", 0, "a measurements message carries at least one record");
  if (count > lim.max_measurements)
    return make_error(errc::out_of_range, "measurements.count", count,
                      "exceeds limits.max_measurements = " + std::to_string(lim.max_measurements));
  return {};
}
inline status check_body(const measurements_body& b, const limits& lim) {
  if (b.records.size() % measurements_body::record_bytes != 0)
    return make_error(errc::malformed, "measurements.records_bytes", b.records.size(), "not a whole number of 25-byte records");
  ASHL_TRY(check_count(b.size(), lim));
  for (std::size_t i = 0; i < b.size(); ++i) ASHL_TRY(check_record(i, b[i]));
  return {};
}

// A body of fixed size (join, leave, metric): its fields in their table's
// order (Body::fields(); an enum as its underlying integer).
template <class Body>
  requires described<Body>
inline void put_body(byte_writer& w, const Body& b) {
  put_fields(w, b);
}
// The plan's fields in their table's order (worker_plan::fields()); the
// codec options only when set (24 bytes without, 32 with).
inline void put_body(byte_writer& w, const plan_update_body& b) {
  if (b.has_codec_options()) put_fields(w, b);
  else put_fields(w, b, plan_update_body::fields_before_codec());
}
inline void put_record(byte_writer& w, const measurement& m) {
  w.put(static_cast<std::uint8_t>(m.kind));
  w.put(m.seconds);
  w.put(m.amount);
  w.put(m.time);
}
inline void put_body(byte_writer& w, const measurements_body& b) {
  w.put(static_cast<std::uint32_t>(b.size()));
  w.put_bytes(b.records);
}
inline void put_body(byte_writer& w, const error_body& b) {
  w.put(static_cast<std::uint32_t>(b.code));
  w.put(static_cast<std::uint32_t>(b.text.size()));
  w.put(b.in_reply_to);
  w.put_bytes(std::as_bytes(std::span<const char>(b.text.data(), b.text.size())));
}

template <class Body>
std::size_t body_bytes(const Body& b) noexcept {
  if constexpr (std::is_same_v<Body, error_body>)
    return error_body::fixed_bytes + b.text.size();
  else if constexpr (std::is_same_v<Body, measurements_body>)
    return measurements_body::fixed_bytes + b.records.size();
  else if constexpr (std::is_same_v<Body, plan_update_body>)
    return b.has_codec_options() ? body_traits<Body>::wire_bytes : body_traits<Body>::wire_bytes_before_codec;
  else
    return body_traits<Body>::wire_bytes;
}

inline status fixed_size(std::string_view kind, std::size_t got, std::size_t want) {
  if (got == want) return {};
  return make_error(errc::malformed, std::string(kind) + ".payload_bytes", got,
                    "a " + std::string(kind) + " body is " + std::to_string(want) + " bytes");
}

// A body of fixed size read by its field table (errors name "<kind>.<field>";
// an enum's range is checked by check_body).
template <class Body>
result<control_body> read_fixed_body(byte_reader& r, std::size_t bytes, std::string_view kind, const limits& lim) {
  ASHL_TRY(fixed_size(kind, bytes, body_traits<Body>::wire_bytes));
  Body b;
  ASHL_TRY(get_fields(r, b, kind));
  ASHL_TRY(check_body(b, lim));
  return control_body(b);
}

// Parses and checks the body of a control kind; the payload length was
// already checked against the buffer.
inline result<control_body> read_body(const header& h, std::span<const std::byte> p, const limits& lim) {
  byte_reader r(p);
  switch (h.kind) {
    case message_kind::join:
      return read_fixed_body<join_body>(r, p.size(), "join", lim);
    case message_kind::leave:
      return read_fixed_body<leave_body>(r, p.size(), "leave", lim);
    case message_kind::plan_update: {
      constexpr std::size_t full = body_traits<plan_update_body>::wire_bytes;
      constexpr std::size_t before = body_traits<plan_update_body>::wire_bytes_before_codec;
      if (p.size() != full && p.size() != before)
        return make_error(errc::malformed, "plan_update.payload_bytes", p.size(),
                          "a plan_update body is " + std::to_string(before) + " or " + std::to_string(full) + " bytes");
      plan_update_body b;
      if (p.size() == full) ASHL_TRY(get_fields(r, b, "plan_update"));
      else ASHL_TRY(get_fields(r, b, "plan_update", plan_update_body::fields_before_codec()));
      ASHL_TRY(check_body(b, lim));  // the stage's range too
      return control_body(b);
    }
    case message_kind::metric:
      return read_fixed_body<metric_body>(r, p.size(), "metric", lim);
    case message_kind::error: {
      if (p.size() < error_body::fixed_bytes)
        return make_error(errc::malformed, "error.payload_bytes", p.size(), "an error body is at least 16 bytes");
      std::uint32_t code = 0, text_bytes = 0;
      error_body b;
      ASHL_TRY(r.get(code, "error.code"));
      ASHL_TRY(r.get(text_bytes, "error.text_bytes"));
      ASHL_TRY(r.get(b.in_reply_to, "error.in_reply_to"));
      if (text_bytes != r.remaining())
        return make_error(errc::malformed, "error.text_bytes", text_bytes,
                          "disagrees with the " + std::to_string(r.remaining()) + " bytes after the fixed fields");
      if (code > 0xffu) return make_error(errc::malformed, "error.code", code, "not an error code");
      b.code = static_cast<errc>(code);
      const auto text = r.rest();
      b.text = std::string_view(reinterpret_cast<const char*>(text.data()), text.size());
      ASHL_TRY(check_body(b, lim));
      return control_body(b);
    }
    case message_kind::measurements: {
      // The count is checked against the limit and the bytes present before
      // any record is looked at; nothing is allocated either way.
      if (p.size() < measurements_body::fixed_bytes)
        return make_error(errc::malformed, "measurements.payload_bytes", p.size(),
                          "a measurements body is at least 4 bytes");
      std::uint32_t count = 0;
      ASHL_TRY(r.get(count, "measurements.count"));
      ASHL_TRY(check_count(count, lim));
      if (r.remaining() != std::size_t{count} * measurements_body::record_bytes)
        return make_error(errc::malformed, "measurements.count", count,
                          "disagrees with the " + std::to_string(r.remaining()) +
                              " bytes after it (25 bytes a record)");
      measurements_body b{r.rest(), h.rank};
      ASHL_TRY(check_body(b, lim));
      return control_body(b);
    }
    default: return control_body{};
  }
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
  std::uint32_t crc = crc32c(out.first(crc_offset));
  crc = crc32c(out.subspan(header_bytes, payload_bytes), crc);
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
  if (out.size() < encoded_size(n))
    return make_error(errc::buffer_too_small, "wire.out.size", out.size(),
                      "bytes, fewer than the " + std::to_string(encoded_size(n)) + " the message needs");
  byte_writer w(out.first(encoded_size(n)));
  detail::put_header(w, h, n);
  w.put(std::uint32_t{0});
  detail::put_body(w, body);
  ASHL_ASSERT(w.ok() && w.position() == encoded_size(n), "wire control body layout");
  std::uint32_t crc = crc32c(out.first(crc_offset));
  crc = crc32c(out.subspan(header_bytes, n), crc);
  byte_writer c(out.subspan(crc_offset, 4));
  c.put(crc);
  return encoded_size(n);
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
  if (out.size() < encoded_size(n))
    return make_error(errc::buffer_too_small, "wire.out.size", out.size(),
                      "bytes, fewer than the " + std::to_string(encoded_size(n)) + " the message needs");
  byte_writer w(out.first(encoded_size(n)));
  detail::put_header(w, h, n);
  w.put(std::uint32_t{0});
  w.put(static_cast<std::uint32_t>(ms.size()));
  for (const auto& m : ms) detail::put_record(w, m);
  ASHL_ASSERT(w.ok() && w.position() == encoded_size(n), "wire measurements body layout");
  std::uint32_t crc = crc32c(out.first(crc_offset));
  crc = crc32c(out.subspan(header_bytes, n), crc);
  byte_writer c(out.subspan(crc_offset, 4));
  c.put(crc);
  return encoded_size(n);
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
  w.put(crc32c(payload, crc32c(out.first(crc_offset))));
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
  w.put(crc32c_combine(crc32c(out.first(crc_offset)), payload_crc, payload_bytes));
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
// it, while it is in the cache. Three of crc32c's 64 KiB streams (its
// fastest path), small enough for a core's L2 cache.
inline constexpr std::size_t decode_chunk_bytes = std::size_t{192} << 10;

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
  std::uint32_t want_crc = crc32c(head.first(crc_offset));
  for (std::size_t at = 0; at < payload.size(); at += decode_chunk_bytes) {
    const auto chunk = payload.subspan(at, std::min(decode_chunk_bytes, payload.size() - at));
    want_crc = crc32c(chunk, want_crc);
    visit(static_cast<const header&>(h), chunk);
  }
  if (crc != want_crc)
    return make_error(errc::checksum_mismatch, "header.crc32c", detail::hex32{crc},
                      "computed " + detail::hex32{want_crc}.str() + " over header and payload");
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
