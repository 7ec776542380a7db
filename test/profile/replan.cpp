#include <ashl/profile/replan.hpp>

#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstring>
#include <vector>

namespace ap = ashl::profile;
namespace tt = boost::test_tools;

BOOST_AUTO_TEST_CASE(initial_plan_is_algorithms_1_and_2) {
  auto r = ap::replanner::create({.h0 = 8, .t_compress = 0.0, .r0 = 0.1},
                                 {{0.10, 0.02, 0.02}, {0.05, 0.02, 0.02}});
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->plan().local[0].h == 8u);
  BOOST_TEST(r->plan().local[1].h == 16u);
  BOOST_TEST(r->plan().ratio.size() == 2u);
}

BOOST_AUTO_TEST_CASE(a_worker_that_slows_mid_run_is_replanned) {
  auto r = ap::replanner::create({.h0 = 8, .t_compress = 0.0, .r0 = 0.1, .drift = 0.6, .half_life = 2.0},
                                 {{0.10, 0.02, 0.02}, {0.05, 0.02, 0.02}});
  BOOST_TEST_REQUIRE(r.has_value());
  // Worker 1's iterations now take 0.1 s; its EWMA goes 0.05 → 0.1 − 0.05·2^(−n/2):
  // 0.0646 (+29 %), 0.075 (+50 %), then 0.0823 (+65 % > 60 %).
  for (int n = 1; n <= 2; ++n) {
    auto o = r->observe(1, ap::timing_kind::iter, 0.1);
    BOOST_TEST_REQUIRE(o.has_value());
    BOOST_TEST(!o->has_value());
  }
  // The other worker staying on its planned times does not re-plan.
  BOOST_TEST(!r->observe(0, ap::timing_kind::iter, 0.1)->has_value());
  auto o = r->observe(1, ap::timing_kind::iter, 0.1);
  BOOST_TEST_REQUIRE(o.has_value());
  BOOST_TEST_REQUIRE(o->has_value());
  const ap::full_plan& p = **o;
  BOOST_TEST(p.basis[1].t_iter == 0.1 - 0.05 * 0.35355339059327373, tt::tolerance(1e-9));
  // T_max = 0.84 (worker 0); H_1 = round(0.80 / 0.08232) = 10.
  BOOST_TEST(p.local[0].h == 8u);
  BOOST_TEST(p.local[1].h == 10u);
  BOOST_TEST(p.local[1].share == 10.0 / 18, tt::tolerance(1e-12));
  // Algorithm 2: worker 1 is now the slowest round (0.8452 s) and sends r0.
  BOOST_TEST(p.ratio[1] == 0.1, tt::tolerance(1e-9));
  BOOST_TEST(p.ratio[0] == 1.0);
  BOOST_TEST(r->replans() == 1u);
  BOOST_TEST(r->plan().local[1].h == 10u);
  // The new basis is what the EWMAs hold, so the next equal sample does not re-plan.
  BOOST_TEST(!r->observe(0, ap::timing_kind::push, 0.02)->has_value());
}

BOOST_AUTO_TEST_CASE(errors) {
  BOOST_TEST(!ap::replanner::create({}, {}).has_value());
  BOOST_TEST(!ap::replanner::create({.drift = 0.0}, {{0.1, 0.1, 0.1}}).has_value());
  auto r = ap::replanner::create({}, {{0.1, 0.1, 0.1}});
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(!r->observe(1, ap::timing_kind::iter, 0.1).has_value());
  auto bad = r->observe(0, ap::timing_kind::pull, -0.5);
  BOOST_TEST_REQUIRE(!bad.has_value());
  BOOST_TEST(bad.error().message() == "profile.sample = -0.5: duration must be finite and > 0");
}

BOOST_AUTO_TEST_CASE(measurements_drive_the_replanner) {
  using k = ap::measurement_kind;
  auto r = ap::replanner::create({.h0 = 8, .t_compress = 0.0, .r0 = 0.1, .drift = 0.6, .half_life = 2.0},
                                 {{0.10, 0.02, 0.02}, {0.05, 0.02, 0.02}});
  BOOST_TEST_REQUIRE(r.has_value());
  // compress and round measurements are not part of the basis.
  BOOST_TEST(!r->observe({.worker = 1, .kind = k::round, .seconds = 50.0})->has_value());
  BOOST_TEST(!r->observe({.worker = 1, .kind = k::commit, .seconds = 50.0})->has_value());
  BOOST_TEST(!r->observe({.worker = 1, .kind = k::compress, .seconds = 50.0, .amount = 10})->has_value());
  // An absurd timing is rejected and does not move the EWMA.
  auto bad = r->observe({.worker = 1, .kind = k::compute, .seconds = 0.0, .amount = 32});
  BOOST_TEST_REQUIRE(!bad.has_value());
  BOOST_TEST(bad.error().message() == "measurement.seconds = 0: duration must be finite and > 0");
  BOOST_TEST(!r->observe({.worker = 9, .kind = k::round, .seconds = 1.0}).has_value());
  // Worker 1's link slows 4×: push EWMA 0.02 → 0.08 − 0.06·2^(−n/2): 0.0376 (+88 % > 60 %).
  auto o = r->observe({.worker = 1, .kind = k::push, .seconds = 0.08, .amount = 1e6});
  BOOST_TEST_REQUIRE(o.has_value());
  BOOST_TEST_REQUIRE(o->has_value());
  const auto w = (*o)->workers(ashl::stage_id::shl);
  BOOST_TEST((w[0].stage == ashl::stage_id::shl));
  BOOST_TEST((*o)->basis[1].t_push == 0.08 - 0.06 * 0.70710678118654752, tt::tolerance(1e-9));
  // Rounds at H0 = 8: 0.84 and 0.4 + 0.0376 + 0.02 = 0.4576; H_1 = round((0.84 − 0.0576) / 0.05) = 16.
  BOOST_TEST(w[1].local_iterations == 16u);
  // Algorithm 2 at r0 = 0.1: worker 1's round 0.8 + 0.1·p + 0.02 (p = 0.0376) beats
  // worker 0's 0.8 + 0.002 + 0.02, so worker 1 sends r0 and worker 0 gets
  // (0.82 + 0.1·p − 0.82) / 0.02 = 5·p = 0.188: its link has the time to spare.
  const double p = 0.08 - 0.06 * 0.70710678118654752;
  BOOST_TEST(w[1].compression_ratio == 0.1f, tt::tolerance(1e-6f));
  BOOST_TEST(w[0].compression_ratio == static_cast<float>(5.0 * p), tt::tolerance(1e-6f));
}

BOOST_AUTO_TEST_CASE(save_and_load_continue_exactly) {
  auto r = ap::replanner::create({.h0 = 8, .t_compress = 0.001, .r0 = 0.1, .drift = 0.3, .half_life = 3.0},
                                 {{0.10, 0.02, 0.02}, {0.05, 0.02, 0.02}, {0.07, 0.03, 0.01}});
  BOOST_TEST_REQUIRE(r.has_value());
  // Move some EWMAs and re-plan once, so the state is not the initial one.
  for (int n = 0; n < 6; ++n) (void)r->observe(1, ap::timing_kind::iter, 0.1);
  (void)r->observe(2, ap::timing_kind::push, 0.031);
  BOOST_TEST_REQUIRE(r->replans() >= 1u);
  std::vector<std::byte> bytes;
  ashl::state_writer w(bytes);
  r->save(w);
  ashl::state_reader in(bytes);
  auto back = ap::replanner::load(in);
  BOOST_TEST_REQUIRE(back.has_value(), (back ? "" : back.error().to_string()));
  BOOST_TEST(in.at_end());
  BOOST_TEST((*back == *r));
  // Both decide alike from here on.
  const double samples[] = {0.1, 0.12, 0.05, 0.2, 0.2, 0.2, 0.02};
  for (std::uint32_t w2 = 0; w2 < 3; ++w2) {
    for (double x : samples) {
      auto a = r->observe(w2, ap::timing_kind::pull, x);
      auto b = back->observe(w2, ap::timing_kind::pull, x);
      BOOST_TEST_REQUIRE(a.has_value());
      BOOST_TEST_REQUIRE(b.has_value());
      BOOST_TEST(a->has_value() == b->has_value());
      if (a->has_value()) BOOST_TEST((**a == **b));
    }
  }
  BOOST_TEST((*back == *r));
  // Damaged state is refused with the field named, never half-applied.
  std::vector<std::byte> cut(bytes.begin(), bytes.begin() + 40);
  ashl::state_reader short_in(cut);
  BOOST_TEST(!ap::replanner::load(short_in).has_value());
  std::vector<std::byte> other = bytes;
  other[0] = std::byte{'X'};
  ashl::state_reader tag_in(other);
  auto t = ap::replanner::load(tag_in);
  BOOST_TEST_REQUIRE(!t.has_value());
  BOOST_TEST(t.error().message().rfind("state.tag = \"XPLN\"", 0) == 0u, t.error().message());
  std::vector<std::byte> drift = bytes;
  const double bad = -1.0;
  std::memcpy(drift.data() + 8 + 4 + 8 + 8, &bad, 8);  // tag, h0, t_compress, r0, then drift
  ashl::state_reader drift_in(drift);
  auto d = ap::replanner::load(drift_in);
  BOOST_TEST_REQUIRE(!d.has_value());
  BOOST_TEST(d.error().message() == "replan.drift = -1: must be finite and > 0");
}

BOOST_AUTO_TEST_CASE(a_straggler_flag_replans_once_for_the_new_capability) {
  // Drift re-planning effectively off (100x), so only straggler flags re-plan.
  auto r = ap::replanner::create({.h0 = 8, .r0 = 0.1, .drift = 100.0, .half_life = 2.0, .stragglers = true,
                                  .straggler_window = 4, .straggler_threshold = 0.5, .straggler_consecutive = 2},
                                 {{0.10, 0.02, 0.02}, {0.05, 0.02, 0.02}});
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST_REQUIRE(r->stragglers() != nullptr);
  BOOST_TEST((r->last_replan().reason == ap::replan_reason::none));
  // Worker 0 is twice as slow as worker 1 by design, and runs at its prediction: no flag.
  for (int n = 0; n < 40; ++n) {
    BOOST_TEST(!r->observe(0, ap::timing_kind::iter, 0.10)->has_value());
    BOOST_TEST(!r->observe(1, ap::timing_kind::iter, 0.05)->has_value());
  }
  // Worker 1 becomes 2x slower than its own prediction: flagged after two
  // windows of four samples, re-planned once, at the window's end.
  int replans = 0, at = -1;
  for (int n = 0; n < 40; ++n) {
    auto o = r->observe(1, ap::timing_kind::iter, 0.10);
    BOOST_TEST_REQUIRE(o.has_value());
    if (o->has_value()) {
      ++replans;
      at = n;
      // Algorithm 1 on the new capability: both take 0.1 s now, so H = 8 each.
      BOOST_TEST((*o)->basis[1].t_iter == 0.10);
      BOOST_TEST((*o)->local[1].h == 8u);
    }
  }
  BOOST_TEST(replans == 1);
  BOOST_TEST(at == 7);
  BOOST_TEST(r->replans() == 1u);
  BOOST_TEST(r->straggler_replans() == 1u);
  const ap::replan_record& why = r->last_replan();
  BOOST_TEST(why.worker == 1u);
  BOOST_TEST((why.reason == ap::replan_reason::straggler));
  BOOST_TEST(ap::to_string(why.reason) == "straggler");
  BOOST_TEST(why.measured == 0.10);
  BOOST_TEST(why.predicted == 0.05);
  // It drifts again (0.3 s, 3x the new basis): one re-plan per window at most.
  replans = 0;
  for (int n = 0; n < 16; ++n) replans += r->observe(1, ap::timing_kind::iter, 0.30)->has_value() ? 1 : 0;
  BOOST_TEST(replans == 1);
  BOOST_TEST(r->straggler_replans() == 2u);
}

BOOST_AUTO_TEST_CASE(a_drift_replan_is_recorded_with_its_worker_and_reason) {
  auto r = ap::replanner::create({.h0 = 8, .r0 = 0.1, .drift = 0.6, .half_life = 2.0},
                                 {{0.10, 0.02, 0.02}, {0.05, 0.02, 0.02}});
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->stragglers() == nullptr);  // off by default
  for (int n = 0; n < 3; ++n) (void)r->observe(1, ap::timing_kind::iter, 0.1);
  BOOST_TEST(r->replans() == 1u);
  BOOST_TEST(r->straggler_replans() == 0u);
  BOOST_TEST(r->last_replan().worker == 1u);
  BOOST_TEST((r->last_replan().reason == ap::replan_reason::drift));
  BOOST_TEST(r->last_replan().predicted == 0.05);
  BOOST_TEST(r->last_replan().measured == 0.1 - 0.05 * 0.35355339059327373, tt::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(straggler_state_saves_and_loads) {
  auto r = ap::replanner::create({.h0 = 4, .r0 = 0.5, .drift = 100.0, .stragglers = true, .straggler_window = 3,
                                  .straggler_consecutive = 1},
                                 {{0.10, 0.02, 0.02}, {0.05, 0.02, 0.02}});
  BOOST_TEST_REQUIRE(r.has_value());
  for (int n = 0; n < 4; ++n) (void)r->observe(1, ap::timing_kind::iter, 0.2);  // a flag, one sample open
  BOOST_TEST(r->straggler_replans() == 1u);
  std::vector<std::byte> bytes;
  ashl::state_writer w(bytes);
  r->save(w);
  ashl::state_reader in(bytes);
  auto back = ap::replanner::load(in);
  BOOST_TEST_REQUIRE(back.has_value(), (back ? "" : back.error().to_string()));
  BOOST_TEST(in.at_end());
  BOOST_TEST((*back == *r));
  for (double x : {0.5, 0.5, 0.5, 0.5, 0.05}) {
    auto a = r->observe(1, ap::timing_kind::iter, x);
    auto b = back->observe(1, ap::timing_kind::iter, x);
    BOOST_TEST(a->has_value() == b->has_value());
  }
  BOOST_TEST((*back == *r));
  BOOST_TEST(!ap::replanner::create({.stragglers = true, .straggler_window = 0}, {{0.1, 0.1, 0.1}}).has_value());
}
