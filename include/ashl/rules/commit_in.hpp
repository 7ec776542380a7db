// ashl/rules/commit_in.hpp — the commit a server core is given, built from a
// commit's header in one place for every driver, and the rule for the pull
// riding with it: a push (ps::worker::push) asks for an acknowledgement
// instead of the parameters.
//
//   wire::header h{.kind = wire::message_kind::commit, .flags = ashl::ps::commit_flags(true, push),
//                  .sequence = seq, .clock = clock, .samples = samples};
//   ashl::ps::commit_in c = ashl::ps::commit_in_of(h, worker, incarnation, payload, wire_bytes);
//   core.commit(c, now, out);      // c.pull, c.ack_only as the worker asked
//
// The worker sets the flags (ps/worker_send.hpp), the real server reads them
// off the wire (ps/server_receive.hpp), and the simulator builds the header
// its worker would send (sim/simulator.hpp), so the three agree by
// construction. docs/ps.md "Servers and workers"; docs/design.md "Data flow
// of one commit".
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/sync/events.hpp>
#include <ashl/wire/ids.hpp>
#include <ashl/wire/message.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

ASHL_NAMESPACE_BEGIN
namespace ps {

using sync::worker_id;

// One commit shard, as decoded from a wire commit message.
struct commit_in {
  worker_id worker = 0;
  std::uint64_t incarnation = 0;
  std::uint64_t sequence = 0;  // the worker's, 1, 2, ... per incarnation
  std::uint64_t clock = 0;
  std::uint64_t samples = 0;
  std::uint64_t bytes = 0;     // bytes on the wire (for the policy)
  codec_id codec = codec_id::identity;
  dtype type = dtype::f32;
  std::uint64_t element_count = 0;
  std::uint64_t step = 0;      // codec_context.step
  std::uint32_t tensor = 0;    // codec_context.tensor
  std::span<const std::byte> payload{};  // not kept: copied into the store if buffered
  bool pull = false;                     // a pull rides with the commit
  // That pull is a push's (ps::worker::push): the driver answers it with an
  // acknowledgement, not the parameters, so a dense apply skips the new
  // version's CRC (computed when a reply first pins the version).
  bool ack_only = false;
  // The reply to that pull goes without a CRC (a lane the driver trusts:
  // wire flag `unchecked`, trust_local_lanes), so the apply computes none
  // either; a later reply that needs one computes it when it pins.
  bool reply_unchecked = false;
  // The driver ran a dense_value_check over this payload (in its CRC pass:
  // wire::decode's visitor) and it found every value finite: validate()
  // skips its own pass over the values. False: validate() checks (and names
  // the first non-finite element).
  bool values_checked = false;
  // The driver keeps the payload's bytes where they are, unchanged, until
  // it calls server_core::apply_pending() (ps::server: a receive buffer or
  // a commit's staging it holds for a batch). With defer_dense_applies(k),
  // an applied dense model-delta commit may then wait for that call and be
  // added in one pass with the others waiting. False:
  // the payload is read before commit() returns.
  bool payload_kept = false;
};

// Whether the apply of commit c computes the new version's CRC in its pass:
// a reply of the parameters rides with it and is checksummed.
constexpr bool wants_reply_crc(const commit_in& c) noexcept { return c.pull && !c.ack_only && !c.reply_unchecked; }

// The header flags of a commit: `pull`, a pull rides with it; `push`, that
// pull is answered with a header-only acknowledgement, not the parameters.
constexpr std::uint32_t commit_flags(bool pull, bool push) noexcept {
  return (pull ? wire::flag_pull : 0u) | (pull && push ? wire::flag_ack_requested : 0u);
}

// Whether the pull riding with a commit of these flags is a push's.
constexpr bool pull_acknowledged(std::uint32_t flags) noexcept {
  constexpr std::uint32_t both = wire::flag_pull | wire::flag_ack_requested;
  return (flags & both) == both;
}

// The commit server_core gets from shard header h, sent by worker w in
// `incarnation`, with its payload and the bytes it took on the wire. The
// driver's own facts (values_checked, payload_kept) stay false: the driver
// sets them.
constexpr commit_in commit_in_of(const wire::header& h, worker_id w, std::uint64_t incarnation,
                                 std::span<const std::byte> payload, std::uint64_t wire_bytes) noexcept {
  return commit_in{.worker = w,
                   .incarnation = incarnation,
                   .sequence = h.sequence,
                   .clock = h.clock,
                   .samples = h.samples,
                   .bytes = wire_bytes,
                   .codec = h.codec,
                   .type = h.type,
                   .element_count = h.element_count,
                   .step = h.step,
                   .tensor = h.tensor,
                   .payload = payload,
                   .pull = (h.flags & wire::flag_pull) != 0,
                   .ack_only = pull_acknowledged(h.flags)};
}

}  // namespace ps
ASHL_NAMESPACE_END
