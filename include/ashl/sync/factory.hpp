// ashl/sync/factory.hpp — any_policy (a type-erased consistency policy for
// drivers) and make_policy(name, params).
//
//   ashl::sync::policy_params pp;
//   pp.workers = 9;
//   pp.staleness = 3;
//   auto p = ashl::sync::make_policy("ssp", pp);   // result<any_policy>
//   if (!p) std::cerr << p.error().message();      // "ssp.staleness = -1: must be >= 0"
//   auto d = p->on_commit({.worker = 0, .sequence = 1});
//
// Names: bsp, asp, ssp, local_sgd, dssp, semi_async, adsp, ashl. The
// simulator and the parameter server drive every policy through any_policy;
// templates stay below it (STYLE.md, RAFT's one type-erased boundary).
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/adsp.hpp>
#include <ashl/sync/ashl.hpp>
#include <ashl/sync/asp.hpp>
#include <ashl/sync/bsp.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/dssp.hpp>
#include <ashl/sync/events.hpp>
#include <ashl/sync/local_sgd.hpp>
#include <ashl/sync/semi_async.hpp>
#include <ashl/sync/ssp.hpp>

#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

ASHL_NAMESPACE_BEGIN
namespace sync {

class any_policy {
 public:
  using policy_concept = policy_tag;

  any_policy() = default;
  template <consistency_policy P>
    requires(!std::same_as<std::remove_cvref_t<P>, any_policy>)
  any_policy(P p) : p_(std::make_unique<model<P>>(std::move(p))) {}  // NOLINT(google-explicit-constructor)
  any_policy(const any_policy& o) : p_(o.p_ ? o.p_->clone() : nullptr) {}
  any_policy(any_policy&&) noexcept = default;
  any_policy& operator=(const any_policy& o) {
    if (this != &o) p_ = o.p_ ? o.p_->clone() : nullptr;
    return *this;
  }
  any_policy& operator=(any_policy&&) noexcept = default;
  ~any_policy() = default;

  [[nodiscard]] bool has_value() const noexcept { return p_ != nullptr; }

  commit_decision on_commit(const commit_event& c) { return get().on_commit(c); }
  pull_decision on_pull(const pull_event& q) { return get().on_pull(q); }
  outcome on_metric(const metric_event& m) { return get().on_metric(m); }
  outcome on_join(const membership_event& j) { return get().on_join(j); }
  outcome on_evict(const membership_event& j) { return get().on_evict(j); }
  outcome on_measurement(const measurement_event& x) { return get().on_measurement(x); }
  outcome drain() { return get().drain(); }
  [[nodiscard]] worker_plan plan(worker_id w) const { return get().plan(w); }
  [[nodiscard]] std::string_view name() const { return get().name(); }
  [[nodiscard]] bool is_live(worker_id w) const { return get().is_live(w); }
  [[nodiscard]] bool is_held(worker_id w) const { return get().is_held(w); }

  // The concrete policy, or nullptr when it is not a P.
  template <class P>
  P* target() noexcept {
    auto* m = dynamic_cast<model<P>*>(p_.get());
    return m ? &m->p : nullptr;
  }

 private:
  struct base {
    virtual ~base() = default;
    [[nodiscard]] virtual std::unique_ptr<base> clone() const = 0;
    virtual commit_decision on_commit(const commit_event&) = 0;
    virtual pull_decision on_pull(const pull_event&) = 0;
    virtual outcome on_metric(const metric_event&) = 0;
    virtual outcome on_join(const membership_event&) = 0;
    virtual outcome on_evict(const membership_event&) = 0;
    virtual outcome on_measurement(const measurement_event&) = 0;
    virtual outcome drain() = 0;
    [[nodiscard]] virtual worker_plan plan(worker_id) const = 0;
    [[nodiscard]] virtual std::string_view name() const = 0;
    [[nodiscard]] virtual bool is_live(worker_id) const = 0;
    [[nodiscard]] virtual bool is_held(worker_id) const = 0;
  };
  template <class P>
  struct model final : base {
    explicit model(P v) : p(std::move(v)) {}
    [[nodiscard]] std::unique_ptr<base> clone() const override { return std::make_unique<model>(p); }
    commit_decision on_commit(const commit_event& c) override { return p.on_commit(c); }
    pull_decision on_pull(const pull_event& q) override { return p.on_pull(q); }
    outcome on_metric(const metric_event& m) override { return p.on_metric(m); }
    outcome on_join(const membership_event& j) override { return p.on_join(j); }
    outcome on_evict(const membership_event& j) override { return p.on_evict(j); }
    outcome on_measurement(const measurement_event& x) override { return p.on_measurement(x); }
    outcome drain() override { return p.drain(); }
    [[nodiscard]] worker_plan plan(worker_id w) const override { return p.plan(w); }
    [[nodiscard]] std::string_view name() const override { return p.name(); }
    [[nodiscard]] bool is_live(worker_id w) const override { return p.is_live(w); }
    [[nodiscard]] bool is_held(worker_id w) const override { return p.is_held(w); }
    P p;
  };

  base& get() {
    ASHL_ASSERT(p_ != nullptr, "any_policy: empty");
    return *p_;
  }
  [[nodiscard]] const base& get() const {
    ASHL_ASSERT(p_ != nullptr, "any_policy: empty");
    return *p_;
  }

  std::unique_ptr<base> p_;
};

static_assert(consistency_policy<any_policy>);

// Every knob of every policy; each policy reads the ones it names. Signed
// integers so a negative value from a config file is reported, not wrapped.
struct policy_params {
  std::int64_t workers = 0;
  // staleness-aware weighting of async commits: "none" | "inverse" | "custom"
  std::string staleness_weight = "none";
  std::function<double(std::uint64_t)> staleness_fn{};  // for "custom"
  // bsp, local_sgd
  std::string weighting = "mean";  // "mean" | "samples"
  std::int64_t batch_size = 0;
  std::int64_t local_steps = 2;  // local_sgd H
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
  double compression_ratio = 1.0;  // r₀ of the uniform planner
  double switch_loss = 0.3;
  std::int64_t shl_staleness = 3;
  ashl_planner planner{};
  ashl_replanner_factory replanner{};  // ASHL+: online re-planning; empty: plan once
};

namespace detail {
inline status at_least(std::string_view field, std::int64_t v, std::int64_t lo) {
  if (v < lo) return invalid_argument(field, v, lo == 0 ? "must be >= 0" : "must be >= 1");
  return {};
}
inline status positive(std::string_view field, double v) {
  if (!(v > 0.0) || !std::isfinite(v)) return invalid_argument(field, v, "must be finite and > 0");
  return {};
}
inline status non_negative(std::string_view field, double v) {
  if (!(v >= 0.0) || !std::isfinite(v)) return invalid_argument(field, v, "must be finite and >= 0");
  return {};
}
inline status ratio(std::string_view field, double v) {
  if (!(v > 0.0 && v <= 1.0)) return invalid_argument(field, v, "must be in (0, 1]");
  return {};
}
inline result<staleness_weighting> weighting_of(std::string_view policy, const policy_params& p) {
  const std::string field = std::string(policy) + ".staleness_weight";
  if (p.staleness_weight == "none") return staleness_weighting::none();
  if (p.staleness_weight == "inverse") return staleness_weighting::inverse();
  if (p.staleness_weight == "custom") {
    if (!p.staleness_fn) return invalid_argument(field, p.staleness_weight, "needs staleness_fn");
    return staleness_weighting::custom(p.staleness_fn);
  }
  return invalid_argument(field, p.staleness_weight, "must be none, inverse or custom");
}
inline result<round_weighting> round_weighting_of(std::string_view policy, const policy_params& p) {
  if (p.weighting == "mean") return round_weighting::mean;
  if (p.weighting == "samples") return round_weighting::samples;
  return invalid_argument(std::string(policy) + ".weighting", p.weighting, "must be mean or samples");
}
inline std::string f(std::string_view policy, std::string_view field) {
  return std::string(policy) + "." + std::string(field);
}
}  // namespace detail

inline result<any_policy> make_policy(std::string_view name, const policy_params& p) {
  using namespace detail;
  const std::string_view known[] = {"bsp", "asp", "ssp", "local_sgd", "dssp", "semi_async", "adsp", "ashl"};
  bool ok = false;
  for (auto k : known) ok = ok || k == name;
  if (!ok)
    return make_error(errc::not_found, "sync.policy", name,
                      "unknown policy (bsp, asp, ssp, local_sgd, dssp, semi_async, adsp, ashl)");
  ASHL_TRY(at_least(f(name, "workers"), p.workers, 1));
  const auto m = static_cast<std::size_t>(p.workers);
  ASHL_TRY(at_least(f(name, "batch_size"), p.batch_size, 0));
  auto sw = weighting_of(name, p);
  if (!sw) return sw.error();
  const auto u32 = [](std::int64_t v) { return static_cast<std::uint32_t>(v); };

  if (name == "bsp" || name == "local_sgd") {
    auto rw = round_weighting_of(name, p);
    if (!rw) return rw.error();
    if (name == "bsp") return any_policy(bsp({m, *rw, 1, u32(p.batch_size), "bsp"}));
    ASHL_TRY(at_least(f(name, "local_steps"), p.local_steps, 1));
    return any_policy(local_sgd({m, u32(p.local_steps), *rw, u32(p.batch_size), "local_sgd"}));
  }
  if (name == "asp") return any_policy(asp({.workers = m, .staleness_weight = *sw}));
  if (name == "ssp") {
    ASHL_TRY(at_least(f(name, "staleness"), p.staleness, 0));
    return any_policy(ssp({.workers = m, .staleness = u32(p.staleness), .staleness_weight = *sw}));
  }
  if (name == "dssp") {
    ASHL_TRY(at_least(f(name, "s_min"), p.s_min, 0));
    ASHL_TRY(at_least(f(name, "s_max"), p.s_max, 0));
    if (p.s_max < p.s_min) return invalid_argument(f(name, "s_max"), p.s_max, "must be >= dssp.s_min");
    ASHL_TRY(at_least(f(name, "window"), p.window, 1));
    return any_policy(dssp({.workers = m, .s_min = u32(p.s_min), .s_max = u32(p.s_max), .window = u32(p.window),
                            .staleness_weight = *sw}));
  }
  if (name == "semi_async") {
    ASHL_TRY(at_least(f(name, "sync_every_iterations"), p.sync_every_iterations, 0));
    ASHL_TRY(non_negative(f(name, "sync_every_seconds"), p.sync_every_seconds));
    if (p.sync_every_iterations == 0 && p.sync_every_seconds == 0.0)
      return invalid_argument(f(name, "sync_every_iterations"), p.sync_every_iterations,
                              "set it or semi_async.sync_every_seconds");
    return any_policy(semi_async({.workers = m, .sync_every_iterations = u32(p.sync_every_iterations),
                                  .sync_every_seconds = p.sync_every_seconds, .staleness_weight = *sw}));
  }
  if (name == "adsp") {
    ASHL_TRY(positive(f(name, "period"), p.period));
    ASHL_TRY(non_negative(f(name, "t_min"), p.t_min));
    ASHL_TRY(positive(f(name, "search_every"), p.search_every));
    if (!std::isfinite(p.target_loss)) return invalid_argument(f(name, "target_loss"), p.target_loss, "must be finite");
    ASHL_TRY(positive(f(name, "loss_rise"), p.loss_rise));
    ASHL_TRY(at_least(f(name, "initial_commit_rate"), p.initial_commit_rate, 1));
    if (p.max_commit_rate < p.initial_commit_rate)
      return invalid_argument(f(name, "max_commit_rate"), p.max_commit_rate, "must be >= adsp.initial_commit_rate");
    return any_policy(adsp({.workers = m, .period = p.period, .t_min = p.t_min, .search_every = p.search_every,
                            .target_loss = p.target_loss, .loss_rise = p.loss_rise,
                            .initial_commit_rate = u32(p.initial_commit_rate),
                            .max_commit_rate = u32(p.max_commit_rate), .staleness_weight = *sw}));
  }
  // ashl
  ASHL_TRY(at_least(f(name, "profile_iterations"), p.profile_iterations, 0));
  ASHL_TRY(non_negative(f(name, "profile_seconds"), p.profile_seconds));
  if (p.profile_iterations == 0 && p.profile_seconds == 0.0)
    return invalid_argument(f(name, "profile_iterations"), p.profile_iterations, "set it or ashl.profile_seconds");
  ASHL_TRY(at_least(f(name, "h_ahl"), p.h_ahl, 1));
  ASHL_TRY(at_least(f(name, "h_shl"), p.h_shl, 1));
  ASHL_TRY(ratio(f(name, "compression_ratio"), p.compression_ratio));
  if (!std::isfinite(p.switch_loss)) return invalid_argument(f(name, "switch_loss"), p.switch_loss, "must be finite");
  ASHL_TRY(at_least(f(name, "shl_staleness"), p.shl_staleness, 0));
  ashl_params ap{.workers = m,
                 .profile_iterations = u32(p.profile_iterations),
                 .profile_seconds = p.profile_seconds,
                 .planner = p.planner ? p.planner : uniform_planner(u32(p.h_ahl), u32(p.h_shl), p.compression_ratio),
                 .to_shl = switch_trigger{.loss_below = p.switch_loss},
                 .shl_staleness = u32(p.shl_staleness),
                 .ahl_staleness_weight = *sw,
                 .replanner = p.replanner};
  return any_policy(ashl_schedule(std::move(ap)));
}

}  // namespace sync
ASHL_NAMESPACE_END
