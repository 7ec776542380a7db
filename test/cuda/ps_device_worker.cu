// ps::device_worker on one GPU against a server process (ashl_test_ps_node)
// over UCX loopback: a dense BSP run whose device parameters follow the SGD
// trajectory exactly after every wait; an ASHL run whose top-k commits are
// encoded on the device (error feedback there too) and whose device
// parameters end equal to the server's; one error-feedback step on the
// device against compress::error_feedback on the host, bit for bit. Skips
// (77) only without a device or without UCX in the build; any other CUDA
// error fails.
#include <ashl/ps/device_worker.cuh>

#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>

#include "support.cuh"

#include <cstdio>

namespace {

// 77 only without a device, 1 on any other CUDA error (support.cuh).
int device_state() { return ::ashl_test::cuda_device_exit_code(); }

}  // namespace

#if ASHL_HAS_UCX() && defined(ASHL_TEST_PS_NODE)

#include <ashl/compress/error_feedback.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/transport/ucx.hpp>

#include "../support/node_files.hpp"
#include "../support/process.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace ps = ashl::ps;
namespace tr = ashl::transport;
using namespace std::chrono_literals;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <class T>
struct dbuf {
  explicit dbuf(std::size_t count) : n(count) { check(cudaMalloc(&p, (count == 0 ? 1 : count) * sizeof(T)), "cudaMalloc"); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
  ~dbuf() { cudaFree(p); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    check(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
  T* p = nullptr;
  std::size_t n;
};

struct stream_holder {
  stream_holder() { check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~stream_holder() { cudaStreamDestroy(s); }
  cudaStream_t s = nullptr;
};

// Multiples of 1/8 in [-4, 4]: sums and lr 1/8 steps stay exact in f32.
float grad(int cycle, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 37 + static_cast<std::size_t>(cycle) * 101) % 65) - 32) / 8.0f;
}

// One server process of ashl_test_ps_node on a free loopback port.
struct server_process {
  std::string dir, log, addr;
  pid_t pid = -1;
  server_process(const std::string& stem, std::size_t elements, std::vector<std::string> extra) {
    dir = process::temp_dir(stem);
    log = dir + "/server.log";
    addr = "127.0.0.1:" + std::to_string(process::free_port());
    std::vector<std::string> argv = {ASHL_TEST_PS_NODE, "--elements", std::to_string(elements), "--out", dir,
                                     "--max-seconds", "120"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid = process::start(argv,
                         {{"ASHL_ROLE", "server"}, {"ASHL_RANK", "0"}, {"ASHL_NUM_WORKERS", "1"},
                          {"ASHL_NUM_SERVERS", "1"}, {"ASHL_SERVER_ADDR", addr}, {"ASHL_TOKEN", "gpu-test-token-0123"}},
                         log);
    BOOST_TEST_REQUIRE(pid > 0);
  }
  process::outcome finish() { return process::finish(pid, 60s, log); }
};

ps::device_worker<tr::ucx> join(const server_process& srv, float* d_w, std::size_t n, cudaStream_t s) {
  auto t = tr::ucx::create({.token = "gpu-test-token-0123"});
  BOOST_TEST_REQUIRE(t.has_value(), (t ? "" : t.error().message()));
  auto wk = ps::device_worker<tr::ucx>::create({.rank = 0, .servers = {srv.addr}, .timeout = 60s, .seed = 3},
                                              std::move(*t), {d_w, n}, s);
  BOOST_TEST_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
  return std::move(*wk);
}

}  // namespace

BOOST_AUTO_TEST_CASE(dense_bsp_follows_sgd_exactly) {
  const std::size_t n = 100003;
  const int cycles = 6;
  server_process srv("ashl-gpu-dense", n, {"--policy", "bsp"});
  stream_holder st;
  dbuf<float> w(n), g(n);
  auto wk = join(srv, w.p, n, st.s);
  const auto tel0 = wk.telemetry();
  BOOST_TEST_MESSAGE(tel0.ucx.describe() << "; " << tel0.staging.reason);
  BOOST_TEST(tel0.ucx.probed);
  BOOST_TEST(tel0.ucx.host);
  BOOST_TEST(tel0.registered >= 2u);  // page-locked parameters and staging, registered with UCX once
  check(cudaStreamSynchronize(st.s), "sync");
  std::vector<float> ref(n, 0.5f), gh(n);
  BOOST_TEST((w.download() == ref));  // the initial parameters arrived on the device
  for (int c = 0; c < cycles; ++c) {
    while (!wk.iteration_done()) {}
    for (std::size_t i = 0; i < n; ++i) gh[i] = grad(c, i);
    check(cudaMemcpyAsync(g.p, gh.data(), n * sizeof(float), cudaMemcpyHostToDevice, st.s), "upload");
    const auto cs = wk.commit({g.p, n}, st.s);
    BOOST_TEST_REQUIRE(cs.ok(), cs.message());
    BOOST_TEST((wk.commit({g.p, n}, st.s).code() == ashl::errc::invalid_argument));  // one in flight
    const auto ws = wk.wait(st.s);
    BOOST_TEST_REQUIRE(ws.ok(), ws.message());
    for (std::size_t i = 0; i < n; ++i) ref[i] -= 0.125f * gh[i];
    check(cudaStreamSynchronize(st.s), "sync");
    BOOST_TEST((w.download() == ref), "cycle " << c);
  }
  const auto tel = wk.telemetry();
  BOOST_TEST(tel.dense == static_cast<std::uint64_t>(cycles));
  BOOST_TEST(tel.device_encoded == 0u);
  BOOST_TEST(tel.bytes_to_host == static_cast<std::uint64_t>(cycles) * n * sizeof(float));
  BOOST_TEST(tel.staging_allocations == 2u);  // allocated once each
  BOOST_TEST_REQUIRE(wk.leave().ok());
  const auto r = srv.finish();
  BOOST_TEST_REQUIRE(r.exit_code == 0, r.log());
  BOOST_TEST((node_files::read_f32(srv.dir + "/server0.f32") == ref));
}

BOOST_AUTO_TEST_CASE(compressed_commits_are_encoded_on_the_device) {
  const std::size_t n = 50000;
  const int cycles = 12;
  server_process srv("ashl-gpu-topk", n,
                     {"--policy", "ashl", "--optimizer", "delta", "--compression-ratio", "0.05",
                      "--profile-iterations", "1", "--h-ahl", "1", "--switch-loss", "-1"});
  stream_holder st;
  dbuf<float> w(n), g(n);
  auto wk = join(srv, w.p, n, st.s);
  std::vector<float> gh(n);
  int compressed = 0;
  for (int c = 0; c < cycles; ++c) {
    while (!wk.iteration_done()) {}
    if (wk.host_worker().compresses()) ++compressed;
    for (std::size_t i = 0; i < n; ++i) gh[i] = grad(c, i) / 64.0f;
    check(cudaMemcpyAsync(g.p, gh.data(), n * sizeof(float), cudaMemcpyHostToDevice, st.s), "upload");
    const auto cs = wk.commit({g.p, n}, st.s);
    BOOST_TEST_REQUIRE(cs.ok(), cs.message());
    const auto ws = wk.wait(st.s);
    BOOST_TEST_REQUIRE(ws.ok(), ws.message());
  }
  check(cudaStreamSynchronize(st.s), "sync");
  const std::vector<float> on_device = w.download();
  const auto tel = wk.telemetry();
  BOOST_TEST(compressed > 0);
  BOOST_TEST(tel.device_encoded == static_cast<std::uint64_t>(compressed));
  BOOST_TEST(tel.host_encoded == 0u);
  // Only payloads moved: far below the dense bytes for the compressed cycles.
  BOOST_TEST(tel.bytes_to_host < static_cast<std::uint64_t>(cycles - compressed) * n * 4 +
                                     static_cast<std::uint64_t>(compressed) * (12 + 8 * (n / 20 + 1)) + 1);
  BOOST_TEST_REQUIRE(wk.leave().ok());
  const auto r = srv.finish();
  BOOST_TEST_REQUIRE(r.exit_code == 0, r.log());
  const auto counters = node_files::read_counters(srv.dir + "/server0.txt");
  BOOST_TEST(counters.at("refused") == 0.0);
  BOOST_TEST(counters.at("commits") == static_cast<double>(cycles));
  BOOST_TEST((node_files::read_f32(srv.dir + "/server0.f32") == on_device));
  BOOST_TEST((on_device != std::vector<float>(n, 0.5f)));
}

// Three steps of error feedback with top-k: the device payload and the
// device residual equal the host decorator's, bit for bit.
BOOST_AUTO_TEST_CASE(error_feedback_step_matches_the_host) {
  const std::size_t n = 30011;
  ashl::compress::topk codec{0.01};
  ashl::compress::error_feedback<ashl::compress::topk> host{codec};
  stream_holder st;
  dbuf<float> x(n), e(n);
  dbuf<std::byte> out(codec.max_encoded_bytes(n, ashl::dtype::f32));
  dbuf<ashl::compress::cuda::device_report> reports(2);
  check(cudaMemset(e.p, 0, n * sizeof(float)), "memset");
  check(cudaDeviceSynchronize(), "memset (synchronize)");  // legacy stream vs st.s
  std::vector<float> xh(n);
  std::vector<std::byte> hp(host.max_encoded_bytes(n, ashl::dtype::f32)), hs(host.scratch_bytes(n, ashl::dtype::f32));
  void* scratch = nullptr;
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < n; ++i) xh[i] = grad(step, i) * (1.0f + static_cast<float>(i % 7));
    check(cudaMemcpy(x.p, xh.data(), n * sizeof(float), cudaMemcpyHostToDevice), "upload");
    check(cudaDeviceSynchronize(), "upload (synchronize)");  // the encode runs on st.s, a non-blocking stream
    const ashl::compress::codec_context ctx{.seed = 1, .step = static_cast<std::uint64_t>(step), .tensor = 0};
    ashl::compress::cuda::device_output o{.bytes = {out.p, out.n}};
    ashl::compress::cuda::device_scratch q{};
    BOOST_TEST_REQUIRE(ps::encode_with_feedback(codec, {x.p, n}, {e.p, n}, o, ctx, q, reports.p, reports.p + 1, st.s).ok());
    if (scratch == nullptr) check(cudaMalloc(&scratch, q.bytes == 0 ? 1 : q.bytes), "cudaMalloc");
    ashl::compress::cuda::device_scratch sc{scratch, q.bytes};
    const auto s = ps::encode_with_feedback(codec, {x.p, n}, {e.p, n}, o, ctx, sc, reports.p, reports.p + 1, st.s);
    BOOST_TEST_REQUIRE(s.ok(), s.message());
    BOOST_TEST_REQUIRE(o.size_known);
    check(cudaStreamSynchronize(st.s), "sync");
    const ashl::compress::codec_context hctx{.seed = 1, .step = static_cast<std::uint64_t>(step), .tensor = 0,
                                             .scratch = hs};
    auto used = host.encode(ashl::host_view<const float>(xh.data(), n), hp, hctx);
    BOOST_TEST_REQUIRE(used.has_value());
    BOOST_TEST_REQUIRE(o.used == *used);
    std::vector<std::byte> dp = out.download();
    dp.resize(o.used);
    BOOST_TEST((dp == std::vector<std::byte>(hp.begin(), hp.begin() + static_cast<std::ptrdiff_t>(*used))),
               "step " << step);
    const auto res = host.residual(0);
    BOOST_TEST((e.download() == std::vector<float>(res.begin(), res.end())), "step " << step);
  }
  cudaFree(scratch);
}

int main(int argc, char** argv) {
  if (const int s = device_state(); s != 0) return s;
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}

#else

int main() {
  if (const int s = device_state(); s != 0) return s;
  std::printf("SKIPPED: built without UCX (the device worker runs against a server process over UCX)\n");
  return 77;
}

#endif
