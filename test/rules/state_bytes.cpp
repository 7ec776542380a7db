// Saved states keep their bytes: states written by the hand-written
// save/load sequences (before the field tables drove them) load into fresh
// objects and save again byte for byte. test/rules/data/state_bytes.inc holds
// them: every policy of ps::make_policy mid-run (during ASHL's profiling and
// after its switch), and server cores (SSP with momentum SGD and buffered
// commits, ADSP over a store of top-k commits, async DiLoCo's outer
// optimizer mid-way between Delayed Nesterov's folds). Regenerate it only when a
// format changes on purpose (and bump that section's version):
//   ASHL_WRITE_STATE_BYTES=test/rules/data/state_bytes.inc build/release/test/test_rules_state_bytes
// and keep the old version's bytes loading: test/rules/data/state_bytes_pscr2.inc
// holds the server cores as PSCR version 2 wrote them (before max_workers,
// docs/elastic.md §2.2), which must load and save as today's version 3;
// test/rules/data/state_bytes_ashl1.inc holds the ASHL policies as ASHL
// version 1 wrote them (before the re-profiling window, docs/elastic.md
// §2.4), which must load and save as version 2 with no window open.
// test/rules/data/state_bytes_rond1.inc the round policies as ROND version 1
// wrote them (before pending joins, docs/elastic.md §2.4); core/bsp+sgd of
// the PSCR version 2 states holds a ROND version 1 section too.
// core/bsp+sgd+ledger is PSCR version 4: a core running the data ledger
// (docs/elastic.md §3.5), its LDGR section after the policy's, mid-epoch
// with a worker suspended; every core without a ledger still saves version
// 3 (the others above), and versions 3 and 2 load as ledger-off.
#include <ashl/rules/server_core.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/ps_policy_cases.hpp"
#include "../support/saved_state.hpp"

#include <ashl/compress/identity.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/rules/policies.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace as = ashl::sync;
namespace ps = ashl::ps;

namespace {

struct saved_state {
  const char* label;
  std::vector<unsigned char> bytes;
};

#include "data/state_bytes.inc"
#include "data/state_bytes_pscr2.inc"
#include "data/state_bytes_ashl1.inc"
#include "data/state_bytes_rond1.inc"

using test_support::saved;

// Every policy after `events` of the shared script.
std::map<std::string, std::vector<std::byte>> policy_states() {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& c : ps_cases::every_policy(4)) {
    for (int events : {40, 700}) {
      auto p = ps::make_policy(c.name, c.params);
      BOOST_REQUIRE_MESSAGE(p.has_value(), c.label);
      ps_cases::script s(4, 3);
      as::outcome_sink sink(6);
      for (int i = 0; i < events; ++i) {
        policy_testing::apply(*p, s.next(), sink);
        sink.clear();
      }
      out["policy/" + c.label + "@" + std::to_string(events)] = saved(*p);
    }
  }
  return out;
}

std::vector<float> ramp(std::size_t n, float base, float step) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = base + step * static_cast<float>(i);
  return v;
}

ps::commit_in commit_of(as::worker_id w, std::uint64_t seq, std::span<const std::byte> payload, std::uint64_t n,
                        ashl::codec_id codec, bool pull) {
  ps::commit_in c;
  c.worker = w;
  c.sequence = seq;
  c.clock = seq;
  c.bytes = payload.size() + 72;
  c.codec = codec;
  c.type = ashl::dtype::f32;
  c.element_count = n;
  c.step = seq;
  c.payload = payload;
  c.pull = pull;
  return c;
}

// A core after a few rounds of commits from three workers, with the last
// commits left buffered (`codec` encodes each update).
template <class Codec>
std::vector<std::byte> core_state(as::any_policy policy, ps::optimizer_params o, Codec codec) {
  constexpr std::uint64_t n = 40;
  auto core = ps::server_core<>::create(
      {.layout = *ps::shard_layout::even(n, 1), .workers = 3, .optimizer = o, .store_bytes = 1 << 16, .seed = 9},
      std::move(policy), ramp(n, 0.5f, -0.01f));
  BOOST_REQUIRE_MESSAGE(core.has_value(), core.to_status().to_string());
  ps::server_actions out(3);
  std::vector<std::byte> buf(codec.max_encoded_bytes(n, ashl::dtype::f32));
  for (std::uint64_t seq = 1; seq < 7; ++seq)
    for (as::worker_id w = 0; w < 3; ++w) {
      const auto x = ramp(n, 0.1f * static_cast<float>(w + seq), 0.003f * static_cast<float>(w + 1));
      auto used = codec.encode(ashl::host_view<const float>(x.data(), n), buf, {.seed = 9, .step = seq, .tensor = 0});
      BOOST_REQUIRE(used.has_value());
      core->commit(commit_of(w, seq, std::span<const std::byte>(buf.data(), *used), n, Codec::id, w != 1),
                   static_cast<double>(seq), out);
      if (seq % 2 == 0 && w == 2) core->pull(1, static_cast<double>(seq), out);
      out.clear();
    }
  core->apply_pending();
  return saved(*core);
}

// A BSP core running the data ledger: three workers joined (one past the
// initial two), commits of a few samples each over rounds, one leave and
// rejoin, one eviction left suspended; the last round's commits buffered.
std::vector<std::byte> ledger_core_state() {
  constexpr std::uint64_t n = 40;
  auto core = ps::server_core<>::create(
      {.layout = *ps::shard_layout::even(n, 1),
       .workers = 2,
       .max_workers = 3,
       .optimizer = {.mode = ps::optimizer_params::kind::sgd, .lr = 0.5},
       .store_bytes = 1 << 16,
       .seed = 9,
       .ledger = {.samples = 300, .shuffle_seed = 5, .lease_samples = 0, .ahead = 1, .give_back_after = 10.0}},
      *ps::make_policy("bsp", ps_cases::base_params("bsp", 2)), ramp(n, 0.5f, -0.01f));
  BOOST_REQUIRE_MESSAGE(core.has_value(), core.to_status().to_string());
  ps::server_actions out(3);
  std::uint64_t inc[3] = {4, 5, 6};
  for (as::worker_id w = 0; w < 3; ++w) core->join(w, inc[w], 0.0, out, 8 + 4 * w);
  std::vector<std::byte> buf(4 * n);
  std::uint64_t seq[3] = {0, 0, 0};
  auto commit = [&](as::worker_id w, double now) {
    const auto x = ramp(n, 0.1f * static_cast<float>(w + seq[w]), 0.003f * static_cast<float>(w + 1));
    auto used = ashl::compress::identity{}.encode(ashl::host_view<const float>(x.data(), n), buf, {});
    BOOST_REQUIRE(used.has_value());
    ++seq[w];
    auto c = commit_of(w, seq[w], std::span<const std::byte>(buf.data(), *used), n, ashl::codec_id::identity, true);
    c.incarnation = inc[w];
    c.samples = 8 + 4 * w + seq[w] % 3;
    core->commit(c, now, out);
    BOOST_REQUIRE(out.errors().empty());
    out.clear();
  };
  for (int round = 0; round < 5; ++round)
    for (as::worker_id w = 0; w < 3; ++w) commit(w, 1.0 + round);
  core->leave(1, 6.5, out);
  core->join(1, 7, 6.6, out, 12);  // a new incarnation: sequences from 1
  seq[1] = 0;
  inc[1] = 7;
  for (as::worker_id w = 0; w < 3; ++w) commit(w, 7.0);
  core->evict(2, 7.5, out);  // suspended at the save (give_back_after 10 s)
  commit(0, 8.0);            // buffered: the round waits for worker 1
  out.clear();
  return saved(*core);
}

std::map<std::string, std::vector<std::byte>> core_states() {
  std::map<std::string, std::vector<std::byte>> out;
  ps::policy_params p = ps_cases::base_params("ssp", 3);
  p.staleness = 1;
  out["core/ssp+momentum"] =
      core_state(*ps::make_policy("ssp", p),
                 {.mode = ps::optimizer_params::kind::sgd, .lr = 0.1, .momentum = 0.5, .nesterov = true},
                 ashl::compress::identity{});
  out["core/adsp+topk"] =
      core_state(*ps::make_policy("adsp", ps_cases::base_params("adsp", 3)), {}, ashl::compress::topk{0.25});
  out["core/bsp+sgd"] =
      core_state(*ps::make_policy("bsp", ps_cases::base_params("bsp", 3)),
                 {.mode = ps::optimizer_params::kind::sgd, .lr = 0.5}, ashl::compress::identity{});
  // The outer optimizer (POPT version 2): Delayed Nesterov mid-way between folds.
  ps::policy_params d = ps_cases::base_params("async_diloco", 3);
  d.outer_delay = 4;
  d.outer_activation = 0.25;
  out["core/async_diloco+outer"] = core_state(*ps::make_policy("async_diloco", d),
                                              *ps::outer_optimizer_of("async_diloco", d), ashl::compress::identity{});
  out["core/bsp+sgd+ledger"] = ledger_core_state();
  return out;
}

void write_inc(const char* path, const std::map<std::string, std::vector<std::byte>>& states) {
  std::FILE* f = std::fopen(path, "w");
  BOOST_REQUIRE_MESSAGE(f != nullptr, path);
  std::fprintf(f, "// Generated by test/rules/state_bytes.cpp (ASHL_WRITE_STATE_BYTES): saved states, never edit.\n");
  std::fprintf(f, "const std::vector<saved_state> old_states = {\n");
  for (const auto& [label, b] : states) {
    std::fprintf(f, "    {\"%s\", {", label.c_str());
    for (std::size_t i = 0; i < b.size(); ++i)
      std::fprintf(f, "%s%s%u", i == 0 ? "" : ",", i % 24 == 0 ? "\n         " : "", static_cast<unsigned>(b[i]));
    std::fprintf(f, "}},\n");
  }
  std::fprintf(f, "};\n");
  std::fclose(f);
}

std::span<const std::byte> as_bytes(const saved_state& s) {
  return std::as_bytes(std::span<const unsigned char>(s.bytes));
}

// A fresh core for a saved core state (other numbers would do: the state
// carries them; max_workers 7 here, so a loaded state's own value shows).
ps::server_core<> fresh_core(const std::string& label) {
  auto fresh = ps::server_core<>::create({.layout = *ps::shard_layout::even(40, 1), .workers = 3, .max_workers = 7},
                                         *ps::make_policy(label == "core/adsp+topk"            ? "adsp"
                                                          : label == "core/bsp+sgd"             ? "bsp"
                                                          : label == "core/bsp+sgd+ledger"      ? "bsp"
                                                          : label == "core/async_diloco+outer" ? "async_diloco"
                                                                                                : "ssp",
                                                          ps_cases::base_params("ssp", 3)));
  BOOST_REQUIRE(fresh.has_value());
  return std::move(*fresh);
}

std::uint32_t tag_version(std::span<const std::byte> b) {
  std::uint32_t v = 0;
  if (b.size() >= 8) std::memcpy(&v, b.data() + 4, 4);
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(states_saved_before_load_and_save_again_byte_for_byte) {
  auto policies = policy_states();
  auto cores = core_states();
  if (const char* path = std::getenv("ASHL_WRITE_STATE_BYTES"); path != nullptr && *path != '\0') {
    auto all = policies;
    all.insert(cores.begin(), cores.end());
    write_inc(path, all);
    BOOST_TEST_MESSAGE("wrote " << all.size() << " states to " << path);
    return;
  }
  BOOST_TEST_REQUIRE(old_states.size() == policies.size() + cores.size());
  for (const auto& s : old_states) {
    const std::string label = s.label;
    const auto old = as_bytes(s);
    if (label.rfind("policy/", 0) == 0) {
      // A fresh policy of the same kind (other numbers would do: the state
      // carries them) takes the old bytes and gives them back.
      const std::string rest = label.substr(7, label.find('@') - 7);
      const auto cases = ps_cases::every_policy(4);
      const auto c = std::find_if(cases.begin(), cases.end(), [&](const auto& x) { return x.label == rest; });
      BOOST_REQUIRE_MESSAGE(c != cases.end(), label);
      auto fresh = ps::make_policy(c->name, c->params);
      BOOST_REQUIRE(fresh.has_value());
      ashl::state_reader r(old);
      const auto st = fresh->load(r);
      BOOST_REQUIRE_MESSAGE(st.ok(), label << ": " << st.to_string());
      BOOST_TEST(r.at_end(), label);
      const auto again = saved(*fresh);
      BOOST_TEST((again == std::vector<std::byte>(old.begin(), old.end())), label << " saves other bytes");
      // Today's run saves the same bytes as the old one.
      BOOST_TEST((policies.at(label) == again), label << " runs to another state");
    } else {
      auto fresh = fresh_core(label);
      ashl::state_reader r(old);
      const auto st = fresh.load(r);
      BOOST_REQUIRE_MESSAGE(st.ok(), label << ": " << st.to_string());
      const bool ledger = label == "core/bsp+sgd+ledger";
      BOOST_TEST(tag_version(old) == (ledger ? 4u : 3u), label);
      BOOST_TEST(fresh.params().max_workers == 3u, label);
      BOOST_TEST(fresh.ledger().enabled() == ledger, label);
      if (ledger) {
        BOOST_TEST(fresh.params().ledger.samples == 300u);
        BOOST_TEST((fresh.ledger().state(2) == ps::ledger_worker_state::suspended));
        BOOST_TEST(fresh.ledger().used(0) > 0u);
        BOOST_TEST(fresh.ledger().check().ok());
      }
      const auto again = saved(fresh);
      BOOST_TEST((again == std::vector<std::byte>(old.begin(), old.end())), label << " saves other bytes");
      BOOST_TEST((cores.at(label) == again), label << " runs to another state");
    }
  }
}

// PSCR version 2 (before max_workers) still loads: each state takes
// max_workers = workers (3: the job's count was its maximum) and saves, as
// version 3, exactly the bytes pinned above for the same run.
BOOST_AUTO_TEST_CASE(server_core_states_of_version_2_load_with_max_workers_equal_to_workers) {
  if (const char* path = std::getenv("ASHL_WRITE_STATE_BYTES"); path != nullptr && *path != '\0') return;  // writing
  const auto cores = core_states();
  BOOST_TEST_REQUIRE(pscr2_states.size() == cores.size() - 1);  // all but the ledger's (PSCR 4)
  for (const auto& s : pscr2_states) {
    const std::string label = s.label;
    const auto v2 = as_bytes(s);
    BOOST_TEST(tag_version(v2) == 2u, label);
    auto fresh = fresh_core(label);
    ashl::state_reader r(v2);
    const auto st = fresh.load(r);
    BOOST_REQUIRE_MESSAGE(st.ok(), label << ": " << st.to_string());
    BOOST_TEST(r.at_end(), label);
    BOOST_TEST(fresh.params().workers == 3u, label);
    BOOST_TEST(fresh.params().max_workers == 3u, label);
    BOOST_TEST(fresh.known_workers() == 3u, label);
    BOOST_TEST(fresh.live_count() == 3u, label);
    const auto again = saved(fresh);
    BOOST_TEST(tag_version(again) == 3u, label);
    const auto pinned = std::find_if(old_states.begin(), old_states.end(),
                                     [&](const saved_state& x) { return label == x.label; });
    BOOST_REQUIRE_MESSAGE(pinned != old_states.end(), label);
    const auto v3 = as_bytes(*pinned);
    BOOST_TEST((again == std::vector<std::byte>(v3.begin(), v3.end())), label << ": version 2 loads to another state");
    BOOST_TEST((cores.at(label) == again), label);
  }
}

// ASHL version 1 (before the membership re-profiling window) still loads:
// no window open, no membership re-plan, and it saves as version 2: the same
// bytes with the version raised and the two new fields (reprofiling 0,
// membership_replans 0) at the end of the section, which ends the state.
BOOST_AUTO_TEST_CASE(ashl_states_of_version_1_load_with_no_window_open) {
  if (const char* path = std::getenv("ASHL_WRITE_STATE_BYTES"); path != nullptr && *path != '\0') return;  // writing
  BOOST_TEST_REQUIRE(ashl1_states.size() == 10u);
  for (const auto& s : ashl1_states) {
    const std::string label = s.label;
    const auto v1 = as_bytes(s);
    BOOST_TEST(tag_version(v1) == 1u, label);
    const std::string rest = label.substr(7, label.find('@') - 7);
    const auto cases = ps_cases::every_policy(4);
    const auto c = std::find_if(cases.begin(), cases.end(), [&](const auto& x) { return x.label == rest; });
    BOOST_REQUIRE_MESSAGE(c != cases.end(), label);
    auto fresh = ps::make_policy(c->name, c->params);
    BOOST_REQUIRE(fresh.has_value());
    ashl::state_reader r(v1);
    const auto st = fresh->load(r);
    BOOST_REQUIRE_MESSAGE(st.ok(), label << ": " << st.to_string());
    BOOST_TEST(r.at_end(), label);
    const auto again = saved(*fresh);
    BOOST_TEST(tag_version(again) == 2u, label);
    std::vector<std::byte> expected(v1.begin(), v1.end());
    const std::uint32_t two = 2;
    std::memcpy(expected.data() + 4, &two, 4);
    expected.insert(expected.end(), 9, std::byte{0});
    BOOST_TEST((again == expected), label << ": version 1 loads to another state");
  }
}
namespace {
std::uint64_t get_u64(std::span<const std::byte> b, std::size_t at) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(b[at + i]) << (8 * i);
  return v;
}
// What a ROND version 1 section becomes when loaded and saved again: version
// 2, min_workers 1 after the round count, "not pending" before each queue.
std::vector<std::byte> rond1_to_2(std::span<const std::byte> v1) {
  const std::byte tag[8] = {std::byte{'R'}, std::byte{'O'}, std::byte{'N'}, std::byte{'D'},
                            std::byte{1},   std::byte{0},   std::byte{0},   std::byte{0}};
  const auto it = std::search(v1.begin(), v1.end(), std::begin(tag), std::end(tag));
  BOOST_REQUIRE(it != v1.end());
  std::size_t at = static_cast<std::size_t>(it - v1.begin());
  std::vector<std::byte> out(v1.begin(), v1.begin() + static_cast<std::ptrdiff_t>(at));
  auto copy = [&](std::size_t n) {
    out.insert(out.end(), v1.begin() + static_cast<std::ptrdiff_t>(at), v1.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  };
  copy(4);
  out.push_back(std::byte{2});
  out.insert(out.end(), 3, std::byte{0});
  at += 4;
  copy(1 + 8);  // weighting, rounds
  out.push_back(std::byte{1});
  out.insert(out.end(), 3, std::byte{0});  // min_workers
  const std::uint64_t ids = get_u64(v1, at);
  copy(8);
  for (std::uint64_t w = 0; w < ids; ++w) {
    out.push_back(std::byte{0});  // not pending
    const std::uint64_t k = get_u64(v1, at);
    copy(8 + 16 * k);
  }
  copy(v1.size() - at);
  return out;
}
}  // namespace

// ROND version 2 (pending joiners, min_workers) is what today's states above
// pin; version 1's states of the round policies still load, with min_workers
// 1 and nothing pending, and save as version 2 (a BSP core's: the PSCR
// version 2 test above).
BOOST_AUTO_TEST_CASE(round_states_of_version_1_still_load) {
  BOOST_TEST_REQUIRE(rond1_states.size() == 10u);
  for (const auto& s : rond1_states) {
    const std::string label = s.label;
    const auto old = as_bytes(s);
    const auto want = rond1_to_2(old);
    BOOST_REQUIRE(want.size() > old.size());
    ashl::state_reader r(old);
    BOOST_REQUIRE(label.rfind("policy/", 0) == 0);
    const std::string name = label.substr(7, label.find('@') - 7);
    auto fresh = ps::make_policy(name, ps_cases::base_params(name, 4));
    BOOST_REQUIRE(fresh.has_value());
    const auto st = fresh->load(r);
    BOOST_REQUIRE_MESSAGE(st.ok(), label << ": " << st.to_string());
    BOOST_TEST(r.at_end(), label);
    BOOST_TEST((saved(*fresh) == want), label << " saves other bytes");
  }
}

