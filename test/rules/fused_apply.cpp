// rules/server_core_fused.hpp (docs/perf/ps-passes.md, "The check and the
// apply in one pass"): server_core::check_message's one
// pass over a whole dense commit as it lies in the receive buffer — the CRC,
// the finite scan and, where the apply would write beside a version replies
// read, new = w + s·v into a spare version — gives the parameters, their
// CRCs and the saved state bit for bit as the check and the apply in
// separate passes, for every policy by name with replies pinning versions;
// a bit flipped at the payload's first or last byte or at a chunk bound, or
// a NaN or infinity in the first or last chunk, is refused by name with the
// parameters and every saved byte unchanged (but the refusal's counter);
// a duplicate is applied once; nothing allocates once warm; and the fused
// path is taken (fused_applies) where it should be and only there.
#include <ashl/rules/server_core.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/apply_payloads.hpp"
#include "../support/counting_new.hpp"
#include "../support/ps_policy_cases.hpp"
#include "../support/saved_state.hpp"

#include <ashl/rules/policies.hpp>
#include <ashl/sync/any_policy.hpp>
#include <ashl/sync/asp.hpp>
#include <ashl/wire/crc32c.hpp>
#include <ashl/wire/message.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace {

namespace ps = ashl::ps;
namespace sync = ashl::sync;
namespace wire = ashl::wire;
using ashl::codec_id;
using apply_payloads::value;

constexpr std::size_t chunk_floats = wire::decode_chunk_bytes / sizeof(float);

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

using test_support::saved;

template <class Policy>
ps::server_core<Policy> make(Policy policy, std::size_t n, std::uint32_t workers, ps::fused_apply mode) {
  ps::server_core_params p;
  p.layout = *ps::shard_layout::even(n, 1);
  p.workers = workers;
  p.fuse_checks = mode;
  std::vector<float> w0(n);
  for (std::size_t i = 0; i < n; ++i) w0[i] = value(9, 0, i);
  auto made = ps::server_core<Policy>::create(p, std::move(policy), w0);
  BOOST_REQUIRE_MESSAGE(made.has_value(), made.to_status().to_string());
  return std::move(*made);
}

// A whole commit message of worker w as it lands in a receive buffer.
std::vector<std::byte> message(std::size_t n, std::uint32_t w, std::uint64_t seq, codec_id codec,
                               const std::vector<float>& g, bool pull = true, bool push = false) {
  const auto payload = apply_payloads::encode(codec, g);
  const wire::header h{.kind = wire::message_kind::commit, .codec = codec, .type = ashl::dtype::f32,
                       .flags = ps::commit_flags(pull, push), .element_count = n, .rank = w, .sequence = seq,
                       .clock = seq, .samples = 16};
  std::vector<std::byte> out(wire::header_bytes + payload.size());
  BOOST_REQUIRE(wire::encode(h, payload, out).has_value());
  return out;
}

std::vector<float> update(std::size_t n, std::uint32_t w, std::uint64_t seq) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = value(w, seq, i);
  return g;
}

// What ps::server does with a message: check_message, then commit() with
// what the check learnt. The decode's error, or ok.
template <class Core>
ashl::status feed(Core& core, std::span<const std::byte> msg, std::uint32_t w, double now, ps::server_actions& out) {
  ps::dense_value_check values;
  auto m = core.check_message(msg.first(wire::header_bytes), msg.subspan(wire::header_bytes), wire::limits{}, w, false,
                              values);
  if (!m) return m.error();
  ps::commit_in c = ps::commit_in_of(m->header, w, core.incarnation(w), m->payload, msg.size());
  c.values_checked = values.all_finite();
  core.commit(c, now, out);
  return {};
}

struct run {
  std::vector<float> w;
  std::vector<std::uint32_t> crcs;          // every pin's
  std::vector<sync::worker_id> replies;     // every reply, in order
  std::vector<std::byte> state;
  std::uint64_t fused = 0, wasted = 0, beside = 0;
};

// 3 workers commit 24 times (an order from a fixed seed; every fourth a
// push, every fifth without a pull), each reply pins the version until the
// next commit has been applied beside it.
run drive(const ps_cases::policy_case& pc, std::size_t n, codec_id codec, ps::fused_apply mode) {
  auto pol = ps::make_policy(pc.name, pc.params);
  BOOST_REQUIRE_MESSAGE(pol.has_value(), pol.to_status().to_string());
  auto core = make(std::move(*pol), n, 3, mode);
  ps::server_actions out(3);
  run r;
  std::vector<std::uint64_t> seq(3, 0), pins;
  std::vector<std::uint8_t> waiting(3, 0);
  std::uint64_t x = 7;
  double now = 0.0;
  for (int k = 0; k < 24; ++k) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    // A worker whose pull is held waits for its reply, as a real one does.
    auto w = static_cast<std::uint32_t>((x >> 33) % 3);
    for (int t = 0; t < 3 && waiting[w] != 0; ++t) w = (w + 1) % 3;
    if (waiting[w] != 0) {
      core.drain(out);
      for (sync::worker_id rw : out.pull_replies()) waiting[rw] = 0;
      r.replies.insert(r.replies.end(), out.pull_replies().begin(), out.pull_replies().end());
      out.clear();
    }
    now += 0.01;
    const bool pull = k % 5 != 4;
    waiting[w] = pull ? 1 : 0;
    const auto msg = message(n, w, ++seq[w], codec, update(n, w, seq[w]), pull, k % 4 == 3);
    BOOST_TEST(feed(core, msg, w, now, out).ok());
    BOOST_TEST(out.errors().empty(), pc.label << " commit " << k << ": " << (out.errors().empty() ? std::string() : out.errors()[0].text));
    for (std::uint64_t v : pins) core.unpin_parameters(v);
    pins.clear();
    for (sync::worker_id rw : out.pull_replies()) {
      waiting[rw] = 0;
      r.replies.push_back(rw);
      const auto pv = core.pin_parameters();
      BOOST_TEST(pv.crc == wire::crc32c(std::as_bytes(pv.values)));
      r.crcs.push_back(pv.crc);
      pins.push_back(pv.version);
    }
    out.clear();
  }
  for (std::uint64_t v : pins) core.unpin_parameters(v);
  core.drain(out);
  r.w.assign(core.parameters().begin(), core.parameters().end());
  r.state = saved(core);
  r.fused = core.fused_applies();
  r.wasted = core.fused_wasted();
  r.beside = core.applied_beside();
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_policy_gets_the_same_bits_with_the_apply_in_the_check_pass) {
  const std::size_t n = 2 * chunk_floats + 37;  // two whole chunks and a SIMD tail
  std::uint64_t fused_beside = 0, fused_always = 0;
  for (const auto& pc : ps_cases::every_policy(3))
    for (codec_id codec : {codec_id::identity, codec_id::bf16}) {
      BOOST_TEST_CONTEXT(pc.label << ", " << to_string(codec)) {
        const run off = drive(pc, n, codec, ps::fused_apply::off);
        const run beside = drive(pc, n, codec, ps::fused_apply::beside);
        const run always = drive(pc, n, codec, ps::fused_apply::always);
        for (const run* r : {&beside, &always}) {
          BOOST_TEST(same_bits(r->w, off.w));
          BOOST_TEST(r->crcs == off.crcs);
          BOOST_TEST(r->replies == off.replies);
          BOOST_TEST((r->state == off.state), "the saved state differs");
        }
        BOOST_TEST(off.fused == 0u);
        BOOST_TEST(off.wasted == 0u);
        BOOST_TEST(beside.fused <= beside.beside, "fused beside only where the apply writes beside");
        BOOST_TEST(always.fused >= beside.fused);
        fused_beside += beside.fused;
        fused_always += always.fused;
      }
    }
  BOOST_TEST(fused_beside > 0u);
  BOOST_TEST(fused_always > fused_beside);
}

BOOST_AUTO_TEST_CASE(asp_applies_every_commit_beside_a_pin_from_the_check_pass) {
  const std::size_t n = 3 * chunk_floats + 5;
  auto core = make(sync::asp{{.workers = 2}}, n, 2, ps::fused_apply::beside);
  auto ref = make(sync::asp{{.workers = 2}}, n, 2, ps::fused_apply::off);
  ps::server_actions out(2);
  // Not pinned: in place, no fusion.
  const auto m1 = message(n, 0, 1, codec_id::identity, update(n, 0, 1));
  BOOST_TEST(feed(core, m1, 0, 0.0, out).ok());
  BOOST_TEST(feed(ref, m1, 0, 0.0, out).ok());
  BOOST_TEST(core.fused_applies() == 0u);
  BOOST_TEST(core.applied_beside() == 0u);
  // Pinned by worker 0's reply: worker 1's commit is added in the check pass.
  const auto pv = core.pin_parameters();
  const std::vector<float> old(pv.values.begin(), pv.values.end());
  const auto m2 = message(n, 1, 1, codec_id::identity, update(n, 1, 1));
  BOOST_TEST(feed(core, m2, 1, 0.1, out).ok());
  BOOST_TEST(feed(ref, m2, 1, 0.1, out).ok());
  BOOST_TEST(core.fused_applies() == 1u);
  BOOST_TEST(core.applied_beside() == 1u);
  BOOST_TEST(same_bits(pv.values, old), "the pinned version was written");
  BOOST_TEST(same_bits(core.parameters(), ref.parameters()));
  // Its reply's CRC came with the pass: the pin needs no pass of its own.
  const std::uint64_t passes = core.checksum_passes();
  const auto pv2 = core.pin_parameters();
  BOOST_TEST(core.checksum_passes() == passes);
  BOOST_TEST(pv2.crc == wire::crc32c(std::as_bytes(pv2.values)));
  // The same message again: a duplicate, applied once.
  BOOST_TEST(feed(core, m2, 1, 0.2, out).ok());
  BOOST_TEST(core.stats().duplicates == 1u);
  BOOST_TEST(core.fused_applies() == 1u);
  BOOST_TEST(same_bits(core.parameters(), ref.parameters()));
  core.unpin_parameters(pv.version);
  core.unpin_parameters(pv2.version);
}

BOOST_AUTO_TEST_CASE(a_bad_byte_or_value_is_refused_and_changes_nothing_but_its_refusal) {
  const std::size_t n = 4 * chunk_floats + 37;
  const std::size_t bytes = 4 * n;
  const std::size_t chunk = wire::decode_chunk_bytes;
  auto core = make(sync::asp{{.workers = 2}}, n, 2, ps::fused_apply::beside);
  auto twin = make(sync::asp{{.workers = 2}}, n, 2, ps::fused_apply::off);
  ps::server_actions out(2);
  // Worker 0's first commit, its reply's version pinned: the next is fused.
  const auto m1 = message(n, 0, 1, codec_id::identity, update(n, 0, 1));
  BOOST_TEST(feed(core, m1, 0, 0.0, out).ok());
  BOOST_TEST(feed(twin, m1, 0, 0.0, out).ok());
  const auto pv = core.pin_parameters();
  const auto tv = twin.pin_parameters();
  out.clear();
  const std::vector<float> before(core.parameters().begin(), core.parameters().end());
  const auto good = message(n, 1, 1, codec_id::identity, update(n, 1, 1));

  // A bit flipped in the payload: its first and last byte, each side of
  // every chunk bound; and in the header's last byte before the CRC.
  std::vector<std::size_t> at{0, bytes - 1};
  for (std::size_t b = chunk; b < bytes; b += chunk) {
    at.push_back(b - 1);
    at.push_back(b);
  }
  const std::vector<std::byte> state0 = saved(core);
  for (std::size_t i : at) {
    auto bad = good;
    bad[wire::header_bytes + i] ^= std::byte{0x04};
    const ashl::status s = feed(core, bad, 1, 0.1, out);
    BOOST_TEST(!s.ok(), "byte " << i);
    BOOST_TEST((s.code() == ashl::errc::checksum_mismatch), "byte " << i);
    BOOST_TEST(s.message().rfind("header.crc32c = ", 0) == 0u, s.message());
    BOOST_TEST(out.empty());
    BOOST_TEST(same_bits(core.parameters(), before), "byte " << i);
    BOOST_TEST((saved(core) == state0), "the state changed after a CRC failure at byte " << i);
  }
  BOOST_TEST(core.fused_applies() == 0u);
  BOOST_TEST(core.fused_wasted() == 0u);

  // A NaN or an infinity in the first or last chunk: refused by name, the
  // state as the twin's without fusion after the same refusal.
  struct bad_value {
    std::size_t element;
    float v;
  };
  const std::uint64_t refused0 = core.stats().refused[static_cast<std::size_t>(ps::refusal::non_finite)];
  for (const bad_value b : {bad_value{0, std::numeric_limits<float>::quiet_NaN()},
                            bad_value{5, -std::numeric_limits<float>::infinity()},
                            bad_value{n - 1, std::numeric_limits<float>::infinity()},
                            bad_value{n - 40, std::numeric_limits<float>::quiet_NaN()}}) {
    auto g = update(n, 1, 1);
    g[b.element] = b.v;
    const auto bad = message(n, 1, 1, codec_id::identity, g);
    BOOST_TEST(feed(core, bad, 1, 0.1, out).ok());
    BOOST_TEST(feed(twin, bad, 1, 0.1, out).ok());
    BOOST_REQUIRE(out.errors().size() == 2u);
    for (const ps::error_out& e : out.errors()) {
      BOOST_TEST((e.reason == ps::refusal::non_finite));
      BOOST_TEST(e.text.rfind("commit.payload[" + std::to_string(b.element) + "] = ", 0) == 0u, e.text);
    }
    out.clear();
    BOOST_TEST(same_bits(core.parameters(), before), "element " << b.element);
    BOOST_TEST((saved(core) == saved(twin)), "element " << b.element);
  }
  BOOST_TEST(core.stats().refused[static_cast<std::size_t>(ps::refusal::non_finite)] == refused0 + 4);
  BOOST_TEST(core.fused_applies() == 0u);
  BOOST_TEST(core.fused_wasted() == 0u);

  // The good one after them: fused, the twin's bits.
  BOOST_TEST(feed(core, good, 1, 0.2, out).ok());
  BOOST_TEST(feed(twin, good, 1, 0.2, out).ok());
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(core.fused_applies() == 1u);
  BOOST_TEST(same_bits(core.parameters(), twin.parameters()));
  BOOST_TEST(same_bits(pv.values, before));
  core.unpin_parameters(pv.version);
  twin.unpin_parameters(tv.version);
  BOOST_TEST((saved(core) == saved(twin)));
}

BOOST_AUTO_TEST_CASE(a_weight_other_than_the_guess_or_a_change_first_applies_as_before) {
  const std::size_t n = chunk_floats + 3;
  // Worker 0 weighs 0.5: its first commit is guessed at 1 (discarded,
  // applied as before), its second at 0.5 (fused).
  auto core = make(sync::asp{{.workers = 2, .weights = {0.5, 1.0}}}, n, 2, ps::fused_apply::always);
  auto ref = make(sync::asp{{.workers = 2, .weights = {0.5, 1.0}}}, n, 2, ps::fused_apply::off);
  ps::server_actions out(2);
  for (std::uint64_t s = 1; s <= 2; ++s) {
    const auto m = message(n, 0, s, codec_id::identity, update(n, 0, s));
    BOOST_TEST(feed(core, m, 0, 0.0, out).ok());
    BOOST_TEST(feed(ref, m, 0, 0.0, out).ok());
  }
  BOOST_TEST(core.fused_wasted() == 1u);
  BOOST_TEST(core.fused_applies() == 1u);
  BOOST_TEST(same_bits(core.parameters(), ref.parameters()));
  // The pass ran, then another commit changed the parameters before this
  // one reached commit(): it is stale, and applied as before.
  const auto a = message(n, 1, 1, codec_id::identity, update(n, 1, 1));
  ps::dense_value_check values;
  auto m = core.check_message(std::span(a).first(wire::header_bytes), std::span(a).subspan(wire::header_bytes),
                              wire::limits{}, 1, false, values);
  BOOST_REQUIRE(m.has_value());
  const auto b = update(n, 0, 3);
  core.commit({.worker = 0, .sequence = 3, .clock = 3, .codec = codec_id::identity, .element_count = n,
               .payload = std::as_bytes(std::span(b))},
              0.0, out);
  ref.commit({.worker = 0, .sequence = 3, .clock = 3, .codec = codec_id::identity, .element_count = n,
              .payload = std::as_bytes(std::span(b))},
             0.0, out);
  ps::commit_in c = ps::commit_in_of(m->header, 1, 0, m->payload, a.size());
  c.values_checked = values.all_finite();
  core.commit(c, 0.0, out);
  BOOST_TEST(feed(ref, a, 1, 0.0, out).ok());
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(core.fused_applies() == 1u);
  BOOST_TEST(core.fused_wasted() == 2u);
  BOOST_TEST(same_bits(core.parameters(), ref.parameters()));
}

BOOST_AUTO_TEST_CASE(the_fused_pass_allocates_nothing_once_warm) {
  const std::size_t n = 2 * chunk_floats + 11;
  auto core = make(sync::asp{{.workers = 2}}, n, 2, ps::fused_apply::beside);
  ps::server_actions out(2);
  const auto m0 = message(n, 0, 1, codec_id::identity, update(n, 0, 1));
  const auto m1 = message(n, 1, 1, codec_id::identity, update(n, 1, 1));
  std::vector<std::byte> a = m0, b = m1;
  std::uint64_t seq = 0, pinned = ~std::uint64_t{0};
  // Re-sealed in place with the next sequence (the worker's buffer).
  auto reseal = [&](std::vector<std::byte>& msg, std::uint32_t w) {
    const wire::header h{.kind = wire::message_kind::commit, .codec = codec_id::identity, .type = ashl::dtype::f32,
                         .flags = ps::commit_flags(true, false), .element_count = n, .rank = w, .sequence = seq,
                         .clock = seq, .samples = 16};
    BOOST_REQUIRE(wire::seal(h, msg.size() - wire::header_bytes, msg).has_value());
  };
  auto cycle = [&] {
    ++seq;
    for (std::uint32_t w = 0; w < 2; ++w) {
      auto& msg = w == 0 ? a : b;
      reseal(msg, w);
      BOOST_TEST(feed(core, msg, w, 0.0, out).ok());
      if (pinned != ~std::uint64_t{0}) core.unpin_parameters(pinned);
      pinned = core.pin_parameters().version;  // the next commit is added beside it
      out.clear();
    }
  };
  for (int k = 0; k < 3; ++k) cycle();
  const std::uint64_t fused = core.fused_applies();
  const std::size_t before = counting_new::count();
  for (int k = 0; k < 6; ++k) cycle();
  BOOST_TEST(counting_new::count() == before, "allocations: " << counting_new::count() - before);
  BOOST_TEST(core.fused_applies() == fused + 12u);
  core.unpin_parameters(pinned);
}
