#include <ashl/coll/driver.hpp>
#include <boost/test/unit_test.hpp>

#include <ashl/coll/inproc.hpp>
#include <ashl/sync/asp.hpp>
#include <ashl/sync/bsp.hpp>
#include <ashl/sync/dlb.hpp>
#include <ashl/sync/local_sgd.hpp>
#include <ashl/sync/semi_async.hpp>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

// The collective drivers over the in-process model: the sync policies decide
// when and with which weights; values are checked exactly (dyadic weights).

#include "../support/on_ranks.hpp"
#include "../support/checks.hpp"

using namespace ashl;
using ashl_test::on_ranks;
using namespace ashl::coll;

BOOST_AUTO_TEST_CASE(bsp_averages_gradients_every_step) {
  on_ranks(4, [](inproc& c) {
    auto d = sync_driver<inproc, sync::bsp>::create(c, sync::bsp{{.workers = 4}});
    ASHL_REQUIRE(d.has_value());
    for (int step = 1; step <= 3; ++step) {
      std::vector<float> g = {float(c.rank() + step), -float(c.rank())};
      auto r = d->reduce_gradients(g, {.samples = 8});
      ASHL_REQUIRE(r.has_value());
      ASHL_TEST(*r);
      ASHL_TEST(g[0] == 1.5f + float(step));  // mean of step..step+3
      ASHL_TEST(g[1] == -1.5f);
      std::vector<float> w = {1.f};
      ASHL_TEST(!*d->sync_models(w));
    }
    ASHL_TEST(d->rounds() == 3u);
  });
}

BOOST_AUTO_TEST_CASE(dlb_weights_by_samples_and_replans_batches_from_speeds) {
  on_ranks(4, [](inproc& c) {
    auto d = sync_driver<inproc, sync::dlb>::create(c, sync::dlb{{.workers = 4, .total_batch = 64, .min_batch = 1}});
    ASHL_REQUIRE(d.has_value());
    const double samples[4] = {8, 8, 16, 32};  // Σ 64: weights 1/8 1/8 1/4 1/2
    std::vector<float> g = {float(c.rank() + 1)};
    // every rank takes 0.1 s for its samples: speeds 80 80 160 320 samples/s
    auto r = d->reduce_gradients(g, {.samples = samples[c.rank()], .compute_seconds = 0.1, .time = 1.0});
    ASHL_REQUIRE(r.has_value());
    ASHL_TEST(*r);
    ASHL_TEST(g[0] == 1.f / 8 + 2.f / 8 + 3.f / 4 + 4.f / 2);
    const double expect[4] = {0.125, 0.125, 0.25, 0.5};
    for (int j = 0; j < 4; ++j) ASHL_TEST(d->weights()[std::size_t(j)] == expect[j]);
    // the plan follows the measured speeds: b = 64·v/Σv = 8 8 16 32
    ASHL_TEST(d->plan().batch_size == std::uint32_t(samples[c.rank()]));
  });
}

BOOST_AUTO_TEST_CASE(local_sgd_averages_models_every_h_steps) {
  on_ranks(2, [](inproc& c) {
    auto d = sync_driver<inproc, sync::local_sgd>::create(c, sync::local_sgd{{.workers = 2, .local_steps = 3}});
    ASHL_REQUIRE(d.has_value());
    std::vector<float> w = {0.f};
    for (int step = 1; step <= 6; ++step) {
      std::vector<float> g = {float(c.rank() + 1)};
      auto r = d->reduce_gradients(g, {});
      ASHL_REQUIRE(r.has_value());
      ASHL_TEST(!*r);
      ASHL_TEST(g[0] == float(c.rank() + 1));  // untouched
      w[0] += g[0];                              // the local step
      auto s = d->sync_models(w);
      ASHL_REQUIRE(s.has_value());
      ASHL_TEST(*s == (step % 3 == 0));
      if (step == 3) ASHL_TEST(w[0] == 4.5f);  // (3 + 6) / 2
      if (step == 6) ASHL_TEST(w[0] == 9.0f);  // 4.5 + (3 + 6) / 2
    }
  });
}

BOOST_AUTO_TEST_CASE(semi_async_averages_at_the_barrier_only) {
  on_ranks(4, [](inproc& c) {
    auto d = sync_driver<inproc, sync::semi_async>::create(c, sync::semi_async{{.workers = 4, .sync_every_iterations = 2}});
    ASHL_REQUIRE(d.has_value());
    std::vector<float> w = {float(c.rank())};
    int syncs = 0;
    for (int step = 1; step <= 4; ++step) {
      std::vector<float> g = {0.f};
      ASHL_REQUIRE(d->reduce_gradients(g, {.time = double(step)}).has_value());
      w[0] += 2.f * float(c.rank());
      auto s = d->sync_models(w);
      ASHL_REQUIRE(s.has_value());
      syncs += *s ? 1 : 0;
      ASHL_TEST(*s == (step % 2 == 0));
      if (step == 2) ASHL_TEST(w[0] == 7.5f);  // mean of 5r over r = 0..3
    }
    ASHL_TEST(syncs == 2);
  });
}

BOOST_AUTO_TEST_CASE(asynchronous_policies_are_refused) {
  inproc_group g(1);
  inproc c = g.communicator(0);
  auto d = sync_driver<inproc, sync::asp>::create(c, sync::asp{{.workers = 1}});
  ASHL_REQUIRE(!d.has_value());
  ASHL_TEST(d.error().message().find("sync_driver.policy.stage = \"asp\"") != std::string::npos, d.error().message());
}

BOOST_AUTO_TEST_CASE(bsp_with_a_16_bit_exchange) {
  on_ranks(2, [](inproc& c) {
    auto d = sync_driver<inproc, sync::bsp>::create(c, sync::bsp{{.workers = 2}}, dense_exchange{dtype::bf16});
    ASHL_REQUIRE(d.has_value());
    std::vector<float> g = {float(c.rank()) * 4.f, 1.f + 1.f / 1024};  // 1 + 2^-10 is not a bf16
    ASHL_REQUIRE(*d->reduce_gradients(g, {}));
    ASHL_TEST(g[0] == 2.f);
    ASHL_TEST(g[1] == 1.f);  // rounded to bf16 before the sum
  });
}

// Issue 25: a commit's samples are those of all its H steps (a samples-
// weighted round), not the last step's. Rank 0 runs 24, 4, 4 samples and
// rank 1 runs 8, 8, 16: both 32 over the cycle, so the round weighs them
// equally (the last step alone would have weighed them 4 : 16).
BOOST_AUTO_TEST_CASE(a_commit_counts_the_samples_of_all_its_steps) {
  on_ranks(2, [](inproc& c) {
    auto d = sync_driver<inproc, sync::local_sgd>::create(
        c, sync::local_sgd{{.workers = 2, .local_steps = 3, .weighting = sync::round_weighting::samples}});
    ASHL_REQUIRE(d.has_value());
    const double samples[2][3] = {{24, 4, 4}, {8, 8, 16}};
    std::vector<float> w = {float(4 * c.rank())};
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g = {0.f};
      ASHL_REQUIRE(d->reduce_gradients(g, {.samples = samples[c.rank()][step]}).has_value());
    }
    auto s = d->sync_models(w);
    ASHL_REQUIRE(s.has_value());
    ASHL_TEST(*s);
    ASHL_TEST(d->weights()[0] == 0.5);
    ASHL_TEST(d->weights()[1] == 0.5);
    ASHL_TEST(w[0] == 2.f);  // (0 + 4) / 2
  });
}

namespace {
// local_sgd whose plan commits by interval (H = 0, 250 ms), as ADSP-style
// plans do: the collective driver must follow the interval, not commit
// every step.
struct interval_local_sgd : sync::local_sgd {
  using sync::local_sgd::local_sgd;
  [[nodiscard]] worker_plan plan(sync::worker_id w) const {
    worker_plan p = sync::local_sgd::plan(w);
    p.local_iterations = 0;
    p.commit_interval_us = 250'000;
    return p;
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(interval_plans_commit_when_the_interval_has_passed) {
  on_ranks(2, [](inproc& c) {
    auto d = sync_driver<inproc, interval_local_sgd>::create(c, interval_local_sgd{{.workers = 2}});
    ASHL_REQUIRE(d.has_value());
    std::vector<float> w = {float(c.rank())};
    std::vector<int> synced;
    // Steps of 0.1 s from t = 0: the first cycle starts at 0 (the first step's
    // own compute time before 0.1), so commits at 0.3 s and then 0.6 s.
    for (int step = 1; step <= 6; ++step) {
      std::vector<float> g = {0.f};
      ASHL_REQUIRE(d->reduce_gradients(g, {.samples = 1, .compute_seconds = 0.1, .time = 0.1 * step}).has_value());
      auto s = d->sync_models(w);
      ASHL_REQUIRE(s.has_value());
      if (*s) synced.push_back(step);
    }
    ASHL_TEST(synced == (std::vector<int>{3, 6}));
    ASHL_TEST(w[0] == 0.5f);
  });
}

// ---- plan_exchange: each rank's plan picks its codec (docs/coll.md) ----

namespace {
// BSP whose rank 0 keeps half of its update (top-k, error feedback) while
// `compressing` is set; the other ranks send densely.
struct half_on_rank0_bsp : sync::bsp {
  using sync::bsp::bsp;
  std::shared_ptr<bool> compressing = std::make_shared<bool>(true);
  worker_plan plan(sync::worker_id w) const {
    worker_plan p = sync::bsp::plan(w);
    if (w == 0 && *compressing) p.compression_ratio = 0.5f;
    return p;
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(plan_exchange_encodes_by_each_ranks_plan_and_pays_the_residual_off) {
  on_ranks(2, [](inproc& c) {
    // Every rank holds its own policy object; the flag is per rank and both
    // ranks flip it at the same step, as a policy's plan would change.
    half_on_rank0_bsp policy{{.workers = 2}};
    auto d = sync_driver<inproc, half_on_rank0_bsp, plan_exchange>::create(c, policy, plan_exchange({.seed = 3}));
    ASHL_REQUIRE(d.has_value(), d.error().message());
    // Round 1: rank 0 top-k 50 % of {4, -1, 0.5, 3} = {4, 0, 0, 3}, owing {0, -1, 0.5, 0}; rank 1 dense.
    std::vector<float> g = c.rank() == 0 ? std::vector<float>{4.f, -1.f, 0.5f, 3.f} : std::vector<float>{1.f, 1.f, 1.f, 1.f};
    auto r = d->reduce_gradients(g, {.samples = 8});
    ASHL_REQUIRE(r.has_value(), r.error().message());
    ASHL_TEST(*r);
    ASHL_TEST(g == (std::vector<float>{2.5f, 0.5f, 0.5f, 2.f}));  // ½(4,0,0,3) + ½(1,1,1,1)
    ASHL_TEST((d->exchange().encoder().codec() == (c.rank() == 0 ? codec_id::topk : codec_id::identity)));
    if (c.rank() == 0) {
      const auto e = d->exchange().encoder().residual(0);
      ASHL_TEST((std::vector<float>(e.begin(), e.end()) == std::vector<float>{0.f, -1.f, 0.5f, 0.f}));
      ASHL_TEST(d->exchange().last_payload_bytes() < 4 * sizeof(float) + 16);  // two pairs and a count
    } else {
      ASHL_TEST(d->exchange().last_payload_bytes() == 4 * sizeof(float));
    }
    // Round 2: nobody compresses: one allreduce, and rank 0 sends its update plus what it owed.
    *d->policy().compressing = false;
    g = c.rank() == 0 ? std::vector<float>{0.f, 0.f, 0.f, 0.f} : std::vector<float>{1.f, 1.f, 1.f, 1.f};
    r = d->reduce_gradients(g, {.samples = 8});
    ASHL_REQUIRE(r.has_value(), r.error().message());
    ASHL_TEST(g == (std::vector<float>{0.5f, 0.f, 0.75f, 0.5f}));  // ½(0,-1,0.5,0) + ½(1,1,1,1)
    ASHL_TEST(!d->exchange().encoder().owes());
    ASHL_TEST(d->exchange().last_gathered_bytes() == 0u);  // the allreduce path
  });
}

BOOST_AUTO_TEST_CASE(plan_exchange_matches_the_dense_exchange_when_no_plan_compresses) {
  on_ranks(4, [](inproc& c) {
    auto a = sync_driver<inproc, sync::bsp, plan_exchange>::create(c, sync::bsp{{.workers = 4}});
    auto b = sync_driver<inproc, sync::bsp>::create(c, sync::bsp{{.workers = 4}});
    ASHL_REQUIRE((a.has_value() && b.has_value()));
    for (int step = 1; step <= 3; ++step) {
      std::vector<float> g = {float(c.rank() * step) / 8.f, -float(c.rank() + step)};
      std::vector<float> h = g;
      ASHL_REQUIRE(a->reduce_gradients(g, {.samples = 8}).has_value());
      ASHL_REQUIRE(b->reduce_gradients(h, {.samples = 8}).has_value());
      ASHL_TEST(g == h);
    }
  });
}

BOOST_AUTO_TEST_CASE(plan_exchange_refuses_an_exchange_before_any_plan_and_names_a_bad_plan) {
  on_ranks(2, [](inproc& c) {
    plan_exchange x;
    std::vector<float> g = {1.f};
    const std::vector<double> w = {0.5, 0.5};
    auto s = x(c, host_view<float>(g.data(), g.size()), w);
    ASHL_TEST(!s.ok());
    ASHL_TEST(s.message().find("adopt()") != std::string::npos, s.message());
    std::vector<worker_plan> plans(2);
    plans[1].compression_ratio = 1.5f;
    s = x.adopt(plans, c.rank());
    ASHL_TEST(!s.ok());
    ASHL_TEST(s.message().find("plan_exchange.plans[1].compression_ratio") != std::string::npos, s.message());
  });
}

// DiLoCo over collectives: the round exchanges the deltas from W and every
// rank takes the same outer Nesterov step on their weighted sum, recomputed
// here in the documented f32 order (deltas are dyadic: the sum is exact).
BOOST_AUTO_TEST_CASE(local_sgd_with_the_outer_optimizer_steps_on_the_mean_delta) {
  on_ranks(2, [](inproc& c) {
    auto d = sync_driver<inproc, sync::local_sgd>::create(c, sync::local_sgd{{.workers = 2, .local_steps = 2}});
    ASHL_REQUIRE(d.has_value());
    const ps::optimizer_params o{
        .mode = ps::optimizer_params::kind::outer, .lr = 0.7, .momentum = 0.9, .nesterov = true};
    std::vector<float> w = {1.0f, -2.0f};
    ASHL_REQUIRE(d->use_outer_optimizer(o, w).ok());
    std::vector<float> W = w, v(2, 0.0f);
    for (int step = 1; step <= 6; ++step) {
      std::vector<float> g = {0.25f * float(c.rank() + 1), -0.5f};
      ASHL_REQUIRE(d->reduce_gradients(g, {}).has_value());
      w[0] += g[0];  // the local step
      w[1] += g[1] * float(c.rank() + 1);
      auto s = d->sync_models(w);
      ASHL_REQUIRE(s.has_value());
      ASHL_TEST(*s == (step % 2 == 0));
      if (step % 2 != 0) continue;
      // Rank r's delta over the round: (0.5 (r + 1), -(r + 1)); mean at weight 1/2.
      const float mean[2] = {0.5f * 0.5f + 0.5f * 1.0f, 0.5f * -1.0f + 0.5f * -2.0f};
      for (int i = 0; i < 2; ++i) {
        const float gi = -1.0f * mean[i] + 0.0f * W[i];
        v[i] = 0.9f * v[i] + gi;
        W[i] = W[i] - 0.7f * (gi + 0.9f * v[i]);
      }
      ASHL_TEST(w[0] == W[0]);
      ASHL_TEST(w[1] == W[1]);
    }
    ASHL_TEST(d->outer_optimizer()->outer_steps() == 3u);
  });
}

BOOST_AUTO_TEST_CASE(the_outer_optimizer_is_refused_for_gradient_policies) {
  on_ranks(1, [](inproc& c) {
    auto d = sync_driver<inproc, sync::bsp>::create(c, sync::bsp{{.workers = 1}});
    ASHL_REQUIRE(d.has_value());
    const std::vector<float> w = {0.0f};
    const auto s = d->use_outer_optimizer({.mode = ps::optimizer_params::kind::outer, .lr = 0.7}, w);
    ASHL_TEST(!s.ok());
    ASHL_TEST(s.message() == "sync_driver.outer_optimizer = \"bsp\": an outer optimizer steps on model deltas: "
                             "local_sgd or semi_async");
  });
}
