// ashl/core/enum_table.hpp — an enum's names, count and parser from one table.
//
//   enum class colour : std::uint8_t { red = 0, green = 1, blue = 2 };
//   inline constexpr auto colour_table = ashl::make_enum_table<colour>("red", "green", "blue");
//   static_assert(colour_table.name(colour::blue) == "blue");      // the table ends where the enum does
//   inline constexpr std::size_t colour_count = colour_table.size();
//   constexpr std::string_view to_string(colour c) noexcept { return colour_table.name(c); }
//   std::optional<colour> c = colour_table.parse("green");          // by name
//   std::optional<colour> d = colour_table.from_value(7);           // nullopt: not an enumerator
//
// The names of an enum whose values run without gaps from `first` (0 unless
// said) are listed once, in value order; the count, to_string, parsing by
// name and by value all come from that list, so they cannot drift apart as
// a hand-written switch, a count constant and a parser did. Each enum pins
// its last enumerator's name with a static_assert next to its table, so an
// appended enumerator without a name (or a name without an enumerator)
// fails to compile. Wire values stay the enum's own: the table only names
// them. docs/design.md, core/.
#pragma once

#include <ashl/config.hpp>

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>
#include <type_traits>

ASHL_NAMESPACE_BEGIN

template <class E, std::size_t N>
  requires std::is_enum_v<E>
struct enum_table {
  using underlying = std::underlying_type_t<E>;

  std::array<std::string_view, N> names{};
  underlying first = 0;             // the value of names[0]
  std::string_view unnamed = "?";   // what name() says of a value outside the table

  [[nodiscard]] static constexpr std::size_t size() noexcept { return N; }
  [[nodiscard]] constexpr bool contains(E e) const noexcept { return index(static_cast<underlying>(e)) < N; }
  [[nodiscard]] constexpr std::string_view name(E e) const noexcept {
    const std::size_t i = index(static_cast<underlying>(e));
    return i < N ? names[i] : unnamed;
  }
  // The enumerator named `s`, or nullopt.
  [[nodiscard]] constexpr std::optional<E> parse(std::string_view s) const noexcept {
    for (std::size_t i = 0; i < N; ++i)
      if (names[i] == s) return static_cast<E>(static_cast<underlying>(first + i));
    return std::nullopt;
  }
  // The enumerator of value `v` (a byte off the wire, a field of a file), or
  // nullopt when the table does not name it.
  template <class V>
    requires std::is_integral_v<V>
  [[nodiscard]] constexpr std::optional<E> from_value(V v) const noexcept {
    if constexpr (std::is_signed_v<V>) {
      if (v < 0) return std::nullopt;
    }
    if (static_cast<unsigned long long>(v) < static_cast<unsigned long long>(first)) return std::nullopt;
    const unsigned long long i = static_cast<unsigned long long>(v) - static_cast<unsigned long long>(first);
    if (i >= N) return std::nullopt;
    return static_cast<E>(static_cast<underlying>(v));
  }

 private:
  [[nodiscard]] constexpr std::size_t index(underlying v) const noexcept {
    if (v < first) return N;
    return static_cast<std::size_t>(v - first);
  }
};

// The table of E's names, in value order from 0.
template <class E, class... S>
  requires std::is_enum_v<E> && (std::is_convertible_v<S, std::string_view> && ...)
constexpr enum_table<E, sizeof...(S)> make_enum_table(S... names) noexcept {
  return {{std::string_view(names)...}};
}

// The same from `first` (an enum whose values start above 0), with the
// name given to values outside the table.
template <class E, class... S>
  requires std::is_enum_v<E> && (std::is_convertible_v<S, std::string_view> && ...)
constexpr enum_table<E, sizeof...(S)> make_enum_table_from(std::underlying_type_t<E> first, std::string_view unnamed,
                                                           S... names) noexcept {
  return {{std::string_view(names)...}, first, unnamed};
}

ASHL_NAMESPACE_END
