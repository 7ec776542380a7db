#include <ashl/compress/error_feedback.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/codec_testing.hpp"

#include <ashl/compress/qsgd.hpp>
#include <ashl/compress/sign.hpp>
#include <ashl/compress/topk.hpp>

#include <cmath>

using namespace ashl;
using namespace codec_testing;

static_assert(compress::stateful_codec<compress::error_feedback<compress::sign>>);
static_assert(compress::stateful_codec<compress::error_feedback<compress::topk>>);
static_assert(!compress::codec<compress::error_feedback<compress::sign>>);

namespace {
// Runs T steps of EF over fresh inputs; checks sum(sent) == sum(x) - e_T and
// returns the largest residual max-norm seen.
template <class C, class T = float>
float run_steps(compress::error_feedback<C>& ef, std::size_t n, int steps, std::uint32_t tensor) {
  std::vector<double> sum_x(n, 0.0), sum_sent(n, 0.0);
  std::vector<std::byte> buf(ef.max_encoded_bytes(n, dtype_of<T>));
  float worst = 0.0f;
  for (int t = 0; t < steps; ++t) {
    const auto x = to_type<T>(normal_values(n, 100 + t));
    const compress::codec_context ctx{.seed = 1, .step = static_cast<std::uint64_t>(t), .tensor = tensor};
    auto used = ef.encode(host_view<const T>(x.data(), n), buf, ctx);
    BOOST_REQUIRE(used.has_value());
    std::vector<float> sent(n, 0.0f);
    BOOST_REQUIRE(C{}.decode_add({buf.data(), *used}, {n, dtype::f32}, host_view<float>(sent.data(), n), 1.0f, ctx).ok());
    for (std::size_t i = 0; i < n; ++i) {
      sum_x[i] += to_float(x[i]);
      sum_sent[i] += sent[i];
    }
    for (float v : ef.residual(tensor)) worst = std::max(worst, std::fabs(v));
  }
  const auto e = ef.residual(tensor);
  BOOST_REQUIRE_EQUAL(e.size(), n);
  // Each step's f32 residual update rounds at the scale of the residual and the sent values.
  const double tol = 1e-5 * steps * (8.0 + worst);
  for (std::size_t i = 0; i < n; ++i) BOOST_CHECK_SMALL(sum_sent[i] - (sum_x[i] - e[i]), tol);
  return worst;
}
}  // namespace

BOOST_AUTO_TEST_CASE(telescoping_sum_and_bounded_residual_sign) {
  compress::error_feedback<compress::sign> ef{compress::sign{{.bucket = 64}}};
  const float worst = run_steps(ef, 256, 200, 3);
  BOOST_CHECK_LT(worst, 30.0f);  // bounded, not growing like sqrt(T) * sum
  BOOST_CHECK(ef.residual(4).empty());
}

BOOST_AUTO_TEST_CASE(telescoping_sum_and_bounded_residual_topk) {
  compress::error_feedback<compress::topk> ef{compress::topk{0.1}};
  ef.reserve(0, 300);
  const float worst = run_steps(ef, 300, 150, 0);
  // Each coordinate is sent once its debt is among the top 10 %; debts stay near a few sigma * sqrt(10).
  BOOST_CHECK_LT(worst, 40.0f);
}

BOOST_AUTO_TEST_CASE(half_inputs_and_per_tensor_state) {
  compress::error_feedback<compress::qsgd> ef{compress::qsgd{{.levels = 1, .bucket = 16}}};
  run_steps<compress::qsgd, half>(ef, 100, 50, 1);
  run_steps<compress::qsgd, bfloat16>(ef, 40, 50, 2);
  BOOST_CHECK_EQUAL(ef.residual(1).size(), 100u);
  BOOST_CHECK_EQUAL(ef.residual(2).size(), 40u);
  ef.reset();
  for (float v : ef.residual(1)) BOOST_CHECK_EQUAL(v, 0.0f);
}

BOOST_AUTO_TEST_CASE(identity_leaves_no_residual_and_errors_keep_debt) {
  compress::error_feedback<compress::identity> ef;
  std::vector<float> x{1.0f, -2.0f, 3.5f};
  std::vector<std::byte> buf(12), small(4);
  BOOST_REQUIRE(ef.encode(host_view<const float>(x.data(), 3), buf, {}).has_value());
  for (float v : ef.residual(0)) BOOST_CHECK_EQUAL(v, 0.0f);
  BOOST_CHECK(!ef.encode(host_view<const float>(x.data(), 3), small, {}).has_value());
  BOOST_CHECK(std::vector<float>(ef.residual(0).begin(), ef.residual(0).end()) == x);  // still owed
  BOOST_CHECK_EQUAL(ef.max_encoded_bytes(3, dtype::f16), 12u);
}

// The decorator's body is compress::error_feedback_step on a residual the
// caller owns (ps::commit_encoder keeps one per shard): the same bytes and
// residual as the decorator, step after step, and on an encode error the
// caller's residual keeps x + e.
BOOST_AUTO_TEST_CASE(the_step_on_a_callers_residual_is_the_decorators) {
  const std::size_t n = 300;
  const compress::topk inner{0.05};
  compress::error_feedback<compress::topk> ef{inner};
  std::vector<float> e(n, 0.0f);
  std::vector<std::byte> a(ef.max_encoded_bytes(n, dtype::bf16)), b(a.size());
  for (int t = 0; t < 5; ++t) {
    const auto x = to_type<bfloat16>(normal_values(n, 300 + t));
    const compress::codec_context ctx{.seed = 4, .step = static_cast<std::uint64_t>(t), .tensor = 2};
    auto want = ef.encode(host_view<const bfloat16>(x.data(), n), a, ctx);
    auto got = compress::error_feedback_step(inner, host_view<const bfloat16>(x.data(), n),
                                             host_view<float>(e.data(), n), b, ctx);
    BOOST_REQUIRE(want.has_value() && got.has_value());
    BOOST_REQUIRE_EQUAL(*got, *want);
    BOOST_CHECK(std::equal(a.begin(), a.begin() + *want, b.begin()));
    BOOST_CHECK(std::equal(e.begin(), e.end(), ef.residual(2).begin(), ef.residual(2).end()));
  }
  const std::vector<float> before = e;
  const std::vector<float> x(n, 0.25f);
  std::vector<std::byte> small(4);
  BOOST_CHECK(!compress::error_feedback_step(inner, host_view<const float>(x.data(), n), host_view<float>(e.data(), n),
                                             small, {})
                   .has_value());
  for (std::size_t i = 0; i < n; ++i) BOOST_CHECK_EQUAL(e[i], before[i] + 0.25f);
}
