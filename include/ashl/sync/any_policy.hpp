// ashl/sync/any_policy.hpp — any_policy: a type-erased consistency policy, the
// one boundary where drivers stop being templates (as RAFT keeps one
// type-erased interface; templates everywhere below it).
//
//   ashl::sync::any_policy p = ashl::sync::ssp{{.workers = 4, .staleness = 3}};
//   ashl::sync::outcome_sink out(4);
//   auto d = p.on_commit({.worker = 0, .sequence = 1}, out);
//   ashl::sync::any_policy q = p;                  // an independent copy
//   if (auto* s = q.target<ashl::sync::ssp>()) s->bound();
//
// Holds the policy in a unique_ptr and copies by cloning, so copies share
// nothing (a policy holds plain values only). save/load forward to the
// policy: the bytes are the policy's own, so a load into an any_policy that
// holds another type is refused by that type's section tag. Building one by
// name: rules/policies.hpp (make_policy). docs/design.md "Consistency policy".
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/events.hpp>

#include <concepts>
#include <memory>
#include <type_traits>
#include <utility>

ASHL_NAMESPACE_BEGIN
namespace sync {

class any_policy {
 public:
  using policy_concept = policy_tag;

  any_policy() = default;
  // The any_policy test comes first: checking consistency_policy<any_policy>
  // from inside its own copy-constructibility check would recurse.
  template <class P>
    requires(!std::same_as<std::remove_cvref_t<P>, any_policy> && consistency_policy<P>)
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

  commit_decision on_commit(const commit_event& c, outcome_sink& out) { return get().on_commit(c, out); }
  pull_action on_pull(const pull_event& q, outcome_sink& out) { return get().on_pull(q, out); }
  void on_metric(const metric_event& m, outcome_sink& out) { get().on_metric(m, out); }
  void on_join(const membership_event& j, outcome_sink& out) { get().on_join(j, out); }
  void on_evict(const membership_event& j, outcome_sink& out) { get().on_evict(j, out); }
  void on_measurement(const measurement_event& x, outcome_sink& out) { get().on_measurement(x, out); }
  void drain(outcome_sink& out) { get().drain(out); }
  [[nodiscard]] worker_plan plan(worker_id w) const { return get().plan(w); }
  [[nodiscard]] stage_id stage() const { return get().stage(); }
  [[nodiscard]] bool is_live(worker_id w) const { return get().is_live(w); }
  [[nodiscard]] bool is_held(worker_id w) const { return get().is_held(w); }
  void save(state_writer& w) const { get().save(w); }
  status load(state_reader& r) { return get().load(r); }

  // The concrete policy, or nullptr when it is not a P (or nothing is held).
  template <class P>
  [[nodiscard]] P* target() noexcept {
    auto* m = dynamic_cast<model<P>*>(p_.get());
    return m ? &m->p : nullptr;
  }
  template <class P>
  [[nodiscard]] const P* target() const noexcept {
    const auto* m = dynamic_cast<const model<P>*>(p_.get());
    return m ? &m->p : nullptr;
  }

 private:
  struct base {
    virtual ~base() = default;
    [[nodiscard]] virtual std::unique_ptr<base> clone() const = 0;
    virtual commit_decision on_commit(const commit_event&, outcome_sink&) = 0;
    virtual pull_action on_pull(const pull_event&, outcome_sink&) = 0;
    virtual void on_metric(const metric_event&, outcome_sink&) = 0;
    virtual void on_join(const membership_event&, outcome_sink&) = 0;
    virtual void on_evict(const membership_event&, outcome_sink&) = 0;
    virtual void on_measurement(const measurement_event&, outcome_sink&) = 0;
    virtual void drain(outcome_sink&) = 0;
    [[nodiscard]] virtual worker_plan plan(worker_id) const = 0;
    [[nodiscard]] virtual stage_id stage() const = 0;
    [[nodiscard]] virtual bool is_live(worker_id) const = 0;
    [[nodiscard]] virtual bool is_held(worker_id) const = 0;
    virtual void save(state_writer&) const = 0;
    virtual status load(state_reader&) = 0;
  };
  template <class P>
  struct model final : base {
    explicit model(P v) : p(std::move(v)) {}
    [[nodiscard]] std::unique_ptr<base> clone() const override { return std::make_unique<model>(p); }
    commit_decision on_commit(const commit_event& c, outcome_sink& o) override { return p.on_commit(c, o); }
    pull_action on_pull(const pull_event& q, outcome_sink& o) override { return p.on_pull(q, o); }
    void on_metric(const metric_event& m, outcome_sink& o) override { p.on_metric(m, o); }
    void on_join(const membership_event& j, outcome_sink& o) override { p.on_join(j, o); }
    void on_evict(const membership_event& j, outcome_sink& o) override { p.on_evict(j, o); }
    void on_measurement(const measurement_event& x, outcome_sink& o) override { p.on_measurement(x, o); }
    void drain(outcome_sink& o) override { p.drain(o); }
    [[nodiscard]] worker_plan plan(worker_id w) const override { return p.plan(w); }
    [[nodiscard]] stage_id stage() const override { return p.stage(); }
    [[nodiscard]] bool is_live(worker_id w) const override { return p.is_live(w); }
    [[nodiscard]] bool is_held(worker_id w) const override { return p.is_held(w); }
    void save(state_writer& w) const override { p.save(w); }
    status load(state_reader& r) override { return p.load(r); }
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

}  // namespace sync
ASHL_NAMESPACE_END
