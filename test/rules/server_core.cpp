#include <ashl/rules/server_core.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/compress/identity.hpp>
#include <ashl/compress/qsgd.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/compress/cast.hpp>
#include <ashl/compress/natural.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/sign.hpp>
#include <ashl/compress/terngrad.hpp>
#include <ashl/compress/threshold.hpp>
#include <ashl/compress/topk_sampled.hpp>
#include <ashl/rules/commit_encoder.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/sync/any_policy.hpp>
#include <ashl/sync/asp.hpp>
#include <ashl/sync/bsp.hpp>
#include <ashl/sync/ssp.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <utility>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <vector>

#include "../support/counting_new.hpp"
#include "../support/saved_state.hpp"

namespace {

namespace ps = ashl::ps;
namespace sync = ashl::sync;
using ashl::codec_id;
using ashl::dtype;

// ---------------------------------------------------------- a round policy

// Buffers every commit; when every live worker has one buffered, names them
// all in one round (weight 1/live, in worker order) and releases the held
// pulls. An evicted worker's buffered commit stays in the round. Written for
// these tests (independent of sync/bsp.hpp); allocation-free after
// construction.
class rounds {
 public:
  using policy_concept = sync::policy_tag;
  rounds() = default;
  explicit rounds(std::size_t m) : live_(m, 1), seq_(m, 0), has_(m, 0), held_(m, 0), live_count_(m) {}
  // Room for `capacity` ids, the first m live: a join of a later id
  // allocates nothing here (so a test can count the core's own).
  rounds(std::size_t m, std::size_t capacity)
      : live_(capacity, 0), seq_(capacity, 0), has_(capacity, 0), held_(capacity, 0), live_count_(m) {
    std::fill_n(live_.begin(), m, std::uint8_t{1});
  }

  sync::commit_decision on_commit(const sync::commit_event& c, sync::outcome_sink& out) {
    if (c.worker >= live_.size() || !live_[c.worker] || has_[c.worker]) return {sync::commit_action::drop, 0.0};
    has_[c.worker] = 1;
    seq_[c.worker] = c.sequence;
    ++buffered_;
    maybe_round(out);
    return {sync::commit_action::buffer, 0.0};
  }
  sync::pull_action on_pull(const sync::pull_event& q, sync::outcome_sink&) {
    if (has_[q.worker]) {
      held_[q.worker] = 1;
      return sync::pull_action::hold;
    }
    return sync::pull_action::serve;
  }
  void on_metric(const sync::metric_event&, sync::outcome_sink&) {}
  void on_join(const sync::membership_event& j, sync::outcome_sink& out) {
    if (!live_[j.worker]) ++live_count_;
    live_[j.worker] = 1;
    out.plan_changed(j.worker);
  }
  void on_evict(const sync::membership_event& j, sync::outcome_sink& out) {
    if (!live_[j.worker]) return;
    live_[j.worker] = 0;
    held_[j.worker] = 0;
    --live_count_;
    maybe_round(out);
  }
  void on_measurement(const sync::measurement_event&, sync::outcome_sink&) {}
  void drain(sync::outcome_sink& out) { round(out); }
  [[nodiscard]] ashl::worker_plan plan(sync::worker_id w) const {
    return {.local_iterations = 1 + w, .stage = ashl::stage_id::bsp};
  }
  [[nodiscard]] ashl::stage_id stage() const { return ashl::stage_id::bsp; }
  [[nodiscard]] bool is_live(sync::worker_id w) const { return w < live_.size() && live_[w]; }
  [[nodiscard]] bool is_held(sync::worker_id w) const { return w < held_.size() && held_[w]; }
  void save(ashl::state_writer& w) const {
    w.tag("TRND", 1);
    w.put_vector(live_);
    w.put_vector(seq_);
    w.put_vector(has_);
    w.put_vector(held_);
    w.put<std::uint64_t>(live_count_);
    w.put<std::uint64_t>(buffered_);
  }
  ashl::status load(ashl::state_reader& r) {
    rounds f;
    ASHL_TRY(r.tag("TRND", 1));
    ASHL_TRY(r.get_vector(f.live_, "live"));
    ASHL_TRY(r.get_vector(f.seq_, "seq"));
    ASHL_TRY(r.get_vector(f.has_, "has"));
    ASHL_TRY(r.get_vector(f.held_, "held"));
    std::uint64_t a = 0, b = 0;
    ASHL_TRY(r.get(a, "live_count"));
    ASHL_TRY(r.get(b, "buffered"));
    f.live_count_ = a;
    f.buffered_ = b;
    *this = std::move(f);
    return {};
  }

 private:
  void maybe_round(sync::outcome_sink& out) {
    std::size_t live_with = 0;
    for (std::size_t w = 0; w < live_.size(); ++w) live_with += live_[w] && has_[w];
    if (live_count_ > 0 && live_with == live_count_) round(out);
  }
  void round(sync::outcome_sink& out) {
    if (buffered_ == 0) return;
    const double wt = 1.0 / static_cast<double>(buffered_);
    for (std::size_t w = 0; w < has_.size(); ++w)
      if (has_[w]) {
        out.apply(static_cast<sync::worker_id>(w), seq_[w], wt);
        has_[w] = 0;
      }
    for (std::size_t w = 0; w < held_.size(); ++w)
      if (held_[w]) {
        out.release(static_cast<sync::worker_id>(w));
        held_[w] = 0;
      }
    buffered_ = 0;
  }

  std::vector<std::uint8_t> live_;
  std::vector<std::uint64_t> seq_;
  std::vector<std::uint8_t> has_, held_;
  std::size_t live_count_ = 0;
  std::size_t buffered_ = 0;
};
static_assert(sync::consistency_policy<rounds>);

// ---------------------------------------------------------------- helpers

std::vector<std::byte> dense(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * 4);
  ashl::compress::identity{}.encode(ashl::host_view<const float>(v.data(), v.size()), b, {}).value();
  return b;
}

std::vector<float> vec(std::size_t n, float base, float step) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = base + step * static_cast<float>(i);
  return v;
}

ps::shard_layout layout(std::uint64_t n) { return *ps::shard_layout::even(n, 1); }

ps::commit_in commit_of(sync::worker_id w, std::uint64_t seq, std::span<const std::byte> payload, std::uint64_t n,
                        bool pull = false, codec_id codec = codec_id::identity) {
  ps::commit_in c;
  c.worker = w;
  c.sequence = seq;
  c.clock = seq;
  c.bytes = payload.size() + 72;
  c.codec = codec;
  c.type = dtype::f32;
  c.element_count = n;
  c.payload = payload;
  c.pull = pull;
  return c;
}

std::uint32_t index_at(const std::vector<std::byte>& sparse, std::size_t j) {
  std::uint32_t v = 0;
  ashl::byte_reader r(std::span<const std::byte>(sparse).subspan(12 + 4 * j, 4));
  (void)r.get(v, "index");
  return v;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

template <class P>
ps::server_core<P> make(P p, std::uint64_t n, std::uint32_t m, ps::optimizer_params o = {},
                        std::span<const float> init = {}, std::uint64_t store = std::uint64_t{1} << 20,
                        std::uint32_t max_workers = 0) {
  auto c = ps::server_core<P>::create(
      {.layout = layout(n), .workers = m, .max_workers = max_workers, .optimizer = o, .store_bytes = store},
      std::move(p), init);
  BOOST_REQUIRE_MESSAGE(c.has_value(), c.to_status().to_string());
  return std::move(*c);
}

const ps::optimizer_params sgd_plain{.mode = ps::optimizer_params::kind::sgd, .lr = 0.5};
const ps::optimizer_params outer_nesterov{
    .mode = ps::optimizer_params::kind::outer, .lr = 0.7, .momentum = 0.9, .nesterov = true};
const ps::optimizer_params outer_delayed{.mode = ps::optimizer_params::kind::outer,
                                         .lr = 0.7,
                                         .momentum = 0.9,
                                         .nesterov = true,
                                         .nesterov_delay = 3,
                                         .nesterov_activation = 0.2};

}  // namespace

// ------------------------------------------------------------- creation

BOOST_AUTO_TEST_CASE(create_refuses_bad_parameters) {
  auto bad_shard = ps::server_core<sync::asp>::create({.layout = layout(4), .shard = 1}, sync::asp{{.workers = 1}});
  BOOST_REQUIRE(!bad_shard.has_value());
  BOOST_TEST(bad_shard.error().message() == "server_core.shard = 1: must be < layout.servers() = 1");
  const std::vector<float> three(3, 0.0f);
  auto bad_init = ps::server_core<sync::asp>::create({.layout = layout(4)}, sync::asp{{.workers = 1}}, three);
  BOOST_REQUIRE(!bad_init.has_value());
  BOOST_TEST(bad_init.error().message() == "server_core.initial.size = 3: must be 0 or the shard's 4 elements");
  auto bad_workers = ps::server_core<sync::asp>::create({.layout = layout(4), .workers = 3}, sync::asp{{.workers = 2}});
  BOOST_REQUIRE(!bad_workers.has_value());
  auto small_store =
      ps::server_core<sync::asp>::create({.layout = layout(100), .store_bytes = 399}, sync::asp{{.workers = 1}});
  BOOST_REQUIRE(!small_store.has_value());
  BOOST_TEST(small_store.error().message() ==
             "server_core.store_bytes = 399: holds less than one dense f32 commit of the shard (4 x 100 = 400 bytes; "
             "0 = automatic, 864 here)");
  auto bad_opt = ps::server_core<sync::asp>::create(
      {.layout = layout(4), .optimizer = {.mode = ps::optimizer_params::kind::model_delta, .momentum = 0.9}},
      sync::asp{{.workers = 1}});
  BOOST_REQUIRE(!bad_opt.has_value());
  BOOST_TEST(bad_opt.error().message() == "optimizer.momentum = 0.9: applies to sgd and outer only (model_delta adds the deltas)");
  // Issue 44, item 6: a worker count past ps::max_workers is refused by
  // name before any per-worker table is sized (a server aborted with
  // std::bad_alloc at 100,000,000), by the core and by make_policy.
  auto too_many = ps::server_core<sync::asp>::create({.layout = layout(4), .workers = 100000000},
                                                     sync::asp{{.workers = 1}});
  BOOST_REQUIRE(!too_many.has_value());
  BOOST_TEST(too_many.error().message() == "server_core.workers = 100000000: must be at most 65536 (ps::max_workers)");
  ps::policy_params pp{};
  pp.workers = 100000000;
  auto policy = ps::make_policy("bsp", pp);
  BOOST_REQUIRE(!policy.has_value());
  BOOST_TEST(policy.error().message() == "bsp.workers = 100000000: must be at most 65536 (ps::max_workers)");
  pp.workers = ps::max_workers;
  BOOST_TEST(ps::make_policy("asp", pp).has_value());
}

// --------------------------------------------------------- exact values: ASP

BOOST_AUTO_TEST_CASE(asp_model_deltas_add_each_commit_with_its_weight_bit_exactly) {
  const std::size_t n = 37;
  const std::uint32_t m = 3;
  const auto w0 = vec(n, 0.25f, -0.01f);
  auto core = make(sync::asp{{.workers = m, .scale = 1.0 / 3.0}}, n, m, {}, w0);
  ps::server_actions out(m);
  std::vector<float> expect = w0;
  const float third = static_cast<float>(1.0 / 3.0);
  for (std::uint64_t seq = 1; seq <= 4; ++seq)
    for (sync::worker_id w = 0; w < m; ++w) {
      const auto delta = vec(n, 0.1f * static_cast<float>(w + 1), 0.003f * static_cast<float>(seq));
      const auto bytes = dense(delta);
      core.commit(commit_of(w, seq, bytes, n, /*pull=*/true), 1.0 * static_cast<double>(seq), out);
      for (std::size_t i = 0; i < n; ++i) expect[i] += third * delta[i];
      BOOST_TEST(out.steps() == 1u);
      BOOST_TEST(out.errors().empty());
      BOOST_REQUIRE(out.pull_replies().size() == 1u);  // ASP serves the riding pull at once
      BOOST_TEST(out.pull_replies()[0] == w);
      out.clear();
    }
  BOOST_TEST(same_bits(core.parameters(), expect));
  BOOST_TEST(core.version() == 12u);
  BOOST_TEST(core.stats().commits == 12u);
  BOOST_TEST(core.stats().commits_applied == 12u);
  BOOST_TEST(core.stats().pulls_served == 12u);
  BOOST_TEST(core.store().empty());
}

BOOST_AUTO_TEST_CASE(sgd_momentum_nesterov_weight_decay_bit_exactly) {
  const std::size_t n = 19;
  for (bool nesterov : {false, true}) {
    const ps::optimizer_params o{.mode = ps::optimizer_params::kind::sgd, .lr = 0.05, .momentum = 0.9,
                                 .weight_decay = 1e-3, .nesterov = nesterov};
    const auto w0 = vec(n, -0.5f, 0.05f);
    auto core = make(sync::asp{{.workers = 2, .scale = 0.5}}, n, 2, o, w0);
    ps::server_actions out(2);
    std::vector<float> W = w0, v(n, 0.0f);
    const float lr = 0.05f, mu = 0.9f, wd = 1e-3f, half = 0.5f;
    for (std::uint64_t seq = 1; seq <= 5; ++seq)
      for (sync::worker_id w = 0; w < 2; ++w) {
        const auto g = vec(n, 0.2f - 0.1f * static_cast<float>(w), 0.01f * static_cast<float>(seq));
        const auto bytes = dense(g);
        core.commit(commit_of(w, seq, bytes, n), 0.0, out);
        BOOST_TEST(out.errors().empty());
        for (std::size_t i = 0; i < n; ++i) {
          const float acc = 0.0f + 1.0f * g[i];  // decoded at scale 1 into the zero accumulator
          const float gi = half * acc + wd * W[i];
          v[i] = mu * v[i] + gi;
          W[i] -= lr * (nesterov ? gi + mu * v[i] : v[i]);
        }
        out.clear();
      }
    BOOST_TEST(same_bits(core.parameters(), W));
    BOOST_TEST(same_bits(core.optimizer_state().velocity(), v));
  }
}

// ------------------------------------------------------- exact values: rounds

BOOST_AUTO_TEST_CASE(round_policy_applies_buffered_commits_once_per_round_bit_exactly) {
  const std::size_t n = 23;
  const std::uint32_t m = 4;
  for (bool sgd : {false, true}) {
    const auto w0 = vec(n, 1.0f, 0.125f);
    auto core = make(rounds(m), n, m, sgd ? sgd_plain : ps::optimizer_params{}, w0);
    ps::server_actions out(m);
    std::vector<float> W = w0;
    const float q = 0.25f;
    for (std::uint64_t seq = 1; seq <= 3; ++seq) {
      std::vector<std::vector<float>> deltas;
      for (sync::worker_id w = 0; w < m; ++w) {
        deltas.push_back(vec(n, 0.3f * static_cast<float>(w) - 0.4f, 0.07f / static_cast<float>(seq)));
        const auto bytes = dense(deltas.back());
        core.commit(commit_of(w, seq, bytes, n, /*pull=*/true), 0.0, out);
        BOOST_TEST(out.errors().empty());
        if (w + 1 < m) {
          BOOST_TEST(out.steps() == 0u);
          BOOST_TEST(out.pull_replies().empty());  // held until the round
          BOOST_TEST(same_bits(core.parameters(), W));
          BOOST_TEST(core.store().size() == w + 1u);
        }
      }
      // The last commit completed the round: it is decoded from the message
      // (not stored), every held pull is released, and the last worker's own
      // pull is served.
      BOOST_TEST(out.steps() == 1u);
      BOOST_TEST(out.pull_replies().size() == m);
      BOOST_TEST(core.store().empty());
      if (sgd) {
        std::vector<float> acc(n, 0.0f);
        for (sync::worker_id w = 0; w < m; ++w)
          for (std::size_t i = 0; i < n; ++i) acc[i] += q * deltas[w][i];
        for (std::size_t i = 0; i < n; ++i) W[i] -= 0.5f * (1.0f * acc[i] + 0.0f * W[i]);
      } else {
        for (sync::worker_id w = 0; w < m; ++w)
          for (std::size_t i = 0; i < n; ++i) W[i] += q * deltas[w][i];
      }
      BOOST_TEST(same_bits(core.parameters(), W));
      out.clear();
    }
    BOOST_TEST(core.version() == 3u);
    BOOST_TEST(core.stats().commits_applied == 12u);
    BOOST_TEST(core.stats().commits_buffered == 9u);  // the round's last commit was never stored
    BOOST_TEST(core.stats().pulls_held == 9u);
    BOOST_TEST(core.stats().pulls_released == 9u);
  }
}

// ------------------------------------------------------------ exactly once

BOOST_AUTO_TEST_CASE(duplicates_are_dropped_and_counted_without_touching_parameters) {
  const std::size_t n = 8;
  auto core = make(sync::asp{{.workers = 2}}, n, 2);
  ps::server_actions out(2);
  const auto a = dense(vec(n, 1.0f, 0.0f)), b = dense(vec(n, 2.0f, 0.0f));
  core.commit(commit_of(0, 1, a, n), 0.0, out);
  core.commit(commit_of(0, 2, a, n), 0.0, out);
  const std::vector<float> after(core.parameters().begin(), core.parameters().end());
  out.clear();
  core.commit(commit_of(0, 2, b, n, /*pull=*/true), 0.0, out);  // retransmission, different bytes even
  core.commit(commit_of(0, 1, b, n), 0.0, out);                 // older
  BOOST_TEST(same_bits(core.parameters(), after));
  BOOST_TEST(core.stats().duplicates == 2u);
  BOOST_TEST(core.stats().commits == 2u);
  BOOST_TEST(out.steps() == 0u);
  BOOST_TEST(out.errors().empty());
  BOOST_REQUIRE(out.pull_replies().size() == 1u);  // the riding pull is still answered
  BOOST_TEST(core.policy().staleness(0) == 0u);    // the policy saw only two commits
  for (float x : core.parameters()) BOOST_TEST(x == 2.0f);
}

BOOST_AUTO_TEST_CASE(rejoin_with_a_new_incarnation_restarts_sequences_and_refuses_the_old_one) {
  const std::size_t n = 4;
  auto core = make(sync::asp{{.workers = 2}}, n, 2);
  ps::server_actions out(2);
  const auto one = dense(vec(n, 1.0f, 0.0f));
  core.commit(commit_of(1, 1, one, n), 0.0, out);
  core.commit(commit_of(1, 2, one, n), 0.0, out);
  core.evict(1, 1.0, out);
  out.clear();
  auto c = commit_of(1, 3, one, n);
  core.commit(c, 1.5, out);  // evicted: refused
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST((out.errors()[0].reason == ps::refusal::not_live));
  BOOST_TEST(out.errors()[0].text == "commit.worker = 1: left or was evicted: join again");
  out.clear();
  core.join(1, 7, 2.0, out);  // restarted process
  BOOST_REQUIRE(out.plans().size() == 1u);
  BOOST_TEST(out.plans()[0].worker == 1u);
  BOOST_TEST((out.plans()[0].plan.stage == ashl::stage_id::asp));
  out.clear();
  core.commit(commit_of(1, 3, one, n), 2.1, out);  // incarnation 0: refused
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST((out.errors()[0].reason == ps::refusal::incarnation));
  BOOST_TEST(out.errors()[0].text == "commit.incarnation = 0: worker 1 joined as incarnation 7");
  BOOST_TEST(out.errors()[0].in_reply_to == 3u);
  out.clear();
  c = commit_of(1, 1, one, n);
  c.incarnation = 7;
  core.commit(c, 2.2, out);  // sequence 1 again: a new incarnation's first
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(out.steps() == 1u);
  core.commit(c, 2.3, out);  // and now a duplicate
  BOOST_TEST(core.stats().duplicates == 1u);
  for (float x : core.parameters()) BOOST_TEST(x == 3.0f);
  out.clear();
  core.join(1, 3, 2.4, out);  // an older incarnation's late join
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST(out.errors()[0].text == "join.incarnation = 3: stale: worker 1 is at incarnation 7 (a later process of this rank joined; this one must not commit)");
  out.clear();
  core.join(1, 7, 2.5, out);  // duplicate join: the plan again, nothing else
  BOOST_TEST(out.plans().size() == 1u);
  BOOST_TEST(core.stats().joins == 1u);
}

// Issue 24: workers join with fresh incarnations (the wall clock), not 0.
// A worker live from creation takes its first joiner's incarnation without
// an eviction: under BSP, worker 0's buffered commit does not make a round
// of one when worker 1 joins late.
BOOST_AUTO_TEST_CASE(first_join_of_a_worker_live_from_creation_takes_its_incarnation) {
  const std::size_t n = 4;
  auto core = make(sync::bsp{{.workers = 2}}, n, 2);
  ps::server_actions out(2);
  const auto one = dense(vec(n, 1.0f, 0.0f));
  core.join(0, 1000, 0.0, out);
  auto c0 = commit_of(0, 1, one, n);
  c0.incarnation = 1000;
  core.commit(c0, 0.1, out);
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(core.stats().commits_buffered == 1u);
  out.clear();
  core.join(1, 2000, 0.2, out);
  BOOST_TEST(core.stats().evictions == 0u);
  BOOST_TEST(core.stats().joins == 2u);
  BOOST_TEST(core.stats().commits_applied == 0u);  // the round still waits for worker 1
  BOOST_TEST(core.incarnation(1) == 2000u);
  BOOST_REQUIRE(out.plans().size() == 1u);
  out.clear();
  auto c1 = commit_of(1, 1, one, n);
  c1.incarnation = 2000;
  core.commit(c1, 0.3, out);
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(core.stats().commits_applied == 2u);
  BOOST_TEST(core.stats().duplicates == 0u);
  // Now touched: a later process of rank 1 is a restart (an eviction first).
  out.clear();
  core.join(1, 3000, 0.4, out);
  BOOST_TEST(core.stats().evictions == 1u);
  BOOST_TEST(core.incarnation(1) == 3000u);
}

BOOST_AUTO_TEST_CASE(rejoin_while_an_old_commit_is_still_buffered_does_not_collide) {
  const std::size_t n = 3;
  auto core = make(rounds(2), n, 2);
  ps::server_actions out(2);
  const auto one = dense({1.0f, 1.0f, 1.0f}), ten = dense({10.0f, 10.0f, 10.0f});
  core.commit(commit_of(0, 1, one, n), 0.0, out);  // buffered (waits for worker 1)
  core.join(0, 1, 0.5, out);                       // worker 0 restarts: old incarnation evicted, commit kept
  auto c = commit_of(0, 1, ten, n);
  c.incarnation = 1;
  core.commit(c, 0.6, out);  // its sequence 1 again; the policy sees sequence 2
  BOOST_TEST(out.errors().empty());
  // The rounds policy keeps one commit per worker, so it drops the new one;
  // the old incarnation's commit stays stored under its own key.
  BOOST_TEST(core.stats().commits_dropped == 1u);
  BOOST_TEST(core.store().size() == 1u);
  out.clear();
  core.drain(out);
  BOOST_TEST(out.steps() == 1u);
  BOOST_TEST(core.store().empty());
  for (float x : core.parameters()) BOOST_TEST(x == 1.0f);
}

// ------------------------------------------------------------ bounded store

BOOST_AUTO_TEST_CASE(store_bound_refuses_past_it_keeps_what_it_had_and_applies_it_later) {
  const std::size_t n = 16;  // 64-byte payloads
  const std::uint32_t m = 4;
  auto core = make(rounds(m), n, m, {}, {}, /*store=*/150);
  ps::server_actions out(m);
  std::vector<std::vector<float>> d;
  for (sync::worker_id w = 0; w < m; ++w) d.push_back(vec(n, static_cast<float>(w + 1), 0.5f));
  std::vector<std::vector<std::byte>> b;
  for (auto& x : d) b.push_back(dense(x));
  core.commit(commit_of(0, 1, b[0], n), 0.0, out);
  core.commit(commit_of(1, 1, b[1], n), 0.0, out);
  BOOST_TEST(out.errors().empty());
  core.commit(commit_of(2, 1, b[2], n), 0.0, out);
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST((out.errors()[0].reason == ps::refusal::store_full));
  BOOST_TEST((out.errors()[0].code == ashl::errc::out_of_range));
  BOOST_TEST(out.errors()[0].text ==
             "store_bytes = 150: a payload of 64 bytes would pass it (128 bytes of 2 buffered commits held); give the "
             "server a larger store_bytes (0 = automatic: 768 for 4 workers)");
  BOOST_TEST(core.store().size() == 2u);
  BOOST_TEST(core.stats().refused_for(ps::refusal::store_full) == 1u);
  BOOST_TEST(core.stats().commits == 2u);  // the policy never saw the refused one
  for (float x : core.parameters()) BOOST_TEST(x == 0.0f);
  out.clear();
  // Workers 2 and 3 are evicted: the round of 0 and 1 completes with what
  // the store kept.
  core.evict(2, 1.0, out);
  BOOST_TEST(out.steps() == 0u);
  core.evict(3, 1.0, out);
  BOOST_TEST(out.steps() == 1u);
  std::vector<float> expect(n, 0.0f);
  for (int w = 0; w < 2; ++w)
    for (std::size_t i = 0; i < n; ++i) expect[i] += 0.5f * d[w][i];
  BOOST_TEST(same_bits(core.parameters(), expect));
  BOOST_TEST(core.store().empty());
  BOOST_TEST(core.store().arena_bytes() <= 150u);
}

// ------------------------------------------------------------ eviction

BOOST_AUTO_TEST_CASE(eviction_releases_held_pulls_of_others_and_drops_the_evicted_ones) {
  const std::size_t n = 2;
  auto core = make(sync::ssp{{.workers = 3, .staleness = 0}}, n, 3);
  ps::server_actions out(3);
  const auto x = dense({1.0f, 1.0f});
  core.commit(commit_of(0, 1, x, n), 0.0, out);
  core.commit(commit_of(0, 2, x, n, true), 0.1, out);  // c0 = 2, min 0: held
  core.commit(commit_of(1, 1, x, n, true), 0.2, out);  // c1 = 1: held
  BOOST_TEST(out.pull_replies().empty());
  BOOST_TEST(core.is_held(0));
  BOOST_TEST(core.is_held(1));
  out.clear();
  core.evict(2, 1.0, out);  // min over {0, 1} = 1: worker 1 released, 0 still ahead
  BOOST_REQUIRE(out.pull_replies().size() == 1u);
  BOOST_TEST(out.pull_replies()[0] == 1u);
  BOOST_TEST(core.is_held(0));
  out.clear();
  core.evict(0, 2.0, out);  // its held pull is dropped, never answered
  BOOST_TEST(out.pull_replies().empty());
  BOOST_TEST(!core.is_held(0));
  BOOST_TEST(core.stats().pulls_dropped == 1u);
  BOOST_TEST(core.stats().pulls_released == 1u);
  BOOST_TEST(core.stats().evictions == 2u);
  out.clear();
  core.pull(0, 2.5, out);
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST((out.errors()[0].reason == ps::refusal::not_live));
}

BOOST_AUTO_TEST_CASE(buffered_commits_of_an_evicted_worker_still_apply) {
  const std::size_t n = 2;
  auto core = make(rounds(3), n, 3);
  ps::server_actions out(3);
  core.commit(commit_of(0, 1, dense({4.0f, 8.0f}), n), 0.0, out);
  core.commit(commit_of(1, 1, dense({2.0f, 2.0f}), n), 0.0, out);
  core.evict(0, 0.5, out);  // its commit stays buffered
  BOOST_TEST(core.store().size() == 2u);
  BOOST_TEST(out.steps() == 0u);
  core.evict(2, 0.6, out);  // round of live worker 1, with 0's commit too
  BOOST_TEST(out.steps() == 1u);
  BOOST_TEST(core.parameters()[0] == 0.5f * 4.0f + 0.5f * 2.0f);
  BOOST_TEST(core.parameters()[1] == 0.5f * 8.0f + 0.5f * 2.0f);
}

// ---------------------------------------------------------------- bad input

BOOST_AUTO_TEST_CASE(bad_commits_are_refused_named_counted_and_change_nothing) {
  const std::size_t n = 64;
  for (bool sgd : {false, true}) {
    const auto w0 = vec(n, 0.5f, 0.01f);
    auto core = make(sync::asp{{.workers = 2}}, n, 2, sgd ? sgd_plain : ps::optimizer_params{}, w0);
    ps::server_actions out(2);
    const auto good = dense(vec(n, 1.0f, 0.0f));
    std::uint64_t seq = 1;
    auto expect_refused = [&](ps::commit_in c, ps::refusal why, const std::string& text) {
      c.sequence = seq;
      core.commit(c, 0.0, out);
      BOOST_REQUIRE(out.errors().size() == 1u);
      BOOST_TEST((out.errors()[0].reason == why), ps::to_string(why));
      BOOST_TEST(out.errors()[0].text == text);
      BOOST_TEST(out.errors()[0].in_reply_to == c.sequence);
      BOOST_TEST(out.steps() == 0u);
      BOOST_TEST(same_bits(core.parameters(), w0));
      BOOST_TEST(core.stats().commits == 0u);
      BOOST_TEST(core.last_sequence(0) == 0u);  // the sequence is not consumed
      out.clear();
    };
    // identity of the wrong size
    expect_refused(commit_of(0, 1, std::span(good).first(good.size() - 4), n), ps::refusal::payload,
                   "commit.payload_bytes = 252: identity of 64 f32 is 256 bytes");
    expect_refused(commit_of(0, 1, good, n - 1), ps::refusal::element_count,
                   "commit.element_count = 63: this server's shard 0 holds 64");
    auto i8 = commit_of(0, 1, good, n);
    i8.type = dtype::i8;
    expect_refused(i8, ps::refusal::dtype, "commit.dtype = \"i8\": must be f32, f16 or bf16");
    auto unknown = commit_of(0, 1, good, n);
    unknown.codec = static_cast<codec_id>(200);
    expect_refused(unknown, ps::refusal::codec, "commit.codec = 200: unknown codec id");
    auto zero = commit_of(0, 0, good, n);
    core.commit(zero, 0.0, out);
    BOOST_REQUIRE(out.errors().size() == 1u);
    BOOST_TEST(out.errors()[0].text == "commit.sequence = 0: sequences start at 1");
    out.clear();
    core.commit(commit_of(9, 1, good, n), 0.0, out);
    BOOST_REQUIRE(out.errors().size() == 1u);
    BOOST_TEST(out.errors()[0].text == "commit.worker = 9: not a worker of this server (join first)");
    BOOST_TEST((out.errors()[0].code == ashl::errc::not_found));
    out.clear();
    // top-k with an index out of range, and with indices not increasing
    const auto g = vec(n, -1.0f, 0.05f);
    ashl::compress::topk tk(ashl::compress::topk::count{4});
    std::vector<std::byte> sparse(tk.max_encoded_bytes(n, dtype::f32));
    sparse.resize(tk.encode(ashl::host_view<const float>(g.data(), n), sparse, {}).value());
    auto bad_index = sparse;
    ashl::byte_writer(std::span(bad_index).subspan(12 + 4 * 3, 4)).put(std::uint32_t{64});
    expect_refused(commit_of(0, 1, bad_index, n, false, codec_id::topk), ps::refusal::payload,
                   "topk.index[3] = 64: must be < n = 64");
    auto unordered = sparse;
    ashl::byte_writer(std::span(unordered).subspan(12 + 4 * 2, 4)).put(std::uint32_t{0});
    expect_refused(commit_of(0, 1, unordered, n, false, codec_id::topk), ps::refusal::payload,
                   "topk.index[2] = 0: must be greater than the previous index " + std::to_string(index_at(sparse, 1)));
    // qsgd truncated
    ashl::compress::qsgd qs;
    std::vector<std::byte> qb(qs.max_encoded_bytes(n, dtype::f32));
    qb.resize(qs.encode(ashl::host_view<const float>(g.data(), n), qb, {}).value());
    auto qcut = commit_of(0, 1, std::span(qb).first(qb.size() - 1), n, false, codec_id::qsgd);
    qcut.sequence = seq;
    core.commit(qcut, 0.0, out);
    BOOST_REQUIRE(out.errors().size() == 1u);
    BOOST_TEST((out.errors()[0].reason == ps::refusal::payload));
    BOOST_TEST(same_bits(core.parameters(), w0));
    out.clear();
    // over the wire limits
    auto big = ps::server_core<sync::asp>::create(
        {.layout = layout(n), .workers = 1, .limits = {.max_payload_bytes = 100}}, sync::asp{{.workers = 1}});
    big->commit(commit_of(0, 1, good, n), 0.0, out);
    BOOST_REQUIRE(out.errors().size() == 1u);
    BOOST_TEST(out.errors()[0].text == "commit.payload_bytes = 256: exceeds limits.max_payload_bytes = 100");
    out.clear();
    // A valid commit afterwards lands exactly: nothing of the refused ones
    // stayed in the accumulator.
    core.commit(commit_of(0, 1, good, n), 0.0, out);
    BOOST_TEST(out.errors().empty());
    std::vector<float> expect = w0;
    for (std::size_t i = 0; i < n; ++i) expect[i] = sgd ? w0[i] - 0.5f * (1.0f * 1.0f + 0.0f * w0[i]) : w0[i] + 1.0f;
    BOOST_TEST(same_bits(core.parameters(), expect));
    BOOST_TEST(core.stats().refused_total() == 9u);
    BOOST_TEST(core.stats().refused_for(ps::refusal::payload) == 4u);
    out.clear();
  }
}

BOOST_AUTO_TEST_CASE(every_codec_decodes_by_its_own_id) {
  const std::size_t n = 300;
  const auto g = vec(n, -0.7f, 0.004f);
  auto core = make(sync::asp{{.workers = 1}}, n, 1);
  ps::server_actions out(1);
  std::uint64_t seq = 0;
  std::vector<float> expect(n, 0.0f);
  auto send = [&](const auto& codec) {
    std::vector<std::byte> b(codec.max_encoded_bytes(n, dtype::f32));
    b.resize(codec.encode(ashl::host_view<const float>(g.data(), n), b, {}).value());
    auto c = commit_of(0, ++seq, b, n, false, std::decay_t<decltype(codec)>::id);
    core.commit(c, 0.0, out);
    BOOST_TEST(out.errors().empty());
    BOOST_TEST(ashl::compress::decode_add(c.codec, b, {n, dtype::f32}, ashl::host_view<float>(expect.data(), n), 1.0f,
                                          {})
                   .ok());
    BOOST_TEST(same_bits(core.parameters(), expect));
    out.clear();
  };
  send(ashl::compress::identity{});
  send(ashl::compress::topk{0.05});
  send(ashl::compress::qsgd{});
  BOOST_TEST(core.version() == 3u);
}

BOOST_AUTO_TEST_CASE(bad_measurements_are_refused) {
  auto core = make(sync::asp{{.workers = 1}}, 0, 1);
  ps::server_actions out(1);
  core.measurement({.worker = 0, .kind = ashl::measurement_kind::push, .seconds = 0.0}, out);
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST(out.errors()[0].text == "measurement.seconds = 0: must be finite and > 0");
  out.clear();
  core.measurement({.worker = 5, .kind = ashl::measurement_kind::push, .seconds = 1.0}, out);
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST((out.errors()[0].reason == ps::refusal::unknown_worker));
  out.clear();
  core.measurement({.worker = 0, .kind = ashl::measurement_kind::push, .seconds = 0.5, .amount = 10}, out);
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(core.stats().refused_for(ps::refusal::measurement) == 1u);
}

// ---------------------------------------------------------------- timing only

BOOST_AUTO_TEST_CASE(timing_only_layout_takes_policy_decisions_without_payloads) {
  auto core = make(rounds(3), 0, 3);
  ps::server_actions out(3);
  BOOST_TEST(core.timing_only());
  for (std::uint64_t seq = 1; seq <= 5; ++seq)
    for (sync::worker_id w = 0; w < 3; ++w) {
      ps::commit_in c{.worker = w, .sequence = seq, .bytes = 4096, .element_count = 123456, .pull = true};
      core.commit(c, 0.0, out);
    }
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(out.steps() == 5u);
  BOOST_TEST(out.pull_replies().size() == 15u);
  BOOST_TEST(core.version() == 5u);
  BOOST_TEST(core.store().empty());
  BOOST_TEST(core.stats().bytes_in == 15u * 4096u);
  BOOST_TEST(core.parameters().empty());
}

BOOST_AUTO_TEST_CASE(join_sends_the_plan_and_plan_changes_reach_live_workers) {
  // The policy knows 4 ids, all live; the core 2 live at creation, ranks up to 4.
  auto core = make(rounds(4), 0, 2, {}, {}, std::uint64_t{1} << 20, 4);
  ps::server_actions out(4);
  core.join(3, 0, 0.0, out);  // a new id for the core
  BOOST_REQUIRE(out.plans().size() == 1u);
  BOOST_TEST(out.plans()[0].worker == 3u);
  BOOST_TEST(out.plans()[0].plan.local_iterations == 4u);
  BOOST_TEST(core.stats().plans_sent == 1u);
  out.clear();
  core.leave(3, 1.0, out);
  BOOST_TEST(core.stats().leaves == 1u);
  core.leave(3, 1.0, out);
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST(out.errors()[0].text == "leave.worker = 3: left or was evicted: join again");
}

// ------------------------------------------------- max_workers (docs/elastic.md §2, E1)

namespace {

using test_support::saved;

}  // namespace

BOOST_AUTO_TEST_CASE(max_workers_is_validated_by_name_and_0_means_workers) {
  auto below = ps::server_core<sync::asp>::create({.layout = layout(4), .workers = 3, .max_workers = 2},
                                                  sync::asp{{.workers = 3}});
  BOOST_REQUIRE(!below.has_value());
  BOOST_TEST(below.error().message() ==
             "server_core.max_workers = 2: must be 0 (the same as workers) or at least server_core.workers = 3");
  auto past = ps::server_core<sync::asp>::create({.layout = layout(4), .workers = 3, .max_workers = 65537},
                                                 sync::asp{{.workers = 3}});
  BOOST_REQUIRE(!past.has_value());
  BOOST_TEST(past.error().message() == "server_core.max_workers = 65537: must be at most 65536 (ps::max_workers)");
  // 0 and the initial count are today's fixed set: the same parameters, the same state.
  auto zero = make(sync::asp{{.workers = 3}}, 4, 3);
  auto same = make(sync::asp{{.workers = 3}}, 4, 3, {}, {}, std::uint64_t{1} << 20, 3);
  BOOST_TEST(zero.params().max_workers == 3u);
  BOOST_TEST((saved(zero) == saved(same)));
  BOOST_TEST(zero.known_workers() == 3u);
  BOOST_TEST(zero.live_count() == 3u);
  // The automatic store bound holds a commit per rank the job may have.
  auto grown = ps::server_core<sync::asp>::create({.layout = layout(100), .workers = 3, .max_workers = 7},
                                                  sync::asp{{.workers = 3}});
  BOOST_REQUIRE(grown.has_value());
  BOOST_TEST(grown->params().store_bytes == ps::automatic_store_bytes(100, 7));
  BOOST_TEST(grown->params().store_bytes == 7u * (8u * 100u + 64u));
}

// A rank in M0..Mmax-1 that was never live joins, commits and is applied:
// ASP adds its commit at once; BSP's round waits for it and averages it in
// (dyadic values, 4 live workers: weight 1/4, exact in any order).
BOOST_AUTO_TEST_CASE(a_rank_past_the_initial_workers_joins_commits_and_is_applied) {
  const std::size_t n = 4;
  const std::vector<float> w0{1.0f, 2.0f, 3.0f, 4.0f};
  {
    auto core = make(sync::asp{{.workers = 2, .scale = 1.0}}, n, 2, {}, w0, std::uint64_t{1} << 20, 4);
    ps::server_actions out(4);
    core.join(3, 77, 0.5, out);  // rank 2 never joins: the table covers it, unknown
    BOOST_TEST(out.errors().empty());
    BOOST_REQUIRE(out.plans().size() == 1u);
    BOOST_TEST(out.plans()[0].worker == 3u);
    BOOST_TEST(core.known_workers() == 4u);
    BOOST_TEST(core.is_known(3));
    BOOST_TEST(!core.is_known(2));
    BOOST_TEST(!core.is_live(2));
    BOOST_TEST(core.live_count() == 3u);
    BOOST_TEST(core.incarnation(3) == 77u);
    out.clear();
    const auto d3 = dense({0.5f, -0.25f, 1.0f, 0.125f});
    auto c = commit_of(3, 1, d3, n, /*pull=*/true);
    c.incarnation = 77;
    core.commit(c, 1.0, out);
    BOOST_TEST(out.errors().empty());
    BOOST_TEST(out.steps() == 1u);
    BOOST_REQUIRE(out.pull_replies().size() == 1u);
    BOOST_TEST(out.pull_replies()[0] == 3u);
    BOOST_TEST(same_bits(core.parameters(), std::vector<float>{1.5f, 1.75f, 4.0f, 4.125f}));
    BOOST_TEST(core.last_sequence(3) == 1u);
    // A commit of the rank that never joined is refused as before.
    out.clear();
    core.commit(commit_of(2, 1, dense(w0), n), 1.1, out);
    BOOST_REQUIRE(out.errors().size() == 1u);
    BOOST_TEST((out.errors()[0].reason == ps::refusal::unknown_worker));
    // It leaves: one live fewer, still known.
    out.clear();
    core.leave(3, 2.0, out);
    BOOST_TEST(core.live_count() == 2u);
    BOOST_TEST(core.known_workers() == 4u);
  }
  for (const char* name : {"bsp", "local_sgd"}) {
    ps::policy_params pp;
    pp.workers = 2;
    auto core = make(ps::make_policy(name, pp).value(), n, 2, {}, w0, std::uint64_t{1} << 20, 4);
    ps::server_actions out(4);
    core.join(2, 5, 0.0, out);
    core.join(3, 6, 0.0, out);
    BOOST_TEST(out.errors().empty(), name);
    BOOST_TEST(core.live_count() == 4u, name);
    out.clear();
    // The joiners count from the next round boundary (docs/elastic.md §2.4):
    // their first pulls are held until the round ranks 0 and 1 compute
    // completes without them, then they count in the next one.
    core.pull(2, 0.0, out);
    core.pull(3, 0.0, out);
    BOOST_TEST(out.pull_replies().empty(), name);
    for (std::uint64_t seq = 1; seq <= 2; ++seq) {
      for (sync::worker_id w = 0; w < 4; ++w) {
        if (seq == 1 && w >= 2) continue;  // the joiners wait for their parameters
        const float v = static_cast<float>(w + 1);  // worker w commits (w+1) * (1, -1, 2, 0.5)
        const auto d = dense({v, -v, 2 * v, 0.5f * v});
        auto c = commit_of(w, w < 2 ? seq : 1, d, n, true);
        c.incarnation = w < 2 ? 0 : w + 3;
        core.commit(c, 1.0, out);
        BOOST_TEST(out.errors().empty(), name);
        BOOST_TEST(out.steps() == (w == (seq == 1 ? 1u : 3u) ? 1u : 0u), name << ": the round waits for its workers");
      }
      BOOST_TEST(out.pull_replies().size() == 4u, name);  // round 1: ranks 0, 1 and the joiners' held pulls
      out.clear();
    }
    BOOST_TEST(core.stats().commits_applied == 6u, name);
    // (1 + 2)/2 = 1.5, then Σ (w+1)/4 = 2.5: 4 in all
    BOOST_TEST(same_bits(core.parameters(), std::vector<float>{5.0f, -2.0f, 11.0f, 6.0f}), name);
  }
}

// A join of rank >= max_workers is refused by name before anything else:
// the table does not grow, the policy is not told, and the state saves the
// same bytes but for the refusal's counter (0 to 1) and the CRC over it.
BOOST_AUTO_TEST_CASE(a_join_past_max_workers_is_refused_by_name_and_changes_nothing) {
  const std::size_t n = 4;
  auto core = make(sync::bsp{{.workers = 2}}, n, 2, {}, {}, std::uint64_t{1} << 20, 3);
  ps::server_actions out(3);
  core.join(2, 9, 0.0, out);
  core.commit(commit_of(0, 1, dense({1.0f, 1.0f, 1.0f, 1.0f}), n, true), 0.1, out);  // buffered, its pull held
  BOOST_TEST(out.errors().empty());
  out.clear();
  const auto before = saved(core);
  const auto stats = core.stats();
  for (sync::worker_id rank : {3u, 4u, 0xfffffffeu}) {
    core.join(rank, 1, 0.2, out);
    BOOST_REQUIRE(out.errors().size() == 1u);
    BOOST_TEST((out.errors()[0].reason == ps::refusal::max_workers));
    BOOST_TEST((out.errors()[0].code == ashl::errc::out_of_range));
    BOOST_TEST(out.errors()[0].worker == rank);
    BOOST_TEST(out.errors()[0].text ==
               "join.rank = " + std::to_string(rank) + ": this job admits at most 3 workers (ranks 0..2)");
    BOOST_TEST(out.plans().empty());
    BOOST_TEST(out.pull_replies().empty());
    BOOST_TEST(out.steps() == 0u);
    out.clear();
  }
  BOOST_TEST(core.known_workers() == 3u);
  BOOST_TEST(core.live_count() == 3u);
  BOOST_TEST(core.stats().refused_for(ps::refusal::max_workers) == 3u);
  auto expect = stats;
  expect.refused[static_cast<std::size_t>(ps::refusal::max_workers)] = 3;
  BOOST_TEST((core.stats() == expect));
  const auto after = saved(core);
  BOOST_REQUIRE(after.size() == before.size());
  std::vector<std::size_t> differ;
  for (std::size_t i = 0; i + 4 < after.size(); ++i)
    if (after[i] != before[i]) differ.push_back(i);
  BOOST_REQUIRE(differ.size() == 1u);  // the counter's low byte
  BOOST_TEST(static_cast<unsigned>(before[differ[0]]) == 0u);
  BOOST_TEST(static_cast<unsigned>(after[differ[0]]) == 3u);
  // The round still waits for rank 1 only: none of the refused ranks, nor
  // rank 2, which joined during it and counts from the next round
  // (docs/elastic.md §2.4).
  core.commit(commit_of(1, 1, dense({1.0f, 1.0f, 1.0f, 1.0f}), n, true), 0.3, out);
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(out.steps() == 1u);
  BOOST_TEST(out.pull_replies().size() == 2u);
  const auto ones = dense({1.0f, 1.0f, 1.0f, 1.0f});
  auto c2 = commit_of(2, 1, ones, n, true);
  c2.incarnation = 9;
  core.commit(c2, 0.4, out);
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(out.steps() == 1u);  // rank 2's commit is in the next round

  // max_workers left at 0: the initial set is the maximum (the driver
  // refused rank >= workers before; now the core does too).
  auto fixed = make(sync::asp{{.workers = 2}}, n, 2);
  out.clear();
  fixed.join(2, 1, 0.0, out);
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST(out.errors()[0].text == "join.rank = 2: this job admits at most 2 workers (ranks 0..1)");
  BOOST_TEST(fixed.known_workers() == 2u);
}

// The core's per-rank tables are reserved for max_workers at creation (and
// at load): a join of a rank past the initial set allocates nothing of the
// core's own (the test policy has room for every id), and neither do the
// joiner's commits and pulls after its first.
BOOST_AUTO_TEST_CASE(a_join_within_max_workers_allocates_nothing_in_the_core) {
  const std::size_t n = 64;
  const auto d = dense(vec(n, 0.01f, 0.001f));
  for (bool loaded : {false, true}) {
    auto core = make(rounds(2, 6), n, 2, {}, {}, std::uint64_t{1} << 20, 6);
    if (loaded) {  // the capacity comes back with a load too
      auto fresh = make(rounds(2, 6), n, 2);
      const auto bytes = saved(core);
      ashl::state_reader r(bytes);
      BOOST_REQUIRE(fresh.load(r).ok());
      BOOST_TEST(fresh.params().max_workers == 6u);
      core = std::move(fresh);
    }
    ps::server_actions out(6);
    out.clear();
    const auto before = counting_new::count();
    for (sync::worker_id w = 2; w < 6; ++w) {
      core.join(w, 10 + w, 0.0, out);
      (void)core.serve_staleness(w);  // its first reply
    }
    const auto after = counting_new::count();
    BOOST_TEST(out.errors().empty());
    BOOST_TEST(after - before == 0u, (loaded ? "loaded" : "created"));
    BOOST_TEST(core.live_count() == 6u);
    out.clear();
    std::uint64_t errors = 0;
    auto rounds_of = [&](std::uint64_t from, std::uint64_t to) {
      for (std::uint64_t seq = from; seq < to; ++seq)
        for (sync::worker_id w = 0; w < 6; ++w) {
          auto c = commit_of(w, seq, d, n, true);
          c.incarnation = w < 2 ? 0 : 10 + w;
          core.commit(c, static_cast<double>(seq), out);
          (void)core.serve_staleness(w);
          errors += out.errors().size();
          out.clear();
        }
    };
    rounds_of(1, 4);  // warm-up: the store's arena and index
    const auto b2 = counting_new::count();
    rounds_of(4, 40);
    BOOST_TEST(counting_new::count() - b2 == 0u);
    BOOST_TEST(errors == 0u);
    BOOST_TEST(core.stats().commits_applied == 39u * 6u);
  }
}

// max_workers and the joined ranks travel with the state (PSCR version 3):
// a core loads them whatever it was created with, and goes on identically.
BOOST_AUTO_TEST_CASE(max_workers_and_joined_ranks_save_and_load) {
  const std::size_t n = 4;
  auto a = make(sync::asp{{.workers = 2, .scale = 0.5}}, n, 2, {}, {}, std::uint64_t{1} << 20, 5);
  ps::server_actions out(5);
  a.join(4, 3, 0.0, out);
  const auto d4 = dense({1.0f, 2.0f, 3.0f, 4.0f});
  auto c = commit_of(4, 1, d4, n);
  c.incarnation = 3;
  a.commit(c, 0.1, out);
  a.join(7, 1, 0.2, out);  // refused: counted
  out.clear();
  const auto bytes = saved(a);
  auto b = make(sync::asp{{.workers = 2, .scale = 0.5}}, n, 2);  // max_workers 2 here
  ashl::state_reader r(bytes);
  BOOST_REQUIRE(b.load(r).ok());
  BOOST_TEST(b.params().max_workers == 5u);
  BOOST_TEST(b.known_workers() == 5u);
  BOOST_TEST(b.live_count() == 3u);
  BOOST_TEST(b.is_live(4));
  BOOST_TEST((b.stats() == a.stats()));
  BOOST_TEST((saved(b) == bytes));
  for (auto* core : {&a, &b}) {
    c.sequence = 2;
    core->commit(c, 0.3, out);
    core->join(3, 1, 0.4, out);
    core->join(5, 1, 0.5, out);  // past 5: refused in both
    BOOST_REQUIRE(out.errors().size() == 1u);
    BOOST_TEST(out.errors()[0].text == "join.rank = 5: this job admits at most 5 workers (ranks 0..4)");
    out.clear();
  }
  BOOST_TEST(same_bits(a.parameters(), b.parameters()));
  BOOST_TEST((saved(a) == saved(b)));
}

// ---------------------------------------------------------------- allocation

BOOST_AUTO_TEST_CASE(no_allocation_in_steady_state) {
  const std::size_t n = 512;
  const std::uint32_t m = 4;
  const auto g = vec(n, 0.01f, 0.0001f);
  const auto dense_bytes = dense(g);
  ashl::compress::topk tk(0.05);
  std::vector<std::byte> sparse(tk.max_encoded_bytes(n, dtype::f32));
  sparse.resize(tk.encode(ashl::host_view<const float>(g.data(), n), sparse, {}).value());

  auto check = [&](auto core, const char* what) {
    ps::server_actions out(m);
    std::uint64_t errors = 0;
    auto events = [&](std::uint64_t from, std::uint64_t to) {
      for (std::uint64_t seq = from; seq < to; ++seq)
        for (sync::worker_id w = 0; w < m; ++w) {
          const bool sp = (seq + w) % 2 == 0;
          core.commit(commit_of(w, seq, sp ? std::span<const std::byte>(sparse) : std::span<const std::byte>(dense_bytes),
                                n, /*pull=*/true, sp ? codec_id::topk : codec_id::identity),
                      static_cast<double>(seq), out);
          core.measurement({.worker = w, .kind = ashl::measurement_kind::push, .seconds = 0.01, .amount = 100,
                            .time = static_cast<double>(seq)},
                           out);
          errors += out.errors().size();
          out.clear();
        }
    };
    events(1, 50);  // warm-up
    const std::uint64_t before = counting_new::count();
    events(50, 800);
    const std::uint64_t after = counting_new::count();
    BOOST_TEST(errors == 0u, what);
    BOOST_TEST(after - before == 0u, what);
    BOOST_TEST(core.stats().commits == 799u * m, what);
  };
  check(make(sync::ssp{{.workers = m, .staleness = 2}}, n, m), "ssp model deltas");
  check(make(sync::ssp{{.workers = m, .staleness = 2}}, n, m,
             {.mode = ps::optimizer_params::kind::sgd, .lr = 0.01, .momentum = 0.9}),
        "ssp sgd");
  check(make(sync::bsp{{.workers = m}}, n, m), "bsp model deltas (the store)");
  check(make(sync::bsp{{.workers = m}}, n, m, sgd_plain), "bsp sgd (the store)");
  check(make(rounds(m), n, m), "rounds model deltas (the store)");
  check(make(rounds(m), n, m, sgd_plain), "rounds sgd (the store)");
  check(make(rounds(m), 0, m), "rounds timing only");
  // The outer optimizer (DiLoCo): per commit with Delayed Nesterov, per round with Nesterov.
  check(make(sync::ssp{{.workers = m, .staleness = 2}}, n, m, outer_delayed), "ssp outer, Delayed Nesterov");
  check(make(rounds(m), n, m, outer_nesterov), "rounds outer Nesterov (the store)");
}

// ---------------------------------------------------------------- save/load

namespace {

template <class Core>
void script(Core& core, std::uint64_t from, std::uint64_t to, std::vector<float>& trail) {
  ps::server_actions out(3);
  for (std::uint64_t seq = from; seq < to; ++seq)
    for (sync::worker_id w = 0; w < 3; ++w) {
      const auto d = vec(5, 0.1f * static_cast<float>(w + seq), 0.01f);
      const auto b = dense(d);
      core.commit(commit_of(w, seq, b, 5, /*pull=*/w != 1), static_cast<double>(seq), out);
      if (seq % 3 == 0 && w == 2) core.pull(1, static_cast<double>(seq), out);
      for (auto r : out.pull_replies()) trail.push_back(static_cast<float>(r));
      trail.push_back(static_cast<float>(out.steps()));
      out.clear();
    }
  for (float x : core.parameters()) trail.push_back(x);
}

template <class P>
void round_trip(P policy, ps::optimizer_params o) {
  auto a = make(policy, 5, 3, o);
  std::vector<float> ta, tb;
  script(a, 1, 5, ta);
  ps::server_actions out(3);
  a.commit(commit_of(0, 5, dense(vec(5, 1.0f, 1.0f)), 5, true), 5.0, out);  // leave something buffered/held
  std::vector<std::byte> bytes;
  ashl::state_writer w(bytes);
  a.save(w);

  auto b = make(policy, 5, 3, {.mode = ps::optimizer_params::kind::sgd, .lr = 0.3});  // other parameters
  ashl::state_reader r(bytes);
  BOOST_REQUIRE_MESSAGE(b.load(r).ok(), "load");
  BOOST_TEST(same_bits(a.parameters(), b.parameters()));
  BOOST_TEST((a.stats() == b.stats()));
  BOOST_TEST((a.params().optimizer == b.params().optimizer));
  BOOST_TEST(a.store().size() == b.store().size());
  ta.clear();
  script(a, 6, 12, ta);
  script(b, 6, 12, tb);
  BOOST_TEST(ta == tb);
  BOOST_TEST((a.stats() == b.stats()));
  BOOST_TEST(same_bits(a.optimizer_state().velocity(), b.optimizer_state().velocity()));

  // Truncated and corrupt states are refused and leave the core unchanged.
  std::vector<std::byte> before;
  ashl::state_writer wb(before);
  b.save(wb);
  for (std::size_t cut : {std::size_t{0}, std::size_t{7}, bytes.size() / 2, bytes.size() - 1}) {
    ashl::state_reader t(std::span<const std::byte>(bytes.data(), cut));
    BOOST_TEST(!b.load(t).ok());
  }
  auto corrupt = bytes;
  corrupt[corrupt.size() / 2] ^= std::byte{0x10};
  ashl::state_reader cr(corrupt);
  const auto s = b.load(cr);
  BOOST_TEST(!s.ok());
  BOOST_TEST((s.code() == ashl::errc::checksum_mismatch));
  std::vector<std::byte> after;
  ashl::state_writer wa(after);
  b.save(wa);
  BOOST_TEST((before == after));
}

}  // namespace

BOOST_AUTO_TEST_CASE(save_load_round_trip_continues_identically) {
  round_trip(sync::ssp{{.workers = 3, .staleness = 1}}, {});
  round_trip(sync::ssp{{.workers = 3, .staleness = 0}},
             {.mode = ps::optimizer_params::kind::sgd, .lr = 0.1, .momentum = 0.5, .nesterov = true});
  round_trip(rounds(3), {});
  round_trip(sync::any_policy(rounds(3)), {.mode = ps::optimizer_params::kind::sgd, .lr = 0.2});
  // The outer optimizer's state (velocity, Delayed Nesterov's buffer and count) travels too.
  round_trip(sync::ssp{{.workers = 3, .staleness = 1}}, outer_delayed);
  round_trip(rounds(3), outer_nesterov);
  ps::policy_params pp;
  pp.workers = 3;
  pp.profile_iterations = 2;
  pp.profile_trim = 0;
  pp.sync_every_iterations = 3;
  for (const auto& d : ps::policies) {
    BOOST_TEST_CONTEXT(d.name) { round_trip(ps::make_policy(d.name, pp).value(), {}); }
  }
}

// ------------------------------------------------------- every policy by name

namespace {

// The rules of docs/ps.md written out plainly, driving a bare copy of the
// policy: what the core must do with each decision. Parameters are added as
// W += float(weight) * delta, in the order the decisions name them.
struct mirror {
  sync::any_policy p;
  std::vector<float> W;
  std::map<std::pair<sync::worker_id, std::uint64_t>, std::vector<float>> stored;
  std::vector<std::uint64_t> pseq;
  std::vector<std::uint8_t> held, live;
  sync::outcome_sink sink;
  std::vector<sync::worker_id> replies;
  std::uint64_t steps = 0;
  std::vector<std::uint64_t> applied;  // per worker: its commits added into W

  void add(const std::vector<float>& d, double w, sync::worker_id from) {
    for (std::size_t i = 0; i < W.size(); ++i) W[i] += static_cast<float>(w) * d[i];
    ++applied[from];
  }
  void settle(std::size_t& r0, std::size_t& q0, const std::vector<float>* current, std::uint64_t cur_seq,
              sync::worker_id cur_w, bool& pending) {
    const auto round = sink.round();
    if (round.size() > r0) {
      for (std::size_t k = r0; k < round.size(); ++k) {
        if (pending && round[k].worker == cur_w && round[k].sequence == cur_seq) {
          add(*current, round[k].weight, cur_w);
          pending = false;
        } else {
          auto it = stored.find({round[k].worker, round[k].sequence});
          BOOST_REQUIRE(it != stored.end());
          add(it->second, round[k].weight, round[k].worker);
          stored.erase(it);
        }
      }
      ++steps;
    }
    r0 = round.size();
    const auto rel = sink.released();
    for (std::size_t k = q0; k < rel.size(); ++k)
      if (held[rel[k]]) {
        held[rel[k]] = 0;
        replies.push_back(rel[k]);
      }
    q0 = rel.size();
  }
  void event_done(const std::vector<float>* current, std::uint64_t seq, sync::worker_id w, bool pending, bool pull,
                  double now) {
    std::size_t r0 = 0, q0 = 0;
    settle(r0, q0, current, seq, w, pending);
    if (pull && live[w] && !held[w]) {
      if (p.on_pull({w, now}, sink) == sync::pull_action::serve) {
        settle(r0, q0, current, seq, w, pending);
        replies.push_back(w);
      } else {
        held[w] = 1;
        settle(r0, q0, current, seq, w, pending);
      }
    }
    if (pending) stored[{w, seq}] = *current;
    sink.clear();
  }
  void commit(sync::worker_id w, const std::vector<float>& d, double now, bool pull) {
    const std::uint64_t seq = ++pseq[w];
    const auto dec = p.on_commit({w, seq, seq, now, 100, 8}, sink);
    bool pending = false;
    if (dec.action == sync::commit_action::apply) {
      add(d, dec.weight, w);
      ++steps;
    } else if (dec.action == sync::commit_action::buffer) {
      pending = true;
    }
    event_done(&d, seq, w, pending, pull, now);
  }
  void other() { event_done(nullptr, 0, 0, false, false, 0.0); }
};

// joiners: the core admits ranks up to 5 (max_workers) beside the 3 live
// from creation; ranks 4 and 3 join at steps 20 and 30 (docs/elastic.md
// §2.3) and commit with the others, each of their decisions applied as the
// policy says, bit for bit.
void drive_every_policy(std::string_view name, bool evictions, bool joiners = false) {
  const std::uint32_t m = 3;
  const std::uint32_t mx = joiners ? 5 : m;
  const std::size_t n = 6;
  ps::policy_params pp;
  pp.workers = m;
  pp.profile_iterations = 2;
  pp.profile_trim = 0;
  pp.switch_loss = 0.8;
  pp.period = 0.5;
  pp.sync_every_iterations = 3;
  pp.staleness = 1;
  pp.local_steps = 2;
  auto pol = ps::make_policy(name, pp);
  BOOST_REQUIRE_MESSAGE(pol.has_value(), pol.to_status().to_string());
  const auto w0 = vec(n, 0.5f, 0.25f);
  auto core = make(*pol, n, m, {}, w0, std::uint64_t{1} << 20, joiners ? mx : 0);
  BOOST_TEST(core.params().max_workers == mx);
  mirror ref{*pol, w0, {}, std::vector<std::uint64_t>(mx, 0), std::vector<std::uint8_t>(mx, 0),
             std::vector<std::uint8_t>(mx, 0), sync::outcome_sink(mx), {}, 0, std::vector<std::uint64_t>(mx, 0)};
  for (sync::worker_id w = 0; w < m; ++w) ref.live[w] = 1;
  ps::server_actions out(mx);
  std::vector<std::uint64_t> seq(mx, 0);
  std::vector<std::uint64_t> incarnation(mx, 0);
  std::vector<sync::worker_id> ready{0, 1, 2};
  double now = 0.0, loss = 2.0;
  std::uint64_t x = 12345;
  auto compare = [&](const char* what, int step) {
    BOOST_TEST(same_bits(core.parameters(), ref.W), name << " " << what << " at " << step);
    std::vector<sync::worker_id> got(out.pull_replies().begin(), out.pull_replies().end());
    BOOST_TEST(got == ref.replies, name << " " << what << " replies at " << step);
    BOOST_TEST(out.steps() == ref.steps, name << " steps at " << step);
    BOOST_TEST(out.errors().empty(), name << " errors at " << step);
    for (auto r : got) ready.push_back(r);
    ref.replies.clear();
    ref.steps = 0;
    out.clear();
  };
  // w (re)joins as a new incarnation and pulls, as a worker does.
  auto join_rank = [&](sync::worker_id w, int step) {
    core.join(w, ++incarnation[w], now, out);
    seq[w] = 0;
    ref.live[w] = 1;
    ref.p.on_join({w, now}, ref.sink);
    ref.other();
    compare("join", step);
    core.pull(w, now, out);
    std::size_t r0 = 0, q0 = 0;
    bool pending = false;
    if (ref.p.on_pull({w, now}, ref.sink) == sync::pull_action::serve) {
      ref.settle(r0, q0, nullptr, 0, 0, pending);
      ref.replies.push_back(w);
    } else {
      ref.held[w] = 1;
      ref.settle(r0, q0, nullptr, 0, 0, pending);
    }
    ref.sink.clear();
    compare("pull after join", step);
  };
  for (int step = 0; step < 150; ++step) {
    now += 0.01;
    if (evictions && step == 40 && core.is_live(2)) {
      core.evict(2, now, out);
      ref.live[2] = 0;
      ref.held[2] = 0;
      ref.p.on_evict({2, now}, ref.sink);
      ref.other();
      std::erase(ready, 2u);
      compare("evict", step);
    }
    if (evictions && step == 70 && !core.is_live(2)) join_rank(2, step);
    if (joiners && step == 20) join_rank(4, step);
    if (joiners && step == 30) join_rank(3, step);
    if (ready.empty()) {
      core.drain(out);
      ref.p.drain(ref.sink);
      ref.other();
      compare("drain", step);
      if (ready.empty()) break;
      continue;
    }
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const std::size_t pick = static_cast<std::size_t>(x >> 33) % ready.size();
    const sync::worker_id w = ready[pick];
    ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(pick));
    const ashl::measurement mc{w, ashl::measurement_kind::compute, 0.01 * (1 + w), 8, now};
    const ashl::measurement mp{w, ashl::measurement_kind::push, 0.002, 100, now};
    for (const auto& ms : {mc, mp}) {
      core.measurement(ms, out);
      ref.p.on_measurement(ms, ref.sink);
      ref.other();
    }
    const auto d = vec(n, 0.01f * static_cast<float>(w + 1), -0.001f * static_cast<float>(step % 7));
    const auto b = dense(d);
    auto c = commit_of(w, ++seq[w], b, n, /*pull=*/true);
    c.incarnation = incarnation[w];
    c.bytes = 100;
    c.samples = 8;
    core.commit(c, now, out);
    ref.commit(w, d, now, true);
    compare("commit", step);
    if (step % 9 == 8) {
      loss *= 0.8;
      core.metric(ashl::metric_id::loss, loss, now, out);
      ref.p.on_metric({ashl::metric_id::loss, loss, now}, ref.sink);
      ref.other();
      compare("metric", step);
    }
  }
  BOOST_TEST(core.stats().commits > 50u, name);
  BOOST_TEST(core.store().size() == ref.stored.size(), name);
  std::uint32_t live = 0;
  for (sync::worker_id w = 0; w < mx; ++w) live += ref.live[w];
  BOOST_TEST(core.live_count() == live, name);
  if (joiners) {
    BOOST_TEST(core.known_workers() == mx, name);
    BOOST_TEST(core.stats().joins == (evictions ? 3u : 2u), name);
    BOOST_TEST(core.stats().refused_total() == 0u, name);
    for (sync::worker_id w : {3u, 4u}) {
      BOOST_TEST(core.last_sequence(w) > 0u, name << " rank " << w << " committed");
      BOOST_TEST(ref.applied[w] > 0u, name << " rank " << w << "'s commits applied");
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_policy_by_name_applies_exactly_what_it_decides) {
  for (const auto& d : ps::policies) {
    drive_every_policy(d.name, false);
    drive_every_policy(d.name, true);
  }
}

// docs/elastic.md §2 (E1): every policy by name takes ranks 3 and 4 of a
// core created with 3 workers and max_workers 5; their commits are applied
// exactly as the policy decides (the policies' weights and plans for a
// grown set are still their creation's: E3, E4).
BOOST_AUTO_TEST_CASE(every_policy_by_name_admits_ranks_up_to_max_workers) {
  for (const auto& d : ps::policies) {
    drive_every_policy(d.name, false, true);
    drive_every_policy(d.name, true, true);
  }
}

BOOST_AUTO_TEST_CASE(bsp_and_local_sgd_rounds_by_hand) {
  // Dyadic values and M = 4 (weight 1/4): every sum is exact in any order.
  const std::size_t n = 4;
  for (const char* name : {"bsp", "local_sgd"}) {
    ps::policy_params pp;
    pp.workers = 4;
    auto core = make(ps::make_policy(name, pp).value(), n, 4, {}, std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f});
    ps::server_actions out(4);
    for (sync::worker_id w = 0; w < 4; ++w) {
      const float v = static_cast<float>(w + 1);  // worker w commits (w+1) * (1, -1, 2, 0.5)
      core.commit(commit_of(w, 1, dense({v, -v, 2 * v, 0.5f * v}), n, true), 0.0, out);
    }
    BOOST_TEST(out.steps() == 1u);
    BOOST_TEST(out.pull_replies().size() == 4u);
    // Σ (w+1)/4 = 2.5
    BOOST_TEST(same_bits(core.parameters(), std::vector<float>{3.5f, -0.5f, 8.0f, 5.25f}), name);
  }
}

BOOST_AUTO_TEST_CASE(sparse_pair_payloads_of_no_pairs_follow_their_codec) {
  const std::size_t n = 10;
  auto core = make(sync::asp{{.workers = 1}}, n, 1);
  ps::server_actions out(1);
  std::vector<std::byte> none(12);
  ashl::byte_writer bw(none);
  bw.put(std::uint64_t{n});
  bw.put(std::uint32_t{0});
  core.commit(commit_of(0, 1, none, n, false, codec_id::topk_sampled), 0.0, out);  // allowed: nothing above threshold
  core.commit(commit_of(0, 2, none, n, false, codec_id::threshold), 0.0, out);
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(out.steps() == 2u);
  core.commit(commit_of(0, 3, none, n, false, codec_id::topk), 0.0, out);  // top-k sends at least one
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST(out.errors()[0].text == "topk.count = 0: must be >= 1");
  out.clear();
  std::vector<std::byte> wrong_n = none;
  ashl::byte_writer(wrong_n).put(std::uint64_t{n + 1});
  core.commit(commit_of(0, 3, wrong_n, n, false, codec_id::topk_sampled), 0.0, out);
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST(out.errors()[0].text == "topk_sampled.n = 11: must equal info.count = 10");
  for (float v : core.parameters()) BOOST_TEST(v == 0.0f);
}

// ---------------------------------------------------- mutated payloads

namespace {

// Encodes g with `codec`, then mutates the payload at random (flip bytes,
// cut, extend) and commits it: a refused commit leaves the parameters as
// they were; an accepted one changes them exactly as decode_add of that
// payload does. So every check before the policy matches the codec's rules.
template <class Codec>
void mutate(const Codec& codec, bool sgd, std::uint64_t seed) {
  const std::size_t n = 96;
  const auto g = vec(n, -0.4f, 0.011f);
  std::vector<std::byte> base(codec.max_encoded_bytes(n, dtype::f32));
  std::vector<std::byte> scratch(codec.scratch_bytes(n, dtype::f32));
  const ashl::compress::codec_context ctx{.seed = 0, .step = 3, .tensor = 1, .scratch = scratch};
  base.resize(codec.encode(ashl::host_view<const float>(g.data(), n), base, ctx).value());
  auto core = make(sync::asp{{.workers = 1}}, n, 1, sgd ? sgd_plain : ps::optimizer_params{});
  ps::server_actions out(1);
  std::uint64_t x = seed, seq = 0, accepted = 0, refused = 0;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x >> 33;
  };
  for (int trial = 0; trial < 120; ++trial) {
    auto p = base;
    const auto kind = next() % 4;
    if (kind == 0 && !p.empty()) {
      for (int k = 0, m = 1 + static_cast<int>(next() % 3); k < m; ++k) p[next() % p.size()] ^= std::byte{static_cast<unsigned char>(1u << (next() % 8))};
    } else if (kind == 1 && !p.empty()) {
      p.resize(next() % p.size());
    } else if (kind == 2) {
      p.resize(p.size() + 1 + next() % 8, std::byte{0});
    }  // kind 3: unchanged
    const std::vector<float> before(core.parameters().begin(), core.parameters().end());
    auto c = commit_of(0, ++seq, p, n, false, Codec::id);
    c.step = 3;
    c.tensor = 1;
    core.commit(c, 0.0, out);
    if (!out.errors().empty()) {
      ++refused;
      BOOST_REQUIRE(same_bits(core.parameters(), before));
      BOOST_REQUIRE(out.steps() == 0u);
      --seq;  // the sequence was not consumed; reuse it
    } else {
      ++accepted;
      std::vector<float> acc(n, 0.0f);
      const ashl::compress::codec_context dctx{.seed = 0, .step = 3, .tensor = 1};
      BOOST_REQUIRE(ashl::compress::decode_add(Codec::id, p, {n, dtype::f32}, ashl::host_view<float>(acc.data(), n),
                                               1.0f, dctx)
                        .ok());
      std::vector<float> expect = before;
      if (sgd) {
        for (std::size_t i = 0; i < n; ++i) expect[i] -= 0.5f * (1.0f * acc[i] + 0.0f * before[i]);
      } else {
        expect = before;
        BOOST_REQUIRE(ashl::compress::decode_add(Codec::id, p, {n, dtype::f32},
                                                 ashl::host_view<float>(expect.data(), n), 1.0f, dctx)
                          .ok());
      }
      // NaN from a flipped exponent compares by bits on both sides.
      BOOST_REQUIRE(same_bits(core.parameters(), expect));
    }
    out.clear();
  }
  BOOST_TEST(accepted > 0u, ashl::to_string(Codec::id));
  BOOST_TEST(refused > 0u, ashl::to_string(Codec::id));
}

}  // namespace

BOOST_AUTO_TEST_CASE(mutated_payloads_are_refused_or_applied_exactly) {
  namespace cz = ashl::compress;
  for (bool sgd : {false, true}) {
    mutate(cz::identity{}, sgd, 1);
    mutate(cz::fp16{}, sgd, 2);
    mutate(cz::bf16{}, sgd, 3);
    mutate(cz::topk{0.1}, sgd, 4);
    mutate(cz::topk_sampled{}, sgd, 5);
    mutate(cz::threshold{}, sgd, 6);
    mutate(cz::randomk{}, sgd, 7);
    mutate(cz::qsgd{}, sgd, 8);
    mutate(cz::terngrad{}, sgd, 9);
    mutate(cz::sign{}, sgd, 10);
    mutate(cz::natural{}, sgd, 11);
  }
}

BOOST_AUTO_TEST_CASE(sgd_round_of_a_checked_by_decode_codec_and_a_dense_one) {
  // qsgd is checked by decoding it into the accumulator; buffered, that
  // decode is cleared, and the round decodes it again with its weight.
  const std::size_t n = 40;
  const auto g0 = vec(n, 0.3f, -0.02f), g1 = vec(n, -0.1f, 0.005f);
  ashl::compress::qsgd qs;
  std::vector<std::byte> q(qs.max_encoded_bytes(n, dtype::f32));
  q.resize(qs.encode(ashl::host_view<const float>(g0.data(), n), q, {}).value());
  const auto d1 = dense(g1);
  const auto w0 = vec(n, 1.0f, 0.0f);
  auto core = make(rounds(2), n, 2, sgd_plain, w0);
  ps::server_actions out(2);
  core.commit(commit_of(0, 1, q, n, false, codec_id::qsgd), 0.0, out);
  BOOST_TEST(out.steps() == 0u);
  BOOST_TEST(same_bits(core.parameters(), w0));
  core.commit(commit_of(1, 1, d1, n), 0.0, out);
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(out.steps() == 1u);
  std::vector<float> acc(n, 0.0f);
  BOOST_REQUIRE(ashl::compress::decode_add(codec_id::qsgd, q, {n, dtype::f32}, ashl::host_view<float>(acc.data(), n),
                                           0.5f, {})
                    .ok());
  for (std::size_t i = 0; i < n; ++i) acc[i] += 0.5f * g1[i];
  std::vector<float> expect = w0;
  for (std::size_t i = 0; i < n; ++i) expect[i] -= 0.5f * (1.0f * acc[i] + 0.0f * w0[i]);
  BOOST_TEST(same_bits(core.parameters(), expect));
}

// ------------------------------------------- versions pinned by replies
//
// Issue 28: replies read the parameters where they lie. A pinned version is
// never written: a dense model-delta commit adds beside it (new = old + s·v,
// one pass, its CRC from the same pass when a pull rides along), any other
// change copies it first; the pinned bytes stay those of their version until
// unpinned, and the result is the same bits as the in-place apply.

namespace {

std::uint32_t crc_of(std::span<const float> v) { return ashl::wire::crc32c(std::as_bytes(v)); }

// n elements: several 192 KiB chunks and a tail that is no SIMD multiple.
constexpr std::size_t pinned_n = 3 * 49152 + 1001;

}  // namespace

BOOST_AUTO_TEST_CASE(a_pinned_version_is_never_written_and_applies_go_beside_it) {
  const std::size_t n = pinned_n;
  const auto w0 = vec(n, 0.5f, 1e-6f);
  auto core = make(sync::asp{{.workers = 2, .scale = 0.5}}, n, 2, {}, w0);
  ps::server_actions out(2);
  std::vector<float> expect = w0;
  const auto d1 = vec(n, 0.125f, -3e-7f), d2 = vec(n, -0.25f, 2e-7f), d3 = vec(n, 0.0625f, 1e-7f);
  const auto b1 = dense(d1), b2 = dense(d2), b3 = dense(d3);

  // Version 1, in place (nothing pinned), its CRC from the apply.
  core.commit(commit_of(0, 1, b1, n, true), 1.0, out);
  for (std::size_t i = 0; i < n; ++i) expect[i] += 0.5f * d1[i];
  BOOST_REQUIRE(same_bits(core.parameters(), expect));
  const auto p1 = core.pin_parameters();
  BOOST_TEST(p1.version == 1u);
  BOOST_TEST(p1.first);
  BOOST_TEST(p1.crc == crc_of(expect));
  BOOST_TEST(p1.values.data() == core.parameters().data());  // no copy
  const auto again = core.pin_parameters();                  // a second reply of the same version
  BOOST_TEST(!again.first);
  BOOST_TEST(again.crc == p1.crc);
  BOOST_TEST(core.pinned_versions() == 1u);
  const std::vector<float> v1 = expect;

  // Version 2 while version 1 is pinned: beside it, same bits as in place.
  core.commit(commit_of(1, 1, b2, n, true), 2.0, out);
  for (std::size_t i = 0; i < n; ++i) expect[i] += 0.5f * d2[i];
  BOOST_TEST(same_bits(core.parameters(), expect));
  BOOST_TEST(same_bits(p1.values, v1));  // the replies' bytes did not change
  BOOST_TEST(core.parameters().data() != p1.values.data());
  BOOST_TEST(core.applied_beside() == 1u);
  BOOST_TEST(core.copies_for_readers() == 0u);
  const auto p2 = core.pin_parameters();
  BOOST_TEST(p2.version == 2u);
  BOOST_TEST(p2.first);
  BOOST_TEST(p2.crc == crc_of(expect));
  BOOST_TEST(core.pinned_versions() == 2u);

  // Version 3 without a pull: in a spare buffer again, its CRC at the pin.
  core.commit(commit_of(0, 2, b3, n, false), 3.0, out);
  for (std::size_t i = 0; i < n; ++i) expect[i] += 0.5f * d3[i];
  BOOST_TEST(same_bits(core.parameters(), expect));
  BOOST_TEST(same_bits(p1.values, v1));
  BOOST_TEST(core.applied_beside() == 2u);
  BOOST_TEST(core.version_buffers() == 2u);  // versions 1 and 2 held for their replies
  const std::vector<float> v2(p2.values.begin(), p2.values.end());

  // The replies complete; the storage is the pool's again.
  core.unpin_parameters(1);
  core.unpin_parameters(1);
  BOOST_TEST(core.pinned_versions() == 1u);
  BOOST_TEST(same_bits(p2.values, v2));
  core.unpin_parameters(2);
  BOOST_TEST(core.pinned_versions() == 0u);
  const auto p3 = core.pin_parameters();
  BOOST_TEST(p3.version == 3u);
  BOOST_TEST(p3.crc == crc_of(expect));
  core.unpin_parameters(3);
  // Nothing pinned: the next commit adds in place.
  const float* at = core.parameters().data();
  core.commit(commit_of(1, 2, b1, n, true), 4.0, out);
  BOOST_TEST(core.parameters().data() == at);
  BOOST_TEST(core.applied_beside() == 2u);
  BOOST_TEST(out.errors().empty());
}

// A sparse commit, and an sgd step, while a version is pinned: the version
// is copied first (the change is not element-wise over the payload), the
// pinned bytes stay.
BOOST_AUTO_TEST_CASE(other_changes_copy_a_pinned_version_first) {
  const std::size_t n = 4096;
  const auto w0 = vec(n, 1.0f, 1e-4f);
  {
    auto core = make(sync::asp{{.workers = 1}}, n, 1, {}, w0);
    ps::server_actions out(1);
    const auto p0 = core.pin_parameters();
    BOOST_TEST(p0.crc == crc_of(w0));
    auto g = vec(n, 0.0f, 0.001f);
    ashl::compress::topk tk(ashl::compress::topk::count{16});
    std::vector<std::byte> sparse(tk.max_encoded_bytes(n, dtype::f32));
    sparse.resize(tk.encode(ashl::host_view<const float>(g.data(), n), sparse, {}).value());
    core.commit(commit_of(0, 1, sparse, n, true, codec_id::topk), 1.0, out);
    BOOST_TEST(out.errors().empty());
    BOOST_TEST(same_bits(p0.values, w0));
    BOOST_TEST(!same_bits(core.parameters(), w0));
    BOOST_TEST(core.copies_for_readers() == 1u);
    BOOST_TEST(core.pin_parameters().crc == crc_of(core.parameters()));
  }
  {
    auto core = make(sync::asp{{.workers = 1}}, n, 1, sgd_plain, w0);
    ps::server_actions out(1);
    const auto p0 = core.pin_parameters();
    const auto bytes = dense(vec(n, 0.5f, 0.0f));
    core.commit(commit_of(0, 1, bytes, n, true), 1.0, out);
    BOOST_TEST(out.errors().empty());
    BOOST_TEST(same_bits(p0.values, w0));
    BOOST_TEST(core.parameters()[0] == 1.0f - 0.5f * 0.5f);
    BOOST_TEST(core.copies_for_readers() == 1u);
  }
}

// Pins, applies beside and unpins in steady state allocate nothing: the
// spare buffers are pooled.
BOOST_AUTO_TEST_CASE(pinned_versions_allocate_nothing_in_steady_state) {
  const std::size_t n = 8192;
  auto core = make(sync::asp{{.workers = 2}}, n, 2, {}, vec(n, 0.0f, 1.0f));
  ps::server_actions out(2);
  const auto bytes = dense(vec(n, 0.5f, 0.0f));
  std::uint64_t seq[2] = {0, 0};
  auto round = [&](int k) {
    // Two replies in flight over three versions, as two workers overlap.
    const sync::worker_id w = static_cast<sync::worker_id>(k % 2);
    core.commit(commit_of(w, ++seq[w], bytes, n, true), static_cast<double>(k), out);
    out.clear();
    const auto p = core.pin_parameters();
    if (p.version >= 2) core.unpin_parameters(p.version - 1);
  };
  for (int k = 0; k < 8; ++k) round(k);
  const auto before = counting_new::count();
  for (int k = 8; k < 40; ++k) round(k);
  const auto after = counting_new::count();
  BOOST_TEST(after == before);
  BOOST_TEST(core.pinned_versions() == 1u);
  BOOST_TEST(core.applied_beside() >= 32u);
  BOOST_TEST(core.parameters()[5] == 5.0f + 0.5f * 40);
}

// Issue 28: the value check a driver runs in its CRC pass
// (dense_value_check, chunk by chunk) says all_finite() only for a dense
// payload of the header's size whose every value it saw finite; a commit it
// cleared skips validate()'s pass, one it did not is checked (and named) by
// validate() as before.
BOOST_AUTO_TEST_CASE(the_drivers_value_check_clears_only_whole_finite_dense_payloads) {
  const std::size_t n = 3000;
  auto v = vec(n, 0.5f, 0.25f);
  const auto good = dense(v);
  auto feed = [](ps::dense_value_check& c, std::span<const std::byte> p, std::size_t chunk) {
    for (std::size_t at = 0; at < p.size(); at += chunk) c(p.subspan(at, std::min(chunk, p.size() - at)));
  };
  {
    ps::dense_value_check c(codec_id::identity, dtype::f32, n, good.size());
    feed(c, good, 4096);
    BOOST_TEST(c.all_finite());
  }
  {
    ps::dense_value_check c(codec_id::identity, dtype::f32, n, good.size());
    feed(c, std::span<const std::byte>(good).first(good.size() - 4096), 4096);  // not all seen
    BOOST_TEST(!c.all_finite());
  }
  {
    ps::dense_value_check c(codec_id::identity, dtype::f32, n, good.size());
    feed(c, good, 4098);  // a chunk cut inside a value
    BOOST_TEST(!c.all_finite());
  }
  BOOST_TEST(!ps::dense_value_check(codec_id::identity, dtype::f32, n + 1, good.size()).all_finite());
  BOOST_TEST(!ps::dense_value_check(codec_id::topk, dtype::f32, n, good.size()).all_finite());
  BOOST_TEST(!ps::dense_value_check(static_cast<codec_id>(200), dtype::f32, n, good.size()).all_finite());
  BOOST_TEST(!ps::dense_value_check(codec_id::identity, static_cast<dtype>(99), n, good.size()).all_finite());
  {
    // fp16 payload: 2 bytes a value, checked as f16.
    std::vector<std::byte> half(2 * n, std::byte{0});
    ps::dense_value_check c(codec_id::fp16, dtype::f32, n, half.size());
    feed(c, half, 1000);
    BOOST_TEST(c.all_finite());
    half[2 * 1234 + 1] = std::byte{0x7c};  // f16 +inf
    ps::dense_value_check d(codec_id::fp16, dtype::f32, n, half.size());
    feed(d, half, 1000);
    BOOST_TEST(!d.all_finite());
  }
  // A NaN: the check does not clear it, and the core refuses it by name.
  v[2222] = std::numeric_limits<float>::quiet_NaN();
  const auto bad = dense(v);
  ps::dense_value_check c(codec_id::identity, dtype::f32, n, bad.size());
  feed(c, bad, 4096);
  BOOST_TEST(!c.all_finite());
  auto core = make(sync::asp{{.workers = 1}}, n, 1);
  ps::server_actions out(1);
  auto in = commit_of(0, 1, bad, n, true);
  in.values_checked = c.all_finite();
  core.commit(in, 1.0, out);
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST(out.errors()[0].text.find("commit.payload[2222] = nan") != std::string::npos, out.errors()[0].text);
  BOOST_TEST(core.stats().refused_for(ps::refusal::non_finite) == 1u);
  BOOST_TEST(core.parameters()[0] == 0.0f);
  out.clear();
  // A cleared one applies without validate()'s pass.
  auto ok = commit_of(0, 2, good, n, true);
  ps::dense_value_check g(codec_id::identity, dtype::f32, n, good.size());
  feed(g, good, 8192);
  ok.values_checked = g.all_finite();
  BOOST_TEST(ok.values_checked);
  core.commit(ok, 2.0, out);
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(core.parameters()[0] == 0.5f);
}

// ------------------------------------------------------- the outer optimizer

namespace {
ps::policy_params diloco_params(std::int64_t m) {
  ps::policy_params p;
  p.workers = m;
  p.local_steps = 4;
  return p;
}
}  // namespace

// DiLoCo at outer lr 1, momentum 0 is Local SGD with plain averaging: the
// same commits give the same parameter bits (docs/algorithms.md "The outer
// optimizer").
BOOST_AUTO_TEST_CASE(diloco_at_lr_one_without_momentum_is_local_sgd_bit_for_bit) {
  constexpr std::uint32_t m = 3;
  constexpr std::size_t n = 37;
  auto pp = diloco_params(m);
  pp.outer_lr = 1.0;
  pp.outer_momentum = 0.0;
  auto opt = ps::outer_optimizer_of("diloco", pp);
  BOOST_REQUIRE(opt.has_value());
  BOOST_TEST((opt->mode == ps::optimizer_params::kind::outer));
  auto a = make(ps::make_policy("diloco", pp).value(), n, m, *opt, vec(n, 0.5f, -0.01f));
  auto b = make(ps::make_policy("local_sgd", pp).value(), n, m, {}, vec(n, 0.5f, -0.01f));
  auto c = make(ps::make_policy("diloco", diloco_params(m)).value(), n, m,
                *ps::outer_optimizer_of("diloco", diloco_params(m)), vec(n, 0.5f, -0.01f));
  ps::server_actions out(m);
  for (std::uint64_t seq = 1; seq <= 6; ++seq)
    for (sync::worker_id w = 0; w < m; ++w) {
      const auto d = dense(vec(n, 0.013f * static_cast<float>(w + 1) - 0.02f * static_cast<float>(seq), 0.0007f));
      for (auto* core : {&a, &b, &c}) {
        core->commit(commit_of(w, seq, d, n, true), static_cast<double>(seq), out);
        out.clear();
      }
    }
  BOOST_TEST(a.stats().steps == 6u);
  BOOST_TEST(same_bits(a.parameters(), b.parameters()));
  BOOST_TEST(!same_bits(c.parameters(), b.parameters()));  // DiLoCo's defaults are not plain averaging
}

// One synchronous round = one outer Nesterov step on the weighted mean of
// the deltas, recomputed by hand: acc = ((0 + w·Δ_0) + w·Δ_1) + w·Δ_2 in
// worker order (w = f32(1/3)), g = (−1)·acc + 0·W, v = μv + g,
// W = W − lr·(g + μv).
BOOST_AUTO_TEST_CASE(diloco_round_is_one_outer_step_on_the_mean_delta) {
  constexpr std::uint32_t m = 3;
  constexpr std::size_t n = 9;
  auto pp = diloco_params(m);
  auto core = make(ps::make_policy("diloco", pp).value(), n, m, *ps::outer_optimizer_of("diloco", pp),
                   vec(n, 0.25f, 0.125f));
  std::vector<float> W = vec(n, 0.25f, 0.125f), v(n, 0.0f);
  const float wt = static_cast<float>(1.0 / 3.0);
  ps::server_actions out(m);
  for (std::uint64_t round = 1; round <= 4; ++round) {
    std::vector<float> acc(n, 0.0f);
    for (sync::worker_id w = 0; w < m; ++w) {
      const auto delta = vec(n, 0.05f * static_cast<float>(w) - 0.03f * static_cast<float>(round), 0.011f);
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] + wt * delta[i];
      core.commit(commit_of(w, round, dense(delta), n, true), static_cast<double>(round), out);
      out.clear();
    }
    for (std::size_t i = 0; i < n; ++i) {
      const float g = -1.0f * acc[i] + 0.0f * W[i];
      v[i] = 0.9f * v[i] + g;
      W[i] = W[i] - 0.7f * (g + 0.9f * v[i]);
    }
    BOOST_TEST(same_bits(W, core.parameters()), "round " << round);
  }
  BOOST_TEST(core.stats().steps == 4u);
  BOOST_TEST(same_bits(v, core.optimizer_state().velocity()));
}

// Asynchronous: one outer step per commit, Delayed Nesterov counting the
// steps once however many apply threads split each one: the same bits.
BOOST_AUTO_TEST_CASE(delayed_nesterov_per_commit_same_bits_with_apply_threads) {
  constexpr std::uint32_t m = 3;
  const std::size_t n = std::size_t{3} << 14;
  auto pp = diloco_params(m);
  const auto opt = *ps::outer_optimizer_of("async_diloco", pp);
  BOOST_TEST(opt.nesterov_delay == m);
  auto a = make(ps::make_policy("async_diloco", pp).value(), n, m, opt, vec(n, 0.1f, 1e-5f));
  auto b = make(ps::make_policy("async_diloco", pp).value(), n, m, opt, vec(n, 0.1f, 1e-5f));
  auto pool = ps::apply_pool::create(4);
  BOOST_REQUIRE(pool.has_value());
  b.use_apply_pool(pool->get());
  ps::server_actions out(m);
  for (std::uint64_t seq = 1; seq <= 5; ++seq)
    for (sync::worker_id w = 0; w < m; ++w) {
      const auto d = dense(vec(n, 0.01f * static_cast<float>(w + seq), -2e-7f));
      a.commit(commit_of(w, seq, d, n, w == 1), static_cast<double>(seq), out);
      out.clear();
      b.commit(commit_of(w, seq, d, n, w == 1), static_cast<double>(seq), out);
      out.clear();
    }
  BOOST_TEST(a.stats().steps == 15u);
  BOOST_TEST(a.optimizer_state().outer_steps() == 15u);
  BOOST_TEST(b.optimizer_state().outer_steps() == 15u);
  BOOST_TEST(same_bits(a.parameters(), b.parameters()));
  BOOST_TEST(same_bits(a.optimizer_state().velocity(), b.optimizer_state().velocity()));
  BOOST_TEST(same_bits(a.optimizer_state().delayed(), b.optimizer_state().delayed()));
}

// SparseLoCo's recipe as a composition of existing parts (docs/algorithms.md
// §6): each worker sends the top-k of its pseudo-gradient with error
// feedback (ps::commit_encoder, e ← e + Δ, send C(e), e ← e − C(e)), and a
// DiLoCo round applies one outer Nesterov step to the mean of what arrived.
// Checked against a hand computation from the payloads themselves (decoded
// independently into a zero vector), and the error feedback's promise: over
// the rounds, what was sent plus what is still owed is what was computed.
BOOST_AUTO_TEST_CASE(topk_pseudo_gradients_with_error_feedback_and_the_outer_optimizer) {
  constexpr std::uint32_t m = 2;
  constexpr std::size_t n = 200;
  auto pp = diloco_params(m);
  auto core = make(ps::make_policy("diloco", pp).value(), n, m, *ps::outer_optimizer_of("diloco", pp),
                   vec(n, 0.25f, 0.001f));
  std::vector<float> W = vec(n, 0.25f, 0.001f), v(n, 0.0f);
  std::vector<ps::commit_encoder> enc;
  for (std::uint32_t w = 0; w < m; ++w) {
    enc.emplace_back(ps::commit_encoder::options{.error_feedback = true, .seed = 7});
    BOOST_REQUIRE(enc.back().set(codec_id::topk, 0.05f).ok());  // k = 10 of 200
  }
  std::vector<std::vector<double>> computed(m, std::vector<double>(n, 0.0)), sent(m, std::vector<double>(n, 0.0));
  const float wt = 0.5f;
  ps::server_actions out(m);
  for (std::uint64_t round = 1; round <= 6; ++round) {
    std::vector<float> acc(n, 0.0f);
    for (sync::worker_id w = 0; w < m; ++w) {
      std::vector<float> delta(n);
      for (std::size_t i = 0; i < n; ++i)
        delta[i] = std::sin(0.37f * static_cast<float>(i + 1) * static_cast<float>(round + w)) * 0.01f;
      auto payload = enc[w].encode(0, delta, round);
      BOOST_REQUIRE(payload.has_value());
      std::vector<float> decoded(n, 0.0f);
      BOOST_REQUIRE(ashl::compress::decode_add(codec_id::topk, *payload, {n, dtype::f32},
                                               ashl::host_view<float>(decoded.data(), n), 1.0f, {7, round, 0, {}})
                        .ok());
      std::size_t nonzero = 0;
      for (std::size_t i = 0; i < n; ++i) {
        computed[w][i] += delta[i];
        sent[w][i] += decoded[i];
        nonzero += decoded[i] != 0.0f;
        acc[i] = acc[i] + wt * decoded[i];
      }
      BOOST_TEST(nonzero <= 10u);  // a top-k payload, not the dense delta
      core.commit(commit_of(w, round, *payload, n, true, codec_id::topk), static_cast<double>(round), out);
      BOOST_TEST(out.errors().empty());
      out.clear();
    }
    for (std::size_t i = 0; i < n; ++i) {  // the outer step, as rules/optimizer.hpp documents it
      const float g = -1.0f * acc[i] + 0.0f * W[i];
      v[i] = 0.9f * v[i] + g;
      W[i] = W[i] - 0.7f * (g + 0.9f * v[i]);
    }
    BOOST_TEST(same_bits(W, core.parameters()), "round " << round);
  }
  for (std::uint32_t w = 0; w < m; ++w) {
    const auto e = enc[w].residual(0);
    BOOST_REQUIRE(e.size() == n);
    double worst = 0.0, owed = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::abs(sent[w][i] + e[i] - computed[w][i]));
      owed = std::max(owed, std::abs(static_cast<double>(e[i])));
    }
    BOOST_TEST(worst < 1e-6, "worker " << w << ": sent + owed differs from computed by " << worst);
    BOOST_TEST(owed > 0.0);  // top-k dropped something this round: the residual holds it
  }
}

// ------------------------------------------------------------- the data ledger
//
// docs/elastic.md §3: server_core runs the ledger (rules/data_ledger.hpp) on
// its own events: a join the core accepts grants, an accepted commit's
// samples move the worker's cursor, a leave gives back, an eviction
// suspends until tick() passes give_back_after; the leases go out in
// server_actions::leases(), and the ledger is part of save() (PSCR 4).

namespace {

constexpr ps::ledger_params small_ledger{
    .samples = 100, .shuffle_seed = 7, .lease_samples = 10, .ahead = 1, .give_back_after = 5.0};

ps::server_core<sync::asp> ledger_core(std::uint32_t m, std::uint32_t max_workers = 0,
                                       ps::ledger_params lp = small_ledger, std::uint64_t n = 4) {
  auto c = ps::server_core<sync::asp>::create(
      {.layout = layout(n), .workers = m, .max_workers = max_workers, .ledger = lp},
      sync::asp{{.workers = m, .scale = 0.5}});
  BOOST_REQUIRE_MESSAGE(c.has_value(), c.to_status().to_string());
  return std::move(*c);
}

std::vector<std::byte> ledger_bytes(const ps::data_ledger& l) {
  std::vector<std::byte> b;
  ashl::state_writer w(b);
  l.save(w);
  return b;
}

ps::commit_in commit_with_samples(sync::worker_id w, std::uint64_t inc, std::uint64_t seq,
                                  std::span<const std::byte> payload, std::uint64_t samples) {
  auto c = commit_of(w, seq, payload, payload.size() / 4);
  c.incarnation = inc;
  c.samples = samples;
  return c;
}

struct lease_view {
  sync::worker_id worker;
  std::uint64_t epoch, begin, end;
  std::uint32_t flags;
  friend bool operator==(const lease_view&, const lease_view&) = default;
};
std::vector<lease_view> leases_of(const ps::server_actions& out) {
  std::vector<lease_view> v;
  for (const auto& l : out.leases()) v.push_back({l.worker, l.epoch, l.begin, l.end, l.flags});
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_ledger_is_checked_by_name_and_runs_on_shard_0_only) {
  auto off = ledger_core(2, 0, {});
  BOOST_TEST(!off.ledger().enabled());
  auto bad = ps::server_core<sync::asp>::create(
      {.layout = layout(4), .workers = 1, .ledger = {.samples = 10, .ahead = 65}}, sync::asp{{.workers = 1}});
  BOOST_REQUIRE(!bad.has_value());
  BOOST_TEST(bad.error().message() == "server_core.ledger.ahead = 65: must be at most 64 (ps::max_ledger_ahead)");
  auto big_lease = ps::server_core<sync::asp>::create(
      {.layout = layout(4), .workers = 1, .ledger = {.samples = 10, .lease_samples = 11}}, sync::asp{{.workers = 1}});
  BOOST_REQUIRE(!big_lease.has_value());
  BOOST_TEST(big_lease.error().message().starts_with("server_core.ledger.lease_samples = 11: must be at most"));
  auto shard1 = ps::server_core<sync::asp>::create(
      {.layout = *ps::shard_layout::even(8, 2), .shard = 1, .workers = 1, .ledger = {.samples = 10}},
      sync::asp{{.workers = 1}});
  BOOST_REQUIRE(!shard1.has_value());
  BOOST_TEST(shard1.error().message() ==
             "server_core.ledger.samples = 10: the data ledger runs on shard 0 only (the plan authority, "
             "docs/elastic.md §3.3); this core is shard 1");
}

// A join grants; an accepted commit of k samples moves the cursor k
// positions (and tops the worker up); a refused commit and a duplicate
// change nothing of the ledger and send no lease.
BOOST_AUTO_TEST_CASE(commits_of_k_samples_move_the_ledger_refused_and_duplicate_ones_do_not) {
  auto core = ledger_core(2);
  ps::server_actions out(2);
  const auto d = dense({1.0f, 2.0f, 3.0f, 4.0f});
  core.join(0, 11, 0.0, out);
  BOOST_TEST((leases_of(out) == std::vector<lease_view>{{0, 0, 0, 10, 0}}));
  out.clear();
  core.join(1, 21, 0.0, out);
  BOOST_TEST((leases_of(out) == std::vector<lease_view>{{1, 0, 10, 20, 0}}));
  out.clear();

  core.commit(commit_with_samples(0, 11, 1, d, 4), 1.0, out);
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(core.ledger().used(0) == 4u);
  BOOST_TEST(core.ledger().unused(0) == 6u + 10u);  // below one lease ahead: topped up
  BOOST_TEST((leases_of(out) == std::vector<lease_view>{{0, 0, 20, 30, 0}}));
  BOOST_TEST(core.ledger().leases(0)[0].begin == 4u);
  out.clear();
  core.commit(commit_with_samples(0, 11, 2, d, 9), 2.0, out);  // across its two leases
  BOOST_TEST(core.ledger().used(0) == 13u);
  BOOST_TEST(core.ledger().leases(0).size() == 2u);
  BOOST_TEST(core.ledger().leases(0)[0].begin == 23u);
  BOOST_TEST(core.ledger().unused(0) == 7u + 10u);  // 7 left: below a lease ahead again
  BOOST_TEST((leases_of(out) == std::vector<lease_view>{{0, 0, 30, 40, 0}}));
  BOOST_TEST(core.ledger().stats().leases_granted == 4u);
  out.clear();

  // Refused commits: each named, none moves the ledger or sends a lease.
  const auto before = ledger_bytes(core.ledger());
  const auto stats = core.stats();
  auto expect_unmoved = [&](ps::commit_in c, ps::refusal why) {
    core.commit(c, 3.0, out);
    BOOST_REQUIRE(out.errors().size() == 1u);
    BOOST_TEST((out.errors()[0].reason == why), ps::to_string(why));
    BOOST_TEST(out.leases().empty());
    BOOST_TEST((ledger_bytes(core.ledger()) == before));
    out.clear();
  };
  expect_unmoved(commit_with_samples(0, 10, 3, d, 5), ps::refusal::incarnation);
  expect_unmoved(commit_with_samples(0, 11, 0, d, 5), ps::refusal::sequence);
  expect_unmoved(commit_with_samples(0, 11, 3, dense({1.0f, 2.0f}), 5), ps::refusal::element_count);
  expect_unmoved(commit_with_samples(0, 11, 3, dense({1.0f, NAN, 3.0f, 4.0f}), 5), ps::refusal::non_finite);
  expect_unmoved(commit_with_samples(0, 11, 3, d, (std::uint64_t{1} << 30) + 1), ps::refusal::samples);
  expect_unmoved(commit_with_samples(3, 0, 1, d, 5), ps::refusal::unknown_worker);
  // A duplicate (sequence 2 again): dropped before the policy, and the ledger.
  core.commit(commit_with_samples(0, 11, 2, d, 9), 3.0, out);
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(out.leases().empty());
  BOOST_TEST(core.stats().duplicates == stats.duplicates + 1);
  BOOST_TEST((ledger_bytes(core.ledger()) == before));
  BOOST_TEST(core.ledger().check().ok());
}

// A leave gives the unused positions back at once (the next lease takes the
// lowest of them); an eviction suspends them until give_back_after, passed
// by tick() or any event's time; a rejoin of the same incarnation before
// that gets them sent again, marked resent.
BOOST_AUTO_TEST_CASE(a_leave_gives_back_and_an_eviction_waits_for_give_back_after) {
  auto core = ledger_core(3);
  ps::server_actions out(3);
  const auto d = dense({1.0f, 2.0f, 3.0f, 4.0f});
  for (sync::worker_id w = 0; w < 3; ++w) core.join(w, 1, 0.0, out);  // [0,10) [10,20) [20,30)
  out.clear();
  core.commit(commit_with_samples(0, 1, 1, d, 3), 1.0, out);  // w0: [3,10) and [30,40)
  out.clear();
  core.leave(0, 2.0, out);  // 17 positions back: [3,10) below next, [30,40) moves next down to 30
  BOOST_TEST(out.leases().empty());  // nobody is short
  BOOST_TEST(core.ledger().unused(0) == 0u);
  BOOST_TEST(core.ledger().stats().positions_returned == 17u);
  BOOST_TEST(core.ledger().next(0) == 30u);
  BOOST_TEST(core.ledger().check().ok());
  out.clear();
  core.commit(commit_with_samples(1, 1, 1, d, 10), 3.0, out);  // w1 used its lease: the lowest returned range
  BOOST_TEST((leases_of(out) == std::vector<lease_view>{{1, 0, 3, 10, 0}, {1, 0, 30, 40, 0}}));
  out.clear();

  // w2 evicted: suspended; a tick before give_back_after does nothing.
  core.evict(2, 4.0, out);
  BOOST_TEST((core.ledger().state(2) == ps::ledger_worker_state::suspended));
  core.tick(8.9, out);
  BOOST_TEST(out.leases().empty());
  BOOST_TEST(core.ledger().unused(2) == 10u);
  // It rejoins as the same incarnation: its lease is sent again.
  core.join(2, 1, 8.95, out);
  BOOST_TEST((leases_of(out) == std::vector<lease_view>{{2, 0, 20, 30, ps::lease_resent}}));
  BOOST_TEST(core.ledger().stats().leases_resent == 1u);
  out.clear();
  // Evicted again, and this time give_back_after passes: the tick gives its
  // positions back to the pool (no one is short of leases, so none is sent).
  core.evict(2, 10.0, out);
  core.tick(15.0, out);
  BOOST_TEST((core.ledger().state(2) == ps::ledger_worker_state::gone));
  BOOST_TEST(core.ledger().stats().expiries == 1u);
  BOOST_TEST(core.ledger().unused(2) == 0u);
  BOOST_TEST(out.leases().empty());
  BOOST_TEST(core.ledger().check().ok());
  BOOST_TEST(core.ledger().next(0) == 40u);  // [20, 30) is a returned range now
  // A tick with nothing due changes nothing.
  out.clear();
  const auto before = saved(core);
  core.tick(16.0, out);
  BOOST_TEST((saved(core) == before));
  BOOST_TEST(out.empty());
}

// The ledger travels with the state (PSCR version 4, section LDGR after the
// policy's): a core created without a ledger loads one mid-epoch and goes on
// exactly as the saved core does (the same leases out, the same bytes). A
// core without a ledger still saves version 3, and a version 3 state loads
// into a core configured with a ledger as ledger-off.
BOOST_AUTO_TEST_CASE(a_ledger_saved_mid_epoch_loads_and_continues_identically) {
  const auto d = dense({1.0f, 2.0f, 3.0f, 4.0f});
  auto a = ledger_core(2, 4, {.samples = 97, .shuffle_seed = 3, .lease_samples = 8, .ahead = 2, .give_back_after = 1.0});
  ps::server_actions out(4);
  a.join(0, 5, 0.0, out);
  a.join(1, 6, 0.0, out);
  a.join(3, 7, 0.0, out);
  std::uint64_t seq[4] = {1, 1, 1, 1};
  const std::uint64_t inc[4] = {5, 6, 0, 7};
  for (int i = 0; i < 12; ++i) {
    const sync::worker_id w = i % 3 == 2 ? 3 : static_cast<sync::worker_id>(i % 3);
    a.commit(commit_with_samples(w, inc[w], seq[w]++, d, 2 + static_cast<std::uint64_t>(i % 4)), 0.5 * i, out);
  }
  a.evict(1, 6.0, out);  // suspended at the save
  out.clear();
  const auto bytes = saved(a);
  BOOST_TEST(static_cast<unsigned>(bytes[4]) == 4u);  // PSCR version 4
  BOOST_TEST(a.ledger().used(0) > 0u);
  BOOST_TEST(a.ledger().used(0) < 97u);

  auto b = ledger_core(2, 0, {});  // no ledger of its own: the state's comes
  ashl::state_reader r(bytes);
  const auto st = b.load(r);
  BOOST_REQUIRE_MESSAGE(st.ok(), st.to_string());
  BOOST_TEST(b.ledger().enabled());
  BOOST_TEST((b.params().ledger == a.params().ledger));
  BOOST_TEST((saved(b) == bytes));
  ps::server_actions out_b(4);
  std::uint64_t seq_b[4] = {seq[0], seq[1], seq[2], seq[3]};
  auto go_on = [&](auto& core, ps::server_actions& o, std::uint64_t* s) {
    std::vector<lease_view> trail;
    auto take = [&] {
      for (const auto& l : leases_of(o)) trail.push_back(l);
      o.clear();
    };
    core.tick(7.5, o);  // w1's leases go back, to whoever is short
    take();
    for (int i = 0; i < 60; ++i) {  // past the epoch's end: the next opens
      const sync::worker_id w = i % 2 == 0 ? 0 : 3;
      core.commit(commit_with_samples(w, inc[w], s[w]++, d, 4 + static_cast<std::uint64_t>(i % 5)), 8.0 + i, o);
      take();
    }
    core.join(1, 6, 70.0, o);  // back as the same incarnation: gone, so new leases
    take();
    core.leave(0, 71.0, o);
    take();
    return trail;
  };
  const auto ta = go_on(a, out, seq);
  const auto tb = go_on(b, out_b, seq_b);
  BOOST_TEST(ta.size() > 10u);
  BOOST_TEST((ta == tb));
  BOOST_TEST(a.ledger().epoch() >= 1u);
  BOOST_TEST(a.ledger().check().ok());
  BOOST_TEST((saved(a) == saved(b)));

  // Without a ledger: version 3, and it loads as ledger-off into a core that has one.
  auto plain = ledger_core(2, 0, {});
  plain.join(0, 5, 0.0, out);
  const auto v3 = saved(plain);
  BOOST_TEST(static_cast<unsigned>(v3[4]) == 3u);
  auto with = ledger_core(2);
  ashl::state_reader r3(v3);
  BOOST_REQUIRE(with.load(r3).ok());
  BOOST_TEST(!with.ledger().enabled());
  BOOST_TEST((with.params().ledger == ps::ledger_params{}));
  BOOST_TEST((saved(with) == v3));
}

// With the ledger on, commits (each moving the cursor, granting leases,
// crossing leases and epochs) allocate nothing after warm-up; nor do
// ticks.
BOOST_AUTO_TEST_CASE(commits_with_the_ledger_on_allocate_nothing_in_steady_state) {
  const std::uint32_t m = 4;
  const auto d = dense(vec(64, 0.01f, 0.001f));
  for (std::uint64_t lease : {std::uint64_t{0}, std::uint64_t{24}}) {
    auto core = ledger_core(m, 0, {.samples = 1000, .shuffle_seed = 1, .lease_samples = lease, .ahead = 2}, 64);
    ps::server_actions out(m);
    for (sync::worker_id w = 0; w < m; ++w) core.join(w, 1, 0.0, out, 4);
    std::uint64_t seq = 1, leases = 0, errors = 0;
    auto events = [&](std::uint64_t to) {
      for (; seq < to; ++seq)
        for (sync::worker_id w = 0; w < m; ++w) {
          core.commit(commit_with_samples(w, 1, seq, d, 3 + (seq + w) % 7), static_cast<double>(seq), out);
          core.tick(static_cast<double>(seq) + 0.5, out);
          leases += out.leases().size();
          errors += out.errors().size();
          out.clear();
        }
    };
    events(50);  // warm-up
    const auto before = counting_new::count();
    const auto leases_before = leases;
    events(800);
    BOOST_TEST(counting_new::count() - before == 0u, "lease_samples " << lease);
    BOOST_TEST(errors == 0u);
    BOOST_TEST(leases - leases_before > 100u);
    BOOST_TEST(core.ledger().epoch() > 5u);  // several epochs completed in the counted part
    BOOST_TEST(core.ledger().stats().overrun == 0u);
    BOOST_TEST(core.ledger().check().ok());
  }
}
