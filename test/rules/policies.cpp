#include <ashl/rules/policies.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/ps_policy_cases.hpp"

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace as = ashl::sync;
namespace ps = ashl::ps;
using ashl::stage_id;

namespace {
std::string error_of(std::string_view name, const ps::policy_params& p) {
  auto r = ps::make_policy(name, p);
  return r ? std::string("ok") : r.error().message();
}
ps::policy_params with_workers(std::int64_t m) {
  ps::policy_params p;
  p.workers = m;
  return p;
}
constexpr std::size_t script_workers = 4;
constexpr int script_events = 1500;
}  // namespace

BOOST_AUTO_TEST_CASE(every_name_builds_and_drives) {
  for (const auto& c : ps_cases::every_policy(2)) {
    auto r = ps::make_policy(c.name, c.params);
    BOOST_TEST_REQUIRE(r.has_value(), c.label);
    as::any_policy a = std::move(*r);
    as::outcome_sink out(4);
    auto d = a.on_commit({.worker = 0, .sequence = 1}, out);
    BOOST_TEST((d.action != as::commit_action::drop), c.label);
    out.clear();
    BOOST_TEST((a.on_commit({.worker = 0, .sequence = 1}, out).action == as::commit_action::drop), c.label);
    out.clear();
    (void)a.on_pull({.worker = 0}, out);
    out.clear();
    a.on_evict({.worker = 1}, out);
    BOOST_TEST(!a.is_held(0), c.label);  // nothing waits for the evicted worker
    BOOST_TEST((a.plan(0).stage != stage_id::none), c.label);
    BOOST_TEST((a.stage() == a.plan(0).stage), c.label);
  }
}

BOOST_AUTO_TEST_CASE(the_names_are_listed_once_and_drive_errors_and_help) {
  BOOST_TEST(ps::policy_names_text() == "bsp, asp, ssp, local_sgd, dssp, semi_async, adsp, ashl, dlb, joint, coded_bsp, diloco, async_diloco, async_local_sgd, ashl_diloco");
  BOOST_TEST(error_of("gossip", with_workers(2)) ==
             "sync.policy = \"gossip\": unknown policy (bsp, asp, ssp, local_sgd, dssp, semi_async, adsp, ashl, dlb, joint, coded_bsp, diloco, async_diloco, async_local_sgd, ashl_diloco)");
  const std::string help = ps::policy_help();
  for (const auto& d : ps::policies) {
    BOOST_TEST(help.find(std::string(d.name)) != std::string::npos, d.name);
    BOOST_TEST(help.find(std::string(d.fields)) != std::string::npos, d.name);
    BOOST_TEST(ps::policy_kind_of(d.name).has_value());
  }
  BOOST_TEST(!ps::policy_kind_of("ASP").has_value());
}

BOOST_AUTO_TEST_CASE(rejects_unknown_names_and_impossible_parameters) {
  BOOST_TEST(error_of("asp", with_workers(0)) == "asp.workers = 0: must be >= 1");
  for (std::string n : {"bsp", "local_sgd", "diloco"}) {
    auto q = with_workers(2);
    q.min_workers = 0;
    BOOST_TEST(error_of(n, q) == n + ".min_workers = 0: must be >= 1");
    q.min_workers = 65537;
    BOOST_TEST(error_of(n, q) == n + ".min_workers = 65537: must be at most 65536 (ps::max_workers)");
    q.min_workers = 3;  // more than the job starts with: it waits for joins
    BOOST_TEST(error_of(n, q) == "ok");
  }
  {
    auto q = with_workers(2);
    q.sync_every_iterations = 2;
    q.min_workers = -1;
    BOOST_TEST(error_of("semi_async", q) == "semi_async.min_workers = -1: must be >= 1");
  }
  auto p = with_workers(2);
  p.staleness = -1;
  BOOST_TEST(error_of("ssp", p) == "ssp.staleness = -1: must be >= 0");
  p = with_workers(2);
  p.local_steps = 0;
  BOOST_TEST(error_of("local_sgd", p) == "local_sgd.local_steps = 0: must be >= 1");
  p = with_workers(2);
  p.h_ahl = 0;
  BOOST_TEST(error_of("ashl", p) == "ashl.h_ahl = 0: must be >= 1");
  p = with_workers(2);
  p.compression_ratio = 0.0;
  BOOST_TEST(error_of("ashl", p) == "ashl.compression_ratio = 0: must be in (0, 1]");
  p.compression_ratio = 1.5;
  BOOST_TEST(error_of("ashl", p) == "ashl.compression_ratio = 1.5: must be in (0, 1]");
  p = with_workers(2);
  p.s_min = 4;
  p.s_max = 2;
  BOOST_TEST(error_of("dssp", p) == "dssp.s_max = 2: must be >= dssp.s_min");
  p = with_workers(2);
  BOOST_TEST(error_of("semi_async", p) == "semi_async.sync_every_iterations = 0: set it or semi_async.sync_every_seconds");
  p = with_workers(2);
  p.period = 0.0;
  BOOST_TEST(error_of("adsp", p) == "adsp.period = 0: must be finite and > 0");
  p = with_workers(2);
  p.weighting = "median";
  BOOST_TEST(error_of("bsp", p) == "bsp.weighting = \"median\": must be mean or samples");
  p = with_workers(2);
  p.staleness_weight = "custom";
  BOOST_TEST(error_of("asp", p) == "asp.staleness_weight = \"custom\": must be none, inverse or power");
  p.staleness_weight = "power";
  p.staleness_exponent = -1.0;
  BOOST_TEST(error_of("asp", p) == "asp.staleness_exponent = -1: must be finite and > 0");
  p.staleness_exponent = 2.0;
  BOOST_TEST(error_of("asp", p) == "ok");
  BOOST_TEST(error_of("adsp", p) == "ok");
  p = with_workers(2);
  p.planner = "oracle";
  BOOST_TEST(error_of("ashl", p) == "ashl.planner = \"oracle\": must be uniform or profile");
  p = with_workers(2);
  p.replanner = "always";
  BOOST_TEST(error_of("ashl", p) == "ashl.replanner = \"always\": must be none or profile");
  p = with_workers(2);
  p.replanner = "profile";
  p.replan_drift = 0.0;
  BOOST_TEST(error_of("ashl", p) == "ashl.replan_drift = 0: must be finite and > 0");
  p = with_workers(2);
  p.planner = "profile";
  p.profile_trim = -1;
  BOOST_TEST(error_of("ashl", p) == "ashl.profile_trim = -1: must be >= 0");
  p = with_workers(4);
  p.total_batch = 16;
  p.min_batch = 8;
  BOOST_TEST(error_of("dlb", p) == "dlb.total_batch = 16: must be >= dlb.min_batch * workers");
  p.min_batch = 0;
  BOOST_TEST(error_of("dlb", p) == "dlb.min_batch = 0: must be >= 1");
  p = with_workers(2);
  p.replan_every = 0;
  BOOST_TEST(error_of("dlb", p) == "dlb.replan_every = 0: must be >= 1");
  p = with_workers(2);
  p.speed_half_life = std::nan("");
  BOOST_TEST(error_of("dlb", p) == "dlb.speed_half_life = nan: must be finite and > 0");
  p = with_workers(2);
  p.initial_commit_rate = 3;
  p.max_commit_rate = 2;
  BOOST_TEST(error_of("adsp", p) == "adsp.max_commit_rate = 2: must be >= adsp.initial_commit_rate");
  p = with_workers(2);
  p.staleness = std::int64_t{1} << 33;
  BOOST_TEST(error_of("ssp", p) == "ssp.staleness = 8589934592: must be < 2^32");
}

namespace {
// One field of one policy: a base (on top of ps_cases::base_params) and the
// change that must show in what the policy decides.
struct field_case {
  std::string policy;
  std::string field;
  std::function<void(ps::policy_params&)> base;
  std::function<void(ps::policy_params&)> change;
};

void none(ps::policy_params&) {}

std::vector<field_case> field_cases() {
  std::vector<field_case> c;
  const auto add = [&](std::string policy, std::string field, std::function<void(ps::policy_params&)> change,
                       std::function<void(ps::policy_params&)> base = none) {
    c.push_back({std::move(policy), std::move(field), std::move(base), std::move(change)});
  };
  const auto power = [](ps::policy_params& p) { p.staleness_weight = "power"; };
  for (const auto& d : ps::policies) add(std::string(d.name), "workers", [](auto& p) { p.workers = 5; });
  for (std::string n : {"asp", "ssp", "dssp", "semi_async", "adsp", "ashl"}) {
    add(n, "staleness_weight", [](auto& p) { p.staleness_weight = "inverse"; });
    add(n, "staleness_exponent", [](auto& p) { p.staleness_exponent = 3.0; }, power);
  }
  for (std::string n : {"bsp", "local_sgd"}) {
    add(n, "weighting", [](auto& p) { p.weighting = "samples"; });
    add(n, "batch_size", [](auto& p) { p.batch_size = 32; });
  }
  // The script evicts and rejoins workers: with min_workers = the workers,
  // rounds wait for rejoins instead of completing with fewer.
  for (std::string n : {"bsp", "local_sgd", "semi_async"})
    add(n, "min_workers", [](auto& p) { p.min_workers = 4; });
  add("local_sgd", "local_steps", [](auto& p) { p.local_steps = 3; });
  add("ssp", "staleness", [](auto& p) { p.staleness = 0; });
  add("dssp", "s_min", [](auto& p) { p.s_min = 0; });
  add("dssp", "s_max", [](auto& p) { p.s_max = 1; });
  add("dssp", "window", [](auto& p) { p.window = 1; });
  add("semi_async", "sync_every_iterations", [](auto& p) { p.sync_every_iterations = 2; });
  add("semi_async", "sync_every_seconds", [](auto& p) { p.sync_every_seconds = 3.0; });
  add("adsp", "period", [](auto& p) { p.period = 10.0; });
  add("adsp", "t_min", [](auto& p) { p.t_min = 15.0; });
  add("adsp", "search_every", [](auto& p) { p.search_every = 150.0; });
  add("adsp", "target_loss", [](auto& p) { p.target_loss = 0.9; });
  add("adsp", "loss_rise", [](auto& p) { p.loss_rise = 5.0; });
  add("adsp", "initial_commit_rate", [](auto& p) { p.initial_commit_rate = 2; });
  add("adsp", "max_commit_rate", [](auto& p) { p.max_commit_rate = 1; });
  add("ashl", "profile_iterations", [](auto& p) { p.profile_iterations = 2; });
  add("ashl", "profile_seconds", [](auto& p) { p.profile_seconds = 1.0; });
  add("ashl", "h_ahl", [](auto& p) { p.h_ahl = 4; });
  add("ashl", "h_shl", [](auto& p) { p.h_shl = 3; });
  add("ashl", "compression_ratio", [](auto& p) { p.compression_ratio = 0.5; });
  add("ashl", "switch_loss", [](auto& p) { p.switch_loss = 0.6; });
  add("ashl", "shl_staleness", [](auto& p) { p.shl_staleness = 0; });
  add("ashl", "planner", [](auto& p) { p.planner = "profile"; });
  add("ashl", "replanner", [](auto& p) { p.replanner = "profile"; });
  const auto profiled = [](ps::policy_params& p) {
    p.planner = "profile";
    p.compression_ratio = 0.1;  // R_i then varies continuously with the measured times
  };
  add("ashl", "profile_trim", [](auto& p) { p.profile_trim = 0; }, profiled);
  add("ashl", "profile_warmup", [](auto& p) { p.profile_warmup = 3; }, profiled);
  const auto replanned = [](ps::policy_params& p) { p.replanner = "profile"; };
  add("ashl", "replan_drift", [](auto& p) { p.replan_drift = 5.0; }, replanned);
  add("ashl", "replan_half_life", [](auto& p) { p.replan_half_life = 1.0; }, replanned);
  add("dlb", "total_batch", [](auto& p) { p.total_batch = 100; });
  add("dlb", "min_batch", [](auto& p) { p.min_batch = 40; });
  add("dlb", "speed_half_life", [](auto& p) { p.speed_half_life = 1.0; });
  add("dlb", "replan_every", [](auto& p) { p.replan_every = 3; });
  // Straggler re-planning: scheduled re-plans rare, so flags show.
  const auto straggling_dlb = [](ps::policy_params& p) {
    p.replan_every = 50;
    p.straggler_replan = true;
  };
  add("dlb", "straggler_replan", [](auto& p) { p.straggler_replan = true; },
      [](ps::policy_params& p) { p.replan_every = 50; });
  add("dlb", "straggler_window", [](auto& p) { p.straggler_window = 2; }, straggling_dlb);
  add("dlb", "straggler_threshold", [](auto& p) { p.straggler_threshold = 5.0; }, straggling_dlb);
  add("dlb", "straggler_consecutive", [](auto& p) { p.straggler_consecutive = 1; }, straggling_dlb);
  const auto straggling_ashl = [](ps::policy_params& p) {
    p.replanner = "profile";
    p.replan_drift = 100.0;  // only flags re-plan
    p.straggler_replan = true;
  };
  // Each membership re-plan (the script joins and evicts) starts the
  // re-planner, and so its detector, again (docs/elastic.md §2.4): short
  // windows, so that flags can fire between two of them.
  const auto quick_straggling_ashl = [=](ps::policy_params& p) {
    straggling_ashl(p);
    p.straggler_window = 2;
    p.straggler_consecutive = 1;
  };
  add("ashl", "straggler_replan", [](auto& p) { p.straggler_replan = true; }, [](ps::policy_params& p) {
    p.replanner = "profile";
    p.replan_drift = 100.0;
    p.straggler_window = 2;
    p.straggler_consecutive = 1;
  });
  add("ashl", "straggler_window", [](auto& p) { p.straggler_window = 2; }, straggling_ashl);
  add("ashl", "straggler_threshold", [](auto& p) { p.straggler_threshold = 5.0; }, quick_straggling_ashl);
  add("ashl", "straggler_consecutive", [](auto& p) { p.straggler_consecutive = 1; }, straggling_ashl);
  add("joint", "s_min", [](auto& p) { p.s_min = 5; });
  add("joint", "s_max", [](auto& p) { p.s_max = 1; });
  add("joint", "min_batch", [](auto& p) { p.min_batch = 16; });
  add("joint", "max_batch", [](auto& p) { p.max_batch = 32; });
  add("joint", "batch_step", [](auto& p) { p.batch_step = 24; });
  add("joint", "horizon", [](auto& p) { p.horizon = 1.0; });
  add("joint", "staleness_cost", [](auto& p) { p.staleness_cost = 1.0; });
  add("joint", "replan_drift", [](auto& p) { p.replan_drift = 5.0; });
  add("joint", "speed_half_life", [](auto& p) { p.speed_half_life = 1.0; });
  add("coded_bsp", "stragglers", [](auto& p) { p.stragglers = 2; });
  add("coded_bsp", "batch_size", [](auto& p) { p.batch_size = 32; });
  // The DiLoCo family decides as its parent policy does: the same cases.
  const std::size_t parents = c.size();
  for (std::size_t i = 0; i < parents; ++i) {
    const field_case parent = c[i];
    const auto copy = [&](const std::string& name) {
      if (parent.field == "workers") return;  // already added for every name
      field_case x = parent;
      x.policy = name;
      c.push_back(std::move(x));
    };
    if (parent.policy == "local_sgd") copy("diloco");
    if (parent.policy == "ashl" && parent.field != "planner") copy("ashl_diloco");
    if (parent.policy == "asp") {
      copy("async_diloco");
      copy("async_local_sgd");
    }
  }
  for (std::string n : {"async_diloco", "async_local_sgd"})
    add(n, "local_steps", [](auto& p) { p.local_steps = 3; });
  return c;
}

std::vector<ps_cases::trace_entry> trace_of(const std::string& policy, const ps::policy_params& p) {
  auto r = ps::make_policy(policy, p);
  BOOST_REQUIRE_MESSAGE(r.has_value(), policy + ": " + (r ? std::string() : r.error().message()));
  return ps_cases::trace(*r, script_workers, 5, script_events);
}
}  // namespace

BOOST_AUTO_TEST_CASE(every_field_a_policy_reads_changes_what_it_decides) {
  const auto cases = field_cases();
  std::set<std::pair<std::string, std::string>> covered;
  for (const auto& c : cases) {
    ps::policy_params a = ps_cases::base_params(c.policy, static_cast<std::int64_t>(script_workers));
    c.base(a);
    ps::policy_params b = a;
    c.change(b);
    const auto ta = trace_of(c.policy, a);
    const auto tb = trace_of(c.policy, b);
    BOOST_TEST(!(ta == tb), c.policy + "." + c.field + " changed nothing");
    covered.insert({c.policy, c.field});
  }
  // Every field the table says a policy reads has a case.
  for (const auto& d : ps::policies) {
    std::istringstream fields{std::string(d.fields)};
    for (std::string f; fields >> f;)
      BOOST_TEST(covered.count({std::string(d.name), f}) == 1u, std::string(d.name) + "." + f + " has no case");
  }
}

BOOST_AUTO_TEST_CASE(fields_a_policy_does_not_read_change_nothing) {
  // ssp does not read bsp's weighting, nor ashl's planner.
  auto a = ps_cases::base_params("ssp", 4);
  auto b = a;
  b.weighting = "samples";
  b.planner = "profile";
  b.local_steps = 7;
  BOOST_TEST((trace_of("ssp", a) == trace_of("ssp", b)));
}

BOOST_AUTO_TEST_CASE(ashl_summary_sees_every_instantiation) {
  for (const auto& c : ps_cases::every_policy(2)) {
    auto r = ps::make_policy(c.name, c.params);
    BOOST_TEST_REQUIRE(r.has_value());
    const auto s = ps::ashl_summary_of(*r);
    BOOST_TEST(s.has_value() == (c.name == "ashl" || c.name == "ashl_diloco"), c.label);
    if (s) BOOST_TEST((s->stage == stage_id::profile), c.label);
  }
  // After profiling: the plan the planner made, and the stage.
  auto p = ps_cases::base_params("ashl", 2);
  p.profile_iterations = 1;
  p.h_ahl = 6;
  auto r = ps::make_policy("ashl", p);
  BOOST_TEST_REQUIRE(r.has_value());
  as::outcome_sink out(2);
  for (as::worker_id w = 0; w < 2; ++w) {  // a cycle: its commit, then its compute measurement
    (void)r->on_commit({.worker = w, .sequence = 1}, out);
    r->on_measurement({.worker = w, .kind = ashl::measurement_kind::compute, .seconds = 0.1}, out);
  }
  const auto s = ps::ashl_summary_of(*r);
  BOOST_TEST_REQUIRE(s.has_value());
  BOOST_TEST((s->stage == stage_id::ahl));
  BOOST_TEST(s->planner_status.ok());
  BOOST_TEST_REQUIRE(s->plan.workers.size() == 2u);
  BOOST_TEST(s->plan.workers[1].h_ahl == 6u);
  BOOST_TEST(s->plan.workers[1].share == 0.5);
}

BOOST_AUTO_TEST_CASE(replan_report_names_the_worker_and_the_reason) {
  auto p = with_workers(3);
  p.total_batch = 120;
  p.replan_every = 1000;
  p.speed_half_life = 1e-9;
  p.straggler_replan = true;
  p.straggler_window = 4;
  auto r = ps::make_policy("dlb", p);
  BOOST_TEST_REQUIRE(r.has_value());
  as::outcome_sink out(3);
  const auto measure = [&](as::worker_id w, double s) {
    out.clear();
    r->on_measurement({.worker = w, .kind = ashl::measurement_kind::compute, .seconds = s, .amount = 40}, out);
  };
  for (int n = 0; n < 8; ++n) {
    measure(0, 0.1);
    measure(1, 0.1);
    measure(2, 0.4);  // 4x slower by design: never flagged
  }
  auto rep = ps::replan_report_of(*r);
  BOOST_TEST_REQUIRE(rep.has_value());
  BOOST_TEST(rep->reason == "none");
  for (int n = 0; n < 8; ++n) measure(1, 0.2);  // 2x slower than its own prediction
  rep = ps::replan_report_of(*r);
  BOOST_TEST_REQUIRE(rep.has_value());
  BOOST_TEST(rep->replans == 1u);
  BOOST_TEST(rep->straggler_replans == 1u);
  BOOST_TEST(rep->reason == "straggler");
  BOOST_TEST(rep->worker == 1u);
  BOOST_TEST(rep->measured == 0.005, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(rep->predicted == 0.0025, boost::test_tools::tolerance(1e-12));
  // Off by default: the plain dlb; other policies have no report.
  p.straggler_replan = false;
  auto plain = ps::make_policy("dlb", p);
  BOOST_TEST_REQUIRE(plain.has_value());
  BOOST_TEST(plain->target<as::dlb>() != nullptr);
  BOOST_TEST(!ps::replan_report_of(*ps::make_policy("ssp", with_workers(2))).has_value());
}

// The DiLoCo family: one name sets the policy and the servers' outer
// optimizer (ps::outer_optimizer_of); the other policies keep theirs.
BOOST_AUTO_TEST_CASE(diloco_names_set_the_outer_optimizer) {
  using kind = ps::optimizer_params::kind;
  auto p = with_workers(4);
  auto sync_o = ps::outer_optimizer_of("diloco", p);
  BOOST_TEST_REQUIRE(sync_o.has_value());
  BOOST_TEST((sync_o->mode == kind::outer));
  BOOST_TEST(sync_o->lr == 0.7);
  BOOST_TEST(sync_o->momentum == 0.9);
  BOOST_TEST(sync_o->nesterov);
  BOOST_TEST(sync_o->nesterov_delay == 1u);  // synchronous rounds: plain Nesterov once per round
  for (const char* n : {"async_diloco", "async_local_sgd", "ashl_diloco"}) {
    auto o = ps::outer_optimizer_of(n, p);
    BOOST_TEST_REQUIRE(o.has_value(), n);
    BOOST_TEST(o->nesterov_delay == 4u, n);  // N = 0: the workers
  }
  p.outer_delay = 2;
  p.outer_activation = 0.5;
  BOOST_TEST(ps::outer_optimizer_of("async_diloco", p)->nesterov_delay == 2u);
  BOOST_TEST(ps::outer_optimizer_of("async_diloco", p)->nesterov_activation == 0.5);
  BOOST_TEST(ps::outer_optimizer_of("diloco", p)->nesterov_delay == 1u);  // not read by the synchronous form
  // Momentum 0: no Nesterov, no delay (plain outer SGD; lr 1 is plain averaging).
  p = with_workers(4);
  p.outer_momentum = 0.0;
  p.outer_lr = 1.0;
  auto plain = ps::outer_optimizer_of("async_diloco", p);
  BOOST_TEST_REQUIRE(plain.has_value());
  BOOST_TEST(!plain->nesterov);
  BOOST_TEST(plain->nesterov_delay == 1u);
  BOOST_TEST(plain->plain_average());
  // Other names: the optimizer given.
  const ps::optimizer_params sgd{.mode = kind::sgd, .lr = 0.05};
  BOOST_TEST((*ps::outer_optimizer_of("ssp", with_workers(2), sgd) == sgd));
  BOOST_TEST((ps::outer_optimizer_of("local_sgd", with_workers(2))->mode == kind::model_delta));
  // Every outer field the table names changes the optimizer.
  std::map<std::string, std::function<void(ps::policy_params&)>> change{
      {"outer_lr", [](auto& q) { q.outer_lr = 0.5; }},
      {"outer_momentum", [](auto& q) { q.outer_momentum = 0.5; }},
      {"outer_nesterov", [](auto& q) { q.outer_nesterov = false; }},
      {"outer_weight_decay", [](auto& q) { q.outer_weight_decay = 0.01; }},
      {"outer_delay", [](auto& q) { q.outer_delay = 2; }},
      {"outer_activation", [](auto& q) { q.outer_activation = 0.25; }}};
  for (const auto& d : ps::policies) {
    std::istringstream fields{std::string(d.outer)};
    for (std::string f; fields >> f;) {
      BOOST_TEST_REQUIRE(change.count(f) == 1u, f);
      auto a = with_workers(4), b = a;
      change[f](b);
      BOOST_TEST(!(*ps::outer_optimizer_of(d.name, a) == *ps::outer_optimizer_of(d.name, b)),
                 std::string(d.name) + "." + f + " changed nothing");
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_outer_parameters_are_refused_by_name) {
  const auto outer_error = [](const char* name, ps::policy_params p) {
    auto o = ps::outer_optimizer_of(name, p);
    auto m = ps::make_policy(name, p);  // make_policy refuses the same
    BOOST_TEST(!m.has_value());
    return o ? std::string("ok") : o.error().message();
  };
  auto p = with_workers(4);
  p.outer_lr = 0.0;
  BOOST_TEST(outer_error("diloco", p) == "diloco.outer_lr = 0: must be finite and > 0");
  p.outer_lr = std::nan("");
  BOOST_TEST(outer_error("async_diloco", p) == "async_diloco.outer_lr = nan: must be finite and > 0");
  p = with_workers(4);
  p.outer_momentum = 1.0;
  BOOST_TEST(outer_error("diloco", p) == "diloco.outer_momentum = 1: must be in [0, 1)");
  p = with_workers(4);
  p.outer_weight_decay = -1.0;
  BOOST_TEST(outer_error("ashl_diloco", p) == "ashl_diloco.outer_weight_decay = -1: must be finite and >= 0");
  p = with_workers(4);
  p.outer_delay = -1;
  BOOST_TEST(outer_error("async_local_sgd", p) == "async_local_sgd.outer_delay = -1: must be >= 0");
  p = with_workers(4);
  p.outer_nesterov = false;
  p.outer_delay = 3;
  BOOST_TEST(outer_error("async_diloco", p) ==
             "async_diloco.outer_delay = 3: Delayed Nesterov needs outer_nesterov and outer_momentum > 0");
  p = with_workers(4);
  p.outer_activation = 2.0;
  BOOST_TEST(outer_error("async_diloco", p) == "async_diloco.outer_activation = 2: must be in [0, 1]");
}

// async_diloco: every worker runs local_steps per commit, each commit is
// applied at once at weight 1/M; diloco rounds as local_sgd.
BOOST_AUTO_TEST_CASE(diloco_policies_plan_local_steps_and_weights) {
  auto p = with_workers(4);
  p.local_steps = 50;
  auto a = ps::make_policy("async_diloco", p);
  BOOST_TEST_REQUIRE(a.has_value());
  as::outcome_sink out(4);
  for (as::worker_id w = 0; w < 4; ++w) BOOST_TEST(a->plan(w).local_iterations == 50u);
  const auto d = a->on_commit({.worker = 2, .sequence = 1}, out);
  BOOST_TEST((d.action == as::commit_action::apply));
  BOOST_TEST(d.weight == 0.25);
  auto s = ps::make_policy("diloco", p);
  BOOST_TEST_REQUIRE(s.has_value());
  BOOST_TEST(s->plan(1).local_iterations == 50u);
  BOOST_TEST((s->on_commit({.worker = 0, .sequence = 1}, out).action == as::commit_action::buffer));
}
