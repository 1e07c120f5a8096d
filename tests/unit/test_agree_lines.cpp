// The ranks' agreement on their command line and effective deck (src/mesh/agree.hpp agree_on_lines):
// the first collective of every command (docs/cluster.md "Faults on a cluster": a mixed launch).
#include <catch2/catch.hpp>

#include <mpi.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "mesh/agree.hpp"

using namespace meshmoe;

TEST_CASE("agree_on_lines: equal lines pass; a rank's other line is an InputError on every rank, named", "[mesh][mpi]") {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const auto label = [](const std::vector<std::string>&, size_t i) { return "line " + std::to_string(i + 1); };
  std::vector<std::string> lines{"[optim]", "lr = 0.001", "batch_size = 8"};
  CHECK_NOTHROW(agree_on_lines("deck", lines, label, MPI_COMM_WORLD));
  if (size < 2) return;
  if (rank == size - 1) lines[1] = "lr = 0.5";
  const std::string want = "the ranks disagree on their deck: rank " + std::to_string(size - 1) +
                           " differs from rank 0, first at line 2 ('lr = 0.5' on rank " + std::to_string(size - 1) +
                           ", 'lr = 0.001' on rank 0)";
  CHECK_THROWS_WITH(agree_on_lines("deck", lines, label, MPI_COMM_WORLD), Catch::StartsWith(want));
  // A rank with fewer lines: named at the first line it lacks.
  std::vector<std::string> shorter{"[optim]"};
  if (rank != 1) shorter.push_back("lr = 0.001");
  CHECK_THROWS_WITH(agree_on_lines("deck", shorter, label, MPI_COMM_WORLD),
                    Catch::Contains("first at line 2 (nothing on rank 1, 'lr = 0.001' on rank 0)"));
}
