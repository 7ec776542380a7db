// ashl/core/fields.hpp — one table of a struct's fields, so that whatever
// lists them (a parser of flags or settings, help text, the wire, a
// checkpoint, the Python binding's dicts) is driven by the table and cannot
// drift from the struct.
//
//   struct knobs {
//     std::int64_t h = 2;
//     double lr = 0.1;
//     static constexpr auto fields() {
//       return std::tuple{ashl::field{"h", &knobs::h, "local steps"}, ashl::field{"lr", &knobs::lr, "step size"}};
//     }
//   };
//   knobs k;
//   ashl::status s = ashl::set_field(k, "lr", "0.05", "knobs");      // "knobs.lr = \"x\": ..." on bad text
//   ashl::for_each_field(k, [](std::string_view name, auto& value) { ... });
//
// A table lists every field once, in the struct's order; where a struct has
// no padding, fields_cover<S>() proves at compile time that none is missing
// (the sizes add up). Values set from text: integers (range-checked),
// floating point (finite), bool (true, false, 1, 0), strings, and enums by
// their integer value.
#pragma once

#include <array>
#include <ashl/config.hpp>
#include <ashl/core/status.hpp>

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

ASHL_NAMESPACE_BEGIN

template <class S, class T>
struct field {
  std::string_view name;
  T S::*member;
  std::string_view help{};
  using owner = S;
  using type = T;
};
template <class S, class T>
field(std::string_view, T S::*, std::string_view = {}) -> field<S, T>;

// A struct with a field table: `static constexpr auto fields()` returning a
// tuple of ashl::field.
template <class S>
concept described = requires { S::fields(); };

template <described S>
inline constexpr std::size_t field_count = std::tuple_size_v<decltype(S::fields())>;

// f(field) for each entry of S's table, in order.
template <described S, class F>
constexpr void for_each_field_of(F&& f) {
  std::apply([&](const auto&... fs) { (f(fs), ...); }, S::fields());
}

// f(name, value) for each field of s, in order (value is s's member).
template <class S, class F>
  requires described<std::remove_const_t<S>>
constexpr void for_each_field(S& s, F&& f) {
  for_each_field_of<std::remove_const_t<S>>([&](const auto& fd) { f(fd.name, s.*(fd.member)); });
}

// Whether the table's field sizes add up to the struct's: for a struct
// without padding, no field was left out of the table.
template <described S>
constexpr bool fields_cover() {
  std::size_t bytes = 0;
  for_each_field_of<S>([&](const auto& fd) { bytes += sizeof(typename std::decay_t<decltype(fd)>::type); });
  return bytes == sizeof(S);
}

// S's field names, in table order, built once per S (a lookup then costs a
// scan of string_views, not a rebuild of the table: clang's constexpr step
// limit counts every rebuild).
template <described S>
inline constexpr auto field_names_of = [] {
  std::array<std::string_view, field_count<S>> names{};
  std::size_t i = 0;
  for_each_field_of<S>([&](const auto& fd) { names[i++] = fd.name; });
  return names;
}();

// Whether S's table names `name`.
template <described S>
constexpr bool has_field(std::string_view name) {
  for (const auto n : field_names_of<S>)
    if (n == name) return true;
  return false;
}

// "a b c": the names, space-separated (help text, error messages).
template <described S>
std::string field_names(char separator = ' ') {
  std::string s;
  for_each_field_of<S>([&](const auto& fd) {
    if (!s.empty()) s += separator;
    s += fd.name;
  });
  return s;
}

namespace detail {

template <class T>
status parse_field_text(std::string_view text, T& out, const std::string& where) {
  if constexpr (std::is_same_v<T, bool>) {
    if (text == "true" || text == "1") out = true;
    else if (text == "false" || text == "0") out = false;
    else return invalid_argument(where, text, "must be true, false, 1 or 0");
    return {};
  } else if constexpr (std::is_same_v<T, std::string>) {
    out.assign(text);
    return {};
  } else if constexpr (std::is_enum_v<T>) {
    std::underlying_type_t<T> v{};
    ASHL_TRY(parse_field_text(text, v, where));
    out = static_cast<T>(v);
    return {};
  } else if constexpr (std::is_integral_v<T>) {
    T v{};
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec == std::errc::result_out_of_range)
      return invalid_argument(where, text, "is out of range (" + std::to_string(std::numeric_limits<T>::min()) +
                                               " .. " + std::to_string(std::numeric_limits<T>::max()) + ")");
    if (ec != std::errc{} || end != text.data() + text.size() || text.empty())
      return invalid_argument(where, text, "must be an integer");
    out = v;
    return {};
  } else if constexpr (std::is_floating_point_v<T>) {
    const std::string s(text);
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size()) return invalid_argument(where, text, "must be a number");
    if (!std::isfinite(v)) return invalid_argument(where, text, "must be finite");
    out = static_cast<T>(v);
    return {};
  } else {
    static_assert(sizeof(T) == 0, "ashl::set_field: no text form for this field type");
  }
}

}  // namespace detail

// Writes s's fields in `table`'s order (S::fields() unless given: a
// saved state may list only some of a struct's fields, or a class's own
// members) with w.put (core/bytes.hpp's byte_writer, core/state_io.hpp's
// state_writer): an enum as its underlying integer, a field whose type has
// its own table by that table, in place. So the bytes are those of the
// put() sequence a table replaces.
template <class Writer, class S, class Table>
void put_fields(Writer& w, const S& s, const Table& table) {
  std::apply(
      [&](const auto&... fd) {
        (
            [&](const auto& v) {
              using T = std::decay_t<decltype(v)>;
              if constexpr (described<T>) put_fields(w, v, T::fields());
              else if constexpr (std::is_enum_v<T>) w.put(static_cast<std::underlying_type_t<T>>(v));
              else w.put(v);
            }(s.*(fd.member)),
            ...);
      },
      table);
}
template <described S, class Writer>
void put_fields(Writer& w, const S& s) {
  put_fields(w, s, S::fields());
}

// Reads them back in the same order with r.get(value, "<prefix>.<name>")
// (nested: "<prefix>.<name>.<name>"), stopping at the first error; the
// field names are built on the stack (no allocation). An enum is read as
// its integer; the caller checks its range.
template <class Reader, class S, class Table>
status get_fields(Reader& r, S& s, std::string_view prefix, const Table& table) {
  status st;
  std::apply(
      [&](const auto&... fd) {
        (
            [&](auto& v, std::string_view name) {
              if (!st.ok()) return;
              char buf[128];
              std::size_t n = 0;
              for (char c : prefix)
                if (n < sizeof buf) buf[n++] = c;
              if (!prefix.empty() && n < sizeof buf) buf[n++] = '.';
              for (char c : name)
                if (n < sizeof buf) buf[n++] = c;
              const std::string_view where(buf, n);
              using T = std::decay_t<decltype(v)>;
              if constexpr (described<T>) {
                st = get_fields(r, v, where, T::fields());
              } else if constexpr (std::is_enum_v<T>) {
                std::underlying_type_t<T> u{};
                st = r.get(u, where);
                if (st.ok()) v = static_cast<T>(u);
              } else {
                st = r.get(v, where);
              }
            }(s.*(fd.member), fd.name),
            ...);
      },
      table);
  return st;
}
template <described S, class Reader>
status get_fields(Reader& r, S& s, std::string_view prefix) {
  return get_fields(r, s, prefix, S::fields());
}

// Sets field `name` of s from its text form; errors name "<prefix>.<name>".
template <described S>
status set_field(S& s, std::string_view name, std::string_view text, std::string_view prefix) {
  const std::string where = prefix.empty() ? std::string(name) : std::string(prefix) + "." + std::string(name);
  status result = invalid_argument(where, text, "unknown field (known: " + field_names<S>() + ")");
  bool found = false;
  for_each_field_of<S>([&](const auto& fd) {
    if (found || fd.name != name) return;
    found = true;
    result = detail::parse_field_text(text, s.*(fd.member), where);
  });
  return result;
}

ASHL_NAMESPACE_END
