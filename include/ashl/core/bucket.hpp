// ashl/core/bucket.hpp — many named tensors laid out in one contiguous buffer.
//
//   auto layout = ashl::bucket_layout::make({{"fc1.weight", {256, 784}, ashl::dtype::f32},
//                                            {"fc1.bias", {256}, ashl::dtype::f32}});
//   if (!layout) ...;                              // names the bad entry
//   ashl::bucket b(*layout);                       // owns aligned host storage
//   auto w = b.view<float>("fc1.weight");          // result<host_view<float>>
//   ashl::host_view<std::byte> all = b.bytes();    // everything, for one send
//
// Each tensor starts at a multiple of `alignment` bytes (default 64, one cache
// line; a power of two). The layout is pure arithmetic and can be shared by
// a bucket over caller-owned memory (a framework's flat gradient buffer).
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <vector>

ASHL_NAMESPACE_BEGIN

struct tensor_spec {
  std::string name;
  std::vector<std::size_t> shape;
  dtype type = dtype::f32;
};

struct bucket_entry {
  std::string name;
  std::vector<std::size_t> shape;
  dtype type;
  std::size_t count;   // elements
  std::size_t offset;  // bytes from the start of the buffer
};

class bucket_layout {
 public:
  static result<bucket_layout> make(const std::vector<tensor_spec>& specs, std::size_t alignment = 64) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
      return invalid_argument("bucket.alignment", alignment, "must be a power of two");
    bucket_layout l;
    l.alignment_ = alignment;
    std::size_t off = 0;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const auto& s = specs[i];
      const std::string field = "bucket.tensors[" + std::to_string(i) + "]";
      if (s.name.empty()) return invalid_argument(field + ".name", s.name, "must not be empty");
      for (const auto& e : l.entries_)
        if (e.name == s.name) return invalid_argument(field + ".name", s.name, "appears twice");
      std::size_t count = 1;
      for (std::size_t d = 0; d < s.shape.size(); ++d) {
        if (s.shape[d] != 0 && count > SIZE_MAX / s.shape[d] / 16)
          return out_of_range(field + ".shape[" + std::to_string(d) + "]", s.shape[d], "element count overflows");
        count *= s.shape[d];
      }
      off = (off + alignment - 1) & ~(alignment - 1);
      // Each tensor alone fits (above); their sum, padded, must too.
      if (count * size_of(s.type) > SIZE_MAX - off - alignment)
        return out_of_range(field + ".shape", count, "elements: the bucket's total size overflows");
      l.entries_.push_back({s.name, s.shape, s.type, count, off});
      off += count * size_of(s.type);
    }
    l.total_ = (off + alignment - 1) & ~(alignment - 1);
    return l;
  }

  [[nodiscard]] const std::vector<bucket_entry>& entries() const noexcept { return entries_; }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return total_; }
  [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }
  [[nodiscard]] const bucket_entry* find(std::string_view name) const noexcept {
    for (const auto& e : entries_)
      if (e.name == name) return &e;
    return nullptr;
  }

 private:
  std::vector<bucket_entry> entries_;
  std::size_t total_ = 0;
  std::size_t alignment_ = 64;
};

// A layout over memory: owned (aligned, zeroed) or borrowed from the caller.
class bucket {
 public:
  explicit bucket(bucket_layout layout) : layout_(std::move(layout)) {
    const std::size_t n = layout_.size_bytes() == 0 ? layout_.alignment() : layout_.size_bytes();
    void* p = ::operator new(n, std::align_val_t(layout_.alignment()));
    std::memset(p, 0, n);
    owned_ = std::unique_ptr<std::byte, aligned_delete>(static_cast<std::byte*>(p),
                                                         aligned_delete{layout_.alignment()});
    data_ = owned_.get();
  }
  // Borrow caller memory of at least layout.size_bytes(), aligned to layout.alignment().
  static result<bucket> borrow(bucket_layout layout, std::span<std::byte> memory) {
    if (memory.size() < layout.size_bytes())
      return make_error(errc::buffer_too_small, "bucket.memory.size", memory.size(),
                        "smaller than the layout's size_bytes()");
    if (reinterpret_cast<std::uintptr_t>(memory.data()) % layout.alignment() != 0)
      return invalid_argument("bucket.memory.data", reinterpret_cast<std::uintptr_t>(memory.data()),
                              "not aligned to the layout's alignment");
    return bucket(std::move(layout), memory.data());
  }

  [[nodiscard]] const bucket_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] host_view<std::byte> bytes() const noexcept { return {data_, layout_.size_bytes()}; }

  template <class T>
  result<host_view<T>> view(std::string_view name) const {
    const bucket_entry* e = layout_.find(name);
    if (!e) return make_error(errc::not_found, "bucket.tensor", name, "no tensor of that name");
    if (e->type != dtype_of<T>)
      return make_error(errc::invalid_argument, "bucket.tensor.dtype", to_string(e->type),
                        std::string("tensor \"") + std::string(name) + "\" is not " + std::string(to_string(dtype_of<T>)));
    return host_view<T>(reinterpret_cast<T*>(data_ + e->offset), e->count);
  }
  // Type-erased view of entry i.
  [[nodiscard]] raw_view<host_space> raw(std::size_t i) const noexcept {
    const auto& e = layout_.entries()[i];
    return raw_view<host_space>(data_ + e.offset, e.count, e.type);
  }

 private:
  struct aligned_delete {
    std::size_t align;
    void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t(align)); }
  };
  bucket(bucket_layout layout, std::byte* borrowed)
      : layout_(std::move(layout)), owned_(nullptr, aligned_delete{layout_.alignment()}), data_(borrowed) {}

  bucket_layout layout_;
  std::unique_ptr<std::byte, aligned_delete> owned_{nullptr, aligned_delete{64}};
  std::byte* data_ = nullptr;
};

ASHL_NAMESPACE_END
