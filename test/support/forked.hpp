// test/support/forked.hpp — child processes for the multi-process tests that
// fork their peers (transport/ucx, ps/liveness, ps/limits): forked before the
// parent has any UCX object, talking to it in lines over a pipe, always
// reaped with a bound.
//
//   ashl_test::child c = ashl_test::spawn([](int fd) { ashl_test::say(fd, "ready"); return 0; });
//   auto line = c.read_line(5s);   // "ready", or nullopt after 5 s
//   int code = c.finish(10s);      // its exit code; -2: killed after 10 s
#pragma once

#include "process.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

namespace ashl_test {

struct child {
  pid_t pid = -1;
  int from_child = -1;  // the child's lines (its address, then results)

  // Reads one line from the child, waiting at most `limit`.
  std::optional<std::string> read_line(std::chrono::milliseconds limit) {
    std::string line;
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      pollfd pfd{from_child, POLLIN, 0};
      if (::poll(&pfd, 1, 50) <= 0) continue;
      char c = 0;
      if (::read(from_child, &c, 1) != 1) return std::nullopt;
      if (c == '\n') return line;
      line += c;
    }
    return std::nullopt;
  }

  // Waits for the exit status; kills the child after `limit`. Returns its
  // exit code, -1 when there is no child, -2 when it was killed, -3 when a
  // signal ended it.
  int finish(std::chrono::milliseconds limit) {
    if (pid < 0) return -1;
    const auto until = std::chrono::steady_clock::now() + limit;
    int st = 0;
    while (::waitpid(pid, &st, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() >= until) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &st, 0);
        pid = -1;
        return -2;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -3;
  }

  child() = default;
  child(child&& o) noexcept : pid(o.pid), from_child(o.from_child) {
    o.pid = -1;
    o.from_child = -1;
  }
  child& operator=(child&& o) noexcept {
    if (this != &o) {
      reap();
      pid = o.pid;
      from_child = o.from_child;
      o.pid = -1;
      o.from_child = -1;
    }
    return *this;
  }
  ~child() { reap(); }

 private:
  // A child still running (or stopped: SIGCONT first) is killed and reaped.
  void reap() {
    if (pid > 0) {
      ::kill(pid, SIGCONT);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
    if (from_child >= 0) {
      ::close(from_child);
      from_child = -1;
    }
  }
};

// One line to the parent.
inline void say(int fd, const std::string& line) {
  const std::string s = line + "\n";
  (void)!::write(fd, s.data(), s.size());
}

// Forks; the child runs body(fd), fd its end of the pipe, and exits with what
// body returns.
template <class F>
child spawn(F body) {
  int fds[2];
  if (::pipe(fds) != 0) std::abort();
  child c;
  std::fflush(nullptr);
  c.pid = ::fork();
  if (c.pid == 0) {
    ::close(fds[0]);
    const int code = body(fds[1]);
    ::close(fds[1]);
    std::fflush(nullptr);
    ::_exit(code);
  }
  ::close(fds[1]);
  c.from_child = fds[0];
  return c;
}

// free_port(): test/support/process.hpp's.
using process::free_port;

}  // namespace ashl_test
