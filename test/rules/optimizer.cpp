#include <ashl/rules/optimizer.hpp>

#include <boost/test/unit_test.hpp>

#include <cstring>
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
  BOOST_TEST(msg({.mode = kind::model_delta, .weight_decay = 0.1}) == "optimizer.weight_decay = 0.1: applies to sgd only");
  BOOST_TEST(msg({.mode = static_cast<kind>(7)}) == "optimizer.mode = 7: must be model_delta (0) or sgd (1)");
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
