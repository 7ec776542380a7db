// rules/server_core.hpp: what a worker's commit says is checked before the
// policy sees it: NaN and infinite values (refused unless allow_non_finite),
// the samples a commit says it covers (bounded), and the store bound
// (automatic by default, an explicit one named when too small). Issue 24,
// items 3 and 6.
#include <ashl/rules/server_core.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/compress/cast.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/sync/any_policy.hpp>
#include <ashl/sync/asp.hpp>
#include <ashl/sync/bsp.hpp>

#include <cmath>
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
using ashl::codec_id;
using ashl::dtype;

std::vector<float> vec(std::size_t n, float base, float step) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = base + step * static_cast<float>(i);
  return v;
}

std::vector<std::byte> dense(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * 4);
  ashl::compress::identity{}.encode(ashl::host_view<const float>(v.data(), v.size()), b, {}).value();
  return b;
}

ps::commit_in commit_of(sync::worker_id w, std::uint64_t seq, std::span<const std::byte> payload, std::uint64_t n,
                        codec_id codec = codec_id::identity, dtype type = dtype::f32) {
  ps::commit_in c;
  c.worker = w;
  c.sequence = seq;
  c.clock = seq;
  c.bytes = payload.size() + 72;
  c.codec = codec;
  c.type = type;
  c.element_count = n;
  c.payload = payload;
  return c;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

ps::shard_layout layout(std::uint64_t n, std::uint32_t servers = 1) { return *ps::shard_layout::even(n, servers); }

const float a_nan = std::numeric_limits<float>::quiet_NaN();
const float inf = std::numeric_limits<float>::infinity();

}  // namespace

// Dense f32, f16 and bf16 (identity and the cast codecs), sparse pairs
// (top-k: named by the pair's index) and a codec checked on what it decodes
// (random-k): refused with refusal::non_finite, the worker and the element
// named, counted, the sequence not consumed, the parameters unchanged (sgd
// and model deltas alike); a valid commit afterwards lands exactly.
BOOST_AUTO_TEST_CASE(non_finite_updates_are_refused_named_and_change_nothing) {
  const std::size_t n = 600;
  for (bool sgd : {false, true}) {
    const auto w0 = vec(n, 0.5f, 0.01f);
    const ps::optimizer_params opt =
        sgd ? ps::optimizer_params{.mode = ps::optimizer_params::kind::sgd, .lr = 0.5} : ps::optimizer_params{};
    auto core = ps::server_core<sync::asp>::create({.layout = layout(n), .workers = 2, .optimizer = opt},
                                                   sync::asp{{.workers = 2}}, w0);
    BOOST_REQUIRE(core.has_value());
    ps::server_actions out(2);
    std::uint64_t refused = 0;
    auto expect_refused = [&](const ps::commit_in& c, const std::string& starts) {
      core->commit(c, 0.0, out);
      BOOST_REQUIRE(out.errors().size() == 1u);
      BOOST_TEST((out.errors()[0].reason == ps::refusal::non_finite));
      const std::string& t = out.errors()[0].text;
      BOOST_TEST(t.rfind(starts, 0) == 0u, t << " does not start with " << starts);
      BOOST_TEST(t.find("worker 1 sent a non-finite value") != std::string::npos, t);
      BOOST_TEST(t.find("allow_non_finite") != std::string::npos, t);
      BOOST_TEST(out.steps() == 0u);
      BOOST_TEST(same_bits(core->parameters(), w0));
      BOOST_TEST(core->stats().commits == 0u);
      BOOST_TEST(core->last_sequence(1) == 0u);
      BOOST_TEST(core->stats().refused_for(ps::refusal::non_finite) == ++refused);
      out.clear();
    };
    // Dense f32: a NaN in the middle of a block, an infinity in the last
    // (partial) block of 256.
    auto g = vec(n, 0.25f, -0.001f);
    g[300] = a_nan;
    expect_refused(commit_of(1, 1, dense(g), n), "commit.payload[300] = nan");
    g[300] = 0.0f;
    g[599] = -inf;
    expect_refused(commit_of(1, 1, dense(g), n), "commit.payload[599] = -inf");
    g[599] = 0.0f;
    // f16 values (identity of f16, and the fp16 codec); bf16 by its codec.
    std::vector<std::byte> h(2 * n);
    for (std::size_t i = 0; i < n; ++i) ashl::byte_writer(std::span(h).subspan(2 * i, 2)).put(std::uint16_t{0x3c00});
    ashl::byte_writer(std::span(h).subspan(2 * 7, 2)).put(std::uint16_t{0x7c00});  // +inf
    expect_refused(commit_of(1, 1, h, n, codec_id::identity, dtype::f16), "commit.payload[7] = inf");
    expect_refused(commit_of(1, 1, h, n, codec_id::fp16), "commit.payload[7] = inf");
    ashl::byte_writer(std::span(h).subspan(2 * 7, 2)).put(std::uint16_t{0x3f80});  // bf16 1.0
    ashl::byte_writer(std::span(h).subspan(2 * 42, 2)).put(std::uint16_t{0x7fc1});  // bf16 NaN
    expect_refused(commit_of(1, 1, h, n, codec_id::bf16), "commit.payload[42] = nan");
    // Sparse pairs: the value of the pair whose index is the largest.
    const auto x = vec(n, -1.0f, 0.01f);
    ashl::compress::topk tk(ashl::compress::topk::count{5});
    std::vector<std::byte> sp(tk.max_encoded_bytes(n, dtype::f32));
    sp.resize(tk.encode(ashl::host_view<const float>(x.data(), n), sp, {}).value());
    std::uint32_t last_index = 0;
    ashl::byte_reader ir(std::span<const std::byte>(sp).subspan(12 + 4 * 4, 4));
    BOOST_REQUIRE(ir.get(last_index, "index").ok());
    ashl::byte_writer(std::span(sp).subspan(12 + 4 * 5 + 4 * 4, 4)).put(a_nan);
    expect_refused(commit_of(1, 1, sp, n, codec_id::topk), "commit.payload[" + std::to_string(last_index) + "] = nan");
    // Random-k: its values are checked as decoded.
    ashl::compress::randomk rk(ashl::compress::randomk_options{.count = 8});
    std::vector<std::byte> rb(rk.max_encoded_bytes(n, dtype::f32));
    rb.resize(rk.encode(ashl::host_view<const float>(x.data(), n), rb, {}).value());
    ashl::byte_writer(std::span(rb).subspan(21 + 4 * 3, 4)).put(inf);
    expect_refused(commit_of(1, 1, rb, n, codec_id::randomk), "commit.decoded[");
    // Nothing of the refused ones stayed in the accumulator.
    core->commit(commit_of(1, 1, dense(vec(n, 1.0f, 0.0f)), n), 0.0, out);
    BOOST_TEST(out.errors().empty());
    std::vector<float> expect = w0;
    for (std::size_t i = 0; i < n; ++i) expect[i] = sgd ? w0[i] - 0.5f * 1.0f : w0[i] + 1.0f;
    BOOST_TEST(same_bits(core->parameters(), expect));
    for (float v : core->parameters()) BOOST_TEST_REQUIRE(std::isfinite(v));
  }
}

// allow_non_finite: the value is taken as the worker sent it.
BOOST_AUTO_TEST_CASE(allow_non_finite_accepts_them) {
  const std::size_t n = 64;
  auto core = ps::server_core<sync::asp>::create({.layout = layout(n), .workers = 1, .allow_non_finite = true},
                                                 sync::asp{{.workers = 1}});
  BOOST_REQUIRE(core.has_value());
  ps::server_actions out(1);
  auto g = vec(n, 1.0f, 0.0f);
  g[5] = a_nan;
  core->commit(commit_of(0, 1, dense(g), n), 0.0, out);
  BOOST_TEST(out.errors().empty());
  BOOST_TEST(core->stats().commits_applied == 1u);
  BOOST_TEST(std::isnan(core->parameters()[5]));
  BOOST_TEST(core->parameters()[4] == 1.0f);
}

// A non-finite commit of a round policy is refused before it is buffered:
// the round completes with the others' commits only when the worker sends
// a finite one, and the parameters stay finite.
BOOST_AUTO_TEST_CASE(bsp_round_never_buffers_a_non_finite_commit) {
  const std::size_t n = 32;
  auto core = ps::server_core<sync::bsp>::create({.layout = layout(n), .workers = 2}, sync::bsp{{.workers = 2}});
  BOOST_REQUIRE(core.has_value());
  ps::server_actions out(2);
  const auto a = dense(vec(n, 2.0f, 0.0f));
  auto bad = vec(n, 4.0f, 0.0f);
  bad[31] = inf;
  core->commit(commit_of(0, 1, a, n), 0.0, out);
  BOOST_TEST(core->stats().commits_buffered == 1u);
  out.clear();
  core->commit(commit_of(1, 1, dense(bad), n), 0.0, out);
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST((out.errors()[0].reason == ps::refusal::non_finite));
  BOOST_TEST(core->version() == 0u);
  BOOST_TEST(core->store().size() == 1u);
  out.clear();
  core->commit(commit_of(1, 1, dense(vec(n, 4.0f, 0.0f)), n), 0.0, out);
  BOOST_TEST(core->version() == 1u);
  for (float v : core->parameters()) BOOST_TEST_REQUIRE(v == 3.0f);  // the mean of 2 and 4
}

// The samples a commit says it covers: above max_commit_samples it is
// refused (named), at the bound it is taken and reaches the policy.
BOOST_AUTO_TEST_CASE(commit_samples_are_bounded) {
  const std::size_t n = 16;
  auto core = ps::server_core<sync::bsp>::create(
      {.layout = layout(n), .workers = 2, .max_commit_samples = 1000},
      sync::bsp{{.workers = 2, .weighting = sync::round_weighting::samples}});
  BOOST_REQUIRE(core.has_value());
  ps::server_actions out(2);
  const auto one = dense(vec(n, 1.0f, 0.0f)), four = dense(vec(n, 4.0f, 0.0f));
  auto c = commit_of(0, 1, one, n);
  c.samples = 1001;
  core->commit(c, 0.0, out);
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST((out.errors()[0].reason == ps::refusal::samples));
  BOOST_TEST(out.errors()[0].text ==
             "commit.samples = 1001: worker 0 says its commit covers more samples than max_commit_samples = 1000");
  BOOST_TEST(core->last_sequence(0) == 0u);
  BOOST_TEST(core->stats().refused_for(ps::refusal::samples) == 1u);
  out.clear();
  c.samples = 1000;
  core->commit(c, 0.0, out);
  auto d = commit_of(1, 1, four, n);
  d.samples = 3000;  // refused: the round waits
  core->commit(d, 0.0, out);
  BOOST_TEST(core->version() == 0u);
  out.clear();
  d.samples = 250;
  core->commit(d, 0.0, out);
  BOOST_TEST(out.errors().empty());
  BOOST_REQUIRE(core->version() == 1u);
  // Samples-weighted: (1000 * 1 + 250 * 4) / 1250 = 1.6.
  for (float v : core->parameters()) BOOST_TEST_REQUIRE(std::abs(v - 1.6f) < 1e-6f);
}

// A samples-weighted round whose counts sum past 64 bits saturates the sum
// (a misconfigured bound) instead of wrapping to a tiny total.
BOOST_AUTO_TEST_CASE(round_sample_sum_saturates) {
  const std::size_t n = 8;
  auto core = ps::server_core<sync::bsp>::create(
      {.layout = layout(n), .workers = 2, .max_commit_samples = ~std::uint64_t{0}},
      sync::bsp{{.workers = 2, .weighting = sync::round_weighting::samples}});
  BOOST_REQUIRE(core.has_value());
  ps::server_actions out(2);
  const auto one = dense(vec(n, 1.0f, 0.0f));
  auto c = commit_of(0, 1, one, n);
  c.samples = ~std::uint64_t{0} - 1;
  core->commit(c, 0.0, out);
  auto d = commit_of(1, 1, one, n);
  d.samples = 10;
  core->commit(d, 0.0, out);
  BOOST_TEST(out.errors().empty());
  BOOST_REQUIRE(core->version() == 1u);
  // Wrapped, the total would be 8 and the weights ~2.3e18 and 1.25.
  for (float v : core->parameters()) BOOST_TEST_REQUIRE(std::abs(v - 1.0f) < 1e-6f);
}

// store_bytes = 0 (the default) is workers x the largest commit of the
// shard; an explicit bound below one dense commit is refused by name.
BOOST_AUTO_TEST_CASE(store_bound_is_automatic_by_default) {
  BOOST_TEST(ps::automatic_store_bytes(1000, 4) == 4u * (8u * 1000u + 64u));
  BOOST_TEST(ps::automatic_store_bytes(~std::uint64_t{0} / 4, 4) == ~std::uint64_t{0});  // saturates
  // 17 M elements on one server (above the old fixed 64 MiB store, which
  // refused to create it) is created with the defaults.
  const std::uint64_t n = 17'000'000;
  auto big = ps::server_core<sync::bsp>::create({.layout = layout(n), .workers = 4}, sync::bsp{{.workers = 4}});
  BOOST_REQUIRE_MESSAGE(big.has_value(), big.to_status().to_string());
  BOOST_TEST(big->store().bound() == ps::automatic_store_bytes(n, 4));
  BOOST_TEST(big->params().store_bytes == ps::automatic_store_bytes(n, 4));
  auto small = ps::server_core<sync::bsp>::create({.layout = layout(1000), .workers = 4, .store_bytes = 3999},
                                                  sync::bsp{{.workers = 4}});
  BOOST_REQUIRE(!small.has_value());
  BOOST_TEST(small.error().message() ==
             "server_core.store_bytes = 3999: holds less than one dense f32 commit of the shard (4 x 1000 = 4000 "
             "bytes; 0 = automatic, 32256 here)");
}

// The new refusal counters survive save/load (the state's version 2 writes
// their count).
BOOST_AUTO_TEST_CASE(refusal_counters_save_and_load) {
  const std::size_t n = 16;
  auto core = ps::server_core<sync::asp>::create({.layout = layout(n), .workers = 1, .max_commit_samples = 5},
                                                 sync::asp{{.workers = 1}});
  BOOST_REQUIRE(core.has_value());
  ps::server_actions out(1);
  auto g = vec(n, 1.0f, 0.0f);
  g[0] = a_nan;
  core->commit(commit_of(0, 1, dense(g), n), 0.0, out);
  auto c = commit_of(0, 1, dense(vec(n, 1.0f, 0.0f)), n);
  c.samples = 6;
  core->commit(c, 0.0, out);
  BOOST_TEST(core->stats().refused_for(ps::refusal::non_finite) == 1u);
  BOOST_TEST(core->stats().refused_for(ps::refusal::samples) == 1u);
  std::vector<std::byte> bytes;
  ashl::state_writer w(bytes);
  core->save(w);
  auto other = ps::server_core<sync::asp>::create({.layout = layout(n), .workers = 1}, sync::asp{{.workers = 1}});
  BOOST_REQUIRE(other.has_value());
  ashl::state_reader r(bytes);
  BOOST_REQUIRE(other->load(r).ok());
  BOOST_TEST((other->stats() == core->stats()));
  // This server's own choice stays (not part of the state).
  BOOST_TEST(other->params().max_commit_samples == (std::uint64_t{1} << 30));
}

// The element is named in the shard and in the whole model.
BOOST_AUTO_TEST_CASE(non_finite_names_the_model_element_of_another_shard) {
  const auto l = layout(1000, 2);
  auto core = ps::server_core<sync::asp>::create({.layout = l, .shard = 1, .workers = 3}, sync::asp{{.workers = 3}});
  BOOST_REQUIRE(core.has_value());
  const std::size_t n = l.range(1).size();
  BOOST_REQUIRE(n == 500u);
  auto g = vec(n, 1.0f, 0.0f);
  g[10] = inf;
  ps::server_actions out(3);
  core->commit(commit_of(2, 4, dense(g), n), 0.0, out);
  BOOST_REQUIRE(out.errors().size() == 1u);
  BOOST_TEST(out.errors()[0].text ==
             "commit.payload[10] = inf: worker 2 sent a non-finite value (element 10 of server 1's shard, 510 of the "
             "model; commit 4); refused, the parameters unchanged (server allow_non_finite accepts it)");
  BOOST_TEST(out.errors()[0].in_reply_to == 4u);
}
