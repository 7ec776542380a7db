#include <ashl/ps/worker.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/counting_new.hpp"
#include "../support/forwarding_transport.hpp"
#include "../support/ps_job.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include "../support/checks.hpp"

// ps::worker over inproc: errors a user can act on, zero-copy commits and
// pulls, compression, the progress thread, and no allocation in steady state.

using namespace ps_job;
namespace ps = ashl::ps;
namespace tr = ashl::transport;
using namespace std::chrono_literals;

namespace {

// A server thread over `fabric` named "server0" holding `elements` for
// `workers` workers, until `stop`.
struct server_thread {
  std::atomic<bool> stop{false};
  std::atomic<bool> up{false};
  std::thread th;
  server_thread(std::shared_ptr<tr::inproc_fabric> fabric, std::size_t elements, std::uint32_t workers,
                std::string policy = "bsp") {
    th = std::thread([this, fabric, elements, workers, policy] {
      auto node = fabric->node("server0");
      auto layout = ps::shard_layout::even(elements, 1);
      ps::policy_params pp;
      pp.workers = workers;
      auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = workers}},
                                                std::move(*ps::make_policy(policy, pp)), std::move(*node));
      up = true;
      srv->run(stop);
    });
    while (!up) std::this_thread::sleep_for(1ms);
  }
  ~server_thread() {
    stop = true;
    th.join();
  }
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

tr::inproc node_of(const std::shared_ptr<tr::inproc_fabric>& f) {
  auto n = f->node();
  ASHL_REQUIRE(n.has_value());
  return std::move(*n);
}

using test_support::forwarding_handler;
using test_support::inproc_forwarder;

// Forwards to inproc and records where each send's data part lay.
struct spy : inproc_forwarder<spy> {
  std::vector<const std::byte*>* sent_from;
  ashl::status send(tr::peer_id p, std::span<const std::byte> h, std::span<const std::byte> d, std::uint64_t c) {
    if (!d.empty()) sent_from->push_back(d.data());
    return t.send(p, h, d, c);
  }
};
static_assert(tr::transport<spy>);

// Forwards to inproc; once armed, the next pull reply from the peer named
// `victim` reaches the worker with one bit of its payload flipped (on the
// wire) or with its header's CRC-32C changed, as a copy (the worker's own
// receive buffer, if the data went there, is left as the transport wrote it),
// or (in_place) with the bit flipped where the data landed: the worker's
// staging buffer for a rendezvous reply, as a transfer that went wrong
// would leave it.
enum class tamper_mode { payload, crc, in_place };
struct tamper : inproc_forwarder<tamper> {
  std::string victim;
  tamper_mode mode = tamper_mode::payload;
  std::shared_ptr<std::atomic<bool>> armed = std::make_shared<std::atomic<bool>>(false);
  tr::peer_id victim_peer = tr::no_peer;
  std::vector<std::byte> head_copy, data_copy;
  ashl::result<tr::peer_id> connect(std::string_view a) {
    auto id = t.connect(a);
    if (id && a == victim) victim_peer = *id;
    return id;
  }
  template <class H>
  struct wrapped : forwarding_handler<H> {
    tamper* self;
    void on_message(tr::peer_id p, std::span<const std::byte> head, std::span<const std::byte> data) {
      const bool reply = !data.empty() && ashl::wire::peek_kind(head) == ashl::wire::message_kind::pull_reply;
      if (reply && p == self->victim_peer && self->armed->exchange(false)) {
        if (self->mode == tamper_mode::in_place) {  // the buffer the worker gave the transport
          const_cast<std::byte*>(data.data())[data.size() / 2] ^= std::byte{0x10};
          this->h->on_message(p, head, data);
          return;
        }
        self->head_copy.assign(head.begin(), head.end());
        self->data_copy.assign(data.begin(), data.end());
        if (self->mode == tamper_mode::payload) self->data_copy[data.size() / 2] ^= std::byte{0x10};
        else self->head_copy[ashl::wire::crc_offset] ^= std::byte{0x01};
        this->h->on_message(p, self->head_copy, self->data_copy);
        return;
      }
      this->h->on_message(p, head, data);
    }
  };
};
static_assert(tr::transport<tamper>);

}  // namespace

BOOST_AUTO_TEST_CASE(a_model_of_another_size_is_refused_with_both_sizes_named) {
  auto fabric = tr::inproc_fabric::create({});
  server_thread srv(fabric, 999, 1);
  std::vector<float> w(1000);
  auto wk = ps::worker<tr::inproc>::create({.servers = {"server0"}, .timeout = 5s}, node_of(fabric), w);
  ASHL_REQUIRE(!wk.has_value());
  const std::string m = wk.error().message();
  // Refused at the join, which says the worker's model size (wire version
  // 6, docs/elastic.md §2.3), before any pull (pull_request.element_count
  // catches a worker that does not say it).
  ASHL_TEST(contains(m, "join.elements = 1000: this job's model has 999 elements"), m);
  ASHL_TEST(contains(m, "server 0 at server0"), m);
}

BOOST_AUTO_TEST_CASE(a_server_that_does_not_exist_is_named) {
  auto fabric = tr::inproc_fabric::create({});
  std::vector<float> w(10);
  const auto t0 = std::chrono::steady_clock::now();
  auto wk = ps::worker<tr::inproc>::create({.servers = {"nowhere"}, .timeout = 5s}, node_of(fabric), w);
  ASHL_REQUIRE(!wk.has_value());
  ASHL_TEST(contains(wk.error().message(), "nowhere"), wk.error().message());
  ASHL_TEST((std::chrono::steady_clock::now() - t0 < 5s));  // failed, not timed out
}

BOOST_AUTO_TEST_CASE(a_wait_that_cannot_end_times_out_with_its_bound_named) {
  // BSP over two workers, only one of them commits: its pull is held, and
  // wait() ends at the worker's timeout, saying so.
  auto fabric = tr::inproc_fabric::create({});
  server_thread srv(fabric, 64, 2);
  std::vector<float> w(64), g(64, 1.0f);
  auto wk = ps::worker<tr::inproc>::create({.servers = {"server0"}, .timeout = 300ms}, node_of(fabric), w);
  ASHL_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
  while (!wk->iteration_done()) {}
  ASHL_REQUIRE(wk->commit(g).ok());
  // In slices (what the Python binding does to see Ctrl-C): nothing yet,
  // then the same timeout, counted from the first slice.
  ASHL_TEST(!wk->wait_for(20ms, true).has_value());
  std::optional<ashl::status> sliced;
  for (int i = 0; i < 1000 && !sliced; ++i) sliced = wk->wait_for(20ms, false);
  ASHL_REQUIRE(sliced.has_value());
  ASHL_TEST((sliced->code() == ashl::errc::timed_out), sliced->message());
  ASHL_TEST(contains(sliced->message(), "worker.timeout_ms = 300"), sliced->message());
  const auto s = wk->wait();
  ASHL_TEST((s.code() == ashl::errc::timed_out));
  ASHL_TEST(contains(s.message(), "worker.timeout_ms = 300"), s.message());
}

BOOST_AUTO_TEST_CASE(a_failed_server_ends_the_wait_with_why) {
  auto fabric = tr::inproc_fabric::create({});
  server_thread srv(fabric, 64, 2);
  std::vector<float> w(64), g(64, 1.0f);
  auto wk = ps::worker<tr::inproc>::create({.servers = {"server0"}, .timeout = 10s}, node_of(fabric), w);
  ASHL_REQUIRE(wk.has_value());
  while (!wk->iteration_done()) {}
  ASHL_REQUIRE(wk->commit(g).ok());
  std::thread killer([&] {
    std::this_thread::sleep_for(50ms);
    (void)fabric->fail("server0");
  });
  const auto t0 = std::chrono::steady_clock::now();
  const auto s = wk->wait();
  killer.join();
  ASHL_TEST((s.code() == ashl::errc::unavailable));
  ASHL_TEST(contains(s.message(), "server 0 at server0 failed"), s.message());
  ASHL_TEST((std::chrono::steady_clock::now() - t0 < 5s));
  // Every later call says the same.
  ASHL_TEST((wk->commit(g).code() == ashl::errc::unavailable));
}

BOOST_AUTO_TEST_CASE(commits_go_from_the_callers_buffer_and_replies_land_in_it) {
  auto fabric = tr::inproc_fabric::create({.eager_bytes = 256});
  server_thread srv(fabric, 1000, 1, "asp");
  std::vector<float> w(1000), g(1000, 0.25f);
  std::vector<const std::byte*> sent_from;
  auto wk = ps::worker<spy>::create({.servers = {"server0"}, .timeout = 10s}, spy{{node_of(fabric)}, &sent_from}, w);
  ASHL_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
  for (int c = 0; c < 5; ++c) {
    while (!wk->iteration_done()) {}
    sent_from.clear();
    ASHL_REQUIRE(wk->commit(g).ok());
    ASHL_REQUIRE(wk->wait().ok());
    // The commit's data part was the caller's gradient buffer itself.
    ASHL_TEST(std::count(sent_from.begin(), sent_from.end(), reinterpret_cast<const std::byte*>(g.data())) == 1);
  }
  // Every pull reply (4000 bytes, above the eager size) was received where
  // the worker asked (its staging buffer: nothing copied from the
  // transport's), checked, and copied into w once: the join's pull and five.
  ASHL_TEST(wk->telemetry().copied_replies == 0u);
  ASHL_TEST(wk->telemetry().staged_replies == 6u);
  ASHL_TEST(wk->telemetry().bad_messages == 0u);
  // model_delta default: w = 0 + 5 commits of 0.25 each.
  ASHL_TEST(w[0] == 1.25f);
  ASHL_TEST(w[999] == 1.25f);
}

// Issue 50: the worker's value check and its commit's CRC-32C are one pass
// (rules/commit_check.hpp over wire::crc32c_chunked). A non-finite value
// anywhere in a commit of several 192 KiB chunks (the first element, either
// side of a chunk's end, the last element) is refused by name before
// anything is sent; the fixed commit then goes from the caller's buffer,
// sealed with the CRC of the check's pass, which the server verifies (a
// wrong one fails the wait naming header.crc32c) and applies.
BOOST_AUTO_TEST_CASE(a_non_finite_value_anywhere_is_refused_and_the_fixed_commit_is_sealed_in_the_checks_pass) {
  constexpr std::size_t chunk = ashl::wire::crc32c_chunk_bytes / sizeof(float);
  constexpr std::size_t n = 3 * chunk + 7;
  auto fabric = tr::inproc_fabric::create({.eager_bytes = 256});
  server_thread srv(fabric, n, 1, "asp");
  std::vector<float> w(n), g(n, 0.25f);
  std::vector<const std::byte*> sent_from;
  auto wk = ps::worker<spy>::create({.servers = {"server0"}, .timeout = 10s}, spy{{node_of(fabric)}, &sent_from}, w);
  ASHL_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct poison {
    std::size_t at;
    float value;
    const char* text;
  };
  const poison cases[] = {{0, inf, "inf"}, {chunk - 1, nan, "nan"}, {chunk, -inf, "-inf"}, {n - 1, nan, "nan"}};
  for (const poison& p : cases) {
    while (!wk->iteration_done()) {}
    sent_from.clear();
    g[p.at] = p.value;
    const ashl::status refused = wk->commit(g);
    ASHL_TEST(!refused.ok(), "at " << p.at);
    ASHL_TEST((refused.code() == ashl::errc::invalid_argument), refused.message());
    ASHL_TEST(contains(refused.message(), "commit.payload[" + std::to_string(p.at) + "] = " + p.text),
              refused.message());
    ASHL_TEST(sent_from.empty(), "at " << p.at << ": something was sent");
    g[p.at] = 0.25f;
    ASHL_REQUIRE(wk->commit(g).ok());
    const ashl::status st = wk->wait();
    ASHL_REQUIRE(st.ok(), st.message());
    ASHL_TEST(std::count(sent_from.begin(), sent_from.end(), reinterpret_cast<const std::byte*>(g.data())) == 1);
  }
  // model_delta: w = 0 + four commits of 0.25, every element.
  ASHL_TEST(std::count(w.begin(), w.end(), 1.0f) == static_cast<std::ptrdiff_t>(n));
  ASHL_TEST(wk->telemetry().bad_messages == 0u);
  ASHL_TEST(wk->telemetry().errors == 0u);
}

// Issue 50: only a payload sent as it was checked is sealed with the
// check's CRC. The first dense commit after top-k ones sends x + e from the
// worker's own buffer (the residual paid off), so it is sealed over what it
// sends: sealed with the CRC of x, the server refused it (header.crc32c).
// A follower is handed its plans, so the switch falls on known cycles;
// values in eighths keep every sum exact.
BOOST_AUTO_TEST_CASE(a_dense_commit_that_pays_a_residual_is_sealed_over_what_it_sends) {
  constexpr std::size_t n = 1000;
  auto fabric = tr::inproc_fabric::create({});
  server_thread srv(fabric, n, 1, "asp");
  std::vector<float> w(n), g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(static_cast<int>(i % 9) - 4) * 0.125f;
  auto wk = ps::worker<tr::inproc>::create({.servers = {"server0"}, .timeout = 10s, .follower = true},
                                           node_of(fabric), w);
  ASHL_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
  ashl::worker_plan sparse = wk->plan(), dense = wk->plan();
  sparse.compression_ratio = 0.05f;
  dense.compression_ratio = 1.0f;
  constexpr int cycles = 4;  // top-k, top-k, dense with x + e, dense from the caller's buffer
  for (int c = 0; c < cycles; ++c) {
    const bool compress = c < 2;
    const ps::plan_in_force p{compress ? sparse : dense, compress ? ashl::codec_id::topk : ashl::codec_id::identity};
    while (!wk->iteration_done(p, true)) {}
    ASHL_REQUIRE(wk->compresses() == compress, "cycle " << c);
    ASHL_REQUIRE(wk->commit(g).ok());
    const ashl::status st = wk->wait();
    ASHL_REQUIRE(st.ok(), "cycle " << c << ": " << st.message());
  }
  // Nothing top-k dropped was lost: w = four times g, exactly.
  std::size_t off = 0;
  for (std::size_t i = 0; i < n; ++i) off += w[i] != cycles * g[i] ? 1 : 0;
  ASHL_TEST(off == 0u);
  ASHL_TEST(wk->telemetry().errors == 0u);
}

BOOST_AUTO_TEST_CASE(compressing_plans_send_topk_with_error_feedback) {
  // ASHL's AHL stage at ratio 0.05: after profiling, commits are top-k
  // payloads (8 bytes per kept element), far below the dense 4000 bytes.
  job_spec spec;
  spec.policy = "ashl";
  spec.pp.profile_iterations = 1;
  spec.pp.h_ahl = 1;
  spec.pp.compression_ratio = 0.05;
  spec.pp.switch_loss = -1.0;  // never switches to SHL
  spec.workers = 2;
  spec.cycles = 20;
  spec.opt = {.mode = ps::optimizer_params::kind::model_delta};
  const job_result r = run_job(spec);
  for (const auto& e : r.worker_errors) ASHL_REQUIRE(e.empty(), e);
  // Each commit made under a compressing plan is a top-k payload (k = 50:
  // 12 + 8 k bytes), each other one dense (4 bytes per element); how many
  // cycles profiling takes depends on timing, so the bound is per cycle.
  std::uint64_t dense_cycles = 0, sparse_cycles = 0;
  for (const auto& plans : r.plans)
    for (const auto& p : plans) (p.compression_ratio < 1.0f ? sparse_cycles : dense_cycles) += 1;
  const std::uint64_t bound = dense_cycles * (72 + 4 * spec.elements) + sparse_cycles * (72 + 12 + 8 * 50);
  ASHL_TEST(sparse_cycles >= std::uint64_t{spec.workers});
  ASHL_TEST(r.servers[0].core.bytes_in <= bound);
  ASHL_TEST(r.servers[0].core.bytes_in < std::uint64_t{spec.workers} * spec.cycles * (72 + 4 * spec.elements));
  ASHL_TEST(r.servers[0].core.refused_total() == 0u);
  for (std::size_t k = 0; k < r.workers.size(); ++k) {
    bool compressing = false;
    for (const auto& p : r.plans[k]) compressing |= p.compression_ratio < 1.0f;
    if (compressing) ASHL_TEST(r.workers[k].compress_seconds > 0.0);
  }
}

BOOST_AUTO_TEST_CASE(a_progress_thread_drives_the_transport) {
  job_spec spec;
  spec.progress_thread = true;
  spec.cycles = 10;
  const job_result r = run_job(spec);
  for (const auto& e : r.worker_errors) ASHL_REQUIRE(e.empty(), e);
  ASHL_TEST(r.servers[0].core.commits_applied == std::uint64_t{spec.workers} * spec.cycles);
}

// A BSP server and four workers, driven from this one thread in a fixed
// order over a deterministic fabric (threads only while the workers join),
// so the run is the same every time: after a warm-up, a stretch of
// commit/pull cycles (rounds, snapshots, plans, measurements, the fabric's
// buffers) must not call operator new anywhere in the process. Measurements
// go after every cycle (measurement_interval 0), or in batches by count (an
// interval of an hour: batches of 57 to 64 records; the warm-up holds one).
void no_allocation_in_steady_state(std::chrono::microseconds measurement_interval, int warmup,
                                   std::uint64_t reply_part_bytes = 0, std::uint64_t commit_part_bytes = 0,
                                   ps::reply_compression replies = {}, bool flip_replies = false,
                                   ps::ledger_params ledger = {}) {
  constexpr std::uint32_t M = 4;
  const std::uint64_t part_bytes = std::max(reply_part_bytes, commit_part_bytes);
  const std::size_t n = part_bytes == 0 ? 1000 : 4 * part_bytes / sizeof(float);  // replies or commits in 4 parts
  constexpr int measured = 30;
  auto fabric = tr::inproc_fabric::create({.eager_bytes = 256, .deterministic = true});
  auto layout = ps::shard_layout::even(n, 1);
  ps::policy_params pp;
  pp.workers = M;
  auto node = fabric->node("server0");
  ASHL_REQUIRE(node.has_value());
  ps::server_params sp{.core = {.layout = *layout, .workers = M, .replies = replies},
                       .reply_part_bytes = reply_part_bytes};
  sp.ledger = ledger;
  auto srv = ps::server<tr::inproc>::create(sp, std::move(*ps::make_policy("bsp", pp)), std::move(*node));
  ASHL_REQUIRE(srv.has_value());
  std::vector<std::vector<float>> w(M, std::vector<float>(n)), g(M, std::vector<float>(n));
  std::vector<ps::worker<tr::inproc>> workers;
  {
    std::atomic<bool> stop{false};
    std::thread th([&] { srv->run(stop); });
    for (std::uint32_t k = 0; k < M; ++k) {
      auto wk = ps::worker<tr::inproc>::create({.rank = k, .servers = {"server0"}, .timeout = 20s, .measurement_interval = measurement_interval,
                                                .flip_replies = flip_replies,
                                                .commit_part_bytes = commit_part_bytes, .commit_window = 2},
                                               node_of(fabric), w[k]);
      ASHL_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
      workers.push_back(std::move(*wk));
    }
    stop = true;
    th.join();
  }
  auto cycle = [&](int c) {
    for (std::uint32_t k = 0; k < M; ++k) {
      for (std::size_t i = 0; i < n; ++i) g[k][i] = grad_value(k, static_cast<std::uint64_t>(c), i);
      while (!workers[k].iteration_done()) {}
      if (!workers[k].commit(g[k]).ok()) return false;
    }
    for (int spins = 0; spins < 100000; ++spins) {
      srv->poll();
      bool done = true;
      for (auto& wk : workers) done = wk.test() && done;
      if (done) break;
    }
    for (auto& wk : workers)
      if (!wk.wait().ok()) return false;  // complete: finishes the cycle
    return true;
  };
  for (int c = 0; c < warmup; ++c) ASHL_REQUIRE(cycle(c));
  const std::size_t before = counting_new::count();
  bool ok = true;
  for (int c = warmup; c < warmup + measured; ++c) ok = cycle(c) && ok;
  const std::size_t after = counting_new::count();
  ASHL_REQUIRE(ok);
  ASHL_TEST(after == before, "allocations in steady state: " << after - before);
  ASHL_TEST(srv->core().stats().commits_applied == std::uint64_t{M} * (warmup + measured));
  for (auto& wk : workers)
    ASHL_TEST(wk.telemetry().flipped_replies == (flip_replies ? std::uint64_t(1 + warmup + measured) : 0u),
              wk.telemetry().flipped_replies);
  if (reply_part_bytes != 0 && replies.codec != ashl::codec_id::identity) {
    // Only the joins' dense replies (their views) went in parts.
    ASHL_TEST(srv->telemetry().reply_parts == 4u * M, srv->telemetry().reply_parts);
    for (auto& wk : workers) ASHL_TEST(wk.telemetry().reply_parts == 4u, wk.telemetry().reply_parts);
  }
  if (reply_part_bytes != 0 && replies.codec == ashl::codec_id::identity) {
    ASHL_TEST(srv->telemetry().reply_parts == 4 * srv->telemetry().pull_replies, srv->telemetry().reply_parts);
    // One CRC pass per version (the first pin's: BSP releases the four
    // workers from one version), which gives the parts' CRCs too: none of the server's own.
    ASHL_TEST(srv->core().checksum_passes() == std::uint64_t(warmup + measured) + 1, srv->core().checksum_passes());
    ASHL_TEST(srv->telemetry().part_crc_passes == 0u, srv->telemetry().part_crc_passes);
    for (auto& wk : workers) ASHL_TEST(wk.telemetry().reply_parts == 4u * (warmup + measured + 1), wk.telemetry().reply_parts);
  }
  if (replies.codec != ashl::codec_id::identity) {
    // Every reply after the join's went compressed; BSP sends every worker
    // the same versions, so their views (their parameters) are equal, and
    // each is within the codec's reach of the server's.
    const std::uint64_t cycles = static_cast<std::uint64_t>(warmup + measured);
    ASHL_TEST(srv->telemetry().compressed_replies == M * cycles, srv->telemetry().compressed_replies);
    for (std::uint32_t k = 0; k < M; ++k) {
      ASHL_TEST(workers[k].telemetry().compressed_replies == cycles, workers[k].telemetry().compressed_replies);
      ASHL_TEST(std::memcmp(w[k].data(), w[0].data(), n * sizeof(float)) == 0);
    }
    const auto W = srv->parameters();
    double gap = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      gap = std::max(gap, std::fabs(static_cast<double>(W[i]) - w[0][i]));
      scale = std::max(scale, std::fabs(static_cast<double>(W[i])));
    }
    ASHL_TEST(gap > 0.0);            // compressed: the views trail the server's parameters
    ASHL_TEST(gap < 0.05 * scale, gap << " of " << scale);
  }
  if (commit_part_bytes != 0) {  // every commit in 4 parts, staged on the server, applied whole
    const std::uint64_t commits = std::uint64_t{M} * (warmup + measured);
    ASHL_TEST(srv->telemetry().commits_in_parts == commits, srv->telemetry().commits_in_parts);
    ASHL_TEST(srv->telemetry().commit_parts == 4 * commits, srv->telemetry().commit_parts);
    ASHL_TEST(srv->telemetry().wire_refused_total() == 0u);
    for (auto& wk : workers) ASHL_TEST(wk.telemetry().commit_parts == 4u * (warmup + measured), wk.telemetry().commit_parts);
  }
  if (ledger.samples != 0) {  // leases went out and were kept during the measured cycles
    const std::uint64_t granted = srv->core().ledger().stats().leases_granted;
    ASHL_TEST(srv->telemetry().leases == granted, srv->telemetry().leases);
    ASHL_TEST(granted > 4u * M, granted);
    std::uint64_t kept = 0;
    for (auto& wk : workers) kept += wk.telemetry().leases;
    ASHL_TEST(kept == granted, kept);
    ASHL_TEST(srv->core().ledger().stats().overrun == 0u);
  }
  for (auto& wk : workers) ASHL_TEST(wk.leave().ok());
}

// Issue 27: worker_params::link_hold replaces the rate's sleep. It is called
// with link_direction::up and the commit's bytes (header and payload) before
// the commit is sent, and with down and the reply's bytes after the reply
// arrived; what it holds is telemetry's link_seconds. The server's
// run(stop, between) calls between() on its own thread after every pass,
// where its parameters are one version (here: what the worker pulled).
BOOST_AUTO_TEST_CASE(a_link_hold_gets_each_transfer_and_between_sees_the_servers_parameters) {
  auto fabric = tr::inproc_fabric::create({});
  std::atomic<bool> stop{false}, up{false}, want{false};
  std::vector<float> seen;
  std::atomic<int> betweens{0};
  std::thread server([&] {
    auto node = fabric->node("server0");
    auto layout = ps::shard_layout::even(100, 1);
    ps::policy_params pp;
    pp.workers = 1;
    auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = 1}},
                                              std::move(*ps::make_policy("asp", pp)), std::move(*node));
    up = true;
    srv->run(stop, [&] {
      ++betweens;
      if (want.exchange(false)) {
        const auto p = srv->parameters();
        seen.assign(p.begin(), p.end());
      }
    });
  });
  while (!up) std::this_thread::sleep_for(1ms);
  std::vector<std::pair<ps::link_direction, std::uint64_t>> calls;
  std::vector<float> w(100), g(100, 0.5f);
  auto wk = ps::worker<tr::inproc>::create(
      {.servers = {"server0"},
       .timeout = 10s,
       .link_hold = [&](ps::link_direction d, std::uint64_t b) {
         calls.emplace_back(d, b);
         std::this_thread::sleep_for(5ms);
       }},
      node_of(fabric), w);
  ASHL_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
  calls.clear();  // the join's pull
  for (int c = 0; c < 3; ++c) {
    while (!wk->iteration_done()) {}
    ASHL_REQUIRE(wk->commit(g).ok());
    ASHL_REQUIRE(wk->wait().ok());
  }
  const std::uint64_t dense = ashl::wire::header_bytes + 100 * sizeof(float);
  ASHL_REQUIRE(calls.size() == 6u, calls.size());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    ASHL_TEST((calls[i].first == (i % 2 == 0 ? ps::link_direction::up : ps::link_direction::down)));
    ASHL_TEST(calls[i].second == dense, calls[i].second);
  }
  ASHL_TEST(wk->telemetry().link_seconds >= 0.025, wk->telemetry().link_seconds);
  want = true;
  while (want) std::this_thread::sleep_for(1ms);
  ASHL_TEST(betweens.load() > 0);
  ASHL_REQUIRE(seen.size() == 100u);
  ASHL_TEST((seen[0] == 1.5f && seen[99] == 1.5f && w[0] == 1.5f));
  (void)wk->leave();
  stop = true;
  server.join();
}

BOOST_AUTO_TEST_CASE(nothing_allocates_in_steady_state) {
  no_allocation_in_steady_state(std::chrono::microseconds{0}, 10);
  no_allocation_in_steady_state(std::chrono::microseconds{3'600'000'000}, 40);
  no_allocation_in_steady_state(std::chrono::microseconds{0}, 10, 4096);  // replies in parts (docs/ps.md "Messages")
  no_allocation_in_steady_state(std::chrono::microseconds{0}, 10, 0, 4096);  // commits in parts, two in flight (item 1 (b))
  // Compressed replies (docs/ps.md "Compressed replies"): 4-bit payloads
  // encoded into the send slots' buffers, decoded into the workers' views.
  no_allocation_in_steady_state(std::chrono::microseconds{0}, 10, 0, 0,
                                {.codec = ashl::codec_id::block, .options = {.bits = 4, .block = 64}});
  // The same with the dense (join) replies in parts, flagged `view` part by part.
  no_allocation_in_steady_state(std::chrono::microseconds{0}, 10, 4096, 0,
                                {.codec = ashl::codec_id::block, .options = {.bits = 4, .block = 64}});
  // Pulls that flip the buffers (worker_params::flip_replies), whole and in parts.
  no_allocation_in_steady_state(std::chrono::microseconds{0}, 10, 0, 0, {}, true);
  no_allocation_in_steady_state(std::chrono::microseconds{0}, 10, 4096, 0, {}, true);
  // The data ledger (server_params.ledger, docs/elastic.md §3.3): leases of
  // 4 cycles' samples granted as commits use them, sent and kept, past
  // several epochs of 200 samples.
  no_allocation_in_steady_state(std::chrono::microseconds{0}, 10, 0, 0, {}, false,
                                {.samples = 200, .shuffle_seed = 3});
}

BOOST_AUTO_TEST_CASE(a_pull_without_commit_reads_the_model) {
  auto fabric = tr::inproc_fabric::create({});
  server_thread srv(fabric, 100, 2, "asp");
  std::vector<float> w1(100), w2(100), g(100, 0.5f);
  auto a = ps::worker<tr::inproc>::create({.rank = 0, .servers = {"server0"}, .timeout = 10s}, node_of(fabric), w1);
  auto b = ps::worker<tr::inproc>::create({.rank = 1, .servers = {"server0"}, .timeout = 10s}, node_of(fabric), w2);
  ASHL_REQUIRE((a.has_value() && b.has_value()));
  for (int c = 0; c < 3; ++c) {
    while (!a->iteration_done()) {}
    ASHL_REQUIRE(a->commit(g).ok());
    ASHL_REQUIRE(a->wait().ok());
  }
  ASHL_TEST(w1[7] == 1.5f);
  ASHL_TEST(w2[7] == 0.0f);  // b has not pulled since it joined
  ASHL_REQUIRE(b->pull().ok());
  ASHL_TEST((b->pull().code() == ashl::errc::invalid_argument));  // one at a time
  ASHL_REQUIRE(b->wait().ok());
  ASHL_TEST(w2[7] == 1.5f);
  // After an iteration has begun, a pull must wait for the commit.
  (void)b->iteration_done();
  ASHL_TEST((b->pull().code() == ashl::errc::invalid_argument));
  ASHL_TEST(b->progress_line().find("worker 1:") == 0u, b->progress_line());
}

// Issue 25: the plan in force is worker_cycle's, adopted at a cycle start
// only. ADSP re-plans from every measurement a worker sends when a cycle ends
// (the join's pull too); the plan_updates reach the worker while it computes
// the next cycle, and the plan it runs by does not change until that cycle
// has committed and pulled. The first cycle runs the join's plan.
BOOST_AUTO_TEST_CASE(plans_from_the_servers_take_effect_at_cycle_starts_only) {
  auto fabric = tr::inproc_fabric::create({});
  std::atomic<bool> stop{false}, up{false};
  std::thread th([&] {
    auto node = fabric->node("server0");
    auto layout = ps::shard_layout::even(256, 1);
    ps::policy_params pp;
    pp.workers = 1;
    pp.period = 0.1;
    pp.initial_commit_rate = 4;  // a 25 ms interval until an overhead is measured
    auto pol = ps::make_policy("adsp", pp);
    ASHL_REQUIRE(pol.has_value());
    auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = 1}}, std::move(*pol),
                                              std::move(*node));
    ASHL_REQUIRE(srv.has_value());
    up = true;
    srv->run(stop);
  });
  while (!up) std::this_thread::sleep_for(1ms);
  std::vector<float> w(256), g(256, 0.5f);
  auto wk = ps::worker<tr::inproc>::create({.servers = {"server0"}, .timeout = 10s}, node_of(fabric), w);
  ASHL_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
  std::vector<std::uint32_t> interval_us;
  for (int c = 0; c < 4; ++c) {
    const ashl::worker_plan at_start = wk->plan();
    interval_us.push_back(at_start.commit_interval_us);
    while (!wk->iteration_done()) {}
    ASHL_REQUIRE(wk->commit(g).ok());
    // plan_updates may have arrived during the cycle (the measurements of the
    // last one were re-planned), yet the cycle ran, and committed, by its
    // start's plan.
    ASHL_TEST((wk->plan() == at_start), "cycle " << c);
    ASHL_REQUIRE(wk->wait().ok());
  }
  ASHL_TEST(interval_us[0] == 25'000u);  // the join's plan
  ASHL_TEST(interval_us[3] < 25'000u);   // 25 ms less a measured commit overhead
  ASHL_TEST(wk->telemetry().plan_changes >= 2u);
  ASHL_TEST(wk->leave().ok());
  stop = true;
  th.join();
}

// The samples a commit covers travel in its header, from the worker's
// worker_cycle (iterations x batch), and reach the policy: under
// samples-weighted BSP two workers of batch 16 and 48 weigh 1 : 3. (Before
// wire version 3 the server rebuilt them from header.step and its copy of
// the batch.)
BOOST_AUTO_TEST_CASE(commit_samples_come_from_the_workers_cycle) {
  auto fabric = tr::inproc_fabric::create({.eager_bytes = 256});
  std::atomic<bool> stop{false}, up{false};
  std::vector<float> server_params;
  ps::server_telemetry tel;
  std::thread server([&] {
    auto node = fabric->node("server0");
    auto layout = ps::shard_layout::even(100, 1);
    ps::policy_params pp;
    pp.workers = 2;
    pp.weighting = "samples";
    pp.local_steps = 2;
    auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = 2}},
                                              std::move(*ps::make_policy("local_sgd", pp)), std::move(*node));
    ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
    up = true;
    srv->run(stop);
    server_params.assign(srv->parameters().begin(), srv->parameters().end());
    tel = srv->telemetry();
  });
  while (!up) std::this_thread::sleep_for(1ms);
  std::vector<std::string> errors(2);
  std::vector<std::thread> workers;
  for (std::uint32_t k = 0; k < 2; ++k)
    workers.emplace_back([&, k] {
      std::vector<float> w(100), g(100, k == 0 ? 1.0f : 3.0f);
      auto wk = ps::worker<tr::inproc>::create({.rank = k, .servers = {"server0"}, .batch = k == 0 ? 16u : 48u,
                                                .timeout = 20s},
                                               node_of(fabric), w);
      if (!wk) {
        errors[k] = wk.error().message();
        return;
      }
      std::uint32_t iterations = 0;
      do {
        ++iterations;
      } while (!wk->iteration_done());
      if (iterations != 2) errors[k] = "ran " + std::to_string(iterations) + " iterations, not the plan's 2";
      else if (auto s = wk->commit(g); !s) errors[k] = s.message();
      else if (auto s2 = wk->wait(); !s2) errors[k] = s2.message();
      (void)wk->leave();
    });
  for (auto& t : workers) t.join();
  stop = true;
  server.join();
  for (const auto& e : errors) ASHL_REQUIRE(e.empty(), e);
  ASHL_TEST(tel.core.commits_applied == 2u);
  ASHL_TEST(tel.core.refused_total() == 0u);
  // (2 x 16 x 1 + 2 x 48 x 3) / (2 x 16 + 2 x 48) = 2.5 (the mean would be 2).
  ASHL_REQUIRE(server_params.size() == 100u);
  for (float v : server_params) ASHL_REQUIRE(v == 2.5f);
}

// Two workers of one process on two servers (the torch adapter's buckets):
// the follower runs the leader's plan and cycle end, counts its own
// servers' plan_updates as ignored, and reports the leader's measurements.
BOOST_AUTO_TEST_CASE(a_follower_runs_its_leaders_cycles_and_reports_its_measurements) {
  auto fabric = tr::inproc_fabric::create({});
  std::atomic<bool> stop{false};
  std::atomic<int> up{0};
  std::vector<std::thread> servers;
  for (const char* name : {"lead", "follow"}) {
    servers.emplace_back([&, name] {
      auto node = fabric->node(name);
      auto layout = ps::shard_layout::even(128, 1);
      ps::policy_params pp;
      pp.workers = 1;
      pp.period = 0.1;
      pp.initial_commit_rate = 4;  // ADSP: a 25 ms interval until an overhead is measured
      auto pol = ps::make_policy("adsp", pp);
      ASHL_REQUIRE(pol.has_value());
      auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = 1}}, std::move(*pol),
                                                std::move(*node));
      ASHL_REQUIRE(srv.has_value());
      ++up;
      srv->run(stop);
    });
  }
  while (up < 2) std::this_thread::sleep_for(1ms);
  std::vector<float> w0(128), w1(128), g(128, 0.25f);
  auto lead = ps::worker<tr::inproc>::create({.servers = {"lead"}, .timeout = 10s}, node_of(fabric), w0);
  auto fol = ps::worker<tr::inproc>::create({.servers = {"follow"}, .timeout = 10s, .follower = true},
                                            node_of(fabric), w1);
  ASHL_REQUIRE((lead.has_value() && fol.has_value()));
  for (int c = 0; c < 5; ++c) {
    const ps::plan_in_force p = lead->current_plan();
    int iterations = 0;
    bool done = false;
    while (!done) {
      done = lead->iteration_done();
      ++iterations;
      ASHL_TEST(fol->iteration_done(p, done) == done, "cycle " << c << " iteration " << iterations);
      if (!done) std::this_thread::sleep_for(2ms);
    }
    ASHL_TEST((fol->plan() == p.plan), "cycle " << c);  // the leader's plan of this cycle
    ASHL_TEST((fol->commit_step() == lead->commit_step()), "cycle " << c);
    ASHL_REQUIRE(lead->commit(g).ok());
    ASHL_REQUIRE(fol->commit(g).ok());
    ASHL_REQUIRE(lead->wait().ok());
    ASHL_REQUIRE(fol->wait().ok());
    const auto ms = lead->reported_measurements();
    ASHL_TEST(!ms.empty(), "cycle " << c);
    ASHL_TEST(fol->report_measurements(ms).ok());
  }
  ASHL_TEST(lead->telemetry().plan_changes >= 2u);   // ADSP re-planned the interval
  ASHL_TEST(fol->telemetry().plan_changes >= 2u);    // and the follower took it from the leader
  ASHL_TEST(fol->telemetry().plans_ignored >= 1u);   // its own server's plans were not followed
  ASHL_TEST(lead->telemetry().plans_ignored == 0u);
  ASHL_TEST(fol->telemetry().commits == lead->telemetry().commits);
  // A measurement of another rank is refused by name.
  const auto bad = fol->report_measurements(std::vector<ashl::measurement>{{.worker = 7, .seconds = 1.0}});
  ASHL_TEST((!bad.ok() && contains(bad.message(), "worker.report_measurements.worker")));
  ASHL_TEST(lead->leave().ok());
  ASHL_TEST(fol->leave().ok());
  stop = true;
  for (auto& t : servers) t.join();
}

// Issue 28: a cycle's measurements join a batch that goes to the servers
// once worker_params.measurement_interval has passed since the last batch
// (or measurement_batch records wait), and what is left goes before the
// leave; interval 0 sends one message per cycle. Every message counted by
// the worker reached the server, and nothing else was added.
BOOST_AUTO_TEST_CASE(measurements_travel_in_batches_when_due) {
  constexpr int cycles = 60;
  for (const std::chrono::microseconds interval : {std::chrono::microseconds{0}, std::chrono::microseconds{3'600'000'000}}) {
    auto fabric = tr::inproc_fabric::create({.eager_bytes = 256});
    std::atomic<bool> stop{false}, up{false};
    ps::server_telemetry tel;
    std::thread server([&] {
      auto node = fabric->node("server0");
      auto layout = ps::shard_layout::even(64, 1);
      ps::policy_params pp;
      pp.workers = 1;
      auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = 1}},
                                                std::move(*ps::make_policy("asp", pp)), std::move(*node));
      ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
      up = true;
      srv->run(stop);
      tel = srv->telemetry();
    });
    while (!up) std::this_thread::sleep_for(1ms);
    std::vector<float> w(64), g(64, 0.25f);
    auto wk = ps::worker<tr::inproc>::create(
        {.servers = {"server0"}, .timeout = 10s, .measurement_interval = interval, .measurement_batch = 16},
        node_of(fabric), w);
    ASHL_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
    for (int c = 0; c < cycles; ++c) {
      while (!wk->iteration_done()) {}
      ASHL_REQUIRE(wk->commit(g).ok());
      ASHL_REQUIRE(wk->wait().ok());
    }
    const std::uint64_t before_leave = wk->telemetry().measurement_messages;
    ASHL_REQUIRE(wk->leave().ok());
    const std::uint64_t sent = wk->telemetry().measurement_messages;
    stop = true;
    server.join();
    if (interval.count() == 0) {
      // The join's pull and every cycle: one message each (a pull is always
      // measured), none left for the leave.
      ASHL_TEST(sent == std::uint64_t{cycles} + 1);
      ASHL_TEST(sent == before_leave);
    } else {
      // The join's (the first is always due), batches of 9 to 16 records (a
      // cycle records 3 to 5), and what is left before the leave (if any).
      ASHL_TEST(sent >= 1u + (3u * cycles) / 16u, "measurement messages: " << sent);
      ASHL_TEST(sent <= 2u + (5u * cycles) / 8u, "measurement messages: " << sent);
      ASHL_TEST((sent == before_leave || sent == before_leave + 1));
    }
    // join, the join's pull, the commits, the measurements, the leave.
    ASHL_TEST(tel.messages_in == 2u + cycles + sent + 1u, "messages in: " << tel.messages_in);
    ASHL_TEST(tel.core.commits_applied == std::uint64_t{cycles});
    ASHL_TEST(tel.core.refused_total() == 0u);
    ASHL_TEST(tel.wire_refused_total() == 0u);
    ASHL_TEST(w[3] == 0.25f * cycles);
  }
}

BOOST_AUTO_TEST_CASE(measurement_parameters_are_checked) {
  auto fabric = tr::inproc_fabric::create({});
  std::vector<float> w(8);
  auto a = ps::worker<tr::inproc>::create({.servers = {"server0"}, .measurement_batch = 4}, node_of(fabric), w);
  ASHL_TEST((!a && a.error().message().find("worker.measurement_batch") != std::string::npos));
  auto b = ps::worker<tr::inproc>::create({.servers = {"server0"}, .measurement_interval = std::chrono::microseconds{-1}},
                                          node_of(fabric), w);
  ASHL_TEST((!b && b.error().message().find("worker.measurement_interval_us") != std::string::npos));
}

namespace {
// Server k of `servers` ("server<k>") over `fabric`, for `workers` workers,
// until `stop`; its telemetry is read after it stops.
struct shard_server {
  std::atomic<bool> stop{false}, up{false};
  ps::server_telemetry tel{};
  std::thread th;
  shard_server(std::shared_ptr<tr::inproc_fabric> fabric, std::size_t elements, std::uint32_t k,
               std::uint32_t servers, std::uint32_t workers, std::string policy) {
    th = std::thread([this, fabric, elements, k, servers, workers, policy] {
      auto node = fabric->node("server" + std::to_string(k));
      auto layout = ps::shard_layout::even(elements, servers);
      ps::policy_params pp;
      pp.workers = workers;
      auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .shard = k, .workers = workers}},
                                                std::move(*ps::make_policy(policy, pp)), std::move(*node));
      ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
      up = true;
      srv->run(stop);
      tel = srv->telemetry();
    });
    while (!up) std::this_thread::sleep_for(1ms);
  }
  void end() {
    if (th.joinable()) {
      stop = true;
      th.join();
    }
  }
  ~shard_server() { end(); }
};
}  // namespace

// Issue 28 (fan-in): push() commits without the parameters back. Each of two
// servers answers with a header-only acknowledgement (a pull_reply of no
// elements) once it has taken its shard and the policy releases the worker,
// so wait() returns with the worker's buffer as it was; ASP applied every
// push, which pull() then reads. A push's cycle measures the commit (push +
// the wait for the acknowledgements) and no pull.
BOOST_AUTO_TEST_CASE(a_push_is_acknowledged_without_the_parameters) {
  constexpr int cycles = 8;
  auto fabric = tr::inproc_fabric::create({});
  shard_server s0(fabric, 100, 0, 2, 1, "asp"), s1(fabric, 100, 1, 2, 1, "asp");
  std::vector<float> w(100), g(100, 0.25f);
  auto wk = ps::worker<tr::inproc>::create({.servers = {"server0", "server1"}, .timeout = 10s}, node_of(fabric), w);
  ASHL_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
  std::fill(w.begin(), w.end(), 7.0f);  // what the caller holds; a push leaves it
  for (int c = 0; c < cycles; ++c) {
    while (!wk->iteration_done()) {}
    ASHL_REQUIRE(wk->push(g).ok());
    ASHL_TEST((wk->push(g).code() == ashl::errc::invalid_argument));  // one at a time
    ASHL_REQUIRE(wk->wait().ok());
    ASHL_TEST(w[3] == 7.0f);
    ASHL_TEST(w[97] == 7.0f);
  }
  bool commit_measured = false, pull_measured = false;
  for (const auto& m : wk->reported_measurements()) {
    commit_measured = commit_measured || m.kind == ashl::measurement_kind::commit;
    pull_measured = pull_measured || m.kind == ashl::measurement_kind::pull;
  }
  ASHL_TEST(commit_measured);
  ASHL_TEST(!pull_measured);
  const auto t = wk->telemetry();
  ASHL_TEST(t.commits == std::uint64_t{cycles});
  ASHL_TEST(t.pushes == std::uint64_t{cycles});
  ASHL_TEST(t.pulls == 1u);  // the join's
  ASHL_REQUIRE(wk->pull().ok());
  ASHL_REQUIRE(wk->wait().ok());
  ASHL_TEST(w[3] == 0.25f * cycles);
  ASHL_TEST(w[97] == 0.25f * cycles);
  // A commit after pushes gets the parameters back again.
  std::fill(w.begin(), w.end(), 7.0f);
  while (!wk->iteration_done()) {}
  ASHL_REQUIRE(wk->commit(g).ok());
  ASHL_REQUIRE(wk->wait().ok());
  ASHL_TEST(w[3] == 0.25f * (cycles + 1));
  ASHL_REQUIRE(wk->leave().ok());
  s0.end();
  s1.end();
  for (const auto* s : {&s0, &s1}) {
    ASHL_TEST(s->tel.core.commits_applied == std::uint64_t{cycles} + 1);
    ASHL_TEST(s->tel.acks == std::uint64_t{cycles});
    ASHL_TEST(s->tel.pull_replies == std::uint64_t{cycles} + 3);  // acks, the join's, pull(), the commit's
    ASHL_TEST(s->tel.core.refused_total() == 0u);
    ASHL_TEST(s->tel.wire_refused_total() == 0u);
  }
}

// The policy still decides when a push is answered: under BSP worker 0's
// push is acknowledged only when worker 1's commit completes the round.
// Both are then at the round's version (parameters_version(): server 0's
// pull_reply.clock, the acknowledgement's too), the version after round c.
BOOST_AUTO_TEST_CASE(a_push_waits_at_the_bsp_barrier) {
  auto fabric = tr::inproc_fabric::create({});
  shard_server s0(fabric, 64, 0, 1, 2, "bsp");
  std::vector<float> wa(64), wb(64), g(64, 0.5f);
  auto a = ps::worker<tr::inproc>::create({.rank = 0, .servers = {"server0"}, .timeout = 10s}, node_of(fabric), wa);
  auto b = ps::worker<tr::inproc>::create({.rank = 1, .servers = {"server0"}, .timeout = 10s}, node_of(fabric), wb);
  ASHL_REQUIRE((a.has_value() && b.has_value()));
  ASHL_TEST(a->parameters_version() == 0u);  // the join's pull: nothing applied yet
  for (int c = 0; c < 3; ++c) {
    while (!a->iteration_done()) {}
    ASHL_REQUIRE(a->push(g).ok());
    for (int i = 0; i < 20; ++i) {
      ASHL_TEST(!a->test());  // held: the round waits for worker 1
      std::this_thread::sleep_for(1ms);
    }
    while (!b->iteration_done()) {}
    ASHL_REQUIRE(b->commit(g).ok());
    ASHL_REQUIRE(a->wait().ok());
    ASHL_REQUIRE(b->wait().ok());
    ASHL_TEST(wa[5] == 0.0f);  // the pusher's buffer: as it was after the join
    ASHL_TEST(wb[5] == 0.5f * (c + 1));  // BSP: the mean of the two updates per round
    ASHL_TEST(a->parameters_version() == static_cast<std::uint64_t>(c + 1));
    ASHL_TEST(b->parameters_version() == static_cast<std::uint64_t>(c + 1));
  }
  ASHL_REQUIRE(a->leave().ok());
  ASHL_REQUIRE(b->leave().ok());
  s0.end();
  ASHL_TEST(s0.tel.acks == 3u);
  ASHL_TEST(s0.tel.core.commits_applied == 6u);
}

// Issue 24, item 8: a pull reply is checked before the caller's parameters
// change. Two servers (ASP, model deltas), one worker; after three good
// cycles server 1's next reply arrives corrupted (a payload bit flipped, or
// its header's CRC-32C changed), rendezvous (into the worker's buffer) or
// eager (copied from the transport's). The wait fails naming the checksum
// and server 1, and w is bit-identical to what it was before the commit:
// server 0's good reply of the same pull did not reach it either.
// Issue 50: also with the bit flipped in the worker's staging buffer, where
// the rendezvous reply landed: the reply is checked before it is copied, so
// a copy-and-check into w (which would leave the bad reply there) fails it.
void a_bad_reply_leaves_the_parameters(std::size_t eager_bytes, tamper_mode mode, bool flip = false) {
  constexpr std::size_t n = 1000;
  constexpr std::uint32_t S = 2;
  auto fabric = tr::inproc_fabric::create({.eager_bytes = eager_bytes});
  auto layout = ps::shard_layout::even(n, S);
  ASHL_REQUIRE(layout.has_value());
  std::atomic<bool> stop{false};
  std::atomic<std::uint32_t> up{0};
  std::vector<std::thread> servers;
  for (std::uint32_t s = 0; s < S; ++s)
    servers.emplace_back([&, s] {
      auto node = fabric->node("server" + std::to_string(s));
      ASHL_REQUIRE(node.has_value());
      ps::policy_params pp;
      pp.workers = 1;
      auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .shard = s, .workers = 1}},
                                                std::move(*ps::make_policy("asp", pp)), std::move(*node));
      ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
      ++up;
      srv->run(stop);
    });
  while (up.load() < S) std::this_thread::sleep_for(1ms);
  std::vector<float> w(n), g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = 0.25f + static_cast<float>(i) * 1e-3f;
  tamper tp{{node_of(fabric)}, "server1", mode};
  auto armed = tp.armed;
  auto wk = ps::worker<tamper>::create({.servers = {"server0", "server1"}, .timeout = 10s, .flip_replies = flip},
                                       std::move(tp), w);
  ASHL_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
  for (int c = 0; c < 3; ++c) {
    while (!wk->iteration_done()) {}
    ASHL_REQUIRE(wk->commit(g).ok());
    ASHL_REQUIRE(wk->wait().ok());
  }
  // Staged, or flipped four times (the join's pull and three): the caller's buffer.
  const std::span<float> params = wk->parameters();
  ASHL_TEST(params.data() == w.data());
  ASHL_TEST(params[0] == 0.75f);
  const std::vector<float> before(params.begin(), params.end());
  *armed = true;
  while (!wk->iteration_done()) {}
  ASHL_REQUIRE(wk->commit(g).ok());
  const auto st = wk->wait();
  ASHL_TEST(!armed->load());  // the reply was tampered with
  ASHL_TEST((st.code() == ashl::errc::checksum_mismatch), st.message());
  ASHL_TEST(contains(st.message(), "header.crc32c"), st.message());
  ASHL_TEST(contains(st.message(), "server 1 at server1"), st.message());
  ASHL_TEST(wk->parameters().data() == params.data(), "the parameters moved after a bad reply");
  ASHL_TEST(std::memcmp(params.data(), before.data(), n * sizeof(float)) == 0,
            "eager_bytes " << eager_bytes << " flip " << flip << ": the caller's parameters changed");
  const auto tel = wk->telemetry();
  ASHL_TEST(tel.bad_messages == 1u);
  ASHL_TEST(tel.staged_replies == 4u);  // the join's pull and three cycles
  ASHL_TEST(tel.flipped_replies == (flip ? 4u : 0u));
  if (eager_bytes > n * sizeof(float)) ASHL_TEST(tel.copied_replies > 0u);
  else ASHL_TEST(tel.copied_replies == 0u);
  stop = true;
  for (auto& th : servers) th.join();
}

BOOST_AUTO_TEST_CASE(a_bad_pull_reply_fails_the_wait_and_leaves_the_parameters_as_they_were) {
  for (const std::size_t eager : {std::size_t{256}, std::size_t{1} << 20})
    for (const tamper_mode mode : {tamper_mode::payload, tamper_mode::crc}) a_bad_reply_leaves_the_parameters(eager, mode);
  a_bad_reply_leaves_the_parameters(256, tamper_mode::in_place);  // rendezvous: flipped in the worker's staging
  // Pulls that flip the buffers: the same, and the parameters stay where they were.
  for (const std::size_t eager : {std::size_t{256}, std::size_t{1} << 20})
    for (const tamper_mode mode : {tamper_mode::payload, tamper_mode::crc, tamper_mode::in_place})
      if (eager == 256 || mode != tamper_mode::in_place) a_bad_reply_leaves_the_parameters(eager, mode, true);
}

// docs/perf/ps-passes.md "Pulls that flip": with worker_params::flip_replies
// a pull's replies land in the buffer that is not the parameters and, all
// checked, make it the parameters: no copy per pull, neither from the
// transport's buffer (rendezvous) nor from a staging buffer. The two buffers
// take turns; the one the pull did not land in is left exactly as it was; a
// push's acknowledgements do not move the parameters; an update in the
// landing buffer and flipping without staging are refused by name.
BOOST_AUTO_TEST_CASE(flipped_pulls_land_in_the_other_buffer_and_make_it_the_parameters) {
  auto fabric = tr::inproc_fabric::create({.eager_bytes = 256});
  server_thread srv(fabric, 1000, 1, "asp");
  std::vector<float> w(1000, -1.0f), g(1000, 0.25f);
  auto bad = ps::worker<tr::inproc>::create(
      {.servers = {"server0"}, .timeout = 10s, .stage_replies = false, .flip_replies = true}, node_of(fabric), w);
  ASHL_REQUIRE(!bad.has_value());
  ASHL_TEST(contains(bad.error().message(), "worker.flip_replies"), bad.error().message());
  auto wk = ps::worker<tr::inproc>::create({.servers = {"server0"}, .timeout = 10s, .flip_replies = true},
                                           node_of(fabric), w);
  ASHL_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
  // The join's pull landed in the worker's buffer: the caller's is as it was.
  const std::span<float> own = wk->parameters();
  ASHL_REQUIRE(own.size() == w.size());
  ASHL_TEST(own.data() != w.data());
  ASHL_TEST((own[0] == 0.0f && own[999] == 0.0f));
  ASHL_TEST((w[0] == -1.0f && w[999] == -1.0f));
  // An update in the buffer the next pull lands in (the caller's, now) is refused.
  while (!wk->iteration_done()) {}
  std::fill(w.begin(), w.end(), 0.25f);
  const auto st = wk->commit(w);
  ASHL_TEST((st.code() == ashl::errc::invalid_argument), st.message());
  ASHL_TEST(contains(st.message(), "worker.commit.update"), st.message());
  for (int c = 1; c <= 4; ++c) {
    while (!wk->iteration_done()) {}
    ASHL_REQUIRE(wk->commit(g).ok());
    ASHL_REQUIRE(wk->wait().ok());
    const std::span<float> now = wk->parameters();
    const bool in_callers = c % 2 == 1;
    ASHL_TEST((now.data() == (in_callers ? w.data() : own.data())), c);
    ASHL_TEST((now[0] == 0.25f * float(c) && now[999] == 0.25f * float(c)), c << " " << now[0]);
    // The other buffer holds the pull before: this pull did not touch it.
    const std::span<float> other = in_callers ? own : std::span<float>(w);
    ASHL_TEST(other[500] == 0.25f * float(c - 1), c << " " << other[500]);
  }
  // A push: acknowledged without parameters, so nothing flips.
  const float* before = wk->parameters().data();
  while (!wk->iteration_done()) {}
  ASHL_REQUIRE(wk->push(g).ok());
  ASHL_REQUIRE(wk->wait().ok());
  ASHL_TEST(wk->parameters().data() == before);
  ASHL_TEST(wk->parameters()[0] == 1.0f);
  // The next pull sees the push's delta.
  ASHL_REQUIRE(wk->pull().ok());
  ASHL_REQUIRE(wk->wait().ok());
  ASHL_TEST(wk->parameters().data() != before);
  ASHL_TEST(wk->parameters()[0] == 1.25f);
  const auto tel = wk->telemetry();
  ASHL_TEST(tel.flipped_replies == 6u, tel.flipped_replies);  // the join, four cycles, the pull
  ASHL_TEST(tel.copied_replies == 0u);                       // rendezvous into the landing buffer
  ASHL_TEST(tel.bad_messages == 0u);
}

// Issue 28, item 1: a pull reply in parts (server_params.reply_part_bytes).
// Each part is checked as it lands; the parameters change only when every
// part passed. Forwards to inproc; once armed, the `nth` part message from
// the server is handed to edit(head, data), which changes it (re-sealed,
// so its CRC is good, unless it flips a payload bit after sealing) and says
// how often to deliver it: 0 dropped, 1, or 2 (repeated).
struct part_tamper : inproc_forwarder<part_tamper> {
  int nth = 0;
  std::function<int(ashl::wire::header&, std::vector<std::byte>&)> edit;
  bool flip_after_seal = false;
  std::shared_ptr<std::atomic<bool>> armed = std::make_shared<std::atomic<bool>>(false);
  int seen = 0;
  std::vector<std::byte> head_copy, data_copy;
  template <class H>
  struct wrapped : forwarding_handler<H> {
    part_tamper* self;
    void on_message(tr::peer_id p, std::span<const std::byte> head, std::span<const std::byte> data) {
      const bool part = ashl::wire::peek_part(head).valid();
      if (!part || !self->armed->load() || self->seen++ != self->nth) {
        this->h->on_message(p, head, data);
        return;
      }
      self->armed->store(false);
      auto m = ashl::wire::decode(head, data, {});
      ASHL_REQUIRE(m.has_value());
      ashl::wire::header hd = m->header;
      self->data_copy.assign(data.begin(), data.end());
      const int times = self->edit(hd, self->data_copy);
      self->head_copy.assign(ashl::wire::header_bytes, std::byte{0});
      ASHL_REQUIRE(ashl::wire::seal_header(hd, self->data_copy, self->head_copy).ok());
      if (self->flip_after_seal) self->data_copy[self->data_copy.size() / 2] ^= std::byte{0x10};
      for (int k = 0; k < times; ++k) this->h->on_message(p, self->head_copy, self->data_copy);
    }
  };
};
static_assert(tr::transport<part_tamper>);

struct part_case {
  const char* name;
  int nth;
  bool flip;
  std::function<int(ashl::wire::header&, std::vector<std::byte>&)> edit;
  ashl::errc code;
  const char* says;
};

// One server (ASP, 4096 elements, replies in 4 parts of 1024), one worker
// per case: two good cycles, then the case's part; rendezvous parts (into the
// staging buffer) and eager ones (copied from the transport's).
void parts_are_checked_one_by_one(std::size_t eager_bytes) {
  constexpr std::size_t n = 4096;
  const std::vector<part_case> cases = {
      {"good", -1, false, nullptr, ashl::errc::ok, ""},
      {"payload bit of part 2", 2, true, [](auto&, auto&) { return 1; }, ashl::errc::checksum_mismatch, "header.crc32c"},
      {"part 0 lost", 0, false, [](auto&, auto&) { return 0; }, ashl::errc::malformed,
       "pull_reply.part = 1: from server 0 at server0: expected part 0 of 4 (a part out of order or repeated)"},
      {"part 1 twice", 1, false, [](auto&, auto&) { return 2; }, ashl::errc::malformed,
       "pull_reply.part = 1: from server 0 at server0: expected part 2 of 4"},
      {"part 3 of another version", 3, false, [](ashl::wire::header& h, auto&) { h.clock += 1; return 1; },
       ashl::errc::malformed, "pull_reply.clock"},
      {"part 1 of another split", 1, false,
       [](ashl::wire::header& h, std::vector<std::byte>& d) {
         h.parts = 5;  // 820 elements a part
         d.resize(820 * sizeof(float));
         return 1;
       },
       ashl::errc::malformed, "pull_reply.parts = 5: from server 0 at server0: earlier parts of this reply said 4"},
  };
  auto fabric = tr::inproc_fabric::create({.eager_bytes = eager_bytes});
  auto layout = ps::shard_layout::even(n, 1);
  ASHL_REQUIRE(layout.has_value());
  const auto W = static_cast<std::uint32_t>(cases.size());
  std::atomic<bool> stop{false}, up{false};
  std::atomic<std::uint64_t> parts_sent{0};
  std::thread server([&] {
    auto node = fabric->node("server0");
    ASHL_REQUIRE(node.has_value());
    ps::policy_params pp;
    pp.workers = W;
    auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = W}, .reply_part_bytes = 4096},
                                              std::move(*ps::make_policy("asp", pp)), std::move(*node));
    ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
    up = true;
    srv->run(stop);
    parts_sent = srv->telemetry().reply_parts;
  });
  while (!up) std::this_thread::sleep_for(1ms);
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = 0.25f + static_cast<float>(i) * 1e-3f;
  for (std::uint32_t k = 0; k < W; ++k) {
    const part_case& c = cases[k];
    std::vector<float> w(n);
    part_tamper tp{{node_of(fabric)}, c.nth, c.edit, c.flip};
    auto armed = tp.armed;
    auto wk = ps::worker<part_tamper>::create({.rank = k, .servers = {"server0"}, .timeout = 10s}, std::move(tp), w);
    ASHL_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
    for (int i = 0; i < 2; ++i) {
      while (!wk->iteration_done()) {}
      ASHL_REQUIRE(wk->commit(g).ok());
      ASHL_REQUIRE(wk->wait().ok());
    }
    // ASP, model deltas: the earlier workers' three commits each, and this one's two.
    for (std::size_t i = 0; i < n; i += 1000)
      ASHL_TEST(std::abs(w[i] - g[i] * float(3 * k + 2)) <= 1e-4f * g[i] * float(3 * k + 2), c.name << " " << i << " " << w[i]);
    const std::vector<float> before = w;
    *armed = c.edit != nullptr;
    while (!wk->iteration_done()) {}
    ASHL_REQUIRE(wk->commit(g).ok());
    const auto st = wk->wait();
    const auto tel = wk->telemetry();
    ASHL_TEST(tel.staged_replies == (c.edit ? 3u : 4u), c.name);  // the join's pull and the good cycles
    if (!c.edit) {
      ASHL_TEST(st.ok(), st.message());
      ASHL_TEST(tel.reply_parts == 16u, tel.reply_parts);
      ASHL_TEST(std::abs(w[n - 1] - g[n - 1] * float(3 * k + 3)) <= 1e-4f * g[n - 1] * float(3 * k + 3), w[n - 1]);
      (void)wk->leave();
      continue;
    }
    ASHL_TEST(!armed->load(), c.name);
    ASHL_TEST((st.code() == c.code), c.name << ": " << st.message());
    ASHL_TEST(contains(st.message(), c.says), c.name << ": " << st.message());
    ASHL_TEST(tel.bad_messages == 1u, c.name);
    ASHL_TEST(std::memcmp(w.data(), before.data(), n * sizeof(float)) == 0, c.name << ": the caller's parameters changed");
  }
  stop = true;
  server.join();
  ASHL_TEST(parts_sent.load() == 4u * 4 * W, parts_sent.load());
}

BOOST_AUTO_TEST_CASE(a_reply_in_parts_is_checked_part_by_part_and_delivered_whole) {
  parts_are_checked_one_by_one(256);
  parts_are_checked_one_by_one(std::size_t{1} << 20);
}

// Compressed replies (docs/ps.md "Compressed replies"): the `nth` pull
// reply with parameters (0: the join's, dense and flagged `view`; then one
// compressed reply per cycle) is handed to edit(), re-sealed (its CRC is
// good) and delivered. A reply that does not fit the worker's view, or whose
// payload the decoder refuses, fails the wait by name and leaves the
// caller's parameters as they were.
struct reply_tamper : inproc_forwarder<reply_tamper> {
  int nth = 0;
  std::function<void(ashl::wire::header&, std::vector<std::byte>&)> edit;
  int seen = 0;
  std::vector<std::byte> head_copy, data_copy;
  template <class H>
  struct wrapped : forwarding_handler<H> {
    reply_tamper* self;
    void on_message(tr::peer_id p, std::span<const std::byte> head, std::span<const std::byte> data) {
      auto m = ashl::wire::decode(head, data, {});
      if (!m || m->header.kind != ashl::wire::message_kind::pull_reply || m->header.element_count == 0 ||
          self->seen++ != self->nth || !self->edit) {
        this->h->on_message(p, head, data);
        return;
      }
      ashl::wire::header hd = m->header;
      self->data_copy.assign(data.begin(), data.end());
      self->edit(hd, self->data_copy);
      self->head_copy.assign(ashl::wire::header_bytes, std::byte{0});
      ASHL_REQUIRE(ashl::wire::seal_header(hd, self->data_copy, self->head_copy).ok());
      this->h->on_message(p, self->head_copy, self->data_copy);
    }
  };
};
static_assert(tr::transport<reply_tamper>);

BOOST_AUTO_TEST_CASE(a_compressed_reply_that_does_not_fit_the_view_is_refused_by_name) {
  constexpr std::size_t n = 256;
  struct reply_case {
    const char* name;
    int nth;  // the reply edited
    std::function<void(ashl::wire::header&, std::vector<std::byte>&)> edit;
    const char* says;
  };
  const std::vector<reply_case> cases = {
      {"good", -1, nullptr, ""},
      {"another view's version", 2, [](ashl::wire::header& h, auto&) { h.sequence += 1; },
       "pull_reply.sequence = "},
      {"the join's reply not flagged view", 0, [](ashl::wire::header& h, auto&) { h.flags &= ~ashl::wire::flag_view; },
       "no view of the shard (no dense reply flagged `view` came first)"},
      {"a payload the decoder refuses", 1, [](auto&, std::vector<std::byte>& d) { d.resize(3); },
       "pull_reply.payload = 3: from server 0 at server0: a block payload the decoder refused"},
  };
  auto fabric = tr::inproc_fabric::create({.eager_bytes = std::size_t{1} << 20});
  auto layout = ps::shard_layout::even(n, 1);
  const auto W = static_cast<std::uint32_t>(cases.size());
  std::atomic<bool> stop{false}, up{false};
  std::thread server([&] {
    auto node = fabric->node("server0");
    ASHL_REQUIRE(node.has_value());
    ps::policy_params pp;
    pp.workers = W;
    auto srv = ps::server<tr::inproc>::create(
        {.core = {.layout = *layout, .workers = W,
                  .replies = {.codec = ashl::codec_id::block, .options = {.bits = 4, .block = 64}}}},
        std::move(*ps::make_policy("asp", pp)), std::move(*node));
    ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
    up = true;
    srv->run(stop);
  });
  while (!up) std::this_thread::sleep_for(1ms);
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = 0.25f + static_cast<float>(i % 17) * 1e-2f;
  for (std::uint32_t k = 0; k < W; ++k) {
    const reply_case& c = cases[k];
    std::vector<float> w(n);
    reply_tamper tp{{node_of(fabric)}, c.nth, c.edit};
    auto wk = ps::worker<reply_tamper>::create({.rank = k, .servers = {"server0"}, .timeout = 10s}, std::move(tp), w);
    ASHL_REQUIRE(wk.has_value(), (wk ? "" : wk.error().message()));
    ashl::status st;
    int cycle = 0;
    std::vector<float> before;
    for (; cycle < 3 && st.ok(); ++cycle) {
      before = w;
      while (!wk->iteration_done()) {}
      ASHL_REQUIRE(wk->commit(g).ok());
      st = wk->wait();
    }
    const auto tel = wk->telemetry();
    if (!c.edit) {
      ASHL_TEST(st.ok(), st.message());
      ASHL_TEST(tel.compressed_replies == 3u, tel.compressed_replies);
      (void)wk->leave();
      continue;
    }
    ASHL_TEST(!st.ok(), c.name);
    ASHL_TEST(cycle == std::max(c.nth, 1), c.name << ": failed in cycle " << cycle);
    ASHL_TEST((st.code() == ashl::errc::malformed), c.name << ": " << st.message());
    ASHL_TEST(contains(st.message(), c.says), c.name << ": " << st.message());
    ASHL_TEST(tel.bad_messages == 1u, c.name);
    ASHL_TEST(std::memcmp(w.data(), before.data(), n * sizeof(float)) == 0, c.name << ": the caller's parameters changed");
  }
  stop = true;
  server.join();
}

BOOST_AUTO_TEST_CASE(a_part_size_below_4096_is_refused_by_name) {
  auto fabric = tr::inproc_fabric::create({});
  auto layout = ps::shard_layout::even(100, 1);
  ps::policy_params pp;
  pp.workers = 1;
  auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = 1}, .reply_part_bytes = 4095},
                                            std::move(*ps::make_policy("asp", pp)), node_of(fabric));
  ASHL_REQUIRE(!srv.has_value());
  ASHL_TEST(contains(srv.error().message(), "server.reply_part_bytes = 4095: must be 0 (one message) or >= 4096"),
            srv.error().message());
}

// Issue 44, item 6: durations and counts a caller gives are bounded by
// name (rules/job_limits.hpp), before any deadline is computed from them.
BOOST_AUTO_TEST_CASE(durations_and_server_counts_past_their_bounds_are_refused_by_name) {
  auto fabric = tr::inproc_fabric::create({});
  std::vector<float> w(8, 0.0f);
  auto refused = [&](ps::worker_params p) {
    auto wk = ps::worker<tr::inproc>::create(std::move(p), node_of(fabric), w);
    BOOST_REQUIRE(!wk.has_value());
    return wk.error().message();
  };
  using std::chrono::milliseconds;
  ASHL_TEST(contains(refused({.servers = {"s"}, .timeout = milliseconds(std::int64_t{1} << 62)}),
                     "worker.timeout_ms = 4611686018427387904: must be at most 1000000000 seconds"));
  ASHL_TEST(contains(refused({.servers = {"s"}, .reconnect = milliseconds(std::int64_t{1} << 62)}),
                     "worker.reconnect_ms = 4611686018427387904: must be at most 1000000000 seconds"));
  ASHL_TEST(contains(refused({.servers = {"s"}, .progress_seconds = 1e300}), "worker.progress_seconds"));
  // docs/elastic.md §4.5: one backup address per server (or none), and a failover attempt > 0.
  ASHL_TEST(contains(refused({.servers = {"s", "t"}, .backups = {"b"}}),
                     "worker.backups = 1: must list one address per server (2; an empty one for a shard without a "
                     "backup) or none"));
  ASHL_TEST(contains(refused({.servers = {"s"}, .failover_attempt = milliseconds(0)}),
                     "worker.failover_attempt_ms = 0: must be > 0"));
  ASHL_TEST(contains(refused({.servers = std::vector<std::string>(1025, "s")}),
                     "worker.servers = 1025: must be at most 1024 addresses (ps::max_servers)"));
  auto layout = ps::shard_layout::even(100, 1);
  ps::policy_params pp;
  pp.workers = 1;
  auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = 1},
                                             .worker_timeout = milliseconds(std::int64_t{1} << 62)},
                                            std::move(*ps::make_policy("asp", pp)), node_of(fabric));
  ASHL_REQUIRE(!srv.has_value());
  ASHL_TEST(contains(srv.error().message(), "server.worker_timeout_ms = 4611686018427387904: must be at most"),
            srv.error().message());
}

// Lanes without CRC (server_params / worker_params trust_local_lanes, wire
// flag `unchecked`; docs/ps.md "Lanes without CRC"): over a fabric whose
// peers are on this host, a server and a worker that both trust such lanes
// send commits and replies with no CRC and compute none (not for the new
// version either), and end where checked lanes end; a lane not on this host
// keeps its CRC; an end that does not trust the lane refuses an unchecked
// message by name and nothing is applied.
namespace {
struct lane_run {
  std::vector<float> params;
  ps::server_telemetry server{};
  ps::worker_telemetry worker{};
  std::uint64_t checksum_passes = 0, checksums_in_apply = 0, version = 0;
  ashl::status failed{};
};
lane_run run_lanes(bool same_host, bool server_trusts, bool worker_trusts) {
  constexpr std::size_t n = 3000;
  auto fabric = tr::inproc_fabric::create({.eager_bytes = 1024, .same_host = same_host});
  auto layout = ps::shard_layout::even(n, 1);
  std::atomic<bool> stop{false}, up{false};
  lane_run out;
  std::thread server([&] {
    auto node = fabric->node("server0");
    ASHL_REQUIRE(node.has_value());
    ps::policy_params pp;
    pp.workers = 1;
    auto srv = ps::server<tr::inproc>::create({.core = {.layout = *layout, .workers = 1}, .trust_local_lanes = server_trusts},
                                              std::move(*ps::make_policy("asp", pp)), std::move(*node));
    ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
    up = true;
    srv->run(stop);
    out.server = srv->telemetry();
    out.checksum_passes = srv->core().checksum_passes();
    out.checksums_in_apply = srv->core().checksums_in_apply();
    out.version = srv->core().version();
  });
  while (!up) std::this_thread::sleep_for(1ms);
  std::vector<float> w(n), g(n);
  auto wk = ps::worker<tr::inproc>::create({.servers = {"server0"}, .timeout = 10s, .trust_local_lanes = worker_trusts},
                                           node_of(fabric), w);
  if (!wk) {
    out.failed = wk.error();
  } else {
    for (int c = 0; c < 5 && out.failed.ok(); ++c) {
      for (std::size_t i = 0; i < n; ++i) g[i] = grad_value(0, static_cast<std::uint64_t>(c), i);
      while (!wk->iteration_done()) {}
      out.failed = wk->commit(g);
      if (out.failed.ok()) out.failed = wk->wait();
    }
    out.worker = wk->telemetry();
    if (out.failed.ok()) (void)wk->leave();
  }
  out.params = w;
  stop = true;
  server.join();
  return out;
}
}  // namespace

BOOST_AUTO_TEST_CASE(trusted_lanes_on_this_host_go_without_crc_and_end_where_checked_ones_do) {
  const lane_run checked = run_lanes(true, false, false);
  BOOST_TEST_REQUIRE(checked.failed.ok(), checked.failed.message());
  BOOST_TEST(checked.server.unchecked_in == 0u);
  BOOST_TEST(checked.worker.unchecked_in == 0u);
  BOOST_TEST(checked.checksums_in_apply + checked.checksum_passes >= 5u);  // every reply's version checksummed

  const lane_run trusted = run_lanes(true, true, true);
  BOOST_TEST_REQUIRE(trusted.failed.ok(), trusted.failed.message());
  BOOST_TEST(std::memcmp(trusted.params.data(), checked.params.data(), checked.params.size() * sizeof(float)) == 0);
  BOOST_TEST(trusted.version == 5u);
  BOOST_TEST(trusted.worker.unchecked_out == 5u);  // every commit
  BOOST_TEST(trusted.server.unchecked_in == 5u);
  BOOST_TEST(trusted.server.unchecked_out == 6u);  // the join's reply and one per commit
  BOOST_TEST(trusted.worker.unchecked_in == 6u);
  BOOST_TEST(trusted.checksum_passes == 0u);       // no version CRC: not in the applies, not at the pins
  BOOST_TEST(trusted.checksums_in_apply == 0u);

  const lane_run remote = run_lanes(false, true, true);  // trusted, but not on this host: CRCs kept
  BOOST_TEST_REQUIRE(remote.failed.ok(), remote.failed.message());
  BOOST_TEST(remote.worker.unchecked_out == 0u);
  BOOST_TEST(remote.server.unchecked_out == 0u);
  BOOST_TEST(std::memcmp(remote.params.data(), checked.params.data(), checked.params.size() * sizeof(float)) == 0);

  const lane_run server_distrusts = run_lanes(true, false, true);  // the commit comes unchecked: refused
  BOOST_TEST(!server_distrusts.failed.ok());
  BOOST_TEST(contains(server_distrusts.failed.message(), "unchecked (no CRC) is taken only from a peer on this host"),
             server_distrusts.failed.message());
  BOOST_TEST(server_distrusts.version == 0u);
  BOOST_TEST(server_distrusts.server.unchecked_in == 0u);

  const lane_run worker_distrusts = run_lanes(true, true, false);  // the join's reply comes unchecked: refused
  BOOST_TEST(!worker_distrusts.failed.ok());
  BOOST_TEST(contains(worker_distrusts.failed.message(), "unchecked (no CRC) is taken only from a peer on this host"),
             worker_distrusts.failed.message());
  BOOST_TEST(worker_distrusts.version == 0u);
}
