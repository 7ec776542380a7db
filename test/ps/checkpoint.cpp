#include <ashl/ps/checkpoint.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/core/bytes.hpp>
#include <ashl/wire/crc32c.hpp>

#include <algorithm>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

namespace ps = ashl::ps;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test, removed with everything in it.
struct temp_dir {
  std::string path;
  temp_dir() {
    std::string t = (fs::temp_directory_path() / "ashl-checkpoint-XXXXXX").string();
    BOOST_REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  [[nodiscard]] std::set<std::string> entries() const {
    std::set<std::string> s;
    for (const auto& e : fs::directory_iterator(path)) s.insert(e.path().filename().string());
    return s;
  }
};

std::vector<std::byte> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::byte> v(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = std::byte(x & 0xffu);
  }
  return v;
}

std::vector<std::byte> slurp(const std::string& f) {
  std::ifstream in(f, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::transform(c.begin(), c.end(), b.begin(), [](char x) { return std::byte(static_cast<unsigned char>(x)); });
  return b;
}

void spill(const std::string& f, std::span<const std::byte> b) {
  std::ofstream out(f, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  BOOST_REQUIRE(out.good());
}

const ps::checkpoint_meta meta_a{.shard = 2, .servers = 4, .version = 123456789012ull, .commits_applied = 42,
                                 .unix_seconds = 1764720000.25};
const ps::checkpoint_meta meta_b{.shard = 2, .servers = 4, .version = 123456789013ull, .commits_applied = 43,
                                 .unix_seconds = 1764720060.5};

bool same_meta(const ps::checkpoint_meta& a, const ps::checkpoint_meta& b) {
  return a.shard == b.shard && a.servers == b.servers && a.version == b.version &&
         a.commits_applied == b.commits_applied && a.unix_seconds == b.unix_seconds;
}

bool holds(const std::string& f, const ps::checkpoint_meta& m, const std::vector<std::byte>& state) {
  auto c = ps::read_checkpoint(f);
  if (!c) {
    BOOST_TEST_MESSAGE(c.error().to_string());
    return false;
  }
  return same_meta(c->meta, m) && c->state == state;
}

// Changes header bytes and recomputes the header CRC (bytes 60..63 over
// 0..59), so only the field's own check can refuse the file.
template <class Patch>
void rewrite_header(std::vector<std::byte>& file, Patch patch) {
  patch(file);
  ashl::byte_writer w(std::span<std::byte>(file.data() + 60, 4));
  w.put(ashl::wire::crc32c(std::span<const std::byte>(file.data(), 60)));
}

template <class T>
void put_at(std::vector<std::byte>& file, std::size_t at, T v) {
  ashl::byte_writer w(std::span<std::byte>(file.data() + at, sizeof(T)));
  w.put(v);
}

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_CASE(file_names) {
  BOOST_TEST(ps::checkpoint_file("/ckpt", 3) == "/ckpt/server-3.ashlckpt");
  BOOST_TEST(ps::checkpoint_file("/ckpt/", 0) == "/ckpt/server-0.ashlckpt");
  BOOST_TEST(ps::checkpoint_file("", 12) == "server-12.ashlckpt");
}

BOOST_AUTO_TEST_CASE(round_trip) {
  temp_dir d;
  const auto f = ps::checkpoint_file(d.path, 2);
  const auto state = pattern(1000, 1);
  BOOST_REQUIRE(ps::write_checkpoint(f, meta_a, state).ok());
  BOOST_TEST(fs::file_size(f) == 64u + 1000u);
  BOOST_TEST(holds(f, meta_a, state));
  // No temporary file is left behind.
  BOOST_TEST((d.entries() == std::set<std::string>{"server-2.ashlckpt"}));
}

BOOST_AUTO_TEST_CASE(round_trip_empty_and_large_states) {
  temp_dir d;
  const auto f = ps::checkpoint_file(d.path, 0);
  const ps::checkpoint_meta m{};
  BOOST_REQUIRE(ps::write_checkpoint(f, m, {}).ok());
  BOOST_TEST(fs::file_size(f) == 64u);
  BOOST_TEST(holds(f, m, {}));

  const auto big = pattern((std::size_t{5} << 20) + 3, 2);  // 5 MiB and an odd tail
  BOOST_REQUIRE(ps::write_checkpoint(f, meta_b, big).ok());
  BOOST_TEST(holds(f, meta_b, big));
}

// The table in docs/checkpoints.md, byte for byte.
BOOST_AUTO_TEST_CASE(header_layout) {
  temp_dir d;
  const auto f = ps::checkpoint_file(d.path, 2);
  const auto state = pattern(10, 3);
  BOOST_REQUIRE(ps::write_checkpoint(f, meta_a, state).ok());
  const auto b = slurp(f);
  BOOST_REQUIRE(b.size() == 74u);
  BOOST_TEST(std::string(reinterpret_cast<const char*>(b.data()), 8) == "ASHLCKPT");
  ashl::byte_reader r(std::span<const std::byte>(b).subspan(8));
  std::uint32_t format = 0, header = 0, shard = 0, servers = 0, state_crc = 0, header_crc = 0;
  std::uint64_t version = 0, commits = 0, state_bytes = 0;
  double seconds = 0;
  BOOST_REQUIRE(r.get(format, "f").ok());
  BOOST_REQUIRE(r.get(header, "h").ok());
  BOOST_REQUIRE(r.get(shard, "s").ok());
  BOOST_REQUIRE(r.get(servers, "n").ok());
  BOOST_REQUIRE(r.get(version, "v").ok());
  BOOST_REQUIRE(r.get(commits, "c").ok());
  BOOST_REQUIRE(r.get(seconds, "t").ok());
  BOOST_REQUIRE(r.get(state_bytes, "b").ok());
  BOOST_REQUIRE(r.get(state_crc, "sc").ok());
  BOOST_REQUIRE(r.get(header_crc, "hc").ok());
  BOOST_TEST(r.position() == 56u);  // 8 + 56 = 64
  BOOST_TEST(format == ps::checkpoint_format);
  BOOST_TEST(header == 64u);
  BOOST_TEST(shard == 2u);
  BOOST_TEST(servers == 4u);
  BOOST_TEST(version == meta_a.version);
  BOOST_TEST(commits == meta_a.commits_applied);
  BOOST_TEST(seconds == meta_a.unix_seconds);
  BOOST_TEST(state_bytes == 10u);
  BOOST_TEST(state_crc == ashl::wire::crc32c(state));
  BOOST_TEST(header_crc == ashl::wire::crc32c(std::span<const std::byte>(b.data(), 60)));
  BOOST_TEST((std::vector<std::byte>(b.begin() + 64, b.end()) == state));
}

BOOST_AUTO_TEST_CASE(every_single_byte_change_is_refused) {
  temp_dir d;
  const auto f = ps::checkpoint_file(d.path, 2);
  BOOST_REQUIRE(ps::write_checkpoint(f, meta_a, pattern(16, 4)).ok());
  const auto good = slurp(f);
  BOOST_REQUIRE(good.size() == 80u);
  const auto bad = d.path + "/bad.ashlckpt";
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (unsigned mask : {0x01u, 0x80u, 0xffu}) {
      auto b = good;
      b[i] ^= std::byte(mask);
      spill(bad, b);
      auto c = ps::read_checkpoint(bad);
      BOOST_TEST_CONTEXT("byte " << i << " ^ " << mask) {
        BOOST_TEST(!c.has_value());
        if (c.has_value()) continue;
        const auto& e = c.error();
        BOOST_TEST(contains(e.message(), "checkpoint \"" + bad + "\": "), e.message());
        // Which check refuses it follows from where the byte is.
        ashl::errc want = ashl::errc::checksum_mismatch;          // meta, lengths, CRCs, state
        if (i < 8) want = ashl::errc::malformed;                   // magic
        else if (i < 12) want = ashl::errc::unsupported;           // format
        else if (i < 16) want = ashl::errc::malformed;             // header_bytes
        BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(want), e.to_string());
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(every_truncation_is_refused) {
  temp_dir d;
  const auto f = ps::checkpoint_file(d.path, 2);
  BOOST_REQUIRE(ps::write_checkpoint(f, meta_a, pattern(16, 5)).ok());
  const auto good = slurp(f);
  const auto bad = d.path + "/short.ashlckpt";
  for (std::size_t n = 0; n < good.size(); ++n) {
    spill(bad, std::span<const std::byte>(good.data(), n));
    auto c = ps::read_checkpoint(bad);
    BOOST_TEST_CONTEXT("length " << n) {
      BOOST_TEST(!c.has_value());
      if (c.has_value()) continue;
      BOOST_TEST((c.error().code() == ashl::errc::malformed));
      BOOST_TEST(contains(c.error().message(), "truncated"), c.error().message());
      BOOST_TEST(contains(c.error().message(), "checkpoint.size = " + std::to_string(n)), c.error().message());
    }
  }
}

BOOST_AUTO_TEST_CASE(wrong_magic) {
  temp_dir d;
  const auto f = ps::checkpoint_file(d.path, 2);
  BOOST_REQUIRE(ps::write_checkpoint(f, meta_a, pattern(16, 6)).ok());
  auto b = slurp(f);
  const std::string other = "NOTCKPT!";
  for (std::size_t i = 0; i < 8; ++i) b[i] = std::byte(static_cast<unsigned char>(other[i]));
  spill(f, b);
  auto c = ps::read_checkpoint(f);
  BOOST_REQUIRE(!c.has_value());
  BOOST_TEST((c.error().code() == ashl::errc::malformed));
  BOOST_TEST(c.error().message() == "checkpoint \"" + f +
                                        "\": checkpoint.magic = \"NOTCKPT!\": not an ashl checkpoint "
                                        "(expected \"ASHLCKPT\")");

  // A short text file is not a checkpoint either (not "truncated").
  const std::string text = "hello";
  spill(f, std::as_bytes(std::span<const char>(text.data(), text.size())));
  c = ps::read_checkpoint(f);
  BOOST_REQUIRE(!c.has_value());
  BOOST_TEST(contains(c.error().message(), "not an ashl checkpoint"), c.error().message());
}

BOOST_AUTO_TEST_CASE(wrong_format) {
  temp_dir d;
  const auto f = ps::checkpoint_file(d.path, 0);
  BOOST_REQUIRE(ps::write_checkpoint(f, {}, pattern(16, 7)).ok());
  auto b = slurp(f);
  rewrite_header(b, [](auto& h) { put_at<std::uint32_t>(h, 8, 7); });
  spill(f, b);
  auto c = ps::read_checkpoint(f);
  BOOST_REQUIRE(!c.has_value());
  BOOST_TEST((c.error().code() == ashl::errc::unsupported));
  BOOST_TEST(c.error().message() == "checkpoint \"" + f + "\": checkpoint.format = 7: this build reads format 1");

  // A later format may have a shorter header: still "unsupported", not "truncated".
  b.resize(20);
  spill(f, b);
  c = ps::read_checkpoint(f);
  BOOST_REQUIRE(!c.has_value());
  BOOST_TEST((c.error().code() == ashl::errc::unsupported));
}

BOOST_AUTO_TEST_CASE(header_checked_beyond_its_crc) {
  temp_dir d;
  const auto f = ps::checkpoint_file(d.path, 0);
  BOOST_REQUIRE(ps::write_checkpoint(f, {}, pattern(16, 8)).ok());
  const auto good = slurp(f);

  auto b = good;  // a header length other than format 1's
  rewrite_header(b, [](auto& h) { put_at<std::uint32_t>(h, 12, 72); });
  spill(f, b);
  auto c = ps::read_checkpoint(f);
  BOOST_REQUIRE(!c.has_value());
  BOOST_TEST((c.error().code() == ashl::errc::malformed));
  BOOST_TEST(contains(c.error().message(), "checkpoint.header_bytes = 72"), c.error().message());

  b = good;  // a shard outside its servers, with a valid CRC
  rewrite_header(b, [](auto& h) { put_at<std::uint32_t>(h, 16, 5); });
  spill(f, b);
  c = ps::read_checkpoint(f);
  BOOST_REQUIRE(!c.has_value());
  BOOST_TEST((c.error().code() == ashl::errc::malformed));
  BOOST_TEST(contains(c.error().message(), "checkpoint.shard = 5"), c.error().message());

  b = good;  // a state length that disagrees with the file's, with a valid CRC
  rewrite_header(b, [](auto& h) { put_at<std::uint64_t>(h, 48, std::uint64_t{1} << 40); });
  spill(f, b);
  c = ps::read_checkpoint(f);
  BOOST_REQUIRE(!c.has_value());
  BOOST_TEST((c.error().code() == ashl::errc::malformed));
  BOOST_TEST(contains(c.error().message(), "truncated"), c.error().message());

  b = good;  // the state CRC field itself
  b[56] ^= std::byte{1};
  rewrite_header(b, [](auto&) {});
  spill(f, b);
  c = ps::read_checkpoint(f);
  BOOST_REQUIRE(!c.has_value());
  BOOST_TEST((c.error().code() == ashl::errc::checksum_mismatch));
  BOOST_TEST(contains(c.error().message(), "checkpoint.state_crc32c = 0x"), c.error().message());
}

BOOST_AUTO_TEST_CASE(trailing_bytes) {
  temp_dir d;
  const auto f = ps::checkpoint_file(d.path, 0);
  BOOST_REQUIRE(ps::write_checkpoint(f, {}, pattern(16, 9)).ok());
  auto b = slurp(f);
  b.push_back(std::byte{0});
  b.push_back(std::byte{0x5a});
  spill(f, b);
  auto c = ps::read_checkpoint(f);
  BOOST_REQUIRE(!c.has_value());
  BOOST_TEST((c.error().code() == ashl::errc::malformed));
  BOOST_TEST(c.error().message() == "checkpoint \"" + f +
                                        "\": checkpoint.size = 82: 2 trailing bytes after the 80 the header "
                                        "describes");
}

BOOST_AUTO_TEST_CASE(missing_file_and_not_a_file) {
  temp_dir d;
  const auto f = ps::checkpoint_file(d.path, 0);
  auto c = ps::read_checkpoint(f);
  BOOST_REQUIRE(!c.has_value());
  BOOST_TEST((c.error().code() == ashl::errc::not_found));
  BOOST_TEST(contains(c.error().message(), f), c.error().message());

  fs::create_directory(f);
  c = ps::read_checkpoint(f);
  BOOST_REQUIRE(!c.has_value());
  BOOST_TEST((c.error().code() == ashl::errc::io_error));
  BOOST_TEST(contains(c.error().message(), "not a regular file"), c.error().message());
}

BOOST_AUTO_TEST_CASE(write_into_a_missing_directory) {
  temp_dir d;
  const auto f = ps::checkpoint_file(d.path + "/absent", 0);
  const auto s = ps::write_checkpoint(f, {}, pattern(16, 10));
  BOOST_REQUIRE(!s.ok());
  BOOST_TEST((s.code() == ashl::errc::io_error));
  BOOST_TEST(contains(s.message(), "checkpoint \"" + f + "\""), s.message());
  BOOST_TEST(contains(s.message(), "No such file or directory"), s.message());
  BOOST_TEST(d.entries().empty());
}

BOOST_AUTO_TEST_CASE(meta_a_reader_would_refuse_is_not_written) {
  temp_dir d;
  const auto f = ps::checkpoint_file(d.path, 0);
  auto s = ps::write_checkpoint(f, {.shard = 3, .servers = 3}, {});
  BOOST_TEST((s.code() == ashl::errc::invalid_argument));
  BOOST_TEST(contains(s.message(), "checkpoint.shard = 3"), s.message());
  s = ps::write_checkpoint(f, {.shard = 0, .servers = 0}, {});
  BOOST_TEST((s.code() == ashl::errc::invalid_argument));
  BOOST_TEST(contains(s.message(), "checkpoint.servers = 0"), s.message());
  BOOST_TEST(d.entries().empty());
}

BOOST_AUTO_TEST_CASE(overwrite_replaces) {
  temp_dir d;
  const auto f = ps::checkpoint_file(d.path, 2);
  const auto a = pattern(300, 11), b = pattern(70, 12);
  BOOST_REQUIRE(ps::write_checkpoint(f, meta_a, a).ok());
  BOOST_REQUIRE(ps::write_checkpoint(f, meta_b, b).ok());
  BOOST_TEST(holds(f, meta_b, b));
  BOOST_TEST(fs::file_size(f) == 64u + 70u);  // replaced, not written over in place
  BOOST_REQUIRE(ps::write_checkpoint(f, meta_a, {}).ok());
  BOOST_TEST(holds(f, meta_a, {}));
  BOOST_TEST((d.entries() == std::set<std::string>{"server-2.ashlckpt"}));
}

// A writer that died between creating its temporary file and the rename
// leaves FILE.tmp.<pid>.<n>: never read as the checkpoint, never in the way.
BOOST_AUTO_TEST_CASE(stale_temporary_of_a_crashed_writer) {
  temp_dir d;
  const auto f = ps::checkpoint_file(d.path, 2);
  const auto a = pattern(100, 13), b = pattern(120, 14);

  // Before any checkpoint exists, only a stale temporary: nothing to restore.
  BOOST_REQUIRE(ps::write_checkpoint(f, meta_b, b).ok());
  const auto b_file = slurp(f);
  fs::remove(f);
  const auto stale_other = f + ".tmp.999999.0";                                     // another process
  const auto stale_mine = f + ".tmp." + std::to_string(::getpid()) + ".999999";     // this pid, reused
  spill(stale_other, std::span<const std::byte>(b_file.data(), 70));              // cut mid-write
  spill(stale_mine, b_file);                                                      // written, not renamed
  auto c = ps::read_checkpoint(f);
  BOOST_REQUIRE(!c.has_value());
  BOOST_TEST((c.error().code() == ashl::errc::not_found));

  BOOST_REQUIRE(ps::write_checkpoint(f, meta_a, a).ok());
  BOOST_TEST(holds(f, meta_a, a));
  BOOST_REQUIRE(ps::write_checkpoint(f, meta_b, b).ok());
  BOOST_TEST(holds(f, meta_b, b));
  // The stale files are as they were: a writer only touches its own temporary.
  BOOST_TEST((slurp(stale_other) == std::vector<std::byte>(b_file.begin(), b_file.begin() + 70)));
  BOOST_TEST((slurp(stale_mine) == b_file));
  BOOST_TEST((d.entries() == std::set<std::string>{"server-2.ashlckpt", fs::path(stale_other).filename().string(),
                                                   fs::path(stale_mine).filename().string()}));
}

// A write that fails midway (the file size limit, which binds root too)
// reports the error, removes its temporary file and leaves the old
// checkpoint intact.
BOOST_AUTO_TEST_CASE(failed_write_keeps_the_old_checkpoint) {
  temp_dir d;
  const auto f = ps::checkpoint_file(d.path, 2);
  const auto a = pattern(500, 15);
  BOOST_REQUIRE(ps::write_checkpoint(f, meta_a, a).ok());

  rlimit old{};
  BOOST_REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  rlimit small = old;
  small.rlim_cur = old.rlim_max == RLIM_INFINITY || old.rlim_max > 4096 ? 4096 : old.rlim_max;
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // write returns EFBIG instead of killing us
  BOOST_REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  const auto s = ps::write_checkpoint(f, meta_b, pattern(64 << 10, 16));
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);

  BOOST_REQUIRE(!s.ok());
  BOOST_TEST((s.code() == ashl::errc::io_error));
  BOOST_TEST(contains(s.message(), "write failed"), s.message());
  BOOST_TEST(contains(s.message(), "checkpoint \"" + f + "\""), s.message());
  BOOST_TEST(holds(f, meta_a, a));
  BOOST_TEST((d.entries() == std::set<std::string>{"server-2.ashlckpt"}));
}

// Checkpoint files are found relative to the working directory when the
// name has no directory part (the directory fsync then opens ".").
BOOST_AUTO_TEST_CASE(bare_file_name) {
  temp_dir d;
  const auto here = fs::current_path();
  fs::current_path(d.path);
  const auto f = ps::checkpoint_file("", 1);
  const auto s = ps::write_checkpoint(f, {.shard = 1, .servers = 2}, pattern(8, 17));
  const bool read_back = holds(f, {.shard = 1, .servers = 2}, pattern(8, 17));
  fs::current_path(here);
  BOOST_TEST(s.ok(), s.to_string());
  BOOST_TEST(read_back);
  BOOST_TEST((d.entries() == std::set<std::string>{"server-1.ashlckpt"}));
}
