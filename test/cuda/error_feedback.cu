// GPU decorators against the CPU ones (built by the host compiler,
// reference.hpp): cuda::error_feedback<C> over the routes the fused codecs
// do not cover (sparse pairs: topk, threshold, topk_sampled; decode:
// identity, fp16, bf16), and cuda::dgc<C> (momentum and velocity on the
// device, sent coordinates cleared): every step's payload byte for byte and
// the state after, bit for bit. Also: the wrappers are device codecs, strict
// casts are refused under error feedback, state is per tensor, reset zeroes it.
#include <ashl/compress/cuda/cast.cuh>
#include <ashl/compress/cuda/dgc.cuh>
#include <ashl/compress/cuda/error_feedback.cuh>
#include <ashl/compress/cuda/identity.cuh>
#include <ashl/compress/cuda/threshold.cuh>
#include <ashl/compress/cuda/topk.cuh>
#include <ashl/compress/cuda/topk_sampled.cuh>

#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include "harness.cuh"

#include <ashl/compress/cast.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/threshold.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/compress/topk_sampled.hpp>

using namespace ashl_test;

static_assert(cc::cuda::device_codec<cc::cuda::error_feedback<cc::topk>>);
static_assert(cc::cuda::device_codec<cc::cuda::error_feedback<cc::threshold>>);
static_assert(cc::cuda::device_codec<cc::cuda::error_feedback<cc::topk_sampled>>);
static_assert(cc::cuda::device_codec<cc::cuda::error_feedback<cc::fp16>>);
static_assert(cc::cuda::device_codec<cc::cuda::dgc<cc::topk>>);
static_assert(cc::cuda::device_codec<cc::cuda::dgc<cc::threshold>>);
static_assert(cc::cuda::device_codec<cc::cuda::dgc<cc::topk_sampled>>);

namespace {

const cc::codec_context ctx{.seed = 99, .step = 40, .tensor = 6};

std::vector<float> download(ashl::device_view<const float> v) {
  std::vector<float> h(v.size());
  if (!h.empty()) check(cudaMemcpy(h.data(), v.data(), h.size() * sizeof(float), cudaMemcpyDeviceToHost), "download");
  return h;
}

// Three DGC steps on both sides: payloads, then u and v.
template <class T, class C>
void check_dgc(const C& c, float m, std::size_t n, pattern p, cc::codec_context cx) {
  BOOST_TEST_CONTEXT("dgc, n = " << n << ", pattern = " << name(p) << ", dtype = "
                                 << ashl::to_string(ashl::dtype_of<T>) << ", m = " << m) {
    std::vector<std::vector<T>> xs;
    std::vector<const void*> ptrs;
    for (std::uint32_t s = 0; s < 3; ++s) xs.push_back(convert<T>(make_input(n, p, 200 + s)));
    for (const auto& x : xs) ptrs.push_back(x.data());
    const ref::dgc_run cpu = ref::dgc(c, m, ashl::dtype_of<T>, ptrs, n, cx);
    cc::cuda::dgc<C> d{c, {.momentum = m}};
    device_buffer<std::byte> out(d.max_encoded_bytes(n, ashl::dtype::f32));
    device_buffer<std::uint64_t> d_used(1);
    cc::cuda::device_output o{.bytes = out.view(), .d_used = d_used.data()};
    cc::cuda::device_scratch q{};
    {
      device_buffer<T> probe(1);
      BOOST_REQUIRE(cc::cuda::encode(d, ashl::device_view<const T>(probe.data(), n), o, cx, q, nullptr, cudaStream_t{})
                        .ok());
    }
    BOOST_TEST(d.velocity(cx.tensor).size() == 0u);  // a size query allocates nothing
    device_buffer<std::byte> scratch(q.bytes);
    const std::uint64_t first = cx.step;
    for (std::size_t s = 0; s < xs.size(); ++s) {
      cx.step = first + s;
      device_buffer<T> dx(xs[s]);
      cc::cuda::device_scratch sc{scratch.data(), q.bytes};
      const ashl::status st = cc::cuda::encode(d, dx.cview(), o, cx, sc, nullptr, cudaStream_t{});
      BOOST_REQUIRE_MESSAGE(st.ok(), st.message());
      check(cudaDeviceSynchronize(), "dgc encode");
      BOOST_REQUIRE(cpu.steps[s].payload.has_value());
      BOOST_TEST(first_difference(*cpu.steps[s].payload, out.download(d_used.download(1)[0])) == -1);
    }
    BOOST_TEST(first_float_difference(cpu.momentum, download(d.momentum(cx.tensor))) == -1);
    BOOST_TEST(first_float_difference(cpu.velocity, download(d.velocity(cx.tensor))) == -1);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(error_feedback_sparse_pairs_match_cpu) {
  check_error_feedback<float>(cc::topk{0.01}, 100003, pattern::normal, ctx);
  check_error_feedback<ashl::half>(cc::topk{0.001}, 300007, pattern::heavy_tailed, ctx);
  check_error_feedback<float>(cc::topk{0.05}, 4099, pattern::special, ctx);  // NaN, inf in the residual
  check_error_feedback<float>(cc::threshold{{.theta = 1.0f, .max_ratio = 0.5}}, 100003, pattern::normal, ctx);
  check_error_feedback<ashl::bfloat16>(cc::threshold{{.theta = 0.5f, .max_ratio = 0.01}}, 100003, pattern::ties, ctx);
  check_error_feedback<float>(cc::topk_sampled{0.01}, 300007, pattern::normal, ctx);
  check_error_feedback<ashl::half>(cc::topk_sampled{0.001}, 1000003, pattern::heavy_tailed, ctx);
}

BOOST_AUTO_TEST_CASE(error_feedback_dense_match_cpu) {
  check_error_feedback<float>(cc::identity{}, 100003, pattern::normal, ctx);
  check_error_feedback<ashl::half>(cc::identity{}, 10007, pattern::special, ctx);
  check_error_feedback<float>(cc::fp16{}, 100003, pattern::special, ctx);
  check_error_feedback<ashl::bfloat16>(cc::bf16{}, 100003, pattern::heavy_tailed, ctx);
}

BOOST_AUTO_TEST_CASE(error_feedback_refuses_strict_casts) {
  cc::cuda::error_feedback<cc::fp16> ef{cc::fp16{{.strict = true}}};
  device_buffer<float> dx(16);
  device_buffer<std::byte> out(64);
  cc::cuda::device_output o{.bytes = out.view()};
  cc::cuda::device_scratch q{};
  const ashl::status s = cc::cuda::encode(ef, dx.cview(), o, ctx, q, nullptr, cudaStream_t{});
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("error_feedback.inner.strict") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(error_feedback_state_is_per_tensor_and_resets) {
  cc::cuda::error_feedback<cc::topk> ef{cc::topk{0.5}};
  const std::size_t n = 1000;
  BOOST_REQUIRE(ef.reserve(1, n, cudaStream_t{}).ok());
  BOOST_REQUIRE(ef.reserve(2, 10, cudaStream_t{}).ok());
  BOOST_TEST(ef.residual(1).size() == n);
  BOOST_TEST(ef.residual(2).size() == 10u);
  BOOST_TEST(ef.residual(3).size() == 0u);
  const std::vector<float> x = make_input(n, pattern::normal, 1);
  device_buffer<float> dx(x);
  device_buffer<std::byte> out(ef.max_encoded_bytes(n, ashl::dtype::f32));
  cc::cuda::device_output o{.bytes = out.view()};
  std::unique_ptr<device_buffer<std::byte>> scratch;
  const cc::codec_context c1{.tensor = 1};
  BOOST_REQUIRE(
      two_call([&](cc::cuda::device_scratch& sc) { return cc::cuda::encode(ef, dx.cview(), o, c1, sc, nullptr, {}); },
               scratch)
          .ok());
  check(cudaDeviceSynchronize(), "encode");
  const std::vector<float> e = download(ef.residual(1));
  std::size_t nonzero = 0;
  for (float v : e) nonzero += v != 0.0f;
  BOOST_TEST(nonzero == n / 2);  // the half not sent stays owed
  for (float v : download(ef.residual(2))) BOOST_TEST(v == 0.0f);
  BOOST_REQUIRE(ef.reset(cudaStream_t{}).ok());
  check(cudaDeviceSynchronize(), "reset");
  for (float v : download(ef.residual(1))) BOOST_TEST_REQUIRE(v == 0.0f);
}

BOOST_AUTO_TEST_CASE(dgc_matches_cpu) {
  check_dgc<float>(cc::topk{0.01}, 0.9f, 100003, pattern::normal, ctx);
  check_dgc<ashl::half>(cc::topk{0.001}, 0.5f, 300007, pattern::heavy_tailed, ctx);
  check_dgc<float>(cc::threshold{{.theta = 2.0f, .max_ratio = 0.05}}, 0.9f, 100003, pattern::normal, ctx);
  check_dgc<ashl::bfloat16>(cc::threshold{{.theta = 0.5f, .max_ratio = 0.001}}, 0.0f, 100003, pattern::ties, ctx);
  check_dgc<float>(cc::topk_sampled{0.01}, 0.9f, 1000003, pattern::normal, ctx);
  check_dgc<float>(cc::topk_sampled{0.001}, 0.99f, 1000003, pattern::all_equal, ctx);
}

BOOST_AUTO_TEST_CASE(dgc_rejects_a_bad_momentum) {
  cc::cuda::dgc<cc::topk> d{cc::topk{0.01}, {.momentum = 1.0f}};
  device_buffer<float> dx(16);
  device_buffer<std::byte> out(1024);
  cc::cuda::device_output o{.bytes = out.view()};
  cc::cuda::device_scratch q{};
  BOOST_TEST(!cc::cuda::encode(d, dx.cview(), o, ctx, q, nullptr, cudaStream_t{}).ok());
}

ASHL_TEST_CUDA_MAIN()
