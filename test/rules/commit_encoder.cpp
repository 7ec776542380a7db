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
