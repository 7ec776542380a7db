// test/support/checks.hpp — assertions that may run on any thread.
//
// Boost.Test is not thread-safe: every BOOST_TEST stores a checkpoint (a
// std::string in one global) and counts into shared results, so checks made
// from several rank threads at once race (one ASan run of the README command
// died in basic_string::_M_create inside test/coll/driver). ASHL_TEST and
// ASHL_REQUIRE evaluate their expression on the calling thread without any
// lock (it may be a collective that waits for the other ranks), then report
// to Boost under one mutex, with the values of a comparison:
//
//   ASHL_TEST(g[0] == 2.5f);      // fails with "g[0] == 2.5f [2 == 2.5]"
//   ASHL_REQUIRE(r.has_value());  // stops this test case on failure
//   ASHL_TEST(ok, "cycle " << c);     // a message after the values
//
// A REQUIRE that fails on a thread other than the test's ends the process
// (the exception leaves the thread), as BOOST_REQUIRE there always did; the
// failure is printed first.
#pragma once

#include <boost/test/unit_test.hpp>

#include <concepts>
#include <cstddef>
#include <iterator>
#include <mutex>
#include <ostream>
#include <ranges>
#include <sstream>
#include <string>
#include <utility>

namespace ashl_test {

inline std::mutex& boost_mutex() {
  static std::mutex m;
  return m;
}

namespace detail {

template <class T>
concept streamable = requires(std::ostream& o, const T& v) { o << v; };

template <class T>
void print(std::ostream& o, const T& v) {
  if constexpr (std::same_as<T, bool>) {
    o << (v ? "true" : "false");
  } else if constexpr (std::same_as<T, char> || std::same_as<T, signed char> || std::same_as<T, unsigned char>) {
    o << int(v);
  } else if constexpr (std::is_enum_v<T>) {
    o << +static_cast<std::underlying_type_t<T>>(v);
  } else if constexpr (streamable<T>) {
    o << v;
  } else if constexpr (std::ranges::input_range<const T>) {
    o << '{';
    std::size_t i = 0;
    for (const auto& e : v) {
      if (i == 8) {
        o << ", ...";
        break;
      }
      if (i++ != 0) o << ", ";
      print(o, e);
    }
    o << '}';
  } else {
    o << '?';
  }
}

// Integers of different signedness compare by value (std::cmp_*), as
// BOOST_TEST does without -Wsign-compare noise; everything else by its own
// operator.
template <class T>
concept plain_integer = std::integral<T> && !std::same_as<T, bool> && !std::same_as<T, char> &&
                        !std::same_as<T, wchar_t> && !std::same_as<T, char8_t> && !std::same_as<T, char16_t> &&
                        !std::same_as<T, char32_t>;
template <class A, class B>
constexpr bool mixed_integers = plain_integer<A> && plain_integer<B> && (std::is_signed_v<A> != std::is_signed_v<B>);

}  // namespace detail

// What a check evaluated to, and the values that made it so.
struct outcome {
  bool ok = false;
  std::string values;   // " [lhs op rhs]" for a failed comparison, else empty
  std::string message;  // ": what the caller added" for a failed check
};

template <class L, class R>
outcome compared(bool ok, const L& l, const char* op, const R& r) {
  outcome o{ok, {}};
  if (!ok) {
    std::ostringstream s;
    s << " [";
    detail::print(s, l);
    s << ' ' << op << ' ';
    detail::print(s, r);
    s << ']';
    o.values = std::move(s).str();
  }
  return o;
}

// The left operand of a decomposed check (`capture{} <= a == b`: <= binds
// tighter than == and != and as tight as < >, left to right).
template <class L>
struct operand {
  const L& l;

#define ASHL_TEST_COMPARISON_(OP, CMP)                                     \
  template <class R>                                                       \
  outcome operator OP(const R& r) const {                                  \
    if constexpr (detail::mixed_integers<L, R>)                            \
      return compared(std::CMP(l, r), l, #OP, r);                          \
    else                                                                   \
      return compared(static_cast<bool>(l OP r), l, #OP, r);               \
  }
  ASHL_TEST_COMPARISON_(==, cmp_equal)
  ASHL_TEST_COMPARISON_(!=, cmp_not_equal)
  ASHL_TEST_COMPARISON_(<, cmp_less)
  ASHL_TEST_COMPARISON_(<=, cmp_less_equal)
  ASHL_TEST_COMPARISON_(>, cmp_greater)
  ASHL_TEST_COMPARISON_(>=, cmp_greater_equal)
#undef ASHL_TEST_COMPARISON_

  // A check that is not a comparison: its truth.
  explicit operator outcome() const { return {static_cast<bool>(l), {}}; }
};

struct capture {
  template <class L>
  operand<L> operator<=(const L& l) const {
    return {l};
  }
};

inline outcome evaluate(outcome o) { return o; }
template <class L>
outcome evaluate(const operand<L>& o) {
  return static_cast<outcome>(o);
}
// `a && b`, `a || b` and friends arrive as a plain bool: no values.
inline outcome evaluate(bool b) { return {b, {}}; }
}  // namespace ashl_test

#define ASHL_TEST_REPORT_(BOOST_MACRO, CHECK, ...)                                              \
  do {                                                                                          \
    _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wparentheses\"")          \
    ::ashl_test::outcome ashl_test_o_ = ::ashl_test::evaluate(::ashl_test::capture{} <= CHECK); \
    _Pragma("GCC diagnostic pop")                                                               \
    __VA_OPT__(if (!ashl_test_o_.ok) {                                                          \
      std::ostringstream ashl_test_s_;                                                          \
      ashl_test_s_ << ": " << __VA_ARGS__;                                                      \
      ashl_test_o_.message = std::move(ashl_test_s_).str();                                     \
    })                                                                                          \
    std::lock_guard<std::mutex> ashl_test_l_(::ashl_test::boost_mutex());                       \
    BOOST_MACRO(ashl_test_o_.ok, #CHECK << ashl_test_o_.values << ashl_test_o_.message);        \
  } while (false)

// ASHL_TEST(check) or ASHL_TEST(check, message << streamed << values)
#define ASHL_TEST(...) ASHL_TEST_REPORT_(BOOST_CHECK_MESSAGE, __VA_ARGS__)
#define ASHL_REQUIRE(...) ASHL_TEST_REPORT_(BOOST_REQUIRE_MESSAGE, __VA_ARGS__)
