// ashl/adapt/update_builder.hpp — what a framework adapter commits, built
// over plain float spans: the model delta since the last pull, or the mean
// gradient over the cycle's local iterations; plus the finiteness check that
// skips a mixed-precision step, and the one rule for tied parameters. Shared
// by the C++ torch adapter (adapt/torch.hpp) and, through the Python module,
// by ashl.torch (docs/torch.md, "Buckets and overlap"), so both build the
// same bytes for the same step.
//
//   ashl::adapt::update_builder b(ashl::adapt::update_kind::gradient, n);
//   b.pulled(params);                 // after each pull (delta: remembers w0)
//   b.add(grads);                     // once per local iteration
//   if (worker.iteration_done()) { b.build(params, send); worker.commit(send); ... }
//
// The builder owns its buffers (w0 or the gradient sum) and never allocates
// after construction. It does not know about threads or tensors.
#pragma once

#include <ashl/config.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace adapt {

enum class update_kind : std::uint8_t {
  delta = 0,     // the local optimizer steps; commit params - w0 (servers: model_delta)
  gradient = 1,  // nothing steps locally; commit the mean gradient of the cycle (servers: sgd)
};

// Whether every element is finite (an AMP step with inf/nan is skipped).
[[nodiscard]] inline bool all_finite(std::span<const float> x) noexcept {
  // One pass that vectorises: x - x is 0 for finite x and NaN otherwise.
  float acc = 0.0f;
  for (float v : x) acc += v - v;
  return acc == 0.0f;
}

class update_builder {
 public:
  update_builder(update_kind kind, std::size_t size) : kind_(kind), buf_(size, 0.0f) {}

  [[nodiscard]] update_kind kind() const noexcept { return kind_; }
  [[nodiscard]] std::size_t size() const noexcept { return buf_.size(); }
  // Local iterations added since the last pull.
  [[nodiscard]] std::uint64_t iterations() const noexcept { return n_; }

  // The parameters arrived (or the cycle starts): delta remembers them as
  // w0; gradient forgets the sum.
  void pulled(std::span<const float> params) noexcept {
    if (kind_ == update_kind::delta)
      for (std::size_t i = 0; i < buf_.size(); ++i) buf_[i] = params[i];
    n_ = 0;
  }

  // One local iteration's gradients (gradient: summed; delta: counted only).
  void add(std::span<const float> grads) noexcept {
    if (kind_ == update_kind::gradient) {
      if (n_ == 0)
        for (std::size_t i = 0; i < buf_.size(); ++i) buf_[i] = grads[i];
      else
        for (std::size_t i = 0; i < buf_.size(); ++i) buf_[i] += grads[i];
    }
    ++n_;
  }

  // The commit into `out`: params - w0 (delta) or sum / iterations
  // (gradient; one iteration: the gradient itself, bit for bit).
  void build(std::span<const float> params, std::span<float> out) const noexcept {
    if (kind_ == update_kind::delta) {
      for (std::size_t i = 0; i < buf_.size(); ++i) out[i] = params[i] - buf_[i];
    } else if (n_ <= 1) {
      for (std::size_t i = 0; i < buf_.size(); ++i) out[i] = buf_[i];
    } else {
      const float k = static_cast<float>(n_);
      for (std::size_t i = 0; i < buf_.size(); ++i) out[i] = buf_[i] / k;
    }
  }

 private:
  update_kind kind_;
  std::vector<float> buf_;  // delta: w0; gradient: the sum of the cycle's gradients
  std::uint64_t n_ = 0;
};

// Tied (shared) parameters: the first registration of a tensor owns its
// slot, later ones are skipped. `keys[i]` identifies parameter i's storage
// (its data pointer in torch, id() in Python); returns, per parameter, true
// when it owns a slot.
template <class Key>
[[nodiscard]] std::vector<bool> first_registrations(std::span<const Key> keys) {
  std::vector<bool> own(keys.size(), true);
  for (std::size_t i = 0; i < keys.size(); ++i)
    for (std::size_t k = 0; k < i; ++k)
      if (own[k] && keys[k] == keys[i]) {
        own[i] = false;
        break;
      }
  return own;
}

// A bucket's share of one slot: elements [begin, begin + size) of slot
// `slot` (the whole slot unless the slot is partitioned).
struct bucket_piece {
  std::size_t slot = 0;
  std::uint64_t begin = 0;
  std::uint64_t size = 0;
  friend bool operator==(const bucket_piece&, const bucket_piece&) = default;
};

// The bucket plan, the one rule both adapters follow (ashl.torch through
// the Python module, adapt/torch.hpp directly): slots (the parameters that
// own one, in registration order) into buckets of at most `cap_bytes`, in
// reverse registration order (the last layers' gradients are ready first
// in backward, as in DDP), one dtype per bucket. A slot of more than
// `part_bytes` bytes (BytePS's partitioning; part 0: none) is cut into
// ceil(bytes / part) pieces of near-equal whole elements, each a bucket
// alone, in element order (consecutive buckets of its dtype, so the slot
// stays one contiguous range of its dtype's buckets laid end to end): its
// pieces are committed and pulled as a pipeline, one piece's reply coming
// down while the next goes up. A slot of at most part_bytes but more than
// the cap gets a bucket alone. cap 0: one bucket per dtype, nothing cut.
// dtype_of(i) is any comparable tag; bytes_of(i) the slot's size in bytes,
// elems_of(i) in elements. Returns, per bucket, its pieces in bucket order.
template <class DtypeOf, class BytesOf, class ElemsOf>
[[nodiscard]] std::vector<std::vector<bucket_piece>> plan_buckets(std::size_t slots, DtypeOf dtype_of,
                                                                  BytesOf bytes_of, ElemsOf elems_of,
                                                                  std::uint64_t cap_bytes,
                                                                  std::uint64_t part_bytes) {
  constexpr std::size_t none = static_cast<std::size_t>(-1);
  std::vector<std::vector<bucket_piece>> out;
  std::vector<std::size_t> open_bucket;  // per dtype seen: index into out of its open bucket (none: closed)
  std::vector<decltype(dtype_of(std::size_t{0}))> dtypes;
  std::vector<std::uint64_t> filled;
  for (std::size_t k = slots; k-- > 0;) {
    const auto d = dtype_of(k);
    std::size_t j = 0;
    while (j < dtypes.size() && !(dtypes[j] == d)) ++j;
    if (j == dtypes.size()) {
      dtypes.push_back(d);
      open_bucket.push_back(none);
      filled.push_back(0);
    }
    const std::uint64_t b = bytes_of(k);
    const std::uint64_t n = elems_of(k);
    if (cap_bytes != 0 && part_bytes != 0 && b > part_bytes && n > 1) {
      const std::uint64_t pieces = std::min<std::uint64_t>(n, (b + part_bytes - 1) / part_bytes);
      for (std::uint64_t q = 0; q < pieces; ++q) {
        const std::uint64_t lo = n * q / pieces, hi = n * (q + 1) / pieces;
        out.push_back({bucket_piece{k, lo, hi - lo}});
      }
      open_bucket[j] = none;  // the dtype's next slot opens a bucket after the pieces
      filled[j] = 0;
      continue;
    }
    if (open_bucket[j] == none || (cap_bytes != 0 && filled[j] != 0 && filled[j] + b > cap_bytes)) {
      open_bucket[j] = out.size();
      filled[j] = 0;
      out.emplace_back();
    }
    out[open_bucket[j]].push_back(bucket_piece{k, 0, n});
    filled[j] += b;
  }
  return out;
}

// Buckets without partitioning (plan_buckets with part 0): per bucket, its
// slot indices in bucket order.
template <class DtypeOf, class BytesOf>
[[nodiscard]] std::vector<std::vector<std::size_t>> partition(std::size_t slots, DtypeOf dtype_of, BytesOf bytes_of,
                                                              std::uint64_t cap_bytes) {
  const auto plan = plan_buckets(slots, dtype_of, bytes_of, [](std::size_t) { return std::uint64_t{0}; },
                                 cap_bytes, 0);
  std::vector<std::vector<std::size_t>> out(plan.size());
  for (std::size_t i = 0; i < plan.size(); ++i)
    for (const auto& piece : plan[i]) out[i].push_back(piece.slot);
  return out;
}

// The partition size (plan_buckets' part_bytes) of `part_mb` MiB: a
// parameter larger than it is cut across buckets. Default 4 MiB, BytePS's
// partition size: on the overlap benchmark's MLP (docs/perf/torch.md) it
// cuts the 8 MiB first layer in two and the 16 MiB ones in four, 13
// buckets, inside ashl-run's 16 ports per server; a smaller size would need
// more buckets (each one a ps::worker and ps::server and a port) than the
// block holds. infinity: no partitioning (0). 0, negative or NaN: refused
// by the adapters (valid_partition_mb) before this is called.
inline constexpr double default_partition_mb = 4.0;

[[nodiscard]] inline bool valid_partition_mb(double part_mb) noexcept { return part_mb > 0.0; }

[[nodiscard]] inline std::uint64_t partition_bytes(double part_mb) noexcept {
  constexpr double mib = 1 << 20;
  if (!valid_partition_mb(part_mb) || std::isinf(part_mb) || part_mb * mib >= 1.8e19) return 0;
  const auto b = static_cast<std::uint64_t>(part_mb * mib);
  return b == 0 ? 1 : b;
}

// The bucket cap in bytes for a model of `model_bytes` (the parameters that
// own a slot, all dtypes), the rule of ashl.torch.bucket_cap_bytes:
// nullopt ("auto", the default) is min(25 MiB, max(1 MiB, model_bytes / 4))
// (DDP's 25 MiB for a large model, about four buckets for a smaller one;
// docs/perf/torch.md, "Bucket size"); a number is that many MiB; 0 (or
// less, refused by the adapters) one bucket per dtype and device.
inline constexpr double default_bucket_cap_mb = 25.0;
inline constexpr double min_bucket_cap_mb = 1.0;
inline constexpr std::uint64_t min_buckets = 4;

[[nodiscard]] inline std::uint64_t bucket_cap_bytes(std::uint64_t model_bytes,
                                                    std::optional<double> cap_mb = std::nullopt) noexcept {
  constexpr double mib = 1 << 20;
  if (!cap_mb) {
    const double quarter = static_cast<double>(model_bytes) / static_cast<double>(min_buckets);
    const double cap = quarter < min_bucket_cap_mb * mib ? min_bucket_cap_mb * mib : quarter;
    return static_cast<std::uint64_t>(cap < default_bucket_cap_mb * mib ? cap : default_bucket_cap_mb * mib);
  }
  if (!(*cap_mb > 0.0)) return 0;
  return static_cast<std::uint64_t>(*cap_mb * mib);
}

// Where bucket `bucket`'s servers listen, given the job's server addresses
// (bucket 0's): in-process nodes "<node>/b<bucket>"; "host:port" addresses
// at port + bucket * addresses.size(), so the contiguous ports ashl-run
// gives the servers stay disjoint (ashl.torch.bucket_addresses, the
// servers' side: one ps::server per bucket; docs/torch.md). nullopt: an
// address (bucket > 0, not inproc) has no decimal port after its last ':'.
[[nodiscard]] inline std::optional<std::vector<std::string>> bucket_addresses(
    const std::vector<std::string>& addresses, std::size_t bucket, bool inproc) {
  if (bucket == 0) return addresses;
  std::vector<std::string> out;
  out.reserve(addresses.size());
  for (const auto& a : addresses) {
    if (inproc) {
      out.push_back(a + "/b" + std::to_string(bucket));
      continue;
    }
    const auto colon = a.rfind(':');
    if (colon == std::string::npos || colon + 1 == a.size()) return std::nullopt;
    std::uint64_t port = 0;
    for (std::size_t i = colon + 1; i < a.size(); ++i) {
      if (a[i] < '0' || a[i] > '9' || port > 65535) return std::nullopt;
      port = port * 10 + static_cast<std::uint64_t>(a[i] - '0');
    }
    out.push_back(a.substr(0, colon + 1) + std::to_string(port + bucket * addresses.size()));
  }
  return out;
}

}  // namespace adapt
ASHL_NAMESPACE_END
