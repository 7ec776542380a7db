#include <ashl/coll/inproc.hpp>
#include <boost/test/unit_test.hpp>

#include <functional>
#include <thread>
#include <vector>

#include "../support/on_ranks.hpp"
#include "../support/checks.hpp"

using namespace ashl;
using ashl_test::on_ranks;
using namespace ashl::coll;

BOOST_AUTO_TEST_CASE(allreduce_sum_max_min_and_in_place) {
  on_ranks(3, [](inproc& c) {
    const int r = c.rank();
    std::vector<float> x = {float(r), float(-r), 0.5f * float(r + 1)};
    std::vector<float> y(3);
    ASHL_TEST(blocking(c, c.allreduce(cview(x), view(y), reduce_op::sum, {})).ok());
    ASHL_TEST(y == (std::vector<float>{3.f, -3.f, 3.f}));
    ASHL_TEST(blocking(c, c.allreduce(cview(x), view(y), reduce_op::max, {})).ok());
    ASHL_TEST(y == (std::vector<float>{2.f, 0.f, 1.5f}));
    ASHL_TEST(blocking(c, c.allreduce(cview(x), view(x), reduce_op::min, {})).ok());  // in place
    ASHL_TEST(x == (std::vector<float>{0.f, -2.f, 0.5f}));
  });
}

BOOST_AUTO_TEST_CASE(half_allreduce_rounds_each_partial) {
  on_ranks(2, [](inproc& c) {
    std::vector<half> x = {half::from_float(1.0f), half::from_float(c.rank() ? 2048.f : 1.f)};
    ASHL_TEST(blocking(c, c.allreduce(cview(x), view(x), reduce_op::sum, {})).ok());
    ASHL_TEST(x[0].to_float() == 2.0f);
    ASHL_TEST(x[1].to_float() == 2048.0f);  // 2049 rounds to even in binary16
  });
}

BOOST_AUTO_TEST_CASE(uneven_reduce_scatter_and_all_gather_with_zero_and_one) {
  on_ranks(4, [](inproc& c) {
    const std::vector<std::size_t> counts = {0, 1, 5, 2};
    const auto d = displacements(counts);
    std::vector<double> in(8);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = double(i) + 10.0 * c.rank();
    std::vector<double> mine(counts[std::size_t(c.rank())]);
    ASHL_TEST(blocking(c, c.reduce_scatter(cview(in), view(mine), counts, reduce_op::sum, {})).ok());
    for (std::size_t j = 0; j < mine.size(); ++j) ASHL_TEST(mine[j] == 4.0 * double(d[std::size_t(c.rank())] + j) + 60.0);
    std::vector<double> all(8, -1.0);
    ASHL_TEST(blocking(c, c.all_gather(cview(mine), view(all), counts, {})).ok());
    for (std::size_t j = 0; j < all.size(); ++j) ASHL_TEST(all[j] == 4.0 * double(j) + 60.0);
    // in place: the rank's block of `all` is its input
    for (std::size_t j = 0; j < all.size(); ++j) all[j] = (j >= d[std::size_t(c.rank())] && j < d[std::size_t(c.rank()) + 1]) ? double(c.rank()) : -1.0;
    in_view<> own(all.data() + d[std::size_t(c.rank())], counts[std::size_t(c.rank())], dtype::f64);
    ASHL_TEST(blocking(c, c.all_gather(own, view(all), counts, {})).ok());
    ASHL_TEST(all == (std::vector<double>{1, 2, 2, 2, 2, 2, 3, 3}));
  });
}

BOOST_AUTO_TEST_CASE(broadcast_barrier_and_non_blocking_order) {
  on_ranks(3, [](inproc& c) {
    std::vector<std::int8_t> b(4, std::int8_t(c.rank()));
    auto r1 = c.broadcast(view(b), 2, {});
    ASHL_REQUIRE(r1);
    auto r2 = c.barrier({});
    ASHL_REQUIRE(r2);
    ASHL_TEST(c.wait(*r2).ok());
    auto t = c.test(*r1);  // completed before the barrier behind it
    ASHL_TEST(t.has_value());
    ASHL_TEST(*t);
    ASHL_TEST(c.wait(*r1).ok());
    ASHL_TEST(b == (std::vector<std::int8_t>(4, 2)));
    ASHL_TEST(c.counters().broadcasts == 1u);
    ASHL_TEST(c.counters().barriers == 1u);
  });
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_errors_naming_the_field) {
  on_ranks(2, [](inproc& c) {
    std::vector<float> a(3), b(2);
    auto r = c.allreduce(cview(a), view(b), reduce_op::sum, {});
    ASHL_REQUIRE(!r);
    ASHL_TEST(r.error().message().find("allreduce.out.size = 2") != std::string::npos);
    const std::vector<std::size_t> wrong = {1, 1, 1};
    auto s = c.reduce_scatter(cview(a), view(b), wrong, reduce_op::sum, {});
    ASHL_REQUIRE(!s);
    ASHL_TEST(s.error().message().find("reduce_scatter.counts.size = 3") != std::string::npos);
    auto q = c.broadcast(view(a), 5, {});
    ASHL_TEST(!q);
    // Ranks that disagree on the dtype both get an error.
    std::vector<double> d(3);
    auto m = c.rank() == 0 ? c.allreduce(cview(a), view(a), reduce_op::sum, {})
                           : c.allreduce(cview(d), view(d), reduce_op::sum, {});
    ASHL_REQUIRE(m);
    auto st = c.wait(*m);
    ASHL_TEST(!st.ok());
    ASHL_TEST(st.message().find("allreduce.dtype") != std::string::npos);
    ASHL_TEST(c.counters().errors == 4u);
  });
}
