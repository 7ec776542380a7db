// test/cuda/harness.cuh — the checks every device codec with a host-known
// payload size shares (qsgd, terngrad, sign, natural, randomk): payload bytes
// against the CPU reference, decode-add against the CPU decoder, error
// feedback over several steps, graph capture and replay, malformed payloads.
//
//   check_payloads<float>(cc::qsgd{}, {0, 1, 1000003}, all_patterns, ctx);
//   check_error_feedback<ashl::half>(cc::qsgd{}, 100003, ctx);
#pragma once

#include "reference.hpp"
#include "support.cuh"

#include <boost/test/unit_test.hpp>

#include <ashl/compress/randomk.hpp>

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace ashl_test {

namespace cc = ::ashl::compress;

// The device entry points, whichever of the two call shapes a codec has
// (randomk: no encode report, a context on decode).
template <class C>
inline constexpr bool randomk_shape = std::is_same_v<C, cc::randomk>;
template <class C, class T, std::enable_if_t<!randomk_shape<C>, int> = 0>
ashl::status dev_encode(const C& c, void* s, std::size_t& b, ashl::device_view<const T> x,
                        ashl::device_view<std::byte> o, std::size_t& used, const cc::codec_context& ctx,
                        cudaStream_t st, cc::cuda::device_report* r) {
  return cc::cuda::encode(c, s, b, x, o, used, ctx, st, r);
}
template <class T>
ashl::status dev_encode(const cc::randomk& c, void* s, std::size_t& b, ashl::device_view<const T> x,
                        ashl::device_view<std::byte> o, std::size_t& used, const cc::codec_context& ctx,
                        cudaStream_t st, cc::cuda::device_report*) {
  return cc::cuda::encode(c, s, b, x, o, used, ctx, st);
}
template <class C, class T, std::enable_if_t<!randomk_shape<C>, int> = 0>
ashl::status dev_encode_ef(const C& c, void* s, std::size_t& b, ashl::device_view<const T> x,
                           ashl::device_view<float> e, ashl::device_view<std::byte> o, std::size_t& used,
                           const cc::codec_context& ctx, cudaStream_t st, cc::cuda::device_report* r) {
  return cc::cuda::encode_error_feedback(c, s, b, x, e, o, used, ctx, st, r);
}
template <class T>
ashl::status dev_encode_ef(const cc::randomk& c, void* s, std::size_t& b, ashl::device_view<const T> x,
                           ashl::device_view<float> e, ashl::device_view<std::byte> o, std::size_t& used,
                           const cc::codec_context& ctx, cudaStream_t st, cc::cuda::device_report*) {
  return cc::cuda::encode_error_feedback(c, s, b, x, e, o, used, ctx, st);
}
template <class C, std::enable_if_t<!randomk_shape<C>, int> = 0>
ashl::status dev_decode(const C& c, void* s, std::size_t& b, ashl::device_view<const std::byte> in,
                        cc::payload_info info, ashl::device_view<float> acc, float scale, const cc::codec_context&,
                        cudaStream_t st, cc::cuda::device_report* r) {
  return cc::cuda::decode_add(c, s, b, in, info, acc, scale, st, r);
}
ashl::status dev_decode(const cc::randomk& c, void* s, std::size_t& b, ashl::device_view<const std::byte> in,
                        cc::payload_info info, ashl::device_view<float> acc, float scale,
                        const cc::codec_context& ctx, cudaStream_t st, cc::cuda::device_report* r);

struct gpu_encoded {
  std::vector<std::byte> payload;
  cc::cuda::device_report report{};
};

template <class C, class T>
gpu_encoded gpu_encode(const C& c, const std::vector<T>& x, const cc::codec_context& ctx) {
  device_buffer<T> dx(x);
  device_buffer<std::byte> out(c.max_encoded_bytes(x.size(), ashl::dtype_of<T>));
  device_buffer<cc::cuda::device_report> report(1);
  std::unique_ptr<device_buffer<std::byte>> scratch;
  std::size_t used = 0;
  const ashl::status s = two_call(
      [&](void* p, std::size_t& b) {
        return dev_encode(c, p, b, dx.cview(), out.view(), used, ctx, cudaStream_t{}, report.data());
      },
      scratch);
  BOOST_REQUIRE_MESSAGE(s.ok(), s.message());
  check(cudaDeviceSynchronize(), "encode");
  gpu_encoded r;
  r.payload = out.download(used);
  if constexpr (!randomk_shape<C>) r.report = report.download(1)[0];
  return r;
}

// Decodes `payload` with the CPU codec and on the device into the same
// accumulator; they must agree (NaN as NaN) and the device report be clear.
template <class C>
void compare_decode(const C& c, const std::vector<std::byte>& payload, std::size_t n, ashl::dtype t,
                    const cc::codec_context& ctx) {
  std::vector<float> acc(n);
  for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<float>(i % 13) * 0.1f - 0.5f;
  device_buffer<float> dacc(acc);
  device_buffer<std::byte> din(payload.size());
  if (!payload.empty()) check(cudaMemcpy(din.data(), payload.data(), payload.size(), cudaMemcpyHostToDevice), "upload");
  const float scale = 0.37f;
  const ashl::status cs = c.decode_add(payload, {n, t}, ashl::host_view<float>(acc.data(), n), scale, ctx);
  BOOST_REQUIRE_MESSAGE(cs.ok(), cs.message());
  device_buffer<cc::cuda::device_report> report(1);
  std::unique_ptr<device_buffer<std::byte>> scratch;
  const ashl::status s = two_call(
      [&](void* p, std::size_t& b) {
        return dev_decode(c, p, b, {din.data(), payload.size()}, {n, t}, dacc.view(), scale, ctx, cudaStream_t{},
                          report.data());
      },
      scratch);
  BOOST_REQUIRE_MESSAGE(s.ok(), s.message());
  check(cudaDeviceSynchronize(), "decode");
  BOOST_TEST(report.download(1)[0].fault == 0u);
  BOOST_TEST(first_float_difference(acc, dacc.download(n)) == -1);
}

// Where the CPU refuses an input, the device must report nonfinite_input;
// for bucketed codecs the CPU message names the bucket ("...bucket[b]").
inline void check_refusal(const ref::encoded& cpu, const cc::cuda::device_report& r) {
  BOOST_TEST(r.fault == static_cast<std::uint32_t>(cc::cuda::device_fault::nonfinite_input));
  const auto at = cpu.error.find("bucket[");
  if (at != std::string::npos) {
    const unsigned long long b = std::stoull(cpu.error.substr(at + 7));
    BOOST_TEST(r.index == b);
  }
}

template <class T, class C>
void check_payload(const C& c, std::size_t n, pattern p, const cc::codec_context& ctx) {
  BOOST_TEST_CONTEXT("n = " << n << ", pattern = " << name(p) << ", dtype = " << ashl::to_string(ashl::dtype_of<T>)
                            << ", seed = " << ctx.seed << ", step = " << ctx.step) {
    const std::vector<T> x = convert<T>(make_input(n, p, static_cast<std::uint32_t>(n) * 7 + 1));
    const ref::encoded cpu = ref::encode(c, ashl::dtype_of<T>, x.data(), n, ctx);
    const gpu_encoded gpu = gpu_encode(c, x, ctx);
    if (!cpu.payload) {
      check_refusal(cpu, gpu.report);
      return;
    }
    BOOST_TEST(gpu.report.fault == 0u);
    BOOST_TEST(cpu.payload->size() == gpu.payload.size());
    BOOST_TEST(first_difference(*cpu.payload, gpu.payload) == -1);
    compare_decode(c, gpu.payload, n, ashl::dtype_of<T>, ctx);
  }
}

inline const std::vector<pattern>& all_patterns() {
  static const std::vector<pattern> p{pattern::normal, pattern::ties,    pattern::all_equal, pattern::heavy_tailed,
                                      pattern::special, pattern::zeros, pattern::tiny};
  return p;
}

template <class C>
void check_payloads(const C& c, const std::vector<std::size_t>& sizes, const cc::codec_context& ctx) {
  for (std::size_t n : sizes)
    for (pattern p : all_patterns()) {
      check_payload<float>(c, n, p, ctx);
      check_payload<ashl::half>(c, n, p, ctx);
      check_payload<ashl::bfloat16>(c, n, p, ctx);
    }
}

// Three steps of error feedback on both sides: payloads and final residual.
template <class T, class C>
void check_error_feedback(const C& c, std::size_t n, pattern p, cc::codec_context ctx) {
  BOOST_TEST_CONTEXT("error feedback, n = " << n << ", pattern = " << name(p) << ", dtype = "
                                            << ashl::to_string(ashl::dtype_of<T>)) {
    std::vector<std::vector<T>> xs;
    std::vector<const void*> ptrs;
    for (std::uint32_t s = 0; s < 3; ++s) xs.push_back(convert<T>(make_input(n, p, 100 + s)));
    for (const auto& x : xs) ptrs.push_back(x.data());
    const ref::ef_run cpu = ref::error_feedback(c, ashl::dtype_of<T>, ptrs, n, ctx);
    device_buffer<float> e(std::vector<float>(n, 0.0f));
    device_buffer<std::byte> out(c.max_encoded_bytes(n, ashl::dtype::f32));
    device_buffer<cc::cuda::device_report> report(1);
    std::size_t bytes = 0, used = 0;
    {
      device_buffer<T> probe(1);
      BOOST_REQUIRE(dev_encode_ef(c, nullptr, bytes, ashl::device_view<const T>(probe.data(), n), e.view(), out.view(),
                                  used, ctx, cudaStream_t{}, report.data())
                        .ok());
    }
    device_buffer<std::byte> scratch(bytes);
    const std::uint64_t first = ctx.step;
    for (std::size_t s = 0; s < xs.size(); ++s) {
      ctx.step = first + s;
      device_buffer<T> dx(xs[s]);
      const ashl::status st =
          dev_encode_ef(c, scratch.data(), bytes, dx.cview(), e.view(), out.view(), used, ctx, cudaStream_t{},
                        report.data());
      BOOST_REQUIRE_MESSAGE(st.ok(), st.message());
      check(cudaDeviceSynchronize(), "ef encode");
      if (!cpu.steps[s].payload) {
        check_refusal(cpu.steps[s], report.download(1)[0]);
      } else {
        BOOST_TEST(first_difference(*cpu.steps[s].payload, out.download(used)) == -1);
      }
    }
    BOOST_TEST(first_float_difference(cpu.residual, e.download(n)) == -1);
  }
}

// Encode and decode captured into one graph, replayed on two inputs.
template <class C>
void check_graph_replay(const C& c, std::size_t n, const cc::codec_context& ctx) {
  const auto x1 = make_input(n, pattern::heavy_tailed, 11);
  const auto x2 = make_input(n, pattern::ties, 12);
  device_buffer<float> dx(x1);
  const std::size_t cap = c.max_encoded_bytes(n, ashl::dtype::f32);
  device_buffer<std::byte> out(cap);
  device_buffer<float> acc(std::vector<float>(n, 0.0f));
  std::size_t bytes = 0, dbytes = 0, used = 0;
  BOOST_REQUIRE(dev_encode(c, nullptr, bytes, dx.cview(), out.view(), used, ctx, cudaStream_t{}, nullptr).ok());
  BOOST_REQUIRE(dev_decode(c, nullptr, dbytes, {out.data(), used}, {n, ashl::dtype::f32}, acc.view(), 1.0f, ctx,
                           cudaStream_t{}, nullptr)
                    .ok());
  device_buffer<std::byte> scratch(bytes), dscratch(dbytes);
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  const ashl::status s = [&] {
    ASHL_TRY(dev_encode(c, scratch.data(), bytes, dx.cview(), out.view(), used, ctx, stream, nullptr));
    return dev_decode(c, dscratch.data(), dbytes, {out.data(), used}, {n, ashl::dtype::f32}, acc.view(), 1.0f, ctx,
                      stream, nullptr);
  }();
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  BOOST_REQUIRE_MESSAGE(s.ok(), s.message());
  cudaGraphExec_t exec;
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  std::vector<float> expect(n, 0.0f);
  for (const auto* x : {&x1, &x2}) {
    check(cudaMemcpy(dx.data(), x->data(), n * sizeof(float), cudaMemcpyHostToDevice), "upload");
    check(cudaGraphLaunch(exec, stream), "launch");
    check(cudaStreamSynchronize(stream), "replay");
    const ref::encoded cpu = ref::encode(c, ashl::dtype::f32, x->data(), n, ctx);
    BOOST_REQUIRE(cpu.payload.has_value());
    BOOST_TEST(first_difference(*cpu.payload, out.download(used)) == -1);
    BOOST_REQUIRE(c.decode_add(*cpu.payload, {n, ashl::dtype::f32}, ashl::host_view<float>(expect.data(), n), 1.0f, ctx)
                      .ok());
    BOOST_TEST(first_float_difference(expect, acc.download(n)) == -1);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// A corrupted payload: the CPU decoder refuses it, the device reports
// `expect` and leaves the accumulator untouched.
template <class C>
void check_malformed(const C& c, std::vector<std::byte> payload, std::size_t n, ashl::dtype t,
                     cc::cuda::device_fault expect, const cc::codec_context& ctx) {
  BOOST_TEST_CONTEXT("malformed, expecting " << cc::cuda::to_string(expect)) {
    std::vector<float> host(n, 1.0f);
    BOOST_TEST(!c.decode_add(payload, {n, t}, ashl::host_view<float>(host.data(), n), 1.0f, ctx).ok());
    device_buffer<std::byte> din(payload.size());
    if (!payload.empty())
      check(cudaMemcpy(din.data(), payload.data(), payload.size(), cudaMemcpyHostToDevice), "upload");
    device_buffer<float> acc(std::vector<float>(n, 1.0f));
    device_buffer<cc::cuda::device_report> report(1);
    std::unique_ptr<device_buffer<std::byte>> scratch;
    const ashl::status s = two_call(
        [&](void* p, std::size_t& b) {
          return dev_decode(c, p, b, {din.data(), payload.size()}, {n, t}, acc.view(), 1.0f, ctx, cudaStream_t{},
                            report.data());
        },
        scratch);
    BOOST_REQUIRE_MESSAGE(s.ok(), s.message());
    check(cudaDeviceSynchronize(), "decode");
    BOOST_TEST(report.download(1)[0].fault == static_cast<std::uint32_t>(expect));
    for (float v : acc.download(n)) BOOST_TEST_REQUIRE(v == 1.0f);
  }
}

template <class C>
std::vector<std::byte> cpu_payload(const C& c, const std::vector<float>& x, const cc::codec_context& ctx) {
  const ref::encoded e = ref::encode(c, ashl::dtype::f32, x.data(), x.size(), ctx);
  BOOST_REQUIRE_MESSAGE(e.payload.has_value(), e.error);
  return *e.payload;
}

}  // namespace ashl_test
