#include <ashl/adapt/torch.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/transport/inproc.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include "../support/checks.hpp"
#include "../support/torch_server.hpp"
#include "../support/torch_testing.hpp"

// adapt/torch.hpp: the buckets alias the module's parameters and gradients;
// BSP + identity + server SGD over inproc is plain SGD bit for bit; the
// plan's local iterations and batch size are followed; bad models are named.

namespace adapt = ashl::adapt;
namespace ps = ashl::ps;
namespace tr = ashl::transport;
using namespace std::chrono_literals;

namespace {

using torch_testing::contains;
using torch_testing::flat_copy;
using torch_testing::make_net;
using torch_testing::net;
using torch_testing::node_of;
using torch_testing::server_thread;

}  // namespace

BOOST_AUTO_TEST_CASE(bucket_views_alias_the_parameters_and_gradients) {
  auto m = make_net();
  const auto before = flat_copy(*m);
  auto b = adapt::torch_bucket::create(*m);
  ASHL_REQUIRE(b.has_value(), (b ? "" : b.error().message()));
  ASHL_TEST(b->size() == before.size());
  ASHL_TEST(flat_copy(*m) == before);  // values kept
  float* flat = b->params().data_ptr<float>();
  ASHL_TEST(std::memcmp(flat, before.data(), before.size() * 4) == 0);
  // Through the bucket -> seen by the parameter.
  flat[0] = 42.0f;
  ASHL_TEST(m->fc1->weight[0][0].item<float>() == 42.0f);
  // Through the parameter -> seen by the bucket (fc2.bias is the last one).
  {
    torch::NoGradGuard g;
    m->fc2->bias.fill_(-3.0f);
  }
  ASHL_TEST(flat[b->size() - 1] == -3.0f);
  // backward() accumulates into the gradient bucket.
  auto x = torch::randn({4, 6});
  m->forward(x).sum().backward();
  const float* gflat = b->grads().data_ptr<float>();
  const auto gb = m->fc2->bias.grad();
  ASHL_TEST(gb.data_ptr<float>() == gflat + b->size() - 3);
  ASHL_TEST(gflat[b->size() - 1] == 4.0f);  // d(sum)/d(bias) over 4 rows
  // A replaced grad (zero_grad(set_to_none)) is a view again after attach().
  m->fc2->bias.mutable_grad() = torch::ones({3});
  b->attach();
  ASHL_TEST(m->fc2->bias.grad().data_ptr<float>() == gflat + b->size() - 3);
  ASHL_TEST(gflat[b->size() - 1] == 1.0f);
}

BOOST_AUTO_TEST_CASE(bsp_identity_sgd_over_inproc_is_plain_sgd_bit_for_bit) {
  constexpr double lr = 0.1;
  auto reference = make_net();
  auto m = make_net();
  const auto initial = flat_copy(*m);
  auto fabric = tr::inproc_fabric::create({});
  server_thread srv(fabric, initial, "bsp", {},
                    {.mode = ps::optimizer_params::kind::sgd, .lr = lr});
  auto d = adapt::torch_worker<tr::inproc>::create(*m, nullptr, {.servers = {"server0"}, .timeout = 10s},
                                                   node_of(fabric), adapt::torch_update::gradient);
  ASHL_REQUIRE(d.has_value(), (d ? "" : d.error().message()));
  ASHL_TEST(d->plan().local_iterations == 1u);
  torch::manual_seed(3);
  for (int it = 0; it < 5; ++it) {
    auto x = torch::randn({8, 6});
    auto y = torch::randn({8, 3});
    // Plain SGD on the reference: W -= lr * g in f32.
    reference->zero_grad();
    torch::mse_loss(reference->forward(x), y).backward();
    {
      torch::NoGradGuard g;
      for (auto& p : reference->parameters()) {
        auto w = p.data_ptr<float>();
        auto gr = p.grad().data_ptr<float>();
        for (std::int64_t i = 0; i < p.numel(); ++i) w[i] -= static_cast<float>(lr) * gr[i];
      }
    }
    d->zero_grad();
    torch::mse_loss(m->forward(x), y).backward();
    const auto s = d->step();
    ASHL_REQUIRE(s.ok(), s.message());
    const auto a = flat_copy(*reference), b = flat_copy(*m);
    ASHL_REQUIRE(a.size() == b.size());
    ASHL_TEST(std::memcmp(a.data(), b.data(), a.size() * 4) == 0, "iteration " << it << " differs");
  }
  ASHL_TEST(d->commits() == 5u);
  ASHL_TEST(d->leave().ok());
}

BOOST_AUTO_TEST_CASE(local_iterations_and_batch_size_of_the_plan_are_followed) {
  auto m = make_net();
  const auto initial = flat_copy(*m);
  auto fabric = tr::inproc_fabric::create({});
  ps::policy_params pp;
  pp.local_steps = 3;
  pp.batch_size = 16;
  server_thread srv(fabric, initial, "local_sgd", pp, {});
  torch::optim::SGD local(m->parameters(), 0.05);
  auto d = adapt::torch_worker<tr::inproc>::create(*m, &local, {.servers = {"server0"}, .batch = 4, .timeout = 10s},
                                                   node_of(fabric));
  ASHL_REQUIRE(d.has_value(), (d ? "" : d.error().message()));
  ASHL_TEST(d->plan().local_iterations == 3u);
  ASHL_TEST(d->batch() == 16u);  // the plan's, not the worker's own 4
  for (int it = 1; it <= 9; ++it) {
    const auto x = torch::randn({static_cast<std::int64_t>(d->batch()), 6});
    d->zero_grad();
    m->forward(x).pow(2).mean().backward();
    const auto before = flat_copy(*m);
    ASHL_REQUIRE(d->step().ok());
    ASHL_TEST(d->commits() == static_cast<std::uint64_t>(it / 3), "after iteration " << it);
    ASHL_TEST((flat_copy(*m) != before));  // the local step moved the model
  }
  // One worker: the server holds exactly the worker's model after each commit.
  ASHL_TEST(d->worker().telemetry().commits == 3u);
  ASHL_TEST(d->leave().ok());
}

// DiLoCo from C++: servers named "diloco" run the outer optimizer
// (ps::outer_optimizer_of: Nesterov, lr 0.7, μ 0.9), the worker's inner
// optimizer is AdamW under torch_update::delta. A reference model takes
// the same AdamW steps; at each commit the expected parameters are the
// outer step on its delta, in f32 in the documented order
// (rules/optimizer.hpp): g = (−1)·Δ + 0·W, v = μv + g, W = W − lr·(g + μv).
BOOST_AUTO_TEST_CASE(diloco_with_an_adamw_inner_optimizer_takes_outer_nesterov_steps) {
  auto m = make_net(), ref = make_net();
  std::vector<float> W = flat_copy(*m), v(W.size(), 0.0f);
  auto fabric = tr::inproc_fabric::create({});
  ps::policy_params pp;
  pp.workers = 1;
  pp.local_steps = 3;
  const auto opt = ps::outer_optimizer_of("diloco", pp);
  ASHL_REQUIRE(opt.has_value());
  server_thread srv(fabric, W, "diloco", pp, *opt);
  torch::optim::AdamW local(m->parameters(), torch::optim::AdamWOptions(0.01));
  torch::optim::AdamW local_ref(ref->parameters(), torch::optim::AdamWOptions(0.01));
  auto d = adapt::torch_worker<tr::inproc>::create(*m, &local, {.servers = {"server0"}, .timeout = 10s},
                                                   node_of(fabric));
  ASHL_REQUIRE(d.has_value(), (d ? "" : d.error().message()));
  ASHL_TEST(d->plan().local_iterations == 3u);
  torch::manual_seed(5);
  for (int it = 1; it <= 9; ++it) {
    const auto x = torch::randn({8, 6});
    d->zero_grad();
    m->forward(x).pow(2).mean().backward();
    local_ref.zero_grad();
    ref->forward(x).pow(2).mean().backward();
    local_ref.step();
    ASHL_REQUIRE(d->step().ok());
    if (it % 3 != 0) continue;
    const auto w_local = flat_copy(*ref);
    for (std::size_t i = 0; i < W.size(); ++i) {
      const float delta = w_local[i] - W[i];
      const float acc = 0.0f + 1.0f * delta;  // the round's mean of one delta
      const float g = -1.0f * acc + 0.0f * W[i];
      v[i] = 0.9f * v[i] + g;
      W[i] = W[i] - 0.7f * (g + 0.9f * v[i]);
    }
    const auto got = flat_copy(*m);
    ASHL_REQUIRE(got.size() == W.size());
    ASHL_TEST(std::memcmp(got.data(), W.data(), W.size() * 4) == 0, "after round " << it / 3);
    ASHL_TEST(got != w_local);  // not plain averaging
    // The pull: the reference continues from the servers' parameters.
    torch::NoGradGuard no_grad;
    std::size_t at = 0;
    for (auto& p : ref->parameters()) {
      auto flat = p.view({-1});
      for (std::int64_t k = 0; k < flat.numel(); ++k) flat[k] = W[at++];
    }
  }
  ASHL_TEST(d->leave().ok());
}

BOOST_AUTO_TEST_CASE(bad_models_are_refused_with_the_value_named) {
  {
    auto lin = torch::nn::Linear(3, 2);
    lin->to(torch::kDouble);
    auto b = adapt::torch_bucket::create(*lin);
    ASHL_REQUIRE(!b.has_value());
    ASHL_TEST(contains(b.error().message(), "torch.parameter[weight].dtype = \"Double\": must be float32"), b.error().message());
  }
  {
    auto t = torch::randn({4, 3}).t().set_requires_grad(true);  // strides (1, 3)
    auto b = adapt::torch_bucket::create({t}, {"w"});
    ASHL_REQUIRE(!b.has_value());
    ASHL_TEST(contains(b.error().message(), "torch.parameter[w].stride = \"(1, 3)\": must be contiguous"), b.error().message());
  }
  {
    auto m = make_net();
    auto fabric = tr::inproc_fabric::create({});
    server_thread srv(fabric, std::vector<float>(10), "bsp", {}, {});
    torch::optim::SGD local(m->parameters(), 0.05);
    auto d = adapt::torch_worker<tr::inproc>::create(*m, &local, {.servers = {"server0"}, .timeout = 5s},
                                                     node_of(fabric));
    ASHL_REQUIRE(!d.has_value());
    ASHL_TEST(contains(d.error().message(), "join.elements = 53: this job's model has 10 elements"), d.error().message());
  }
  {
    auto m = make_net();
    auto fabric = tr::inproc_fabric::create({});
    auto d = adapt::torch_worker<tr::inproc>::create(*m, nullptr, {.servers = {"server0"}}, node_of(fabric));
    ASHL_REQUIRE(!d.has_value());
    ASHL_TEST(contains(d.error().message(), "torch_worker.local = \"null\""), d.error().message());
  }
}

// A tied parameter (one tensor registered twice) owns one slot, at its first
// registration, as in ashl.torch (adapt::first_registrations); its gradient
// is the sum over both uses, and one step with BSP + identity + server SGD
// is W - lr * that sum.
BOOST_AUTO_TEST_CASE(tied_parameters_own_one_slot_and_step_by_their_summed_gradient) {
  torch::manual_seed(3);
  auto w = torch::randn({4, 4}).set_requires_grad(true);
  auto b = torch::randn({4}).set_requires_grad(true);
  auto bucket = adapt::torch_bucket::create({w, b, w}, {"enc", "bias", "dec"});
  ASHL_REQUIRE(bucket.has_value(), (bucket ? "" : bucket.error().message()));
  ASHL_TEST(bucket->size() == 20u);
  ASHL_TEST((bucket->names() == std::vector<std::string>{"enc", "bias"}));
  std::vector<float> initial(bucket->params().data_ptr<float>(), bucket->params().data_ptr<float>() + 20);
  auto fabric = tr::inproc_fabric::create({});
  ps::optimizer_params opt;
  opt.mode = ps::optimizer_params::kind::sgd;
  opt.lr = 0.5;
  server_thread srv(fabric, initial, "bsp", {}, opt);
  auto d = adapt::torch_worker<tr::inproc>::create(std::move(*bucket), nullptr, {.servers = {"server0"}},
                                                   node_of(fabric), adapt::torch_update::gradient);
  ASHL_REQUIRE(d.has_value(), (d ? "" : d.error().message()));
  d->zero_grad();
  auto x = torch::randn({2, 4});
  (torch::matmul(torch::matmul(x, w) + b, w.t())).pow(2).sum().backward();
  const auto expect = (w.detach() - 0.5f * w.grad()).clone();
  ASHL_REQUIRE(d->step().ok());
  ASHL_TEST(torch::equal(w.detach(), expect));
  ASHL_TEST(d->leave().ok());
}
