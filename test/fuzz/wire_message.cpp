// Fuzz target: wire::decode on arbitrary bytes must never crash, read out of
// bounds or accept something it cannot reproduce. Whatever it accepts is
// encoded again and must come back byte for byte (the format has one
// encoding per message), and must decode again to the same header.
// Random bytes almost never carry a valid CRC, so each input is also tried
// with its checksum recomputed, which lets the fuzzer reach the field checks.
// A measurements message's records are read back through the view and must
// satisfy the rules decode checked (the view allocates nothing).
// A pull_reply or commit in parts must peek (wire::peek_part, read before
// the checks) as what decode accepted.
// Seed corpus: test/fuzz/corpus/wire_message/ (one valid message of every
// kind, a pull_reply part and a commit part, version 6: replicate as a
// core event record, a tick and a snapshot's piece too).
// A version-6 body decode accepted holds the rules it checked (a lease's
// positions, a replicate's record inside its total, a view into the input).
#include <ashl/wire/message.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <vector>

namespace {
namespace w = ashl::wire;

void check_one(std::span<const std::byte> in) {
  const std::size_t size = in.size();
  w::limits lim;
  lim.max_elements = std::uint64_t{1} << 20;
  lim.max_payload_bytes = std::uint64_t{1} << 20;
  lim.max_error_text = 256;
  lim.max_measurements = 64;
  auto m = w::decode(in, lim);
  if (!m) {
    if (m.error().message().empty()) std::abort();  // every refusal says why
    return;
  }
  if (m->payload.data() != in.data() + w::header_bytes) std::abort();  // a view, not a copy
  if (const auto* r = m->get<w::measurements_body>()) {
    if (r->size() == 0 || r->size() > lim.max_measurements || r->worker != m->header.rank) std::abort();
    for (const ashl::measurement x : *r) {
      if (static_cast<unsigned>(x.kind) >= ashl::measurement_kind_count || !(x.seconds > 0.0) ||
          !std::isfinite(x.seconds) || !(x.amount >= 0.0) || !std::isfinite(x.amount) || !std::isfinite(x.time))
        std::abort();
    }
  }
  if (const auto* l = m->get<w::lease_body>()) {
    if (!(l->begin < l->end && l->end <= l->samples) || (l->flags & ~w::lease_flags_known) != 0) std::abort();
  }
  if (const auto* r = m->get<w::replicate_body>()) {
    if (r->record.data() + r->record.size() != in.data() + size) std::abort();  // the record is the body's tail, a view
    if (r->record.empty() || r->offset >= r->total || r->record.size() > r->total - r->offset) std::abort();
  }
  if (const auto* a = m->get<w::replica_ack_body>(); a && a->applied > a->received) std::abort();
  if (const auto* h = m->get<w::replica_hello_body>(); h && (h->shard >= h->servers || h->elements == 0)) std::abort();
  if (const auto* st = m->get<w::shard_state_body>(); st && st->term == 0) std::abort();
  const w::peeked_part pk = w::peek_part(in.first(w::header_bytes));
  if (pk.valid() != ((m->header.flags & w::flag_part) != 0)) std::abort();
  if (pk.valid() && (pk.part != m->header.part || pk.parts != m->header.parts || pk.kind != m->header.kind ||
                     pk.element_count != m->header.element_count || pk.sequence != m->header.sequence ||
                     w::part_elements(pk.element_count, pk.parts, pk.part).count * ashl::size_of(m->header.type) !=
                         m->payload.size()))
    std::abort();
  std::vector<std::byte> out(size);
  auto n = w::encode(*m, out, lim);
  if (!n || *n != size || std::memcmp(out.data(), in.data(), size) != 0) std::abort();
  auto again = w::decode(out, lim);
  if (!again || !(again->header == m->header)) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  check_one(in);
  if (size >= w::header_bytes) {
    std::vector<std::byte> fixed(in.begin(), in.end());
    const std::uint32_t crc = w::crc32c(in.subspan(w::header_bytes), w::crc32c(in.first(w::crc_offset)));
    for (int i = 0; i < 4; ++i) fixed[w::crc_offset + i] = std::byte(static_cast<unsigned char>(crc >> (8 * i)));
    check_one(fixed);
  }
  return 0;
}
