// ashl_bench_server_core — the cost of ps::server_core (docs/perf/server-core.md).
//
//   ashl_bench_server_core                 # every policy at 9 and 1,024 workers; apply path at 2^20 and 2^24
//   ashl_bench_server_core --quick         # fewer events and reps, apply path at 2^20 only
//   ashl_bench_server_core --reps 15 --json-only
//   ashl_bench_server_core --part apply --reps 31   # one part only (policy | apply)
//   ashl_bench_server_core --part apply --apply-threads 2   # 1 vs 2 apply threads at 1, 16, 64 MiB
//   ashl_bench_server_core --part batch --reps 15   # k commits one at a time vs in one batched pass
//   ashl_bench_server_core --part landed --reps 15  # a commit in parts added as they land vs applied whole
//
// Two parts, one thread, every figure the median of --reps timed runs after
// one warm-up run; a case and its baselines run interleaved (case, baseline,
// case, baseline, ...), so load drift on a shared machine reaches both:
//
// 1. Policy path: events per second through server_core<sync::any_policy>
//    built by ps::make_policy(name) for every policy name, with the timing-only
//    layout (0 elements), so only validation, the exactly-once table, the
//    policy and the actions are measured. A fixed script: workers whose pull
//    was answered commit again (the pull rides with the commit) and report
//    compute and push measurements; every 4·M commits a falling loss is
//    reported. Baseline: the same script driving the bare policy (its own
//    outcome sink, no core), so the ratio baseline/core is the core's share.
// 2. Apply path: one commit of a dense f32 (identity) payload and of a top-k
//    1 % payload decoded into a shard of n elements through server_core
//    (ASP, model deltas: validation, the policy, decode_add into the
//    parameters), against std::memcpy of the same payload bytes into a
//    buffer. Ratio = memcpy time / apply time (goal >= 0.5). Also
//    compress::decode_add alone into a shard of the same size (what the core
//    adds on top of the codec), and sgd with momentum (decode into the
//    accumulator, then the fused step), for reference. "unchecked" is the
//    dense case with allow_non_finite (no NaN/infinity scan): the scan's
//    cost is the difference (ps::server's receive path checks the values in
//    its CRC pass and tells the core so: "unchecked" is the server's apply).
//    "+crc" cases carry a pull (the new version's CRC is computed in the
//    apply's pass, chunk by chunk); "+crc N parts" with the CRCs of a pull
//    reply's parts of N bytes too (server_core::checksum_in_parts),
//    and their decode_add column is decode_add then crc32c of the
//    shard (two passes).
//    --apply-threads N: shards of 1, 16 and 64 MiB (2^18,
//    2^22, 2^24 elements), every case applied by a core without a pool and
//    by one with a ps::apply_pool of N threads, interleaved with the memcpy
//    and the decode_add in one run. Rows say apply_threads.
// 3. Batched applies (--part batch; server_params.apply_batch):
//    k dense identity model-delta commits (k workers, ASP, values checked by
//    the driver) into a shard of 1 and 64 MiB, applied one at a time (k
//    passes over the shard) and batched (defer_dense_applies(k), then one
//    apply_pending() pass), interleaved with the baseline: memcpy of the k
//    payloads (each byte of them moved once, what no apply can beat). Ratio
//    = memcpy time / apply time; the batched row's "one at a time" column
//    is the speedup. The two cores' parameters are compared bit for bit.
// 4. Applies as parts land (--part landed;
//    server_params.apply_parts_as_they_land): one dense identity model-delta
//    commit into a shard of 1 and 64 MiB, applied whole (one apply_dense
//    pass, what the server does at a commit's last part without it) and in
//    P parts (256 KiB a part at 1 MiB, 1 MiB at 64 MiB) whose first P - 1
//    are speculated as they land, then commit(): the rows time what is left
//    after the last part landed (the last part's add and the swap) and the
//    speculated parts' adds, against a memcpy of the payload, with the
//    whole apply in the last column; without and with a pull riding (+crc:
//    the new version's CRC in the same passes). The parameters are
//    compared bit for bit with the whole applies'.
//
// Output: a human table, then one JSON object per case (machine, date,
// sizes, median, baseline, ratio).
#include "support.hpp"

#include <ashl/compress/identity.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/rules/server_core.hpp>
#include <ashl/sync/any_policy.hpp>
#include <ashl/wire/crc32c.hpp>
#include <ashl/wire/message.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace {

using bench::machine;
using bench::median;
using bench::today;

namespace ps = ashl::ps;
namespace sync = ashl::sync;
using clock_type = std::chrono::steady_clock;

struct options {
  int reps = 9;
  bool quick = false;
  bool json_only = false;
  std::string part = "all";  // all | policy | apply
  unsigned apply_threads = 1;  // > 1: the apply path runs 1 and this many threads side by side
};

using bench::time_interleaved;

struct row {
  std::string part, name;
  std::uint64_t n = 0, workers = 0, events = 0, bytes = 0;
  double median_s = 0, baseline_s = 0;
  std::string baseline;
  double decode_s = 0;  // apply: compress::decode_add alone into the same shard (+crc cases: and crc32c of it)
  unsigned threads = 1;  // apply: the apply pool's threads (1: none)
};

// ------------------------------------------------------------ policy path

ps::policy_params params_for(std::uint32_t m) {
  ps::policy_params pp;
  pp.workers = m;
  pp.profile_iterations = 3;  // ASHL leaves profiling early in the script
  pp.profile_trim = 0;
  pp.switch_loss = 0.5;
  pp.period = 5.0;
  pp.sync_every_iterations = 4;
  return pp;
}

// A ring of workers ready to commit (their pull was answered).
struct ready_ring {
  std::vector<sync::worker_id> q;
  std::size_t head = 0, size = 0;
  explicit ready_ring(std::size_t m) : q(m) {}
  void push(sync::worker_id w) {
    q[(head + size) % q.size()] = w;
    ++size;
  }
  sync::worker_id pop() {
    const sync::worker_id w = q[head];
    head = (head + 1) % q.size();
    --size;
    return w;
  }
};

// Drives `commits` commits through the core; returns the events it took.
std::uint64_t drive_core(ps::server_core<sync::any_policy>& core, std::uint32_t m, std::uint64_t commits,
                         std::vector<std::uint64_t>& seq, double& now) {
  ps::server_actions out(m);
  ready_ring ready(m);
  for (sync::worker_id w = 0; w < m; ++w) ready.push(w);
  std::uint64_t events = 0;
  double loss = 2.0;
  for (std::uint64_t k = 0; k < commits; ++k) {
    if (ready.size == 0) {
      core.drain(out);
      ++events;
      for (auto w : out.pull_replies()) ready.push(w);
      out.clear();
      if (ready.size == 0) break;
    }
    const sync::worker_id w = ready.pop();
    now += 1e-4;
    core.measurement({w, ashl::measurement_kind::compute, 0.01 * (1 + w % 3), 32, now}, out);
    core.measurement({w, ashl::measurement_kind::push, 0.002, 1e6, now}, out);
    ps::commit_in c{.worker = w, .sequence = ++seq[w], .clock = seq[w], .samples = 32, .bytes = 1'000'000,
                    .pull = true};
    core.commit(c, now, out);
    events += 3;
    if ((k + 1) % (4 * m) == 0) {
      loss *= 0.9;
      core.metric(ashl::metric_id::loss, loss, now, out);
      ++events;
    }
    for (auto r : out.pull_replies()) ready.push(r);
    out.clear();
  }
  return events;
}

// The same script on the bare policy.
std::uint64_t drive_bare(sync::any_policy& p, std::uint32_t m, std::uint64_t commits, std::vector<std::uint64_t>& seq,
                         double& now) {
  sync::outcome_sink out(m);
  ready_ring ready(m);
  for (sync::worker_id w = 0; w < m; ++w) ready.push(w);
  std::vector<std::uint8_t> held(m, 0);
  std::uint64_t events = 0;
  double loss = 2.0;
  auto take = [&] {
    for (auto r : out.released())
      if (held[r]) {
        held[r] = 0;
        ready.push(r);
      }
    out.clear();
  };
  for (std::uint64_t k = 0; k < commits; ++k) {
    if (ready.size == 0) {
      p.drain(out);
      ++events;
      take();
      if (ready.size == 0) break;
    }
    const sync::worker_id w = ready.pop();
    now += 1e-4;
    p.on_measurement({w, ashl::measurement_kind::compute, 0.01 * (1 + w % 3), 32, now}, out);
    take();
    p.on_measurement({w, ashl::measurement_kind::push, 0.002, 1e6, now}, out);
    take();
    ++seq[w];
    (void)p.on_commit({w, seq[w], seq[w], now, 1'000'000, 32}, out);
    take();
    if (p.on_pull({w, now}, out) == sync::pull_action::serve) ready.push(w);
    else held[w] = 1;
    take();
    events += 3;
    if ((k + 1) % (4 * m) == 0) {
      loss *= 0.9;
      p.on_metric({ashl::metric_id::loss, loss, now}, out);
      take();
      ++events;
    }
  }
  return events;
}

void policy_path(const options& o, std::vector<row>& rows) {
  for (std::uint32_t m : {9u, 1024u}) {
    const std::uint64_t commits = (o.quick ? 20'000u : 200'000u);
    for (const auto& d : ps::policies) {
      auto pol = ps::make_policy(d.name, params_for(m));
      if (!pol) {
        std::fprintf(stderr, "make_policy(%s): %s\n", std::string(d.name).c_str(), pol.error().message().c_str());
        continue;
      }
      std::uint64_t events = 0, bare_events = 0;
      const auto t = time_interleaved(
          o.reps,
          [&] {
            auto core = ps::server_core<sync::any_policy>::create({.workers = m}, *pol).value();
            std::vector<std::uint64_t> seq(m, 0);
            double now = 0.0;
            events = drive_core(core, m, commits, seq, now);
          },
          [&] {
            sync::any_policy p = *pol;
            std::vector<std::uint64_t> seq(m, 0);
            double now = 0.0;
            bare_events = drive_bare(p, m, commits, seq, now);
          });
      const double core_s = t[0], bare_s = t[1];
      row r{"policy", std::string(d.name), 0, m, events, 0, core_s, bare_s, "bare policy, same script"};
      if (bare_events != events) r.baseline = "bare policy, same script (" + std::to_string(bare_events) + " events)";
      rows.push_back(r);
    }
  }
}

// ------------------------------------------------------------- apply path

// One commit applied by a core without a pool and, with --apply-threads N
// (N > 1), by one with a ps::apply_pool of N threads; each case interleaved
// in one run with a memcpy of the payload and the bare decode_add (for
// "+crc" cases decode_add and then crc32c of the shard: the same work in
// two passes over memory, which the apply does in one).
void apply_path(const options& o, std::vector<row>& rows) {
  std::unique_ptr<ps::apply_pool> pool;
  if (o.apply_threads > 1) {
    auto made = ps::apply_pool::create(o.apply_threads, "--apply-threads");
    if (!made) {
      std::fprintf(stderr, "ashl_bench_server_core: %s\n", made.error().message().c_str());
      std::exit(2);
    }
    pool = std::move(*made);
  }
  std::vector<std::size_t> sizes{std::size_t{1} << 20, std::size_t{1} << 24};
  if (pool) sizes = {std::size_t{1} << 18, std::size_t{1} << 22, std::size_t{1} << 24};
  if (o.quick) sizes.pop_back();
  for (std::size_t n : sizes) {
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = std::sin(0.001f * static_cast<float>(i)) * 1e-3f;
    std::vector<std::byte> dense(4 * n);
    (void)ashl::compress::identity{}.encode(ashl::host_view<const float>(g.data(), n), dense, {});
    ashl::compress::topk tk(0.01);
    std::vector<std::byte> sparse(tk.max_encoded_bytes(n, ashl::dtype::f32));
    sparse.resize(tk.encode(ashl::host_view<const float>(g.data(), n), sparse, {}).value());
    std::vector<std::byte> sink(dense.size());
    const auto layout = ps::shard_layout::even(n, 1).value();
    struct which {
      const char* name;
      const std::vector<std::byte>* payload;
      ashl::codec_id codec;
      ps::optimizer_params opt;
      bool allow_non_finite = false;  // true: without the value check (its cost is the difference)
      bool pull = false;              // the new version's CRC in the apply's pass (a reply reads it)
      std::uint64_t part_bytes = 0;   // and, with it, the CRCs of a reply's parts of this size
    };
    const ps::optimizer_params sgd{.mode = ps::optimizer_params::kind::sgd, .lr = 0.01, .momentum = 0.9};
    for (const which& c : {which{"identity model_delta", &dense, ashl::codec_id::identity, {}},
                           which{"identity model_delta unchecked", &dense, ashl::codec_id::identity, {}, true},
                           which{"identity model_delta unchecked+crc", &dense, ashl::codec_id::identity, {}, true,
                                 true},
                           which{"identity model_delta unchecked+crc 1M parts", &dense, ashl::codec_id::identity, {},
                                 true, true, std::uint64_t{1} << 20},
                           which{"identity model_delta unchecked+crc 64K parts", &dense, ashl::codec_id::identity, {},
                                 true, true, std::uint64_t{64} << 10},
                           which{"topk1% model_delta", &sparse, ashl::codec_id::topk, {}},
                           which{"identity sgd+momentum", &dense, ashl::codec_id::identity, sgd},
                           which{"identity sgd+momentum+crc", &dense, ashl::codec_id::identity, sgd, false, true},
                           which{"topk1% sgd+momentum", &sparse, ashl::codec_id::topk, sgd}}) {
      auto make = [&] {
        auto core = ps::server_core<sync::asp>::create(
                        {.layout = layout, .workers = 1, .optimizer = c.opt, .allow_non_finite = c.allow_non_finite},
                        sync::asp{{.workers = 1, .scale = 1e-3}})
                        .value();
        const auto st = core.checksum_in_parts(ashl::wire::parts_for(n, sizeof(float), c.part_bytes));
        if (!st.ok()) std::fprintf(stderr, "ashl_bench_server_core: %s\n", st.message().c_str());
        return core;
      };
      auto one = make(), many = make();
      if (pool) many.use_apply_pool(pool.get());
      ps::server_actions out(1);
      std::uint64_t seq_one = 0, seq_many = 0;
      const std::size_t bytes = c.payload->size();
      // Enough commits per timed run to be well above the clock's resolution.
      const int runs = std::min(std::max<int>(1, static_cast<int>((std::size_t{1} << 24) / std::max<std::size_t>(bytes, 1))), 64);
      std::vector<float> shard(n, 0.0f);
      auto commits = [&](ps::server_core<sync::asp>& core, std::uint64_t& seq) {
        for (int k = 0; k < runs; ++k) {
          ps::commit_in ci{.worker = 0, .sequence = ++seq, .bytes = bytes, .codec = c.codec, .element_count = n,
                           .payload = *c.payload, .pull = c.pull};
          core.commit(ci, 0.0, out);
          if (!out.errors().empty()) std::fprintf(stderr, "refused: %s\n", out.errors()[0].text.c_str());
          out.clear();
        }
      };
      auto copy = [&] {
        for (int k = 0; k < runs; ++k) {
          std::memcpy(sink.data(), c.payload->data(), bytes);
          asm volatile("" : : "r"(sink.data()) : "memory");
        }
      };
      std::uint32_t crc_sink = 0;
      auto decode = [&] {
        for (int k = 0; k < runs; ++k) {
          (void)ashl::compress::decode_add(c.codec, *c.payload, {n, ashl::dtype::f32},
                                           ashl::host_view<float>(shard.data(), n), 1e-3f, {});
          if (c.pull) crc_sink ^= ashl::wire::crc32c(std::as_bytes(std::span<const float>(shard)));
        }
      };
      auto apply_one = [&] { commits(one, seq_one); };
      auto apply_many = [&] { commits(many, seq_many); };
      double t_one = 0, t_many = 0, t_copy = 0, t_decode = 0;
      if (pool) {
        const auto t = time_interleaved(o.reps, apply_one, apply_many, copy, decode);
        t_one = t[0], t_many = t[1], t_copy = t[2], t_decode = t[3];
        if (std::memcmp(one.parameters().data(), many.parameters().data(), n * sizeof(float)) != 0)
          std::fprintf(stderr, "ashl_bench_server_core: %s: %u threads differ from 1 (a bug)\n", c.name,
                       o.apply_threads);
      } else {
        const auto t = time_interleaved(o.reps, apply_one, copy, decode);
        t_one = t[0], t_copy = t[1], t_decode = t[2];
      }
      asm volatile("" : : "r"(crc_sink) : "memory");
      const char* baseline = "memcpy of the payload bytes";
      rows.push_back({"apply", c.name, n, 1, 1, bytes, t_one / runs, t_copy / runs, baseline, t_decode / runs, 1});
      if (pool)
        rows.push_back({"apply", c.name, n, 1, 1, bytes, t_many / runs, t_copy / runs, baseline, t_decode / runs,
                        o.apply_threads});
    }
  }
}

// k commits one at a time and in one batched pass (the same bits), against
// a memcpy of the k payloads.
void batch_path(const options& o, std::vector<row>& rows) {
  std::vector<std::size_t> sizes{std::size_t{1} << 18, std::size_t{1} << 24};
  if (o.quick) sizes.pop_back();
  for (std::size_t n : sizes)
    for (std::uint32_t k : {2u, 4u, 8u}) {
      const auto layout = ps::shard_layout::even(n, 1).value();
      std::vector<std::vector<std::byte>> payloads(k, std::vector<std::byte>(4 * n));
      for (std::uint32_t w = 0; w < k; ++w) {
        std::vector<float> g(n);
        for (std::size_t i = 0; i < n; ++i) g[i] = std::sin(0.001f * static_cast<float>(i + 7 * w)) * 1e-3f;
        (void)ashl::compress::identity{}.encode(ashl::host_view<const float>(g.data(), n), payloads[w], {});
      }
      std::vector<std::byte> sink(4 * n);
      auto make = [&](std::uint32_t batch) {
        auto core = ps::server_core<sync::asp>::create({.layout = layout, .workers = k},
                                                       sync::asp{{.workers = k, .scale = 1e-3}})
                        .value();
        core.defer_dense_applies(batch);
        return core;
      };
      auto one = make(1), batched = make(k);
      ps::server_actions out(k);
      std::uint64_t seq_one = 0, seq_batched = 0;
      auto commits = [&](ps::server_core<sync::asp>& core, std::uint64_t& seq) {
        ++seq;
        for (std::uint32_t w = 0; w < k; ++w) {
          core.commit({.worker = w, .sequence = seq, .bytes = payloads[w].size(), .element_count = n,
                       .payload = payloads[w], .values_checked = true, .payload_kept = true},
                      0.0, out);
          if (!out.errors().empty()) std::fprintf(stderr, "refused: %s\n", out.errors()[0].text.c_str());
          out.clear();
        }
        core.apply_pending();
      };
      auto copy = [&] {
        for (std::uint32_t w = 0; w < k; ++w) {
          std::memcpy(sink.data(), payloads[w].data(), payloads[w].size());
          asm volatile("" : : "r"(sink.data()) : "memory");
        }
      };
      const auto t = time_interleaved(o.reps, [&] { commits(one, seq_one); }, [&] { commits(batched, seq_batched); },
                                      copy);
      if (std::memcmp(one.parameters().data(), batched.parameters().data(), n * sizeof(float)) != 0)
        std::fprintf(stderr, "ashl_bench_server_core: batches of %u differ from one at a time (a bug)\n", k);
      if (batched.batched_commits() != std::uint64_t{k} * seq_batched)
        std::fprintf(stderr, "ashl_bench_server_core: %llu of %llu commits batched\n",
                     static_cast<unsigned long long>(batched.batched_commits()),
                     static_cast<unsigned long long>(std::uint64_t{k} * seq_batched));
      const std::uint64_t bytes = std::uint64_t{k} * 4 * n;
      const char* baseline = "memcpy of the k payloads";
      rows.push_back({"batch", std::to_string(k) + " commits one at a time", n, k, k, bytes, t[0], t[2], baseline,
                      t[0], 1});
      rows.push_back({"batch", std::to_string(k) + " commits in one pass", n, k, k, bytes, t[1], t[2], baseline, t[0],
                      1});
    }
}

// One commit applied whole, and in parts added as they land (the first
// P - 1 speculated, then commit()), against a memcpy of its payload.
void landed_path(const options& o, std::vector<row>& rows) {
  std::vector<std::size_t> sizes{std::size_t{1} << 18, std::size_t{1} << 24};
  if (o.quick) sizes.pop_back();
  for (std::size_t n : sizes)
    for (bool pull : {false, true}) {
    const std::uint16_t parts = n >= (std::size_t{1} << 24) ? 64 : 4;
    const auto layout = ps::shard_layout::even(n, 1).value();
    std::vector<std::byte> payload(4 * n), sink(4 * n);
    {
      std::vector<float> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = std::sin(0.001f * static_cast<float>(i)) * 1e-3f;
      (void)ashl::compress::identity{}.encode(ashl::host_view<const float>(g.data(), n), payload, {});
    }
    auto make = [&] {
      return ps::server_core<sync::asp>::create({.layout = layout, .workers = 1},
                                                sync::asp{{.workers = 1, .scale = 1e-3}})
          .value();
    };
    auto whole = make(), landed = make();
    ps::server_actions out(1);
    std::uint64_t seq_whole = 0, seq_landed = 0;
    auto commit_of = [&](std::uint64_t seq) {
      return ps::commit_in{.worker = 0, .sequence = seq, .bytes = payload.size(), .element_count = n,
                           .payload = payload, .pull = pull, .values_checked = true};
    };
    auto apply_whole = [&] {
      whole.commit(commit_of(++seq_whole), 0.0, out);
      out.clear();
    };
    auto speculate = [&] {
      const ps::commit_in c = commit_of(++seq_landed);
      for (std::uint16_t j = 0; j + 1 < parts; ++j) {
        const auto pr = ashl::wire::part_elements(n, parts, j);
        (void)landed.speculate(c, pr.first, pr.first + pr.count);
      }
    };
    auto end = [&] {
      landed.commit(commit_of(seq_landed), 0.0, out);
      out.clear();
    };
    auto copy = [&] {
      std::memcpy(sink.data(), payload.data(), payload.size());
      asm volatile("" : : "r"(sink.data()) : "memory");
    };
    apply_whole();  // warm-up: the landed core learns the weight (1e-3) from its first commit
    speculate();
    end();
    copy();
    std::vector<double> t_whole, t_spec, t_end, t_copy;
    auto timed = [](auto& f, std::vector<double>& into) {
      const auto a = clock_type::now();
      f();
      into.push_back(std::chrono::duration<double>(clock_type::now() - a).count());
    };
    for (int r = 0; r < o.reps; ++r) {
      timed(apply_whole, t_whole);
      timed(speculate, t_spec);
      timed(end, t_end);
      timed(copy, t_copy);
    }
    if (std::memcmp(whole.parameters().data(), landed.parameters().data(), n * sizeof(float)) != 0)
      std::fprintf(stderr, "ashl_bench_server_core: commits added as their parts landed differ from whole (a bug)\n");
    if (landed.applied_as_landed() != static_cast<std::uint64_t>(o.reps))
      std::fprintf(stderr, "ashl_bench_server_core: %llu of %d commits applied as they landed\n",
                   static_cast<unsigned long long>(landed.applied_as_landed()), o.reps);
    const std::uint64_t bytes = payload.size();
    const char* baseline = "memcpy of the payload";
    const double w = median(t_whole), c = median(t_copy);
    const std::string p = std::to_string(parts) + " parts" + (pull ? " +crc" : "") + ": ";
    rows.push_back({"landed", std::string("whole") + (pull ? " +crc" : "") + ": one pass at the last part", n, 1, 1,
                    bytes, w, c, baseline, w, 1});
    rows.push_back({"landed", p + "left after the last part", n, 1, 1, bytes, median(t_end), c, baseline, w, 1});
    rows.push_back({"landed", p + "adds as the first P-1 land", n, 1, 1, bytes, median(t_spec), c, baseline, w, 1});
    }
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    if (bench::common_option(o, argc, argv, i)) continue;
    const std::string a = argv[i];
    if (a == "--part" && i + 1 < argc) {
      o.part = argv[++i];
      if (o.part != "all" && o.part != "policy" && o.part != "apply" && o.part != "batch" && o.part != "landed") {
        std::fprintf(stderr, "ashl_bench_server_core: --part = \"%s\": must be all, policy, apply, batch or landed\n",
                     o.part.c_str());
        return 2;
      }
    } else if (a == "--apply-threads" && i + 1 < argc) {
      const long v = std::atol(argv[++i]);
      if (!ps::apply_pool::check_threads(v < 0 ? 0 : static_cast<std::uint64_t>(v), "--apply-threads")) {
        std::fprintf(stderr, "ashl_bench_server_core: %s\n",
                     ps::apply_pool::check_threads(0, "--apply-threads").message().c_str());
        return 2;
      }
      o.apply_threads = static_cast<unsigned>(v);
    } else {
      std::fprintf(stderr,
                   "usage: ashl_bench_server_core [--quick] [--reps N] [--part all|policy|apply|batch|landed] [--apply-threads N] "
                   "[--json-only]\n");
      return 2;
    }
  }
  const std::string mach = machine(), date = today();
  std::vector<row> rows;
  if (o.part == "all" || o.part == "policy") policy_path(o, rows);
  if (o.part == "all" || o.part == "apply") apply_path(o, rows);
  if (o.part == "all" || o.part == "batch") batch_path(o, rows);
  if (o.part == "all" || o.part == "landed") landed_path(o, rows);
  if (!o.json_only) {
    std::printf("server_core on %s, %s, median of %d\n\n", mach.c_str(), date.c_str(), o.reps);
    std::printf("%-8s %-44s %10s %8s %14s %14s %8s %14s\n", "part", "case", "n",
                o.apply_threads > 1 ? "threads" : "workers",
                "median", "baseline", "ratio", "decode_add");
    for (const auto& r : rows) {
      if (r.part == "policy") {
        std::printf("%-8s %-42s %10s %8llu %10.2f Mev/s %10.2f Mev/s %8.2f\n", r.part.c_str(), r.name.c_str(), "-",
                    static_cast<unsigned long long>(r.workers), r.events / r.median_s * 1e-6,
                    r.events / r.baseline_s * 1e-6, r.baseline_s / r.median_s);
      } else {
        std::printf("%-8s %-44s %10llu %8u %11.1f us %11.1f us %8.2f %11.1f us%s\n", r.part.c_str(), r.name.c_str(),
                    static_cast<unsigned long long>(r.n), r.threads, r.median_s * 1e6, r.baseline_s * 1e6,
                    r.baseline_s / r.median_s, r.decode_s * 1e6,
                    r.part == "batch" ? " (one at a time)" : r.part == "landed" ? " (whole)" : "");
      }
    }
    std::printf("\n");
  }
  for (const auto& r : rows) {
    std::printf(
        "{\"bench\":\"server_core\",\"part\":\"%s\",\"case\":\"%s\",\"machine\":\"%s\",\"date\":\"%s\",\"n\":%llu,"
        "\"workers\":%llu,\"events\":%llu,\"payload_bytes\":%llu,\"reps\":%d,\"median_s\":%.9g,"
        "\"events_per_s\":%.6g,\"baseline\":\"%s\",\"baseline_median_s\":%.9g,\"ratio\":%.4f,\"decode_add_alone_s\":%.9g,"
        "\"apply_threads\":%u}\n",
        r.part.c_str(), r.name.c_str(), mach.c_str(), date.c_str(), static_cast<unsigned long long>(r.n),
        static_cast<unsigned long long>(r.workers), static_cast<unsigned long long>(r.events),
        static_cast<unsigned long long>(r.bytes), o.reps, r.median_s,
        r.part == "policy" ? r.events / r.median_s : 0.0, r.baseline.c_str(), r.baseline_s,
        r.baseline_s / r.median_s, r.decode_s, r.threads);
  }
  return 0;
}
