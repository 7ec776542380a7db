// ashl/compress/detail/tensor_state.hpp — the per-tensor state of a
// stateful codec: K float arrays per tensor id, as long as the tensor.
//
//   detail::tensor_state<2> s;                       // dgc: momentum u, velocity v
//   auto& [u, v] = s.slot(ctx.tensor, n);            // zeroed on first use or a new n
//   std::span<const float> v_now = s.view(tensor, 1);
//
// error_feedback (one residual) and dgc (momentum and velocity) keep their
// state here, so both follow one rule: a tensor seen with a new element
// count starts again from zero (a new shape owes nothing), and reset()
// zeroes every tensor without freeing. docs/algorithms.md §4, "Decorators".
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/detail/host_simd.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

ASHL_DETAIL_COMPRESS_HOST_BEGIN
namespace detail {

template <std::size_t K>
class tensor_state {
  static_assert(K >= 1, "tensor_state: at least one array per tensor");

 public:
  using arrays = std::array<std::vector<float>, K>;

  // The K arrays of `tensor`, each n floats, zeroed when first seen or when
  // n differs from the last call's.
  arrays& slot(std::uint32_t tensor, std::size_t n) {
    arrays& a = state_[tensor];
    if (a[0].size() != n)
      for (auto& v : a) v.assign(n, 0.0f);
    return a;
  }
  // Array `which` of `tensor`; empty if the tensor was never seen.
  [[nodiscard]] std::span<const float> view(std::uint32_t tensor, std::size_t which) const noexcept {
    const auto it = state_.find(tensor);
    return it == state_.end() ? std::span<const float>{} : std::span<const float>(it->second[which]);
  }
  void reset() noexcept {
    for (auto& [tensor, a] : state_)
      for (auto& v : a) std::fill(v.begin(), v.end(), 0.0f);
  }

 private:
  std::unordered_map<std::uint32_t, arrays> state_;
};

}  // namespace detail
ASHL_DETAIL_COMPRESS_HOST_END
