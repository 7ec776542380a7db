// ashl/rules/server_core_state.hpp — server_core's whole state as bytes:
// save() and load() (layout, parameters, optimizer, values, the
// exactly-once table, buffered commits, counters, the policy, the data
// ledger when there is one, one CRC-32C over it all). The bytes are pinned
// by test/rules/state_bytes.
//
//   #include <ashl/rules/server_core.hpp>   // includes this
//   std::vector<std::byte> bytes;
//   ashl::state_writer out(bytes);
//   core.save(out);                         // ... later, or in another process:
//   ashl::state_reader in(bytes);
//   if (auto s = core.load(in); !s) return s;  // refused whole: the core unchanged
//
// Definitions of server_core's members, out of the class so that
// rules/server_core.hpp reads as the rules' outline; docs/ps.md
// "server_core".
#pragma once

#include <ashl/rules/server_core.hpp>

ASHL_NAMESPACE_BEGIN
namespace ps {

template <sync::consistency_policy Policy>
inline void server_core<Policy>::save(state_writer& out) const {
  // The body is written in place after a length placeholder (the layout of
  // put_string: u64 length, bytes), then the length is patched and the CRC
  // appended: no second buffer, no copy (a 64 MB shard saves at memory speed).
  // Version 2: the refusal counters are preceded by their count (version
  // 1 had 11 reasons). Version 3: max_workers after workers (docs/elastic.md
  // §2.2). Version 4: the data ledger's section (LDGR) after the policy's
  // (§3.5), written only when the core runs a ledger: without one the
  // bytes stay version 3's, so every state of a job without a ledger is
  // unchanged. load() reads all four; before 4, no ledger.
  ASHL_ASSERT(pending_n_ == 0, "server_core: save() with commits waiting (call apply_pending())");
  const bool ledger = ledger_.enabled();
  out.tag("PSCR", ledger ? 4 : 3);
  const std::size_t length_at = out.size();
  out.put<std::uint64_t>(0);
  const std::size_t body_at = out.size();
  state_writer& w = out;
  p_.layout.save(w);
  put_fields(w, p_, saved_params());
  opt_.save(w);
  w.put_vector(w_);
  w.put<std::uint64_t>(table_.size());
  for (const auto& e : table_) put_fields(w, e, worker_entry::saved());
  store_.save(w);
  save_counters(w, stats_);
  policy_.save(w);
  if (ledger) ledger_.save(w);
  out.patch<std::uint64_t>(length_at, out.size() - body_at);
  out.put(wire::crc32c(out.written(body_at)));
}

template <sync::consistency_policy Policy>
inline status server_core<Policy>::load(state_reader& in) {
  ASHL_ASSERT(pending_n_ == 0, "server_core: load() with commits waiting (call apply_pending())");
  std::uint32_t version = 0;
  ASHL_TRY(in.tag("PSCR", 1, 4, version));
  std::span<const std::byte> bytes;
  ASHL_TRY(in.get_bytes(bytes, "server_core.state"));
  std::uint32_t crc = 0;
  ASHL_TRY(in.get(crc, "server_core.crc"));
  if (wire::crc32c(bytes) != crc)
    return make_error(errc::checksum_mismatch, "server_core.crc", crc, "does not match the saved state");
  state_reader r(bytes);
  server_core_params p;
  ASHL_TRY(p.layout.load(r));
  if (version >= 3) {
    ASHL_TRY(get_fields(r, p, "server_core", saved_params()));
  } else {
    ASHL_TRY(get_fields(r, p, "server_core", saved_params_v2()));
  }
  if (p.shard >= p.layout.servers())
    return make_error(errc::malformed, "server_core.shard", p.shard, "not a server of the saved layout");
  const std::uint64_t n = p.layout.range(p.shard).size();
  optimizer opt;
  ASHL_TRY(opt.load(r));
  p.optimizer = opt.params();
  std::vector<float> w;
  ASHL_TRY(r.get_vector(w, "server_core.parameters"));
  if (w.size() != n || opt.size() != n)
    return make_error(errc::malformed, "server_core.parameters.size", w.size(),
                      "the saved shard holds " + std::to_string(n) + " elements");
  std::uint64_t m = 0;
  ASHL_TRY(r.count(m, 27, "server_core.workers_known"));
  std::vector<worker_entry> table(static_cast<std::size_t>(m));
  for (auto& e : table) ASHL_TRY(get_fields(r, e, "server_core.worker", worker_entry::saved()));
  // Before version 3 the worker count was the maximum; a rank past it that
  // the core let join then (it grew the table for any id) stays admitted.
  if (version < 3) p.max_workers = static_cast<std::uint32_t>(std::max<std::uint64_t>(p.workers, m));
  if (p.workers > ps::max_workers || p.max_workers > ps::max_workers || p.max_workers < p.workers)
    return make_error(errc::malformed, "server_core.max_workers", p.max_workers,
                      "must be at least server_core.workers = " + std::to_string(p.workers) + " and at most " +
                          std::to_string(ps::max_workers) + " (ps::max_workers)");
  if (m > p.max_workers)
    return make_error(errc::malformed, "server_core.workers_known", m,
                      "more ranks than server_core.max_workers = " + std::to_string(p.max_workers));
  std::uint32_t live = 0;
  for (const auto& e : table) live += e.live ? 1u : 0u;
  // The larger of the saved bound and this server's: a restart given a
  // larger store_bytes (the saved one was too small) keeps it.
  p.store_bytes = std::max(p.store_bytes, p_.store_bytes);
  commit_store store(p.store_bytes);
  ASHL_TRY(store.load(r));
  counters st;
  ASHL_TRY(load_counters(r, st, version));
  Policy pol = policy_;
  ASHL_TRY(pol.load(r));
  // Before version 4 no ledger: a restored job of an older build runs none,
  // whatever this server's params().ledger says.
  data_ledger ledger;
  if (version >= 4) ASHL_TRY(ledger.load(r));  // named "data_ledger.<field>"
  if (ledger.enabled() && p.shard != 0)
    return make_error(errc::malformed, "server_core.ledger.samples", ledger.params().samples,
                      "a data ledger on shard " + std::to_string(p.shard) + " (it runs on shard 0 only)");
  // The ledger follows the core's accepted joins, so it knows no rank the
  // table lacks and no incarnation past the table's (else a join the core
  // accepts could be one the ledger refuses).
  if (ledger.known_workers() > m)
    return make_error(errc::malformed, "server_core.ledger.workers", ledger.known_workers(),
                      "more ranks than the " + std::to_string(m) + " of the exactly-once table");
  for (worker_id w = 0; w < ledger.known_workers(); ++w)
    if (ledger.incarnation(w) > table[w].incarnation)
      return make_error(errc::malformed, "server_core.ledger.incarnation", ledger.incarnation(w),
                        "worker " + std::to_string(w) + " is at incarnation " + std::to_string(table[w].incarnation) +
                            " in the exactly-once table");
  p.ledger = ledger.params();
  ASHL_TRY(r.expect_end("server_core.state"));
  // Not part of the state: this server's own choices stay.
  p.allow_non_finite = p_.allow_non_finite;
  p.max_commit_samples = p_.max_commit_samples;
  p_ = std::move(p);
  opt_ = std::move(opt);
  make_writable();  // a version replies still read keeps its storage
  w_ = std::move(w);
  w_crc_valid_ = false;
  if (checksum_parts_ >= 2 && !checksum_in_parts(checksum_parts_).ok()) (void)checksum_in_parts(0);  // another size
  acc_.assign(w_.size(), 0.0f);
  table_ = std::move(table);
  live_n_ = live;
  store_ = std::move(store);
  stats_ = st;
  policy_ = std::move(pol);
  ledger_ = std::move(ledger);
  sink_.clear();
  reserve_ranks();
  return {};
}

template <sync::consistency_policy Policy>
inline void server_core<Policy>::save_counters(state_writer& w, const counters& c) {
  put_fields(w, c, scalar_counter_fields());
  w.put<std::uint64_t>(c.refused.size());
  for (std::uint64_t v : c.refused) w.put(v);
}

template <sync::consistency_policy Policy>
inline status server_core<Policy>::load_counters(state_reader& r, counters& c, std::uint32_t version) {
  ASHL_TRY(get_fields(r, c, "server_core.counters", scalar_counter_fields()));
  std::uint64_t reasons = 11;  // version 1: the reasons up to refusal::measurement
  if (version >= 2) {
    ASHL_TRY(r.get(reasons, "server_core.counters.refused.count"));
    if (reasons > refusal_count)
      return make_error(errc::malformed, "server_core.counters.refused.count", reasons,
                        "this build knows " + std::to_string(refusal_count) + " refusal reasons");
  }
  for (std::uint64_t k = 0; k < reasons; ++k) ASHL_TRY(r.get(c.refused[k], "server_core.counters.refused"));
  return {};
}

}  // namespace ps
ASHL_NAMESPACE_END
