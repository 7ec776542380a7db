// ashl_bench_checkpoint — what a parameter server's checkpoint costs
// (docs/perf/checkpoint.md): server_core::save into the server's reused
// buffer, then ps::write_checkpoint (a temporary file, write, fsync, rename,
// directory fsync), against the baseline of writing the same bytes to a file
// with write() and one fsync(). And the restart: ps::read_checkpoint (size,
// header and state CRC checks) plus server_core::load, against read() of the
// same bytes.
//
//   ashl_bench_checkpoint                   # the reference MLP's shard (203,530 f32) and 2^24 f32
//   ashl_bench_checkpoint --reps 15 --dir /tmp
//
// Every figure is the median of --reps runs after one warm-up; a case and its
// baseline run interleaved, so load drift reaches both. Ratio = baseline /
// case (1.0: the checkpoint costs no more than writing its bytes once).
#include "support.hpp"

#include <ashl/core/state_io.hpp>
#include <ashl/ps/checkpoint.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/rules/server_core.hpp>
#include <ashl/sync/any_policy.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/vfs.h>
#include <unistd.h>

namespace {

namespace ps = ashl::ps;
using clock_type = std::chrono::steady_clock;

double seconds_of(const std::function<void()>& f) {
  const auto a = clock_type::now();
  f();
  return std::chrono::duration<double>(clock_type::now() - a).count();
}

bool raw_write(const std::string& file, const std::vector<std::byte>& b) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return false;
  std::size_t done = 0;
  while (done < b.size()) {
    const ssize_t n = ::write(fd, b.data() + done, b.size() - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  const bool ok = done == b.size() && ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

bool raw_read(const std::string& file, std::vector<std::byte>& b) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) return false;
  std::size_t done = 0;
  while (done < b.size()) {
    const ssize_t n = ::read(fd, b.data() + done, b.size() - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return done == b.size();
}

std::string fs_type(const std::string& dir) {
  struct statfs s {};
  if (::statfs(dir.c_str(), &s) != 0) return "?";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0x01021994: return "tmpfs";
    case 0xEF53: return "ext4";
    case 0x794c7630: return "overlayfs";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    default: {
      char b[32];
      std::snprintf(b, sizeof b, "0x%lx", static_cast<unsigned long>(s.f_type));
      return b;
    }
  }
}

struct figures {
  std::size_t elements = 0, bytes = 0;
  double save_s = 0, write_s = 0, raw_write_s = 0, read_load_s = 0, raw_read_s = 0;
};

figures measure(std::size_t n, int reps, const std::string& dir) {
  auto layout = ps::shard_layout::even(n, 1);
  ps::policy_params pp;
  pp.workers = 9;
  auto core = ps::server_core<ashl::sync::any_policy>::create(
      {.layout = *layout, .workers = 9, .optimizer = {.mode = ps::optimizer_params::kind::sgd, .lr = 0.1, .momentum = 0.9}},
      *ps::make_policy("ssp", pp), std::vector<float>(n, 0.25f));
  if (!core) {
    std::fprintf(stderr, "server_core: %s\n", core.error().message().c_str());
    std::exit(1);
  }
  auto copy = ps::server_core<ashl::sync::any_policy>::create(
      {.layout = *layout, .workers = 9, .optimizer = {.mode = ps::optimizer_params::kind::sgd, .lr = 0.1, .momentum = 0.9}},
      *ps::make_policy("ssp", pp));
  const std::string file = ps::checkpoint_file(dir, 0), raw = dir + "/raw.bin";
  std::vector<std::byte> state, back;
  std::vector<double> save, write, raww, readload, rawr;
  for (int r = 0; r <= reps; ++r) {
    const double a = seconds_of([&] {
      state.clear();
      ashl::state_writer w(state);
      core->save(w);
    });
    const double b = seconds_of([&] {
      if (auto s = ps::write_checkpoint(file, {.shard = 0, .servers = 1, .version = core->version()}, state); !s) {
        std::fprintf(stderr, "%s\n", s.message().c_str());
        std::exit(1);
      }
    });
    const double c = seconds_of([&] {
      if (!raw_write(raw, state)) std::exit(1);
    });
    const double d = seconds_of([&] {
      auto ck = ps::read_checkpoint(file);
      if (!ck) std::exit(1);
      ashl::state_reader in(ck->state);
      if (auto s = copy->load(in); !s) {
        std::fprintf(stderr, "%s\n", s.message().c_str());
        std::exit(1);
      }
    });
    back.resize(state.size());
    const double e = seconds_of([&] {
      if (!raw_read(raw, back)) std::exit(1);
    });
    if (r == 0) continue;  // warm-up
    save.push_back(a);
    write.push_back(b);
    raww.push_back(c);
    readload.push_back(d);
    rawr.push_back(e);
  }
  ::unlink(file.c_str());
  ::unlink(raw.c_str());
  return {n, state.size(), bench::median(save), bench::median(write), bench::median(raww), bench::median(readload),
          bench::median(rawr)};
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 11;
  std::string dir = "/tmp";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else {
      std::fprintf(stderr, "usage: ashl_bench_checkpoint [--reps N] [--dir DIR]\n");
      return 2;
    }
  }
  std::string tmpl = dir + "/ashl-bench-checkpoint-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    std::fprintf(stderr, "--dir %s: cannot create a directory there\n", dir.c_str());
    return 1;
  }
  const std::string work = buf.data();
  std::printf("# %s, %s, load %s, %s (%s), median of %d\n", bench::machine().c_str(), bench::today().c_str(),
              bench::loadavg().c_str(), work.c_str(), fs_type(work).c_str(), reps);
  std::printf("%10s %10s %9s %9s %10s %7s %11s %9s %7s\n", "elements", "MB", "save_ms", "write_ms", "raw_ms",
              "ratio", "read+load", "raw_read", "ratio");
  std::vector<figures> all;
  for (std::size_t n : {std::size_t{203530}, std::size_t{1} << 24}) {
    const figures f = measure(n, reps, work);
    all.push_back(f);
    std::printf("%10zu %10.2f %9.3f %9.3f %10.3f %7.2f %11.3f %9.3f %7.2f\n", f.elements, f.bytes / 1e6, f.save_s * 1e3,
                f.write_s * 1e3, f.raw_write_s * 1e3, f.raw_write_s / (f.save_s + f.write_s), f.read_load_s * 1e3,
                f.raw_read_s * 1e3, f.raw_read_s / f.read_load_s);
    std::fflush(stdout);
  }
  for (const auto& f : all)
    std::printf("{\"bench\":\"checkpoint\",\"machine\":\"%s\",\"date\":\"%s\",\"fs\":\"%s\",\"elements\":%zu,"
                "\"state_bytes\":%zu,\"save_s\":%.6g,\"write_s\":%.6g,\"raw_write_fsync_s\":%.6g,\"write_ratio\":%.4g,"
                "\"read_load_s\":%.6g,\"raw_read_s\":%.6g,\"read_ratio\":%.4g,\"reps\":%d}\n",
                bench::machine().c_str(), bench::today().c_str(), fs_type(work).c_str(), f.elements, f.bytes, f.save_s,
                f.write_s, f.raw_write_s, f.raw_write_s / (f.save_s + f.write_s), f.read_load_s, f.raw_read_s,
                f.raw_read_s / f.read_load_s, reps);
  ::rmdir(work.c_str());
  return 0;
}
