// ashl/rules/server_core_checks.hpp — what a commit must pass before the
// policy sees it: server_core's validate() (limits, element count, dtype,
// codec, store room, the payload's form) and its finite-values check, which
// names the first NaN or infinite element. A refused commit changes nothing
// but the refusal counters (rules/server_core_vocabulary.hpp, `refusal`).
//
//   #include <ashl/rules/server_core.hpp>   // includes this; server_core::commit() calls validate()
//
// Definitions of server_core's members, out of the class so that
// rules/server_core.hpp reads as the rules' outline; docs/design.md "Server
// core"; docs/ps.md.
#pragma once

#include <ashl/rules/server_core.hpp>

ASHL_NAMESPACE_BEGIN
namespace ps {

// Every check before the policy may see the commit. On success in_acc_
// says whether acc_ now holds the commit decoded at scale 1 (sgd, a codec
// whose check is its decode).
template <sync::consistency_policy Policy>
inline bool server_core<Policy>::validate(const commit_in& c, server_actions& out) {
  const std::uint64_t n = w_.size();
  if (c.payload.size() > p_.limits.max_payload_bytes) {
    refuse(out, c.worker, c.sequence, refusal::limits,
           make_error(errc::out_of_range, "commit.payload_bytes", c.payload.size(),
                      "exceeds limits.max_payload_bytes = " + std::to_string(p_.limits.max_payload_bytes)));
    return false;
  }
  if (c.element_count != n) {
    refuse(out, c.worker, c.sequence, refusal::element_count,
           make_error(errc::invalid_argument, "commit.element_count", c.element_count,
                      "this server's shard " + std::to_string(p_.shard) + " holds " + std::to_string(n)));
    return false;
  }
  if (c.type != dtype::f32 && c.type != dtype::f16 && c.type != dtype::bf16) {
    refuse(out, c.worker, c.sequence, refusal::dtype,
           make_error(errc::invalid_argument, "commit.dtype", to_string(c.type), "must be f32, f16 or bf16"));
    return false;
  }
  if (static_cast<int>(c.codec) >= codec_id_count) {
    refuse(out, c.worker, c.sequence, refusal::codec,
           make_error(errc::unsupported, "commit.codec", static_cast<unsigned>(c.codec), "unknown codec id"));
    return false;
  }
  if (status s = store_.can_hold(c.payload.size()); !s) {
    refuse(out, c.worker, c.sequence, refusal::store_full,
           status(s.code(), s.message() + "; give the server a larger store_bytes (0 = automatic: " +
                                std::to_string(automatic_store_bytes(n, p_.workers)) + " for " +
                                std::to_string(p_.workers) + " workers)"));
    return false;
  }
  const compress::payload_info info{static_cast<std::size_t>(n), c.type};
  const compress::codec_context ctx{p_.seed, c.step, c.tensor, {}};
  in_acc_ = false;
  // The payload is checked here without touching the parameters: a dense
  // cast's only rule is its size; sparse pairs (a published layout,
  // docs/wire-format.md "Sparse pairs") are checked by reading their header
  // and indices, the rules of decode_add_pairs (a payload of 0 pairs goes
  // to the decode check, which knows whether its codec allows none). Such
  // a commit is decoded once, after the policy's decision.
  //
  // Values: unless allow_non_finite, a NaN or infinite value is refused
  // before the policy sees the commit, so the parameters (and every later
  // checkpoint) stay finite. A dense cast or sparse pairs are checked on
  // their values as they lie in the payload (one branch-free pass that
  // reads the bytes the decode reads next); any other codec on what its
  // check-decode wrote into the accumulator (a finite payload can decode
  // to an infinity: a huge QSGD norm).
  const bool check_values = !p_.allow_non_finite;
  const std::size_t dense = compress::dense_payload_bytes(c.codec, info);
  if (dense != 0) {
    if (c.payload.size() != dense)
      return refuse_payload(c, make_error(errc::malformed, "commit.payload_bytes", c.payload.size(),
                                          std::string(to_string(c.codec)) + " of " + std::to_string(n) + " " +
                                              std::string(to_string(c.type)) + " is " + std::to_string(dense) +
                                              " bytes"),
                            out);
    if (!check_values || c.values_checked) return true;  // checked by the driver in its CRC pass
    return finite_values(c, c.payload.data(), static_cast<std::size_t>(n), dense_values_type(c.codec, c.type),
                         nullptr, out);
  }
  if (compress::sparse_pairs(c.codec) && compress::sparse_pairs_well_formed(c.payload, info)) {
    if (!check_values) return true;
    // 12-byte header (n, count), count u32 indices, count values.
    const std::size_t count = ::ashl::compress::detail::load_le32(c.payload.data() + 8);
    return finite_values(c, c.payload.data() + 12 + 4 * count, count, c.type, c.payload.data() + 12, out);
  }
  if (!opt_.adds_deltas() || check_values) {
    // Any other codec, sgd: the decode into the (zero) accumulator at
    // scale 1 is the check and the decode (the step scales it); a codec
    // that refuses may have written part of it, so it is zeroed again.
    // Model deltas with the value check: the same decode, checked, then
    // zeroed (the accumulator is scratch there).
    status s = compress::decode_add(c.codec, c.payload, info, host_view<float>(acc_.data(), acc_.size()), 1.0f, ctx);
    if (!s) {
      clear_acc();
      return refuse_payload(c, s, out);
    }
    if (check_values &&
        !finite_values(c, reinterpret_cast<const std::byte*>(acc_.data()), acc_.size(), dtype::f32, nullptr, out)) {
      clear_acc();
      return false;
    }
    if (opt_.adds_deltas()) {
      clear_acc();
      return true;
    }
    in_acc_ = true;
    return true;
  }
  // Any other codec, model deltas, non-finite values allowed: one decode
  // at scale 0 into the scratch buffer (never read), then the real one
  // into the parameters.
  status s = compress::decode_add(c.codec, c.payload, info, host_view<float>(acc_.data(), acc_.size()), 0.0f, ctx);
  if (!s) return refuse_payload(c, s, out);
  return true;
}

// Whether the n values of `type` at p are finite; refuses the commit
// otherwise, naming the worker and the element (the pair's index when
// `indices` gives the sparse pairs' u32 indices; the decoded element when
// the values are the accumulator's).
template <sync::consistency_policy Policy>
inline bool server_core<Policy>::finite_values(const commit_in& c, const std::byte* p, std::size_t n, dtype type,
                                               const std::byte* indices, server_actions& out) {
  const detail::float_bits b = detail::bits_of(type);
  std::size_t i = n;
  const unsigned k = for_parts(n, [&](unsigned part, std::size_t lo, std::size_t hi) noexcept {
    const std::size_t j = detail::first_non_finite(p + lo * b.bytes, hi - lo, b.bytes, b.mask);
    part_first_[part] = j == hi - lo ? n : lo + j;
  });
  for (unsigned q = 0; q < k && i == n; ++q) i = part_first_[q];
  if (i == n) return true;
  const bool decoded = p == reinterpret_cast<const std::byte*>(acc_.data());
  const std::uint64_t element =
      indices != nullptr ? ::ashl::compress::detail::load_le32(indices + 4 * i) : std::uint64_t{i};
  const std::string field = std::string(decoded ? "commit.decoded[" : "commit.payload[") + std::to_string(element) +
                            "]";
  refuse(out, c.worker, c.sequence, refusal::non_finite,
         make_error(errc::invalid_argument, field, detail::non_finite_value(p, i, b.bytes, b.mask),
                    "worker " + std::to_string(c.worker) + " sent a non-finite value (element " +
                        std::to_string(element) + " of server " + std::to_string(p_.shard) + "'s shard, " +
                        std::to_string(range().begin + element) + " of the model; commit " +
                        std::to_string(c.sequence) +
                        "); refused, the parameters unchanged (server allow_non_finite accepts it)"));
  return false;
}

template <sync::consistency_policy Policy>
inline bool server_core<Policy>::refuse_payload(const commit_in& c, const status& s, server_actions& out) {
  refuse(out, c.worker, c.sequence, s.code() == errc::unsupported ? refusal::codec : refusal::payload, s);
  return false;
}

}  // namespace ps
ASHL_NAMESPACE_END
