#include <ashl/profile/capability.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <vector>

namespace ap = ashl::profile;
namespace tt = boost::test_tools;

namespace {
// Deterministic ±2% jitter with zero mean over each pair of samples.
double jitter(std::size_t i) { return i % 2 == 0 ? 1.02 : 0.98; }
}  // namespace

BOOST_AUTO_TEST_CASE(compute_fit_exact_and_noisy) {
  auto c = ap::fit_compute({{32, 0.021}, {64, 0.037}, {128, 0.069}});
  BOOST_TEST_REQUIRE(c.has_value());
  BOOST_TEST(c->a == 0.005, tt::tolerance(1e-9));
  BOOST_TEST(c->b == 0.0005, tt::tolerance(1e-9));
  BOOST_TEST(c->predict(96) == 0.053, tt::tolerance(1e-9));

  std::vector<ap::sample> s;
  for (std::size_t i = 0; i < 40; ++i) {
    const double batch = 16.0 * static_cast<double>(1 + i / 2);
    s.push_back({batch, (0.004 + 0.0003 * batch) * jitter(i)});
  }
  auto n = ap::fit_compute(s);
  BOOST_TEST_REQUIRE(n.has_value());
  BOOST_TEST(n->a == 0.004, tt::tolerance(0.05));
  BOOST_TEST(n->b == 0.0003, tt::tolerance(0.02));
}

BOOST_AUTO_TEST_CASE(link_fit_recovers_latency_and_bandwidth) {
  const double alpha = 50e-6, beta = 1.25e9;  // 50 us, 10 Gbit/s
  std::vector<ap::sample> s;
  for (std::size_t i = 0; i < 20; ++i) {
    const double bytes = 1e5 * static_cast<double>(1 + i / 2);
    s.push_back({bytes, (alpha + bytes / beta) * jitter(i)});
  }
  auto l = ap::fit_link(s);
  BOOST_TEST_REQUIRE(l.has_value());
  BOOST_TEST(l->alpha == alpha, tt::tolerance(0.1));
  BOOST_TEST(l->beta == beta, tt::tolerance(0.03));
  BOOST_TEST(l->predict(1e6) == alpha + 1e6 / beta, tt::tolerance(0.03));
  BOOST_TEST(l->predict(1e6, 4) == l->alpha + 4e6 / l->beta, tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(codec_fit_through_origin) {
  auto c = ap::fit_codec({{1000, 2e-6}, {2000, 4e-6}, {4000, 8e-6}});
  BOOST_TEST_REQUIRE(c.has_value());
  BOOST_TEST(c->seconds_per_element == 2e-9, tt::tolerance(1e-9));
  BOOST_TEST(c->predict(1e6) == 2e-3, tt::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(fit_errors) {
  BOOST_TEST(!ap::fit_compute({}).has_value());
  BOOST_TEST(!ap::fit_compute({{32, 0.1}, {32, 0.2}}).has_value());  // one distinct x
  auto bad = ap::fit_compute({{32, 0.1}, {64, -0.5}});
  BOOST_TEST_REQUIRE(!bad.has_value());
  BOOST_TEST(bad.error().message() == "capability.compute[1].seconds = -0.5: duration must be finite and > 0");
  BOOST_TEST(!ap::fit_link({{100, 0.2}, {200, 0.1}}).has_value());  // shrinking with bytes
  BOOST_TEST(!ap::fit_codec({{0, 0.1}}).has_value());
  BOOST_TEST(!ap::fit_codec({{std::numeric_limits<double>::infinity(), 0.1}}).has_value());
}

BOOST_AUTO_TEST_CASE(link_fit_from_one_size_with_a_given_latency) {
  const double alpha = 50e-6, beta = 1.25e9, bytes = 4e6;
  std::vector<ap::sample> s;
  for (std::size_t i = 0; i < 10; ++i) s.push_back({bytes, alpha + bytes / beta * jitter(i)});
  BOOST_TEST(!ap::fit_link(s).has_value());  // one size: α and β cannot be separated
  auto l = ap::fit_link_at_latency(s, alpha);
  BOOST_TEST_REQUIRE(l.has_value());
  BOOST_TEST(l->alpha == alpha);
  BOOST_TEST(l->beta == beta, tt::tolerance(1e-9));
  auto over = ap::fit_link_at_latency(s, 1.0);  // latency larger than every measured time
  BOOST_TEST_REQUIRE(!over.has_value());
  BOOST_TEST(over.error().message() == "capability.link.alpha = 1: must be below the measured times");
  BOOST_TEST(!ap::fit_link_at_latency(s, -1e-6).has_value());
}

BOOST_AUTO_TEST_CASE(capability_from_measurements_recovers_known_parameters) {
  using k = ap::measurement_kind;
  const double a = 0.004, b = 0.0003, alpha = 80e-6, beta = 1e9, up_beta = 5e8, spe = 3e-9;
  std::vector<ap::measurement> m;
  for (std::size_t i = 0; i < 24; ++i) {
    const double batch = 16.0 * static_cast<double>(1 + (i / 2) % 4);  // both jitters per batch
    const double bytes = 1e6 * static_cast<double>(1 + i % 3);
    m.push_back({.worker = 1, .kind = k::compute, .seconds = (a + b * batch) * jitter(i), .amount = batch});
    m.push_back({.worker = 1, .kind = k::push, .seconds = (alpha + bytes / up_beta) * jitter(i), .amount = bytes});
    m.push_back({.worker = 1, .kind = k::pull, .seconds = alpha + 4e6 / beta, .amount = 4e6});
    m.push_back({.worker = 1, .kind = k::compress, .seconds = spe * 1e6 * jitter(i), .amount = 1e6});
    m.push_back({.worker = 0, .kind = k::compute, .seconds = 9.0, .amount = 32});  // another worker
    m.push_back({.worker = 1, .kind = k::round, .seconds = 7.0});                 // ignored
  }
  // Pull has one size only: it needs the latency.
  auto missing = ap::fit_capability(m, 1);
  BOOST_TEST_REQUIRE(!missing.has_value());
  BOOST_TEST(missing.error().message() ==
             "capability.worker[1].pull.sizes = 1: samples of one size need a given link_latency");
  auto c = ap::fit_capability(m, 1, {.link_latency = alpha});
  BOOST_TEST_REQUIRE(c.has_value());
  BOOST_TEST(c->compute.a == a, tt::tolerance(0.05));
  BOOST_TEST(c->compute.b == b, tt::tolerance(0.02));
  BOOST_TEST(c->push.alpha == alpha, tt::tolerance(0.25));
  BOOST_TEST(c->push.beta == up_beta, tt::tolerance(0.03));
  BOOST_TEST(c->pull.alpha == alpha);
  BOOST_TEST(c->pull.beta == beta, tt::tolerance(1e-9));
  BOOST_TEST(c->codec.seconds_per_element == spe, tt::tolerance(1e-9));

  // One batch size: compute proportional to the batch.
  auto one = ap::fit_capability({{.worker = 0, .kind = k::compute, .seconds = 0.064, .amount = 32},
                                 {.worker = 0, .kind = k::push, .seconds = 0.002, .amount = 1e6},
                                 {.worker = 0, .kind = k::pull, .seconds = 0.002, .amount = 1e6}},
                                0, {.link_latency = 0.0});
  BOOST_TEST_REQUIRE(one.has_value());
  BOOST_TEST(one->compute.a == 0.0);
  BOOST_TEST(one->compute.b == 0.002, tt::tolerance(1e-12));
  BOOST_TEST(one->codec.seconds_per_element == 0.0);
}

BOOST_AUTO_TEST_CASE(capability_rejects_absurd_timings) {
  using k = ap::measurement_kind;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<ap::measurement> m{{.worker = 0, .kind = k::compute, .seconds = 0.1, .amount = 32},
                                 {.worker = 0, .kind = k::compute, .seconds = nan, .amount = 64}};
  auto c = ap::fit_capability(m, 0);
  BOOST_TEST_REQUIRE(!c.has_value());
  BOOST_TEST(c.error().message() == "measurement.seconds = nan: duration must be finite and > 0");
  auto none = ap::fit_capability(m, 5);
  BOOST_TEST_REQUIRE(!none.has_value());
  BOOST_TEST(none.error().message() == "capability.worker[5].compute.size = 0: no samples");
}
