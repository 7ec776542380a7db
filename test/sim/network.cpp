#include <ashl/sim/network.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

using ashl::sim::shared_link;
constexpr double inf = std::numeric_limits<double>::infinity();

BOOST_AUTO_TEST_CASE(processor_sharing_divides_bandwidth_among_active_transfers) {
  shared_link l{100.0};  // bytes per second
  l.add(0.0, 1, 100.0, inf);
  auto c = l.next_completion(0.0);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->time == 1.0);
  // At 0.5 s, 50 bytes of transfer 1 are left; a second transfer of 50 bytes
  // joins: both now run at 50 B/s and finish together at 1.5 s.
  l.add(0.5, 2, 50.0, inf);
  BOOST_TEST(l.remaining(0.5, 1) == 50.0);
  BOOST_TEST(l.remaining(0.5, 2) == 50.0);
  BOOST_TEST(l.active() == 2u);
  c = l.next_completion(0.5);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->time == 1.5);
  BOOST_TEST(c->id == 1u);  // tie: lower id
  BOOST_TEST(l.remove(1.5, 1));
  c = l.next_completion(1.5);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->time == 1.5);  // transfer 2 is done as well
  BOOST_TEST(l.remove(1.5, 2));
  BOOST_TEST(!l.next_completion(1.5));
  BOOST_TEST(!l.remove(1.5, 2));
}

BOOST_AUTO_TEST_CASE(a_transfer_is_capped_by_its_own_link) {
  shared_link l{100.0};
  l.add(0.0, 1, 10.0, 10.0);    // sender link: 10 B/s
  l.add(0.0, 2, 100.0, inf);    // share 50 B/s
  BOOST_TEST(l.rate(10.0) == 10.0);
  BOOST_TEST(l.rate(inf) == 50.0);
  auto c = l.next_completion(0.0);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->id == 1u);
  BOOST_TEST(c->time == 1.0);
  BOOST_TEST(l.remove(1.0, 1));
  // 50 bytes of transfer 2 left, now alone at 100 B/s.
  c = l.next_completion(1.0);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->time == 1.5);
}

BOOST_AUTO_TEST_CASE(unlimited_link_runs_each_transfer_at_its_cap) {
  shared_link l;
  l.add(0.0, 1, 100.0, 50.0);
  l.add(0.0, 2, 100.0, 25.0);
  auto c = l.next_completion(0.0);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->time == 2.0);
}

// A capped transfer becomes share-limited when others join and capped again
// when they leave. B = 100 B/s, transfer 1 capped at 40 B/s with 100 bytes.
// [0, 1): alone, 40 B/s (60 left). [1, 2): with 2 others the share is 33.3:
// 33.3 B/s (26.7 left). At 2 the two leave: 40 B/s again, done at 2 + 2/3.
BOOST_AUTO_TEST_CASE(a_transfer_switches_between_its_cap_and_the_share) {
  shared_link l{100.0};
  l.add(0.0, 1, 100.0, 40.0);
  l.add(1.0, 2, 1000.0, inf);
  l.add(1.0, 3, 1000.0, inf);
  BOOST_TEST(l.rate(40.0) == 100.0 / 3.0);
  BOOST_TEST(l.remaining(1.0, 1) == 60.0, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(l.remaining(2.0, 1) == 60.0 - 100.0 / 3.0, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(l.remove(2.0, 2));
  BOOST_TEST(l.remove(2.0, 3));
  auto c = l.next_completion(2.0);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->id == 1u);
  BOOST_TEST(c->time == 2.0 + (60.0 - 100.0 / 3.0) / 40.0, boost::test_tools::tolerance(1e-12));
}

namespace {
// The rule written the obvious way, O(n) per call: the reference.
struct naive_link {
  struct flow {
    std::uint64_t id;
    double remaining, cap;
  };
  double b;
  double last = 0.0;
  std::vector<flow> flows;
  double rate(double cap) const { return flows.empty() ? cap : std::min(cap, b / static_cast<double>(flows.size())); }
  void advance(double now) {
    for (auto& f : flows) f.remaining = std::max(0.0, f.remaining - rate(f.cap) * (now - last));
    last = now;
  }
  void add(double now, std::uint64_t id, double bytes, double cap) {
    advance(now);
    flows.push_back({id, bytes, cap});
  }
  void remove(double now, std::uint64_t id) {
    advance(now);
    std::erase_if(flows, [&](const flow& f) { return f.id == id; });
  }
  std::optional<shared_link::completion> next() const {
    std::optional<shared_link::completion> best;
    for (const auto& f : flows) {
      const double t = last + f.remaining / rate(f.cap);
      if (!best || t < best->time || (t == best->time && f.id < best->id)) best = shared_link::completion{t, f.id};
    }
    return best;
  }
};
}  // namespace

// Hundreds of transfers with a few distinct caps (groups) and many distinct
// ones, arriving, finishing and cancelled at pseudo-random times: every
// completion (time and id) agrees with the O(n) reference.
BOOST_AUTO_TEST_CASE(agrees_with_the_direct_rule_under_churn) {
  for (const double bandwidth : {1000.0, 50.0}) {
    shared_link l{bandwidth};
    naive_link ref{bandwidth};
    std::uint64_t x = 0x9e3779b97f4a7c15ull;
    const auto next_rand = [&] {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      return x;
    };
    std::vector<std::uint64_t> active;
    double now = 0.0;
    std::uint64_t completions = 0;
    for (int step = 0; step < 4000; ++step) {
      const auto r = next_rand();
      const auto mine = l.next_completion(now), theirs = ref.next();
      BOOST_REQUIRE(mine.has_value() == theirs.has_value());
      if (mine) {
        BOOST_TEST(mine->time == theirs->time, boost::test_tools::tolerance(1e-9));
      }
      const double gap = static_cast<double>(r % 1000) * 2e-3;
      if (mine && mine->time <= now + gap) {
        // The earliest one finishes first (ids may differ only on an exact tie).
        now = std::max(now, mine->time);
        const std::uint64_t id = std::fabs(mine->time - theirs->time) < 1e-9 ? theirs->id : mine->id;
        BOOST_TEST(l.remaining(now, id) <= 1e-6);
        BOOST_TEST(l.remove(now, id));
        ref.remove(now, id);
        std::erase(active, id);
        ++completions;
        continue;
      }
      now += gap;
      if (r % 7 == 0 && !active.empty()) {  // cancel one
        const std::uint64_t id = active[(r >> 8) % active.size()];
        BOOST_TEST(l.remove(now, id));
        ref.remove(now, id);
        std::erase(active, id);
      } else if (active.size() < 200) {
        std::uint64_t id = (r >> 16) % 1000;
        while (std::find(active.begin(), active.end(), id) != active.end()) id = (id + 1) % 1000;
        // Half the transfers share one of three caps, the rest have their own.
        const double cap = r % 2 ? 5.0 * static_cast<double>(1 + (r >> 20) % 3)
                                 : 1.0 + static_cast<double>((r >> 24) % 100000) * 1e-3;
        const double bytes = 1.0 + static_cast<double>((r >> 40) % 500);
        l.add(now, id, bytes, cap);
        ref.add(now, id, bytes, cap);
        active.push_back(id);
      }
      BOOST_TEST(l.active() == active.size());
    }
    BOOST_TEST_MESSAGE("completions " << completions);
    BOOST_TEST(completions > 500u);
  }
}

// link_set (the simulator's flow scheduling; docs/sim.md "Network"): one
// check per link at its earliest completion, not re-armed while that stays
// the same; a stale check is ignored; a cancel re-arms; unlimited links
// schedule nothing.
BOOST_AUTO_TEST_CASE(link_set_keeps_one_current_check_per_link) {
  ashl::sim::link_set ls;
  ls.reset({1e6, std::numeric_limits<double>::infinity()});
  BOOST_TEST(!ls.unlimited(0));
  BOOST_TEST(ls.unlimited(1));
  auto c1 = ls.add(0, 0.0, 1, 1000, 1e9);  // alone at 1 MB/s: done at 1 ms
  BOOST_TEST_REQUIRE(c1.has_value());
  BOOST_TEST(c1->time == 0.001, boost::test_tools::tolerance(1e-12));
  // A second, longer transfer halves the share: transfer 1 now ends at 2 ms (re-armed).
  auto c2 = ls.add(0, 0.0, 2, 3000, 1e9);
  BOOST_TEST_REQUIRE(c2.has_value());
  BOOST_TEST(c2->version > c1->version);
  BOOST_TEST(c2->time == 0.002, boost::test_tools::tolerance(1e-12));
  // The first check is stale now: it completes nothing and schedules nothing.
  auto stale = ls.fire(0, c1->version, 0.001);
  BOOST_TEST(!stale.finished.has_value());
  BOOST_TEST(!stale.next.has_value());
  // The current one completes transfer 1 and arms the check of transfer 2
  // (2000 bytes left alone at 1 MB/s: 2 ms later).
  auto r = ls.fire(0, c2->version, 0.002);
  BOOST_TEST_REQUIRE(r.finished.has_value());
  BOOST_TEST(*r.finished == 1u);
  BOOST_TEST_REQUIRE(r.next.has_value());
  BOOST_TEST(r.next->time == 0.004, boost::test_tools::tolerance(1e-12));
  // Cancelling transfer 2 leaves nothing to check; cancelling it again is a no-op.
  BOOST_TEST(!ls.cancel(0, 0.003, 2).has_value());
  BOOST_TEST(ls[0].active() == 0u);
  auto after = ls.fire(0, r.next->version, 0.004);  // its check went stale with the cancel
  BOOST_TEST(!after.finished.has_value());
  BOOST_TEST(!ls.cancel(1, 0.0, 5).has_value());  // unlimited: nothing to cancel
}
