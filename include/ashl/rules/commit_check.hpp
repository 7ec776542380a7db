// ashl/rules/commit_check.hpp — a commit split over several servers is
// checked whole before any part of it leaves the worker: every shard's part
// against the servers' value rule (no NaN or infinite value unless
// allow_non_finite; server_core's own check, the same functions), so a bad
// value in one server's half can no longer be refused there while another
// server applies its half (docs/ps.md "All or nothing
// across shards"). ps::worker runs it in commit(), push() and
// commit_encoded(); the simulator runs it on the parts its compute hook
// made, before the first shard's transfer: one rule in both drivers.
//
//   std::vector<ashl::ps::commit_part_view> parts;   // one per server, in shard order
//   parts.push_back({.payload = std::as_bytes(update.subspan(r.begin, r.size())), .element_count = r.size(),
//                    .model_begin = r.begin});
//   if (auto s = ashl::ps::check_commit_parts(parts, {.allow_non_finite = false}); !s) return s;  // nothing sent
//
// A part whose view names a `crc` gets the CRC-32C of its whole payload
// written there, computed in the same pass as its value check
// (wire::crc32c_chunked, the fusion the server's CRC check and finite scan
// use): ps::worker seals the header over it (wire::seal_header with the
// payload's CRC) instead of reading the payload a second time. Written
// whether or not the values pass; worth nothing when the check fails.
//
// The servers still check every part they receive (a worker of another
// build, or a payload a codec decodes to an infinity, is refused there): this
// check makes the refusal whole for the worker that follows the rule.
// Refusals that depend on one server's state (its store full, the worker
// evicted there, its receive budget) are not content and are not covered:
// the wait fails with that server's error.
#pragma once

#include <ashl/config.hpp>
#include <ashl/compress/registry.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/rules/finite.hpp>
#include <ashl/wire/crc32c.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

ASHL_NAMESPACE_BEGIN
namespace ps {

// One shard's part of a commit, as the worker will send it.
struct commit_part_view {
  codec_id codec = codec_id::identity;
  dtype type = dtype::f32;
  std::span<const std::byte> payload{};
  std::uint64_t element_count = 0;  // the shard's elements
  std::uint64_t model_begin = 0;    // the shard's first element in the model (for the error)
  std::uint32_t* crc = nullptr;     // where to write crc32c(payload) (null: not computed)
};

struct commit_value_rules {
  bool allow_non_finite = false;  // the servers' server_core_params::allow_non_finite
};

// Every part's values as they lie in the payload (dense casts and sparse
// pairs; another codec's values are known only once decoded, which its
// server does). The first non-finite value refuses the whole commit, naming
// the server whose part holds it, the element, and the value.
inline status check_commit_parts(std::span<const commit_part_view> parts, const commit_value_rules& r) {
  for (std::size_t s = 0; s < parts.size(); ++s) {
    const commit_part_view& p = parts[s];
    if (r.allow_non_finite) {
      if (p.crc != nullptr) *p.crc = wire::crc32c(p.payload);
      continue;
    }
    const compress::payload_info info{static_cast<std::size_t>(p.element_count), p.type};
    const std::byte* values = nullptr;
    const std::byte* indices = nullptr;
    std::size_t n = 0;
    dtype type = p.type;
    const std::size_t dense = compress::dense_payload_bytes(p.codec, info);
    if (dense != 0 && p.payload.size() == dense) {
      values = p.payload.data();
      n = static_cast<std::size_t>(p.element_count);
      type = dense_values_type(p.codec, p.type);
    } else if (compress::sparse_pairs(p.codec) && compress::sparse_pairs_well_formed(p.payload, info)) {
      n = ::ashl::compress::detail::load_le32(p.payload.data() + 8);
      indices = p.payload.data() + 12;
      values = indices + 4 * n;
    } else {
      if (p.crc != nullptr) *p.crc = wire::crc32c(p.payload);
      continue;  // decoded values: its server checks them
    }
    const detail::float_bits b = detail::bits_of(type);
    std::size_t i = n;
    if (p.crc != nullptr && indices == nullptr) {
      // Dense: the values are the payload; each chunk is scanned right
      // after the CRC read it.
      static_assert(wire::crc32c_chunk_bytes % 4 == 0, "a chunk holds whole values");
      *p.crc = wire::crc32c_chunked(p.payload, 0, [&](std::span<const std::byte> chunk) {
        if (i != n) return;
        const std::size_t k = chunk.size() / b.bytes;
        const std::size_t j = detail::first_non_finite(chunk.data(), k, b.bytes, b.mask);
        if (j != k) i = static_cast<std::size_t>(chunk.data() - values) / b.bytes + j;
      });
    } else {
      if (p.crc != nullptr) *p.crc = wire::crc32c(p.payload);  // sparse pairs: the values are a few of its bytes
      i = detail::first_non_finite(values, n, b.bytes, b.mask);
    }
    if (i == n) continue;
    const std::uint64_t element = indices != nullptr ? ::ashl::compress::detail::load_le32(indices + 4 * i) : i;
    return make_error(errc::invalid_argument, "commit.payload[" + std::to_string(element) + "]",
                      detail::non_finite_value(values, i, b.bytes, b.mask),
                      "a non-finite value in server " + std::to_string(s) + "'s part (element " +
                          std::to_string(p.model_begin + element) + " of the model); the commit is refused whole, "
                          "no part of it was sent to any server (allow_non_finite accepts it)");
  }
  return {};
}

}  // namespace ps
ASHL_NAMESPACE_END
