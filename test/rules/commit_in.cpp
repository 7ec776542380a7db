#include <ashl/rules/commit_in.hpp>

#include <boost/test/unit_test.hpp>

#include <array>
#include <cstddef>
#include <cstdint>

namespace ps = ashl::ps;
namespace wire = ashl::wire;

// The worker sets the flags, the real server and the simulator read them
// (docs/ps.md "Servers and workers"): a pull rides with a commit or not, and
// only a pull can be a push's (answered with an acknowledgement).
BOOST_AUTO_TEST_CASE(a_push_is_acknowledged_only_when_a_pull_rides) {
  BOOST_TEST(ps::commit_flags(false, false) == 0u);
  BOOST_TEST(ps::commit_flags(false, true) == 0u);
  BOOST_TEST(ps::commit_flags(true, false) == wire::flag_pull);
  BOOST_TEST(ps::commit_flags(true, true) == (wire::flag_pull | wire::flag_ack_requested));
  for (bool pull : {false, true})
    for (bool push : {false, true}) {
      const std::uint32_t f = ps::commit_flags(pull, push) | wire::flag_last_shard;
      BOOST_TEST(ps::pull_acknowledged(f) == (pull && push));
    }
  // An acknowledgement asked for without a pull is no push's pull.
  BOOST_TEST(!ps::pull_acknowledged(wire::flag_ack_requested));
}

BOOST_AUTO_TEST_CASE(the_commit_carries_every_header_field_the_core_reads) {
  const std::array<std::byte, 8> bytes{};
  const wire::header h{.kind = wire::message_kind::commit,
                       .codec = ashl::codec_id::topk,
                       .type = ashl::dtype::f16,
                       .flags = ps::commit_flags(true, true) | wire::flag_last_shard,
                       .element_count = 1000,
                       .tensor = 3,
                       .rank = 9,
                       .sequence = 41,
                       .clock = 17,
                       .step = 123,
                       .samples = 640};
  const ps::commit_in c = ps::commit_in_of(h, 2, 5, bytes, 80);
  BOOST_TEST(c.worker == 2u);  // the connection's rank, not the header's
  BOOST_TEST(c.incarnation == 5u);
  BOOST_TEST(c.sequence == 41u);
  BOOST_TEST(c.clock == 17u);
  BOOST_TEST(c.samples == 640u);
  BOOST_TEST(c.bytes == 80u);
  BOOST_TEST((c.codec == ashl::codec_id::topk));
  BOOST_TEST((c.type == ashl::dtype::f16));
  BOOST_TEST(c.element_count == 1000u);
  BOOST_TEST(c.step == 123u);
  BOOST_TEST(c.tensor == 3u);
  BOOST_TEST(c.payload.data() == bytes.data());
  BOOST_TEST(c.payload.size() == bytes.size());
  BOOST_TEST(c.pull);
  BOOST_TEST(c.ack_only);
  // The driver's own facts stay for the driver to set.
  BOOST_TEST(!c.values_checked);
  BOOST_TEST(!c.payload_kept);

  wire::header plain = h;
  plain.flags = ps::commit_flags(true, false);
  const ps::commit_in d = ps::commit_in_of(plain, 2, 5, bytes, 80);
  BOOST_TEST(d.pull);
  BOOST_TEST(!d.ack_only);
  plain.flags = ps::commit_flags(false, true);
  const ps::commit_in e = ps::commit_in_of(plain, 2, 5, bytes, 80);
  BOOST_TEST(!e.pull);
  BOOST_TEST(!e.ack_only);
}
