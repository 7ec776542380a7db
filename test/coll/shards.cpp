#include <ashl/coll/shards.hpp>
#include <boost/test/unit_test.hpp>

#include <ashl/coll/inproc.hpp>

#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include "../support/on_ranks.hpp"
#include "../support/checks.hpp"

using namespace ashl;
using ashl_test::on_ranks;
using namespace ashl::coll;

namespace {
using sizes = std::vector<std::size_t>;
}  // namespace

BOOST_AUTO_TEST_CASE(counts_follow_the_weights_and_add_up) {
  ASHL_TEST(*shard_counts(10, std::vector<double>{1, 1}) == (sizes{5, 5}));
  ASHL_TEST(*shard_counts(10, std::vector<double>{1, 3}) == (sizes{3, 7}));   // 2.5 / 7.5: tie to the lower rank
  ASHL_TEST(*shard_counts(7, std::vector<double>{1, 1, 1}) == (sizes{3, 2, 2}));
  ASHL_TEST(*shard_counts(1, std::vector<double>{1, 1, 1}) == (sizes{1, 0, 0}));
  ASHL_TEST(*shard_counts(0, std::vector<double>{1, 2}) == (sizes{0, 0}));
  ASHL_TEST(*shard_counts(5, std::vector<double>{0, 1, 0}) == (sizes{0, 5, 0}));
  const auto c = *shard_counts(1000003, std::vector<double>{0.3, 1.7, 2.9, 0.01});
  ASHL_TEST(std::accumulate(c.begin(), c.end(), std::size_t{0}) == 1000003u);
}

BOOST_AUTO_TEST_CASE(bad_weights_are_named) {
  auto a = shard_counts(4, std::vector<double>{1, -1});
  ASHL_REQUIRE(!a);
  ASHL_TEST(a.error().message().find("shards.weights[1] = -1") != std::string::npos, a.error().message());
  ASHL_TEST(!shard_counts(4, std::vector<double>{0, 0}));
  ASHL_TEST(!shard_counts(4, std::vector<double>{}));
}

BOOST_AUTO_TEST_CASE(counts_from_profile_capabilities) {
  std::vector<profile::worker_capability> caps(3);
  caps[0].compute = {0.0, 0.01};   // 100 samples/s
  caps[1].compute = {0.0, 0.005};  // 200
  caps[2].compute = {0.0, 0.0025}; // 400
  caps[0].push = {0, 1e9};
  caps[0].pull = {0, 2e9};
  caps[1].push = caps[1].pull = {0, 1e9};
  caps[2].push = caps[2].pull = {0, 2e9};
  ASHL_TEST(*shard_counts(700, caps, shard_basis::compute, 32) == (sizes{100, 200, 400}));
  ASHL_TEST(*shard_counts(800, caps, shard_basis::bandwidth) == (sizes{200, 200, 400}));  // slower of push/pull
  caps[1].pull.beta = 0;
  auto bad = shard_counts(10, caps, shard_basis::bandwidth);
  ASHL_REQUIRE(!bad);
  ASHL_TEST(bad.error().message().find("shards.caps[1].beta") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(uneven_allreduce_with_blocks_of_0_and_1) {
  on_ranks(4, [](inproc& c) {
    uneven_allreduce<inproc> ar(sizes{0, 1, 6, 2});
    std::vector<float> x(9);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i) * float(c.rank() + 1);
    ASHL_REQUIRE(ar.run(c, view(x)).ok());
    for (std::size_t i = 0; i < x.size(); ++i) ASHL_TEST(x[i] == float(i) * 10.f);
  });
}
