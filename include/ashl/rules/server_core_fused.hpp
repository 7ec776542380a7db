// ashl/rules/server_core_fused.hpp — server_core's check of a commit as it
// lies in the driver's receive buffer, unchecked (check_message): the CRC,
// the finite scan and, where the apply would write beside a version replies
// read anyway, the apply itself into a spare version, all in one chunked
// pass; a bad commit discards the spare and changes nothing.
//
//   ashl::ps::dense_value_check values;
//   auto m = core.check_message(head, payload, limits, rank, reply_unchecked, values);
//   if (!m) refuse(m.error());                   // nothing changed
//   else core.commit(commit_in_of(m->header, ...) /* .values_checked = values.all_finite() */, now, out);
//
// Definitions of server_core's members, out of the class so that
// rules/server_core.hpp reads as the rules' outline; docs/ps.md "The check
// and the apply in one pass"; docs/perf/ps-passes.md.
#pragma once

#include <ashl/rules/server_core.hpp>

ASHL_NAMESPACE_BEGIN
namespace ps {

template <sync::consistency_policy Policy>
inline result<wire::message_view> server_core<Policy>::check_message(std::span<const std::byte> head,
                                                                     std::span<const std::byte> payload,
                                                                     const wire::limits& lim, worker_id from,
                                                                     bool reply_unchecked, dense_value_check& values) {
  fused_.dead = true;  // an earlier message's pass that commit() never claimed ends here
  bool started = false, fusing = false;
  std::size_t seen = 0, per = 1;
  auto m = wire::decode(head, payload, lim, [&](const wire::header& raw, std::span<const std::byte> chunk) {
    if (!started) {
      started = true;
      if (raw.kind != wire::message_kind::commit) return;
      if (!p_.allow_non_finite) {
        // A commit part: its own elements (the split its header names).
        const std::uint64_t n = (raw.flags & wire::flag_part) != 0
                                    ? wire::part_elements(raw.element_count, raw.parts, raw.part).count
                                    : raw.element_count;
        values = dense_value_check(raw.codec, raw.type, n, payload.size());
      }
      fusing = fuse_start(raw, from, payload, reply_unchecked);
      if (fusing) per = payload.size() / w_.size();
    }
    values(chunk);
    if (!fusing) return;
    // The chunk the CRC and the finite scan just read, added while it is
    // in cache (decode's chunks are whole apply chunks: 192 KiB).
    seen += chunk.size();
    fused_.landed = std::min(seen / per, w_.size());
    speculate_to(fused_, grid_floor(fused_.landed));
  });
  if (!m || (fusing && fused_.done != w_.size())) fused_.dead = true;  // discarded: nothing else changed
  return m;
}

// Whether check_message computes this commit's apply in its pass, and if
// so its spare set up: a whole dense model-delta commit of a live rank,
// not a duplicate, whose last commit was applied at once, without batched
// applies, where params().fuse_checks says (beside a pinned version, or
// always). raw is the header as read, not yet checked: anything it claims
// that is wrong makes decode or commit() refuse the message, and the spare
// goes with it.
template <sync::consistency_policy Policy>
inline bool server_core<Policy>::fuse_start(const wire::header& raw, worker_id from, std::span<const std::byte> payload,
                                            bool reply_unchecked) {
  const std::size_t n = w_.size();
  if (p_.fuse_checks == fused_apply::off || n == 0 || !opt_.adds_deltas()) return false;
  if (p_.fuse_checks == fused_apply::beside && w_readers_ == 0) return false;  // the apply would be in place
  // Batched applies (defer_dense_applies): the batch's one pass serves its
  // commits, and their replies leave with it; fusing one would cut it.
  if (!pending_.empty()) return false;
  if ((raw.flags & wire::flag_part) != 0 || raw.element_count != n || pending_n_ > 0) return false;
  if (raw.type != dtype::f32 && raw.type != dtype::f16 && raw.type != dtype::bf16) return false;
  if (static_cast<int>(raw.codec) >= codec_id_count) return false;
  const std::size_t dense = compress::dense_payload_bytes(raw.codec, {n, raw.type});
  if (dense == 0 || dense != payload.size() || payload.size() % n != 0 ||
      payload.size() > p_.limits.max_payload_bytes)
    return false;
  if (from >= table_.size() || raw.rank != from) return false;
  const worker_entry& e = table_[from];
  if (!e.live || raw.sequence <= e.last_sequence || !e.applied_at_once) return false;
  commit_in c = commit_in_of(raw, from, e.incarnation, payload, 0);
  c.reply_unchecked = reply_unchecked;
  fused_.start(c, e.last_weight, w_changes_);
  if (fused_.values.size() != n) fused_.values.resize(n);  // once: then it cycles with the version buffers
  const std::size_t ranges = std::max<std::uint32_t>(checksum_parts_, 1);
  if (fused_.crcs.size() != ranges) fused_.crcs.assign(ranges, 0u);
  return true;
}

// True when check_message's pass computed c's apply (c as it checked it:
// the same rank, incarnation, sequence, codec and payload bytes) in full;
// it ends here, whatever commit() decides.
template <sync::consistency_policy Policy>
inline bool server_core<Policy>::claim_fused(const commit_in& c) noexcept {
  if (fused_.dead || !fused_.owns(c)) return false;
  fused_.dead = true;
  return fused_.done == w_.size();
}

// commit()'s apply of the claimed fused pass's commit at `weight`: the
// spare becomes the parameters (the pinned version keeps its storage).
// False, nothing changed, when the parameters changed since the pass or
// the policy weighs the commit otherwise.
template <sync::consistency_policy Policy>
inline bool server_core<Policy>::take_fused(double weight) {
  if (!publish_speculation(fused_, weight)) return false;
  ++fused_applies_;
  return true;
}

}  // namespace ps
ASHL_NAMESPACE_END
