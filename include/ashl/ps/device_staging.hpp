// ashl/ps/device_staging.hpp — the host side of a device-resident worker
// (ps/device_worker.cuh): where the commit payloads and the pulled
// parameters wait in host memory, and whether UCX could take device memory
// itself (docs/gpu-workers.md).
//
//   auto mem = ashl::ps::probe_ucx_memory();            // UCX's memory types, asked at run time
//   std::printf("%s\n", mem->describe().c_str());       // "UCX memory types: host (no CUDA memory)"
//   auto path = ashl::ps::choose_staging(*mem);         // the path taken and why
//   auto plan = ashl::ps::staging_layout::of({c0, c1}); // one region per shard, 256-byte aligned
//   ashl::ps::pinned_buffer buf;                         // with CUDA: page-locked, allocated once
//   ASHL_TRY(buf.reserve(plan.total()));                 // grows only when a plan needs more
//
// A device worker stages every shard's payload in one page-locked buffer,
// allocated once (and again only if a new plan's payload bound exceeds it)
// and registered with UCX once (transport::ucx::register_memory), so the
// copy from the device is a DMA and UCX sends from a registered region.
// Regions start on 256-byte boundaries (cudaMemcpyAsync and the codecs want
// 4-byte alignment; 256 keeps each shard's DMA on its own cache lines).
//
// Device memory straight to UCX: UCX says at run time which memory types
// its loaded transports handle (ucp_context_query, UCP_ATTR_FIELD_MEMORY_TYPES).
// Even where it handles CUDA memory, the wire format's CRC-32C covers the
// payload and is computed by the host (wire::seal_header reads the bytes),
// and a pull reply is checked the same way, so the payload must be in host
// memory either way; choose_staging() says so in its reason, and the
// worker reports both.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#if ASHL_HAS_UCX()
#include <ucp/api/ucp.h>
#endif
#if ASHL_HAS_CUDA()
#include <cuda_runtime.h>
#endif

ASHL_NAMESPACE_BEGIN
namespace ps {

// What the UCX build and its configuration (UCX_TLS, ...) can send from.
struct ucx_memory_types {
  bool probed = false;       // false: built without UCX
  bool host = false;
  bool cuda = false;         // UCS_MEMORY_TYPE_CUDA
  bool cuda_managed = false;
  std::uint64_t raw = 0;     // the bit mask, UCS_BIT(ucs_memory_type_t)

  [[nodiscard]] std::string describe() const {
    if (!probed) return "UCX memory types: not probed (built without UCX)";
    std::string s = "UCX memory types:";
    if (host) s += " host";
    if (cuda) s += " cuda";
    if (cuda_managed) s += " cuda-managed";
    if (!cuda) s += " (no CUDA memory)";
    return s;
  }
};

#if ASHL_HAS_UCX()
// Asks a UCP context of the same configuration a transport::ucx gets (the
// environment's UCX_* variables) which memory types it supports.
inline result<ucx_memory_types> probe_ucx_memory() {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return make_error(errc::unavailable, "ucx.ucp_config_read", static_cast<int>(s), ucs_status_string(s));
  ucp_params_t cp{};
  cp.field_mask = UCP_PARAM_FIELD_FEATURES;
  cp.features = UCP_FEATURE_AM;
  ucp_context_h ctx = nullptr;
  s = ucp_init(&cp, config, &ctx);
  ucp_config_release(config);
  if (s != UCS_OK) return make_error(errc::unavailable, "ucx.ucp_init", static_cast<int>(s), ucs_status_string(s));
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  s = ucp_context_query(ctx, &attr);
  ucp_cleanup(ctx);
  if (s != UCS_OK)
    return make_error(errc::unavailable, "ucx.ucp_context_query", static_cast<int>(s), ucs_status_string(s));
  ucx_memory_types m;
  m.probed = true;
  m.raw = attr.memory_types;
  m.host = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_HOST)) != 0;
  m.cuda = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  m.cuda_managed = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA_MANAGED)) != 0;
  return m;
}
#else
inline result<ucx_memory_types> probe_ucx_memory() { return ucx_memory_types{}; }
#endif

enum class staging_path : std::uint8_t {
  pinned_host = 0,  // device → page-locked host buffer (registered with UCX) → UCX
};

struct staging_choice {
  staging_path path = staging_path::pinned_host;
  std::string reason;
};

// The path a device worker takes, and why, from what UCX supports.
inline staging_choice choose_staging(const ucx_memory_types& m) {
  if (m.cuda)
    return {staging_path::pinned_host,
            "UCX supports CUDA memory, but the wire CRC-32C over the payload is computed on the host: "
            "payloads are staged in pinned host memory"};
  return {staging_path::pinned_host, m.probed ? "UCX has no CUDA memory support: payloads are staged in pinned "
                                                "host memory"
                                              : "built without UCX: payloads are staged in pinned host memory"};
}

// One region per shard in one buffer: region s is [offset(s), offset(s) +
// capacity(s)), each offset a multiple of `alignment`.
class staging_layout {
 public:
  static constexpr std::size_t alignment = 256;

  static staging_layout of(std::span<const std::size_t> capacities) {
    staging_layout l;
    l.offset_.reserve(capacities.size() + 1);
    l.capacity_.assign(capacities.begin(), capacities.end());
    std::size_t at = 0;
    for (std::size_t c : capacities) {
      l.offset_.push_back(at);
      at += round_up(c);
    }
    l.offset_.push_back(at);
    return l;
  }

  [[nodiscard]] std::size_t shards() const noexcept { return capacity_.size(); }
  [[nodiscard]] std::size_t offset(std::size_t s) const noexcept { return offset_[s]; }
  [[nodiscard]] std::size_t capacity(std::size_t s) const noexcept { return capacity_[s]; }
  [[nodiscard]] std::size_t total() const noexcept { return offset_.empty() ? 0 : offset_.back(); }
  static constexpr std::size_t round_up(std::size_t n) noexcept { return (n + alignment - 1) / alignment * alignment; }

 private:
  std::vector<std::size_t> offset_, capacity_;
};

#if ASHL_HAS_CUDA()
// Page-locked host memory (cudaHostAlloc), optionally registered with a
// transport that has register_memory/deregister_memory (transport::ucx).
// reserve() reallocates only to grow; it synchronizes the host with the
// device when it frees the old buffer (cudaFreeHost), which happens only
// when a plan's payload bound outgrows it.
class pinned_buffer {
 public:
  pinned_buffer() = default;
  pinned_buffer(pinned_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() { release(); }

  // true when it (re)allocated: a registration must be made again.
  result<bool> reserve(std::size_t bytes) {
    if (bytes <= bytes_) return false;
    release();
    void* p = nullptr;
    if (const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault); e != cudaSuccess)
      return make_error(errc::unavailable, "pinned_buffer.cudaHostAlloc", bytes, cudaGetErrorString(e));
    data_ = static_cast<std::byte*>(p);
    bytes_ = bytes;
    return true;
  }

  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  [[nodiscard]] std::span<std::byte> bytes() const noexcept { return {data_, bytes_}; }

 private:
  void release() noexcept {
    if (data_ != nullptr) (void)cudaFreeHost(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};
#endif

}  // namespace ps
ASHL_NAMESPACE_END
