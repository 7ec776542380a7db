// ashl/ps/checkpoint.hpp — the checkpoint file of one parameter server:
// a versioned, checksummed header and the server's saved state, written so
// that a crash at any moment leaves either the old checkpoint or the new one.
//
//   std::vector<std::byte> state;
//   ashl::state_writer out(state);
//   core.save(out);                                        // server_core::save
//   const auto file = ashl::ps::checkpoint_file("/ckpt", 0);   // "/ckpt/server-0.ashlckpt"
//   if (auto s = ashl::ps::write_checkpoint(file, {.shard = 0, .servers = 1, .version = v}, state); !s)
//     log(s.to_string());                                  // the old checkpoint is intact
//   ...
//   auto c = ashl::ps::read_checkpoint(file);              // result<checkpoint>
//   if (!c) return c.error();   // 'checkpoint "/ckpt/server-0.ashlckpt": checkpoint.format = 7: ...'
//   ashl::state_reader in(c->state);
//   ASHL_TRY(core.load(in));
//
// Writing: a temporary file in the same directory (so the rename stays in
// one file system), the whole file written, fsync'd and closed, renamed over
// the checkpoint, then the directory fsync'd so the rename itself is durable.
// rename(2) replaces the name atomically: a reader, or a server restarting
// after a crash, sees the complete old file or the complete new one. Any
// failure before the rename removes the temporary file and leaves the old
// checkpoint as it was.
//
// Reading refuses, with a status naming the file, the field and the value, a
// missing file (not_found), a short one (malformed, "truncated"), one that is
// not a checkpoint (malformed), another format (unsupported), a header or
// state whose CRC-32C does not match (checksum_mismatch) and trailing bytes
// (malformed). The state is returned only when every check passed; its
// buffer is sized from a header whose checksum held and whose length agrees
// with the file's, so no input makes a read allocate past the file's size.
// The state's own layout (server_core::save) carries its own tags, version
// and CRC; this file adds what a restarting server needs before parsing it.
//
// Files are created 0600 (the state is the model: not for other users).
//
// A server writes its checkpoints through a checkpoint_writer (below): the
// event loop serialises into one buffer (fast) and hands it to a writer
// thread, which does the slow part (write, fsyncs, rename) while the loop
// goes on; the writer also holds the shard's lock (flock on
// "<file>.lock"), so two servers never write one checkpoint.
//
//   auto w = ashl::ps::checkpoint_writer::open(file, "server 0");   // result<unique_ptr>; refused if locked
//   if (!(*w)->busy()) { fill((*w)->buffer()); (*w)->submit(meta); }   // never waits
//   status s = (*w)->write_now(meta);        // at the end: waits, then writes buffer() here
//
// docs/design.md "Runtime contract for real runs" (server state checkpointed:
// temporary file, fsync, rename); docs/checkpoints.md (layout, atomicity).
// POSIX (Linux): open, write, fsync, rename, flock.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/clock.hpp>
#include <ashl/core/status.hpp>
#include <ashl/wire/crc32c.hpp>

#include <array>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

ASHL_NAMESPACE_BEGIN
namespace ps {

// The layout version this build writes and reads (docs/checkpoints.md).
inline constexpr std::uint32_t checkpoint_format = 1;
// "ASHLCKPT": the first eight bytes of every checkpoint file.
inline constexpr std::array<std::byte, 8> checkpoint_magic = {
    std::byte{'A'}, std::byte{'S'}, std::byte{'H'}, std::byte{'L'},
    std::byte{'C'}, std::byte{'K'}, std::byte{'P'}, std::byte{'T'}};
// Bytes of the format-1 header, before the state.
inline constexpr std::uint32_t checkpoint_header_bytes = 64;

// What a restarting server checks before it parses the state: which shard
// of how many servers saved it, and how far the shard had come.
struct checkpoint_meta {
  std::uint32_t shard = 0, servers = 1;
  std::uint64_t version = 0;          // the shard's parameter version (optimizer steps)
  std::uint64_t commits_applied = 0;
  double unix_seconds = 0;            // when it was written (wall clock), for people and logs
};

struct checkpoint {
  checkpoint_meta meta;
  std::vector<std::byte> state;       // server_core::save bytes, exactly as written
};

// DIR/server-<shard>.ashlckpt; no separator is added after a DIR ending in
// '/', and an empty DIR gives the bare name (the working directory).
inline std::string checkpoint_file(std::string_view dir, std::uint32_t shard) {
  std::string f(dir);
  if (!f.empty() && f.back() != '/') f += '/';
  f += "server-";
  f += std::to_string(shard);
  f += ".ashlckpt";
  return f;
}

namespace detail {

// 'checkpoint "<file>": <field> = <value>: <why>'
template <class T>
status checkpoint_error(errc code, const std::string& file, std::string_view field, const T& value,
                        std::string_view why) {
  std::string m = "checkpoint \"" + file + "\": ";
  m += make_error(code, field, value, why).message();
  return status(code, std::move(m));
}

// A CRC in messages: 0x1234abcd, as people compare them.
struct crc_text {
  std::uint32_t v;
  [[nodiscard]] std::string text() const {
    char b[11];
    std::snprintf(b, sizeof b, "0x%08x", static_cast<unsigned>(v));
    return b;
  }
  friend std::ostream& operator<<(std::ostream& os, crc_text c) { return os << c.text(); }
};

inline std::string errno_text(int e) { return std::system_category().message(e) + " (errno " + std::to_string(e) + ")"; }

// Closes on every path out of a function.
class checkpoint_fd {
 public:
  explicit checkpoint_fd(int fd) noexcept : fd_(fd) {}
  checkpoint_fd(const checkpoint_fd&) = delete;
  checkpoint_fd& operator=(const checkpoint_fd&) = delete;
  ~checkpoint_fd() { close(); }
  [[nodiscard]] int get() const noexcept { return fd_; }
  // The result of close(2), which can report a write-back error (NFS).
  int close() noexcept {
    if (fd_ < 0) return 0;
    const int r = ::close(fd_);
    fd_ = -1;
    return r;
  }

 private:
  int fd_;
};

// 0 or an errno; short writes and EINTR continue.
inline int write_all(int fd, std::span<const std::byte> b) noexcept {
  while (!b.empty()) {
    const std::size_t chunk = b.size() < (std::size_t{1} << 30) ? b.size() : (std::size_t{1} << 30);
    const ssize_t n = ::write(fd, b.data(), chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;  // a regular file never takes zero bytes without an error
    b = b.subspan(static_cast<std::size_t>(n));
  }
  return 0;
}

// Reads until `b` is full or the end of the file: the bytes read, or -errno.
inline std::ptrdiff_t read_full(int fd, std::span<std::byte> b) noexcept {
  std::size_t got = 0;
  while (got < b.size()) {
    const std::size_t want = b.size() - got;
    const std::size_t chunk = want < (std::size_t{1} << 30) ? want : (std::size_t{1} << 30);
    const ssize_t n = ::read(fd, b.data() + got, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  return static_cast<std::ptrdiff_t>(got);
}

// Temporary names are FILE.tmp.<pid>.<counter>: unique among the writers of
// this process (the counter) and of others (the pid); a stale one left by a
// writer that died is never read as the checkpoint.
inline std::atomic<std::uint64_t> checkpoint_temp_counter{0};

inline std::string checkpoint_directory(const std::string& file) {
  const auto slash = file.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return file.substr(0, slash);
}

inline std::array<std::byte, checkpoint_header_bytes> encode_checkpoint_header(const checkpoint_meta& m,
                                                                               std::uint64_t state_bytes,
                                                                               std::uint32_t state_crc) noexcept {
  std::array<std::byte, checkpoint_header_bytes> h{};
  byte_writer w(h);
  w.put_bytes(checkpoint_magic);
  w.put(checkpoint_format);
  w.put(checkpoint_header_bytes);
  w.put(m.shard);
  w.put(m.servers);
  w.put(m.version);
  w.put(m.commits_applied);
  w.put(m.unix_seconds);
  w.put(state_bytes);
  w.put(state_crc);
  w.put(wire::crc32c(w.written()));
  ASHL_ASSERT(w.ok() && w.position() == checkpoint_header_bytes, "checkpoint header: layout and size disagree");
  return h;
}

}  // namespace detail

// Writes `state` and `meta` to `file` atomically (see the top of this file).
// invalid_argument for meta a reader would refuse (servers = 0, shard >=
// servers), nothing written; io_error naming the file, the step and the
// system's reason otherwise. After a failure before the rename the old
// checkpoint is untouched and no temporary file is left; a failure of the
// final directory fsync is reported too (the new file is in place, but its
// name may not survive a power loss).
inline status write_checkpoint(const std::string& file, const checkpoint_meta& meta,
                               std::span<const std::byte> state) {
  if (meta.servers == 0)
    return detail::checkpoint_error(errc::invalid_argument, file, "checkpoint.servers", meta.servers,
                                    "must be >= 1");
  if (meta.shard >= meta.servers)
    return detail::checkpoint_error(errc::invalid_argument, file, "checkpoint.shard", meta.shard,
                                    "must be < checkpoint.servers = " + std::to_string(meta.servers));
  const auto header = detail::encode_checkpoint_header(meta, state.size(), wire::crc32c(state));

  // O_EXCL: a stale temporary of a dead process with a reused pid is never
  // written into; the next counter value is tried instead.
  std::string temp;
  int fd = -1;
  int err = 0;
  for (int attempt = 0; attempt < 64; ++attempt) {
    temp = file + ".tmp." + std::to_string(::getpid()) + "." +
           std::to_string(detail::checkpoint_temp_counter.fetch_add(1, std::memory_order_relaxed));
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) break;
    err = errno;
    if (err != EEXIST) break;
  }
  if (fd < 0)
    return detail::checkpoint_error(errc::io_error, file, "checkpoint.temporary", temp,
                                    "cannot create: " + detail::errno_text(err));
  detail::checkpoint_fd out(fd);
  const auto fail = [&](std::string_view step, int e) {
    out.close();
    ::unlink(temp.c_str());
    return detail::checkpoint_error(errc::io_error, file, "checkpoint.temporary", temp,
                                    std::string(step) + " failed: " + detail::errno_text(e));
  };
  if (int e = detail::write_all(out.get(), header); e != 0) return fail("write", e);
  if (int e = detail::write_all(out.get(), state); e != 0) return fail("write", e);
  if (::fsync(out.get()) != 0) return fail("fsync", errno);
  if (out.close() != 0) return fail("close", errno);
  if (::rename(temp.c_str(), file.c_str()) != 0) return fail("rename", errno);

  // The rename is a change to the directory: without this fsync a power loss
  // could bring back the old name (or no name) although the data was synced.
  const std::string dir = detail::checkpoint_directory(file);
  detail::checkpoint_fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.get() < 0 || ::fsync(d.get()) != 0) {
    const int e = errno;
    return detail::checkpoint_error(errc::io_error, file, "checkpoint.directory", dir,
                                    "fsync after the rename failed (the new checkpoint is in place, its "
                                    "durability is not known): " + detail::errno_text(e));
  }
  return {};
}

// Reads and checks `file` (see the top of this file for what is refused).
inline result<checkpoint> read_checkpoint(const std::string& file) {
  detail::checkpoint_fd in(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) {
    const int e = errno;
    if (e == ENOENT)
      return detail::checkpoint_error(errc::not_found, file, "checkpoint.file", file, "no such file");
    return detail::checkpoint_error(errc::io_error, file, "checkpoint.file", file,
                                    "cannot open: " + detail::errno_text(e));
  }
  struct stat st{};
  if (::fstat(in.get(), &st) != 0) {
    const int e = errno;
    return detail::checkpoint_error(errc::io_error, file, "checkpoint.file", file,
                                    "cannot stat: " + detail::errno_text(e));
  }
  if (!S_ISREG(st.st_mode))
    return detail::checkpoint_error(errc::io_error, file, "checkpoint.file", file, "not a regular file");
  const auto size = static_cast<std::uint64_t>(st.st_size);

  std::array<std::byte, checkpoint_header_bytes> h{};
  const std::ptrdiff_t got = detail::read_full(in.get(), h);
  if (got < 0)
    return detail::checkpoint_error(errc::io_error, file, "checkpoint.file", file,
                                    "read failed: " + detail::errno_text(static_cast<int>(-got)));
  const auto have = static_cast<std::size_t>(got);

  // Magic first, on what there is: a short file that does not start like a
  // checkpoint is "not a checkpoint", one that does is "truncated".
  const std::size_t magic_have = have < checkpoint_magic.size() ? have : checkpoint_magic.size();
  if (std::memcmp(h.data(), checkpoint_magic.data(), magic_have) != 0) {
    std::string seen;
    for (std::size_t i = 0; i < magic_have; ++i) {
      const auto c = std::to_integer<unsigned char>(h[i]);
      seen += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
    }
    return detail::checkpoint_error(errc::malformed, file, "checkpoint.magic", seen,
                                    "not an ashl checkpoint (expected \"ASHLCKPT\")");
  }
  // The format before anything whose place it decides: a later format may
  // have another header, which must read as "unsupported", not "corrupt".
  byte_reader r(std::span<const std::byte>(h.data(), have));
  if (have >= checkpoint_magic.size() + 4) {
    ASHL_TRY(r.skip(checkpoint_magic.size(), "checkpoint.magic"));
    std::uint32_t format = 0;
    ASHL_TRY(r.get(format, "checkpoint.format"));
    if (format != checkpoint_format)
      return detail::checkpoint_error(errc::unsupported, file, "checkpoint.format", format,
                                      "this build reads format " + std::to_string(checkpoint_format));
  }
  if (have < checkpoint_header_bytes)
    return detail::checkpoint_error(errc::malformed, file, "checkpoint.size", size,
                                    "truncated: the header alone is " + std::to_string(checkpoint_header_bytes) +
                                        " bytes");
  std::uint32_t header_bytes = 0;
  checkpoint_meta m;
  std::uint64_t state_bytes = 0;
  std::uint32_t state_crc = 0, header_crc = 0;
  ASHL_TRY(r.get(header_bytes, "checkpoint.header_bytes"));
  ASHL_TRY(r.get(m.shard, "checkpoint.shard"));
  ASHL_TRY(r.get(m.servers, "checkpoint.servers"));
  ASHL_TRY(r.get(m.version, "checkpoint.version"));
  ASHL_TRY(r.get(m.commits_applied, "checkpoint.commits_applied"));
  ASHL_TRY(r.get(m.unix_seconds, "checkpoint.unix_seconds"));
  ASHL_TRY(r.get(state_bytes, "checkpoint.state_bytes"));
  ASHL_TRY(r.get(state_crc, "checkpoint.state_crc32c"));
  const std::size_t covered = r.position();
  ASHL_TRY(r.get(header_crc, "checkpoint.header_crc32c"));
  if (header_bytes != checkpoint_header_bytes)
    return detail::checkpoint_error(errc::malformed, file, "checkpoint.header_bytes", header_bytes,
                                    "format 1 has a header of " + std::to_string(checkpoint_header_bytes) +
                                        " bytes");
  if (const std::uint32_t c = wire::crc32c(std::span<const std::byte>(h.data(), covered)); c != header_crc)
    return detail::checkpoint_error(errc::checksum_mismatch, file, "checkpoint.header_crc32c",
                                    detail::crc_text{header_crc},
                                    "the header's bytes give " + detail::crc_text{c}.text() + " (corrupt header)");
  // The header is now trusted: its lengths and meta are what the writer wrote.
  if (m.servers == 0 || m.shard >= m.servers)
    return detail::checkpoint_error(errc::malformed, file, "checkpoint.shard", m.shard,
                                    "not a shard of checkpoint.servers = " + std::to_string(m.servers));
  const std::uint64_t body = size - checkpoint_header_bytes;
  if (body < state_bytes)
    return detail::checkpoint_error(errc::malformed, file, "checkpoint.size", size,
                                    "truncated: the header says " + std::to_string(checkpoint_header_bytes) + " + " +
                                        std::to_string(state_bytes) + " bytes");
  if (body > state_bytes)
    return detail::checkpoint_error(errc::malformed, file, "checkpoint.size", size,
                                    std::to_string(body - state_bytes) + " trailing bytes after the " +
                                        std::to_string(checkpoint_header_bytes + state_bytes) +
                                        " the header describes");

  checkpoint c{m, std::vector<std::byte>(static_cast<std::size_t>(state_bytes))};
  const std::ptrdiff_t n = detail::read_full(in.get(), c.state);
  if (n < 0)
    return detail::checkpoint_error(errc::io_error, file, "checkpoint.file", file,
                                    "read failed: " + detail::errno_text(static_cast<int>(-n)));
  // Checkpoints are replaced by rename, never rewritten in place, so the
  // size cannot change under an open descriptor; a file that does (written
  // by something else) is refused like any other mismatch.
  if (static_cast<std::uint64_t>(n) != state_bytes)
    return detail::checkpoint_error(errc::malformed, file, "checkpoint.size",
                                    checkpoint_header_bytes + static_cast<std::uint64_t>(n),
                                    "truncated while reading: the header says " +
                                        std::to_string(checkpoint_header_bytes + state_bytes) + " bytes");
  std::array<std::byte, 1> extra{};
  if (detail::read_full(in.get(), extra) != 0)
    return detail::checkpoint_error(errc::malformed, file, "checkpoint.size", size,
                                    "the file grew while being read: trailing bytes");
  if (const std::uint32_t got_crc = wire::crc32c(c.state); got_crc != state_crc)
    return detail::checkpoint_error(errc::checksum_mismatch, file, "checkpoint.state_crc32c",
                                    detail::crc_text{state_crc},
                                    "the state's bytes give " + detail::crc_text{got_crc}.text() + " (corrupt state)");
  return c;
}

// What a checkpoint_writer did (server_telemetry's checkpoint counters).
struct checkpoint_writer_stats {
  std::uint64_t written = 0, failed = 0;
  std::uint64_t deferred = 0;     // submits refused because the previous write was still running
  double write_seconds = 0.0;     // in the write function (write, fsyncs, rename), on whichever thread
  std::uint64_t bytes = 0;        // the last written checkpoint's state
};

// Writes one checkpoint file from a thread of its own, double-buffered:
// buffer() is the caller's (its event loop serialises the next checkpoint
// into it), the other buffer is the writer thread's. submit() swaps them
// and wakes the thread; it never waits and never queues a second write: while
// a write runs, busy() is true and submit() is refused (counted as deferred).
// The caller decides what a deferral means (a server tries again at its next
// housekeeping pass, so checkpoints are at most one write behind).
//
// open() takes an exclusive flock on "<file>.lock" (created 0600, this pid
// written into it) and keeps it until destruction: a second writer of the
// same file, in this process or another, is refused naming the holder's pid.
// The lock file is left in place on exit (unlinking it would let two later
// servers each lock a different inode).
//
// One thread calls buffer(), busy(), submit(), write_now() and wait() (the
// event loop); stats() and last_error() may be read from any thread.
class checkpoint_writer {
 public:
  using write_function =
      std::function<status(const std::string& file, const checkpoint_meta& meta, std::span<const std::byte> state)>;

  // `label` prefixes the one line printed at the first failure ("server 0").
  static result<std::unique_ptr<checkpoint_writer>> open(std::string file, std::string label = "checkpoint",
                                                         write_function write = write_checkpoint) {
    std::unique_ptr<checkpoint_writer> w(new checkpoint_writer(std::move(file), std::move(label), std::move(write)));
    ASHL_TRY(w->lock());
    w->thread_ = std::thread([p = w.get()] { p->serve(); });
    return w;
  }

  checkpoint_writer(const checkpoint_writer&) = delete;
  checkpoint_writer& operator=(const checkpoint_writer&) = delete;
  // Waits for the write in flight (a checkpoint handed over is written),
  // stops the thread, releases the lock.
  ~checkpoint_writer() {
    {
      std::lock_guard g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }

  [[nodiscard]] const std::string& file() const noexcept { return file_; }
  [[nodiscard]] const std::string& lock_file() const noexcept { return lock_file_; }

  // The caller's buffer: serialise the next checkpoint into it (clear()
  // first; its capacity is kept, and after a swap it is the previous
  // write's buffer, so neither allocates in steady state).
  [[nodiscard]] std::vector<std::byte>& buffer() noexcept { return front_; }

  // A write is running (or handed over and not yet finished).
  [[nodiscard]] bool busy() const {
    std::lock_guard g(mu_);
    return pending_;
  }

  // Hands buffer() to the writer thread; never waits. false, with nothing
  // handed over (counted in stats().deferred), while the previous write runs.
  bool submit(const checkpoint_meta& meta) {
    {
      std::lock_guard g(mu_);
      if (pending_) {
        ++stats_.deferred;
        return false;
      }
      front_.swap(back_);
      back_meta_ = meta;
      pending_ = true;
    }
    cv_.notify_all();
    return true;
  }

  // Until no write is in flight.
  void wait() {
    std::unique_lock g(mu_);
    cv_.wait(g, [&] { return !pending_; });
  }

  // Waits for the write in flight, then writes buffer() on this thread and
  // returns its status (also counted): a server's final checkpoint.
  status write_now(const checkpoint_meta& meta) {
    wait();
    const steady_clock since;
    status s = write_(file_, meta, front_);
    const double d = since.now();
    std::lock_guard g(mu_);
    record(s, d, front_.size());
    return s;
  }

  [[nodiscard]] checkpoint_writer_stats stats() const {
    std::lock_guard g(mu_);
    return stats_;
  }
  // The last write's status (ok before any).
  [[nodiscard]] status last_status() const {
    std::lock_guard g(mu_);
    return last_;
  }

 private:
  checkpoint_writer(std::string file, std::string label, write_function write)
      : file_(std::move(file)), lock_file_(file_ + ".lock"), label_(std::move(label)), write_(std::move(write)) {}

  status lock() {
    const std::string dir = detail::checkpoint_directory(file_);
    lock_fd_ = ::open(lock_file_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd_ < 0) {
      const int e = errno;
      return status(errc::io_error, "checkpoint_dir \"" + dir + "\": cannot create the lock file \"" + lock_file_ +
                                        "\": " + detail::errno_text(e));
    }
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      if (e != EWOULDBLOCK)
        return status(errc::io_error, "checkpoint_dir \"" + dir + "\": cannot lock \"" + lock_file_ +
                                          "\": " + detail::errno_text(e));
      char buf[32] = {};
      const auto n = ::pread(lock_fd_, buf, sizeof buf - 1, 0);
      std::string pid = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("unknown");
      while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
      return status(errc::unavailable, "checkpoint_dir \"" + dir + "\" is locked by another server (pid " + pid +
                                              ", lock file \"" + lock_file_ + "\"): one server per shard checkpoint");
    }
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(lock_fd_, 0) != 0 ||
        detail::write_all(lock_fd_, std::as_bytes(std::span<const char>(pid.data(), pid.size()))) != 0) {
      // The lock holds without the pid; a refused server then says "pid unknown".
    }
    return {};
  }

  void serve() {
    std::unique_lock g(mu_);
    while (true) {
      cv_.wait(g, [&] { return pending_ || stop_; });
      if (!pending_) return;  // stop_, nothing left to write
      const checkpoint_meta meta = back_meta_;
      g.unlock();
      const steady_clock since;
      status s = write_(file_, meta, back_);  // back_ is this thread's while pending_
      const double d = since.now();
      g.lock();
      record(s, d, back_.size());
      pending_ = false;
      cv_.notify_all();
    }
  }

  // Under mu_.
  void record(const status& s, double seconds, std::size_t bytes) {
    stats_.write_seconds += seconds;
    if (s) {
      ++stats_.written;
      stats_.bytes = bytes;
    } else if (stats_.failed++ == 0) {
      std::fprintf(stderr, "%s: checkpoint failed: %s\n", label_.c_str(), s.message().c_str());
    }
    last_ = s;
  }

  std::string file_, lock_file_, label_;
  write_function write_;
  int lock_fd_ = -1;
  std::vector<std::byte> front_;  // the caller's

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::byte> back_;   // the writer thread's while pending_
  checkpoint_meta back_meta_{};
  bool pending_ = false, stop_ = false;
  checkpoint_writer_stats stats_;
  status last_;
  std::thread thread_;
};

}  // namespace ps
ASHL_NAMESPACE_END
