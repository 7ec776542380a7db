// rules/server_core.hpp, applies as parts land (server_core::speculate; issue
// 28, item 1; ps::server's server_params.apply_parts_as_they_land): a commit
// whose parts are added beside the parameters as they land gives the same
// parameters and the same CRCs (the version's and every checksum range's),
// bit for bit, as the same commit applied whole, on 1, 2 and 3 apply threads
// and for f32, fp16 and bf16 payloads; the parameters do not change before
// commit() applies it (a commit never finished, or refused, changes
// nothing); anything that changes the parameters first (another commit, a
// deferred one), or a weight other than the one guessed, makes commit()
// apply the payload whole as before; a version pinned by replies keeps its
// storage and bits; a rank whose commits wait for rounds is not speculated
// after its first; nothing allocates once warm.
#include <ashl/rules/server_core.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/apply_payloads.hpp"
#include "../support/counting_new.hpp"

#include <ashl/rules/apply_pool.hpp>
#include <ashl/sync/asp.hpp>
#include <ashl/sync/bsp.hpp>
#include <ashl/wire/crc32c.hpp>
#include <ashl/wire/message.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

namespace {

namespace ps = ashl::ps;
namespace sync = ashl::sync;
using ashl::codec_id;
using apply_payloads::encode;
using apply_payloads::value;

// Not a multiple of 16 (the last chunk ends in a SIMD tail), split by a pool
// of 2 or 3, and four of the apply's 192 KiB chunks: the parts land across
// several chunks a pool part.
constexpr std::size_t n = 4 * ((std::size_t{192} << 10) / sizeof(float)) + 37;

using core_t = ps::server_core<sync::asp>;

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> update(std::uint32_t w, std::uint64_t seq) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = value(w, seq, i);
  return g;
}

ps::commit_in commit_of(std::uint32_t w, std::uint64_t seq, codec_id codec, std::span<const std::byte> payload,
                        bool pull = true) {
  return {.worker = w, .sequence = seq, .clock = seq, .bytes = payload.size(), .codec = codec, .element_count = n,
          .payload = payload, .pull = pull};
}

// c's parts (the wire's split into `parts`) land one by one: each but the
// last is speculated; then commit(). Returns how many speculate() took.
template <class Core>
std::uint32_t land(Core& core, const ps::commit_in& c, std::uint16_t parts, ps::server_actions& out) {
  std::uint32_t took = 0;
  for (std::uint16_t j = 0; j + 1 < parts; ++j) {
    const auto pr = ashl::wire::part_elements(n, parts, j);
    took += core.speculate(c, pr.first, pr.first + pr.count) ? 1u : 0u;
  }
  core.commit(c, 0.0, out);
  return took;
}

// The pin's CRCs against its bytes (the whole's and each range's); appends them.
void check_pin(const core_t::pinned_parameters& pv, std::uint32_t ranges, std::vector<std::uint32_t>& crcs) {
  BOOST_TEST(pv.crc == ashl::wire::crc32c(std::as_bytes(pv.values)));
  BOOST_REQUIRE(pv.range_crcs.size() == (ranges >= 2 ? ranges : 0u));
  for (std::uint32_t j = 0; j < pv.range_crcs.size(); ++j) {
    const auto pr = ashl::wire::part_elements(pv.values.size(), ranges, j);
    BOOST_TEST(pv.range_crcs[j] == ashl::wire::crc32c(std::as_bytes(pv.values.subspan(pr.first, pr.count))));
    crcs.push_back(pv.range_crcs[j]);
  }
  crcs.push_back(pv.crc);
}

struct run_result {
  std::vector<float> w;
  std::vector<std::uint32_t> crcs;
  std::uint64_t as_landed = 0, stale = 0, passes = 0;
};

// 3 workers x 4 commits: workers 0 and 2 commit in `parts` parts (landed
// part by part when `speculate`, else committed whole), worker 1 whole,
// in turn; every reply's version stays pinned across the next commit.
run_result drive(codec_id codec, unsigned threads, std::uint32_t ranges, std::uint16_t parts, bool speculate) {
  auto made = apply_payloads::make_core(sync::asp{{.workers = 3}}, {}, n, 3, threads);
  auto& core = *made.core;
  BOOST_REQUIRE(core.checksum_in_parts(ranges).ok());
  ps::server_actions out(3);
  run_result r;
  std::uint64_t pinned = ~std::uint64_t{0};
  for (std::uint64_t seq = 1; seq <= 4; ++seq)
    for (std::uint32_t w = 0; w < 3; ++w) {
      const auto payload = encode(codec, update(w, seq));
      const ps::commit_in c = commit_of(w, seq, codec, payload);
      if (speculate && w != 1) {
        BOOST_TEST(land(core, c, parts, out) == parts - 1u, "worker " << w << " commit " << seq);
      } else {
        core.commit(c, 0.0, out);
      }
      BOOST_TEST(out.errors().empty());
      BOOST_REQUIRE(!out.pull_replies().empty());
      if (pinned != ~std::uint64_t{0}) core.unpin_parameters(pinned);
      const auto pv = core.pin_parameters();
      check_pin(pv, ranges, r.crcs);
      pinned = pv.version;
      out.clear();
    }
  core.unpin_parameters(pinned);
  r.w.assign(core.parameters().begin(), core.parameters().end());
  r.as_landed = core.applied_as_landed();
  r.stale = core.speculations_stale();
  r.passes = core.checksum_passes();
  BOOST_TEST(core.stats().commits_applied == 12u);
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_commit_applied_as_its_parts_land_is_bit_identical_to_one_applied_whole) {
  for (codec_id codec : {codec_id::identity, codec_id::fp16, codec_id::bf16})
    for (unsigned threads : {1u, 2u, 3u})
      for (std::uint32_t ranges : {0u, 7u})
        for (std::uint16_t parts : {std::uint16_t{2}, std::uint16_t{5}, std::uint16_t{40}}) {
          BOOST_TEST_CONTEXT(to_string(codec) << ", " << threads << " threads, " << ranges << " ranges, " << parts
                                              << " parts") {
            const run_result whole = drive(codec, threads, ranges, parts, false);
            const run_result landed = drive(codec, threads, ranges, parts, true);
            BOOST_TEST(same_bits(landed.w, whole.w));
            BOOST_TEST(landed.crcs == whole.crcs);
            BOOST_TEST(whole.as_landed == 0u);
            // Workers 0 and 2's commits: ASP weighs each 1, the guess.
            BOOST_TEST(landed.as_landed == 8u);
            BOOST_TEST(landed.stale == 0u);
            BOOST_TEST(landed.passes == whole.passes, "the pins found the version's CRCs made");
          }
        }
}

BOOST_AUTO_TEST_CASE(the_parameters_do_not_change_before_the_commit_is_applied) {
  auto made = apply_payloads::make_core(sync::asp{{.workers = 2}}, {}, n, 2, 2);
  auto& core = *made.core;
  ps::server_actions out(2);
  const std::vector<float> before(core.parameters().begin(), core.parameters().end());
  const auto p1 = encode(codec_id::identity, update(0, 1));
  const ps::commit_in c1 = commit_of(0, 1, codec_id::identity, p1);
  // Three of four parts land; the last never comes.
  for (std::uint16_t j = 0; j < 3; ++j) {
    const auto pr = ashl::wire::part_elements(n, 4, j);
    BOOST_TEST(core.speculate(c1, pr.first, pr.first + pr.count));
    BOOST_TEST(same_bits(core.parameters(), before), "after part " << j);
  }
  // Another rank's parts wait while that speculation is live...
  const auto p2 = encode(codec_id::identity, update(1, 1));
  const ps::commit_in c2 = commit_of(1, 1, codec_id::identity, p2);
  BOOST_TEST(!core.speculate(c2, 0, n / 4));
  // ...until the driver discards worker 0's commit.
  core.forget_speculation(0);
  BOOST_TEST(land(core, c2, 4, out) == 3u);
  BOOST_TEST(core.applied_as_landed() == 1u);
  std::vector<float> want = before;
  for (std::size_t i = 0; i < n; ++i) want[i] += value(1, 1, i);
  BOOST_TEST(same_bits(core.parameters(), want));

  // A commit refused after its parts were speculated (a NaN the driver did
  // not check for): nothing changes, the next commit applies as it lands.
  auto g = update(0, 1);
  g[n - 3] = std::numeric_limits<float>::quiet_NaN();
  const auto bad = encode(codec_id::identity, g);
  out.clear();
  land(core, commit_of(0, 1, codec_id::identity, bad), 4, out);
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST(same_bits(core.parameters(), want));
  // Its speculation ended with it: another rank's part 0 takes the buffer.
  BOOST_TEST(core.speculate(commit_of(1, 9, codec_id::identity, p2), 0, n / 4));
  core.forget_speculation(1);
  out.clear();
  land(core, c1, 4, out);
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(core.applied_as_landed() == 2u);
  for (std::size_t i = 0; i < n; ++i) want[i] += value(0, 1, i);
  BOOST_TEST(same_bits(core.parameters(), want));
  // A duplicate (the same commit sent again) is not speculated at all.
  BOOST_TEST(!core.speculate(c1, 0, n / 2));

  // A staging that takes the same commit again with other bytes (its first
  // send refused): part 0 starts afresh, nothing of the first bytes stays.
  std::vector<std::byte> staging = encode(codec_id::identity, update(1, 7));
  const ps::commit_in c3 = commit_of(1, 2, codec_id::identity, staging);
  BOOST_TEST(core.speculate(c3, 0, n / 2));
  const auto other = encode(codec_id::identity, update(1, 8));
  std::memcpy(staging.data(), other.data(), staging.size());
  out.clear();
  land(core, c3, 4, out);
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(core.applied_as_landed() == 3u);
  for (std::size_t i = 0; i < n; ++i) want[i] += value(1, 8, i);
  BOOST_TEST(same_bits(core.parameters(), want));

  // Parts out of order: the speculation stops, the commit applies whole.
  const auto p4 = encode(codec_id::identity, update(0, 2));
  const ps::commit_in c4 = commit_of(0, 2, codec_id::identity, p4);
  BOOST_TEST(core.speculate(c4, 0, n / 4));
  BOOST_TEST(!core.speculate(c4, n / 2, 3 * n / 4));
  BOOST_TEST(!core.speculate(c4, n / 4, n / 2));  // stopped for this commit
  core.commit(c4, 0.0, out);
  BOOST_TEST(core.applied_as_landed() == 3u);
  for (std::size_t i = 0; i < n; ++i) want[i] += value(0, 2, i);
  BOOST_TEST(same_bits(core.parameters(), want));
}

BOOST_AUTO_TEST_CASE(a_change_first_or_another_weight_applies_the_commit_whole) {
  ps::server_actions out(2);
  const auto a = encode(codec_id::identity, update(0, 1)), b = encode(codec_id::identity, update(1, 1)),
             a2 = encode(codec_id::identity, update(0, 2));
  // Reference: worker 1's commit, then worker 0's, applied whole.
  auto ref = apply_payloads::make_core(sync::asp{{.workers = 2}}, {}, n, 2, 1);
  ref.core->commit(commit_of(1, 1, codec_id::identity, b), 0.0, out);
  ref.core->commit(commit_of(0, 1, codec_id::identity, a), 0.0, out);
  out.clear();
  {  // Worker 1's whole commit lands between worker 0's parts.
    auto made = apply_payloads::make_core(sync::asp{{.workers = 2}}, {}, n, 2, 1);
    auto& core = *made.core;
    const ps::commit_in c = commit_of(0, 1, codec_id::identity, a);
    BOOST_TEST(core.speculate(c, 0, n / 3));
    core.commit(commit_of(1, 1, codec_id::identity, b), 0.0, out);
    BOOST_TEST(!core.speculate(c, n / 3, 2 * n / 3));
    core.commit(c, 0.0, out);
    BOOST_TEST(core.speculations_stale() == 1u);
    BOOST_TEST(core.applied_as_landed() == 0u);
    BOOST_TEST(same_bits(core.parameters(), ref.core->parameters()));
    out.clear();
  }
  {  // With batched applies: worker 1's commit waits in the batch.
    auto made = apply_payloads::make_core(sync::asp{{.workers = 2}}, {}, n, 2, 1);
    auto& core = *made.core;
    core.defer_dense_applies(4);
    const ps::commit_in c = commit_of(0, 1, codec_id::identity, a);
    BOOST_TEST(core.speculate(c, 0, n / 3));
    ps::commit_in kept = commit_of(1, 1, codec_id::identity, b);
    kept.payload_kept = true;
    core.commit(kept, 0.0, out);
    BOOST_REQUIRE(core.pending_applies() == 1u);
    BOOST_TEST(!core.speculate(c, n / 3, 2 * n / 3));
    core.commit(c, 0.0, out);
    core.apply_pending();
    BOOST_TEST(core.applied_as_landed() == 0u);
    BOOST_TEST(same_bits(core.parameters(), ref.core->parameters()));
    out.clear();
  }
  {  // Per-worker weights: worker 0 weighs 0.5. Its first commit is guessed
     // at 1 (applied whole), its second at 0.5 (applied as it landed).
    auto made = apply_payloads::make_core(sync::asp{{.workers = 2, .weights = {0.5, 1.0}}}, {}, n, 2, 1);
    auto wref = apply_payloads::make_core(sync::asp{{.workers = 2, .weights = {0.5, 1.0}}}, {}, n, 2, 1);
    auto& core = *made.core;
    land(core, commit_of(0, 1, codec_id::identity, a), 3, out);
    BOOST_TEST(core.applied_as_landed() == 0u);
    BOOST_TEST(core.speculations_stale() == 1u);
    land(core, commit_of(0, 2, codec_id::identity, a2), 3, out);
    BOOST_TEST(core.applied_as_landed() == 1u);
    wref.core->commit(commit_of(0, 1, codec_id::identity, a), 0.0, out);
    wref.core->commit(commit_of(0, 2, codec_id::identity, a2), 0.0, out);
    BOOST_TEST(same_bits(core.parameters(), wref.core->parameters()));
    out.clear();
  }
}

BOOST_AUTO_TEST_CASE(a_pinned_version_keeps_its_bits_while_a_commit_lands_beside_it) {
  auto made = apply_payloads::make_core(sync::asp{{.workers = 1}}, {}, n, 1, 2);
  auto& core = *made.core;
  ps::server_actions out(1);
  const auto pv = core.pin_parameters();
  const std::vector<float> old(pv.values.begin(), pv.values.end());
  const auto a = encode(codec_id::identity, update(0, 1));
  land(core, commit_of(0, 1, codec_id::identity, a), 6, out);
  BOOST_TEST(core.applied_as_landed() == 1u);
  BOOST_TEST(core.applied_beside() == 1u);
  BOOST_TEST(same_bits(pv.values, old), "the pinned storage was written");
  BOOST_TEST(pv.values.data() != core.parameters().data());
  std::vector<float> want = old;
  for (std::size_t i = 0; i < n; ++i) want[i] += value(0, 1, i);
  BOOST_TEST(same_bits(core.parameters(), want));
  core.unpin_parameters(pv.version);
}

BOOST_AUTO_TEST_CASE(applies_as_parts_land_allocate_nothing_once_warm) {
  for (unsigned threads : {1u, 2u}) {
    auto made = apply_payloads::make_core(sync::asp{{.workers = 2}}, {}, n, 2, threads);
    auto& core = *made.core;
    BOOST_REQUIRE(core.checksum_in_parts(5).ok());
    ps::server_actions out(2);
    const auto p0 = encode(codec_id::identity, update(0, 1)), p1 = encode(codec_id::bf16, update(1, 1));
    std::uint64_t seq = 0, pinned = ~std::uint64_t{0};
    auto cycle = [&] {
      ++seq;
      for (std::uint32_t w = 0; w < 2; ++w) {
        land(core, commit_of(w, seq, w == 0 ? codec_id::identity : codec_id::bf16, w == 0 ? p0 : p1), 8, out);
        if (pinned != ~std::uint64_t{0}) core.unpin_parameters(pinned);
        pinned = core.pin_parameters().version;  // the next commit lands beside it
        out.clear();
      }
    };
    for (int k = 0; k < 3; ++k) cycle();
    const std::size_t before = counting_new::count();
    for (int k = 0; k < 6; ++k) cycle();
    BOOST_TEST(counting_new::count() == before, "allocations, " << threads << " threads: " << counting_new::count() - before);
    BOOST_TEST(core.applied_as_landed() == 18u);
    BOOST_TEST(core.checksum_passes() == 0u, "every pin found its version's CRCs");
    core.unpin_parameters(pinned);
  }
}

BOOST_AUTO_TEST_CASE(a_rank_whose_commits_wait_for_rounds_is_not_speculated_again) {
  auto made = apply_payloads::make_core(sync::bsp{{.workers = 2}}, {}, n, 2, 1);
  auto& core = *made.core;
  ps::server_actions out(2);
  const auto a1 = encode(codec_id::identity, update(0, 1)), b1 = encode(codec_id::identity, update(1, 1)),
             a2 = encode(codec_id::identity, update(0, 2));
  const std::vector<float> before(core.parameters().begin(), core.parameters().end());
  BOOST_TEST(core.speculate(commit_of(0, 1, codec_id::identity, a1), 0, n / 2));  // not known yet
  core.commit(commit_of(0, 1, codec_id::identity, a1), 0.0, out);                 // buffered for the round
  BOOST_TEST(core.applied_as_landed() == 0u);
  BOOST_TEST(same_bits(core.parameters(), before));
  core.commit(commit_of(1, 1, codec_id::identity, b1), 0.0, out);  // the round ends
  BOOST_TEST(core.stats().commits_applied == 2u);
  BOOST_TEST(!core.speculate(commit_of(0, 2, codec_id::identity, a2), 0, n / 2));
  BOOST_TEST(core.speculations() == 1u);
  BOOST_TEST(core.applied_as_landed() == 0u);
}
