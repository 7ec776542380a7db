// ashl/sync/staged.hpp — a staged schedule: stage policies run in order, each
// switch fired once, for good, by a trigger. The schedule is itself a policy.
//
//   using ashl::sync::staged, ashl::sync::switch_trigger;
//   staged<asp, ssp> p{{switch_trigger{.loss_below = 0.3}}, asp{{.workers = 4}},
//                      ssp{{.workers = 4, .staleness = 3}}};
//   p.on_metric({.name = "loss", .value = 0.29, .time = 80});   // switches to ssp
//
// A trigger fires on any of: a finite loss below a threshold; a plateau
// (relative improvement over the last k evaluations < ε); a number of commits
// accepted in the stage; an event time. A non-finite loss never fires. On a
// switch the old stage is drained (its buffered commits come out as a round,
// its held pulls are released) and plans change. Membership and measurement
// events go to every stage so a later stage knows who is live; commits,
// pulls and metrics go to the current one. ALGORITHMS.md §2 "Switch".
#pragma once

#include <ashl/config.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/events.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

ASHL_NAMESPACE_BEGIN
namespace sync {

struct switch_trigger {
  double loss_below = std::numeric_limits<double>::quiet_NaN();  // NaN: off
  std::uint32_t plateau_window = 0;  // k evaluations; 0: off
  double plateau_epsilon = 0.0;      // ε, relative improvement
  std::uint64_t after_commits = 0;   // commits accepted in the stage; 0: off
  double at_time = std::numeric_limits<double>::quiet_NaN();  // first event at or after; NaN: off
  std::string metric = "loss";
};

template <consistency_policy... Stages>
class staged {
  static_assert(sizeof...(Stages) >= 1, "staged needs at least one stage");
  static constexpr std::size_t n_ = sizeof...(Stages);

 public:
  using policy_concept = policy_tag;

  staged(std::array<switch_trigger, n_ - 1> triggers, Stages... stages)
      : stages_(std::move(stages)...), triggers_(std::move(triggers)) {}

  commit_decision on_commit(const commit_event& c) {
    outcome pre = switch_on_time(c.time);
    commit_decision d = with_current([&](auto& s) { return s.on_commit(c); });
    if (d.action != commit_action::drop) ++commits_;
    pre.merge(std::move(d.effects));
    if (current_ + 1 < n_ && triggers_[current_].after_commits > 0 && commits_ >= triggers_[current_].after_commits)
      pre.merge(switch_stage(c.time));
    pre.merge(switch_on_time(c.time));
    d.effects = std::move(pre);
    return d;
  }
  pull_decision on_pull(const pull_event& q) {
    outcome pre = switch_on_time(q.time);
    pull_decision d = with_current([&](auto& s) { return s.on_pull(q); });
    pre.merge(std::move(d.effects));
    d.effects = std::move(pre);
    return d;
  }
  outcome on_metric(const metric_event& m) {
    outcome o = switch_on_time(m.time);
    o.merge(with_current([&](auto& s) { return s.on_metric(m); }));
    if (current_ + 1 < n_ && m.name == triggers_[current_].metric && std::isfinite(m.value)) {
      const auto& t = triggers_[current_];
      bool fire = m.value < t.loss_below;  // false when loss_below is NaN
      if (t.plateau_window > 0) {
        history_.push_back(m.value);
        if (history_.size() > t.plateau_window + 1) history_.pop_front();
        if (history_.size() == t.plateau_window + 1) {
          const double first = history_.front();
          const double gain = first == 0.0 ? 0.0 : (first - history_.back()) / std::abs(first);
          fire = fire || gain < t.plateau_epsilon;
        }
      }
      if (fire) o.merge(switch_stage(m.time));
    }
    return o;
  }
  outcome on_join(const membership_event& j) {
    return for_all([&](auto& s) { return s.on_join(j); });
  }
  outcome on_evict(const membership_event& j) {
    return for_all([&](auto& s) { return s.on_evict(j); });
  }
  outcome on_measurement(const measurement_event& x) {
    return for_all([&](auto& s) { return s.on_measurement(x); });
  }
  outcome drain() {
    return with_current([](auto& s) { return s.drain(); });
  }

  [[nodiscard]] worker_plan plan(worker_id w) const {
    return with_current([&](const auto& s) { return s.plan(w); });
  }
  [[nodiscard]] std::string_view name() const {
    return with_current([](const auto& s) { return std::string_view(s.name()); });
  }
  [[nodiscard]] bool is_live(worker_id w) const {
    return with_current([&](const auto& s) { return s.is_live(w); });
  }
  [[nodiscard]] bool is_held(worker_id w) const {
    return with_current([&](const auto& s) { return s.is_held(w); });
  }

  [[nodiscard]] std::size_t stage() const noexcept { return current_; }
  [[nodiscard]] double switched_at(std::size_t k) const { return switched_at_[k]; }  // time stage k began
  template <std::size_t I>
  auto& stage_policy() noexcept { return std::get<I>(stages_); }
  template <std::size_t I>
  const auto& stage_policy() const noexcept { return std::get<I>(stages_); }

 private:
  template <class F>
  auto with_current(F&& f) {
    return dispatch(*this, std::forward<F>(f), std::index_sequence_for<Stages...>{});
  }
  template <class F>
  auto with_current(F&& f) const {
    return dispatch(*this, std::forward<F>(f), std::index_sequence_for<Stages...>{});
  }
  template <class Self, class F, std::size_t... I>
  static auto dispatch(Self& self, F&& f, std::index_sequence<I...>) {
    using R = decltype(f(std::get<0>(self.stages_)));
    R r{};
    ((I == self.current_ ? (void)(r = f(std::get<I>(self.stages_))) : void()), ...);
    return r;
  }
  template <class F>
  outcome for_all(F&& f) {
    outcome o;
    std::apply([&](auto&... s) { (o.merge(f(s)), ...); }, stages_);
    return o;
  }

  outcome switch_on_time(double now) {
    outcome o;
    while (current_ + 1 < n_ && now >= triggers_[current_].at_time) o.merge(switch_stage(now));
    return o;
  }
  outcome switch_stage(double now) {
    outcome o = with_current([](auto& s) { return s.drain(); });
    ++current_;
    switched_at_[current_] = now;
    commits_ = 0;
    history_.clear();
    o.plans_changed = true;
    return o;
  }

  std::tuple<Stages...> stages_;
  std::array<switch_trigger, n_ - 1> triggers_;
  std::size_t current_ = 0;
  std::uint64_t commits_ = 0;
  std::deque<double> history_;
  std::array<double, n_> switched_at_{};
};

}  // namespace sync
ASHL_NAMESPACE_END
