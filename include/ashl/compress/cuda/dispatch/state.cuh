// ashl/compress/cuda/dispatch/state.cuh — per-tensor f32 device arrays owned
// by the device decorators (error-feedback residuals, DGC momentum and
// velocity).
//
//   detail::tensor_state_map<1> residuals;                   // one array per tensor
//   ASHL_TRY(residuals.slot(ctx.tensor, n, stream, arrays));  // allocates zeroed on first use
//   float* e = arrays[0];
//
// The host decorators keep std::vectors in an unordered_map by tensor id;
// this is the same map over device memory. Arrays come from
// cudaMallocAsync on the caller's stream and are zeroed there (a new shape
// starts with no debt, as on the host), so a first encode needs no host
// synchronization either; a caller that wants no allocation on the hot path
// calls reserve() first. Freed with cudaFree in the destructor (which waits
// for the device). Move-only. docs/algorithms.md §4 (decorators).
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/cuda/dispatch/common.cuh>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

ASHL_NAMESPACE_BEGIN
namespace compress::cuda::detail {

template <std::size_t Arrays>
class tensor_state_map {
 public:
  tensor_state_map() = default;
  tensor_state_map(const tensor_state_map&) = delete;
  tensor_state_map& operator=(const tensor_state_map&) = delete;
  tensor_state_map(tensor_state_map&& o) noexcept : slots_(std::move(o.slots_)) { o.slots_.clear(); }
  tensor_state_map& operator=(tensor_state_map&& o) noexcept {
    if (this != &o) {
      release();
      slots_ = std::move(o.slots_);
      o.slots_.clear();
    }
    return *this;
  }
  ~tensor_state_map() { release(); }

  // The arrays of `tensor` for n elements: allocated and zeroed on `stream`
  // when missing or of another size.
  status slot(std::uint32_t tensor, std::size_t n, cudaStream_t stream, std::string_view codec,
              std::array<float*, Arrays>& arrays) {
    entry& e = slots_[tensor];
    if (e.n != n || e.data[0] == nullptr) {
      for (float*& p : e.data)
        if (p != nullptr) {
          ASHL_TRY(cuda_check(cudaFreeAsync(p, stream), std::string(codec) + ".state_free"));
          p = nullptr;
        }
      e.n = n;
      for (float*& p : e.data) {
        ASHL_TRY(cuda_check(cudaMallocAsync(reinterpret_cast<void**>(&p), n == 0 ? sizeof(float) : n * sizeof(float),
                                            stream),
                            std::string(codec) + ".state_alloc"));
        ASHL_TRY(cuda_check(cudaMemsetAsync(p, 0, n * sizeof(float), stream), std::string(codec) + ".state_zero"));
      }
    }
    arrays = e.data;
    return {};
  }

  // Array `which` of `tensor`; empty when the tensor has none.
  [[nodiscard]] device_view<float> view(std::uint32_t tensor, std::size_t which) const noexcept {
    const auto it = slots_.find(tensor);
    if (it == slots_.end() || it->second.data[which] == nullptr) return {};
    return {it->second.data[which], it->second.n};
  }

  status zero(cudaStream_t stream, std::string_view codec) {
    for (auto& [t, e] : slots_)
      for (float* p : e.data)
        if (p != nullptr)
          ASHL_TRY(cuda_check(cudaMemsetAsync(p, 0, e.n * sizeof(float), stream), std::string(codec) + ".reset"));
    return {};
  }

 private:
  struct entry {
    std::array<float*, Arrays> data{};
    std::size_t n = 0;
  };
  void release() noexcept {
    for (auto& [t, e] : slots_)
      for (float* p : e.data)
        if (p != nullptr) cudaFree(p);
    slots_.clear();
  }
  std::unordered_map<std::uint32_t, entry> slots_;
};

}  // namespace compress::cuda::detail
ASHL_NAMESPACE_END
