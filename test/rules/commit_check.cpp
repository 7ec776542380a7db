#include <ashl/rules/commit_check.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/core/dtype.hpp>
#include <ashl/wire/crc32c.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

// rules/commit_check.hpp: the worker's value check of every shard's part,
// and the CRC-32C a part asks for (commit_part_view::crc), computed in the
// same pass (wire::crc32c_chunked): the CRC is the payload's whatever the
// codec, the values check, or allow_non_finite, and a non-finite value is
// refused with the same text as without the CRC, wherever it lies in
// the chunks (the first, across a chunk's end, the last element).

namespace ps = ashl::ps;
namespace w = ashl::wire;

namespace {

constexpr std::size_t chunk_floats = w::crc32c_chunk_bytes / sizeof(float);

std::vector<float> values(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 0.5f + static_cast<float>(i % 977) * 1e-3f;
  return v;
}

// The check's status for one part, with and without a CRC asked for; the
// CRC it wrote (check_commit_parts never reads it first: start it wrong).
struct checked {
  ashl::status plain, with_crc;
  std::uint32_t crc = 0;
};
checked check(ps::commit_part_view part, bool allow_non_finite = false) {
  checked c;
  c.plain = ps::check_commit_parts({&part, 1}, {.allow_non_finite = allow_non_finite});
  c.crc = ~w::crc32c(part.payload);
  part.crc = &c.crc;
  c.with_crc = ps::check_commit_parts({&part, 1}, {.allow_non_finite = allow_non_finite});
  return c;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_dense_parts_crc_is_its_payloads_at_every_size_around_the_chunk) {
  for (std::size_t n : {std::size_t{1}, chunk_floats - 1, chunk_floats, chunk_floats + 1, 3 * chunk_floats + 7}) {
    const auto v = values(n);
    const auto payload = std::as_bytes(std::span<const float>(v));
    const checked c = check({.payload = payload, .element_count = n});
    BOOST_TEST(c.plain.ok(), c.plain.message());
    BOOST_TEST(c.with_crc.ok(), c.with_crc.message());
    BOOST_TEST(c.crc == w::crc32c(payload), "n " << n);
  }
}

BOOST_AUTO_TEST_CASE(a_non_finite_value_in_any_chunk_is_refused_with_the_same_text) {
  constexpr std::size_t n = 3 * chunk_floats + 7;  // four chunks, the last one short
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct poison {
    std::size_t at;
    float value;
    const char* text;
  };
  for (const poison p : {poison{0, nan, "nan"}, poison{chunk_floats - 1, inf, "inf"}, poison{chunk_floats, -inf, "-inf"},
                         poison{2 * chunk_floats + 5, nan, "nan"}, poison{n - 1, nan, "nan"}, poison{n - 1, -inf, "-inf"}}) {
    auto v = values(n);
    v[p.at] = p.value;
    if (p.at + 1 < n) v[n - 1] = inf;  // a later one too: the first is named
    const checked c = check({.payload = std::as_bytes(std::span<const float>(v)), .element_count = n,
                             .model_begin = 1000});
    const std::string want = "commit.payload[" + std::to_string(p.at) + "] = " + p.text;
    BOOST_TEST(!c.with_crc.ok(), "at " << p.at);
    BOOST_TEST((c.with_crc.code() == ashl::errc::invalid_argument));
    BOOST_TEST(c.with_crc.message().find(want) != std::string::npos, c.with_crc.message());
    BOOST_TEST(c.with_crc.message().find("(element " + std::to_string(1000 + p.at) + " of the model)") !=
                   std::string::npos,
               c.with_crc.message());
    BOOST_TEST(c.with_crc.message() == c.plain.message());
  }
}

BOOST_AUTO_TEST_CASE(an_fp16_cast_parts_values_and_crc) {
  constexpr std::size_t n = chunk_floats + 3;  // 2-byte values: one chunk and part of another
  std::vector<std::uint16_t> h(n, ashl::detail::f32_to_f16_bits(0.25f));
  const auto payload = std::as_bytes(std::span<const std::uint16_t>(h));
  const checked ok = check({.codec = ashl::codec_id::fp16, .payload = payload, .element_count = n});
  BOOST_TEST(ok.with_crc.ok(), ok.with_crc.message());
  BOOST_TEST(ok.crc == w::crc32c(payload));
  h[n - 1] = 0x7c00u;  // +inf in f16
  const checked bad = check({.codec = ashl::codec_id::fp16, .payload = payload, .element_count = n});
  BOOST_TEST(bad.with_crc.message().find("commit.payload[" + std::to_string(n - 1) + "] = inf") != std::string::npos,
             bad.with_crc.message());
  BOOST_TEST(bad.with_crc.message() == bad.plain.message());
}

BOOST_AUTO_TEST_CASE(sparse_pairs_other_codecs_and_allowed_non_finite_values_get_the_payloads_crc) {
  // top-k pairs: u64 n, u32 count, u32 index[count], f32 value[count].
  constexpr std::uint64_t n = 1000;
  const std::uint32_t idx[3] = {4, 500, 999};
  float val[3] = {1.0f, 2.0f, std::numeric_limits<float>::quiet_NaN()};
  std::vector<std::byte> pairs(12 + sizeof idx + sizeof val);
  const std::uint32_t count = 3;
  std::memcpy(pairs.data(), &n, 8);
  std::memcpy(pairs.data() + 8, &count, 4);
  std::memcpy(pairs.data() + 12, idx, sizeof idx);
  std::memcpy(pairs.data() + 12 + sizeof idx, val, sizeof val);
  const checked sparse = check({.codec = ashl::codec_id::topk, .payload = pairs, .element_count = n});
  BOOST_TEST(sparse.with_crc.message().find("commit.payload[999] = nan") != std::string::npos,
             sparse.with_crc.message());
  BOOST_TEST(sparse.with_crc.message() == sparse.plain.message());
  BOOST_TEST(sparse.crc == w::crc32c(pairs));
  // Values known only once decoded (its server checks them): the CRC still.
  const checked qsgd = check({.codec = ashl::codec_id::qsgd, .payload = pairs, .element_count = n});
  BOOST_TEST(qsgd.with_crc.ok());
  BOOST_TEST(qsgd.crc == w::crc32c(pairs));
  // allow_non_finite: nothing refused, the CRC still.
  auto v = values(2 * chunk_floats);
  v.back() = std::numeric_limits<float>::quiet_NaN();
  const auto payload = std::as_bytes(std::span<const float>(v));
  const checked allowed = check({.payload = payload, .element_count = v.size()}, true);
  BOOST_TEST(allowed.with_crc.ok());
  BOOST_TEST(allowed.crc == w::crc32c(payload));
}

BOOST_AUTO_TEST_CASE(every_part_gets_its_own_crc_and_the_bad_one_is_named_by_server) {
  constexpr std::size_t n = 2 * chunk_floats + 11;
  auto v = values(n);
  const std::size_t half = n / 2;
  const std::span<const float> all(v);
  std::uint32_t crc[2] = {0, 0};
  const ps::commit_part_view parts[2] = {
      {.payload = std::as_bytes(all.first(half)), .element_count = half, .crc = &crc[0]},
      {.payload = std::as_bytes(all.subspan(half)), .element_count = n - half, .model_begin = half, .crc = &crc[1]}};
  BOOST_TEST(ps::check_commit_parts(parts, {}).ok());
  BOOST_TEST(crc[0] == w::crc32c(parts[0].payload));
  BOOST_TEST(crc[1] == w::crc32c(parts[1].payload));
  v[n - 1] = std::numeric_limits<float>::infinity();
  const ashl::status st = ps::check_commit_parts(parts, {});
  BOOST_TEST(st.message().find("commit.payload[" + std::to_string(n - 1 - half) + "] = inf") != std::string::npos,
             st.message());
  BOOST_TEST(st.message().find("server 1's part (element " + std::to_string(n - 1) + " of the model)") !=
                 std::string::npos,
             st.message());
}
