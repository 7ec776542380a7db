#include <ashl/rules/reply_encoder.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/counting_new.hpp"

#include <ashl/compress/registry.hpp>
#include <ashl/rules/server_core.hpp>
#include <ashl/sync/asp.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

// rules/reply_encoder.hpp: compressed pull replies. The first reply to a
// worker is dense and becomes its view; each later one is the codec's
// encoding of what the view lacks, which the worker adds into its own copy
// (apply_compressed_reply) to end bit for bit where the server's copy ends;
// what the codec dropped is sent by the next reply (error feedback); a
// (re)join forgets the view; nothing allocates once the views exist.

namespace ps = ashl::ps;
using ashl::codec_id;

namespace {

std::vector<float> gaussian(std::size_t n, unsigned seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  float m = 0.0f;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

const ps::reply_compression block4{.codec = codec_id::block, .options = {.bits = 4, .block = 64}};

}  // namespace

BOOST_AUTO_TEST_CASE(first_reply_dense_then_compressed_and_the_worker_ends_where_the_server_does) {
  const std::size_t n = 1000;
  ps::reply_encoder enc;
  BOOST_TEST_REQUIRE(enc.configure(block4, n, 2, /*seed=*/5, /*tensor=*/0).ok());
  BOOST_TEST(enc.compresses());
  std::vector<std::byte> out(enc.max_encoded_bytes());

  auto W = gaussian(n, 1);
  const auto first = enc.serve(0, W, /*version=*/3, out);
  BOOST_TEST(!first.compressed);
  BOOST_TEST(first.bytes == n * sizeof(float));
  BOOST_TEST(enc.holds_view(0));
  BOOST_TEST(!enc.holds_view(1));
  std::vector<float> worker_view = W;  // what the worker keeps of the dense reply flagged `view`

  const auto step = gaussian(n, 2, 0.01f);
  for (std::size_t i = 0; i < n; ++i) W[i] += step[i];
  const auto second = enc.serve(0, W, /*version=*/7, out);
  BOOST_TEST_REQUIRE(second.compressed);
  BOOST_TEST(second.base == 3u);  // the view it applies to
  BOOST_TEST(second.bytes == enc.max_encoded_bytes());
  BOOST_TEST(second.bytes * 6 < n * sizeof(float));  // 4 bits, a step per 64 values: 580 of 4000 bytes
  BOOST_TEST_REQUIRE(ps::reply_encoder::apply_compressed_reply(codec_id::block, std::span(out).first(second.bytes),
                                                               worker_view, 5, 7, 0u | ps::reply_stream_bit)
                         .ok());
  BOOST_TEST(same_bits(worker_view, second.view));
  // The view moved to within a 4-bit step of the delta's block maxima of W.
  const float err = max_abs_diff(worker_view, W);
  float amax = 0.0f;
  for (float v : step) amax = std::max(amax, std::fabs(v));
  BOOST_TEST(err <= amax / 7.0f * 0.5f * 1.001f);
  BOOST_TEST(err > 0.0f);  // it is compressed: something was dropped
}

BOOST_AUTO_TEST_CASE(what_a_reply_drops_the_next_one_sends) {
  const std::size_t n = 512;
  ps::reply_encoder enc;
  BOOST_TEST_REQUIRE(enc.configure(block4, n, 1, 0, 0).ok());
  std::vector<std::byte> out(enc.max_encoded_bytes());
  auto W = gaussian(n, 3);
  (void)enc.serve(0, W, 1, out);
  const auto jump = gaussian(n, 4, 0.5f);
  for (std::size_t i = 0; i < n; ++i) W[i] += jump[i];
  // W stays put: each reply sends what the last one left out, so the
  // worker's view converges on W (the residual shrinks by a 4-bit step's
  // factor per reply), as error feedback promises.
  float last = 1e30f;
  std::span<const float> view;
  for (std::uint64_t v = 2; v <= 8; ++v) {
    const auto r = enc.serve(0, W, v, out);
    BOOST_TEST_REQUIRE(r.compressed);
    view = r.view;
    const float err = max_abs_diff(view, W);
    BOOST_TEST(err <= last * 0.5f + 1e-6f);
    last = err;
  }
  BOOST_TEST(last < 1e-5f);
}

BOOST_AUTO_TEST_CASE(a_forgotten_view_makes_the_next_reply_dense) {
  const std::size_t n = 64;
  ps::reply_encoder enc;
  BOOST_TEST_REQUIRE(enc.configure(block4, n, 1, 0, 0).ok());
  std::vector<std::byte> out(enc.max_encoded_bytes());
  const auto W = gaussian(n, 5);
  BOOST_TEST(!enc.serve(0, W, 1, out).compressed);
  BOOST_TEST(enc.serve(0, W, 2, out).compressed);
  enc.forget(0);
  BOOST_TEST(!enc.holds_view(0));
  BOOST_TEST(!enc.serve(0, W, 3, out).compressed);
  // A worker beyond the ones configured gets a view of its own.
  BOOST_TEST(!enc.serve(4, W, 3, out).compressed);
  BOOST_TEST(enc.serve(4, W, 4, out).compressed);
  // An output buffer too small for the payload: the reply goes dense (the
  // view becomes the parameters), never a truncated payload.
  std::vector<std::byte> tiny(8);
  const auto r = enc.serve(0, W, 5, tiny);
  BOOST_TEST(!r.compressed);
  BOOST_TEST(same_bits(r.view, W));
}

BOOST_AUTO_TEST_CASE(identity_sends_everything_dense_and_timing_mode_counts_sizes) {
  ps::reply_encoder dense;
  BOOST_TEST_REQUIRE(dense.configure({}, 10, 1, 0, 0).ok());
  std::vector<std::byte> none;
  const std::vector<float> W(10, 1.0f);
  for (int i = 0; i < 3; ++i) BOOST_TEST(!dense.serve(0, W, 1, none).compressed);

  ps::reply_encoder timing;
  BOOST_TEST_REQUIRE(timing.configure(block4, 0, 1, 0, 0).ok());
  const auto a = timing.serve(0, {}, 1, none, 4096);
  BOOST_TEST(!a.compressed);
  BOOST_TEST(a.bytes == 4096u * 4u);
  const auto b = timing.serve(0, {}, 2, none, 4096);
  BOOST_TEST(b.compressed);
  BOOST_TEST(b.base == 1u);
  BOOST_TEST(b.bytes == timing.max_encoded_bytes(4096));
}

BOOST_AUTO_TEST_CASE(bad_settings_are_refused_by_name) {
  ps::reply_encoder enc;
  auto s = enc.configure({.codec = codec_id::block, .ratio = 0.0f}, 8, 1, 0, 0);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("server.replies.ratio") != std::string::npos);
  s = enc.configure({.codec = codec_id::identity, .options = {.bits = 4}}, 8, 1, 0, 0);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("server.replies.options") != std::string::npos);
  s = enc.configure({.codec = codec_id::block, .options = {.bits = 3}}, 8, 1, 0, 0);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("server.replies.options.bits") != std::string::npos);
  s = enc.configure({.codec = static_cast<codec_id>(200)}, 8, 1, 0, 0);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("server.replies.codec") != std::string::npos);
  // A server_core refuses them the same way at creation.
  auto core = ps::server_core<ashl::sync::asp>::create(
      {.layout = *ps::shard_layout::even(8, 1), .workers = 1, .replies = {.codec = codec_id::block, .ratio = 2.0f}},
      ashl::sync::asp{{.workers = 1}});
  BOOST_TEST(!core.has_value());
  BOOST_TEST(core.error().message().find("server.replies.ratio") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_worker_view_refuses_a_payload_the_decoder_refuses) {
  std::vector<float> view(64, 0.0f);
  std::vector<std::byte> junk(3, std::byte{0xff});
  BOOST_TEST(!ps::reply_encoder::apply_compressed_reply(codec_id::block, junk, view, 0, 1, ps::reply_stream_bit).ok());
}

BOOST_AUTO_TEST_CASE(steady_state_replies_allocate_nothing) {
  const std::size_t n = 4096;
  ps::reply_encoder enc;
  BOOST_TEST_REQUIRE(enc.configure(block4, n, 2, 0, 0).ok());
  std::vector<std::byte> out(enc.max_encoded_bytes());
  auto W = gaussian(n, 6);
  for (ashl::sync::worker_id w = 0; w < 2; ++w) {
    (void)enc.serve(w, W, 1, out);  // dense: the views are made here
    (void)enc.serve(w, W, 2, out);  // the first compressed one: the codec's scratch
  }
  const auto before = counting_new::allocations.load();
  for (std::uint64_t v = 3; v < 20; ++v) {
    W[v] += 0.5f;
    for (ashl::sync::worker_id w = 0; w < 2; ++w) BOOST_TEST(enc.serve(w, W, v, out).compressed);
  }
  BOOST_TEST(counting_new::allocations.load() == before);
}

// The rule inside server_core: the core's serve_reply, and a (re)join
// forgets the worker's view (a reconnected worker has none).
BOOST_AUTO_TEST_CASE(server_core_serves_compressed_replies_and_a_join_forgets_the_view) {
  const std::size_t n = 256;
  const auto W0 = gaussian(n, 7);
  auto core = ps::server_core<ashl::sync::asp>::create(
      {.layout = *ps::shard_layout::even(n, 1), .workers = 2, .replies = block4}, ashl::sync::asp{{.workers = 2}}, W0);
  BOOST_TEST_REQUIRE(core.has_value());
  BOOST_TEST(core->compresses_replies());
  std::vector<std::byte> out(core->max_reply_bytes());
  BOOST_TEST(!core->serve_reply(0, out).compressed);
  const auto r = core->serve_reply(0, out);
  BOOST_TEST(r.compressed);
  BOOST_TEST(same_bits(r.view, W0));  // nothing changed: a zero delta decodes to zero
  ps::server_actions acts(2);
  core->join(0, 0, 0.0, acts);
  BOOST_TEST(!core->replies().holds_view(0));
  BOOST_TEST(!core->serve_reply(0, out).compressed);
}
