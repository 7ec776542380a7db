// rules/replication.hpp: a primary core and a backup core driven through
// one backup link in-process (the primary's records encoded by
// recorded_core, handed to the backup in index order, its acks handed back)
// for every policy of rules/policies.hpp (test/support/ps_policy_cases.hpp)
// under 500 mixed random events: the backup's save() bytes equal the
// primary's, fed from its creation and from a snapshot taken a third of the
// way in; every worker-visible action is released exactly once, in record
// order, never before the backup acknowledged its record (a stalled backup
// holds every one); a flipped bit, a gap or a repeated record is refused by
// name and changes nothing; a backup whose CRC disagrees is dropped naming
// backup.crc and the version; a silent one after replica_timeout; one past
// max_backup_lag_bytes naming backup.lag_bytes; the held actions then flow,
// and without a backup nothing is held. No allocation per record once warm.
#include <ashl/rules/replication.hpp>

#include <boost/test/unit_test.hpp>

#include "../support/core_event_script.hpp"
#include "../support/counting_new.hpp"
#include "../support/ps_policy_cases.hpp"

#include <ashl/compress/cast.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/rules/apply_pool.hpp>
#include <ashl/rules/core_events.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/rules/server_core.hpp>
#include <ashl/wire/crc32c.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace core_script;  // ps, as, core_t, workers, seed, value, saved, side, make_side, events, call

// An event's actions, copied to compare with what the link releases.
struct action_copy {
  std::vector<ps::worker_id> replies;
  std::vector<ps::plan_out> plans;
  std::vector<std::string> errors;
  std::uint64_t steps = 0;
  static action_copy of(const ps::server_actions& a) {
    action_copy c{{a.pull_replies().begin(), a.pull_replies().end()}, {a.plans().begin(), a.plans().end()}, {},
                  a.steps()};
    for (const auto& e : a.errors()) c.errors.push_back(std::to_string(e.worker) + " " + e.text);
    return c;
  }
  friend bool operator==(const action_copy&, const action_copy&) = default;
};

// A primary, its link, a backup and the records in flight between them.
class harness {
 public:
  struct options {
    std::size_t n = 257;
    ps::replication_params link{.workers = workers + 2};
    std::uint64_t crc_every = 5;     // a record asks for the version's CRC
    std::uint64_t state_every = 50;  // and for the whole state's
    bool nudged_backup = false;      // the backup's initial values differ from the primary's
  };

  harness(const ps_cases::policy_case& c, std::size_t variant, const options& o)
      : o_(o),
        c_(c),
        variant_(variant),
        primary_(make_side(c, variant, o.n, 1, 1)),
        link_(o.link),
        rc_(*primary_.core, [this](const ps::core_event& e) { ps::encode_core_event(e, bytes_); }),
        out_(workers + 2) {}

  // The backup attaches now: fresh (created as the primary was) when no
  // record exists yet, else from the primary's snapshot.
  void attach() {
    backup_side_ = make_side(c_, variant_, o_.n, 1, 1, {}, o_.nudged_backup);
    backup_.emplace(*backup_side_.core, workers + 2);
    const std::uint64_t at = link_.attach(now_);
    if (at > 0) {
      std::vector<std::byte> snapshot;
      ps::save_snapshot(*primary_.core, snapshot);
      const ashl::status s = backup_->start_from(snapshot, at);
      BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
    }
    BOOST_TEST(backup_->last_index() == at);
  }

  void step(const ps::core_event& e, const ps::commit_in& c) {
    now_ = std::max(now_, e.now);
    call(rc_, e, c, out_);
    const std::uint64_t index = link_.last_index() + 1;
    const bool want_crc = o_.crc_every > 0 && index % o_.crc_every == 0;
    const bool want_state = o_.state_every > 0 && index % o_.state_every == 0;
    std::uint32_t crc = 0, state_crc = 0;
    if (want_crc) {
      const auto pinned = primary_.core->pin_parameters(true);
      crc = pinned.crc;
      primary_.core->unpin_parameters(pinned.version);
    }
    if (want_state) {
      ps::save_snapshot(*primary_.core, state_);
      state_crc = ashl::wire::crc32c(std::span<const std::byte>(state_));
    }
    const bool was_attached = link_.attached();
    note(link_.append(bytes_.size(), primary_.core->version(), crc, now_, state_crc));
    BOOST_TEST(link_.last_index() == index);
    if (link_.attached()) queue_.push_back({index, bytes_, want_crc, want_state});
    if (was_attached && !link_.attached()) queue_.clear();
    expected_.push_back(action_copy::of(out_));
    if (!out_.empty()) ++visible_;
    link_.submit(index, out_, sender());
    out_.clear();
    max_held_ = std::max(max_held_, link_.held_events());
  }

  // Hands the backup up to k records in order, then its ack to the primary.
  void deliver(std::size_t k = std::numeric_limits<std::size_t>::max()) {
    if (!link_.attached()) return;
    for (; k > 0 && !queue_.empty(); --k) {
      const record& r = queue_.front();
      const ashl::status s = backup_->receive(r.index, r.bytes, r.crc, r.state);
      if (!s.ok()) {
        ++backup_refusals_;
        BOOST_TEST_MESSAGE(s.to_string());
      }
      queue_.pop_front();
    }
    note(link_.ack(backup_->ack(), now_));
    link_.release(sender());
    if (!link_.attached()) queue_.clear();
  }

  void poll(double now) {
    now_ = std::max(now_, now);
    note(link_.poll(now_));
    link_.release(sender());
  }

  // What every run must show: each visible action released once, in
  // order, none before its ack, equal to the event's.
  void check_released() const {
    BOOST_TEST(early_ == 0u);
    BOOST_TEST(out_of_order_ == 0u);
    BOOST_TEST(mismatched_ == 0u);
    BOOST_TEST(backup_refusals_ == 0u);
    BOOST_TEST(sent_ == visible_ - link_.held_events());
  }

  ps::replication_primary& link() { return link_; }
  core_t& primary() { return *primary_.core; }
  core_t& backup() { return *backup_side_.core; }
  ps::replication_backup<core_t>& backup_rule() { return *backup_; }
  [[nodiscard]] std::uint64_t sent() const { return sent_; }
  [[nodiscard]] std::uint64_t visible() const { return visible_; }
  [[nodiscard]] std::size_t max_held() const { return max_held_; }
  [[nodiscard]] std::size_t queued() const { return queue_.size(); }
  [[nodiscard]] const std::vector<std::string>& drops() const { return drops_; }
  [[nodiscard]] double now() const { return now_; }
  [[nodiscard]] const std::deque<std::vector<std::byte>>& sent_records() const { return records_seen_; }
  [[nodiscard]] const std::vector<std::byte>& last_record() const { return bytes_; }

 private:
  struct record {
    std::uint64_t index;
    std::vector<std::byte> bytes;
    bool crc, state;
  };

  // The driver's send: checks each release against the rule of §4.3.
  struct send_fn {
    harness* h;
    void operator()(std::uint64_t index, const ps::server_actions& a) const { h->sent_one(index, a); }
  };
  send_fn sender() { return {this}; }
  void sent_one(std::uint64_t index, const ps::server_actions& a) {
    if (link_.attached() && index > link_.received()) ++early_;
    if (index <= last_sent_) ++out_of_order_;
    last_sent_ = index;
    if (!(action_copy::of(a) == expected_.at(index - 1))) ++mismatched_;
    ++sent_;
  }
  void note(const ashl::status& s) {
    if (!s.ok()) drops_.push_back(s.message());
  }

  options o_;
  ps_cases::policy_case c_;
  std::size_t variant_;
  side primary_, backup_side_;
  ps::replication_primary link_;
  std::optional<ps::replication_backup<core_t>> backup_;
  std::vector<std::byte> bytes_, state_;
  ps::recorded_core<core_t, std::function<void(const ps::core_event&)>> rc_;
  ps::server_actions out_;
  std::deque<record> queue_;
  std::deque<std::vector<std::byte>> records_seen_;
  std::vector<action_copy> expected_;
  std::vector<std::string> drops_;
  double now_ = 0.0;
  std::uint64_t sent_ = 0, visible_ = 0, early_ = 0, out_of_order_ = 0, mismatched_ = 0, last_sent_ = 0;
  std::uint64_t backup_refusals_ = 0;
  std::size_t max_held_ = 0;
};

ps_cases::policy_case first_case(std::string_view name) {
  for (const auto& c : ps_cases::every_policy(workers))
    if (c.name == name) return c;
  BOOST_FAIL("no policy case " << name);
  return {};
}

// One policy's run of n_events through the link: the backup attached at
// `attach_at` (0: fresh, before any record; else from a snapshot), fed a
// random number of records after each event (sometimes none: actions wait),
// everything at the end.
void run_through_link(const ps_cases::policy_case& c, std::size_t variant, int n_events, int attach_at,
                      std::uint32_t rng_seed, std::size_t& held_total) {
  BOOST_TEST_CONTEXT(c.label << (attach_at == 0 ? "" : " (from a snapshot)")) {
    harness h(c, variant, {});
    events ev(257, rng_seed, false);
    std::mt19937 rng(rng_seed * 7 + 1);
    if (attach_at == 0) h.attach();
    for (int i = 0; i < n_events; ++i) {
      if (i == attach_at && attach_at > 0) {
        BOOST_TEST(h.link().held_events() == 0u);  // no backup: everything went at once
        BOOST_TEST(h.sent() == h.visible());
        h.attach();
      }
      const ps::core_event e = ev.next();
      h.step(e, ev.last_commit());
      if (rng() % 3 != 0) h.deliver(rng() % 4);
    }
    h.deliver();
    BOOST_TEST(h.queued() == 0u);
    BOOST_TEST(h.link().attached());
    BOOST_TEST(h.drops().empty(), (h.drops().empty() ? "" : h.drops().front()));
    BOOST_TEST(h.link().held_events() == 0u);
    BOOST_TEST(h.link().bytes_in_flight() == 0u);
    BOOST_TEST(h.link().received() == static_cast<std::uint64_t>(n_events));
    h.check_released();
    BOOST_TEST((saved(h.backup()) == saved(h.primary())));
    BOOST_TEST(h.primary().stats().commits_applied > 0u);
    held_total += h.max_held();
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_backup_fed_through_the_link_saves_the_primary_bytes_for_every_policy) {
  const auto cases = ps_cases::every_policy(workers);
  BOOST_REQUIRE(cases.size() >= ps::policies.size());
  std::size_t held = 0;
  for (std::size_t i = 0; i < cases.size(); ++i)
    run_through_link(cases[i], i, 500, 0, 300 + static_cast<std::uint32_t>(i), held);
  BOOST_TEST(held > cases.size());  // actions did wait for acks
}

BOOST_AUTO_TEST_CASE(a_backup_caught_up_from_a_snapshot_mid_run_saves_the_primary_bytes) {
  const auto cases = ps_cases::every_policy(workers);
  std::size_t held = 0;
  for (std::size_t i = 0; i < cases.size(); ++i)
    run_through_link(cases[i], i, 500, 500 / 3, 400 + static_cast<std::uint32_t>(i), held);
  BOOST_TEST(held > 0u);
}

BOOST_AUTO_TEST_CASE(a_stalled_backup_holds_every_action_until_it_acks) {
  harness h(first_case("bsp"), 0, {});
  events ev(257, 11, false);
  h.attach();
  for (int i = 0; i < 150; ++i) h.step(ev.next(), ev.last_commit());
  BOOST_TEST(h.visible() > 50u);
  BOOST_TEST(h.sent() == 0u);  // not one reply, plan or error
  BOOST_TEST(h.link().held_events() == h.visible());
  BOOST_TEST(h.link().bytes_in_flight() > 0u);
  h.deliver(40);  // part of the way: the actions of records 1..40 only
  BOOST_TEST(h.link().received() == 40u);
  BOOST_TEST(h.sent() > 0u);
  BOOST_TEST(h.sent() < h.visible());
  h.check_released();
  h.deliver();
  BOOST_TEST(h.sent() == h.visible());
  BOOST_TEST(h.link().held_events() == 0u);
  h.check_released();
  BOOST_TEST((saved(h.backup()) == saved(h.primary())));
}

BOOST_AUTO_TEST_CASE(without_a_backup_every_action_goes_at_once) {
  harness h(first_case("ssp"), 0, {});
  events ev(257, 12, false);
  for (int i = 0; i < 200; ++i) {
    h.step(ev.next(), ev.last_commit());
    BOOST_TEST_REQUIRE(h.sent() == h.visible());
  }
  BOOST_TEST(h.max_held() == 0u);
  BOOST_TEST(h.link().last_index() == 200u);
  h.poll(1e9);  // no backup: nothing to time out
  BOOST_TEST(h.drops().empty());
  h.check_released();
}

BOOST_AUTO_TEST_CASE(a_flipped_bit_a_gap_or_a_repeat_is_refused_by_name_and_changes_nothing) {
  auto c = first_case("asp");
  side primary = make_side(c, 0, 257, 1, 1), backup_side = make_side(c, 0, 257, 1, 1);
  ps::replication_backup<core_t> backup(*backup_side.core, workers + 2);
  std::vector<std::vector<std::byte>> records;
  auto rc = ps::recorded_core(*primary.core,
                              [&](const ps::core_event& e) { ps::encode_core_event(e, records.emplace_back()); });
  events ev(257, 13, false);
  ps::server_actions out(workers + 2);
  while (records.size() < 60) {
    call(rc, ev.next(), ev.last_commit(), out);
    out.clear();
  }
  // Records 1..29 in order.
  for (std::uint64_t i = 1; i < 30; ++i) BOOST_TEST_REQUIRE(backup.receive(i, records[i - 1]).ok());
  // Record 30 with one bit flipped, at places in its prefix and payload.
  auto find_commit = [&](std::size_t from) {
    for (std::size_t k = from; k < records.size(); ++k)
      if (records[k].size() > ps::core_event_prefix_bytes) return k;
    return records.size();
  };
  const std::size_t k = find_commit(29);
  BOOST_TEST_REQUIRE(k < records.size());
  for (std::uint64_t i = 30; i <= k; ++i)
    if (i - 1 < k) BOOST_TEST_REQUIRE(backup.receive(i, records[i - 1]).ok());
  const auto before = saved(*backup_side.core);
  const std::uint64_t next = k + 1;
  BOOST_TEST(backup.last_index() == k);
  const std::vector<std::byte>& good = records[k];
  for (std::size_t at : {std::size_t{3}, std::size_t{17}, std::size_t{64}, std::size_t{118},
                         ps::core_event_prefix_bytes + 5, good.size() - 1}) {
    std::vector<std::byte> bad = good;
    bad[at] ^= std::byte{0x10};
    const ashl::status s = backup.receive(next, bad);
    BOOST_TEST_INFO("bit flipped at byte " << at << ": " << s.to_string());
    BOOST_TEST(!s.ok());
    const bool named = s.message().rfind("core_event.prefix_crc = ", 0) == 0 ||
                       s.message().rfind("core_event.payload_crc = ", 0) == 0 ||
                       s.message().rfind("core_event.magic = ", 0) == 0;
    BOOST_TEST(named, s.message());
  }
  // A gap and a repeat.
  const ashl::status gap = backup.receive(next + 1, records[next]);
  BOOST_TEST(gap.message().rfind("replicate.index = " + std::to_string(next + 1) + ": the backup expects record " +
                                     std::to_string(next) + " (a gap",
                                 0) == 0u,
             gap.message());
  const ashl::status repeat = backup.receive(next - 1, records[next - 2]);
  BOOST_TEST(repeat.message().find("(a repeated record)") != std::string::npos, repeat.message());
  BOOST_TEST(backup.last_index() == k);
  BOOST_TEST((saved(*backup_side.core) == before));  // nothing applied
  // The good bytes go on.
  for (std::uint64_t i = next; i <= records.size(); ++i) BOOST_TEST_REQUIRE(backup.receive(i, records[i - 1]).ok());
  BOOST_TEST((saved(*backup_side.core) == saved(*primary.core)));
}

BOOST_AUTO_TEST_CASE(a_backup_whose_crc_differs_is_dropped_naming_backup_crc_and_the_version) {
  harness::options o;
  o.nudged_backup = true;  // same versions, other values
  o.state_every = 0;
  harness h(first_case("asp"), 0, o);
  events ev(257, 14, false);
  h.attach();
  int i = 0;
  for (; i < 200 && h.link().attached(); ++i) {
    h.step(ev.next(), ev.last_commit());
    h.deliver();
  }
  BOOST_TEST_REQUIRE(!h.link().attached());
  BOOST_TEST(h.link().drops(ps::backup_drop::crc) == 1u);
  BOOST_TEST_REQUIRE(h.drops().size() == 1u);
  const std::string& m = h.drops().front();
  BOOST_TEST(m.rfind("backup.crc = 0x", 0) == 0u, m);
  BOOST_TEST(m.find(": the primary's is 0x") != std::string::npos, m);
  BOOST_TEST(m.find("at version " + std::to_string(h.backup().version())) != std::string::npos, m);
  BOOST_TEST(m.find("backup dropped") != std::string::npos, m);
  BOOST_TEST((h.link().last_drop().code() == ashl::errc::checksum_mismatch));
  // Actions then flow without waiting.
  for (int j = 0; j < 50; ++j) h.step(ev.next(), ev.last_commit());
  BOOST_TEST(h.link().held_events() == 0u);
  BOOST_TEST(h.sent() == h.visible());
  h.check_released();
}

BOOST_AUTO_TEST_CASE(a_backup_that_stops_acking_is_dropped_after_replica_timeout_and_actions_flow) {
  harness::options o;
  o.link.replica_timeout = 2.0;
  harness h(first_case("ssp"), 0, o);
  events ev(257, 15, false);
  h.attach();
  for (int i = 0; i < 40; ++i) {
    h.step(ev.next(), ev.last_commit());
    h.deliver();
    h.poll(h.now());
  }
  BOOST_TEST(h.link().attached());  // acking: never dropped, however long the run
  // Silent from here: records pile up unacknowledged.
  const double silent_from = h.now();
  int i = 0;
  while (h.link().attached() && i++ < 10000) {
    h.step(ev.next(), ev.last_commit());
    h.poll(h.now());
    BOOST_TEST_REQUIRE((h.link().attached() || h.now() - silent_from > 2.0));
  }
  BOOST_TEST_REQUIRE(!h.link().attached());
  BOOST_TEST(h.link().drops(ps::backup_drop::timeout) == 1u);
  BOOST_TEST_REQUIRE(h.drops().size() == 1u);
  const std::string& m = h.drops().front();
  BOOST_TEST(m.rfind("backup.silent_seconds = ", 0) == 0u, m);
  BOOST_TEST(m.find("replication.replica_timeout = 2") != std::string::npos, m);
  // Every held action went when the backup was dropped; later ones at once.
  BOOST_TEST(h.link().held_events() == 0u);
  BOOST_TEST(h.sent() == h.visible());
  for (int j = 0; j < 30; ++j) h.step(ev.next(), ev.last_commit());
  BOOST_TEST(h.sent() == h.visible());
  h.check_released();
}

BOOST_AUTO_TEST_CASE(a_backup_past_max_backup_lag_bytes_is_dropped_naming_backup_lag_bytes) {
  harness::options o;
  o.link.max_backup_lag_bytes = 16 * 1024;
  harness h(first_case("asp"), 0, o);
  events ev(257, 16, false);
  h.attach();
  std::uint64_t most = 0;
  int i = 0;
  while (h.link().attached() && i++ < 10000) {
    h.step(ev.next(), ev.last_commit());
    if (h.link().attached()) most = std::max(most, h.link().bytes_in_flight());
    if (i % 4 == 0 && i < 40) h.deliver();  // acked for a while, then stalled
  }
  BOOST_TEST_REQUIRE(!h.link().attached());
  BOOST_TEST(most <= o.link.max_backup_lag_bytes);
  BOOST_TEST(most > 0u);
  BOOST_TEST(h.link().drops(ps::backup_drop::lag) == 1u);
  BOOST_TEST_REQUIRE(h.drops().size() == 1u);
  BOOST_TEST(h.drops().front().rfind("backup.lag_bytes = ", 0) == 0u, h.drops().front());
  BOOST_TEST(h.drops().front().find("max_backup_lag_bytes = 16384") != std::string::npos, h.drops().front());
  BOOST_TEST(h.link().held_events() == 0u);
  h.check_released();
}

BOOST_AUTO_TEST_CASE(acks_out_of_order_or_beyond_the_records_drop_the_backup_by_name) {
  ps::replication_primary link({.workers = workers});
  link.attach(0.0);
  BOOST_TEST(link.append(200, 1, 0, 0.1).ok());
  BOOST_TEST(link.append(200, 2, 0, 0.2).ok());
  const ashl::status beyond = link.ack({.received = 3, .applied = 3, .version = 3}, 0.3);
  BOOST_TEST(beyond.message().rfind("backup.received = 3: the primary's last record is 2", 0) == 0u, beyond.message());
  BOOST_TEST(!link.attached());
  BOOST_TEST(link.drops(ps::backup_drop::protocol) == 1u);
  link.attach(1.0);
  BOOST_TEST(link.snapshot_index() == 2u);
  BOOST_TEST(link.append(100, 3, 0, 1.1).ok());
  const ashl::status version = link.ack({.received = 3, .applied = 3, .version = 4}, 1.2);
  BOOST_TEST(version.message().rfind("backup.version = 4: at record 3: the primary's is 3", 0) == 0u,
             version.message());
  BOOST_TEST(!ps::replication_params{.replica_timeout = 0.0}.validate().ok());
}

BOOST_AUTO_TEST_CASE(the_link_allocates_nothing_per_record_once_warm) {
  constexpr std::size_t n = 1000;
  core_t primary = make_ssp_core(n), backup_core = make_ssp_core(n);
  ps::replication_primary link({.max_held_events = 64, .workers = workers});
  ps::replication_backup<core_t> backup(backup_core, workers);
  link.attach(0.0);
  ps::server_actions out(workers);
  std::vector<std::byte> bytes, queued[4];
  std::uint64_t queued_index[4] = {};
  std::size_t n_queued = 0;
  std::uint64_t failures = 0, sent = 0;
  auto rc = ps::recorded_core(primary, [&](const ps::core_event& e) { ps::encode_core_event(e, bytes); });
  auto send = [&](std::uint64_t, const ps::server_actions&) { ++sent; };
  std::vector<float> g(n);
  std::vector<std::uint64_t> seq(workers, 0);
  auto step = [&](int i) {
    const auto w = static_cast<as::worker_id>(i % workers);
    const double now = 0.01 * i;
    for (std::size_t k = 0; k < n; ++k) g[k] = value(w, seq[w] + 1, k);
    if (i % 5 == 4) {
      rc.measurement({.worker = w, .kind = ashl::measurement_kind::compute, .seconds = 0.01, .amount = 32.0,
                      .time = now},
                     out);
    } else {
      ++seq[w];
      rc.commit({.worker = w, .sequence = seq[w], .clock = seq[w], .samples = 16, .bytes = 4 * n + 72,
                 .element_count = n, .step = seq[w], .payload = std::as_bytes(std::span<const float>(g)),
                 .pull = true},
                now, out);
    }
    const std::uint64_t index = link.last_index() + 1;
    const bool want_crc = index % 5 == 0;
    std::uint32_t crc = 0;
    if (want_crc) {
      const auto p = primary.pin_parameters(true);
      crc = p.crc;
      primary.unpin_parameters(p.version);
    }
    if (!link.append(bytes.size(), primary.version(), crc, now).ok()) ++failures;
    queued[n_queued].assign(bytes.begin(), bytes.end());  // capacity reused once warm
    queued_index[n_queued++] = index;
    link.submit(index, out, send);
    if (n_queued == 3) {  // the backup acks every third record: actions wait in between
      for (std::size_t k = 0; k < n_queued; ++k)
        if (!backup.receive(queued_index[k], queued[k], queued_index[k] % 5 == 0).ok()) ++failures;
      n_queued = 0;
      if (!link.ack(backup.ack(), now).ok()) ++failures;
      link.release(send);
    }
    if (!link.poll(now).ok()) ++failures;
  };
  int i = 0;
  for (; i < 200; ++i) step(i);  // warm
  const std::size_t before = counting_new::count();
  for (; i < 800; ++i) step(i);
  BOOST_TEST(counting_new::count() == before);
  for (std::size_t k = 0; k < n_queued; ++k) BOOST_TEST(backup.receive(queued_index[k], queued[k]).ok());
  BOOST_TEST(failures == 0u);
  BOOST_TEST(link.attached());
  BOOST_TEST(sent > 500u);
  BOOST_TEST(primary.stats().commits_applied > 400u);
  BOOST_TEST((saved(primary) == saved(backup_core)));
}

// docs/elastic.md §4.5's promotion rule (failover_votes) alone, over a
// stand-in for the replicated core's live set.
namespace {
struct live_set {
  std::vector<bool> live;
  [[nodiscard]] std::uint32_t known_workers() const noexcept { return static_cast<std::uint32_t>(live.size()); }
  [[nodiscard]] bool is_live(std::uint32_t w) const noexcept { return w < live.size() && live[w]; }
  [[nodiscard]] std::uint32_t live_count() const noexcept {
    return static_cast<std::uint32_t>(std::count(live.begin(), live.end(), true));
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(the_backup_promotes_only_with_the_link_down_and_a_majority_of_live_workers_voting) {
  const live_set core{{true, true, true, true, true, false}};  // 5 live of 6 known
  ps::failover_votes v(8, 2.0);
  const std::uint32_t own = 3;
  BOOST_TEST((v.join(0, own, own, 1.0) == ps::failover_vote::vote));
  BOOST_TEST((v.join(0, own, own, 1.1) == ps::failover_vote::vote));  // the same rank again: one vote
  BOOST_TEST((v.join(1, own, own, 1.2) == ps::failover_vote::vote));
  BOOST_TEST((v.join(5, own, own, 1.2) == ps::failover_vote::vote));  // not live: does not count
  BOOST_TEST((v.join(2, 0, own, 1.2) == ps::failover_vote::no_vote));  // term 0: a process that knows none
  BOOST_TEST((v.join(2, own - 1, own, 1.2) == ps::failover_vote::no_vote));
  BOOST_TEST(v.votes(core, 1.3) == 2u);
  BOOST_TEST(!v.promote(core, true, 1.3));  // 2 of 5: a minority
  BOOST_TEST((v.join(3, own, own, 1.4) == ps::failover_vote::vote));
  BOOST_TEST(v.votes(core, 1.5) == 3u);
  BOOST_TEST(!v.promote(core, false, 1.5));  // the link to the primary is up: never
  BOOST_TEST(v.promote(core, true, 1.5));    // 3 of 5, the link down
  // Votes last replica_timeout: worker 0's (at 1.1) is gone at 3.2.
  BOOST_TEST(v.votes(core, 3.15) == 2u);
  BOOST_TEST(!v.promote(core, true, 3.15));
  // No live worker: never by itself.
  const live_set none{{false, false}};
  BOOST_TEST(!v.promote(none, true, 1.5));
}

BOOST_AUTO_TEST_CASE(a_join_of_a_higher_term_makes_the_backup_stale_for_good) {
  const live_set core{{true, true, true}};
  ps::failover_votes v(3, 2.0);
  BOOST_TEST((v.join(0, 3, 3, 1.0) == ps::failover_vote::vote));
  BOOST_TEST((v.join(2, 4, 3, 1.1) == ps::failover_vote::stale));  // the primary went on at term 4
  BOOST_TEST(v.stale());
  BOOST_TEST(v.stale_worker() == 2u);
  BOOST_TEST(v.stale_term() == 4u);
  BOOST_TEST((v.join(1, 3, 3, 1.2) == ps::failover_vote::vote));
  BOOST_TEST(v.votes(core, 1.3) == 2u);
  BOOST_TEST(!v.promote(core, true, 1.3));  // a majority, but stale
}

BOOST_AUTO_TEST_CASE(votes_allocate_nothing) {
  const live_set core{{true, true, true}};
  ps::failover_votes v(3, 2.0);
  const std::size_t before = counting_new::count();
  for (int i = 0; i < 100; ++i) {
    (void)v.join(static_cast<std::uint32_t>(i % 3), 1, 1, 0.01 * i);
    (void)v.promote(core, i % 2 == 0, 0.01 * i);
  }
  BOOST_TEST(counting_new::count() == before);
}
