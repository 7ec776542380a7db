// ashl/wire/bodies.hpp — the control bodies (join, leave, plan_update,
// metric, error, measurements): their types, their checks, and how each is
// written and read (the fixed ones by their field tables, core/fields.hpp).
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

namespace detail {

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
    default: return control_body{};
  }
}

}  // namespace detail

}  // namespace wire
ASHL_NAMESPACE_END
