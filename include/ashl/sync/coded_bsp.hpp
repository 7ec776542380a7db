// ashl/sync/coded_bsp.hpp — coded BSP: synchronous rounds with gradient coding,
// so a round never waits for its r slowest workers.
//
//   ashl::sync::coded_bsp p{{.workers = 4, .stragglers = 1}};
//   ashl::sync::outcome_sink out(4);
//   // worker i commits Σ (coefficient · gradient of partition) over p.encoding(i)
//   p.on_commit({.worker = 0, .sequence = 1}, out);   // buffer
//   p.on_commit({.worker = 2, .sequence = 1}, out);   // buffer
//   p.on_commit({.worker = 3, .sequence = 1}, out);   // buffer; 3 = M − r arrived: the round completes,
//   // out.round(): workers 0, 2, 3 with weights a_i / M (Σ a_i·commit_i = Σ_j g_j)
//   p.on_commit({.worker = 1, .sequence = 1}, out);   // late: drop (late_commits() counts it)
//   p.on_pull({.worker = 1}, out);                    // served at once: the new parameters
//
// Tandon et al., "Gradient Coding" (ICML 2017), cyclic repetition; the code
// itself is profile/gradient_coding.hpp; docs/seed-algorithms.md "Gradient
// coding". Rounds are BSP's (one commit per worker per round, pulls held
// while the worker has a commit buffered), except that a round completes when
// the first M − r of its commits have arrived; those are applied with weights
// a_i / M, a_i the decoding weights of that set, so the step sees the mean of
// the M partition gradients exactly as BSP's "mean" sees the mean of M
// worker gradients. The round's other commits are late: each is dropped when
// it arrives (late_commits()), and the worker's pull is served at once (it
// has nothing buffered), so it gets the new parameters and commits for the
// round in progress. A worker's commits are attributed to rounds in order; a
// late worker's next commit after its dropped one counts for the current
// round.
//
// r = 0 is BSP: B is the identity, a_i = 1, weights 1/M; with a fixed
// membership coded_bsp with r = 0 makes BSP's decisions bit for bit (tested
// event by event). Membership changes differ from BSP: see below.
//
// Membership. The code of a round is fixed when the round starts, over the
// live workers then (sorted by id: position p in that list is worker p of the
// code, with partitions p..p+r mod M_live). An eviction or a join marks a
// re-plan, made when the round in progress completes: a new code over the
// live workers (same r and seed; r_eff = r when r < M_live ≤ 64, else 0,
// so with M_live ≤ r every round needs all live workers), every plan changes
// (out.all_plans_changed()), and commits buffered for later rounds under the
// old code are named in that round with weight 0 (discarded_commits(); the
// driver frees them, nothing is added). Until then an evicted worker's
// received commit still counts, the round waits for M_live − r of the others,
// and when fewer can arrive it completes once every remaining worker of the
// code has committed, with least-squares weights scaled by 1 / Σ_j x_j
// (x = B_Sᵀa, the weight each partition got): the best approximation of the
// mean those commits allow (inexact_rounds(); for r = 0 it is 1/|S|, BSP's
// mean over the commits it has). A joiner's commits are dropped
// (outside_commits()) until the re-plan makes it a member. A commit buffered
// under an older code holds no pull. BSP instead counts a joiner from the
// round in progress and applies every buffered commit of an evicted worker.
// drain() applies the round in progress (decoded, or least squares when
// fewer than M − r arrived) and names commits buffered for later rounds with
// weight 0; BSP's drain averages everything buffered.
//
// The worker's side: worker_plan has no room for coefficients, so a worker
// program gets them from encoding(w) (in-process drivers, the simulator) or
// rebuilds them with profile::gradient_code::make(M, r, seed) and its
// position among the live workers: the construction is deterministic. Its
// plan's data_share is (r + 1) / M (it holds r + 1 partitions of 1/M each);
// 0 means it is not in the code yet (a joiner before the next boundary) and
// should not compute: what it commits then is dropped. A worker computes
// each round with the encoding of the plan it last received.
//
// Cost: an event that completes no round is O(1); a completed round O(ids)
// plus the decode: a cache lookup for a set of workers seen before under the
// current code, O(M·(M − r)²) and an allocation the first time. A re-plan
// to a live-worker count not seen before builds its code (profile/
// gradient_coding.hpp "Cost") and allocates; codes are kept per count, with
// their decoding caches, so after warm-up neither re-plans nor rounds do.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/fields.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/profile/gradient_coding.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/detail/workers.hpp>
#include <ashl/sync/events.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sync {

struct coded_bsp_params {
  std::size_t workers = 0;
  std::uint32_t stragglers = 1;                                 // r: commits a round does not wait for
  std::uint64_t seed = profile::gradient_code_default_seed;     // of the code (workers use the same)
  std::uint32_t batch_size = 0;                                 // advertised in the plan; 0: the worker's own
  stage_id stage = stage_id::bsp;
};

class coded_bsp {
 public:
  using policy_concept = policy_tag;

  coded_bsp() = default;
  explicit coded_bsp(coded_bsp_params p)
      : table_(p.workers), r_(p.stragglers), seed_(p.seed), batch_(p.batch_size), stage_(p.stage) {
    grow(p.workers);
    replan(nullptr);
  }

  commit_decision on_commit(const commit_event& c, outcome_sink& out) {
    if (!table_.accept(c)) return {commit_action::drop, 0.0};
    grow(table_.size());
    const worker_id w = c.worker;
    if (!contrib_[w]) {
      ++outside_;
      return {commit_action::drop, 0.0};
    }
    if (next_[w] < round_) {
      ++late_;
      next_[w] = round_;
      return {commit_action::drop, 0.0};
    }
    const std::uint64_t rd = next_[w]++;
    push(w, c.sequence, rd);
    if (rd == round_) arrive(slot_[w]);
    settle(out);
    return {commit_action::buffer, 0.0};
  }
  pull_action on_pull(const pull_event& q, outcome_sink&) {
    if (!table_.is_live(q.worker)) return pull_action::serve;
    if (waiting(q.worker)) {
      table_.hold(q.worker);
      return pull_action::hold;
    }
    return detail::serve(table_, q.worker);
  }
  void on_metric(const metric_event&, outcome_sink&) {}
  void on_join(const membership_event& j, outcome_sink& out) {
    if (!table_.join(j.worker, 0)) return;
    grow(table_.size());
    replan_ = true;
    settle(out);
  }
  void on_evict(const membership_event& j, outcome_sink& out) {
    const worker_id w = j.worker;
    if (!table_.is_live(w)) return;
    table_.evict(w);
    if (contrib_[w]) {
      contrib_[w] = 0;
      if (arrived_[slot_[w]] == 0) --pending_;
    }
    replan_ = true;
    settle(out);
  }
  void on_measurement(const measurement_event&, outcome_sink&) {}
  void drain(outcome_sink& out) {
    if (buffered_ > 0) take_round(out, true);
    table_.release_if(out, [](worker_id) { return true; });
  }

  [[nodiscard]] worker_plan plan(worker_id w) const {
    worker_plan p;
    p.local_iterations = 1;
    p.batch_size = batch_;
    p.stage = stage_;
    if (member(w))
      p.data_share = static_cast<float>(static_cast<double>(r_eff_ + 1) / static_cast<double>(members_.size()));
    return p;
  }
  [[nodiscard]] stage_id stage() const noexcept { return stage_; }
  [[nodiscard]] bool is_live(worker_id w) const noexcept { return table_.is_live(w); }
  [[nodiscard]] bool is_held(worker_id w) const noexcept { return table_.is_held(w); }

  // ---- the code of the round in progress, for worker programs
  // Worker w's terms (partition, coefficient): it commits Σ coefficient·g_partition
  // over them. Empty when w is not a member of the current code.
  [[nodiscard]] std::vector<profile::coded_partition> encoding(worker_id w) const {
    if (!member(w)) return {};
    if (r_eff_ == 0) return {{slot_[w], 1.0}};
    return code().encoding(slot_[w]);
  }
  [[nodiscard]] std::size_t partitions() const noexcept { return members_.size(); }  // M of the current code
  [[nodiscard]] std::optional<std::uint32_t> position(worker_id w) const {
    if (!member(w)) return std::nullopt;
    return slot_[w];
  }
  [[nodiscard]] std::size_t tolerated() const noexcept { return r_eff_; }  // r of the current code
  [[nodiscard]] std::size_t needed() const noexcept { return members_.size() - r_eff_; }
  [[nodiscard]] std::uint32_t stragglers() const noexcept { return r_; }
  [[nodiscard]] std::uint64_t seed() const noexcept { return seed_; }

  // ---- counters
  [[nodiscard]] std::uint64_t rounds() const noexcept { return rounds_; }
  [[nodiscard]] std::uint64_t late_commits() const noexcept { return late_; }
  [[nodiscard]] std::uint64_t discarded_commits() const noexcept { return discarded_; }
  [[nodiscard]] std::uint64_t outside_commits() const noexcept { return outside_; }
  [[nodiscard]] std::uint64_t inexact_rounds() const noexcept { return inexact_; }
  [[nodiscard]] std::uint64_t undecodable_rounds() const noexcept { return undecodable_; }
  [[nodiscard]] std::size_t buffered() const noexcept { return buffered_; }
  [[nodiscard]] std::size_t live_count() const noexcept { return table_.live_count(); }

 private:
  // The saved scalars (core/fields.hpp), in their order: the parameters
  // before the stage and the worker table, the round state after them.
  static constexpr auto saved_params() {
    return std::tuple{field{"stragglers", &coded_bsp::r_}, field{"seed", &coded_bsp::seed_},
                      field{"batch_size", &coded_bsp::batch_}};
  }
  static constexpr auto saved_rounds() {
    return std::tuple{field{"round", &coded_bsp::round_},         field{"generation", &coded_bsp::gen_},
                      field{"rounds", &coded_bsp::rounds_},       field{"replan", &coded_bsp::replan_},
                      field{"late", &coded_bsp::late_},           field{"discarded", &coded_bsp::discarded_},
                      field{"outside", &coded_bsp::outside_},     field{"inexact", &coded_bsp::inexact_},
                      field{"undecodable", &coded_bsp::undecodable_}};
  }

 public:
  void save(state_writer& out) const {
    out.tag("CBSP", 1);
    put_fields(out, *this, saved_params());
    out.put(static_cast<std::uint32_t>(stage_));
    table_.save(out);
    put_fields(out, *this, saved_rounds());
    out.put<std::uint64_t>(members_.size());
    for (worker_id w : members_) out.put(w);
    out.put<std::uint64_t>(order_.size());
    for (std::uint32_t p : order_) out.put(p);
    out.put<std::uint64_t>(head_.size());
    for (worker_id w = 0; w < head_.size(); ++w) {
      out.put(contrib_[w] != 0);
      out.put(next_[w]);
      std::uint64_t k = 0;
      for (auto n = head_[w]; n != detail::no_position; n = q_next_[n]) ++k;
      out.put(k);
      for (auto n = head_[w]; n != detail::no_position; n = q_next_[n]) {
        out.put(q_seq_[n]);
        out.put(q_round_[n]);
        out.put(q_gen_[n]);
      }
    }
  }
  status load(state_reader& in) {
    coded_bsp n;
    ASHL_TRY(in.tag("CBSP", 1));
    ASHL_TRY(get_fields(in, n, "coded_bsp", saved_params()));
    ASHL_TRY(detail::load_stage(in, n.stage_, "coded_bsp.stage"));
    ASHL_TRY(n.table_.load(in));
    ASHL_TRY(get_fields(in, n, "coded_bsp", saved_rounds()));
    std::uint64_t count = 0;
    ASHL_TRY(in.count(count, 4, "coded_bsp.members"));
    n.members_.resize(static_cast<std::size_t>(count));
    for (auto& w : n.members_) ASHL_TRY(in.get(w, "coded_bsp.member"));
    for (std::size_t p = 0; p < n.members_.size(); ++p) {
      if (n.members_[p] >= n.table_.size()) return malformed("coded_bsp.member", n.members_[p], "an unknown worker");
      if (p > 0 && n.members_[p] <= n.members_[p - 1])
        return malformed("coded_bsp.member", n.members_[p], "members must be in increasing order");
    }
    ASHL_TRY(in.count(count, 4, "coded_bsp.arrivals"));
    if (count > n.members_.size()) return malformed("coded_bsp.arrivals", count, "more than the members");
    std::vector<std::uint32_t> order(static_cast<std::size_t>(count));
    for (auto& p : order) ASHL_TRY(in.get(p, "coded_bsp.arrival"));
    ASHL_TRY(in.count(count, 1 + 8 + 8, "coded_bsp.workers"));
    if (count < n.table_.size()) return malformed("coded_bsp.workers", count, "fewer than the worker table");
    n.grow(static_cast<std::size_t>(count));
    for (worker_id w = 0; w < count; ++w) {
      bool contrib = false;
      ASHL_TRY(in.get(contrib, "coded_bsp.contributing"));
      ASHL_TRY(in.get(n.next_[w], "coded_bsp.next_round"));
      n.contrib_[w] = contrib ? 1 : 0;
      std::uint64_t k = 0;
      ASHL_TRY(in.count(k, 24, "coded_bsp.queue"));
      for (std::uint64_t i = 0; i < k; ++i) {
        std::uint64_t seq = 0, rd = 0, gen = 0;
        ASHL_TRY(in.get(seq, "coded_bsp.sequence"));
        ASHL_TRY(in.get(rd, "coded_bsp.queued_round"));
        ASHL_TRY(in.get(gen, "coded_bsp.queued_generation"));
        n.push(w, seq, rd, gen);
      }
    }
    // The code and everything derived from the members.
    n.set_members_code();
    if (n.r_eff_ > 0 && !n.build_code()) return malformed("coded_bsp.seed", n.seed_, "no code for these members");
    for (worker_id w = 0; w < count; ++w) {
      if (n.contrib_[w] == 0) continue;
      if (n.slot_[w] == detail::no_position) return malformed("coded_bsp.contributing", w, "not a member");
      if (!n.table_.is_live(w)) return malformed("coded_bsp.contributing", w, "not live");
    }
    for (std::uint32_t p : order) {
      if (p >= n.members_.size() || n.arrived_[p] != 0)
        return malformed("coded_bsp.arrival", p, "not a member position, or twice");
      n.arrived_[p] = 1;
      n.order_.push_back(p);
    }
    n.pending_ = 0;
    for (worker_id w : n.members_)
      if (n.contrib_[w] != 0 && n.arrived_[n.slot_[w]] == 0) ++n.pending_;
    *this = std::move(n);
    return {};
  }

 private:
  [[nodiscard]] bool member(worker_id w) const noexcept {
    return w < contrib_.size() && contrib_[w] != 0 && slot_[w] != detail::no_position;
  }
  // Has a commit of the current code buffered (one of an older code only
  // waits to be discarded: it holds no pull). O(queue), normally 0 or 1.
  [[nodiscard]] bool waiting(worker_id w) const noexcept {
    if (w >= head_.size()) return false;
    for (auto n = head_[w]; n != detail::no_position; n = q_next_[n])
      if (q_gen_[n] == gen_) return true;
    return false;
  }

  void grow(std::size_t n) {
    if (head_.size() >= n) return;
    head_.resize(n, detail::no_position);
    tail_.resize(n, detail::no_position);
    slot_.resize(n, detail::no_position);
    contrib_.resize(n, 0);
    next_.resize(n, 0);
    q_seq_.reserve(2 * n);
    q_round_.reserve(2 * n);
    q_gen_.reserve(2 * n);
    q_next_.reserve(2 * n);
  }

  // ---- per-worker queues of buffered commits (sequence, round, code generation)
  void push(worker_id w, std::uint64_t seq, std::uint64_t rd) { push(w, seq, rd, gen_); }
  void push(worker_id w, std::uint64_t seq, std::uint64_t rd, std::uint64_t gen) {
    std::uint32_t n = free_;
    if (n != detail::no_position) {
      free_ = q_next_[n];
      q_seq_[n] = seq;
      q_round_[n] = rd;
      q_gen_[n] = gen;
      q_next_[n] = detail::no_position;
    } else {
      n = static_cast<std::uint32_t>(q_seq_.size());
      q_seq_.push_back(seq);
      q_round_.push_back(rd);
      q_gen_.push_back(gen);
      q_next_.push_back(detail::no_position);
    }
    if (head_[w] == detail::no_position) head_[w] = n;
    else q_next_[tail_[w]] = n;
    tail_[w] = n;
    ++buffered_;
  }
  void pop(worker_id w) {
    const std::uint32_t n = head_[w];
    head_[w] = q_next_[n];
    if (head_[w] == detail::no_position) tail_[w] = detail::no_position;
    q_next_[n] = free_;
    free_ = n;
    --buffered_;
  }

  void arrive(std::uint32_t p) {
    arrived_[p] = 1;
    order_.push_back(p);
    --pending_;
  }
  [[nodiscard]] bool complete() const noexcept {
    if (members_.empty() || order_.empty()) return false;
    return order_.size() >= needed() || pending_ == 0;
  }

  void settle(outcome_sink& out) {
    std::uint64_t n = 0;
    for (;;) {
      if (complete()) {
        take_round(out, false);
        ++n;
        continue;
      }
      // Nobody of the current code can commit any more and nothing arrived:
      // re-plan over the live workers now rather than wait for nothing.
      if (pending_ == 0 && order_.empty() && replan_ && table_.live_count() > 0) {
        replan(&out);
        continue;
      }
      break;
    }
    if (n > 0) table_.release_if(out, [&](worker_id w) { return !waiting(w); });
  }

  // Decoding weights of the round's first M − r arrivals (all of them when
  // fewer arrived) into weight_ by position; returns the scale, 0 when the set
  // does not decode.
  double decode(std::size_t used) {
    const std::size_t m = members_.size();
    for (std::size_t p = 0; p < m; ++p) weight_[p] = 0.0;
    if (r_eff_ == 0) {
      // B = I: a_i = 1, and the mean over the commits there are (1/M when all are).
      for (std::size_t k = 0; k < used; ++k) weight_[order_[k]] = 1.0;
      if (used < m) ++inexact_;
      return 1.0 / static_cast<double>(used);
    }
    std::uint64_t set = 0;
    for (std::size_t k = 0; k < used; ++k) set |= std::uint64_t{1} << order_[k];
    if (used >= needed()) {
      auto d = code().decode(set);
      if (!d) return 0.0;
      for (std::size_t p = 0; p < m; ++p) weight_[p] = d->weights[p];
      return 1.0 / static_cast<double>(m);
    }
    auto res = code().approximate(set, std::span<double>(weight_.data(), m));
    if (!res) return 0.0;
    double total = 0.0;  // Σ_j x_j, x = B_Sᵀa
    for (std::size_t p = 0; p < m; ++p)
      if (weight_[p] != 0.0)
        for (std::size_t j = 0; j < m; ++j) total += weight_[p] * code().coefficient(p, j);
    if (!(total > 0.0)) return 0.0;
    ++inexact_;
    return 1.0 / total;
  }

  // Names the round (decoded arrivals with their weights, discarded commits
  // with 0) into `out`, then starts the next round (re-planned when marked).
  // `everything`: drain, every buffered commit leaves.
  void take_round(outcome_sink& out, bool everything) {
    const std::size_t used = order_.size() < needed() ? order_.size() : needed();
    std::fill(used_.begin(), used_.end(), 0);
    for (std::size_t k = 0; k < used; ++k) used_[order_[k]] = 1;
    double scale = used > 0 ? decode(used) : 0.0;
    if (used > 0 && scale == 0.0) ++undecodable_;
    const bool discard_future = replan_ || everything;
    for (worker_id w = 0; w < head_.size(); ++w) {
      while (head_[w] != detail::no_position) {
        const std::uint32_t n = head_[w];
        const bool current = q_round_[n] == round_ && q_gen_[n] == gen_;
        const std::uint32_t p = slot_[w];
        const bool decoded = current && p != detail::no_position && used_[p] != 0;
        const bool keep = !decoded && !discard_future && q_gen_[n] == gen_ && q_round_[n] > round_ &&
                          table_.is_live(w) && contrib_[w] != 0;
        if (keep) break;
        if (decoded) {
          out.apply(w, q_seq_[n], weight_[p] * scale);
          used_[p] = 0;  // its one decoded commit
        } else {
          out.apply(w, q_seq_[n], 0.0);
          ++discarded_;
        }
        pop(w);
      }
    }
    table_.bump_version();
    ++rounds_;
    ++round_;
    for (std::uint32_t p : order_) arrived_[p] = 0;
    order_.clear();
    if (replan_ && table_.live_count() > 0) {
      replan(&out);
      return;
    }
    // The next round under the same code: members that committed early arrive now.
    pending_ = 0;
    for (std::uint32_t p = 0; p < members_.size(); ++p) {
      const worker_id w = members_[p];
      if (contrib_[w] == 0) continue;
      if (everything) next_[w] = round_;
      ++pending_;
      const std::uint32_t n = head_[w];
      if (n != detail::no_position && q_round_[n] == round_ && q_gen_[n] == gen_) arrive(p);
    }
  }

  // A new code over the live workers, in force from the round in progress
  // (called at a round boundary, or when nobody of the old code is left).
  void replan(outcome_sink* out) {
    for (worker_id w : members_) slot_[w] = detail::no_position;
    members_.clear();
    for (worker_id w = 0; w < head_.size(); ++w) {
      if (!table_.is_live(w)) {
        contrib_[w] = 0;
        continue;
      }
      members_.push_back(w);
      // A member that was late keeps its round, so the commit it is still
      // computing under the old code is dropped when it arrives; one whose
      // early commits were just discarded, and a new member, count from now.
      next_[w] = contrib_[w] != 0 && next_[w] < round_ ? next_[w] : round_;
      contrib_[w] = 1;
    }
    set_members_code();
    if (r_eff_ > 0 && !build_code()) set_members_code(true);
    pending_ = members_.size();
    order_.clear();
    ++gen_;
    replan_ = false;
    if (out != nullptr) out->all_plans_changed();
  }
  // Positions, r_eff and the per-position buffers for members_ (forced to
  // r_eff = 0 when no code could be built).
  void set_members_code(bool plain = false) {
    const std::size_t m = members_.size();
    for (std::uint32_t p = 0; p < m; ++p) slot_[members_[p]] = p;
    r_eff_ = !plain && r_ < m && m <= profile::gradient_code_max_workers ? r_ : 0;
    arrived_.assign(m, 0);
    used_.assign(m, 0);
    weight_.assign(m, 0.0);
    order_.reserve(m);
  }
  // The code for members_.size() workers, built once per size: the code is
  // a function of (M, r, seed) only, so a membership that comes back to a
  // size seen before reuses it and its decoding cache (no allocation).
  bool build_code() {
    const std::size_t m = members_.size();
    if (codes_.size() <= m) codes_.resize(m + 1);
    if (codes_[m].workers() == m) return true;
    auto c = profile::gradient_code::make(m, r_eff_, seed_);
    if (!c) return false;
    codes_[m] = std::move(*c);
    return true;
  }
  profile::gradient_code& code() { return codes_[members_.size()]; }
  [[nodiscard]] const profile::gradient_code& code() const { return codes_[members_.size()]; }

  detail::worker_table table_;
  std::uint32_t r_ = 1;
  std::uint64_t seed_ = profile::gradient_code_default_seed;
  std::uint32_t batch_ = 0;
  stage_id stage_ = stage_id::bsp;

  // The code of the round in progress.
  std::vector<worker_id> members_;      // live workers when it was made, increasing; position = code worker
  std::size_t r_eff_ = 0;
  std::vector<profile::gradient_code> codes_;  // by worker count, built when r_eff_ > 0
  std::uint64_t gen_ = 0;               // code generation: commits buffered under another are not decoded
  bool replan_ = false;                 // membership changed: a new code at the next round boundary

  // The round in progress.
  std::uint64_t round_ = 0;
  std::vector<std::uint8_t> arrived_;   // by position
  std::vector<std::uint32_t> order_;    // positions, in arrival order
  std::size_t pending_ = 0;             // contributing members that have not committed for it
  std::vector<std::uint8_t> used_;      // scratch, by position
  std::vector<double> weight_;          // scratch, by position

  // Per worker id.
  std::vector<std::uint32_t> slot_;     // position in members_, or no_position
  std::vector<std::uint8_t> contrib_;   // a member that may commit for the round in progress
  std::vector<std::uint64_t> next_;     // the round its next commit counts for
  std::vector<std::uint32_t> head_, tail_;

  // Node pool of the queues.
  std::vector<std::uint64_t> q_seq_, q_round_, q_gen_;
  std::vector<std::uint32_t> q_next_;
  std::uint32_t free_ = detail::no_position;
  std::size_t buffered_ = 0;

  std::uint64_t rounds_ = 0;
  std::uint64_t late_ = 0;
  std::uint64_t discarded_ = 0;
  std::uint64_t outside_ = 0;
  std::uint64_t inexact_ = 0;
  std::uint64_t undecodable_ = 0;
};

static_assert(consistency_policy<coded_bsp>);

}  // namespace sync
ASHL_NAMESPACE_END
