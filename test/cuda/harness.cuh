// test/cuda/harness.cuh — the checks every device codec shares: payload
// bytes against the CPU reference, decode-add against the CPU decoder, error
// feedback (cuda::error_feedback<C>) over several steps, graph capture and
// replay, malformed payloads. Written against compress::cuda::device_codec
// only: one call shape, no per-codec shims.
//
//   check_payloads<float>(cc::qsgd{}, {0, 1, 1000003}, all_patterns, ctx);
//   check_error_feedback<ashl::half>(cc::qsgd{}, 100003, ctx);
#pragma once

#include "reference.hpp"
#include "support.cuh"

#include <boost/test/unit_test.hpp>

#include <ashl/compress/cuda/concepts.cuh>
#include <ashl/compress/cuda/error_feedback.cuh>
#include <ashl/compress/cast.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/threshold.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/compress/topk_sampled.hpp>

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace ashl_test {

namespace cc = ::ashl::compress;

struct gpu_encoded {
  std::vector<std::byte> payload;
  cc::cuda::device_report report{};
};

// A stateless codec, taken by value (so temporaries bind).
template <class C, class T>
gpu_encoded gpu_encode(C c, const std::vector<T>& x, const cc::codec_context& ctx) {
  device_buffer<T> dx(x);
  device_buffer<std::byte> out(c.max_encoded_bytes(x.size(), ashl::dtype_of<T>));
  device_buffer<cc::cuda::device_report> report(1);
  std::unique_ptr<device_buffer<std::byte>> scratch;
  device_buffer<std::uint64_t> d_used(1);
  check(cudaMemset(report.data(), 0, sizeof(cc::cuda::device_report)), "report");
  cc::cuda::device_output o{.bytes = out.view(), .d_used = d_used.data()};
  const ashl::status s = two_call(
      [&](cc::cuda::device_scratch& sc) {
        return cc::cuda::encode(c, dx.cview(), o, ctx, sc, report.data(), cudaStream_t{});
      },
      scratch);
  BOOST_REQUIRE_MESSAGE(s.ok(), s.message());
  check(cudaDeviceSynchronize(), "encode");
  // The size on the device is the payload's; on the host, the size or its bound.
  const std::uint64_t used = d_used.download(1)[0];
  if (o.size_known) BOOST_TEST(used == o.used);
  BOOST_TEST(used <= o.used);
  gpu_encoded r;
  r.payload = out.download(used);
  r.report = report.download(1)[0];
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
      [&](cc::cuda::device_scratch& sc) {
        return cc::cuda::decode_add(c, {din.data(), payload.size()}, {n, t}, dacc.view(), scale, ctx, sc,
                                    report.data(), cudaStream_t{});
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
    cc::cuda::error_feedback<C> ef{c};
    BOOST_REQUIRE(ef.reserve(ctx.tensor, n, cudaStream_t{}).ok());
    device_buffer<std::byte> out(ef.max_encoded_bytes(n, ashl::dtype::f32));
    device_buffer<cc::cuda::device_report> report(1);
    device_buffer<std::uint64_t> d_used(1);
    cc::cuda::device_output o{.bytes = out.view(), .d_used = d_used.data()};
    cc::cuda::device_scratch query{};
    {
      device_buffer<T> probe(1);
      BOOST_REQUIRE(cc::cuda::encode(ef, ashl::device_view<const T>(probe.data(), n), o, ctx, query, report.data(),
                                     cudaStream_t{})
                        .ok());
    }
    device_buffer<std::byte> scratch(query.bytes);
    const std::uint64_t first = ctx.step;
    for (std::size_t s = 0; s < xs.size(); ++s) {
      ctx.step = first + s;
      device_buffer<T> dx(xs[s]);
      check(cudaMemset(report.data(), 0, sizeof(cc::cuda::device_report)), "report");
      cc::cuda::device_scratch sc{scratch.data(), query.bytes};
      const ashl::status st = cc::cuda::encode(ef, dx.cview(), o, ctx, sc, report.data(), cudaStream_t{});
      BOOST_REQUIRE_MESSAGE(st.ok(), st.message());
      check(cudaDeviceSynchronize(), "ef encode");
      if (!cpu.steps[s].payload) {
        check_refusal(cpu.steps[s], report.download(1)[0]);
      } else {
        const auto gpu = out.download(d_used.download(1)[0]);
        // Dense payloads (identity, fp16, bf16) may differ only in the bits
        // of NaNs that the residual's arithmetic made (first_dense_difference).
        // So may the f32 values of randomk and sparse-pair payloads (the
        // headers and indices must match exactly).
        const std::vector<std::byte>& want = *cpu.steps[s].payload;
        long long at = -1;
        std::size_t values_from = 0;
        if constexpr (std::is_same_v<C, cc::identity>) {
          at = first_dense_difference(want, gpu, 4);
        } else if constexpr (std::is_same_v<C, cc::fp16>) {
          at = first_dense_difference(want, gpu, 2);
        } else if constexpr (std::is_same_v<C, cc::bf16>) {
          at = first_dense_difference(want, gpu, 2, true);
        } else if constexpr (std::is_same_v<C, cc::randomk>) {
          values_from = ashl::compress::layout::randomk::header_bytes;
          at = first_value_difference(want, gpu, values_from, 4);
        } else if constexpr (std::is_same_v<C, cc::topk> || std::is_same_v<C, cc::topk_sampled> ||
                             std::is_same_v<C, cc::threshold>) {
          std::uint32_t count = 0;
          if (want.size() >= ashl::compress::layout::sparse::header_bytes)
            std::memcpy(&count, want.data() + ashl::compress::layout::sparse::count_offset, 4);
          values_from = ashl::compress::layout::sparse_values_offset(count);
          at = first_value_difference(want, gpu, values_from, 4);
        } else {
          at = first_difference(want, gpu);
        }
        BOOST_TEST(at == -1, "step " << s << ": " << describe_difference(want, gpu, values_from));
      }
    }
    const ashl::device_view<const float> e = ef.residual(ctx.tensor);
    BOOST_REQUIRE(e.size() == n);
    std::vector<float> residual(n);
    if (n != 0) check(cudaMemcpy(residual.data(), e.data(), n * sizeof(float), cudaMemcpyDeviceToHost), "residual");
    BOOST_TEST(first_float_difference(cpu.residual, residual) == -1);
  }
}

// Encode and decode captured into one graph, replayed on two inputs. Where
// the size depends on the data (threshold, topk_sampled) the host cannot
// give the decoder the payload's size at capture time: the graph holds the
// encode alone, and its payload is read back by the size in d_used.
template <class C>
void check_graph_replay(const C& c, std::size_t n, const cc::codec_context& ctx) {
  const auto x1 = make_input(n, pattern::heavy_tailed, 11);
  const auto x2 = make_input(n, pattern::ties, 12);
  device_buffer<float> dx(x1);
  const std::size_t cap = c.max_encoded_bytes(n, ashl::dtype::f32);
  device_buffer<std::byte> out(cap);
  device_buffer<float> acc(std::vector<float>(n, 0.0f));
  C dc = c;
  device_buffer<std::uint64_t> d_used(1);
  cc::cuda::device_output o{.bytes = out.view(), .d_used = d_used.data()};
  cc::cuda::device_scratch q{}, dq{};
  BOOST_REQUIRE(cc::cuda::encode(dc, dx.cview(), o, ctx, q, nullptr, cudaStream_t{}).ok());
  const std::size_t used = o.used;  // the bound where the size depends on the data
  const bool known = o.size_known;
  if (known)
    BOOST_REQUIRE(cc::cuda::decode_add(c, {out.data(), used}, {n, ashl::dtype::f32}, acc.view(), 1.0f, ctx, dq,
                                       nullptr, cudaStream_t{})
                      .ok());
  device_buffer<std::byte> scratch(q.bytes), dscratch(dq.bytes);
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  const ashl::status s = [&] {
    cc::cuda::device_scratch sc{scratch.data(), q.bytes}, dsc{dscratch.data(), dq.bytes};
    ASHL_TRY(cc::cuda::encode(dc, dx.cview(), o, ctx, sc, nullptr, stream));
    if (!known) return ashl::status{};
    return cc::cuda::decode_add(c, {out.data(), used}, {n, ashl::dtype::f32}, acc.view(), 1.0f, ctx, dsc, nullptr,
                                stream);
  }();
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  BOOST_REQUIRE_MESSAGE(s.ok(), s.message());
  cudaGraphExec_t exec;
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  std::vector<float> expect(n, 0.0f);
  for (const auto* x : {&x1, &x2}) {
    check(cudaMemcpy(dx.data(), x->data(), n * sizeof(float), cudaMemcpyHostToDevice), "upload");
    check(cudaDeviceSynchronize(), "upload (synchronize)");  // the legacy stream's copy vs the graph's stream
    check(cudaGraphLaunch(exec, stream), "launch");
    check(cudaStreamSynchronize(stream), "replay");
    const ref::encoded cpu = ref::encode(c, ashl::dtype::f32, x->data(), n, ctx);
    BOOST_REQUIRE(cpu.payload.has_value());
    BOOST_TEST(first_difference(*cpu.payload, out.download(d_used.download(1)[0])) == -1);
    if (!known) continue;
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
        [&](cc::cuda::device_scratch& sc) {
          return cc::cuda::decode_add(c, {din.data(), payload.size()}, {n, t}, acc.view(), 1.0f, ctx, sc,
                                      report.data(), cudaStream_t{});
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
