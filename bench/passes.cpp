// ashl_bench_passes — each kind of pass the parameter server's dense commit
// cycle (commit + pull, identity f32) makes over the payload, timed with
// ashl's own functions against a memcpy of the same bytes in the same run:
// the cost side of the pass count in docs/perf/ps-passes.md.
//
//   ashl_bench_passes                      # 1 MiB and 16 MiB, 21 reps
//   ashl_bench_passes --reps 31 --sizes 16M,64M
//
// Cases, timed interleaved (one of each per rep, so load drift reaches all
// alike), medians of --reps after one warm-up; ratio = case ÷ memcpy:
//   memcpy       std::memcpy of X into another buffer (one read, one write);
//                also the worker's reply copy (worker.hpp deliver_replies)
//   cma          process_vm_readv of X from this process: the kernel copy of
//                UCX's rendezvous over shared memory (the receiver's get),
//                where the system allows it
//   w_finite     ps::check_commit_parts: the worker's value check (read X)
//   w_seal       wire::seal_header: the worker's CRC of the commit (read X)
//   s_check      wire::decode with ps::dense_value_check as its visitor: the
//                server's CRC check and finite scan in one chunked pass
//   s_apply_crc  server_core::commit with a pull riding, values checked:
//                the dense add in place (read X, read-modify-write the
//                parameters) with the new version's CRC in the same pass;
//                then the reply's pin and unpin (no copy)
//   s_apply      the same commit without a pull (a push): no CRC
//   s_beside     the same with the previous reply still pinned: the add
//                writes the new version beside it (new = old + v) with its CRC
//   w_reply_chk  wire::decode of the reply: the worker's CRC check (read X)
//   copy_crc     memcpy + wire::crc32c per 192 KiB chunk (the CRC reads the
//                chunk from cache): a copy-and-checksum, which ashl does not
//                have; what the worker's reply copy would cost with its check
//   fused        per 192 KiB chunk: CRC and finite scan of the payload, copy
//                of the old version, compress::decode_add, CRC of the new
//                version: the server's check and apply in one pass into a
//                spare version (not built in ashl: a prediction)
//   w_check_crc  ps::check_commit_parts with the part's CRC asked for, then
//                wire::seal_header from that CRC: the worker's value check
//                and seal in one pass (ps::worker since 2026-12-07, docs/perf/ps-passes.md; was
//                w_finite + w_seal)
//   crc_copy     per 192 KiB chunk: wire::crc32c of the staged reply's
//                chunk, then memcpy of it (from cache) into the caller's
//                buffer: a check-while-copying that would leave a bad reply
//                in the caller's buffer (not built; was w_reply_chk + memcpy)
//   swap_crc     the same with std::swap_ranges instead of the memcpy: the
//                caller's old values go to the staging, so a bad reply
//                could be swapped back (not built; what keeping "a bad
//                reply leaves the parameters as they were" would cost)
//   s_chk_beside server_core::check_message (fuse_checks off: the CRC check
//                and finite scan, S2) then commit() with a pull riding and
//                the previous reply still pinned (the add beside it with the
//                new version's CRC, s_beside): today's fan-in commit, two
//                passes after the transfer
//   s_fused      the same with fuse_checks beside: the check, the finite
//                scan and new = old + v (with the new version's CRC) in one
//                chunked pass, published by commit() (built 2026-12-07)
//   s_chk_inpl   s_chk_beside with the reply unpinned at once: the check pass,
//                then the add in place with the new version's CRC (S2 + S3)
//   s_fused_inpl the same with fuse_checks always: the fused pass writes the
//                new version beside the parameters though nothing pins them
//                (what fused_apply::beside avoids)
// Prints a table, then one JSON object per case. Never an assertion on time.
#include "support.hpp"

#include <ashl/compress/registry.hpp>
#include <ashl/rules/commit_check.hpp>
#include <ashl/rules/server_core.hpp>
#include <ashl/sync/asp.hpp>
#include <ashl/wire/crc32c.hpp>
#include <ashl/wire/message.hpp>

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

namespace ps = ashl::ps;
namespace wire = ashl::wire;
using core_type = ps::server_core<ashl::sync::asp>;

constexpr std::size_t cases = 18;
constexpr std::array<const char*, cases> names{
    "memcpy",   "cma",         "w_finite", "w_seal",   "s_check",      "s_apply_crc", "s_apply", "s_beside",
    "w_reply_chk", "copy_crc", "fused",    "w_check_crc", "crc_copy", "swap_crc",  "s_chk_beside", "s_fused", "s_chk_inpl", "s_fused_inpl"};

std::size_t parse_size(const std::string& s) {
  const std::size_t v = std::strtoull(s.c_str(), nullptr, 10);
  const char u = s.empty() ? ' ' : s.back();
  return u == 'K' ? v << 10 : u == 'M' ? v << 20 : u == 'G' ? v << 30 : v;
}

struct options {
  int reps = 21;
  bool quick = false, json_only = false;
  std::vector<std::size_t> sizes{std::size_t{1} << 20, std::size_t{16} << 20};
};

// A model-delta server_core of one shard of n elements, one worker (ASP:
// every commit applies at once).
core_type make_core(std::size_t n, ps::fused_apply fuse = ps::fused_apply::off) {
  auto layout = ps::shard_layout::even(n, 1);
  ps::server_core_params p{.layout = *layout, .workers = 1};
  p.fuse_checks = fuse;
  auto core = core_type::create(p, ashl::sync::asp{{.workers = 1}});
  if (!core) {
    std::fprintf(stderr, "%s\n", core.error().message().c_str());
    std::exit(1);
  }
  return std::move(*core);
}

// The times of every case for X = bytes; NaN for a case the system refuses.
std::array<double, cases> measure(std::size_t bytes, int reps) {
  const std::size_t n = bytes / sizeof(float);
  std::vector<float> g(n, 1e-7f), dst(n), old_v(n, 0.5f), new_v(n), stage(n, 1e-7f);
  const auto payload = std::as_bytes(std::span<const float>(g));
  const wire::limits lim{.max_elements = n, .max_payload_bytes = bytes};
  std::array<std::byte, wire::header_bytes> head{}, reply_head{};
  (void)wire::seal_header({.kind = wire::message_kind::pull_reply, .type = ashl::dtype::f32,
                           .flags = wire::flag_last_shard, .element_count = n, .sequence = 1, .clock = 1},
                          payload, reply_head, lim);
  std::uint32_t keep = 0;
  core_type in_place = make_core(n), beside = make_core(n);
  // Whole messages as received, checked by check_message: today's two
  // passes (unfused) against the one fused pass, each beside a pinned version.
  core_type unfused = make_core(n, ps::fused_apply::off), fused = make_core(n, ps::fused_apply::beside);
  core_type unfused_inpl = make_core(n, ps::fused_apply::off), fused_inpl = make_core(n, ps::fused_apply::always);
  ps::server_actions out(1);
  std::uint64_t seq = 0, beside_seq = 0, pinned = beside.pin_parameters().version;
  std::uint64_t unfused_seq = 0, fused_seq = 0, unfused_pin = unfused.pin_parameters().version,
                fused_pin = fused.pin_parameters().version;
  std::uint64_t unfused_inpl_seq = 0, fused_inpl_seq = 0, no_pin = ~std::uint64_t{0};
  const std::uint32_t payload_crc = wire::crc32c(payload);
  std::array<std::byte, wire::header_bytes> msg_head{};
  // check_message, commit() with a pull riding, the reply's pin replacing the last.
  auto checked_commit = [&](core_type& core, std::uint64_t& s, std::uint64_t& pin) {
    ++s;
    (void)wire::seal_header({.kind = wire::message_kind::commit, .type = ashl::dtype::f32,
                             .flags = wire::flag_last_shard | wire::flag_pull, .element_count = n, .rank = 0,
                             .sequence = s, .clock = s},
                            bytes, payload_crc, msg_head, lim);
    ps::dense_value_check values;
    auto m = core.check_message(msg_head, payload, lim, 0, false, values);
    if (!m) std::abort();
    ps::commit_in c = ps::commit_in_of(m->header, 0, 0, m->payload, wire::header_bytes + bytes);
    c.values_checked = values.all_finite();
    core.commit(c, 0.0, out);
    if (!out.errors().empty() || out.pull_replies().size() != 1) std::abort();
    out.clear();
    if (pin != ~std::uint64_t{0}) core.unpin_parameters(pin);
    const auto pv = core.pin_parameters();
    keep ^= pv.crc;
    pin = pv.version;
  };
  // The same with the reply's send complete at once: the next apply is in place.
  auto checked_commit_unpinned = [&](core_type& core, std::uint64_t& s) {
    checked_commit(core, s, no_pin);
    core.unpin_parameters(no_pin);
    no_pin = ~std::uint64_t{0};
  };
  auto commit = [&](core_type& core, std::uint64_t& s, bool pull) {
    core.commit({.worker = 0, .sequence = ++s, .clock = s, .bytes = wire::header_bytes + bytes, .element_count = n,
                 .payload = payload, .pull = pull, .values_checked = true},
                0.0, out);
    if (!out.errors().empty()) std::abort();
    out.clear();
  };
  const iovec local{dst.data(), bytes}, remote{g.data(), bytes};
  const bool cma = process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(bytes);
  constexpr std::size_t chunk = std::size_t{192} << 10;  // decode's and the apply's chunk (decode_chunk_bytes)
  const auto t = bench::time_interleaved(
      reps, [&] { std::memcpy(dst.data(), g.data(), bytes); },
      [&] {
        if (cma) keep ^= static_cast<std::uint32_t>(process_vm_readv(getpid(), &local, 1, &remote, 1, 0));
      },
      [&] {
        const ps::commit_part_view part{.payload = payload, .element_count = n};
        keep ^= static_cast<std::uint32_t>(ps::check_commit_parts({&part, 1}, {}).ok());
      },
      [&] {
        (void)wire::seal_header({.kind = wire::message_kind::commit, .type = ashl::dtype::f32,
                                 .flags = wire::flag_last_shard, .element_count = n, .sequence = ++seq, .clock = seq},
                                payload, head, lim);
      },
      [&] {
        ps::dense_value_check values(ashl::codec_id::identity, ashl::dtype::f32, n, bytes);
        auto m = wire::decode(head, payload, lim, [&](const wire::header&, std::span<const std::byte> c) { values(c); });
        if (!m || !values.all_finite()) std::abort();
      },
      [&] {
        commit(in_place, seq, true);
        const auto pv = in_place.pin_parameters();
        keep ^= pv.crc;
        in_place.unpin_parameters(pv.version);
      },
      [&] { commit(in_place, seq, false); },
      [&] {  // the last reply pinned while the commit applies, then the new one pinned
        commit(beside, beside_seq, true);
        beside.unpin_parameters(pinned);
        const auto pv = beside.pin_parameters();
        keep ^= pv.crc;
        pinned = pv.version;
      },
      [&] {
        if (!wire::decode(reply_head, payload, lim)) std::abort();
      },
      [&] {
        std::uint32_t crc = 0;
        auto* d = reinterpret_cast<std::byte*>(dst.data());
        for (std::size_t at = 0; at < bytes; at += chunk) {
          const std::size_t k = std::min(chunk, bytes - at);
          std::memcpy(d + at, payload.data() + at, k);
          crc = wire::crc32c(std::span<const std::byte>(d + at, k), crc);
        }
        keep ^= crc;
      },
      [&] {
        std::uint32_t in_crc = 0, out_crc = 0;
        std::size_t bad = 0;
        for (std::size_t at = 0; at < n; at += chunk / sizeof(float)) {
          const std::size_t k = std::min(chunk / sizeof(float), n - at);
          const auto c = payload.subspan(at * sizeof(float), k * sizeof(float));
          in_crc = wire::crc32c(c, in_crc);
          bad += ps::detail::first_non_finite(c.data(), k, 4, 0x7f800000u) != k;
          std::memcpy(new_v.data() + at, old_v.data() + at, k * sizeof(float));
          (void)ashl::compress::decode_add(ashl::codec_id::identity, c, {k, ashl::dtype::f32},
                                           ashl::host_view<float>(new_v.data() + at, k), 1.0f, {});
          out_crc = wire::crc32c(std::as_bytes(std::span<const float>(new_v.data() + at, k)), out_crc);
        }
        keep ^= in_crc ^ out_crc ^ static_cast<std::uint32_t>(bad);
      },
      [&] {
        std::uint32_t crc = 0;
        const ps::commit_part_view part{.payload = payload, .element_count = n, .crc = &crc};
        if (!ps::check_commit_parts({&part, 1}, {}).ok()) std::abort();
        (void)wire::seal_header({.kind = wire::message_kind::commit, .type = ashl::dtype::f32,
                                 .flags = wire::flag_last_shard, .element_count = n, .sequence = ++seq, .clock = seq},
                                bytes, crc, head, lim);
      },
      [&] {
        std::uint32_t crc = 0;
        const auto* src = reinterpret_cast<const std::byte*>(stage.data());
        auto* d = reinterpret_cast<std::byte*>(dst.data());
        for (std::size_t at = 0; at < bytes; at += chunk) {
          const std::size_t k = std::min(chunk, bytes - at);
          crc = wire::crc32c(std::span<const std::byte>(src + at, k), crc);
          std::memcpy(d + at, src + at, k);
        }
        keep ^= crc;
      },
      [&] {
        std::uint32_t crc = 0;
        constexpr std::size_t per = chunk / sizeof(float);
        for (std::size_t at = 0; at < n; at += per) {
          const std::size_t k = std::min(per, n - at);
          crc = wire::crc32c(std::as_bytes(std::span<const float>(stage.data() + at, k)), crc);
          std::swap_ranges(stage.data() + at, stage.data() + at + k, dst.data() + at);
        }
        keep ^= crc;
      },
      [&] { checked_commit(unfused, unfused_seq, unfused_pin); },
      [&] { checked_commit(fused, fused_seq, fused_pin); },
      [&] { checked_commit_unpinned(unfused_inpl, unfused_inpl_seq); },
      [&] { checked_commit_unpinned(fused_inpl, fused_inpl_seq); });
  beside.unpin_parameters(pinned);
  unfused.unpin_parameters(unfused_pin);
  fused.unpin_parameters(fused_pin);
  if (keep == 0x12345678u) std::printf(" ");
  // server_core's own counters say which path each apply took: in place
  // with the CRC in the apply's pass, or beside the pinned version.
  std::fprintf(stderr,
               "# %zu B: in place: %llu commits, %llu beside, %llu CRCs in the apply, %llu CRC passes of their own; "
               "beside: %llu commits, %llu beside; s_chk_beside: %llu beside, %llu fused; s_fused: %llu beside, "
               "%llu fused, %llu discarded; s_chk_inpl: %llu beside; s_fused_inpl: %llu beside, %llu fused\n",
               bytes, static_cast<unsigned long long>(in_place.stats().commits_applied),
               static_cast<unsigned long long>(in_place.applied_beside()),
               static_cast<unsigned long long>(in_place.checksums_in_apply()),
               static_cast<unsigned long long>(in_place.checksum_passes()),
               static_cast<unsigned long long>(beside.stats().commits_applied),
               static_cast<unsigned long long>(beside.applied_beside()),
               static_cast<unsigned long long>(unfused.applied_beside()),
               static_cast<unsigned long long>(unfused.fused_applies()),
               static_cast<unsigned long long>(fused.applied_beside()),
               static_cast<unsigned long long>(fused.fused_applies()),
               static_cast<unsigned long long>(fused.fused_wasted()),
               static_cast<unsigned long long>(unfused_inpl.applied_beside()),
               static_cast<unsigned long long>(fused_inpl.applied_beside()),
               static_cast<unsigned long long>(fused_inpl.fused_applies()));
  std::array<double, cases> r{};
  std::copy(t.begin(), t.end(), r.begin());
  if (!cma) r[1] = std::nan("");
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (bench::common_option(o, argc, argv, i)) continue;
    if (a == "--sizes" && i + 1 < argc) {
      o.sizes.clear();
      const std::string list = argv[++i];
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        o.sizes.push_back(parse_size(list.substr(at, comma - at)));
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr, "usage: ashl_bench_passes [--reps N] [--quick] [--sizes 1M,16M,...] [--json-only]\n");
      return 2;
    }
  }
  std::vector<std::array<double, cases>> rows;
  for (const std::size_t bytes : o.sizes) rows.push_back(measure(bytes, o.reps));
  const std::string mach = bench::machine(), date = bench::today();
  if (!o.json_only) {
    std::printf("# %s, %s, load %s, %d reps (medians; ratio = case / memcpy of the same bytes)\n", mach.c_str(),
                date.c_str(), bench::loadavg().c_str(), o.reps);
    std::printf("%-12s", "case");
    for (const std::size_t b : o.sizes) std::printf(" %10zuKiB_us %6s", b >> 10, "ratio");
    std::printf("\n");
    for (std::size_t c = 0; c < cases; ++c) {
      std::printf("%-12s", names[c]);
      for (const auto& r : rows) std::printf(" %15.1f %6.2f", r[c] * 1e6, r[c] / r[0]);
      std::printf("\n");
    }
  }
  for (std::size_t s = 0; s < o.sizes.size(); ++s)
    for (std::size_t c = 0; c < cases; ++c)
      std::printf("{\"bench\":\"passes\",\"case\":\"%s\",\"bytes\":%zu,\"us\":%.2f,\"memcpy_us\":%.2f,\"ratio\":%.3f,"
                  "\"reps\":%d,\"machine\":\"%s\",\"date\":\"%s\"}\n",
                  names[c], o.sizes[s], rows[s][c] * 1e6, rows[s][0] * 1e6, rows[s][c] / rows[s][0], o.reps,
                  mach.c_str(), date.c_str());
  return 0;
}
