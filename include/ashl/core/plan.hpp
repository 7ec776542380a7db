// ashl/core/plan.hpp — the vocabulary every layer shares: what a worker is
// told to do (worker_plan, also the wire's plan_update body), which schedule
// stage it is in (stage_id), what a driver measured (measurement_kind,
// measurement) and which global metric a value is (metric_id).
//
//   ashl::worker_plan p{.local_iterations = 0, .commit_interval_us = 250'000, .stage = ashl::stage_id::adsp};
//   double dt = p.commit_interval();           // 0.25 s: commit by interval, not by H
//   ashl::measurement m{.worker = 2, .kind = ashl::measurement_kind::push, .seconds = 0.012, .amount = 4e6};
//
// These are plain values with fixed-width fields: sync/, profile/, wire/ and
// ps/ all speak them, so a plan made by a policy is the body a server sends,
// and a measurement a worker reports is what the planner reads, without a
// translation layer (docs/design.md "Interfaces"; issue "One vocabulary").
// Numeric values are part of the wire format: never renumber, only append.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/enum_table.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/status.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>
#include <string>
#include <string_view>

ASHL_NAMESPACE_BEGIN

// ------------------------------------------------------------------ stages

// The policy or schedule stage a plan belongs to. Integer on hot paths and on
// the wire; names (to_string) only for telemetry.
enum class stage_id : std::uint32_t {
  none = 0,
  bsp = 1,
  asp = 2,
  ssp = 3,
  local_sgd = 4,
  dssp = 5,
  semi_async = 6,
  adsp = 7,
  profile = 8,  // ASHL phase 0
  ahl = 9,      // ASHL phase 1
  shl = 10,     // ASHL phase 2
  dlb = 11,
};
inline constexpr auto stage_id_table = make_enum_table<stage_id>(
    "none", "bsp", "asp", "ssp", "local_sgd", "dssp", "semi_async", "adsp", "profile", "ahl", "shl", "dlb");
static_assert(stage_id_table.name(stage_id::dlb) == "dlb", "stage_id_table ends where stage_id does");
inline constexpr std::uint32_t stage_id_count = stage_id_table.size();

constexpr std::string_view to_string(stage_id s) noexcept { return stage_id_table.name(s); }

constexpr std::optional<stage_id> stage_id_from_string(std::string_view s) noexcept { return stage_id_table.parse(s); }

// -------------------------------------------------------------- the plan

// Options of the codec a plan commits with (the codec itself is the
// plan_update header's): 0 leaves each to the codec's default. bits: the
// block codec's code width (2, 4 or 8); block: elements per scale (the block
// codec's B; qsgd's, terngrad's and sign's bucket). Which codec takes which
// is checked with the codec (ps::check_plan_codec, rules/commit_encoder.hpp).
struct codec_options {
  std::uint32_t bits = 0;
  std::uint32_t block = 0;
  friend constexpr bool operator==(const codec_options&, const codec_options&) = default;
};

// What a worker does until told otherwise; the wire's plan_update body
// (docs/wire-format.md) in this field order: 24 bytes when the codec options
// are 0 (the body every version-5 peer reads), 32 when one is set.
struct worker_plan {
  std::uint32_t local_iterations = 1;    // local steps per commit; 0: commit by interval
  std::uint32_t commit_interval_us = 0;  // time between commits (ADSP); 0: by iterations
  std::uint32_t batch_size = 0;          // 0: keep the worker's own
  stage_id stage = stage_id::none;       // for telemetry and the worker's schedule
  float data_share = 0.0f;               // fraction of the training data, [0, 1]; 0: unspecified
  float compression_ratio = 1.0f;        // fraction kept, (0, 1]
  std::uint32_t codec_bits = 0;          // codec_options::bits; 0: the codec's default
  std::uint32_t codec_block = 0;         // codec_options::block; 0: the codec's default

  [[nodiscard]] constexpr double commit_interval() const noexcept {
    return static_cast<double>(commit_interval_us) * 1e-6;
  }
  // Seconds to the plan's microseconds, rounded to nearest, saturating; a
  // positive interval never rounds to 0 (that would mean "by iterations").
  static std::uint32_t interval_us(double seconds) noexcept {
    if (!(seconds > 0.0)) return 0;
    const double us = std::round(seconds * 1e6);
    if (!(us < 4294967295.0)) return 4294967295u;
    return us < 1.0 ? 1u : static_cast<std::uint32_t>(us);
  }
  [[nodiscard]] constexpr codec_options compression_options() const noexcept { return {codec_bits, codec_block}; }
  [[nodiscard]] constexpr bool has_codec_options() const noexcept { return codec_bits != 0 || codec_block != 0; }
  friend constexpr bool operator==(const worker_plan&, const worker_plan&) = default;

  // The fields a plan had before the codec options (the 24-byte plan_update
  // body, and the plans of version-1 checkpoint sections).
  static constexpr auto fields_before_codec() {
    return std::tuple{field{"local_iterations", &worker_plan::local_iterations, "local steps per commit; 0: by interval"},
                      field{"commit_interval_us", &worker_plan::commit_interval_us, "time between commits (ADSP)"},
                      field{"batch_size", &worker_plan::batch_size, "0: keep the worker's own"},
                      field{"stage", &worker_plan::stage, "the policy or schedule stage"},
                      field{"data_share", &worker_plan::data_share, "fraction of the training data; 0: unspecified"},
                      field{"compression_ratio", &worker_plan::compression_ratio, "fraction kept, (0, 1]"}};
  }
  // The one list of the plan's fields, in wire order (core/fields.hpp): the
  // wire's plan_update body, checkpoints and the Python binding read it.
  static constexpr auto fields() {
    return std::tuple_cat(fields_before_codec(),
                          std::tuple{field{"codec_bits", &worker_plan::codec_bits,
                                           "the block codec's bits (2, 4, 8); 0: the codec's default"},
                                     field{"codec_block", &worker_plan::codec_block,
                                           "elements per scale (block codec B; qsgd/terngrad/sign bucket); 0: default"}});
  }
};
static_assert(fields_cover<worker_plan>(), "worker_plan::fields() must list every field");

// Whether a cycle of `plan` is complete after `iterations` local iterations
// that took `elapsed` seconds: H = local_iterations iterations, or, with
// H = 0, once the commit interval has passed (at least one iteration; at
// most `max_iterations`, a guard against zero-duration iterations). The
// one rule of ps::worker_cycle (parameter servers, the simulator) and
// coll::sync_driver (collectives).
[[nodiscard]] constexpr bool cycle_complete(const worker_plan& plan, std::uint32_t iterations, double elapsed,
                                            std::uint32_t max_iterations = 1u << 24) noexcept {
  if (iterations == 0) return false;
  if (plan.local_iterations > 0) return iterations >= plan.local_iterations;
  return elapsed >= plan.commit_interval() || iterations >= max_iterations;
}

// The logical clock a commit carries (sync::commit_event::clock; SSP and
// DSSP bound staleness in it, the wire's header.clock): the commit's
// sequence within its worker's incarnation. The one rule of every driver:
// ps::worker_cycle::clock() for the real worker and the simulator, and the
// collective driver.
[[nodiscard]] constexpr std::uint64_t commit_clock(std::uint64_t sequence) noexcept { return sequence; }

// Whether a plan can be run, the one check of every driver: the wire's
// plan_update ("plan_update"), a policy's plans in the simulator
// ("policy.plan(3)"). `field` prefixes the field named in the error.
// batch_size 0 keeps the worker's own batch; local_iterations 0 means
// "commit by interval" (ADSP) and so needs an interval.
inline status check_plan(const worker_plan& p, std::string_view field) {
  const std::string f(field);
  if (p.local_iterations == 0 && p.commit_interval_us == 0)
    return make_error(errc::invalid_argument, f + ".local_iterations", 0,
                      "must be >= 1 unless commit_interval_us > 0 (commit by interval)");
  const auto stage = static_cast<std::uint32_t>(p.stage);
  if (stage >= stage_id_count) return make_error(errc::unsupported, f + ".stage", stage, "unknown stage id");
  if (!std::isfinite(p.data_share) || p.data_share < 0.0f || p.data_share > 1.0f)
    return make_error(errc::invalid_argument, f + ".data_share", p.data_share, "must be finite and in [0, 1]");
  if (!std::isfinite(p.compression_ratio) || p.compression_ratio <= 0.0f || p.compression_ratio > 1.0f)
    return make_error(errc::invalid_argument, f + ".compression_ratio", p.compression_ratio,
                      "must be finite and in (0, 1]");
  return {};
}

// ------------------------------------------------------------ measurements

// What a driver timed (docs/algorithms.md §3 "Measurements"). One enum for sync,
// profile and the wire's measurement records.
enum class measurement_kind : std::uint8_t {
  compute = 0,   // one local iteration at the worker's batch size; amount = batch
  push = 1,      // sending one commit; amount = bytes
  pull = 2,      // receiving the parameters; amount = bytes
  compress = 3,  // encoding one update; amount = bytes of payload (or elements)
  commit = 4,    // push + pull of one commit together (ADSP's O_i); amount unused
  round = 5,     // one whole round (compute·H + push + pull); amount unused
};
inline constexpr auto measurement_kind_table =
    make_enum_table<measurement_kind>("compute", "push", "pull", "compress", "commit", "round");
static_assert(measurement_kind_table.name(measurement_kind::round) == "round",
              "measurement_kind_table ends where measurement_kind does");
inline constexpr std::uint8_t measurement_kind_count = measurement_kind_table.size();

constexpr std::string_view to_string(measurement_kind k) noexcept { return measurement_kind_table.name(k); }

// One timing measurement, as the driver built it and every layer reads it.
struct measurement {
  std::uint32_t worker = 0;
  measurement_kind kind = measurement_kind::compute;
  double seconds = 0.0;  // finite and > 0 to be usable
  double amount = 0.0;   // bytes or batch size (see measurement_kind); 0: not relevant
  double time = 0.0;     // the driver's time when it was taken
  friend constexpr bool operator==(const measurement&, const measurement&) = default;
};

// ------------------------------------------------------------------ metrics

// Global metrics a driver evaluates; the wire's metric body carries the id.
enum class metric_id : std::uint32_t { loss = 0, accuracy = 1, samples_per_second = 2, iteration_seconds = 3 };
// Ids the table does not name are the application's ("application").
inline constexpr auto metric_id_table = make_enum_table_from<metric_id>(
    0, "application", "loss", "accuracy", "samples_per_second", "iteration_seconds");
static_assert(metric_id_table.name(metric_id::iteration_seconds) == "iteration_seconds",
              "metric_id_table ends where metric_id does");
inline constexpr std::uint32_t metric_id_count = metric_id_table.size();
// Ids from here up are the application's; those between are reserved.
inline constexpr std::uint32_t metric_id_application = 1024;

constexpr std::string_view to_string(metric_id m) noexcept { return metric_id_table.name(m); }

// ------------------------------------------------------ ADSP commit interval

// ADSP's time between two commits of one worker (docs/algorithms.md §1 "ADSP"):
// max(t_min, Γ/ΔC − O_i). The one formula both the policy and the planner use.
constexpr double adsp_commit_interval(double period, double commits_per_period, double commit_overhead,
                                      double t_min) noexcept {
  const double t = commits_per_period > 0.0 ? period / commits_per_period - commit_overhead : period;
  return t > t_min ? t : t_min;
}

ASHL_NAMESPACE_END
