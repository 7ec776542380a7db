// Fuzz target: ps::read_checkpoint on arbitrary file contents must never
// crash, read out of bounds or allocate past the file's size, and whatever
// it accepts must be exactly what the file holds: the state is the bytes
// after the 64-byte header, their CRC-32C is the header's, and the header
// encodes again byte for byte from the meta read back.
// Random bytes almost never carry valid CRCs, so each input of 64 bytes or
// more is also tried with its CRCs recomputed, and with its state length set
// to the file's as well, which lets the fuzzer reach the checks behind them.
// The input goes through a real file (one per process, rewritten for each
// input), as a restarting server reads it.
// Seed corpus: test/fuzz/corpus/checkpoint/ (valid format-1 files: an empty
// state, 16 bytes, 200 bytes).
#include <ashl/ps/checkpoint.hpp>

#include <ashl/core/bytes.hpp>
#include <ashl/wire/crc32c.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace {
namespace ps = ashl::ps;

// One file per process, unlinked as soon as it is made (libFuzzer ends with
// _Exit, so nothing at exit would remove it) and read back through
// /proc/self/fd, which opens the same inode by another name.
struct scratch {
  int fd = -1;
  std::string path;
};

const scratch& scratch_file() {
  static const scratch s = [] {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t != nullptr && *t != '\0' ? t : "/tmp") + "/ashl-fuzz-checkpoint-XXXXXX";
    const int fd = ::mkstemp(tmpl.data());
    if (fd < 0) std::abort();
    ::unlink(tmpl.c_str());
    return scratch{fd, "/proc/self/fd/" + std::to_string(fd)};
  }();
  return s;
}

void spill(std::span<const std::byte> b) {
  const int fd = scratch_file().fd;
  if (::ftruncate(fd, 0) != 0) std::abort();
  if (!b.empty() && ::pwrite(fd, b.data(), b.size(), 0) != static_cast<ssize_t>(b.size())) std::abort();
}

template <class T>
T field_at(std::span<const std::byte> b, std::size_t at) {
  ashl::byte_reader r(b.subspan(at, sizeof(T)));
  T v{};
  if (!r.get(v, "field").ok()) std::abort();
  return v;
}

void check_one(std::span<const std::byte> in) {
  spill(in);
  auto c = ps::read_checkpoint(scratch_file().path);
  if (!c) {
    if (c.error().message().find(scratch_file().path) == std::string::npos) std::abort();  // names the file
    return;
  }
  if (in.size() != ps::checkpoint_header_bytes + c->state.size()) std::abort();
  const auto state = in.subspan(ps::checkpoint_header_bytes);
  if (c->state.size() != state.size() ||
      (!state.empty() && std::memcmp(c->state.data(), state.data(), state.size()) != 0))
    std::abort();
  if (ashl::wire::crc32c(c->state) != field_at<std::uint32_t>(in, 56)) std::abort();
  const auto h = ps::detail::encode_checkpoint_header(c->meta, c->state.size(), ashl::wire::crc32c(c->state));
  if (std::memcmp(h.data(), in.data(), h.size()) != 0) std::abort();
}

void put_u32(std::vector<std::byte>& b, std::size_t at, std::uint32_t v) {
  ashl::byte_writer w(std::span<std::byte>(b.data() + at, 4));
  w.put(v);
}

void fix_crcs(std::vector<std::byte>& b) {
  put_u32(b, 56, ashl::wire::crc32c(std::span<const std::byte>(b).subspan(64)));
  put_u32(b, 60, ashl::wire::crc32c(std::span<const std::byte>(b.data(), 60)));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  check_one(in);
  if (size >= ps::checkpoint_header_bytes) {
    std::vector<std::byte> b(in.begin(), in.end());
    fix_crcs(b);
    check_one(b);
    ashl::byte_writer w(std::span<std::byte>(b.data() + 48, 8));
    w.put<std::uint64_t>(size - ps::checkpoint_header_bytes);
    fix_crcs(b);
    check_one(b);
  }
  return 0;
}
