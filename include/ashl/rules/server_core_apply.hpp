// ashl/rules/server_core_apply.hpp — how server_core applies what the
// policy decided: the dense add in cache-sized chunks (beside a version
// replies read, or in place), the adds waiting for one batched pass
// (apply_pending), the add of a commit while its parts land (speculate),
// the decode of a round's commits and the optimizer's step, by the apply
// pool's parts; then settle() and finish(), the one order of an event's
// outcomes (round, released pulls, the riding pull, changed plans).
//
//   #include <ashl/rules/server_core.hpp>   // includes this; the events call these passes
//
// Definitions of server_core's members, out of the class so that
// rules/server_core.hpp reads as the rules' outline; docs/design.md "Data
// flow of one commit"; docs/ps.md.
#pragma once

#include <ashl/rules/server_core.hpp>

ASHL_NAMESPACE_BEGIN
namespace ps {

// A spare buffer no reply reads (pooled).
template <sync::consistency_policy Policy>
inline auto server_core<Policy>::spare() -> version_buffer& {
  for (version_buffer& b : held_)
    if (b.readers == 0) return b;
  held_.emplace_back();
  return held_.back();
}

// Before w_ changes in place: a version replies read moves to a spare
// buffer's place (its storage stays with them) and w_ continues as a copy.
template <sync::consistency_policy Policy>
inline void server_core<Policy>::make_writable() {
  apply_pending();  // what waits came first
  w_crc_valid_ = false;
  ++w_changes_;
  if (w_readers_ == 0) return;
  version_buffer& b = spare();
  b.values.resize(w_.size());
  float* dst = b.values.data();
  const float* src = w_.data();
  for_parts(w_.size(), [&](unsigned, std::size_t lo, std::size_t hi) noexcept {
    if (hi > lo) std::memcpy(dst + lo, src + lo, (hi - lo) * sizeof(float));
  });
  retire_pinned(b);
  ++copies_for_readers_;
}

// w_'s storage (pinned) goes to b, b's (the new version) becomes w_.
template <sync::consistency_policy Policy>
inline void server_core<Policy>::retire_pinned(version_buffer& b) {
  std::swap(b.values, w_);
  b.version = w_pin_version_;
  b.readers = w_readers_;
  w_readers_ = 0;
}

// c waits for apply_pending() (false: no slot free, or batching is off).
template <sync::consistency_policy Policy>
inline bool server_core<Policy>::defer_dense(const commit_in& c, double weight) {
  if (pending_n_ >= pending_.size()) return false;
  pending_[pending_n_++] = {c.payload, c.codec, c.type, c.step, c.tensor, static_cast<float>(weight)};
  ++w_changes_;
  pending_crc_ = pending_crc_ || wants_reply_crc(c);
  w_crc_valid_ = false;
  return true;
}

// A dense model-delta commit (identity, fp16, bf16: element-wise) in one
// pass of cache-sized chunks: w += s·v in place, or, while replies read w,
// new = w + s·v into a spare buffer that then becomes w; with want_crc
// the new version's CRC from the chunk just written. The same additions in
// the same order as one decode_add of the whole payload (chunks are a
// multiple of every SIMD width, so only the last chunk has a tail).
// What waits (apply_pending) is added first.
template <sync::consistency_policy Policy>
inline void server_core<Policy>::apply_dense(const commit_in& c, double weight, bool want_crc) {
  apply_pending();
  const dense_add one{c.payload, c.codec, c.type, c.step, c.tensor, static_cast<float>(weight)};
  add_dense(std::span<const dense_add>(&one, 1), want_crc);
}

// The adds of several commits in one pass: each chunk gets every add, in
// order, before the next chunk (the same decode_add per chunk as one
// apply_dense per commit: the same bits).
template <sync::consistency_policy Policy>
inline void server_core<Policy>::add_dense(std::span<const dense_add> adds, bool want_crc) {
  const std::size_t n = w_.size();
  ++w_changes_;
  for ([[maybe_unused]] const dense_add& a : adds)
    ASHL_ASSERT(a.payload.size() % n == 0, "server_core: a dense payload of a fractional element size");
  const bool beside = w_readers_ > 0;
  version_buffer* b = beside ? &spare() : nullptr;
  if (b != nullptr) b->values.resize(n);
  float* dst = b != nullptr ? b->values.data() : w_.data();
  const float* src = w_.data();
  const std::size_t chunk = apply_chunk_bytes / sizeof(float);
  // One part per apply thread (one part without a pool); each part's
  // chunks start at its first element, a whole number of 64-byte lines.
  // The CRC is cut at the driver's checksum ranges (checksum_in_parts),
  // the add is not: its chunks stay whole multiples of every SIMD width.
  const unsigned parts = for_parts(n, [&](unsigned part, std::size_t lo, std::size_t hi) noexcept {
    crc_cursor crc = crc_open(part, lo, n);
    for (std::size_t at = lo; at < hi; at += chunk) {
      const std::size_t k = std::min(chunk, hi - at);
      if (beside) std::memcpy(dst + at, src + at, k * sizeof(float));
      for (const dense_add& a : adds) {
        const std::size_t per = a.payload.size() / n;
        const status s = compress::decode_add(a.codec, a.payload.subspan(at * per, k * per), {k, a.type},
                                              host_view<float>(dst + at, k), a.weight,
                                              compress::codec_context{p_.seed, a.step, a.tensor, {}});
        ASHL_ASSERT(s.ok(), "server_core: a validated payload failed to decode");
        (void)s;
      }
      if (want_crc) crc_feed(crc, dst, at, at + k);
    }
    if (want_crc) crc_close(crc, hi);
  });
  if (beside) publish_beside(*b);
  end_pass(want_crc, parts);
}

// A pass wrote the new version into b (beside the version replies read,
// which b's storage takes): b's values become w_.
template <sync::consistency_policy Policy>
inline void server_core<Policy>::publish_beside(version_buffer& b) {
  retire_pinned(b);
  ++applied_beside_;
}

// The end of a pass that wrote a new version: with crc its CRC from the
// `parts` pool parts' ranges the pass fed; without, the first pin reads it.
template <sync::consistency_policy Policy>
inline void server_core<Policy>::end_pass(bool crc, unsigned parts) noexcept {
  if (crc) {
    finish_crcs(parts);
    ++checksums_in_apply_;
  } else {
    w_crc_ = 0;
    w_crc_valid_ = false;
  }
}

// The largest bound of add_dense's chunks at or below x (n for x >= n):
// each pool part's first element plus whole chunks, so the speculation's
// decode_adds cover the same elements as one apply_dense's.
template <sync::consistency_policy Policy>
inline std::size_t server_core<Policy>::grid_floor(std::size_t x) const noexcept {
  const std::size_t n = w_.size();
  if (x >= n) return n;
  const std::size_t block = part_block(n, parts_for(n));
  const std::size_t lo = x / block * block;
  const std::size_t chunk = apply_chunk_bytes / sizeof(float);
  return lo + (x - lo) / chunk * chunk;
}

// A speculation's add over [sp.done, to) (to: a grid bound), chunk by
// chunk on add_dense's grid, and, when a pull rides with the commit, its
// checksum ranges' CRCs (each range's CRC continued from where the last
// call left it). sp: spec_, or fused_ (check_message's pass).
template <sync::consistency_policy Policy>
inline void server_core<Policy>::speculate_to(speculation& sp, std::size_t to) {
  const std::size_t n = w_.size();
  const std::size_t block = part_block(n, parts_for(n));
  const std::size_t chunk = apply_chunk_bytes / sizeof(float);
  const std::size_t per_range = range_elements(n);
  const std::size_t per = sp.payload.size() / n;
  const compress::codec_context ctx{p_.seed, sp.step, sp.tensor, {}};
  float* dst = sp.values.data();
  while (sp.done < to) {
    const std::size_t at = sp.done;
    const std::size_t k = std::min({chunk, to - at, std::min(n, at / block * block + block) - at});
    std::memcpy(dst + at, w_.data() + at, k * sizeof(float));
    const status s = compress::decode_add(sp.codec, sp.payload.subspan(at * per, k * per), {k, sp.type},
                                          host_view<float>(dst + at, k), sp.weight, ctx);
    ASHL_ASSERT(s.ok(), "server_core: a checked part failed to decode");
    (void)s;
    for (std::size_t from = at; sp.crcs_wanted && from < at + k;) {
      const std::size_t j = from / per_range;
      const std::size_t b = std::min(at + k, (j + 1) * per_range);
      std::uint32_t& crc = sp.crcs[j];
      crc = wire::crc32c(std::as_bytes(std::span<const float>(dst + from, b - from)), from == j * per_range ? 0u : crc);
      from = b;
    }
    sp.done = at + k;
  }
}

// True when c is the commit of the live speculation, which ends here (the
// buffer is free for the next commit's part 0, whatever commit() decides).
template <sync::consistency_policy Policy>
inline bool server_core<Policy>::claim_speculation(const commit_in& c) noexcept {
  if (spec_.dead || !spec_.owns(c)) return false;
  spec_.dead = true;
  return true;
}

// commit()'s apply of the claimed speculation's commit at `weight`: what
// is left of the pass, then the swap (beside a pinned version when
// replies read w_). False (nothing changed) when the parameters changed
// under it or the policy weighs the commit otherwise.
template <sync::consistency_policy Policy>
inline bool server_core<Policy>::take_speculation(double weight) {
  if (!publish_speculation(spec_, weight)) {
    ++speculations_stale_;
    return false;
  }
  ++applied_as_landed_;
  return true;
}

// sp's pass finished and becomes the parameters (take_speculation,
// take_fused); false, nothing changed, when it is stale or weighed otherwise.
template <sync::consistency_policy Policy>
inline bool server_core<Policy>::publish_speculation(speculation& sp, double weight) {
  if (sp.base != w_changes_ || pending_n_ > 0 || sp.weight != static_cast<float>(weight) ||
      sp.crcs.size() != std::max<std::size_t>(checksum_parts_, 1))
    return false;
  speculate_to(sp, w_.size());
  ++w_changes_;
  if (w_readers_ > 0) {
    version_buffer& b = spare();
    std::swap(b.values, sp.values);  // b: the new version; sp.values: b's storage, for the next one
    publish_beside(b);
  } else {
    std::swap(w_, sp.values);
  }
  if (sp.crcs_wanted) {  // the ranges' CRCs came with the adds (a push's are not computed)
    if (range_crc_.size() != sp.crcs.size()) range_crc_.assign(sp.crcs.size(), 0u);
    std::copy(sp.crcs.begin(), sp.crcs.end(), range_crc_.begin());
  }
  end_pass(sp.crcs_wanted, 1);
  return true;
}

// Adds weight x a validated payload into `into` (w_ or acc_): by parts
// when a pool is in use and the codec is element-wise (a dense cast: each
// part decodes its slice of the payload) or sparse pairs (each part adds
// the pairs whose index falls in it); else one decode_add.
template <sync::consistency_policy Policy>
inline void server_core<Policy>::decode_or_die(codec_id id, dtype t, std::uint64_t step, std::uint32_t tensor,
                                               std::span<const std::byte> payload, std::vector<float>& into,
                                               double weight) {
  const compress::codec_context ctx{p_.seed, step, tensor, {}};
  const std::size_t n = into.size();
  float* const base = into.data();
  const float scale = static_cast<float>(weight);
  if (parts_for(n) > 1) {
    const std::size_t dense = compress::dense_payload_bytes(id, {n, t});
    if (dense != 0 && dense == payload.size()) {
      const std::size_t per = payload.size() / n;
      for_parts(n, [&](unsigned, std::size_t lo, std::size_t hi) noexcept {
        if (hi == lo) return;
        const status s = compress::decode_add(id, payload.subspan(lo * per, (hi - lo) * per), {hi - lo, t},
                                              host_view<float>(base + lo, hi - lo), scale, ctx);
        ASHL_ASSERT(s.ok(), "server_core: a validated payload failed to decode");
        (void)s;
      });
      return;
    }
    if (compress::sparse_pairs(id)) {
      for_parts(n, [&](unsigned, std::size_t lo, std::size_t hi) noexcept {
        compress::add_pairs_in_range(payload, t, base, scale, lo, hi);
      });
      return;
    }
  }
  const status s = compress::decode_add(id, payload, {n, t}, host_view<float>(base, n), scale, ctx);
  ASHL_ASSERT(s.ok(), "server_core: a validated payload failed to decode");
  (void)s;
}

// The optimizer's step over acc_, by parts; with want_crc the new
// version's CRC (and its checksum ranges') in the same pass, chunk by
// chunk as apply_dense does (chunks of whole SIMD widths: the same bits).
template <sync::consistency_policy Policy>
inline void server_core<Policy>::step_parts(float scale, bool want_crc) {
  opt_.begin_step();  // one step, however many parts (Delayed Nesterov counts steps)
  const std::size_t n = w_.size();
  const std::size_t chunk = apply_chunk_bytes / sizeof(float);
  const unsigned parts = for_parts(n, [&](unsigned part, std::size_t lo, std::size_t hi) noexcept {
    if (!want_crc) {
      if (hi > lo) opt_.step(w_, acc_, scale, lo, hi);
      return;
    }
    crc_cursor crc = crc_open(part, lo, n);
    for (std::size_t at = lo; at < hi; at += chunk) {
      const std::size_t k = std::min(chunk, hi - at);
      opt_.step(w_, acc_, scale, at, at + k);
      crc_feed(crc, w_.data(), at, at + k);
    }
    crc_close(crc, hi);
  });
  end_pass(want_crc, parts);
}

template <sync::consistency_policy Policy>
inline bool server_core<Policy>::speculate(const commit_in& c, std::size_t from, std::size_t to) {
  const std::size_t n = w_.size();
  if (n == 0 || !opt_.adds_deltas() || c.worker >= table_.size() || c.element_count != n ||
      compress::dense_payload_bytes(c.codec, {n, c.type}) != c.payload.size())
    return false;
  const worker_entry& e = table_[c.worker];
  if (!e.live || c.incarnation != e.incarnation || c.sequence <= e.last_sequence) return false;  // commit() refuses it
  if (!e.applied_at_once) return false;  // its last commit waited for a round: so will this one, likely
  speculation& sp = spec_;
  if (from == 0) {
    if (sp.live(w_changes_) && sp.worker != c.worker) return false;  // another rank's, still good
    sp.start(c, e.last_weight, w_changes_);
    sp.values.resize(n);
    sp.crcs.assign(std::max<std::uint32_t>(checksum_parts_, 1), 0u);
    ++speculations_;
  } else if (!sp.owns(c) || sp.dead) {
    return false;
  }
  if (from != sp.landed || to < from || pending_n_ > 0 || sp.base != w_changes_) {
    sp.dead = true;  // out of order, or the parameters changed under it (or a deferred commit waits)
    ++speculations_stale_;
    return false;
  }
  sp.landed = std::min(to, n);
  speculate_to(sp, grid_floor(sp.landed));
  return true;
}

template <sync::consistency_policy Policy>
inline void server_core<Policy>::apply_pending() {
  if (pending_n_ == 0) return;
  const std::size_t k = pending_n_;
  pending_n_ = 0;
  add_dense(std::span<const dense_add>(pending_.data(), k), pending_crc_);
  pending_crc_ = false;
  if (k >= 2) {
    ++batched_passes_;
    batched_commits_ += k;
  }
}

// Acts on what the sink holds beyond `from`, in the one order: the round
// (one step), then released pulls.
template <sync::consistency_policy Policy>
inline auto server_core<Policy>::settle(server_actions& out, progress from) -> progress {
  const auto round = sink_.round();
  if (round.size() > from.round) {
    const bool math = !timing_only();
    for (std::size_t k = from.round; k < round.size(); ++k) {
      const sync::weighted_commit& rc = round[k];
      ASHL_ASSERT(std::isfinite(rc.weight), "server_core: the policy gave a non-finite round weight");
      std::vector<float>& into = opt_.adds_deltas() ? w_ : acc_;
      if (math && opt_.adds_deltas()) make_writable();
      if (current_ != nullptr && rc.worker == current_->worker && rc.sequence == current_sequence_) {
        if (math) decode_or_die(current_->codec, current_->type, current_->step, current_->tensor, current_->payload,
                                into, rc.weight);
        current_ = nullptr;  // consumed without being stored
      } else if (math) {
        const commit_store::entry* e = store_.find(rc.worker, rc.sequence);
        if (e == nullptr) {
          ++stats_.round_missing;
          continue;
        }
        decode_or_die(e->meta.codec, e->meta.type, e->meta.step, e->meta.tensor, store_.payload(*e), into,
                      rc.weight);
        store_.erase(rc.worker, rc.sequence);
      }
      ++stats_.commits_applied;
    }
    if (math && !opt_.adds_deltas()) {
      make_writable();
      step_parts(1.0f, sink_.released().size() > from.released);  // the round releases pulls: they read it
    }
    take_step(out);
  }
  const auto rel = sink_.released();
  for (std::size_t k = from.released; k < rel.size(); ++k) {
    const worker_id r = rel[k];
    if (r >= table_.size() || !table_[r].held) continue;  // nothing asked: nothing to answer
    table_[r].held = false;
    ++stats_.pulls_released;
    out.reply(r);
  }
  return {round.size(), rel.size()};
}

// Settles the event's outcomes; then the pull of `puller` (riding with a
// commit, or alone); then the plans that changed (and the joiner's).
template <sync::consistency_policy Policy>
inline void server_core<Policy>::finish(server_actions& out, progress from, worker_id joiner, worker_id puller,
                                        double now) {
  from = settle(out, from);
  if (puller != no_worker && table_[puller].live) {
    if (table_[puller].held) {
      // Asked again while held: it stays held and is answered once, on release.
    } else {
      ++stats_.pulls;
      const sync::pull_action a = policy_.on_pull({puller, now}, sink_);
      if (a == sync::pull_action::serve) {
        from = settle(out, from);
        ++stats_.pulls_served;
        out.reply(puller);
      } else {
        table_[puller].held = true;
        ++stats_.pulls_held;
        from = settle(out, from);
      }
    }
  }
  if (sink_.every_plan_changed()) {
    for (worker_id w = 0; w < table_.size(); ++w)
      if (table_[w].live) send_plan(w, out);
  } else {
    for (worker_id w : sink_.plans_changed())
      if (w < table_.size() && table_[w].live) send_plan(w, out);
    if (joiner != no_worker && !sink_.plan_changed_for(joiner)) send_plan(joiner, out);
  }
  sink_.clear();
}

}  // namespace ps
ASHL_NAMESPACE_END
