#include <ashl/rules/optimizer.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace ps = ashl::ps;
using kind = ps::optimizer_params::kind;

namespace {
bool same_bits(const std::vector<float>& a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}
}  // namespace

BOOST_AUTO_TEST_CASE(model_delta_adds_the_scaled_aggregate_and_zeroes_it) {
  auto o = ps::optimizer::create({}, 3);
  BOOST_REQUIRE(o.has_value());
  BOOST_TEST(o->adds_deltas());
  std::vector<float> w{1.0f, 2.0f, 3.0f}, acc{0.5f, -1.0f, 0.25f};
  o->step(w, acc, 2.0f);
  BOOST_TEST(same_bits({2.0f, 0.0f, 3.5f}, w));
  BOOST_TEST(same_bits({0.0f, 0.0f, 0.0f}, acc));
  BOOST_TEST(o->velocity().empty());
}

BOOST_AUTO_TEST_CASE(sgd_steps_match_the_formula_bit_exactly) {
  for (double mu : {0.0, 0.9})
    for (bool nesterov : {false, true}) {
      if (nesterov && mu == 0.0) continue;
      const ps::optimizer_params p{.mode = kind::sgd, .lr = 0.1, .momentum = mu, .weight_decay = 0.01, .nesterov = nesterov};
      auto o = ps::optimizer::create(p, 4);
      BOOST_REQUIRE(o.has_value());
      std::vector<float> w{0.3f, -0.2f, 1.5f, 0.0f}, v(4, 0.0f), W = w;
      for (int k = 0; k < 3; ++k) {
        std::vector<float> acc{0.1f * k, -0.3f, 0.7f, 2.0f}, a = acc;
        o->step(w, acc, 0.5f);
        for (int i = 0; i < 4; ++i) {
          const float g = 0.5f * a[i] + 0.01f * W[i];
          if (mu == 0.0) {
            W[i] -= 0.1f * g;
          } else {
            v[i] = 0.9f * v[i] + g;
            W[i] -= 0.1f * (nesterov ? g + 0.9f * v[i] : v[i]);
          }
        }
        BOOST_TEST(same_bits(W, w));
        BOOST_TEST(same_bits({0.0f, 0.0f, 0.0f, 0.0f}, acc));
      }
      if (mu > 0.0) BOOST_TEST(same_bits(v, o->velocity()));
    }
}

BOOST_AUTO_TEST_CASE(bad_parameters_are_refused_by_name) {
  auto msg = [](ps::optimizer_params p) { return ps::optimizer::create(p, 1).to_status().message(); };
  BOOST_TEST(msg({.mode = kind::sgd, .lr = 0.0}) == "optimizer.lr = 0: must be finite and > 0");
  BOOST_TEST(msg({.mode = kind::sgd, .momentum = 1.0}) == "optimizer.momentum = 1: must be in [0, 1)");
  BOOST_TEST(msg({.mode = kind::sgd, .weight_decay = -1}) == "optimizer.weight_decay = -1: must be finite and >= 0");
  BOOST_TEST(msg({.mode = kind::sgd, .nesterov = true}) == "optimizer.nesterov = true: needs momentum > 0");
  BOOST_TEST(msg({.mode = kind::model_delta, .weight_decay = 0.1}) ==
             "optimizer.weight_decay = 0.1: applies to sgd and outer only");
  BOOST_TEST(msg({.mode = static_cast<kind>(7)}) == "optimizer.mode = 7: must be model_delta (0), sgd (1) or outer (2)");
  // The outer optimizer's own.
  BOOST_TEST(msg({.mode = kind::outer, .lr = 0.0}) == "optimizer.lr = 0: must be finite and > 0");
  BOOST_TEST(msg({.mode = kind::outer, .lr = -0.7}) == "optimizer.lr = -0.7: must be finite and > 0");
  BOOST_TEST(msg({.mode = kind::outer, .lr = std::nan("")}).rfind("optimizer.lr = nan", 0) == 0);
  BOOST_TEST(msg({.mode = kind::outer, .lr = HUGE_VAL}) == "optimizer.lr = inf: must be finite and > 0");
  BOOST_TEST(msg({.mode = kind::outer, .momentum = 1.0}) == "optimizer.momentum = 1: must be in [0, 1)");
  BOOST_TEST(msg({.mode = kind::outer, .momentum = -0.1}) == "optimizer.momentum = -0.1: must be in [0, 1)");
  BOOST_TEST(msg({.mode = kind::outer, .nesterov = true}) == "optimizer.nesterov = true: needs momentum > 0");
  BOOST_TEST(msg({.mode = kind::outer, .momentum = 0.9, .nesterov = true, .nesterov_delay = 0}) ==
             "optimizer.nesterov_delay = 0: must be >= 1 (1: the momentum acts every step)");
  BOOST_TEST(msg({.mode = kind::outer, .momentum = 0.9, .nesterov_delay = 4}) ==
             "optimizer.nesterov_delay = 4: Delayed Nesterov needs nesterov (and momentum > 0); 1 without it");
  BOOST_TEST(msg({.mode = kind::outer, .momentum = 0.9, .nesterov = true, .nesterov_delay = 4,
                  .nesterov_activation = 1.5}) == "optimizer.nesterov_activation = 1.5: must be in [0, 1]");
  BOOST_TEST(msg({.mode = kind::outer, .momentum = 0.9, .nesterov = true, .nesterov_activation = 0.5}) ==
             "optimizer.nesterov_activation = 0.5: applies with nesterov_delay > 1 only");
  BOOST_TEST(msg({.mode = kind::sgd, .nesterov_delay = 2}) == "optimizer.nesterov_delay = 2: applies to outer only");
}

BOOST_AUTO_TEST_CASE(save_load_round_trip_and_refusal) {
  auto o = ps::optimizer::create({.mode = kind::sgd, .lr = 0.2, .momentum = 0.5}, 2);
  std::vector<float> w{1.0f, 1.0f}, acc{1.0f, 2.0f};
  o->step(w, acc, 1.0f);
  std::vector<std::byte> bytes;
  ashl::state_writer out(bytes);
  o->save(out);
  ps::optimizer back;
  ashl::state_reader in(bytes);
  BOOST_REQUIRE(back.load(in).ok());
  BOOST_TEST((back.params() == o->params()));
  BOOST_TEST(same_bits(std::vector<float>(o->velocity().begin(), o->velocity().end()), back.velocity()));
  ps::optimizer cut;
  ashl::state_reader t(std::span<const std::byte>(bytes.data(), bytes.size() - 2));
  BOOST_TEST(!cut.load(t).ok());
  BOOST_TEST(cut.size() == 0u);
}

// ------------------------------------------------------------ outer optimizer

namespace {
ps::optimizer outer(double lr, double mu, bool nesterov, double wd = 0.0, std::uint32_t delay = 1, double c = 0.0,
                    std::size_t n = 4) {
  auto o = ps::optimizer::create({.mode = kind::outer, .lr = lr, .momentum = mu, .weight_decay = wd,
                                  .nesterov = nesterov, .nesterov_delay = delay, .nesterov_activation = c},
                                 n);
  BOOST_REQUIRE_MESSAGE(o.has_value(), o.to_status().to_string());
  return std::move(*o);
}
}  // namespace

// DiLoCo's outer step, recomputed by hand in the documented order: the
// accumulator holds Σ w_i Δ_i (deltas w_i − W), the pseudo-gradient is
// g = (−s)·acc + wd·W, then PyTorch's SGD rule on g.
BOOST_AUTO_TEST_CASE(outer_steps_match_the_hand_computation_bit_exactly) {
  for (double mu : {0.0, 0.9})
    for (bool nesterov : {false, true}) {
      if (nesterov && mu == 0.0) continue;
      auto o = outer(0.7, mu, nesterov, 0.01);
      BOOST_TEST(!o.adds_deltas());
      std::vector<float> w{0.3f, -0.2f, 1.5f, 0.0f}, v(4, 0.0f), W = w;
      for (int k = 0; k < 4; ++k) {
        std::vector<float> acc{0.1f * static_cast<float>(k), -0.3f, 0.7f, 2.0f}, a = acc;
        o.step(w, acc, 0.25f);
        for (int i = 0; i < 4; ++i) {
          const float sa = 0.25f * a[i];
          const float g = -sa + 0.01f * W[i];  // the pseudo-gradient: minus the mean delta
          if (mu == 0.0) {
            W[i] = W[i] - 0.7f * g;
          } else {
            v[i] = 0.9f * v[i] + g;
            W[i] = W[i] - 0.7f * (nesterov ? g + 0.9f * v[i] : v[i]);
          }
        }
        BOOST_TEST(same_bits(W, w));
        BOOST_TEST(same_bits({0.0f, 0.0f, 0.0f, 0.0f}, acc));
      }
      if (mu > 0.0) BOOST_TEST(same_bits(v, o.velocity()));
      BOOST_TEST(o.outer_steps() == 4u);
    }
}

// outer at lr 1, momentum 0: plain averaging. The server runs it as
// model_delta (adds_deltas: no accumulator, bit for bit Local SGD); the
// outer formula itself gives the same bits for one aggregate: W − 1·(−s·a)
// is W + s·a exactly in IEEE arithmetic (nonzero values).
BOOST_AUTO_TEST_CASE(outer_at_lr_one_without_momentum_is_plain_averaging) {
  auto o = outer(1.0, 0.0, false);
  BOOST_TEST(o.adds_deltas());
  auto plain = ps::optimizer::create({}, 4);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> w1(4), w2;
  for (auto& x : w1) x = u(rng);
  w2 = w1;
  for (int k = 0; k < 20; ++k) {
    std::vector<float> a1(4);
    for (auto& x : a1) x = u(rng);
    auto a2 = a1;
    o.step(w1, a1, 1.0f / 3.0f);
    plain->step(w2, a2, 1.0f / 3.0f);
    BOOST_TEST(same_bits(w1, w2));
  }
  // With momentum it is no longer plain averaging: the model_delta path is not taken.
  BOOST_TEST(!outer(1.0, 0.5, false).adds_deltas());
  BOOST_TEST(!outer(0.7, 0.0, false).adds_deltas());
}

// Delayed Nesterov against the Async Local-SGD paper's update (arXiv
// 2401.09135, Algorithm "Delayed Nesterov"), written here as the paper
// states it: on pseudo-gradient g_t (one worker's W − w_i), Δ += g_t; when
// t % N == 0: m = βm + Δ/N, θ −= ε((1 − cN + c)βm + g_t/N), Δ = 0; else
// θ −= ε(cβm + g_t/N). ashl feeds each commit at the policy's weight 1/N
// (N a power of two, so g/N and Σg/N are exact) and must give the same bits.
BOOST_AUTO_TEST_CASE(delayed_nesterov_matches_the_papers_update) {
  for (std::uint32_t N : {1u, 2u, 4u})
    for (double c : {0.0, 0.25}) {
      if (N == 1 && c != 0.0) continue;
      const float eps = 0.7f, beta = 0.9f;
      constexpr std::size_t n = 5;
      auto o = outer(0.7, 0.9, true, 0.0, N, c, n);
      std::mt19937 rng(11 + N);
      std::uniform_real_distribution<float> u(0.125f, 1.0f);
      std::vector<float> theta(n), m(n, 0.0f), delta(n, 0.0f);
      for (auto& x : theta) x = u(rng);
      std::vector<float> w = theta;
      const float coeff_fold = static_cast<float>((1.0 - c * N + c) * 0.9);
      const float coeff_other = static_cast<float>(c * 0.9);
      const float inv_n = 1.0f / static_cast<float>(N);
      for (int t = 1; t <= 12; ++t) {
        std::vector<float> g(n);
        for (auto& x : g) x = (rng() % 2 ? 1.0f : -1.0f) * u(rng);  // W − w_i
        // The server's accumulator: the worker's delta −g at weight 1/N.
        std::vector<float> acc(n);
        for (std::size_t i = 0; i < n; ++i) acc[i] = 0.0f + inv_n * -g[i];
        o.step(w, acc, 1.0f);
        for (std::size_t i = 0; i < n; ++i) {
          delta[i] = delta[i] + g[i];
          if (t % static_cast<int>(N) == 0) {
            m[i] = beta * m[i] + delta[i] / static_cast<float>(N);
            theta[i] = theta[i] - eps * (coeff_fold * m[i] + g[i] / static_cast<float>(N));
            delta[i] = 0.0f;
          } else {
            theta[i] = theta[i] - eps * (coeff_other * m[i] + g[i] / static_cast<float>(N));
          }
        }
        BOOST_TEST(same_bits(theta, w), "N = " << N << ", c = " << c << ", t = " << t);
      }
      BOOST_TEST(same_bits(m, o.velocity()));
      if (N > 1) BOOST_TEST(same_bits(delta, o.delayed()));  // 12 % N == 0: both folded, zero
    }
}

// The momentum of Delayed Nesterov acts only at the fold (c = 0): a step in
// between moves W by lr·g alone, whatever the velocity holds.
BOOST_AUTO_TEST_CASE(delayed_nesterov_moves_by_the_gradient_between_folds) {
  auto o = outer(0.5, 0.9, true, 0.0, 3, 0.0, 1);
  std::vector<float> w{1.0f};
  for (int t = 1; t <= 7; ++t) {
    std::vector<float> acc{-1.0f};  // g = +1
    const float before = w[0];
    const float v_before = o.velocity()[0];
    o.step(w, acc, 1.0f);
    if (t % 3 != 0) {
      BOOST_TEST(w[0] == before - 0.5f * 1.0f);
      BOOST_TEST(o.velocity()[0] == v_before);
    } else {
      BOOST_TEST(o.velocity()[0] == 0.9f * v_before + 3.0f);
      BOOST_TEST(o.delayed()[0] == 0.0f);
    }
  }
}

BOOST_AUTO_TEST_CASE(outer_state_saves_and_loads_with_its_count_and_buffer) {
  auto o = outer(0.7, 0.9, true, 0.0, 4, 0.25, 3);
  std::vector<float> w{1.0f, 2.0f, 3.0f};
  for (int k = 0; k < 6; ++k) {  // 6 % 4: mid-way to the second fold
    std::vector<float> acc{0.1f, -0.2f, 0.3f * static_cast<float>(k)};
    o.step(w, acc, 0.5f);
  }
  std::vector<std::byte> bytes;
  ashl::state_writer out(bytes);
  o.save(out);
  ps::optimizer back;
  ashl::state_reader in(bytes);
  BOOST_REQUIRE(back.load(in).ok());
  BOOST_TEST(in.at_end());
  BOOST_TEST((back.params() == o.params()));
  BOOST_TEST(back.outer_steps() == 6u);
  BOOST_TEST(same_bits(std::vector<float>(o.delayed().begin(), o.delayed().end()), back.delayed()));
  // The restored one continues exactly as the original would.
  std::vector<float> w2 = w;
  for (int k = 0; k < 5; ++k) {
    std::vector<float> a1{0.3f, 0.1f, -0.4f}, a2 = a1;
    o.step(w, a1, 0.5f);
    back.step(w2, a2, 0.5f);
    BOOST_TEST(same_bits(w, w2));
  }
  // A cut section is refused and changes nothing.
  ps::optimizer cut;
  ashl::state_reader t(std::span<const std::byte>(bytes.data(), bytes.size() - 3));
  BOOST_TEST(!cut.load(t).ok());
  BOOST_TEST(cut.size() == 0u);
  // Model deltas and sgd still save version 1 (the bytes of older builds).
  std::vector<std::byte> old;
  ashl::state_writer ow(old);
  ps::optimizer::create({}, 2)->save(ow);
  ashl::state_reader orr(old);
  std::uint32_t version = 0;
  BOOST_TEST(orr.tag("POPT", 1, 2, version).ok());
  BOOST_TEST(version == 1u);
}
