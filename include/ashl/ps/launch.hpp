// ashl/ps/launch.hpp — the runtime contract of a real run: who this process
// is (server or worker, its rank, the job's size, the servers' addresses, the
// token), read from the environment and overridden by the same flags
// (docs/design.md "Runtime contract for real runs"; docs/multi-host.md).
//
//   int main(int argc, char** argv) {
//     auto j = ashl::ps::job_from(argc, argv);          // result<job>
//     if (!j) { std::fprintf(stderr, "%s\n", j.error().message().c_str()); return 2; }
//     std::fprintf(stderr, "%s\n", ashl::ps::describe(*j).c_str());   // never prints the token
//     if (j->role == ashl::ps::role::server) serve(j->server_addresses[j->rank], *j);
//     else train(*j, j->rest);                         // the program's own arguments
//   }
//
// Variables and flags (a flag wins over its variable; "--flag value" and
// "--flag=value" both work; an empty variable counts as unset):
//
//   ASHL_ROLE         --role         server | worker (required)
//   ASHL_RANK         --rank         0 .. count of that role - 1 (required when that count > 1);
//                                  a worker's count is ASHL_MAX_WORKERS
//   ASHL_NUM_WORKERS  --num-workers  1 .. ps::max_workers (default 1): the initial workers
//   ASHL_MAX_WORKERS  --max-workers  the most workers the job may have: ranks past the initial
//                                  ones join a running job up to it (docs/elastic.md §2.1);
//                                  0 or unset = ASHL_NUM_WORKERS, else ASHL_NUM_WORKERS ..
//                                  ps::max_workers; part of the job id (job_id_of)
//   ASHL_NUM_SERVERS  --num-servers  1 .. ps::max_servers (default 1)
//   ASHL_SERVER_ADDR  --server-addr  server 0's host:port, or every server's, comma-separated (required)
//   ASHL_TOKEN        (no flag)      the job's shared secret, >= 16 bytes (required unless insecure)
//   ASHL_INSECURE     --insecure     run without a token (variable: 1/0, true/false, yes/no, on/off)
//   ASHL_VERBOSE      --verbose      print transport details
//   ASHL_PROGRESS     --progress S   a progress line every S seconds (0 = none, the default;
//                                  every duration at most ps::max_duration_seconds)
//   ASHL_JOB          --job NAME     the job's name, part of its id (job_id_of; default empty)
//   ASHL_NO_WORKER_GRACE --no-worker-grace S   a server ends after S seconds with no worker
//                                  connected (server_params::no_worker_grace; default 60, > 0)
//   ASHL_BACKUP_ADDR  --backup-addr  each shard's backup (docs/elastic.md §4.6): every shard's,
//                                  comma-separated, an empty entry for a shard without one; or
//                                  shard 0's alone (shard i's at port + i), as ASHL_SERVER_ADDR
//   ASHL_REPLICA      --replica      with ASHL_ROLE=server: this process is shard ASHL_RANK's
//                                  backup (listens on its ASHL_BACKUP_ADDR entry; 1/0 as ASHL_INSECURE)
//
// The token (docs/multi-host.md, "The token"): only from ASHL_TOKEN, never a
// command line (ps(1) and /proc/<pid>/cmdline show those to every user of
// the host): "--token" is refused, naming ASHL_TOKEN. job_from removes
// ASHL_TOKEN from this process's environment once it has read it, so the
// programs it starts (data loaders, shells) do not inherit the secret; a
// second job_from in the same process no longer sees it (keep the job). A
// token shorter than min_token_bytes is refused unless insecure; the error
// gives its length, never the token.
//
// A single host:port with S > 1 servers means server i listens on port + i of
// that host. Hosts are names, IPv4 addresses or bracketed IPv6 ("[::1]:5000").
// Arguments that are not these flags (including unknown --flags) are left
// for the program in job::rest, in order, after argv[0]; parsing stops at
// "--", which is left in rest with everything after it. Every error names
// the variable or flag and the bad value.
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>
#include <ashl/ps/identity.hpp>
#include <ashl/rules/job_limits.hpp>
#include <ashl/transport/address.hpp>
#include <ashl/transport/token.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdlib.h>  // ::unsetenv (POSIX)
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace ps {

enum class role : std::uint8_t { server, worker };

// The shortest token job_from accepts without insecure (transport/token.hpp,
// the transport's own rule too).
using transport::min_token_bytes;

constexpr std::string_view to_string(role r) noexcept { return r == role::server ? "server" : "worker"; }

struct job {
  ps::role role = ps::role::worker;
  std::uint32_t rank = 0;
  std::uint32_t num_workers = 1;             // the initial workers, ranks 0..num_workers-1
  std::uint32_t max_workers = 0;             // the job's maximum (ASHL_MAX_WORKERS); 0 = num_workers
                                             // (job_from writes the resolved value; max_workers_of)
  std::uint32_t num_servers = 1;
  std::vector<std::string> server_addresses;  // one per server: "host:port", server i at index i
  std::string token;                          // empty only when insecure
  bool insecure = false;
  bool verbose = false;
  double progress_seconds = 0;                // 0 = no progress line
  std::string name;                           // ASHL_JOB: part of the job id (job_id_of)
  double no_worker_grace_seconds = 60;        // servers: server_params::no_worker_grace
  // Shard i's backup at backup_addresses[i] ("" none); empty: no shard has
  // one (ASHL_BACKUP_ADDR; worker_params::backups).
  std::vector<std::string> backup_addresses;
  bool replica = false;                       // a server that is its shard's backup (ASHL_REPLICA)
  std::vector<std::string> rest;              // argv[0], then the arguments left for the program
};

// "host:port" split; an IPv6 host keeps no brackets here.
using transport::host_port;  // transport/address.hpp: the one address parser

namespace detail {

// "<source> = '<value>': <why>", the contract's error form for text values.
inline status launch_error(std::string_view source, std::string_view value, std::string_view why) {
  std::string m(source);
  m += " = '";
  m += value;
  m += "': ";
  m += why;
  return status(errc::invalid_argument, std::move(m));
}

// A count in min .. max; `max_name` names the bound in the error (a
// value past 2^32 - 1 is refused as past max, never wrapped).
inline result<std::uint32_t> parse_count(std::string_view source, std::string_view text, std::uint32_t min,
                                         std::uint32_t max = ~std::uint32_t{0}, std::string_view max_name = {}) {
  std::uint64_t v = 0;
  const auto* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || (ec != std::errc{} && ec != std::errc::result_out_of_range) || p != end)
    return launch_error(source, text, "expected a non-negative integer");
  if (ec == std::errc::result_out_of_range || v > max)
    return launch_error(source, text,
                        "must be at most " + std::to_string(max) +
                            (max_name.empty() ? std::string() : " (" + std::string(max_name) + ")"));
  if (v < min) return launch_error(source, text, "must be >= " + std::to_string(min));
  return static_cast<std::uint32_t>(v);
}

inline result<bool> parse_flag_value(std::string_view source, std::string_view text) {
  if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
  if (text == "0" || text == "false" || text == "no" || text == "off") return false;
  return launch_error(source, text, "expected 1, 0, true, false, yes, no, on or off");
}

inline result<double> parse_seconds(std::string_view source, std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  const double v = s.empty() ? -1 : std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !(v >= 0) || !std::isfinite(v))
    return launch_error(source, text, "expected a number of seconds >= 0");
  if (v > max_duration_seconds)
    return launch_error(source, text, "must be at most 1000000000 seconds (ps::max_duration_seconds)");
  return v;
}

using transport::join_host_port;

}  // namespace detail

// Parses "host:port" or "[v6]:port" (transport::split_host_port, shared with
// the UCX transport); errors name `source` and the text.
inline result<host_port> parse_host_port(std::string_view text, std::string_view source) {
  auto a = transport::split_host_port(text);
  if (!a) return detail::launch_error(source, text, a.error().message());
  return a;
}

namespace detail {

// A comma-separated list of addresses, one per server; `empty_ok`: an
// empty entry stands for none (a shard without a backup).
inline result<std::vector<std::string>> address_list(std::string_view text, std::uint32_t num_servers,
                                                     std::string_view source, std::string_view servers_source,
                                                     bool empty_ok) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    auto end = text.find(',', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view entry = text.substr(begin, end - begin);
    if (empty_ok && entry.empty()) {
      out.emplace_back();
    } else {
      auto a = parse_host_port(entry, source);
      if (!a) return a.error();
      out.push_back(join_host_port(*a));
    }
    begin = end + 1;
  }
  if (out.size() != num_servers)
    return launch_error(source, text,
                        "lists " + std::to_string(out.size()) + " addresses, expected one per server (" +
                            std::string(servers_source) + " = " + std::to_string(num_servers) +
                            (empty_ok ? "; an empty one for a shard without a backup)" : ")"));
  return out;
}

}  // namespace detail

// The servers' addresses from ASHL_SERVER_ADDR's value: every server's,
// comma-separated, or server 0's alone (server i then at port + i).
inline result<std::vector<std::string>> server_addresses_from(std::string_view text, std::uint32_t num_servers,
                                                              std::string_view source,
                                                              std::string_view servers_source = "ASHL_NUM_SERVERS") {
  std::vector<std::string> out;
  if (num_servers < 1 || num_servers > max_servers)
    return status(errc::out_of_range, std::string(servers_source) + " = " + std::to_string(num_servers) +
                                          ": must be in 1.." + std::to_string(max_servers) + " (ps::max_servers)");
  if (text.find(',') != std::string_view::npos)
    return detail::address_list(text, num_servers, source, servers_source, false);
  auto a = parse_host_port(text, source);
  if (!a) return a.error();
  if (num_servers > 1 && a->port == 0)
    return detail::launch_error(source, text,
                                "port 0 (any free port) cannot give " + std::to_string(num_servers) +
                                    " servers their ports; list every server's host:port, comma-separated");
  if (std::uint64_t{a->port} + num_servers - 1 > 65535)
    return detail::launch_error(source, text,
                                "server " + std::to_string(num_servers - 1) + " would listen on port " +
                                    std::to_string(std::uint64_t{a->port} + num_servers - 1) +
                                    " (port + rank), above 65535");
  for (std::uint32_t i = 0; i < num_servers; ++i) {
    host_port s = *a;
    s.port = static_cast<std::uint16_t>(a->port + i);
    out.push_back(detail::join_host_port(s));
  }
  return out;
}

// The backups' addresses from ASHL_BACKUP_ADDR's value (docs/elastic.md
// §4.6): every shard's, comma-separated, an empty entry for a shard
// without a backup; or shard 0's alone (shard i's at port + i).
inline result<std::vector<std::string>> backup_addresses_from(std::string_view text, std::uint32_t num_servers,
                                                              std::string_view source,
                                                              std::string_view servers_source = "ASHL_NUM_SERVERS") {
  if (text.find(',') == std::string_view::npos) return server_addresses_from(text, num_servers, source, servers_source);
  return detail::address_list(text, num_servers, source, servers_source, true);
}

// The job of this process: the environment, then the flags in argv over it.
inline result<job> job_from(int argc, char** argv) {
  struct setting {
    std::string_view env, flag;
    std::optional<std::string> value;
    std::string source;  // the variable or the flag the value came from
  };
  setting role_s{"ASHL_ROLE", "--role", {}, {}}, rank_s{"ASHL_RANK", "--rank", {}, {}},
      workers_s{"ASHL_NUM_WORKERS", "--num-workers", {}, {}},
      max_workers_s{"ASHL_MAX_WORKERS", "--max-workers", {}, {}}, servers_s{"ASHL_NUM_SERVERS", "--num-servers", {}, {}},
      addr_s{"ASHL_SERVER_ADDR", "--server-addr", {}, {}}, token_s{"ASHL_TOKEN", "--token", {}, {}},
      insecure_s{"ASHL_INSECURE", "--insecure", {}, {}}, verbose_s{"ASHL_VERBOSE", "--verbose", {}, {}},
      progress_s{"ASHL_PROGRESS", "--progress", {}, {}}, name_s{"ASHL_JOB", "--job", {}, {}},
      grace_s{"ASHL_NO_WORKER_GRACE", "--no-worker-grace", {}, {}},
      backup_s{"ASHL_BACKUP_ADDR", "--backup-addr", {}, {}}, replica_s{"ASHL_REPLICA", "--replica", {}, {}};
  setting* all[] = {&role_s,     &rank_s,     &workers_s, &max_workers_s, &servers_s, &addr_s,    &token_s,
                    &insecure_s, &verbose_s,  &progress_s, &name_s,       &grace_s,   &backup_s,  &replica_s};
  for (auto* s : all) {
    const std::string name(s->env);
    if (const char* v = std::getenv(name.c_str()); v && *v) {
      s->value = v;
      s->source = name;
    }
  }
  // ASHL_TOKEN set but empty is reported as such, not as missing.
  if (const char* v = std::getenv("ASHL_TOKEN"); v && !*v) {
    token_s.value = std::string();
    token_s.source = "ASHL_TOKEN";
  }
  // Read: out of the environment children inherit (their own copy of it
  // from fork/exec, posix_spawn, system(), popen()).
  ::unsetenv("ASHL_TOKEN");

  job j;
  if (argc > 0 && argv[0]) j.rest.emplace_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") {
      for (; i < argc; ++i) j.rest.emplace_back(argv[i]);
      break;
    }
    setting* match = nullptr;
    std::optional<std::string_view> inline_value;
    for (auto* s : all) {
      if (arg == s->flag) match = s;
      else if (arg.size() > s->flag.size() && arg.starts_with(s->flag) && arg[s->flag.size()] == '=') {
        match = s;
        inline_value = arg.substr(s->flag.size() + 1);
      }
      if (match) break;
    }
    if (!match) {
      j.rest.emplace_back(arg);
      continue;
    }
    if (match == &token_s)
      return status(errc::invalid_argument,
                    "--token: a token on the command line is visible to every user of this host (ps, "
                    "/proc/<pid>/cmdline); pass it in the environment variable ASHL_TOKEN instead");
    match->source = std::string(match->flag);
    const bool is_switch = match == &insecure_s || match == &verbose_s || match == &replica_s;
    if (is_switch) {
      match->value = inline_value ? std::string(*inline_value) : std::string("1");
    } else if (inline_value) {
      match->value = std::string(*inline_value);
    } else if (i + 1 < argc) {
      match->value = std::string(argv[++i]);
    } else {
      return status(errc::invalid_argument, std::string(match->flag) + ": expects a value");
    }
  }

  if (!role_s.value)
    return status(errc::invalid_argument, "ASHL_ROLE is not set: set it (or pass --role) to server or worker");
  if (*role_s.value == "server") j.role = role::server;
  else if (*role_s.value == "worker") j.role = role::worker;
  else return detail::launch_error(role_s.source, *role_s.value, "expected server or worker");

  if (workers_s.value) {
    auto v = detail::parse_count(workers_s.source, *workers_s.value, 1, max_workers, "ps::max_workers");
    if (!v) return v.error();
    j.num_workers = *v;
  }
  j.max_workers = j.num_workers;
  if (max_workers_s.value) {
    // 0 says "no more than the initial workers", as not setting it does.
    auto v = detail::parse_count(max_workers_s.source, *max_workers_s.value, 0, max_workers, "ps::max_workers");
    if (!v) return v.error();
    if (*v != 0 && *v < j.num_workers) {
      const std::string workers_name = workers_s.value ? workers_s.source : std::string(workers_s.env);
      return detail::launch_error(max_workers_s.source, *max_workers_s.value,
                                  "must be 0 (the same as " + workers_name + ") or at least " + workers_name +
                                      " = " + std::to_string(j.num_workers));
    }
    if (*v != 0) j.max_workers = *v;
  }
  if (servers_s.value) {
    auto v = detail::parse_count(servers_s.source, *servers_s.value, 1, max_servers, "ps::max_servers");
    if (!v) return v.error();
    j.num_servers = *v;
  }
  const bool server = j.role == role::server;
  // A worker's rank is bounded by the job's maximum: ranks past the initial
  // workers are joiners (docs/elastic.md §2.3).
  const bool elastic = !server && j.max_workers > j.num_workers;
  const std::uint32_t count = server ? j.num_servers : elastic ? j.max_workers : j.num_workers;
  const setting& count_s = server ? servers_s : elastic ? max_workers_s : workers_s;
  const std::string count_name = count_s.value ? count_s.source : std::string(count_s.env);
  if (rank_s.value) {
    auto v = detail::parse_count(rank_s.source, *rank_s.value, 0);
    if (!v) return v.error();
    if (*v >= count)
      return status(errc::out_of_range,
                    rank_s.source + " = " + std::to_string(*v) + ": must be < " + count_name + " = " +
                        std::to_string(count) +
                        (server || elastic ? std::string() : " (or < ASHL_MAX_WORKERS, when set above it)"));
    j.rank = *v;
  } else if (count > 1) {
    return status(errc::invalid_argument, "ASHL_RANK is not set: set it (or pass --rank) to this " +
                                              std::string(to_string(j.role)) + "'s rank, 0.." +
                                              std::to_string(count - 1));
  }

  if (!addr_s.value)
    return status(errc::invalid_argument,
                  "ASHL_SERVER_ADDR is not set: set it (or pass --server-addr) to server 0's host:port");
  auto addrs = server_addresses_from(*addr_s.value, j.num_servers, addr_s.source,
                                     servers_s.value ? servers_s.source : std::string(servers_s.env));
  if (!addrs) return addrs.error();
  j.server_addresses = std::move(*addrs);
  if (backup_s.value) {
    auto b = backup_addresses_from(*backup_s.value, j.num_servers, backup_s.source,
                                   servers_s.value ? servers_s.source : std::string(servers_s.env));
    if (!b) return b.error();
    j.backup_addresses = std::move(*b);
  }
  if (replica_s.value) {
    auto v = detail::parse_flag_value(replica_s.source, *replica_s.value);
    if (!v) return v.error();
    j.replica = *v;
    if (j.replica && !server)
      return detail::launch_error(replica_s.source, *replica_s.value,
                                  "only a server is a backup (ASHL_ROLE = " + std::string(to_string(j.role)) + ")");
    if (j.replica && (j.backup_addresses.empty() || j.backup_addresses[j.rank].empty()))
      return detail::launch_error(replica_s.source, *replica_s.value,
                                  "shard " + std::to_string(j.rank) +
                                      " has no backup address (set ASHL_BACKUP_ADDR, or pass --backup-addr)");
  }

  if (insecure_s.value) {
    auto v = detail::parse_flag_value(insecure_s.source, *insecure_s.value);
    if (!v) return v.error();
    j.insecure = *v;
  }
  if (verbose_s.value) {
    auto v = detail::parse_flag_value(verbose_s.source, *verbose_s.value);
    if (!v) return v.error();
    j.verbose = *v;
  }
  if (progress_s.value) {
    auto v = detail::parse_seconds(progress_s.source, *progress_s.value);
    if (!v) return v.error();
    j.progress_seconds = *v;
  }
  if (name_s.value) j.name = *name_s.value;
  if (grace_s.value) {
    auto v = detail::parse_seconds(grace_s.source, *grace_s.value);
    if (!v) return v.error();
    if (*v <= 0) return detail::launch_error(grace_s.source, *grace_s.value, "must be > 0 seconds");
    j.no_worker_grace_seconds = *v;
  }
  if (token_s.value) j.token = *token_s.value;
  if (j.token.empty() && !j.insecure) {
    const std::string name = token_s.value ? token_s.source : std::string("ASHL_TOKEN");
    return status(errc::invalid_argument,
                  name + " is empty: set it, or pass --insecure to run without authentication");
  }
  if (!j.insecure && j.token.size() < min_token_bytes)
    return status(errc::invalid_argument,
                  "ASHL_TOKEN is " + std::to_string(j.token.size()) + " bytes: a token must have at least " +
                      std::to_string(min_token_bytes) +
                      " (e.g. openssl rand -hex 16), or pass --insecure to run without authentication");
  return j;
}

// The most workers job j may have: max_workers, or num_workers where that
// is 0 (or below it, as in a job made by hand). What a server's
// server_core_params::max_workers is given.
inline std::uint32_t max_workers_of(const job& j) noexcept { return std::max(j.max_workers, j.num_workers); }

// The id of job j for a model of `elements` elements: its name and shape
// (ps/identity.hpp). Every process of a job computes the same one; a worker
// of another job (another name, model size, maximum of workers or server
// count) is refused by the servers' join. The maximum, not the initial
// count: a job started with 2 of at most 4 workers is the job a 4-worker
// run of the same name and model was, and restores its checkpoints; with no
// maximum said it is the worker count, so the id is the one a job had
// before there was a maximum.
inline std::uint64_t job_id_of(const job& j, std::uint64_t elements) noexcept {
  return make_job_id(j.name, elements, max_workers_of(j), j.num_servers);
}

// One line for logs: "worker 3 of 4 (2 servers, 4 workers), servers 127.0.0.1:5000,127.0.0.1:5001, token set".
// Never contains the token.
inline std::string describe(const job& j) {
  std::string s(to_string(j.role));
  s += ' ';
  s += std::to_string(j.rank);
  s += " of ";
  s += std::to_string(j.role == role::server ? j.num_servers : max_workers_of(j));
  s += " (";
  s += std::to_string(j.num_servers);
  s += j.num_servers == 1 ? " server, " : " servers, ";
  s += std::to_string(j.num_workers);
  s += j.num_workers == 1 ? " worker" : " workers";
  if (max_workers_of(j) > j.num_workers) {
    s += ", at most ";
    s += std::to_string(max_workers_of(j));
  }
  s += "), servers ";
  for (std::size_t i = 0; i < j.server_addresses.size(); ++i) {
    if (i) s += ',';
    s += j.server_addresses[i];
  }
  if (!j.backup_addresses.empty()) {
    s += ", backups ";
    for (std::size_t i = 0; i < j.backup_addresses.size(); ++i) {
      if (i) s += ',';
      s += j.backup_addresses[i];
    }
  }
  if (j.replica) s += ", this server a backup";
  s += j.token.empty() ? ", insecure (no token)" : ", token set";
  if (j.verbose) s += ", verbose";
  if (j.progress_seconds > 0) {
    s += ", progress every ";
    std::string secs = std::to_string(j.progress_seconds);
    while (secs.ends_with('0')) secs.pop_back();
    if (secs.ends_with('.')) secs.pop_back();
    s += secs;
    s += " s";
  }
  if (!j.name.empty()) {
    s += ", job ";
    s += j.name;
  }
  return s;
}

}  // namespace ps
ASHL_NAMESPACE_END
