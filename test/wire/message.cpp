#include <ashl/wire/message.hpp>

#include <boost/test/unit_test.hpp>

#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

// Counts every allocation of this program, so a test can require that a
// path allocates nothing.
namespace {
std::atomic<std::size_t> allocations{0};
std::atomic<std::size_t> allocated_bytes{0};
}  // namespace

void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  allocated_bytes.fetch_add(n, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  allocated_bytes.fetch_add(n, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  allocated_bytes.fetch_add(n, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  allocated_bytes.fetch_add(n, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace w = ashl::wire;
using ashl::errc;

namespace {

using bytes = std::vector<std::byte>;

bytes payload_of(std::size_t n, std::uint8_t seed) {
  bytes p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = std::byte(static_cast<std::uint8_t>(seed + 31 * i));
  return p;
}

w::header data_header(w::message_kind k) {
  w::header h;
  h.kind = k;
  h.codec = k == w::message_kind::commit ? ashl::codec_id::qsgd : ashl::codec_id::identity;
  h.type = k == w::message_kind::commit ? ashl::dtype::bf16 : ashl::dtype::f32;
  h.flags = k == w::message_kind::pull_request ? w::flag_ack_requested : w::flag_last_shard;
  h.element_count = 1000;
  h.tensor = 17;
  h.rank = 5;
  h.sequence = 0x1122334455667788ull;
  h.clock = 42;
  h.step = 0xfffffffffull;
  if (k == w::message_kind::commit) h.samples = 96;  // version 3: the samples a commit covers
  return h;
}

// Part `part` of a 10-element f32 pull_reply in 3 parts (4, 4 and 2 elements).
w::header part_header(std::uint16_t part) {
  w::header h = data_header(w::message_kind::pull_reply);
  h.flags = w::flag_last_shard | w::flag_part;
  h.element_count = 10;
  h.part = part;
  h.parts = 3;
  return h;
}

// Version 5: a dense commit in parts. Its offset 64 keeps the samples, so
// the part's index and the count of parts sit in flags bits 16..31.
w::header commit_part_header(std::uint16_t part) {
  w::header h = data_header(w::message_kind::commit);
  h.codec = ashl::codec_id::identity;
  h.type = ashl::dtype::f32;
  h.flags = w::flag_last_shard | w::flag_pull | w::flag_part;
  h.element_count = 10;
  h.part = part;
  h.parts = 3;
  return h;
}

bytes encode_data(const w::header& h, const bytes& payload) {
  bytes out(w::encoded_size(payload.size()));
  auto n = w::encode(h, payload, out);
  BOOST_TEST_REQUIRE(n.has_value(), (n ? "" : n.error().to_string()));
  BOOST_TEST_REQUIRE(*n == out.size());
  return out;
}

template <class Body>
bytes encode_control(const Body& b, w::header h = {}) {
  h.rank = 3;
  h.sequence = 9;
  h.clock = 4;
  if constexpr (std::is_same_v<Body, w::plan_update_body>) {
    h.codec = ashl::codec_id::topk;
    h.type = ashl::dtype::f16;
  }
  bytes out(w::encoded_size(b));
  auto n = w::encode(h, b, out);
  BOOST_TEST_REQUIRE(n.has_value(), (n ? "" : n.error().to_string()));
  BOOST_TEST_REQUIRE(*n == out.size());
  return out;
}

const std::string error_text = "qsgd.levels = 0: must be >= 1";

const ashl::worker_plan a_plan{.local_iterations = 4, .commit_interval_us = 1500, .batch_size = 48,
                               .stage = ashl::stage_id::ssp, .data_share = 0.25f, .compression_ratio = 0.01f};

// Three records of worker 3 (encode_control's rank).
std::vector<ashl::measurement> some_measurements() {
  return {{.worker = 3, .kind = ashl::measurement_kind::compute, .seconds = 0.125, .amount = 64, .time = 10.5},
          {.worker = 3, .kind = ashl::measurement_kind::push, .seconds = 0.02, .amount = 4e6, .time = 10.75},
          {.worker = 3, .kind = ashl::measurement_kind::round, .seconds = 1.5, .amount = 0, .time = -2.0}};
}

bytes encode_measurements(const std::vector<ashl::measurement>& ms, const w::limits& lim = {}) {
  w::header h;
  h.rank = 3;
  h.sequence = 9;
  h.clock = 4;
  bytes out(w::encoded_size(w::measurements_body::bytes_for(ms.size())));
  auto n = w::encode(h, std::span<const ashl::measurement>(ms), out, lim);
  BOOST_TEST_REQUIRE(n.has_value(), (n ? "" : n.error().to_string()));
  BOOST_TEST_REQUIRE(*n == out.size());
  return out;
}

// Version 6's bodies (docs/elastic.md §3.4, §4.2).
const w::lease_body a_lease{.epoch = 2, .begin = 96, .end = 160, .samples = 997, .shuffle_seed = 0x5eed5eed5eedull,
                            .flags = w::lease_flag_epoch_end};
const w::replica_ack_body an_ack{.received = 812, .applied = 800, .version = 411, .crc = 0x1a2b3c4du, .state_crc = 0x5e6f7a8bu};
const w::replica_hello_body a_hello{.job = 0x0123456789abcdefull, .shard = 1, .servers = 3, .elements = 1000, .term = 2,
                                    .have = 812, .version = 411, .crc = 0xcafef00du};
const w::shard_state_body a_shard_state{.term = 3, .flags = w::shard_state_flag_backup};

// A record as rules/core_events.hpp frames one (its 120-byte prefix starts
// with "ACEV", version 1, the kind), then `payload` bytes: the wire looks
// only at the magic and the kind.
bytes core_record(w::replica_event kind, std::size_t payload) {
  bytes r = payload_of(w::core_event_record_prefix_bytes + payload, 11);
  const std::uint32_t magic = w::core_event_record_magic;
  const std::uint16_t version = 1;
  std::memcpy(r.data(), &magic, 4);
  std::memcpy(r.data() + 4, &version, 2);
  r[w::core_event_record_kind_offset] = std::byte{static_cast<std::uint8_t>(kind)};
  return r;
}
const bytes a_commit_record = core_record(w::replica_event::commit, 5);
const bytes a_snapshot_piece = payload_of(40, 13);

w::replicate_body a_replicate() {
  return {.event = w::replica_event::commit, .flags = w::replicate_flag_state_crc, .version_after = 411,
          .offset = 0, .total = a_commit_record.size(), .crc_after = 0x0badf00du, .record = a_commit_record};
}
// A tick is a record like the others (its `now` is the primary's clock).
const bytes a_tick_record = core_record(w::replica_event::tick, 0);
w::replicate_body a_tick() {
  return {.event = w::replica_event::tick, .version_after = 411, .total = a_tick_record.size(), .record = a_tick_record};
}
// The second piece of a 100-byte snapshot (server_core::save()'s bytes).
w::replicate_body a_snapshot() {
  return {.event = w::replica_event::snapshot, .version_after = 400, .offset = 60, .total = 100, .record = a_snapshot_piece};
}

// One valid message of every kind.
std::vector<bytes> every_kind() {
  std::vector<bytes> all;
  all.push_back(encode_data(data_header(w::message_kind::commit), payload_of(37, 1)));
  auto pr = data_header(w::message_kind::pull_request);
  all.push_back(encode_data(pr, {}));
  all.push_back(encode_data(data_header(w::message_kind::pull_reply), payload_of(64, 2)));
  all.push_back(encode_control(w::join_body{.incarnation = 7, .batch = 32, .job = 0x1122334455667788u, .elements = 1000,
                                            .flags = w::join_flag_failover, .term = 2}));
  all.push_back(encode_control(w::leave_body{.reason = w::leave_reason::evicted_timeout, .subject = 2}));
  all.push_back(encode_control(a_plan));
  all.push_back(encode_control(w::metric_body{.name = ashl::metric_id::accuracy, .value = 0.875}));
  all.push_back(encode_control(w::error_body{.code = errc::invalid_argument, .in_reply_to = 77, .text = error_text}));
  all.push_back(encode_measurements(some_measurements()));
  all.push_back(encode_data(part_header(2), payload_of(8, 3)));  // a pull_reply in parts (version 4): last part, 2 of 10 elements
  all.push_back(encode_data(commit_part_header(1), payload_of(16, 4)));  // a commit in parts (version 5): part 1, 4 of 10 elements
  // Version 6: 11 lease, 12..14 replicate (a commit's record, a tick, a
  // snapshot's piece), 15 replica_ack, 16 replica_hello, 17 shard_state.
  all.push_back(encode_control(a_lease));
  all.push_back(encode_control(a_replicate()));
  all.push_back(encode_control(a_tick()));
  all.push_back(encode_control(a_snapshot()));
  all.push_back(encode_control(an_ack));
  all.push_back(encode_control(a_hello));
  all.push_back(encode_control(a_shard_state));
  return all;
}

// Overwrite bytes at `off` (little-endian value) and recompute the CRC, so the
// decoder reaches the semantic checks.
template <class T>
bytes patched(bytes m, std::size_t off, T v) {
  std::memcpy(m.data() + off, &v, sizeof(T));
  const std::uint32_t crc = w::crc32c(std::span<const std::byte>(m).subspan(w::header_bytes),
                                      w::crc32c(std::span<const std::byte>(m).first(w::crc_offset)));
  std::memcpy(m.data() + w::crc_offset, &crc, 4);
  return m;
}

void expect_error(const ashl::result<w::message_view>& r, errc code, const std::string& starts) {
  BOOST_TEST_REQUIRE(!r.has_value(), "accepted; expected " << starts);
  BOOST_TEST((r.error().code() == code), r.error().to_string());
  BOOST_TEST(r.error().message().rfind(starts, 0) == 0u, r.error().message() << " does not start with " << starts);
}

void expect_error(const ashl::status& s, errc code, const std::string& starts) {
  BOOST_TEST_REQUIRE(!s.ok(), "accepted; expected " << starts);
  BOOST_TEST((s.code() == code), s.to_string());
  BOOST_TEST(s.message().rfind(starts, 0) == 0u, s.message() << " does not start with " << starts);
}

ashl::result<w::message_view> dec(const bytes& m, const w::limits& lim = {}) { return w::decode(m, lim); }

}  // namespace

BOOST_AUTO_TEST_CASE(header_layout_is_the_documented_one) {
  const auto m = encode_data(data_header(w::message_kind::commit), payload_of(3, 0));
  auto u8 = [&](std::size_t o) { return std::to_integer<unsigned>(m[o]); };
  auto u32 = [&](std::size_t o) { std::uint32_t v; std::memcpy(&v, m.data() + o, 4); return v; };
  auto u64 = [&](std::size_t o) { std::uint64_t v; std::memcpy(&v, m.data() + o, 8); return v; };
  BOOST_TEST(u8(0) == unsigned('A'));
  BOOST_TEST(u8(1) == unsigned('S'));
  BOOST_TEST(u8(2) == unsigned('H'));
  BOOST_TEST(u8(3) == unsigned('L'));
  BOOST_TEST((u8(4) | u8(5) << 8) == 6u);   // version
  BOOST_TEST((u8(6) | u8(7) << 8) == 72u);  // header bytes
  BOOST_TEST(u8(8) == 1u);                  // kind commit
  BOOST_TEST(u8(9) == 7u);                  // codec qsgd
  BOOST_TEST(u8(10) == 2u);                 // dtype bf16
  BOOST_TEST(u8(11) == 0u);
  BOOST_TEST(u32(12) == w::flag_last_shard);
  BOOST_TEST(u64(16) == 1000u);
  BOOST_TEST(u32(24) == 17u);
  BOOST_TEST(u32(28) == 5u);
  BOOST_TEST(u64(32) == 0x1122334455667788ull);
  BOOST_TEST(u64(40) == 42u);
  BOOST_TEST(u64(48) == 0xfffffffffull);
  BOOST_TEST(u64(56) == 3u);
  BOOST_TEST(u32(64) == 96u);  // samples (version 3)
  BOOST_TEST(u32(68) == w::crc32c(std::span<const std::byte>(m).subspan(72),
                                  w::crc32c(std::span<const std::byte>(m).first(68))));
  BOOST_TEST(m.size() == 75u);
}

BOOST_AUTO_TEST_CASE(data_kinds_round_trip_with_payload_views) {
  for (auto k : {w::message_kind::commit, w::message_kind::pull_request, w::message_kind::pull_reply}) {
    const auto h = data_header(k);
    const bytes p = k == w::message_kind::pull_request ? bytes{} : payload_of(129, 3);
    const auto m = encode_data(h, p);
    auto d = dec(m);
    BOOST_TEST_REQUIRE(d.has_value(), (d ? "" : d.error().to_string()));
    BOOST_TEST((d->header == h));
    BOOST_TEST(d->payload.size() == p.size());
    BOOST_TEST(d->payload.data() == m.data() + w::header_bytes);  // a view, no copy
    if (!p.empty()) BOOST_TEST(std::memcmp(d->payload.data(), p.data(), p.size()) == 0);
    BOOST_TEST(std::holds_alternative<std::monostate>(d->body));
    bytes again(m.size());
    auto n = w::encode(*d, again);
    BOOST_TEST_REQUIRE(n.has_value());
    BOOST_TEST((again == m));
  }
}

BOOST_AUTO_TEST_CASE(control_kinds_round_trip) {
  const auto all = every_kind();
  const w::message_kind kinds[] = {w::message_kind::commit, w::message_kind::pull_request,
                                   w::message_kind::pull_reply, w::message_kind::join,
                                   w::message_kind::leave, w::message_kind::plan_update,
                                   w::message_kind::metric, w::message_kind::error,
                                   w::message_kind::measurements, w::message_kind::pull_reply,
                                   w::message_kind::commit, w::message_kind::lease,
                                   w::message_kind::replicate, w::message_kind::replicate,
                                   w::message_kind::replicate, w::message_kind::replica_ack,
                                   w::message_kind::replica_hello, w::message_kind::shard_state};
  BOOST_TEST_REQUIRE(all.size() == std::size(kinds));
  for (std::size_t i = 0; i < all.size(); ++i) {
    auto d = dec(all[i]);
    BOOST_TEST_REQUIRE(d.has_value(), (d ? "" : d.error().to_string()));
    BOOST_TEST((d->header.kind == kinds[i]));
    bytes again(all[i].size());
    BOOST_TEST_REQUIRE(w::encode(*d, again).has_value());
    BOOST_TEST((again == all[i]), "kind " << w::to_string(kinds[i]));
  }
  auto j = dec(all[3]);
  BOOST_TEST_REQUIRE(j->get<w::join_body>() != nullptr);
  BOOST_TEST((*j->get<w::join_body>() == w::join_body{7, 32, 0x1122334455667788u, 1000, w::join_flag_failover, 2}));
  BOOST_TEST(j->header.rank == 3u);
  BOOST_TEST(j->header.sequence == 9u);
  auto l = dec(all[4]);
  BOOST_TEST((l->get<w::leave_body>()->reason == w::leave_reason::evicted_timeout));
  BOOST_TEST(l->get<w::leave_body>()->subject == 2u);
  auto p = dec(all[5]);
  const auto* plan = p->get<ashl::worker_plan>();
  BOOST_TEST_REQUIRE(plan != nullptr);
  BOOST_TEST((*plan == a_plan));
  BOOST_TEST((p->get<w::plan_update_body>() == plan));  // one type: the alias
  BOOST_TEST((p->header.codec == ashl::codec_id::topk));
  BOOST_TEST((p->header.type == ashl::dtype::f16));
  auto mt = dec(all[6]);
  BOOST_TEST((mt->get<w::metric_body>()->name == ashl::metric_id::accuracy));
  BOOST_TEST(mt->get<w::metric_body>()->value == 0.875);
  BOOST_TEST(mt->get<w::join_body>() == nullptr);
  auto e = dec(all[7]);
  const auto* err = e->get<w::error_body>();
  BOOST_TEST_REQUIRE(err != nullptr);
  BOOST_TEST((err->code == errc::invalid_argument));
  BOOST_TEST(err->in_reply_to == 77u);
  BOOST_TEST(err->text == error_text);
  BOOST_TEST(static_cast<const void*>(err->text.data()) == static_cast<const void*>(all[7].data() + 72 + 16));
  // An empty error text is allowed.
  auto empty = encode_control(w::error_body{.code = errc::timed_out, .in_reply_to = 1, .text = {}});
  BOOST_TEST(empty.size() == 72u + 16u);
  BOOST_TEST(dec(empty).has_value());
  // Application metric ids.
  BOOST_TEST(dec(encode_control(w::metric_body{.name = static_cast<ashl::metric_id>(ashl::metric_id_application + 5),
                                               .value = -1e300}))
                 .has_value());
  auto ms = dec(all[8]);
  const auto* rec = ms->get<w::measurements_body>();
  BOOST_TEST_REQUIRE(rec != nullptr);
  BOOST_TEST(rec->worker == 3u);
  BOOST_TEST_REQUIRE(rec->size() == 3u);
  const auto want = some_measurements();
  std::size_t i = 0;
  for (ashl::measurement x : *rec) BOOST_TEST((x == want[i++]));
  BOOST_TEST(i == 3u);
  BOOST_TEST(rec->records.data() == all[8].data() + 72 + 4);  // a view, no copy
  // Version 6's bodies.
  BOOST_TEST((*dec(all[11])->get<w::lease_body>() == a_lease));
  auto rp = dec(all[12]);
  const auto* r = rp->get<w::replicate_body>();
  BOOST_TEST_REQUIRE(r != nullptr);
  BOOST_TEST((*r == a_replicate()));
  BOOST_TEST(r->record.data() == all[12].data() + 72 + 36);  // the record is a view, no copy
  BOOST_TEST((rp->header.clock == 4u && rp->header.sequence == 9u && rp->header.rank == 3u));  // term, index, worker
  BOOST_TEST((*dec(all[13])->get<w::replicate_body>() == a_tick()));
  BOOST_TEST(dec(all[13])->get<w::replicate_body>()->record.size() == 120u);
  BOOST_TEST((*dec(all[14])->get<w::replicate_body>() == a_snapshot()));
  BOOST_TEST((*dec(all[15])->get<w::replica_ack_body>() == an_ack));
  BOOST_TEST((*dec(all[16])->get<w::replica_hello_body>() == a_hello));
  BOOST_TEST((*dec(all[17])->get<w::shard_state_body>() == a_shard_state));
  // Every event that has a record: its kind is the record's.
  for (const auto e : {w::replica_event::join, w::replica_event::leave, w::replica_event::evict, w::replica_event::pull,
                       w::replica_event::metric, w::replica_event::measurement, w::replica_event::drain}) {
    const bytes rec2 = core_record(e, 0);
    const w::replicate_body b{.event = e, .version_after = 1, .total = rec2.size(), .record = rec2};
    const bytes m = encode_control(b);
    auto d = dec(m);
    BOOST_TEST_REQUIRE(d.has_value(), w::to_string(e) << ": " << (d ? "" : d.error().to_string()));
    BOOST_TEST((*d->get<w::replicate_body>() == b));
  }
  // A record's later pieces are bytes the wire does not look into.
  const bytes tail = payload_of(5, 1);
  BOOST_TEST(dec(encode_control(w::replicate_body{.event = w::replica_event::commit, .offset = 120, .total = 125, .record = tail}))
                 .has_value());
}

// Version 6: every field of the new bodies (and the join's new ones)
// refused by name with its value, by decode and by encode alike.
BOOST_AUTO_TEST_CASE(version_6_bodies_refuse_bad_fields_by_name) {
  const auto all = every_kind();
  const auto& join = all[3];
  const auto& lease = all[11];
  const auto& repl = all[12];
  const auto& tick = all[13];
  const auto& snap = all[14];
  const auto& ack = all[15];
  const auto& hello = all[16];
  const auto& state = all[17];
  // join: 36 bytes; flags only failover; elements and term any value (0: not said).
  expect_error(dec(patched(join, 72 + 28, std::uint32_t{2})), errc::unsupported,
               "join.flags = 0x00000002: unknown flag bits set (known: 0x00000001)");
  BOOST_TEST(dec(patched(patched(join, 72 + 20, std::uint64_t{0}), 72 + 32, std::uint32_t{0})).has_value());
  bytes short_join(join.begin(), join.end() - 16);  // a version-5 body (20 bytes) under a version-6 header
  expect_error(dec(patched(short_join, 56, std::uint64_t{20})), errc::malformed, "join.payload_bytes = 20: a join body is 36 bytes");
  // lease: begin < end <= samples; flags epoch_end | resent.
  expect_error(dec(patched(lease, 72 + 8, std::uint64_t{160})), errc::invalid_argument, "lease.begin = 160: must be < end = 160");
  expect_error(dec(patched(lease, 72 + 8, std::uint64_t{161})), errc::invalid_argument, "lease.begin = 161: must be < end = 160");
  expect_error(dec(patched(lease, 72 + 16, std::uint64_t{998})), errc::invalid_argument, "lease.end = 998: must be <= samples = 997");
  expect_error(dec(patched(lease, 72 + 24, std::uint64_t{159})), errc::invalid_argument, "lease.end = 160: must be <= samples = 159");
  BOOST_TEST(dec(patched(lease, 72 + 24, std::uint64_t{160})).has_value());  // the last positions
  BOOST_TEST(dec(patched(lease, 72 + 40, w::lease_flag_resent | w::lease_flag_epoch_end)).has_value());
  expect_error(dec(patched(lease, 72 + 40, std::uint32_t{4})), errc::unsupported,
               "lease.flags = 0x00000004: unknown flag bits set (known: 0x00000003)");
  bytes long_lease = lease;
  long_lease.push_back(std::byte{0});
  expect_error(dec(patched(long_lease, 56, std::uint64_t{45})), errc::malformed, "lease.payload_bytes = 45: a lease body is 44 bytes");
  // replicate: the event, the reserved bytes, the flags, the record's place and framing.
  expect_error(dec(patched(repl, 72, std::uint8_t{10})), errc::unsupported, "replicate.event = 10: unknown event");
  expect_error(dec(patched(repl, 72 + 1, std::uint8_t{1})), errc::malformed, "replicate.reserved = 1: bytes 1..3 must be 0");
  expect_error(dec(patched(repl, 72 + 3, std::uint8_t{1})), errc::malformed, "replicate.reserved = 65536");
  expect_error(dec(patched(repl, 72 + 4, std::uint32_t{0x80000000u})), errc::unsupported,
               "replicate.flags = 0x80000000: unknown flag bits set (known: 0x00000001)");
  expect_error(dec(patched(repl, 72, std::uint8_t{1})), errc::malformed,
               "replicate.record_kind = 4: disagrees with replicate.event = 1 (join)");
  expect_error(dec(patched(repl, 72 + 36, std::uint32_t{0x56454342u})), errc::malformed,
               "replicate.record_magic = 0x56454342: not a core event record (want 0x56454341, \"ACEV\")");
  expect_error(dec(patched(repl, 72 + 24, std::uint64_t{124})), errc::malformed,
               "replicate.offset = 0: with the 125 bytes here passes total = 124");
  expect_error(dec(patched(repl, 72 + 16, std::uint64_t{1})), errc::malformed,
               "replicate.offset = 1: with the 125 bytes here passes total = 125");
  expect_error(dec(patched(repl, 72 + 16, ~std::uint64_t{0})), errc::malformed, "replicate.offset = 18446744073709551615");
  bytes short_repl(repl.begin(), repl.begin() + 72 + 36 + 119);  // a first piece without the whole prefix
  expect_error(dec(patched(patched(short_repl, 56, std::uint64_t{36 + 119}), 72 + 24, std::uint64_t{200})), errc::malformed,
               "replicate.record_bytes = 119: the first piece of a record holds its 120-byte prefix");
  expect_error(dec(patched(patched(short_repl, 56, std::uint64_t{36 + 119}), 72 + 24, std::uint64_t{119})), errc::malformed,
               "replicate.total = 119: a core event record is at least 120 bytes");
  bytes no_prefix(repl.begin(), repl.begin() + 72 + 35);
  expect_error(dec(patched(no_prefix, 56, std::uint64_t{35})), errc::malformed,
               "replicate.payload_bytes = 35: a replicate body is at least 36 bytes");
  bytes empty_commit(repl.begin(), repl.begin() + 72 + 36);
  expect_error(dec(patched(empty_commit, 56, std::uint64_t{36})), errc::malformed,
               "replicate.record_bytes = 0: a commit carries a record");
  bytes empty_tick(tick.begin(), tick.begin() + 72 + 36);  // a tick is a record too (its now is the primary's)
  expect_error(dec(patched(empty_tick, 56, std::uint64_t{36})), errc::malformed,
               "replicate.record_bytes = 0: a tick carries a record");
  expect_error(dec(patched(tick, 72 + 36 + 6, std::uint8_t{5})), errc::malformed,
               "replicate.record_kind = 5: disagrees with replicate.event = 9 (tick)");
  expect_error(dec(patched(snap, 72 + 24, std::uint64_t{99})), errc::malformed,
               "replicate.offset = 60: with the 40 bytes here passes total = 99");
  expect_error(dec(patched(snap, 72 + 16, std::uint64_t{100})), errc::malformed, "replicate.offset = 100");
  BOOST_TEST(dec(patched(snap, 72 + 16, std::uint64_t{0})).has_value());  // a snapshot's pieces are not core records
  // replica_ack: applied <= received.
  expect_error(dec(patched(ack, 72 + 8, std::uint64_t{813})), errc::invalid_argument,
               "replica_ack.applied = 813: must be <= received = 812");
  BOOST_TEST(dec(patched(ack, 72 + 8, std::uint64_t{812})).has_value());
  bytes short_ack(ack.begin(), ack.end() - 4);
  expect_error(dec(patched(short_ack, 56, std::uint64_t{28})), errc::malformed, "replica_ack.payload_bytes = 28: a replica_ack body is 32 bytes");
  // replica_hello: servers >= 1, shard < servers, elements >= 1.
  expect_error(dec(patched(hello, 72 + 12, std::uint32_t{0})), errc::invalid_argument, "replica_hello.servers = 0: must be >= 1");
  expect_error(dec(patched(hello, 72 + 8, std::uint32_t{3})), errc::invalid_argument, "replica_hello.shard = 3: must be < servers = 3");
  expect_error(dec(patched(hello, 72 + 16, std::uint64_t{0})), errc::invalid_argument,
               "replica_hello.elements = 0: a shard holds at least one element");
  BOOST_TEST(dec(patched(patched(hello, 72 + 24, std::uint32_t{0}), 72 + 28, std::uint64_t{0})).has_value());  // a fresh backup
  bytes long_hello = hello;
  long_hello.push_back(std::byte{0});
  expect_error(dec(patched(long_hello, 56, std::uint64_t{49})), errc::malformed, "replica_hello.payload_bytes = 49: a replica_hello body is 48 bytes");
  // shard_state: term >= 1; flags only backup.
  expect_error(dec(patched(state, 72, std::uint32_t{0})), errc::invalid_argument, "shard_state.term = 0: must be >= 1");
  expect_error(dec(patched(state, 72 + 4, std::uint32_t{3})), errc::unsupported,
               "shard_state.flags = 0x00000003: unknown flag bits set (known: 0x00000001)");
  BOOST_TEST(dec(patched(state, 72 + 4, std::uint32_t{0})).has_value());
  // The header rules of a control kind hold for every new kind.
  for (std::size_t i = 11; i < all.size(); ++i) {
    const std::string kind(w::to_string(static_cast<w::message_kind>(std::to_integer<int>(all[i][8]))));
    expect_error(dec(patched(all[i], 16, std::uint64_t{1})), errc::malformed, "header.element_count = 1: must be 0 for a " + kind);
    expect_error(dec(patched(all[i], 9, std::uint8_t{3})), errc::malformed, "header.codec = \"topk\": must be identity for a " + kind);
    expect_error(dec(patched(all[i], 64, std::uint32_t{1})), errc::malformed, "header.samples = 1");
    // A version-5 peer's message of this kind: refused by version, naming both.
    expect_error(dec(patched(all[i], 4, std::uint16_t{5})), errc::unsupported, "header.version = 5: this build reads version 6");
  }
  // The encoder refuses what the decoder would.
  bytes out(1024);
  auto enc = [&](const auto& b) { return w::encode(w::header{}, b, out).to_status(); };
  expect_error(enc(w::join_body{.batch = 1, .flags = 4}), errc::unsupported, "join.flags = 0x00000004");
  expect_error(enc(w::lease_body{.begin = 5, .end = 5, .samples = 10}), errc::invalid_argument, "lease.begin = 5: must be < end = 5");
  expect_error(enc(w::lease_body{.begin = 5, .end = 11, .samples = 10}), errc::invalid_argument, "lease.end = 11");
  expect_error(enc(w::lease_body{.begin = 0, .end = 1, .samples = 1, .flags = 8}), errc::unsupported, "lease.flags = 0x00000008");
  expect_error(enc(w::replicate_body{.event = static_cast<w::replica_event>(42)}), errc::unsupported, "replicate.event = 42");
  expect_error(enc(w::replicate_body{.event = w::replica_event::tick, .total = 3}), errc::malformed, "replicate.record_bytes = 0: a tick carries a record");
  const bytes join_rec = core_record(w::replica_event::join, 0);
  expect_error(enc(w::replicate_body{.event = w::replica_event::leave, .total = join_rec.size(), .record = join_rec}),
               errc::malformed, "replicate.record_kind = 1: disagrees with replicate.event = 2 (leave)");
  expect_error(enc(w::replica_ack_body{.received = 1, .applied = 2}), errc::invalid_argument, "replica_ack.applied = 2");
  expect_error(enc(w::replica_hello_body{.shard = 0, .servers = 0, .elements = 1}), errc::invalid_argument, "replica_hello.servers = 0");
  expect_error(enc(w::shard_state_body{.term = 0}), errc::invalid_argument, "shard_state.term = 0");
  expect_error(enc(w::shard_state_body{.term = 1, .flags = 2}), errc::unsupported, "shard_state.flags = 0x00000002");
  BOOST_TEST(w::encoded_size(a_replicate()) == 72u + 36u + 125u);
  BOOST_TEST(w::encoded_size(a_tick()) == 72u + 36u + 120u);
  BOOST_TEST(w::encoded_size(a_lease) == 72u + 44u);
}

BOOST_AUTO_TEST_CASE(seal_writes_the_header_in_front_of_an_in_place_payload) {
  const auto h = data_header(w::message_kind::commit);
  bytes buf(w::encoded_size(200));
  auto area = w::payload_area(buf);
  BOOST_TEST(area.size() == 200u);
  const auto p = payload_of(150, 9);
  std::memcpy(area.data(), p.data(), p.size());  // a codec writes here
  auto n = w::seal(h, p.size(), buf);
  BOOST_TEST_REQUIRE(n.has_value());
  BOOST_TEST(*n == 72u + 150u);
  auto d = w::decode(std::span<const std::byte>(buf.data(), *n), {});
  BOOST_TEST_REQUIRE(d.has_value());
  BOOST_TEST((d->header == h));
  BOOST_TEST(std::memcmp(d->payload.data(), p.data(), p.size()) == 0);
  BOOST_TEST((encode_data(h, p) == bytes(buf.begin(), buf.begin() + 222)));
}

BOOST_AUTO_TEST_CASE(seal_header_and_two_part_decode_match_one_buffer) {
  // A transport sends the header and a payload that lies elsewhere; the bytes
  // are those of the one-buffer encoding, and the receiver decodes the parts.
  const auto h = data_header(w::message_kind::commit);
  const auto p = payload_of(150, 9);
  std::array<std::byte, w::header_bytes> head{};
  BOOST_TEST_REQUIRE(w::seal_header(h, p, head).ok());
  const bytes whole = encode_data(h, p);
  BOOST_TEST(std::memcmp(head.data(), whole.data(), w::header_bytes) == 0);
  auto d = w::decode(head, p, {});
  BOOST_TEST_REQUIRE(d.has_value());
  BOOST_TEST((d->header == h));
  BOOST_TEST(d->payload.data() == reinterpret_cast<const std::byte*>(p.data()));
  // The payload is checksummed: one flipped bit is refused, and a payload of
  // another length too.
  bytes flipped(p.begin(), p.end());
  flipped[17] ^= std::byte{1};
  expect_error(w::decode(head, flipped, {}), errc::checksum_mismatch, "header.crc32c");
  expect_error(w::decode(head, std::span<const std::byte>(p).first(149), {}), errc::malformed,
               "header.payload_bytes = 150: disagrees with the 149 bytes");
  expect_error(w::decode(std::span<const std::byte>(head).first(71), p, {}), errc::malformed,
               "message.header_size = 71");
  // With the payload's CRC known, the header is the same bytes.
  std::array<std::byte, w::header_bytes> head2{};
  BOOST_TEST_REQUIRE(w::seal_header(h, p.size(), ashl::wire::crc32c(std::span<const std::byte>(p)), head2).ok());
  BOOST_TEST((head2 == head));
  std::array<std::byte, 71> small{};
  BOOST_TEST((w::seal_header(h, p, small).code() == errc::buffer_too_small));
  BOOST_TEST((w::seal_header(h, p, head, w::limits{.max_payload_bytes = 100}).code() == errc::out_of_range));
}

BOOST_AUTO_TEST_CASE(header_failures_name_field_and_value) {
  const auto commit = encode_data(data_header(w::message_kind::commit), payload_of(8, 4));
  expect_error(dec(bytes(commit.begin(), commit.begin() + 71)), errc::malformed, "message.size = 71");
  expect_error(dec(patched(commit, 0, std::uint32_t{0x4c485342})), errc::malformed, "header.magic = 0x4c485342");
  expect_error(dec(patched(commit, 4, std::uint16_t{1})), errc::unsupported,
               "header.version = 1: this build reads version 6");
  expect_error(dec(patched(commit, 4, std::uint16_t{2})), errc::unsupported,
               "header.version = 2: this build reads version 6");
  expect_error(dec(patched(commit, 4, std::uint16_t{4})), errc::unsupported,
               "header.version = 4: this build reads version 6");  // version 4 had no commit in parts
  expect_error(dec(patched(commit, 4, std::uint16_t{5})), errc::unsupported,
               "header.version = 5: this build reads version 6");  // version 5 had a 20-byte join and no lease
  expect_error(dec(patched(commit, 4, std::uint16_t{7})), errc::unsupported, "header.version = 7");
  expect_error(dec(patched(commit, 6, std::uint16_t{80})), errc::malformed, "header.header_bytes = 80");
  expect_error(dec(patched(commit, 8, std::uint8_t{0})), errc::unsupported, "header.kind = 0");
  expect_error(dec(patched(commit, 8, std::uint8_t{15})), errc::unsupported,
               "header.kind = 15: not a message kind of version 6");
  expect_error(dec(patched(commit, 9, std::uint8_t{12})), errc::unsupported, "header.codec = 12");
  expect_error(dec(patched(commit, 10, std::uint8_t{6})), errc::unsupported, "header.dtype = 6");
  expect_error(dec(patched(commit, 11, std::uint8_t{1})), errc::malformed, "header.reserved0 = 1");
  expect_error(dec(patched(commit, 12, std::uint32_t{0x40})), errc::unsupported, "header.flags = 0x00000040");
  // Offset 64 is a commit's samples (version 3); any other kind must leave it 0.
  auto with_samples = dec(patched(commit, 64, std::uint32_t{0xffffffffu}));
  BOOST_TEST_REQUIRE(with_samples.has_value());
  BOOST_TEST(with_samples->header.samples == 0xffffffffu);
  const auto a_reply = encode_data(data_header(w::message_kind::pull_reply), payload_of(8, 4));
  expect_error(dec(patched(a_reply, 64, std::uint32_t{5})), errc::malformed,
               "header.samples = 5: only a commit covers samples (must be 0)");
  const auto a_join = encode_control(w::join_body{.incarnation = 7, .batch = 32});
  expect_error(dec(patched(a_join, 64, std::uint32_t{1})), errc::malformed, "header.samples = 1");
  w::header bad_pull = data_header(w::message_kind::pull_request);
  bad_pull.samples = 3;
  std::array<std::byte, w::header_bytes> bad_head{};
  BOOST_TEST((w::seal_header(bad_pull, std::span<const std::byte>{}, bad_head).code() == errc::malformed));
  w::limits small;
  small.max_elements = 999;
  expect_error(dec(commit, small), errc::out_of_range, "header.element_count = 1000: exceeds limits.max_elements = 999");
  small = {};
  small.max_payload_bytes = 7;
  expect_error(dec(commit, small), errc::out_of_range, "header.payload_bytes = 8: exceeds limits.max_payload_bytes = 7");
  expect_error(dec(patched(commit, 56, std::uint64_t{9})), errc::malformed,
               "header.payload_bytes = 9: disagrees with the 8 bytes");
  expect_error(dec(patched(commit, 56, std::uint64_t{7})), errc::malformed, "header.payload_bytes = 7");
  expect_error(dec(patched(commit, 56, ~std::uint64_t{0})), errc::out_of_range, "header.payload_bytes = 18446744073709551615");
  bytes bad_crc = commit;
  bad_crc[w::crc_offset] ^= std::byte{1};
  expect_error(dec(bad_crc), errc::checksum_mismatch, "header.crc32c = 0x");
  // Per-kind rules.
  expect_error(dec(patched(commit, 10, std::uint8_t(ashl::dtype::i8))), errc::malformed, "header.dtype = \"i8\"");
  expect_error(dec(patched(commit, 10, std::uint8_t(ashl::dtype::f64))), errc::malformed, "header.dtype = \"f64\"");
  expect_error(dec(patched(commit, 16, std::uint64_t{0})), errc::malformed, "header.element_count = 0");
  const auto reply = encode_data(data_header(w::message_kind::pull_reply), payload_of(8, 4));
  BOOST_TEST(dec(patched(reply, 10, std::uint8_t(ashl::dtype::f64))).has_value());  // dense f64 parameters
  expect_error(dec(patched(reply, 10, std::uint8_t(ashl::dtype::u8))), errc::malformed, "header.dtype = \"u8\"");
  const auto pull = encode_data(data_header(w::message_kind::pull_request), {});
  bytes pull_with_payload = pull;
  pull_with_payload.push_back(std::byte{0});
  expect_error(dec(patched(pull_with_payload, 56, std::uint64_t{1})), errc::malformed, "header.payload_bytes = 1: a pull_request");
  expect_error(dec(patched(pull, 12, w::flag_last_shard)), errc::malformed, "header.flags = 0x00000001");
  // A pull rides only with a commit.
  expect_error(dec(patched(pull, 12, w::flag_pull)), errc::malformed, "header.flags = 0x00000004: pull is only for commit");
  // The flag `view` marks a dense pull_reply only (docs/wire-format.md, "Compressed replies").
  BOOST_TEST(dec(patched(reply, 12, w::flag_view)).has_value());
  expect_error(dec(patched(pull, 12, w::flag_view)), errc::malformed,
               "header.flags = 0x00000010: view is only for a dense pull_reply");
  expect_error(dec(patched(patched(reply, 12, w::flag_view), 9, std::uint8_t(ashl::codec_id::block))), errc::malformed,
               "header.flags = 0x00000010: view is only for a dense pull_reply");
  expect_error(dec(patched(reply, 12, std::uint32_t{1} << 6)), errc::unsupported, "header.flags = 0x00000040: unknown flag bits");
  auto commit_pull = data_header(w::message_kind::commit);
  commit_pull.flags = w::flag_last_shard | w::flag_pull;
  auto d = w::decode(encode_data(commit_pull, payload_of(8, 3)), {});
  BOOST_TEST_REQUIRE(d.has_value());
  BOOST_TEST(d->header.flags == (w::flag_last_shard | w::flag_pull));
  // A push (docs/ps.md "The worker"): the commit asks for an acknowledgement, which is a
  // pull_reply of no elements and no payload.
  commit_pull.flags |= w::flag_ack_requested;
  d = w::decode(encode_data(commit_pull, payload_of(8, 3)), {});
  BOOST_TEST_REQUIRE(d.has_value());
  BOOST_TEST(d->header.flags == (w::flag_last_shard | w::flag_pull | w::flag_ack_requested));
  auto ack = data_header(w::message_kind::pull_reply);
  ack.element_count = 0;
  ack.flags = w::flag_last_shard;
  const bytes ack_frame = encode_data(ack, {});
  BOOST_TEST(ack_frame.size() == w::header_bytes);
  auto a = w::decode(ack_frame, {});
  BOOST_TEST_REQUIRE(a.has_value());
  BOOST_TEST(a->header.element_count == 0u);
  BOOST_TEST(a->payload.empty());
}

// Version 4: a pull_reply in parts. Offset 64 holds part | parts << 16;
// part i of n carries elements [i * per, ...) with per = ceil(count / n).
BOOST_AUTO_TEST_CASE(reply_parts_round_trip_and_bad_parts_are_refused_by_name) {
  static_assert(w::flag_part == 8u);
  BOOST_TEST(w::part_elements(10, 3, 0).first == 0u);
  BOOST_TEST(w::part_elements(10, 3, 1).first == 4u);
  BOOST_TEST(w::part_elements(10, 3, 2).count == 2u);
  BOOST_TEST(w::part_elements(10, 6, 5).count == 0u);  // per 2: 5 parts cover 10, a sixth is empty
  BOOST_TEST(w::part_elements(10, 1, 0).count == 0u);
  BOOST_TEST(w::parts_for(10, 4, 16) == 3u);            // 4 elements a part
  BOOST_TEST(w::parts_for(10, 4, 40) == 0u);            // one part: not in parts
  BOOST_TEST(w::parts_for(10, 4, 0) == 0u);             // off
  BOOST_TEST(w::parts_for(std::uint64_t{1} << 30, 4, 4096) == 65533u);  // capped at max_parts: parts grow to 16385 elements
  BOOST_TEST(w::parts_for(1000, 4, 4 * 166) == 7u);     // per 143 after the cap rule: 7 parts, none empty
  for (std::uint16_t i = 0; i < 3; ++i) {
    const auto m = encode_data(part_header(i), payload_of(i == 2 ? 8 : 16, 1));
    std::uint32_t at64 = 0;
    std::memcpy(&at64, m.data() + 64, 4);
    BOOST_TEST(at64 == (i | (3u << 16)));
    auto d = dec(m);
    BOOST_TEST_REQUIRE(d.has_value(), (d ? "" : d.error().to_string()));
    BOOST_TEST((d->header == part_header(i)));
    const auto pk = w::peek_part(std::span<const std::byte>(m).first(w::header_bytes));
    BOOST_TEST(pk.valid());
    BOOST_TEST(pk.part == i);
    BOOST_TEST(pk.parts == 3u);
    BOOST_TEST(pk.element_count == 10u);
  }
  BOOST_TEST(!w::peek_part(std::span<const std::byte>(every_kind()[2]).first(w::header_bytes)).valid());
  const auto last = encode_data(part_header(2), payload_of(8, 1));
  expect_error(dec(patched(last, 64, std::uint32_t{3 | (3u << 16)})), errc::malformed, "header.part = 3: must be < parts = 3");
  expect_error(dec(patched(last, 64, std::uint32_t{0 | (1u << 16)})), errc::malformed, "header.parts = 1: must be >= 2");
  expect_error(dec(patched(last, 64, std::uint32_t{0})), errc::malformed, "header.parts = 0: must be >= 2");
  expect_error(dec(patched(last, 64, std::uint32_t{0 | (11u << 16)})), errc::malformed,
               "header.parts = 11: must be >= 2 and <= element_count = 10");
  expect_error(dec(patched(last, 64, std::uint32_t{0 | (6u << 16)})), errc::malformed,
               "header.parts = 6: leaves an empty part of 10 elements");
  expect_error(dec(patched(last, 64, std::uint32_t{1 | (3u << 16)})), errc::malformed,
               "header.payload_bytes = 8: part 1 of 3 holds 4 elements");
  expect_error(dec(patched(last, 9, std::uint8_t(ashl::codec_id::topk))), errc::malformed, "header.codec = \"topk\": a pull_reply in parts is dense");
  // The flag on another kind, and offset 64 without it.
  const auto commit = encode_data(data_header(w::message_kind::commit), payload_of(8, 4));
  expect_error(dec(patched(commit, 12, w::flag_part | w::flag_last_shard)), errc::malformed,
               "header.codec = \"qsgd\": a commit in parts is dense");  // a compressed commit never comes in parts
  const auto request = encode_data(data_header(w::message_kind::pull_request), {});
  expect_error(dec(patched(request, 12, w::flag_part)), errc::malformed,
               "header.flags = 0x00000008: part is only for pull_reply and commit");
  const auto reply = encode_data(data_header(w::message_kind::pull_reply), payload_of(8, 4));
  expect_error(dec(patched(reply, 64, std::uint32_t{3u << 16})), errc::malformed, "header.samples = 196608");
  // The encoder refuses what the decoder would.
  w::header bad = part_header(0);
  bad.parts = 1;
  std::array<std::byte, w::header_bytes> head{};
  expect_error(w::seal_header(bad, payload_of(16, 1), head), errc::malformed, "header.parts = 1");
  bad = data_header(w::message_kind::pull_reply);
  bad.parts = 3;
  expect_error(w::seal_header(bad, payload_of(16, 1), head), errc::malformed, "header.parts = 3: part and parts are 0 without the part flag");
}

BOOST_AUTO_TEST_CASE(commit_parts_round_trip_and_bad_parts_are_refused_by_name) {
  BOOST_TEST(w::parts_for(std::uint64_t{1} << 20, 4, 4096, w::max_commit_parts) == 255u);  // capped: parts grow
  BOOST_TEST(w::parts_for(1000, 4, 400, w::max_commit_parts) == 10u);
  BOOST_TEST(w::parts_for(1000, 4, 400, 1) == 0u);  // at most one part: whole
  for (std::uint16_t i = 0; i < 3; ++i) {
    const auto m = encode_data(commit_part_header(i), payload_of(i == 2 ? 8 : 16, 1));
    std::uint32_t flags = 0, at64 = 0;
    std::memcpy(&flags, m.data() + 12, 4);
    std::memcpy(&at64, m.data() + 64, 4);
    BOOST_TEST(flags == (w::flag_last_shard | w::flag_pull | w::flag_part | (std::uint32_t{i} << 16) | (3u << 24)));
    BOOST_TEST(at64 == 96u);  // the samples, as in any commit
    auto d = dec(m);
    BOOST_TEST_REQUIRE(d.has_value(), (d ? "" : d.error().to_string()));
    BOOST_TEST((d->header == commit_part_header(i)));
    const auto pk = w::peek_part(std::span<const std::byte>(m).first(w::header_bytes));
    BOOST_TEST(pk.valid());
    BOOST_TEST((pk.kind == w::message_kind::commit));
    BOOST_TEST(pk.part == i);
    BOOST_TEST(pk.parts == 3u);
    BOOST_TEST(pk.element_count == 10u);
    BOOST_TEST(pk.sequence == 0x1122334455667788ull);
  }
  const auto last = encode_data(commit_part_header(2), payload_of(8, 1));
  const std::uint32_t low = w::flag_last_shard | w::flag_pull | w::flag_part;
  expect_error(dec(patched(last, 12, low | (3u << 16) | (3u << 24))), errc::malformed, "header.part = 3: must be < parts = 3");
  expect_error(dec(patched(last, 12, low | (0u << 16) | (1u << 24))), errc::malformed, "header.parts = 1: must be >= 2");
  expect_error(dec(patched(last, 12, low | (0u << 16) | (11u << 24))), errc::malformed,
               "header.parts = 11: must be >= 2 and <= element_count = 10");
  expect_error(dec(patched(last, 12, low | (1u << 16) | (3u << 24))), errc::malformed,
               "header.payload_bytes = 8: part 1 of 3 holds 4 elements");
  expect_error(dec(patched(last, 9, std::uint8_t(ashl::codec_id::topk))), errc::malformed,
               "header.codec = \"topk\": a commit in parts is dense");
  // Bits 16..31 without the part flag are unknown flags.
  const auto whole = encode_data(data_header(w::message_kind::commit), payload_of(8, 4));
  expect_error(dec(patched(whole, 12, w::flag_last_shard | (1u << 16))), errc::unsupported, "header.flags = 0x00010001: unknown flag bits");
  // The encoder refuses what the decoder would: more than 255 parts.
  w::header bad = commit_part_header(0);
  bad.element_count = 1000;
  bad.parts = 256;
  std::array<std::byte, w::header_bytes> head{};
  expect_error(w::seal_header(bad, payload_of(16, 1), head), errc::malformed, "header.parts = 256: a commit comes in at most 255 parts");
}

BOOST_AUTO_TEST_CASE(control_failures_name_field_and_value) {
  const auto all = every_kind();
  const auto& join = all[3];
  const auto& leave = all[4];
  const auto& plan = all[5];
  const auto& metric = all[6];
  const auto& error = all[7];
  expect_error(dec(patched(join, 16, std::uint64_t{1})), errc::malformed, "header.element_count = 1: must be 0 for a join");
  expect_error(dec(patched(join, 9, std::uint8_t{3})), errc::malformed, "header.codec = \"topk\": must be identity for a join");
  expect_error(dec(patched(metric, 10, std::uint8_t{1})), errc::malformed, "header.dtype = \"f16\": must be f32 for a metric");
  expect_error(dec(patched(join, 12, w::flag_last_shard)), errc::malformed, "header.flags = 0x00000001");
  BOOST_TEST(dec(patched(join, 12, w::flag_ack_requested)).has_value());
  expect_error(dec(patched(plan, 10, std::uint8_t(ashl::dtype::u8))), errc::malformed, "header.dtype = \"u8\"");
  // Bodies of the wrong size.
  bytes long_join = join;
  long_join.push_back(std::byte{0});
  expect_error(dec(patched(long_join, 56, std::uint64_t{37})), errc::malformed, "join.payload_bytes = 37: a join body is 36 bytes");
  bytes short_plan(plan.begin(), plan.end() - 1);
  expect_error(dec(patched(short_plan, 56, std::uint64_t{23})), errc::malformed, "plan_update.payload_bytes = 23");
  // The long body (codec options) with both options 0 is not the plan's
  // encoding (put_body writes the short one): refused, so that a decoded
  // message re-encodes to its own bytes (found by fuzz_wire_message).
  bytes zero_options = plan;
  zero_options.insert(zero_options.end(), 8, std::byte{0});
  expect_error(dec(patched(zero_options, 56, std::uint64_t{32})), errc::malformed,
               "plan_update.payload_bytes = 32: a plan without codec options is 24 bytes");
  // Body fields.
  expect_error(dec(patched(join, 72 + 8, std::uint32_t{0})), errc::invalid_argument, "join.batch = 0: must be >= 1");
  expect_error(dec(patched(leave, 72, std::uint32_t{4})), errc::malformed, "leave.reason = 4: unknown reason");
  // local_iterations 0 needs an interval (ADSP commits by time); with one it is a valid plan.
  expect_error(dec(patched(patched(plan, 72, std::uint32_t{0}), 76, std::uint32_t{0})), errc::invalid_argument,
               "plan_update.local_iterations = 0: must be >= 1 unless commit_interval_us > 0");
  BOOST_TEST(dec(patched(plan, 72, std::uint32_t{0})).has_value());
  BOOST_TEST(dec(patched(plan, 80, std::uint32_t{0})).has_value());  // batch 0: keep the worker's own
  expect_error(dec(patched(plan, 84, std::uint32_t{12})), errc::unsupported, "plan_update.stage = 12: unknown stage id");
  expect_error(dec(patched(plan, 84, std::uint32_t{0xffffffff})), errc::unsupported, "plan_update.stage = 4294967295");
  expect_error(dec(patched(plan, 88, std::numeric_limits<float>::quiet_NaN())), errc::invalid_argument,
               "plan_update.data_share = nan: must be finite and in [0, 1]");
  expect_error(dec(patched(plan, 88, 1.5f)), errc::invalid_argument, "plan_update.data_share = 1.5");
  expect_error(dec(patched(plan, 88, -0.5f)), errc::invalid_argument, "plan_update.data_share = -0.5");
  expect_error(dec(patched(plan, 92, 0.0f)), errc::invalid_argument,
               "plan_update.compression_ratio = 0: must be finite and in (0, 1]");
  expect_error(dec(patched(plan, 92, 1.25f)), errc::invalid_argument, "plan_update.compression_ratio = 1.25");
  expect_error(dec(patched(plan, 92, std::numeric_limits<float>::infinity())), errc::invalid_argument,
               "plan_update.compression_ratio = inf");
  expect_error(dec(patched(metric, 76, std::numeric_limits<double>::infinity())), errc::invalid_argument, "metric.value = inf: must be finite");
  expect_error(dec(patched(metric, 76, -std::numeric_limits<double>::infinity())), errc::invalid_argument, "metric.value = -inf");
  expect_error(dec(patched(metric, 76, std::numeric_limits<double>::quiet_NaN())), errc::invalid_argument, "metric.value = nan");
  expect_error(dec(patched(metric, 72, std::uint32_t{100})), errc::unsupported, "metric.name = 100: reserved metric id");
  expect_error(dec(patched(error, 72, std::uint32_t{0})), errc::malformed, "error.code = 0: not an error code");
  expect_error(dec(patched(error, 72, std::uint32_t{200})), errc::malformed, "error.code = 200");
  expect_error(dec(patched(error, 76, std::uint32_t{5})), errc::malformed, "error.text_bytes = 5: disagrees");
  bytes short_error(error.begin(), error.begin() + 72 + 15);
  expect_error(dec(patched(short_error, 56, std::uint64_t{15})), errc::malformed, "error.payload_bytes = 15");
  w::limits lim;
  lim.max_error_text = 10;
  expect_error(dec(error, lim), errc::out_of_range, "error.text_bytes = 29: exceeds limits.max_error_text = 10");
}

BOOST_AUTO_TEST_CASE(encoder_refuses_what_the_decoder_would) {
  bytes out(512);
  auto h = data_header(w::message_kind::commit);
  h.type = ashl::dtype::u8;
  expect_error(w::encode(h, payload_of(4, 0), out).to_status(), errc::malformed, "header.dtype = \"u8\"");
  h = data_header(w::message_kind::commit);
  h.flags = 1u << 7;
  expect_error(w::encode(h, payload_of(4, 0), out).to_status(), errc::unsupported, "header.flags = 0x00000080");
  h = data_header(w::message_kind::commit);
  h.codec = static_cast<ashl::codec_id>(200);
  expect_error(w::encode(h, payload_of(4, 0), out).to_status(), errc::unsupported, "header.codec = 200");
  h = data_header(w::message_kind::commit);
  expect_error(w::encode(h, payload_of(4, 0), std::span<std::byte>(out.data(), 75)).to_status(), errc::buffer_too_small,
               "wire.out.size = 75: bytes, fewer than the 76");
  h.kind = w::message_kind::join;
  expect_error(w::encode(h, payload_of(4, 0), out).to_status(), errc::invalid_argument, "header.kind = \"join\"");
  expect_error(w::encode(w::header{}, ashl::worker_plan{.data_share = std::nanf("")}, out).to_status(),
               errc::invalid_argument, "plan_update.data_share = nan");
  expect_error(w::encode(w::header{}, ashl::worker_plan{.local_iterations = 0}, out).to_status(),
               errc::invalid_argument, "plan_update.local_iterations = 0");
  expect_error(w::encode(w::header{}, ashl::worker_plan{.stage = static_cast<ashl::stage_id>(99)}, out).to_status(),
               errc::unsupported, "plan_update.stage = 99");
  expect_error(w::encode(w::header{}, w::metric_body{.value = HUGE_VAL}, out).to_status(), errc::invalid_argument,
               "metric.value = inf");
  expect_error(w::encode(w::header{}, w::join_body{.batch = 1}, std::span<std::byte>(out.data(), 91)).to_status(),
               errc::buffer_too_small, "wire.out.size = 91");
  w::header f16;
  f16.type = ashl::dtype::f16;
  expect_error(w::encode(f16, w::join_body{.batch = 1}, out).to_status(), errc::malformed, "header.dtype = \"f16\"");
  w::limits lim;
  lim.max_error_text = 3;
  expect_error(w::encode(w::header{}, w::error_body{.code = errc::internal, .text = "abcd"}, out, lim).to_status(),
               errc::out_of_range, "error.text_bytes = 4");
  BOOST_TEST(w::encoded_size(w::error_body{.text = "abcd"}) == 72u + 16u + 4u);
  BOOST_TEST(w::encoded_size(w::plan_update_body{}) == 96u);
}

BOOST_AUTO_TEST_CASE(every_single_byte_change_is_rejected) {
  for (const auto& m : every_kind()) {
    BOOST_TEST_REQUIRE(dec(m).has_value());
    bytes c = m;
    for (std::size_t i = 0; i < c.size(); ++i) {
      const std::byte orig = c[i];
      for (unsigned x = 1; x < 256; ++x) {
        c[i] = orig ^ std::byte(x);
        auto d = dec(c);
        if (d.has_value()) {
          BOOST_ERROR("kind " << std::to_integer<int>(m[8]) << " byte " << i << " xor " << x << " accepted");
          return;
        }
      }
      c[i] = orig;
    }
  }
}

BOOST_AUTO_TEST_CASE(every_truncation_and_extension_is_rejected) {
  for (const auto& m : every_kind()) {
    for (std::size_t n = 0; n < m.size(); ++n) {
      auto d = w::decode(std::span<const std::byte>(m.data(), n), {});
      BOOST_TEST_REQUIRE(!d.has_value(), "kind " << std::to_integer<int>(m[8]) << " length " << n);
      BOOST_TEST_REQUIRE((d.error().code() == errc::malformed));
    }
    bytes longer = m;
    longer.push_back(std::byte{0});
    expect_error(dec(longer), errc::malformed, "header.payload_bytes = ");
  }
}

BOOST_AUTO_TEST_CASE(peek_kind_reads_the_kind_that_decode_accepts) {
  // Every kind, whole or in parts: the undecoded header says what decode says.
  for (const auto& m : every_kind()) {
    const auto head = std::span<const std::byte>(m).first(w::header_bytes);
    auto d = dec(m);
    BOOST_TEST_REQUIRE(d.has_value(), (d ? "" : d.error().to_string()));
    const auto k = w::peek_kind(head);
    BOOST_TEST_REQUIRE(k.has_value());
    BOOST_TEST(w::to_string(*k) == w::to_string(d->header.kind));
  }
  // Not a whole header: no kind, whatever the bytes.
  const auto m = every_kind()[0];
  BOOST_TEST(!w::peek_kind(std::span<const std::byte>(m).first(w::header_bytes - 1)).has_value());
  BOOST_TEST(!w::peek_kind(std::span<const std::byte>(m).first(w::header_bytes + 1)).has_value());
  BOOST_TEST(!w::peek_kind({}).has_value());
  // A hint, not a check: a byte that is no kind comes back as it is.
  auto bad = m;
  bad[w::kind_offset] = std::byte{200};
  BOOST_TEST(static_cast<int>(*w::peek_kind(std::span<const std::byte>(bad).first(w::header_bytes))) == 200);
  BOOST_TEST(!dec(bad).has_value());
}

BOOST_AUTO_TEST_CASE(kind_names) {
  BOOST_TEST(w::to_string(w::message_kind::plan_update) == "plan_update");
  BOOST_TEST(w::to_string(w::message_kind::measurements) == "measurements");
  BOOST_TEST(w::is_control(w::message_kind::measurements));
  BOOST_TEST(w::is_control(w::message_kind::join));
  BOOST_TEST(!w::is_control(w::message_kind::pull_reply));
  BOOST_TEST(w::to_string(w::message_kind::lease) == "lease");
  BOOST_TEST(w::to_string(w::message_kind::replicate) == "replicate");
  BOOST_TEST(w::to_string(w::message_kind::replica_ack) == "replica_ack");
  BOOST_TEST(w::to_string(w::message_kind::replica_hello) == "replica_hello");
  BOOST_TEST(w::to_string(w::message_kind::shard_state) == "shard_state");
  BOOST_TEST(w::to_string(w::replica_event::measurement) == "measurement");
  for (auto k : {w::message_kind::lease, w::message_kind::replicate, w::message_kind::replica_ack,
                 w::message_kind::replica_hello, w::message_kind::shard_state})
    BOOST_TEST(w::is_control(k));
}

namespace {
// Little-endian reads at a byte offset of a frame.
struct at {
  const bytes& m;
  unsigned u8(std::size_t o) const { return std::to_integer<unsigned>(m[o]); }
  std::uint32_t u32(std::size_t o) const { std::uint32_t v; std::memcpy(&v, m.data() + o, 4); return v; }
  std::uint64_t u64(std::size_t o) const { std::uint64_t v; std::memcpy(&v, m.data() + o, 8); return v; }
  float f32(std::size_t o) const { float v; std::memcpy(&v, m.data() + o, 4); return v; }
  double f64(std::size_t o) const { double v; std::memcpy(&v, m.data() + o, 8); return v; }
};
}  // namespace

// Every control body at the offsets docs/wire-format.md gives (from header offset 72).
BOOST_AUTO_TEST_CASE(body_layouts_are_the_documented_ones) {
  const auto all = every_kind();
  {
    const at j{all[3]};
    BOOST_TEST(all[3].size() == 72u + 36u);
    BOOST_TEST(j.u64(72 + 0) == 7u);   // incarnation
    BOOST_TEST(j.u32(72 + 8) == 32u);  // batch
    BOOST_TEST(j.u64(72 + 12) == 0x1122334455667788u);  // job
    BOOST_TEST(j.u64(72 + 20) == 1000u);  // elements (version 6)
    BOOST_TEST(j.u32(72 + 28) == 1u);     // flags: failover
    BOOST_TEST(j.u32(72 + 32) == 2u);     // term
  }
  {
    const at l{all[11]};
    BOOST_TEST(all[11].size() == 72u + 44u);
    BOOST_TEST(l.u8(8) == 10u);                          // kind lease
    BOOST_TEST(l.u64(72 + 0) == 2u);                     // epoch
    BOOST_TEST(l.u64(72 + 8) == 96u);                    // begin
    BOOST_TEST(l.u64(72 + 16) == 160u);                  // end
    BOOST_TEST(l.u64(72 + 24) == 997u);                  // samples
    BOOST_TEST(l.u64(72 + 32) == 0x5eed5eed5eedull);     // shuffle_seed
    BOOST_TEST(l.u32(72 + 40) == 1u);                    // flags: epoch_end
  }
  {
    const at r{all[12]};
    BOOST_TEST(all[12].size() == 72u + 36u + 125u);
    BOOST_TEST(r.u8(8) == 11u);                      // kind replicate
    BOOST_TEST(r.u64(40) == 4u);                     // header clock: the term
    BOOST_TEST(r.u64(32) == 9u);                     // header sequence: the record's index
    BOOST_TEST(r.u8(72 + 0) == 4u);                  // event commit
    BOOST_TEST((r.u8(72 + 1) | r.u8(72 + 2) | r.u8(72 + 3)) == 0u);
    BOOST_TEST(r.u32(72 + 4) == 1u);                 // flags: state_crc
    BOOST_TEST(r.u64(72 + 8) == 411u);               // version_after
    BOOST_TEST(r.u64(72 + 16) == 0u);                // offset
    BOOST_TEST(r.u64(72 + 24) == 125u);              // total
    BOOST_TEST(r.u32(72 + 32) == 0x0badf00du);       // crc_after
    BOOST_TEST(std::memcmp(all[12].data() + 72 + 36, a_commit_record.data(), 125) == 0);  // the record as it is
    BOOST_TEST(r.u32(72 + 36) == 0x56454341u);       // "ACEV"
    BOOST_TEST(r.u8(72 + 36 + 6) == 4u);             // the record's kind
    const at t{all[13]};
    BOOST_TEST(all[13].size() == 72u + 36u + 120u);
    BOOST_TEST(t.u8(72) == 9u);                      // event tick
    BOOST_TEST(t.u64(72 + 24) == 120u);              // total: its record
    BOOST_TEST(t.u8(72 + 36 + 6) == 9u);             // the record's kind
    const at s{all[14]};
    BOOST_TEST(all[14].size() == 72u + 36u + 40u);
    BOOST_TEST(s.u8(72) == 0u);                      // event snapshot
    BOOST_TEST(s.u64(72 + 16) == 60u);
    BOOST_TEST(s.u64(72 + 24) == 100u);
  }
  {
    const at a{all[15]};
    BOOST_TEST(all[15].size() == 72u + 32u);
    BOOST_TEST(a.u8(8) == 12u);
    BOOST_TEST(a.u64(72 + 0) == 812u);         // received
    BOOST_TEST(a.u64(72 + 8) == 800u);         // applied
    BOOST_TEST(a.u64(72 + 16) == 411u);        // version
    BOOST_TEST(a.u32(72 + 24) == 0x1a2b3c4du); // crc
    BOOST_TEST(a.u32(72 + 28) == 0x5e6f7a8bu); // state_crc
  }
  {
    const at h{all[16]};
    BOOST_TEST(all[16].size() == 72u + 48u);
    BOOST_TEST(h.u8(8) == 13u);
    BOOST_TEST(h.u64(72 + 0) == 0x0123456789abcdefull);  // job
    BOOST_TEST(h.u32(72 + 8) == 1u);                     // shard
    BOOST_TEST(h.u32(72 + 12) == 3u);                    // servers
    BOOST_TEST(h.u64(72 + 16) == 1000u);                 // elements
    BOOST_TEST(h.u32(72 + 24) == 2u);                    // term
    BOOST_TEST(h.u64(72 + 28) == 812u);                  // have
    BOOST_TEST(h.u64(72 + 36) == 411u);                  // version
    BOOST_TEST(h.u32(72 + 44) == 0xcafef00du);           // crc
  }
  {
    const at s{all[17]};
    BOOST_TEST(all[17].size() == 72u + 8u);
    BOOST_TEST(s.u8(8) == 14u);
    BOOST_TEST(s.u32(72 + 0) == 3u);  // term
    BOOST_TEST(s.u32(72 + 4) == 1u);  // flags: backup
  }
  {
    const at l{all[4]};
    BOOST_TEST(all[4].size() == 72u + 8u);
    BOOST_TEST(l.u32(72 + 0) == 1u);  // reason evicted_timeout
    BOOST_TEST(l.u32(72 + 4) == 2u);  // subject
  }
  {
    const at p{all[5]};
    BOOST_TEST(all[5].size() == 72u + 24u);
    BOOST_TEST(p.u8(9) == 3u);                 // header codec topk
    BOOST_TEST(p.u8(10) == 1u);                // header dtype f16
    BOOST_TEST(p.u32(72 + 0) == 4u);           // local_iterations
    BOOST_TEST(p.u32(72 + 4) == 1500u);        // commit_interval_us
    BOOST_TEST(p.u32(72 + 8) == 48u);          // batch_size
    BOOST_TEST(p.u32(72 + 12) == 3u);          // stage: stage_id::ssp
    BOOST_TEST(p.f32(72 + 16) == 0.25f);       // data_share
    BOOST_TEST(p.f32(72 + 20) == 0.01f);       // compression_ratio
  }
  {
    const at m{all[6]};
    BOOST_TEST(all[6].size() == 72u + 12u);
    BOOST_TEST(m.u32(72 + 0) == 1u);      // name: metric_id::accuracy
    BOOST_TEST(m.f64(72 + 4) == 0.875);   // value
  }
  {
    const at e{all[7]};
    BOOST_TEST(all[7].size() == 72u + 16u + error_text.size());
    BOOST_TEST(e.u32(72 + 0) == static_cast<std::uint32_t>(errc::invalid_argument));
    BOOST_TEST(e.u32(72 + 4) == error_text.size());
    BOOST_TEST(e.u64(72 + 8) == 77u);
    BOOST_TEST(std::memcmp(all[7].data() + 72 + 16, error_text.data(), error_text.size()) == 0);
  }
  {
    const at r{all[8]};
    BOOST_TEST(all[8].size() == 72u + 4u + 3u * 25u);
    BOOST_TEST(r.u8(8) == 9u);                 // kind measurements
    BOOST_TEST(r.u32(28) == 3u);               // header rank: the worker measured
    BOOST_TEST(r.u32(72 + 0) == 3u);           // count
    const auto want = some_measurements();
    for (std::size_t i = 0; i < 3; ++i) {
      const std::size_t o = 72 + 4 + 25 * i;
      BOOST_TEST(r.u8(o + 0) == static_cast<unsigned>(want[i].kind));
      BOOST_TEST(r.f64(o + 1) == want[i].seconds);
      BOOST_TEST(r.f64(o + 9) == want[i].amount);
      BOOST_TEST(r.f64(o + 17) == want[i].time);
    }
  }
}

// The numbers docs/wire-format.md documents; never renumber, only append.
BOOST_AUTO_TEST_CASE(documented_id_values_are_pinned) {
  using k = w::message_kind;
  static_assert(static_cast<int>(k::commit) == 1 && static_cast<int>(k::pull_request) == 2 &&
                static_cast<int>(k::pull_reply) == 3 && static_cast<int>(k::join) == 4 &&
                static_cast<int>(k::leave) == 5 && static_cast<int>(k::plan_update) == 6 &&
                static_cast<int>(k::metric) == 7 && static_cast<int>(k::error) == 8 &&
                static_cast<int>(k::measurements) == 9 && static_cast<int>(k::lease) == 10 &&
                static_cast<int>(k::replicate) == 11 && static_cast<int>(k::replica_ack) == 12 &&
                static_cast<int>(k::replica_hello) == 13 && static_cast<int>(k::shard_state) == 14);
  static_assert(w::message_kind_first == 1 && w::message_kind_last == 14);
  using re = w::replica_event;
  static_assert(static_cast<int>(re::snapshot) == 0 && static_cast<int>(re::join) == 1 && static_cast<int>(re::leave) == 2 &&
                static_cast<int>(re::evict) == 3 && static_cast<int>(re::commit) == 4 && static_cast<int>(re::pull) == 5 &&
                static_cast<int>(re::metric) == 6 && static_cast<int>(re::measurement) == 7 &&
                static_cast<int>(re::drain) == 8 && static_cast<int>(re::tick) == 9);
  static_assert(w::join_flag_failover == 1u && w::lease_flag_epoch_end == 1u && w::lease_flag_resent == 2u &&
                w::replicate_flag_state_crc == 1u && w::shard_state_flag_backup == 1u);
  static_assert(w::join_body::wire_bytes == 36 && w::lease_body::wire_bytes == 44 && w::replicate_body::fixed_bytes == 36 &&
                w::replica_ack_body::wire_bytes == 32 && w::replica_hello_body::wire_bytes == 48 &&
                w::shard_state_body::wire_bytes == 8);
  static_assert(w::version == 6 && w::header_bytes == 72 && w::crc_offset == 68 && w::magic == 0x4C485341u);
  using lr = w::leave_reason;
  static_assert(static_cast<int>(lr::left) == 0 && static_cast<int>(lr::evicted_timeout) == 1 &&
                static_cast<int>(lr::evicted_failure) == 2 && static_cast<int>(lr::evicted_policy) == 3 &&
                w::leave_reason_count == 4);
  static_assert(to_string(lr::evicted_failure) == "evicted_failure" && w::leave_reason_table.parse("left") == lr::left &&
                !w::leave_reason_table.from_value(4u));
  using mi = ashl::metric_id;
  static_assert(static_cast<int>(mi::loss) == 0 && static_cast<int>(mi::accuracy) == 1 &&
                static_cast<int>(mi::samples_per_second) == 2 && static_cast<int>(mi::iteration_seconds) == 3 &&
                ashl::metric_id_count == 4 && ashl::metric_id_application == 1024);
  using st = ashl::stage_id;
  static_assert(static_cast<int>(st::none) == 0 && static_cast<int>(st::bsp) == 1 && static_cast<int>(st::asp) == 2 &&
                static_cast<int>(st::ssp) == 3 && static_cast<int>(st::local_sgd) == 4 &&
                static_cast<int>(st::dssp) == 5 && static_cast<int>(st::semi_async) == 6 &&
                static_cast<int>(st::adsp) == 7 && static_cast<int>(st::profile) == 8 &&
                static_cast<int>(st::ahl) == 9 && static_cast<int>(st::shl) == 10 && static_cast<int>(st::dlb) == 11 &&
                ashl::stage_id_count == 12);
  using mk = ashl::measurement_kind;
  static_assert(static_cast<int>(mk::compute) == 0 && static_cast<int>(mk::push) == 1 &&
                static_cast<int>(mk::pull) == 2 && static_cast<int>(mk::compress) == 3 &&
                static_cast<int>(mk::commit) == 4 && static_cast<int>(mk::round) == 5 &&
                ashl::measurement_kind_count == 6);
  static_assert(w::flag_last_shard == 1u && w::flag_ack_requested == 2u);
  // error.code carries an errc (1..11); header.dtype a dtype.
  static_assert(static_cast<int>(errc::ok) == 0 && static_cast<int>(errc::invalid_argument) == 1 &&
                static_cast<int>(errc::out_of_range) == 2 && static_cast<int>(errc::malformed) == 3 &&
                static_cast<int>(errc::checksum_mismatch) == 4 && static_cast<int>(errc::unsupported) == 5 &&
                static_cast<int>(errc::buffer_too_small) == 6 && static_cast<int>(errc::not_found) == 7 &&
                static_cast<int>(errc::io_error) == 8 && static_cast<int>(errc::unavailable) == 9 &&
                static_cast<int>(errc::timed_out) == 10 && static_cast<int>(errc::internal) == 11);
  static_assert(static_cast<int>(ashl::dtype::f32) == 0 && static_cast<int>(ashl::dtype::f16) == 1 &&
                static_cast<int>(ashl::dtype::bf16) == 2 && static_cast<int>(ashl::dtype::f64) == 3 &&
                static_cast<int>(ashl::dtype::i8) == 4 && static_cast<int>(ashl::dtype::u8) == 5);
  static_assert(w::body_traits<ashl::worker_plan>::wire_bytes == 32 && w::body_traits<ashl::worker_plan>::wire_bytes_before_codec == 24 &&
                w::body_traits<ashl::worker_plan>::kind == w::message_kind::plan_update);
  static_assert(std::is_same_v<w::plan_update_body, ashl::worker_plan>);
  static_assert(w::measurements_body::record_bytes == 25 && w::measurements_body::fixed_bytes == 4);
  BOOST_TEST(w::limits{}.max_measurements == 1024u);
}

BOOST_AUTO_TEST_CASE(plan_bodies_round_trip) {
  const ashl::worker_plan plans[] = {
      a_plan,
      // ADSP: commit by interval, no local-iteration count.
      {.local_iterations = 0, .commit_interval_us = 250'000, .batch_size = 0, .stage = ashl::stage_id::adsp,
       .data_share = 0.5f, .compression_ratio = 1.0f},
      // Batch 0 keeps the worker's own; the extremes of share and ratio.
      {.local_iterations = 1, .commit_interval_us = 0, .batch_size = 0, .stage = ashl::stage_id::dlb,
       .data_share = 0.0f, .compression_ratio = 1.0f},
      {.local_iterations = 0xffffffffu, .commit_interval_us = 0xffffffffu, .batch_size = 0xffffffffu,
       .stage = ashl::stage_id::shl, .data_share = 1.0f, .compression_ratio = 1e-30f},
      ashl::worker_plan{},
  };
  for (const auto& plan : plans) {
    const auto m = encode_control(plan);
    auto d = dec(m);
    BOOST_TEST_REQUIRE(d.has_value(), (d ? "" : d.error().to_string()));
    BOOST_TEST_REQUIRE(d->get<ashl::worker_plan>() != nullptr);
    BOOST_TEST((*d->get<ashl::worker_plan>() == plan));
    bytes again(m.size());
    BOOST_TEST_REQUIRE(w::encode(*d, again).has_value());
    BOOST_TEST((again == m));
  }
  BOOST_TEST(ashl::worker_plan{.commit_interval_us = 250'000}.commit_interval() == 0.25);
}

// A plan with codec options travels in 32 bytes; one without them in the 24
// bytes every version-5 peer reads (the same bytes as before the options).
BOOST_AUTO_TEST_CASE(plan_bodies_with_codec_options) {
  const ashl::worker_plan with{.local_iterations = 500, .compression_ratio = 0.14f, .codec_bits = 4, .codec_block = 128};
  const auto m = encode_control(with);
  BOOST_TEST(m.size() == w::header_bytes + 32);
  auto d = dec(m);
  BOOST_TEST_REQUIRE(d.has_value(), (d ? "" : d.error().to_string()));
  BOOST_TEST((*d->get<ashl::worker_plan>() == with));
  BOOST_TEST(d->get<ashl::worker_plan>()->compression_options().bits == 4u);
  BOOST_TEST(d->get<ashl::worker_plan>()->compression_options().block == 128u);
  // Without options: 24 bytes, ending with the ratio.
  ashl::worker_plan without = with;
  without.codec_bits = 0;
  without.codec_block = 0;
  const auto m24 = encode_control(without);
  BOOST_TEST_REQUIRE(m24.size() == w::header_bytes + 24);
  float ratio = 0;
  std::memcpy(&ratio, m24.data() + w::header_bytes + 20, 4);
  BOOST_TEST(ratio == 0.14f);
  auto d24 = dec(m24);
  BOOST_TEST_REQUIRE(d24.has_value());
  BOOST_TEST((*d24->get<ashl::worker_plan>() == without));
  // Any other size is refused by name (a 28-byte body: one option cut off).
  const bytes cut(m.begin(), m.end() - 4);
  expect_error(dec(patched(cut, 56, std::uint64_t{28})), errc::malformed,
               "plan_update.payload_bytes = 28: a plan_update body is 24 or 32 bytes");
}

BOOST_AUTO_TEST_CASE(measurements_round_trip_every_kind) {
  std::vector<ashl::measurement> ms;
  for (std::uint8_t k = 0; k < ashl::measurement_kind_count; ++k)
    ms.push_back({.worker = 3, .kind = static_cast<ashl::measurement_kind>(k), .seconds = 1e-9 * (k + 1),
                  .amount = k == 0 ? 0.0 : 1e12 * k, .time = -1e6 + k});
  const auto m = encode_measurements(ms);
  auto d = dec(m);
  BOOST_TEST_REQUIRE(d.has_value(), (d ? "" : d.error().to_string()));
  const auto* r = d->get<w::measurements_body>();
  BOOST_TEST_REQUIRE(r != nullptr);
  BOOST_TEST_REQUIRE(r->size() == ms.size());
  for (std::size_t i = 0; i < ms.size(); ++i) BOOST_TEST(((*r)[i] == ms[i]));
  bytes again(m.size());
  BOOST_TEST_REQUIRE(w::encode(*d, again).has_value());
  BOOST_TEST((again == m));
  // The limit itself is accepted.
  w::limits lim;
  lim.max_measurements = static_cast<std::uint32_t>(ms.size());
  BOOST_TEST(w::decode(m, lim).has_value());
}

BOOST_AUTO_TEST_CASE(measurements_decode_and_read_without_allocating) {
  std::vector<ashl::measurement> ms(1024, {.worker = 3, .kind = ashl::measurement_kind::pull, .seconds = 0.5,
                                           .amount = 8, .time = 1});
  const auto m = encode_measurements(ms);
  // A count far beyond the bytes (the limit raised out of the way) is refused
  // before anything is sized by it: only the error text is allocated.
  const auto huge = patched(m, 72, std::uint32_t{0x7fffffff});
  w::limits big;
  big.max_measurements = 0xffffffffu;
  double sum = 0.0;
  const std::size_t before = allocations.load();
  auto d = w::decode(m, {});
  if (d)
    if (const auto* r = d->get<w::measurements_body>())
      for (const ashl::measurement x : *r) sum += x.seconds;
  BOOST_TEST(allocations.load() == before);
  BOOST_TEST_REQUIRE(d.has_value());
  BOOST_TEST(sum == 512.0);
  const std::size_t bytes_before = allocated_bytes.load();
  auto bad = w::decode(huge, big);  // refused; only its error text allocates
  BOOST_TEST(allocated_bytes.load() - bytes_before < 4096u);
  BOOST_TEST_REQUIRE(!bad.has_value());
  BOOST_TEST(bad.error().message().rfind("measurements.count = 2147483647: disagrees", 0) == 0u);
}

BOOST_AUTO_TEST_CASE(malformed_measurements_are_refused_naming_the_field) {
  const auto m = encode_measurements(some_measurements());
  const std::size_t r1 = 72 + 4 + 25;  // record 1
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  expect_error(dec(patched(m, r1, std::uint8_t{6})), errc::unsupported,
               "measurements[1].kind = 6: unknown measurement kind");
  expect_error(dec(patched(m, r1, std::uint8_t{255})), errc::unsupported, "measurements[1].kind = 255");
  expect_error(dec(patched(m, r1 + 1, 0.0)), errc::invalid_argument, "measurements[1].seconds = 0: must be finite and > 0");
  expect_error(dec(patched(m, r1 + 1, -0.5)), errc::invalid_argument, "measurements[1].seconds = -0.5");
  expect_error(dec(patched(m, r1 + 1, nan)), errc::invalid_argument, "measurements[1].seconds = nan");
  expect_error(dec(patched(m, r1 + 1, inf)), errc::invalid_argument, "measurements[1].seconds = inf");
  expect_error(dec(patched(m, r1 + 9, -1.0)), errc::invalid_argument, "measurements[1].amount = -1: must be finite and >= 0");
  expect_error(dec(patched(m, r1 + 9, inf)), errc::invalid_argument, "measurements[1].amount = inf");
  expect_error(dec(patched(m, r1 + 17, nan)), errc::invalid_argument, "measurements[1].time = nan: must be finite");
  expect_error(dec(patched(m, r1 + 17, -inf)), errc::invalid_argument, "measurements[1].time = -inf");
  // The count must agree with the bytes, be >= 1 and within the limit.
  expect_error(dec(patched(m, 72, std::uint32_t{2})), errc::malformed,
               "measurements.count = 2: disagrees with the 75 bytes after it");
  expect_error(dec(patched(m, 72, std::uint32_t{0xffffffff})), errc::out_of_range,
               "measurements.count = 4294967295: exceeds limits.max_measurements = 1024");
  bytes empty(m.begin(), m.begin() + 72 + 4);
  expect_error(dec(patched(patched(empty, 56, std::uint64_t{4}), 72, std::uint32_t{0})), errc::malformed,
               "measurements.count = 0: a measurements message carries at least one record");
  bytes tiny(m.begin(), m.begin() + 72 + 3);
  expect_error(dec(patched(tiny, 56, std::uint64_t{3})), errc::malformed, "measurements.payload_bytes = 3");
  bytes partial(m.begin(), m.end() - 1);
  expect_error(dec(patched(partial, 56, std::uint64_t{partial.size() - 72})), errc::malformed,
               "measurements.count = 3: disagrees with the 74 bytes after it");
  w::limits lim;
  lim.max_measurements = 2;
  expect_error(dec(m, lim), errc::out_of_range, "measurements.count = 3: exceeds limits.max_measurements = 2");
  // Header rules of a control kind.
  expect_error(dec(patched(m, 9, std::uint8_t{3})), errc::malformed, "header.codec = \"topk\": must be identity");
  expect_error(dec(patched(m, 16, std::uint64_t{3})), errc::malformed, "header.element_count = 3: must be 0");
}

BOOST_AUTO_TEST_CASE(measurement_encoder_refuses_what_the_decoder_would) {
  bytes out(1024);
  w::header h;
  h.rank = 3;
  auto ms = some_measurements();
  auto enc = [&](const std::vector<ashl::measurement>& v, const w::limits& lim = {}) {
    return w::encode(h, std::span<const ashl::measurement>(v), out, lim).to_status();
  };
  BOOST_TEST(enc(ms).ok());
  auto bad = ms;
  bad[2].seconds = 0.0;
  expect_error(enc(bad), errc::invalid_argument, "measurements[2].seconds = 0");
  bad = ms;
  bad[0].kind = static_cast<ashl::measurement_kind>(17);
  expect_error(enc(bad), errc::unsupported, "measurements[0].kind = 17");
  bad = ms;
  bad[1].worker = 4;
  expect_error(enc(bad), errc::invalid_argument, "measurements[1].worker = 4: must equal header.rank = 3");
  expect_error(enc({}), errc::malformed, "measurements.count = 0");
  w::limits lim;
  lim.max_measurements = 1;
  expect_error(enc(ms, lim), errc::out_of_range, "measurements.count = 3: exceeds limits.max_measurements = 1");
  expect_error(w::encode(h, std::span<const ashl::measurement>(ms), std::span<std::byte>(out.data(), 100)).to_status(),
               errc::buffer_too_small, "wire.out.size = 100: bytes, fewer than the 151");
  // A decoded body re-encodes only under its own rank.
  const auto m = encode_measurements(ms);
  auto d = dec(m);
  BOOST_TEST_REQUIRE(d.has_value());
  w::header other = d->header;
  other.rank = 4;
  expect_error(w::encode(other, *d->get<w::measurements_body>(), out).to_status(), errc::invalid_argument,
               "measurements.worker = 3: must equal header.rank = 4");
}

// Issue 28: decode's visitor sees the payload in order, in chunks of
// decode_chunk_bytes right after the CRC read them, with the header as read;
// the result is the same as without a visitor, a corrupt payload is still
// refused (after the visitor saw it: what it learnt counts for nothing), and
// the visited decode allocates nothing.
BOOST_AUTO_TEST_CASE(decode_visits_the_payload_in_chunks_as_the_crc_reads_it) {
  auto h = data_header(w::message_kind::commit);
  const std::size_t size = 2 * w::decode_chunk_bytes + 4100;
  const auto p = payload_of(size, 3);
  h.element_count = size / 4;
  std::array<std::byte, w::header_bytes> head{};
  BOOST_TEST_REQUIRE(w::seal_header(h, p, head).ok());
  std::vector<std::size_t> offsets, sizes;
  offsets.reserve(8);
  sizes.reserve(8);
  std::size_t kinds_seen = 0;
  auto visit = [&](const w::header& raw, std::span<const std::byte> chunk) {
    offsets.push_back(static_cast<std::size_t>(chunk.data() - reinterpret_cast<const std::byte*>(p.data())));
    sizes.push_back(chunk.size());
    kinds_seen += raw.kind == w::message_kind::commit && raw.element_count == h.element_count ? 1 : 0;
  };
  const std::size_t before = allocations.load();
  auto d = w::decode(head, p, {}, visit);
  BOOST_TEST(allocations.load() == before);
  BOOST_TEST_REQUIRE(d.has_value());
  BOOST_TEST((d->header == h));
  BOOST_TEST((offsets == std::vector<std::size_t>{0, w::decode_chunk_bytes, 2 * w::decode_chunk_bytes}));
  BOOST_TEST((sizes == std::vector<std::size_t>{w::decode_chunk_bytes, w::decode_chunk_bytes, 4100}));
  BOOST_TEST(kinds_seen == 3u);
  bytes flipped(p.begin(), p.end());
  flipped[size - 1] ^= std::byte{0x40};
  offsets.clear();
  sizes.clear();
  expect_error(w::decode(head, flipped, {}, visit), errc::checksum_mismatch, "header.crc32c");
  BOOST_TEST(sizes.size() == 3u);
  // No payload: no call.
  auto e = data_header(w::message_kind::pull_request);
  std::array<std::byte, w::header_bytes> head2{};
  BOOST_TEST_REQUIRE(w::seal_header(e, {}, head2).ok());
  sizes.clear();
  BOOST_TEST(w::decode(head2, {}, {}, visit).has_value());
  BOOST_TEST(sizes.empty());
}

// Flag `unchecked` (docs/wire-format.md): a commit or pull_reply sealed
// with CRC 0 and no CRC computed, taken only where the receiver allows it
// (limits::unchecked_allowed: a trusted peer on this host); the decoder's
// visitor still sees every chunk, and every other check stays.
BOOST_AUTO_TEST_CASE(unchecked_messages_carry_no_crc_and_are_taken_only_where_allowed) {
  w::header h = data_header(w::message_kind::pull_reply);
  h.flags |= w::flag_unchecked;
  h.element_count = 100000;  // 400 KB: three of decode's chunks
  const bytes payload = payload_of(4 * h.element_count, 3);
  const bytes m = encode_data(h, payload);
  std::uint32_t crc = 1;
  std::memcpy(&crc, m.data() + w::crc_offset, 4);
  BOOST_TEST(crc == 0u);
  // The same through seal_header, from the payload and from a known CRC.
  bytes head(w::header_bytes);
  BOOST_TEST_REQUIRE(w::seal_header(h, payload, head).ok());
  BOOST_TEST(std::memcmp(head.data(), m.data(), w::header_bytes) == 0);
  BOOST_TEST_REQUIRE(w::seal_header(h, payload.size(), 0xdeadbeefu, head).ok());
  BOOST_TEST(std::memcmp(head.data(), m.data(), w::header_bytes) == 0);

  expect_error(dec(m), errc::malformed,
               "header.flags = 0x00000021: unchecked (no CRC) is taken only from a peer on this host");
  w::limits allowed;
  allowed.unchecked_allowed = true;
  std::size_t seen = 0;
  auto ok = w::decode(std::span<const std::byte>(m).first(w::header_bytes), std::span<const std::byte>(m).subspan(w::header_bytes),
                      allowed, [&](const w::header&, std::span<const std::byte> chunk) { seen += chunk.size(); });
  BOOST_TEST_REQUIRE(ok.has_value(), (ok ? "" : ok.error().message()));
  BOOST_TEST(seen == payload.size());
  // No CRC: a flipped payload bit is not caught (what the flag trades away)...
  bytes flipped = m;
  flipped[w::header_bytes + 5] ^= std::byte{1};
  BOOST_TEST(dec(flipped, allowed).has_value());
  // ...and a CRC field that is not 0 is refused, as is the flag on other kinds.
  bytes with_crc = m;
  with_crc[w::crc_offset] = std::byte{1};
  expect_error(dec(with_crc, allowed), errc::malformed, "header.crc32c = 0x00000001: must be 0 with the flag unchecked");
  w::header q = data_header(w::message_kind::pull_request);
  q.flags |= w::flag_unchecked;
  bytes out(w::header_bytes);
  const auto sealed = w::seal(q, 0, out);
  BOOST_TEST(!sealed.has_value());
  BOOST_TEST(sealed.error().message().find("unchecked is only for commit and pull_reply") != std::string::npos);
  // A checked message is taken where unchecked ones are allowed.
  BOOST_TEST(dec(encode_data(data_header(w::message_kind::pull_reply), payload_of(4000, 1)), allowed).has_value());
}
