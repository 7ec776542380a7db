// coll::nccl on one GPU (one rank: NCCL refuses two ranks on one device):
// every collective against its single-rank reference, bit for bit, over
// every dtype; in place and out of place; stream order without a host wait;
// requests (wait twice, test); argument errors. Skips (77) only without a
// device or without NCCL in the build; any other CUDA error fails.
#include <ashl/coll/nccl.hpp>

#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>

#include "support.cuh"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#if ASHL_HAS_NCCL()

namespace {

// 77 only without a device, 1 on any other CUDA error (support.cuh).
int device_state() { return ::ashl_test::cuda_device_exit_code(); }

}  // namespace


namespace {

namespace coll = ashl::coll;
using ashl::dtype;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct dbuf {
  explicit dbuf(std::size_t bytes) : n(bytes) { check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc"); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
  ~dbuf() { cudaFree(p); }
  // cudaMemcpy from pageable memory may return before the copy has landed,
  // and the legacy stream it runs on is not ordered before the tests'
  // non-blocking streams: wait for it (on the H200 an allreduce read a
  // half-uploaded input).
  void upload(const std::vector<std::byte>& h) {
    check(cudaMemcpy(p, h.data(), h.size(), cudaMemcpyHostToDevice), "upload");
    check(cudaDeviceSynchronize(), "upload (synchronize)");
  }
  std::vector<std::byte> download(std::size_t bytes) const {
    std::vector<std::byte> h(bytes);
    check(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost), "download");
    return h;
  }
  void* p = nullptr;
  std::size_t n;
};

// Deterministic bytes; for floating dtypes any bit pattern but NaN works
// with one rank (the sum of one value is the value), so use small integers
// in each dtype's encoding.
std::vector<std::byte> pattern(dtype t, std::size_t count, unsigned salt) {
  std::vector<std::byte> out(count * ashl::size_of(t));
  for (std::size_t i = 0; i < count; ++i) {
    const int v = static_cast<int>((i * 7 + salt) % 23) - 11;
    switch (t) {
      case dtype::f32: {
        const float f = static_cast<float>(v);
        std::memcpy(out.data() + 4 * i, &f, 4);
        break;
      }
      case dtype::f64: {
        const double d = v;
        std::memcpy(out.data() + 8 * i, &d, 8);
        break;
      }
      case dtype::f16: {
        const auto h = ashl::from_float<ashl::half>(static_cast<float>(v));
        std::memcpy(out.data() + 2 * i, &h, 2);
        break;
      }
      case dtype::bf16: {
        const auto b = ashl::from_float<ashl::bfloat16>(static_cast<float>(v));
        std::memcpy(out.data() + 2 * i, &b, 2);
        break;
      }
      case dtype::i8: out[i] = static_cast<std::byte>(static_cast<std::int8_t>(v)); break;
      case dtype::u8: out[i] = static_cast<std::byte>(static_cast<std::uint8_t>(v + 11)); break;
    }
  }
  return out;
}

coll::nccl make() {
  auto c = coll::nccl::create_single(0);
  BOOST_TEST_REQUIRE(c.has_value(), (c ? "" : c.error().message()));
  return std::move(*c);
}

struct stream_holder {
  stream_holder() { check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~stream_holder() { cudaStreamDestroy(s); }
  cudaStream_t s = nullptr;
};

constexpr dtype all_types[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::f64, dtype::i8, dtype::u8};

__global__ void twice(float* x, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] *= 2.0f;
}

}  // namespace

BOOST_AUTO_TEST_CASE(identity_of_one_rank) {
  auto c = make();
  BOOST_TEST(c.rank() == 0);
  BOOST_TEST(c.size() == 1);
  static_assert(coll::collective<coll::nccl>);
}

BOOST_AUTO_TEST_CASE(allreduce_every_dtype_and_op) {
  auto c = make();
  stream_holder st;
  for (dtype t : all_types) {
    for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{(1u << 20) + 3}}) {
      const auto ref = pattern(t, n, static_cast<unsigned>(n));
      const std::size_t bytes = ref.size();
      for (coll::reduce_op op : {coll::reduce_op::sum, coll::reduce_op::max, coll::reduce_op::min}) {
        dbuf in(bytes), out(bytes);
        in.upload(ref);
        // On the allreduce's stream: a cudaMemset on the legacy stream is not
        // ordered before work on a non-blocking stream (it overwrote results).
        check(cudaMemsetAsync(out.p, 0x5a, bytes, st.s), "memset");
        auto r = c.allreduce({in.p, n, t}, {out.p, n, t}, op, st.s);
        BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.error().message()));
        BOOST_TEST_REQUIRE(c.wait(*r).ok());
        BOOST_TEST((out.download(bytes) == ref), to_string(t) << " n=" << n << " " << to_string(op) << " out of place");
        auto r2 = c.allreduce({in.p, n, t}, {in.p, n, t}, op, st.s);  // in place
        BOOST_TEST_REQUIRE(r2.has_value());
        BOOST_TEST_REQUIRE(c.wait(*r2).ok());
        BOOST_TEST((in.download(bytes) == ref), to_string(t) << " n=" << n << " " << to_string(op) << " in place");
      }
    }
  }
  BOOST_TEST(c.counters().errors == 0u);
  BOOST_TEST(c.counters().allreduces == 6u * 3u * 3u * 2u);
}

BOOST_AUTO_TEST_CASE(reduce_scatter_and_all_gather) {
  auto c = make();
  stream_holder st;
  for (dtype t : all_types) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4097}}) {
      const auto ref = pattern(t, n, 3);
      const std::size_t bytes = ref.size();
      const std::vector<std::size_t> counts = {n};
      dbuf in(bytes), out(bytes);
      if (n != 0) in.upload(ref);
      auto r = c.reduce_scatter({in.p, n, t}, {out.p, n, t}, counts, coll::reduce_op::sum, st.s);
      BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.error().message()));
      BOOST_TEST_REQUIRE(c.wait(*r).ok());
      BOOST_TEST((out.download(bytes) == ref), to_string(t) << " n=" << n << " reduce_scatter");
      dbuf all(bytes);
      auto g = c.all_gather({out.p, n, t}, {all.p, n, t}, counts, st.s);
      BOOST_TEST_REQUIRE(g.has_value(), (g ? "" : g.error().message()));
      BOOST_TEST_REQUIRE(c.wait(*g).ok());
      BOOST_TEST((all.download(bytes) == ref), to_string(t) << " n=" << n << " all_gather");
      auto g2 = c.all_gather({all.p, n, t}, {all.p, n, t}, counts, st.s);  // the rank's own block in place
      BOOST_TEST_REQUIRE(g2.has_value());
      BOOST_TEST_REQUIRE(c.wait(*g2).ok());
      BOOST_TEST((all.download(bytes) == ref), to_string(t) << " n=" << n << " all_gather in place");
    }
  }
}

BOOST_AUTO_TEST_CASE(broadcast_and_barrier) {
  auto c = make();
  stream_holder st;
  const auto ref = pattern(dtype::f32, 12345, 5);
  dbuf b(ref.size());
  b.upload(ref);
  auto r = c.broadcast({b.p, 12345, dtype::f32}, 0, st.s);
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST_REQUIRE(c.wait(*r).ok());
  BOOST_TEST((b.download(ref.size()) == ref));
  auto bad = c.broadcast({b.p, 12345, dtype::f32}, 1, st.s);
  BOOST_TEST_REQUIRE(!bad.has_value());
  BOOST_TEST((bad.error().code() == ashl::errc::out_of_range));
  auto bar = c.barrier(st.s);
  BOOST_TEST_REQUIRE(bar.has_value());
  BOOST_TEST(c.wait(*bar).ok());
  BOOST_TEST(c.wait(*bar).ok());  // done: ok again at once
  auto t = c.test(*bar);
  BOOST_TEST_REQUIRE(t.has_value());
  BOOST_TEST(*t);
  BOOST_TEST(c.counters().barriers == 1u);
}

// The result is visible to later work on the same stream without any host
// wait; test() polls until the event completes.
BOOST_AUTO_TEST_CASE(stream_order) {
  auto c = make();
  stream_holder st;
  const std::size_t n = 1 << 20;
  const auto ref = pattern(dtype::f32, n, 1);
  dbuf in(ref.size()), out(ref.size());
  in.upload(ref);
  auto r = c.allreduce({in.p, n, dtype::f32}, {out.p, n, dtype::f32}, coll::reduce_op::sum, st.s);
  BOOST_TEST_REQUIRE(r.has_value());
  twice<<<static_cast<unsigned>((n + 255) / 256), 256, 0, st.s>>>(static_cast<float*>(out.p), n);
  check(cudaGetLastError(), "launch");
  bool done = false;
  for (int i = 0; i < 10000000 && !done; ++i) {
    auto t = c.test(*r);
    BOOST_TEST_REQUIRE(t.has_value());
    done = *t;
  }
  BOOST_TEST(done);
  check(cudaStreamSynchronize(st.s), "cudaStreamSynchronize");
  std::vector<float> got(n), want(n);
  check(cudaMemcpy(got.data(), out.p, n * 4, cudaMemcpyDeviceToHost), "download");
  std::memcpy(want.data(), ref.data(), n * 4);
  for (auto& w : want) w *= 2.0f;
  BOOST_TEST((got == want));
}

BOOST_AUTO_TEST_CASE(argument_errors) {
  auto c = make();
  stream_holder st;
  dbuf a(4096), b(4096);
  auto r = c.allreduce({a.p, 100, dtype::f32}, {b.p, 99, dtype::f32}, coll::reduce_op::sum, st.s);
  BOOST_TEST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find("allreduce.out.size") != std::string::npos);
  auto* base = static_cast<std::byte*>(a.p);
  auto o = c.allreduce({base, 100, dtype::f32}, {base + 8, 100, dtype::f32}, coll::reduce_op::sum, st.s);
  BOOST_TEST_REQUIRE(!o.has_value());
  BOOST_TEST(o.error().message().find("overlap") != std::string::npos);
  const std::vector<std::size_t> two = {50, 50};
  auto s = c.reduce_scatter({a.p, 100, dtype::f32}, {b.p, 50, dtype::f32}, two, coll::reduce_op::sum, st.s);
  BOOST_TEST_REQUIRE(!s.has_value());
  BOOST_TEST(s.error().message().find("reduce_scatter.counts.size") != std::string::npos);
  auto d = c.allreduce({a.p, 100, dtype::f32}, {b.p, 100, dtype::f16}, coll::reduce_op::sum, st.s);
  BOOST_TEST_REQUIRE(!d.has_value());
  BOOST_TEST(c.counters().errors == 4u);
  BOOST_TEST(c.counters().allreduces == 0u);
}

BOOST_AUTO_TEST_CASE(unique_id_roundtrip) {
  auto id = coll::nccl_new_unique_id();
  BOOST_TEST_REQUIRE(id.has_value());
  auto back = coll::nccl_id_from_hex(coll::nccl_id_to_hex(*id));
  BOOST_TEST_REQUIRE(back.has_value());
  BOOST_TEST((*back == *id));
  // A communicator from an id that went through its hex form.
  auto c = coll::nccl::create(*back, 0, 1, 0);
  BOOST_TEST_REQUIRE(c.has_value(), (c ? "" : c.error().message()));
}

int main(int argc, char** argv) {
  if (const int s = device_state(); s != 0) return s;
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}

#else  // !ASHL_HAS_NCCL()

int main() {
  std::printf("SKIPPED: built without NCCL (component nccl off)\n");
  return 77;
}

#endif
