// ashl/ps/device_worker.cuh — a ps::worker whose gradients and parameters
// live on a GPU (docs/gpu-workers.md; docs/design.md "Data flow
// of one commit").
//
//   float* d_w = ...; float* d_g = ...;                          // the framework's device buffers
//   auto t = ashl::transport::ucx::create({.token = token});
//   auto wk = ashl::ps::device_worker<ashl::transport::ucx>::create(
//       {.rank = r, .servers = {"10.0.0.1:5000"}}, std::move(*t), {d_w, n}, stream);  // joins; d_w <- server
//   while (training) {
//     do { step<<<..., stream>>>(d_w, d_g); } while (!wk->iteration_done());
//     ASHL_TRY(wk->commit({d_g, n}, stream));   // encoded on `stream`; returns once the payload is on the host
//     ASHL_TRY(wk->wait(stream));               // parameters arrived; copied into d_w on `stream`
//   }                                           // kernels queued on `stream` after wait() see them
//   wk->leave();
//
// A commit under a compressing plan is encoded shard by shard with the
// plan's device codec (compress/cuda/concepts.cuh) on the caller's stream,
// with error feedback on the device (e <- (x + e) - C(x + e): the device
// decorator's step, compress::cuda::error_feedback_step, on the worker's
// residual; the same bits as compress/error_feedback.hpp on the host, and
// settled on the stream even when a payload's size is known only on the
// device), and only the payloads are
// copied into one page-locked host buffer registered with UCX once
// (ps/device_staging.hpp); ps::worker::commit_encoded sends them from
// there. A dense commit copies the gradient into that buffer and is sent
// from it (zero copy on the host). A plan whose codec has no device
// implementation is encoded by ps::worker on the host from the same copy
// (counted: host_encoded). Pull replies land in a page-locked parameter
// buffer (UCX receives into it) and wait() copies it into the device
// buffer on the caller's stream.
//
// Synchronization: commit() waits for its own stream (cudaStreamSynchronize:
// the host must hold the payload before it sends it) and, before a new pull
// may overwrite the page-locked parameters, for the event recorded after
// the previous copy to the device (a no-op when that stream already ran
// it). Nothing synchronizes the device. The caller's update buffer may be
// reused once commit() returned; the device parameter buffer must not be
// written by the caller between commit() and the copy wait() enqueues.
//
// Device-side allocations (residuals, payload and scratch buffers) are
// stream-ordered (cudaMallocAsync) and grow only when a plan needs more.
#pragma once

#if !defined(__CUDACC__)
#error "ashl/ps/device_worker.cuh needs nvcc; ashl/ps/worker.hpp is the host worker"
#endif

#include <ashl/config.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/cuda/concepts.cuh>
#include <ashl/compress/cuda/error_feedback.cuh>
#include <ashl/compress/cuda/cast.cuh>
#include <ashl/compress/cuda/identity.cuh>
#include <ashl/compress/cuda/block.cuh>
#include <ashl/compress/cuda/natural.cuh>
#include <ashl/compress/cuda/qsgd.cuh>
#include <ashl/compress/cuda/randomk.cuh>
#include <ashl/compress/cuda/sign.cuh>
#include <ashl/compress/cuda/terngrad.cuh>
#include <ashl/compress/cuda/threshold.cuh>
#include <ashl/compress/cuda/topk.cuh>
#include <ashl/compress/cuda/topk_sampled.cuh>
#include <ashl/compress/registry.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
#include <ashl/ps/device_staging.hpp>
#include <ashl/ps/worker.hpp>
#include <ashl/transport/concepts.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

struct device_worker_telemetry {
  std::uint64_t device_encoded = 0;  // compressed commits encoded on the device
  std::uint64_t host_encoded = 0;    // compressed commits whose codec has no device implementation
  std::uint64_t dense = 0;           // uncompressed commits
  std::uint64_t residual_paid = 0;   // of them, commits that paid off the device residual (commit_encoder rule)
  std::uint64_t bytes_to_host = 0;   // device → page-locked host
  std::uint64_t bytes_to_device = 0; // page-locked host → device parameters
  std::uint64_t staging_allocations = 0;  // page-locked buffers (re)allocated and registered
  std::uint64_t registered = 0;      // of them, registered with the transport (register_memory)
  ucx_memory_types ucx{};            // what UCX supports, probed at creation
  staging_choice staging{};          // the path taken and why
  worker_telemetry host{};           // the ps::worker underneath
};

namespace detail {

// A transport that registers memory regions once (transport::ucx).
template <class T>
concept registers_memory = requires(T& t, std::span<std::byte> region) {
  { t.register_memory(region) };
  t.deregister_memory(*t.register_memory(region));
};
template <class T>
struct region_id {
  using type = std::uint32_t;
};
template <registers_memory T>
struct region_id<T> {
  using type = std::remove_cvref_t<decltype(*std::declval<T&>().register_memory(std::span<std::byte>{}))>;
};

inline status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return make_error(errc::unavailable, std::string("device_worker.") + what, static_cast<int>(e), cudaGetErrorString(e));
}

// e[i] += x[i]: the residual becomes x + e before it is encoded.
static __global__ void add_into_kernel(float* e, const float* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    e[i] += x[i];
}

// A stream-ordered device allocation that only grows.
struct device_block {
  void* data = nullptr;
  std::size_t bytes = 0;
  status reserve(std::size_t want, cudaStream_t s) {
    if (want <= bytes) return {};
    if (data != nullptr) ASHL_TRY(cuda_status(cudaFreeAsync(data, s), "cudaFreeAsync"));
    data = nullptr;
    bytes = 0;
    ASHL_TRY(cuda_status(cudaMallocAsync(&data, want, s), "cudaMallocAsync"));
    bytes = want;
    return {};
  }
  void release() noexcept {
    if (data != nullptr) (void)cudaFree(data);
    data = nullptr;
    bytes = 0;
  }
};

// Calls f(codec) with the plan's codec (id, ratio, options) when it has a
// device implementation; false when it has none.
template <class F, std::size_t I = 0>
bool with_device_codec(codec_id id, double ratio, codec_options o, F&& f) {
  if constexpr (I == codec_id_count) {
    return false;
  } else {
    if (static_cast<std::size_t>(id) == I) {
      using C = compress::codec_for<static_cast<codec_id>(I)>;
      if constexpr (compress::cuda::device_codec<C>) {
        f(make_codec<static_cast<codec_id>(I)>(ratio, o));
        return true;
      } else {
        return false;
      }
    }
    return with_device_codec<F, I + 1>(id, ratio, o, std::forward<F>(f));
  }
}

}  // namespace detail

// A shard's encode on `stream`: with a residual e, the device decorator's
// error-feedback step (compress::cuda::error_feedback_step, e <- e + x;
// out <- C(e); e <- e - C(e), as compress::error_feedback does on the
// host); an empty `e` encodes x alone. With scratch.data == nullptr only
// the sizes are set (scratch.bytes, out.used). When the codec knows its
// size only on the device (out.size_known false), the exact size is
// *out.d_used; the residual is already settled on the device.
template <class C>
status encode_with_feedback(C& c, device_view<const float> x, device_view<float> e, compress::cuda::device_output& out,
                            const compress::codec_context& ctx, compress::cuda::device_scratch& scratch,
                            compress::cuda::device_report* encode_report, compress::cuda::device_report* decode_report,
                            cudaStream_t stream) {
  if (e.size() == 0) return compress::cuda::encode(c, x, out, ctx, scratch, encode_report, stream);
  if (e.size() != x.size())
    return invalid_argument("device_worker.residual.size", e.size(), "must equal the update's " + std::to_string(x.size()));
  return compress::cuda::error_feedback_step(c, x, e, out, ctx, scratch, encode_report, decode_report, stream);
}

template <transport::transport Transport>
class device_worker {
 public:
  // Joins like ps::worker::create (the initial parameters are pulled) and
  // copies them into `parameters` on `stream`.
  static result<device_worker> create(worker_params p, Transport t, device_view<float> parameters,
                                      cudaStream_t stream) {
    if (parameters.size() == 0) return invalid_argument("device_worker.parameters.size", 0, "needs at least one element");
    if (parameters.data() == nullptr) return invalid_argument("device_worker.parameters.data", "null", "needs a device buffer");
    auto im = std::make_unique<impl>();
    im->n = parameters.size();
    im->d_params = parameters.data();
    im->seed = p.seed;
    im->error_feedback = p.error_feedback;
    auto mem = probe_ucx_memory();
    if (!mem) return mem.error();
    im->tel.ucx = *mem;
    im->tel.staging = choose_staging(*mem);
    ASHL_TRY(detail::cuda_status(cudaEventCreateWithFlags(&im->params_copied, cudaEventDisableTiming), "cudaEventCreate"));
    auto grown = im->host_params.reserve(im->n * sizeof(float));
    if (!grown) return grown.error();
    ASHL_TRY(im->stage(im->n * sizeof(float), t));
    im->params_region = im->register_region(t, im->host_params.bytes());
    ++im->tel.staging_allocations;
    // The page-locked buffer is the staging already: the device's parameters
    // change only in wait(stream) after the host worker's wait() succeeded
    // (a bad reply fails it), so replies land straight in the registered
    // buffer instead of in a second host copy (worker_params::stage_replies).
    p.stage_replies = false;
    auto wk = worker<Transport>::create(std::move(p), std::move(t),
                                        std::span<float>(reinterpret_cast<float*>(im->host_params.data()), im->n));
    if (!wk) return wk.error();
    im->wk.emplace(std::move(*wk));
    ASHL_TRY(im->copy_params_to_device(stream));
    return device_worker(std::move(im));
  }

  device_worker(device_worker&&) noexcept = default;
  device_worker& operator=(device_worker&&) noexcept = default;
  ~device_worker() = default;

  [[nodiscard]] worker_plan plan() const { return im_->wk->plan(); }
  [[nodiscard]] std::uint32_t batch() const { return im_->wk->batch(); }
  [[nodiscard]] codec_id codec() const { return im_->wk->codec(); }
  [[nodiscard]] const shard_layout& layout() const noexcept { return im_->wk->layout(); }
  [[nodiscard]] std::uint64_t staleness() const { return im_->wk->staleness(); }
  bool iteration_done() {
    const bool done = im_->wk->iteration_done();
    if (done) im_->ready = true;
    return done;
  }

  // Sends `update` (device memory, all the model's elements), encoded on
  // `stream` when the plan compresses, with the pull; returns once the
  // payload is in host memory and handed to the transport, so `update` may
  // be reused at once.
  status commit(device_view<const float> update, cudaStream_t stream) { return im_->commit(update, stream); }

  // Asks for the parameters without committing (ps::worker::pull).
  status pull() {
    ASHL_TRY(im_->idle("device_worker.pull"));
    ASHL_TRY(im_->params_free());
    ASHL_TRY(im_->wk->pull());
    im_->in_flight = true;
    return {};
  }

  // Drives the transport until the commit was sent and the parameters
  // arrived, then copies them into the device buffer on `stream`.
  status wait(cudaStream_t stream) {
    ASHL_TRY(im_->wk->wait());
    if (!im_->in_flight) return {};
    im_->in_flight = false;
    return im_->copy_params_to_device(stream);
  }

  status report_metric(metric_id m, double value) { return im_->wk->report_metric(m, value); }
  status leave() { return im_->wk->leave(); }

  [[nodiscard]] device_worker_telemetry telemetry() const {
    device_worker_telemetry t = im_->tel;
    t.host = im_->wk->telemetry();
    return t;
  }
  // The host worker underneath (its transport, progress line, ...).
  [[nodiscard]] worker<Transport>& host_worker() noexcept { return *im_->wk; }

 private:
  struct impl {
    std::size_t n = 0;
    float* d_params = nullptr;
    std::uint64_t seed = 0;
    bool error_feedback = true;
    cudaEvent_t params_copied = nullptr;
    bool params_pending = false;  // a copy to the device was enqueued after the event's last query
    bool in_flight = false;       // a commit or pull not yet completed by wait(): staging is in use
    bool ready = false;           // iteration_done() said true since the last commit: the residual may change
    pinned_buffer host_params;    // pull replies land here
    pinned_buffer staging;        // commit payloads (or the dense update) wait here
    pinned_buffer control;        // d_used and the report, read back after the stream sync
    std::optional<typename detail::region_id<Transport>::type> params_region, staging_region;
    detail::device_block residual, payload, scratch, d_control;
    std::size_t residual_elements = 0;
    bool device_owed = false;     // the device residual holds what earlier compressed commits dropped
    device_worker_telemetry tel{};
    std::optional<worker<Transport>> wk;  // destroyed before the buffers it points into

    impl() = default;
    impl(const impl&) = delete;
    impl& operator=(const impl&) = delete;
    ~impl() {
      if (wk) {
        if (params_region) wk->transport().deregister_memory(*params_region);
        if (staging_region) wk->transport().deregister_memory(*staging_region);
      }
      wk.reset();
      residual.release();
      payload.release();
      scratch.release();
      d_control.release();
      if (params_copied != nullptr) (void)cudaEventDestroy(params_copied);
    }

    template <class T>
    std::optional<typename detail::region_id<Transport>::type> register_region(T& t, std::span<std::byte> region) {
      if constexpr (detail::registers_memory<Transport>) {
        auto id = t.register_memory(region);
        if (id) {
          ++tel.registered;
          return *id;
        }
        std::fprintf(stderr, "device_worker: register_memory failed (%s); sends use UCX's registration cache\n",
                     id.error().message().c_str());
      }
      return std::nullopt;
    }

    // The staging buffer holds at least `bytes`; when it grows, the old
    // region is deregistered first and the new one registered once.
    template <class T>
    status stage(std::size_t bytes, T& t) {
      if (bytes <= staging.size()) return {};
      if constexpr (detail::registers_memory<Transport>) {
        if (staging_region) t.deregister_memory(*staging_region);
      }
      staging_region.reset();
      auto grown = staging.reserve(bytes);
      if (!grown) return grown.error();
      ++tel.staging_allocations;
      staging_region = register_region(t, staging.bytes());
      return {};
    }

    // The previous copy of the page-locked parameters to the device has
    // run, so a new pull may overwrite them.
    // Staging and the page-locked parameters are in use while a commit or
    // pull is in flight: refused before either is touched.
    status idle(const char* what) const {
      if (in_flight) return invalid_argument(what, "pending", "the last commit or pull is not complete: wait() first");
      return {};
    }

    status params_free() {
      if (!params_pending) return {};
      ASHL_TRY(detail::cuda_status(cudaEventSynchronize(params_copied), "cudaEventSynchronize"));
      params_pending = false;
      return {};
    }

    status copy_params_to_device(cudaStream_t s) {
      ASHL_TRY(detail::cuda_status(
          cudaMemcpyAsync(d_params, host_params.data(), n * sizeof(float), cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync(parameters)"));
      ASHL_TRY(detail::cuda_status(cudaEventRecord(params_copied, s), "cudaEventRecord"));
      params_pending = true;
      tel.bytes_to_device += n * sizeof(float);
      return {};
    }

    status commit(device_view<const float> update, cudaStream_t s) {
      if (update.size() != n)
        return invalid_argument("device_worker.commit.update.size", update.size(),
                                "must be the model's " + std::to_string(n) + " elements");
      ASHL_TRY(idle("device_worker.commit"));
      // Checked here, not only by ps::worker: the error-feedback residual
      // changes as soon as the update is encoded.
      if (!ready)
        return invalid_argument("device_worker.commit.iterations", "incomplete",
                                "the plan's cycle is not complete: call iteration_done() until it returns true");
      ASHL_TRY(params_free());
      if (wk->compresses()) {
        status st;
        const worker_plan pl = wk->plan();
        const bool has = detail::with_device_codec(wk->codec(), pl.compression_ratio, pl.compression_options(),
                                                   [&](auto c) { (void)(st = encode_on_device(c, update, s)); });
        if (has) {
          if (st.ok()) {
            in_flight = true;
            ready = false;
            device_owed = device_owed || error_feedback;
          }
          return st;
        }
        ++tel.host_encoded;
      } else {
        ++tel.dense;
      }
      // Dense, or a codec without a device implementation: the update
      // itself goes to host memory and ps::worker sends (or encodes) it.
      // A dense commit after device-encoded ones pays their residual off,
      // the rule of ps::commit_encoder: e <- e + x is sent and e
      // is cleared, so nothing compression dropped is lost.
      const std::size_t bytes = n * sizeof(float);
      ASHL_TRY(stage(bytes, wk->transport()));
      const float* from = update.data();
      const bool pay_off = !wk->compresses() && device_owed;
      if (pay_off) {
        const unsigned blocks = static_cast<unsigned>(std::clamp<std::size_t>((n + 255) / 256, 1, 4096));
        auto* e = static_cast<float*>(residual.data);
        detail::add_into_kernel<<<blocks, 256, 0, s>>>(e, update.data(), n);
        ASHL_TRY(detail::cuda_status(cudaGetLastError(), "add_into_kernel"));
        from = e;
      }
      ASHL_TRY(detail::cuda_status(cudaMemcpyAsync(staging.data(), from, bytes, cudaMemcpyDeviceToHost, s),
                                   "cudaMemcpyAsync(update)"));
      if (pay_off) {
        ASHL_TRY(detail::cuda_status(cudaMemsetAsync(residual.data, 0, bytes, s), "cudaMemsetAsync(residual)"));
        device_owed = false;
        ++tel.residual_paid;
      }
      ASHL_TRY(detail::cuda_status(cudaStreamSynchronize(s), "cudaStreamSynchronize"));
      tel.bytes_to_host += bytes;
      ASHL_TRY(wk->commit(std::span<const float>(reinterpret_cast<const float*>(staging.data()), n)));
      in_flight = true;
      ready = false;
      return {};
    }

    // Control block on the device and its page-locked copy: one u64 size
    // per shard, then a report per shard for its encode and one for its
    // decode (each entry point clears its own report on the stream).
    static std::size_t control_bytes(std::size_t shards) {
      return shards * sizeof(std::uint64_t) + 2 * shards * sizeof(compress::cuda::device_report);
    }

    template <class C>
    status encode_on_device(C c, device_view<const float> update, cudaStream_t s) {
      const shard_layout& L = wk->layout();
      const std::size_t S = L.servers();
      const std::uint64_t step = wk->commit_step();
      std::vector<std::size_t> caps(S);
      for (std::size_t k = 0; k < S; ++k) caps[k] = c.max_encoded_bytes(L.range(static_cast<std::uint32_t>(k)).size(), dtype::f32);
      const staging_layout at = staging_layout::of(caps);
      ASHL_TRY(payload.reserve(at.total(), s));
      ASHL_TRY(d_control.reserve(control_bytes(S), s));
      ASHL_TRY(stage(at.total(), wk->transport()));
      if (control.size() < control_bytes(S)) {
        auto g = control.reserve(control_bytes(S));
        if (!g) return g.error();
      }
      if (error_feedback && residual_elements != n) {
        ASHL_TRY(residual.reserve(n * sizeof(float), s));
        ASHL_TRY(detail::cuda_status(cudaMemsetAsync(residual.data, 0, n * sizeof(float), s), "cudaMemsetAsync"));
        residual_elements = n;
      }
      auto* d_used = static_cast<std::uint64_t*>(d_control.data);
      auto* d_reports = reinterpret_cast<compress::cuda::device_report*>(d_used + S);  // encode k, then decode k
      // All clear (fault 0), whether or not a codec writes its report.
      ASHL_TRY(detail::cuda_status(cudaMemsetAsync(d_control.data, 0, control_bytes(S), s), "cudaMemsetAsync"));
      auto* base = static_cast<std::byte*>(payload.data);
      auto x_of = [&](std::size_t k) {
        const key_range r = L.range(static_cast<std::uint32_t>(k));
        return device_view<const float>(update.data() + r.begin, r.size());
      };
      auto e_of = [&](std::size_t k) {
        const key_range r = L.range(static_cast<std::uint32_t>(k));
        return error_feedback ? device_view<float>(static_cast<float*>(residual.data) + r.begin, r.size())
                              : device_view<float>{};
      };
      auto ctx_of = [&](std::size_t k) {
        return compress::codec_context{.seed = seed, .step = step, .tensor = static_cast<std::uint32_t>(k)};
      };
      // Size queries (two-call pattern), then the runs.
      std::size_t need = 1;
      for (std::size_t k = 0; k < S; ++k) {
        compress::cuda::device_output out{.bytes = {base + at.offset(k), caps[k]}};
        compress::cuda::device_scratch q{};
        ASHL_TRY(encode_with_feedback(c, x_of(k), e_of(k), out, ctx_of(k), q, d_reports + k, d_reports + S + k, s));
        need = std::max(need, q.bytes);
      }
      ASHL_TRY(scratch.reserve(need, s));
      std::vector<std::size_t> used(S);
      std::vector<std::uint8_t> known(S);
      for (std::size_t k = 0; k < S; ++k) {
        compress::cuda::device_output out{.bytes = {base + at.offset(k), caps[k]}, .d_used = d_used + k};
        compress::cuda::device_scratch sc{scratch.data, scratch.bytes};
        ASHL_TRY(encode_with_feedback(c, x_of(k), e_of(k), out, ctx_of(k), sc, d_reports + k, d_reports + S + k, s));
        used[k] = out.used;
        known[k] = out.size_known ? 1 : 0;
        if (known[k]) {
          ASHL_TRY(detail::cuda_status(
              cudaMemcpyAsync(staging.data() + at.offset(k), base + at.offset(k), used[k], cudaMemcpyDeviceToHost, s),
              "cudaMemcpyAsync(payload)"));
          tel.bytes_to_host += used[k];
        }
      }
      ASHL_TRY(detail::cuda_status(
          cudaMemcpyAsync(control.data(), d_control.data, control_bytes(S), cudaMemcpyDeviceToHost, s),
          "cudaMemcpyAsync(control)"));
      ASHL_TRY(detail::cuda_status(cudaStreamSynchronize(s), "cudaStreamSynchronize"));
      ASHL_TRY(check_reports(S, 0));
      // Sizes known only on the device (threshold, topk_sampled): their
      // exact bytes now (their residuals were settled on the device).
      const auto* h_used = reinterpret_cast<const std::uint64_t*>(control.data());
      for (std::size_t k = 0; k < S; ++k) {
        if (known[k]) continue;
        if (h_used[k] > caps[k])
          return make_error(errc::internal, "device_worker.payload_bytes", h_used[k],
                            "exceeds the codec's bound " + std::to_string(caps[k]));
        used[k] = static_cast<std::size_t>(h_used[k]);
        ASHL_TRY(detail::cuda_status(cudaMemcpyAsync(staging.data() + at.offset(k), base + at.offset(k), used[k],
                                                     cudaMemcpyDeviceToHost, s),
                                     "cudaMemcpyAsync(payload)"));
        tel.bytes_to_host += used[k];
      }
      std::vector<std::span<const std::byte>> spans(S);
      for (std::size_t k = 0; k < S; ++k) spans[k] = {staging.data() + at.offset(k), used[k]};
      ++tel.device_encoded;
      return wk->commit_encoded(spans);
    }

    // The reports read back into `control`, from report `first` on.
    status check_reports(std::size_t S, std::size_t first) const {
      for (std::size_t k = first; k < 2 * S; ++k) {
        compress::cuda::device_report rep{};
        std::memcpy(&rep, control.data() + S * sizeof(std::uint64_t) + k * sizeof rep, sizeof rep);
        if (rep.fault != 0)
          return make_error(errc::invalid_argument, k < S ? "device_worker.commit.encode" : "device_worker.commit.residual",
                            rep.fault,
                            "the device codec " + std::string(to_string(wk->codec())) + " reported fault " +
                                std::to_string(rep.fault) + " in shard " + std::to_string(k % S) + " at index " +
                                std::to_string(rep.index));
      }
      return {};
    }
  };

  explicit device_worker(std::unique_ptr<impl> im) : im_(std::move(im)) {}
  std::unique_ptr<impl> im_;
};

}  // namespace ps
ASHL_NAMESPACE_END
