// ashl/sync/staged.hpp — a staged schedule: stage policies run in order, each
// switch fired once, for good, by a trigger. The schedule is itself a policy.
//
//   using ashl::sync::staged, ashl::sync::switch_trigger;
//   staged<asp, ssp> p{{switch_trigger{.loss_below = 0.3}}, asp{{.workers = 4}},
//                      ssp{{.workers = 4, .staleness = 3}}};
//   ashl::sync::outcome_sink out(4);
//   p.on_metric({.metric = ashl::metric_id::loss, .value = 0.29, .time = 80}, out);  // switches to ssp
//
// A trigger fires on any of: a finite value of its metric (loss by default)
// below a threshold; a plateau (relative improvement over the last k
// evaluations < ε); a number of commits accepted in the stage; an event
// time. A non-finite value never fires. On a switch the old stage is drained
// into the caller's sink (its buffered commits come out as a round, its held
// pulls are released) and every plan changes (all_plans_changed). Membership
// and measurement events go to every stage so a later stage knows who is
// live; commits, pulls and metrics go to the current one. Only the stage in
// force speaks: what the others answer to membership and measurements goes
// into a scratch sink and is discarded (their plans are not in force, they
// hold no pulls and buffer no commits). The plateau history is a ring sized
// at construction, so no event allocates. docs/algorithms.md §2 "Switch".
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/events.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

struct switch_trigger {
  double loss_below = std::numeric_limits<double>::quiet_NaN();  // NaN: off
  std::uint32_t plateau_window = 0;  // k evaluations; 0: off
  double plateau_epsilon = 0.0;      // ε, relative improvement
  std::uint64_t after_commits = 0;   // commits accepted in the stage; 0: off
  double at_time = std::numeric_limits<double>::quiet_NaN();  // first event at or after; NaN: off
  metric_id metric = metric_id::loss;                          // the metric loss_below and plateau read

  // The saved fields, in their order (core/fields.hpp; the metric as its
  // u32 value).
  static constexpr auto saved() {
    return std::tuple{field{"loss_below", &switch_trigger::loss_below},
                      field{"plateau_window", &switch_trigger::plateau_window},
                      field{"plateau_epsilon", &switch_trigger::plateau_epsilon},
                      field{"after_commits", &switch_trigger::after_commits},
                      field{"at_time", &switch_trigger::at_time}, field{"metric", &switch_trigger::metric}};
  }
  void save(state_writer& w) const { put_fields(w, *this, saved()); }
  status load(state_reader& r) {
    switch_trigger t;
    ASHL_TRY(get_fields(r, t, "switch_trigger", saved()));
    *this = t;
    return {};
  }
  friend bool operator==(const switch_trigger&, const switch_trigger&) = default;
};

template <consistency_policy... Stages>
class staged {
  static_assert(sizeof...(Stages) >= 1, "staged needs at least one stage");
  static constexpr std::size_t n_ = sizeof...(Stages);

 public:
  using policy_concept = policy_tag;

  staged(std::array<switch_trigger, n_ - 1> triggers, Stages... stages)
      : stages_(std::move(stages)...), triggers_(std::move(triggers)) {
    std::size_t cap = 0;
    for (const auto& t : triggers_) cap = std::max<std::size_t>(cap, std::size_t{t.plateau_window} + 1);
    history_.assign(cap, 0.0);
  }

  commit_decision on_commit(const commit_event& c, outcome_sink& out) {
    switch_on_time(c.time, out);
    const commit_decision d = with_current([&](auto& s) { return s.on_commit(c, out); });
    if (d.action != commit_action::drop) ++commits_;
    if (current_ + 1 < n_ && triggers_[current_].after_commits > 0 && commits_ >= triggers_[current_].after_commits)
      switch_stage(c.time, out);
    switch_on_time(c.time, out);
    return d;
  }
  pull_action on_pull(const pull_event& q, outcome_sink& out) {
    switch_on_time(q.time, out);
    return with_current([&](auto& s) { return s.on_pull(q, out); });
  }
  void on_metric(const metric_event& m, outcome_sink& out) {
    switch_on_time(m.time, out);
    with_current([&](auto& s) { s.on_metric(m, out); });
    if (current_ + 1 < n_ && m.metric == triggers_[current_].metric && std::isfinite(m.value)) {
      const auto& t = triggers_[current_];
      bool fire = m.value < t.loss_below;  // false when loss_below is NaN
      if (t.plateau_window > 0) {
        push_history(m.value);
        const std::size_t k = t.plateau_window;
        if (count_ >= k + 1) {
          const double first = history_at(k), last = history_at(0);
          const double gain = first == 0.0 ? 0.0 : (first - last) / std::abs(first);
          fire = fire || gain < t.plateau_epsilon;
        }
      }
      if (fire) switch_stage(m.time, out);
    }
  }
  void on_join(const membership_event& j, outcome_sink& out) {
    for_all(out, [&](auto& s, outcome_sink& o) { s.on_join(j, o); });
  }
  void on_evict(const membership_event& j, outcome_sink& out) {
    for_all(out, [&](auto& s, outcome_sink& o) { s.on_evict(j, o); });
  }
  void on_measurement(const measurement_event& x, outcome_sink& out) {
    for_all(out, [&](auto& s, outcome_sink& o) { s.on_measurement(x, o); });
  }
  void drain(outcome_sink& out) {
    with_current([&](auto& s) { s.drain(out); });
  }

  [[nodiscard]] worker_plan plan(worker_id w) const {
    return with_current([&](const auto& s) { return s.plan(w); });
  }
  [[nodiscard]] stage_id stage() const {
    return with_current([](const auto& s) { return s.stage(); });
  }
  [[nodiscard]] bool is_live(worker_id w) const {
    return with_current([&](const auto& s) { return s.is_live(w); });
  }
  [[nodiscard]] bool is_held(worker_id w) const {
    return with_current([&](const auto& s) { return s.is_held(w); });
  }

  // Index of the stage in force, 0-based.
  [[nodiscard]] std::size_t stage_index() const noexcept { return current_; }
  [[nodiscard]] double switched_at(std::size_t k) const { return switched_at_[k]; }  // time stage k began
  [[nodiscard]] const std::array<switch_trigger, n_ - 1>& triggers() const noexcept { return triggers_; }
  template <std::size_t I>
  auto& stage_policy() noexcept { return std::get<I>(stages_); }
  template <std::size_t I>
  const auto& stage_policy() const noexcept { return std::get<I>(stages_); }

  // Triggers, position, commit count, plateau history, switch times, then
  // every stage's own state in order.
  void save(state_writer& w) const {
    w.tag("STGD", 1);
    w.put<std::uint64_t>(n_);
    for (const auto& t : triggers_) t.save(w);
    w.put<std::uint64_t>(current_);
    w.put(commits_);
    w.put_vector(history_);
    w.put<std::uint64_t>(head_);
    w.put<std::uint64_t>(count_);
    for (double t : switched_at_) w.put(t);
    std::apply([&](const auto&... s) { (s.save(w), ...); }, stages_);
  }
  status load(state_reader& r) {
    staged next = *this;
    ASHL_TRY(r.tag("STGD", 1));
    std::uint64_t n = 0, cur = 0, head = 0, count = 0;
    ASHL_TRY(r.get(n, "staged.stages"));
    if (n != n_) return malformed("staged.stages", n, "this schedule has " + std::to_string(n_) + " stages");
    for (auto& t : next.triggers_) ASHL_TRY(t.load(r));
    ASHL_TRY(r.get(cur, "staged.current"));
    if (cur >= n_) return malformed("staged.current", cur, "past the last stage");
    next.current_ = static_cast<std::size_t>(cur);
    ASHL_TRY(r.get(next.commits_, "staged.commits"));
    ASHL_TRY(r.get_vector(next.history_, "staged.history"));
    ASHL_TRY(r.get(head, "staged.history_head"));
    ASHL_TRY(r.get(count, "staged.history_count"));
    std::size_t cap = 0;
    for (const auto& t : next.triggers_) cap = std::max<std::size_t>(cap, std::size_t{t.plateau_window} + 1);
    if (next.history_.size() != cap) return malformed("staged.history", next.history_.size(), "does not fit the triggers");
    if (head >= std::max<std::size_t>(cap, 1) || count > cap)
      return malformed("staged.history_head", head, "outside the history");
    next.head_ = static_cast<std::size_t>(head);
    next.count_ = static_cast<std::size_t>(count);
    for (double& t : next.switched_at_) ASHL_TRY(r.get(t, "staged.switched_at"));
    status s;
    std::apply([&](auto&... st) { ((s.ok() ? (void)(s = st.load(r)) : void()), ...); }, next.stages_);
    if (!s.ok()) return s;
    *this = std::move(next);
    return {};
  }

 private:
  template <class F>
  decltype(auto) with_current(F&& f) {
    return dispatch(*this, std::forward<F>(f), std::index_sequence_for<Stages...>{});
  }
  template <class F>
  decltype(auto) with_current(F&& f) const {
    return dispatch(*this, std::forward<F>(f), std::index_sequence_for<Stages...>{});
  }
  template <class Self, class F, std::size_t... I>
  static auto dispatch(Self& self, F&& f, std::index_sequence<I...>) {
    using R = decltype(f(std::get<0>(self.stages_)));
    if constexpr (std::is_void_v<R>) {
      ((I == self.current_ ? (void)f(std::get<I>(self.stages_)) : void()), ...);
    } else {
      R r{};
      ((I == self.current_ ? (void)(r = f(std::get<I>(self.stages_))) : void()), ...);
      return r;
    }
  }
  // The stage in force writes into `out`; the others into scratch_.
  template <class F>
  void for_all(outcome_sink& out, F&& f) {
    std::size_t i = 0;
    std::apply(
        [&](auto&... s) {
          ((i == current_ ? f(s, out) : (f(s, scratch_), scratch_.clear()), ++i), ...);
        },
        stages_);
  }

  void push_history(double v) {
    history_[head_] = v;
    head_ = (head_ + 1) % history_.size();
    count_ = std::min(count_ + 1, history_.size());
  }
  // The value `back` evaluations before the latest.
  [[nodiscard]] double history_at(std::size_t back) const {
    const std::size_t n = history_.size();
    return history_[(head_ + n - 1 - back) % n];
  }

  void switch_on_time(double now, outcome_sink& out) {
    while (current_ + 1 < n_ && now >= triggers_[current_].at_time) switch_stage(now, out);
  }
  void switch_stage(double now, outcome_sink& out) {
    with_current([&](auto& s) { s.drain(out); });
    ++current_;
    switched_at_[current_] = now;
    commits_ = 0;
    head_ = 0;
    count_ = 0;
    out.all_plans_changed();
  }

  std::tuple<Stages...> stages_;
  std::array<switch_trigger, n_ - 1> triggers_;
  std::size_t current_ = 0;
  std::uint64_t commits_ = 0;
  std::vector<double> history_;  // ring of the last plateau_window + 1 evaluations
  std::size_t head_ = 0;
  std::size_t count_ = 0;
  std::array<double, n_> switched_at_{};
  outcome_sink scratch_;  // the answers of stages not in force; always empty between events
};

}  // namespace sync
ASHL_NAMESPACE_END
