// ashl_bench_ps_commit_passes — the server's CPU work for one dense commit
// round with its pull (fewer passes over the bytes), in one process, no
// transport: what bench/ps_ucx's end-to-end figures hide under a shared
// machine's load (docs/perf/ps-ucx.md).
//
//   ashl_bench_ps_commit_passes                 # 1 MiB, 16 MiB and 64 MiB shards
//   ashl_bench_ps_commit_passes --reps 31 --sizes 1M,16M
//
// Cases, interleaved (a, b, c, d, a, ...) so load drift reaches them alike,
// medians of --reps after one warm-up; each includes the wire's CRC check
// of the commit (wire::decode) and the check that its values are finite:
//   copy   the server before its passes were fused: the CRC pass, the value pass, the
//          commit applied in place, then the reply's snapshot of the new
//          version copied and checksummed in 192 KiB chunks;
//   pin    now, nothing pinned: the value check in the CRC pass, the commit
//          applied in place with the new version's CRC in the same chunked
//          pass; the reply pins it;
//   beside now, the previous reply still in flight: the apply writes the
//          new version beside the pinned one (new = old + v) with its CRC;
//   memcpy a memcpy of the payload (a reference: one read, one write).
// Prints a table, then one JSON object per size. Never an assertion on time.
#include "support.hpp"

#include <ashl/compress/identity.hpp>
#include <ashl/rules/server_core.hpp>
#include <ashl/sync/asp.hpp>
#include <ashl/wire/crc32c.hpp>
#include <ashl/wire/message.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

namespace ps = ashl::ps;
using bench::time_interleaved;

struct row {
  std::size_t bytes = 0;
  double copy_s = 0, pin_s = 0, beside_s = 0, memcpy_s = 0;
};

std::size_t parse_size(const std::string& s) {
  const std::size_t v = std::strtoull(s.c_str(), nullptr, 10);
  const char u = s.empty() ? ' ' : s.back();
  return u == 'K' ? v << 10 : u == 'M' ? v << 20 : u == 'G' ? v << 30 : v;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 15;
  bool json_only = false;
  std::vector<std::size_t> sizes{std::size_t{1} << 20, std::size_t{16} << 20, std::size_t{64} << 20};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--json-only") json_only = true;
    else if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::string list = argv[++i];
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        sizes.push_back(parse_size(list.substr(at, comma - at)));
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr, "usage: ashl_bench_ps_commit_passes [--reps N] [--sizes 1M,16M,...] [--json-only]\n");
      return 2;
    }
  }
  std::vector<row> rows;
  for (const std::size_t bytes : sizes) {
    const std::size_t n = bytes / sizeof(float);
    auto layout = ps::shard_layout::even(n, 1);
    auto core = ps::server_core<ashl::sync::asp>::create({.layout = *layout, .workers = 1},
                                                          ashl::sync::asp{{.workers = 1}});
    if (!core) {
      std::fprintf(stderr, "%s\n", core.error().message().c_str());
      return 1;
    }
    ps::server_actions out(1);
    std::vector<float> delta(n, 1e-7f), snapshot(n), sink(n);
    // The commit as it arrives: header + identity payload (the same bytes each time).
    std::vector<std::byte> msg(ashl::wire::header_bytes + bytes);
    const std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(delta.data()), bytes);
    std::memcpy(msg.data() + ashl::wire::header_bytes, payload.data(), bytes);
    const ashl::wire::limits lim{.max_elements = n, .max_payload_bytes = bytes};
    std::uint64_t seq = 0;
    std::uint32_t keep = 0;
    // now: the value check rides in the CRC pass (ps::server's decode
    // visitor); before: the CRC pass, then server_core's own value pass.
    auto commit = [&](bool pull, bool now) {
      ashl::wire::header h{.kind = ashl::wire::message_kind::commit, .flags = ashl::wire::flag_last_shard,
                           .element_count = n, .sequence = ++seq, .clock = seq};
      const auto head = std::span<std::byte>(msg).first(ashl::wire::header_bytes);
      const auto body = std::span<const std::byte>(msg).subspan(ashl::wire::header_bytes);
      (void)ashl::wire::seal_header(h, body, head, lim);
      ps::dense_value_check values(ashl::codec_id::identity, ashl::dtype::f32, n, bytes);
      auto m = now ? ashl::wire::decode(head, body, lim,
                                        [&](const ashl::wire::header&, std::span<const std::byte> c) { values(c); })
                   : ashl::wire::decode(head, body, lim);
      if (!m) std::abort();
      core->commit({.worker = 0, .sequence = seq, .clock = seq, .bytes = msg.size(), .element_count = n,
                    .payload = m->payload, .pull = pull, .values_checked = now && values.all_finite()},
                   0.0, out);
      if (!out.errors().empty()) std::abort();
      out.clear();
    };
    std::uint64_t pinned = ~std::uint64_t{0};
    const auto t = time_interleaved(
        reps,
        [&] {  // copy: apply in place, then the snapshot copy + CRC in chunks
          commit(false, false);
          const auto params = core->parameters();
          const auto* src = reinterpret_cast<const std::byte*>(params.data());
          auto* dst = reinterpret_cast<std::byte*>(snapshot.data());
          std::uint32_t crc = 0;
          constexpr std::size_t chunk = std::size_t{192} << 10;
          for (std::size_t at = 0; at < bytes; at += chunk) {
            const std::size_t k = std::min(chunk, bytes - at);
            std::memcpy(dst + at, src + at, k);
            crc = ashl::wire::crc32c(std::span<const std::byte>(dst + at, k), crc);
          }
          keep ^= crc;
        },
        [&] {  // pin: nothing pinned, the CRC in the apply's pass
          commit(true, true);
          const auto pv = core->pin_parameters();
          keep ^= pv.crc;
          core->unpin_parameters(pv.version);
        },
        [&] {  // beside: the last reply still pinned while the commit applies
          if (pinned == ~std::uint64_t{0}) pinned = core->pin_parameters().version;
          commit(true, true);
          core->unpin_parameters(pinned);
          const auto pv = core->pin_parameters();
          keep ^= pv.crc;
          pinned = pv.version;
        },
        [&] {  // memcpy of the payload
          std::memcpy(sink.data(), delta.data(), bytes);
          keep ^= static_cast<std::uint32_t>(sink[n / 2] > 0.0f);
        });
    if (pinned != ~std::uint64_t{0}) core->unpin_parameters(pinned);
    rows.push_back({bytes, t[0], t[1], t[2], t[3]});
    if (keep == 0x12345678u) std::printf(" ");
  }
  const std::string mach = bench::machine(), date = bench::today();
  if (!json_only) {
    std::printf("# %s, %s, load %s, %d reps (medians; each case includes the commit's CRC check)\n", mach.c_str(),
                date.c_str(), bench::loadavg().c_str(), reps);
    std::printf("%10s %12s %12s %12s %12s %10s %10s\n", "bytes", "copy_us", "pin_us", "beside_us", "memcpy_us",
                "pin/copy", "beside/copy");
    for (const row& r : rows)
      std::printf("%10zu %12.1f %12.1f %12.1f %12.1f %10.3f %10.3f\n", r.bytes, r.copy_s * 1e6, r.pin_s * 1e6,
                  r.beside_s * 1e6, r.memcpy_s * 1e6, r.pin_s / r.copy_s, r.beside_s / r.copy_s);
  }
  for (const row& r : rows)
    std::printf("{\"bench\":\"ps_commit_passes\",\"bytes\":%zu,\"copy_us\":%.2f,\"pin_us\":%.2f,\"beside_us\":%.2f,"
                "\"memcpy_us\":%.2f,\"reps\":%d,\"machine\":\"%s\",\"date\":\"%s\"}\n",
                r.bytes, r.copy_s * 1e6, r.pin_s * 1e6, r.beside_s * 1e6, r.memcpy_s * 1e6, reps, mach.c_str(),
                date.c_str());
  return 0;
}
