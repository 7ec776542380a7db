#include <ashl/coll/compressed.hpp>
#include <boost/test/unit_test.hpp>

#include <ashl/coll/inproc.hpp>
#include <ashl/compress/error_feedback.hpp>
#include <ashl/compress/qsgd.hpp>
#include <ashl/compress/topk.hpp>

#include <functional>
#include <thread>
#include <vector>

// Compressed collectives over the in-process model, against a
// single-process reference: encode every rank's vector, decode-add in rank
// order with the rank's weight.

#include "../support/on_ranks.hpp"
#include "../support/checks.hpp"

using namespace ashl;
using ashl_test::on_ranks;
using namespace ashl::coll;

namespace {

std::vector<float> input(int rank, std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = float((i * 7 + std::size_t(rank) * 13) % 17) - 8.f + 0.25f * float(rank);
  return x;
}
}  // namespace

BOOST_AUTO_TEST_CASE(topk_payload_allreduce_matches_the_reference_exactly) {
  constexpr int m = 4;
  constexpr std::size_t n = 1000;
  const std::vector<double> w = {0.25, 0.25, 0.25, 0.25};
  // reference
  std::vector<float> ref(n, 0.f);
  compress::topk codec(0.05);
  for (int r = 0; r < m; ++r) {
    auto x = input(r, n);
    std::vector<std::byte> buf(codec.max_encoded_bytes(n, dtype::f32)), scratch(codec.scratch_bytes(n, dtype::f32));
    compress::codec_context ctx{.scratch = scratch};
    auto used = codec.encode(host_view<const float>(x.data(), n), buf, ctx);
    ASHL_REQUIRE(used.has_value());
    ASHL_REQUIRE(codec.decode_add({buf.data(), *used}, {n, dtype::f32}, host_view<float>(ref.data(), n), 0.25f, ctx).ok());
  }
  on_ranks(m, [&](inproc& c) {
    payload_exchange<compress::topk> ex(compress::topk(0.05));
    auto x = input(c.rank(), n);
    ASHL_REQUIRE(ex(c, host_view<float>(x.data(), n), w, 1).ok());
    ASHL_TEST(x == ref);
    ASHL_TEST(ex.last_payload_bytes() <= compress::topk(0.05).max_encoded_bytes(n, dtype::f32));
    ASHL_TEST(ex.last_gathered_bytes() == 4 * ex.last_payload_bytes());  // same k everywhere
  });
}

BOOST_AUTO_TEST_CASE(error_feedback_keeps_what_was_not_sent) {
  constexpr std::size_t n = 64;
  on_ranks(2, [&](inproc& c) {
    using ef = compress::error_feedback<compress::topk>;
    payload_exchange<ef> ex(ef(compress::topk(compress::topk::count{1})));
    std::vector<float> x(n, 0.f);
    x[std::size_t(c.rank())] = 4.f;  // sent
    x[10] = 1.f;                      // kept in the residual
    ASHL_REQUIRE(ex(c, host_view<float>(x.data(), n), std::vector<double>{0.5, 0.5}, 1).ok());
    ASHL_TEST(x[0] == 2.f);
    ASHL_TEST(x[1] == 2.f);
    ASHL_TEST(x[10] == 0.f);
    ASHL_TEST(ex.codec().residual(0)[10] == 1.f);
    // next step with nothing new: the residual goes out now
    std::vector<float> z(n, 0.f);
    ASHL_REQUIRE(ex(c, host_view<float>(z.data(), n), std::vector<double>{0.5, 0.5}, 2).ok());
    ASHL_TEST(z[10] == 1.f);
  });
}

BOOST_AUTO_TEST_CASE(qsgd_payloads_decode_the_same_on_every_rank) {
  constexpr std::size_t n = 300;
  std::vector<std::vector<float>> out(3);
  on_ranks(3, [&](inproc& c) {
    payload_exchange<compress::qsgd> ex(compress::qsgd{}, 42);
    auto x = input(c.rank(), n);
    ASHL_REQUIRE(ex(c, host_view<float>(x.data(), n), std::vector<double>{1.0, 1.0, 1.0}, 3).ok());
    out[std::size_t(c.rank())] = x;
  });
  ASHL_TEST(out[0] == out[1]);
  ASHL_TEST(out[0] == out[2]);
}

BOOST_AUTO_TEST_CASE(dense_16_bit_exchanges_are_weighted_sums) {
  on_ranks(4, [](inproc& c) {
    std::vector<float> x = {float(c.rank() + 1), 0.5f};
    dense_exchange half_ex{dtype::f16};
    ASHL_REQUIRE(half_ex(c, host_view<float>(x.data(), 2), std::vector<double>{0.5, 0.5, 0.25, 0.25}).ok());
    ASHL_TEST(x[0] == 0.5f + 1.f + 0.75f + 1.f);
    ASHL_TEST(x[1] == 0.75f);
    auto bad = half_ex(c, host_view<float>(x.data(), 2), std::vector<double>{1.0});
    ASHL_TEST(!bad.ok());
  });
}

BOOST_AUTO_TEST_CASE(the_model_compares_compression_with_16_bit_dense) {
  // 100 MiB of f32, top-k 1 % (8-byte pairs: 2 % of the f32 bytes), 4 ranks.
  const std::size_t n = 25 * 1024 * 1024;
  transfer_inputs slow{.elements = n, .ranks = 4, .link = {1e-4, 1.25e8}, .payload_bytes = 0.08 * double(n),
                       .codec = {2e-9}};
  const auto e = estimate_transfer(slow);
  BOOST_TEST(e.dense16_seconds == 6 * (1e-4 + 2.0 * double(n) / 4 / 1.25e8), boost::test_tools::tolerance(1e-12));
  ASHL_TEST(e.compress());
  // A fast link where the codec's time dominates: 16-bit dense wins.
  transfer_inputs fast = slow;
  fast.link = {1e-6, 1e11};
  fast.codec = {1e-8};
  ASHL_TEST(!estimate_transfer(fast).compress());
  // A payload as large as 16-bit dense never pays.
  transfer_inputs dense_like = slow;
  dense_like.payload_bytes = 2.0 * double(n);
  ASHL_TEST(!estimate_transfer(dense_like).compress());
  ASHL_TEST(!estimate_transfer({.elements = n, .ranks = 1}).compress());
}

BOOST_AUTO_TEST_CASE(auto_exchange_takes_rank_0s_decision_everywhere) {
  on_ranks(2, [](inproc& c) {
    auto_exchange<compress::topk> ex(dtype::bf16, payload_exchange<compress::topk>(compress::topk(0.5)));
    // only rank 0's inputs count: rank 1's would say the opposite
    transfer_inputs in{.elements = 1 << 20, .ranks = 2, .link = {1e-4, 1e8}, .payload_bytes = 1e4, .codec = {1e-10}};
    if (c.rank() == 1) in.payload_bytes = 1e9;
    ASHL_REQUIRE(ex.decide(c, in).ok());
    ASHL_TEST(ex.compressing());
    std::vector<float> x = {float(c.rank()), 3.f};
    ASHL_REQUIRE(ex(c, host_view<float>(x.data(), 2), std::vector<double>{1.0, 1.0}).ok());
    ASHL_TEST(x[1] == 6.f);  // top-k 50 % of 2: the 3 goes, the 0/1 stays behind
  });
}
