#include <ashl/ps/device_staging.hpp>

#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <string>
#include <vector>

// The host side of the device worker: the staging layout (one 256-byte
// aligned region per shard, none overlapping), UCX's memory types asked at
// run time, and the staging choice with its reason.

namespace ps = ashl::ps;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

BOOST_AUTO_TEST_CASE(regions_are_aligned_and_disjoint) {
  const std::vector<std::size_t> caps = {0, 1, 256, 257, 1000, 12};
  const auto l = ps::staging_layout::of(caps);
  BOOST_TEST(l.shards() == caps.size());
  const std::vector<std::size_t> want = {0, 0, 256, 512, 1024, 2048};
  for (std::size_t k = 0; k < caps.size(); ++k) {
    BOOST_TEST(l.offset(k) == want[k], "shard " << k);
    BOOST_TEST(l.offset(k) % ps::staging_layout::alignment == 0u);
    BOOST_TEST(l.capacity(k) == caps[k]);
    if (k + 1 < caps.size()) BOOST_TEST(l.offset(k) + l.capacity(k) <= l.offset(k + 1));
  }
  BOOST_TEST(l.total() == 2048u + 256u);
  BOOST_TEST(l.offset(caps.size() - 1) + l.capacity(caps.size() - 1) <= l.total());
}

BOOST_AUTO_TEST_CASE(no_shards_take_no_bytes) {
  const auto l = ps::staging_layout::of({});
  BOOST_TEST(l.shards() == 0u);
  BOOST_TEST(l.total() == 0u);
  BOOST_TEST(ps::staging_layout::round_up(0) == 0u);
  BOOST_TEST(ps::staging_layout::round_up(1) == 256u);
  BOOST_TEST(ps::staging_layout::round_up(512) == 512u);
}

BOOST_AUTO_TEST_CASE(ucx_memory_types_are_probed_at_run_time) {
  auto m = ps::probe_ucx_memory();
  BOOST_TEST_REQUIRE(m.has_value(), (m ? "" : m.error().message()));
#if ASHL_HAS_UCX()
  BOOST_TEST(m->probed);
  BOOST_TEST(m->host);  // every UCX build sends from host memory
  BOOST_TEST((m->raw & 1u) != 0u);
  BOOST_TEST(contains(m->describe(), "host"), m->describe());
  BOOST_TEST(contains(m->describe(), "cuda") == m->cuda, m->describe());
#else
  BOOST_TEST(!m->probed);
  BOOST_TEST(contains(m->describe(), "not probed"), m->describe());
#endif
  const auto c = ps::choose_staging(*m);
  BOOST_TEST((c.path == ps::staging_path::pinned_host));
  BOOST_TEST(contains(c.reason, "pinned host memory"), c.reason);
}

BOOST_AUTO_TEST_CASE(cuda_capable_ucx_still_stages_and_says_why) {
  ps::ucx_memory_types m;
  m.probed = m.host = m.cuda = true;
  const auto c = ps::choose_staging(m);
  BOOST_TEST((c.path == ps::staging_path::pinned_host));
  BOOST_TEST(contains(c.reason, "CRC-32C"), c.reason);
  BOOST_TEST(contains(m.describe(), "cuda"), m.describe());
  ps::ucx_memory_types none;
  none.probed = none.host = true;
  BOOST_TEST(contains(ps::choose_staging(none).reason, "no CUDA memory"));
  BOOST_TEST(contains(none.describe(), "(no CUDA memory)"), none.describe());
}
