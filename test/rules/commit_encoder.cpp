#include <ashl/rules/commit_encoder.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/counting_new.hpp"

#include <ashl/compress/error_feedback.hpp>
#include <ashl/compress/qsgd.hpp>
#include <ashl/compress/registry.hpp>
#include <ashl/compress/topk.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

// rules/commit_encoder.hpp: the codec a plan commits with, the check of a
// plan_update's plan and codec, and the error-feedback rule every driver
// shares: residuals kept across codec changes, paid off by a dense commit,
// nothing lost; no allocation once a shard's buffers are sized.

namespace ps = ashl::ps;
using ashl::codec_id;
using ashl::worker_plan;

namespace {

std::vector<float> random_update(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

// What the server adds for a payload of `codec` (scale 1).
void decode_into(codec_id codec, std::span<const std::byte> payload, std::vector<float>& acc) {
  const auto s = ashl::compress::decode_add(codec, payload, {acc.size(), ashl::dtype::f32},
                                            ashl::host_view<float>(acc.data(), acc.size()), 1.0f, {});
  BOOST_TEST_REQUIRE(s.ok(), s.message());
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_plan_commits_with_the_servers_codec_only_when_it_compresses) {
  BOOST_TEST((ps::plan_codec(worker_plan{.compression_ratio = 0.1f}, codec_id::topk) == codec_id::topk));
  BOOST_TEST((ps::plan_codec(worker_plan{.compression_ratio = 1.0f}, codec_id::topk) == codec_id::identity));
  BOOST_TEST((ps::plan_codec(worker_plan{.compression_ratio = 0.5f}, codec_id::qsgd) == codec_id::qsgd));
}

BOOST_AUTO_TEST_CASE(a_plan_and_codec_that_do_not_go_together_are_named) {
  BOOST_TEST(ps::check_plan_codec(worker_plan{.compression_ratio = 0.1f}, codec_id::topk).ok());
  BOOST_TEST(ps::check_plan_codec(worker_plan{}, codec_id::identity).ok());
  BOOST_TEST(ps::check_plan_codec(worker_plan{.compression_ratio = 0.1f}, codec_id::identity).message() ==
             "plan_update.codec = \"identity\": must compress: the plan's compression_ratio is 0.100000");
  BOOST_TEST(ps::check_plan_codec(worker_plan{}, codec_id::sign).message() ==
             "plan_update.codec = \"sign\": must be identity: the plan's compression_ratio is 1");
  BOOST_TEST(ps::check_plan_codec(worker_plan{}, static_cast<codec_id>(200)).message() ==
             "plan_update.codec = 200: unknown codec id");
  // The plan's own rules come first, with the caller's field name.
  BOOST_TEST(ps::check_plan_codec(worker_plan{.local_iterations = 0}, codec_id::identity, "plan").message() ==
             "plan.local_iterations = 0: must be >= 1 unless commit_interval_us > 0 (commit by interval)");
  ps::commit_encoder e;
  BOOST_TEST(e.set(codec_id::topk, 0.0f).message() == "commit_encoder.ratio = 0: must be in (0, 1]");
  BOOST_TEST(e.encode(0, std::vector<float>(4), 0).error().message() ==
             "commit_encoder.codec = \"identity\": does not encode: use dense()");
}

BOOST_AUTO_TEST_CASE(encoding_is_the_error_feedback_decorators_byte_for_byte) {
  const std::size_t n = 5000;
  ps::commit_encoder enc({.error_feedback = true, .seed = 11});
  BOOST_TEST_REQUIRE(enc.set(codec_id::topk, 0.02f).ok());
  ashl::compress::error_feedback<ashl::compress::topk> ref{ashl::compress::topk{0.02}};
  std::vector<std::byte> buf(ref.max_encoded_bytes(n, ashl::dtype::f32));
  std::vector<std::byte> scratch(ref.scratch_bytes(n, ashl::dtype::f32));
  for (unsigned step = 0; step < 6; ++step) {
    const auto x = random_update(n, step);
    auto got = enc.encode(3, x, step);
    BOOST_TEST_REQUIRE(got.has_value(), (got ? "" : got.error().message()));
    auto used = ref.encode(ashl::host_view<const float>(x.data(), n), buf,
                           {.seed = 11, .step = step, .tensor = 3, .scratch = scratch});
    BOOST_TEST_REQUIRE(used.has_value());
    BOOST_TEST_REQUIRE(got->size() == *used);
    BOOST_TEST(std::memcmp(got->data(), buf.data(), *used) == 0, "step " << step);
    const auto a = enc.residual(3), b = ref.residual(3);
    BOOST_TEST_REQUIRE(a.size() == b.size());
    BOOST_TEST(std::memcmp(a.data(), b.data(), a.size() * 4) == 0, "step " << step);
  }
}

BOOST_AUTO_TEST_CASE(nothing_is_lost_across_codec_changes_and_a_dense_commit_pays_the_residual_off) {
  // Top-k at two ratios, then QSGD, then dense: what the server decodes over
  // all commits equals the sum of the updates (up to float rounding), and
  // the dense commit leaves nothing owed.
  const std::size_t n = 4096;
  ps::commit_encoder enc({.error_feedback = true, .seed = 5});
  std::vector<float> sent(n, 0.0f), truth(n, 0.0f);
  const struct {
    codec_id id;
    float ratio;
  } plans[] = {{codec_id::topk, 0.01f}, {codec_id::topk, 0.05f}, {codec_id::qsgd, 0.5f}, {codec_id::topk, 0.01f}};
  unsigned step = 0;
  for (const auto& pl : plans) {
    BOOST_TEST_REQUIRE(enc.set(pl.id, pl.ratio).ok());
    for (int c = 0; c < 3; ++c, ++step) {
      const auto x = random_update(n, 100 + step);
      for (std::size_t i = 0; i < n; ++i) truth[i] += x[i];
      auto payload = enc.encode(0, x, step);
      BOOST_TEST_REQUIRE(payload.has_value(), (payload ? "" : payload.error().message()));
      decode_into(pl.id, *payload, sent);
    }
  }
  BOOST_TEST(enc.owes());
  // The plan stops compressing: the dense commit is x + e, then nothing is owed.
  BOOST_TEST_REQUIRE(enc.set(codec_id::identity, 1.0f).ok());
  const auto x = random_update(n, 999);
  for (std::size_t i = 0; i < n; ++i) truth[i] += x[i];
  const auto dense = enc.dense(0, x);
  BOOST_TEST(dense.data() != x.data());
  for (std::size_t i = 0; i < n; ++i) sent[i] += dense[i];
  BOOST_TEST(!enc.owes());
  for (float v : enc.residual(0)) BOOST_TEST_REQUIRE(v == 0.0f);
  double worst = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(double(sent[i]) - double(truth[i])));
    scale = std::max(scale, std::abs(double(truth[i])));
  }
  BOOST_TEST(worst <= 1e-4 * scale, "largest difference " << worst << " of " << scale);
  // With nothing owed, a dense commit is the caller's buffer itself.
  BOOST_TEST(enc.dense(0, x).data() == x.data());
}

BOOST_AUTO_TEST_CASE(without_error_feedback_nothing_is_kept) {
  const std::size_t n = 1000;
  ps::commit_encoder enc({.error_feedback = false});
  BOOST_TEST_REQUIRE(enc.set(codec_id::topk, 0.01f).ok());
  const auto x = random_update(n, 1);
  auto payload = enc.encode(0, x, 0);
  BOOST_TEST_REQUIRE(payload.has_value());
  std::vector<std::byte> ref(ashl::compress::topk{0.01}.max_encoded_bytes(n, ashl::dtype::f32));
  auto used = ashl::compress::topk{0.01}.encode(ashl::host_view<const float>(x.data(), n), ref, {});
  BOOST_TEST_REQUIRE(used.has_value());
  BOOST_TEST_REQUIRE(payload->size() == *used);
  BOOST_TEST(std::memcmp(payload->data(), ref.data(), *used) == 0);
  BOOST_TEST(!enc.owes());
  BOOST_TEST(enc.dense(0, x).data() == x.data());
}

BOOST_AUTO_TEST_CASE(nothing_allocates_once_a_shards_buffers_are_sized) {
  const std::size_t n = 20000;
  ps::commit_encoder enc({.error_feedback = true});
  BOOST_TEST_REQUIRE(enc.set(codec_id::topk, 0.01f).ok());
  const auto x = random_update(n, 7);
  for (std::uint32_t s = 0; s < 2; ++s) {
    enc.reserve(s, n);
    BOOST_TEST_REQUIRE(enc.encode(s, x, 0).has_value());  // the first encode sizes the codec's scratch
  }
  (void)enc.set(codec_id::identity, 1.0f);
  (void)enc.dense(0, x);
  (void)enc.set(codec_id::topk, 0.01f);
  const auto before = counting_new::allocations.load();
  for (unsigned step = 1; step < 20; ++step) {
    for (std::uint32_t s = 0; s < 2; ++s) BOOST_TEST_REQUIRE(enc.encode(s, x, step).has_value());
    if (step % 5 == 0) {
      (void)enc.set(codec_id::identity, 1.0f);
      for (std::uint32_t s = 0; s < 2; ++s) (void)enc.dense(s, x);
      (void)enc.set(codec_id::topk, 0.01f);
    }
  }
  BOOST_TEST(counting_new::allocations.load() == before);
}

// Codec options in the plan (core/plan.hpp codec_options): checked per codec
// by name, filled from the server's where the policy left them 0, and the
// encoder builds the codec they name ("block4 with B = 128").
BOOST_AUTO_TEST_CASE(plan_codec_options_build_the_named_codec) {
  const worker_plan p{.compression_ratio = 0.14f, .codec_bits = 4, .codec_block = 128};
  BOOST_TEST(ps::check_plan_codec(p, codec_id::block).ok());
  auto msg = [](const worker_plan& q, codec_id c) { return ps::check_plan_codec(q, c).message(); };
  BOOST_TEST(msg({.compression_ratio = 0.5f, .codec_bits = 3}, codec_id::block) ==
             "plan_update.codec_bits = 3: must be 2, 4 or 8");
  BOOST_TEST(msg({.compression_ratio = 0.5f, .codec_block = 100}, codec_id::block) ==
             "plan_update.codec_block = 100: must be a multiple of 8 in [8, 65536]");
  BOOST_TEST(msg({.compression_ratio = 0.5f, .codec_block = 131072}, codec_id::block) ==
             "plan_update.codec_block = 131072: must be a multiple of 8 in [8, 65536]");
  BOOST_TEST(msg({.compression_ratio = 0.5f, .codec_bits = 4}, codec_id::topk) ==
             "plan_update.codec_bits = 4: codec topk takes no bits (must be 0)");
  BOOST_TEST(msg({.compression_ratio = 0.5f, .codec_block = 64}, codec_id::topk) ==
             "plan_update.codec_block = 64: codec topk takes no block (must be 0)");
  BOOST_TEST(ps::check_plan_codec({.compression_ratio = 0.5f, .codec_block = 100}, codec_id::qsgd).ok());

  // The server's options fill what the plan left 0; a dense plan carries none.
  const ashl::codec_options server{.bits = 2, .block = 256};
  const auto filled = ps::plan_with_codec_options({.compression_ratio = 0.5f, .codec_block = 32}, codec_id::block, server);
  BOOST_TEST(filled.codec_bits == 2u);
  BOOST_TEST(filled.codec_block == 32u);
  const auto dense = ps::plan_with_codec_options({.codec_bits = 4}, codec_id::block, server);
  BOOST_TEST(!dense.has_codec_options());
  BOOST_TEST(ps::check_plan_codec(dense, ps::plan_codec(dense, codec_id::block)).ok());
  // A server ratio below 1 makes the plans its policy left dense compress
  // (DiLoCo's low-bit pseudo-gradients under any policy); a plan that
  // compresses keeps its own ratio; 1 changes nothing.
  const auto low_bit = ps::plan_with_codec_options({.local_iterations = 8}, codec_id::block, server, 0.125f);
  BOOST_TEST(low_bit.compression_ratio == 0.125f);
  BOOST_TEST(low_bit.local_iterations == 8u);
  BOOST_TEST((ps::plan_codec(low_bit, codec_id::block) == codec_id::block));
  BOOST_TEST((low_bit.compression_options() == server));
  BOOST_TEST(ps::check_plan_codec(low_bit, codec_id::block).ok());
  BOOST_TEST(ps::plan_with_codec_options({.compression_ratio = 0.5f}, codec_id::topk, {}, 0.125f).compression_ratio ==
             0.5f);
  BOOST_TEST((ps::plan_with_codec_options({.local_iterations = 8}, codec_id::block, server, 1.0f) ==
              ashl::worker_plan{.local_iterations = 8}));
  BOOST_TEST(ps::check_compression_ratio(0.125f, codec_id::block, "server.compression_ratio").ok());
  BOOST_TEST(ps::check_compression_ratio(1.0f, codec_id::identity, "server.compression_ratio").ok());
  BOOST_TEST(ps::check_compression_ratio(0.0f, codec_id::block, "server.compression_ratio").message() ==
             "server.compression_ratio = 0: must be in (0, 1] (1: a plan the policy leaves dense stays dense)");
  BOOST_TEST(ps::check_compression_ratio(1.5f, codec_id::block, "server.compression_ratio").message() ==
             "server.compression_ratio = 1.5: must be in (0, 1] (1: a plan the policy leaves dense stays dense)");
  BOOST_TEST(ps::check_compression_ratio(0.5f, codec_id::identity, "server.compression_ratio").message() ==
             "server.compression_ratio = 0.5: must be 1 with compression identity (nothing would compress)");

  // The encoder's payload is block_quant{4, 128}'s, byte for byte.
  const std::size_t n = 1000;
  const auto x = random_update(n, 11);
  ps::commit_encoder enc({.error_feedback = false});
  BOOST_TEST_REQUIRE(enc.set(codec_id::block, p.compression_ratio, p.compression_options()).ok());
  BOOST_TEST((enc.compression_options() == ashl::codec_options{4, 128}));
  BOOST_TEST(enc.max_encoded_bytes(n) == 16u + 4u * 8u + 500u);
  const auto got = enc.encode(0, x, 3);
  BOOST_TEST_REQUIRE(got.has_value());
  const ashl::compress::block_quant direct{{.bits = 4, .block = 128}};
  std::vector<std::byte> want(direct.max_encoded_bytes(n, ashl::dtype::f32));
  const auto used = direct.encode(ashl::host_view<const float>(x.data(), n), want, {.step = 3});
  BOOST_TEST_REQUIRE(used.has_value());
  BOOST_TEST_REQUIRE(got->size() == *used);
  BOOST_TEST(std::memcmp(got->data(), want.data(), *used) == 0);
  // The defaults (options 0): 4 bits, B = 64.
  BOOST_TEST_REQUIRE(enc.set(codec_id::block, 0.5f).ok());
  BOOST_TEST(enc.max_encoded_bytes(n) == 16u + 4u * 16u + 500u);
  // Options a codec does not take are refused by name; the codec in force stays.
  BOOST_TEST(enc.set(codec_id::topk, 0.1f, {.bits = 4}).message() ==
             "commit_encoder.codec_bits = 4: codec topk takes no bits (must be 0)");
  BOOST_TEST((enc.codec() == codec_id::block));
  // qsgd's bucket from the plan.
  BOOST_TEST_REQUIRE(enc.set(codec_id::qsgd, 0.5f, {.block = 100}).ok());
  BOOST_TEST(enc.max_encoded_bytes(n) == ashl::compress::qsgd::payload_bytes(n, 100, 127));
}

BOOST_AUTO_TEST_CASE(codec_specs_parse_and_print) {
  auto parse = [](std::string_view t) { return ps::parse_codec_spec(t); };
  BOOST_TEST((parse("block4")->options == ashl::codec_options{4, 0}));
  BOOST_TEST((parse("block4")->id == codec_id::block));
  BOOST_TEST((parse("block8:128")->options == ashl::codec_options{8, 128}));
  BOOST_TEST((parse("block2:32")->options == ashl::codec_options{2, 32}));
  BOOST_TEST((parse("block")->options == ashl::codec_options{0, 0}));
  BOOST_TEST((parse("qsgd:256")->options == ashl::codec_options{0, 256}));
  BOOST_TEST((parse("topk")->id == codec_id::topk));
  BOOST_TEST(ps::to_string(*parse("block")) == "block4:64");
  BOOST_TEST(ps::to_string(*parse("block4")) == "block4:64");
  BOOST_TEST(ps::to_string(*parse("block2:256")) == "block2:256");
  BOOST_TEST(ps::to_string(*parse("qsgd:256")) == "qsgd:256");
  BOOST_TEST(ps::to_string(*parse("topk")) == "topk");
  BOOST_TEST(parse("block3").error().message().rfind("compression.bits = 3", 0) == 0u, parse("block3").error().message());
  BOOST_TEST(parse("block4:0").error().message().rfind("compression = \"block4:0\"", 0) == 0u);
  BOOST_TEST(parse("block4:12").error().message().rfind("compression.block = 12", 0) == 0u);
  BOOST_TEST(parse("block4:x").error().message().rfind("compression = \"block4:x\"", 0) == 0u);
  BOOST_TEST(parse("blockx").error().message().rfind("compression = \"blockx\"", 0) == 0u);
  BOOST_TEST(parse("topk:64").error().message().rfind("compression.block = 64", 0) == 0u);
  BOOST_TEST(parse("gzip").error().message() == "compression = \"gzip\": unknown codec");
}
