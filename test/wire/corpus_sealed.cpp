// The fuzz seeds that carry a format version and checksums
// (test/fuzz/corpus/{wire_message,ps_server,checkpoint}) must be accepted by
// this build's own readers. A seed that a version bump left behind is
// refused at the version check; its replay (ctest fuzz/<name>) still passes,
// since a refusal is a fine outcome for a fuzz input, but it no longer
// reaches the code behind the check. This test fails instead, naming the seed
// and the reader's message. To re-seal: test/fuzz/seal_corpus.py.
#include <ashl/ps/checkpoint.hpp>
#include <ashl/wire/message.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace {
namespace fs = std::filesystem;
namespace w = ashl::wire;

// test/fuzz/corpus, beside this file's directory (CMake compiles sources by
// their absolute paths).
fs::path corpus(const char* target) {
  return fs::path(__FILE__).parent_path().parent_path() / "fuzz" / "corpus" / target;
}

std::vector<fs::path> seeds(const char* target) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(corpus(target)))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::byte> read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  const std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::transform(c.begin(), c.end(), out.begin(), [](char x) { return static_cast<std::byte>(x); });
  return out;
}

// The limits of the fuzz targets (test/fuzz/wire_message.cpp).
w::limits fuzz_limits() {
  w::limits lim;
  lim.max_elements = std::uint64_t{1} << 20;
  lim.max_payload_bytes = std::uint64_t{1} << 20;
  lim.max_error_text = 256;
  return lim;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_wire_message_seed_decodes_and_every_kind_has_one) {
  const auto files = seeds("wire_message");
  BOOST_TEST_REQUIRE(!files.empty(), corpus("wire_message") << " holds no seed");
  std::set<unsigned> kinds;
  bool reply_part = false, commit_part = false;
  for (const fs::path& p : files) {
    const std::vector<std::byte> in = read(p);
    const auto m = w::decode(in, fuzz_limits());
    BOOST_TEST(m.has_value(), p.filename() << ": " << (m ? std::string() : m.error().message())
                                           << " (re-seal: test/fuzz/seal_corpus.py)");
    if (!m) continue;
    kinds.insert(static_cast<unsigned>(m->header.kind));
    const bool part = (m->header.flags & w::flag_part) != 0;
    reply_part |= part && m->header.kind == w::message_kind::pull_reply;
    commit_part |= part && m->header.kind == w::message_kind::commit;
  }
  for (unsigned k = w::message_kind_first; k <= w::message_kind_last; ++k)
    BOOST_TEST(kinds.count(k) == 1u, "no wire_message seed of kind " << k);
  BOOST_TEST(reply_part, "no wire_message seed of a pull_reply part");
  BOOST_TEST(commit_part, "no wire_message seed of a commit part");
}

// A ps_server seed: a prefix byte (join first or not), then per message a u8
// header length, a u16 payload length and those bytes (test/fuzz/ps_server.cpp).
BOOST_AUTO_TEST_CASE(every_ps_server_seed_is_a_sequence_of_messages_that_decode) {
  const auto files = seeds("ps_server");
  BOOST_TEST_REQUIRE(!files.empty(), corpus("ps_server") << " holds no seed");
  std::set<unsigned> kinds;
  for (const fs::path& p : files) {
    const std::vector<std::byte> in = read(p);
    const std::span<const std::byte> s(in);
    std::size_t at = 1, n = 0;
    bool whole = !in.empty();
    while (whole && at < in.size()) {
      if (at + 3 > in.size()) {
        whole = false;
        break;
      }
      const auto hl = static_cast<std::size_t>(s[at]);
      const std::size_t dl = static_cast<std::size_t>(s[at + 1]) | static_cast<std::size_t>(s[at + 2]) << 8;
      at += 3;
      if (at + hl + dl > in.size()) {
        whole = false;
        break;
      }
      const auto m = w::decode(s.subspan(at, hl), s.subspan(at + hl, dl), fuzz_limits());
      BOOST_TEST(m.has_value(), p.filename() << " message " << n << ": "
                                             << (m ? std::string() : m.error().message())
                                             << " (re-seal: test/fuzz/seal_corpus.py)");
      if (m) kinds.insert(static_cast<unsigned>(m->header.kind));
      at += hl + dl;
      ++n;
    }
    BOOST_TEST(whole, p.filename() << ": message " << n << " runs past the end of the file");
    BOOST_TEST(n >= 1u, p.filename() << " holds no message");
  }
  // The server meets every kind of version 6 (docs/elastic.md §3.4): a
  // join of the 36-byte body and each new kind, which it takes or refuses.
  for (const auto k : {w::message_kind::join, w::message_kind::lease, w::message_kind::replicate,
                       w::message_kind::replica_ack, w::message_kind::replica_hello, w::message_kind::shard_state})
    BOOST_TEST(kinds.count(static_cast<unsigned>(k)) == 1u, "no ps_server seed of kind " << w::to_string(k));
}

BOOST_AUTO_TEST_CASE(every_checkpoint_seed_reads_back) {
  const auto files = seeds("checkpoint");
  BOOST_TEST_REQUIRE(!files.empty(), corpus("checkpoint") << " holds no seed");
  for (const fs::path& p : files) {
    const auto c = ashl::ps::read_checkpoint(p.string());
    BOOST_TEST(c.has_value(), p.filename() << ": " << (c ? std::string() : c.error().message())
                                           << " (re-seal: test/fuzz/seal_corpus.py)");
    if (c) BOOST_TEST(c->state.size() + ashl::ps::checkpoint_header_bytes == fs::file_size(p), p.filename());
  }
}
