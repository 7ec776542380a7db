// ashl/rules/core_events.hpp — the calls a driver makes on a server_core, as
// records: each one a value (core_event), its bytes (a fixed 120-byte prefix,
// then a commit's payload), and replay(), which makes the same call on another
// core. A backup fed the primary's records in order holds the primary's state
// bit for bit (docs/elastic.md §4.1: what is replicated is the core's events,
// not deltas); a log of records replays a run into one fresh core.
//
//   std::vector<std::byte> bytes;                                  // reused across records
//   auto primary = ashl::ps::recorded_core(core, [&](const ashl::ps::core_event& e) {
//     ashl::ps::encode_core_event(e, bytes);                       // send or log `bytes`
//   });
//   primary.commit(c, now, out);                                   // recorded, then core.commit(c, now, out)
//   ...                                                            // on the backup:
//   ashl::ps::core_event e;
//   if (auto s = ashl::ps::decode_core_event(bytes, e); !s) return s;  // names the bad field; nothing replayed
//   ashl::ps::replay(backup, e, actions);                          // backup.commit(e.commit, e.now, actions)
//
// Which calls are records. Every server_core call that can change what
// save() writes (parameters, optimizer, the exactly-once table, buffered
// commits, counters, the policy, the data ledger): join, leave, evict,
// commit, pull, metric, measurement (one record each; a measurements message
// is one call per measurement), drain and tick (the data ledger's clock). A refused call is recorded too: its refusal
// counter is part of the state. Why these suffice: server_core is pure
// (docs/design.md "The one rule"): it reads no clock (the driver's time is
// the record's `now`; a measurement carries its own time), no randomness but
// its params' seed and a commit's step and tensor (recorded), and its
// outcome depends only on its state and the call's arguments. So two cores
// created alike (the same server_core_params but the driver's choices below,
// the same policy, the same initial values; or the second loaded from the
// first's save()) and given the same records in the same order save the same
// bytes. test/rules/core_events.cpp checks it for every policy of
// rules/policies.hpp.
//
// What is not a record, and why:
// - The driver's choices, which change how fast a pass runs or what a reply
//   costs but never the state (each is proven bit-identical by its own test):
//   use_apply_pool, defer_dense_applies and apply_pending, speculate and
//   forget_speculation, checksum_in_parts, pin_parameters and
//   unpin_parameters, serve_reply (the reply encoder's views are not saved;
//   a worker rejoining after a takeover starts dense), serve_staleness. Two
//   of commit_in's fields are driver facts: payload_kept (the replaying
//   driver's buffers are its own) and values_checked (the primary's check
//   of the payload's values; the replaying core checks them itself, with the
//   same outcome). A record clears both.
// - create and load: a backup starts from the same creation or from a
//   snapshot (save() bytes, docs/elastic.md §4.2), then records.
// - A driver's own refusals before the core (wire checks, a rank beyond the
//   job, a job id): they change nothing in the core.
// - tick is a record (kind 9): with a data ledger it gives back the leases
//   of workers evicted give_back_after ago; without one it changes nothing
//   (a driver may still record it).
//
// The bytes (little-endian; docs/elastic.md §4.2):
//
//   offset size field          used by
//        0    4 magic "ACEV"
//        4    2 version (1)
//        6    1 kind           1 join, 2 leave, 3 evict, 4 commit, 5 pull, 6 metric, 7 measurement, 8 drain, 9 tick
//        7    1 flags          commit: bit 0 pull, bit 1 ack_only, bit 2 reply_unchecked
//        8    8 now f64        all but drain (measurement: its time)
//       16    4 worker u32     join leave evict commit pull measurement
//       20    4 tensor u32     commit
//       24    8 incarnation    join commit
//       32    8 sequence       commit (the worker's)
//       40    8 clock          commit
//       48    8 samples        commit; join (its batch: the data ledger's lease size)
//       56    8 bytes          commit (its bytes on the wire)
//       64    8 elements       commit
//       72    8 step           commit
//       80    1 codec          commit (any value: the core refuses what it cannot decode, as it did on the primary)
//       81    1 dtype          commit (the same)
//       82    1 measure        measurement (its kind; the same)
//       83    1 reserved (0)
//       84    4 metric u32     metric (its id)
//       88    8 value f64      metric (its value), measurement (its seconds)
//       96    8 amount f64     measurement
//      104    8 payload_bytes  commit
//      112    4 payload_crc    CRC-32C of the payload (0 without one)
//      116    4 prefix_crc     CRC-32C of bytes 0..115
//      120      payload
//
// decode_core_event() checks the framing only: magic, version, kind, flags a
// kind does not use, every field a kind does not use (0), the length, both
// CRCs; an error names the field and its value, and nothing is replayed. It
// does not judge the call's arguments (an unknown codec, a NaN loss, a stale
// incarnation): the core does, when the record replays, exactly as it did on
// the primary. No allocation per record once the caller's byte buffer has
// grown to the largest record: encode writes into it, decode returns views
// into the bytes it was given (a commit's payload is not copied).
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/enum_table.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>
#include <ashl/rules/commit_in.hpp>
#include <ashl/rules/server_core_vocabulary.hpp>
#include <ashl/wire/bodies.hpp>
#include <ashl/wire/crc32c.hpp>
#include <ashl/wire/ids.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

// One value per server_core call that changes its state. 0 is kept for the
// snapshot record of docs/elastic.md §4.2 (not a core call).
enum class core_event_kind : std::uint8_t {
  join = 1,
  leave = 2,
  evict = 3,
  commit = 4,
  pull = 5,
  metric = 6,
  measurement = 7,
  drain = 8,
  tick = 9,
};
inline constexpr auto core_event_kind_table = make_enum_table_from<core_event_kind>(
    1, "?", "join", "leave", "evict", "commit", "pull", "metric", "measurement", "drain", "tick");
static_assert(core_event_kind_table.name(core_event_kind::tick) == "tick",
              "core_event_kind_table ends where core_event_kind does");

constexpr std::string_view to_string(core_event_kind k) noexcept { return core_event_kind_table.name(k); }

// One recorded call: its kind and its arguments. Build one with the of_*
// functions (they set exactly the fields the kind uses); a decoded one has
// its commit's payload as a view into the decoded bytes.
struct core_event {
  core_event_kind kind = core_event_kind::drain;
  double now = 0.0;             // the driver's time passed to the call
  worker_id worker = 0;         // join, leave, evict, pull; a commit's and a measurement's too
  std::uint64_t incarnation = 0;  // join
  std::uint32_t batch = 0;        // join (server_core::join's batch)
  commit_in commit{};           // commit (payload_kept and values_checked false)
  metric_id metric = metric_id::loss;  // metric
  double value = 0.0;                  // metric
  ashl::measurement measurement{};     // measurement (its time is `now`)

  static core_event of_join(worker_id w, std::uint64_t incarnation, double now, std::uint32_t batch = 0) noexcept {
    core_event e;
    e.kind = core_event_kind::join;
    e.worker = w;
    e.incarnation = incarnation;
    e.batch = batch;
    e.now = now;
    return e;
  }
  static core_event of_leave(worker_id w, double now) noexcept { return of_worker(core_event_kind::leave, w, now); }
  static core_event of_evict(worker_id w, double now) noexcept { return of_worker(core_event_kind::evict, w, now); }
  static core_event of_pull(worker_id w, double now) noexcept { return of_worker(core_event_kind::pull, w, now); }
  static core_event of_commit(const commit_in& c, double now) noexcept {
    core_event e;
    e.kind = core_event_kind::commit;
    e.worker = c.worker;
    e.incarnation = c.incarnation;
    e.commit = c;
    e.commit.payload_kept = false;    // the replaying driver's buffers are its own
    e.commit.values_checked = false;  // the replaying core checks the values itself
    e.now = now;
    return e;
  }
  static core_event of_metric(metric_id m, double value, double now) noexcept {
    core_event e;
    e.kind = core_event_kind::metric;
    e.metric = m;
    e.value = value;
    e.now = now;
    return e;
  }
  static core_event of_measurement(const ashl::measurement& m) noexcept {
    core_event e;
    e.kind = core_event_kind::measurement;
    e.worker = m.worker;
    e.measurement = m;
    e.now = m.time;
    return e;
  }
  static core_event of_drain() noexcept { return core_event{}; }
  static core_event of_tick(double now) noexcept {
    core_event e;
    e.kind = core_event_kind::tick;
    e.now = now;
    return e;
  }

 private:
  static core_event of_worker(core_event_kind k, worker_id w, double now) noexcept {
    core_event e;
    e.kind = k;
    e.worker = w;
    e.now = now;
    return e;
  }
};

// The record's bytes: the prefix, then a commit's payload.
inline constexpr std::uint32_t core_event_magic = 0x56454341u;  // "ACEV" read little-endian
inline constexpr std::uint16_t core_event_version = 1;
inline constexpr std::size_t core_event_prefix_bytes = 120;

// A wire replicate message carries these records as they are (wire
// version 6, docs/elastic.md §4.2); the wire checks where one starts by
// these numbers, so they must agree.
static_assert(wire::core_event_record_magic == core_event_magic && wire::core_event_record_prefix_bytes == core_event_prefix_bytes &&
                  wire::core_event_record_kind_offset == 6,
              "wire/bodies.hpp's view of the record's framing disagrees with this file's");
static_assert(static_cast<int>(wire::replica_event::join) == static_cast<int>(core_event_kind::join) &&
                  static_cast<int>(wire::replica_event::leave) == static_cast<int>(core_event_kind::leave) &&
                  static_cast<int>(wire::replica_event::evict) == static_cast<int>(core_event_kind::evict) &&
                  static_cast<int>(wire::replica_event::commit) == static_cast<int>(core_event_kind::commit) &&
                  static_cast<int>(wire::replica_event::pull) == static_cast<int>(core_event_kind::pull) &&
                  static_cast<int>(wire::replica_event::metric) == static_cast<int>(core_event_kind::metric) &&
                  static_cast<int>(wire::replica_event::measurement) == static_cast<int>(core_event_kind::measurement) &&
                  static_cast<int>(wire::replica_event::drain) == static_cast<int>(core_event_kind::drain) &&
                  static_cast<int>(wire::replica_event::tick) == static_cast<int>(core_event_kind::tick),
              "a replicate message's event is its record's kind");

[[nodiscard]] inline std::span<const std::byte> core_event_payload(const core_event& e) noexcept {
  return e.kind == core_event_kind::commit ? e.commit.payload : std::span<const std::byte>{};
}

[[nodiscard]] inline std::size_t core_event_bytes(const core_event& e) noexcept {
  return core_event_prefix_bytes + core_event_payload(e).size();
}

namespace detail {

inline constexpr std::uint8_t core_event_commit_flags = 0x7;  // pull, ack_only, reply_unchecked

// The prefix's fields as written: each kind's own, the others 0.
struct core_event_fields {
  std::uint8_t kind = 0, flags = 0;
  double now = 0.0;
  std::uint32_t worker = 0, tensor = 0;
  std::uint64_t incarnation = 0, sequence = 0, clock = 0, samples = 0, bytes = 0, elements = 0, step = 0;
  std::uint8_t codec = 0, type = 0, measure = 0, reserved = 0;
  std::uint32_t metric = 0;
  double value = 0.0, amount = 0.0;
  std::uint64_t payload_bytes = 0;
};

inline core_event_fields core_event_fields_of(const core_event& e) noexcept {
  core_event_fields f;
  f.kind = static_cast<std::uint8_t>(e.kind);
  switch (e.kind) {
    case core_event_kind::join:
      f.now = e.now;
      f.worker = e.worker;
      f.incarnation = e.incarnation;
      f.samples = e.batch;
      break;
    case core_event_kind::tick:
      f.now = e.now;
      break;
    case core_event_kind::leave:
    case core_event_kind::evict:
    case core_event_kind::pull:
      f.now = e.now;
      f.worker = e.worker;
      break;
    case core_event_kind::commit: {
      const commit_in& c = e.commit;
      f.flags = static_cast<std::uint8_t>((c.pull ? 1u : 0u) | (c.ack_only ? 2u : 0u) | (c.reply_unchecked ? 4u : 0u));
      f.now = e.now;
      f.worker = c.worker;
      f.tensor = c.tensor;
      f.incarnation = c.incarnation;
      f.sequence = c.sequence;
      f.clock = c.clock;
      f.samples = c.samples;
      f.bytes = c.bytes;
      f.elements = c.element_count;
      f.step = c.step;
      f.codec = static_cast<std::uint8_t>(c.codec);
      f.type = static_cast<std::uint8_t>(c.type);
      f.payload_bytes = c.payload.size();
      break;
    }
    case core_event_kind::metric:
      f.now = e.now;
      f.metric = static_cast<std::uint32_t>(e.metric);
      f.value = e.value;
      break;
    case core_event_kind::measurement:
      f.now = e.measurement.time;
      f.worker = e.measurement.worker;
      f.measure = static_cast<std::uint8_t>(e.measurement.kind);
      f.value = e.measurement.seconds;
      f.amount = e.measurement.amount;
      break;
    case core_event_kind::drain:
      break;
  }
  return f;
}

// The kinds that use a field, as a bit set (bit k: kind k).
constexpr std::uint32_t core_event_kinds(std::initializer_list<core_event_kind> ks) noexcept {
  std::uint32_t m = 0;
  for (auto k : ks) m |= 1u << static_cast<unsigned>(k);
  return m;
}

// A field that `kind` does not use (its bit not in `uses`) must be 0, all
// its bits (-0.0 too): anything else is corruption or another writer.
template <class T>
status core_event_unused_zero(std::uint8_t kind, std::uint32_t uses, std::string_view field, T v) {
  if ((uses >> kind & 1u) != 0) return {};
  T zero{};
  if (std::memcmp(&v, &zero, sizeof(T)) == 0) return {};
  if constexpr (std::is_floating_point_v<T>) {
    std::uint64_t bits = 0;
    static_assert(sizeof(T) == sizeof(bits));
    std::memcpy(&bits, &v, sizeof(bits));
    return malformed(field, bits,
                     std::string("bits of a field a ") +
                         std::string(core_event_kind_table.name(static_cast<core_event_kind>(kind))) +
                         " record does not use (must be 0; a corrupt or foreign record)");
  } else {
    return malformed(field, static_cast<std::uint64_t>(v),
                     std::string("a field a ") +
                         std::string(core_event_kind_table.name(static_cast<core_event_kind>(kind))) +
                         " record does not use (must be 0; a corrupt or foreign record)");
  }
}

}  // namespace detail

// Writes e's prefix into out (core_event_prefix_bytes): with the payload
// sent or logged from where it lies, the record is this prefix and that
// payload, no copy.
inline void encode_core_event_prefix(const core_event& e, std::span<std::byte, core_event_prefix_bytes> out) noexcept {
  const detail::core_event_fields f = detail::core_event_fields_of(e);
  const std::span<const std::byte> payload = core_event_payload(e);
  byte_writer w(out);
  w.put(core_event_magic);
  w.put<std::uint16_t>(core_event_version);
  w.put(f.kind);
  w.put(f.flags);
  w.put(f.now);
  w.put(f.worker);
  w.put(f.tensor);
  w.put(f.incarnation);
  w.put(f.sequence);
  w.put(f.clock);
  w.put(f.samples);
  w.put(f.bytes);
  w.put(f.elements);
  w.put(f.step);
  w.put(f.codec);
  w.put(f.type);
  w.put(f.measure);
  w.put(f.reserved);
  w.put(f.metric);
  w.put(f.value);
  w.put(f.amount);
  w.put(f.payload_bytes);
  w.put(wire::crc32c(payload));
  w.put(wire::crc32c(w.written()));
  ASHL_ASSERT(w.ok() && w.position() == core_event_prefix_bytes, "core_event: the prefix is 120 bytes");
}

// The whole record into `out` (resized to core_event_bytes(e); its capacity
// is reused, so once it held the largest record nothing allocates).
inline void encode_core_event(const core_event& e, std::vector<std::byte>& out) {
  const std::span<const std::byte> payload = core_event_payload(e);
  out.resize(core_event_prefix_bytes + payload.size());
  encode_core_event_prefix(e, std::span<std::byte, core_event_prefix_bytes>(out.data(), core_event_prefix_bytes));
  if (!payload.empty()) std::memcpy(out.data() + core_event_prefix_bytes, payload.data(), payload.size());
}

// Reads one record; on success `out` is the call (a commit's payload a view
// into `bytes`, valid while they are). On failure `out` is unchanged and the
// status names the field and its value.
inline status decode_core_event(std::span<const std::byte> bytes, core_event& out) {
  using detail::core_event_unused_zero;
  using K = core_event_kind;
  constexpr auto kinds = [](std::initializer_list<K> ks) constexpr { return detail::core_event_kinds(ks); };
  if (bytes.size() < core_event_prefix_bytes)
    return malformed("core_event.size", bytes.size(),
                     "shorter than the record's " + std::to_string(core_event_prefix_bytes) + "-byte prefix");
  byte_reader r(bytes);
  std::uint32_t magic = 0;
  ASHL_TRY(r.get(magic, "core_event.magic"));
  if (magic != core_event_magic)
    return malformed("core_event.magic", magic,
                     "not a core event record (\"ACEV\", " + std::to_string(core_event_magic) + ")");
  std::uint16_t version = 0;
  ASHL_TRY(r.get(version, "core_event.version"));
  if (version != core_event_version)
    return make_error(errc::unsupported, "core_event.version", version,
                      "this build reads version " + std::to_string(core_event_version));
  detail::core_event_fields f;
  std::uint32_t payload_crc = 0, prefix_crc = 0;
  ASHL_TRY(r.get(f.kind, "core_event.kind"));
  ASHL_TRY(r.get(f.flags, "core_event.flags"));
  ASHL_TRY(r.get(f.now, "core_event.now"));
  ASHL_TRY(r.get(f.worker, "core_event.worker"));
  ASHL_TRY(r.get(f.tensor, "core_event.tensor"));
  ASHL_TRY(r.get(f.incarnation, "core_event.incarnation"));
  ASHL_TRY(r.get(f.sequence, "core_event.sequence"));
  ASHL_TRY(r.get(f.clock, "core_event.clock"));
  ASHL_TRY(r.get(f.samples, "core_event.samples"));
  ASHL_TRY(r.get(f.bytes, "core_event.bytes"));
  ASHL_TRY(r.get(f.elements, "core_event.elements"));
  ASHL_TRY(r.get(f.step, "core_event.step"));
  ASHL_TRY(r.get(f.codec, "core_event.codec"));
  ASHL_TRY(r.get(f.type, "core_event.dtype"));
  ASHL_TRY(r.get(f.measure, "core_event.measure"));
  ASHL_TRY(r.get(f.reserved, "core_event.reserved"));
  ASHL_TRY(r.get(f.metric, "core_event.metric"));
  ASHL_TRY(r.get(f.value, "core_event.value"));
  ASHL_TRY(r.get(f.amount, "core_event.amount"));
  ASHL_TRY(r.get(f.payload_bytes, "core_event.payload_bytes"));
  ASHL_TRY(r.get(payload_crc, "core_event.payload_crc"));
  const std::uint32_t computed_prefix_crc = wire::crc32c(bytes.first(r.position()));
  ASHL_TRY(r.get(prefix_crc, "core_event.prefix_crc"));
  // The CRC first: a flipped bit anywhere in the prefix is named as what it
  // is (corruption) rather than as whichever field it happened to hit.
  if (prefix_crc != computed_prefix_crc)
    return make_error(errc::checksum_mismatch, "core_event.prefix_crc", prefix_crc,
                      "the record's first 116 bytes have CRC-32C " + std::to_string(computed_prefix_crc) +
                          " (a corrupt record)");
  if (!core_event_kind_table.from_value(f.kind))
    return malformed("core_event.kind", f.kind,
                     f.kind == 0 ? "a snapshot, not a core call (docs/elastic.md §4.2)"
                                 : "not a server_core call (1..9: join leave evict commit pull metric "
                                   "measurement drain tick)");
  const std::uint32_t flags_ok = f.kind == static_cast<std::uint8_t>(K::commit) ? detail::core_event_commit_flags : 0u;
  if ((f.flags & ~flags_ok) != 0)
    return malformed("core_event.flags", f.flags,
                     std::string("bits a ") + std::string(to_string(static_cast<K>(f.kind))) +
                         " record does not use (commit: 1 pull, 2 ack_only, 4 reply_unchecked)");
  const std::uint8_t k = f.kind;
  ASHL_TRY(core_event_unused_zero(k, ~kinds({K::drain}), "core_event.now", f.now));
  ASHL_TRY(core_event_unused_zero(k, kinds({K::join, K::leave, K::evict, K::commit, K::pull, K::measurement}),
                                  "core_event.worker", f.worker));
  constexpr std::uint32_t commit_only = kinds({K::commit});
  ASHL_TRY(core_event_unused_zero(k, commit_only, "core_event.tensor", f.tensor));
  ASHL_TRY(core_event_unused_zero(k, kinds({K::join, K::commit}), "core_event.incarnation", f.incarnation));
  ASHL_TRY(core_event_unused_zero(k, commit_only, "core_event.sequence", f.sequence));
  ASHL_TRY(core_event_unused_zero(k, commit_only, "core_event.clock", f.clock));
  ASHL_TRY(core_event_unused_zero(k, kinds({K::join, K::commit}), "core_event.samples", f.samples));
  if (k == static_cast<std::uint8_t>(K::join) && f.samples > 0xffffffffu)
    return malformed("core_event.samples", f.samples, "a join's batch is a u32");
  ASHL_TRY(core_event_unused_zero(k, commit_only, "core_event.bytes", f.bytes));
  ASHL_TRY(core_event_unused_zero(k, commit_only, "core_event.elements", f.elements));
  ASHL_TRY(core_event_unused_zero(k, commit_only, "core_event.step", f.step));
  ASHL_TRY(core_event_unused_zero(k, commit_only, "core_event.codec", f.codec));
  ASHL_TRY(core_event_unused_zero(k, commit_only, "core_event.dtype", f.type));
  ASHL_TRY(core_event_unused_zero(k, kinds({K::measurement}), "core_event.measure", f.measure));
  ASHL_TRY(core_event_unused_zero(k, 0u, "core_event.reserved", f.reserved));
  ASHL_TRY(core_event_unused_zero(k, kinds({K::metric}), "core_event.metric", f.metric));
  ASHL_TRY(core_event_unused_zero(k, kinds({K::metric, K::measurement}), "core_event.value", f.value));
  ASHL_TRY(core_event_unused_zero(k, kinds({K::measurement}), "core_event.amount", f.amount));
  ASHL_TRY(core_event_unused_zero(k, commit_only, "core_event.payload_bytes", f.payload_bytes));
  if (f.payload_bytes != r.remaining())
    return malformed("core_event.payload_bytes", f.payload_bytes,
                     std::to_string(r.remaining()) + " bytes follow the prefix (a truncated or overlong record)");
  const std::span<const std::byte> payload = r.rest();
  if (const std::uint32_t c = wire::crc32c(payload); c != payload_crc)
    return make_error(errc::checksum_mismatch, "core_event.payload_crc", payload_crc,
                      "the " + std::to_string(payload.size()) + " payload bytes have CRC-32C " + std::to_string(c) +
                          " (a corrupt record)");

  core_event e;
  e.kind = static_cast<K>(f.kind);
  e.now = f.now;
  e.worker = f.worker;
  switch (e.kind) {
    case K::join:
      e.incarnation = f.incarnation;
      e.batch = static_cast<std::uint32_t>(f.samples);
      break;
    case K::commit:
      e.incarnation = f.incarnation;
      e.commit = commit_in{.worker = f.worker,
                           .incarnation = f.incarnation,
                           .sequence = f.sequence,
                           .clock = f.clock,
                           .samples = f.samples,
                           .bytes = f.bytes,
                           .codec = static_cast<codec_id>(f.codec),
                           .type = static_cast<dtype>(f.type),
                           .element_count = f.elements,
                           .step = f.step,
                           .tensor = f.tensor,
                           .payload = payload,
                           .pull = (f.flags & 1u) != 0,
                           .ack_only = (f.flags & 2u) != 0,
                           .reply_unchecked = (f.flags & 4u) != 0};
      break;
    case K::metric:
      e.metric = static_cast<metric_id>(f.metric);
      e.value = f.value;
      break;
    case K::measurement:
      e.measurement = ashl::measurement{.worker = f.worker,
                                        .kind = static_cast<measurement_kind>(f.measure),
                                        .seconds = f.value,
                                        .amount = f.amount,
                                        .time = f.now};
      break;
    default: break;
  }
  out = e;
  return {};
}

// Makes e's call on `core` (any server_core<Policy>), its actions into
// `out` (a backup discards them; a replay checks them if it likes).
template <class Core>
void replay(Core& core, const core_event& e, server_actions& out) {
  switch (e.kind) {
    case core_event_kind::join: core.join(e.worker, e.incarnation, e.now, out, e.batch); return;
    case core_event_kind::leave: core.leave(e.worker, e.now, out); return;
    case core_event_kind::evict: core.evict(e.worker, e.now, out); return;
    case core_event_kind::commit: core.commit(e.commit, e.now, out); return;
    case core_event_kind::pull: core.pull(e.worker, e.now, out); return;
    case core_event_kind::metric: core.metric(e.metric, e.value, e.now, out); return;
    case core_event_kind::measurement: core.measurement(e.measurement, out); return;
    case core_event_kind::drain: core.drain(out); return;
    case core_event_kind::tick: core.tick(e.now, out); return;
  }
  ASHL_ASSERT(false, "core_event: a kind replay does not know");
}

// The one place a driver's state-changing calls go through: each call is
// handed to `record` as a core_event, then made on the core, in that order
// (a backup's record i exists before the actions of event i are sent). The
// driver's choices (apply_pending, speculate, pins, replies) and what it
// reads stay on core() directly: they are not records.
//
//   auto rc = ashl::ps::recorded_core(core, [&](const ashl::ps::core_event& e) { log.push(e); });
//   rc.join(w, incarnation, now, out);
template <class Core, class Record>
class recorded_core {
 public:
  recorded_core(Core& core, Record record) : core_(&core), record_(std::move(record)) {}

  void join(worker_id w, std::uint64_t incarnation, double now, server_actions& out, std::uint32_t batch = 0) {
    call(core_event::of_join(w, incarnation, now, batch), out);
  }
  void leave(worker_id w, double now, server_actions& out) { call(core_event::of_leave(w, now), out); }
  void evict(worker_id w, double now, server_actions& out) { call(core_event::of_evict(w, now), out); }
  // The core gets `c` as given (payload_kept and values_checked included);
  // the record has both cleared.
  void commit(const commit_in& c, double now, server_actions& out) {
    record_(core_event::of_commit(c, now));
    core_->commit(c, now, out);
  }
  void pull(worker_id w, double now, server_actions& out) { call(core_event::of_pull(w, now), out); }
  void metric(metric_id m, double value, double now, server_actions& out) {
    call(core_event::of_metric(m, value, now), out);
  }
  void measurement(const ashl::measurement& m, server_actions& out) { call(core_event::of_measurement(m), out); }
  void drain(server_actions& out) { call(core_event::of_drain(), out); }
  void tick(double now, server_actions& out) { call(core_event::of_tick(now), out); }

  [[nodiscard]] Core& core() noexcept { return *core_; }
  [[nodiscard]] const Core& core() const noexcept { return *core_; }

 private:
  void call(const core_event& e, server_actions& out) {
    record_(e);
    replay(*core_, e, out);
  }

  Core* core_;
  Record record_;
};

}  // namespace ps
ASHL_NAMESPACE_END
