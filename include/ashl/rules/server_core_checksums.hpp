// ashl/rules/server_core_checksums.hpp — the versions pull replies read and
// their CRC-32Cs: pin_parameters()/unpin_parameters(), checksum_in_parts()
// (the driver's ranges, each with its own CRC) and the CRC cursor that every
// pass over the parameters feeds, cut at the apply pool's parts and the
// ranges, so a version's CRC costs no read pass of its own.
//
//   #include <ashl/rules/server_core.hpp>   // includes this
//   auto pinned = core.pin_parameters();    // values, version, crc, range_crcs
//   send(pinned.values, pinned.crc);  ...  core.unpin_parameters(pinned.version);
//
// Definitions of server_core's members, out of the class so that
// rules/server_core.hpp reads as the rules' outline; docs/ps.md.
#pragma once

#include <ashl/rules/server_core.hpp>

ASHL_NAMESPACE_BEGIN
namespace ps {

template <sync::consistency_policy Policy>
inline status server_core<Policy>::checksum_in_parts(std::uint32_t k) {
  const std::size_t n = w_.size();
  if (k >= 2) {
    const std::size_t per = k > n ? 0 : (n + k - 1) / k;
    if (per == 0 || (n + per - 1) / per != k)
      return invalid_argument("server_core.checksum_parts", k,
                              "leaves an empty range of the " + std::to_string(n) + " parameters");
  }
  checksum_parts_ = k < 2 ? 1 : k;
  range_crc_.assign(checksum_parts_, 0u);
  w_crc_valid_ = false;
  ++w_changes_;  // a speculation's CRCs were cut at the old ranges
  return {};
}

template <sync::consistency_policy Policy>
inline auto server_core<Policy>::pin_parameters(bool with_crc) -> pinned_parameters {
  apply_pending();
  if (!w_crc_valid_ && with_crc) {
    const float* src = w_.data();
    const std::size_t n = w_.size();
    const unsigned k = for_parts(n, [&](unsigned part, std::size_t lo, std::size_t hi) noexcept {
      crc_cursor c = crc_open(part, lo, n);
      crc_feed(c, src, lo, hi);
      crc_close(c, hi);
    });
    finish_crcs(k);
    ++checksum_passes_;
  }
  const std::uint64_t v = version();
  const bool first = !w_pinned_before_ || w_pin_version_ != v;
  if (w_readers_ == 0) w_pin_version_ = v;
  ASHL_ASSERT(w_pin_version_ == v, "server_core: the pinned parameters changed in place");
  w_pinned_before_ = true;
  ++w_readers_;
  const std::span<const std::uint32_t> ranges = checksum_parts_ >= 2 ? std::span<const std::uint32_t>(range_crc_)
                                                                      : std::span<const std::uint32_t>{};
  return {w_, v, w_crc_, first, ranges};
}

template <sync::consistency_policy Policy>
inline void server_core<Policy>::unpin_parameters(std::uint64_t version) {
  if (w_readers_ > 0 && w_pin_version_ == version) {
    --w_readers_;
    return;
  }
  for (version_buffer& b : held_)
    if (b.readers > 0 && b.version == version) {
      --b.readers;
      return;
    }
  ASHL_ASSERT(false, "server_core: unpin of a version not pinned");
}

template <sync::consistency_policy Policy>
inline auto server_core<Policy>::crc_open(unsigned part, std::size_t lo, std::size_t n) noexcept -> crc_cursor {
  const std::size_t per = range_elements(n);
  head_len_[part] = 0;
  return {part, lo, std::min(n, (lo / per + 1) * per), per, n, 0};
}

// Appends elements [from, to) of `data` (consecutive calls, in order).
template <sync::consistency_policy Policy>
inline void server_core<Policy>::crc_feed(crc_cursor& c, const float* data, std::size_t from, std::size_t to) noexcept {
  while (from < to) {
    const std::size_t b = std::min(to, c.end);
    c.crc = wire::crc32c(std::as_bytes(std::span<const float>(data + from, b - from)), c.crc);
    from = b;
    if (b == c.end) crc_close(c, b);
  }
}

// Ends the open segment at `at` (the pool part's end, or a range's).
template <sync::consistency_policy Policy>
inline void server_core<Policy>::crc_close(crc_cursor& c, std::size_t at) noexcept {
  if (at > c.seg) {
    const std::size_t j = c.seg / c.per;
    if (c.seg == j * c.per) {
      range_crc_[j] = c.crc;
    } else {
      head_crc_[c.part] = c.crc;
      head_len_[c.part] = at - c.seg;
      head_range_[c.part] = static_cast<std::uint32_t>(j);
    }
  }
  c.seg = at;
  c.end = std::min(c.n, at + c.per);
  c.crc = 0;
}

// Elements per checksum range: ceil(n / k) (n without ranges).
template <sync::consistency_policy Policy>
inline std::size_t server_core<Policy>::range_elements(std::size_t n) const noexcept {
  const std::size_t k = checksum_parts_;
  return n == 0 ? 1 : (n + k - 1) / k;
}

// After a pass of `parts` pool parts: the heads appended to their ranges,
// the version's CRC = the ranges' combined in order.
template <sync::consistency_policy Policy>
inline void server_core<Policy>::finish_crcs(unsigned parts) noexcept {
  if (range_crc_.empty()) range_crc_.assign(1, 0u);  // a core never given checksum_in_parts
  for (unsigned q = 1; q < parts; ++q)
    if (head_len_[q] > 0) {
      std::uint32_t& r = range_crc_[head_range_[q]];
      r = wire::crc32c_combine(r, head_crc_[q], head_len_[q] * sizeof(float));
    }
  const std::size_t n = w_.size();
  const std::size_t per = range_elements(n);
  std::uint32_t crc = n == 0 ? 0u : range_crc_[0];
  if (checksum_parts_ >= 2) {
    const wire::crc32c_combiner after_range(per * sizeof(float));
    const std::uint32_t last = checksum_parts_ - 1;
    for (std::uint32_t j = 1; j < last; ++j) crc = after_range(crc, range_crc_[j]);
    crc = wire::crc32c_combine(crc, range_crc_[last], (n - std::size_t{last} * per) * sizeof(float));
  }
  w_crc_ = crc;
  w_crc_valid_ = true;
}

}  // namespace ps
ASHL_NAMESPACE_END
