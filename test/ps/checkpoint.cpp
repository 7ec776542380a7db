#include <ashl/ps/checkpoint.hpp>

#include <boost/test/unit_test.hpp>

#include <ashl/core/bytes.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/wire/crc32c.hpp>

#include "../support/ps_job.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>
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

// ---------------------------------------------------------------------------
// The checkpoint a ps::server writes (docs/checkpoints.md "The state a server
// writes"; docs/elastic.md §2.2, E2b): its identity section PSID version 2
// holds the job's maximum of workers, version 1 (the worker count) still
// restores, and a checkpoint of a 4-worker job trains with 2 of them.

namespace {

namespace tr = ashl::transport;
using namespace std::chrono_literals;

tr::inproc any_node(const std::shared_ptr<tr::inproc_fabric>& f) {
  auto n = f->node();
  ASHL_REQUIRE(n.has_value());
  return std::move(*n);
}

ashl::sync::any_policy bsp_of(std::uint32_t workers) {
  ps::policy_params pp;
  pp.workers = workers;
  return std::move(*ps::make_policy("bsp", pp));
}

// A BSP job of 4 workers over 64 elements, 3 rounds, identity commits; the
// final checkpoint in `dir`. Job "elastic", so its id is make_job_id("elastic", 64, 4, 1).
void run_a_4_worker_job(const std::string& dir) {
  ps_job::job_spec spec;
  spec.workers = 4;
  spec.elements = 64;
  spec.cycles = 3;
  spec.compression = ashl::codec_id::identity;
  spec.configure_server = [&](ps::server_params& sp) {
    sp.checkpoint_dir = dir;
    sp.job = ps::make_job_id("elastic", 64, 4, 1);
    sp.policy = "bsp";
  };
  spec.configure_worker = [](ps::worker_params& wp) {
    wp.incarnation = 1 + wp.rank;
    wp.job = ps::make_job_id("elastic", 64, 4, 1);
  };
  const auto r = ps_job::run_job(spec);
  for (const auto& e : r.worker_errors) BOOST_REQUIRE_MESSAGE(e.empty(), e);
  BOOST_REQUIRE(r.servers[0].core.commits_applied == 12u);
}

// The bytes PSID version `version` holds for that job (state_writer's
// little-endian layout, written out by hand).
std::vector<std::byte> psid_bytes(std::uint32_t version, std::uint64_t job, std::uint64_t elements,
                                  std::uint32_t max_workers, std::uint8_t codec, std::string_view policy) {
  std::vector<std::byte> b;
  const auto le = [&](std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b.push_back(std::byte((v >> (8 * i)) & 0xffu));
  };
  for (char c : std::string_view("PSID")) b.push_back(std::byte(c));
  le(version, 4);
  le(job, 8);
  le(elements, 8);
  le(max_workers, 4);
  le(codec, 1);
  le(policy.size(), 8);
  for (char c : policy) b.push_back(std::byte(c));
  return b;
}

ps::server_params restore_params(const std::string& dir, std::uint32_t workers, std::uint32_t max_workers) {
  auto layout = ps::shard_layout::even(64, 1);
  ps::server_params p{.core = {.layout = *layout,
                               .workers = workers,
                               .max_workers = max_workers,
                               .optimizer = {.mode = ps::optimizer_params::kind::sgd, .lr = 0.125}},
                      .compression = ashl::codec_id::identity};
  p.checkpoint_dir = dir;
  p.restore = true;
  p.policy = "bsp";
  p.job = ps::make_job_id("elastic", 64, max_workers == 0 ? workers : max_workers, 1);
  return p;
}

}  // namespace

// PSID version 2, pinned byte for byte: the job id, the elements, the
// maximum of workers (4: the worker count, no maximum said), the codec, the
// policy; server_core's own state (PSCR) follows. Rewritten as version 1 (the
// same layout, its field read as the worker count) it still restores, and
// each version names its own field when the maximum differs.
BOOST_AUTO_TEST_CASE(server_checkpoints_hold_psid_version_2_and_version_1_still_restores) {
  temp_dir dir;
  run_a_4_worker_job(dir.path);
  const std::string file = ps::checkpoint_file(dir.path, 0);
  auto c = ps::read_checkpoint(file);
  BOOST_TEST_REQUIRE(c.has_value(), (c ? "" : c.error().to_string()));
  const std::uint64_t job = ps::make_job_id("elastic", 64, 4, 1);
  const std::vector<std::byte> v2 =
      psid_bytes(2, job, 64, 4, static_cast<std::uint8_t>(ashl::codec_id::identity), "bsp");
  BOOST_TEST_REQUIRE(c->state.size() > v2.size() + 4);
  BOOST_TEST((std::vector<std::byte>(c->state.begin(), c->state.begin() + static_cast<std::ptrdiff_t>(v2.size())) == v2));
  BOOST_TEST(std::string(reinterpret_cast<const char*>(c->state.data() + v2.size()), 4) == "PSCR");

  // Each server is gone before the next opens the shard's checkpoint (one
  // server per shard holds it): what it said, or its restored version.
  const auto restore = [&](const ps::server_params& p, std::uint32_t* max_workers = nullptr) -> std::string {
    auto f = tr::inproc_fabric::create({});
    auto srv = ps::server<tr::inproc>::create(p, bsp_of(p.core.workers), any_node(f));
    if (!srv) return srv.error().message();
    if (max_workers) *max_workers = srv->core().params().max_workers;
    return "restored version " + std::to_string(srv->restored_version());
  };
  // Version 2: the same maximum restores; another is named.
  BOOST_TEST(restore(restore_params(dir.path, 4, 0)) == "restored version 3");
  BOOST_TEST(contains(restore(restore_params(dir.path, 4, 6)),
                      "checkpoint.max_workers = 4: this server's job admits at most 6 workers"),
             restore(restore_params(dir.path, 4, 6)));
  // The same state behind a version-1 identity (what a build before E2b wrote).
  std::vector<std::byte> state = c->state;
  state[4] = std::byte{1};
  BOOST_TEST_REQUIRE(ps::write_checkpoint(file, c->meta, state).ok());
  std::uint32_t loaded_max = 0;
  BOOST_TEST(restore(restore_params(dir.path, 4, 0), &loaded_max) == "restored version 3");
  BOOST_TEST(loaded_max == 4u);
  // Version 1's count is the job's maximum: 2 of at most 4 restore it too.
  BOOST_TEST(restore(restore_params(dir.path, 2, 4)) == "restored version 3");
  BOOST_TEST(contains(restore(restore_params(dir.path, 4, 6)),
                      "checkpoint.workers = 4: this server's job admits at most 6 workers"),
             restore(restore_params(dir.path, 4, 6)));
  // The server writes version 2 from then on.
  {
    auto f = tr::inproc_fabric::create({});
    auto srv = ps::server<tr::inproc>::create(restore_params(dir.path, 4, 0), bsp_of(4), any_node(f));
    BOOST_TEST_REQUIRE(srv.has_value(), (srv ? "" : srv.error().message()));
    BOOST_TEST_REQUIRE(srv->checkpoint().ok());
  }
  auto again = ps::read_checkpoint(file);
  BOOST_TEST_REQUIRE(again.has_value());
  BOOST_TEST((std::vector<std::byte>(again->state.begin(), again->state.begin() + static_cast<std::ptrdiff_t>(v2.size())) == v2));
}

// docs/elastic.md §2.2 (E2b): a checkpoint of a 4-worker BSP job restores
// into a job started with 2 of at most 4 workers (ASHL_NUM_WORKERS=2,
// ASHL_MAX_WORKERS=4: the same job id), and only ranks 0 and 1 rejoin. Before
// E2b the restore was refused (checkpoint.workers), and a restore with 4
// workers of which 2 came waited for the others (docs/ps.md, "Faults,
// checkpoints and rejoining"). Here
// nothing is refused, the rounds complete with the 2 live workers, the job
// ends by itself once they left (all_left), and the parameters equal one
// server_core loaded from the same checkpoint and fed the same events, bit
// for bit.
BOOST_AUTO_TEST_CASE(a_checkpoint_of_a_4_worker_job_trains_with_2_of_its_4_workers_rejoining) {
  temp_dir dir;
  run_a_4_worker_job(dir.path);
  constexpr std::size_t n = 64;
  constexpr int rounds = 4;
  const ps::server_params rp = restore_params(dir.path, 2, 4);
  BOOST_TEST_REQUIRE(rp.job == ps::make_job_id("elastic", 64, 4, 1));  // the 4-worker job's id

  // The reference: the checkpoint's state loaded into one core of the
  // restoring server's shape, every known rank evicted (as a restore does),
  // then rank 0 joins and pulls (no round in progress: live at once), rank 1
  // joins and pulls (held: round 1 is in progress with rank 0 alone), rank 0
  // commits round 1 alone, and both commit rounds 2..4.
  auto file = ps::read_checkpoint(ps::checkpoint_file(dir.path, 0));
  BOOST_TEST_REQUIRE(file.has_value());
  ashl::state_reader in(file->state);
  {
    std::uint32_t version = 0;
    std::uint64_t job = 0, elements = 0;
    std::uint32_t max_workers = 0;
    std::uint8_t codec = 0;
    std::string policy;
    BOOST_TEST_REQUIRE(in.tag("PSID", 2, 2, version).ok());
    BOOST_TEST_REQUIRE((in.get(job, "job").ok() && in.get(elements, "elements").ok() &&
                        in.get(max_workers, "max_workers").ok() && in.get(codec, "codec").ok() &&
                        in.get_string(policy, "policy").ok()));
    BOOST_TEST(max_workers == 4u);
  }
  auto core = ps::server_core<ashl::sync::any_policy>::create(rp.core, bsp_of(2), std::vector<float>(n, 0.5f));
  BOOST_TEST_REQUIRE(core.has_value());
  BOOST_TEST_REQUIRE(core->load(in).ok());
  BOOST_TEST_REQUIRE(core->known_workers() == 4u);
  const std::vector<float> restored(core->parameters().begin(), core->parameters().end());
  ps::server_actions out(4);
  for (std::uint32_t w = 0; w < 4; ++w) core->evict(w, 0.0, out);
  out.clear();
  std::vector<float> g(n);
  const auto commit = [&](std::uint32_t k, int c, std::uint64_t sequence) {
    for (std::size_t i = 0; i < n; ++i) g[i] = ps_job::grad_value(k, static_cast<std::uint64_t>(c), i);
    core->commit({.worker = k, .incarnation = 100 + k, .sequence = sequence, .clock = sequence, .samples = 16,
                  .codec = ashl::codec_id::identity, .element_count = n,
                  .payload = std::as_bytes(std::span<const float>(g))},
                 0.0, out);
    BOOST_TEST_REQUIRE(out.errors().empty(), "worker " << k << " round " << c << ": "
                                                       << (out.errors().empty() ? std::string() : out.errors()[0].text));
    out.clear();
  };
  core->join(0, 100, 0.0, out);
  core->pull(0, 0.0, out);
  core->join(1, 101, 0.0, out);
  core->pull(1, 0.0, out);
  out.clear();
  BOOST_TEST(core->is_held(1));
  commit(0, 0, 1);
  BOOST_TEST(!core->is_held(1));
  for (int c = 1; c < rounds; ++c) {
    commit(0, c, static_cast<std::uint64_t>(c) + 1);
    commit(1, c, static_cast<std::uint64_t>(c));
  }
  const std::vector<float> expected(core->parameters().begin(), core->parameters().end());
  BOOST_TEST_REQUIRE(expected != restored);  // the commits moved the parameters

  // The restoring server and its two rejoining workers.
  auto fabric = tr::inproc_fabric::create({.eager_bytes = 256});
  std::atomic<bool> stop{false}, up{false}, one_held{false};
  std::vector<float> got;
  ps::server_end end = ps::server_end::running;
  ps::server_telemetry tel{};
  std::string create_error;
  std::thread server([&] {
    auto node = fabric->node("server0");
    ASHL_REQUIRE(node.has_value());
    auto srv = ps::server<tr::inproc>::create(rp, bsp_of(2), std::move(*node));
    if (!srv) {
      create_error = srv.error().message();
      up = true;
      return;
    }
    up = true;
    srv->run(stop, [&] { one_held = srv->core().is_held(1); });
    got.assign(srv->parameters().begin(), srv->parameters().end());
    end = srv->end();
    tel = srv->telemetry();
  });
  while (!up) std::this_thread::sleep_for(1ms);
  std::vector<std::thread> workers;
  struct joiner_of_threads {
    std::atomic<bool>& stop;
    std::thread& server;
    std::vector<std::thread>& workers;
    ~joiner_of_threads() {
      for (auto& t : workers)
        if (t.joinable()) t.join();
      stop = true;  // only after a failure: the job ends by itself otherwise
      if (server.joinable()) server.join();
    }
  } guard{stop, server, workers};
  BOOST_TEST_REQUIRE(create_error.empty(), create_error);
  const auto wait_for = [](const auto& done) {
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(100us);
    return done();
  };
  std::vector<std::string> errors(2);
  std::atomic<bool> zero_joined{false};
  for (std::uint32_t k = 0; k < 2; ++k) {
    workers.emplace_back([&, k] {
      std::vector<float> w(n), gw(n);
      // Rank 1 joins once rank 0 is in (so its pull is held by round 1).
      if (k == 1 && !wait_for([&] { return zero_joined.load(); })) {
        errors[k] = "rank 0 never joined";
        return;
      }
      auto wk = ps::worker<tr::inproc>::create({.rank = k, .servers = {"server0"}, .batch = 16, .incarnation = 100 + k,
                                                .job = rp.job, .timeout = 20s},
                                               any_node(fabric), w);
      if (!wk) {
        errors[k] = wk.error().message();
        return;
      }
      if (k == 0) {
        zero_joined = true;
        // Round 1 with rank 0 alone: commit once rank 1's pull is held.
        if (!wait_for([&] { return one_held.load(); })) {
          errors[k] = "rank 1's pull was never held";
          return;
        }
      }
      for (int c = k == 0 ? 0 : 1; c < rounds; ++c) {
        while (!wk->iteration_done()) {}
        for (std::size_t i = 0; i < n; ++i) gw[i] = ps_job::grad_value(k, static_cast<std::uint64_t>(c), i);
        if (auto s = wk->commit(gw); !s) {
          errors[k] = s.message();
          return;
        }
        if (auto s = wk->wait(); !s) {
          errors[k] = s.message();
          return;
        }
      }
      if (auto s = wk->leave(); !s) errors[k] = s.message();
    });
  }
  for (auto& t : workers) t.join();
  for (const auto& e : errors) BOOST_TEST(e.empty(), e);
  server.join();  // ends by itself: every rank that joined left
  BOOST_TEST((end == ps::server_end::all_left));
  BOOST_TEST(tel.restored_version == 3u);
  BOOST_TEST(tel.core.refused_total() == 0u);
  BOOST_TEST(tel.wire_refused_total() == 0u);
  BOOST_TEST_REQUIRE(got.size() == n);
  BOOST_TEST(std::memcmp(got.data(), expected.data(), n * sizeof(float)) == 0);
}
