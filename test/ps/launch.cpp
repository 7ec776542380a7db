#include <ashl/ps/launch.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

namespace ps = ashl::ps;

namespace {

// Clears the contract's variables, sets the given ones, and clears them again
// on destruction, so every case starts from an empty environment.
struct env_guard {
  static constexpr const char* names[] = {"ASHL_ROLE",  "ASHL_RANK",     "ASHL_NUM_WORKERS", "ASHL_NUM_SERVERS",
                                          "ASHL_SERVER_ADDR", "ASHL_TOKEN", "ASHL_INSECURE", "ASHL_VERBOSE",
                                          "ASHL_PROGRESS", "ASHL_JOB", "ASHL_NO_WORKER_GRACE", "ASHL_MAX_WORKERS",
                                          "ASHL_BACKUP_ADDR", "ASHL_REPLICA"};
  env_guard(std::initializer_list<std::pair<const char*, const char*>> vars) {
    clear();
    for (auto [k, v] : vars) ::setenv(k, v, 1);
  }
  ~env_guard() { clear(); }
  static void clear() {
    for (auto* n : names) ::unsetenv(n);
  }
};

ashl::result<ps::job> parse(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return ps::job_from(static_cast<int>(args.size()), argv.data());
}

std::string error_of(const ashl::result<ps::job>& r) {
  BOOST_REQUIRE(!r);
  return r.error().message();
}

}  // namespace

BOOST_AUTO_TEST_CASE(environment_contract) {
  env_guard env{{"ASHL_ROLE", "worker"},        {"ASHL_RANK", "3"},   {"ASHL_NUM_WORKERS", "4"},
                {"ASHL_NUM_SERVERS", "2"},      {"ASHL_TOKEN", "s3cret-s3cret-s3cret"},
                {"ASHL_SERVER_ADDR", "10.0.0.1:5000"}, {"ASHL_PROGRESS", "2.5"}};
  auto j = parse({});
  BOOST_REQUIRE(j);
  BOOST_TEST((j->role == ps::role::worker));
  BOOST_TEST(j->rank == 3u);
  BOOST_TEST(j->num_workers == 4u);
  BOOST_TEST(j->num_servers == 2u);
  BOOST_TEST((j->server_addresses == std::vector<std::string>{"10.0.0.1:5000", "10.0.0.1:5001"}));
  BOOST_TEST(j->token == "s3cret-s3cret-s3cret");
  BOOST_TEST(!j->insecure);
  BOOST_TEST(!j->verbose);
  BOOST_TEST(j->progress_seconds == 2.5);
  BOOST_TEST((j->rest == std::vector<std::string>{"prog"}));
  const auto d = ps::describe(*j);
  BOOST_TEST(d == "worker 3 of 4 (2 servers, 4 workers), servers 10.0.0.1:5000,10.0.0.1:5001, token set, "
                  "progress every 2.5 s");
  BOOST_TEST(d.find("s3cret") == std::string::npos);
  // Read, then removed: a program this process starts does not inherit it.
  BOOST_TEST(std::getenv("ASHL_TOKEN") == nullptr);
}

BOOST_AUTO_TEST_CASE(flags_win_and_the_rest_is_left_for_the_program) {
  env_guard env{{"ASHL_ROLE", "worker"}, {"ASHL_RANK", "9"}, {"ASHL_NUM_WORKERS", "4"},
                {"ASHL_SERVER_ADDR", "x"}, {"ASHL_TOKEN", "from-the-environment"}};
  auto j = parse({"--lr", "0.1", "--role", "server", "--rank=1", "--num-servers", "3", "--server-addr",
                  "[::1]:7000,h1:1,h2:2", "--verbose", "--epochs=3", "--progress", "5", "--",
                  "--rank", "7"});
  BOOST_REQUIRE(j);
  BOOST_TEST((j->role == ps::role::server));
  BOOST_TEST(j->rank == 1u);
  BOOST_TEST(j->num_servers == 3u);
  BOOST_TEST(j->num_workers == 4u);
  BOOST_TEST((j->server_addresses == std::vector<std::string>{"[::1]:7000", "h1:1", "h2:2"}));
  BOOST_TEST(j->token == "from-the-environment");
  BOOST_TEST(j->verbose);
  BOOST_TEST(j->progress_seconds == 5.0);
  BOOST_TEST((j->rest == std::vector<std::string>{"prog", "--lr", "0.1", "--epochs=3", "--", "--rank", "7"}));
}

BOOST_AUTO_TEST_CASE(insecure_and_defaults) {
  env_guard env{{"ASHL_ROLE", "server"}, {"ASHL_SERVER_ADDR", "127.0.0.1:0"}};
  BOOST_TEST(error_of(parse({})) == "ASHL_TOKEN is empty: set it, or pass --insecure to run without authentication");
  auto j = parse({"--insecure"});
  BOOST_REQUIRE(j);
  BOOST_TEST(j->insecure);
  BOOST_TEST(j->token.empty());
  BOOST_TEST(j->rank == 0u);  // one server: the rank may be omitted
  BOOST_TEST(j->num_workers == 1u);
  BOOST_TEST((j->server_addresses == std::vector<std::string>{"127.0.0.1:0"}));
  BOOST_TEST(ps::describe(*j) == "server 0 of 1 (1 server, 1 worker), servers 127.0.0.1:0, insecure (no token)");
  ::setenv("ASHL_INSECURE", "1", 1);
  BOOST_TEST(parse({}).has_value());
  ::setenv("ASHL_INSECURE", "maybe", 1);
  BOOST_TEST(error_of(parse({})) == "ASHL_INSECURE = 'maybe': expected 1, 0, true, false, yes, no, on or off");
  ::unsetenv("ASHL_INSECURE");
  ::setenv("ASHL_TOKEN", "", 1);
  BOOST_TEST(error_of(parse({})) == "ASHL_TOKEN is empty: set it, or pass --insecure to run without authentication");
}

// Issue 24, item 9: the token never on a command line, never short.
BOOST_AUTO_TEST_CASE(token_hygiene) {
  env_guard env{{"ASHL_ROLE", "server"}, {"ASHL_SERVER_ADDR", "127.0.0.1:0"}};
  const std::string on_command_line =
      "--token: a token on the command line is visible to every user of this host (ps, /proc/<pid>/cmdline); "
      "pass it in the environment variable ASHL_TOKEN instead";
  BOOST_TEST(error_of(parse({"--token", "0123456789abcdef0123"})) == on_command_line);
  BOOST_TEST(error_of(parse({"--token=0123456789abcdef0123"})) == on_command_line);
  BOOST_TEST(error_of(parse({"--token="})) == on_command_line);
  BOOST_TEST(error_of(parse({"--insecure", "--token", "x"})) == on_command_line);
  // After "--" it is the program's argument, not ours.
  BOOST_TEST(parse({"--insecure", "--", "--token", "x"}).has_value());

  ::setenv("ASHL_TOKEN", "secret", 1);
  const std::string e = error_of(parse({}));
  BOOST_TEST(e == "ASHL_TOKEN is 6 bytes: a token must have at least 16 (e.g. openssl rand -hex 16), or pass "
                  "--insecure to run without authentication");
  BOOST_TEST(std::getenv("ASHL_TOKEN") == nullptr);
  ::setenv("ASHL_TOKEN", "fifteen-bytes!!", 1);
  BOOST_TEST(error_of(parse({})).starts_with("ASHL_TOKEN is 15 bytes: "));
  ::setenv("ASHL_TOKEN", "sixteen-bytes!!!", 1);
  auto j = parse({});
  BOOST_REQUIRE(j);
  BOOST_TEST(j->token == "sixteen-bytes!!!");
  BOOST_TEST(std::getenv("ASHL_TOKEN") == nullptr);
  BOOST_TEST(error_of(parse({})) == "ASHL_TOKEN is empty: set it, or pass --insecure to run without authentication");
  ::setenv("ASHL_TOKEN", "short", 1);  // insecure: a short token is the user's choice
  auto k = parse({"--insecure"});
  BOOST_REQUIRE(k);
  BOOST_TEST(k->token == "short");
}

BOOST_AUTO_TEST_CASE(errors_name_the_variable_or_flag_and_the_value) {
  env_guard env{{"ASHL_ROLE", "worker"}, {"ASHL_RANK", "7"},          {"ASHL_NUM_WORKERS", "4"},
                {"ASHL_TOKEN", "a-token-of-some-length"}, {"ASHL_SERVER_ADDR", "h:1"}};
  BOOST_TEST(error_of(parse({})) ==
             "ASHL_RANK = 7: must be < ASHL_NUM_WORKERS = 4 (or < ASHL_MAX_WORKERS, when set above it)");
  BOOST_TEST(error_of(parse({"--num-workers", "2", "--rank", "3"})) ==
             "--rank = 3: must be < --num-workers = 2 (or < ASHL_MAX_WORKERS, when set above it)");
  BOOST_TEST(error_of(parse({"--rank", "-1"})) == "--rank = '-1': expected a non-negative integer");
  BOOST_TEST(error_of(parse({"--rank"})) == "--rank: expects a value");
  BOOST_TEST(error_of(parse({"--rank", "1", "--role", "boss"})) == "--role = 'boss': expected server or worker");
  BOOST_TEST(error_of(parse({"--rank", "1", "--num-servers", "0"})) == "--num-servers = '0': must be >= 1");
  BOOST_TEST(error_of(parse({"--rank", "1", "--progress", "-2"})) ==
             "--progress = '-2': expected a number of seconds >= 0");

  ::setenv("ASHL_RANK", "1", 1);
  ::setenv("ASHL_SERVER_ADDR", "x", 1);
  BOOST_TEST(error_of(parse({})) == "ASHL_SERVER_ADDR = 'x': expected host:port");
  BOOST_TEST(error_of(parse({"--server-addr", "h:99999"})) ==
             "--server-addr = 'h:99999': expected host:port with a port in 0..65535");
  BOOST_TEST(error_of(parse({"--server-addr", "::1:5000"})) ==
             "--server-addr = '::1:5000': expected host:port (an IPv6 host goes in brackets: [::1]:5000)");
  BOOST_TEST(error_of(parse({"--server-addr", "[::1]5000"})) == "--server-addr = '[::1]5000': expected [ipv6]:port");
  BOOST_TEST(error_of(parse({"--num-servers", "3", "--server-addr", "h:65534"})) ==
             "--server-addr = 'h:65534': server 2 would listen on port 65536 (port + rank), above 65535");
  BOOST_TEST(error_of(parse({"--num-servers", "2", "--server-addr", "h:0"})) ==
             "--server-addr = 'h:0': port 0 (any free port) cannot give 2 servers their ports; list every "
             "server's host:port, comma-separated");
  BOOST_TEST(error_of(parse({"--server-addr", "a:1,b:2"})) ==
             "--server-addr = 'a:1,b:2': lists 2 addresses, expected one per server (ASHL_NUM_SERVERS = 1)");
  BOOST_TEST(error_of(parse({"--server-addr", "a:1,"})) == "--server-addr = '': expected host:port");

  ::unsetenv("ASHL_SERVER_ADDR");
  BOOST_TEST(error_of(parse({})) ==
             "ASHL_SERVER_ADDR is not set: set it (or pass --server-addr) to server 0's host:port");
  ::unsetenv("ASHL_RANK");
  BOOST_TEST(error_of(parse({"--server-addr", "h:1"})) ==
             "ASHL_RANK is not set: set it (or pass --rank) to this worker's rank, 0..3");
  ::unsetenv("ASHL_ROLE");
  BOOST_TEST(error_of(parse({})) == "ASHL_ROLE is not set: set it (or pass --role) to server or worker");
}

// Issue 44, item 6: counts and durations past their named bounds are
// refused by name, never wrapped or taken (ASHL_NUM_WORKERS=100000000 made
// a server abort with std::bad_alloc sizing its per-worker tables).
BOOST_AUTO_TEST_CASE(counts_and_durations_past_their_bounds_are_refused_by_name) {
  env_guard env{{"ASHL_ROLE", "server"}, {"ASHL_TOKEN", "a-token-of-some-length"}, {"ASHL_SERVER_ADDR", "h:1"}};
  BOOST_TEST(parse({"--num-workers", "65536"}).has_value());
  BOOST_TEST(error_of(parse({"--num-workers", "65537"})) ==
             "--num-workers = '65537': must be at most 65536 (ps::max_workers)");
  ::setenv("ASHL_NUM_WORKERS", "100000000", 1);
  BOOST_TEST(error_of(parse({})) == "ASHL_NUM_WORKERS = '100000000': must be at most 65536 (ps::max_workers)");
  BOOST_TEST(error_of(parse({"--num-workers", "4294967295"})) ==
             "--num-workers = '4294967295': must be at most 65536 (ps::max_workers)");
  // Past 2^32: refused as past the bound, not read modulo 2^32 (nor as garbage).
  BOOST_TEST(error_of(parse({"--num-workers", "4294967297"})) ==
             "--num-workers = '4294967297': must be at most 65536 (ps::max_workers)");
  BOOST_TEST(error_of(parse({"--num-workers", "99999999999999999999999"})) ==
             "--num-workers = '99999999999999999999999': must be at most 65536 (ps::max_workers)");
  ::unsetenv("ASHL_NUM_WORKERS");
  BOOST_TEST(error_of(parse({"--num-servers", "1025", "--rank", "0", "--server-addr", "h:1"})) ==
             "--num-servers = '1025': must be at most 1024 (ps::max_servers)");
  BOOST_TEST(error_of(parse({"--rank", "4294967296"})) == "--rank = '4294967296': must be at most 4294967295");
  BOOST_TEST(error_of(parse({"--progress", "1e300"})) ==
             "--progress = '1e300': must be at most 1000000000 seconds (ps::max_duration_seconds)");
  BOOST_TEST(error_of(parse({"--no-worker-grace", "inf"})) ==
             "--no-worker-grace = 'inf': expected a number of seconds >= 0");
  BOOST_TEST(error_of(parse({"--progress", "nan"})) == "--progress = 'nan': expected a number of seconds >= 0");
  ::setenv("ASHL_TOKEN", "a-token-of-some-length", 1);  // job_from took it out of the environment
  BOOST_TEST(parse({"--progress", "1e9"}).has_value());
  // The address list's own count, from a C++ caller.
  auto none = ps::server_addresses_from("h:1", 0, "addr", "servers");
  BOOST_REQUIRE(!none);
  BOOST_TEST(none.error().message() == "servers = 0: must be in 1..1024 (ps::max_servers)");
  BOOST_TEST(!ps::server_addresses_from("h:1", 4294967295u, "addr", "servers"));
  auto d = ps::checked_millis("worker.timeout", 1e300);
  BOOST_REQUIRE(!d);
  BOOST_TEST(d.error().message().find("worker.timeout") != std::string::npos, d.error().message());
  BOOST_TEST(d.error().message().find("ps::max_duration_seconds") != std::string::npos, d.error().message());
  BOOST_TEST(ps::checked_millis("t", 1.5).value().count() == 1500);
  BOOST_TEST(!ps::checked_millis("t", -1.0));
  BOOST_TEST(!ps::checked_millis("t", std::numeric_limits<double>::quiet_NaN()));
}

BOOST_AUTO_TEST_CASE(host_port_parsing) {
  auto a = ps::parse_host_port("[fe80::1]:80", "addr");
  BOOST_REQUIRE(a);
  BOOST_TEST(a->host == "fe80::1");
  BOOST_TEST(a->ipv6);
  BOOST_TEST(a->port == 80u);
  auto s = ps::server_addresses_from("[::1]:5000", 2, "ASHL_SERVER_ADDR");
  BOOST_REQUIRE(s);
  BOOST_TEST((*s == std::vector<std::string>{"[::1]:5000", "[::1]:5001"}));
  BOOST_TEST(!ps::parse_host_port(":5000", "addr"));
  BOOST_TEST(!ps::parse_host_port("h:", "addr"));
  BOOST_TEST(!ps::parse_host_port("[]:1", "addr"));
}

// Issue 24: the job's name (part of its id) and a server's no-worker grace.
BOOST_AUTO_TEST_CASE(job_name_and_no_worker_grace) {
  {
    env_guard env{{"ASHL_ROLE", "server"}, {"ASHL_SERVER_ADDR", "127.0.0.1:5000"}, {"ASHL_INSECURE", "1"},
                  {"ASHL_JOB", "resnet"}, {"ASHL_NO_WORKER_GRACE", "2.5"}};
    auto j = parse({});
    BOOST_REQUIRE(j);
    BOOST_TEST(j->name == "resnet");
    BOOST_TEST(j->no_worker_grace_seconds == 2.5);
    BOOST_TEST(ps::job_id_of(*j, 100) == ps::make_job_id("resnet", 100, 1, 1));
    BOOST_TEST(ps::describe(*j).find(", job resnet") != std::string::npos);
    auto f = parse({"--job", "other", "--no-worker-grace=7"});  // flags win
    BOOST_REQUIRE(f);
    BOOST_TEST(f->name == "other");
    BOOST_TEST(f->no_worker_grace_seconds == 7.0);
    BOOST_TEST(ps::job_id_of(*f, 100) != ps::job_id_of(*j, 100));
  }
  {
    env_guard env{{"ASHL_ROLE", "server"}, {"ASHL_SERVER_ADDR", "127.0.0.1:5000"}, {"ASHL_INSECURE", "1"}};
    auto j = parse({});
    BOOST_REQUIRE(j);
    BOOST_TEST(j->name.empty());
    BOOST_TEST(j->no_worker_grace_seconds == 60.0);
    BOOST_TEST(error_of(parse({"--no-worker-grace", "0"})) == "--no-worker-grace = '0': must be > 0 seconds");
    BOOST_TEST(error_of(parse({"--no-worker-grace", "soon"})) ==
               "--no-worker-grace = 'soon': expected a number of seconds >= 0");
  }
}

// docs/elastic.md §2.1-2.2 (E2b): ASHL_MAX_WORKERS makes the worker count a
// maximum. Not set (or 0) it is the worker count and the job id is the one
// a job had before there was a maximum; a worker's rank is bounded by it;
// below the worker count or past ps::max_workers it is refused by name.
BOOST_AUTO_TEST_CASE(max_workers_bounds_a_workers_rank_and_is_the_job_ids_count) {
  env_guard env{{"ASHL_ROLE", "worker"}, {"ASHL_RANK", "5"},     {"ASHL_NUM_WORKERS", "4"},
                {"ASHL_INSECURE", "1"},  {"ASHL_JOB", "resnet"}, {"ASHL_SERVER_ADDR", "10.0.0.1:5000"}};
  // Rank 5 of 4 workers: past the initial set, and no maximum says more.
  BOOST_TEST(error_of(parse({})) ==
             "ASHL_RANK = 5: must be < ASHL_NUM_WORKERS = 4 (or < ASHL_MAX_WORKERS, when set above it)");
  ::setenv("ASHL_MAX_WORKERS", "8", 1);
  auto j = parse({});
  BOOST_REQUIRE(j);
  BOOST_TEST(j->rank == 5u);
  BOOST_TEST(j->num_workers == 4u);
  BOOST_TEST(j->max_workers == 8u);
  BOOST_TEST(ps::max_workers_of(*j) == 8u);
  BOOST_TEST(ps::describe(*j) == "worker 5 of 8 (1 server, 4 workers, at most 8), servers 10.0.0.1:5000, "
                                 "insecure (no token), job resnet");
  // The id counts the maximum, not the initial workers: a job of 4 of at
  // most 8 is the job 8 workers without a maximum were.
  BOOST_TEST(ps::job_id_of(*j, 100) == ps::make_job_id("resnet", 100, 8, 1));
  BOOST_TEST(ps::job_id_of(*j, 100) != ps::make_job_id("resnet", 100, 4, 1));
  BOOST_TEST(error_of(parse({"--rank", "8"})) == "--rank = 8: must be < ASHL_MAX_WORKERS = 8");
  BOOST_TEST(error_of(parse({"--rank", "8", "--max-workers", "6"})) == "--rank = 8: must be < --max-workers = 6");
  auto f = parse({"--max-workers=6"});  // the flag wins
  BOOST_REQUIRE(f);
  BOOST_TEST(f->max_workers == 6u);
  // Equal to the worker count, 0, or not set: the same job, today's id.
  for (const char* same : {"4", "0"}) {
    ::setenv("ASHL_MAX_WORKERS", same, 1);
    auto s = parse({"--rank", "3"});
    BOOST_REQUIRE(s);
    BOOST_TEST(s->max_workers == 4u, same);
    BOOST_TEST(ps::job_id_of(*s, 100) == ps::make_job_id("resnet", 100, 4, 1), same);
    BOOST_TEST(ps::describe(*s) == "worker 3 of 4 (1 server, 4 workers), servers 10.0.0.1:5000, insecure (no "
                                   "token), job resnet", same);
  }
  ::unsetenv("ASHL_MAX_WORKERS");
  auto u = parse({"--rank", "3"});
  BOOST_REQUIRE(u);
  BOOST_TEST(u->max_workers == 4u);
  // Pinned: the id this job had before max_workers existed (computed by
  // the build before E2b), so its checkpoints and workers still match.
  BOOST_TEST(ps::job_id_text(ps::job_id_of(*u, 100)) == "0xa9057d4019128d31");
  BOOST_TEST(ps::job_id_text(ps::make_job_id("resnet", 100, 4, 1)) == "0xa9057d4019128d31");
  BOOST_TEST(ps::job_id_text(ps::make_job_id("resnet", 100, 5, 1)) != "0xa9057d4019128d31");
  // A job made by hand leaves max_workers 0: the worker count.
  ps::job by_hand;
  by_hand.num_workers = 3;
  BOOST_TEST(ps::max_workers_of(by_hand) == 3u);
  BOOST_TEST(ps::job_id_of(by_hand, 10) == ps::make_job_id("", 10, 3, 1));

  // Refused by name: below the worker count, past ps::max_workers, not a count.
  ::setenv("ASHL_MAX_WORKERS", "3", 1);
  BOOST_TEST(error_of(parse({"--rank", "0"})) ==
             "ASHL_MAX_WORKERS = '3': must be 0 (the same as ASHL_NUM_WORKERS) or at least ASHL_NUM_WORKERS = 4");
  BOOST_TEST(error_of(parse({"--rank", "0", "--num-workers", "5", "--max-workers", "2"})) ==
             "--max-workers = '2': must be 0 (the same as --num-workers) or at least --num-workers = 5");
  ::setenv("ASHL_MAX_WORKERS", "65537", 1);
  BOOST_TEST(error_of(parse({"--rank", "0"})) == "ASHL_MAX_WORKERS = '65537': must be at most 65536 (ps::max_workers)");
  BOOST_TEST(error_of(parse({"--rank", "0", "--max-workers", "4294967297"})) ==
             "--max-workers = '4294967297': must be at most 65536 (ps::max_workers)");
  ::setenv("ASHL_MAX_WORKERS", "many", 1);
  BOOST_TEST(error_of(parse({"--rank", "0"})) == "ASHL_MAX_WORKERS = 'many': expected a non-negative integer");
  ::setenv("ASHL_MAX_WORKERS", "65536", 1);
  BOOST_TEST(parse({"--rank", "65535"}).has_value());

  // A server's rank stays bounded by the servers; its job carries the maximum.
  ::setenv("ASHL_ROLE", "server", 1);
  ::setenv("ASHL_MAX_WORKERS", "8", 1);
  BOOST_TEST(error_of(parse({"--rank", "5"})) == "--rank = 5: must be < ASHL_NUM_SERVERS = 1");
  auto s = parse({"--rank", "0"});
  BOOST_REQUIRE(s);
  BOOST_TEST(s->max_workers == 8u);
  BOOST_TEST(ps::job_id_of(*s, 100) == ps::make_job_id("resnet", 100, 8, 1));
}

// docs/elastic.md §4.6: each shard's backup address and the backup's role.
BOOST_AUTO_TEST_CASE(backup_addresses_and_the_replica_role_by_name) {
  {
    env_guard env{{"ASHL_ROLE", "worker"},          {"ASHL_NUM_SERVERS", "3"}, {"ASHL_INSECURE", "1"},
                  {"ASHL_SERVER_ADDR", "10.0.0.1:5000"}, {"ASHL_BACKUP_ADDR", "10.0.0.2:6000"}};
    auto j = parse({});
    BOOST_REQUIRE(j);
    BOOST_TEST((j->backup_addresses == std::vector<std::string>{"10.0.0.2:6000", "10.0.0.2:6001", "10.0.0.2:6002"}));
    BOOST_TEST(!j->replica);
    BOOST_TEST(ps::describe(*j).find("backups 10.0.0.2:6000,10.0.0.2:6001,10.0.0.2:6002") != std::string::npos);
  }
  {  // a list, an empty entry for a shard without a backup; the flag wins
    env_guard env{{"ASHL_ROLE", "server"},          {"ASHL_RANK", "2"}, {"ASHL_NUM_SERVERS", "3"},
                  {"ASHL_INSECURE", "1"},           {"ASHL_SERVER_ADDR", "10.0.0.1:5000"},
                  {"ASHL_BACKUP_ADDR", "10.0.0.9:1"}, {"ASHL_REPLICA", "1"}};
    auto j = parse({"--backup-addr", "h:7000,,[::1]:7002"});
    BOOST_REQUIRE(j);
    BOOST_TEST((j->backup_addresses == std::vector<std::string>{"h:7000", "", "[::1]:7002"}));
    BOOST_TEST(j->replica);
    BOOST_TEST(ps::describe(*j).find("this server a backup") != std::string::npos);
  }
  {  // unset: no backups
    env_guard env{{"ASHL_ROLE", "worker"}, {"ASHL_INSECURE", "1"}, {"ASHL_SERVER_ADDR", "h:1"}};
    auto j = parse({});
    BOOST_REQUIRE(j);
    BOOST_TEST(j->backup_addresses.empty());
  }
  auto refused = [](std::initializer_list<std::pair<const char*, const char*>> vars) {
    env_guard env(vars);
    return error_of(parse({}));
  };
  BOOST_TEST(refused({{"ASHL_ROLE", "worker"}, {"ASHL_NUM_SERVERS", "2"}, {"ASHL_INSECURE", "1"},
                      {"ASHL_SERVER_ADDR", "h:1"}, {"ASHL_BACKUP_ADDR", "h:7000,h:7001,h:7002"}}) ==
             "ASHL_BACKUP_ADDR = 'h:7000,h:7001,h:7002': lists 3 addresses, expected one per server "
             "(ASHL_NUM_SERVERS = 2; an empty one for a shard without a backup)");
  BOOST_TEST(refused({{"ASHL_ROLE", "worker"}, {"ASHL_NUM_SERVERS", "2"}, {"ASHL_INSECURE", "1"},
                      {"ASHL_SERVER_ADDR", "h:1"}, {"ASHL_BACKUP_ADDR", "h:7000,nohost"}})
                 .starts_with("ASHL_BACKUP_ADDR = 'nohost': "));
  BOOST_TEST(refused({{"ASHL_ROLE", "server"}, {"ASHL_INSECURE", "1"}, {"ASHL_SERVER_ADDR", "h:1"},
                      {"ASHL_BACKUP_ADDR", "h:2"}, {"ASHL_REPLICA", "maybe"}}) ==
             "ASHL_REPLICA = 'maybe': expected 1, 0, true, false, yes, no, on or off");
  BOOST_TEST(refused({{"ASHL_ROLE", "worker"}, {"ASHL_INSECURE", "1"}, {"ASHL_SERVER_ADDR", "h:1"},
                      {"ASHL_BACKUP_ADDR", "h:2"}, {"ASHL_REPLICA", "1"}}) ==
             "ASHL_REPLICA = '1': only a server is a backup (ASHL_ROLE = worker)");
  BOOST_TEST(refused({{"ASHL_ROLE", "server"}, {"ASHL_RANK", "1"}, {"ASHL_NUM_SERVERS", "2"}, {"ASHL_INSECURE", "1"},
                      {"ASHL_SERVER_ADDR", "h:1"}, {"ASHL_BACKUP_ADDR", "h:7000,"}, {"ASHL_REPLICA", "yes"}}) ==
             "ASHL_REPLICA = 'yes': shard 1 has no backup address (set ASHL_BACKUP_ADDR, or pass --backup-addr)");
  BOOST_TEST(refused({{"ASHL_ROLE", "server"}, {"ASHL_INSECURE", "1"}, {"ASHL_SERVER_ADDR", "h:1"},
                      {"ASHL_REPLICA", "1"}}) ==
             "ASHL_REPLICA = '1': shard 0 has no backup address (set ASHL_BACKUP_ADDR, or pass --backup-addr)");
}
