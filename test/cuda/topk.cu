// GPU exact top-k against the CPU codec: payloads and decoded accumulators
// byte for byte, over sizes, dtypes and input patterns; malformed payloads;
// CUDA graph capture and replay.
#include <ashl/compress/cuda/topk.cuh>

#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include "support.cuh"

#include <ashl/compress/topk.hpp>

#include <cstddef>
#include <memory>
#include <vector>

namespace cc = ashl::compress;
using namespace ashl_test;

namespace {

template <class T>
std::vector<std::byte> cpu_encode(const cc::topk& c, const std::vector<T>& x) {
  std::vector<std::byte> out(c.max_encoded_bytes(x.size(), ashl::dtype_of<T>));
  auto used = c.encode(ashl::host_view<const T>(x.data(), x.size()), out, {});
  BOOST_REQUIRE_MESSAGE(used.has_value(), used.to_status().message());
  out.resize(*used);
  return out;
}

template <class T>
std::vector<std::byte> gpu_encode(const cc::topk& c, const std::vector<T>& x) {
  device_buffer<T> dx(x);
  device_buffer<std::byte> dout(c.max_encoded_bytes(x.size(), ashl::dtype_of<T>));
  std::unique_ptr<device_buffer<std::byte>> scratch;
  cc::cuda::device_output o{.bytes = dout.view()};
  const ashl::status s = two_call(
      [&](cc::cuda::device_scratch& sc) { return cc::cuda::encode(c, dx.cview(), o, {}, sc, nullptr, cudaStream_t{}); },
      scratch);
  BOOST_REQUIRE_MESSAGE(s.ok(), s.message());
  check(cudaDeviceSynchronize(), "encode");
  return dout.download(o.used);
}

// Decodes `payload` on both sides into the same starting accumulator.
void compare_decode(const std::vector<std::byte>& payload, std::size_t n, ashl::dtype t) {
  std::vector<float> acc(n);
  for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<float>(i % 13) * 0.1f;
  device_buffer<float> dacc(acc);
  device_buffer<std::byte> din(payload.size());
  if (!payload.empty())
    check(cudaMemcpy(din.data(), payload.data(), payload.size(), cudaMemcpyHostToDevice), "upload");
  const float scale = 0.37f;
  BOOST_REQUIRE(cc::topk{}.decode_add(payload, {n, t}, ashl::host_view<float>(acc.data(), n), scale, {}).ok());
  device_buffer<cc::cuda::device_report> report(1);
  std::unique_ptr<device_buffer<std::byte>> scratch;
  const ashl::status s = two_call(
      [&](cc::cuda::device_scratch& sc) {
        return cc::cuda::decode_add(cc::topk{}, {din.data(), payload.size()}, {n, t}, dacc.view(), scale, {}, sc,
                                    report.data(), cudaStream_t{});
      },
      scratch);
  BOOST_REQUIRE_MESSAGE(s.ok(), s.message());
  check(cudaDeviceSynchronize(), "decode");
  BOOST_TEST(report.download(1)[0].fault == 0u);
  BOOST_TEST(first_float_difference(acc, dacc.download(n)) == -1);
}

template <class T>
void compare_case(std::size_t n, pattern p, const cc::topk& c) {
  BOOST_TEST_CONTEXT("n = " << n << ", pattern = " << name(p) << ", dtype = " << ashl::to_string(ashl::dtype_of<T>)
                            << ", k = " << c.k_for(n)) {
    const std::vector<T> x = convert<T>(make_input(n, p, static_cast<std::uint32_t>(n) * 7 + 1));
    const auto cpu = cpu_encode(c, x);
    const auto gpu = gpu_encode(c, x);
    BOOST_TEST(cpu.size() == gpu.size());
    BOOST_TEST(first_difference(cpu, gpu) == -1);
    compare_decode(gpu, n, ashl::dtype_of<T>);
  }
}

const std::size_t sizes[] = {1, 31, 1000003, (std::size_t{1} << 24) + 7};
const pattern patterns[] = {pattern::normal, pattern::ties, pattern::all_equal, pattern::heavy_tailed,
                            pattern::special};

}  // namespace

BOOST_AUTO_TEST_CASE(payload_matches_cpu_f32) {
  for (std::size_t n : sizes)
    for (pattern p : patterns) compare_case<float>(n, p, cc::topk{0.01});
}

BOOST_AUTO_TEST_CASE(payload_matches_cpu_16_bit) {
  for (std::size_t n : sizes)
    for (pattern p : patterns) {
      compare_case<ashl::bfloat16>(n, p, cc::topk{0.001});
      compare_case<ashl::half>(n, p, cc::topk{0.01});
    }
}

BOOST_AUTO_TEST_CASE(absolute_k_and_k_equal_n) {
  compare_case<float>(1000, pattern::ties, cc::topk{cc::topk::count{1}});
  compare_case<float>(1000, pattern::ties, cc::topk{cc::topk::count{999}});
  compare_case<float>(1000, pattern::normal, cc::topk{cc::topk::count{1000}});
  compare_case<float>(1000, pattern::special, cc::topk{cc::topk::count{5000}});  // clamped to n
}

BOOST_AUTO_TEST_CASE(empty_input_is_the_header) {
  const cc::topk c{0.01};
  const std::vector<float> x;
  BOOST_TEST(first_difference(cpu_encode(c, x), gpu_encode(c, x)) == -1);
}

BOOST_AUTO_TEST_CASE(malformed_payload_adds_nothing_and_reports) {
  const std::size_t n = 100;
  std::vector<float> x = make_input(n, pattern::normal, 3);
  auto payload = cpu_encode(cc::topk{cc::topk::count{4}}, x);
  // Second index made equal to the first: not strictly increasing.
  std::memcpy(payload.data() + 16, payload.data() + 12, 4);
  device_buffer<std::byte> din(payload.size());
  check(cudaMemcpy(din.data(), payload.data(), payload.size(), cudaMemcpyHostToDevice), "upload");
  device_buffer<float> acc(std::vector<float>(n, 1.0f));
  device_buffer<cc::cuda::device_report> report(1);
  std::unique_ptr<device_buffer<std::byte>> scratch;
  const ashl::status s = two_call(
      [&](cc::cuda::device_scratch& sc) {
        return cc::cuda::decode_add(cc::topk{}, {din.data(), payload.size()}, {n, ashl::dtype::f32}, acc.view(), 1.0f,
                                    {}, sc, report.data(), cudaStream_t{});
      },
      scratch);
  BOOST_REQUIRE(s.ok());
  check(cudaDeviceSynchronize(), "decode");
  const auto r = report.download(1)[0];
  BOOST_TEST(r.fault == static_cast<std::uint32_t>(cc::cuda::device_fault::index_not_increasing));
  BOOST_TEST(r.index == 1u);
  for (float v : acc.download(n)) BOOST_TEST(v == 1.0f);

  // Host-checkable errors are statuses.
  cc::cuda::device_scratch sc{scratch->data(), scratch->size()};
  BOOST_TEST(!cc::cuda::decode_add(cc::topk{}, {din.data(), 8}, {n, ashl::dtype::f32}, acc.view(), 1.0f, {}, sc,
                                   nullptr, cudaStream_t{})
                  .ok());
  BOOST_TEST(!cc::cuda::decode_add(cc::topk{}, {din.data(), payload.size()}, {n + 1, ashl::dtype::f32}, acc.view(),
                                   1.0f, {}, sc, nullptr, cudaStream_t{})
                  .ok());
}

BOOST_AUTO_TEST_CASE(too_small_scratch_or_output_is_an_error) {
  const std::vector<float> x = make_input(1000, pattern::normal, 5);
  device_buffer<float> dx(x);
  device_buffer<std::byte> out(8);
  const cc::topk c{0.1};
  cc::cuda::device_output o{.bytes = out.view()};
  cc::cuda::device_scratch q{};
  BOOST_REQUIRE(cc::cuda::encode(c, dx.cview(), o, {}, q, nullptr, cudaStream_t{}).ok());
  BOOST_TEST(o.used == c.max_encoded_bytes(1000, ashl::dtype::f32));
  BOOST_TEST(o.size_known);
  device_buffer<std::byte> scratch(q.bytes);
  cc::cuda::device_scratch sc{scratch.data(), q.bytes};
  BOOST_TEST((cc::cuda::encode(c, dx.cview(), o, {}, sc, nullptr, cudaStream_t{}).code() ==
              ashl::errc::buffer_too_small));
  device_buffer<std::byte> big(o.used);
  cc::cuda::device_output ob{.bytes = big.view()};
  cc::cuda::device_scratch small{scratch.data(), q.bytes - 1};
  BOOST_TEST((cc::cuda::encode(c, dx.cview(), ob, {}, small, nullptr, cudaStream_t{}).code() ==
              ashl::errc::buffer_too_small));
}

BOOST_AUTO_TEST_CASE(graph_capture_and_replay) {
  const std::size_t n = 1000003;
  const cc::topk c{0.01};
  const auto x1 = make_input(n, pattern::heavy_tailed, 11);
  const auto x2 = make_input(n, pattern::ties, 12);
  device_buffer<float> dx(x1);
  device_buffer<std::byte> out(c.max_encoded_bytes(n, ashl::dtype::f32));
  cc::cuda::device_output o{.bytes = out.view()};
  cc::cuda::device_scratch q{};
  BOOST_REQUIRE(cc::cuda::encode(c, dx.cview(), o, {}, q, nullptr, cudaStream_t{}).ok());
  const std::size_t used = o.used;
  device_buffer<std::byte> scratch(q.bytes);
  cc::cuda::device_scratch sc{scratch.data(), q.bytes};
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  const ashl::status s = cc::cuda::encode(c, dx.cview(), o, {}, sc, nullptr, stream);
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  BOOST_REQUIRE_MESSAGE(s.ok(), s.message());
  cudaGraphExec_t exec;
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  int replay = 0;
  for (const auto* x : {&x1, &x2, &x1}) {
    check(cudaMemcpy(dx.data(), x->data(), n * sizeof(float), cudaMemcpyHostToDevice), "upload");
    // The graph runs on a non-blocking stream, which the legacy stream's copy
    // is not ordered before (a replay once read a half-uploaded input).
    check(cudaDeviceSynchronize(), "upload (synchronize)");
    check(cudaGraphLaunch(exec, stream), "launch");
    check(cudaStreamSynchronize(stream), "replay");
    const auto cpu = cpu_encode(c, *x), gpu = out.download(used);
    // The same input encoded without the graph, to tell a replay fault from a codec one.
    device_buffer<std::byte> plain(c.max_encoded_bytes(n, ashl::dtype::f32));
    cc::cuda::device_output po{.bytes = plain.view()};
    BOOST_REQUIRE(cc::cuda::encode(c, dx.cview(), po, {}, sc, nullptr, stream).ok());
    check(cudaStreamSynchronize(stream), "plain encode");
    BOOST_TEST(first_difference(cpu, gpu) == -1,
               "replay " << replay << (x == &x2 ? " (ties)" : " (heavy tailed)") << ": " << describe_difference(cpu, gpu)
                         << "; without the graph: " << describe_difference(cpu, plain.download(po.used)));
    ++replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

ASHL_TEST_CUDA_MAIN()
