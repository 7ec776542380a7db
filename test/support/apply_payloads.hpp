// test/support/apply_payloads.hpp — the updates and payloads the server_core
// apply tests feed (apply_threads.cpp, apply_batch.cpp).
//
//   float g = apply_payloads::value(worker, sequence, i);   // a distinct value per (worker, commit, element)
//   auto bytes = apply_payloads::encode(codec_id::bf16, g);  // identity, fp16, bf16, top-k 5 %, random-k 500
//   auto c = apply_payloads::make_core(sync::asp{{.workers = 3}}, opt, n, 3, threads);  // c.core, c.pool
#pragma once

#include <ashl/rules/apply_pool.hpp>
#include <ashl/rules/server_core.hpp>

#include <boost/test/unit_test.hpp>

#include <memory>
#include <optional>

#include <ashl/compress/cast.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/core/dtype.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace apply_payloads {

// Values in [-1, 1] with low bits that differ by element, so any change in
// the order or grouping of the additions shows in the result's bits.
inline float value(std::uint32_t w, std::uint64_t seq, std::size_t i) {
  const std::uint64_t h = (i * 2654435761u) ^ (seq * 40503u) ^ (std::uint64_t{w} * 977u);
  return static_cast<float>(static_cast<int>(h % 2001) - 1000) * 1e-3f + 1e-7f * static_cast<float>(i % 7);
}

inline std::vector<std::byte> encode(ashl::codec_id codec, const std::vector<float>& x) {
  auto run = [&](const auto& c) {
    std::vector<std::byte> b(c.max_encoded_bytes(x.size(), ashl::dtype::f32));
    b.resize(c.encode(ashl::host_view<const float>(x.data(), x.size()), b, {}).value());
    return b;
  };
  switch (codec) {
    case ashl::codec_id::identity: return run(ashl::compress::identity{});
    case ashl::codec_id::fp16: return run(ashl::compress::fp16{});
    case ashl::codec_id::bf16: return run(ashl::compress::bf16{});
    case ashl::codec_id::topk: return run(ashl::compress::topk{0.05});
    default: return run(ashl::compress::randomk(ashl::compress::randomk_options{.count = 500}));
  }
}

// A core of n elements (initial values value(9, 0, i)) for `workers`
// workers, applying with `threads` threads (a pool when > 1, kept beside it).
template <class Policy>
struct core_with_pool {
  std::unique_ptr<ashl::ps::apply_pool> pool;
  std::optional<ashl::ps::server_core<Policy>> core;
};
template <class Policy>
core_with_pool<Policy> make_core(Policy policy, const ashl::ps::optimizer_params& opt, std::size_t n,
                                 std::uint32_t workers, unsigned threads) {
  core_with_pool<Policy> c;
  if (threads > 1) {
    auto made = ashl::ps::apply_pool::create(threads);
    BOOST_REQUIRE(made.has_value());
    c.pool = std::move(*made);
  }
  std::vector<float> w0(n);
  for (std::size_t i = 0; i < n; ++i) w0[i] = value(9, 0, i);
  auto made = ashl::ps::server_core<Policy>::create(
      {.layout = *ashl::ps::shard_layout::even(n, 1), .workers = workers, .optimizer = opt}, std::move(policy), w0);
  BOOST_REQUIRE(made.has_value());
  c.core.emplace(std::move(*made));
  if (c.pool) c.core->use_apply_pool(c.pool.get());
  return c;
}

}  // namespace apply_payloads
