#include <ashl/adapt/torch.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/transport/inproc.hpp>
#if ASHL_HAS_UCX()
#include <ashl/transport/ucx.hpp>
#endif

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>
#include "../support/checks.hpp"
#include "../support/torch_server.hpp"
#include "../support/torch_testing.hpp"
#include "../support/counting_new.hpp"

// adapt/torch.hpp with several buckets (docs/torch.md, "C++"): the buckets
// (reverse registration order, the cap rule) alias the parameters and
// gradients; the overlapped exchange (commits from the gradient
// accumulators' hooks, pulls waited for per layer) and the serial one give
// bit-identical parameters under BSP, and equal plain SGD; the hooks fire
// once per parameter and backward with gradient accumulation and a tied
// parameter; a bf16 model trains and a non-finite step is skipped; a
// parameter larger than partition_mb is cut across buckets that alias it,
// its overlapped BSP equals the serial one, and wait_for waits for every
// piece.

namespace adapt = ashl::adapt;
namespace ps = ashl::ps;
namespace tr = ashl::transport;
using namespace std::chrono_literals;

namespace {

using torch_testing::contains;
using torch_testing::flat_copy;
using torch_testing::make_net;
using torch_testing::net;
using torch_testing::server_thread;

// 100 bytes: fc2.bias, fc2.weight, fc1.bias (92 B) in bucket 0; fc1.weight (120 B) alone in bucket 1.
constexpr double small_cap_mb = 100.0 / (1 << 20);
// 64 bytes: fc1.weight (120 B, 30 elements) cut in two pieces of 15, buckets 1 and 2.
constexpr double small_partition_mb = 64.0 / (1 << 20);

// Bucket b's server at "server0/b<b>" (adapt::bucket_addresses), starting
// from the bucket's float32 values, servers stepping SGD with `lr`.
std::vector<std::unique_ptr<server_thread>> serve(const std::shared_ptr<tr::inproc_fabric>& fabric,
                                                  const std::vector<adapt::torch_bucket>& buckets, double lr,
                                                  adapt::torch_update update = adapt::torch_update::gradient) {
  std::vector<std::unique_ptr<server_thread>> out;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const auto& h = buckets[b].host_params();
    std::vector<float> initial(h.data_ptr<float>(), h.data_ptr<float>() + h.numel());
    const auto name = (*adapt::bucket_addresses({"server0"}, b, true))[0];
    out.push_back(std::make_unique<server_thread>(fabric, std::move(initial), "bsp", ps::policy_params{},
                                                  update == adapt::torch_update::gradient
                                                      ? ps::optimizer_params{.mode = ps::optimizer_params::kind::sgd,
                                                                             .lr = lr}
                                                      : ps::optimizer_params{},  // model_delta
                                                  name));
  }
  return out;
}

auto nodes_of(const std::shared_ptr<tr::inproc_fabric>& f) {
  return [f](std::size_t) { return f->node(); };
}

}  // namespace

BOOST_AUTO_TEST_CASE(auto_makes_one_bucket_of_a_small_model_and_a_negative_cap_is_refused) {
  auto m = make_net();
  auto auto_buckets = adapt::torch_buckets(*m);
  ASHL_REQUIRE(auto_buckets.has_value());
  ASHL_TEST(auto_buckets->size() == 1u);  // 212 bytes: one bucket under "auto"
  auto bad = adapt::torch_buckets(*m, -1.0);
  ASHL_REQUIRE(!bad.has_value());
  ASHL_TEST(contains(bad.error().message(), "torch.bucket_cap_mb"), bad.error().message());
  for (const double part : {0.0, -1.0}) {
    auto refused = adapt::torch_buckets(*m, small_cap_mb, part);
    ASHL_REQUIRE(!refused.has_value());
    ASHL_TEST(contains(refused.error().message(), "torch.partition_mb"), refused.error().message());
  }
}

BOOST_AUTO_TEST_CASE(a_parameter_larger_than_the_partition_is_cut_across_buckets_that_alias_it) {
  auto m = make_net();
  const auto before = flat_copy(*m);
  auto bs = adapt::torch_buckets(*m, small_cap_mb, small_partition_mb);
  ASHL_REQUIRE(bs.has_value(), (bs ? "" : bs.error().message()));
  ASHL_REQUIRE(bs->size() == 3u);
  ASHL_TEST(((*bs)[0].names() == std::vector<std::string>{"fc2.bias", "fc2.weight", "fc1.bias"}));
  ASHL_TEST(flat_copy(*m) == before);  // values kept
  float* w = m->fc1->weight.data_ptr<float>();
  for (std::size_t k = 1; k <= 2; ++k) {  // piece k - 1: elements [15 (k - 1), 15 k) of fc1.weight, in place
    const auto& b = (*bs)[k];
    ASHL_TEST((b.names() == std::vector<std::string>{"fc1.weight"}));
    ASHL_TEST((b.pieces() == std::vector<std::pair<std::int64_t, std::int64_t>>{{15 * (k - 1), 15}}));
    ASHL_TEST(b.size() == 15u);
    ASHL_TEST(b.params().data_ptr<float>() == w + 15 * (k - 1));
  }
  ASHL_TEST((*bs)[1].params().data_ptr<float>() == (*bs)[0].params().data_ptr<float>() + 23);  // one flat storage
  (*bs)[2].params().fill_(2.0f);  // through the second piece's bucket
  ASHL_TEST((w[14] != 2.0f && w[15] == 2.0f && w[29] == 2.0f));
  m->forward(torch::randn({4, 6})).sum().backward();
  ASHL_TEST(m->fc1->weight.grad().data_ptr<float>() == (*bs)[1].grads().data_ptr<float>());
  ASHL_TEST(m->fc1->weight.grad().data_ptr<float>() + 15 == (*bs)[2].grads().data_ptr<float>());
}

#if ASHL_HAS_UCX()
// Under ashl-run, bucket b listens at port + b * servers inside the block of
// ports it reserved per server: more buckets than that are refused by name
// before any transport is made (as ashl.torch does).
BOOST_AUTO_TEST_CASE(more_buckets_than_the_ports_ashl_run_reserved_are_refused_by_name) {
  auto m = make_net();
  std::size_t made = 0;
  auto d = adapt::torch_worker<tr::ucx>::create(
      *m, nullptr, {.servers = {"127.0.0.1:1"}},
      [&](std::size_t) {
        ++made;
        return tr::ucx::create({});
      },
      {.update = adapt::torch_update::gradient, .bucket_cap_mb = small_cap_mb, .ports_per_server = 1});
  ASHL_REQUIRE(!d.has_value());
  ASHL_TEST(contains(d.error().message(), "torch_worker.buckets.size = 2: ashl-run reserved ASHL_PORTS_PER_SERVER=1"),
            d.error().message());
  ASHL_TEST(made == 0u);
}
#endif

BOOST_AUTO_TEST_CASE(buckets_go_in_reverse_order_and_alias_the_parameters_and_gradients) {
  auto m = make_net();
  const auto before = flat_copy(*m);
  auto bs = adapt::torch_buckets(*m, small_cap_mb);
  ASHL_REQUIRE(bs.has_value(), (bs ? "" : bs.error().message()));
  ASHL_REQUIRE(bs->size() == 2u);
  ASHL_TEST(((*bs)[0].names() == std::vector<std::string>{"fc2.bias", "fc2.weight", "fc1.bias"}));
  ASHL_TEST(((*bs)[1].names() == std::vector<std::string>{"fc1.weight"}));
  ASHL_TEST(flat_copy(*m) == before);  // values kept
  // fc2.bias opens bucket 0; fc1.bias follows fc2.weight's 15 elements.
  ASHL_TEST(m->fc2->bias.data_ptr<float>() == (*bs)[0].params().data_ptr<float>());
  ASHL_TEST(m->fc1->bias.data_ptr<float>() == (*bs)[0].params().data_ptr<float>() + 18);
  ASHL_TEST(m->fc1->weight.data_ptr<float>() == (*bs)[1].params().data_ptr<float>());
  ASHL_TEST((*bs)[0].host_params().data_ptr() == (*bs)[0].params().data_ptr());  // f32 CPU: no staging
  m->forward(torch::randn({4, 6})).sum().backward();
  ASHL_TEST(m->fc2->bias.grad().data_ptr<float>() == (*bs)[0].grads().data_ptr<float>());
  ASHL_TEST((*bs)[0].grads().data_ptr<float>()[0] == 4.0f);  // d(sum)/d(fc2.bias) over 4 rows
  ASHL_TEST(m->fc1->weight.grad().data_ptr<float>() == (*bs)[1].grads().data_ptr<float>());
}

namespace {

// `iterations` BSP steps over two buckets (gradient: SGD on the servers;
// delta: local SGD steps, model deltas committed); the parameters after
// each, flattened in registration order.
std::vector<std::vector<float>> run_bsp(bool overlap, int iterations,
                                        adapt::torch_update update = adapt::torch_update::gradient,
                                        std::optional<std::string> trace = std::nullopt,
                                        double partition_mb = adapt::default_partition_mb) {
  constexpr double lr = 0.1;
  auto m = make_net();
  auto bs = adapt::torch_buckets(*m, small_cap_mb, partition_mb);
  const std::size_t buckets = partition_mb == small_partition_mb ? 3 : 2;  // fc1.weight cut in two
  ASHL_REQUIRE((bs.has_value() && bs->size() == buckets));
  auto fabric = tr::inproc_fabric::create({});
  auto servers = serve(fabric, *bs, lr, update);
  torch::optim::SGD local(m->parameters(), lr);
  // Pull replies held 5 ms each on the emulated link, so that a wait for
  // one piece of fc1.weight only would find the other in flight.
  auto d = adapt::torch_worker<tr::inproc>::create(
      std::move(*bs), &local,
      {.servers = {"server0"},
       .timeout = 10s,
       .link_hold = [](ps::link_direction dir, std::uint64_t) {
         if (dir == ps::link_direction::down) std::this_thread::sleep_for(5ms);
       }},
      nodes_of(fabric), {.update = update, .overlap = overlap, .trace = std::move(trace)});
  ASHL_REQUIRE(d.has_value(), (d ? "" : d.error().message()));
  ASHL_TEST(d->buckets() == buckets);
  ASHL_TEST(d->overlapped() == overlap);
  std::vector<std::vector<float>> out;
  torch::manual_seed(3);
  for (int it = 0; it < iterations; ++it) {
    auto x = torch::randn({8, 6});
    auto y = torch::randn({8, 3});
    d->zero_grad();
    // Each layer waits for its bucket's pull just before it runs.
    ASHL_REQUIRE(d->wait_for(*m->fc1).ok());
    auto h = torch::tanh(m->fc1->forward(x));
    ASHL_REQUIRE(d->wait_for(*m->fc2).ok());
    torch::mse_loss(m->fc2->forward(h), y).backward();
    if (overlap && update == adapt::torch_update::gradient) {
      // Both buckets were full in backward: committed from the hooks.
      ASHL_REQUIRE(d->wait_bucket_for(m->fc2->weight).ok());
      ASHL_TEST(d->worker(0).telemetry().commits == static_cast<std::uint64_t>(it + 1));
    }
    const auto s = d->step();
    ASHL_REQUIRE(s.ok(), s.message());
    if (overlap) {  // the pulls are in flight: fc1.weight's buckets (1, and 2 when cut) are all waited for
      ASHL_REQUIRE(d->wait_bucket_for(m->fc1->weight).ok());
      for (std::size_t b = 1; b < buckets; ++b) ASHL_TEST(!d->in_flight(b), "bucket " << b);
    }
    ASHL_REQUIRE(d->before_forward().ok());
    out.push_back(flat_copy(*m));
  }
  ASHL_TEST(d->commits() == static_cast<std::uint64_t>(iterations));
  // wait_for looks a layer's buckets up at its first wait: later waits
  // (every forward's) allocate nothing.
  {
    const auto before = counting_new::count();
    bool ok = true;
    for (int k = 0; k < 3; ++k) ok = d->wait_for(*m->fc1).ok() && d->wait_for(*m->fc2).ok() && ok;
    const auto allocations = counting_new::count() - before;
    ASHL_TEST(ok);
    ASHL_TEST(allocations == 0u);
  }
  for (std::size_t b = 0; b < d->buckets(); ++b)
    ASHL_TEST(d->worker(b).telemetry().commits == static_cast<std::uint64_t>(iterations), "bucket " << b);
  for (std::size_t b = 0; b < d->buckets(); ++b)
    for (std::size_t i = 0; i < d->bucket(b).tensors().size(); ++i)
      ASHL_TEST(d->hook_calls(b, i) == static_cast<std::uint64_t>(iterations), d->bucket(b).names()[i]);
  ASHL_TEST(d->leave().ok());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(overlapped_and_serial_bsp_exchanges_give_bit_identical_parameters) {
  constexpr int iterations = 4;
  // The overlapped run also writes its trace (adapt/trace.hpp): every
  // bucket's encode, commit and pull of every iteration, and the compute
  // between steps.
  std::string dir = (std::filesystem::temp_directory_path() / "ashl-torch-trace-XXXXXX").string();
  ASHL_REQUIRE(::mkdtemp(dir.data()) != nullptr);
  const auto overlapped = run_bsp(true, iterations, adapt::torch_update::gradient, dir + "/run.json");
  {
    const auto file = dir + "/run.json.worker0.json";
    std::ifstream in(file);
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::filesystem::remove_all(dir);
    adapt::detail::trace_scanner sc{text};
    ASHL_TEST(sc.trace_events().has_value(), file);
    // Complete events named `name` (of bucket b when b >= 0).
    const auto count = [&](const std::string& name, int b = -1) {
      const std::string head = "{\"name\": \"" + name + "\", \"ph\": \"X\"";
      const std::string arg = "\"args\": {\"bucket\": " + std::to_string(b) + "}}";
      std::size_t n = 0;
      for (auto i = text.find(head); i != std::string::npos; i = text.find(head, i + 1)) {
        // What follows the event's "cat": its args (a bucket) or its end.
        const auto cat = text.find("\"cat\": \"ashl\"", i);
        n += b < 0 || std::string_view(text).substr(cat + 13).starts_with(", " + arg);
      }
      return n;
    };
    for (const char* name : {"encode", "commit", "pull"})
      for (int b = 0; b < 2; ++b)
        ASHL_TEST(count(name, b) == static_cast<std::size_t>(iterations), name << " of bucket " << b);
    ASHL_TEST(count("compute") == static_cast<std::size_t>(iterations - 1));
  }
  const auto serial = run_bsp(false, iterations);
  const auto cut = run_bsp(true, iterations, adapt::torch_update::gradient, std::nullopt, small_partition_mb);
  ASHL_REQUIRE((overlapped.size() == serial.size() && cut.size() == serial.size()));
  // And both are plain SGD on one model (W -= lr * g in f32).
  auto reference = make_net();
  torch::manual_seed(3);
  for (int it = 0; it < iterations; ++it) {
    auto x = torch::randn({8, 6});
    auto y = torch::randn({8, 3});
    reference->zero_grad();
    torch::mse_loss(reference->forward(x), y).backward();
    {
      torch::NoGradGuard g;
      for (auto& p : reference->parameters()) {
        auto w = p.data_ptr<float>();
        auto gr = p.grad().data_ptr<float>();
        for (std::int64_t i = 0; i < p.numel(); ++i) w[i] -= 0.1f * gr[i];
      }
    }
    const auto r = flat_copy(*reference);
    ASHL_REQUIRE((overlapped[it].size() == r.size() && serial[it].size() == r.size()));
    ASHL_TEST(std::memcmp(overlapped[it].data(), serial[it].data(), r.size() * 4) == 0, "iteration " << it);
    ASHL_TEST(std::memcmp(cut[it].data(), serial[it].data(), r.size() * 4) == 0, "iteration " << it);
    ASHL_TEST(std::memcmp(serial[it].data(), r.data(), r.size() * 4) == 0, "iteration " << it);
  }
}

// update::delta commits from step() (the local step comes first), with the
// pulls in flight when it returns: the same parameters as the serial
// exchange, bit for bit.
BOOST_AUTO_TEST_CASE(overlapped_and_serial_delta_exchanges_give_bit_identical_parameters) {
  const auto overlapped = run_bsp(true, 3, adapt::torch_update::delta);
  const auto serial = run_bsp(false, 3, adapt::torch_update::delta);
  ASHL_REQUIRE(overlapped.size() == serial.size());
  for (std::size_t it = 0; it < serial.size(); ++it)
    ASHL_TEST(overlapped[it] == serial[it], "iteration " << it);
  ASHL_TEST(serial.front() != serial.back());  // it trained
}

// A tied parameter (w used twice) owns one slot; with gradient accumulation
// (the first backward under no_sync) each hook fires once per backward, the
// buckets are committed by the second backward's hooks, and the step is W
// minus lr times the accumulated gradient.
BOOST_AUTO_TEST_CASE(hooks_fire_once_per_parameter_and_backward_with_accumulation_and_a_tied_parameter) {
  torch::manual_seed(3);
  auto w = torch::randn({4, 4}).set_requires_grad(true);
  auto bias = torch::randn({4}).set_requires_grad(true);
  auto bs = adapt::torch_buckets({w, bias, w}, {"enc", "bias", "dec"}, 40.0 / (1 << 20));
  ASHL_REQUIRE(bs.has_value(), (bs ? "" : bs.error().message()));
  ASHL_REQUIRE(bs->size() == 2u);
  ASHL_TEST(((*bs)[0].names() == std::vector<std::string>{"bias"}));
  ASHL_TEST(((*bs)[1].names() == std::vector<std::string>{"enc"}));
  auto fabric = tr::inproc_fabric::create({});
  auto servers = serve(fabric, *bs, 0.5);
  auto d = adapt::torch_worker<tr::inproc>::create(std::move(*bs), nullptr, {.servers = {"server0"}, .timeout = 10s},
                                                   nodes_of(fabric), {.update = adapt::torch_update::gradient});
  ASHL_REQUIRE(d.has_value(), (d ? "" : d.error().message()));
  const auto w0 = w.detach().clone(), b0 = bias.detach().clone();
  const auto loss = [&] {
    auto x = torch::randn({2, 4});
    return torch::matmul(torch::matmul(x, w) + bias, w.t()).pow(2).sum();
  };
  d->zero_grad();
  d->no_sync(true);
  loss().backward();
  d->no_sync(false);
  ASHL_TEST(d->hook_calls(1, 0) == 1u);  // w: once, though used twice
  ASHL_TEST(d->hook_calls(0, 0) == 1u);
  ASHL_REQUIRE(d->before_forward().ok());
  ASHL_TEST(d->worker(0).telemetry().commits == 0u);  // nothing committed under no_sync
  ASHL_TEST(d->worker(1).telemetry().commits == 0u);
  loss().backward();
  ASHL_TEST(d->hook_calls(1, 0) == 2u);
  ASHL_TEST(d->hook_calls(0, 0) == 2u);
  ASHL_REQUIRE(d->before_forward().ok());
  ASHL_TEST(d->worker(0).telemetry().commits == 1u);  // committed in the second backward
  ASHL_TEST(d->worker(1).telemetry().commits == 1u);
  const auto expect_w = (w0 - 0.5f * w.grad()).clone();
  const auto expect_b = (b0 - 0.5f * bias.grad()).clone();
  ASHL_REQUIRE(d->step().ok());
  ASHL_REQUIRE(d->before_forward().ok());
  ASHL_TEST(d->commits() == 1u);
  ASHL_TEST(d->worker(0).telemetry().commits == 1u);  // step() committed nothing more
  ASHL_TEST(torch::equal(w.detach(), expect_w));
  ASHL_TEST(torch::equal(bias.detach(), expect_b));
  ASHL_TEST(d->leave().ok());
}

BOOST_AUTO_TEST_CASE(a_bf16_model_trains_on_the_cpu_and_a_non_finite_step_is_skipped) {
  auto m = make_net();
  m->to(torch::kBFloat16);
  auto bs = adapt::torch_buckets(*m, small_cap_mb / 2);  // 2-byte elements: the same two buckets
  ASHL_REQUIRE(bs.has_value(), (bs ? "" : bs.error().message()));
  ASHL_REQUIRE(bs->size() == 2u);
  ASHL_TEST((*bs)[0].dtype() == torch::kBFloat16);
  ASHL_TEST((*bs)[0].staged());
  ASHL_TEST((*bs)[0].host_params().scalar_type() == torch::kFloat);
  ASHL_TEST(m->fc2->bias.data_ptr() == (*bs)[0].params().data_ptr());
  auto fabric = tr::inproc_fabric::create({});
  auto servers = serve(fabric, *bs, 0.2);
  auto d = adapt::torch_worker<tr::inproc>::create(std::move(*bs), nullptr, {.servers = {"server0"}, .timeout = 10s},
                                                   nodes_of(fabric), {.update = adapt::torch_update::gradient});
  ASHL_REQUIRE(d.has_value(), (d ? "" : d.error().message()));
  torch::manual_seed(5);
  const auto x = torch::randn({16, 6}).to(torch::kBFloat16);
  const auto y = (torch::randn({16, 3}) * 0.5).to(torch::kBFloat16);
  float first = 0.0f, last = 0.0f;
  for (int it = 0; it < 12; ++it) {
    d->zero_grad();
    ASHL_REQUIRE(d->before_forward().ok());
    auto loss = (m->forward(x) - y).pow(2).mean();  // libtorch 1.13 has no bf16 mse_loss on the CPU
    (it == 0 ? first : last) = loss.to(torch::kFloat).item<float>();
    loss.backward();
    ASHL_REQUIRE(d->step().ok());
    ASHL_REQUIRE(d->before_forward().ok());
    // The servers' float32 parameters, rounded to bf16, are the model's.
    for (std::size_t b = 0; b < d->buckets(); ++b)
      ASHL_TEST(torch::equal(d->bucket(b).params(), d->bucket(b).host_params().to(torch::kBFloat16)));
  }
  ASHL_TEST(last < first, "loss " << first << " -> " << last);
  ASHL_TEST(d->commits() == 12u);
  ASHL_TEST(d->skipped() == 0u);
  // A step with nan gradients: skipped, nothing committed, nothing moved.
  const auto before = flat_copy(*m);
  d->zero_grad();
  auto bad = x.clone();
  bad[0][0] = std::numeric_limits<float>::quiet_NaN();
  (m->forward(bad) - y).pow(2).mean().backward();
  ASHL_REQUIRE(d->step().ok());
  ASHL_REQUIRE(d->before_forward().ok());
  ASHL_TEST(d->skipped() == 1u);
  ASHL_TEST(d->commits() == 12u);
  ASHL_TEST(d->iterations() == 12u);
  ASHL_TEST(d->worker(0).telemetry().commits == 12u);
  ASHL_TEST(d->worker(1).telemetry().commits == 12u);
  ASHL_TEST(flat_copy(*m) == before);
  // And the next finite step commits again.
  d->zero_grad();
  (m->forward(x) - y).pow(2).mean().backward();
  ASHL_REQUIRE(d->step().ok());
  ASHL_REQUIRE(d->before_forward().ok());
  ASHL_TEST(d->commits() == 13u);
  ASHL_TEST(d->worker(1).telemetry().commits == 13u);
  ASHL_TEST(d->leave().ok());
}
