#include <ashl/rules/compensation.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/rules/policies.hpp>
#include <ashl/rules/server_core.hpp>
#include <ashl/sync/any_policy.hpp>

#include <cstring>
#include <vector>

namespace ps = ashl::ps;

BOOST_AUTO_TEST_CASE(tau_zero_changes_nothing_bit_for_bit) {
  std::vector<float> w = {1.5f, -0.25f, 3.0e-8f, -0.0f, 1e30f}, v = {0.3f, -7.0f, 1e-3f, 2.0f, -1e29f};
  const std::vector<float> before = w;
  BOOST_TEST(ps::compensate(w, v, 0, 0.1).ok());
  BOOST_TEST(std::memcmp(w.data(), before.data(), w.size() * sizeof(float)) == 0);
  BOOST_TEST(ps::compensate(w, v, 5, 0.0).ok());
  BOOST_TEST(std::memcmp(w.data(), before.data(), w.size() * sizeof(float)) == 0);
}

BOOST_AUTO_TEST_CASE(tau_moves_by_exactly_tau_eta_v) {
  std::vector<float> w = {1.0f, 2.0f, -3.0f, 0.5f}, v = {0.5f, -0.25f, 1.0f, 0.0f};
  const std::vector<float> before = w;
  BOOST_TEST(ps::compensate(w, v, 4, 0.125).ok());  // τ·η = 0.5, exact in f32
  for (std::size_t i = 0; i < w.size(); ++i) BOOST_TEST(w[i] == before[i] - 0.5f * v[i]);
  BOOST_TEST(w[0] == 0.75f);
  BOOST_TEST(w[1] == 2.125f);
  BOOST_TEST(w[2] == -3.5f);
  BOOST_TEST(w[3] == 0.5f);
}

BOOST_AUTO_TEST_CASE(size_mismatch_is_refused_by_name) {
  std::vector<float> w(3), v(2);
  const auto s = ps::compensate(w, v, 1, 0.1);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("compensate.momentum.size = 2") != std::string::npos, s.message());
}

// τ as server_core reports it: under ASP each reply counts the versions the
// other workers added since this worker's previous reply; under BSP it is 0.
BOOST_AUTO_TEST_CASE(server_core_reports_the_versions_others_added) {
  auto layout = ps::shard_layout::even(4, 1);
  ps::policy_params pp;
  pp.workers = 3;
  auto core = ps::server_core<ashl::sync::any_policy>::create(
      {.layout = *layout, .workers = 3, .optimizer = {.mode = ps::optimizer_params::kind::model_delta}},
      *ps::make_policy("asp", pp), std::vector<float>(4, 0.0f));
  BOOST_TEST_REQUIRE(core.has_value());
  ps::server_actions out(3);
  std::vector<float> delta(4, 1.0f);
  const auto bytes = std::as_bytes(std::span<const float>(delta));
  std::uint64_t seq[3] = {0, 0, 0};
  auto commit = [&](ashl::sync::worker_id w) {
    out.clear();
    core->commit({.worker = w, .sequence = ++seq[w], .clock = seq[w], .samples = 1, .bytes = bytes.size(),
                  .codec = ashl::codec_id::identity, .type = ashl::dtype::f32, .element_count = 4, .payload = bytes,
                  .pull = true},
                 0.0, out);
    BOOST_TEST_REQUIRE(out.pull_replies().size() == 1u);
    return core->serve_staleness(w);
  };
  for (ashl::sync::worker_id w = 0; w < 3; ++w) BOOST_TEST(core->serve_staleness(w) == 0u);  // first replies
  BOOST_TEST(commit(0) == 0u);  // only its own commit since
  BOOST_TEST(commit(1) == 1u);  // worker 0's
  BOOST_TEST(commit(2) == 2u);  // workers 0 and 1's
  BOOST_TEST(commit(0) == 2u);  // 1 and 2 since its last reply
  BOOST_TEST(commit(0) == 0u);
}
