// ashl/core/status.hpp — error values for every boundary (wire, files,
// network, user configuration).
//
//   ashl::status check(int s) {
//     if (s < 0) return ashl::invalid_argument("ssp.staleness", s, "must be >= 0");
//     return {};
//   }
//   ashl::result<int> r = parse(...);
//   if (!r) std::cerr << r.error().message() << '\n';
//
// A message names the field and the bad value: errors at
// boundaries are values. Programming errors are ASHL_ASSERTs instead.
#pragma once

#include <ashl/config.hpp>

#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

ASHL_NAMESPACE_BEGIN

enum class errc : std::uint8_t {
  ok = 0,
  invalid_argument,  // a caller- or user-supplied value is out of its domain
  out_of_range,      // an index, count or length exceeds what is allowed
  malformed,         // bytes that do not parse (wire, payload, file)
  checksum_mismatch, // bytes that parse but were corrupted
  unsupported,       // a version, codec or feature this build does not know
  buffer_too_small,  // caller-provided output space is insufficient
  not_found,         // a file, dataset, peer or name does not exist
  io_error,          // the operating system said no
  unavailable,       // a peer or device is gone or absent
  timed_out,
  internal,
};

constexpr std::string_view to_string(errc e) noexcept {
  switch (e) {
    case errc::ok: return "ok";
    case errc::invalid_argument: return "invalid argument";
    case errc::out_of_range: return "out of range";
    case errc::malformed: return "malformed";
    case errc::checksum_mismatch: return "checksum mismatch";
    case errc::unsupported: return "unsupported";
    case errc::buffer_too_small: return "buffer too small";
    case errc::not_found: return "not found";
    case errc::io_error: return "I/O error";
    case errc::unavailable: return "unavailable";
    case errc::timed_out: return "timed out";
    case errc::internal: return "internal error";
  }
  return "unknown error";
}

// An error code plus a human message. The success value carries no string, so
// `status{}` is cheap on hot paths.
class [[nodiscard]] status {
 public:
  status() noexcept = default;
  status(errc code, std::string message) : code_(code), message_(std::move(message)) {}

  [[nodiscard]] bool ok() const noexcept { return code_ == errc::ok; }
  explicit operator bool() const noexcept { return ok(); }
  [[nodiscard]] errc code() const noexcept { return code_; }
  [[nodiscard]] const std::string& message() const noexcept { return message_; }

  // "invalid argument: ssp.staleness = -1: must be >= 0"
  [[nodiscard]] std::string to_string() const {
    if (ok()) return "ok";
    std::string s(ashl::to_string(code_));
    s += ": ";
    s += message_;
    return s;
  }

 private:
  errc code_ = errc::ok;
  std::string message_;
};

namespace detail {
template <class T>
void append_value(std::ostringstream& os, const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    os << (v ? "true" : "false");
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    os << '"' << std::string_view(v) << '"';
  } else if constexpr (std::is_integral_v<T> && sizeof(T) == 1) {
    os << static_cast<int>(v);
  } else {
    os << v;
  }
}
}  // namespace detail

// Builds "<field> = <value>: <why>"; the form every boundary error uses.
template <class T>
status make_error(errc code, std::string_view field, const T& value, std::string_view why) {
  std::ostringstream os;
  os << field << " = ";
  detail::append_value(os, value);
  if (!why.empty()) os << ": " << why;
  return status(code, os.str());
}

template <class T>
status invalid_argument(std::string_view field, const T& value, std::string_view why) {
  return make_error(errc::invalid_argument, field, value, why);
}
template <class T>
status out_of_range(std::string_view field, const T& value, std::string_view why) {
  return make_error(errc::out_of_range, field, value, why);
}
template <class T>
status malformed(std::string_view field, const T& value, std::string_view why) {
  return make_error(errc::malformed, field, value, why);
}

// A value or a status; a small subset of C++23 std::expected.
template <class T>
class [[nodiscard]] result {
  static_assert(!std::is_same_v<std::remove_cv_t<T>, status>, "result<status> is meaningless");

 public:
  result(const T& v) : v_(v) {}             // NOLINT(google-explicit-constructor)
  result(T&& v) : v_(std::move(v)) {}       // NOLINT(google-explicit-constructor)
  result(status s) : v_(std::move(s)) {     // NOLINT(google-explicit-constructor)
    ASHL_ASSERT(!std::get<status>(v_).ok(), "result constructed from an ok status");
  }

  [[nodiscard]] bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  T& value() & { ASHL_ASSERT(has_value(), "result::value() on an error"); return std::get<0>(v_); }
  const T& value() const& { ASHL_ASSERT(has_value(), "result::value() on an error"); return std::get<0>(v_); }
  T&& value() && { ASHL_ASSERT(has_value(), "result::value() on an error"); return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  [[nodiscard]] const status& error() const& {
    ASHL_ASSERT(!has_value(), "result::error() on a value");
    return std::get<1>(v_);
  }
  // The status of this result: ok when it holds a value.
  [[nodiscard]] status to_status() const { return has_value() ? status{} : std::get<1>(v_); }

 private:
  std::variant<T, status> v_;
};

// Propagate a failed status: ASHL_TRY(check_header(h));
#define ASHL_TRY(expr)                      \
  do {                                      \
    ::ashl::status ashl_try_s_ = (expr);    \
    if (!ashl_try_s_.ok()) return ashl_try_s_; \
  } while (0)

ASHL_NAMESPACE_END
