// ashl/core/bytes.hpp — bounds-checked little-endian byte reader and writer.
//
//   std::array<std::byte, 16> buf;
//   ashl::byte_writer w(buf);
//   w.put<std::uint32_t>(7); w.put<float>(1.5f);
//   if (!w) ...                                  // overflowed: nothing past the end was written
//   ashl::byte_reader r(w.written());
//   std::uint32_t a; float b;
//   if (auto s = r.get(a, "header.count"); !s) return s;   // error names the field
//
// Every multi-byte value is little-endian on the wire whatever the host;
// the wire layer and every codec payload go through these two types.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>

ASHL_NAMESPACE_BEGIN

namespace detail {
template <class T>
T byteswap_if_big(T v) noexcept {
  if constexpr (std::endian::native == std::endian::big && sizeof(T) > 1) {
    unsigned char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    for (std::size_t i = 0; i < sizeof(T) / 2; ++i) {
      const unsigned char t = b[i];
      b[i] = b[sizeof(T) - 1 - i];
      b[sizeof(T) - 1 - i] = t;
    }
    std::memcpy(&v, b, sizeof(T));
  }
  return v;
}
}  // namespace detail

template <class T>
concept wire_scalar = std::is_trivially_copyable_v<T> && (std::is_arithmetic_v<T> || std::is_enum_v<T> ||
                                                         (std::is_class_v<T> && sizeof(T) <= 8));

class byte_writer {
 public:
  explicit byte_writer(std::span<std::byte> out) noexcept : out_(out) {}

  // Writes v little-endian; on overflow writes nothing and latches failure.
  template <wire_scalar T>
  void put(T v) noexcept {
    if (failed_ || out_.size() - pos_ < sizeof(T)) {
      failed_ = true;
      return;
    }
    v = detail::byteswap_if_big(v);
    std::memcpy(out_.data() + pos_, &v, sizeof(T));
    pos_ += sizeof(T);
  }
  void put_bytes(std::span<const std::byte> b) noexcept {
    if (failed_ || out_.size() - pos_ < b.size()) {
      failed_ = true;
      return;
    }
    if (!b.empty()) std::memcpy(out_.data() + pos_, b.data(), b.size());
    pos_ += b.size();
  }
  // Reserve n bytes to be filled in place (bulk payloads); empty span on overflow.
  std::span<std::byte> reserve(std::size_t n) noexcept {
    if (failed_ || out_.size() - pos_ < n) {
      failed_ = true;
      return {};
    }
    auto s = out_.subspan(pos_, n);
    pos_ += n;
    return s;
  }

  [[nodiscard]] bool ok() const noexcept { return !failed_; }
  explicit operator bool() const noexcept { return ok(); }
  [[nodiscard]] std::size_t position() const noexcept { return pos_; }
  [[nodiscard]] std::size_t remaining() const noexcept { return out_.size() - pos_; }
  [[nodiscard]] std::span<std::byte> written() const noexcept { return out_.first(pos_); }
  [[nodiscard]] status to_status(std::string_view what) const {
    if (ok()) return {};
    return make_error(errc::buffer_too_small, what, out_.size(), "bytes of output space are not enough");
  }

 private:
  std::span<std::byte> out_;
  std::size_t pos_ = 0;
  bool failed_ = false;
};

class byte_reader {
 public:
  explicit byte_reader(std::span<const std::byte> in) noexcept : in_(in) {}

  template <wire_scalar T>
  status get(T& v, std::string_view field) noexcept {
    if (in_.size() - pos_ < sizeof(T))
      return make_error(errc::malformed, field, remaining(),
                        "bytes remain, fewer than the field needs (truncated input)");
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    v = detail::byteswap_if_big(v);
    pos_ += sizeof(T);
    return {};
  }
  // A view of the next n bytes (no copy), or an error when fewer remain.
  result<std::span<const std::byte>> get_bytes(std::size_t n, std::string_view field) noexcept {
    if (in_.size() - pos_ < n)
      return make_error(errc::malformed, field, n, "bytes requested but fewer remain (truncated input)");
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  status skip(std::size_t n, std::string_view field) noexcept {
    if (in_.size() - pos_ < n) return make_error(errc::malformed, field, n, "bytes to skip but fewer remain");
    pos_ += n;
    return {};
  }

  [[nodiscard]] std::size_t position() const noexcept { return pos_; }
  [[nodiscard]] std::size_t remaining() const noexcept { return in_.size() - pos_; }
  [[nodiscard]] bool at_end() const noexcept { return pos_ == in_.size(); }
  [[nodiscard]] std::span<const std::byte> rest() const noexcept { return in_.subspan(pos_); }
  // An error unless every byte has been consumed.
  [[nodiscard]] status expect_end(std::string_view what) const {
    if (at_end()) return {};
    return make_error(errc::malformed, what, remaining(), "trailing bytes after the last field");
  }

 private:
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

ASHL_NAMESPACE_END
