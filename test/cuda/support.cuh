// test/cuda/support.cuh — what the GPU tests share: the main that skips
// without a device (exit 77, ctest "skipped"), device buffers, input
// patterns, and the two-call helper. A test skips only without a device.
//
//   ASHL_TEST_CUDA_MAIN()                      // once per test executable, after boost/test
//   device_buffer<float> d(host);              // upload
//   auto bytes = d.download_bytes();
#pragma once

#if !defined(__CUDACC__)
#error "test/cuda/support.cuh needs nvcc"
#endif

#include <ashl/compress/cuda/concepts.cuh>
#include <ashl/core/dtype.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace ashl_test {

// Whether the tests can run. No device is a skip: cudaErrorNoDevice, a count
// of 0, or no driver at all (cudaDriverGetVersion gives 0 then; the runtime
// says cudaErrorInsufficientDriver, which also means a driver too old for
// this runtime, so the driver version tells the two apart). Any other error
// is a failure the test must not hide: a driver that is present but does not
// match, a device that will not initialize.
enum class device_state { present, absent, broken };
inline device_state cuda_device_state(std::string& why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess) {
    why = "no CUDA device";
    return n > 0 ? device_state::present : device_state::absent;
  }
  int driver = 0;
  const bool no_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0;
  if (e == cudaErrorNoDevice || no_driver) {
    why = no_driver ? "no CUDA driver (so no device)" : "no CUDA device";
    return device_state::absent;
  }
  why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
        "), driver version " + std::to_string(driver);
  return device_state::broken;
}

// The device check as an exit code, printing why: 77 (ctest "skipped") only
// without a device, 1 on any other CUDA error, 0 when the tests can run.
inline int cuda_device_exit_code() {
  std::string why;
  switch (cuda_device_state(why)) {
    case device_state::absent: std::printf("SKIPPED: %s\n", why.c_str()); return 77;
    case device_state::broken: std::printf("FAILED: %s\n", why.c_str()); return 1;
    case device_state::present: break;
  }
  return 0;
}

// Boost.Test's runner, preceded by the device check.
#define ASHL_TEST_CUDA_MAIN()                                                 \
  int main(int argc, char** argv) {                                           \
    if (const int code = ::ashl_test::cuda_device_exit_code(); code != 0)     \
      return code;                                                            \
    return ::boost::unit_test::unit_test_main(&init_unit_test, argc, argv);   \
  }

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// A cudaMalloc'd array (tests only; the library never allocates).
template <class T>
class device_buffer {
 public:
  explicit device_buffer(std::size_t n) : n_(n) {
    check(cudaMalloc(&p_, n == 0 ? 1 : n * sizeof(T)), "cudaMalloc");
  }
  explicit device_buffer(const std::vector<T>& h) : device_buffer(h.size()) {
    if (!h.empty()) check(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { cudaFree(p_); }
  T* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  std::vector<T> download(std::size_t count) const {
    std::vector<T> h(count);
    if (count != 0) check(cudaMemcpy(h.data(), p_, count * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
  ashl::device_view<const T> cview() const noexcept { return {p_, n_}; }
  ashl::device_view<T> view() const noexcept { return {p_, n_}; }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

enum class pattern { normal, ties, all_equal, heavy_tailed, special, zeros, tiny };
inline const char* name(pattern p) {
  switch (p) {
    case pattern::normal: return "normal";
    case pattern::ties: return "ties";
    case pattern::all_equal: return "all_equal";
    case pattern::heavy_tailed: return "heavy_tailed";
    case pattern::special: return "special";
    case pattern::zeros: return "zeros";
    case pattern::tiny: return "tiny";
  }
  return "?";
}

// Inputs as float; `special` mixes NaN, +-inf, +-0, subnormals and values
// beyond the 16-bit ranges into normal data.
inline std::vector<float> make_input(std::size_t n, pattern p, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (p) {
      case pattern::normal: x[i] = nd(rng); break;
      case pattern::ties: x[i] = static_cast<float>(static_cast<int>(rng() % 7) - 3) * 0.5f; break;
      case pattern::all_equal: x[i] = -1.25f; break;
      case pattern::heavy_tailed: {
        const float u = std::uniform_real_distribution<float>(1e-6f, 1.0f)(rng);
        x[i] = (rng() & 1 ? 1.0f : -1.0f) * std::pow(u, -1.5f);  // Pareto-like tail
        break;
      }
      case pattern::special: {
        const std::uint32_t r = rng() % 64;
        if (r == 0) x[i] = std::numeric_limits<float>::quiet_NaN();
        else if (r == 1) x[i] = std::numeric_limits<float>::infinity();
        else if (r == 2) x[i] = -std::numeric_limits<float>::infinity();
        else if (r == 3) x[i] = -0.0f;
        else if (r == 4) x[i] = 1e-40f;   // f32 subnormal
        else if (r == 5) x[i] = 70000.0f; // overflows fp16
        else if (r == 6) x[i] = 3e-6f;    // fp16 subnormal
        else x[i] = nd(rng);
        break;
      }
      case pattern::zeros: x[i] = (i & 1) ? -0.0f : 0.0f; break;
      case pattern::tiny: x[i] = nd(rng) * 1e-39f; break;  // f32 subnormals: tiny norms, exact fallbacks
    }
  }
  return x;
}

template <class T>
std::vector<T> convert(const std::vector<float>& x) {
  std::vector<T> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = ashl::from_float<T>(x[i]);
  return out;
}

template <class T>
std::vector<std::byte> as_bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Runs a device entry point with the two-call protocol: size query, scratch,
// run. `call(scratch)` takes an ashl::compress::cuda::device_scratch& and
// returns an ashl::status. `keep` owns the scratch afterwards (a graph
// replay needs it to stay).
template <class Call>
ashl::status two_call(Call&& call, std::unique_ptr<device_buffer<std::byte>>& keep) {
  ashl::compress::cuda::device_scratch s{};
  ashl::status st = call(s);
  if (!st.ok()) return st;
  keep = std::make_unique<device_buffer<std::byte>>(s.bytes);
  s.data = keep->data();
  return call(s);
}

// Index of the first float that differs in its bits, where NaN equals any
// NaN (x86 propagates a NaN operand's payload through arithmetic, a GPU
// returns the canonical NaN, so accumulators with NaN agree only as NaN).
inline long long first_float_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return static_cast<long long>(a.size() < b.size() ? a.size() : b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    if (x != y && !(std::isnan(a[i]) && std::isnan(b[i]))) return static_cast<long long>(i);
  }
  return -1;
}

// Index of the first differing byte, or -1.
inline long long first_difference(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  const std::size_t m = a.size() < b.size() ? a.size() : b.size();
  for (std::size_t i = 0; i < m; ++i)
    if (a[i] != b[i]) return static_cast<long long>(i);
  return a.size() == b.size() ? -1 : static_cast<long long>(m);
}

// The first difference of two payloads whose values start at byte
// `values_from` and are `width`-byte floats (4: f32, 2: f16 or bf16, `bf16`
// telling which): the bytes before must be equal, and two values match when
// their bits do or when both are NaN, whatever their bits. A NaN made by
// arithmetic carries the hardware's bits (x86 keeps a quiet NaN's payload and
// makes 0xffc00000 from inf - inf; the GPU writes 0x7fffffff, or 0x7fff in
// f16), so error feedback over inputs with inf and NaN is bit-identical
// except there. -1 when nothing differs; the byte offset of the first byte
// or value that does otherwise.
inline long long first_value_difference(const std::vector<std::byte>& a, const std::vector<std::byte>& b,
                                        std::size_t values_from, std::size_t width, bool bf16 = false) {
  if (a.size() != b.size()) return static_cast<long long>(a.size() < b.size() ? a.size() : b.size());
  if (values_from > a.size()) return first_difference(a, b);
  for (std::size_t i = 0; i < values_from; ++i)
    if (a[i] != b[i]) return static_cast<long long>(i);
  const auto is_nan = [&](const std::byte* p) {
    if (width == 4) {
      std::uint32_t u;
      std::memcpy(&u, p, 4);
      return (u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0;
    }
    std::uint16_t h;
    std::memcpy(&h, p, 2);
    return bf16 ? ((h & 0x7f80u) == 0x7f80u && (h & 0x007fu) != 0) : ((h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0);
  };
  std::size_t i = values_from;
  for (; i + width <= a.size(); i += width)
    if (std::memcmp(a.data() + i, b.data() + i, width) != 0 && !(is_nan(a.data() + i) && is_nan(b.data() + i)))
      return static_cast<long long>(i);
  for (; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<long long>(i);
  return -1;
}

// A dense payload (identity, fp16, bf16): values from byte 0.
inline long long first_dense_difference(const std::vector<std::byte>& a, const std::vector<std::byte>& b,
                                        std::size_t width, bool bf16 = false) {
  return first_value_difference(a, b, 0, width, bf16);
}

// What two payloads hold around their first difference, for a failure
// message: the sizes, the offset, and the 4-byte words there as hex and as
// f32 (a NaN whose payload bits differ shows as two NaNs). Words are aligned
// to the payload's f32 values when they start at `values_from` (randomk's
// start at byte 21: a word aligned to 4 there would mix two values), and to
// 4 bytes before them.
inline std::string describe_difference(const std::vector<std::byte>& cpu, const std::vector<std::byte>& gpu,
                                       std::size_t values_from = 0) {
  const long long at = first_difference(cpu, gpu);
  if (at < 0) return "identical";
  const auto a = static_cast<std::size_t>(at);
  const std::size_t w = a >= values_from ? values_from + (a - values_from) / 4 * 4 : a & ~std::size_t{3};
  auto word = [&](const std::vector<std::byte>& v) {
    if (w + 4 > v.size()) return std::string("(past the end)");
    std::uint32_t u = 0;
    std::memcpy(&u, v.data() + w, 4);
    float f = 0;
    std::memcpy(&f, &u, 4);
    char buf[64];
    std::snprintf(buf, sizeof buf, "0x%08x (%g)", u, static_cast<double>(f));
    return std::string(buf);
  };
  return "sizes cpu " + std::to_string(cpu.size()) + " gpu " + std::to_string(gpu.size()) + ", first difference at byte " +
         std::to_string(at) + ": word at " + std::to_string(w) + " cpu " + word(cpu) + " gpu " + word(gpu);
}

}  // namespace ashl_test
