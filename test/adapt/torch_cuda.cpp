#include <ashl/adapt/torch.hpp>

#ifndef BOOST_TEST_NO_MAIN
#define BOOST_TEST_NO_MAIN
#endif
#include <boost/test/unit_test.hpp>

#include <ashl/transport/inproc.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include "../support/checks.hpp"
#include "../support/torch_server.hpp"
#include "../support/torch_testing.hpp"

// adapt/torch.hpp with CUDA tensors (label gpu): the buckets live on the
// device and alias the module's parameters and gradients there; the worker
// exchanges through pinned host copies; BSP + identity + server SGD over
// inproc equals the same SGD done on the host, bit for bit; a plan's local
// iterations are followed; a model split across devices is refused, named.
//
// It runs only where libtorch has CUDA and a device is present
// (torch::cuda::is_available()); elsewhere (Debian's CPU-only libtorch, CI)
// it reports itself skipped (exit 77). bench/gpu/run.sh builds it against
// the device machine's CUDA libtorch and runs it.

namespace adapt = ashl::adapt;
namespace ps = ashl::ps;
namespace tr = ashl::transport;
using namespace std::chrono_literals;

namespace {

struct net_impl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  net_impl() {
    fc1 = register_module("fc1", torch::nn::Linear(64, 48));
    fc2 = register_module("fc2", torch::nn::Linear(48, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::tanh(fc1->forward(x))); }
};
TORCH_MODULE_IMPL(net, net_impl);

const torch::Device cuda0(torch::kCUDA, 0);

net make_cuda_net() {
  torch::manual_seed(7);
  net m;
  m->to(cuda0);
  return m;
}

using torch_testing::contains;
using torch_testing::flat_copy;
using torch_testing::node_of;
using torch_testing::server_thread;

}  // namespace

BOOST_AUTO_TEST_CASE(cuda_buckets_alias_the_parameters_and_gradients_on_the_device) {
  auto m = make_cuda_net();
  const auto before = flat_copy(*m);
  auto b = adapt::torch_bucket::create(*m);
  ASHL_REQUIRE(b.has_value(), (b ? "" : b.error().message()));
  ASHL_TEST(b->is_cuda());
  ASHL_TEST(b->params().device() == cuda0);
  ASHL_TEST(b->grads().device() == cuda0);
  ASHL_TEST(flat_copy(*m) == before);  // values kept
  const auto* pflat = static_cast<const char*>(b->params().data_ptr());
  const auto* gflat = static_cast<const char*>(b->grads().data_ptr());
  std::size_t offset = 0;
  auto x = torch::randn({16, 64}, torch::TensorOptions().device(cuda0));
  m->forward(x).sum().backward();
  for (const auto& p : m->parameters()) {
    ASHL_TEST(p.is_cuda());
    // As integers: Boost.Test compares (and prints) char pointers as C strings,
    // which read device memory from the host.
    ASHL_TEST(reinterpret_cast<std::uintptr_t>(p.data_ptr()) == reinterpret_cast<std::uintptr_t>(pflat + offset * 4),
               "parameter at offset " << offset << ": data " << p.data_ptr() << " (storage "
                                      << p.storage().data() << " + " << p.storage_offset() << "), bucket "
                                      << static_cast<const void*>(pflat) << " + " << offset * 4 << " bytes, sizes "
                                      << p.sizes() << ", same values " << torch::equal(p.detach().flatten(), b->params().narrow(0, static_cast<std::int64_t>(offset), p.numel())));
    ASHL_REQUIRE(p.grad().defined());
    ASHL_TEST(reinterpret_cast<std::uintptr_t>(p.grad().data_ptr()) ==
               reinterpret_cast<std::uintptr_t>(gflat + offset * 4));  // backward wrote in place
    offset += static_cast<std::size_t>(p.numel());
  }
  ASHL_TEST(offset == b->size());
  // d(sum)/d(fc2.bias) = 16 per output, read through the gradient bucket.
  const auto tail = b->grads().narrow(0, static_cast<std::int64_t>(b->size()) - 10, 10).to(torch::kCPU);
  for (std::int64_t i = 0; i < 10; ++i) ASHL_TEST(tail[i].item<float>() == 16.0f);
}

BOOST_AUTO_TEST_CASE(cuda_bsp_identity_sgd_over_inproc_equals_host_sgd_bit_for_bit) {
  constexpr double lr = 0.05;
  auto reference = make_cuda_net();
  auto m = make_cuda_net();
  const auto initial = flat_copy(*m);
  ASHL_REQUIRE(flat_copy(*reference) == initial);
  auto fabric = tr::inproc_fabric::create({});
  server_thread srv(fabric, initial, "bsp", {}, {.mode = ps::optimizer_params::kind::sgd, .lr = lr});
  auto d = adapt::torch_worker<tr::inproc>::create(*m, nullptr, {.servers = {"server0"}, .timeout = 20s},
                                                   node_of(fabric), adapt::torch_update::gradient);
  ASHL_REQUIRE(d.has_value(), (d ? "" : d.error().message()));
  ASHL_TEST(d->bucket().is_cuda());
  torch::manual_seed(3);
  const auto on_gpu = torch::TensorOptions().device(cuda0);
  for (int it = 0; it < 6; ++it) {
    auto x = torch::randn({32, 64}, on_gpu);
    auto y = torch::randn({32, 10}, on_gpu);
    // The reference: the same forward/backward on the device, then the
    // server's rule W -= lr * g in f32 on the host, and back to the device.
    reference->zero_grad();
    torch::mse_loss(reference->forward(x), y).backward();
    {
      torch::NoGradGuard g;
      for (auto& p : reference->parameters()) {
        auto w = p.detach().to(torch::kCPU).contiguous();
        auto gr = p.grad().to(torch::kCPU).contiguous();
        float* wp = w.data_ptr<float>();
        const float* gp = gr.data_ptr<float>();
        for (std::int64_t i = 0; i < w.numel(); ++i) wp[i] -= static_cast<float>(lr) * gp[i];
        p.copy_(w);
      }
    }
    d->zero_grad();
    torch::mse_loss(m->forward(x), y).backward();
    const auto s = d->step();
    ASHL_REQUIRE(s.ok(), s.message());
    for (const auto& p : m->parameters()) ASHL_REQUIRE(p.is_cuda());
    const auto a = flat_copy(*reference), b = flat_copy(*m);
    ASHL_REQUIRE(a.size() == b.size());
    double worst = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
    ASHL_TEST(std::memcmp(a.data(), b.data(), a.size() * 4) == 0,
               "iteration " << it << " differs; largest difference " << worst);
  }
  ASHL_TEST(d->commits() == 6u);
  ASHL_TEST(d->leave().ok());
}

BOOST_AUTO_TEST_CASE(cuda_local_iterations_of_the_plan_are_followed_and_the_server_holds_the_model) {
  auto m = make_cuda_net();
  const auto initial = flat_copy(*m);
  auto fabric = tr::inproc_fabric::create({});
  ps::policy_params pp;
  pp.local_steps = 3;
  server_thread srv(fabric, initial, "local_sgd", pp, {});
  torch::optim::SGD local(m->parameters(), 0.05);
  auto d = adapt::torch_worker<tr::inproc>::create(*m, &local, {.servers = {"server0"}, .timeout = 20s},
                                                   node_of(fabric));
  ASHL_REQUIRE(d.has_value(), (d ? "" : d.error().message()));
  ASHL_TEST(d->plan().local_iterations == 3u);
  const auto on_gpu = torch::TensorOptions().device(cuda0);
  for (int it = 1; it <= 9; ++it) {
    const auto x = torch::randn({16, 64}, on_gpu);
    d->zero_grad();
    m->forward(x).pow(2).mean().backward();
    const auto before = flat_copy(*m);
    ASHL_REQUIRE(d->step().ok());
    ASHL_TEST(d->commits() == static_cast<std::uint64_t>(it / 3), "after iteration " << it);
    ASHL_TEST((flat_copy(*m) != before));  // the local step moved the model
  }
  ASHL_TEST(d->worker().telemetry().commits == 3u);
  // One worker, model deltas: after a pull the device model is the server's;
  // it moved away from the start, and stays on the device, in the bucket.
  ASHL_REQUIRE(d->synchronize().ok());
  const auto now = flat_copy(*m);
  ASHL_TEST((now != initial));
  for (float v : now) ASHL_REQUIRE(std::isfinite(v));
  ASHL_TEST(m->parameters()[0].data_ptr() == d->bucket().params().data_ptr());
  ASHL_TEST(d->leave().ok());
}

BOOST_AUTO_TEST_CASE(a_model_split_across_devices_is_refused_with_the_device_named) {
  auto a = torch::randn({4}, torch::TensorOptions().device(cuda0)).set_requires_grad(true);
  auto b = torch::randn({3}).set_requires_grad(true);
  auto bucket = adapt::torch_bucket::create({a, b}, {"a", "b"});
  ASHL_REQUIRE(!bucket.has_value());
  ASHL_TEST(contains(bucket.error().message(), "torch.parameter[b].device = \"cpu\""), bucket.error().message());
}

// Skips (exit 77, ctest "Skipped") only where libtorch reports no usable CUDA.
int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::printf("SKIPPED: torch::cuda::is_available() is false (libtorch built without CUDA, or no device)\n");
    return 77;
  }
  return ::boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
