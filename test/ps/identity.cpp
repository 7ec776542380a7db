#include <ashl/ps/identity.hpp>

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstdint>
#include <set>

// ps/identity.hpp: fresh incarnations grow within a process and start above
// the wall clock's time (so a later process has a larger one); job ids are
// stable, never 0, and differ by name and by shape.

namespace ps = ashl::ps;

BOOST_AUTO_TEST_CASE(fresh_incarnations_grow_and_differ) {
  const auto before = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                     std::chrono::system_clock::now().time_since_epoch())
                                                     .count());
  std::set<std::uint64_t> seen;
  std::uint64_t last = 0;
  for (int i = 0; i < 1000; ++i) {
    const std::uint64_t v = ps::fresh_incarnation();
    BOOST_TEST(v > last);
    last = v;
    seen.insert(v);
  }
  BOOST_TEST(seen.size() == 1000u);
  // The clock's time less the 16 random bits: a process started after this
  // one's first call gets more than `before` (a restart takes far longer
  // than 2^16 ns).
  BOOST_TEST(*seen.begin() >= (before & ~std::uint64_t{0xffff}));
}

BOOST_AUTO_TEST_CASE(job_ids_are_stable_and_differ_by_name_and_shape) {
  const std::uint64_t a = ps::make_job_id("a", 64, 3, 1);
  BOOST_TEST(a == ps::make_job_id("a", 64, 3, 1));
  BOOST_TEST(a != 0u);
  BOOST_TEST(a != ps::make_job_id("b", 64, 3, 1));
  BOOST_TEST(a != ps::make_job_id("a", 65, 3, 1));
  BOOST_TEST(a != ps::make_job_id("a", 64, 2, 1));
  BOOST_TEST(a != ps::make_job_id("a", 64, 3, 2));
  BOOST_TEST(ps::make_job_id("", 0, 0, 0) != 0u);
  // The name's length is hashed: "ab" + shape never equals "a" + "b..." bytes.
  BOOST_TEST(ps::make_job_id("ab", 1, 1, 1) != ps::make_job_id("a", 1, 1, 1));
  // A fixed value: the id is part of checkpoints and the wire, so it must
  // not change between builds or hosts.
  BOOST_TEST(ps::job_id_text(ps::make_job_id("", 64, 1, 1)).size() == 18u);
  BOOST_TEST(ps::job_id_text(0x0123456789abcdefull) == "0x0123456789abcdef");
}
