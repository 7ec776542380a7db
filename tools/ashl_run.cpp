// ashl-run — starts one job (S servers and M workers of a program) on this
// machine with the runtime contract set for every process (docs/design.md
// "Runtime contract for real runs"; docs/multi-host.md, "One host").
//
//   ashl-run -s 2 -w 4 -- ./train --epochs 3
//
// Every process gets ASHL_ROLE, ASHL_RANK, ASHL_NUM_WORKERS,
// ASHL_NUM_SERVERS, ASHL_SERVER_ADDR and ASHL_TOKEN (or ASHL_INSECURE=1) in
// its environment (and ASHL_MAX_WORKERS with --max-workers: the job admits
// ranks past the M it starts, started by hand or by a harness with the same
// contract and ASHL_RANK in M..K-1; docs/elastic.md §2.2), nothing on its command line; stdin is /dev/null. Without
// --addr the servers get free loopback ports (each bound on 127.0.0.1:0 and
// released just before the start: another program could take one in
// between). Without --insecure the token is ASHL_TOKEN of ashl-run's own
// environment (at least 16 bytes), or 32 random bytes from /dev/urandom in
// hex; it is never taken from the command line (--token is refused: ps(1)
// shows command lines to every user) and reaches the processes only in
// their environment (ps/launch.hpp's job_from then removes it from theirs).
// Each line a process writes to stdout or stderr goes to ashl-run's stdout or
// stderr prefixed "[server 0] " or "[worker 3] ", whole (a line longer than
// 1 MiB is cut into pieces). When a process fails (exit status != 0 or a
// signal) the others are stopped: SIGTERM to each process group, SIGKILL
// after the grace period. The exit status is 0 when all succeeded, else the
// first failure's exit status (128 + signal for a signal); 124 when --timeout
// passed; 128 + signal when ashl-run itself got SIGINT, SIGTERM or SIGHUP
// (forwarded to every process first); 2 for a usage error.
// --trace PATH (or ASHL_TRACE=PATH): every worker writes a Chrome trace
// ("PATH.worker<rank>.json", the torch adapters' timeline) and ashl-run
// merges them into PATH when the job ends, whatever its outcome
// (adapt/trace.hpp; a merge that fails turns a successful job's status to 1).
// --backups: one backup per shard (docs/elastic.md §4.6): process "backup i"
// has ASHL_ROLE=server, ASHL_RANK=i and ASHL_REPLICA=1, and listens on the
// next block of ports (server i's port + S * ports-per-server); every
// process gets ASHL_BACKUP_ADDR. A server or backup that fails then does not
// stop the job (its shard fails over); once every worker has ended, the
// server-side processes still running are stopped (a backup that was never
// promoted waits for a failover that will not come).
#include <ashl/adapt/trace.hpp>
#include <ashl/ps/launch.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

extern char** environ;

namespace {

using clock_type = std::chrono::steady_clock;
namespace ps = ashl::ps;

constexpr const char* usage_text =
    "usage: ashl-run -s S -w M [--max-workers K] [--addr HOST:PORT] [--ports-per-server K] [--backups] [--insecure]\n"
    "                [--timeout SECONDS] [--grace SECONDS] [--verbose] [--trace PATH] -- program [args...]\n"
    "  -s, --servers S    number of servers (1 .. 1024)\n"
    "  -w, --workers M    number of workers (1 .. 65536)\n"
    "  --max-workers K    the most workers the job may have (M .. 65536; 0 = M, the default):\n"
    "                     ASHL_MAX_WORKERS=K for every process, so workers of rank M..K-1 started\n"
    "                     later with the same contract join the running job (part of the job id)\n"
    "  --addr HOST:PORT   server 0's address (server i: port + i), or every server's, comma-separated;\n"
    "                     default: a block of free consecutive ports on 127.0.0.1\n"
    "  --ports-per-server K  ports reserved per server in that block (default 16): a process with\n"
    "                     several tensors (ashl.torch's buckets) puts tensor b's server i at\n"
    "                     port + b * S + i; ASHL_PORTS_PER_SERVER=K tells it the bound\n"
    "  --insecure         no token (ASHL_INSECURE=1 for every process)\n"
    "  --timeout SECONDS  stop the job and exit 124 after this long (default: none)\n"
    "  --grace SECONDS    between SIGTERM and SIGKILL when stopping (default 5)\n"
    "  --verbose          print the processes started; ASHL_VERBOSE=1 for every process\n"
    "  --trace PATH       every worker writes a Chrome trace (ASHL_TRACE); merged into PATH at the end\n"
    "                     (default: ASHL_TRACE of this environment)\n"
    "  --backups          one backup per server (ASHL_REPLICA=1) on the next block of ports;\n"
    "                     ASHL_BACKUP_ADDR for every process (docs/elastic.md §4.6)\n"
    "The token is ASHL_TOKEN of this environment (>= 16 bytes), else a random one; never a flag.\n";

struct options {
  std::uint32_t servers = 0, workers = 0;
  std::uint32_t max_workers = 0;  // 0: not said (ASHL_MAX_WORKERS not set)
  std::uint32_t ports_per_server = 16;
  bool ports_per_server_set = false;
  std::string addr;
  bool insecure = false, verbose = false, backups = false;
  double timeout = 0, grace = 5;
  std::string trace;  // absolute; empty: none
  std::vector<std::string> program;
};

int usage_error(const std::string& why) {
  std::fprintf(stderr, "ashl-run: %s\n%s", why.c_str(), usage_text);
  return 2;
}

// Parses the command line; returns 0 (ok), or the exit status after printing.
int parse(int argc, char** argv, options& o) {
  bool servers_set = false, workers_set = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      std::fputs(usage_text, stdout);
      return -1;
    }
    if (!arg.starts_with('-')) break;  // the program, without "--"
    std::string_view flag = arg, value;
    bool has_inline = false;
    if (const auto eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_inline = true;
    }
    if (flag == "--token")
      return usage_error("--token: a token on the command line is visible to every user of this host (ps); "
                         "put it in the environment variable ASHL_TOKEN instead");
    const bool is_switch = flag == "--insecure" || flag == "--verbose" || flag == "--backups";
    const bool known = is_switch || flag == "-s" || flag == "--servers" || flag == "-w" || flag == "--workers" ||
                       flag == "--addr" || flag == "--timeout" || flag == "--grace" ||
                       flag == "--ports-per-server" || flag == "--trace" || flag == "--max-workers";
    if (!known) return usage_error("unknown option '" + std::string(arg) + "'");
    if (is_switch) {
      if (has_inline) return usage_error(std::string(flag) + " takes no value");
      (flag == "--insecure" ? o.insecure : flag == "--backups" ? o.backups : o.verbose) = true;
      continue;
    }
    if (!has_inline) {
      if (i + 1 >= argc) return usage_error(std::string(flag) + ": expects a value");
      value = argv[++i];
    }
    const std::string f(flag);
    if (flag == "-s" || flag == "--servers" || flag == "-w" || flag == "--workers") {
      // The job's own bounds (rules/job_limits.hpp): job_from refuses more in
      // every process, and the process count below cannot wrap.
      const bool s = flag == "-s" || flag == "--servers";
      auto n = ps::detail::parse_count(f, value, 1, s ? ps::max_servers : ps::max_workers,
                                       s ? "ps::max_servers" : "ps::max_workers");
      if (!n) return usage_error(n.error().message());
      (flag == "-s" || flag == "--servers" ? o.servers : o.workers) = *n;
      (flag == "-s" || flag == "--servers" ? servers_set : workers_set) = true;
    } else if (flag == "--max-workers") {
      auto n = ps::detail::parse_count(f, value, 0, ps::max_workers, "ps::max_workers");
      if (!n) return usage_error(n.error().message());
      o.max_workers = *n;
    } else if (flag == "--ports-per-server") {
      auto n = ps::detail::parse_count(f, value, 1);
      if (!n) return usage_error(n.error().message());
      if (*n > 4096) return usage_error("--ports-per-server = " + std::string(value) + ": must be at most 4096");
      o.ports_per_server = *n;
      o.ports_per_server_set = true;
    } else if (flag == "--addr") {
      o.addr = std::string(value);
    } else if (flag == "--trace") {
      if (value.empty()) return usage_error("--trace: expects a file path");
      o.trace = std::string(value);
    } else {
      auto s = ps::detail::parse_seconds(f, value);
      if (!s) return usage_error(s.error().message());
      (flag == "--timeout" ? o.timeout : o.grace) = *s;
    }
  }
  if (!servers_set) return usage_error("-s (the number of servers) is required");
  if (!workers_set) return usage_error("-w (the number of workers) is required");
  // The same rule as job_from's for ASHL_MAX_WORKERS, said here before
  // anything starts rather than by every process.
  if (o.max_workers != 0 && o.max_workers < o.workers)
    return usage_error("--max-workers = '" + std::to_string(o.max_workers) +
                       "': must be 0 (the same as -w) or at least -w = " + std::to_string(o.workers));
  if ((o.backups ? 2 : 1) * std::uint64_t{o.servers} * o.ports_per_server > 16384)
    return usage_error("-s " + std::to_string(o.servers) + " x --ports-per-server " + std::to_string(o.ports_per_server) +
                       " = " + std::to_string(std::uint64_t{o.servers} * o.ports_per_server) +
                       " ports: at most 16384 can be reserved");
  if (!o.addr.empty()) {
    auto a = ps::server_addresses_from(o.addr, o.servers, "--addr", "-s");
    if (!a) return usage_error(a.error().message());
    for (std::uint32_t k = 0; o.backups && k < a->size(); ++k) {
      const auto hp = ps::parse_host_port((*a)[k], "--addr");
      if (hp && std::uint64_t{hp->port} + std::uint64_t{o.servers} * o.ports_per_server > 65535)
        return usage_error("--backups: server " + std::to_string(k) + "'s backup would listen on port " +
                           std::to_string(std::uint64_t{hp->port} + std::uint64_t{o.servers} * o.ports_per_server) +
                           " (its port + -s x --ports-per-server), above 65535");
    }
  }
  if (o.trace.empty())
    if (const char* t = std::getenv("ASHL_TRACE"); t && *t) o.trace = t;
  if (!o.trace.empty()) {
    std::error_code ec;
    const auto abs = std::filesystem::absolute(o.trace, ec);  // the processes may change directory
    if (ec) return usage_error("--trace " + o.trace + ": " + ec.message());
    o.trace = abs.string();
    if (!std::filesystem::is_directory(abs.parent_path(), ec))
      return usage_error("--trace " + o.trace + ": the directory " + abs.parent_path().string() + " does not exist");
  }
  for (; i < argc; ++i) o.program.emplace_back(argv[i]);
  if (o.program.empty()) return usage_error("no program given (expected: -- program [args...])");
  return 0;
}

// A block of n consecutive free loopback ports, all bound at once (so
// nothing else holds one of them while they are chosen), then released.
// The kernel picks a free port as the candidate base; a block with a taken
// port is tried again from another base.
bool free_port_block(std::uint32_t n, std::uint16_t& base, std::string& why) {
  auto bind_one = [](std::uint16_t port, std::uint16_t* got) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(fd);
      return -1;
    }
    if (got) *got = ntohs(a.sin_port);
    return fd;
  };
  for (int attempt = 0; attempt < 64; ++attempt) {
    std::uint16_t first = 0;
    const int fd0 = bind_one(0, &first);
    if (fd0 < 0) {
      why = std::string("cannot bind a free port on 127.0.0.1: ") + std::strerror(errno);
      return false;
    }
    std::vector<int> fds{fd0};
    bool ok = std::uint32_t{first} + n - 1 <= 65535;
    for (std::uint32_t i = 1; i < n && ok; ++i) {
      const int fd = bind_one(static_cast<std::uint16_t>(first + i), nullptr);
      if (fd < 0) ok = false;
      else fds.push_back(fd);
    }
    for (int fd : fds) ::close(fd);
    if (ok) {
      base = first;
      return true;
    }
  }
  why = "cannot find " + std::to_string(n) + " consecutive free ports on 127.0.0.1 (64 tries; lower --ports-per-server)";
  return false;
}

bool random_token(std::string& token, std::string& why) {
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  unsigned char b[32];
  std::size_t got = 0;
  while (fd >= 0 && got < sizeof b) {
    const auto r = ::read(fd, b + got, sizeof b - got);
    if (r <= 0 && errno != EINTR) break;
    if (r > 0) got += static_cast<std::size_t>(r);
  }
  if (fd >= 0) ::close(fd);
  if (got != sizeof b) {
    why = std::string("cannot read 32 random bytes from /dev/urandom: ") + std::strerror(errno);
    return false;
  }
  static constexpr char hex[] = "0123456789abcdef";
  token.clear();
  for (unsigned char c : b) {
    token += hex[c >> 4];
    token += hex[c & 15];
  }
  return true;
}

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const auto w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  // our own output is gone (EPIPE): nothing to do
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void say(const std::string& text) {
  const std::string line = "ashl-run: " + text + "\n";
  write_all(2, line.data(), line.size());
}

// One output stream of one process: a partial line waits for its end.
struct stream {
  int fd = -1;
  int out = 1;  // where its lines go
  std::string pending;

  static constexpr std::size_t max_line = std::size_t{1} << 20;

  void emit(const std::string& prefix, std::string_view line) {
    std::string s;
    s.reserve(prefix.size() + line.size() + 1);
    s += prefix;
    s += line;
    s += '\n';
    write_all(out, s.data(), s.size());
  }
  // Reads what is there; false at end of file (the stream is then closed).
  bool read_some(const std::string& prefix) {
    char buf[65536];
    const auto r = ::read(fd, buf, sizeof buf);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (r <= 0) {
      finish(prefix);
      return false;
    }
    pending.append(buf, static_cast<std::size_t>(r));
    std::size_t start = 0;
    for (std::size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1)
      emit(prefix, std::string_view(pending).substr(start, nl - start));
    pending.erase(0, start);
    while (pending.size() >= max_line) {
      emit(prefix, std::string_view(pending).substr(0, max_line));
      pending.erase(0, max_line);
    }
    return true;
  }
  void finish(const std::string& prefix) {
    if (!pending.empty()) emit(prefix, pending);  // a last line without its newline
    pending.clear();
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

struct process {
  std::string label;   // "server 0"
  std::string prefix;  // "[server 0] "
  pid_t pid = -1;
  bool running = false;
  int exit_code = 0;   // 128 + signal for a signal
  clock_type::time_point exited_at;
  stream out, err;
};

int signal_pipe[2] = {-1, -1};
void on_signal(int sig) {
  const int saved = errno;
  const unsigned char s = static_cast<unsigned char>(sig);
  (void)!::write(signal_pipe[1], &s, 1);
  errno = saved;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

std::string describe_status(int code) {
  if (code > 128) {
    const char* name = ::strsignal(code - 128);
    return "was killed by signal " + std::to_string(code - 128) + (name ? std::string(" (") + name + ")" : "");
  }
  return "exited with status " + std::to_string(code);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (const int rc = parse(argc, argv, o); rc != 0) return rc < 0 ? 0 : rc;

  std::string why;
  std::string server_addr = o.addr;
  if (server_addr.empty()) {
    // Server i listens on base + i; a process with several tensors (one
    // server per bucket, ashl.torch) puts bucket b's at base + b * S + i, so
    // the block holds ports_per_server ports per server.
    std::uint16_t base = 0;
    if (!free_port_block((o.backups ? 2 : 1) * o.servers * o.ports_per_server, base, why)) {
      say(why);
      return 1;
    }
    for (std::uint32_t i = 0; i < o.servers; ++i)
      server_addr += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(base + i);
  }
  // Each server's backup on the next block of ports (parse() checked the range).
  std::string backup_addr;
  if (o.backups) {
    const auto a = ps::server_addresses_from(server_addr, o.servers, "--addr", "-s");
    for (std::uint32_t k = 0; a && k < a->size(); ++k) {
      auto hp = ps::parse_host_port((*a)[k], "--addr");
      if (!hp) continue;
      hp->port = static_cast<std::uint16_t>(hp->port + o.servers * o.ports_per_server);
      backup_addr += (k ? "," : "") + ps::detail::join_host_port(*hp);
    }
  }
  std::string token;
  if (!o.insecure) {
    if (const char* t = std::getenv("ASHL_TOKEN"); t && *t) token = t;
    else if (!random_token(token, why)) {
      say(why);
      return 1;
    }
    if (token.size() < ps::min_token_bytes)
      return usage_error("ASHL_TOKEN is " + std::to_string(token.size()) + " bytes: a token must have at least " +
                         std::to_string(ps::min_token_bytes) + " (e.g. openssl rand -hex 16), or pass --insecure");
  }

  if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    say(std::string("pipe: ") + std::strerror(errno));
    return 1;
  }
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher mid-job

  // The environment every process shares, less the contract's variables.
  static constexpr std::string_view contract[] = {"ASHL_ROLE=",        "ASHL_RANK=",  "ASHL_NUM_WORKERS=",
                                                  "ASHL_MAX_WORKERS=", "ASHL_NUM_SERVERS=", "ASHL_SERVER_ADDR=", "ASHL_TOKEN=",
                                                  "ASHL_INSECURE=",    "ASHL_VERBOSE=", "ASHL_PORTS_PER_SERVER=",
                                                  "ASHL_TRACE=", "ASHL_BACKUP_ADDR=", "ASHL_REPLICA="};
  std::vector<std::string> base_env;
  for (char** e = environ; *e; ++e) {
    const std::string_view v = *e;
    bool ours = false;
    for (auto c : contract) ours = ours || v.starts_with(c);
    if (!ours) base_env.emplace_back(v);
  }
  base_env.push_back("ASHL_NUM_WORKERS=" + std::to_string(o.workers));
  if (o.max_workers != 0) base_env.push_back("ASHL_MAX_WORKERS=" + std::to_string(o.max_workers));
  base_env.push_back("ASHL_NUM_SERVERS=" + std::to_string(o.servers));
  base_env.push_back("ASHL_SERVER_ADDR=" + server_addr);
  if (o.backups) base_env.push_back("ASHL_BACKUP_ADDR=" + backup_addr);
  if (o.addr.empty() || o.ports_per_server_set)
    base_env.push_back("ASHL_PORTS_PER_SERVER=" + std::to_string(o.ports_per_server));
  if (o.insecure) base_env.emplace_back("ASHL_INSECURE=1");
  else base_env.push_back("ASHL_TOKEN=" + token);
  if (o.verbose) base_env.emplace_back("ASHL_VERBOSE=1");
  if (!o.trace.empty()) base_env.push_back("ASHL_TRACE=" + o.trace);

  std::vector<char*> args;
  for (auto& a : o.program) args.push_back(a.data());
  args.push_back(nullptr);

  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // Within the bounds parse() checked: no 32-bit sum wraps (4294967295
  // workers and one server once made an empty job that exited 0).
  const std::size_t server_side = std::size_t{o.servers} * (o.backups ? 2 : 1);  // servers, then their backups
  std::vector<process> procs(server_side + std::size_t{o.workers});
  if (o.verbose)
    say("starting " + std::to_string(o.servers) + " server(s) and " + std::to_string(o.workers) +
        " worker(s) of '" + o.program[0] + "'; ASHL_SERVER_ADDR=" + server_addr +
        (o.backups ? "; ASHL_BACKUP_ADDR=" + backup_addr : std::string()) +
        (o.insecure ? "; insecure (no token)" : "; token set"));
  int first_failure = 0;
  bool stopping = false, timed_out = false, killed_all = false;
  int got_signal = 0;
  clock_type::time_point kill_at;
  clock_type::time_point workers_ended_at{};  // --backups: when the last worker ended
  const auto start = clock_type::now();

  auto stop_all = [&](int sig) {
    for (auto& p : procs)
      if (p.running && ::kill(-p.pid, sig) != 0) ::kill(p.pid, sig);
    if (!stopping) {
      stopping = true;
      kill_at = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(o.grace));
    }
  };

  for (std::size_t i = 0; i < procs.size(); ++i) {
    auto& p = procs[i];
    const bool server = i < server_side, backup = server && i >= o.servers;
    const std::size_t rank = backup ? i - o.servers : server ? i : i - server_side;
    p.label = std::string(backup ? "backup " : server ? "server " : "worker ") + std::to_string(rank);
    p.prefix = "[" + p.label + "] ";
    std::vector<std::string> env = base_env;
    env.push_back(std::string("ASHL_ROLE=") + (server ? "server" : "worker"));
    env.push_back("ASHL_RANK=" + std::to_string(rank));
    if (backup) env.emplace_back("ASHL_REPLICA=1");
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      say(std::string("pipe: ") + std::strerror(errno));
      stop_all(SIGKILL);
      first_failure = 1;
      break;
    }
    std::fflush(nullptr);
    // Until the child has its default handlers back, a signal sent to it
    // must not run ashl-run's handler there (it would write to the shared
    // signal pipe): the signals stay blocked across fork until then.
    sigset_t forwarded, previous;
    sigemptyset(&forwarded);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&forwarded, sig);
    ::sigprocmask(SIG_BLOCK, &forwarded, &previous);
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(sig, SIG_DFL);
      ::sigprocmask(SIG_SETMASK, &previous, nullptr);
      ::setpgid(0, 0);  // its own group: stopping it stops what it started
      ::dup2(devnull, 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      environ = envp.data();
      ::execvp(args[0], args.data());
      const std::string msg = "ashl-run: cannot run '" + o.program[0] + "': " + std::strerror(errno) + "\n";
      write_all(2, msg.data(), msg.size());
      ::_exit(127);
    }
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    ::close(out[1]);
    ::close(err[1]);
    if (pid < 0) {
      say(std::string("fork: ") + std::strerror(errno));
      ::close(out[0]);
      ::close(err[0]);
      stop_all(SIGKILL);
      first_failure = 1;
      break;
    }
    ::setpgid(pid, pid);
    p.pid = pid;
    p.running = true;
    p.out = {out[0], 1, {}};
    p.err = {err[0], 2, {}};
    if (o.verbose) say(p.label + ": pid " + std::to_string(pid));
  }

  std::vector<pollfd> fds;
  std::vector<stream*> streams;
  for (;;) {
    bool any_running = false, any_open = false;
    for (auto& p : procs) {
      any_running = any_running || p.running;
      any_open = any_open || p.out.fd >= 0 || p.err.fd >= 0;
    }
    if (!any_running && !any_open) break;

    fds.clear();
    streams.clear();
    fds.push_back({signal_pipe[0], POLLIN, 0});
    streams.push_back(nullptr);
    for (auto& p : procs)
      for (stream* s : {&p.out, &p.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
    // Short waits: exits are found by waitpid between polls.
    const int n = ::poll(fds.data(), fds.size(), 50);
    if (n < 0 && errno != EINTR) {
      say(std::string("poll: ") + std::strerror(errno));
      stop_all(SIGKILL);
      break;
    }
    for (std::size_t k = 0; n > 0 && k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      if (k == 0) {
        unsigned char sig = 0;
        while (::read(signal_pipe[0], &sig, 1) == 1) {
          if (!got_signal) {
            got_signal = sig;
            say("got signal " + std::to_string(sig) + " (" + ::strsignal(sig) + "); forwarding it to every process");
          }
          for (auto& p : procs)
            if (p.running && ::kill(-p.pid, sig) != 0) ::kill(p.pid, sig);
          if (!stopping) {
            stopping = true;
            kill_at = clock_type::now() +
                      std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(o.grace));
          }
        }
        continue;
      }
      for (auto& p : procs)
        if (streams[k] == &p.out || streams[k] == &p.err) streams[k]->read_some(p.prefix);
    }

    const auto now = clock_type::now();
    for (auto& p : procs) {
      if (p.running) {
        int st = 0;
        const pid_t r = ::waitpid(p.pid, &st, WNOHANG);
        if (r == p.pid) {
          p.running = false;
          p.exited_at = now;
          p.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          const bool server_side_process = static_cast<std::size_t>(&p - procs.data()) < server_side;
          if (p.exit_code != 0 && !stopping && o.backups && server_side_process) {
            say(p.label + " " + describe_status(p.exit_code) + "; its shard has a backup: the job goes on");
          } else if (p.exit_code != 0 && !stopping) {
            first_failure = p.exit_code;
            say(p.label + " " + describe_status(p.exit_code) + "; stopping the others");
            stop_all(SIGTERM);
          } else if (o.verbose) {
            say(p.label + " " + describe_status(p.exit_code));
          }
        }
      } else if ((p.out.fd >= 0 || p.err.fd >= 0) && now - p.exited_at > std::chrono::seconds(1)) {
        // Something it started still holds its output open: stop waiting for it.
        ::kill(-p.pid, SIGKILL);
        p.out.finish(p.prefix);
        p.err.finish(p.prefix);
      }
    }
    if (o.backups && !stopping && workers_ended_at == clock_type::time_point{} &&
        std::none_of(procs.begin() + static_cast<std::ptrdiff_t>(server_side), procs.end(),
                     [](const process& q) { return q.running; }))
      workers_ended_at = now;
    if (o.backups && !stopping && workers_ended_at != clock_type::time_point{} &&
        now - workers_ended_at > std::chrono::duration<double>(o.grace) &&
        std::any_of(procs.begin(), procs.begin() + static_cast<std::ptrdiff_t>(server_side),
                    [](const process& q) { return q.running; })) {
      say("every worker ended " + seconds_text(o.grace) + " s ago; stopping the servers and backups still running");
      stop_all(SIGTERM);
    }
    if (o.timeout > 0 && !timed_out && now - start > std::chrono::duration<double>(o.timeout)) {
      timed_out = true;
      say("the job ran past --timeout " + seconds_text(o.timeout) + " s; stopping every process");
      stop_all(SIGTERM);
    }
    if (stopping && !killed_all && now > kill_at) {
      killed_all = true;
      for (auto& p : procs)
        if (p.running) say(p.label + " did not stop within the grace period; sending SIGKILL");
      stop_all(SIGKILL);
    }
  }

  int code = timed_out ? 124 : got_signal ? 128 + got_signal : first_failure;
  if (!o.trace.empty()) {
    const auto merged = ashl::adapt::merge_traces(o.trace);
    if (!merged) {
      say("the trace was not merged: " + merged.error().message());
      if (code == 0) code = 1;
    } else if (*merged == 0) {
      say("--trace " + o.trace + ": no process wrote a trace (" + o.trace + ".<role><rank>.json)");
    } else if (o.verbose) {
      say("merged " + std::to_string(*merged) + " trace files into " + o.trace);
    }
  }
  return code;
}
