// ashl/core/memory_space.hpp — where a buffer lives, as part of its type.
//
//   ashl::tensor_view<float, ashl::host_space> h = ...;
//   ashl::tensor_view<float, ashl::device_space> d = ...;
//   h[3];   // fine
//   d[3];   // does not compile: device memory cannot be read on the host
//
// docs/design.md core/ ("memory spaces in the type of a view"); RAFT does the same.
#pragma once

#include <ashl/config.hpp>

#include <string_view>
#include <type_traits>

ASHL_NAMESPACE_BEGIN

struct host_space {
  static constexpr std::string_view name = "host";
  static constexpr bool host_accessible = true;
};
struct device_space {
  static constexpr std::string_view name = "device";
  static constexpr bool host_accessible = false;
};
// Page-locked host memory: host readable, and the device can DMA from it.
struct pinned_space {
  static constexpr std::string_view name = "pinned";
  static constexpr bool host_accessible = true;
};

template <class S>
concept memory_space = std::is_same_v<S, host_space> || std::is_same_v<S, device_space> ||
                       std::is_same_v<S, pinned_space>;

template <class S>
concept host_accessible_space = memory_space<S> && S::host_accessible;

ASHL_NAMESPACE_END
