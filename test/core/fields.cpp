#include <ashl/core/fields.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/core/bytes.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/ps/worker.hpp>
#include <ashl/transport/inproc.hpp>

#include <array>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

// core/fields.hpp: one table per struct drives text parsing (flags), the
// wire and checkpoints (worker_plan), and the Python binding's dicts; the
// tables cover their structs.

namespace {

struct knobs {
  std::int64_t h = 2;
  std::uint32_t k = 7;
  double lr = 0.1;
  bool on = false;
  std::string name = "a";
  ashl::stage_id stage = ashl::stage_id::none;
  static constexpr auto fields() {
    return std::tuple{ashl::field{"h", &knobs::h, "local steps"}, ashl::field{"k", &knobs::k},
                      ashl::field{"lr", &knobs::lr}, ashl::field{"on", &knobs::on}, ashl::field{"name", &knobs::name},
                      ashl::field{"stage", &knobs::stage}};
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(fields_are_set_from_text_and_bad_text_is_named) {
  knobs k;
  BOOST_TEST(ashl::set_field(k, "h", "-4", "knobs").ok());
  BOOST_TEST(k.h == -4);
  BOOST_TEST(ashl::set_field(k, "lr", "0.025", "knobs").ok());
  BOOST_TEST(k.lr == 0.025);
  BOOST_TEST(ashl::set_field(k, "on", "true", "knobs").ok());
  BOOST_TEST(k.on);
  BOOST_TEST(ashl::set_field(k, "name", "profile", "knobs").ok());
  BOOST_TEST(k.name == "profile");
  BOOST_TEST(ashl::set_field(k, "stage", "7", "knobs").ok());
  BOOST_TEST((k.stage == ashl::stage_id::adsp));
  BOOST_TEST(ashl::set_field(k, "h", "4x", "knobs").message() == "knobs.h = \"4x\": must be an integer");
  BOOST_TEST(ashl::set_field(k, "k", "-1", "knobs").message() == "knobs.k = \"-1\": must be an integer");
  BOOST_TEST(ashl::set_field(k, "k", "4294967296", "knobs").message() ==
             "knobs.k = \"4294967296\": is out of range (0 .. 4294967295)");
  BOOST_TEST(ashl::set_field(k, "lr", "nan", "knobs").message() == "knobs.lr = \"nan\": must be finite");
  BOOST_TEST(ashl::set_field(k, "lr", "", "knobs").message() == "knobs.lr = \"\": must be a number");
  BOOST_TEST(ashl::set_field(k, "on", "yes", "knobs").message() ==
             "knobs.on = \"yes\": must be true, false, 1 or 0");
  BOOST_TEST(ashl::set_field(k, "eta", "1", "knobs").message() ==
             "knobs.eta = \"1\": unknown field (known: h k lr on name stage)");
  BOOST_TEST(k.h == -4);  // a refused value changed nothing
  BOOST_TEST(ashl::field_names<knobs>(',') == "h,k,lr,on,name,stage");
  BOOST_TEST(ashl::has_field<knobs>("lr"));
  BOOST_TEST(!ashl::has_field<knobs>("l"));
}

BOOST_AUTO_TEST_CASE(the_plan_table_is_the_wire_order) {
  const ashl::worker_plan p{.local_iterations = 3,
                            .commit_interval_us = 250'000,
                            .batch_size = 64,
                            .stage = ashl::stage_id::shl,
                            .data_share = 0.25f,
                            .compression_ratio = 0.125f};
  // Without codec options the body is the table's first six fields, 24
  // bytes (the body of every plan before the options existed).
  std::array<std::byte, 24> buf{};
  ashl::byte_writer w(buf);
  ashl::put_fields(w, p, ashl::worker_plan::fields_before_codec());
  BOOST_TEST(w.ok());
  BOOST_TEST(w.position() == 24u);
  // Field by field, little-endian, as docs/wire-format.md lays plan_update out.
  std::array<std::byte, 24> want{};
  ashl::byte_writer v(want);
  v.put(std::uint32_t{3});
  v.put(std::uint32_t{250'000});
  v.put(std::uint32_t{64});
  v.put(static_cast<std::uint32_t>(ashl::stage_id::shl));
  v.put(0.25f);
  v.put(0.125f);
  BOOST_TEST(buf == want);
  ashl::worker_plan q;
  ashl::byte_reader r(buf);
  BOOST_TEST(ashl::get_fields(r, q, "plan_update", ashl::worker_plan::fields_before_codec()).ok());
  BOOST_TEST((q == p));
  // With them, the whole table: the two options follow, 32 bytes.
  ashl::worker_plan o = p;
  o.codec_bits = 4;
  o.codec_block = 128;
  std::array<std::byte, 32> full{};
  ashl::byte_writer wf(full);
  ashl::put_fields(wf, o);
  BOOST_TEST((wf.ok() && wf.position() == 32u));
  BOOST_TEST(std::memcmp(full.data(), want.data(), want.size()) == 0);
  ashl::worker_plan qf;
  ashl::byte_reader rf(full);
  BOOST_TEST(ashl::get_fields(rf, qf, "plan_update").ok());
  BOOST_TEST((qf == o));
  // A short body names the field it ran out at.
  ashl::byte_reader shortr(std::span<const std::byte>(buf.data(), 10));
  const auto s = ashl::get_fields(shortr, q, "plan_update");
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("plan_update.batch_size") != std::string::npos, s.message());
}

BOOST_AUTO_TEST_CASE(every_policy_parameter_is_in_the_table_and_settable_by_name) {
  // The static_assert in rules/policies.hpp checks that each policy's field list
  // is in the table; here every table entry is settable from text.
  ashl::ps::policy_params p;
  std::size_t n = 0;
  ashl::for_each_field_of<ashl::ps::policy_params>([&](const auto& fd) {
    ++n;
    BOOST_TEST(!fd.help.empty(), fd.name);
    using T = typename std::decay_t<decltype(fd)>::type;
    const char* text = std::is_same_v<T, bool> ? "true" : std::is_same_v<T, std::string> ? "power" : "3";
    BOOST_TEST(ashl::set_field(p, fd.name, text, "policy").ok(), fd.name);
  });
  BOOST_TEST(n == ashl::field_count<ashl::ps::policy_params>);
  BOOST_TEST(n == 52u);  // 45 + the DiLoCo family's six outer_* fields + min_workers (docs/elastic.md E3)
  BOOST_TEST(p.stragglers == 3);  // the one the Python binding's hand list had missed
  BOOST_TEST(p.staleness_weight == "power");
  BOOST_TEST(p.straggler_replan);
}

BOOST_AUTO_TEST_CASE(telemetry_tables_cover_their_structs) {
  static_assert(ashl::fields_cover<ashl::worker_plan>());
  static_assert(ashl::fields_cover<ashl::transport::transport_counters>());
  static_assert(ashl::fields_cover<ashl::ps::worker_telemetry>());
  static_assert(ashl::fields_cover<ashl::ps::counters>());
  static_assert(ashl::fields_cover<ashl::ps::server_telemetry>());
  // Values are read through the table (what the Python dicts are made of).
  ashl::ps::worker_telemetry t;
  t.plan_changes = 5;
  t.transport.auth_refused = 2;
  std::uint64_t seen = 0;
  ashl::for_each_field(t, [&](std::string_view name, const auto& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::uint64_t>)
      if (name == "plan_changes") seen = v;
    if constexpr (ashl::described<std::decay_t<decltype(v)>>)
      ashl::for_each_field(v, [&](std::string_view inner, const auto& w) {
        if constexpr (std::is_same_v<std::decay_t<decltype(w)>, std::uint64_t>)
          if (inner == "auth_refused") seen += 10 * w;
      });
  });
  BOOST_TEST(seen == 25u);
}
