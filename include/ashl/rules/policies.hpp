// ashl/rules/policies.hpp — every consistency policy by name: make_policy(name,
// params) for drivers, configuration files and command lines.
//
//   ashl::ps::policy_params pp;
//   pp.workers = 9;
//   pp.staleness = 3;
//   auto p = ashl::ps::make_policy("ssp", pp);      // result<sync::any_policy>
//   if (!p) std::cerr << p.error().message();       // "ssp.staleness = -1: must be >= 0"
//   std::cout << ashl::ps::policy_help();           // one line per policy: name, fields it reads
//
// The names live once, in `policies` (name, the policy_params fields it
// reads, a one-line description); make_policy, its errors and help texts all
// read that table. Each policy reads only the fields listed for it. ASHL's
// planner ("uniform" or "profile") and re-planner ("none" or "profile") pick
// the ashl_schedule instantiation; the profile models come from
// rules/planners.hpp. ps composes sync and profile, so this is where the
// choice of planner meets the policy (docs/design.md "Layers"); the simulator and
// the servers drive the result through sync::any_policy.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/status.hpp>
#include <ashl/rules/job_limits.hpp>
#include <ashl/rules/optimizer.hpp>
#include <ashl/rules/planners.hpp>
#include <ashl/sync/adsp.hpp>
#include <ashl/sync/any_policy.hpp>
#include <ashl/sync/ashl_plan.hpp>
#include <ashl/sync/ashl_schedule.hpp>
#include <ashl/sync/asp.hpp>
#include <ashl/sync/bsp.hpp>
#include <ashl/sync/coded_bsp.hpp>
#include <ashl/sync/dlb.hpp>
#include <ashl/sync/dssp.hpp>
#include <ashl/sync/events.hpp>
#include <ashl/sync/joint.hpp>
#include <ashl/sync/local_sgd.hpp>
#include <ashl/sync/semi_async.hpp>
#include <ashl/sync/ssp.hpp>
#include <ashl/sync/staged.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

// ------------------------------------------------------------ the one list

struct policy_description {
  std::string_view name;
  std::string_view fields;  // the policy_params fields make_policy reads, space-separated
  std::string_view what;
  // The policy_params fields its servers' outer optimizer reads
  // (outer_optimizer_of; the DiLoCo family only): they change the
  // optimizer, not what the policy decides.
  std::string_view outer = {};
};

// Indexed by policy_kind.
inline constexpr std::array<policy_description, 15> policies{{
    {"bsp", "workers weighting batch_size min_workers", "bulk synchronous rounds, mean or samples-weighted"},
    {"asp", "workers staleness_weight staleness_exponent", "apply every commit at once"},
    {"ssp", "workers staleness staleness_weight staleness_exponent", "hold a pull while c_i - min c_j > staleness"},
    {"local_sgd", "workers local_steps weighting batch_size min_workers", "synchronous rounds of local_steps local steps"},
    {"dssp", "workers s_min s_max window staleness_weight staleness_exponent",
     "SSP whose bound moves in [s_min, s_max] with iteration times"},
    {"semi_async", "workers sync_every_iterations sync_every_seconds staleness_weight staleness_exponent min_workers",
     "asynchronous, with a global barrier every K iterations or seconds"},
    {"adsp",
     "workers period t_min search_every target_loss loss_rise initial_commit_rate max_commit_rate staleness_weight "
     "staleness_exponent",
     "commit-rate control with the online commit-rate search"},
    {"ashl",
     "workers profile_iterations profile_seconds h_ahl h_shl compression_ratio switch_loss shl_staleness "
     "staleness_weight staleness_exponent planner replanner profile_trim profile_warmup replan_drift "
     "replan_half_life straggler_replan straggler_window straggler_threshold straggler_consecutive",
     "profiling, then AHL (async, D_i weights), then SHL (SSP) after the loss falls below switch_loss"},
    {"dlb",
     "workers total_batch min_batch speed_half_life replan_every straggler_replan straggler_window "
     "straggler_threshold straggler_consecutive",
     "BSP with per-worker batches proportional to measured throughput"},
    {"joint",
     "workers s_min s_max min_batch max_batch batch_step horizon staleness_cost replan_drift speed_half_life",
     "per-worker batches and the SSP bound chosen together for the least predicted time per sample"},
    {"coded_bsp", "workers stragglers batch_size",
     "BSP with gradient coding: a round completes after the first workers - stragglers commits"},
    // The DiLoCo family: a consistency policy with the outer optimizer on
    // its model deltas (outer_optimizer_of; docs/algorithms.md "The DiLoCo family").
    {"diloco", "workers local_steps weighting batch_size min_workers",
     "DiLoCo: synchronous rounds of local_steps inner steps, one outer (Nesterov) step per round on the mean delta",
     "outer_lr outer_momentum outer_nesterov outer_weight_decay"},
    {"async_diloco", "workers local_steps staleness_weight staleness_exponent",
     "Async Local-SGD: each worker commits after local_steps, one outer step per commit with Delayed Nesterov",
     "outer_lr outer_momentum outer_nesterov outer_weight_decay outer_delay outer_activation"},
    {"async_local_sgd", "workers local_steps staleness_weight staleness_exponent",
     "the same as async_diloco (the paper's name)",
     "outer_lr outer_momentum outer_nesterov outer_weight_decay outer_delay outer_activation"},
    {"ashl_diloco",
     "workers profile_iterations profile_seconds h_ahl h_shl compression_ratio switch_loss shl_staleness "
     "staleness_weight staleness_exponent replanner profile_trim profile_warmup replan_drift replan_half_life "
     "straggler_replan straggler_window straggler_threshold straggler_consecutive",
     "heterogeneity-aware DiLoCo: ASHL with the profile planner (H_i, D_i, R_i) and Delayed Nesterov per commit",
     "outer_lr outer_momentum outer_nesterov outer_weight_decay outer_delay outer_activation"},
}};

enum class policy_kind : std::uint8_t {
  bsp, asp, ssp, local_sgd, dssp, semi_async, adsp, ashl, dlb, joint, coded_bsp,
  diloco, async_diloco, async_local_sgd, ashl_diloco
};
static_assert(policies[static_cast<std::size_t>(policy_kind::bsp)].name == "bsp" &&
                  policies[static_cast<std::size_t>(policy_kind::local_sgd)].name == "local_sgd" &&
                  policies[static_cast<std::size_t>(policy_kind::adsp)].name == "adsp" &&
                  policies[static_cast<std::size_t>(policy_kind::dlb)].name == "dlb" &&
                  policies[static_cast<std::size_t>(policy_kind::ashl_diloco)].name == "ashl_diloco",
              "policy_kind indexes policies");

inline constexpr std::array<std::string_view, 2> ashl_planner_names{"uniform", "profile"};
inline constexpr std::array<std::string_view, 2> ashl_replanner_names{"none", "profile"};
inline constexpr std::array<std::string_view, 3> staleness_weight_names{"none", "inverse", "power"};
inline constexpr std::array<std::string_view, 2> weighting_names{"mean", "samples"};

// "a, b or c"
template <std::size_t N>
std::string one_of(const std::array<std::string_view, N>& names) {
  std::string s;
  for (std::size_t i = 0; i < N; ++i) {
    if (i > 0) s += i + 1 == N ? " or " : ", ";
    s += names[i];
  }
  return s;
}
inline std::string policy_names_text() {
  std::string s;
  for (const auto& p : policies) {
    if (!s.empty()) s += ", ";
    s += p.name;
  }
  return s;
}
inline std::optional<policy_kind> policy_kind_of(std::string_view name) noexcept {
  for (std::size_t i = 0; i < policies.size(); ++i)
    if (policies[i].name == name) return static_cast<policy_kind>(i);
  return std::nullopt;
}
// One line per policy: "  ssp         workers staleness ... — hold a pull ...".
inline std::string policy_help() {
  std::string s;
  for (const auto& p : policies) {
    s += "  ";
    s += p.name;
    s.append(p.name.size() < 12 ? 12 - p.name.size() : 1, ' ');
    s += p.what;
    s += "\n              reads: ";
    s += p.fields;
    if (!p.outer.empty()) {
      s += "\n              outer optimizer: ";
      s += p.outer;
    }
    s += '\n';
  }
  return s;
}

// ------------------------------------------------------------- parameters

// Every knob of every policy; each policy reads the fields its entry in
// `policies` names. Signed integers so a negative value from a config file
// is reported, not wrapped.
struct policy_params {
  std::int64_t workers = 0;
  // asynchronous policies: scale of an update of staleness τ
  std::string staleness_weight = "none";  // "none" | "inverse" (1/(1+τ)) | "power" ((1+τ)^-exponent)
  double staleness_exponent = 1.0;        // for "power", finite and > 0
  // bsp, local_sgd
  std::string weighting = "mean";  // "mean" | "samples" (b_i / Σb)
  std::int64_t batch_size = 0;     // advertised in the plan; 0: the worker's own
  std::int64_t local_steps = 2;    // local_sgd H
  // bsp, local_sgd, diloco, semi_async: no round (barrier) completes with
  // fewer live workers; joiners count from the next round (docs/elastic.md §2.4)
  std::int64_t min_workers = 1;
  // ssp
  std::int64_t staleness = 3;
  // dssp
  std::int64_t s_min = 1;
  std::int64_t s_max = 5;
  std::int64_t window = 5;
  // semi_async
  std::int64_t sync_every_iterations = 0;
  double sync_every_seconds = 0.0;
  // adsp
  double period = 60.0;
  double t_min = 0.0;
  double search_every = 1000.0;
  double target_loss = 0.3;
  double loss_rise = 0.3;
  std::int64_t initial_commit_rate = 1;
  std::int64_t max_commit_rate = 64;
  // ashl
  std::int64_t profile_iterations = 20;
  double profile_seconds = 0.0;
  std::int64_t h_ahl = 8;
  std::int64_t h_shl = 2;
  double compression_ratio = 1.0;  // r₀ of the planner
  double switch_loss = 0.3;
  std::int64_t shl_staleness = 3;
  std::string planner = "uniform";  // "uniform" | "profile"
  std::string replanner = "none";   // "none" | "profile" (ASHL+: online re-planning)
  std::int64_t profile_trim = 20;   // profile planner/re-planner: samples trimmed off each end
  std::int64_t profile_warmup = 0;  // profile planner/re-planner: first samples skipped
  double replan_drift = 0.2;        // profile re-planner: relative drift that re-plans
  double replan_half_life = 8.0;    // profile re-planner: EWMA half-life, in samples
  // dlb
  std::int64_t total_batch = 0;  // B, samples of a round over all workers; 0: 64 per initial worker (kept as workers join or leave)
  std::int64_t min_batch = 8;
  double speed_half_life = 8.0;  // EWMA half-life of the throughput, in measurements
  std::int64_t replan_every = 1; // completed rounds between re-plans
  // straggler re-planning (dlb; ashl with replanner "profile"): a worker slower
  // than its own prediction for straggler_consecutive windows re-plans at once
  bool straggler_replan = false;
  std::int64_t straggler_window = 8;       // samples of one worker per window
  double straggler_threshold = 0.5;        // flagged above prediction · (1 + threshold)
  std::int64_t straggler_consecutive = 2;  // windows over the line before a re-plan
  // joint (also s_min, s_max, min_batch, replan_drift, speed_half_life)
  std::int64_t max_batch = 128;
  std::int64_t batch_step = 8;
  double horizon = 10.0;          // R: slowest-worker cycles the bound lets others run ahead over
  double staleness_cost = 0.02;   // λ: the objective's factor 1 + λ·s
  // coded_bsp (also batch_size)
  std::int64_t stragglers = 1;  // r: commits a round does not wait for, 0 <= r < workers
  // the DiLoCo family's outer optimizer (outer_optimizer_of): DiLoCo's values
  double outer_lr = 0.7;
  double outer_momentum = 0.9;        // [0, 1); 0: no momentum (outer_nesterov then does nothing)
  bool outer_nesterov = true;
  double outer_weight_decay = 0.0;
  std::int64_t outer_delay = 0;       // asynchronous forms: Delayed Nesterov's N; 0: the number of workers
  double outer_activation = 0.0;      // asynchronous forms: momentum activation c, [0, 1]

  // The one list of these fields (core/fields.hpp): flags, the Python
  // binding's dict and help text are all read off it.
  static constexpr auto fields() {
    return std::tuple{
        field{"workers", &policy_params::workers, "workers of the job (set by the launcher)"},
        field{"staleness_weight", &policy_params::staleness_weight, "none, inverse (1/(1+tau)) or power ((1+tau)^-exponent): scale of a stale update"},
        field{"staleness_exponent", &policy_params::staleness_exponent, "exponent of staleness_weight power, > 0"},
        field{"weighting", &policy_params::weighting, "mean or samples (b_i / sum b): weights of a synchronous round"},
        field{"batch_size", &policy_params::batch_size, "batch advertised in the plan; 0: the worker's own"},
        field{"local_steps", &policy_params::local_steps, "local_sgd: local steps per round (H)"},
        field{"min_workers", &policy_params::min_workers, "bsp, local_sgd, diloco, semi_async: no round completes with fewer live workers (>= 1)"},
        field{"staleness", &policy_params::staleness, "ssp: bound on c_i - min c_j"},
        field{"s_min", &policy_params::s_min, "dssp, joint: smallest staleness bound"},
        field{"s_max", &policy_params::s_max, "dssp, joint: largest staleness bound"},
        field{"window", &policy_params::window, "dssp: iteration-time window"},
        field{"sync_every_iterations", &policy_params::sync_every_iterations, "semi_async: global barrier every K iterations (0: off)"},
        field{"sync_every_seconds", &policy_params::sync_every_seconds, "semi_async: global barrier every so many seconds (0: off)"},
        field{"period", &policy_params::period, "adsp: control period, seconds"},
        field{"t_min", &policy_params::t_min, "adsp: shortest commit interval, seconds"},
        field{"search_every", &policy_params::search_every, "adsp: seconds between commit-rate searches"},
        field{"target_loss", &policy_params::target_loss, "adsp: loss that ends the search"},
        field{"loss_rise", &policy_params::loss_rise, "adsp: relative loss rise that undoes a rate step"},
        field{"initial_commit_rate", &policy_params::initial_commit_rate, "adsp: commits per period to start with"},
        field{"max_commit_rate", &policy_params::max_commit_rate, "adsp: largest commits per period"},
        field{"profile_iterations", &policy_params::profile_iterations, "ashl: profiling iterations per worker"},
        field{"profile_seconds", &policy_params::profile_seconds, "ashl: profiling time, seconds (0: by iterations)"},
        field{"h_ahl", &policy_params::h_ahl, "ashl: local iterations in the AHL stage"},
        field{"h_shl", &policy_params::h_shl, "ashl: local iterations in the SHL stage"},
        field{"compression_ratio", &policy_params::compression_ratio, "ashl: r0, the planner's base compression ratio, (0, 1]"},
        field{"switch_loss", &policy_params::switch_loss, "ashl: loss below which AHL switches to SHL"},
        field{"shl_staleness", &policy_params::shl_staleness, "ashl: SSP bound of the SHL stage"},
        field{"planner", &policy_params::planner, "ashl: uniform or profile"},
        field{"replanner", &policy_params::replanner, "ashl: none or profile (ASHL+: online re-planning)"},
        field{"profile_trim", &policy_params::profile_trim, "profile planner: samples trimmed off each end"},
        field{"profile_warmup", &policy_params::profile_warmup, "profile planner: first samples skipped"},
        field{"replan_drift", &policy_params::replan_drift, "profile re-planner, joint: relative drift that re-plans"},
        field{"replan_half_life", &policy_params::replan_half_life, "profile re-planner: EWMA half-life, samples"},
        field{"total_batch", &policy_params::total_batch, "dlb: samples of a round over all workers (0: 64 per initial worker)"},
        field{"min_batch", &policy_params::min_batch, "dlb, joint: smallest per-worker batch"},
        field{"speed_half_life", &policy_params::speed_half_life, "dlb, joint: EWMA half-life of the throughput, measurements"},
        field{"replan_every", &policy_params::replan_every, "dlb: completed rounds between re-plans"},
        field{"straggler_replan", &policy_params::straggler_replan, "dlb, ashl: re-plan at once when a worker straggles"},
        field{"straggler_window", &policy_params::straggler_window, "straggler detector: samples per window"},
        field{"straggler_threshold", &policy_params::straggler_threshold, "straggler detector: flagged above prediction * (1 + threshold)"},
        field{"straggler_consecutive", &policy_params::straggler_consecutive, "straggler detector: windows over the line before a re-plan"},
        field{"max_batch", &policy_params::max_batch, "joint: largest per-worker batch"},
        field{"batch_step", &policy_params::batch_step, "joint: batch granularity"},
        field{"horizon", &policy_params::horizon, "joint: slowest-worker cycles the bound lets others run ahead over"},
        field{"staleness_cost", &policy_params::staleness_cost, "joint: lambda of the objective 1 + lambda * s"},
        field{"stragglers", &policy_params::stragglers, "coded_bsp: commits a round does not wait for, 0 <= r < workers"},
        field{"outer_lr", &policy_params::outer_lr, "DiLoCo family: outer learning rate, > 0 (1 with momentum 0: plain averaging)"},
        field{"outer_momentum", &policy_params::outer_momentum, "DiLoCo family: outer momentum, [0, 1)"},
        field{"outer_nesterov", &policy_params::outer_nesterov, "DiLoCo family: Nesterov momentum (when outer_momentum > 0)"},
        field{"outer_weight_decay", &policy_params::outer_weight_decay, "DiLoCo family: outer weight decay, >= 0"},
        field{"outer_delay", &policy_params::outer_delay, "async_diloco, ashl_diloco: Delayed Nesterov's N, commits per momentum fold (0: workers)"},
        field{"outer_activation", &policy_params::outer_activation, "async_diloco, ashl_diloco: Delayed Nesterov's momentum activation c, [0, 1]"}};
  }
};
namespace detail {
constexpr bool fields_known(std::string_view f) {
  while (!f.empty()) {
    const auto sp = f.find(' ');
    if (!has_field<policy_params>(f.substr(0, sp))) return false;
    f = sp == std::string_view::npos ? std::string_view{} : f.substr(sp + 1);
  }
  return true;
}
// Every field a policy's entry in `policies` says it reads is in the table.
constexpr bool policy_fields_known() {
  for (const auto& p : policies) {
    if (!fields_known(p.outer) || !fields_known(p.fields)) return false;
  }
  return true;
}
}  // namespace detail
static_assert(detail::policy_fields_known(), "a policy reads a field that policy_params::fields() does not list");


namespace detail {
inline std::string field(std::string_view policy, std::string_view name) {
  std::string s(policy);
  s += '.';
  s += name;
  return s;
}
inline status at_least(std::string_view policy, std::string_view name, std::int64_t v, std::int64_t lo) {
  if (v < lo) return invalid_argument(field(policy, name), v, "must be >= " + std::to_string(lo));
  return {};
}
inline status at_most_u32(std::string_view policy, std::string_view name, std::int64_t v) {
  if (v > 0xffffffffll) return invalid_argument(field(policy, name), v, "must be < 2^32");
  return {};
}
inline status positive(std::string_view policy, std::string_view name, double v) {
  if (!(v > 0.0) || !std::isfinite(v)) return invalid_argument(field(policy, name), v, "must be finite and > 0");
  return {};
}
inline status non_negative(std::string_view policy, std::string_view name, double v) {
  if (!(v >= 0.0) || !std::isfinite(v)) return invalid_argument(field(policy, name), v, "must be finite and >= 0");
  return {};
}
inline status finite(std::string_view policy, std::string_view name, double v) {
  if (!std::isfinite(v)) return invalid_argument(field(policy, name), v, "must be finite");
  return {};
}
inline status ratio(std::string_view policy, std::string_view name, double v) {
  if (!(v > 0.0 && v <= 1.0)) return invalid_argument(field(policy, name), v, "must be in (0, 1]");
  return {};
}
inline result<sync::staleness_weighting> staleness_of(std::string_view policy, const policy_params& p) {
  if (p.staleness_weight == "none") return sync::staleness_weighting::none();
  if (p.staleness_weight == "inverse") return sync::staleness_weighting::inverse();
  if (p.staleness_weight == "power") {
    ASHL_TRY(positive(policy, "staleness_exponent", p.staleness_exponent));
    return sync::staleness_weighting::power(p.staleness_exponent);
  }
  return invalid_argument(field(policy, "staleness_weight"), p.staleness_weight,
                          "must be " + one_of(staleness_weight_names));
}
// min_workers may exceed the workers a job starts with (it then waits for
// joins), never the job's bound.
inline status min_workers_of(std::string_view policy, const policy_params& p) {
  ASHL_TRY(at_least(policy, "min_workers", p.min_workers, 1));
  if (p.min_workers > static_cast<std::int64_t>(max_workers))
    return out_of_range(field(policy, "min_workers"), p.min_workers,
                        "must be at most " + std::to_string(max_workers) + " (ps::max_workers)");
  return {};
}
inline result<sync::round_weighting> weighting_of(std::string_view policy, const policy_params& p) {
  if (p.weighting == "mean") return sync::round_weighting::mean;
  if (p.weighting == "samples") return sync::round_weighting::samples;
  return invalid_argument(field(policy, "weighting"), p.weighting, "must be " + one_of(weighting_names));
}
inline std::uint32_t u32(std::int64_t v) noexcept { return static_cast<std::uint32_t>(v); }

inline status straggler_fields(std::string_view policy, const policy_params& p) {
  ASHL_TRY(at_least(policy, "straggler_window", p.straggler_window, 1));
  ASHL_TRY(at_most_u32(policy, "straggler_window", p.straggler_window));
  ASHL_TRY(non_negative(policy, "straggler_threshold", p.straggler_threshold));
  ASHL_TRY(at_least(policy, "straggler_consecutive", p.straggler_consecutive, 1));
  ASHL_TRY(at_most_u32(policy, "straggler_consecutive", p.straggler_consecutive));
  return {};
}

template <class Planner, class Replanner>
sync::any_policy ashl_of(const sync::ashl_params& ap, Planner planner, Replanner replanner) {
  return sync::any_policy(sync::ashl_schedule<Planner, Replanner>(ap, std::move(planner), std::move(replanner)));
}

// ASHL with the planner and re-planner chosen by name. The profile fields
// (trim, warm-up, drift, half-life) are read only when a profile model is.
inline result<sync::any_policy> make_ashl(const policy_params& p, const sync::ashl_params& ap) {
  std::size_t planner = ashl_planner_names.size(), replanner = ashl_replanner_names.size();
  for (std::size_t i = 0; i < ashl_planner_names.size(); ++i)
    if (ashl_planner_names[i] == p.planner) planner = i;
  for (std::size_t i = 0; i < ashl_replanner_names.size(); ++i)
    if (ashl_replanner_names[i] == p.replanner) replanner = i;
  if (planner == ashl_planner_names.size())
    return invalid_argument("ashl.planner", p.planner, "must be " + one_of(ashl_planner_names));
  if (replanner == ashl_replanner_names.size())
    return invalid_argument("ashl.replanner", p.replanner, "must be " + one_of(ashl_replanner_names));
  const sync::uniform_planner uniform{.h_ahl = u32(p.h_ahl), .h_shl = u32(p.h_shl), .ratio = p.compression_ratio};
  if (planner == 0 && replanner == 0) return ashl_of(ap, uniform, sync::no_replanner{});
  ASHL_TRY(at_least("ashl", "profile_trim", p.profile_trim, 0));
  ASHL_TRY(at_least("ashl", "profile_warmup", p.profile_warmup, 0));
  const profile_planner prof{.h_ahl = u32(p.h_ahl),
                             .h_shl = u32(p.h_shl),
                             .r0 = p.compression_ratio,
                             .trim = static_cast<std::size_t>(p.profile_trim),
                             .warmup = static_cast<std::size_t>(p.profile_warmup)};
  if (replanner == 0) return ashl_of(ap, prof, sync::no_replanner{});
  ASHL_TRY(positive("ashl", "replan_drift", p.replan_drift));
  ASHL_TRY(positive("ashl", "replan_half_life", p.replan_half_life));
  if (p.straggler_replan) ASHL_TRY(straggler_fields("ashl", p));
  const profile_replanner re(prof, {.drift = p.replan_drift,
                                    .half_life = p.replan_half_life,
                                    .stragglers = p.straggler_replan,
                                    .straggler_window = u32(p.straggler_window),
                                    .straggler_threshold = p.straggler_threshold,
                                    .straggler_consecutive = u32(p.straggler_consecutive)});
  if (planner == 0) return ashl_of(ap, uniform, re);
  return ashl_of(ap, prof, re);
}
// The outer optimizer a DiLoCo-family policy runs, from its outer_* fields;
// errors name "<policy>.<field>". Synchronous rounds (diloco) take one
// step per round with plain Nesterov; the asynchronous forms one per
// commit with Delayed Nesterov, N = outer_delay (0: the workers).
inline result<optimizer_params> outer_of(std::string_view name, const policy_params& p, bool async) {
  ASHL_TRY(positive(name, "outer_lr", p.outer_lr));
  if (!(p.outer_momentum >= 0.0 && p.outer_momentum < 1.0))
    return invalid_argument(field(name, "outer_momentum"), p.outer_momentum, "must be in [0, 1)");
  ASHL_TRY(non_negative(name, "outer_weight_decay", p.outer_weight_decay));
  optimizer_params o{.mode = optimizer_params::kind::outer,
                     .lr = p.outer_lr,
                     .momentum = p.outer_momentum,
                     .weight_decay = p.outer_weight_decay,
                     .nesterov = p.outer_nesterov && p.outer_momentum > 0.0};
  if (async) {
    ASHL_TRY(at_least(name, "outer_delay", p.outer_delay, 0));
    ASHL_TRY(at_most_u32(name, "outer_delay", p.outer_delay));
    if (!(p.outer_activation >= 0.0 && p.outer_activation <= 1.0))
      return invalid_argument(field(name, "outer_activation"), p.outer_activation, "must be in [0, 1]");
    const std::int64_t n = p.outer_delay == 0 ? p.workers : p.outer_delay;
    if (o.nesterov) {
      o.nesterov_delay = u32(n);
      if (n > 1) o.nesterov_activation = p.outer_activation;
    } else if (p.outer_delay > 1) {
      return invalid_argument(field(name, "outer_delay"), p.outer_delay,
                              "Delayed Nesterov needs outer_nesterov and outer_momentum > 0");
    }
  }
  ASHL_TRY(o.validate());
  return o;
}
}  // namespace detail

// Whether `name` is a DiLoCo-family policy (its servers run the outer
// optimizer of outer_optimizer_of).
inline bool runs_outer_optimizer(std::string_view name) noexcept {
  const auto k = policy_kind_of(name);
  return k && (*k == policy_kind::diloco || *k == policy_kind::async_diloco || *k == policy_kind::async_local_sgd ||
               *k == policy_kind::ashl_diloco);
}

// The servers' optimizer for policy `name`: a DiLoCo-family policy's outer
// optimizer from p's outer_* fields; for any other policy `otherwise`
// (model_delta, or the sgd a gradient job runs). Drivers call this with
// the policy's name so that one name sets both.
inline result<optimizer_params> outer_optimizer_of(std::string_view name, const policy_params& p,
                                                   const optimizer_params& otherwise = {}) {
  if (!runs_outer_optimizer(name)) return otherwise;
  return detail::outer_of(name, p, *policy_kind_of(name) != policy_kind::diloco);
}

inline result<sync::any_policy> make_policy(std::string_view name, const policy_params& p) {
  using namespace detail;
  const auto kind = policy_kind_of(name);
  if (!kind) return make_error(errc::not_found, "sync.policy", name, "unknown policy (" + policy_names_text() + ")");
  ASHL_TRY(at_least(name, "workers", p.workers, 1));
  // Policies size per-worker tables now: past the job's bound, refused by
  // name before any allocation (rules/job_limits.hpp).
  if (p.workers > static_cast<std::int64_t>(max_workers))
    return out_of_range(field(name, "workers"), p.workers,
                        "must be at most " + std::to_string(max_workers) + " (ps::max_workers)");
  const auto m = static_cast<std::size_t>(p.workers);
  switch (*kind) {
    case policy_kind::bsp:
    case policy_kind::local_sgd: {
      auto rw = weighting_of(name, p);
      if (!rw) return rw.error();
      ASHL_TRY(at_least(name, "batch_size", p.batch_size, 0));
      ASHL_TRY(at_most_u32(name, "batch_size", p.batch_size));
      ASHL_TRY(min_workers_of(name, p));
      if (*kind == policy_kind::bsp)
        return sync::any_policy(sync::bsp(
            {.workers = m, .weighting = *rw, .batch_size = u32(p.batch_size), .min_workers = u32(p.min_workers)}));
      ASHL_TRY(at_least(name, "local_steps", p.local_steps, 1));
      ASHL_TRY(at_most_u32(name, "local_steps", p.local_steps));
      return sync::any_policy(sync::local_sgd({.workers = m, .local_steps = u32(p.local_steps), .weighting = *rw,
                                               .batch_size = u32(p.batch_size), .min_workers = u32(p.min_workers)}));
    }
    case policy_kind::asp: {
      auto sw = staleness_of(name, p);
      if (!sw) return sw.error();
      return sync::any_policy(sync::asp({.workers = m, .staleness_weight = *sw}));
    }
    case policy_kind::ssp: {
      ASHL_TRY(at_least(name, "staleness", p.staleness, 0));
      ASHL_TRY(at_most_u32(name, "staleness", p.staleness));
      auto sw = staleness_of(name, p);
      if (!sw) return sw.error();
      return sync::any_policy(sync::ssp({.workers = m, .staleness = u32(p.staleness), .staleness_weight = *sw}));
    }
    case policy_kind::dssp: {
      ASHL_TRY(at_least(name, "s_min", p.s_min, 0));
      ASHL_TRY(at_most_u32(name, "s_min", p.s_min));
      ASHL_TRY(at_least(name, "s_max", p.s_max, 0));
      ASHL_TRY(at_most_u32(name, "s_max", p.s_max));
      if (p.s_max < p.s_min) return invalid_argument("dssp.s_max", p.s_max, "must be >= dssp.s_min");
      ASHL_TRY(at_least(name, "window", p.window, 1));
      ASHL_TRY(at_most_u32(name, "window", p.window));
      auto sw = staleness_of(name, p);
      if (!sw) return sw.error();
      return sync::any_policy(sync::dssp({.workers = m, .s_min = u32(p.s_min), .s_max = u32(p.s_max),
                                          .window = u32(p.window), .staleness_weight = *sw}));
    }
    case policy_kind::semi_async: {
      ASHL_TRY(at_least(name, "sync_every_iterations", p.sync_every_iterations, 0));
      ASHL_TRY(at_most_u32(name, "sync_every_iterations", p.sync_every_iterations));
      ASHL_TRY(non_negative(name, "sync_every_seconds", p.sync_every_seconds));
      if (p.sync_every_iterations == 0 && p.sync_every_seconds == 0.0)
        return invalid_argument("semi_async.sync_every_iterations", p.sync_every_iterations,
                                "set it or semi_async.sync_every_seconds");
      ASHL_TRY(min_workers_of(name, p));
      auto sw = staleness_of(name, p);
      if (!sw) return sw.error();
      return sync::any_policy(sync::semi_async({.workers = m, .sync_every_iterations = u32(p.sync_every_iterations),
                                                .sync_every_seconds = p.sync_every_seconds,
                                                .staleness_weight = *sw, .min_workers = u32(p.min_workers)}));
    }
    case policy_kind::adsp: {
      ASHL_TRY(positive(name, "period", p.period));
      ASHL_TRY(non_negative(name, "t_min", p.t_min));
      ASHL_TRY(positive(name, "search_every", p.search_every));
      ASHL_TRY(finite(name, "target_loss", p.target_loss));
      ASHL_TRY(positive(name, "loss_rise", p.loss_rise));
      ASHL_TRY(at_least(name, "initial_commit_rate", p.initial_commit_rate, 1));
      ASHL_TRY(at_most_u32(name, "initial_commit_rate", p.initial_commit_rate));
      if (p.max_commit_rate < p.initial_commit_rate)
        return invalid_argument("adsp.max_commit_rate", p.max_commit_rate, "must be >= adsp.initial_commit_rate");
      ASHL_TRY(at_most_u32(name, "max_commit_rate", p.max_commit_rate));
      auto sw = staleness_of(name, p);
      if (!sw) return sw.error();
      return sync::any_policy(sync::adsp({.workers = m, .period = p.period, .t_min = p.t_min,
                                          .search_every = p.search_every, .target_loss = p.target_loss,
                                          .loss_rise = p.loss_rise, .initial_commit_rate = u32(p.initial_commit_rate),
                                          .max_commit_rate = u32(p.max_commit_rate), .staleness_weight = *sw}));
    }
    case policy_kind::diloco: {
      ASHL_TRY(outer_of(name, p, false).to_status());
      auto rw = weighting_of(name, p);
      if (!rw) return rw.error();
      ASHL_TRY(at_least(name, "batch_size", p.batch_size, 0));
      ASHL_TRY(at_most_u32(name, "batch_size", p.batch_size));
      ASHL_TRY(at_least(name, "local_steps", p.local_steps, 1));
      ASHL_TRY(at_most_u32(name, "local_steps", p.local_steps));
      ASHL_TRY(min_workers_of(name, p));
      return sync::any_policy(sync::local_sgd({.workers = m, .local_steps = u32(p.local_steps), .weighting = *rw,
                                               .batch_size = u32(p.batch_size), .min_workers = u32(p.min_workers)}));
    }
    case policy_kind::async_diloco:
    case policy_kind::async_local_sgd: {
      ASHL_TRY(outer_of(name, p, true).to_status());
      ASHL_TRY(at_least(name, "local_steps", p.local_steps, 1));
      ASHL_TRY(at_most_u32(name, "local_steps", p.local_steps));
      auto sw = staleness_of(name, p);
      if (!sw) return sw.error();
      // Each commit weighs 1/M over the live workers (the paper's 1/N with
      // N = M; it follows joins and evictions), every worker
      // runs local_steps inner steps per commit, nobody waits.
      worker_plan plan;
      plan.local_iterations = u32(p.local_steps);
      return sync::any_policy(sync::asp({.workers = m, .scale = 1.0 / static_cast<double>(m),
                                         .plans = std::vector<worker_plan>(m, plan), .staleness_weight = *sw,
                                         .scale_over_live = true}));
    }
    case policy_kind::ashl_diloco:
    case policy_kind::ashl: {
      if (*kind == policy_kind::ashl_diloco) ASHL_TRY(outer_of(name, p, true).to_status());
      ASHL_TRY(at_least(name, "profile_iterations", p.profile_iterations, 0));
      ASHL_TRY(at_most_u32(name, "profile_iterations", p.profile_iterations));
      ASHL_TRY(non_negative(name, "profile_seconds", p.profile_seconds));
      if (p.profile_iterations == 0 && p.profile_seconds == 0.0)
        return invalid_argument("ashl.profile_iterations", p.profile_iterations, "set it or ashl.profile_seconds");
      ASHL_TRY(at_least(name, "h_ahl", p.h_ahl, 1));
      ASHL_TRY(at_most_u32(name, "h_ahl", p.h_ahl));
      ASHL_TRY(at_least(name, "h_shl", p.h_shl, 1));
      ASHL_TRY(at_most_u32(name, "h_shl", p.h_shl));
      ASHL_TRY(ratio(name, "compression_ratio", p.compression_ratio));
      ASHL_TRY(finite(name, "switch_loss", p.switch_loss));
      ASHL_TRY(at_least(name, "shl_staleness", p.shl_staleness, 0));
      ASHL_TRY(at_most_u32(name, "shl_staleness", p.shl_staleness));
      auto sw = staleness_of(name, p);
      if (!sw) return sw.error();
      policy_params planned = p;
      // The heterogeneity-aware form plans H_i, D_i and R_i from the profile.
      if (*kind == policy_kind::ashl_diloco) planned.planner = "profile";
      return make_ashl(planned, {.workers = m,
                           .profile_iterations = u32(p.profile_iterations),
                           .profile_seconds = p.profile_seconds,
                           .to_shl = sync::switch_trigger{.loss_below = p.switch_loss},
                           .shl_staleness = u32(p.shl_staleness),
                           .ahl_staleness_weight = *sw});
    }
    case policy_kind::dlb: {
      ASHL_TRY(at_least(name, "total_batch", p.total_batch, 0));
      ASHL_TRY(at_least(name, "min_batch", p.min_batch, 1));
      ASHL_TRY(at_most_u32(name, "min_batch", p.min_batch));
      const std::int64_t total = p.total_batch == 0 ? 64 * p.workers : p.total_batch;
      ASHL_TRY(at_most_u32(name, "total_batch", total));
      if (total < p.min_batch * p.workers)
        return invalid_argument("dlb.total_batch", total, "must be >= dlb.min_batch * workers");
      ASHL_TRY(positive(name, "speed_half_life", p.speed_half_life));
      ASHL_TRY(at_least(name, "replan_every", p.replan_every, 1));
      ASHL_TRY(at_most_u32(name, "replan_every", p.replan_every));
      const sync::dlb_params dp{.workers = m, .total_batch = u32(total), .min_batch = u32(p.min_batch),
                                .half_life = p.speed_half_life, .replan_every = u32(p.replan_every)};
      if (!p.straggler_replan) return sync::any_policy(sync::dlb(dp));
      ASHL_TRY(straggler_fields(name, p));
      return sync::any_policy(sync::basic_dlb<straggler_monitor>(
          dp, straggler_monitor({.workers = u32(p.workers), .window = u32(p.straggler_window),
                                 .threshold = p.straggler_threshold,
                                 .consecutive = u32(p.straggler_consecutive)})));
    }
    case policy_kind::joint: {
      ASHL_TRY(at_least(name, "s_min", p.s_min, 0));
      ASHL_TRY(at_most_u32(name, "s_min", p.s_min));
      ASHL_TRY(at_least(name, "s_max", p.s_max, 0));
      ASHL_TRY(at_most_u32(name, "s_max", p.s_max));
      if (p.s_max < p.s_min) return invalid_argument("joint.s_max", p.s_max, "must be >= joint.s_min");
      ASHL_TRY(at_least(name, "min_batch", p.min_batch, 1));
      ASHL_TRY(at_least(name, "batch_step", p.batch_step, 1));
      ASHL_TRY(at_most_u32(name, "batch_step", p.batch_step));
      if (p.max_batch < p.min_batch) return invalid_argument("joint.max_batch", p.max_batch, "must be >= joint.min_batch");
      ASHL_TRY(at_most_u32(name, "max_batch", p.max_batch));
      if ((p.max_batch - p.min_batch) / p.batch_step >= 4096)
        return invalid_argument("joint.batch_step", p.batch_step, "gives more than 4096 batch sizes");
      ASHL_TRY(positive(name, "horizon", p.horizon));
      ASHL_TRY(non_negative(name, "staleness_cost", p.staleness_cost));
      ASHL_TRY(positive(name, "replan_drift", p.replan_drift));
      ASHL_TRY(positive(name, "speed_half_life", p.speed_half_life));
      return sync::any_policy(sync::joint({.workers = m, .s_min = u32(p.s_min), .s_max = u32(p.s_max),
                                           .min_batch = u32(p.min_batch), .max_batch = u32(p.max_batch),
                                           .batch_step = u32(p.batch_step), .horizon = p.horizon,
                                           .staleness_cost = p.staleness_cost, .drift = p.replan_drift,
                                           .half_life = p.speed_half_life}));
    }
    case policy_kind::coded_bsp: {
      ASHL_TRY(at_least(name, "stragglers", p.stragglers, 0));
      if (p.stragglers >= p.workers)
        return invalid_argument("coded_bsp.stragglers", p.stragglers,
                                "must be < workers (" + std::to_string(p.workers) + ")");
      if (p.stragglers > 0 && p.workers > static_cast<std::int64_t>(profile::gradient_code_max_workers))
        return invalid_argument("coded_bsp.workers", p.workers,
                                "must be <= " + std::to_string(profile::gradient_code_max_workers) +
                                    " when stragglers > 0");
      ASHL_TRY(at_least(name, "batch_size", p.batch_size, 0));
      ASHL_TRY(at_most_u32(name, "batch_size", p.batch_size));
      return sync::any_policy(
          sync::coded_bsp({.workers = m, .stragglers = u32(p.stragglers), .batch_size = u32(p.batch_size)}));
    }
  }
  return make_error(errc::internal, "sync.policy", name, "no builder");
}

// ------------------------------------------------- what an ASHL run did

// For reports: the ASHL schedule's state behind an any_policy that
// make_policy built, whatever its planner and re-planner (the four
// instantiations make_ashl makes).
struct ashl_summary {
  stage_id stage = stage_id::profile;
  std::size_t replans = 0;
  status planner_status;
  status replan_status;
  double switched_at = 0.0;  // when SHL began; meaningful when stage is shl
  sync::ashl_plan plan;      // the plan in force as its planner made it (current_plan())
  bool reprofiling = false;  // a membership change's re-profiling window is open (docs/elastic.md §2.4)
  std::uint64_t membership_replans = 0;  // plans the planner made over the live set after such a window
};

namespace detail {
template <class S>
bool summarise_as(const sync::any_policy& p, ashl_summary& out) {
  const S* s = p.target<S>();
  if (s == nullptr) return false;
  out.stage = s->stage();
  out.replans = s->replans();
  out.planner_status = s->planner_status();
  out.replan_status = s->replan_status();
  out.switched_at = s->switched_at();
  out.plan = s->current_plan();
  out.reprofiling = s->reprofiling();
  out.membership_replans = s->membership_replans();
  return true;
}
}  // namespace detail

// ------------------------------------------------ what re-planning did

// For reports: how often a policy re-planned and why the latest time, behind
// an any_policy that make_policy built: dlb (with or without straggler
// re-planning) and ashl (any planner; the reason needs replanner "profile").
// worker, measured and predicted belong to the latest re-plan's record:
// ashl's (a drift or a straggler, times in seconds per iteration) or dlb's
// latest straggler flag (seconds per sample; reason "none" before one).
struct replan_report {
  std::uint64_t replans = 0;
  std::uint64_t straggler_replans = 0;
  std::string_view reason = "none";  // "none", "drift" or "straggler"
  std::uint32_t worker = 0;
  double measured = 0.0;
  double predicted = 0.0;
};

namespace detail {
template <class S>
bool replan_report_as(const sync::any_policy& p, replan_report& out) {
  const S* s = p.target<S>();
  if (s == nullptr) return false;
  out.replans = s->replans();
  if constexpr (requires { s->replanner().state(); }) {
    if (const profile::replanner* r = s->replanner().state()) {
      out.straggler_replans = r->straggler_replans();
      out.reason = profile::to_string(r->last_replan().reason);
      out.worker = r->last_replan().worker;
      out.measured = r->last_replan().measured;
      out.predicted = r->last_replan().predicted;
    }
  } else if constexpr (requires { s->last_straggler(); }) {
    out.straggler_replans = s->straggler_replans();
    if (out.straggler_replans > 0) {
      out.reason = "straggler";
      out.worker = s->last_straggler().worker;
      out.measured = s->last_straggler().seconds_per_sample;
      out.predicted = s->last_straggler().predicted_per_sample;
    }
  }
  return true;
}
}  // namespace detail

inline std::optional<replan_report> replan_report_of(const sync::any_policy& p) {
  replan_report out;
  using sync::ashl_schedule, sync::uniform_planner, sync::no_replanner;
  if (detail::replan_report_as<sync::dlb>(p, out) ||
      detail::replan_report_as<sync::basic_dlb<straggler_monitor>>(p, out) ||
      detail::replan_report_as<ashl_schedule<uniform_planner, no_replanner>>(p, out) ||
      detail::replan_report_as<ashl_schedule<uniform_planner, profile_replanner>>(p, out) ||
      detail::replan_report_as<ashl_schedule<profile_planner, no_replanner>>(p, out) ||
      detail::replan_report_as<ashl_schedule<profile_planner, profile_replanner>>(p, out))
    return out;
  return std::nullopt;
}

inline std::optional<ashl_summary> ashl_summary_of(const sync::any_policy& p) {
  ashl_summary out;
  using sync::ashl_schedule, sync::uniform_planner, sync::no_replanner;
  if (detail::summarise_as<ashl_schedule<uniform_planner, no_replanner>>(p, out) ||
      detail::summarise_as<ashl_schedule<uniform_planner, profile_replanner>>(p, out) ||
      detail::summarise_as<ashl_schedule<profile_planner, no_replanner>>(p, out) ||
      detail::summarise_as<ashl_schedule<profile_planner, profile_replanner>>(p, out))
    return out;
  return std::nullopt;
}

}  // namespace ps
ASHL_NAMESPACE_END
