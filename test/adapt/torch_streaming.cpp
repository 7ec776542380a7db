#include <ashl/adapt/torch_streaming.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/ps/server.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/transport/inproc.hpp>
#if ASHL_HAS_UCX()
#include <ashl/transport/ucx.hpp>
#endif

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include "../support/checks.hpp"
#include "../support/counting_new.hpp"
#include "../support/torch_server.hpp"
#include "../support/torch_testing.hpp"

// adapt/torch_streaming.hpp (docs/torch.md "Streaming fragments (C++)"):
// the fragments are runs of whole parameter tensors and the parameters are
// views into the adapter's flat model; with one real UCX server per
// fragment on 127.0.0.1 and an AdamW inner optimizer, the module's
// parameters after every step equal, bit for bit, an independent hand
// computation of the rule (schedule, outer step or plain averaging on the
// servers, α-merge, all in f32); bad values are refused by name before the
// model is touched; nothing allocates per step in steady state.

namespace adapt = ashl::adapt;
namespace ps = ashl::ps;
namespace tr = ashl::transport;
using namespace std::chrono_literals;

namespace {

using torch_testing::contains;
using torch_testing::flat_copy;
using torch_testing::make_net;
using torch_testing::net;

// The test net's parameter tensors in registration order: fc1.weight (30),
// fc1.bias (5), fc2.weight (15), fc2.bias (3). Three fragments cut at the
// layer boundaries nearest to 1/3 and 2/3 of the 53 elements (17.7: after
// fc1.weight, 30, the first cut possible; 35.3: after fc1.bias, 35).
struct fragment_span {
  std::size_t begin, end;
};
const std::vector<fragment_span> three_fragments{{0, 30}, {30, 35}, {35, 53}};

// Writes `flat` (registration order) into the module's parameters.
void assign(torch::nn::Module& m, const std::vector<float>& flat) {
  torch::NoGradGuard no_grad;
  std::size_t at = 0;
  for (auto& p : m.parameters()) {
    float* d = p.data_ptr<float>();
    for (std::int64_t k = 0; k < p.numel(); ++k) d[k] = flat[at++];
  }
}

// The fragment servers' rule for one worker, by hand (rules/optimizer.hpp's
// documented f32 order): the round's aggregate is acc = 0 + 1·Δ; "diloco":
// g = (−1)·acc + 0·W, v = μv + g, W = W − lr·(g + μv) (outer Nesterov, lr
// 0.7, μ 0.9); "local_sgd": W = W + 1·acc (plain averaging).
struct hand_server {
  bool outer = false;
  std::vector<float> W, v;
  void commit(std::size_t i, float delta) {
    const float acc = 0.0f + 1.0f * delta;
    if (!outer) {
      W[i] += 1.0f * acc;
      return;
    }
    const float g = -1.0f * acc + 0.0f * W[i];
    v[i] = 0.9f * v[i] + g;
    W[i] = W[i] - 0.7f * (g + 0.9f * v[i]);
  }
};

#if ASHL_HAS_UCX()
const std::string token = "test-token-0123456789";

// One ps::server over UCX listening on 127.0.0.1 (an ephemeral port), for
// one worker, starting from `initial`, run on its own thread until destroyed.
struct ucx_server_thread {
  std::atomic<bool> stop{false};
  std::thread th;
  std::string address;
  ucx_server_thread(std::vector<float> initial, const std::string& policy, std::uint32_t h) {
    using server = ps::server<tr::ucx>;
    ps::policy_params pp;
    pp.workers = 1;
    pp.local_steps = h;
    auto pol = ps::make_policy(policy, pp);
    ASHL_REQUIRE(pol.has_value(), (pol ? "" : pol.error().message()));
    auto opt = ps::outer_optimizer_of(policy, pp);
    ASHL_REQUIRE(opt.has_value(), (opt ? "" : opt.error().message()));
    auto layout = ps::shard_layout::even(initial.size(), 1);
    ASHL_REQUIRE(layout.has_value());
    auto t = tr::ucx::create({.listen = "127.0.0.1:0", .token = token});
    ASHL_REQUIRE(t.has_value(), (t ? "" : t.error().message()));
    auto srv = server::create(
        {.core = {.layout = *layout, .workers = 1, .optimizer = *opt}, .compression = ashl::codec_id::identity},
        std::move(*pol), std::move(*t), initial);
    ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
    address = srv->transport().listen_address();
    th = std::thread([this, s = std::make_shared<server>(std::move(*srv))] { s->run(stop); });
  }
  ~ucx_server_thread() {
    stop = true;
    th.join();
  }
};

struct streaming_case {
  std::string policy;  // the fragment servers': "diloco" or "local_sgd"
  ps::streaming_params sp;
  std::uint64_t steps = 0;
};

// One worker with an AdamW inner optimizer, one UCX server per fragment;
// a reference module takes the same AdamW steps and the rule by hand. The
// parameters are compared after every step and after finish().
void run_against_the_hand_computation(const streaming_case& c) {
  const auto& sp = c.sp;
  ASHL_REQUIRE(sp.fragments == three_fragments.size());
  auto m = make_net(), ref = make_net();
  const std::vector<float> initial = flat_copy(*m);
  std::vector<std::unique_ptr<ucx_server_thread>> servers;
  std::vector<ps::worker_params> wp;
  for (const auto& f : three_fragments) {
    servers.push_back(std::make_unique<ucx_server_thread>(
        std::vector<float>(initial.begin() + static_cast<std::ptrdiff_t>(f.begin),
                           initial.begin() + static_cast<std::ptrdiff_t>(f.end)),
        c.policy, sp.interval));
    wp.push_back({.servers = {servers.back()->address}, .timeout = 20s});
  }
  torch::optim::AdamW inner(m->parameters(), torch::optim::AdamWOptions(0.01));
  torch::optim::AdamW inner_ref(ref->parameters(), torch::optim::AdamWOptions(0.01));
  auto sd = adapt::torch_streaming_worker<tr::ucx>::create(*m, &inner, sp, std::move(wp), [](std::size_t) {
    return tr::ucx::create({.token = token});
  });
  ASHL_REQUIRE(sd.has_value(), (sd ? "" : sd.error().message()));

  // The split: whole tensors, and the parameters are views into the flat model.
  ASHL_TEST((sd->fragment_sizes() == std::vector<std::uint64_t>{30, 5, 18}));
  ASHL_TEST((sd->layers(0) == std::pair<std::size_t, std::size_t>{0, 1}));
  ASHL_TEST((sd->layers(2) == std::pair<std::size_t, std::size_t>{2, 4}));
  ASHL_TEST((sd->names() == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  for (std::uint32_t p = 0; p < sp.fragments; ++p)
    ASHL_TEST((sd->range(p) == ps::key_range{three_fragments[p].begin, three_fragments[p].end}), "fragment " << p);
  const float* flat = sd->flat().data_ptr<float>();
  ASHL_TEST(m->fc1->weight.data_ptr<float>() == flat);
  ASHL_TEST(m->fc2->bias.data_ptr<float>() == flat + 50);
  ASHL_TEST(flat_copy(*m) == initial);  // the join pulled the servers' values: the model's own

  // The rule by hand: fragment p syncs after t = o_p + kH (k >= 1, o_p =
  // ⌊pH/P⌋), its delta local − reference; its servers' value is merged
  // after step t + τ: local = α·local + (1 − α)·W (α = 0: W), reference = W.
  const std::uint32_t P = sp.fragments, H = sp.interval;
  std::vector<hand_server> hs(P);
  std::vector<float> R = initial;  // references, fragment p at its span
  std::vector<std::optional<std::uint64_t>> due(P);
  for (std::uint32_t p = 0; p < P; ++p) {
    const auto& f = three_fragments[p];
    hs[p].outer = c.policy == "diloco";
    hs[p].W.assign(initial.begin() + static_cast<std::ptrdiff_t>(f.begin),
                   initial.begin() + static_cast<std::ptrdiff_t>(f.end));
    hs[p].v.assign(f.end - f.begin, 0.0f);
  }
  const float a = static_cast<float>(sp.alpha), b = static_cast<float>(1.0 - sp.alpha);
  std::size_t merges = 0, moved = 0, syncs = 0;
  auto merge = [&](std::vector<float>& L, std::uint32_t p) {
    const auto& f = three_fragments[p];
    for (std::size_t i = f.begin; i < f.end; ++i) {
      const float w = hs[p].W[i - f.begin];
      const float merged = sp.alpha == 0.0 ? w : a * L[i] + b * w;
      moved += merged != L[i] ? 1 : 0;
      L[i] = merged;
      R[i] = w;
    }
    due[p].reset();
    ++merges;
  };

  torch::manual_seed(5);
  for (std::uint64_t t = 1; t <= c.steps; ++t) {
    const auto x = torch::randn({8, 6});
    sd->zero_grad();
    m->forward(x).pow(2).mean().backward();
    const auto s = sd->step();
    ASHL_REQUIRE(s.ok(), "step " << t << ": " << s.message());

    inner_ref.zero_grad();
    ref->forward(x).pow(2).mean().backward();
    inner_ref.step();
    std::vector<float> L = flat_copy(*ref);
    for (std::uint32_t p = 0; p < P; ++p) {
      const std::uint64_t o = std::uint64_t{p} * H / P;
      if (t < H + o || (t - o) % H != 0) continue;
      const auto& f = three_fragments[p];
      for (std::size_t i = f.begin; i < f.end; ++i) hs[p].commit(i - f.begin, L[i] - R[i]);
      due[p] = t + sp.delay;
      ++syncs;
    }
    for (std::uint32_t p = 0; p < P; ++p)
      if (due[p] && *due[p] == t) merge(L, p);
    assign(*ref, L);

    const auto got = flat_copy(*m);
    ASHL_REQUIRE(got.size() == L.size());
    ASHL_TEST(std::memcmp(got.data(), L.data(), L.size() * 4) == 0, "after step " << t);
  }
  ASHL_TEST(sd->steps() == c.steps);
  ASHL_TEST(sd->syncs() == syncs);
  ASHL_REQUIRE(sd->finish().ok());
  std::vector<float> L = flat_copy(*ref);
  for (std::uint32_t p = 0; p < P; ++p)
    if (due[p]) merge(L, p);
  const auto got = flat_copy(*m);
  ASHL_TEST(std::memcmp(got.data(), L.data(), L.size() * 4) == 0, "after finish()");
  ASHL_TEST(merges == syncs);
  ASHL_TEST(moved > 0u);  // the merges changed the model: not the inner steps alone
  for (std::uint32_t p = 0; p < P; ++p) ASHL_TEST(sd->worker(p).telemetry().commits > 0u, "fragment " << p);
  ASHL_TEST(sd->leave().ok());
}
#endif

}  // namespace

#if ASHL_HAS_UCX()
// Streaming DiLoCo proper: DiLoCo's outer Nesterov per fragment, τ = 2
// (every merge lands two inner steps after its sync, while the other
// fragments compute and sync), α = 1/2. 23 steps: fragments 0, 1, 2 sync
// after steps 6/12/18, 8/14/20, 10/16/22; the last merges in finish().
BOOST_AUTO_TEST_CASE(streaming_diloco_over_ucx_fragment_servers_equals_the_rule_by_hand) {
  run_against_the_hand_computation(
      {.policy = "diloco", .sp = {.fragments = 3, .interval = 6, .delay = 2, .alpha = 0.5}, .steps = 23});
}

// Plain averaging (Local SGD servers, model deltas), τ = 0 (each merge
// right after its own sync) and α = 0 (the servers' value replaces the
// fragment): Local SGD(H) per fragment on staggered schedules.
BOOST_AUTO_TEST_CASE(plain_averaging_without_delay_over_ucx_equals_the_rule_by_hand) {
  run_against_the_hand_computation(
      {.policy = "local_sgd", .sp = {.fragments = 3, .interval = 3, .delay = 0, .alpha = 0.0}, .steps = 10});
}
#endif

BOOST_AUTO_TEST_CASE(bad_values_are_refused_by_name_before_the_model_is_touched) {
  auto fails = [](torch::nn::Module& m, torch::optim::Optimizer* inner, const ps::streaming_params& sp,
                  std::size_t fragment_params, const std::string& expect) {
    const void* before = m.parameters()[0].data_ptr();
    std::size_t made = 0;
    auto fabric = tr::inproc_fabric::create({});
    auto sd = adapt::torch_streaming_worker<tr::inproc>::create(
        m, inner, sp, std::vector<ps::worker_params>(fragment_params, ps::worker_params{.servers = {"nowhere"}}),
        [&](std::size_t) {
          ++made;
          return fabric->node();
        });
    ASHL_REQUIRE(!sd.has_value(), expect);
    ASHL_TEST(contains(sd.error().message(), expect), sd.error().message());
    ASHL_TEST(made == 0u);                              // refused before any transport
    ASHL_TEST(m.parameters()[0].data_ptr() == before);  // and before the parameters became views
  };
  auto m = make_net();
  torch::optim::SGD inner(m->parameters(), 0.1);
  fails(*m, &inner, {.fragments = 0, .interval = 4}, 0, "streaming.fragments = 0: must be >= 1");
  fails(*m, &inner, {.fragments = 5, .interval = 8}, 5,
        "streaming.fragments = 5: must be <= the number of layers (4)");
  fails(*m, &inner, {.fragments = 3, .interval = 2}, 3, "streaming.fragments = 3: must be <= streaming.interval (H = 2)");
  fails(*m, &inner, {.fragments = 2, .interval = 4, .delay = 4}, 2, "streaming.delay = 4: must be < streaming.interval");
  fails(*m, &inner, {.fragments = 2, .interval = 4, .alpha = 1.5}, 2, "streaming.alpha = 1.5: must be in [0, 1]");
  fails(*m, &inner, {.fragments = 2, .interval = 4, .alpha = -0.25}, 2, "streaming.alpha = -0.25");
  fails(*m, &inner, {.fragments = 2, .interval = 4, .alpha = std::numeric_limits<double>::quiet_NaN()}, 2,
        "streaming.alpha = nan");
  fails(*m, nullptr, {.fragments = 2, .interval = 4}, 2, "torch_streaming_worker.inner = \"null\"");
  fails(*m, &inner, {.fragments = 2, .interval = 4}, 3, "torch_streaming_worker.fragments = 3");
  {
    auto h = make_net();
    h->fc2->to(torch::kHalf);
    torch::optim::SGD hi(h->parameters(), 0.1);
    fails(*h, &hi, {.fragments = 2, .interval = 4}, 2,
          "torch.parameter[fc2.weight].dtype = \"Half\": must be float32");
  }
  {
    // Not on the CPU (Debian's libtorch has no CUDA: the meta device stands in).
    auto w = torch::empty({3, 2}, torch::TensorOptions().device(torch::kMeta)).set_requires_grad(true);
    auto c = torch::zeros({2}).set_requires_grad(true);
    torch::optim::SGD mi(std::vector<torch::Tensor>{c, w}, 0.1);
    std::size_t made = 0;
    auto fabric = tr::inproc_fabric::create({});
    auto sd = adapt::torch_streaming_worker<tr::inproc>::create(
        {c, w}, &mi, {.fragments = 1, .interval = 2}, std::vector<ps::worker_params>(1), [&](std::size_t) {
          ++made;
          return fabric->node();
        },
        {"c", "w"});
    ASHL_REQUIRE(!sd.has_value());
    ASHL_TEST(contains(sd.error().message(), "torch.parameter[w].device = \"meta\": must be the CPU"),
              sd.error().message());
    ASHL_TEST(made == 0u);
  }
  {
    auto t = torch::randn({4, 3}).t().set_requires_grad(true);  // strides (1, 3)
    torch::optim::SGD ti(std::vector<torch::Tensor>{t}, 0.1);
    auto fabric = tr::inproc_fabric::create({});
    auto sd = adapt::torch_streaming_worker<tr::inproc>::create(
        {t}, &ti, {.fragments = 1, .interval = 2}, std::vector<ps::worker_params>(1),
        [&](std::size_t) { return fabric->node(); }, {"t"});
    ASHL_REQUIRE(!sd.has_value());
    ASHL_TEST(contains(sd.error().message(), "torch.parameter[t].stride = \"(1, 3)\": must be contiguous"),
              sd.error().message());
  }
  // The fragment sizes a server process needs, by the same split (and the
  // same refusal).
  auto sizes = adapt::torch_fragment_sizes(*m, 2);
  ASHL_REQUIRE(sizes.has_value());
  ASHL_TEST((*sizes == std::vector<std::uint64_t>{30, 23}));
  auto too_many = adapt::torch_fragment_sizes(*m, 5);
  ASHL_REQUIRE(!too_many.has_value());
  ASHL_TEST(contains(too_many.error().message(), "streaming.fragments = 5"), too_many.error().message());
}

namespace {
// An inner optimizer that allocates nothing: each step adds 2^-6 to every
// parameter in place (libtorch's own optimizers make temporaries).
struct add_step : torch::optim::Optimizer {
  explicit add_step(std::vector<torch::Tensor> params)
      : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                                std::make_unique<torch::optim::SGDOptions>(0.1)) {}
  torch::Tensor step(LossClosure) override {
    for (auto& p : param_groups()[0].params()) {
      float* d = p.data_ptr<float>();
      for (std::int64_t k = 0; k < p.numel(); ++k) d[k] += 1.0f / 64.0f;
    }
    return {};
  }
};
}  // namespace

// Steady state allocates nothing in the process: one worker, two fragment
// servers polled from this thread over a deterministic in-process fabric
// (test/ps/streaming_worker.cpp's setting), τ = 2 so that every reply has
// landed by its merge.
BOOST_AUTO_TEST_CASE(nothing_allocates_per_step_in_steady_state) {
  const ps::streaming_params sp{.fragments = 2, .interval = 4, .delay = 2, .alpha = 0.5};
  auto m = make_net();
  auto sizes = adapt::torch_fragment_sizes(*m, sp.fragments);
  ASHL_REQUIRE(sizes.has_value());
  auto fabric = tr::inproc_fabric::create({.eager_bytes = 256, .deterministic = true});
  std::vector<ps::server<tr::inproc>> servers;
  for (std::uint32_t p = 0; p < sp.fragments; ++p) {
    auto node = fabric->node("fragment" + std::to_string(p));
    ASHL_REQUIRE(node.has_value());
    auto layout = ps::shard_layout::even((*sizes)[p], 1);
    ps::policy_params pp;
    pp.workers = 1;
    pp.local_steps = sp.interval;
    auto pol = ps::make_policy("local_sgd", pp);
    ASHL_REQUIRE(pol.has_value());
    auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = 1}}, std::move(*pol),
                                              std::move(*node));
    ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
    servers.push_back(std::move(*srv));
  }
  add_step inner(m->parameters());
  std::optional<adapt::torch_streaming_worker<tr::inproc>> sd;
  {
    std::atomic<bool> stop{false};
    std::vector<std::thread> th;
    for (auto& srv : servers) th.emplace_back([&] { srv.run(stop); });
    std::vector<ps::worker_params> wp;
    for (std::uint32_t p = 0; p < sp.fragments; ++p)
      wp.push_back({.servers = {"fragment" + std::to_string(p)}, .timeout = 20s});
    auto made = adapt::torch_streaming_worker<tr::inproc>::create(*m, &inner, sp, std::move(wp),
                                                                  [&](std::size_t) { return fabric->node(); });
    stop = true;
    for (auto& t : th) t.join();
    ASHL_REQUIRE(made.has_value(), (made ? "" : made.error().message()));
    sd.emplace(std::move(*made));
  }
  auto steps = [&](int count) {
    for (int c = 0; c < count; ++c) {
      if (!sd->step().ok()) return false;
      for (int spins = 0; spins < 64; ++spins)
        for (auto& srv : servers) srv.poll();
    }
    return true;
  };
  ASHL_REQUIRE(steps(12));  // warm-up: every fragment synced and merged twice
  const std::size_t before = counting_new::count();
  const bool ok = steps(40);
  const std::size_t after = counting_new::count();
  ASHL_REQUIRE(ok);
  ASHL_TEST(after == before, "allocations in steady state: " << after - before);
  ASHL_TEST(sd->syncs() == (52u - 4u) / 2u + 1u);  // syncs after steps 4, 6, ..., 52
  ASHL_TEST(m->fc1->weight.data_ptr<float>() == sd->flat().data_ptr<float>());
}
