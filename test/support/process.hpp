// test/support/process.hpp — runs a program as a real process for the
// multi-process tests: argv, extra environment, a bound on its run time
// (killed with its process group past it), output to a log file.
//
//   auto r = process::run({ASHL_RUN_PATH, "-s", "1", "-w", "4", "--", node, ...},
//                         {{"UCX_TLS", "tcp"}}, 60s, dir + "/log.txt");
//   BOOST_TEST(r.exit_code == 0, r.log());
#pragma once

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace process {

struct outcome {
  int exit_code = -1;     // 128 + signal when killed; 124 when it ran past its bound
  bool timed_out = false;
  std::string log_path;
  [[nodiscard]] std::string log() const {
    std::ifstream f(log_path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
};

// Starts argv[0] with `env` added; returns its pid (or -1). Output goes to
// log_path. The child leads its own process group, so a kill reaches
// everything it started.
inline pid_t start(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env,
                   const std::string& log_path) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::setpgid(0, 0);
  const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(fd);
  }
  for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  std::perror("execv");
  ::_exit(127);
}

// Waits for pid until `bound`; past it, kills its process group.
inline outcome finish(pid_t pid, std::chrono::milliseconds bound, std::string log_path) {
  outcome o;
  o.log_path = std::move(log_path);
  if (pid < 0) return o;
  const auto end = std::chrono::steady_clock::now() + bound;
  int st = 0;
  while (true) {
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() >= end) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      o.timed_out = true;
      o.exit_code = 124;
      return o;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  o.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return o;
}

inline outcome run(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env,
                   std::chrono::milliseconds bound, const std::string& log_path) {
  return finish(start(argv, env, log_path), bound, log_path);
}

// Waits until `text` appears in the log at log_path, for at most `bound`;
// false if it did not, or if the process exited first (it is not reaped:
// finish() still reads its status).
inline bool wait_for_text(pid_t pid, const std::string& log_path, const std::string& text,
                          std::chrono::milliseconds bound) {
  const auto end = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < end) {
    outcome o;
    o.log_path = log_path;
    if (o.log().find(text) != std::string::npos) return true;
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// A loopback TCP port that was free a moment ago (another process may take
// it before it is bound: callers retry with another one when a server says
// its port is in use).
inline int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t n = sizeof a;
  int port = -1;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &n) == 0)
    port = ntohs(a.sin_port);
  ::close(s);
  return port;
}

// A fresh directory under TMPDIR (or /tmp).
inline std::string temp_dir(const std::string& stem) {
  const char* t = std::getenv("TMPDIR");
  std::string tmpl = std::string(t && *t ? t : "/tmp") + "/" + stem + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const char* d = ::mkdtemp(buf.data());
  return d ? std::string(d) : std::string();
}

}  // namespace process
