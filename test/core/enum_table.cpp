#include <ashl/core/enum_table.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/core/dtype.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/profile/replan.hpp>
#include <ashl/rules/server_core.hpp>
#include <ashl/wire/ids.hpp>
#include <ashl/wire/message.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>

namespace {

enum class colour : std::uint8_t { red = 0, green = 1, blue = 2 };
inline constexpr auto colour_table = ashl::make_enum_table<colour>("red", "green", "blue");
static_assert(colour_table.size() == 3 && colour_table.name(colour::blue) == "blue");

enum class level : std::int16_t { low = 5, high = 6 };
inline constexpr auto level_table = ashl::make_enum_table_from<level>(5, "other", "low", "high");

// Every value the table names: its name parses back to it, by name and by
// value, names are distinct, and the value after the last is unnamed.
template <class Table>
void check_round_trip(const Table& t) {
  std::set<std::string_view> seen;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const auto v = static_cast<long long>(t.first) + static_cast<long long>(i);
    const auto e = t.from_value(v);
    BOOST_TEST_REQUIRE(e.has_value(), "value " << v);
    const std::string_view n = t.name(*e);
    BOOST_TEST(!n.empty());
    BOOST_TEST(n != t.unnamed);
    BOOST_TEST(seen.insert(n).second, "name " << n << " twice");
    BOOST_TEST((t.parse(n) == e));
  }
  const auto past = static_cast<long long>(t.first) + static_cast<long long>(t.size());
  BOOST_TEST(!t.from_value(past).has_value());
  BOOST_TEST(!t.parse("no such name").has_value());
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_table_names_parses_and_bounds_its_enum) {
  BOOST_TEST(colour_table.name(colour::green) == "green");
  BOOST_TEST(colour_table.name(static_cast<colour>(3)) == "?");
  BOOST_TEST((colour_table.parse("blue") == colour::blue));
  BOOST_TEST(!colour_table.from_value(-1).has_value());
  BOOST_TEST(!colour_table.from_value(3u).has_value());
  BOOST_TEST((colour_table.from_value(std::uint8_t{1}) == colour::green));
  BOOST_TEST(colour_table.contains(colour::red));
  BOOST_TEST(!colour_table.contains(static_cast<colour>(200)));
  // From a first value above 0: below and above are unnamed.
  BOOST_TEST(level_table.name(level::high) == "high");
  BOOST_TEST(level_table.name(static_cast<level>(4)) == "other");
  BOOST_TEST(level_table.name(static_cast<level>(7)) == "other");
  BOOST_TEST(!level_table.from_value(4).has_value());
  BOOST_TEST((level_table.from_value(5) == level::low));
  check_round_trip(colour_table);
  check_round_trip(level_table);
}

// The library's enums: each table round-trips, and the names that telemetry,
// error texts and files carry are the ones the hand-written switches gave.
BOOST_AUTO_TEST_CASE(the_librarys_enum_tables_keep_their_names) {
  check_round_trip(ashl::dtype_table);
  check_round_trip(ashl::wire::message_kind_table);
  check_round_trip(ashl::codec_id_table);
  check_round_trip(ashl::stage_id_table);
  check_round_trip(ashl::measurement_kind_table);
  check_round_trip(ashl::metric_id_table);
  check_round_trip(ashl::profile::replan_reason_table);
  check_round_trip(ashl::ps::refusal_table);

  BOOST_TEST(ashl::dtype_count == 6);
  BOOST_TEST(ashl::to_string(ashl::dtype::bf16) == "bf16");
  BOOST_TEST((ashl::dtype_from_string("i8") == ashl::dtype::i8));
  BOOST_TEST(!ashl::dtype_from_byte(6).has_value());
  BOOST_TEST(ashl::codec_id_count == 12);
  BOOST_TEST(ashl::to_string(ashl::codec_id::topk_sampled) == "topk_sampled");
  BOOST_TEST(ashl::stage_id_count == 12u);
  BOOST_TEST(ashl::to_string(ashl::stage_id::semi_async) == "semi_async");
  BOOST_TEST((ashl::stage_id_from_string("shl") == ashl::stage_id::shl));
  BOOST_TEST(ashl::measurement_kind_count == 6u);
  BOOST_TEST(ashl::to_string(ashl::measurement_kind::compress) == "compress");
  BOOST_TEST(ashl::metric_id_count == 4u);
  BOOST_TEST(ashl::to_string(ashl::metric_id::samples_per_second) == "samples_per_second");
  BOOST_TEST(ashl::to_string(static_cast<ashl::metric_id>(ashl::metric_id_application)) == "application");
  BOOST_TEST(ashl::profile::to_string(ashl::profile::replan_reason::drift) == "drift");
  BOOST_TEST(ashl::ps::refusal_count == 14u);
  BOOST_TEST(ashl::ps::to_string(ashl::ps::refusal::store_full) == "store_full");
  BOOST_TEST(ashl::ps::to_string(ashl::ps::refusal::samples) == "samples");
  BOOST_TEST(ashl::ps::to_string(ashl::ps::refusal::max_workers) == "max_workers");
  BOOST_TEST(ashl::wire::message_kind_first == 1u);
  BOOST_TEST(ashl::wire::message_kind_last == 14u);  // wire version 6 added lease (10) .. shard_state (14)
  BOOST_TEST(ashl::wire::to_string(ashl::wire::message_kind::plan_update) == "plan_update");
  BOOST_TEST(ashl::wire::to_string(static_cast<ashl::wire::message_kind>(10)) == "lease");
  BOOST_TEST(ashl::wire::to_string(static_cast<ashl::wire::message_kind>(14)) == "shard_state");
  BOOST_TEST(ashl::wire::to_string(static_cast<ashl::wire::message_kind>(0)) == "?");
  BOOST_TEST(ashl::wire::to_string(static_cast<ashl::wire::message_kind>(15)) == "?");
}
