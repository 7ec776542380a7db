// ashl/wire/header.hpp — the fixed 72-byte header every message starts
// with: magic, version, kinds, flags, the parts of a message sent in
// parts, and the limits a decoder enforces. wire/message.hpp encodes and
// decodes whole messages with it; docs/wire-format.md, byte by byte.
//
//   #include <ashl/wire/message.hpp>   // includes this
//   ashl::wire::header h{.kind = ashl::wire::message_kind::commit, ...};
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/enum_table.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>
#include <ashl/wire/crc32c.hpp>
#include <ashl/wire/ids.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <ostream>
#include <sstream>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <variant>

ASHL_NAMESPACE_BEGIN
namespace wire {

// "ASHL" in the first four bytes.
inline constexpr std::uint32_t magic = 0x4C485341u;
// Version 2: the plan_update body is ashl::worker_plan (batch 0 keeps the
// worker's own, local_iterations 0 commits by interval, stage is a stage_id)
// and the measurements kind exists. Version 3: the join body carries the
// job id (20 bytes), and a commit's header carries the samples its update
// covers (the u32 at offset 64, reserved before; 0 in every other kind), so
// the server no longer rebuilds them from header.step. An older peer is
// refused by version. Version 4: a pull_reply may come in parts (flag
// `part`; the u32 at offset 64 then holds the part's index and the count of
// parts, see part_elements), each part checksummed on its own. Version 5:
// a dense commit may come in parts too (flag `part`; its offset 64 keeps
// the samples, so the part's index and the count of parts sit in the
// flags word's upper half, see commit_part_shift). Version 6 (elastic jobs,
// docs/elastic.md §3.4 and §4.2): the join body grows to 36 bytes (the
// worker's model size, flags with `failover`, the replication term it
// knows) and the kinds lease, replicate, replica_ack, replica_hello and
// shard_state exist; one bump for all of them, so an old peer is refused
// once, by version.
inline constexpr std::uint16_t version = 6;
inline constexpr std::size_t header_bytes = 72;
// The CRC field sits at the end of the header and covers everything before it
// plus the payload.
inline constexpr std::size_t crc_offset = 68;

// Wire values: never renumber, only append.
enum class message_kind : std::uint8_t {
  commit = 1,        // worker -> server: one encoded update of a tensor (shard)
  pull_request = 2,  // worker -> server: send me tensor `tensor`
  pull_reply = 3,    // server -> worker: parameters, dense (identity) or compressed
  join = 4,          // worker -> server: I am (re)joining
  leave = 5,         // either way: a worker leaves or is evicted
  plan_update = 6,   // server -> worker: the worker's new plan
  metric = 7,        // worker -> server: a named scalar (loss, accuracy, ...)
  error = 8,         // either way: the message with sequence `in_reply_to` was refused
  measurements = 9,  // worker -> server: timing measurements of worker `rank`
  // Version 6 (docs/elastic.md):
  lease = 10,          // server 0 -> worker: positions [begin, end) of an epoch (the data ledger, §3)
  replicate = 11,      // primary -> backup: one record of the core's events, or a piece of it (§4.2)
  replica_ack = 12,    // backup -> primary: the records it holds and has applied
  replica_hello = 13,  // backup -> primary: who it is and what it holds
  shard_state = 14,    // server -> worker: the shard's replication term and whether a backup replicates it
};
inline constexpr auto message_kind_table =
    make_enum_table_from<message_kind>(1, "?", "commit", "pull_request", "pull_reply", "join", "leave", "plan_update",
                                       "metric", "error", "measurements", "lease", "replicate", "replica_ack",
                                       "replica_hello", "shard_state");
static_assert(message_kind_table.name(message_kind::shard_state) == "shard_state",
              "message_kind_table ends where message_kind does");
inline constexpr std::uint8_t message_kind_first = message_kind_table.first;
inline constexpr std::uint8_t message_kind_last = message_kind_table.first + message_kind_table.size() - 1;

constexpr std::string_view to_string(message_kind k) noexcept { return message_kind_table.name(k); }

constexpr bool is_control(message_kind k) noexcept { return static_cast<std::uint8_t>(k) >= 4; }

// Header flag bits. Bits not named here must be zero.
inline constexpr std::uint32_t flag_last_shard = 1u << 0;     // commit, pull_reply: final shard of the tensor
inline constexpr std::uint32_t flag_ack_requested = 1u << 1;  // any kind: the sender wants an acknowledgement
inline constexpr std::uint32_t flag_pull = 1u << 2;           // commit: a pull rides with it (no pull_request follows)
inline constexpr std::uint32_t flag_part = 1u << 3;           // pull_reply (v4), commit (v5): one part of a message sent in parts
// pull_reply: dense parameters the worker keeps as its view, the base of
// the compressed replies that follow (a codec other than identity; their
// header.sequence names the view's version). Only a server that
// compresses replies sets it (rules/reply_encoder.hpp); a version-5 peer
// from before it refuses it as an unknown flag.
inline constexpr std::uint32_t flag_view = 1u << 4;
// commit, pull_reply: the CRC field is 0 and checks nothing. A sender sets
// it only toward a peer its transport says runs on this host and only when
// told to trust such lanes (server_params / worker_params
// trust_local_lanes): shared memory or loopback, no wire to corrupt a bit.
// A receiver accepts it only from a peer its own transport places on this
// host with the same setting (limits::unchecked_allowed); anything else is
// refused by name. Every lane that crosses a wire keeps its end-to-end CRC.
inline constexpr std::uint32_t flag_unchecked = 1u << 5;
inline constexpr std::uint32_t flags_known =
    flag_last_shard | flag_ack_requested | flag_pull | flag_part | flag_view | flag_unchecked;
// A commit part (flag_part on a commit) carries its index in flags bits
// 16..23 and the count of parts in bits 24..31 (header.part, header.parts;
// at most max_commit_parts), because its u32 at offset 64 is the commit's
// samples. In every other message those bits are 0.
inline constexpr unsigned commit_part_shift = 16;
inline constexpr std::uint32_t max_commit_parts = 0xffu;
// Parts of one commit a receiver holds in flight at most (received into
// its staging, not yet checked); a sender's window is at most this
// (ps::worker_params.commit_window), a part beyond it is refused.
inline constexpr std::uint32_t max_parts_in_flight = 16;

// A message in parts (flag_part): part `part` of `parts` (2 <= parts <=
// max_parts, part < parts) carries elements [first, first + count) of the
// element_count the header names, with first = part * per and per =
// ceil(element_count / parts); every part holds at least one element
// (parts = ceil(element_count / per)). A pull_reply's offset 64 holds
// part | parts << 16; a commit's flags word holds them (commit_part_shift).
inline constexpr std::uint32_t max_parts = 0xffffu;
struct part_range {
  std::uint64_t first = 0, count = 0;
};
// The elements of part `part`, or count 0 when (element_count, parts, part)
// is not a valid split.
constexpr part_range part_elements(std::uint64_t element_count, std::uint32_t parts, std::uint32_t part) noexcept {
  if (parts < 2 || parts > max_parts || part >= parts || element_count < parts) return {};
  const std::uint64_t per = (element_count + parts - 1) / parts;
  if ((element_count + per - 1) / per != parts) return {};
  const std::uint64_t first = std::uint64_t{part} * per;
  return {first, std::min(per, element_count - first)};
}
// The number of parts a payload of element_count elements of elem_bytes
// bytes is sent in for a part size of about part_bytes (0: one message):
// 0 or 1 means not in parts. At most `most` parts (max_commit_parts for a
// commit): the parts grow instead.
constexpr std::uint32_t parts_for(std::uint64_t element_count, std::size_t elem_bytes, std::uint64_t part_bytes,
                                  std::uint32_t most = max_parts) noexcept {
  if (part_bytes == 0 || elem_bytes == 0 || element_count < 2) return 0;
  const std::uint64_t per_wanted = std::max<std::uint64_t>(1, part_bytes / elem_bytes);
  std::uint64_t parts = (element_count + per_wanted - 1) / per_wanted;
  if (parts < 2) return 0;
  parts = std::min<std::uint64_t>(parts, std::min(most, max_parts));
  if (parts < 2) return 0;
  const std::uint64_t per = (element_count + parts - 1) / parts;
  return static_cast<std::uint32_t>((element_count + per - 1) / per);
}

// What a receiver accepts. A server sets these from its tensors' sizes.
struct limits {
  std::uint64_t max_elements = std::uint64_t{1} << 32;
  std::uint64_t max_payload_bytes = std::uint64_t{1} << 30;
  std::uint32_t max_error_text = 4096;
  std::uint32_t max_measurements = 1024;  // records in one measurements message
  // A message flagged `unchecked` (no CRC) is taken: set by a receiver per
  // message, for a sender on this host it trusts (flag_unchecked). Not
  // part of a saved state.
  bool unchecked_allowed = false;
  // In this order in a saved server state (core/state_io.hpp).
  static constexpr auto fields() {
    return std::tuple{field{"max_elements", &limits::max_elements},
                      field{"max_payload_bytes", &limits::max_payload_bytes},
                      field{"max_error_text", &limits::max_error_text},
                      field{"max_measurements", &limits::max_measurements}};
  }
};

// Header fields a sender chooses; magic, version, lengths and CRC are derived.
struct header {
  message_kind kind = message_kind::commit;
  codec_id codec = codec_id::identity;
  dtype type = dtype::f32;
  std::uint32_t flags = 0;
  std::uint64_t element_count = 0;
  std::uint32_t tensor = 0;  // tensor (shard) id
  std::uint32_t rank = 0;    // worker rank the message is from or about
  std::uint64_t sequence = 0;
  std::uint64_t clock = 0;   // sender's logical clock (worker iteration / server version)
  std::uint64_t step = 0;    // training step; with seed and tensor it selects the Philox stream
  std::uint32_t samples = 0; // commit: the samples its update covers (iterations x batch); 0 in other kinds
  std::uint16_t part = 0;     // flag_part: this part's index, and
  std::uint16_t parts = 0;    // the number of parts (0 and 0 without the flag; offset 64 as samples is)
  friend constexpr bool operator==(const header&, const header&) = default;
};

}  // namespace wire
ASHL_NAMESPACE_END
