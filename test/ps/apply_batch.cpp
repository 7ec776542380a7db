// Batched applies (docs/ps.md "Batched applies": fan-in from several receive buffers;
// server_core::defer_dense_applies, server_params.apply_batch). Commits that
// arrive together wait and are added in one pass over the parameters, each
// chunk taking every add in arrival order. What must hold:
// - server_core: the parameters, every reply's CRC and the counters are
//   bit-identical to applying each commit as it comes, for every dense codec,
//   with 1 and 2 apply threads, with versions pinned by replies (a pin, a
//   round, any other change applies what waits first), batches cut anywhere;
//   a sparse codec, an sgd server and BSP's rounds never wait;
// - ps::server: commits that one progress pass delivered into receive buffers
//   are applied in one pass, the parameters and the replies the workers get
//   bit-identical to a server that applies each as it arrives; a second
//   commit of a worker in the batch, a tight receive budget and a checkpoint
//   cut the batch without changing a bit; a commit in parts joins the batch
//   with its last part, its earlier parts cutting nothing; nothing allocates
//   once warm; a bad apply_batch is refused by name.
#include <ashl/rules/server_core.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/checks.hpp"
#include "../support/apply_payloads.hpp"
#include "../support/counting_new.hpp"

#include <ashl/compress/cast.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/rules/apply_pool.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/sync/asp.hpp>
#include <ashl/sync/bsp.hpp>
#include <ashl/transport/inproc.hpp>
#include <ashl/wire/crc32c.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

namespace ps = ashl::ps;
namespace sync = ashl::sync;
namespace tr = ashl::transport;
namespace w = ashl::wire;
using ashl::codec_id;
using ashl::dtype;

// Above 2 x min_part_elements (a pool of 2 splits it) and not a multiple of
// 16, so the last chunk ends in a SIMD tail.
constexpr std::size_t n = 3 * ps::server_core<>::min_part_elements + 37;

using apply_payloads::encode;
using apply_payloads::value;

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct outcome {
  std::vector<float> w;
  std::vector<std::uint32_t> crcs;  // every reply's, in order
  std::uint64_t applied = 0, version = 0, batched = 0, passes = 0;
};

// 3 workers x 6 commits, interleaved, payloads kept until apply_pending();
// every third commit carries a pull (one of them a push's: ack only), whose
// reply pins the version across the next commits; apply_pending() every
// `cut` commits (the driver's end of a progress pass).
template <class Policy>
outcome drive(Policy policy, const ps::optimizer_params& opt, codec_id codec, unsigned threads, std::uint32_t batch,
              std::uint32_t cut) {
  auto made = apply_payloads::make_core(std::move(policy), opt, n, 3, threads);
  auto& core = made.core;
  core->defer_dense_applies(batch);
  ps::server_actions out(3);
  outcome r;
  std::vector<std::vector<std::byte>> kept;  // what a driver's receive buffers hold until apply_pending()
  kept.reserve(18);
  std::uint64_t pinned = ~std::uint64_t{0};
  std::uint32_t since_cut = 0;
  for (std::uint64_t seq = 1; seq <= 6; ++seq)
    for (std::uint32_t wk = 0; wk < 3; ++wk) {
      std::vector<float> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = value(wk, seq, i);
      kept.push_back(encode(codec, g));
      const std::uint64_t k = (seq - 1) * 3 + wk;
      const ps::commit_in c{.worker = wk, .sequence = seq, .clock = seq, .bytes = kept.back().size(), .codec = codec,
                            .element_count = n, .payload = kept.back(), .pull = k % 3 == 2, .ack_only = k == 5,
                            .payload_kept = true};
      core->commit(c, 0.0, out);
      BOOST_REQUIRE(out.errors().empty());
      if (!out.pull_replies().empty() && !c.ack_only) {
        if (pinned != ~std::uint64_t{0}) core->unpin_parameters(pinned);
        const auto pv = core->pin_parameters();  // applies what waits first
        BOOST_TEST(core->pending_applies() == 0u);
        BOOST_TEST(pv.crc == w::crc32c(std::as_bytes(pv.values)));
        r.crcs.push_back(pv.crc);
        pinned = pv.version;
      }
      out.clear();
      if (++since_cut == cut) {
        core->apply_pending();
        since_cut = 0;
      }
    }
  core->apply_pending();
  core->drain(out);
  if (pinned != ~std::uint64_t{0}) core->unpin_parameters(pinned);
  r.crcs.push_back(core->pin_parameters().crc);
  r.w.assign(core->parameters().begin(), core->parameters().end());
  r.applied = core->stats().commits_applied;
  r.version = core->version();
  r.batched = core->batched_commits();
  r.passes = core->batched_passes();
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(batched_adds_are_bit_identical_to_one_at_a_time) {
  const ps::optimizer_params delta{};
  const ps::optimizer_params sgd{.mode = ps::optimizer_params::kind::sgd, .lr = 0.3, .momentum = 0.9};
  for (codec_id codec : {codec_id::identity, codec_id::fp16, codec_id::bf16, codec_id::topk})
    for (const ps::optimizer_params* opt : {&delta, &sgd})
      for (bool rounds : {false, true})
        for (unsigned threads : {1u, 2u}) {
          auto run = [&](std::uint32_t batch, std::uint32_t cut) {
            return rounds ? drive(sync::bsp{{.workers = 3}}, *opt, codec, threads, batch, cut)
                          : drive(sync::asp{{.workers = 3}}, *opt, codec, threads, batch, cut);
          };
          const outcome one = run(1, 1);
          BOOST_TEST_CONTEXT(to_string(codec) << (opt == &sgd ? " sgd" : " model deltas") << (rounds ? " bsp" : " asp")
                                              << ", " << threads << " threads") {
            BOOST_TEST(one.applied == 18u);
            BOOST_TEST(one.batched == 0u);
            // Batches of up to 2, 4 and 16, cut every 1, 2, 5 and 18 commits.
            for (std::uint32_t batch : {2u, 4u, 16u})
              for (std::uint32_t cut : {1u, 2u, 5u, 18u}) {
                const outcome b = run(batch, cut);
                BOOST_TEST(same_bits(b.w, one.w), "batch " << batch << ", cut " << cut);
                BOOST_TEST(b.crcs == one.crcs, "batch " << batch << ", cut " << cut);
                BOOST_TEST(b.applied == one.applied);
                BOOST_TEST(b.version == one.version);
                const bool waits = !rounds && opt == &delta && codec != codec_id::topk;
                if (!waits) BOOST_TEST(b.batched == 0u, "only dense model deltas applied at once wait");
                if (waits && cut >= 2) BOOST_TEST(b.batched > b.passes, "some pass added several commits");
              }
          }
        }
}

namespace {

tr::inproc node_of(const std::shared_ptr<tr::inproc_fabric>& f, const std::string& name = "") {
  auto r = f->node(name);
  ASHL_REQUIRE(r.has_value());
  return std::move(*r);
}

constexpr std::size_t m = 4096;  // the model of the driver tests (16 KiB: rendezvous above 256 bytes)

// A worker's side, raw: joins as `rank`, sends commits, keeps the last
// pull reply's values (copied into a buffer allocated once).
struct client {
  struct handler {
    std::vector<std::byte> buf = std::vector<std::byte>(1 << 16);
    std::vector<float> reply = std::vector<float>(m);
    std::uint64_t replies = 0, acks = 0, errors = 0;
    std::span<std::byte> receive_buffer(tr::peer_id, std::span<const std::byte>, std::size_t k) {
      return k <= buf.size() ? std::span<std::byte>(buf.data(), k) : std::span<std::byte>{};
    }
    void on_message(tr::peer_id, std::span<const std::byte> head, std::span<const std::byte> data) {
      auto msg = w::decode(head, data, {});
      ASHL_REQUIRE(msg.has_value());
      if (msg->header.kind == w::message_kind::error) ++errors;
      if (msg->header.kind != w::message_kind::pull_reply) return;
      if (msg->payload.empty()) {
        ++acks;
        return;
      }
      ASHL_REQUIRE(msg->payload.size() == m * sizeof(float));
      std::memcpy(reply.data(), msg->payload.data(), msg->payload.size());
      ++replies;
    }
    void on_sent(tr::peer_id, std::uint64_t, const ashl::status&) {}
    void on_peer(tr::peer_id, tr::peer_event, const ashl::status&) {}
  };
  explicit client(tr::inproc node) : t(std::move(node)) {}
  tr::inproc t;
  tr::peer_id peer = tr::no_peer;
  handler h;
  std::uint32_t rank = 0;
  std::vector<std::array<std::byte, w::header_bytes>> heads;  // sealed before any count starts
  std::vector<std::vector<float>> grads;
  struct slice {
    std::size_t grad, first, count;  // message j sends grads[grad][first, first + count)
  };
  std::vector<slice> slices;

  void progress() { t.progress(h); }
};

// A server (ASP, model deltas) fed by `clients` raw workers, each sending the
// same messages in the same order for any apply_batch.
struct rig {
  std::shared_ptr<tr::inproc_fabric> fabric;
  ashl::result<ps::server<tr::inproc>> srv;
  std::vector<client> clients;

  using configure = std::function<void(ps::server_params&)>;
  rig(std::uint32_t count, std::uint32_t batch, const configure& more = [](ps::server_params&) {},
      std::size_t eager_bytes = 256)
      : fabric(tr::inproc_fabric::create({.eager_bytes = eager_bytes, .deterministic = true})),
        srv(make(count, batch, more)) {
    ASHL_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
    clients.reserve(count);
    for (std::uint32_t k = 0; k < count; ++k) {
      client& c = clients.emplace_back(node_of(fabric));
      c.rank = k;
      c.peer = *c.t.connect("server0");
      pump();
      std::array<std::byte, w::encoded_size(w::join_body::wire_bytes)> join{};
      ASHL_REQUIRE(w::encode(w::header{.rank = k}, w::join_body{.incarnation = 1, .batch = 4}, join).has_value());
      ASHL_REQUIRE(c.t.send(c.peer, std::span<const std::byte>(join).first(w::header_bytes),
                            std::span<const std::byte>(join).subspan(w::header_bytes), 0).ok());
      pump();
    }
  }
  ashl::result<ps::server<tr::inproc>> make(std::uint32_t count, std::uint32_t batch, const configure& more) {
    ps::policy_params pp;
    pp.workers = count;
    ps::server_params sp{.core = {.layout = *ps::shard_layout::even(m, 1), .workers = count}, .apply_batch = batch};
    more(sp);
    return ps::server<tr::inproc>::create(std::move(sp), std::move(*ps::make_policy("asp", pp)), node_of(fabric, "server0"),
                                          initial());
  }
  static std::vector<float> initial() {
    std::vector<float> w0(m);
    for (std::size_t i = 0; i < m; ++i) w0[i] = value(9, 0, i);
    return w0;
  }
  void pump() {
    for (int i = 0; i < 4; ++i) {
      srv->poll();
      for (client& c : clients) c.progress();
    }
  }
  static w::header head(std::uint32_t k, std::uint64_t seq, bool pull) {
    return {.kind = w::message_kind::commit, .flags = w::flag_last_shard | (pull ? w::flag_pull : 0u),
            .element_count = m, .rank = k, .sequence = seq, .clock = seq, .samples = 4};
  }
  // Seals commit `seq` of client k (a pull riding when pull), kept for send().
  void prepare(std::uint32_t k, std::uint64_t seq, bool pull) {
    client& c = clients[k];
    c.grads.emplace_back(m);
    for (std::size_t i = 0; i < m; ++i) c.grads.back()[i] = value(k, seq, i);
    const w::header h = head(k, seq, pull);
    c.heads.emplace_back();
    ASHL_REQUIRE(w::seal_header(h, std::as_bytes(std::span<const float>(c.grads.back())), c.heads.back()).ok());
    c.slices.push_back({c.grads.size() - 1, 0, m});
  }
  // The same commit in `parts` parts (wire flag part): `parts` messages.
  void prepare_parts(std::uint32_t k, std::uint64_t seq, bool pull, std::uint16_t parts) {
    client& c = clients[k];
    c.grads.emplace_back(m);
    for (std::size_t i = 0; i < m; ++i) c.grads.back()[i] = value(k, seq, i);
    for (std::uint16_t j = 0; j < parts; ++j) {
      w::header h = head(k, seq, pull);
      h.flags |= w::flag_part;
      h.part = j;
      h.parts = parts;
      const w::part_range pr = w::part_elements(m, parts, j);
      c.heads.emplace_back();
      ASHL_REQUIRE(w::seal_header(h, std::as_bytes(std::span<const float>(c.grads.back()).subspan(pr.first, pr.count)),
                                  c.heads.back())
                       .ok());
      c.slices.push_back({c.grads.size() - 1, pr.first, pr.count});
    }
  }
  void send(std::uint32_t k, std::size_t j) {
    client& c = clients[k];
    const client::slice& sl = c.slices[j];
    ASHL_REQUIRE(c.t.send(c.peer, c.heads[j],
                          std::as_bytes(std::span<const float>(c.grads[sl.grad]).subspan(sl.first, sl.count)), 0)
                     .ok());
  }
  [[nodiscard]] std::vector<float> params() const { return {srv->parameters().begin(), srv->parameters().end()}; }
};

// Rounds of: every client sends its next commit (half of them with a pull
// riding), then one progress pass of the server (which sees them all), then
// the clients take their replies. In round 3 client 0 sends two commits
// (the second cuts the batch).
struct run_result {
  std::vector<float> w;
  std::vector<std::vector<float>> replies;
  ps::server_telemetry tel;
};
run_result run_rounds(std::uint32_t batch, int rounds, const rig::configure& more = [](ps::server_params&) {},
                      bool checkpoint = false) {
  constexpr std::uint32_t count = 4;
  rig r(count, batch, more);
  for (std::uint32_t k = 0; k < count; ++k) {
    std::uint64_t seq = 0;
    for (int c = 0; c < rounds; ++c) {
      r.prepare(k, ++seq, (c + k) % 2 == 0);
      if (c == 3 && k == 0) r.prepare(k, ++seq, false);
    }
  }
  std::vector<std::size_t> next(count, 0);
  for (int c = 0; c < rounds; ++c) {
    for (std::uint32_t k = 0; k < count; ++k) {
      r.send(k, next[k]++);
      if (c == 3 && k == 0) r.send(k, next[k]++);
    }
    r.srv->poll();
    for (client& cl : r.clients) cl.progress();
  }
  r.pump();
  if (checkpoint) ASHL_REQUIRE(r.srv->checkpoint().ok());  // after the periodic one in flight
  run_result out{r.params(), {}, r.srv->telemetry()};
  for (const client& cl : r.clients) {
    ASHL_TEST(cl.h.errors == 0u);
    out.replies.push_back(cl.h.reply);
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_server_applies_commits_that_arrive_together_in_one_pass) {
  const run_result one = run_rounds(1, 8);
  ASHL_TEST(one.tel.core.commits_applied == 33u);
  ASHL_TEST(one.tel.batched_applies == 0u);
  // One at a time, a reply carries the version its commit made: client 1's
  // last one lacks clients 2 and 3's last commits.
  ASHL_TEST(!same_bits(one.replies[1], one.w));
  ASHL_TEST(same_bits(one.replies[3], one.w));
  for (std::uint32_t batch : {2u, 4u, 64u}) {
    const run_result b = run_rounds(batch, 8);
    ASHL_TEST(same_bits(b.w, one.w), "apply_batch " << batch);
    // A batch's replies leave after its pass: in the last round (clients 1
    // and 3 pull) both carry the version the whole round made, the final one
    // (a reply is never older than without batching).
    if (batch >= 4) {
      ASHL_TEST(same_bits(b.replies[1], b.w), "apply_batch " << batch << ": client 1's last reply");
      ASHL_TEST(same_bits(b.replies[3], b.w), "apply_batch " << batch << ": client 3's last reply");
    }
    ASHL_TEST(b.tel.core.commits_applied == one.tel.core.commits_applied);
    ASHL_TEST(b.tel.core.steps == one.tel.core.steps);
    ASHL_TEST(b.tel.pull_replies == one.tel.pull_replies);
    ASHL_TEST(b.tel.batched_applies >= 8u, "apply_batch " << batch << ": one pass a round at least");
    // Four commits a round, in passes of at most `batch`; round 3's second
    // commit of client 0 ends its batch and waits in the next.
    ASHL_TEST(b.tel.batched_commits >= 8u * std::min(batch, 4u) - 4u, b.tel.batched_commits);
    ASHL_TEST(b.tel.wire_refused_total() == 0u);
  }
}

// server_core_params::fuse_checks (docs/ps.md "The check and the apply in
// one pass"): the server hands each message to check_message; where the
// apply would write beside a version a reply in flight pins, the check's
// pass computes it. The parameters and every reply are the same bits as
// with the check and the apply apart, one at a time and batched, and the
// fused path is taken (fused_applies) only beside a pinned version, and
// not while commits are batched (their batch's pass serves them).
BOOST_AUTO_TEST_CASE(a_server_applies_beside_a_pinned_version_from_the_check_pass) {
  auto fuse = [](ps::fused_apply f) { return [f](ps::server_params& sp) { sp.core.fuse_checks = f; }; };
  for (std::uint32_t batch : {1u, 4u}) {
    const run_result off = run_rounds(batch, 8, fuse(ps::fused_apply::off));
    for (ps::fused_apply f : {ps::fused_apply::beside, ps::fused_apply::always}) {
      const run_result on = run_rounds(batch, 8, fuse(f));
      ASHL_TEST(same_bits(on.w, off.w), "apply_batch " << batch);
      for (std::size_t k = 0; k < on.replies.size(); ++k)
        ASHL_TEST(same_bits(on.replies[k], off.replies[k]), "apply_batch " << batch << ", client " << k);
      ASHL_TEST(on.tel.core.commits_applied == off.tel.core.commits_applied);
      ASHL_TEST(on.tel.pull_replies == off.tel.pull_replies);
      ASHL_TEST(on.tel.wire_refused_total() == 0u);
      if (batch == 1 && f == ps::fused_apply::beside) {
        ASHL_TEST(on.tel.fused_applies > 0u, "no commit was applied from the check pass");
        ASHL_TEST(on.tel.fused_applies <= on.tel.applied_beside);
      }
      if (batch == 1 && f == ps::fused_apply::always)
        ASHL_TEST(on.tel.fused_applies == on.tel.core.commits_applied - on.tel.fused_wasted);
      if (batch > 1) ASHL_TEST(on.tel.fused_applies == 0u, "a batch's commits wait for its pass");
    }
    ASHL_TEST(off.tel.fused_applies == 0u);
  }
}

// A receive budget of two messages: the batch's buffers go back (its commits
// applied) before a third receive would be refused; the same bits.
BOOST_AUTO_TEST_CASE(a_tight_receive_budget_cuts_the_batch_not_a_message) {
  const run_result one = run_rounds(1, 6);
  const run_result b = run_rounds(8, 6, [](ps::server_params& sp) { sp.max_receive_bytes = 2 * (m * sizeof(float)); });
  ASHL_TEST(same_bits(b.w, one.w));
  ASHL_TEST(b.tel.wire_refused_for(ps::wire_refusal::receive_budget) == 0u);
  ASHL_TEST(b.tel.core.commits_applied == one.tel.core.commits_applied);
  ASHL_TEST(b.tel.batched_applies > 0u);
}

// Checkpoints every 3 commits while batches wait: each checkpoint, restored
// into a new server, holds exactly the commits it counts, the parameters
// bit-identical to the same commits applied one at a time on a bare core in
// the order the server took them (round by round, client 0 to 3; client 0
// twice in round 3).
BOOST_AUTO_TEST_CASE(every_checkpoint_holds_exactly_the_commits_it_counts) {
  const auto dir = std::filesystem::temp_directory_path() / ("ashl-apply-batch-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "run");
  std::mutex mu;
  std::vector<std::pair<ps::checkpoint_meta, std::vector<std::byte>>> states;
  constexpr int rounds = 6;
  const run_result b = run_rounds(8, rounds, [&](ps::server_params& sp) {
    sp.checkpoint_dir = (dir / "run").string();
    sp.checkpoint_every_commits = 3;
    sp.checkpoint_write = [&](const std::string& file, const ps::checkpoint_meta& meta, std::span<const std::byte> st) {
      {
        std::lock_guard lk(mu);
        states.emplace_back(meta, std::vector<std::byte>(st.begin(), st.end()));
      }
      return ps::write_checkpoint(file, meta, st);
    };
  }, true);
  ASHL_TEST(b.tel.batched_applies > 0u);

  // The reference: a bare core, the same commits one at a time.
  ps::policy_params pp;
  pp.workers = 4;
  auto core = ps::server_core<>::create({.layout = *ps::shard_layout::even(m, 1), .workers = 4},
                                        std::move(*ps::make_policy("asp", pp)), rig::initial());
  ASHL_REQUIRE(core.has_value());
  ps::server_actions out(4);
  for (std::uint32_t k = 0; k < 4; ++k) core->join(k, 1, 0.0, out);
  std::vector<std::vector<float>> after{rig::initial()};  // after[K]: the parameters after K commits
  std::vector<std::uint64_t> seq(4, 0);
  for (int c = 0; c < rounds; ++c)
    for (std::uint32_t k = 0; k < 4; ++k)
      for (int twice = 0; twice < (c == 3 && k == 0 ? 2 : 1); ++twice) {
        ++seq[k];
        std::vector<float> g(m);
        for (std::size_t i = 0; i < m; ++i) g[i] = value(k, seq[k], i);
        const auto bytes = std::as_bytes(std::span<const float>(g));
        out.clear();
        core->commit({.worker = k, .incarnation = 1, .sequence = seq[k], .clock = seq[k], .samples = 4,
                      .bytes = w::header_bytes + bytes.size(), .element_count = m, .payload = bytes,
                      .pull = (c + static_cast<int>(k)) % 2 == 0 && twice == 0},
                     0.0, out);
        after.emplace_back(core->parameters().begin(), core->parameters().end());
      }
  ASHL_REQUIRE(after.size() == 26u);
  ASHL_TEST(same_bits(after.back(), b.w));

  // A periodic one mid-run (others may merge while one is being written), and the final one.
  ASHL_TEST(states.size() >= 2u, states.size());
  ASHL_TEST(states.front().first.commits_applied < 25u, states.front().first.commits_applied);
  for (const auto& [meta, st] : states) {
    std::filesystem::remove_all(dir / "restore");
    std::filesystem::create_directories(dir / "restore");
    ASHL_REQUIRE(ps::write_checkpoint(ps::checkpoint_file((dir / "restore").string(), 0), meta, st).ok());
    auto fabric = tr::inproc_fabric::create({});
    auto restored = ps::server<tr::inproc>::create(
        {.core = {.layout = *ps::shard_layout::even(m, 1), .workers = 4}, .checkpoint_dir = (dir / "restore").string(),
         .restore = true},
        std::move(*ps::make_policy("asp", pp)), node_of(fabric));
    ASHL_REQUIRE(restored.has_value(), (restored ? "" : restored.error().message()));
    const std::uint64_t k = restored->core().stats().commits_applied;
    ASHL_TEST(k == meta.commits_applied);
    ASHL_REQUIRE(k < after.size());
    ASHL_TEST(same_bits(restored->parameters(), after[k]), "the checkpoint of " << k << " commits");
  }
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(batched_applies_allocate_nothing_once_warm) {
  constexpr std::uint32_t count = 4;
  constexpr int warmup = 4, measured = 20;
  rig r(count, 8);
  for (std::uint32_t k = 0; k < count; ++k)
    for (int c = 0; c < warmup + measured; ++c) r.prepare(k, static_cast<std::uint64_t>(c) + 1, (c + k) % 2 == 0);
  auto round = [&](int c) {
    for (std::uint32_t k = 0; k < count; ++k) r.send(k, static_cast<std::size_t>(c));
    r.srv->poll();
    for (client& cl : r.clients) cl.progress();
  };
  for (int c = 0; c < warmup; ++c) round(c);
  const std::size_t before = counting_new::count();
  for (int c = warmup; c < warmup + measured; ++c) round(c);
  const std::size_t after = counting_new::count();
  ASHL_TEST(after == before, "allocations in " << measured << " batched rounds: " << after - before);
  ASHL_TEST(r.srv->core().stats().commits_applied == std::uint64_t{count} * (warmup + measured));
  ASHL_TEST(r.srv->telemetry().batched_commits >= std::uint64_t{count} * measured);
}

// A commit in parts beside whole ones: a part that does not end its commit
// has no reply to wait for and joins no batch, so the worker's next part
// does not cut the batch; the commit its last part ends waits in the batch
// like a whole one. Client 3 commits in 4 parts, sent between the other
// clients' whole commits, each round in one progress pass: one pass adds all
// four commits, the parameters after every round bit-identical to a server
// that applies each as it comes, and every reply carrying the version after
// its round's pass. Parts received into the staging (rendezvous) and copied
// there (eager); no receive buffer stays lent.
BOOST_AUTO_TEST_CASE(parts_of_a_commit_in_progress_do_not_cut_the_batch) {
  constexpr std::uint32_t count = 4;
  constexpr std::uint16_t parts = 4;  // 4 KiB a part; whole commits 16 KiB
  constexpr int rounds = 6;
  for (const std::size_t eager : {std::size_t{256}, std::size_t{8192}}) {
    struct parts_run : run_result {
      std::vector<std::vector<float>> rounds;  // the parameters after each round
    };
    // Whole clients pull in rounds c with (c + k) even, client 3 in odd ones.
    auto pulls = [](std::uint32_t k, int c) { return k + 1 < count ? (c + static_cast<int>(k)) % 2 == 0 : c % 2 != 0; };
    auto run = [&](std::uint32_t batch) {
      parts_run out;
      rig r(count, batch, [](ps::server_params&) {}, eager);
      for (int c = 0; c < rounds; ++c) {
        const auto seq = static_cast<std::uint64_t>(c) + 1;
        for (std::uint32_t k = 0; k + 1 < count; ++k) r.prepare(k, seq, pulls(k, c));
        r.prepare_parts(count - 1, seq, pulls(count - 1, c), parts);
      }
      for (int c = 0; c < rounds; ++c) {
        const auto at = static_cast<std::size_t>(c);
        for (std::uint32_t k = 0; k + 1 < count; ++k) {
          r.send(count - 1, parts * at + k);
          r.send(k, at);
        }
        r.send(count - 1, parts * at + parts - 1);
        r.srv->poll();
        for (client& cl : r.clients) cl.progress();
        out.rounds.push_back(r.params());
      }
      r.pump();
      out.w = r.params();
      out.tel = r.srv->telemetry();
      for (const client& cl : r.clients) {
        ASHL_TEST(cl.h.errors == 0u);
        out.replies.push_back(cl.h.reply);
      }
      return out;
    };
    BOOST_TEST_CONTEXT((eager > 4096 ? "eager parts" : "rendezvous parts")) {
      const parts_run one = run(1);
      const parts_run b = run(count);
      ASHL_TEST(one.tel.core.commits_applied == count * rounds);
      ASHL_TEST(b.tel.core.commits_applied == count * rounds);
      ASHL_TEST(b.tel.commits_in_parts == std::uint64_t{rounds});
      ASHL_TEST(same_bits(b.w, one.w));
      for (int c = 0; c < rounds; ++c) ASHL_TEST(same_bits(b.rounds[c], one.rounds[c]), "round " << c);
      for (std::uint32_t k = 0; k < count; ++k) {
        const int last = pulls(k, rounds - 1) ? rounds - 1 : rounds - 2;  // the round of client k's last pull
        ASHL_TEST(same_bits(b.replies[k], b.rounds[last]), "client " << k << "'s last reply, of round " << last);
      }
      ASHL_TEST(b.tel.batched_applies == std::uint64_t{rounds}, b.tel.batched_applies);
      ASHL_TEST(b.tel.batched_commits == std::uint64_t{count} * rounds, b.tel.batched_commits);
      ASHL_TEST(b.tel.receive_bytes_lent == 0u);
      ASHL_TEST(b.tel.wire_refused_total() == 0u);
    }
  }
}

BOOST_AUTO_TEST_CASE(apply_batch_out_of_range_is_refused_by_name) {
  auto fabric = tr::inproc_fabric::create({});
  ps::policy_params pp;
  pp.workers = 1;
  for (const std::uint32_t bad : {0u, 65u}) {
    auto s = ps::server<tr::inproc>::create({.core = {.layout = *ps::shard_layout::even(64, 1), .workers = 1},
                                             .apply_batch = bad},
                                            std::move(*ps::make_policy("asp", pp)), node_of(fabric));
    ASHL_REQUIRE(!s.has_value());
    ASHL_TEST(s.error().message().find("server.apply_batch = " + std::to_string(bad) + ": must be in 1..64") !=
                  std::string::npos,
              s.error().message());
  }
}
