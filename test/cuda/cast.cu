// GPU identity, fp16 and bf16 codecs against the CPU codecs: payloads and
// decoded accumulators byte for byte over sizes, input dtypes and patterns
// (NaN, inf, subnormals, fp16 overflow); strict-mode overflow reported at the
// CPU's index; CUDA graph capture and replay.
#include <ashl/compress/cuda/cast.cuh>
#include <ashl/compress/cuda/identity.cuh>

#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include "support.cuh"

#include <ashl/compress/cast.hpp>
#include <ashl/compress/identity.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace cc = ashl::compress;
using namespace ashl_test;

namespace {

template <class Codec, class T>
std::vector<std::byte> cpu_encode(const Codec& c, const std::vector<T>& x) {
  std::vector<std::byte> out(c.max_encoded_bytes(x.size(), ashl::dtype_of<T>));
  auto used = c.encode(ashl::host_view<const T>(x.data(), x.size()), out, {});
  BOOST_REQUIRE_MESSAGE(used.has_value(), used.to_status().message());
  out.resize(*used);
  return out;
}

template <class Codec, class T>
std::vector<std::byte> gpu_encode(const Codec& c, const std::vector<T>& x, cc::cuda::device_report* report) {
  device_buffer<T> dx(x);
  device_buffer<std::byte> dout(c.max_encoded_bytes(x.size(), ashl::dtype_of<T>));
  std::unique_ptr<device_buffer<std::byte>> scratch;
  cc::cuda::device_output o{.bytes = dout.view()};
  const ashl::status s = two_call(
      [&](cc::cuda::device_scratch& sc) { return cc::cuda::encode(c, dx.cview(), o, {}, sc, report, cudaStream_t{}); },
      scratch);
  BOOST_REQUIRE_MESSAGE(s.ok(), s.message());
  check(cudaDeviceSynchronize(), "encode");
  return dout.download(o.used);
}

template <class Codec>
void compare_decode(const Codec& c, const std::vector<std::byte>& payload, std::size_t n, ashl::dtype t) {
  std::vector<float> acc(n);
  for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<float>(i % 11) * 0.25f;
  device_buffer<float> dacc(acc);
  device_buffer<std::byte> din(payload.size());
  if (!payload.empty())
    check(cudaMemcpy(din.data(), payload.data(), payload.size(), cudaMemcpyHostToDevice), "upload");
  const float scale = -0.61f;
  BOOST_REQUIRE(c.decode_add(payload, {n, t}, ashl::host_view<float>(acc.data(), n), scale, {}).ok());
  std::unique_ptr<device_buffer<std::byte>> scratch;
  const ashl::status s = two_call(
      [&](cc::cuda::device_scratch& sc) {
        return cc::cuda::decode_add(c, {din.data(), payload.size()}, {n, t}, dacc.view(), scale, {}, sc, nullptr,
                                    cudaStream_t{});
      },
      scratch);
  BOOST_REQUIRE_MESSAGE(s.ok(), s.message());
  check(cudaDeviceSynchronize(), "decode");
  BOOST_TEST(first_float_difference(acc, dacc.download(n)) == -1);
}

template <class Codec, class T>
void compare_case(const Codec& c, std::size_t n, pattern p) {
  BOOST_TEST_CONTEXT("codec = " << static_cast<int>(Codec::id) << ", n = " << n << ", pattern = " << name(p)
                                << ", dtype = " << ashl::to_string(ashl::dtype_of<T>)) {
    const std::vector<T> x = convert<T>(make_input(n, p, static_cast<std::uint32_t>(n) + 3));
    const auto cpu = cpu_encode(c, x);
    device_buffer<cc::cuda::device_report> report(1);
    const auto gpu = gpu_encode(c, x, report.data());
    BOOST_TEST(cpu.size() == gpu.size());
    BOOST_TEST(first_difference(cpu, gpu) == -1);
    compare_decode(c, gpu, n, ashl::dtype_of<T>);
  }
}

template <class Codec>
void all_cases(const Codec& c) {
  for (std::size_t n : {std::size_t{1}, std::size_t{31}, std::size_t{1000003}, (std::size_t{1} << 24) + 7})
    for (pattern p : {pattern::normal, pattern::ties, pattern::all_equal, pattern::heavy_tailed, pattern::special}) {
      compare_case<Codec, float>(c, n, p);
      compare_case<Codec, ashl::half>(c, n, p);
      compare_case<Codec, ashl::bfloat16>(c, n, p);
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE(identity_matches_cpu) { all_cases(cc::identity{}); }
BOOST_AUTO_TEST_CASE(fp16_matches_cpu) { all_cases(cc::fp16{}); }
BOOST_AUTO_TEST_CASE(bf16_matches_cpu) { all_cases(cc::bf16{}); }

BOOST_AUTO_TEST_CASE(strict_overflow_is_reported_at_the_cpu_index) {
  const std::size_t n = 100000;
  std::vector<float> x = make_input(n, pattern::normal, 9);
  x[4321] = 1e5f;
  x[70000] = -7e4f;
  const cc::fp16 c{{.strict = true}};
  std::vector<std::byte> out(2 * n);
  auto cpu = c.encode(ashl::host_view<const float>(x.data(), n), out, {});
  BOOST_REQUIRE(!cpu.has_value());
  BOOST_TEST(cpu.error().message().find("fp16.input[4321]") != std::string::npos);
  device_buffer<cc::cuda::device_report> report(1);
  (void)gpu_encode(c, x, report.data());
  const auto r = report.download(1)[0];
  BOOST_TEST(r.fault == static_cast<std::uint32_t>(cc::cuda::device_fault::overflow));
  BOOST_TEST(r.index == 4321u);

  // Without a report, strict mode is refused up front.
  device_buffer<float> dx(x);
  device_buffer<std::byte> dout(2 * n);
  device_buffer<std::byte> scratch(4096);
  cc::cuda::device_scratch sc{scratch.data(), 4096};
  cc::cuda::device_output o{.bytes = dout.view()};
  BOOST_TEST(!cc::cuda::encode(c, dx.cview(), o, {}, sc, nullptr, cudaStream_t{}).ok());

  // A clean input leaves the report clear; inf and NaN inputs are not overflows.
  std::vector<float> y = make_input(n, pattern::normal, 10);
  y[5] = std::numeric_limits<float>::infinity();
  y[6] = std::numeric_limits<float>::quiet_NaN();
  (void)gpu_encode(c, y, report.data());
  BOOST_TEST(report.download(1)[0].fault == 0u);
}

BOOST_AUTO_TEST_CASE(bad_decode_arguments_are_statuses) {
  device_buffer<std::byte> in(64);
  device_buffer<float> acc(16);
  device_buffer<std::byte> scratch(4096);
  cc::cuda::device_scratch sc{scratch.data(), 4096};
  BOOST_TEST(!cc::cuda::decode_add(cc::fp16{}, {in.data(), 30}, {16, ashl::dtype::f32}, acc.view(), 1.0f, {}, sc,
                                   nullptr, cudaStream_t{})
                  .ok());
  BOOST_TEST(!cc::cuda::decode_add(cc::bf16{}, {in.data(), 32}, {15, ashl::dtype::f32}, acc.view(), 1.0f, {}, sc,
                                   nullptr, cudaStream_t{})
                  .ok());
  BOOST_TEST(!cc::cuda::decode_add(cc::identity{}, {in.data(), 64}, {16, ashl::dtype::f32}, acc.view(),
                                   std::numeric_limits<float>::infinity(), {}, sc, nullptr, cudaStream_t{})
                  .ok());
}

BOOST_AUTO_TEST_CASE(graph_capture_and_replay) {
  const std::size_t n = 1000003;
  const cc::bf16 c;
  const auto x1 = make_input(n, pattern::special, 21);
  const auto x2 = make_input(n, pattern::heavy_tailed, 22);
  device_buffer<float> dx(x1);
  device_buffer<std::byte> out(2 * n);
  device_buffer<float> acc(std::vector<float>(n, 0.0f));
  cc::cuda::device_output o{.bytes = out.view()};
  cc::cuda::device_scratch q{}, dq{};
  BOOST_REQUIRE(cc::cuda::encode(c, dx.cview(), o, {}, q, nullptr, cudaStream_t{}).ok());
  BOOST_REQUIRE(cc::cuda::decode_add(c, {out.data(), 2 * n}, {n, ashl::dtype::f32}, acc.view(), 1.0f, {}, dq, nullptr,
                                     cudaStream_t{})
                    .ok());
  const std::size_t used = o.used;
  device_buffer<std::byte> scratch(q.bytes), dscratch(dq.bytes);
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  const ashl::status s = [&] {
    cc::cuda::device_scratch sc{scratch.data(), q.bytes}, dsc{dscratch.data(), dq.bytes};
    ASHL_TRY(cc::cuda::encode(c, dx.cview(), o, {}, sc, nullptr, stream));
    return cc::cuda::decode_add(c, {out.data(), 2 * n}, {n, ashl::dtype::f32}, acc.view(), 1.0f, {}, dsc, nullptr,
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
    const auto cpu = cpu_encode(c, *x);
    BOOST_TEST(first_difference(cpu, out.download(used)) == -1);
    BOOST_REQUIRE(c.decode_add(cpu, {n, ashl::dtype::f32}, ashl::host_view<float>(expect.data(), n), 1.0f, {}).ok());
    BOOST_TEST(first_float_difference(expect, acc.download(n)) == -1);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

ASHL_TEST_CUDA_MAIN()
