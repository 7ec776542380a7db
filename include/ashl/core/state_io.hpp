// ashl/core/state_io.hpp — saving an object's state to bytes and loading it
// back: what policies, planners and the server core use for checkpoints.
//
//   std::vector<std::byte> bytes;
//   ashl::state_writer out(bytes);
//   policy.save(out);                              // appends; never fails
//   ashl::policy copy = ...;                       // built with the same parameters
//   ashl::state_reader in(bytes);
//   if (auto s = copy.load(in); !s) return s;      // names the field that was bad
//
// Little-endian fixed-width fields (core/bytes.hpp), each section opened by a
// four-byte tag and a version so a load of the wrong object or an older
// layout is refused with a message, never half-applied: a loader reads into
// a fresh value and assigns it only when everything was read. Containers are
// a u64 count then the elements; a count is checked against the bytes left
// before anything is allocated, so no input can make a load allocate past
// its own size.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/status.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

ASHL_NAMESPACE_BEGIN

class state_writer {
 public:
  explicit state_writer(std::vector<std::byte>& out) noexcept : out_(&out) {}

  template <wire_scalar T>
  void put(T v) {
    const std::size_t at = out_->size();
    out_->resize(at + sizeof(T));
    byte_writer w(std::span<std::byte>(out_->data() + at, sizeof(T)));
    w.put(v);
  }
  void put(bool v) { put<std::uint8_t>(v ? 1 : 0); }
  void put_bytes(std::span<const std::byte> b) { out_->insert(out_->end(), b.begin(), b.end()); }
  // A section header: four ASCII characters and a layout version.
  void tag(std::string_view four, std::uint32_t version) {
    ASHL_ASSERT(four.size() == 4, "state_writer::tag: tags are four characters");
    for (char c : four) put<std::uint8_t>(static_cast<std::uint8_t>(c));
    put(version);
  }
  template <wire_scalar T>
  void put_vector(const std::vector<T>& v) {
    put<std::uint64_t>(v.size());
    if constexpr (std::endian::native == std::endian::little) {
      // The little-endian layout is the in-memory one: one copy, not a
      // resize per element (a 64 MB shard: 0.5 -> ~5 GB/s).
      put_bytes(std::as_bytes(std::span<const T>(v.data(), v.size())));
    } else {
      for (const T& x : v) put(x);
    }
  }
  void put_vector(const std::vector<bool>& v) {
    put<std::uint64_t>(v.size());
    for (bool x : v) put(x);
  }
  void put_string(std::string_view s) {
    put<std::uint64_t>(s.size());
    put_bytes(std::as_bytes(std::span<const char>(s.data(), s.size())));
  }
  [[nodiscard]] std::size_t size() const noexcept { return out_->size(); }
  // What was written from byte `from` on (a checksum over a section).
  [[nodiscard]] std::span<const std::byte> written(std::size_t from) const noexcept {
    return std::span<const std::byte>(*out_).subspan(from);
  }
  // Overwrites the scalar written at byte `at` (a length known only after
  // its section was written in place).
  template <wire_scalar T>
  void patch(std::size_t at, T v) {
    ASHL_ASSERT(at + sizeof(T) <= out_->size(), "state_writer::patch: past the end");
    byte_writer w(std::span<std::byte>(out_->data() + at, sizeof(T)));
    w.put(v);
  }

 private:
  std::vector<std::byte>* out_;
};

class state_reader {
 public:
  explicit state_reader(std::span<const std::byte> in) noexcept : r_(in) {}

  template <wire_scalar T>
  status get(T& v, std::string_view field) {
    return r_.get(v, field);
  }
  status get(bool& v, std::string_view field) {
    std::uint8_t b = 0;
    ASHL_TRY(r_.get(b, field));
    if (b > 1) return make_error(errc::malformed, field, unsigned{b}, "a bool must be 0 or 1");
    v = b == 1;
    return {};
  }
  // Checks a section header written by state_writer::tag.
  status tag(std::string_view four, std::uint32_t version) {
    std::uint32_t v = 0;
    ASHL_TRY(tag_version(four, v));
    if (v != version)
      return make_error(errc::unsupported, std::string(four) + ".version", v,
                        "this build reads version " + std::to_string(version));
    return {};
  }
  // Checks a section header of any version from `oldest` to `newest`, and
  // says which (a reader that still takes an older layout).
  status tag(std::string_view four, std::uint32_t oldest, std::uint32_t newest, std::uint32_t& version) {
    std::uint32_t v = 0;
    ASHL_TRY(tag_version(four, v));
    if (v < oldest || v > newest)
      return make_error(errc::unsupported, std::string(four) + ".version", v,
                        "this build reads versions " + std::to_string(oldest) + " to " + std::to_string(newest));
    version = v;
    return {};
  }
  // A count of elements of `element_bytes` each that must fit in what is left.
  status count(std::uint64_t& n, std::size_t element_bytes, std::string_view field) {
    ASHL_TRY(r_.get(n, field));
    if (element_bytes > 0 && n > r_.remaining() / element_bytes)
      return make_error(errc::malformed, field, n, "more elements than the bytes left can hold");
    return {};
  }
  template <wire_scalar T>
  status get_vector(std::vector<T>& v, std::string_view field) {
    std::uint64_t n = 0;
    ASHL_TRY(count(n, sizeof(T), field));
    std::vector<T> tmp(static_cast<std::size_t>(n));
    if constexpr (std::endian::native == std::endian::little) {
      auto b = r_.get_bytes(tmp.size() * sizeof(T), field);
      if (!b) return b.error();
      if (!tmp.empty()) std::memcpy(tmp.data(), b->data(), b->size());
    } else {
      for (auto& x : tmp) ASHL_TRY(r_.get(x, field));
    }
    v = std::move(tmp);
    return {};
  }
  status get_vector(std::vector<bool>& v, std::string_view field) {
    std::uint64_t n = 0;
    ASHL_TRY(count(n, 1, field));
    std::vector<bool> tmp(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < tmp.size(); ++i) {
      bool b = false;
      ASHL_TRY(get(b, field));
      tmp[i] = b;
    }
    v = std::move(tmp);
    return {};
  }
  // A u64 length and that many bytes, as put_string wrote them: a view into
  // the reader's input (no copy).
  status get_bytes(std::span<const std::byte>& out, std::string_view field) {
    std::uint64_t n = 0;
    ASHL_TRY(count(n, 1, field));
    auto b = r_.get_bytes(static_cast<std::size_t>(n), field);
    if (!b) return b.error();
    out = *b;
    return {};
  }
  status get_string(std::string& s, std::string_view field) {
    std::span<const std::byte> b;
    ASHL_TRY(get_bytes(b, field));
    s.assign(reinterpret_cast<const char*>(b.data()), b.size());
    return {};
  }
  [[nodiscard]] std::size_t remaining() const noexcept { return r_.remaining(); }
  [[nodiscard]] bool at_end() const noexcept { return r_.at_end(); }
  [[nodiscard]] status expect_end(std::string_view what) const { return r_.expect_end(what); }

 private:
  // The section header's four characters (checked against `four`) and its version.
  status tag_version(std::string_view four, std::uint32_t& v) {
    std::array<std::uint8_t, 4> got{};
    for (auto& c : got) ASHL_TRY(r_.get(c, four));
    const std::string seen(got.begin(), got.end());
    if (seen != four) return make_error(errc::malformed, "state.tag", seen, "expected the section " + std::string(four));
    return r_.get(v, std::string(four) + ".version");
  }

  byte_reader r_;
};

ASHL_NAMESPACE_END
