#include <ashl/rules/streaming.hpp>

#include <boost/test/unit_test.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

// Counts every allocation of this program: the schedule and the merge run
// per inner step and must allocate nothing.
#include "../support/counting_new.hpp"

namespace ps = ashl::ps;

namespace {
constexpr int none = -1;
int as_int(std::optional<std::uint32_t> p) { return p ? static_cast<int>(*p) : none; }

// Fails naming the field and the value.
void refused(const ps::streaming_params& p, std::uint64_t units, const std::string& field, const std::string& value) {
  const auto s = p.validate(units);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find(field) != std::string::npos, s.message());
  BOOST_TEST(s.message().find(value) != std::string::npos, s.message());
}
}  // namespace

// H = 8, P = 4, τ = 2: offsets 0, 2, 4, 6; fragment p first after 8 + o_p.
BOOST_AUTO_TEST_CASE(schedule_h8_p4_tau2_against_a_table) {
  const ps::streaming_schedule s({.fragments = 4, .interval = 8, .delay = 2, .alpha = 0.5});
  // t:                               0     1     2     3     4     5     6     7  8     9 10    11 12    13 14    15 16    17 18    19 20
  const std::array<int, 21> sync_tab{none, none, none, none, none, none, none, none, 0, none, 1, none, 2, none, 3, none, 0, none, 1, none, 2};
  const std::array<int, 21> merge_tab{none, none, none, none, none, none, none, none, none, none, 0, none, 1, none, 2, none, 3, none, 0, none, 1};
  const std::array<std::uint32_t, 21> flying{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  for (std::uint64_t t = 0; t < sync_tab.size(); ++t) {
    BOOST_TEST(as_int(s.sync_after(t)) == sync_tab[t], "sync after step " << t);
    BOOST_TEST(as_int(s.merge_after(t)) == merge_tab[t], "merge after step " << t);
    BOOST_TEST(s.in_flight(t) == flying[t], "in flight after step " << t);
  }
  BOOST_TEST(s.offset(0) == 0u);
  BOOST_TEST(s.offset(3) == 6u);
  BOOST_TEST(s.first_sync(0) == 8u);
  BOOST_TEST(s.first_sync(1) == 10u);
  BOOST_TEST(s.first_sync(3) == 14u);
}

// H = 10, P = 4 (P does not divide H): offsets ⌊p·10/4⌋ = 0, 2, 5, 7; τ = 0:
// each merge follows its own sync.
BOOST_AUTO_TEST_CASE(schedule_with_uneven_offsets_and_no_overlap) {
  const ps::streaming_schedule s({.fragments = 4, .interval = 10, .delay = 0});
  std::array<int, 23> sync_tab{};
  sync_tab.fill(none);
  sync_tab[10] = 0;
  sync_tab[12] = 1;
  sync_tab[15] = 2;
  sync_tab[17] = 3;
  sync_tab[20] = 0;
  sync_tab[22] = 1;
  for (std::uint64_t t = 0; t < sync_tab.size(); ++t) {
    BOOST_TEST(as_int(s.sync_after(t)) == sync_tab[t], "sync after step " << t);
    BOOST_TEST(as_int(s.merge_after(t)) == sync_tab[t], "merge after step " << t);
    BOOST_TEST(s.in_flight(t) == 0u, "in flight after step " << t);  // merged after the same step
  }
}

// H = 6, P = 3, τ = 5: up to three fragments on the wire at once.
BOOST_AUTO_TEST_CASE(schedule_with_a_long_delay) {
  const ps::streaming_schedule s({.fragments = 3, .interval = 6, .delay = 5});
  // t:                               0     1     2     3     4     5  6     7  8     9 10    11 12    13 14    15 16    17
  const std::array<int, 18> sync_tab{none, none, none, none, none, none, 0, none, 1, none, 2, none, 0, none, 1, none, 2, none};
  const std::array<int, 18> merge_tab{none, none, none, none, none, none, none, none, none, none, none, 0, none, 1, none, 2, none, 0};
  const std::array<std::uint32_t, 18> flying{0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 3, 2, 3, 2, 3, 2, 3, 2};
  for (std::uint64_t t = 0; t < sync_tab.size(); ++t) {
    BOOST_TEST(as_int(s.sync_after(t)) == sync_tab[t], "sync after step " << t);
    BOOST_TEST(as_int(s.merge_after(t)) == merge_tab[t], "merge after step " << t);
    BOOST_TEST(s.in_flight(t) == flying[t], "in flight after step " << t);
  }
}

// P = 1, τ = 0 is Local SGD(H): the one fragment syncs and merges after every
// H-th step and never otherwise.
BOOST_AUTO_TEST_CASE(one_fragment_is_local_sgd) {
  const ps::streaming_schedule s({.fragments = 1, .interval = 5});
  for (std::uint64_t t = 0; t < 40; ++t) {
    const int want = t > 0 && t % 5 == 0 ? 0 : none;
    BOOST_TEST(as_int(s.sync_after(t)) == want);
    BOOST_TEST(as_int(s.merge_after(t)) == want);
  }
}

// Over any H consecutive steps each fragment syncs exactly once and is merged
// exactly once, τ steps after its sync: one fragment's bytes per sync step.
BOOST_AUTO_TEST_CASE(every_fragment_once_per_interval) {
  for (std::uint32_t h : {1u, 2u, 7u, 12u, 100u})
    for (std::uint32_t p = 1; p <= h && p <= 9; ++p)
      for (std::uint32_t tau : {0u, 1u, h - 1}) {
        if (tau >= h) continue;
        const ps::streaming_schedule s({.fragments = p, .interval = h, .delay = tau});
        std::vector<std::uint32_t> syncs(p, 0), merges(p, 0);
        for (std::uint64_t t = 3 * h + 1; t <= 4 * h; ++t) {
          if (auto f = s.sync_after(t)) {
            ++syncs[*f];
            BOOST_TEST(as_int(s.merge_after(t + tau)) == static_cast<int>(*f));
          }
          if (auto f = s.merge_after(t)) ++merges[*f];
        }
        for (std::uint32_t f = 0; f < p; ++f) {
          BOOST_TEST(syncs[f] == 1u, "H " << h << " P " << p << " fragment " << f);
          BOOST_TEST(merges[f] == 1u, "H " << h << " P " << p << " fragment " << f);
        }
      }
}

BOOST_AUTO_TEST_CASE(bad_parameters_are_refused_by_name) {
  refused({.fragments = 0, .interval = 8}, 100, "streaming.fragments", "0");
  refused({.fragments = 5, .interval = 8}, 4, "streaming.fragments", "5");  // more fragments than parameters
  const ps::streaming_params five_of_four{.fragments = 5, .interval = 8};
  BOOST_TEST(five_of_four.validate(4, "layers").message().find("layers (4)") != std::string::npos);
  refused({.fragments = 9, .interval = 8}, 100, "streaming.fragments", "9");  // more than H
  refused({.fragments = 2, .interval = 0}, 100, "streaming.interval", "0");
  refused({.fragments = 2, .interval = 8, .delay = 8}, 100, "streaming.delay", "8");
  refused({.fragments = 2, .interval = 8, .delay = 1, .alpha = -0.25}, 100, "streaming.alpha", "-0.25");
  refused({.fragments = 2, .interval = 8, .delay = 1, .alpha = 1.5}, 100, "streaming.alpha", "1.5");
  refused({.fragments = 2, .interval = 8, .delay = 1, .alpha = std::numeric_limits<double>::quiet_NaN()}, 100,
          "streaming.alpha", "nan");
  const ps::streaming_params widest{.fragments = 4, .interval = 8, .delay = 7, .alpha = 1.0};
  BOOST_TEST(widest.validate(4).ok());
  const ps::streaming_params smallest{.fragments = 1, .interval = 1};
  BOOST_TEST(smallest.validate(1).ok());
}

BOOST_AUTO_TEST_CASE(core_fragments_are_even_contiguous_ranges) {
  // 10 elements in 4 fragments: 3, 3, 2, 2.
  const std::array<std::uint64_t, 5> bounds{0, 3, 6, 8, 10};
  for (std::uint32_t p = 0; p < 4; ++p) {
    BOOST_TEST(ps::fragment_range(10, 4, p).begin == bounds[p]);
    BOOST_TEST(ps::fragment_range(10, 4, p).end == bounds[p + 1]);
  }
  BOOST_TEST(ps::fragment_range(7, 1, 0).end == 7u);
}

BOOST_AUTO_TEST_CASE(layer_fragments_cut_at_the_nearest_layer_boundary) {
  std::array<std::uint32_t, 2> two{};
  const std::array<std::uint64_t, 4> even{10, 10, 10, 10};
  BOOST_TEST(ps::layer_fragments(even, two).ok());
  BOOST_TEST((two == std::array<std::uint32_t, 2>{0, 2}));

  const std::array<std::uint64_t, 5> big_first{100, 1, 1, 1, 1};
  BOOST_TEST(ps::layer_fragments(big_first, two).ok());
  BOOST_TEST((two == std::array<std::uint32_t, 2>{0, 1}));
  std::array<std::uint32_t, 3> three{};
  BOOST_TEST(ps::layer_fragments(big_first, three).ok());  // each fragment keeps a layer
  BOOST_TEST((three == std::array<std::uint32_t, 3>{0, 1, 2}));

  const std::array<std::uint64_t, 5> big_last{1, 1, 1, 1, 100};
  BOOST_TEST(ps::layer_fragments(big_last, two).ok());
  BOOST_TEST((two == std::array<std::uint32_t, 2>{0, 4}));

  // An MLP's weights and biases: 784·100, 100, 100·10, 10 → the big weight alone.
  const std::array<std::uint64_t, 4> mlp{78400, 100, 1000, 10};
  BOOST_TEST(ps::layer_fragments(mlp, two).ok());
  BOOST_TEST((two == std::array<std::uint32_t, 2>{0, 1}));

  std::array<std::uint32_t, 5> five{};
  const auto s = ps::layer_fragments(even, five);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("streaming.fragments") != std::string::npos, s.message());
  BOOST_TEST(s.message().find("layers (4)") != std::string::npos, s.message());
}

BOOST_AUTO_TEST_CASE(merge_mixes_in_f32_and_moves_the_reference) {
  std::vector<float> local{1.0f, 2.0f, -4.0f}, ref{9.0f, 9.0f, 9.0f};
  const std::vector<float> global{3.0f, 0.5f, 0.0f};
  ps::streaming_merge(local, global, ref, 0.5);
  BOOST_TEST(local == (std::vector<float>{0.5f * 1.0f + 0.5f * 3.0f, 0.5f * 2.0f + 0.5f * 0.5f, 0.5f * -4.0f}),
             boost::test_tools::per_element());
  BOOST_TEST(ref == global, boost::test_tools::per_element());

  // α = 0.3 in the documented order: α·local + (1 − α)·global, f32.
  std::vector<float> l2{0.1f, 7.0f};
  const std::vector<float> g2{0.7f, -1.0f};
  ps::streaming_merge(l2, g2, {}, 0.3);
  const float a = 0.3f, b = static_cast<float>(1.0 - 0.3);
  BOOST_TEST(l2[0] == a * 0.1f + b * 0.7f);
  BOOST_TEST(l2[1] == a * 7.0f + b * -1.0f);

  // α = 0: the global value exactly; α = 1: the local one kept.
  std::vector<float> l3{1e30f, -2.0f};
  ps::streaming_merge(l3, g2, {}, 0.0);
  BOOST_TEST(l3 == g2, boost::test_tools::per_element());
  std::vector<float> l4{5.0f, 6.0f};
  ps::streaming_merge(l4, g2, {}, 1.0);
  BOOST_TEST(l4 == (std::vector<float>{5.0f, 6.0f}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(schedule_and_merge_allocate_nothing) {
  const ps::streaming_schedule s({.fragments = 4, .interval = 16, .delay = 3, .alpha = 0.5});
  std::vector<float> local(64, 1.0f), global(64, 2.0f), ref(64, 0.0f);
  std::uint64_t seen = 0;
  const auto before = counting_new::count();
  for (std::uint64_t t = 1; t <= 1000; ++t) {
    if (auto q = s.merge_after(t)) {
      const auto r = ps::fragment_range(local.size(), s.fragments(), *q);
      ps::streaming_merge(std::span(local).subspan(r.begin, r.size()), std::span(global).subspan(r.begin, r.size()),
                          std::span(ref).subspan(r.begin, r.size()), s.params().alpha);
      ++seen;
    }
    if (s.sync_after(t)) ++seen;
    seen += s.in_flight(t);
  }
  BOOST_TEST(counting_new::count() == before);
  BOOST_TEST(seen > 0u);
}
