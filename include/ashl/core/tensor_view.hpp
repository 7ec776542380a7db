// ashl/core/tensor_view.hpp — non-owning views of typed and untyped buffers.
//
//   std::vector<float> g(n);
//   ashl::host_view<float> v(g.data(), g.size());        // typed
//   ashl::raw_view<ashl::host_space> r = v.raw();        // pointer, count, dtype
//   auto back = r.as<float>();                           // checked: dtype must match
//
// The memory space is part of the type; element access exists only for
// host-accessible spaces. docs/design.md, core/.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/memory_space.hpp>
#include <ashl/core/status.hpp>

#include <cstddef>
#include <span>
#include <type_traits>

ASHL_NAMESPACE_BEGIN

template <class T, memory_space Space = host_space>
class tensor_view {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  using space = Space;

  constexpr tensor_view() noexcept = default;
  ASHL_HOST_DEVICE constexpr tensor_view(T* data, std::size_t count) noexcept : data_(data), count_(count) {}
  // Host containers convert implicitly, host only.
  template <class U>
    requires(host_accessible_space<Space> && std::is_convertible_v<U (*)[], T (*)[]>)
  constexpr tensor_view(std::span<U> s) noexcept : data_(s.data()), count_(s.size()) {}  // NOLINT
  // A mutable view converts to a const one.
  template <class U>
    requires(std::is_convertible_v<U (*)[], T (*)[]>)
  ASHL_HOST_DEVICE constexpr tensor_view(tensor_view<U, Space> o) noexcept  // NOLINT
      : data_(o.data()), count_(o.size()) {}

  ASHL_HOST_DEVICE constexpr T* data() const noexcept { return data_; }
  ASHL_HOST_DEVICE constexpr std::size_t size() const noexcept { return count_; }
  ASHL_HOST_DEVICE constexpr std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  ASHL_HOST_DEVICE constexpr bool empty() const noexcept { return count_ == 0; }
  static constexpr dtype element_dtype() noexcept { return dtype_of<value_type>; }

  constexpr T& operator[](std::size_t i) const noexcept
    requires host_accessible_space<Space>
  {
    ASHL_ASSERT(i < count_, "tensor_view index out of range");
    return data_[i];
  }
  constexpr T* begin() const noexcept
    requires host_accessible_space<Space>
  { return data_; }
  constexpr T* end() const noexcept
    requires host_accessible_space<Space>
  { return data_ + count_; }
  constexpr std::span<T> span() const noexcept
    requires host_accessible_space<Space>
  { return {data_, count_}; }

  ASHL_HOST_DEVICE constexpr tensor_view subview(std::size_t offset, std::size_t count) const noexcept {
    ASHL_ASSERT(offset <= count_ && count <= count_ - offset, "tensor_view::subview out of range");
    return tensor_view(data_ + offset, count);
  }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

template <class T> using host_view = tensor_view<T, host_space>;
template <class T> using device_view = tensor_view<T, device_space>;

template <class T>
tensor_view(std::span<T>) -> tensor_view<T, host_space>;

// Type-erased view: pointer, element count, dtype, space (the type).
template <memory_space Space = host_space, bool Const = false>
class raw_view {
 public:
  using pointer = std::conditional_t<Const, const void*, void*>;
  using space = Space;

  constexpr raw_view() noexcept = default;
  constexpr raw_view(pointer data, std::size_t count, dtype t) noexcept : data_(data), count_(count), dtype_(t) {}
  template <class T>
    requires(Const || !std::is_const_v<T>)
  constexpr raw_view(tensor_view<T, Space> v) noexcept  // NOLINT
      : data_(v.data()), count_(v.size()), dtype_(dtype_of<std::remove_cv_t<T>>) {}

  constexpr pointer data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return count_; }
  constexpr dtype element_dtype() const noexcept { return dtype_; }
  constexpr std::size_t size_bytes() const noexcept { return count_ * size_of(dtype_); }

  // Typed view if the dtype matches, else an error naming both dtypes.
  template <class T>
  result<tensor_view<std::conditional_t<Const, const T, T>, Space>> as() const {
    if (dtype_of<T> != dtype_)
      return make_error(errc::invalid_argument, "view.dtype", to_string(dtype_),
                        std::string("expected ") + std::string(to_string(dtype_of<T>)));
    using E = std::conditional_t<Const, const T, T>;
    return tensor_view<E, Space>(static_cast<E*>(data_), count_);
  }

 private:
  pointer data_ = nullptr;
  std::size_t count_ = 0;
  dtype dtype_ = dtype::f32;
};

ASHL_NAMESPACE_END
