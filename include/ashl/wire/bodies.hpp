// ashl/wire/bodies.hpp — the control bodies (join, leave, plan_update,
// metric, error, measurements; since version 6 lease, replicate,
// replica_ack, replica_hello and shard_state, docs/elastic.md §3.4, §4.2):
// their types, their checks, and how each is written and read (the fixed
// ones by their field tables, core/fields.hpp).
// wire/message.hpp frames them; docs/wire-format.md, byte by byte.
//
//   #include <ashl/wire/message.hpp>   // includes this
//   if (auto* p = m->get<ashl::worker_plan>()) ...   // a decoded plan_update
#pragma once

#include <ashl/wire/header.hpp>

#include <ashl/core/bytes.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/enum_table.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>

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

// Version 6 (docs/elastic.md §3.4): 36 bytes; the last three fields are new
// and 0 means "not said" in each.
struct join_body {
  static constexpr message_kind kind = message_kind::join;
  static constexpr std::size_t wire_bytes = 36;
  std::uint64_t incarnation = 0;  // larger after a restart, so a rejoin is not mistaken for a duplicate
  std::uint32_t batch = 0;        // local batch size it starts with; >= 1
  std::uint64_t job = 0;          // the job id the worker belongs to (ps::make_job_id); 0: not said
  std::uint64_t elements = 0;     // the worker's model size (the shape check of elastic.md §2.3); 0: not said
  std::uint32_t flags = 0;        // join_flags_known (below)
  std::uint32_t term = 0;         // the replication term it last saw (§4.5); 0: none
  // The wire's field order (core/fields.hpp).
  static constexpr auto fields() {
    return std::tuple{field{"incarnation", &join_body::incarnation}, field{"batch", &join_body::batch},
                      field{"job", &join_body::job},                 field{"elements", &join_body::elements},
                      field{"flags", &join_body::flags},             field{"term", &join_body::term}};
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


// ---- version 6: elastic jobs (docs/elastic.md §3.4, §4.2) -------------------

// join (36 bytes) flags.
inline constexpr std::uint32_t join_flag_failover = 1u << 0;  // the worker lost this shard's other server (§4.5)
inline constexpr std::uint32_t join_flags_known = join_flag_failover;

// A grant of the data ledger (server 0 -> worker; header.sequence = the
// lease's number for this worker, header.rank = the worker): positions
// [begin, end) of epoch `epoch`'s order of `samples` samples, shuffled by
// `shuffle_seed` (docs/elastic.md §3.1).
inline constexpr std::uint32_t lease_flag_epoch_end = 1u << 0;  // the last lease of its epoch
inline constexpr std::uint32_t lease_flag_resent = 1u << 1;     // outstanding, sent again after a rejoin (begin = the cursor)
inline constexpr std::uint32_t lease_flags_known = lease_flag_epoch_end | lease_flag_resent;
struct lease_body {
  static constexpr message_kind kind = message_kind::lease;
  static constexpr std::size_t wire_bytes = 44;
  std::uint64_t epoch = 0;
  std::uint64_t begin = 0;         // < end
  std::uint64_t end = 0;           // <= samples
  std::uint64_t samples = 0;       // N, the same in every lease of a job
  std::uint64_t shuffle_seed = 0;  // the workers' permutation seed
  std::uint32_t flags = 0;         // lease_flags_known
  static constexpr auto fields() {
    return std::tuple{field{"epoch", &lease_body::epoch},     field{"begin", &lease_body::begin},
                      field{"end", &lease_body::end},         field{"samples", &lease_body::samples},
                      field{"shuffle_seed", &lease_body::shuffle_seed}, field{"flags", &lease_body::flags}};
  }
  friend constexpr bool operator==(const lease_body&, const lease_body&) = default;
};

// What a replicate message carries: a snapshot of the core (0) or one of
// the core's calls (1..9: the values of rules/core_events.hpp's
// core_event_kind, which static_asserts they agree; 9 is a tick, the
// primary's keepalive and the ledger's clock, a record like the others
// because its `now` is the primary's).
enum class replica_event : std::uint8_t {
  snapshot = 0,
  join = 1,
  leave = 2,
  evict = 3,
  commit = 4,
  pull = 5,
  metric = 6,
  measurement = 7,
  drain = 8,
  tick = 9,
};
inline constexpr auto replica_event_table = make_enum_table<replica_event>(
    "snapshot", "join", "leave", "evict", "commit", "pull", "metric", "measurement", "drain", "tick");
static_assert(replica_event_table.name(replica_event::tick) == "tick", "replica_event_table ends where replica_event does");
constexpr std::string_view to_string(replica_event e) noexcept { return replica_event_table.name(e); }

// The framing of rules/core_events.hpp's record that the wire looks at (a
// replicate body's record starts with it; core_events.hpp static_asserts
// these equal its own): its magic, where its kind byte sits, its prefix.
inline constexpr std::uint32_t core_event_record_magic = 0x56454341u;  // "ACEV" read little-endian
inline constexpr std::size_t core_event_record_kind_offset = 6;
inline constexpr std::size_t core_event_record_prefix_bytes = 120;

// replicate flags.
inline constexpr std::uint32_t replicate_flag_state_crc = 1u << 0;  // compute the CRC of save()'s bytes after this record
inline constexpr std::uint32_t replicate_flags_known = replicate_flag_state_crc;

// One record of the primary's event stream, or a piece of one (primary ->
// backup; header.clock = the term, header.sequence = the record's index,
// header.rank = the event's worker). A 36-byte prefix, then `record`:
// bytes [offset, offset + record.size()) of a record of `total` bytes.
// The record of events 1..9 is rules/core_events.hpp's (the 120-byte ACEV
// prefix and the commit's payload) carried as it is: the wire checks where
// it starts (magic, the kind agreeing with `event`), decode_core_event()
// the rest. A snapshot's record is server_core::save()'s bytes. A record larger than a message (a snapshot, a large
// commit) goes in pieces in offset order, each its own message with its
// own CRC. `record` is a view into the decoded message, as a
// measurements body's records are.
struct replicate_body {
  static constexpr message_kind kind = message_kind::replicate;
  static constexpr std::size_t fixed_bytes = 36;
  replica_event event = replica_event::tick;
  std::uint32_t flags = 0;          // replicate_flags_known
  std::uint64_t version_after = 0;  // the primary's version after the event
  std::uint64_t offset = 0;         // where `record` sits in the whole record
  std::uint64_t total = 0;          // the whole record's bytes
  std::uint32_t crc_after = 0;      // CRC-32C of version_after's parameters; 0: not computed
  std::span<const std::byte> record;

  friend bool operator==(const replicate_body& a, const replicate_body& b) noexcept {
    return a.event == b.event && a.flags == b.flags && a.version_after == b.version_after && a.offset == b.offset &&
           a.total == b.total && a.crc_after == b.crc_after && a.record.size() == b.record.size() &&
           (a.record.empty() || std::memcmp(a.record.data(), b.record.data(), a.record.size()) == 0);
  }
};

// backup -> primary (header.clock = the term).
struct replica_ack_body {
  static constexpr message_kind kind = message_kind::replica_ack;
  static constexpr std::size_t wire_bytes = 32;
  std::uint64_t received = 0;   // every record up to this index is held
  std::uint64_t applied = 0;    // <= received
  std::uint64_t version = 0;    // the backup's version after `applied`
  std::uint32_t crc = 0;        // CRC-32C of `version`'s parameters, when a record asked (else 0)
  std::uint32_t state_crc = 0;  // CRC-32C of save()'s bytes, when a record asked (else 0)
  static constexpr auto fields() {
    return std::tuple{field{"received", &replica_ack_body::received}, field{"applied", &replica_ack_body::applied},
                      field{"version", &replica_ack_body::version}, field{"crc", &replica_ack_body::crc},
                      field{"state_crc", &replica_ack_body::state_crc}};
  }
  friend constexpr bool operator==(const replica_ack_body&, const replica_ack_body&) = default;
};

// backup -> primary, first on its link.
struct replica_hello_body {
  static constexpr message_kind kind = message_kind::replica_hello;
  static constexpr std::size_t wire_bytes = 48;
  std::uint64_t job = 0;       // the job id (ps::make_job_id); 0: not said
  std::uint32_t shard = 0;     // < servers
  std::uint32_t servers = 0;   // >= 1
  std::uint64_t elements = 0;  // the shard's elements, >= 1
  std::uint32_t term = 0;      // the last term it saw; 0: none
  std::uint64_t have = 0;      // the index of the last record it holds; 0: none (a fresh backup)
  std::uint64_t version = 0;   // its version
  std::uint32_t crc = 0;       // CRC-32C of that version's parameters
  static constexpr auto fields() {
    return std::tuple{field{"job", &replica_hello_body::job},         field{"shard", &replica_hello_body::shard},
                      field{"servers", &replica_hello_body::servers}, field{"elements", &replica_hello_body::elements},
                      field{"term", &replica_hello_body::term},       field{"have", &replica_hello_body::have},
                      field{"version", &replica_hello_body::version}, field{"crc", &replica_hello_body::crc}};
  }
  friend constexpr bool operator==(const replica_hello_body&, const replica_hello_body&) = default;
};

// server -> worker: after every join's plan, and to every connected worker
// when the term changes.
inline constexpr std::uint32_t shard_state_flag_backup = 1u << 0;  // a backup replicates this shard
inline constexpr std::uint32_t shard_state_flags_known = shard_state_flag_backup;
struct shard_state_body {
  static constexpr message_kind kind = message_kind::shard_state;
  static constexpr std::size_t wire_bytes = 8;
  std::uint32_t term = 1;   // >= 1 (terms start at 1)
  std::uint32_t flags = 0;  // shard_state_flags_known
  static constexpr auto fields() {
    return std::tuple{field{"term", &shard_state_body::term}, field{"flags", &shard_state_body::flags}};
  }
  friend constexpr bool operator==(const shard_state_body&, const shard_state_body&) = default;
};

using control_body =
    std::variant<std::monostate, join_body, leave_body, plan_update_body, metric_body, error_body, measurements_body,
                 lease_body, replicate_body, replica_ack_body, replica_hello_body, shard_state_body>;

namespace detail {

// Prints as 0x%08x, unquoted, in error messages (flag words).
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


inline status check_flags(std::string_view field, std::uint32_t flags, std::uint32_t known) {
  if ((flags & ~known) == 0) return {};
  return make_error(errc::unsupported, field, hex32{flags}, "unknown flag bits set (known: " + hex32{known}.str() + ")");
}

inline status check_body(const join_body& b, const limits&) {
  if (b.batch == 0) return make_error(errc::invalid_argument, "join.batch", 0, "must be >= 1");
  return check_flags("join.flags", b.flags, join_flags_known);
}
inline status check_body(const lease_body& b, const limits&) {
  if (b.begin >= b.end)
    return make_error(errc::invalid_argument, "lease.begin", b.begin, "must be < end = " + std::to_string(b.end));
  if (b.end > b.samples)
    return make_error(errc::invalid_argument, "lease.end", b.end, "must be <= samples = " + std::to_string(b.samples));
  return check_flags("lease.flags", b.flags, lease_flags_known);
}
inline status check_body(const replicate_body& b, const limits&) {
  const auto e = static_cast<std::uint8_t>(b.event);
  if (!replica_event_table.contains(b.event))
    return make_error(errc::unsupported, "replicate.event", e, "unknown event");
  ASHL_TRY(check_flags("replicate.flags", b.flags, replicate_flags_known));
  const std::uint64_t n = b.record.size();
  if (n == 0)
    return make_error(errc::malformed, "replicate.record_bytes", 0,
                      "a " + std::string(to_string(b.event)) + " carries a record (a piece of at least one byte)");
  if (b.offset >= b.total || n > b.total - b.offset)
    return make_error(errc::malformed, "replicate.offset", b.offset,
                      "with the " + std::to_string(n) + " bytes here passes total = " + std::to_string(b.total));
  if (b.event == replica_event::snapshot) return {};
  // A core event record (rules/core_events.hpp): its first piece holds the
  // prefix, whose magic and kind the wire checks; decode_core_event() the rest.
  if (b.total < core_event_record_prefix_bytes)
    return make_error(errc::malformed, "replicate.total", b.total,
                      "a core event record is at least " + std::to_string(core_event_record_prefix_bytes) + " bytes");
  if (b.offset != 0) return {};
  if (n < core_event_record_prefix_bytes)
    return make_error(errc::malformed, "replicate.record_bytes", n,
                      "the first piece of a record holds its " + std::to_string(core_event_record_prefix_bytes) +
                          "-byte prefix");
  std::uint32_t magic = 0;
  byte_reader head(b.record);
  (void)head.get(magic, "replicate.record_magic");  // cannot fail: at least 120 bytes
  if (magic != core_event_record_magic)
    return make_error(errc::malformed, "replicate.record_magic", hex32{magic},
                      "not a core event record (want " + hex32{core_event_record_magic}.str() + ", \"ACEV\")");
  const auto k = std::to_integer<std::uint8_t>(b.record[core_event_record_kind_offset]);
  if (k != e)
    return make_error(errc::malformed, "replicate.record_kind", k,
                      "disagrees with replicate.event = " + std::to_string(e) + " (" + std::string(to_string(b.event)) + ")");
  return {};
}
inline status check_body(const replica_ack_body& b, const limits&) {
  if (b.applied > b.received)
    return make_error(errc::invalid_argument, "replica_ack.applied", b.applied,
                      "must be <= received = " + std::to_string(b.received));
  return {};
}
inline status check_body(const replica_hello_body& b, const limits&) {
  if (b.servers == 0) return make_error(errc::invalid_argument, "replica_hello.servers", 0, "must be >= 1");
  if (b.shard >= b.servers)
    return make_error(errc::invalid_argument, "replica_hello.shard", b.shard,
                      "must be < servers = " + std::to_string(b.servers));
  if (b.elements == 0)
    return make_error(errc::invalid_argument, "replica_hello.elements", 0, "a shard holds at least one element");
  return {};
}
inline status check_body(const shard_state_body& b, const limits&) {
  if (b.term == 0) return make_error(errc::invalid_argument, "shard_state.term", 0, "must be >= 1 (terms start at 1)");
  return check_flags("shard_state.flags", b.flags, shard_state_flags_known);
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
inline void put_body(byte_writer& w, const replicate_body& b) {
  w.put(static_cast<std::uint8_t>(b.event));
  w.put(std::uint8_t{0});
  w.put(std::uint16_t{0});
  w.put(b.flags);
  w.put(b.version_after);
  w.put(b.offset);
  w.put(b.total);
  w.put(b.crc_after);
  w.put_bytes(b.record);
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
  else if constexpr (std::is_same_v<Body, replicate_body>)
    return replicate_body::fixed_bytes + b.record.size();
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
      if (p.size() == full) {
        ASHL_TRY(get_fields(r, b, "plan_update"));
        // One encoding per plan: without options the body is the short one
        // (what put_body writes), so a decoded message re-encodes to its bytes.
        if (!b.has_codec_options())
          return make_error(errc::malformed, "plan_update.payload_bytes", p.size(),
                            "a plan without codec options is " + std::to_string(before) + " bytes");
      } else {
        ASHL_TRY(get_fields(r, b, "plan_update", plan_update_body::fields_before_codec()));
      }
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
    case message_kind::lease:
      return read_fixed_body<lease_body>(r, p.size(), "lease", lim);
    case message_kind::replicate: {
      if (p.size() < replicate_body::fixed_bytes)
        return make_error(errc::malformed, "replicate.payload_bytes", p.size(),
                          "a replicate body is at least " + std::to_string(replicate_body::fixed_bytes) + " bytes");
      replicate_body b;
      std::uint8_t event = 0, reserved8 = 0;
      std::uint16_t reserved16 = 0;
      ASHL_TRY(r.get(event, "replicate.event"));
      ASHL_TRY(r.get(reserved8, "replicate.reserved"));
      ASHL_TRY(r.get(reserved16, "replicate.reserved"));
      if (reserved8 != 0 || reserved16 != 0)
        return make_error(errc::malformed, "replicate.reserved", std::uint32_t{reserved8} | std::uint32_t{reserved16} << 8,
                          "bytes 1..3 must be 0");
      b.event = static_cast<replica_event>(event);
      ASHL_TRY(r.get(b.flags, "replicate.flags"));
      ASHL_TRY(r.get(b.version_after, "replicate.version_after"));
      ASHL_TRY(r.get(b.offset, "replicate.offset"));
      ASHL_TRY(r.get(b.total, "replicate.total"));
      ASHL_TRY(r.get(b.crc_after, "replicate.crc_after"));
      b.record = r.rest();
      ASHL_TRY(check_body(b, lim));
      return control_body(b);
    }
    case message_kind::replica_ack:
      return read_fixed_body<replica_ack_body>(r, p.size(), "replica_ack", lim);
    case message_kind::replica_hello:
      return read_fixed_body<replica_hello_body>(r, p.size(), "replica_hello", lim);
    case message_kind::shard_state:
      return read_fixed_body<shard_state_body>(r, p.size(), "shard_state", lim);
    default: return control_body{};
  }
}

}  // namespace detail

}  // namespace wire
ASHL_NAMESPACE_END
