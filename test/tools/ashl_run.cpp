// Runs the ashl-run executable (ASHL_RUN_PATH, set by test/CMakeLists.txt) as
// a real process over /bin/sh programs and checks what it does: the runtime
// contract seen by each process, prefixed whole lines, stopping the job when
// one process fails, exit statuses, timeout, signal forwarding, usage errors.
#include <ashl/ps/launch.hpp>

#include "../support/process.hpp"

#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#ifndef ASHL_RUN_PATH

BOOST_AUTO_TEST_CASE(skipped_without_ashl_run) {
  std::printf("skipped: ashl-run is not built (ASHL_BUILD_TOOLS=OFF)\n");
  std::fflush(stdout);
  std::_Exit(77);
}

#else

namespace {

// ashl-run started with `args`; its stdout and stderr are collected.
struct launched {
  pid_t pid = -1;
  int out = -1, err = -1;
  std::string out_text, err_text;

  explicit launched(std::vector<std::string> args) {
    args.insert(args.begin(), ASHL_RUN_PATH);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int o[2], e[2];
    BOOST_REQUIRE(::pipe2(o, O_CLOEXEC) == 0 && ::pipe2(e, O_CLOEXEC) == 0);
    pid = ::fork();
    BOOST_REQUIRE(pid >= 0);
    if (pid == 0) {
      ::dup2(o[1], 1);
      ::dup2(e[1], 2);
      ::execv(argv[0], argv.data());
      ::_exit(126);
    }
    ::close(o[1]);
    ::close(e[1]);
    out = o[0];
    err = e[0];
  }

  // Reads until `done(stdout so far)` or both streams end.
  template <class F>
  void read_until(F done) {
    while ((out >= 0 || err >= 0) && !done(out_text)) {
      pollfd fds[2] = {{out, POLLIN, 0}, {err, POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) break;
      for (int k = 0; k < 2; ++k) {
        if (fds[k].fd < 0 || !(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[4096];
        const auto r = ::read(fds[k].fd, buf, sizeof buf);
        if (r <= 0) {
          ::close(fds[k].fd);
          (k == 0 ? out : err) = -1;
        } else {
          (k == 0 ? out_text : err_text).append(buf, static_cast<std::size_t>(r));
        }
      }
    }
  }

  int finish() {
    read_until([](const std::string&) { return false; });
    int st = 0;
    ::waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
};

struct outcome {
  int code;
  std::string out, err;
};

outcome run(std::vector<std::string> args) {
  launched l(std::move(args));
  const int code = l.finish();
  return {code, l.out_text, l.err_text};
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A directory of its own (process::temp_dir), removed with everything in it
// when the test ends.
struct scratch_dir {
  std::string path = process::temp_dir("ashl-run-test");
  scratch_dir() { BOOST_REQUIRE(!path.empty()); }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
};

// Shell text that marks this process ready in `dir` (after it has set its
// SIGTERM disposition) and text that waits, at most 20 s, until `n` processes
// have; so that a process meant to fail fails only once the others can
// receive the SIGTERM the way the test means them to. Without it a slow
// machine (ASan, two cores) may deliver the SIGTERM before `trap` has run.
std::string mark_ready(const scratch_dir& dir) { return "touch '" + dir.path + "/'$ASHL_ROLE$ASHL_RANK; "; }
std::string wait_until_ready(const scratch_dir& dir, int n) {
  return "i=0; while [ $(ls '" + dir.path + "' | wc -l) -lt " + std::to_string(n) +
         " ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done; ";
}

struct clean_environment {
  clean_environment() {
    for (const char* n : {"ASHL_ROLE", "ASHL_RANK", "ASHL_NUM_WORKERS", "ASHL_NUM_SERVERS", "ASHL_SERVER_ADDR",
                          "ASHL_TOKEN", "ASHL_INSECURE", "ASHL_VERBOSE", "ASHL_PORTS_PER_SERVER", "ASHL_TRACE", "ASHL_MAX_WORKERS"})
      ::unsetenv(n);
  }
};
BOOST_TEST_GLOBAL_FIXTURE(clean_environment);

}  // namespace

BOOST_AUTO_TEST_CASE(every_process_sees_the_contract_and_the_token_is_not_on_a_command_line) {
  // Each process prints its contract and then its own and ashl-run's command
  // lines (NUL bytes as spaces).
  const std::string script =
      "echo \"env $ASHL_ROLE $ASHL_RANK $ASHL_NUM_SERVERS $ASHL_NUM_WORKERS $ASHL_SERVER_ADDR $ASHL_TOKEN "
      "${ASHL_INSECURE:-0}\"; "
      "echo \"cmd $(tr '\\0' ' ' < /proc/$$/cmdline) $(tr '\\0' ' ' < /proc/$PPID/cmdline)\"";
  auto r = run({"-s", "2", "-w", "3", "--", "/bin/sh", "-c", script});
  BOOST_TEST(r.code == 0);
  const std::regex env_line(R"(\[(server|worker) (\d)\] env (server|worker) (\d) 2 3 (\S+) ([0-9a-f]{64}) 0)");
  std::map<std::string, int> seen;
  std::string addr, token;
  for (const auto& line : lines_of(r.out)) {
    std::smatch m;
    if (!std::regex_match(line, m, env_line)) continue;
    BOOST_TEST(m[1].str() == m[3].str());  // the prefix names the process's own role and rank
    BOOST_TEST(m[2].str() == m[4].str());
    ++seen[m[1].str() + m[2].str()];
    if (addr.empty()) addr = m[5], token = m[6];
    BOOST_TEST(m[5].str() == addr);  // one job: the same addresses and token everywhere
    BOOST_TEST(m[6].str() == token);
  }
  BOOST_TEST((seen == std::map<std::string, int>{
                          {"server0", 1}, {"server1", 1}, {"worker0", 1}, {"worker1", 1}, {"worker2", 1}}));
  auto addrs = ashl::ps::server_addresses_from(addr, 2, "ASHL_SERVER_ADDR");
  BOOST_REQUIRE(addrs);
  BOOST_TEST((*addrs)[0].starts_with("127.0.0.1:"));
  BOOST_TEST((*addrs)[0] != (*addrs)[1]);
  int cmd_lines = 0;
  for (const auto& line : lines_of(r.out))
    if (line.find("] cmd ") != std::string::npos) {
      ++cmd_lines;
      BOOST_TEST(line.find(ASHL_RUN_PATH) != std::string::npos);  // really ashl-run's command line
      BOOST_TEST(line.find(token) == std::string::npos);
    }
  BOOST_TEST(cmd_lines == 5);

  // A token from ashl-run's environment; an explicit address; insecure.
  ::setenv("ASHL_TOKEN", "from-the-environment", 1);
  r = run({"-s", "2", "-w", "1", "--addr", "127.0.0.1:7000", "--", "/bin/sh", "-c",
           "echo \"$ASHL_TOKEN $ASHL_SERVER_ADDR ${ASHL_INSECURE:-0}\""});
  ::unsetenv("ASHL_TOKEN");
  BOOST_TEST(r.code == 0);
  BOOST_TEST(lines_of(r.out).size() == 3u);
  for (const auto& line : lines_of(r.out))
    BOOST_TEST(line.ends_with("] from-the-environment 127.0.0.1:7000 0"));
  r = run({"-s", "1", "-w", "1", "--insecure", "--", "/bin/sh", "-c",
           "echo \"token=${ASHL_TOKEN-unset} insecure=$ASHL_INSECURE\""});
  BOOST_TEST(r.code == 0);
  for (const auto& line : lines_of(r.out)) BOOST_TEST(line.ends_with("] token=unset insecure=1"));
}

BOOST_AUTO_TEST_CASE(output_is_prefixed_and_lines_stay_whole) {
  // Every line is written in three pieces, on stdout and stderr, by four
  // processes at once; the last line has no newline.
  const std::string script =
      "i=0; while [ $i -lt 200 ]; do printf 'line-%s-' $i; printf 'middle-%s-' $i; printf 'end-%s\\n' $i; "
      "printf 'err-%s-' $i >&2; printf 'end-%s\\n' $i >&2; i=$((i+1)); done; printf 'last'";
  auto r = run({"-s", "1", "-w", "3", "--", "/bin/sh", "-c", script});
  BOOST_TEST(r.code == 0);
  const std::regex out_line(R"(\[(server 0|worker [012])\] line-(\d+)-middle-(\d+)-end-(\d+))");
  const std::regex err_line(R"(\[(server 0|worker [012])\] err-(\d+)-end-(\d+))");
  std::map<std::string, int> next_out, next_err, last;
  for (const auto& line : lines_of(r.out)) {
    std::smatch m;
    if (std::regex_match(line, m, out_line)) {
      const int i = std::stoi(m[2]);
      BOOST_TEST(i == next_out[m[1]]++);
      BOOST_TEST(std::stoi(m[3]) == i);
      BOOST_TEST(std::stoi(m[4]) == i);
    } else if (line.ends_with("] last")) {
      ++last[line.substr(0, line.size() - 5)];
    } else {
      BOOST_ERROR("unexpected stdout line: " << line);
    }
  }
  for (const auto& line : lines_of(r.err)) {
    std::smatch m;
    if (std::regex_match(line, m, err_line)) {
      const int i = std::stoi(m[2]);
      BOOST_TEST(i == next_err[m[1]]++);
      BOOST_TEST(std::stoi(m[3]) == i);
    } else {
      BOOST_ERROR("unexpected stderr line: " << line);
    }
  }
  for (const char* p : {"server 0", "worker 0", "worker 1", "worker 2"}) {
    BOOST_TEST(next_out[p] == 200);
    BOOST_TEST(next_err[p] == 200);
    BOOST_TEST(last[std::string("[") + p + "]"] == 1);
  }
}

BOOST_AUTO_TEST_CASE(one_failure_stops_the_others_with_its_status) {
  // worker 1 fails; the others wait for a SIGTERM, report it and exit 0.
  const scratch_dir first;
  const std::string script = "if [ $ASHL_ROLE = worker ] && [ $ASHL_RANK = 1 ]; then " +
                             wait_until_ready(first, 4) + "exit 3; fi; trap 'echo stopped; exit 0' TERM; " +
                             mark_ready(first) + "sleep 60 & wait";
  auto r = run({"-s", "2", "-w", "3", "--", "/bin/sh", "-c", script});
  BOOST_TEST(r.code == 3);
  BOOST_TEST(r.err.find("ashl-run: worker 1 exited with status 3; stopping the others") != std::string::npos);
  for (const char* p : {"[server 0] stopped", "[server 1] stopped", "[worker 0] stopped", "[worker 2] stopped"})
    BOOST_TEST(r.out.find(p) != std::string::npos, p);

  // A process that ignores SIGTERM gets SIGKILL after the grace period; the
  // first failure's status stands.
  const scratch_dir second;
  r = run({"-s", "1", "-w", "2", "--grace", "0.3", "--", "/bin/sh", "-c",
           "if [ $ASHL_ROLE = worker ] && [ $ASHL_RANK = 0 ]; then " + wait_until_ready(second, 2) +
               "exit 5; fi; trap '' TERM; " + mark_ready(second) + "sleep 60"});
  BOOST_TEST(r.code == 5, r.err);
  BOOST_TEST(r.err.find("did not stop within the grace period; sending SIGKILL") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_signal_killed_process_gives_128_plus_the_signal) {
  auto r = run({"-s", "1", "-w", "3", "--", "/bin/sh", "-c",
                "if [ $ASHL_ROLE = worker ] && [ $ASHL_RANK = 2 ]; then kill -9 $$; fi; sleep 60 & wait"});
  BOOST_TEST(r.code == 128 + 9);
  BOOST_TEST(r.err.find("ashl-run: worker 2 was killed by signal 9") != std::string::npos);
  // All succeed: 0. A program that cannot be run: 127, said by its process.
  BOOST_TEST(run({"-s", "1", "-w", "1", "--", "/bin/sh", "-c", "exit 0"}).code == 0);
  r = run({"-s", "1", "-w", "1", "--", "/nonexistent/program"});
  BOOST_TEST(r.code == 127);
  BOOST_TEST(r.out.empty());
  BOOST_TEST(r.err.find("[server 0] ashl-run: cannot run '/nonexistent/program'") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(timeout_stops_the_job_with_124) {
  auto r = run({"-s", "1", "-w", "2", "--timeout", "0.5", "--", "/bin/sh", "-c", "sleep 60 & wait"});
  BOOST_TEST(r.code == 124);
  BOOST_TEST(r.err.find("ashl-run: the job ran past --timeout 0.5 s; stopping every process") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(sigterm_is_forwarded_to_every_process) {
  launched l({"-s", "1", "-w", "2", "--", "/bin/sh", "-c",
              "trap 'echo got-term; exit 0' TERM; echo ready; sleep 60 & wait"});
  l.read_until([](const std::string& out) {
    std::size_t n = 0;
    for (auto p = out.find("] ready"); p != std::string::npos; p = out.find("] ready", p + 1)) ++n;
    return n == 3;
  });
  ::kill(l.pid, SIGTERM);
  const int code = l.finish();
  BOOST_TEST(code == 128 + SIGTERM);
  for (const char* p : {"[server 0] got-term", "[worker 0] got-term", "[worker 1] got-term"})
    BOOST_TEST(l.out_text.find(p) != std::string::npos, p);
  BOOST_TEST(l.err_text.find("forwarding it to every process") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(usage_errors_name_the_flag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"-w", "1", "--", "true"}, "ashl-run: -s (the number of servers) is required"},
      {{"-s", "1", "--", "true"}, "ashl-run: -w (the number of workers) is required"},
      {{"-s", "0", "-w", "1", "--", "true"}, "ashl-run: -s = '0': must be >= 1"},
      {{"-s", "1", "-w", "x", "--", "true"}, "ashl-run: -w = 'x': expected a non-negative integer"},
      {{"-s", "2", "-w", "1", "--addr", "x", "--", "true"}, "ashl-run: --addr = 'x': expected host:port"},
      {{"-s", "2", "-w", "1", "--addr", "a:1,b:2,c:3", "--", "true"},
       "ashl-run: --addr = 'a:1,b:2,c:3': lists 3 addresses, expected one per server (-s = 2)"},
      // Issue 24, item 9: never a token on a command line (ps(1) shows it).
      {{"-s", "1", "-w", "1", "--token", "0123456789abcdef0123", "--", "true"},
       "ashl-run: --token: a token on the command line is visible to every user of this host (ps); put it in "
       "the environment variable ASHL_TOKEN instead"},
      {{"-s", "1", "-w", "1", "--token=0123456789abcdef0123", "--insecure", "--", "true"},
       "ashl-run: --token: a token on the command line is visible to every user of this host (ps); put it in "
       "the environment variable ASHL_TOKEN instead"},
      {{"-s", "1", "-w", "1", "--timeout", "soon", "--", "true"},
       "ashl-run: --timeout = 'soon': expected a number of seconds >= 0"},
      {{"-s", "1", "-w", "1", "--bogus", "--", "true"}, "ashl-run: unknown option '--bogus'"},
      // Issue 44, item 6: 1 + 4294967295 processes wrapped to none, and the
      // job "succeeded" with exit status 0; 2 + 4294967295 started server 0 only.
      {{"-s", "1", "-w", "4294967295", "--", "true"},
       "ashl-run: -w = '4294967295': must be at most 65536 (ps::max_workers)"},
      {{"-s", "2", "-w", "4294967295", "--", "true"},
       "ashl-run: -w = '4294967295': must be at most 65536 (ps::max_workers)"},
      {{"-s", "1", "-w", "18446744073709551617", "--", "true"},
       "ashl-run: -w = '18446744073709551617': must be at most 65536 (ps::max_workers)"},
      {{"-s", "1025", "-w", "1", "--", "true"}, "ashl-run: -s = '1025': must be at most 1024 (ps::max_servers)"},
      // docs/elastic.md §2.1: the maximum is at least the workers and at most ps::max_workers.
      {{"-s", "1", "-w", "3", "--max-workers", "2", "--", "true"},
       "ashl-run: --max-workers = '2': must be 0 (the same as -w) or at least -w = 3"},
      {{"-s", "1", "-w", "1", "--max-workers=65537", "--", "true"},
       "ashl-run: --max-workers = '65537': must be at most 65536 (ps::max_workers)"},
      {{"-s", "1", "-w", "1", "--max-workers", "some", "--", "true"},
       "ashl-run: --max-workers = 'some': expected a non-negative integer"},
      {{"-s", "1", "-w", "1", "--timeout", "1e300", "--", "true"},
       "ashl-run: --timeout = '1e300': must be at most 1000000000 seconds (ps::max_duration_seconds)"},
      {{"-s", "1", "-w", "1", "--grace", "inf", "--", "true"},
       "ashl-run: --grace = 'inf': expected a number of seconds >= 0"},
      {{"-s", "1", "-w", "1", "--timeout"}, "ashl-run: --timeout: expects a value"},
      {{"-s", "1", "-w", "1", "--"}, "ashl-run: no program given (expected: -- program [args...])"},
  };
  for (const auto& [args, message] : cases) {
    auto r = run(args);
    BOOST_TEST(r.code == 2);
    BOOST_TEST(r.err.starts_with(message + "\nusage: ashl-run"), r.err);
  }
  BOOST_TEST(run({"--help"}).code == 0);

  // A short ASHL_TOKEN is refused before anything starts, by its length
  // (never the token); with --insecure it is not used at all.
  ::setenv("ASHL_TOKEN", "short-secret", 1);
  auto r = run({"-s", "1", "-w", "1", "--", "true"});
  BOOST_TEST(r.code == 2);
  BOOST_TEST(r.err.starts_with("ashl-run: ASHL_TOKEN is 12 bytes: a token must have at least 16 (e.g. openssl "
                               "rand -hex 16), or pass --insecure\nusage: ashl-run"),
             r.err);
  BOOST_TEST(r.err.find("short-secret") == std::string::npos);
  BOOST_TEST(run({"-s", "1", "-w", "1", "--insecure", "--", "true"}).code == 0);
  ::unsetenv("ASHL_TOKEN");
}

// --trace (docs/torch.md "Timeline"): every worker gets ASHL_TRACE (absolute) and
// writes "<trace>.worker<rank>.json"; ashl-run merges them when the job ends
// (adapt::merge_traces), and a file that is not a trace is named and turns
// the job's 0 into 1.
BOOST_AUTO_TEST_CASE(trace_files_of_every_worker_are_merged_when_the_job_ends) {
  scratch_dir d;
  const auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  const std::string write_trace =
      R"([ "$ASHL_ROLE" = worker ] || exit 0; case "$ASHL_TRACE" in /*) ;; *) exit 3;; esac; )"
      R"(printf '{"traceEvents": [{"name": "compute", "ph": "X", "ts": 1, "dur": 2, "pid": %s, "tid": 1}], )"
      R"("displayTimeUnit": "ms"}' "$ASHL_RANK" > "$ASHL_TRACE.worker$ASHL_RANK.json")";
  auto r = run({"-s", "1", "-w", "3", "--insecure", "--trace", d.path + "/run.json", "--", "/bin/sh", "-c",
                write_trace});
  BOOST_TEST(r.code == 0, r.err);
  auto merged = read(d.path + "/run.json");
  for (const char* pid : {"\"pid\": 0", "\"pid\": 1", "\"pid\": 2"}) BOOST_TEST(merged.find(pid) != std::string::npos);
  BOOST_TEST(merged.starts_with("{\"traceEvents\": [{\"name\": \"compute\""), merged);

  // ASHL_TRACE of ashl-run's environment, a relative path: the processes get it absolute.
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(d.path);
  ::setenv("ASHL_TRACE", "env.json", 1);
  r = run({"-s", "1", "-w", "2", "--insecure", "--", "/bin/sh", "-c", write_trace});
  ::unsetenv("ASHL_TRACE");
  std::filesystem::current_path(cwd);
  BOOST_TEST(r.code == 0, r.err);
  BOOST_TEST(read(d.path + "/env.json").find("\"pid\": 1") != std::string::npos);

  // A worker's file that is not a trace: named; the job succeeded, so 1.
  r = run({"-s", "1", "-w", "1", "--insecure", "--trace", d.path + "/bad.json", "--", "/bin/sh", "-c",
           R"(echo '{"traceEvents": [' > "$ASHL_TRACE.worker$ASHL_RANK.json")"});
  BOOST_TEST(r.code == 1);
  BOOST_TEST(r.err.find("the trace was not merged") != std::string::npos, r.err);
  BOOST_TEST(r.err.find("bad.json.worker0.json") != std::string::npos, r.err);
  // No process wrote one: said, and the job's status stands.
  r = run({"-s", "1", "-w", "1", "--insecure", "--trace", d.path + "/none.json", "--", "true"});
  BOOST_TEST(r.code == 0);
  BOOST_TEST(r.err.find("no process wrote a trace") != std::string::npos, r.err);
  // A trace in a directory that does not exist: a usage error before anything starts.
  r = run({"-s", "1", "-w", "1", "--trace", d.path + "/missing/run.json", "--", "true"});
  BOOST_TEST(r.code == 2);
  BOOST_TEST(r.err.find("does not exist") != std::string::npos, r.err);
}

BOOST_AUTO_TEST_CASE(servers_get_a_block_of_consecutive_ports_for_their_buckets) {
  // Server i on base + i; the block holds --ports-per-server ports per
  // server (ashl.torch's bucket b of server i: base + b * S + i), and every
  // process is told its size.
  auto r = run({"-s", "3", "-w", "1", "--ports-per-server", "5", "--insecure", "--", "/bin/sh", "-c",
                "echo \"$ASHL_SERVER_ADDR $ASHL_PORTS_PER_SERVER\""});
  BOOST_TEST(r.code == 0);
  const auto lines = lines_of(r.out);
  BOOST_TEST(lines.size() == 4u);
  const std::regex line(R"(\[(server|worker) \d\] 127\.0\.0\.1:(\d+),127\.0\.0\.1:(\d+),127\.0\.0\.1:(\d+) 5)");
  for (const auto& l : lines) {
    std::smatch m;
    BOOST_TEST_REQUIRE(std::regex_match(l, m, line), l);
    const int base = std::stoi(m[2]);
    BOOST_TEST(std::stoi(m[3]) == base + 1);
    BOOST_TEST(std::stoi(m[4]) == base + 2);
    BOOST_TEST(base + 3 * 5 - 1 <= 65535);
  }
  // The default is 16 per server; with an explicit --addr nothing is
  // reserved and nothing is said unless the flag is given.
  r = run({"-s", "1", "-w", "1", "--insecure", "--", "/bin/sh", "-c", "echo \"n=$ASHL_PORTS_PER_SERVER\""});
  for (const auto& l : lines_of(r.out)) BOOST_TEST(l.ends_with("] n=16"), l);
  r = run({"-s", "1", "-w", "1", "--insecure", "--addr", "127.0.0.1:7000", "--", "/bin/sh", "-c",
           "echo \"n=${ASHL_PORTS_PER_SERVER-unset}\""});
  for (const auto& l : lines_of(r.out)) BOOST_TEST(l.ends_with("] n=unset"), l);
  // Bad values are named.
  r = run({"-s", "1", "-w", "1", "--ports-per-server", "0", "--", "true"});
  BOOST_TEST(r.code == 2);
  BOOST_TEST(r.err.starts_with("ashl-run: --ports-per-server = '0': must be >= 1"), r.err);
  r = run({"-s", "8", "-w", "1", "--ports-per-server", "4096", "--", "true"});
  BOOST_TEST(r.code == 2);
  BOOST_TEST(r.err.starts_with("ashl-run: -s 8 x --ports-per-server 4096 = 32768 ports: at most 16384 can be reserved"),
             r.err);
}

#endif

// docs/elastic.md §2.2 (E2b): --max-workers K reaches every process as
// ASHL_MAX_WORKERS (the job admits ranks up to K - 1, started later with the
// same contract); without it the variable is unset, even when ashl-run's
// own environment had one (it would change the job id).
BOOST_AUTO_TEST_CASE(max_workers_reaches_every_process_and_only_when_given) {
  const std::vector<std::string> script = {"/bin/sh", "-c", "echo \"max=${ASHL_MAX_WORKERS-unset}\""};
  auto with = [&](std::vector<std::string> args) {
    args.push_back("--");
    args.insert(args.end(), script.begin(), script.end());
    return run(args);
  };
  auto r = with({"-s", "1", "-w", "2", "--insecure", "--max-workers", "5"});
  BOOST_TEST(r.code == 0, r.err);
  BOOST_TEST(lines_of(r.out).size() == 3u);
  for (const auto& line : lines_of(r.out)) BOOST_TEST(line.ends_with("] max=5"), line);
  ::setenv("ASHL_MAX_WORKERS", "9", 1);
  r = with({"-s", "1", "-w", "2", "--insecure"});
  ::unsetenv("ASHL_MAX_WORKERS");
  BOOST_TEST(r.code == 0, r.err);
  BOOST_TEST(lines_of(r.out).size() == 3u);
  for (const auto& line : lines_of(r.out)) BOOST_TEST(line.ends_with("] max=unset"), line);
  r = with({"-s", "1", "-w", "2", "--insecure", "--max-workers=0"});
  for (const auto& line : lines_of(r.out)) BOOST_TEST(line.ends_with("] max=unset"), line);
  const auto help = run({"--help"});
  BOOST_TEST(help.code == 0);
  BOOST_TEST(help.out.find("--max-workers K") != std::string::npos, help.out);
}

// docs/elastic.md §4.6 (E11): --backups starts one backup per server (the
// server's rank, ASHL_REPLICA=1) on the next block of ports, and every
// process gets ASHL_BACKUP_ADDR; a server-side process that fails does not
// stop the job (its shard fails over).
BOOST_AUTO_TEST_CASE(backups_start_one_per_server_on_the_next_block_and_every_process_knows_them) {
  auto r = run({"-s", "2", "-w", "1", "--ports-per-server", "4", "--backups", "--insecure", "--", "/bin/sh", "-c",
                "echo \"$ASHL_ROLE $ASHL_RANK ${ASHL_REPLICA-0} $ASHL_SERVER_ADDR $ASHL_BACKUP_ADDR\""});
  BOOST_TEST(r.code == 0, r.err);
  const auto lines = lines_of(r.out);
  BOOST_TEST(lines.size() == 5u);
  const std::regex line(R"(\[(server|backup|worker) (\d)\] (server|worker) (\d) ([01]) )"
                        R"(127\.0\.0\.1:(\d+),127\.0\.0\.1:(\d+) 127\.0\.0\.1:(\d+),127\.0\.0\.1:(\d+))");
  int backups = 0;
  for (const auto& l : lines) {
    std::smatch m;
    BOOST_TEST_REQUIRE(std::regex_match(l, m, line), l);
    const int base = std::stoi(m[6]);
    BOOST_TEST(std::stoi(m[7]) == base + 1);
    BOOST_TEST(std::stoi(m[8]) == base + 2 * 4);  // the next block: port + S x ports-per-server
    BOOST_TEST(std::stoi(m[9]) == base + 2 * 4 + 1);
    BOOST_TEST(m[2] == m[4]);  // the label's rank is ASHL_RANK
    const bool backup = m[1] == "backup";
    backups += backup;
    BOOST_TEST((m[5] == (backup ? "1" : "0")), l);
    BOOST_TEST((m[3] == (m[1] == "worker" ? "worker" : "server")), l);
  }
  BOOST_TEST(backups == 2);
  // A server that fails: the job goes on, the worker's status is the job's.
  r = run({"-s", "1", "-w", "1", "--backups", "--insecure", "--grace", "1", "--", "/bin/sh", "-c",
           "if [ \"$ASHL_ROLE\" = server ] && [ -z \"$ASHL_REPLICA\" ]; then exit 3; fi; sleep 0.3; echo done"});
  BOOST_TEST(r.code == 0, r.err);
  BOOST_TEST(r.err.find("server 0 exited with status 3; its shard has a backup: the job goes on") != std::string::npos,
             r.err);
  const auto help = run({"--help"});
  BOOST_TEST(help.out.find("--backups") != std::string::npos, help.out);
}
