#include <ashl/coll/nccl.hpp>

#include <boost/test/unit_test.hpp>

// The NCCL unique id from MPI (coll::broadcast_nccl_id): the launcher case
// starts this executable under mpiexec (3 ranks, loopback TCP, bounded) with
// --run_test=rank_id_broadcast; there rank 0's id reaches every rank byte
// for byte. Needs no GPU: only the 128 bytes travel.

#include <mpi.h>

#include "../support/process.hpp"

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

using namespace std::chrono_literals;

namespace {

bool in_mpi_job() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

std::string self_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, std::size_t(n)) : std::string();
}

ashl::coll::nccl_unique_id pattern() {
  ashl::coll::nccl_unique_id id;
  for (std::size_t i = 0; i < id.data.size(); ++i) id.data[i] = static_cast<std::byte>((i * 29 + 7) & 0xff);
  return id;
}

}  // namespace

BOOST_AUTO_TEST_CASE(launch_id_broadcast) {
  if (in_mpi_job()) return;
  const std::vector<std::string> argv = {ASHL_MPIEXEC, "--oversubscribe", "--bind-to", "none", "--mca", "pml", "ob1",
                                         "--mca", "oob_tcp_if_include", "lo", "--mca", "btl", "self,tcp",
                                         "--mca", "btl_tcp_if_include", "lo", "-n", "3", self_path(),
                                         "--run_test=rank_id_broadcast"};
  const auto log = (std::filesystem::temp_directory_path() /
                    ("ashl_coll_nccl_mpi_" + std::to_string(::getpid()) + ".log")).string();
  const auto r = process::run(argv, {{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}}, 60s,
                              log);
  BOOST_TEST(r.exit_code == 0, r.log());
  std::filesystem::remove(log);
}

BOOST_AUTO_TEST_CASE(rank_id_broadcast) {
  if (!in_mpi_job()) return;
  int argc = 0;
  char** argv = nullptr;
  BOOST_REQUIRE(MPI_Init(&argc, &argv) == MPI_SUCCESS);
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  BOOST_TEST(size == 3);
  ashl::coll::nccl_unique_id id;  // zeros except on the root
  if (rank == 1) id = pattern();  // a root other than 0
  const auto s = ashl::coll::broadcast_nccl_id(id, 1, MPI_COMM_WORLD);
  BOOST_TEST(s.ok(), s.message());
  BOOST_TEST((id == pattern()), "rank " << rank);
  MPI_Finalize();
}
