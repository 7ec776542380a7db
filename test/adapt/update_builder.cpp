#include <ashl/adapt/update_builder.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

// adapt/update_builder.hpp: the delta since the pull, the mean gradient of a
// cycle (one iteration: the gradient bit for bit), finiteness, the tied
// parameter rule, the bucket partition, the bucket cap rule and the bucket
// addresses that both torch adapters use.

namespace adapt = ashl::adapt;

BOOST_AUTO_TEST_CASE(delta_is_params_minus_the_pulled_parameters) {
  adapt::update_builder b(adapt::update_kind::delta, 3);
  std::vector<float> w{1.0f, 2.0f, 3.0f}, out(3);
  b.pulled(w);
  w = {1.5f, 1.0f, 3.0f};  // the local optimizer stepped
  b.add({});
  b.build(w, out);
  BOOST_TEST((out == std::vector<float>{0.5f, -1.0f, 0.0f}));
  BOOST_TEST(b.iterations() == 1u);
  b.pulled(w);
  BOOST_TEST(b.iterations() == 0u);
  b.build(w, out);
  BOOST_TEST((out == std::vector<float>{0.0f, 0.0f, 0.0f}));
}

BOOST_AUTO_TEST_CASE(gradient_is_the_mean_of_the_cycle_and_one_iteration_is_copied_exactly) {
  adapt::update_builder b(adapt::update_kind::gradient, 2);
  std::vector<float> g1{0.1f, 3.0f}, g2{0.3f, -1.0f}, out(2);
  b.add(g1);
  b.build({}, out);
  BOOST_TEST((out == g1));
  b.add(g2);
  b.build({}, out);
  BOOST_TEST(out[0] == (0.1f + 0.3f) / 2.0f);
  BOOST_TEST(out[1] == 1.0f);
  b.pulled({});
  b.add(g2);
  b.build({}, out);
  BOOST_TEST((out == g2));
}

BOOST_AUTO_TEST_CASE(all_finite_finds_inf_and_nan) {
  std::vector<float> x(1000, 1.5f);
  BOOST_TEST(adapt::all_finite(x));
  x[977] = std::numeric_limits<float>::infinity();
  BOOST_TEST(!adapt::all_finite(x));
  x[977] = -std::numeric_limits<float>::infinity();
  BOOST_TEST(!adapt::all_finite(x));
  x[977] = std::nanf("");
  BOOST_TEST(!adapt::all_finite(x));
  BOOST_TEST(adapt::all_finite(std::span<const float>{}));
}

BOOST_AUTO_TEST_CASE(a_tied_parameter_owns_its_first_registration) {
  const std::vector<int> keys{7, 3, 7, 9, 3};
  BOOST_TEST((adapt::first_registrations(std::span<const int>(keys)) == std::vector<bool>{true, true, false, true, false}));
}

BOOST_AUTO_TEST_CASE(buckets_go_in_reverse_order_one_dtype_each_up_to_the_cap) {
  // Slots 0..5 in registration order; bytes and dtypes per slot.
  const std::vector<std::string> dt{"f32", "f32", "bf16", "f32", "f32", "f32"};
  const std::vector<std::uint64_t> bytes{100, 40, 10, 30, 80, 20};
  auto d = [&](std::size_t i) { return dt[i]; };
  auto n = [&](std::size_t i) { return bytes[i]; };
  using buckets = std::vector<std::vector<std::size_t>>;
  BOOST_TEST((adapt::partition(6, d, n, 100) == buckets{{5, 4}, {3, 1}, {2}, {0}}));
  BOOST_TEST((adapt::partition(6, d, n, 0) == buckets{{5, 4, 3, 1, 0}, {2}}));
  BOOST_TEST((adapt::partition(6, d, n, 10) == buckets{{5}, {4}, {3}, {2}, {1}, {0}}));  // larger ones alone
}

BOOST_AUTO_TEST_CASE(a_slot_larger_than_the_partition_is_cut_across_consecutive_buckets) {
  // Slots 0..3: bytes (float32: elements = bytes / 4) and dtypes.
  const std::vector<std::string> dt{"f32", "f32", "bf16", "f32"};
  const std::vector<std::uint64_t> bytes{40, 4, 24, 8};
  auto d = [&](std::size_t i) { return dt[i]; };
  auto b = [&](std::size_t i) { return bytes[i]; };
  auto e = [&](std::size_t i) { return bytes[i] / (dt[i] == "f32" ? 4 : 2); };
  using P = adapt::bucket_piece;
  using plan = std::vector<std::vector<P>>;
  // part 16 bytes: slot 0 (10 elements) in ceil(40 / 16) = 3 pieces of 3, 3, 4
  // elements in element order, each alone; slot 2 (12 bf16) in 2; slots 3
  // and 1 (float32) share a bucket under the cap.
  BOOST_TEST((adapt::plan_buckets(4, d, b, e, 100, 16) ==
              plan{{P{3, 0, 2}, P{1, 0, 1}}, {P{2, 0, 6}}, {P{2, 6, 6}}, {P{0, 0, 3}}, {P{0, 3, 3}}, {P{0, 6, 4}}}));
  BOOST_TEST((adapt::plan_buckets(4, d, b, e, 100, 0) == plan{{P{3, 0, 2}, P{1, 0, 1}, P{0, 0, 10}}, {P{2, 0, 12}}}));
  BOOST_TEST((adapt::plan_buckets(4, d, b, e, 0, 16) == plan{{P{3, 0, 2}, P{1, 0, 1}, P{0, 0, 10}}, {P{2, 0, 12}}}));
  constexpr std::uint64_t mib = 1 << 20;
  BOOST_TEST(adapt::partition_bytes(adapt::default_partition_mb) == 4 * mib);
  BOOST_TEST(adapt::partition_bytes(std::numeric_limits<double>::infinity()) == 0u);  // no partitioning
  BOOST_TEST(!adapt::valid_partition_mb(0.0));
  BOOST_TEST(!adapt::valid_partition_mb(-1.0));
  BOOST_TEST(!adapt::valid_partition_mb(std::numeric_limits<double>::quiet_NaN()));
}

BOOST_AUTO_TEST_CASE(the_bucket_cap_rule_and_bucket_addresses_are_both_adapters) {
  constexpr std::uint64_t mib = 1 << 20;
  BOOST_TEST(adapt::bucket_cap_bytes(212) == mib);                   // never below 1 MiB
  BOOST_TEST(adapt::bucket_cap_bytes(42 * mib) == 42 * mib / 4);     // a quarter of a smaller model
  BOOST_TEST(adapt::bucket_cap_bytes(400 * mib) == 25 * mib);        // DDP's 25 MiB
  BOOST_TEST(adapt::bucket_cap_bytes(400 * mib, 10.0) == 10 * mib);  // a number as given
  BOOST_TEST(adapt::bucket_cap_bytes(400 * mib, 0.0) == 0u);         // one bucket per dtype
  using names = std::vector<std::string>;
  BOOST_TEST((*adapt::bucket_addresses({"h:7000", "g:7001"}, 0, false) == names{"h:7000", "g:7001"}));
  BOOST_TEST((*adapt::bucket_addresses({"h:7000", "g:7001"}, 2, false) == names{"h:7004", "g:7005"}));
  BOOST_TEST((*adapt::bucket_addresses({"[::1]:7000"}, 1, false) == names{"[::1]:7001"}));
  BOOST_TEST((*adapt::bucket_addresses({"s0"}, 1, true) == names{"s0/b1"}));
  BOOST_TEST(!adapt::bucket_addresses({"nohost"}, 1, false).has_value());
  BOOST_TEST(!adapt::bucket_addresses({"h:70x0"}, 1, false).has_value());
}
