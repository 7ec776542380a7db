// test/support/torch_testing.hpp — the small libtorch model the adapter tests
// (test/adapt/torch*.cpp) train, and a flat float copy of a module's
// parameters in registration order, for bit-for-bit comparisons.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace torch_testing {

// Linear(6, 5) -> tanh -> Linear(5, 3): four parameters, 53 floats.
struct net_impl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  net_impl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 5));
    fc2 = register_module("fc2", torch::nn::Linear(5, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::tanh(fc1->forward(x))); }
};
TORCH_MODULE_IMPL(net, net_impl);

// The same initial parameters every time.
inline net make_net() {
  torch::manual_seed(7);
  return net();
}

// Every parameter, as float32 on the host (from any device), one after
// another in registration order.
inline std::vector<float> flat_copy(const torch::nn::Module& m) {
  std::vector<float> out;
  for (const auto& p : m.parameters()) {
    auto c = p.detach().to(torch::kCPU, torch::kFloat).contiguous();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
}

}  // namespace torch_testing
