// rules/server_core.hpp with an apply pool (rules/apply_pool.hpp;
// server_params.apply_threads, docs/ps.md "Apply threads"): the parameters, every
// reply's CRC and every refusal are bit-identical to applying on one thread,
// for dense and sparse codecs, model deltas and sgd with momentum, commits
// applied at once (asp) and in rounds (bsp), with versions pinned by
// replies; nothing allocates per commit once warm; a bad thread count is
// refused by name. With the driver's checksum ranges (checksum_in_parts:
// the parts of a pull reply) every range's CRC comes from the pass that
// computes the version's, bit-identical for 1, 2 and 3 threads, and a dense
// apply with a pull riding leaves no pass to the pin.
#include <ashl/rules/server_core.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/apply_payloads.hpp"
#include "../support/counting_new.hpp"

#include <ashl/compress/cast.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/rules/apply_pool.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/sync/asp.hpp>
#include <ashl/sync/bsp.hpp>
#include <ashl/transport/inproc.hpp>
#include <ashl/wire/crc32c.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace {

namespace ps = ashl::ps;
namespace sync = ashl::sync;
using ashl::codec_id;
using ashl::dtype;

// Not a multiple of 16 (the last part is short and ends in a SIMD tail),
// above 2 x min_part_elements so a pool of 2 or 3 splits it.
constexpr std::size_t n = 3 * ps::server_core<>::min_part_elements + 37;

using apply_payloads::encode;
using apply_payloads::value;

struct outcome {
  std::vector<float> w;
  std::vector<std::uint32_t> crcs;  // of every reply, in order (with ranges: each range's, then the whole's)
  std::vector<std::string> errors;
  std::uint64_t applied = 0, runs = 0;
  std::uint64_t checksum_passes = 0, checksums_in_apply = 0;
};

// The pin's CRCs against the bytes: the whole's, and each range's (the
// split of wire::part_elements) when the core has ranges.
template <class Pinned>
void check_crcs(const Pinned& pv, std::uint32_t ranges, outcome& r) {
  BOOST_TEST(pv.crc == ashl::wire::crc32c(std::as_bytes(pv.values)));
  BOOST_REQUIRE(pv.range_crcs.size() == (ranges >= 2 ? ranges : 0u));
  for (std::uint32_t j = 0; j < pv.range_crcs.size(); ++j) {
    const auto pr = ashl::wire::part_elements(pv.values.size(), ranges, j);
    BOOST_TEST(pv.range_crcs[j] == ashl::wire::crc32c(std::as_bytes(pv.values.subspan(pr.first, pr.count))),
               "range " << j << " of " << ranges);
    r.crcs.push_back(pv.range_crcs[j]);
  }
  r.crcs.push_back(pv.crc);
}

// 3 workers x 4 commits, interleaved; every other commit carries a pull
// (some of them a push's: ack only); a reply's version stays pinned across
// the next commit (the apply then runs beside it). One commit holds a NaN
// in two parts: refused, naming the first.
template <class Policy>
outcome drive(Policy policy, const ps::optimizer_params& opt, codec_id codec, unsigned threads,
              std::uint32_t ranges = 0) {
  auto made = apply_payloads::make_core(std::move(policy), opt, n, 3, threads);
  auto& core = made.core;
  BOOST_REQUIRE(core->checksum_in_parts(ranges).ok());
  ps::server_actions out(3);
  outcome r;
  std::uint64_t pinned = ~std::uint64_t{0};
  for (std::uint64_t seq = 1; seq <= 4; ++seq)
    for (std::uint32_t w = 0; w < 3; ++w) {
      std::vector<float> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = value(w, seq, i);
      if (seq == 2 && w == 1) {  // refused: the first bad element is named
        g[n - 5] = std::numeric_limits<float>::quiet_NaN();
        g[17] = std::numeric_limits<float>::infinity();
        const auto bad = encode(codec_id::identity, g);
        core->commit({.worker = w, .sequence = seq, .clock = seq, .bytes = bad.size(), .codec = codec_id::identity,
                      .element_count = n, .payload = bad},
                     0.0, out);
        for (const auto& e : out.errors()) r.errors.push_back(e.text);
        out.clear();
        g[n - 5] = 0.0f;
        g[17] = 0.0f;
      }
      const auto payload = encode(codec, g);
      const ps::commit_in c{.worker = w, .sequence = seq, .clock = seq, .bytes = payload.size(), .codec = codec,
                            .element_count = n, .payload = payload, .pull = (seq + w) % 2 == 0,
                            .ack_only = seq == 3};
      core->commit(c, 0.0, out);
      for (const auto& e : out.errors()) r.errors.push_back(e.text);
      if (!out.pull_replies().empty()) {
        if (pinned != ~std::uint64_t{0}) core->unpin_parameters(pinned);
        const auto pv = core->pin_parameters();
        check_crcs(pv, ranges, r);
        pinned = pv.version;
      }
      out.clear();
    }
  core->drain(out);
  if (pinned != ~std::uint64_t{0}) core->unpin_parameters(pinned);
  check_crcs(core->pin_parameters(), ranges, r);
  r.checksum_passes = core->checksum_passes();
  r.checksums_in_apply = core->checksums_in_apply();
  r.w.assign(core->parameters().begin(), core->parameters().end());
  r.applied = core->stats().commits_applied;
  if (made.pool) r.runs = made.pool->runs();
  return r;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

BOOST_AUTO_TEST_CASE(parameters_crcs_and_refusals_are_bit_identical_to_one_thread) {
  const ps::optimizer_params delta{};
  const ps::optimizer_params sgd{.mode = ps::optimizer_params::kind::sgd, .lr = 0.3, .momentum = 0.9,
                                 .weight_decay = 1e-4, .nesterov = true};
  for (codec_id codec : {codec_id::identity, codec_id::fp16, codec_id::bf16, codec_id::topk, codec_id::randomk})
    for (const ps::optimizer_params* opt : {&delta, &sgd})
      for (bool rounds : {false, true}) {
        auto run = [&](unsigned threads) {
          return rounds ? drive(sync::bsp{{.workers = 3}}, *opt, codec, threads)
                        : drive(sync::asp{{.workers = 3}}, *opt, codec, threads);
        };
        const outcome one = run(1);
        BOOST_TEST_CONTEXT(to_string(codec) << (opt == &sgd ? " sgd" : " model deltas")
                                            << (rounds ? " bsp" : " asp")) {
          BOOST_TEST(one.applied == 12u);
          BOOST_REQUIRE(one.errors.size() == 1u);
          BOOST_TEST(one.errors[0].find("commit.payload[17] = inf") == 0u, one.errors[0]);
          for (unsigned threads : {2u, 3u}) {
            const outcome k = run(threads);
            BOOST_TEST(same_bits(k.w, one.w), threads << " threads");
            BOOST_TEST(k.crcs == one.crcs, threads << " threads");
            BOOST_TEST(k.errors == one.errors, threads << " threads");
            BOOST_TEST(k.applied == one.applied);
            BOOST_TEST(k.runs > 0u, "the pool ran the passes");
          }
        }
      }
}

// Checksum ranges (a pull reply's parts) cut across the pool's parts: 2
// ranges (a range spans pool parts, one starts inside a part), 7 (bounds
// off the 64-byte lines), 984 (ranges of 50 elements, many per part). Each range's CRC is
// right (check_crcs) and bit-identical for 1, 2 and 3 threads; a dense
// model-delta apply or an sgd step with a pull riding computes them in its
// pass, so the pin that follows makes no pass of its own.
BOOST_AUTO_TEST_CASE(range_crcs_come_from_the_apply_and_are_bit_identical_to_one_thread) {
  const ps::optimizer_params delta{};
  const ps::optimizer_params sgd{.mode = ps::optimizer_params::kind::sgd, .lr = 0.3, .momentum = 0.9};
  for (std::uint32_t ranges : {2u, 7u, 984u})
    for (codec_id codec : {codec_id::identity, codec_id::bf16, codec_id::topk})
      for (const ps::optimizer_params* opt : {&delta, &sgd}) {
        BOOST_TEST_CONTEXT(ranges << " ranges, " << to_string(codec) << (opt == &sgd ? " sgd" : " model deltas")) {
          const outcome one = drive(sync::asp{{.workers = 3}}, *opt, codec, 1, ranges);
          BOOST_TEST(one.crcs.size() == 7u * (ranges + 1));
          // Fused: a dense model-delta add, or an sgd step (after any decode).
          const bool fused = opt == &sgd || codec != codec_id::topk;
          // Replies after a commit with a pull: 5 (the other one is an ack's), plus the last pin.
          BOOST_TEST(one.checksums_in_apply == (fused ? 5u : 0u));
          BOOST_TEST(one.checksum_passes == (fused ? 1u : 6u), "passes of the pin's own");
          for (unsigned threads : {2u, 3u}) {
            const outcome k = drive(sync::asp{{.workers = 3}}, *opt, codec, threads, ranges);
            BOOST_TEST(same_bits(k.w, one.w), threads << " threads");
            BOOST_TEST(k.crcs == one.crcs, threads << " threads");
            BOOST_TEST(k.errors == one.errors, threads << " threads");
            BOOST_TEST(k.checksum_passes == one.checksum_passes);
            BOOST_TEST(k.checksums_in_apply == one.checksums_in_apply);
          }
        }
      }
  auto core = ps::server_core<sync::asp>::create({.layout = *ps::shard_layout::even(10, 1), .workers = 1},
                                                 sync::asp{{.workers = 1}});
  BOOST_REQUIRE(core.has_value());
  BOOST_TEST(core->checksum_in_parts(4).ok());  // ranges of 3: 3 + 3 + 3 + 1
  for (std::uint32_t bad : {6u, 11u}) {          // ranges of 2: five cover the 10; 11 > 10
    const auto st = core->checksum_in_parts(bad);
    BOOST_REQUIRE(!st.ok());
    BOOST_TEST(st.message().find("server_core.checksum_parts = " + std::to_string(bad) +
                                 ": leaves an empty range of the 10 parameters") == 0u,
               st.message());
  }
}

// Sparse pairs by parts: each part adds exactly the pairs in its range.
BOOST_AUTO_TEST_CASE(add_pairs_in_range_adds_the_pairs_of_its_range_only) {
  std::vector<float> x(1000, 0.0f);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = value(1, 1, i);
  const auto p = encode(codec_id::topk, x);
  std::vector<float> whole(x.size(), 1.0f), parts(x.size(), 1.0f);
  BOOST_REQUIRE(ashl::compress::decode_add(codec_id::topk, p, {x.size(), dtype::f32},
                                           ashl::host_view<float>(whole.data(), whole.size()), 0.5f, {})
                    .ok());
  for (std::size_t lo : {0u, 16u, 333u, 512u, 999u})
    ashl::compress::add_pairs_in_range(p, dtype::f32, parts.data(), 0.5f, lo,
                                       lo == 0 ? 16 : lo == 16 ? 333 : lo == 333 ? 512 : lo == 512 ? 999 : 1000);
  BOOST_TEST(same_bits(parts, whole));
}

// A pool of 2 in steady state: dense and sparse commits, sgd and model
// deltas, replies pinning versions, with and without checksum ranges: no
// allocation.
BOOST_AUTO_TEST_CASE(no_allocation_per_commit_with_two_apply_threads) {
  auto pool = ps::apply_pool::create(2);
  BOOST_REQUIRE(pool.has_value());
  for (int variant = 0; variant < 4; ++variant) {
    const std::uint32_t ranges = variant < 2 ? 0u : 7u;
    const bool use_sgd = variant % 2 == 1;
    const ps::optimizer_params opt =
        use_sgd ? ps::optimizer_params{.mode = ps::optimizer_params::kind::sgd, .lr = 0.1, .momentum = 0.5}
                : ps::optimizer_params{};
    auto core = ps::server_core<sync::asp>::create({.layout = *ps::shard_layout::even(n, 1), .workers = 2,
                                                    .optimizer = opt},
                                                   sync::asp{{.workers = 2}});
    BOOST_REQUIRE(core.has_value());
    core->use_apply_pool(pool->get());
    BOOST_REQUIRE(core->checksum_in_parts(ranges).ok());
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = value(0, 1, i);
    const auto dense = encode(codec_id::identity, g), half = encode(codec_id::bf16, g),
               sparse = encode(codec_id::topk, g);
    ps::server_actions out(2);
    std::uint64_t seq = 0;
    std::uint64_t pinned = ~std::uint64_t{0};
    auto cycle = [&] {
      for (const auto* p : {&dense, &half, &sparse})
        for (std::uint32_t w = 0; w < 2; ++w) {
          const codec_id codec = p == &dense ? codec_id::identity : p == &half ? codec_id::bf16 : codec_id::topk;
          core->commit({.worker = w, .sequence = seq / 2 + 1, .clock = seq, .bytes = p->size(), .codec = codec,
                        .element_count = n, .payload = *p, .pull = true},
                       0.0, out);
          ++seq;
          if (!out.pull_replies().empty()) {
            if (pinned != ~std::uint64_t{0}) core->unpin_parameters(pinned);
            pinned = core->pin_parameters().version;
          }
          out.clear();
        }
    };
    for (int k = 0; k < 3; ++k) cycle();
    const std::size_t before = counting_new::count();
    const std::uint64_t runs = (*pool)->runs();
    for (int k = 0; k < 5; ++k) cycle();
    const std::size_t after = counting_new::count();
    BOOST_TEST(after == before, "allocations in steady state: " << after - before);
    BOOST_TEST((*pool)->runs() > runs + 30, "the pool ran the passes");
    BOOST_TEST(core->stats().commits_applied == 48u);
    core->unpin_parameters(pinned);
  }
}

BOOST_AUTO_TEST_CASE(bad_apply_threads_are_refused_by_name) {
  for (std::uint64_t bad : {std::uint64_t{0}, std::uint64_t{65}}) {
    auto p = ps::apply_pool::create(bad, "server.apply_threads");
    BOOST_REQUIRE(!p.has_value());
    BOOST_TEST(p.error().message().find("server.apply_threads = " + std::to_string(bad)) == 0u, p.error().message());
  }
  auto fabric = ashl::transport::inproc_fabric::create({});
  ps::policy_params pp;
  pp.workers = 1;
  for (std::uint32_t threads : {0u, 65u, 2u}) {
    auto node = fabric->node();
    BOOST_REQUIRE(node.has_value());
    auto srv = ps::server<ashl::transport::inproc>::create(
        {.core = {.layout = *ps::shard_layout::even(n, 1), .workers = 1}, .apply_threads = threads},
        std::move(*ps::make_policy("asp", pp)), std::move(*node));
    if (threads == 2) {
      BOOST_REQUIRE_MESSAGE(srv.has_value(), (srv ? "" : srv.error().message()));
      BOOST_TEST(srv->core().apply_pool_in_use() != nullptr);
      BOOST_TEST(srv->core().apply_pool_in_use()->threads() == 2u);
    } else {
      BOOST_REQUIRE(!srv.has_value());
      BOOST_TEST(srv.error().message().find("server.apply_threads = " + std::to_string(threads)) == 0u,
                 srv.error().message());
    }
  }
}
