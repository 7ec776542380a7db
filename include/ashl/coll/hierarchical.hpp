// ashl/coll/hierarchical.hpp — hierarchical aggregation (BytePS, HPH; issue
// 14 item 5): the ranks of one host reduce-scatter inside the host, each
// local rank moves its slice across hosts (to a parameter server under the
// server's policy: ps/hierarchical_upper.hpp; or any other upper level), and
// the host all-gathers the slices back.
//
//   auto g = ashl::coll::local_group_from_env();               // ASHL_LOCAL_RANK, ASHL_LOCAL_SIZE
//   auto local = ashl::coll::mpi::split(MPI_COMM_WORLD, world_rank / g->size, g->rank);
//   auto slices = ashl::coll::even_slices(n, g->size);        // or shard_counts(n, weights)
//   auto up = ashl::ps::hierarchical_upper<ashl::transport::ucx>::create(...slice (*slices)[g->rank]...);
//   ashl::coll::hierarchical<ashl::coll::mpi, decltype(*up)&> h(*local, *slices, *up);
//   if (h.iteration_done()) ASHL_TRY(h.step(delta, params));   // params = what the servers hold after this commit
//
// step(update, params): (1) reduce-scatter (sum) of the local ranks'
// updates, so local rank j holds the host's sum of slice j, scaled by
// `local_scale` (1/L by default: the host commits the mean of its ranks);
// (2) the upper level takes that slice and makes its own slice of the
// parameters current (push to the server and pull back); (3) all-gather of
// the upper level's parameter slices into `params` on every local rank. Only
// 1/L of the vector leaves each rank, and each local rank talks to the
// other hosts in parallel: the point of the hierarchy.
//
// Groups: from the launcher (ASHL_LOCAL_RANK / ASHL_LOCAL_SIZE, set by
// ashl-run or the user's launcher; a host's local ranks are consecutive
// world ranks), or from a measured bandwidth matrix (groups_from_bandwidth:
// ranks joined by links at least `fraction` of the fastest link share a
// group, transitively), for clusters where host names do not say which
// ranks are close. docs/coll.md "Hierarchical aggregation".
#pragma once

#include <ashl/config.hpp>
#include <ashl/coll/concepts.hpp>
#include <ashl/core/status.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdlib>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace coll {

struct local_group {
  int rank = 0;  // ASHL_LOCAL_RANK
  int size = 1;  // ASHL_LOCAL_SIZE
};

namespace detail {
inline result<int> env_int(const char* name, const char* value) {
  if (value == nullptr) return make_error(errc::not_found, name, "unset", "set by ashl-run or the launcher");
  const std::string_view s(value);
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size()) return invalid_argument(name, s, "must be an integer");
  return v;
}
}  // namespace detail

// Reads the local group from the values given (the environment's by default).
inline result<local_group> local_group_from_env(const char* rank_value = std::getenv("ASHL_LOCAL_RANK"),
                                                const char* size_value = std::getenv("ASHL_LOCAL_SIZE")) {
  auto r = detail::env_int("ASHL_LOCAL_RANK", rank_value);
  if (!r) return r.error();
  auto s = detail::env_int("ASHL_LOCAL_SIZE", size_value);
  if (!s) return s.error();
  if (*s < 1) return invalid_argument("ASHL_LOCAL_SIZE", *s, "must be >= 1");
  if (*r < 0 || *r >= *s) return out_of_range("ASHL_LOCAL_RANK", *r, "must be in [0, ASHL_LOCAL_SIZE)");
  return local_group{*r, *s};
}

// Group of each of m ranks from an m×m bandwidth matrix (row-major, bytes
// per second; bw[i·m + j] from i to j; the diagonal is ignored): i and j are
// joined when both directions reach `fraction` (0, 1] of the largest
// off-diagonal entry; groups are the connected components, numbered in the
// order of their lowest rank.
inline result<std::vector<int>> groups_from_bandwidth(std::span<const double> bw, std::size_t m, double fraction) {
  if (bw.size() != m * m) return invalid_argument("groups.bandwidth.size", bw.size(), "must be m * m");
  if (!(fraction > 0.0 && fraction <= 1.0)) return invalid_argument("groups.fraction", fraction, "must be in (0, 1]");
  double top = 0.0;
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < m; ++j) {
      const double b = bw[i * m + j];
      if (i == j) continue;
      if (!(b >= 0.0) || !std::isfinite(b))
        return invalid_argument("groups.bandwidth[" + std::to_string(i) + "][" + std::to_string(j) + "]", b,
                                "must be finite and >= 0");
      top = std::max(top, b);
    }
  std::vector<int> group(m, -1);
  int next = 0;
  for (std::size_t s = 0; s < m; ++s) {
    if (group[s] >= 0) continue;
    group[s] = next;
    std::vector<std::size_t> stack = {s};
    while (!stack.empty()) {
      const std::size_t i = stack.back();
      stack.pop_back();
      for (std::size_t j = 0; j < m; ++j)
        if (group[j] < 0 && top > 0.0 && bw[i * m + j] >= fraction * top && bw[j * m + i] >= fraction * top) {
          group[j] = next;
          stack.push_back(j);
        }
    }
    ++next;
  }
  return group;
}

// n elements in `parts` contiguous slices, the first n % parts one larger.
inline std::vector<std::size_t> even_slices(std::size_t n, std::size_t parts) {
  ASHL_ASSERT(parts >= 1, "even_slices: parts must be >= 1");
  std::vector<std::size_t> c(parts, n / parts);
  for (std::size_t i = 0; i < n % parts; ++i) ++c[i];
  return c;
}

// The level above the host: given this local rank's slice of the host's
// update, make parameters() this slice of the current parameters.
template <class U>
concept upper_level = requires(U& u, std::span<const float> slice) {
  { u.exchange(slice) } -> std::same_as<status>;
  { u.parameters() } -> std::convertible_to<std::span<const float>>;
};

template <host_collective Local, class Upper>
  requires upper_level<std::remove_reference_t<Upper>>
class hierarchical {
 public:
  hierarchical(Local& local, std::vector<std::size_t> slices, Upper upper, float local_scale = 0.0f)
      : local_(local), slices_(std::move(slices)), upper_(std::forward<Upper>(upper)),
        scale_(local_scale != 0.0f ? local_scale : 1.0f / static_cast<float>(local.size())) {
    ASHL_ASSERT(slices_.size() == static_cast<std::size_t>(local.size()), "hierarchical: one slice per local rank");
  }

  [[nodiscard]] std::span<const std::size_t> slices() const noexcept { return slices_; }
  [[nodiscard]] std::size_t elements() const noexcept {
    return std::accumulate(slices_.begin(), slices_.end(), std::size_t{0});
  }
  std::remove_reference_t<Upper>& upper() noexcept { return upper_; }

  // One local iteration is done: true when step() should run now. An upper
  // level with a plan (ps::hierarchical_upper: the servers' H or commit interval) decides;
  // one without exchanges every iteration.
  bool iteration_done() {
    if constexpr (requires { upper_.iteration_done(); }) return upper_.iteration_done();
    else return true;
  }

  status step(std::span<const float> update, std::span<float> params) {
    const std::size_t n = elements();
    if (update.size() != n) return invalid_argument("hierarchical.update.size", update.size(), "must equal the slices' sum");
    if (params.size() != n) return invalid_argument("hierarchical.params.size", params.size(), "must equal the slices' sum");
    const auto me = static_cast<std::size_t>(local_.rank());
    slice_.resize(slices_[me]);
    ASHL_TRY(blocking(local_, local_.reduce_scatter(in_view<>(update.data(), n, dtype::f32),
                                                    out_view<>(slice_.data(), slice_.size(), dtype::f32), slices_,
                                                    reduce_op::sum, local_.default_stream())));
    if (scale_ != 1.0f)
      for (auto& v : slice_) v *= scale_;
    ASHL_TRY(upper_.exchange(slice_));
    const std::span<const float> mine = upper_.parameters();
    if (mine.size() != slices_[me])
      return invalid_argument("hierarchical.upper.parameters.size", mine.size(), "must equal this rank's slice");
    return blocking(local_, local_.all_gather(in_view<>(mine.data(), mine.size(), dtype::f32),
                                              out_view<>(params.data(), n, dtype::f32), slices_,
                                              local_.default_stream()));
  }

 private:
  Local& local_;
  std::vector<std::size_t> slices_;
  Upper upper_;
  float scale_;
  std::vector<float> slice_;
};

}  // namespace coll
ASHL_NAMESPACE_END
